"""Recording: what a traced run did, as typed records read by field name.

The ``Recorder`` (a tracer) appends plain tuples on the hot path; after the
run ``Recording.from_events`` pairs them once (node start with its end, a
task's push with its pop, a GraphTask's start with its end) into the typed
records below. Trace writers, the summary and order tools are pure
functions over a ``Recording``; nothing else reads the raw tuples.

Times are ``int`` nanoseconds of the recorder's clock; ``tid`` is the OS
thread id (what trace viewers show); ``gt`` a GraphTask id; ``node`` the
graph's ``Node`` (or a GraphRoot, see ``ops.is_graph_root``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from autograd_run.engine.threads import ThreadKind, thread_kind, thread_sort_key, worker_label

# Raw event kinds: the first field of each tuple the Recorder appends.
NODE_START = "node_start"    # (kind, ts, ident, gt_id, depth, node)
NODE_END = "node_end"        # (kind, ts, ident, gt_id, depth, node)
PUSH = "push"                # (kind, ts, ident, queue_name, gt_id, node, queue_depth)
POP = "pop"                  # (kind, ts, ident, queue_name, gt_id, node, queue_depth)
SKIP = "skip"                # (kind, ts, ident, gt_id, node)
LOCK_WAIT = "lock_wait"      # (kind, ts_end, ident, lock_name, gt_id, waited_ns)
SYNC = "sync"                # (kind, ts, ident, gt_id, producer, consumer, src, dst)
ERROR = "error"              # (kind, ts, ident, gt_id, node, message)
NAN = "nan"                  # (kind, ts, ident, gt_id, node, index)
IDLE = "idle"                # (kind, start, ident, queue_name, end, waited_gt_id_or_None)
GT_START = "gt_start"        # (kind, ts, ident, gt_id, depth)
GT_END = "gt_end"            # (kind, ts, ident, gt_id, error_message_or_None)
EVENT = "event"              # (kind, ts, ident, gt_id, "record"|"wait", node_or_None, stream, event_id)


class ThreadInfo(NamedTuple):
    tid: int
    #: The Python thread name (``autograd-run cuda:0``, ``MainThread``, ...).
    name: str
    kind: ThreadKind
    #: Short display name (``cuda:0``, ``reentrant-1``, or the caller's name).
    label: str


class QueueWait(NamedTuple):
    """A task's time in a ready queue: pushed at ``pushed``, popped by thread ``tid`` at ``popped``."""

    gt: int
    node: Any
    queue: str
    pushed: int
    popped: int
    tid: int

    @property
    def waited(self) -> int:
        return self.popped - self.pushed


class NodeSlice(NamedTuple):
    """One execution of a node on thread ``tid`` from ``start`` to ``end``."""

    gt: int
    depth: int
    node: Any
    tid: int
    start: int
    end: int
    #: The queue wait of the task that ran it (None if its push was not recorded).
    wait: QueueWait | None

    @property
    def duration(self) -> int:
        return self.end - self.start


class QueueSample(NamedTuple):
    """A queue's depth right after a push (``pushed`` true) or a pop; ``node`` None for a wake-up task."""

    ts: int
    tid: int
    queue: str
    gt: int
    node: Any
    depth: int
    pushed: bool


class Skip(NamedTuple):
    """A popped task whose node did not run (not needed for ``grad()``, or its GraphTask had failed)."""

    ts: int
    tid: int
    gt: int
    node: Any


class LockWait(NamedTuple):
    """Thread ``tid`` waited ``waited`` ns for a contended lock, acquiring it at ``end``."""

    end: int
    tid: int
    lock: str
    gt: int
    waited: int


class Sync(NamedTuple):
    """``consumer`` waited for ``producer``'s gradient made on another device or stream."""

    ts: int
    tid: int
    gt: int
    producer: Any
    consumer: Any
    src: str
    dst: str


class StreamEvent(NamedTuple):
    """An event recorded on, or waited for by, ``stream`` (for ``node``; None: the caller)."""

    ts: int
    tid: int
    gt: int
    action: str
    node: Any
    stream: str
    event: int


class KernelSlice(NamedTuple):
    """Work of ``node`` on an accelerator stream (simulated runs): from ``start`` to ``end``."""

    stream: str
    node: Any
    start: int
    end: int


class Failure(NamedTuple):
    ts: int
    tid: int
    gt: int
    node: Any
    message: str


class NanFound(NamedTuple):
    """Anomaly mode found NaN in ``node``'s output ``index``."""

    ts: int
    tid: int
    gt: int
    node: Any
    index: int


class Idle(NamedTuple):
    """A worker blocked on an empty queue: serving it, or waiting for GraphTask ``waiting_for`` to finish."""

    start: int
    end: int
    tid: int
    queue: str
    #: The GraphTask id whose completion the blocked loop waits for (its caller's own
    #: call, or the reentrant call a pool thread runs); None for a device thread serving its queue.
    waiting_for: int | None = None


class GraphTaskSpan(NamedTuple):
    """One backward call: reentrant ``depth`` (0 for a top-level call), from creation to completion."""

    gt: int
    depth: int
    start: int
    end: int | None
    tid: int
    error: str | None


@dataclass
class Recording:
    #: By OS thread id, in display order (callers, device workers by index, pool threads).
    threads: dict[int, ThreadInfo] = field(default_factory=dict)
    slices: list[NodeSlice] = field(default_factory=list)
    waits: list[QueueWait] = field(default_factory=list)
    queue_samples: list[QueueSample] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    lock_waits: list[LockWait] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    stream_events: list[StreamEvent] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)
    nans: list[NanFound] = field(default_factory=list)
    idles: list[Idle] = field(default_factory=list)
    graph_tasks: list[GraphTaskSpan] = field(default_factory=list)
    #: Accelerator stream work, when known (a simulation); empty for real runs.
    kernels: list[KernelSlice] = field(default_factory=list)
    #: True for a simulated run (times on a virtual clock).
    simulated: bool = False
    #: The run's span: from the first top-level backward call's start to the last call's completion
    #: (or the last node's end, if later), with idle spans clipped to it: the device threads' wait
    #: before the first call and after the last is not part of the run. Without graph-task spans,
    #: first to last event. (0, 0 when empty.)
    start: int = 0
    end: int = 0

    @property
    def empty(self) -> bool:
        return self.end == self.start == 0

    def thread_name(self, tid: int) -> str:
        t = self.threads.get(tid)
        return t.name if t is not None else str(tid)

    @staticmethod
    def from_events(events: list[tuple], threads: dict[int, str], os_tids: dict[int, int] | None = None
                    ) -> "Recording":
        """Pair the Recorder's raw tuples (``threads``: ident -> name; ``os_tids``: ident -> OS id)."""
        os_tids = os_tids or {}

        def os_tid(ident: int) -> int:
            t = os_tids.get(ident)
            return t if t is not None else ident & 0x7FFFFFFF

        rec = Recording()
        infos = {}
        for ident, name in threads.items():
            t = os_tid(ident)
            infos[t] = ThreadInfo(t, name, thread_kind(name), worker_label(name))
        rec.threads = dict(sorted(infos.items(), key=lambda kv: thread_sort_key(kv[1].name)))
        if not events:
            return rec
        first, last = float("inf"), float("-inf")
        open_nodes: dict[tuple, tuple] = {}
        pushed: dict[tuple, tuple] = {}
        waits: dict[tuple, QueueWait] = {}
        gts: dict[int, list] = {}
        for ev in events:
            kind, ts = ev[0], ev[1]
            tid = os_tid(ev[2])
            if ts < first:
                first = ts
            if ts > last:
                last = ts
            if kind == NODE_START:
                open_nodes[(tid, ev[3], ev[5])] = (ts, ev[4])
            elif kind == NODE_END:
                gt, node = ev[3], ev[5]
                start, depth = open_nodes.pop((tid, gt, node), (ts, ev[4]))
                rec.slices.append(NodeSlice(gt, depth, node, tid, start, ts, waits.get((gt, node))))
            elif kind == PUSH or kind == POP:
                _, _, _, queue, gt, node, depth = ev
                rec.queue_samples.append(QueueSample(ts, tid, queue, gt, node, depth, kind == PUSH))
                if node is not None:
                    if kind == PUSH:
                        pushed[(gt, node)] = (ts, queue)
                    else:
                        p = pushed.pop((gt, node), None)
                        if p is not None:
                            w = QueueWait(gt, node, p[1], p[0], ts, tid)
                            waits[(gt, node)] = w
                            rec.waits.append(w)
            elif kind == SKIP:
                rec.skips.append(Skip(ts, tid, ev[3], ev[4]))
            elif kind == LOCK_WAIT:
                rec.lock_waits.append(LockWait(ts, tid, ev[3], ev[4], ev[5]))
            elif kind == SYNC:
                rec.syncs.append(Sync(ts, tid, *ev[3:8]))
            elif kind == EVENT:
                rec.stream_events.append(StreamEvent(ts, tid, *ev[3:8]))
            elif kind == ERROR:
                rec.errors.append(Failure(ts, tid, ev[3], ev[4], ev[5]))
            elif kind == NAN:
                rec.nans.append(NanFound(ts, tid, ev[3], ev[4], ev[5]))
            elif kind == IDLE:
                end = ev[4]
                if end > last:
                    last = end
                rec.idles.append(Idle(ts, end, tid, ev[3], ev[5]))
            elif kind == GT_START:
                gts[ev[3]] = [ev[3], ev[4], ts, None, tid, None]
            elif kind == GT_END:
                span = gts.get(ev[3])
                if span is not None:
                    span[3], span[5] = ts, ev[4]
        rec.graph_tasks = [GraphTaskSpan(*s) for s in gts.values()]
        calls = [g for g in rec.graph_tasks if g.depth == 0]
        if calls:  # the run is its backward calls: not the threads' start before, nor a wake-up after them
            first = min(g.start for g in calls)
            if all(g.end is not None for g in calls):
                last = max(max(g.end for g in calls), max((sl.end for sl in rec.slices), default=first))
            rec.idles = [i._replace(start=max(i.start, first), end=min(i.end, last)) for i in rec.idles
                         if i.end > first and i.start < last]
        rec.start, rec.end = first, last
        return rec
