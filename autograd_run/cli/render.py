"""Rendering for the command line: the run summary (rich) and the order file."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from autograd_run.traces import recorder as R


def write_order(path: str, rec) -> None:
    pos = 0
    with open(path, "w") as f:
        for ev in rec.events:
            if ev[0] != R.NODE_START:
                continue
            _, ts, tid, gt, depth, node = ev
            if node.name == "GraphRoot":
                continue
            f.write(json.dumps({"position": pos, "id": node.id, "name": node.name, "seq": node.seq,
                                "device": str(node.device), "thread": rec.threads.get(tid, str(tid)),
                                "depth": depth, "graph_task": gt}) + "\n")
            pos += 1


def render_run(graph, rec, result, wall: float, devices, trace_path) -> None:
    console = Console()
    per_thread: dict[str, list[int]] = {}
    starts = {}
    for ev in rec.events:
        if ev[0] == R.NODE_START:
            starts[(ev[2], ev[3], ev[5])] = ev[1]
        elif ev[0] == R.NODE_END:
            s = starts.pop((ev[2], ev[3], ev[5]), ev[1])
            name = rec.threads.get(ev[2], str(ev[2]))
            per_thread.setdefault(name, [0, 0])
            per_thread[name][0] += 1
            per_thread[name][1] += ev[1] - s
    t = Table(title=f"{graph.source}: {len(graph.nodes)} nodes, {wall * 1e3:.2f} ms wall, devices {devices.kind}")
    t.add_column("worker")
    t.add_column("nodes", justify="right")
    t.add_column("busy ms", justify="right")
    for name, (count, busy) in per_thread.items():
        t.add_row(name, str(count), f"{busy / 1e6:.3f}")
    console.print(t)
    if result is not None:
        g = Table(title=f"gradients ({result.mode})")
        g.add_column("name")
        g.add_column("shape")
        g.add_column("sum", justify="right")
        for name, v in result.grads.items():
            if v is None:
                g.add_row(name, "-", "None")
            else:
                g.add_row(name, str(list(v.shape)), f"{float(v.sum()):.6g}")
        console.print(g)
    if trace_path:
        console.print(f"trace written to {trace_path} (open it in https://ui.perfetto.dev)")
