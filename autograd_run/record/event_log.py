"""EventLog: the Recorder's hot events (task pushed and popped, node start and end, worker idle).

A traced run produces four or five of these per node, so they are kept as
fixed-size records rather than Python objects: the compiled core's
``EventLog`` (``engine/_core.c``) appends them straight from the compiled
ready queue and worker loop; ``EventLogPy`` below is its pure-Python twin
with the same methods, tables and record layout, used when the core is not
built. Either's ``take()`` hands the records over as bytes in
``EVENT_DTYPE`` layout, with the tables the records index into (with
``take(forget_nodes=True)`` the log starts a new node table, so a run of
many passes does not keep every pass's GraphRoot):

* ``nodes``: each distinct node, in order of first appearance (a record's
  ``node`` field is a position here, -1 for none);
* thread idents (``thread``), each thread in order of first appearance;
* ``queues``: each distinct queue object (``queue``).

Record fields by kind (``a`` and ``b`` are kind-specific):

========  ==============  ===================  ==================================
kind      ``ts``          ``a``                ``b``
========  ==============  ===================  ==================================
PUSH/POP  stamp           GraphTask id (-1)    queue size after
START/END stamp           GraphTask id         the GraphTask's reentrant depth
IDLE      start of wait   end of wait          awaited GraphTask id, -1 for none
========  ==============  ===================  ==================================

A thread is named (``on_thread(ident)``) the first time it starts a node or
idles, as the Recorder always did. The clock is CLOCK_MONOTONIC
(``time.perf_counter_ns`` on Linux) unless one is given; ``now()`` reads the
same clock, so the Recorder's other events share its time base.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from autograd_run.engine import core

PUSH, POP, START, END, IDLE = 1, 2, 3, 4, 5

#: One record: 32 bytes, the C struct ``Event`` of ``engine/_core.c``.
EVENT_DTYPE = np.dtype({"names": ["ts", "a", "node", "b", "thread", "queue", "kind"],
                        "formats": ["<i8", "<i8", "<i4", "<i4", "<u2", "<u2", "u1"],
                        "offsets": [0, 8, 16, 20, 24, 26, 28], "itemsize": 32})

_INT32_MAX = 2**31 - 1


class EventLogPy:
    """The pure-Python twin of the compiled ``EventLog``: the same records and tables."""

    def __init__(self, clock=None, on_thread=None):
        self._clock = clock or time.perf_counter_ns
        self._on_thread = on_thread
        self._records: list[tuple] = []
        self._nodes: list = []
        self._node_index: dict = {}  # id(node) -> position (the node list keeps each alive)
        self._threads: list[int] = []
        self._named: set[int] = set()
        self._queues: list = []
        #: Guards the records and the node table together (``take(forget_nodes=True)`` swaps both).
        self._lock = threading.Lock()

    def now(self) -> int:
        return self._clock()

    def __len__(self) -> int:
        return len(self._records)

    def _node(self, node) -> int:
        if node is None:
            return -1
        i = self._node_index.get(id(node))
        if i is None:
            i = self._node_index[id(node)] = len(self._nodes)
            self._nodes.append(node)
        return i

    def _thread(self, name: bool) -> int:
        ident = threading.get_ident()
        try:
            i = self._threads.index(ident)
        except ValueError:
            i = len(self._threads)
            self._threads.append(ident)
        if name and ident not in self._named:
            self._named.add(ident)
            if self._on_thread is not None:
                self._on_thread(ident)
        return i

    def _queue(self, queue) -> int:
        for i, q in enumerate(self._queues):
            if q is queue:
                return i
        self._queues.append(queue)
        return len(self._queues) - 1

    def _append(self, kind: int, queue, gt, node, b: int) -> None:
        thread = self._thread(kind == START)
        q = self._queue(queue) if kind in (PUSH, POP) else 0
        gid = -1 if gt is None else gt.id
        if kind in (START, END):
            b = gt.reentrant_depth
        ts = self._clock()
        with self._lock:
            self._records.append((ts, gid, self._node(node), min(b, _INT32_MAX), thread, q, kind))

    def push(self, queue, gt, node, depth: int) -> None:
        self._append(PUSH, queue, gt, node, depth)

    def pop(self, queue, gt, node, depth: int) -> None:
        self._append(POP, queue, gt, node, depth)

    def start(self, gt, node) -> None:
        self._append(START, None, gt, node, 0)

    def end(self, gt, node) -> None:
        self._append(END, None, gt, node, 0)

    def idle(self, queue, start_ns: int, end_ns: int, waiting_for) -> None:
        thread = self._thread(True)
        wid = -1 if waiting_for is None else min(waiting_for.id, _INT32_MAX)
        q = self._queue(queue)
        with self._lock:
            self._records.append((start_ns, end_ns, -1, wid, thread, q, IDLE))

    def take(self, forget_nodes: bool = False) -> tuple[bytes, list, list, list]:
        """(records as bytes, node table, thread idents, queue table); the records are moved out, and with
        ``forget_nodes`` the node table too (later records index a new one)."""
        with self._lock:  # no record between taking the records and forgetting the table they index
            records, self._records = self._records, []
            nodes = self._nodes
            if forget_nodes:
                self._nodes, self._node_index = [], {}
            else:
                nodes = list(nodes)
        arr = np.zeros(len(records), dtype=EVENT_DTYPE)  # zeroed: the padding bytes too, as the C struct's
        if records:
            arr[:] = records
        data = arr.tobytes()
        return data, nodes, list(self._threads), list(self._queues)


#: The compiled log where the core is built, else the twin.
EventLog = core.EventLog or EventLogPy
