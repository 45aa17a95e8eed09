"""Chrome / Perfetto trace: a pure function from recorded events to the JSON trace.

One process ("autograd-run"), one thread track per worker (the caller / CPU
worker first, then device workers, then reentrant pool threads); one
complete (``X``) slice per node execution with its id, name, seq, depth,
device, stream and input shapes; queue waits as slices named after the
queue; syncs as flow arrows from producer to consumer slice; queue depths
as counters; errors and NaN detections as instant events. Timestamps are
microseconds from the first event, offset by 1 µs so nothing sits at 0.
"""

from __future__ import annotations

from typing import Iterable

import msgspec

from autograd_run.traces import recorder as R

PID = 1


def _thread_rank(name: str) -> int:
    if "cuda:" in name:
        return 1
    if "reentrant" in name:
        return 2
    return 0


def to_chrome_trace(events: Iterable[tuple], threads: dict[int, str], os_tids: dict[int, int] | None = None) -> dict:
    """The trace for recorded ``events``; ``threads`` names thread idents, ``os_tids`` maps them to OS ids."""
    os_tids = os_tids or {}
    events = [_with_os_tid(e, os_tids) for e in events]
    threads = {os_tids.get(k, k & 0x7FFFFFFF): v for k, v in threads.items()}
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ns"}
    t0 = min(e[1] for e in events)

    def us(ns: int) -> float:
        return (ns - t0) / 1000.0 + 1.0

    out: list[dict] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": "autograd-run"}}]
    order = sorted(threads.items(), key=lambda kv: (_thread_rank(kv[1]), kv[1]))
    for rank, (tid, name) in enumerate(order):
        label = "caller / CPU worker" if _thread_rank(name) == 0 else name
        out.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": f"{label} ({name})" if label != name else name}})
        out.append({"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": rank}})

    open_nodes: dict[tuple, tuple] = {}
    slices: dict[tuple, tuple] = {}  # (gt_id, node) -> (tid, start_us, end_us)
    pushed: dict[tuple, int] = {}
    flow_id = 0
    wait_id = 0
    outstanding: dict[int, int] = {}
    for ev in events:
        kind = ev[0]
        if kind == R.NODE_START:
            _, ts, tid, gt, depth, node = ev
            open_nodes[(tid, gt, node)] = (ts, depth)
        elif kind == R.NODE_END:
            _, ts, tid, gt, depth, node = ev
            start, d = open_nodes.pop((tid, gt, node), (ts, depth))
            dur = max((ts - start) / 1000.0, 0.001)
            out.append({"ph": "X", "pid": PID, "tid": tid, "ts": us(start), "dur": dur, "name": node.name,
                        "cat": "node", "args": {"id": node.id, "seq": node.seq, "depth": d,
                                                "graph_task": gt, "device": str(node.device),
                                                "stream": node.stream,
                                                "input_shapes": [list(m.shape) for m in node.inputs]}})
            slices[(gt, node)] = (tid, us(start), us(start) + dur)
            if gt in outstanding:
                outstanding[gt] -= 1
                out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": f"outstanding tasks, graph task {gt}",
                            "args": {"tasks": outstanding[gt]}})
        elif kind == R.PUSH:
            _, ts, tid, qname, gt, node, depth = ev
            if node is not None:
                pushed[(gt, node)] = ts
                outstanding[gt] = outstanding.get(gt, 0) + 1
                out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": f"outstanding tasks, graph task {gt}",
                            "args": {"tasks": outstanding[gt]}})
            out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": f"ready queue {qname}", "args": {"depth": depth}})
        elif kind == R.POP:
            _, ts, tid, qname, gt, node, depth = ev
            if node is not None and (gt, node) in pushed:
                start = pushed.pop((gt, node))
                # Async slices: a task waits while its worker runs other nodes.
                wait_id += 1
                common = {"pid": PID, "tid": tid, "cat": "queue_wait", "id": wait_id,
                          "name": f"queue wait {qname}"}
                out.append({**common, "ph": "b", "ts": us(start), "args": {"id": node.id, "node": node.name, "graph_task": gt}})
                out.append({**common, "ph": "e", "ts": us(ts)})
            out.append({"ph": "C", "pid": PID, "ts": us(ts), "name": f"ready queue {qname}", "args": {"depth": depth}})
        elif kind == R.LOCK_WAIT:
            _, ts, tid, lname, gt, waited = ev
            out.append({"ph": "X", "pid": PID, "tid": tid, "ts": us(ts - waited), "dur": waited / 1000.0,
                        "name": f"lock wait: {lname}", "cat": "lock_wait", "args": {"graph_task": gt}})
        elif kind == R.IDLE:
            _, start, tid, qname, end = ev
            out.append({"ph": "X", "pid": PID, "tid": tid, "ts": us(start), "dur": max((end - start) / 1000.0, 0.001),
                        "name": "idle", "cat": "idle", "args": {"queue": qname}})
        elif kind in (R.ERROR, R.NAN):
            _, ts, tid, gt, node, detail = ev
            out.append({"ph": "i", "pid": PID, "tid": tid, "ts": us(ts), "s": "t",
                        "name": "error" if kind == R.ERROR else "nan detected", "cat": kind,
                        "args": {"id": node.id if node is not None else None, "detail": str(detail)}})
    # Syncs: flow from the producer's slice to the consumer's slice.
    for ev in events:
        if ev[0] != R.SYNC:
            continue
        _, ts, tid, gt, prod, cons, src, dst = ev
        p = slices.get((gt, prod))
        c = slices.get((gt, cons))
        if p is None or c is None:
            continue
        flow_id += 1
        # Flow ends share ts, tid and cat with their slices: Perfetto binds the start to
        # the enclosing producer slice and the end (bp "e") to the enclosing consumer
        # slice; Chrome DevTools binds only on an exact (ts, pid, tid, cat) match.
        out.append({"ph": "s", "pid": PID, "tid": p[0], "ts": p[1], "id": flow_id, "name": f"sync {src} -> {dst}",
                    "cat": "node"})
        out.append({"ph": "f", "bp": "e", "pid": PID, "tid": c[0], "ts": c[1], "id": flow_id,
                    "name": f"sync {src} -> {dst}", "cat": "node"})
        out.append({"ph": "i", "pid": PID, "tid": c[0], "ts": c[1], "s": "t", "name": f"sync {src} -> {dst}",
                    "cat": "sync", "args": {"producer": prod.id, "consumer": cons.id}})
    return {"traceEvents": out, "displayTimeUnit": "ns"}


def _with_os_tid(ev: tuple, os_tids: dict) -> tuple:
    tid = ev[2]
    return ev[:2] + (os_tids.get(tid, tid & 0x7FFFFFFF),) + ev[3:]


def write_chrome_trace(path: str, events, threads, os_tids=None) -> None:
    with open(path, "wb") as f:
        f.write(msgspec.json.encode(to_chrome_trace(events, threads, os_tids)))
