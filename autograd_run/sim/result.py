"""A finished simulation as a ``Recording`` (the summary and trace writer read it as any run's)."""

from __future__ import annotations

from autograd_run.engine.streams import stream_name
from autograd_run.engine.threads import thread_kind, thread_sort_key, worker_label
from autograd_run.traces.recording import (
    GraphTaskSpan, Idle, KernelSlice, NodeSlice, QueueSample, QueueWait, Recording, Skip, StreamEvent, Sync,
    ThreadInfo,
)


def span(sim) -> tuple[int, int]:
    """The simulated run's (start, end): from the first call's start to the last node, kernel or call end.

    A ``Recording`` of the simulation has this span (``to_recording``); the wall time is its length.
    """
    start = min((g.start for g in sim.graph_tasks), default=0)
    end = max(max((s[5] for s in sim.slices), default=0), max((k[3] for k in sim.kernels), default=0),
              max((e for g in sim.graph_tasks if (e := g.returned or g.end)), default=0))
    if end == start == 0:
        end = 1  # a non-empty recording of zero length
    return start, end


def to_recording(sim) -> Recording:
    rec = Recording(simulated=True)
    workers = [sim.caller, *sim.devices, *sim.pool]
    used = {t for s in sim.slices for t in (s[3],)} | {sim.caller.tid}
    infos = [ThreadInfo(w.tid, w.name, thread_kind(w.name), worker_label(w.name)) for w in workers if w.tid in used]
    rec.threads = {t.tid: t for t in sorted(infos, key=lambda t: thread_sort_key(t.name))}
    for gt, depth, node, tid, start, end, queue, pushed in sim.slices:
        wait = QueueWait(gt, node, queue, pushed, start, tid) if queue is not None else None
        if wait is not None:
            rec.waits.append(wait)
        rec.slices.append(NodeSlice(gt, depth, node, tid, start, end, wait))
    rec.queue_samples = [QueueSample(*q) for q in sim.queue_samples]
    rec.skips = [Skip(*s) for s in sim.skips]
    rec.syncs = [Sync(ts, 0, gt, p, c, src, dst) for ts, gt, p, c, src, dst in sim.syncs]
    rec.stream_events = [StreamEvent(ts, 0, gt, action, node, stream, ev)
                         for ts, gt, action, node, stream, ev in sim.stream_events]
    rec.idles = [Idle(*i) for i in sim.idles]
    rec.graph_tasks = [GraphTaskSpan(g.id, g.reentrant_depth, g.start, g.returned or g.end, g.tid, None)
                       for g in sim.graph_tasks]
    rec.kernels = [KernelSlice(stream_name(st), node, a, b) for st, node, a, b in sim.kernels]
    rec.start, rec.end = span(sim)
    return rec
