"""A sweep spec made concrete: the graph files (found, hashed), the machine specs (read) and the points.

``build_grid(spec)`` resolves every path and glob (see ``spec`` for what a
spec file may name), hashes each graph file and the ``.npz`` side files it
reads, reads each machine spec, parses each cost scaling, and expands the
product of the dimensions into ``Point``s, in a stable order (graph, then
the dimensions in ``spec.DIMENSIONS`` order). A point holds everything its
result depends on besides the graph's bytes, so its cache key is the hash of
(graph bytes, side files' bytes, point, tool fingerprint).

A graph that cannot be read at all is a spec error (exit 2); a graph that
reads but does not load is not: its points fail one by one, with the loader's
message, and the rest of the sweep goes on.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field

from autograd_run.errors import AutogradRunError, GraphFileError, RequestError
from autograd_run.graphs.load import EXAMPLE_PREFIX, is_yaml_name, load_graph, read_source
from autograd_run.sim.costs import parse_scale
from autograd_run.sim.placement import PLACEMENTS
from autograd_run.sim.policies import POLICIES, RUN_POLICIES
from autograd_run.sim.specs import SHIPPED, default_spec, load_spec, local_spec_path
from autograd_run.sweep import globbing
from autograd_run.sweep.spec import SweepSpec

MAX_GRAPHS = 10_000
MAX_POINTS = 100_000
GRAPH_EXTENSIONS = (".json", ".yaml", ".yml")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class GraphInput:
    """One graph of the sweep: where it is, what it is (hashes), and what it reads beside it."""

    #: As shown to the user (the spec's or command line's spelling, or a match of a glob).
    name: str
    #: Absolute path, or ``example:NAME``.
    path: str
    sha: str
    size: int
    fmt: str
    #: The side file a tensor spec without ``file`` reads (``<stem>.npz``), as the loader names it.
    side_default: str | None = None
    #: Side files it reads: path relative to its folder -> sha256.
    side: dict[str, str] = field(default_factory=dict)
    #: Why the graph does not load (its points all fail with this), or None.
    error: str | None = None

    @property
    def folder(self) -> str | None:
        return None if self.path.startswith(EXAMPLE_PREFIX) else os.path.dirname(self.path)

    def side_paths(self) -> list[str]:
        """Absolute paths of its side files (examples: inside the installed package)."""
        base = self.folder if self.folder is not None else read_source(self.path)[2]
        return [os.path.join(base, rel) for rel in sorted(self.side)]


@dataclass(frozen=True)
class Point:
    """One grid point on one graph: everything the result depends on besides the graph's bytes."""

    graph: int
    mode: str
    devices: int | None
    placement: str
    policy: str
    #: The machine spec's name (for display) and its full content (what the result depends on).
    spec_name: str
    spec: str
    #: Cost scaling as given (display) and parsed (JSON of {name: factor}).
    scale_text: str
    scale: str
    repeat: int = 1

    def fields(self) -> dict:
        """What the result depends on, as plain JSON values (the cache key's point part)."""
        return {"mode": self.mode, "devices": self.devices, "placement": self.placement, "policy": self.policy,
                "spec": json.loads(self.spec), "scale": json.loads(self.scale), "repeat": self.repeat}

    def label(self) -> str:
        dev = "file" if self.devices is None else str(self.devices)
        parts = [self.policy, f"devices {dev}", self.placement]
        if self.mode == "simulate":
            parts.append(self.spec_name)
            if self.scale_text:
                parts.append(f"scale {self.scale_text}")
        else:
            parts.append(f"run x{self.repeat}")
        return ", ".join(parts)


@dataclass
class Grid:
    graphs: list[GraphInput]
    points: list[Point]
    #: Every file the sweep reads (graphs, side files, machine spec files, the spec): never overwritten.
    inputs: list[str] = field(default_factory=list)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def resolve_graphs(spec: SweepSpec) -> list[tuple[str, str]]:
    """(display name, absolute path or example ref) of each graph, in the spec's order, without duplicates."""
    root = spec.confined_root("graphs")
    base = root or os.getcwd()
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, pattern in enumerate(spec.graphs):
        if pattern.startswith(EXAMPLE_PREFIX):
            found = [(pattern, pattern)]
        else:
            # relative to the spec file's folder (the working directory for the command line's); absolute
            # paths and ~ as they are: the spec's author is the person running the sweep
            full = os.path.join(base, os.path.expanduser(pattern))
            if glob.has_magic(pattern):
                try:
                    matches = [m for m in globbing.find(full) if m.lower().endswith(GRAPH_EXTENSIONS)]
                except globbing.GlobTooLarge as exc:
                    raise spec.error("graphs", i, f"{pattern!r} {exc}") from None
                if not matches:
                    raise spec.error("graphs", i, f"{pattern!r} matches no graph file (.json, .yaml, .yml)")
            else:
                if not os.path.exists(full):
                    raise spec.error("graphs", i, f"{pattern}: no such file")
                if os.path.isdir(full):
                    raise spec.error("graphs", i, f"{pattern}: is a directory (a glob such as {pattern.rstrip('/')}/*.json?)")
                if not full.lower().endswith(GRAPH_EXTENSIONS):
                    raise spec.error("graphs", i, f"{pattern}: graph files end in .json, .yaml or .yml")
                if not os.path.isfile(full):
                    raise spec.error("graphs", i, f"{pattern}: not a regular file (a device or a FIFO?)")
                matches = [full]
            if spec.file and glob.has_magic(pattern):  # a glob never picks the sweep spec itself
                matches = [m for m in matches if not _same_file(m, spec.file)]
                if not matches:
                    raise spec.error("graphs", i, f"{pattern!r} matches no graph file besides the spec")
            found = []
            given = os.path.isabs(os.path.expanduser(pattern))
            for m in matches:  # shown as given: relative to the spec's folder, or absolute
                shown = m if given else (os.path.relpath(m, base) if root is not None else os.path.relpath(m))
                found.append((shown, os.path.abspath(m)))
        for shown, path in found:
            key = path if path.startswith(EXAMPLE_PREFIX) else os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                out.append((shown, path))
        if len(out) > MAX_GRAPHS:
            raise spec.error("graphs", i, f"more than {MAX_GRAPHS} graphs")
    return out


def read_graph(name: str, path: str) -> GraphInput:
    """Hash a graph and find the side files it reads (loading it only when it may have any)."""
    try:
        data, _, _ = read_source(path)
    except GraphFileError as exc:
        raise GraphFileError(name, exc.where, exc.what) from None
    fmt = "yaml" if (is_yaml_name(path) or (path.startswith(EXAMPLE_PREFIX) and _example_is_yaml(path))) else "json"
    g = GraphInput(name, path, hashlib.sha256(data).hexdigest(), len(data), fmt)
    if b"npz" in data:  # a graph without that word reads no side file: no need to load it here
        try:
            graph = load_graph(path)
        except GraphFileError as exc:
            g.error = str(GraphFileError(name, exc.where, exc.what))
            return g
        side = graph.side_files
        g.side_default = side.default_name
        base = os.path.realpath(side.base_dir) if side.base_dir else None
        for full in side.opened():
            g.side[os.path.relpath(full, base)] = sha256_file(full)
    return g


def _example_is_yaml(ref: str) -> bool:
    from importlib import resources
    name = ref[len(EXAMPLE_PREFIX):]
    return resources.files("autograd_run.graphs").joinpath("examples").joinpath(name + ".yaml").is_file()


def _machine_specs(spec: SweepSpec) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, JSON content) per machine spec value, and the spec files read."""
    root = spec.confined_root("spec")
    out, files = [], []
    for i, ref in enumerate(spec.spec or [None]):
        if ref is None:
            m = default_spec()
        else:
            target = ref
            if ref not in SHIPPED and ref != "local":
                target = os.path.expanduser(ref)
                if root is not None:  # relative to the spec file's folder; absolute and ~ as they are
                    target = os.path.join(root, target)
                if os.path.exists(target) and not os.path.isfile(target):
                    raise spec.error("spec", i, f"{ref}: not a regular file")
                files.append(os.path.abspath(target))
            try:
                m = load_spec(target)
            except RequestError as exc:  # the message names the file as the spec does, not as resolved
                raise spec.error("spec", i, str(exc).replace(target, ref)) from None
        # Shown as given; the default as what it is (``local`` once calibrated, else h100).
        shown = ref if ref is not None else ("local" if os.path.isfile(local_spec_path()) else "h100")
        out.append((shown, json.dumps(m.to_dict(), sort_keys=True)))
    return out, files


def build_grid(spec: SweepSpec) -> Grid:
    """Resolve ``spec`` (see the module docstring); raises ``SweepSpecError`` naming the place of a problem."""
    for key, allowed in (("policy", RUN_POLICIES if spec.mode == "run" else POLICIES), ("placement", PLACEMENTS)):
        for i, v in enumerate(getattr(spec, key) or []):
            if v not in allowed:
                extra = " (mode: run uses the engine's own threading)" if key == "policy" and spec.mode == "run" else ""
                raise spec.error(key, i, f"unknown {key} {v!r}; choose from {', '.join(allowed)}{extra}")
    scales = []
    for i, text in enumerate(spec.scale or [None]):
        try:
            parsed = parse_scale(text)
        except RequestError as exc:
            raise spec.error("scale", i, str(exc)) from None
        scales.append((text or "", json.dumps(parsed, sort_keys=True)))
    machines, spec_files = _machine_specs(spec)
    found = resolve_graphs(spec)
    graphs = []
    for name, path in found:
        try:
            graphs.append(read_graph(name, path))
        except AutogradRunError as exc:
            idx = None
            raise spec.error("graphs", idx, str(exc)) from None
    points: list[Point] = []
    seen: set = set()
    per_graph = len(spec.devices or [None]) * len(spec.placement or ["greedy"]) * len(spec.policy or ["pytorch"]) \
        * len(scales) * len(machines)
    if per_graph * len(graphs) > MAX_POINTS:
        raise spec.error("graphs", None, f"{per_graph * len(graphs)} grid points; at most {MAX_POINTS}")
    for gi in range(len(graphs)):
        for devices in spec.devices or [None]:
            # Without a device count the file's placement is kept; each placement needs a count.
            placements = ["keep"] if devices is None else (spec.placement or ["greedy"])
            for placement in placements:
                for policy in spec.policy or ["pytorch"]:
                    for scale_text, scale in scales:
                        for spec_name, content in machines:
                            p = Point(gi, spec.mode, devices, placement, policy, spec_name, content, scale_text, scale,
                                      spec.repeat)
                            if p not in seen:
                                seen.add(p)
                                points.append(p)
    inputs = [g.path for g in graphs if not g.path.startswith(EXAMPLE_PREFIX)]
    inputs += [p for g in graphs if g.side and g.folder for p in g.side_paths()]
    inputs += spec_files + ([os.path.abspath(spec.file)] if spec.file else [])
    return Grid(graphs, points, inputs)
