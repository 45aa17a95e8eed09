"""Chrome / Perfetto trace: a pure function from a ``Recording`` to the JSON trace.

``to_chrome_trace(rec)`` builds the trace as a dict (the definition of its
content); ``write_chrome_trace(path, rec)`` writes the same trace (``json.loads``
of the file equals that dict) without building it: the node slices, queue
waits and counter samples, millions at a million nodes, are formatted from the
Recording's columns by ``traces.encode.fill`` in chunks, streamed to the file
(gzip-compressed for a ``.gz`` path).

One process ("autograd-run"), one thread track per worker (the caller, which
is also the CPU worker of its calls, is ``caller (<thread name>)``); one
complete (``X``) slice per node execution titled ``<node id> <op name>`` (so
a search for either finds it) with its seq, depth, GraphTask, device, stream
and input shapes as args, and what a comparison of runs reads
(``traces.read_profile``): ``pass`` (which top-level backward call),
``critical_path: true`` on its pass's critical path and ``graph_root: true``
on the engine's GraphRoot (``slice_marks``, from the columns). What the
slice's title or track already says is not repeated in its args: the node id
and the op name are the title's (``node_title``), and the worker (a label
stable across runs: ``caller``, ``cuda:0``) is its thread's, given once in
the thread's ``thread_name`` metadata (``worker``, beside ``name``). A title
splits at its last space into ``<id> <op>`` (node ids may have spaces; a
title without a space is a node whose id is its op name: ``slice_node``), so
a node whose op name has a space (a graph file may name a node so beside an
explicit ``op``) keeps its ``id`` argument (``title_says_id``). The
arguments ``depth``, ``graph_task``, ``stream`` and ``pass`` are left out
where they are 0 (not reentrant, the first GraphTask, the default stream,
the first or only pass: ``DEFAULT_ZERO``), ``device`` where it is ``cpu``
(``DEFAULT_DEVICE``), as ``critical_path`` and ``graph_root`` are where
false; readers take an absent one as that default and an absent ``id`` from
the title (``traces.read_profile`` and ``costs.measured``, which still read the
older traces that carried them all). Queue waits as process-scoped async
slices, one track per queue, with the node's id (and a GraphTask other than
0) on their begin (its op name is its node slice's title); syncs as flow
arrows from producer to consumer slice; one counter track per queue (its
depth) and one for the engine's outstanding tasks; errors and NaN detections
as instant events. A caller blocked until its own GraphTask completes shows
"waiting for graph task N"; "idle" is a worker with an empty queue and
nothing of its own to wait for. A simulated run's kernels are slices titled
as their nodes', one track per stream (``stream <name>``), with no args but
an id their title does not say (``kernel_args``).

Track order: the Perfetto UI ignores ``thread_sort_index`` and sorts a
process's threads by tid, so tids are display ranks (callers, then device
workers by index, then reentrant pool threads, as the Recording orders
them), not OS thread ids; ``thread_sort_index`` is kept for chrome://tracing.
Async slices use ``id2.local`` (process scope): a bare ``id`` is global in
the legacy JSON rules and lands outside the process. Each wait has an id of
its own: Perfetto binds an id to the track of the first wait that used it
(a later wait of another queue with that id would be drawn on that queue's
track). A wait's end repeats its begin's category, name and thread: Perfetto
pairs them without the name and thread, but chrome://tracing drops an end
without a name (the wait is then drawn without its length, as an error) and
makes a thread of each event's tid, a missing one too.

Timestamps are microseconds from the first event, offset by 1 µs so nothing
sits at 0, to the nanosecond (three decimals at most). A stopped run's trace
(``incomplete``: ``interrupted`` or ``timeout``) ends with an instant event
saying so and has ``"otherData": {"incomplete": REASON}``.
"""

from __future__ import annotations

import gzip

import msgspec
import numpy as np

from autograd_run.engine.threads import ThreadKind
from autograd_run.outputs import atomic_writer
from autograd_run.record.recording import Recording
from autograd_run.traces import encode as E
from autograd_run.traces.layout import (
    DEFAULT_DEVICE, DEFAULT_ZERO, FIRST_TID, PID, absent_if_zero, kernel_args, launchers, node_tables, node_title,
    outstanding_changes, process_name, slice_marks, thread_tids, title_says_id, trace_ranks,
)


def to_chrome_trace(rec: Recording, incomplete: str | None = None) -> dict:
    """The Chrome trace of a recorded run; a stopped run's (``incomplete``: ``interrupted``, ``timeout``) is
    marked so (``otherData.incomplete`` and an instant event at its end)."""
    if rec.empty:
        return _mark({"traceEvents": [], "displayTimeUnit": "ns"}, rec, incomplete)
    t0 = rec.start

    def us(ns: int) -> float:
        return (ns - t0 + 1000) / 1000

    tids = thread_tids(rec)

    def tid_of(os_tid: int) -> int:  # a thread the recording did not name gets the next rank
        t = tids.get(os_tid)
        if t is None:
            t = tids[os_tid] = FIRST_TID + len(tids)
        return t

    process = process_name(rec)
    out: list[dict] = _metadata(rec, process, tids)

    slices: dict[tuple, tuple] = {}  # (gt, node) -> (tid, start_us)
    passes, critical, root = slice_marks(rec)
    for k, sl in enumerate(rec.slices):
        node = sl.node
        start, dur = us(sl.start), max(sl.duration, 1) / 1000
        tid = tid_of(sl.tid)
        args = {"id": node.id, "seq": node.seq, "depth": sl.depth, "graph_task": sl.gt,
                "device": str(node.device), "stream": node.stream,
                "input_shapes": [list(m.shape) for m in node.inputs], "pass": int(passes[k])}
        for name in DEFAULT_ZERO:
            if args[name] == 0:
                del args[name]
        if title_says_id(node.name):
            del args["id"]
        if args["device"] == DEFAULT_DEVICE:
            del args["device"]
        if critical[k]:
            args["critical_path"] = True
        if root[k]:
            args["graph_root"] = True
        out.append({"ph": "X", "pid": PID, "tid": tid, "ts": start, "dur": dur, "name": node_title(node),
                    "cat": "node", "args": args})
        slices[(sl.gt, node)] = (tid, start)
    _counters(rec, out, us)
    out.extend(extra_counters(rec, us))
    for k, w in enumerate(rec.waits, 1):
        # Async slices: a task waits while its worker runs other nodes. One track per queue name.
        common = {"pid": PID, "tid": tid_of(w.tid), "cat": "queue_wait", "id2": {"local": k},
                  "name": f"queue wait {w.queue}"}
        out.append({**common, "ph": "b", "ts": us(w.pushed),
                    "args": {"id": w.node.id, **({"graph_task": w.gt} if w.gt else {})}})
        out.append({**common, "ph": "e", "ts": us(w.popped)})
    _lock_waits(rec, out, us, tid_of)
    for idle in rec.idles:
        waiting = idle.waiting_for is not None
        out.append({"ph": "X", "pid": PID, "tid": tid_of(idle.tid), "ts": us(idle.start),
                    "dur": max(idle.end - idle.start, 1) / 1000,
                    "name": f"waiting for graph task {idle.waiting_for}" if waiting else "idle",
                    "cat": "wait" if waiting else "idle",
                    "args": {"queue": idle.queue, **({"graph_task": idle.waiting_for} if waiting else {})}})
    _instants_and_flows(rec, out, us, tid_of, slices)
    wanted = launchers(rec)
    at: dict = {}
    for (_, n), place in slices.items():  # (the first slice of each, as the streaming writer takes)
        if n in wanted:
            at.setdefault(n, place)
    _kernels(rec, out, us, at)
    return _mark({"traceEvents": out, "displayTimeUnit": "ns"}, rec, incomplete)


def _mark(trace: dict, rec: Recording, incomplete: str | None) -> dict:
    if incomplete:
        trace["traceEvents"].append(incomplete_event(rec, incomplete))
        trace["otherData"] = {"incomplete": incomplete}
    return trace


def _metadata(rec: Recording, process: str, tids: dict) -> list[dict]:
    out: list[dict] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": process}},
                       {"ph": "M", "pid": PID, "name": "process_sort_index", "args": {"sort_index": 0}}]
    from autograd_run.analysis.samples import stable_worker
    for rank, t in enumerate(rec.threads.values()):
        name = f"caller ({t.name})" if t.kind is ThreadKind.CALLER else t.name
        # the worker label of its node slices (what diff compares across runs), once per thread
        out.append({"ph": "M", "pid": PID, "tid": tids[t.tid], "name": "thread_name",
                    "args": {"name": name, "worker": stable_worker(t.name)}})
        out.append({"ph": "M", "pid": PID, "tid": tids[t.tid], "name": "thread_sort_index",
                    "args": {"sort_index": rank}})
    return out


def _lock_waits(rec: Recording, out: list, us, tid_of) -> None:
    for lw in rec.lock_waits:
        out.append({"ph": "X", "pid": PID, "tid": tid_of(lw.tid), "ts": us(lw.end - lw.waited),
                    "dur": lw.waited / 1000, "name": f"lock wait: {lw.lock}", "cat": "lock_wait",
                    "args": {"graph_task": lw.gt}})


def _instants_and_flows(rec: Recording, out: list, us, tid_of, slices: dict) -> None:
    """Errors and NaN detections as instants; syncs as flows between slices (``slices``: (gt, node) ->
    (trace tid, start in µs))."""
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


def extra_counters(rec: Recording, us) -> list[dict]:
    """The recording's added counter tracks (``Recording.counters``: a device's allocated bytes)."""
    out = []
    for c in rec.counters:
        for ts, v in zip(c.ts.tolist(), c.values.tolist()):
            out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": c.name, "args": {c.arg: v}})
    return out


def incomplete_event(rec: Recording, incomplete: str) -> dict:
    """The instant event that marks the trace of a stopped run (``interrupted``, ``timeout``), at its end."""
    ts = (rec.end - rec.start + 1000) / 1000 if not rec.empty else 1.0
    return {"ph": "i", "s": "g", "pid": PID, "tid": 0, "ts": ts, "cat": "incomplete",
            "name": f"run {incomplete}: the trace is incomplete"}


def _kernels(rec: Recording, out: list, us, slice_at: dict | None = None) -> None:
    """Accelerator streams (simulated runs): a process of their own, one track per stream; a collective
    launched by a node (``Collective.trigger``) gets a flow from that node's slice (``slice_at``: node ->
    (trace tid, start µs)) to its own."""
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
    flow_id = len(rec.syncs)  # (the syncs' flows are 1..len(syncs))
    for k in rec.kernels:
        start = us(k.start)
        out.append({"ph": "X", "pid": PID + 1, "tid": tids[k.stream], "ts": start,
                    "dur": max(k.end - k.start, 1) / 1000, "name": node_title(k.node), "cat": "kernel",
                    "args": kernel_args(k)})
        src = slice_at.get(getattr(k.node, "trigger", None)) if slice_at else None
        if src is not None:
            # from the launching node's slice to the collective's (each end on its slice's start, as a sync's)
            flow_id += 1
            label = f"launch {k.node.name.split(' (')[0]}"
            out.append({"ph": "s", "pid": PID, "tid": src[0], "ts": src[1], "id": flow_id, "name": label,
                        "cat": "node"})
            out.append({"ph": "f", "bp": "e", "pid": PID + 1, "tid": tids[k.stream], "ts": start, "id": flow_id,
                        "name": label, "cat": "node"})


# -- the streaming writer ---------------------------------------------------------------------

#: Rows formatted per ``fill`` call (bounds the memory the text of one chunk takes).
CHUNK = 1 << 14  # about 4 MB of text


# a node slice; its title is "<id> <name>", or the name alone when the id is the name. Columns: 0 tid,
# 1 start, 2 duration, 3 node, 4 seq, 5 depth, 6 graph task, 7 device, 8 stream, 9 input shapes, 10 whether
# the id differs from the name, 11 pass, 12 critical path, 13 GraphRoot, 14 whether the id is an argument;
# depth, graph task, stream and pass are -1 where the value is 0 (the argument is left out), the device -1
# where it is the default, the marks and the id argument -1 where false.
_X = E.template((E.LIT, 0), (E.I64, 0), (E.LIT, 1), (E.US, 1), (E.LIT, 2), (E.DUR, 2), (E.LIT, 3),
                (E.SKIPNEG, 10, 2), (E.JESC, 0, 3), (E.LIT, 4), (E.JESC, 1, 3), (E.LIT, 5),
                (E.SKIPNEG, 14, 3), (E.LIT, 6), (E.JSTR, 0, 3), (E.LIT, 7), (E.LIT, 8), (E.U64, 4),
                (E.SKIPNEG, 5, 2), (E.LIT, 9), (E.I64, 5), (E.SKIPNEG, 6, 2), (E.LIT, 10), (E.I64, 6),
                (E.SKIPNEG, 7, 2), (E.LIT, 11), (E.JSTR, 2, 7), (E.SKIPNEG, 8, 2), (E.LIT, 12), (E.I64, 8),
                (E.LIT, 13), (E.RAW, 3, 9), (E.SKIPNEG, 11, 2), (E.LIT, 14), (E.I64, 11),
                (E.SKIPNEG, 12, 1), (E.LIT, 15), (E.SKIPNEG, 13, 1), (E.LIT, 16), (E.LIT, 17))
_X_LITS = [b',{"ph":"X","pid":1,"tid":', b',"ts":', b',"dur":', b',"name":"', b' ', b'","cat":"node","args":{',
           b'"id":', b',', b'"seq":', b',"depth":', b',"graph_task":', b',"device":', b',"stream":',
           b',"input_shapes":', b',"pass":', b',"critical_path":true', b',"graph_root":true', b'}}']
# a queue wait's begin and end. Columns: 0 tid, 1 async id, 2 queue, 3 time, 4 node, 5 graph task (-1: 0)
_WAIT = [E.template((E.LIT, 0), (E.I64, 0), (E.LIT, 1), (E.I64, 1), (E.LIT, 2), (E.JSTR, 0, 2), (E.LIT, 3),
                    (E.US, 3), (E.LIT, 4), (E.JSTR, 1, 4), (E.SKIPNEG, 5, 2), (E.LIT, 5), (E.I64, 5), (E.LIT, 6)),
         E.template((E.LIT, 0), (E.I64, 0), (E.LIT, 1), (E.I64, 1), (E.LIT, 2), (E.JSTR, 0, 2), (E.LIT, 7),
                    (E.US, 3), (E.LIT, 8))]
_WAIT_LITS = [b',{"pid":1,"tid":', b',"cat":"queue_wait","id2":{"local":', b'},"name":', b',"ph":"b","ts":',
              b',"args":{"id":', b',"graph_task":', b'}}', b',"ph":"e","ts":', b'}']
_QUEUE = E.template((E.LIT, 0), (E.US, 0), (E.LIT, 1), (E.JSTR, 0, 1), (E.LIT, 2), (E.I64, 2), (E.LIT, 3))
_QUEUE_LITS = [b',{"ph":"C","pid":1,"ts":', b',"name":', b',"args":{"queued":', b'}}']
_OUTSTANDING = E.template((E.LIT, 0), (E.US, 0), (E.LIT, 1), (E.I64, 1), (E.LIT, 2))
_OUTSTANDING_LITS = [b',{"ph":"C","pid":1,"ts":', b',"name":"outstanding","args":{"tasks":', b'}}']


def chrome_chunks(rec: Recording, incomplete: str | None = None):
    """The JSON trace of ``rec`` as a sequence of bytes chunks (``json.loads`` of their concatenation
    equals ``to_chrome_trace(rec, incomplete)``). Each kind of bulk event is formatted ``CHUNK`` rows at a
    time from the Recording's columns, gathered per chunk, so the memory it takes beyond the Recording is
    the node tables, a few columns over the slices, and one chunk's."""
    if rec.empty:
        yield msgspec.json.encode(_mark({"traceEvents": [], "displayTimeUnit": "ns"}, rec, incomplete))
        return
    t0 = rec.start
    base = t0 - 1000  # the 1 µs offset

    def us(ns: int) -> float:
        return (ns - t0 + 1000) / 1000
    tid_of, tid_column = trace_ranks(rec)
    tids = thread_tids(rec)
    process = process_name(rec)
    meta = _metadata(rec, process, tids)
    yield b'{"traceEvents":[' + b",".join(msgspec.json.encode(e) for e in meta)
    c = rec.columns()
    info = node_tables(c)
    S = c.slices
    passes, critical, root = slice_marks(rec)
    tables = [info["ids"], info["names"], info["devices"], info["shapes"]]
    for a in range(0, len(S), CHUNK):
        b = min(a + CHUNK, len(S))
        node, start = S.node[a:b], S.start[a:b]
        tid = tid_column(S.tid[a:b])
        cols = [tid, start, S.end[a:b] - start, node, info["seq"][node].view(np.int64),
                absent_if_zero(S.depth[a:b]), absent_if_zero(S.gt[a:b]), info["device"][node],
                absent_if_zero(info["stream"][node]), info["shape"][node], info["same"][node],
                absent_if_zero(passes[a:b]), np.where(critical[a:b], 0, -1), np.where(root[a:b], 0, -1),
                info["id_arg"][node]]
        yield E.fill([_X], None, cols, tables, _X_LITS, base, 0, b - a)
    del passes, critical, root
    q = c.samples
    for a in range(0, len(q), CHUNK):
        yield E.fill([_QUEUE], None, [q.ts, q.queue, q.depth], [c.queues], _QUEUE_LITS, base, a,
                     min(a + CHUNK, len(q)))
    ots, ovals = outstanding_changes(rec)
    for a in range(0, len(ots), CHUNK):
        yield E.fill([_OUTSTANDING], None, [ots, ovals], [], _OUTSTANDING_LITS, base, a, min(a + CHUNK, len(ots)))
    del ots, ovals
    W = c.waits
    names = [f"queue wait {name}" for name in c.queues]
    wait_tables = [names, info["ids"]]
    half = CHUNK // 2
    kinds = np.tile(np.array([0, 1], dtype=np.int64), half)  # b then e of each wait

    def two(x, y):
        return np.stack([x, y], axis=1).reshape(-1)
    for a in range(0, len(W), half):
        b = min(a + half, len(W))
        wt, k, qn, nd = tid_column(W.tid[a:b]), np.arange(a + 1, b + 1), W.queue[a:b], W.node[a:b]
        g = absent_if_zero(W.gt[a:b])
        cols = [two(wt, wt), two(k, k), two(qn, qn), two(W.pushed[a:b], W.popped[a:b]), two(nd, nd), two(g, g)]
        yield E.fill(_WAIT, kinds, cols, wait_tables, _WAIT_LITS, base, 0, 2 * (b - a))
    rest: list[dict] = []
    _lock_waits(rec, rest, us, tid_of)
    I = c.idles
    if len(I):
        it = tid_column(I.tid)
        for t, s_, e_, qn, wf in zip(it.tolist(), I.start.tolist(), I.end.tolist(), I.queue.tolist(),
                                     I.waiting_for.tolist()):
            waiting = wf >= 0
            rest.append({"ph": "X", "pid": PID, "tid": t, "ts": us(s_), "dur": max(e_ - s_, 1) / 1000,
                         "name": f"waiting for graph task {wf}" if waiting else "idle",
                         "cat": "wait" if waiting else "idle",
                         "args": {"queue": c.queues[qn], **({"graph_task": wf} if waiting else {})}})
    slices = {}
    if rec.syncs:
        wanted = {(sy.gt, n) for sy in rec.syncs for n in (sy.producer, sy.consumer)}
        for g, n, t, st in zip(S.gt.tolist(), S.node.tolist(), S.tid.tolist(), S.start.tolist()):
            if (g, c.nodes[n]) in wanted:
                slices[(g, c.nodes[n])] = (tid_of(t), us(st))
    _instants_and_flows(rec, rest, us, tid_of, slices)
    wanted = launchers(rec)
    at = {}
    if wanted:
        for n, t, st in zip(S.node.tolist(), S.tid.tolist(), S.start.tolist()):
            if c.nodes[n] in wanted and c.nodes[n] not in at:
                at[c.nodes[n]] = (tid_of(t), us(st))
    _kernels(rec, rest, us, at)
    rest.extend(extra_counters(rec, us))
    if incomplete:
        rest.append(incomplete_event(rec, incomplete))
    for a in range(0, len(rest), CHUNK):
        yield b"".join(b"," + msgspec.json.encode(e) for e in rest[a:a + CHUNK])
    if incomplete:
        yield b'],"displayTimeUnit":"ns","otherData":' + msgspec.json.encode({"incomplete": incomplete}) + b"}"
    else:
        yield b'],"displayTimeUnit":"ns"}'


def write_chrome_trace(path: str, rec: Recording, compress: bool | None = None,
                       incomplete: str | None = None) -> None:
    """Write the trace atomically (a temporary file renamed into place), gzip-compressed when ``compress``
    (by default: when the path ends in ``.gz``); a stopped run's marked ``incomplete`` (``to_chrome_trace``)."""
    if compress is None:
        compress = path.endswith(".gz")
    with atomic_writer(path, "trace_path") as f:
        if compress:
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=3, mtime=0) as z:
                for chunk in chrome_chunks(rec, incomplete):
                    z.write(chunk)
        else:
            for chunk in chrome_chunks(rec, incomplete):
                f.write(chunk)
