"""The engine's tracing hook interface. The default tracer does nothing.

The engine calls these hooks only when ``tracer.enabled`` is true, so an
idle tracer costs one attribute test per hook site. Implementations stamp
their own clock; the engine passes the facts (which queue, which node,
which GraphTask, which thread). ``autograd_run.traces.recorder`` records
them; the engine itself never formats anything.

Every hook may be called from any worker thread.
"""

from __future__ import annotations


class Tracer:
    enabled = False

    def graph_task_start(self, gt) -> None:
        """A backward call created GraphTask ``gt`` (after dependencies are counted)."""

    def graph_task_end(self, gt) -> None:
        """``gt`` completed (successfully or with ``gt.error`` set)."""

    def task_pushed(self, queue, gt, node, depth: int) -> None:
        """A NodeTask for ``node`` (None for a wake-up) was pushed onto ``queue``; ``depth`` = queue size after."""

    def task_popped(self, queue, gt, node, depth: int) -> None:
        """A worker popped the task for ``node`` from ``queue``; ``depth`` = queue size after."""

    def node_start(self, gt, node) -> None:
        """``node`` starts running on this thread (pre-hooks, rule, post-hooks follow)."""

    def node_end(self, gt, node) -> None:
        """``node`` finished running on this thread (before its outputs are routed)."""

    def node_skipped(self, gt, node) -> None:
        """``node`` was popped but not run: not needed (exec_info) or its GraphTask failed."""

    def lock_wait(self, lock_name: str, gt, waited_ns: int) -> None:
        """This thread waited ``waited_ns`` to acquire ``lock_name`` (reported only when the lock was contended:
        an uncontended acquisition is not timed, so tracing stays cheap)."""

    def sync(self, gt, producer, consumer, src: str, dst: str) -> None:
        """``consumer`` must wait for ``producer``'s gradient made on another stream/device."""

    def error(self, gt, node, exc: BaseException) -> None:
        """``node`` raised ``exc``; its GraphTask is now failed."""

    def nan_detected(self, gt, node, index: int) -> None:
        """Anomaly mode found NaN in ``node``'s output ``index``."""

    def worker_idle(self, queue, start_ns: int, end_ns: int) -> None:
        """A worker waited on an empty ``queue`` from ``start_ns`` to ``end_ns``."""


NULL_TRACER = Tracer()
