"""Recording: what a traced run did, as typed records read by field name, or as columns.

The ``Recorder`` (a tracer) keeps its hot events (pushes, pops, node starts
and ends, idle spans) as fixed-size records in an ``EventLog`` and the rest
as plain tuples; after the run ``Recording.from_log`` pairs them once (node
start with its end, a task's push with its pop, a GraphTask's start with
its end), the hot ones vectorised with numpy into ``Columns``.
``Recording.from_events`` does the same from tuples alone (the layouts
below), and a simulation builds its ``Columns`` directly (``from_columns``).

Either way a Recording offers both views, each made from the other on
first use and then kept: ``slices``, ``waits``, ``queue_samples`` and
``idles`` as lists of the typed records below, and ``columns()`` as numpy
arrays (what the summary and the trace writers read, so a million-node run
never makes a million record objects). A Recording is read-only once made,
except that a list-backed one may be filled in before it is first read.

Times are ``int`` nanoseconds of the recorder's clock; ``tid`` is the OS
thread id (what trace viewers show); ``gt`` a GraphTask id; ``node`` the
graph's ``Node`` (or a GraphRoot, see ``ops.is_graph_root``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from autograd_run.engine import core
from autograd_run.engine.threads import ThreadKind, thread_kind, thread_sort_key, worker_label
from autograd_run.record import event_log as L
from autograd_run.record import kernels

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
    """Work of ``node`` on an accelerator stream (simulated runs): from ``start`` to ``end``; ``node`` is a
    ``Collective`` for a simulated data-parallel collective."""

    stream: str
    node: Any
    start: int
    end: int


class Collective(NamedTuple):
    """A collective as a trace slice: the title is the whole description (the id is the name); what a
    Kineto trace says of it (``traces.kineto``): its ``kind`` (``all_reduce``, ``all_gather``,
    ``reduce_scatter``), its whole buffer's bytes (``nbytes``: the all-reduced bucket, the gathered
    parameters, the gradients reduce-scattered), their ``dtype`` and the ranks taking part (``group``;
    0: every rank); ``trigger``: the node whose run launched it (DDP: the AccumulateGrad node whose hook
    made its bucket ready), which a trace joins to it with a flow, or None (the final callback)."""

    id: str
    name: str
    kind: str = "all_reduce"
    nbytes: int = 0
    dtype: str = "float32"
    group: int = 0
    trigger: Any = None


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


class Counter(NamedTuple):
    """A value over time that the recording carries for its trace (a device's allocated bytes, from
    ``analysis.memory``): a counter track named ``name`` with its value under ``arg``; ``ts`` in the
    recording's clock (ns), ``values`` one per time."""

    name: str
    arg: str
    ts: np.ndarray
    values: np.ndarray


class GraphTaskSpan(NamedTuple):
    """One backward call: reentrant ``depth`` (0 for a top-level call), from creation to completion."""

    gt: int
    depth: int
    start: int
    end: int | None
    tid: int
    error: str | None


class Table:
    """Equal-length numpy columns, by attribute name."""

    def __init__(self, **columns: np.ndarray):
        self.__dict__.update(columns)
        self._n = len(next(iter(columns.values()))) if columns else 0

    def __len__(self) -> int:
        return self._n


def _i64(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64)


class Columns:
    """The hot records of a Recording as numpy columns (times int64 ns, tids OS thread ids).

    ``nodes`` is the node table and ``queues`` the queue names that the
    ``node`` and ``queue`` columns index (-1: none).

    * ``slices``: gt, depth, node, tid, start, end, wait (index into ``waits`` or -1), in end order;
    * ``waits``: gt, node, queue, pushed, popped, tid, in pop order, and the rows of the queue samples of
      its push and pop (``push_row``, ``pop_row``; -1 where not known: a Recording made from lists);
    * ``samples`` (queue samples): ts, tid, queue, gt, node, depth, pushed (bool), in event order;
    * ``idles``: start, end, tid, queue, waiting_for (-1: none), in event order.
    """

    def __init__(self, nodes: list, queues: list[str], slices: Table, waits: Table, samples: Table, idles: Table):
        self.nodes, self.queues = nodes, queues
        self.slices, self.waits, self.samples, self.idles = slices, waits, samples, idles
        self._codes: dict = {}  # node_codes' results

    def node_codes(self, attr: str, identity: bool = False) -> tuple[np.ndarray, list]:
        """``record.kernels.attr_codes`` of the node table (a code per node, the distinct values), made once
        per Columns: the summary and the trace writers each want the op's and the name's (a pass over
        every node object, ~0.15 µs a node at 2e5 nodes)."""
        key = (attr, identity)
        got = self._codes.get(key)
        if got is None:
            got = self._codes[key] = kernels.attr_codes(self.nodes, attr, identity)
        return got


def _empty_table(names: str, bool_cols: str = "") -> Table:
    cols = {n: np.zeros(0, dtype=np.int64) for n in names.split()}
    cols.update({n: np.zeros(0, dtype=bool) for n in bool_cols.split()})
    return Table(**cols)


class Recording:
    """What a traced run did (see the module docstring)."""

    def __init__(self, threads: dict[int, ThreadInfo] | None = None, slices: list | None = None,
                 waits: list | None = None, queue_samples: list | None = None, skips: list | None = None,
                 lock_waits: list | None = None, syncs: list | None = None, stream_events: list | None = None,
                 errors: list | None = None, nans: list | None = None, idles: list | None = None,
                 graph_tasks: list | None = None, kernels: list | None = None, simulated: bool = False,
                 start: int = 0, end: int = 0, counters: list | None = None):
        #: By OS thread id, in display order (callers, device workers by index, pool threads).
        self.threads: dict[int, ThreadInfo] = threads if threads is not None else {}
        self.skips: list[Skip] = skips if skips is not None else []
        self.lock_waits: list[LockWait] = lock_waits if lock_waits is not None else []
        self.syncs: list[Sync] = syncs if syncs is not None else []
        self.stream_events: list[StreamEvent] = stream_events if stream_events is not None else []
        self.errors: list[Failure] = errors if errors is not None else []
        self.nans: list[NanFound] = nans if nans is not None else []
        self.graph_tasks: list[GraphTaskSpan] = graph_tasks if graph_tasks is not None else []
        #: Accelerator stream work, when known (a simulation); empty for real runs.
        self.kernels: list[KernelSlice] = kernels if kernels is not None else []
        #: True for a simulated run (times on a virtual clock).
        self.simulated = simulated
        #: Counter tracks for the trace beyond the engine's own (``Counter``): added after the run by a model
        #: over it (``analysis.memory``'s allocated bytes per device).
        self.counters: list[Counter] = counters if counters is not None else []
        #: The run's span: from the first top-level backward call's start to the last call's completion
        #: (or the last node's end, if later), with idle spans clipped to it: the device threads' wait
        #: before the first call and after the last is not part of the run. Without graph-task spans,
        #: first to last event. (0, 0 when empty.)
        self.start, self.end = start, end
        self._lists: dict[str, list] = {"slices": slices if slices is not None else [],
                                         "waits": waits if waits is not None else [],
                                         "queue_samples": queue_samples if queue_samples is not None else [],
                                         "idles": idles if idles is not None else []}
        self._columns: Columns | None = None
        self._columns_key: tuple | None = None
        self._from_columns = False

    # -- the hot records as lists (made from the columns on first use) -------------
    def _list(self, name: str) -> list:
        if self._lists is None:
            self._lists = _lists_of(self._columns)
        return self._lists[name]

    def _set_list(self, name: str, value: list) -> None:
        if self._lists is None:
            self._lists = _lists_of(self._columns)
        self._lists[name] = value
        self._from_columns = False
        self._columns = None

    slices = property(lambda self: self._list("slices"), lambda self, v: self._set_list("slices", v),
                      doc="Node executions (``NodeSlice``), in end order.")
    waits = property(lambda self: self._list("waits"), lambda self, v: self._set_list("waits", v),
                     doc="Tasks' times in ready queues (``QueueWait``), in pop order.")
    queue_samples = property(lambda self: self._list("queue_samples"),
                             lambda self, v: self._set_list("queue_samples", v),
                             doc="Queue sizes after each push and pop (``QueueSample``).")
    idles = property(lambda self: self._list("idles"), lambda self, v: self._set_list("idles", v),
                     doc="Workers blocked on empty queues (``Idle``).")

    def columns(self) -> Columns:
        """The hot records as numpy columns (made from the lists on first use, and again if they grew)."""
        if self._from_columns:
            return self._columns
        lists = self._lists
        key = tuple((id(v), len(v)) for v in lists.values())
        if self._columns is None or self._columns_key != key:
            self._columns = _columns_of(lists["slices"], lists["waits"], lists["queue_samples"], lists["idles"])
            self._columns_key = key
        return self._columns

    @property
    def empty(self) -> bool:
        return self.end == self.start == 0

    def thread_name(self, tid: int) -> str:
        t = self.threads.get(tid)
        return t.name if t is not None else str(tid)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Recording):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _FIELDS)

    def __repr__(self) -> str:
        return (f"Recording({len(self.threads)} threads, {len(self.columns().slices)} slices, "
                f"{len(self.graph_tasks)} graph tasks{', simulated' if self.simulated else ''})")

    @staticmethod
    def from_events(events: list[tuple], threads: dict[int, str], os_tids: dict[int, int] | None = None
                    ) -> "Recording":
        """Pair raw event tuples (the layouts above; ``threads``: ident -> name; ``os_tids``: ident -> OS id)."""
        os_tids = os_tids or {}
        rec = Recording(threads=_thread_infos(threads, os_tids))
        if not events:
            return rec
        os_tid = _os_tid_fn(os_tids)
        first = last = events[0][1]
        open_nodes: dict[tuple, tuple] = {}
        pushed: dict[tuple, tuple] = {}
        waits: dict[tuple, QueueWait] = {}
        gts: dict[int, list] = {}
        slices, wait_list, samples, idles = rec.slices, rec.waits, rec.queue_samples, rec.idles
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
                slices.append(NodeSlice(gt, depth, node, tid, start, ts, waits.get((gt, node))))
            elif kind == PUSH or kind == POP:
                _, _, _, queue, gt, node, depth = ev
                samples.append(QueueSample(ts, tid, queue, gt, node, depth, kind == PUSH))
                if node is not None:
                    if kind == PUSH:
                        pushed[(gt, node)] = (ts, queue)
                    else:
                        p = pushed.pop((gt, node), None)
                        if p is not None:
                            w = QueueWait(gt, node, p[1], p[0], ts, tid)
                            waits[(gt, node)] = w
                            wait_list.append(w)
            elif kind == IDLE:
                end = ev[4]
                if end > last:
                    last = end
                idles.append(Idle(ts, end, tid, ev[3], ev[5]))
            else:
                _rare(rec, ev, tid, gts)
        rec.graph_tasks = [GraphTaskSpan(*s) for s in gts.values()]
        rec.start, rec.end = _span_of_calls(rec, first, last)
        return rec

    @staticmethod
    def from_columns(columns: Columns, **fields) -> "Recording":
        """A Recording whose hot records are ``columns`` (their typed lists made on first use); ``fields``:
        the other constructor arguments (not ``slices``, ``waits``, ``queue_samples``, ``idles``)."""
        rec = Recording(**fields)
        rec._columns, rec._lists, rec._from_columns = columns, None, True
        return rec

    @staticmethod
    def from_log(data: bytes | list[bytes], nodes: list, idents: list[int], queues: list, rare: list[tuple],
                 threads: dict[int, str], os_tids: dict[int, int] | None = None) -> "Recording":
        """A Recording of an ``EventLog``'s records (``take()``: ``data``, ``nodes``, ``idents``, ``queues``)
        and the Recorder's other events (``rare``, tuples in the layouts above). The node table is the
        Recording's from then on (a list is kept, not copied: ``take`` hands over a list of its own)."""
        os_tids = os_tids or {}
        rec = Recording(threads=_thread_infos(threads, os_tids))
        os_tid = _os_tid_fn(os_tids)
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        arrays = [np.frombuffer(c, dtype=L.EVENT_DTYPE) for c in chunks if len(c)]
        ev = arrays[0] if len(arrays) == 1 else (np.concatenate(arrays) if arrays else
                                                 np.zeros(0, dtype=L.EVENT_DTYPE))
        tid_of = np.array([os_tid(i) for i in idents] or [0], dtype=np.int64)
        cols = _pair(ev, tid_of, nodes if type(nodes) is list else list(nodes), [q.name for q in queues])
        rec._columns, rec._lists, rec._from_columns = cols, None, True
        gts: dict[int, list] = {}
        first = last = None
        if len(ev):
            ts = ev["ts"]
            first, last = int(ts.min()), int(ts.max())
            if len(cols.idles):
                last = max(last, int(cols.idles.end.max()))
        for e in rare:
            t = e[1]
            first = t if first is None or t < first else first
            last = t if last is None or t > last else last
            _rare(rec, e, os_tid(e[2]), gts)
        rec.graph_tasks = [GraphTaskSpan(*s) for s in gts.values()]
        rec.start, rec.end = _span_of_calls(rec, first, last) if first is not None else (0, 0)
        return rec


_FIELDS = ("threads", "slices", "waits", "queue_samples", "skips", "lock_waits", "syncs", "stream_events", "errors",
           "nans", "idles", "graph_tasks", "kernels", "simulated", "start", "end")


def _span_of_calls(rec: Recording, first: int, last: int) -> tuple[int, int]:
    """The run's span (see ``Recording.start``) from its first and last event: the run is its backward
    calls, not the threads' start before them nor a wake-up after them. Clips ``rec``'s idle spans to it."""
    calls = [g for g in rec.graph_tasks if g.depth == 0]
    if not calls:
        return first, last
    first = min(g.start for g in calls)
    columns = rec._columns if rec._from_columns else None
    if all(g.end is not None for g in calls):
        if columns is not None:
            ends = columns.slices.end
            last_slice = int(ends.max()) if len(ends) else first
        else:
            last_slice = max((sl.end for sl in rec.slices), default=first)
        last = max(max(g.end for g in calls), last_slice)
    if columns is not None:
        i = columns.idles
        keep = (i.end > first) & (i.start < last)
        columns.idles = Table(start=np.maximum(i.start[keep], first), end=np.minimum(i.end[keep], last),
                              tid=i.tid[keep], queue=i.queue[keep], waiting_for=i.waiting_for[keep])
    else:
        rec.idles = [i._replace(start=max(i.start, first), end=min(i.end, last)) for i in rec.idles
                     if i.end > first and i.start < last]
    return first, last


def _thread_infos(threads: dict[int, str], os_tids: dict[int, int]) -> dict[int, ThreadInfo]:
    os_tid = _os_tid_fn(os_tids)
    infos = {}
    for ident, name in threads.items():
        t = os_tid(ident)
        infos[t] = ThreadInfo(t, name, thread_kind(name), worker_label(name))
    return dict(sorted(infos.items(), key=lambda kv: thread_sort_key(kv[1].name)))


def _os_tid_fn(os_tids: dict[int, int]):
    def os_tid(ident: int) -> int:
        t = os_tids.get(ident)
        return t if t is not None else ident & 0x7FFFFFFF
    return os_tid


def _rare(rec: Recording, ev: tuple, tid: int, gts: dict) -> None:
    """One event of the kinds the Recorder keeps as tuples (everything but the hot five)."""
    kind, ts = ev[0], ev[1]
    if kind == SKIP:
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
    elif kind == GT_START:
        gts[ev[3]] = [ev[3], ev[4], ts, None, tid, None]
    elif kind == GT_END:
        span = gts.get(ev[3])
        if span is not None:
            span[3], span[5] = ts, ev[4]


def _first_of_group(*keys: np.ndarray) -> np.ndarray:
    """For rows sorted by ``keys``: whether each row starts a new group (its keys differ from the previous row's)."""
    n = len(keys[0])
    new = np.ones(n, dtype=bool)
    if n > 1:
        same = np.ones(n - 1, dtype=bool)
        for k in keys:
            same &= k[1:] == k[:-1]
        new[1:] = ~same
    return new


def _pair(ev: np.ndarray, tid_of: np.ndarray, nodes: list, queues: list[str]) -> Columns:
    """Pair an EventLog's records as ``from_events`` pairs tuples, vectorised (see there for the rules).

    Each table's columns are gathered from the records of its kinds alone (the rows of queue samples, then
    of node starts and ends, then of idle spans), never as a copy of a field over the whole log, and each
    step's index arrays go before the next: beyond the records, the pairing takes little more than the
    columns it returns (on a chain: 226 bytes a node, at most ~320 while pairing; it was 426)."""
    n_nodes = len(nodes)
    if core.pair_common is not None:  # the common case in one compiled pass (the rules below, as they give it)
        got = core.pair_common(ev, tid_of, n_nodes)
        if got is not None:
            return _compiled_columns(got, nodes, queues)
    kind = ev["kind"]

    # queue samples, in event order
    sm = np.flatnonzero((kind == L.PUSH) | (kind == L.POP))
    samples = Table(ts=ev["ts"][sm], tid=tid_of[ev["thread"][sm]], queue=ev["queue"][sm].astype(np.int64),
                    gt=ev["a"][sm], node=ev["node"][sm].astype(np.int64), depth=ev["b"][sm].astype(np.int64),
                    pushed=kind[sm] == L.PUSH)

    # waits: a pop right after a push of the same (gt, node), in pop order
    pairs = _pairs_once(samples.gt, samples.node, samples.pushed, n_nodes)
    pushes, pops = pairs if pairs is not None else _pairs_sorted(samples.gt, samples.node, samples.pushed)
    del pairs
    waits = Table(gt=samples.gt[pops], node=samples.node[pops], queue=samples.queue[pushes],
                  pushed=samples.ts[pushes], popped=samples.ts[pops], tid=samples.tid[pops],
                  push_row=np.asarray(pushes, dtype=np.int64), pop_row=np.asarray(pops, dtype=np.int64))
    wait_pos = sm[pops]  # event positions of the pops
    del sm, pushes, pops

    # slices: an end pairs with a start right before it of the same (tid, gt, node), in end order
    se = np.flatnonzero((kind == L.START) | (kind == L.END))
    gt, node, tid = ev["a"][se], ev["node"][se].astype(np.int64), tid_of[ev["thread"][se]]
    opens = kind[se] == L.START
    pairs = _pairs_once(gt, node, opens, n_nodes, tid)
    starts, ends = pairs if pairs is not None else _slices_sorted(opens, tid, gt, node)
    del pairs, opens
    slice_wait = _slice_waits(waits, wait_pos, gt[ends], node[ends], se[ends], n_nodes)
    del wait_pos
    slices = Table(gt=gt[ends], depth=ev["b"][se[starts]].astype(np.int64), node=node[ends], tid=tid[ends],
                   start=ev["ts"][se[starts]], end=ev["ts"][se[ends]], wait=slice_wait)
    del se, gt, node, tid, starts, ends

    im = np.flatnonzero(kind == L.IDLE)
    idles = Table(start=ev["ts"][im], end=ev["a"][im], tid=tid_of[ev["thread"][im]],
                  queue=ev["queue"][im].astype(np.int64), waiting_for=ev["b"][im].astype(np.int64))
    return Columns(nodes, queues, slices, waits, samples, idles)


def _compiled_columns(got: tuple, nodes: list, queues: list[str]) -> Columns:
    """``Columns`` from ``_core.pair_common``'s int64 columns."""
    s, w, sl, i = ([np.frombuffer(b, dtype=np.int64) for b in group] for group in got)
    samples = Table(ts=s[0], tid=s[1], queue=s[2], gt=s[3], node=s[4], depth=s[5], pushed=s[6].astype(bool))
    waits = Table(gt=w[0], node=w[1], queue=w[2], pushed=w[3], popped=w[4], tid=w[5], push_row=w[6], pop_row=w[7])
    slices = Table(gt=sl[0], depth=sl[1], node=sl[2], tid=sl[3], start=sl[4], end=sl[5], wait=sl[6])
    idles = Table(start=i[0], end=i[1], tid=i[2], queue=i[3], waiting_for=i[4])
    return Columns(nodes, queues, slices, waits, samples, idles)


def _pairs_once(gt: np.ndarray, node: np.ndarray, opens: np.ndarray, n_nodes: int, tid: np.ndarray | None = None):
    """The common case, paired in linear time: one GraphTask, and each node opened once and then closed
    once (on the same thread). Returns (open rows, close rows) in close order, or None when it does not hold
    (then the sorting pairing applies)."""
    sel = node >= 0
    if not sel.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if sel.all():  # every row has a node (a chain's starts and ends, most samples): no copies
        rows = None
        g, n, o = gt, node, opens
    else:
        rows = np.flatnonzero(sel)
        g, n, o = gt[rows], node[rows], opens[rows]
    del sel
    if g.min() != g.max():
        return None
    if np.bincount(n, minlength=n_nodes).max() > 2:
        return None
    if rows is None:
        open_rows, close_rows = np.flatnonzero(o), np.flatnonzero(~o)
    else:
        open_rows, close_rows = rows[o], rows[~o]
    open_nodes, close_nodes = n[o], n[~o]
    open_at = np.full(n_nodes, -1, dtype=np.int64)
    open_at[open_nodes] = open_rows
    if (len(close_nodes) and np.bincount(close_nodes, minlength=n_nodes).max() > 1) or \
            (open_at[open_nodes] != open_rows).any():
        return None
    del open_nodes, open_rows
    paired = open_at[close_nodes]
    del open_at, close_nodes
    ok = (paired >= 0) & (paired < close_rows)
    if tid is not None:
        ok &= tid[np.maximum(paired, 0)] == tid[close_rows]
    if not ok.all():
        return None
    return paired, close_rows


def _pairs_sorted(gt: np.ndarray, node: np.ndarray, pushed: np.ndarray):
    """Pushes and pops paired by sorting on (gt, node): a pop pairs with a push right before it."""
    sel = np.nonzero(node >= 0)[0]
    order = sel[np.lexsort((sel, node[sel], gt[sel]))]
    new = _first_of_group(gt[order], node[order])
    k = pushed[order]
    pair = ~k & ~new
    pair[1:] &= k[:-1]
    pops = order[pair]
    pushes = order[np.nonzero(pair)[0] - 1]
    o = np.argsort(pops, kind="stable")
    return pushes[o], pops[o]


def _slices_sorted(opens: np.ndarray, tid: np.ndarray, gt: np.ndarray, node: np.ndarray):
    """Starts and ends (rows of node starts and ends, ``opens`` for a start) paired by sorting on (tid, gt,
    node): an end pairs with a start right before it, else starts where it ends. Returns (start rows, end
    rows) in end order."""
    order = np.lexsort((node, gt, tid))  # stable: rows of one (tid, gt, node) stay in event order
    new = _first_of_group(tid[order], gt[order], node[order])
    is_end = ~opens[order]
    has_start = is_end & ~new
    has_start[1:] &= ~is_end[:-1]
    at = np.nonzero(is_end)[0]
    ends = order[at]
    starts = np.where(has_start[at], order[at - 1], ends)
    o = np.argsort(ends, kind="stable")
    return starts[o], ends[o]


def _slice_waits(waits: Table, wait_pos: np.ndarray, s_gt: np.ndarray, s_node: np.ndarray, ends: np.ndarray,
                 n_nodes: int) -> np.ndarray:
    """Each slice's wait: the last wait of its (gt, node) popped before its end (-1: none)."""
    nw, ns = len(waits), len(ends)
    if nw and (waits.gt.min() == waits.gt.max()) and (not ns or s_gt.min() == s_gt.max() == waits.gt[0]) \
            and np.bincount(waits.node, minlength=n_nodes).max() == 1:
        at = np.full(n_nodes, -1, dtype=np.int64)
        at[waits.node] = np.arange(nw)
        w = at[s_node]
        return np.where((w >= 0) & (wait_pos[np.maximum(w, 0)] < ends), w, -1)
    kg = np.concatenate([waits.gt, s_gt])
    kn = np.concatenate([waits.node, s_node])
    kp = np.concatenate([wait_pos, ends])
    order = np.lexsort((kp, kn, kg))
    is_wait = order < nw
    idx = np.arange(len(order))
    last_wait = np.maximum.accumulate(np.where(is_wait, idx, -1)) if len(order) else idx
    group_first = np.maximum.accumulate(np.where(_first_of_group(kg[order], kn[order]), idx, 0)) if len(order) else idx
    found = last_wait >= group_first
    slice_wait = np.full(ns, -1, dtype=np.int64)
    rows = ~is_wait
    slice_wait[order[rows] - nw] = np.where(found[rows], order[np.maximum(last_wait[rows], 0)], -1)
    return slice_wait


def _lists_of(c: Columns) -> dict[str, list]:
    """The typed-record lists of columns (a Recording made from a log, read as lists)."""
    nodes, queues = c.nodes, c.queues
    w = c.waits
    waits = [QueueWait(g, nodes[n], queues[q], p, o, t) for g, n, q, p, o, t in
             zip(w.gt.tolist(), w.node.tolist(), w.queue.tolist(), w.pushed.tolist(), w.popped.tolist(),
                 w.tid.tolist())]
    s = c.slices
    slices = [NodeSlice(g, d, nodes[n], t, a, b, waits[k] if k >= 0 else None) for g, d, n, t, a, b, k in
              zip(s.gt.tolist(), s.depth.tolist(), s.node.tolist(), s.tid.tolist(), s.start.tolist(),
                  s.end.tolist(), s.wait.tolist())]
    q = c.samples
    samples = [QueueSample(ts, t, queues[qu], g, nodes[n] if n >= 0 else None, d, p) for ts, t, qu, g, n, d, p in
               zip(q.ts.tolist(), q.tid.tolist(), q.queue.tolist(), q.gt.tolist(), q.node.tolist(),
                   q.depth.tolist(), q.pushed.tolist())]
    i = c.idles
    idles = [Idle(a, b, t, queues[qu], wf if wf >= 0 else None) for a, b, t, qu, wf in
             zip(i.start.tolist(), i.end.tolist(), i.tid.tolist(), i.queue.tolist(), i.waiting_for.tolist())]
    return {"slices": slices, "waits": waits, "queue_samples": samples, "idles": idles}


def _columns_of(slices: list, waits: list, samples: list, idles: list) -> Columns:
    """Columns of typed-record lists (a ``from_events`` Recording, or one filled in as lists, read as columns)."""
    nodes: list = []
    node_ids: dict[int, int] = {}
    queues: list[str] = []
    queue_ids: dict[str, int] = {}

    def n_of(node) -> int:
        if node is None:
            return -1
        k = node_ids.get(id(node))
        if k is None:
            k = node_ids[id(node)] = len(nodes)
            nodes.append(node)
        return k

    def q_of(name: str) -> int:
        k = queue_ids.get(name)
        if k is None:
            k = queue_ids[name] = len(queues)
            queues.append(name)
        return k

    wait_ids = {id(w): k for k, w in enumerate(waits)}
    st = Table(gt=_i64(s.gt for s in slices), depth=_i64(s.depth for s in slices),
               node=_i64(n_of(s.node) for s in slices), tid=_i64(s.tid for s in slices),
               start=_i64(s.start for s in slices), end=_i64(s.end for s in slices),
               wait=_i64(-1 if s.wait is None else wait_ids.get(id(s.wait), -1) for s in slices))
    wt = Table(gt=_i64(w.gt for w in waits), node=_i64(n_of(w.node) for w in waits),
               queue=_i64(q_of(w.queue) for w in waits), pushed=_i64(w.pushed for w in waits),
               popped=_i64(w.popped for w in waits), tid=_i64(w.tid for w in waits),
               push_row=np.full(len(waits), -1, dtype=np.int64), pop_row=np.full(len(waits), -1, dtype=np.int64))
    qt = Table(ts=_i64(q.ts for q in samples), tid=_i64(q.tid for q in samples),
               queue=_i64(q_of(q.queue) for q in samples), gt=_i64(q.gt for q in samples),
               node=_i64(n_of(q.node) for q in samples), depth=_i64(q.depth for q in samples),
               pushed=np.fromiter((bool(q.pushed) for q in samples), dtype=bool, count=len(samples)))
    it = Table(start=_i64(i.start for i in idles), end=_i64(i.end for i in idles), tid=_i64(i.tid for i in idles),
               queue=_i64(q_of(i.queue) for i in idles),
               waiting_for=_i64(-1 if i.waiting_for is None else i.waiting_for for i in idles))
    return Columns(nodes, queues, st, wt, qt, it)
