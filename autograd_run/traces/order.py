"""OrderRecorder: the executed order of nodes, one record per node run.

A tracer (see ``autograd_run.engine.tracer``) that records, at each node
start, the position, node, GraphTask, reentrant depth and thread. It is what
``--order-out`` writes and what order tests compare with PyTorch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

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


class OrderRecorder(Tracer):
    enabled = True

    def __init__(self):
        self.records: list[OrderRecord] = []
        self._lock = threading.Lock()  # guards records

    def node_start(self, gt, node) -> None:
        th = threading.current_thread().name
        with self._lock:
            self.records.append(OrderRecord(len(self.records), node.id, node.name, node.seq, str(node.device),
                                            th, gt.reentrant_depth, gt.id))

    def ids(self) -> list[str]:
        return [r.node_id for r in self.records if r.name != "GraphRoot"]
