"""A finished simulation as a ``Recording`` (the summary and trace writer read it as any run's).

The simulator keeps what happened as plain tuples (``Simulator.slices``, kept
as columns by the compiled core's ``SliceLog`` but read as tuples, and the
rest); ``to_recording`` turns the per-node ones into the Recording's numpy
``Columns`` directly (no record object per node), laid out as
``recording._columns_of`` lays out the same records given as lists: nodes and
queues numbered in order of first appearance, one queue wait per slice whose
task was queued, in slice order.
"""

from __future__ import annotations

from functools import partial
from operator import itemgetter

import numpy as np

from autograd_run.engine import core
from autograd_run.errors import RequestError

from autograd_run.engine.streams import stream_name
from autograd_run.engine.threads import thread_kind, thread_sort_key, worker_label
from autograd_run.record.recording import (
    Columns, GraphTaskSpan, KernelSlice, Recording, Skip, StreamEvent, Sync, Table, ThreadInfo,
)


def span(sim) -> tuple[int, int]:
    """The simulated run's (start, end): from the first call's start to the last node, kernel or call end.

    A ``Recording`` of the simulation has this span (``to_recording``); the wall time is its length.
    """
    return nonempty(*last_times(sim))


def last_times(sim) -> tuple[int, int]:
    """The first call's start and the last node, kernel or call end (0, 0 when nothing happened)."""
    start = min((g.start for g in sim.graph_tasks), default=0)
    # slices are recorded as they end, on a clock that never goes back: the last one ends last
    end = max(sim.slices[-1][5] if sim.slices else 0, max(map(itemgetter(3), sim.kernels), default=0),
              max((e for g in sim.graph_tasks if (e := g.returned or g.end)), default=0))
    return start, end


def nonempty(start: int, end: int) -> tuple[int, int]:
    """A recording of zero length (nothing happened) spans (0, 1)."""
    return (start, 1) if end == start == 0 else (start, end)


def to_recording(sim) -> Recording:
    cols = _columns(sim)
    workers = [sim.caller, *sim.devices, *sim.pool]
    used = set(np.unique(cols.slices.tid).tolist()) | {sim.caller.tid}
    infos = [ThreadInfo(w.tid, w.name, thread_kind(w.name), worker_label(w.name)) for w in workers if w.tid in used]
    rec = Recording.from_columns(
        cols, simulated=True,
        threads={t.tid: t for t in sorted(infos, key=lambda t: thread_sort_key(t.name))},
        skips=[Skip(*s) for s in sim.skips],
        syncs=[Sync(ts, 0, gt, p, c, src, dst) for ts, gt, p, c, src, dst in sim.syncs],
        stream_events=[StreamEvent(ts, 0, gt, action, node, stream, ev)
                       for ts, gt, action, node, stream, ev in sim.stream_events],
        graph_tasks=[GraphTaskSpan(g.id, g.reentrant_depth, g.start, g.returned or g.end, g.tid, None)
                     for g in sim.graph_tasks],
        kernels=_kernel_slices(sim.kernels))
    rec.start, rec.end = span(sim)
    return rec


def _kernel_slices(kernels: list) -> list[KernelSlice]:
    """``KernelSlice(stream_name(stream), node, start, end)`` of each ``(stream, node, start, end)``, in order
    (``_core.kernel_slices``, in one pass; ``_kernel_slices_py`` its twin)."""
    if core.kernel_slices is None:
        return _kernel_slices_py(kernels)
    return core.kernel_slices(kernels, KernelSlice, stream_name)


def _kernel_slices_py(kernels: list) -> list[KernelSlice]:
    """The loops run in C: a stream's name made once per stream object (the simulator shares one per stream; all
    are alive in ``kernels``, so their ids are theirs), each slice made by ``tuple.__new__`` (a NamedTuple's own
    ``__new__`` is Python code)."""
    if not kernels:
        return []
    streams, nodes, starts, ends = zip(*kernels)
    ids = list(map(id, streams))
    names = {k: stream_name(st) for k, st in dict(zip(ids, streams)).items()}
    return list(map(partial(tuple.__new__, KernelSlice), zip(map(names.__getitem__, ids), nodes, starts, ends)))


def _slice_columns_py(slices: list) -> tuple:
    """The columns of a simulation's slices (``_core.sim_slices`` is the compiled twin): the distinct nodes and
    queue names in order of first appearance, each slice's node code, gt, depth, tid, start and end, its queue
    code (-1: not queued) and push time (0 where not queued)."""
    n = len(slices)
    gt, depth, node, tid, start, end, queue, pushed = zip(*slices) if n else ((),) * 8
    nodes = [v for v in dict.fromkeys(node) if v is not None]
    code = dict(zip(nodes, range(len(nodes))))
    code[None] = -1
    queues = [q for q in dict.fromkeys(queue) if q is not None]
    q_code = dict(zip(queues, range(len(queues))))
    q_code[None] = -1
    return (nodes, _i64(list(map(code.__getitem__, node))), _i64(gt), _i64(depth), _i64(tid), _i64(start), _i64(end),
            queues, _i64(list(map(q_code.__getitem__, queue))),
            _i64([0 if q is None else p for q, p in zip(queue, pushed)]))


def _slice_columns(slices: list) -> tuple:
    if core.sim_slices is None:
        return _slice_columns_py(slices)
    try:
        out = core.sim_slices(slices)
    except OverflowError:
        raise too_big() from None
    return (out[0], *(np.frombuffer(b, dtype=np.int64) for b in out[1:7]), out[7], np.frombuffer(out[8], dtype=np.int64),
            np.frombuffer(out[9], dtype=np.int64))


def _none(m: int) -> np.ndarray:
    """m times -1 ("no row": a simulation records no queue samples to pair) as a read-only view of one value,
    not m int64s (16 MB for the two columns at a million nodes)."""
    return np.broadcast_to(np.int64(-1), (m,))


def _i64(values) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
    except OverflowError:  # every input is bounded; this says so if a combination still overflows
        raise too_big() from None


def too_big() -> RequestError:
    return RequestError("the simulated times do not fit a 64-bit count of nanoseconds (292 years): the costs, "
                        "--scale or --network figures are out of any real range")


def _columns(sim) -> Columns:
    """The Recording's columns of ``sim.slices``, ``sim.queue_samples`` and ``sim.idles``."""
    node_code: dict = {}   # node -> its row in the node table, in order of first appearance
    queue_code: dict = {}  # queue name -> its row in the queue table, likewise

    def codes(table: dict, values) -> list:
        # Each value's row (-1: None), new values added in order of first appearance. Loops run in C where
        # they can: the distinct values found by dict.fromkeys, the rows read by a map (a million slices:
        # 0.5 -> ~0.15 s).
        new = [v for v in dict.fromkeys(values) if v is not None and v not in table]
        table.update(zip(new, range(len(table), len(table) + len(new))))
        if None not in table:
            table[None] = -1
            try:
                return list(map(table.__getitem__, values))
            finally:
                del table[None]
        return [-1 if v is None else table[v] for v in values]  # (a None key in the table: never here)

    # slices: (gt, depth, node, tid, start, end, queue or None, pushed or None), in end order
    n = len(sim.slices)
    nodes, node_col, gt_col, depth_col, tid_col, start_col, end_col, queues, queue_all, pushed_all = (
        _slice_columns(sim.slices))
    queue_code.update(zip(queues, range(len(queues))))
    queued = np.flatnonzero(queue_all >= 0)
    wait = np.full(n, -1, dtype=np.int64)
    if len(queued) == n:  # every task was queued (what the simulator does)
        rows, wait[:] = slice(None), np.arange(n)
    else:
        rows, wait[queued] = queued, np.arange(len(queued))
    slices = Table(gt=gt_col, depth=depth_col, node=node_col, tid=tid_col, start=start_col, end=end_col, wait=wait)
    m = len(queued)
    waits = Table(gt=gt_col[rows], node=node_col[rows], queue=queue_all[rows], pushed=pushed_all[rows],
                  popped=start_col[rows], tid=tid_col[rows],
                  push_row=_none(m), pop_row=_none(m))
    # queue samples (with ``detail``): (ts, tid, queue, gt, node or None, depth, pushed), in event order
    qs = sim.queue_samples
    if qs:  # the node table as a dict only where samples name nodes (a million nodes: 0.3 s to make it)
        node_code.update(zip(nodes, range(len(nodes))))
    ts, s_tid, s_queue, s_gt, s_node, s_depth, s_pushed = zip(*qs) if qs else ((),) * 7
    samples = Table(ts=_i64(ts), tid=_i64(s_tid), queue=_i64(codes(queue_code, s_queue)), gt=_i64(s_gt),
                    node=_i64(codes(node_code, s_node)), depth=_i64(s_depth),
                    pushed=np.array([bool(p) for p in s_pushed], dtype=bool))
    # idle spans: (start, end, tid, queue, waited-for gt or None), in event order
    ids = sim.idles
    i_start, i_end, i_tid, i_queue, i_wait = zip(*ids) if ids else ((),) * 5
    idles = Table(start=_i64(i_start), end=_i64(i_end), tid=_i64(i_tid), queue=_i64(codes(queue_code, i_queue)),
                  waiting_for=_i64([-1 if w is None else w for w in i_wait]))
    return Columns(list(node_code) if qs else nodes, list(queue_code), slices, waits, samples, idles)
