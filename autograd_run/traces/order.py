"""Executed order: recording it, and comparing it with a golden order.

``OrderRecorder`` is a tracer that records, at each node start, the
position, node, GraphTask, reentrant depth and thread; with
``snapshots=True`` it also keeps the ready set (with priority keys) at the
pop that chose each node, so a mismatch can be explained.

``compare_orders`` is a pure function over order rows (dicts as written by
``--order-out``): exact when the run is deterministic (multithreading off,
or a single worker), otherwise per worker thread, since device workers
interleave freely.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from autograd_run.engine.tracer import Tracer


@dataclass(frozen=True, slots=True)
class OrderRecord:
    position: int
    node_id: str
    name: str
    seq: int
    device: str
    thread: str
    depth: int
    graph_task: int
    #: With snapshots: the ready set at the pop that chose this node, as
    #: (node id, reentrant depth, seq) of the chosen node first, then the rest.
    ready: tuple = ()

    def row(self) -> dict:
        d = {"position": self.position, "id": self.node_id, "name": self.name, "seq": self.seq,
             "device": self.device, "thread": self.thread, "depth": self.depth, "graph_task": self.graph_task}
        if self.ready:
            d["ready"] = [list(r) for r in self.ready]
        return d


class OrderRecorder(Tracer):
    enabled = True

    def __init__(self, snapshots: bool = False):
        self.records: list[OrderRecord] = []
        self.snapshots = snapshots
        self._lock = threading.Lock()  # guards records
        self._last_pop = threading.local()

    def task_popped(self, queue, gt, node, depth) -> None:
        if self.snapshots and node is not None:
            rest = []
            for key, item in queue.snapshot():
                other_gt, other, _ = item
                if other is not None and other_gt is not None and not isinstance(other_gt, str):
                    rest.append((other.id, other_gt.reentrant_depth, other.seq))
            self._last_pop.ready = ((node.id, gt.reentrant_depth, node.seq),) + tuple(
                sorted(rest, key=lambda r: (r[1], r[2]), reverse=True))

    def node_start(self, gt, node) -> None:
        th = threading.current_thread().name
        ready = getattr(self._last_pop, "ready", ()) if self.snapshots else ()
        if ready and ready[0][0] != node.id:
            ready = ()
        with self._lock:
            self.records.append(OrderRecord(len(self.records), node.id, node.name, node.seq, str(node.device),
                                            th, gt.reentrant_depth, gt.id, ready))

    def ids(self) -> list[str]:
        return [r.node_id for r in self.records if r.name != "GraphRoot"]

    def rows(self) -> list[dict]:
        out = []
        for r in self.records:
            if r.name == "GraphRoot":
                continue
            d = r.row()
            d["position"] = len(out)
            out.append(d)
        return out


@dataclass
class Divergence:
    position: int
    thread: str | None
    expected: dict | None
    got: dict | None
    detail: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"position {self.position}" + (f" of worker {self.thread!r}" if self.thread else "")
        exp = _short(self.expected)
        got = _short(self.got)
        lines = [f"order differs at {where}: expected {exp}, got {got}"]
        return "\n".join(lines + self.detail)


def _short(row: dict | None) -> str:
    if row is None:
        return "(end of order)"
    return f"{row.get('id')} ({row.get('name')}, seq {row.get('seq')})"


def compare_orders(expected: list[dict], got: list[dict], per_worker: bool) -> Divergence | None:
    """The first difference between two orders (by node id), or None."""
    if per_worker:
        groups_e, groups_g = _by_thread(expected), _by_thread(got)
        for th in sorted(set(groups_e) | set(groups_g)):
            d = _first(groups_e.get(th, []), groups_g.get(th, []), th)
            if d is not None:
                return d
        return None
    return _first(expected, got, None)


def _by_thread(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r.get("thread", "?"), []).append(r)
    return out


def _first(expected, got, thread) -> Divergence | None:
    for i in range(max(len(expected), len(got))):
        e = expected[i] if i < len(expected) else None
        g = got[i] if i < len(got) else None
        if (e or {}).get("id") != (g or {}).get("id"):
            d = Divergence(i, thread, e, g)
            ready = (g or {}).get("ready")
            if ready:
                d.detail.append("ready set at that pop (node, reentrant depth, seq; the queue pops the "
                                "largest (depth, seq), ties as libstdc++'s heap):")
                for k, (nid, depth, seq) in enumerate(ready):
                    mark = "  <- popped" if k == 0 else ""
                    d.detail.append(f"  {nid:<24} depth {depth:<3} seq {seq}{mark}")
            return d
    return None
