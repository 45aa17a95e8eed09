"""Rendering for the command line: the run summary and gradients as rich tables.

Tables are built from a ``Summary`` only (``autograd_run.traces.summary``),
so tests render them at a fixed width without colour and compare with
golden text.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def summary_tables(s, title: str, top: int = 10, devices: str | None = None) -> list:
    """The rich renderables for a Summary, in display order."""
    out = []
    head = Table(title=title, show_header=False, box=None, pad_edge=False, title_justify="left")
    head.add_column(justify="left")
    head.add_column(justify="right")
    if devices:
        head.add_row("devices", devices)
    head.add_row("wall time", fmt_ns(s.wall_ns))
    head.add_row("nodes executed", str(s.nodes_executed))
    head.add_row("nodes skipped", str(s.nodes_skipped))
    head.add_row("graph tasks", str(s.graph_tasks))
    if s.passes.count > 1:
        head.add_row(f"passes ({s.passes.count})", f"mean {fmt_ns(s.passes.mean_ns)}, p95 {fmt_ns(s.passes.p95_ns)}")
    head.add_row("critical path", f"{fmt_ns(s.critical_path_ns)} ({s.critical_path_share:.0%} of wall), "
                 f"{len(s.critical_path)} nodes")
    if s.opaque_nodes:
        head.add_row("opaque nodes (no rule)", ", ".join(s.opaque_nodes[:8]) + (" ..." if len(s.opaque_nodes) > 8 else ""))
    out.append(head)

    t = Table(title="workers")
    for c, j in (("worker", "left"), ("nodes", "right"), ("busy", "right"), ("idle", "right"), ("util", "right")):
        t.add_column(c, justify=j)
    for w in s.workers:
        t.add_row(w.name, str(w.nodes), fmt_ns(w.busy_ns), fmt_ns(w.idle_ns), f"{w.utilization:.0%}")
    out.append(t)

    t = Table(title="ops")
    for c, j in (("op", "left"), ("count", "right"), ("total", "right"), ("mean", "right"), ("p95", "right")):
        t.add_column(c, justify=j)
    for name, d in list(s.ops.items())[:top]:
        t.add_row(name, str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    if len(s.ops) > top:
        t.add_row(f"... {len(s.ops) - top} more", "", "", "", "")
    out.append(t)

    t = Table(title="queue waits (push to pop)")
    for c, j in (("queue", "left"), ("tasks", "right"), ("total", "right"), ("mean", "right"), ("p95", "right")):
        t.add_column(c, justify=j)
    for name, d in s.queue_waits.items():
        t.add_row(name, str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    for name, d in s.lock_waits.items():
        t.add_row(f"lock: {name}", str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    out.append(t)

    if s.syncs:
        t = Table(title=f"syncs (producer end to consumer start: {fmt_ns(s.sync_latency_ns)} in all)")
        t.add_column("from -> to")
        t.add_column("count", justify="right")
        for k, v in s.syncs.items():
            t.add_row(k, str(v))
        out.append(t)

    if s.critical_path:
        t = Table(title="critical path (queue wait + run time, root to leaf)")
        for c, j in (("node", "left"), ("op", "left"), ("worker", "left"), ("queue wait", "right"), ("time", "right")):
            t.add_column(c, justify=j)
        shown = s.critical_path if len(s.critical_path) <= top else s.critical_path[:top - 1]
        for r in shown:
            t.add_row(r.id, r.name, r.thread, fmt_ns(r.queue_wait_ns), fmt_ns(r.duration_ns))
        if len(shown) < len(s.critical_path):
            t.add_row(f"... {len(s.critical_path) - len(shown)} more", "", "", "", "")
        out.append(t)

    t = Table(title=f"slowest nodes (top {min(top, len(s.slowest))})")
    for c, j in (("node", "left"), ("op", "left"), ("worker", "left"), ("start", "right"), ("time", "right"),
                 ("queue wait", "right")):
        t.add_column(c, justify=j)
    for r in s.slowest[:top]:
        t.add_row(r.id, r.name, r.thread, fmt_ns(r.start_ns), fmt_ns(r.duration_ns), fmt_ns(r.queue_wait_ns))
    out.append(t)
    if s.errors:
        t = Table(title="errors")
        t.add_column("node: message")
        for e in s.errors:
            t.add_row(e)
        out.append(t)
    return out


def render_summary(console: Console, s, title: str, top: int = 10, devices: str | None = None) -> None:
    for r in summary_tables(s, title, top, devices):
        console.print(r)


def render_grads(console: Console, result, top: int = 20) -> None:
    """The first ``top`` gradients (``--json`` has them all): a table of 1e5 rows takes minutes to draw."""
    g = Table(title=f"gradients ({result.mode})")
    g.add_column("name")
    g.add_column("shape")
    g.add_column("sum", justify="right")
    g.add_column("max |g|", justify="right")
    items = list(result.grads.items())
    for name, v in items[:top]:
        if v is None:
            g.add_row(name, "-", "None", "")
        else:
            arr = _host(v)
            g.add_row(name, str(list(arr.shape)), f"{float(arr.sum()):.6g}",
                      f"{float(abs(arr).max()) if arr.size else 0.0:.6g}")
    if len(items) > top:
        g.add_row(f"... {len(items) - top} more", "", "", "")
    console.print(g)


def _host(v):
    try:
        import cupy
        if isinstance(v, cupy.ndarray):
            return cupy.asnumpy(v)
    except Exception:
        pass
    return v


def report_json(report, graph: str) -> dict:
    """The ``--json`` document of a run report."""
    error = report.error
    return {"graph": graph, "devices": report.devices.kind,
            "error": None if error is None else {"node": error.node_id, "name": error.node_name, "message": str(error)},
            "summary": report.summary.to_dict(),
            "grads": {} if report.result is None else {k: None if v is None else _host(v).tolist()
                                                       for k, v in report.result.grads.items()}}


def render_compare(console: Console, reports, title: str) -> None:
    """One row per simulated variant: wall time, engine time, critical path, busiest worker."""
    t = Table(title=title)
    for c, j in (("policy", "left"), ("devices", "right"), ("placement", "left"), ("wall", "right"),
                 ("engine done", "right"), ("critical path", "right"), ("vs first", "right")):
        t.add_column(c, justify=j)
    base = reports[0].wall_ns or 1
    for r in reports:
        s = r.summary
        t.add_row(r.options.policy, str(r.options.devices or "-"), r.options.placement, fmt_ns(r.wall_ns),
                  fmt_ns(r.engine_done_ns), fmt_ns(s.critical_path_ns), f"{r.wall_ns / base:.2f}x")
    console.print(t)


def render_slack(console: Console, report) -> None:
    if not report.slack:
        return
    pct = int(report.options.slack_speedup * 100)
    t = Table(title=f"what if a critical-path node were {pct}% faster")
    for c, j in (("node", "left"), ("op", "left"), ("time", "right"), ("pass shortens by", "right")):
        t.add_column(c, justify=j)
    for s in report.slack:
        t.add_row(s.node, s.name, fmt_ns(s.duration_ns), fmt_ns(s.saved_ns))
    console.print(t)
