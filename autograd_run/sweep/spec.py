"""A sweep spec: which graphs, and the values of each grid dimension, read from YAML or the command line.

A spec file is untrusted input. It is read with YAML's safe loader, at most
``MAX_SPEC_BYTES``, with alias expansion and nesting bounded before anything
is built, and every problem is a ``SweepSpecError`` naming the file and the
place in it (``line L, column C (at devices[2])``).

The document is a mapping::

    graphs: [models/*.json, example:mlp]   # required: paths, globs or shipped examples
    devices: [1, 2, 4]                     # device counts; null (or "file"): as the graph file places its nodes
    placement: [greedy, layer]             # how nodes are placed on a device count
    policy: [pytorch, fifo]                # scheduling policies
    scale: [null, "MmBackward0=0.5"]       # cost scalings: NAME=F,... or a mapping {NAME: F}
    spec: [h100, a100]                     # machine specs: shipped names, local, or spec files
    mode: simulate                         # or run: really run each point (virtual devices), repeat times
    repeat: 3

Every dimension may be a single value instead of a list. What a spec file
may name: paths and globs relative to the spec file's folder, absolute
paths and ``~`` (the spec's author is the person running the sweep, who
keeps graphs in shared folders); only regular files are read (a device or a
FIFO is refused); hidden files are not matched; a glob keeps only graph
files (``.json``, ``.yaml``, ``.yml``) and never the spec itself. The
command line's own values (``-g``, ``--spec``) are taken relative to the
working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from autograd_run import untrusted
from autograd_run.errors import UsageError

MAX_SPEC_BYTES = 1 << 20
#: Values the document may expand to once aliases are followed, and its nesting depth.
MAX_SPEC_VALUES = 100_000
MAX_SPEC_DEPTH = 16
#: Most values one dimension may list.
MAX_VALUES = 1024
MAX_REPEAT = 10_000
MAX_DEVICES = 1024

DIMENSIONS = ("devices", "placement", "policy", "scale", "spec")
KEYS = ("graphs", *DIMENSIONS, "mode", "repeat")
MODES = ("simulate", "run")


class SweepSpecError(UsageError):
    """A sweep spec (file or options) is wrong; ``file`` and ``where`` say where (exit 2)."""

    def __init__(self, file: str | None, where: str | None, what: str):
        self.file, self.where, self.what = file, where, what
        loc = ": ".join(x for x in (file, where) if x)
        super().__init__(f"{loc}: {what}" if loc else what)


@dataclass
class SweepSpec:
    """The lists of a sweep; ``None`` for a dimension means its default."""

    graphs: list[str]
    devices: list[int | None] | None = None
    placement: list[str] | None = None
    policy: list[str] | None = None
    scale: list[str | None] | None = None
    spec: list[str | None] | None = None
    mode: str = "simulate"
    repeat: int = 1
    #: The spec file (None: the command line), and the folder its relative paths are relative to.
    file: str | None = None
    root: str | None = None
    #: ``where(key, index)`` -> "line L, column C" in the file, for messages about a value.
    marks: dict = field(default_factory=dict, repr=False)
    #: Keys whose values came from the command line (their paths are the user's: cwd, unconfined).
    cli_keys: set = field(default_factory=set)

    def confined_root(self, key: str) -> str | None:
        """The folder the relative paths of ``key`` are relative to; None: the working directory."""
        return None if key in self.cli_keys or self.file is None else self.root

    def where(self, key: str, index: int | None = None) -> str | None:
        m = self.marks.get((key, index)) or self.marks.get((key, None))
        path = key if index is None else f"{key}[{index}]"
        return f"{m} (at {path})" if m else (f"at {path}" if self.file else None)

    def error(self, key: str, index: int | None, what: str) -> SweepSpecError:
        if self.file is None or key in self.cli_keys:
            return SweepSpecError(None, None, f"--{key if key != 'graphs' else 'graph'}: {what}")
        return SweepSpecError(self.file, self.where(key, index), what)


def _marks(root: yaml.Node) -> dict:
    """(key, index) -> "line L, column C" for each top-level key's value and its list items."""
    out: dict = {}
    if not isinstance(root, yaml.MappingNode):
        return out
    for k, v in root.value:
        key = getattr(k, "value", None)
        if not isinstance(key, str):
            continue
        out[(key, None)] = untrusted.mark(v)
        if isinstance(v, yaml.SequenceNode):
            for i, item in enumerate(v.value):
                out[(key, i)] = untrusted.mark(item)
    return out


def read_spec_file(path: str) -> SweepSpec:
    """Read and check a sweep spec file (see the module docstring)."""
    if not path.lower().endswith((".yaml", ".yml")):
        raise SweepSpecError(path, None, "a sweep spec is a YAML file (.yaml or .yml)")
    try:
        data = untrusted.read_regular_file(path, MAX_SPEC_BYTES)
        root, doc = untrusted.load_yaml(data, MAX_SPEC_VALUES, MAX_SPEC_DEPTH)
    except untrusted.Problem as p:
        raise SweepSpecError(path, p.where, p.what) from None
    if root is None:
        raise SweepSpecError(path, None, "the file is empty")
    if not isinstance(doc, dict):
        raise SweepSpecError(path, "line 1, column 1", "a sweep spec is a mapping with 'graphs' and grid lists")
    spec = SweepSpec(graphs=[], file=path, root=os.path.dirname(os.path.abspath(path)), marks=_marks(root))
    return parse_document(doc, spec)


def parse_document(doc: dict, spec: SweepSpec) -> SweepSpec:
    """Fill ``spec`` from a decoded document, checking every key and value."""
    for key in doc:
        if key not in KEYS:
            raise SweepSpecError(spec.file, spec.where(str(key)), f"unknown key {str(key)!r}; keys: {', '.join(KEYS)}")
    if "graphs" not in doc:
        raise SweepSpecError(spec.file, "line 1, column 1", "missing 'graphs': a list of graph paths or globs")
    spec.graphs = [_string(spec, "graphs", i, v) for i, v in enumerate(_listed(spec, "graphs", doc["graphs"]))]
    if "devices" in doc:
        spec.devices = [_device_count(spec, i, v) for i, v in enumerate(_listed(spec, "devices", doc["devices"]))]
    for key in ("placement", "policy"):
        if key in doc:
            setattr(spec, key, [_string(spec, key, i, v) for i, v in enumerate(_listed(spec, key, doc[key]))])
    if "spec" in doc:
        spec.spec = [None if v is None else _string(spec, "spec", i, v)
                     for i, v in enumerate(_listed(spec, "spec", doc["spec"]))]
    if "scale" in doc:
        spec.scale = [_scale_text(spec, i, v) for i, v in enumerate(_listed(spec, "scale", doc["scale"], mapping_ok=True))]
    if "mode" in doc:
        if doc["mode"] not in MODES:
            raise spec.error("mode", None, f"mode is one of {', '.join(MODES)}, got {doc['mode']!r}")
        spec.mode = doc["mode"]
    if "repeat" in doc:
        r = doc["repeat"]
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPEAT:
            raise spec.error("repeat", None, f"repeat is an integer in [1, {MAX_REPEAT}], got {r!r}")
        spec.repeat = r
    return check(spec)


def check(spec: SweepSpec) -> SweepSpec:
    """Checks that hold however the spec was given."""
    if not spec.graphs:
        raise spec.error("graphs", None, "no graphs given")
    if spec.mode == "run":
        for key in ("spec", "scale"):
            if getattr(spec, key) is not None:
                raise spec.error(key, None, f"{key} applies to simulated points only (mode: run measures this machine)")
    elif spec.repeat != 1:
        raise spec.error("repeat", None, "repeat applies to mode: run only (a simulation is deterministic)")
    return spec


def _listed(spec: SweepSpec, key: str, value: Any, mapping_ok: bool = False) -> list:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise spec.error(key, None, f"{key}: the list is empty")
    if len(items) > MAX_VALUES:
        raise spec.error(key, None, f"{key}: at most {MAX_VALUES} values")
    for i, v in enumerate(items):
        if isinstance(v, (list, dict)) and not (mapping_ok and isinstance(v, dict)):
            raise spec.error(key, i if isinstance(value, list) else None, f"{key}: expected a list of plain values")
    return items


def _string(spec: SweepSpec, key: str, i: int, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise spec.error(key, i, f"{key}: expected a non-empty string, got {v!r}")
    if len(v) > 4096 or "\x00" in v:
        raise spec.error(key, i, f"{key}: the value is too long or holds a NUL character")
    return v


def _device_count(spec: SweepSpec, i: int, v: Any) -> int | None:
    if v is None or v == "file":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DEVICES:
        raise spec.error("devices", i, f"devices: a device count in [1, {MAX_DEVICES}] or null (as the file), got {v!r}")
    return v


def _scale_text(spec: SweepSpec, i: int, v: Any) -> str | None:
    """A scale as ``NAME=F,...`` text (a mapping is written that way), or None for no scaling."""
    if v is None:
        return None
    if isinstance(v, dict):
        parts = []
        for name, factor in v.items():
            if not isinstance(name, str) or isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                    or not name.strip() or "," in name or "=" in name:
                raise spec.error("scale", i, "scale: a mapping of op or device names (without ',' or '=') to numbers")
            parts.append(f"{name}={factor!r}")
        return ",".join(parts)
    return _string(spec, "scale", i, v)


def from_options(graphs: list[str], devices: str | None, placement: str | None, policy: str | None,
                 scale: list[str], spec: str | None, mode: str | None, repeat: int | None,
                 base: SweepSpec | None = None) -> SweepSpec:
    """A spec from command-line values; each given value replaces the same dimension of ``base``.

    Command-line paths (``graphs``, spec files) are relative to the working directory and not confined.
    """
    out = base or SweepSpec(graphs=[])
    if graphs:
        out.graphs = list(graphs)
        out.cli_keys.add("graphs")
    if devices is not None:
        out.cli_keys.add("devices")
        out.devices = [_device_count(out, i, None if v.strip() in ("file", "") else _int(out, v))
                       for i, v in enumerate(devices.split(","))]
    for key, text in (("placement", placement), ("policy", policy), ("spec", spec)):
        if text is not None:
            out.cli_keys.add(key)
            vals = [v.strip() for v in text.split(",") if v.strip()]
            if not vals:
                raise out.error(key, None, "no values given")
            setattr(out, key, vals)
    if scale:
        out.cli_keys.add("scale")
        out.scale = [None if s in ("", "none") else s for s in scale]
    if mode is not None:
        out.cli_keys.add("mode")
        out.mode = mode
    if repeat is not None:
        out.cli_keys.add("repeat")
        out.repeat = repeat
    if not out.graphs:
        raise SweepSpecError(None, None, "no graphs: give a sweep spec file or -g GRAPH (a path or a glob)")
    return check(out)


def _int(spec: SweepSpec, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise spec.error("devices", None, f"device counts are integers or 'file', got {text.strip()!r}") from None
