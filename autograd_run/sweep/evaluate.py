"""The work of a grid point, as run on a Dask worker (or in this process): load the graph once, evaluate points.

``run_batch(payload, points)`` is the task function: it loads the graph the
payload describes (at most once per worker process: loaded graphs are kept
in a small LRU keyed by their hashes), evaluates each point with
``evaluate`` and returns one row per point, never raising for a point: a
point that fails becomes an error row with its message, and the other points
of the batch still run.

A ``GraphPayload`` carries a graph either as bytes (sent once per graph:
the client sends it as the result of one small task and every task of that graph refers to the same Dask
data, which each worker fetches once) or as a path on a filesystem shared
with the workers (``transfer="path"``), whose bytes are checked against the
hash the client computed. Side files travel the same way; sent ones are
written to a private temporary folder of the worker, which the graph is
loaded against.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

from autograd_run.errors import AutogradRunError
from autograd_run.graphs.load import loads_graph, read_source
from autograd_run.graphs.model import Graph
from autograd_run.sweep.fingerprint import tool_fingerprint
from autograd_run.sweep.grid import GraphInput, Point

#: Loaded graphs a worker process keeps (by hash), and the folder of sent side files of each.
KEEP_GRAPHS = 4


@dataclass
class GraphPayload:
    name: str
    sha: str
    fmt: str
    side_default: str | None
    side_sha: dict[str, str]
    #: The bytes (sent) or None (read ``path`` on the worker).
    data: bytes | None = None
    side: dict[str, bytes] = field(default_factory=dict)
    path: str | None = None


def make_payload(g: GraphInput, send: bool = True) -> GraphPayload:
    """What a task needs of ``g``: its bytes (checked against the hash taken when the grid was built) or its path."""
    if not send:
        return GraphPayload(g.name, g.sha, g.fmt, g.side_default, dict(g.side), path=g.path)
    data, _, base = read_source(g.path)
    if hashlib.sha256(data).hexdigest() != g.sha:
        raise AutogradRunError(f"{g.name}: the file changed during the sweep")
    side = {}
    for rel in sorted(g.side):
        with open(os.path.join(base, rel), "rb") as f:
            side[rel] = f.read()
        if hashlib.sha256(side[rel]).hexdigest() != g.side[rel]:
            raise AutogradRunError(f"{g.name}: side file {rel} changed during the sweep")
    return GraphPayload(g.name, g.sha, g.fmt, g.side_default, dict(g.side), data, side)


class _Loaded:
    """Graphs loaded in this process, by (graph sha, side shas); the oldest is dropped past ``KEEP_GRAPHS``."""

    def __init__(self):
        self.graphs: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        atexit.register(self.clear)

    def get(self, p: GraphPayload) -> Graph:
        key = (p.sha, tuple(sorted(p.side_sha.items())))
        with self.lock:
            hit = self.graphs.get(key)
            if hit is not None:
                self.graphs.move_to_end(key)
                return hit[0]
        graph, folder = _load(p)
        with self.lock:
            self.graphs[key] = (graph, folder)
            while len(self.graphs) > KEEP_GRAPHS:
                _, (_, old) = self.graphs.popitem(last=False)
                if old:
                    shutil.rmtree(old, ignore_errors=True)
        return graph

    def drop(self, p: GraphPayload) -> None:
        """Forget ``p``'s graph (and delete its folder of sent side files), if it is loaded."""
        key = (p.sha, tuple(sorted(p.side_sha.items())))
        with self.lock:
            entry = self.graphs.pop(key, None)
        if entry is not None and entry[1]:
            shutil.rmtree(entry[1], ignore_errors=True)

    def clear(self) -> None:
        with self.lock:
            for _, folder in self.graphs.values():
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)
            self.graphs.clear()


LOADED = _Loaded()


def _load(p: GraphPayload) -> tuple[Graph, str | None]:
    """Load a payload's graph; (graph, temporary folder to delete when it is dropped, or None)."""
    folder = None
    if p.data is None:  # a shared path: read it here and check it is the file the client hashed
        data, _, base = read_source(p.path)
        if hashlib.sha256(data).hexdigest() != p.sha:
            raise AutogradRunError(f"{p.name}: the file this worker reads at {p.path} differs from the client's")
        for rel, sha in p.side_sha.items():
            with open(os.path.join(base, rel), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != sha:
                    raise AutogradRunError(f"{p.name}: side file {rel} differs on this worker")
    else:
        data, base = p.data, None
        if p.side:
            folder = base = tempfile.mkdtemp(prefix="autograd-run-sweep-")
            for rel, blob in p.side.items():
                full = os.path.join(folder, rel)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(blob)
    try:
        graph = loads_graph(data, p.name, p.fmt, base, p.side_default)
    except BaseException:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return graph, folder


def evaluate(graph: Graph, point: Point) -> dict:
    """The metrics of one point (raises the library's errors for a point that cannot be evaluated)."""
    from autograd_run.sim.specs import MachineSpec
    spec = MachineSpec.from_dict(json.loads(point.spec), point.spec_name)
    scale = json.loads(point.scale)
    if point.mode == "simulate":
        from autograd_run.sim.session import SimOptions, simulate_session
        r = simulate_session(graph, SimOptions(spec=spec, devices=point.devices, placement=point.placement,
                                               policy=point.policy, scale=scale, slack_top=0,
                                               scale_must_apply=False))
        s = r.summary
        return {"wall_ns": r.wall_ns, "engine_done_ns": r.engine_done_ns, "critical_path_ns": s.critical_path_ns,
                "nodes": len(graph.nodes), "nodes_executed": s.nodes_executed,
                "copies": len(r.graph.nodes) - len(graph.nodes), "workers": sum(1 for w in s.workers if w.nodes),
                "devices_used": len([d for d in r.graph.devices if not d.is_cpu]),
                "scale_unused": ",".join(r.scale_unused) or None}
    from autograd_run.session import RunOptions, run_session
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.placement import place
    placed = graph
    if point.devices is not None:
        placed = place(graph, point.devices, point.placement, CostResolver(spec, None, scale))
    from autograd_run.sim.policies import policy
    accelerators = len([d for d in placed.devices if not d.is_cpu])
    multithreading = policy(point.policy).threading(placed)
    report = run_session(placed, RunOptions(devices="virtual", multithreading=multithreading, repeat=point.repeat))
    if report.error is not None:
        raise report.error
    s = report.summary
    passes = max(1, s.passes.count)
    return {"wall_ns": int(s.passes.mean_ns) if s.passes.count else s.wall_ns, "p95_ns": s.passes.p95_ns,
            "critical_path_ns": s.critical_path_ns, "nodes": len(graph.nodes),
            "nodes_executed": s.nodes_executed // passes, "copies": len(placed.nodes) - len(graph.nodes),
            "workers": sum(1 for w in s.workers if w.nodes), "devices_used": accelerators, "passes": s.passes.count}


def error_text(exc: BaseException) -> str:
    """A point's error as one message: the library's own text, or the exception's type and text."""
    if isinstance(exc, AutogradRunError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def freed_when_done():
    """One point's evaluation, whose objects are all freed when it ends, before the next point starts.

    A simulation leaves its objects in reference cycles (the simulator, its workers, queues and tasks refer
    to each other, and through them to the placed graph: millions of objects at 1e5 nodes), so they are not
    freed when the point's figures are taken but when the cyclic collector next runs a full collection,
    which a process doing point after point (the collector paused during each simulation) rarely reaches:
    every point's simulation stayed in memory, and the memory grew with the points. So the collector is off
    for the point (what it makes stays in the youngest generations, none of it scanned meanwhile) and a
    collection of the young generations frees its cycles when it ends: cheaper than a full collection, which
    would scan the loaded graph as well, each time. Restores the collector's state it found. (The collector's
    switch is the process's: the bound holds for one point at a time per process, as in the embedded cluster,
    ``--workers 0`` and the documented ``dask worker --nthreads 1``.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect(1)  # the point's garbage: young, its only way out (the report was the point's last reference)
        if was:
            gc.enable()


def run_batch(payload: GraphPayload, points: list[Point]) -> dict:
    """Evaluate ``points`` on ``payload``'s graph: ``{"tool", "where", "rows"}``, one row per point, in order."""
    where = f"{os.uname().nodename}:{os.getpid()}"
    try:
        graph = LOADED.get(payload)
    except Exception as exc:  # the graph does not load: every point of it fails with the loader's message
        msg = error_text(exc)
        return {"tool": tool_fingerprint(), "where": where, "rows": [{"status": "error", "error": msg} for _ in points]}
    rows = []
    for p in points:
        t, cpu = time.perf_counter(), time.thread_time()
        with freed_when_done():
            try:
                row = {"status": "ok", **evaluate(graph, p)}
            except Exception as exc:
                row = {"status": "error", "error": error_text(exc)}
        row["compute_s"] = round(time.perf_counter() - t, 6)
        row["cpu_s"] = round(time.thread_time() - cpu, 6)  # this thread's CPU: the work without the waits
        rows.append(row)
    return {"tool": tool_fingerprint(), "where": where, "rows": rows}


def hold(payload: GraphPayload) -> GraphPayload:
    """A task whose result is the payload: how a graph is sent to the cluster once."""
    return payload
