"""``autograd-run simulate``: the engine on a virtual clock, with what-if devices, placements, policies, costs."""

from __future__ import annotations

import json

import click

from autograd_run.cli.common import escape
from autograd_run.cli.view_cmd import require_viewer, show_trace
from autograd_run.sim.placement import PLACEMENTS
from autograd_run.sim.policies import POLICIES


def _variants(compare: str | None, policy: str, devices: int | None) -> list[tuple[str, int | None]]:
    """``--compare policy=a,b`` / ``devices=1,2,4`` / a list of policies: the (policy, devices) pairs to run."""
    if not compare:
        return [(policy, devices)]
    from autograd_run.errors import UsageError
    key, sep, values = compare.partition("=")
    if not sep:
        key, values = "policy", compare
    items = [v.strip() for v in values.split(",") if v.strip()]
    if key == "policy":
        bad = [v for v in items if v not in POLICIES]
        if bad:
            raise UsageError(f"--compare: unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
        return [(v, devices) for v in items]
    if key == "devices":
        try:
            counts = [int(v) for v in items]
        except ValueError:
            raise UsageError("--compare devices=K,K,...: device counts are integers") from None
        if any(c < 1 or c > 1024 for c in counts):
            raise UsageError("--compare devices: counts must be in [1, 1024]")
        return [(policy, c) for c in counts]
    raise UsageError("--compare takes policy=A,B,... or devices=K,K,...")


@click.command()
@click.argument("graph")
@click.option("--spec", default=None, metavar="NAME|FILE",
              help="Machine spec: h100, h200, a100, l4, cpu, local (measured by `calibrate`) or a file. "
                   "Default: local when calibrated, else h100.")
@click.option("--devices", type=click.IntRange(1, 1024), default=None,
              help="Remap the graph onto K accelerator devices (with --placement).")
@click.option("--placement", type=click.Choice(PLACEMENTS), default=None,
              help="How nodes are placed on --devices  [default: keep, or greedy with --devices]")
@click.option("--policy", type=click.Choice(POLICIES), default="pytorch", show_default=True,
              help="Scheduling policy.")
@click.option("--scale", default=None, metavar="NAME=F,...",
              help="Scale the costs of an op name or a device, e.g. MmBackward0=0.5,cuda:1=2.0.")
@click.option("--costs", default=None, metavar="TRACE", help="Node durations measured in a trace of `run --trace`.")
@click.option("--compare", default=None, metavar="policy=A,B|devices=K,K",
              help="Simulate several policies or device counts and print one table.")
@click.option("--trace", "trace_path", default=None, metavar="FILE",
              help="Write the simulated trace (.json, .json.gz or .pftrace, as run --trace).")
@click.option("--open", "open_trace", is_flag=True,
              help="Then open the trace in the Perfetto UI served on 127.0.0.1 (needs --trace; see `view`).")
@click.option("--order-out", default=None, metavar="FILE",
              help="Write the predicted order (a golden for `run --expect-order`).")
@click.option("--slack", type=click.IntRange(0, 100), default=5, show_default=True,
              help="What-if for the N slowest critical-path nodes made 20% faster.")
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the summary tables.")
@click.option("--json", "json_out", is_flag=True, help="Print the result as JSON.")
def simulate(graph, spec, devices, placement, policy, scale, costs, compare, trace_path, open_trace, order_out, slack,
             summary, json_out):
    """Simulate GRAPH's backward pass on a virtual clock (no node runs).

    The simulation runs the engine's own scheduling code on simulated workers,
    queues and streams, with costs from the graph's cost nodes, a measured
    trace (--costs) or each op's FLOPs and bytes on the machine spec.

    \b
    Examples:
      autograd-run simulate example:mlp
      autograd-run simulate example:pipeline --trace sim.json --open
      autograd-run simulate model.json --spec a100 --devices 2 --placement layer
      autograd-run simulate model.json --compare policy=pytorch,fifo,single-thread
      autograd-run simulate model.json --compare devices=1,2,4 --json
      autograd-run simulate graph.json --order-out golden.jsonl   # then: run --expect-order
    """
    from autograd_run.graphs.load import load_graph
    from autograd_run.outputs import check_output_path
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.traces.order import write_order

    if open_trace:
        if not trace_path:
            from autograd_run.errors import UsageError
            raise UsageError("--open needs --trace FILE")
        require_viewer()
    g = load_graph(graph)
    variants = _variants(compare, policy, devices)
    for path, option in ((trace_path, "trace_path"), (order_out, "order_out")):
        if path:
            check_output_path(path, option, [g.source])
    reports = []
    for pol, k in variants:
        opts = SimOptions(spec=spec, devices=k, placement=placement or ("greedy" if k else "keep"), policy=pol,
                          scale=scale, costs=costs, slack_top=slack if len(variants) == 1 else 0,
                          detail=bool(trace_path))
        reports.append(simulate_session(g, opts))
    first = reports[0]
    if trace_path:
        from autograd_run.traces.trace_file import write_trace
        write_trace(trace_path, first.recording)
    if order_out:
        write_order(order_out, first.order)
    if json_out:
        click.echo(json.dumps([_report_json(r) for r in reports] if len(reports) > 1 else _report_json(first)))
        if open_trace:
            show_trace(trace_path, url_to_stderr=True)
        return
    from rich.console import Console
    from autograd_run.cli.render import render_compare, render_slack, render_summary
    console = Console()
    if len(reports) > 1:
        render_compare(console, reports, f"{graph}: simulated, {len(g.nodes)} nodes")
    elif summary:
        render_summary(console, first.summary, f"{graph}: simulated on {first.label}, {len(first.graph.nodes)} nodes")
        render_slack(console, first)
    if trace_path and not open_trace:
        console.print(f"simulated trace written to {escape(trace_path)} (open it with `autograd-run view`, or in "
                      "https://ui.perfetto.dev)", markup=False, highlight=False, soft_wrap=True)
    if open_trace:
        show_trace(trace_path)


def _report_json(r) -> dict:
    return {"spec": r.spec.name, "policy": r.options.policy, "devices": r.options.devices,
            "placement": r.options.placement, "wall_ns": r.wall_ns, "engine_done_ns": r.engine_done_ns,
            "cost_sources": r.cost_sources, "summary": r.summary.to_dict(),
            "slack": [s.__dict__ for s in r.slack]}


@click.command()
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Where to write the spec  [default: the user cache folder, used as --spec local]")
@click.option("--nodes", type=click.IntRange(200, 1_000_000), default=4000, show_default=True,
              help="Chain length of the engine measurements.")
def calibrate(output, nodes):
    """Measure this machine (engine cost per node, hand-off latency, FLOP/s, bandwidth) for `simulate --spec local`.

    \b
    Example:
      autograd-run calibrate && autograd-run simulate example:pipeline --spec local
    """
    from autograd_run.sim.calibrate import calibrate as measure, write_local
    spec = measure(nodes=nodes)
    path = write_local(spec, output)
    e, h = spec.engine, spec.host
    click.echo(f"engine: {e.node_overhead_us:.2f} us per node, hand-off {e.handoff_us:.1f} us (holds the GIL)")
    click.echo(f"host: float32 {h.peak_flops['float32'] / 1e9:.1f} GFLOP/s, float64 {h.peak_flops['float64'] / 1e9:.1f} "
               f"GFLOP/s, {h.mem_bw / 1e9:.1f} GB/s, smallest call {h.min_kernel_us:.2f} us")
    click.echo(f"wrote {path}")
