"""The engine's tracing hook interface. The default tracer does nothing.

The engine calls these hooks only when ``tracer.enabled`` is true, so an
idle tracer costs one attribute test per hook site. Implementations stamp
their own clock; the engine passes the facts (which queue, which node,
which GraphTask, which thread). ``autograd_run.record.recorder`` records
them; the engine itself never formats anything.

Every hook may be called from any worker thread.
"""

from __future__ import annotations


class Tracer:
    enabled = False
    #: A compiled ``EventLog`` (``engine.core``) that takes this tracer's hot hooks (task pushed and
    #: popped, node start and end, worker idle) straight from the compiled queue and worker loop,
    #: which then call only ``others`` (the remaining tracers, or None) for those hooks.
    event_log = None
    others = None

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
        """``consumer`` waits for ``producer``'s gradient, made on stream ``src``, on stream ``dst``."""

    def event_record(self, gt, node, stream: str, event_id: int) -> None:
        """An event was recorded on ``stream`` after ``node`` produced a gradient there (node None: the caller)."""

    def event_wait(self, gt, node, stream: str, event_id: int) -> None:
        """``stream`` was made to wait for event ``event_id``, for ``node`` (the consumer), or None (the caller)."""

    def error(self, gt, node, exc: BaseException) -> None:
        """``node`` raised ``exc``; its GraphTask is now failed."""

    def nan_detected(self, gt, node, index: int) -> None:
        """Anomaly mode found NaN in ``node``'s output ``index``."""

    def worker_idle(self, queue, start_ns: int, end_ns: int, waiting_for) -> None:
        """A worker waited on an empty ``queue`` from ``start_ns`` to ``end_ns``.

        ``waiting_for`` is the GraphTask its loop runs until (a caller, or a
        worker inside a reentrant call, waiting for that call to finish); None
        for a device thread serving its queue with no call of its own.
        """


NULL_TRACER = Tracer()


#: The hook names a tracer may implement (every method of ``Tracer`` above).
HOOKS = tuple(name for name, v in vars(Tracer).items() if callable(v) and not name.startswith("_"))


class Tracers(Tracer):
    """Several tracers behind one: each hook calls, in order, the tracers that implement it.

    Built once: a hook that no tracer implements stays the no-op, a hook
    implemented by one tracer is that tracer's bound method itself (no
    wrapper on the hot path), and only hooks implemented by several get a
    loop. Disabled tracers are left out. ``enabled`` is true when any is.
    """

    def __init__(self, *tracers: Tracer):
        self.tracers = [t for t in tracers if t is not None and t.enabled]
        self.enabled = bool(self.tracers)
        logged = next((t for t in self.tracers if t.event_log is not None), None)
        if logged is not None:
            self.event_log = logged.event_log
            rest = [t for t in self.tracers if t is not logged]
            if logged.others is not None:
                rest.insert(0, logged.others)
            self.others = Tracers(*rest) if rest else None
        #: The hooks some tracer here implements (the compiled engine calls no other of the hot ones).
        self.implemented = frozenset(name for name in HOOKS if any(_implements(t, name) for t in self.tracers))
        for name in HOOKS:
            impls = [getattr(t, name) for t in self.tracers if _implements(t, name)]
            if len(impls) == 1:
                setattr(self, name, impls[0])
            elif impls:
                setattr(self, name, _fan(impls))


def _implements(tracer: Tracer, name: str) -> bool:
    """Whether ``tracer`` overrides hook ``name`` (on its class or, as the Recorder's closures, on itself)."""
    if name in vars(tracer) if hasattr(tracer, "__dict__") else False:
        return True
    return getattr(type(tracer), name, None) is not getattr(Tracer, name)


def _fan(impls):
    def hook(*args):
        for fn in impls:
            fn(*args)
    return hook
