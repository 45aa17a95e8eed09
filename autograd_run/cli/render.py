"""Rendering for the command line: the run summary and gradients as rich tables.

Tables are built from a ``Summary`` only (``autograd_run.analysis.summary``),
so tests render them at a fixed width without colour and compare with
golden text. Every table is a ``PlainTable``: ids, names, messages and
paths from files are shown escaped, never as markup. On a narrow terminal
id and name columns fold (the whole id stays visible, broken across
lines), and numbers never wrap; workers show their short label
(``cuda:0``).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
from rich.console import Console
from rich.text import Text

from autograd_run.cli.terminal import PlainTable as Table
from autograd_run.engine.threads import worker_label

#: Column kinds: (justify, no_wrap, fold_words, min_width).
_KINDS = {"id": ("left", False, True, 4), "name": ("left", False, False, 6),
          "label": ("left", False, False, 6), "num": ("right", True, False, None),
          "text": ("left", False, True, None)}


def columns(t: Table, *spec: tuple[str, str]) -> Table:
    """Add columns ``(header, kind)`` to ``t``; kinds: ``id`` (node ids, from files) folds inside a word
    when it must (every character stays visible, broken across lines), ``name`` (op names) and ``label``
    (our own words: policies, placements, workers) wrap only between words (a table too narrow for them
    is shown without its box, then stacked), ``num`` never wraps, ``text`` (messages) wraps at spaces and
    folds a word longer than the line."""
    for header, kind in spec:
        justify, no_wrap, fold_words, min_width = _KINDS[kind]
        t.add_column(header, justify=justify, no_wrap=no_wrap, fold_words=fold_words, min_width=min_width)
    return t


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
    head.add_column(justify="left", no_wrap=True)
    head.add_column(justify="right", overflow="fold")
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

    t = columns(Table(title="workers"), ("worker", "label"), ("nodes", "num"), ("busy", "num"), ("idle", "num"),
                ("util", "num"))
    for w in s.workers:
        t.add_row(worker_label(w.name), str(w.nodes), fmt_ns(w.busy_ns), fmt_ns(w.idle_ns), f"{w.utilization:.0%}")
    out.append(t)

    t = columns(Table(title="ops"), ("op", "name"), ("count", "num"), ("total", "num"), ("mean", "num"),
                ("p95", "num"))
    for name, d in list(s.ops.items())[:top]:
        t.add_row(name, str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    if len(s.ops) > top:
        t.add_row(f"... {len(s.ops) - top} more", "", "", "", "")
    out.append(t)

    t = columns(Table(title="queue waits (push to pop)"), ("queue", "id"), ("tasks", "num"), ("total", "num"),
                ("mean", "num"), ("p95", "num"))
    for name, d in s.queue_waits.items():
        t.add_row(_queue_label(name), str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    for name, d in s.lock_waits.items():
        t.add_row(f"lock: {name}", str(d.count), fmt_ns(d.total_ns), fmt_ns(d.mean_ns), fmt_ns(d.p95_ns))
    out.append(t)

    if s.syncs:
        t = columns(Table(title=f"syncs (producer end to consumer start: {fmt_ns(s.sync_latency_ns)} in all)"),
                    ("from -> to", "id"), ("count", "num"))
        for k, v in s.syncs.items():
            t.add_row(k, str(v))
        out.append(t)

    if s.critical_path:
        t = columns(Table(title="critical path (queue wait + run time, root to leaf)"), ("node", "id"),
                    ("op", "name"), ("worker", "label"), ("queued", "num"), ("time", "num"))
        shown = s.critical_path if len(s.critical_path) <= top else s.critical_path[:top - 1]
        for r in shown:
            t.add_row(r.id, r.name, worker_label(r.thread), fmt_ns(r.queue_wait_ns), fmt_ns(r.duration_ns))
        if len(shown) < len(s.critical_path):
            t.add_row(f"... {len(s.critical_path) - len(shown)} more", "", "", "", "")
        out.append(t)

    t = columns(Table(title=f"slowest nodes (top {min(top, len(s.slowest))})"), ("node", "id"), ("op", "name"),
                ("worker", "label"), ("start", "num"), ("time", "num"), ("queued", "num"))
    for r in s.slowest[:top]:
        t.add_row(r.id, r.name, worker_label(r.thread), fmt_ns(r.start_ns), fmt_ns(r.duration_ns),
                  fmt_ns(r.queue_wait_ns))
    out.append(t)
    if s.errors:
        t = columns(Table(title="errors"), ("node: message", "text"))
        for e in s.errors:
            t.add_row(e)
        out.append(t)
    return out


def _queue_label(name: str) -> str:
    """``cpu:autograd-run reentrant-0`` -> ``cpu:reentrant-0``: the queue of a thread, by its short label."""
    kind, sep, thread = name.partition(":")
    return f"{kind}:{worker_label(thread)}" if sep and kind == "cpu" else name


def render_summary(console: Console, s, title: str, top: int = 10, devices: str | None = None) -> None:
    for r in summary_tables(s, title, top, devices):
        console.print(r)


#: Gradients with at most this many elements show their values in the table.
SHOW_VALUES = 8
#: Gradients shown in the table (``--json`` has them all): a table of 1e5 rows takes minutes to draw.
SHOW_GRADS = 20


def grads_table(result, top: int = SHOW_GRADS) -> Table:
    """One row per gradient, the first ``top`` of them: shape, sum, max |g|, and the values of small ones
    (at most ``SHOW_VALUES``); then a row ``... N more`` when there are more."""
    rows = []
    grads = result.grads
    for name, v in itertools.islice(grads.items(), top):
        if v is None:
            rows.append([name, "-", "None", "", ""])
            continue
        arr = np.asarray(host(v))
        with np.errstate(all="ignore"):  # an overflowing float16 sum shows inf, with no warning
            total = arr.sum() if arr.size else arr.dtype.type(0)
            top_abs = abs(arr).max() if arr.size else 0.0
        rows.append([name, str(list(arr.shape)), _num(total), _num(top_abs), _values(arr)])
    if len(grads) > top:
        rows.append([f"... {len(grads) - top} more", "", "", "", ""])
    spec = [("name", "id"), ("shape", "label"), ("sum", "num"), ("max |g|", "num")]
    if any(r[4] for r in rows):
        spec.append(("values", "text"))
    g = columns(Table(title=f"gradients ({result.mode})"), *spec)
    for r in rows:
        g.add_row(*r[:len(spec)])
    return g


def render_grads(console: Console, result) -> None:
    console.print(grads_table(result))


def _num(x) -> str:
    x = complex(x) if np.iscomplexobj(x) else float(x)
    return f"{x:.6g}"


def _values(arr) -> str:
    if arr.size > SHOW_VALUES:
        return ""
    with np.errstate(all="ignore"):
        text = np.array2string(arr, precision=6, separator=", ", max_line_width=10**6, threshold=SHOW_VALUES,
                               floatmode="maxprec")
    return " ".join(text.split())  # one line: rows of a matrix are not split with newlines


def host(v):
    """A numpy array of ``v`` (copied from the GPU when it is a cupy array)."""
    cupy = sys.modules.get("cupy")  # not imported: no array of it (an import that fails costs a path search)
    if cupy is not None and isinstance(v, getattr(cupy, "ndarray", ())):
        return cupy.asnumpy(v)
    return v


def report_json(report, graph: str, memory: bool = True) -> dict:
    """The ``--json`` document of a run report (``jsonout.dumps`` makes it valid JSON)."""
    from autograd_run.cli.jsonout import array_json
    error = report.error
    return {"graph": graph, "devices": report.devices.kind,
            "error": None if error is None else {"node": error.node_id, "name": error.node_name, "message": str(error)},
            "summary": report.summary.to_dict(), "samples": None if report.samples is None else report.samples.to_dict(),
            "memory": None if not memory or report.memory is None else report.memory.to_dict(),
            "grads": {} if report.result is None else {k: None if v is None else array_json(host(v))
                                                       for k, v in report.result.grads.items()}}


def samples_json(recording) -> dict | None:
    """The per-pass samples (``analysis.samples``) a comparison of runs reads, as JSON."""
    from autograd_run.analysis.samples import pass_samples
    return pass_samples(recording).to_dict() if recording is not None else None


def render_compare(console: Console, reports, title: str, memory: bool = True) -> None:
    """One row per simulated variant: wall time, engine time, critical path, busiest worker."""
    from autograd_run.sim.ddp import size_text
    limit = reports[0].options.memory_limit
    # (short headers: the table fits 80 columns without breaking a word)
    t = columns(Table(title=title), ("policy", "label"), ("devices", "num"), ("placed", "label"), ("wall", "num"),
                ("engine done", "num"), ("critical path", "num"), ("vs first", "num"),
                *((("peak", "num"),) if memory else ()),
                *((("fits " + size_text(limit), "label"),) if limit is not None and memory else ()))
    base = reports[0].wall_ns or 1
    for r in reports:
        s = r.summary
        cells = []
        if memory:
            m = r.memory
            peak = max(m.devices, key=lambda d: d.peak) if m.devices else None
            cells.append(f"{size_text(peak.peak)} ({peak.device})" if peak is not None else "-")
            if limit is not None:
                cells.append("yes" if m.over_limit is None else _plain(f"no: {m.over_limit.name} {m.over_limit.node}"))
        t.add_row(r.options.policy, str(r.options.devices or "-"), r.options.placement, fmt_ns(r.wall_ns),
                  fmt_ns(r.engine_done_ns), fmt_ns(s.critical_path_ns), f"{r.wall_ns / base:.2f}x", *cells)
    console.print(t)


def render_slack(console: Console, report) -> None:
    if report.slack_skipped is not None:
        console.print(Text(slack_skipped_line(report)))
    if not report.slack:
        return
    pct = int(report.options.slack_speedup * 100)
    t = columns(Table(title=f"what if a critical-path node were {pct}% faster"), ("node", "id"), ("op", "name"),
                ("time", "num"), ("pass shortens by", "num"))
    for s in report.slack:
        t.add_row(s.node, s.name, fmt_ns(s.duration_ns), fmt_ns(s.saved_ns))
    console.print(t)


def slack_skipped_line(report) -> str:
    """The line that says the default what-ifs were left out, and what they would cost."""
    count, took = report.slack_skipped
    return (f"what-ifs: not simulated by default for a graph of {len(report.graph.nodes):,} nodes (each is another "
            f"simulation like this one, {took:.1f} s); --slack {count} runs them")


def _plain(text) -> Text:
    """Untrusted text (names and paths from files) as a rich Text: never read as markup, control characters shown."""
    from autograd_run.cli.common import escape
    return Text(escape(str(text)))


def _faults(wall: dict) -> str:
    """capture --profile's page-fault counts, where it kept them: a call's, and the profiled calls' when they
    differ (their node times then hold that difference: docs/costs.md)."""
    n, p = wall.get("faults_median"), wall.get("profiled_faults_median")
    if not isinstance(n, (int, float)):
        return ""
    out = f", {n:,.0f} minor page faults a call"
    if isinstance(p, (int, float)) and abs(p - n) > max(1000, 0.5 * n):
        out += (f" ({p:,.0f} in the profiled calls: their node times hold the difference; the allocator's "
                "state moved between them, docs/costs.md)")
    return out


def render_costs(console: Console, measured, event_us: float = 0.0, top: int = 8,
                 plain_us: float | None = None) -> None:
    """Where the measured costs came from and, for a PyTorch profile, how it matched the graph (``event_us``:
    the spec's profiler time per recorded event, taken out of each span; ``plain_us``: its figure without
    ``record_shapes``, ``ProfileUse.line``'s)."""
    head = Table(title="measured costs", show_header=False, box=None, pad_edge=False, title_justify="left")
    head.add_column(justify="left")
    head.add_column(justify="left")
    head.add_row("source", _plain(measured.describe()))
    if getattr(measured, "use", None) is not None:
        head.add_row("used", _plain(measured.use.line(event_us, plain_us)))
    wall = measured.info.get("backward_wall_ns")
    if isinstance(wall, dict) and isinstance(wall.get("median"), (int, float)):
        head.add_row("PyTorch backward (no profiler)",
                     f"{fmt_ns(wall['median'])} median of {wall.get('runs', '?')} runs" + _faults(wall))
    cov = measured.coverage
    if isinstance(cov, dict) and cov.get("trace") and isinstance(cov.get("matched"), int):  # an autograd-run trace
        other = cov.get("other") or 0
        rest = " (the rest analytic)" if cov["matched"] != cov.get("nodes") else ""
        head.add_row("matched", f"{cov['matched']} of {cov.get('nodes', '?')} graph nodes{rest}"
                     + (f"; the trace's other {other} node{'s' if other != 1 else ''} are not this graph's"
                        if other else ""))
    elif isinstance(cov, dict) and isinstance(cov.get("matched"), int):  # stored by capture --profile
        head.add_row("matched", f"{cov['matched']} of {cov.get('nodes', '?')} graph nodes when measured")
    if cov is not None and hasattr(cov, "alignment"):
        head.add_row("matched", f"{cov.matched_count} of {cov.nodes} graph nodes in {len(cov.steps)} backward call(s)"
                     + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(cov.methods.items()))})" if cov.methods else ""))
        for line in cov.alignment()[:top]:
            head.add_row("alignment", _plain(line))
        if cov.gpu_activities:
            head.add_row("GPU", f"{cov.gpu_attributed} of {cov.gpu_activities} kernels and copies launched by a "
                         "matched backward node")
        if cov.outside:
            head.add_row("outside", f"{cov.outside} backward node runs outside the matched calls (other work)")
    console.print(head)
    if cov is None or not hasattr(cov, "alignment"):
        return
    if cov.unmatched:
        t = Table(title="graph nodes without a measurement (analytic costs)")
        for c in ("node", "op", "why"):
            t.add_column(c, fold_words=c != "why")
        for nid, name, why in cov.unmatched[:top]:
            t.add_row(_plain(nid), _plain(name), _plain(why))
        if len(cov.unmatched) > top:
            t.add_row(f"... {len(cov.unmatched) - top} more", "", "")
        console.print(t)
    if cov.trace_unmatched:
        t = Table(title="runs in the matched calls without a graph node")
        for c, j in (("name", "left"), ("count", "right"), ("why", "left")):
            t.add_column(c, justify=j, fold_words=c == "name")
        for name, (count, why) in sorted(cov.trace_unmatched.items(), key=lambda kv: -kv[1][0])[:top]:
            t.add_row(_plain(name), str(count), _plain(why))
        console.print(t)


def render_streams(console: Console, st) -> None:
    """A simulation's accelerator streams (``analysis.streams.StreamReport``): per stream its kernels, busy
    and idle time over its span; the communication hidden under compute; the critical path through threads
    and streams and how it splits between the CPU and the kernels."""
    if st is None or not st.streams:
        return
    t = columns(Table(title="streams (first kernel to last)"), ("stream", "id"), ("kernels", "num"),
                ("busy", "num"), ("idle", "num"), ("util", "num"))
    for s in st.streams:
        t.add_row(_plain(s.stream), str(s.kernels), fmt_ns(s.busy_ns), fmt_ns(s.idle_ns), f"{s.utilization:.0%}")
    if len(st.streams) > 1 and st.total is not None:
        s = st.total
        t.add_section()
        t.add_row(s.stream, str(s.kernels), fmt_ns(s.busy_ns), fmt_ns(s.idle_ns), f"{s.utilization:.0%}")
    console.print(t)
    if st.overlap is not None:
        console.print(_plain(f"communication under compute kernels: {st.overlap:.1%} of "
                             f"{fmt_ns(st.comm_ns)} ({fmt_ns(st.hidden_ns)} hidden)"))
    if st.path_ns:
        share = lambda ns: f"{ns / st.path_ns:.0%}"  # noqa: E731
        console.print(_plain(f"critical path through threads and streams: {fmt_ns(st.path_ns)} (kernels "
                             f"{share(st.path_gpu_ns)}, CPU {share(st.path_cpu_ns)}, waits "
                             f"{share(st.path_wait_ns)})"))


def render_memory(console: Console, mem, top: int = 5) -> None:
    """The pass's memory (``analysis.memory.Memory``): per device its allocated bytes at the start, the peak
    (when, and the node running), after the pass; the largest holders at each peak; a limit passed."""
    from autograd_run.sim.ddp import size_text
    if mem is None or not mem.devices:
        return
    t = Table(title="memory (allocated bytes)")
    for c, j in (("device", "left"), ("at start", "right"), ("peak", "right"), ("at", "right"),
                 ("while running", "left"), ("after the pass", "right")):
        t.add_column(c, justify=j, no_wrap=j == "right")  # sizes and times never wrap
    for d in mem.devices:
        running = _plain(f"{d.peak_name} {d.peak_node}") if d.peak_node is not None else "(before the first node)"
        t.add_row(_plain(d.device), size_text(d.start), size_text(d.peak), fmt_ns(d.peak_ns), running,
                  size_text(d.end))
    console.print(t)
    for d in mem.devices:
        if not d.holders:
            continue
        h = Table(title=f"at the {_plain(d.device).plain} peak: by kind, and the largest blocks")
        h.add_column("holds", fold_words=True)
        h.add_column("bytes", justify="right", no_wrap=True)
        for kind, n in sorted(d.at_peak.items(), key=lambda kv: -kv[1]):
            h.add_row(kind, size_text(n))
        h.add_section()
        for x in d.holders[:top]:
            h.add_row(_plain(x.what), size_text(x.bytes))
        console.print(h)
    note = ("shared storage as captured" if mem.storage == "captured" else
            "each saved tensor its own allocation (capture records shared storage)")
    console.print(_plain(f"memory model: {note}; formulas' scratch space and the allocator's cache not counted"
                         + ("; saved tensors kept (retain_graph)" if mem.retain_graph else "")))
    if mem.over_limit is not None:
        o = mem.over_limit
        console.print(_plain(f"over the memory limit of {size_text(o.limit)} on {o.device}: "
                             f"{size_text(o.bytes)} at {fmt_ns(o.ns)}, while {o.name} {o.node} ran"))


def render_ddp_compare(console: Console, key: str, results) -> None:
    """``--compare bucket_cap_mb=...`` / ``world=...`` with --ddp: one row per value."""
    t = Table(title=f"DDP: {key} compared")
    for c in (key, "buckets", "communication", "backward with the final wait", "exposed", "hidden"):
        t.add_column(c, justify="right")
    best = min(r.wall_ns for _, r in results)
    for v, r in results:
        mark = " (fastest)" if r.wall_ns == best and sum(x.wall_ns == best for _, x in results) == 1 else ""
        t.add_row(f"{v:g}", str(sum(1 for b in r.buckets if b.kind == "bucket")), fmt_ns(r.comm_ns),
                  fmt_ns(r.wall_ns) + mark, fmt_ns(r.exposed_ns), f"{r.overlap:.0%}")
    console.print(t)


def render_comm_slack(console: Console, rows: list[dict]) -> None:
    """DDP's or FSDP's what-ifs on the collectives (``sim.ddp.what_ifs``), when there are any."""
    if not rows:
        return
    what = Table(title="What if (the collectives)")
    for c, j in (("change", "left"), ("backward with the final wait", "right"), ("ends", "right")):
        what.add_column(c, justify=j)
    for row in rows:
        saved = row["saved_ns"]
        ends = "no change" if saved == 0 else f"{fmt_ns(abs(saved))} {'sooner' if saved > 0 else 'later'}"
        what.add_row(_plain(row["what"]), fmt_ns(row["wall_ns"]), ends)
    console.print(what)


def render_ddp(console: Console, r) -> None:
    """The data-parallel view (``sim.ddp.DdpResult``): each bucket's all-reduce, and what stayed exposed."""
    from autograd_run.sim.ddp import size_text
    t = Table(title=f"DDP on {r.world} ranks ({r.iteration} iteration): bucket all-reduces")
    for c, j in (("bucket", "right"), ("params", "right"), ("size", "right"), ("ready", "right"),
                 ("start", "right"), ("end", "right"), ("launched by", "left")):
        t.add_column(c, justify=j, fold_words=c == "launched by")
    for b in r.buckets[:20]:
        size = size_text(b.nbytes)
        label = str(b.index) if b.kind == "bucket" else "used map"
        by = _plain(b.trigger) if b.trigger is not None else "the final callback"
        t.add_row(label, str(len(b.params)) if b.kind == "bucket" else "", size, fmt_ns(b.ready_ns),
                  fmt_ns(b.start_ns), fmt_ns(b.end_ns), by)
    if len(r.buckets) > 20:
        t.add_row(f"... {len(r.buckets) - 20} more", "", "", "", "", "", "")
    console.print(t)
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column()
    head.add_column(justify="right")
    head.add_row("compute (this rank's backward)", fmt_ns(r.compute_ns))
    head.add_row("backward with the final wait", fmt_ns(r.wall_ns))
    if r.copy_back_ns:
        head.add_row("of it, the reduced buckets copied back into .grad", fmt_ns(r.copy_back_ns))
    head.add_row("exposed communication", fmt_ns(r.exposed_ns))
    head.add_row("communication hidden under compute", f"{r.overlap:.0%}")
    if r.unused:
        head.add_row("parameters no node reaches (ready at the first hook)", str(len(r.unused)))
    if r.straggler is not None:
        st = r.straggler
        head.add_row(f"straggler: rank {st['rank']}, {st['slowdown']:g}x slower, its compute",
                     fmt_ns(st["compute_ns"]))
        head.add_row("every other rank ends later by", fmt_ns(st["delay_ns"]))
    if r.link is not None and r.world > 1:
        lk = r.link
        head.add_row(f"link ({_plain(lk.name).plain})",
                     f"{lk.alpha_us:.3g} us, {lk.bandwidth / 1e9:.3g} GB/s, {lk.channels} in flight")
    console.print(head)
    render_comm_slack(console, r.slack)
    if r.link is not None and r.world > 1 and r.link.source:
        console.print(_plain(f"link source: {r.link.source}"))


def render_fsdp(console: Console, r) -> None:
    """The FSDP2 view (``sim.fsdp.FsdpResult``): each unit's all-gather and reduce-scatter, and the waits."""
    from autograd_run.sim.ddp import size_text
    shard = r.world // r.replicate
    mesh = f"{r.world} ranks" + (f" ({r.replicate} replicas of {shard})" if r.replicate > 1 else "")
    how = "blocking the compute (CPU)" if r.blocking else "on streams of their own"
    from rich import box
    t = Table(title=f"FSDP2 on {mesh}: collectives per unit, {how}", box=box.SIMPLE_HEAD,
              collapse_padding=True, pad_edge=False)
    cols = [("unit", "left"), ("size", "right"), ("gather", "right"), ("gathered", "right"), ("by", "left"),
            ("waited", "right"), ("reduced", "right")]
    if r.replicate > 1:
        cols.append(("HSDP AR", "right"))
    for c, j in cols:
        t.add_column(c, justify=j, fold_words=c in ("unit", "by"))
    order = sorted(r.units, key=lambda u: (u.pre_ns is None, u.pre_ns or 0, -u.index))

    def ends(span):
        return ("-", "-") if span is None else (fmt_ns(span.start_ns), fmt_ns(span.end_ns))
    for u in order[:30]:
        by = u.gathered_by or ("unsharded" if u.pre_ns is not None else "never ran")
        by = "itself" if by == "pre-backward" else by.replace("prefetch by ", "")
        row = [_plain(u.name or "(root)"), size_text(u.gather_bytes), *ends(u.all_gather), _plain(by),
               fmt_ns(u.wait_ns + u.rs_wait_ns), ends(u.reduce_scatter)[1]]
        if r.replicate > 1:
            row.append(ends(u.all_reduce)[1])
        t.add_row(*row)
    if len(order) > 30:
        t.add_row(f"... {len(order) - 30} more", *[""] * (len(cols) - 1))
    console.print(t)
    console.print(_plain("gather/gathered: its all-gather's start and end; by: the unit whose pre-backward issued "
                         "it (its own, or a prefetch), or recompute: activation checkpointing ran its forward again in the "
                         "backward; waited: the compute's wait for it and for the previous "
                         "reduce-scatter; reduced: its reduce-scatter's end (--json: every start and end)"))
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column()
    head.add_column(justify="right")
    head.add_row("compute (this rank's backward)", fmt_ns(r.compute_ns))
    head.add_row("backward with its collectives", fmt_ns(r.wall_ns))
    head.add_row("compute idle, waiting on communication", fmt_ns(r.idle_ns))
    head.add_row("exposed communication (after the last node)", fmt_ns(r.exposed_ns))
    head.add_row("communication hidden under compute", f"{r.overlap:.0%}")
    if r.link is not None and r.world > 1:
        lk = r.link
        head.add_row(f"link ({_plain(lk.name).plain})", f"{lk.alpha_us:.3g} us, {lk.bandwidth / 1e9:.3g} GB/s"
                     + (", reduce-scatter as all-reduce" if lk.reduce_scatter == "allreduce" else ""))
    console.print(head)
    render_comm_slack(console, r.slack)
    if r.link is not None and r.world > 1 and r.link.source:
        console.print(_plain(f"link source: {r.link.source}"))


def render_fsdp_compare(console: Console, key: str, results: list) -> None:
    t = Table(title=f"FSDP2: {key} compared")
    for c in (key, "communication", "backward with its collectives", "compute idle", "exposed", "hidden"):
        t.add_column(c, justify="right")
    best = min(r.wall_ns for _, r in results)
    for v, r in results:
        mark = " (fastest)" if r.wall_ns == best and sum(x.wall_ns == best for _, x in results) == 1 else ""
        t.add_row(f"{v:g}", fmt_ns(r.comm_ns), fmt_ns(r.wall_ns) + mark, fmt_ns(r.idle_ns), fmt_ns(r.exposed_ns),
                  f"{r.overlap:.0%}")
    console.print(t)
