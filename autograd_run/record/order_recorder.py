"""OrderRecorder: a tracer that records the executed order of a run.

At each node start it records the position, node, GraphTask, reentrant
depth, thread and pass (the number of top-level backward calls started
before it, so ``--repeat`` passes can be told apart); with
``snapshots=True`` also the ready set (with priority keys) at the pop that
chose the node, so a mismatch can be explained. ``rows()`` gives the rows of
the order file format (``traces.order``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from autograd_run.engine.tracer import Tracer
from autograd_run.ops import is_graph_root


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
    #: Top-level backward calls started before this node's (0 for the first pass).
    pass_index: int
    #: With snapshots: the ready set at the pop that chose this node, as
    #: (node id, reentrant depth, seq) of the chosen node first, then the rest.
    ready: tuple = ()
    graph_root: bool = False

    def row(self) -> dict:
        d = {"position": self.position, "id": self.node_id, "name": self.name, "seq": self.seq,
             "device": self.device, "thread": self.thread, "depth": self.depth, "graph_task": self.graph_task,
             "pass": self.pass_index}
        if self.ready:
            d["ready"] = [list(r) for r in self.ready]
        return d


class OrderRecorder(Tracer):
    enabled = True

    def __init__(self, snapshots: bool = False):
        self.records: list[OrderRecord] = []
        self.snapshots = snapshots
        self._lock = threading.Lock()  # guards records and _passes
        self._passes = 0
        self._last_pop = threading.local()

    def graph_task_start(self, gt) -> None:
        if gt.reentrant_depth == 0:
            with self._lock:
                self._passes += 1

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
                                            th, gt.reentrant_depth, gt.id, max(0, self._passes - 1), ready,
                                            is_graph_root(node)))

    def executed(self) -> list[OrderRecord]:
        """The records of the graph's own nodes (the engine's GraphRoot left out)."""
        return [r for r in self.records if not r.graph_root]

    def ids(self) -> list[str]:
        return [r.node_id for r in self.executed()]

    def rows(self) -> list[dict]:
        out = []
        for k, r in enumerate(self.executed()):
            d = r.row()
            d["position"] = k
            out.append(d)
        return out
