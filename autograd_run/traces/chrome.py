"""Chrome / Perfetto trace: a pure function from a ``Recording`` to the JSON trace.

One process ("autograd-run"), one thread track per worker (the caller, which
is also the CPU worker of its calls, is ``caller (<thread name>)``); one complete
(``X``) slice per node execution titled ``<node id> <op name>`` (so a search
for either finds it) with its id, name, seq, depth, device, stream and input
shapes as args; queue waits as process-scoped async slices, one track per
queue; syncs as flow arrows from producer to consumer slice; one counter
track per queue (its depth) and one for the engine's outstanding tasks;
errors and NaN detections as instant events. A caller blocked until its own
GraphTask completes shows "waiting for graph task N"; "idle" is a worker
with an empty queue and nothing of its own to wait for.

Track order: the Perfetto UI ignores ``thread_sort_index`` and sorts a
process's threads by tid, so tids are display ranks (callers, then device
workers by index, then reentrant pool threads, as the Recording orders
them), not OS thread ids; ``thread_sort_index`` is kept for chrome://tracing.
Async slices use ``id2.local`` (process scope): a bare ``id`` is global in
the legacy JSON rules and lands outside the process.

Timestamps are microseconds from the first event, offset by 1 µs so nothing
sits at 0.
"""

from __future__ import annotations

import msgspec

from autograd_run.engine.threads import ThreadKind
from autograd_run.outputs import atomic_write
from autograd_run.traces.recording import Recording

PID = 1
#: The first thread's tid: above the pid, so no worker is taken for the process's main thread.
FIRST_TID = PID + 1


def node_title(node) -> str:
    """A node slice's title: ``<id> <op name>`` (just the name when they are the same, as for GraphRoot)."""
    return node.name if node.id == node.name else f"{node.id} {node.name}"


def thread_tids(rec: Recording) -> dict[int, int]:
    """Trace tid of each recorded thread: its display rank (the Recording's order) from ``FIRST_TID``."""
    return {tid: FIRST_TID + rank for rank, tid in enumerate(rec.threads)}


def to_chrome_trace(rec: Recording) -> dict:
    """The Chrome trace of a recorded run."""
    if rec.empty:
        return {"traceEvents": [], "displayTimeUnit": "ns"}
    t0 = rec.start

    def us(ns: int) -> float:
        return (ns - t0) / 1000.0 + 1.0

    tids = thread_tids(rec)

    def tid_of(os_tid: int) -> int:  # a thread the recording did not name gets the next rank
        t = tids.get(os_tid)
        if t is None:
            t = tids[os_tid] = FIRST_TID + len(tids)
        return t

    process = "autograd-run (simulated)" if rec.simulated else "autograd-run"
    out: list[dict] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": process}},
                       {"ph": "M", "pid": PID, "name": "process_sort_index", "args": {"sort_index": 0}}]
    for rank, t in enumerate(rec.threads.values()):
        name = f"caller ({t.name})" if t.kind is ThreadKind.CALLER else t.name
        out.append({"ph": "M", "pid": PID, "tid": tids[t.tid], "name": "thread_name", "args": {"name": name}})
        out.append({"ph": "M", "pid": PID, "tid": tids[t.tid], "name": "thread_sort_index",
                    "args": {"sort_index": rank}})

    slices: dict[tuple, tuple] = {}  # (gt, node) -> (tid, start_us)
    for sl in rec.slices:
        node = sl.node
        start, dur = us(sl.start), max(sl.duration / 1000.0, 0.001)
        tid = tid_of(sl.tid)
        out.append({"ph": "X", "pid": PID, "tid": tid, "ts": start, "dur": dur, "name": node_title(node),
                    "cat": "node", "args": {"id": node.id, "name": node.name, "seq": node.seq, "depth": sl.depth,
                                            "graph_task": sl.gt, "device": str(node.device), "stream": node.stream,
                                            "input_shapes": [list(m.shape) for m in node.inputs]}})
        slices[(sl.gt, node)] = (tid, start)
    _counters(rec, out, us)
    for k, w in enumerate(rec.waits, 1):
        # Async slices: a task waits while its worker runs other nodes. One track per queue name.
        common = {"pid": PID, "tid": tid_of(w.tid), "cat": "queue_wait", "id2": {"local": k},
                  "name": f"queue wait {w.queue}"}
        out.append({**common, "ph": "b", "ts": us(w.pushed),
                    "args": {"id": w.node.id, "node": w.node.name, "graph_task": w.gt}})
        out.append({**common, "ph": "e", "ts": us(w.popped)})
    for lw in rec.lock_waits:
        out.append({"ph": "X", "pid": PID, "tid": tid_of(lw.tid), "ts": us(lw.end - lw.waited),
                    "dur": lw.waited / 1000.0, "name": f"lock wait: {lw.lock}", "cat": "lock_wait",
                    "args": {"graph_task": lw.gt}})
    for idle in rec.idles:
        waiting = idle.waiting_for is not None
        out.append({"ph": "X", "pid": PID, "tid": tid_of(idle.tid), "ts": us(idle.start),
                    "dur": max((idle.end - idle.start) / 1000.0, 0.001),
                    "name": f"waiting for graph task {idle.waiting_for}" if waiting else "idle",
                    "cat": "wait" if waiting else "idle",
                    "args": {"queue": idle.queue, **({"graph_task": idle.waiting_for} if waiting else {})}})
    for kind, items in (("error", rec.errors), ("nan", rec.nans)):
        for e in items:
            detail = e.message if kind == "error" else e.index
            out.append({"ph": "i", "pid": PID, "tid": tid_of(e.tid), "ts": us(e.ts), "s": "t",
                        "name": "error" if kind == "error" else "nan detected", "cat": kind,
                        "args": {"id": e.node.id if e.node is not None else None, "detail": str(detail)}})
    # Syncs: a flow from the producer's slice to the consumer's slice.
    for flow_id, sync in enumerate(rec.syncs, 1):
        p = slices.get((sync.gt, sync.producer))
        c = slices.get((sync.gt, sync.consumer))
        if p is None or c is None:
            continue
        label = f"sync {sync.src} -> {sync.dst}"
        # Flow ends share ts, tid and cat with their slices: Perfetto binds the start to
        # the enclosing producer slice and the end (bp "e") to the enclosing consumer
        # slice; Chrome DevTools binds only on an exact (ts, pid, tid, cat) match.
        out.append({"ph": "s", "pid": PID, "tid": p[0], "ts": p[1], "id": flow_id, "name": label, "cat": "node"})
        out.append({"ph": "f", "bp": "e", "pid": PID, "tid": c[0], "ts": c[1], "id": flow_id, "name": label,
                    "cat": "node"})
        out.append({"ph": "i", "pid": PID, "tid": c[0], "ts": c[1], "s": "t", "name": label, "cat": "sync",
                    "args": {"producer": sync.producer.id, "consumer": sync.consumer.id}})
    _kernels(rec, out, us)
    _annotate(rec, out)
    return {"traceEvents": out, "displayTimeUnit": "ns"}


def _counters(rec: Recording, out: list, us) -> None:
    """One counter track per queue (its depth) and one of the tasks outstanding in the whole engine.

    A task is outstanding from its push until its node's slice ends (or it is
    skipped). Perfetto names a JSON counter track ``<name> <arg>`` (``cuda:0
    queued``, ``outstanding tasks``): short, so the track list shows them whole.
    """
    changes: list[tuple] = []  # (ts, +1/-1, gt)
    for q in rec.queue_samples:
        if q.pushed and q.node is not None:
            changes.append((q.ts, 1, q.gt))
        out.append({"ph": "C", "pid": PID, "ts": us(q.ts), "name": q.queue, "args": {"queued": q.depth}})
    changes.extend((sl.end, -1, sl.gt) for sl in rec.slices)
    changes.extend((sk.ts, -1, sk.gt) for sk in rec.skips)
    per_task: dict[int, int] = {}
    total = 0
    for ts, delta, gt in sorted(changes, key=lambda c: (c[0], -c[1])):
        n = per_task.get(gt, 0)
        if delta < 0 and n == 0:
            continue  # its push was not recorded
        per_task[gt] = n + delta
        total += delta
        out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": "outstanding", "args": {"tasks": total}})


def _annotate(rec: Recording, out: list) -> None:
    """Node slices' args gain what a comparison of runs reads (``traces.profile``): ``pass`` (which
    top-level backward call), ``worker`` (a label stable across runs), ``critical_path`` (on its
    pass's critical path) and ``graph_root`` (the engine's own GraphRoot)."""
    from autograd_run.ops import is_graph_root
    from autograd_run.traces.samples import pass_samples, stable_worker
    s = pass_samples(rec)
    ranks = thread_tids(rec)
    workers = {ranks[tid]: stable_worker(t.name) for tid, t in rec.threads.items()}
    roots = {(sl.gt, sl.node.id) for sl in rec.slices if is_graph_root(sl.node)}
    for e in out:
        if e.get("ph") != "X" or e.get("cat") != "node":
            continue
        args = e["args"]
        key = (args["graph_task"], args["id"])
        args["pass"] = s.pass_of_task.get(key[0], 0)
        args["worker"] = workers.get(e["tid"], str(e["tid"]))
        if key in s.critical_keys:
            args["critical_path"] = True
        if key in roots:
            args["graph_root"] = True


def _kernels(rec: Recording, out: list, us) -> None:
    """Accelerator streams (simulated runs): a process of their own, one track per stream."""
    if not rec.kernels:
        return
    out.append({"ph": "M", "pid": PID + 1, "name": "process_name", "args": {"name": "devices (simulated streams)"}})
    out.append({"ph": "M", "pid": PID + 1, "name": "process_sort_index", "args": {"sort_index": 1}})
    tids: dict[str, int] = {}
    for name in sorted({k.stream for k in rec.kernels}):
        tids[name] = len(tids) + 1
        out.append({"ph": "M", "pid": PID + 1, "tid": tids[name], "name": "thread_name",
                    "args": {"name": f"stream {name}"}})
        out.append({"ph": "M", "pid": PID + 1, "tid": tids[name], "name": "thread_sort_index",
                    "args": {"sort_index": tids[name]}})
    for k in rec.kernels:
        out.append({"ph": "X", "pid": PID + 1, "tid": tids[k.stream], "ts": us(k.start),
                    "dur": max((k.end - k.start) / 1000.0, 0.001), "name": node_title(k.node), "cat": "kernel",
                    "args": {"id": k.node.id, "stream": k.stream}})


def write_chrome_trace(path: str, rec: Recording) -> None:
    """Write the trace atomically (a temporary file renamed into place)."""
    atomic_write(path, msgspec.json.encode(to_chrome_trace(rec)), "trace_path")
