"""Recorder: a tracer that keeps timestamped events of a run.

The hot events (a task pushed or popped, a node started or ended, a worker
idle) go to an ``EventLog`` as fixed-size records: the compiled ready queue
and worker loop append them without calling into Python, the pure-Python
engine through the log's methods, which are this tracer's hooks. The other
events (GraphTask start and end, skips, lock waits, syncs, stream events,
errors, NaNs) are plain tuples in ``rare`` (layouts in ``recording``). The
clock is injected (CLOCK_MONOTONIC, i.e. ``time.perf_counter_ns``, by
default); all events share it. After the run ``recording()`` returns them
as a typed ``Recording``, which trace writers and the summary read.
Appending is done with the GIL held, so workers need no lock.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from autograd_run.engine.tracer import Tracer
from autograd_run.record import event_log as L
from autograd_run.record.recording import (
    ERROR, EVENT, GT_END, GT_START, IDLE, LOCK_WAIT, NAN, NODE_END, NODE_START, POP, PUSH, SKIP, SYNC, Recording,
)


class Recorder(Tracer):
    enabled = True

    def __init__(self, clock: Callable[[], int] | None = None):
        #: Python thread ident -> thread name, filled as threads first run a node (or idle, or start a task).
        self.threads: dict[int, str] = {}
        #: Python thread ident -> OS thread id (what trace viewers show; reading it is a system call,
        #: so events carry the cheap ident and this maps it once per thread).
        self.os_tids: dict[int, int] = {}
        #: The hot events (see the module docstring).
        self.event_log = L.EventLog(clock, self._on_thread)
        #: The clock of every event (the log's).
        self.clock = self.event_log.now
        #: The other events, as tuples.
        self.rare: list[tuple] = []
        self._taken: list[bytes] = []
        self._tables = ([], [], [])
        log = self.event_log
        # The hot hooks are the log's own methods (the compiled engine does not call them).
        self.task_pushed = log.push
        self.task_popped = log.pop
        self.node_start = log.start
        self.node_end = log.end
        self.worker_idle = log.idle

    def _on_thread(self, ident: int) -> None:
        if ident not in self.threads:
            self.threads[ident] = threading.current_thread().name
            self.os_tids[ident] = threading.get_native_id()

    def _tid(self) -> int:
        ident = threading.get_ident()
        if ident not in self.threads:
            self._on_thread(ident)
        return ident

    def flush(self) -> None:
        """Move the event log's records here (the log lets go of the last GraphTask it saw)."""
        self._take()

    def _take(self) -> None:
        data, nodes, idents, queues = self.event_log.take()
        if data:
            self._taken.append(data)
        self._tables = (nodes, idents, queues)

    def recording(self) -> Recording:
        """The events so far as a typed ``Recording``."""
        self._take()
        nodes, idents, queues = self._tables
        data = self._taken[0] if len(self._taken) == 1 else b"".join(self._taken)
        self._taken = [data] if data else []
        # Copies: a worker of a stopped run may still be finishing a node and recording it.
        return Recording.from_log(data, nodes, idents, queues, list(self.rare), dict(self.threads),
                                  dict(self.os_tids))

    def drain(self) -> Recording:
        """The events so far as a typed ``Recording``, forgotten here (the tables of nodes, threads and
        queues are kept): a run of many passes drains the recorder after each one and folds it into its
        summary, so memory stays flat. An event recorded meanwhile by a worker stays for the next drain."""
        rare = self.rare
        n = len(rare)
        batch = rare[:n]
        del rare[:n]  # one operation under the GIL: an append racing with it lands after the first n
        # the log forgets its node table too: a pass's GraphRoot (its root gradients) is not kept
        data, nodes, idents, queues = self.event_log.take(True)
        chunks = self._taken + ([data] if data else [])
        self._taken = []
        self._tables = ([], idents, queues)
        return Recording.from_log(chunks, nodes, idents, queues, batch, dict(self.threads), dict(self.os_tids))

    @property
    def events(self) -> list[tuple]:
        """Every event so far as a tuple (the layouts in ``recording``), in the order they were recorded
        (by time stamp; an idle span is recorded when it ends)."""
        self._take()
        nodes, idents, queues = self._tables
        hot = []
        for data in self._taken:
            for ts, a, n, b, th, q, kind in np.frombuffer(data, dtype=L.EVENT_DTYPE).tolist():
                ident, node = idents[th], nodes[n] if n >= 0 else None
                if kind == L.PUSH or kind == L.POP:
                    hot.append((PUSH if kind == L.PUSH else POP, ts, ident, queues[q].name, a, node, b))
                elif kind == L.START or kind == L.END:
                    hot.append((NODE_START if kind == L.START else NODE_END, ts, ident, a, b, node))
                else:
                    hot.append((IDLE, ts, ident, queues[q].name, a, None if b < 0 else b))
        return sorted(hot + self.rare, key=lambda e: e[4] if e[0] == IDLE else e[1])

    def graph_task_start(self, gt) -> None:
        self.rare.append((GT_START, self.clock(), self._tid(), gt.id, gt.reentrant_depth))

    def graph_task_end(self, gt) -> None:
        self.rare.append((GT_END, self.clock(), self._tid(), gt.id, None if gt.error is None else str(gt.error)))

    def node_skipped(self, gt, node) -> None:
        self.rare.append((SKIP, self.clock(), self._tid(), gt.id, node))

    def lock_wait(self, lock_name, gt, waited_ns) -> None:
        self.rare.append((LOCK_WAIT, self.clock(), self._tid(), lock_name, gt.id if gt is not None else -1, waited_ns))

    def sync(self, gt, producer, consumer, src, dst) -> None:
        self.rare.append((SYNC, self.clock(), self._tid(), gt.id, producer, consumer, src, dst))

    def event_record(self, gt, node, stream, event_id) -> None:
        self.rare.append((EVENT, self.clock(), self._tid(), gt.id, "record", node, stream, event_id))

    def event_wait(self, gt, node, stream, event_id) -> None:
        self.rare.append((EVENT, self.clock(), self._tid(), gt.id, "wait", node, stream, event_id))

    def error(self, gt, node, exc) -> None:
        self.rare.append((ERROR, self.clock(), self._tid(), gt.id, node, str(exc)))

    def nan_detected(self, gt, node, index) -> None:
        self.rare.append((NAN, self.clock(), self._tid(), gt.id, node, index))
