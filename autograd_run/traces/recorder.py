"""Recorder: a tracer that keeps timestamped events of a run.

Events are plain tuples appended to a list (cheap on the hot path; their
layouts are listed in ``recording``); the clock is injected
(``time.perf_counter_ns`` by default). After the run, ``recording()``
returns them as a typed ``Recording``, which trace writers and the summary
read. Appending to a list is atomic under the GIL, so workers need no lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from autograd_run.engine.tracer import Tracer
from autograd_run.traces.recording import (
    ERROR, EVENT, GT_END, GT_START, IDLE, LOCK_WAIT, NAN, NODE_END, NODE_START, POP, PUSH, SKIP, SYNC, Recording,
)


@dataclass
class Recorder(Tracer):
    clock: Callable[[], int] = time.perf_counter_ns
    events: list = field(default_factory=list)
    #: Python thread ident -> thread name, filled as threads first run a node (or idle, or start a task).
    threads: dict = field(default_factory=dict)
    #: Python thread ident -> OS thread id (what trace viewers show; reading it is a system call,
    #: so events carry the cheap ident and this maps it once per thread).
    os_tids: dict = field(default_factory=dict)
    enabled = True

    def __post_init__(self):
        # The hot hooks are closures over locals (no attribute lookups per event);
        # they shadow the methods below, which document the same behaviour.
        append = self.events.append
        clock = self.clock
        tid = threading.get_ident
        threads = self.threads
        os_tids = self.os_tids

        def name_thread() -> int:
            t = tid()
            if t not in threads:
                threads[t] = threading.current_thread().name
                os_tids[t] = threading.get_native_id()
            return t

        def task_pushed(queue, gt, node, depth):
            append((PUSH, clock(), tid(), queue.name, gt.id if gt is not None else -1, node, depth))

        def task_popped(queue, gt, node, depth):
            append((POP, clock(), tid(), queue.name, gt.id, node, depth))

        def node_start(gt, node):
            append((NODE_START, clock(), name_thread(), gt.id, gt.reentrant_depth, node))

        def node_end(gt, node):
            append((NODE_END, clock(), tid(), gt.id, gt.reentrant_depth, node))

        self.task_pushed = task_pushed
        self.task_popped = task_popped
        self.node_start = node_start
        self.node_end = node_end
        self._name_thread = name_thread

    def _tid(self) -> int:
        return self._name_thread()

    def recording(self) -> Recording:
        """The events so far as a typed ``Recording``."""
        # Copies: a worker of a stopped run may still be finishing a node and recording it.
        return Recording.from_events(list(self.events), dict(self.threads), dict(self.os_tids))

    def drain(self) -> Recording:
        """The events so far as a typed ``Recording``, forgotten here: a run of many passes drains the
        recorder after each one and folds it into its summary, so memory stays flat. An event appended
        meanwhile by a worker stays for the next drain."""
        events = self.events
        n = len(events)
        batch = events[:n]
        del events[:n]  # one operation under the GIL: an append racing with it lands after the first n
        return Recording.from_events(batch, dict(self.threads), dict(self.os_tids))

    def graph_task_start(self, gt) -> None:
        self.events.append((GT_START, self.clock(), self._tid(), gt.id, gt.reentrant_depth))

    def graph_task_end(self, gt) -> None:
        self.events.append((GT_END, self.clock(), self._tid(), gt.id,
                            None if gt.error is None else str(gt.error)))

    def task_pushed(self, queue, gt, node, depth) -> None:  # replaced per instance (see __post_init__)
        self.events.append((PUSH, self.clock(), self._tid(), queue.name, gt.id if gt is not None else -1, node, depth))

    def task_popped(self, queue, gt, node, depth) -> None:  # replaced per instance
        self.events.append((POP, self.clock(), self._tid(), queue.name, gt.id, node, depth))

    def node_start(self, gt, node) -> None:  # replaced per instance
        self.events.append((NODE_START, self.clock(), self._tid(), gt.id, gt.reentrant_depth, node))

    def node_end(self, gt, node) -> None:  # replaced per instance
        self.events.append((NODE_END, self.clock(), self._tid(), gt.id, gt.reentrant_depth, node))

    def node_skipped(self, gt, node) -> None:
        self.events.append((SKIP, self.clock(), self._tid(), gt.id, node))

    def lock_wait(self, lock_name, gt, waited_ns) -> None:
        self.events.append((LOCK_WAIT, self.clock(), self._tid(), lock_name, gt.id if gt is not None else -1, waited_ns))

    def sync(self, gt, producer, consumer, src, dst) -> None:
        self.events.append((SYNC, self.clock(), self._tid(), gt.id, producer, consumer, src, dst))

    def event_record(self, gt, node, stream, event_id) -> None:
        self.events.append((EVENT, self.clock(), self._tid(), gt.id, "record", node, stream, event_id))

    def event_wait(self, gt, node, stream, event_id) -> None:
        self.events.append((EVENT, self.clock(), self._tid(), gt.id, "wait", node, stream, event_id))

    def error(self, gt, node, exc) -> None:
        self.events.append((ERROR, self.clock(), self._tid(), gt.id, node, str(exc)))

    def nan_detected(self, gt, node, index) -> None:
        self.events.append((NAN, self.clock(), self._tid(), gt.id, node, index))

    def worker_idle(self, queue, start_ns, end_ns, waiting_for) -> None:
        self.events.append((IDLE, start_ns, self._tid(), queue.name, end_ns,
                            None if waiting_for is None else waiting_for.id))
