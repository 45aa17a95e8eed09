"""``autograd-run simulate``: the engine on a virtual clock, with what-if devices, placements, policies, costs."""

from __future__ import annotations

import gc
import os

import click

from autograd_run.cli import jsonout
from autograd_run.cli.common import (
    Whole, echo, memory_limit_option, memory_option, memory_snapshot_option, one_shot_work,
    want_memory, write,
)
from autograd_run.cli.run_cmd import memory_skipped, over_memory_limit
from autograd_run.cli.view_cmd import require_viewer, show_trace
from autograd_run.errors import UsageError
from autograd_run.sim.placement import PLACEMENTS
from autograd_run.sim.session import SLACK_AUTO_NODES, SLACK_TOP
from autograd_run.sim.policies import POLICIES


#: The memory budget of a graph that is simulated, not run: none (only its file's size bounds it).
NO_BUDGET = 1 << 62


#: The most values one --compare takes (each is a simulation of its own), as for its data-parallel keys.
MAX_COMPARED = 64


def _variants(compare: str | None, policy: str, devices: int | None) -> list[tuple[str, int | None]]:
    """``--compare policy=a,b`` / ``devices=1,2,4`` / a list of policies: the (policy, devices) pairs to run."""
    if not compare:
        return [(policy, devices)]
    from autograd_run.errors import UsageError
    key, sep, values = compare.partition("=")
    if not sep:
        key, values = "policy", compare
    items = [v.strip() for v in values.split(",") if v.strip()]
    if key in ("policy", "devices") and not items:
        raise UsageError(f"--compare {key}=: give the values to compare, e.g. "
                         + ("policy=pytorch,fifo" if key == "policy" else "devices=1,2,4"))
    if len(items) > MAX_COMPARED:  # (each value is a whole simulation: bounded before any starts)
        raise UsageError(f"--compare {key}: at most {MAX_COMPARED} values, got {len(items)}")
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
@click.option("--devices", type=Whole(1, 1024), default=None, metavar="K",
              help="Remap the graph onto K accelerator devices (with --placement).")
@click.option("--placement", type=click.Choice(PLACEMENTS), default=None,
              help="How nodes are placed on --devices  [default: keep, or greedy with --devices]")
@click.option("--policy", type=click.Choice(POLICIES), default="pytorch", show_default=True,
              help="Scheduling policy.")
@click.option("--scale", default=None, metavar="NAME=F,...",
              help="Scale the costs of an op name or a device, e.g. MmBackward0=0.5,cuda:1=2.0.")
@click.option("--costs", default=None, metavar="FILE|analytic",
              help="Measured node costs: a PyTorch profiler trace (torch.profiler's export_chrome_trace, "
                   ".json or gzipped) or a folder of them (a distributed profile: every rank's calls pooled), "
                   "a trace of `run --trace` or `simulate --trace` (Chrome or Kineto), or a graph captured with "
                   "--profile; "
                   "`analytic` ignores the graph's own measured costs. Default: the graph's own, if any.")
@click.option("--step", type=Whole(1), default=None, metavar="N",
              help="With a PyTorch profile: the costs of its N-th backward call of this graph, not the median.")
@click.option("--compare", default=None, metavar="policy=A,B|devices=K,K|bucket_cap_mb=A,B|prefetch=N,N|world=N,N",
              help="Simulate several policies or device counts and print one table; with --ddp, several "
                   "bucket sizes (MiB) or world sizes; with --fsdp, several prefetch depths or world sizes.")
@click.option("--trace", "trace_path", default=None, metavar="FILE|DIR/",
              help="Write the simulated trace (.json, .json.gz, .pftrace or .kineto.json, as run --trace). With "
                   "--ddp/--fsdp, a folder (a path ending in / or an existing folder) gets one Kineto trace per "
                   "rank, as a distributed profile (Holistic Trace Analysis reads the folder as one job).")
@click.option("--trace-format", type=click.Choice(["auto", "json", "json.gz", "pftrace", "kineto"]), default="auto",
              show_default=True, help="The trace's format: from the path's ending, or this one (kineto: the "
              "JSON torch.profiler writes, for Holistic Trace Analysis).")
@click.option("--trace-ranks", type=Whole(1, 1024), default=None, metavar="N",
              help="A folder --trace with --ddp/--fsdp: the ranks written  [default: all, at most 8]")
@click.option("--open", "open_trace", is_flag=True,
              help="Then open the trace in the Perfetto UI served on 127.0.0.1 (needs --trace; see `view`).")
@click.option("--order-out", default=None, metavar="FILE",
              help="Write the predicted order (a golden for `run --expect-order`).")
@click.option("--slack", type=Whole(0, 100), default=None, metavar="N",
              help="What-if for the N slowest critical-path nodes made 20% faster (shown with the summary and in "
                   "--json; not computed with --no-summary alone). Each is another simulation of the whole "
                   f"graph  [default: {SLACK_TOP}; none above {SLACK_AUTO_NODES:,} nodes unless one CPU worker "
                   "runs them all (then they cost no simulation)]")
@click.option("--ddp", default=None, metavar="KEY=V,...",
              help="Data parallel: DDP's gradient buckets and their all-reduces against this rank's backward "
                   "(keys bucket_cap_mb, first_bucket_mb, find_unused_parameters, static_graph, "
                   "gradient_as_bucket_view, iteration=first|steady; "
                   "`defaults` for DDP's own; `captured[,KEY=V]` for the settings capture recorded). "
                   "Needs --world and --network.")
@click.option("--fsdp", default=None, metavar="captured|KEY=V,...",
              help="FSDP2: each fully_shard unit's all-gather and reduce-scatter against this rank's backward, "
                   "from the units capture recorded (keys prefetch=N, replicate=R for HSDP, "
                   "reshard_after_forward, blocking). Needs --world and --network.")
@click.option("--world", type=Whole(1, 1 << 20), default=None, metavar="N",
              help="--ddp or --fsdp: data-parallel ranks.")
@click.option("--network", default=None, metavar="alpha_us=A,gbps=B|local-gloo|FILE",
              help="--ddp: the link between ranks: latency per message (us), bandwidth per rank (GB/s) and "
                   "optionally channels=C (collectives in flight at once); or `local-gloo` (measured here by "
                   "`calibrate --gloo`), or a network file (docs/parallel.md).")
@click.option("--straggler", default=None, metavar="rank=R,slowdown=S",
              help="--ddp: one rank's backward S times slower (its costs scaled): every collective waits for it.")
@memory_option
@memory_limit_option
@memory_snapshot_option
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the summary tables.")
@click.option("--json", "json_out", is_flag=True, help="Print the result as JSON.")
@one_shot_work
def simulate(graph, spec, devices, placement, policy, scale, costs, step, compare, trace_path, trace_format,
             trace_ranks, open_trace, order_out,
             slack, ddp, fsdp, world, network, straggler, memory, memory_limit, memory_snapshot,
             summary, json_out):
    """Simulate GRAPH's backward pass on a virtual clock (no node runs).

    The simulation runs the engine's own scheduling code on simulated workers,
    queues and streams, with costs from the graph's cost nodes, measured
    costs (the graph's own from `capture --profile`, or --costs: a PyTorch
    profiler trace of the same program, matched node by node) or each op's
    FLOPs and bytes on the machine spec.

    \b
    Examples:
      autograd-run simulate example:mlp
      autograd-run simulate example:pipeline --trace sim.json --open
      autograd-run simulate model.json --spec a100 --devices 2 --placement layer
      autograd-run simulate model.json --compare policy=pytorch,fifo,single-thread
      autograd-run simulate model.json --compare devices=1,2,4 --json
      autograd-run simulate graph.json --order-out golden.jsonl   # then: run --expect-order
      autograd-run simulate model.json --costs trace.pt.json.gz --spec local-torch
      autograd-run simulate model.json --ddp bucket_cap_mb=25 --world 8 --network alpha_us=10,gbps=12
      autograd-run simulate fsdp.json --fsdp captured --world 64 --network nvlink-h100 --compare prefetch=0,1,2
      autograd-run simulate model.json --ddp defaults --world 8 --network nvlink-h100 --trace ranks/   # for HTA
      autograd-run simulate model.json --devices 2 --memory-snapshot mem.pickle   # pytorch.org/memory_viz
    """
    from autograd_run.cli.common import load_graph_arg
    from autograd_run.outputs import check_output_path
    from autograd_run.errors import RequestError
    from autograd_run.sim.session import read_costs
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.traces.order import write_order

    if open_trace:
        if not trace_path:
            raise UsageError("--open needs --trace FILE")
        require_viewer()
    if ddp is not None and fsdp is not None:
        raise UsageError("--ddp and --fsdp are two ways to run data parallel: give one")
    if compare and _ddp_compare(compare, fsdp is not None) is None:
        _compare_conflicts(compare, trace_path, order_out)
    if compare and memory_snapshot:
        raise UsageError("--memory-snapshot writes one simulation: with --compare, simulate the variant you want "
                         "written on its own")
    if fsdp is not None and straggler is not None:
        raise UsageError("--straggler goes with --ddp")
    ddp_args = _ddp_args(ddp if fsdp is None else fsdp, world, network, compare, straggler, fsdp=fsdp is not None)
    g = load_graph_arg(graph, max_bytes=NO_BUDGET, keep=True)  # a simulation materialises no tensor
    measured = read_costs(costs, g, step)  # read and matched once for every variant
    variants = _variants(None if ddp_args is not None else compare, policy, devices)
    from autograd_run.costs.measured import trace_files
    inputs = [*g.files(), *trace_files(costs), *(f for f in (spec, network) if f and os.path.isfile(f)),
              *_calibrations_read(spec, network)]  # never overwritten
    folder = _trace_folder(trace_path, trace_format, trace_ranks, ddp_args, compare, open_trace)
    for path, option in ((trace_path, "trace_path"), (order_out, "order_out")):
        if path and not (folder and option == "trace_path"):
            check_output_path(path, option, inputs)
    if folder and costs and os.path.isdir(costs) and os.path.isdir(trace_path) and os.path.samefile(costs,
                                                                                                     trace_path):
        raise RequestError(f"{trace_path}: is the --costs folder, an input of this run; the rank traces would "
                           "overwrite its profiles (and be read as costs next time): write them to another folder",
                           "trace_path")
    if folder and os.path.isdir(trace_path):  # a new folder is made when the traces are written
        for r in range(_ranks_written(ddp_args, trace_ranks)):
            check_output_path(os.path.join(trace_path, f"rank-{r}.kineto.json"), "trace_path", inputs)
    if trace_path and order_out and os.path.abspath(trace_path) == os.path.abspath(order_out):
        raise RequestError(f"{order_out}: the trace is written there already", "order_out")
    if memory_snapshot:
        from autograd_run.traces.memory_snapshot import check_path
        check_path(memory_snapshot, inputs, (trace_path, order_out))
    memory = want_memory(memory, g, memory_limit, memory_snapshot)
    reports, docs = [], []
    # The what-ifs re-simulate the graph: only when something shows them (the summary, or --json).
    slack_top = slack if len(variants) == 1 and (summary or json_out) else 0
    for pol, k in variants:
        opts = SimOptions(spec=spec, devices=k, placement=placement or ("greedy" if k else "keep"), policy=pol,
                          scale=scale, costs=measured or "analytic", slack_top=slack_top, detail=bool(trace_path),
                          memory_limit=memory_limit, memory_events=bool(memory_snapshot))
        left = _memory_left()
        report = simulate_session(g, opts)
        if len(variants) > 1:  # a comparison: each variant's figures taken, its simulation let go
            if json_out:
                docs.append(_report_json(report, memory))
            report.settle(memory)
            # A simulation's objects hold cycles, and the command runs with the collector off: they are
            # collected once the memory left would not hold two more simulations like this one.
            now = _memory_left()
            if left is None or now is None or now < 2 * (left - now):
                gc.collect()
        reports.append(report)
    first = reports[0]
    ddp_results = []
    if ddp_args is not None:
        ddp_results = (_run_fsdp if fsdp is not None else _run_ddp)(g, first, ddp_args, opts)
    ddp_result = ddp_results[0][1] if len(ddp_results) == 1 else None
    if ddp_result is not None and memory:  # DDP's buckets, FSDP's shards and gathers in the pass's memory
        first.add_memory(*ddp_result.memory_extras(first.graph))
    recording = first.recording if (trace_path or summary or json_out) and len(reports) == 1 else None
    if recording is not None and fsdp is not None and ddp_result is not None and ddp_result.stalls:
        import dataclasses
        # the trace: the backward simulated again with the compute's waits on communication in it
        recording = simulate_session(g, dataclasses.replace(opts, extra_ns=ddp_result.stalls, slack_top=0)).recording
    collectives, comm_end = [], None
    if recording is not None and ddp_result is not None:
        from autograd_run.sim.ddp import collective_kernels
        if fsdp is not None:
            from autograd_run.sim.fsdp import add_to_recording as add
        else:
            from autograd_run.sim.ddp import add_to_recording as add
        collectives, comm_end = collective_kernels(ddp_result, recording, add, g)
    streams = None
    if recording is not None:
        from autograd_run.analysis.streams import streams_of
        streams = streams_of(recording, collectives)
    for line in dict.fromkeys(w for r in reports for w in r.warnings):  # one line each, on stderr
        echo(line, err=True)  # (a profile's or a file's text in it: escaped)
    if trace_path:
        if collectives:
            recording.kernels.extend(collectives)
            recording.end = max(recording.end, comm_end)
        if memory:
            recording.counters.extend(first.memory.counters())  # each device's allocated bytes
        _write_sim_trace(trace_path, trace_format, recording, ddp_result, folder,
                         _ranks_written(ddp_args, trace_ranks) if folder else 1, first)
    if order_out:
        write_order(order_out, first.order)
    if memory_snapshot:  # (with --ddp or --fsdp: their buffers are in the memory, as in the summary's)
        from autograd_run.traces.memory_snapshot import write as write_snapshot
        write_snapshot(memory_snapshot, first.memory, g.source)
    if json_out:
        doc = docs if len(reports) > 1 else _report_json(first, memory)
        if len(reports) == 1:
            doc["streams"] = streams.to_dict() if streams is not None else None
        kind = "fsdp" if fsdp is not None else "ddp"
        if ddp_result is not None:
            doc[kind] = ddp_result.to_dict()
        elif ddp_results:
            key = ddp_args["versus"][0]
            doc[f"{kind}_compare"] = [{key: v, **r.to_dict()} for v, r in ddp_results]
        write(jsonout.dumps(doc))
        if open_trace:
            show_trace(trace_path, url_to_stderr=True)
        if len(reports) == 1 and memory:
            over_memory_limit(first.memory)
        return
    from autograd_run.cli.render import render_compare, render_costs, render_memory, render_slack, render_summary
    from autograd_run.cli.terminal import make_console, plain
    console = make_console()
    if measured is not None and summary:
        render_costs(console, measured, measured.event_us(first.spec.engine),
                     plain_us=first.spec.engine.profiler_event_us)
    if len(reports) > 1:
        render_compare(console, reports, f"{g.source}: simulated, {len(g.nodes)} nodes", memory=memory)
    elif summary:
        render_summary(console, first.summary, f"{g.source}: simulated on {first.label}, {len(first.graph.nodes)} nodes")
        render_slack(console, first)
        if streams is not None:
            from autograd_run.cli.render import render_streams
            render_streams(console, streams)
        if memory:
            render_memory(console, first.memory)
        else:
            console.print(plain(memory_skipped(g)))
        if ddp_result is not None:
            from autograd_run.cli.render import render_ddp, render_fsdp
            (render_fsdp if fsdp is not None else render_ddp)(console, ddp_result)
        elif ddp_results:
            from autograd_run.cli.render import render_ddp_compare, render_fsdp_compare
            (render_fsdp_compare if fsdp is not None else render_ddp_compare)(console, ddp_args["versus"][0],
                                                                              ddp_results)
    if summary:
        console.print(plain(confidence_line(first)))
        if first.first_pass_ns is not None and len(reports) == 1:
            console.print(plain(first_pass_line(first)))
    if trace_path and folder:
        console.print(plain(f"simulated Kineto traces of {_ranks_written(ddp_args, trace_ranks)} ranks written to "
                            f"{trace_path} (read the folder with Holistic Trace Analysis: docs/hta.md)"))
    elif trace_path and not open_trace:
        console.print(plain(f"simulated trace written to {trace_path} (open it with `autograd-run view`, or in "
                            "https://ui.perfetto.dev)"))
    if open_trace:
        show_trace(trace_path)
    if len(reports) == 1 and memory:
        over_memory_limit(first.memory)


def _calibrate_gloo(worlds_text: str, output: str | None) -> None:
    import json as _json
    from autograd_run.outputs import atomic_write
    from autograd_run.parallel.gloo_probe import measure
    from autograd_run.parallel.networks import local_gloo_path
    try:
        worlds = sorted({int(w) for w in worlds_text.split(",") if w.strip()})
    except ValueError:
        worlds = []
    if not worlds or any(not 2 <= w <= 16 for w in worlds):
        raise UsageError(f"--gloo: give world sizes from 2 to 16 (local processes), e.g. 2,4; got {worlds_text!r}")
    doc = measure(worlds, log=lambda m: click.echo(m, err=True))
    path = output or local_gloo_path()
    if output is None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, _json.dumps(doc, indent=2).encode(), "output" if output else None)
    for w, link in doc["links"].items():
        write(f"gloo, {w} processes: {link['alpha_us']:.0f} us per message, {link['gbps']:.2f} GB/s, "
              f"{link['channels']} in flight at once (two take {link['pair_over_one']:.1f}x one); the fit's "
              f"worst size is {link['fit_worst']:.0%} off; the repeats' fits {link['repeat_spread']:.0%} apart "
              f"at 1 MiB")
    echo(f"wrote {path}")


DDP_COMPARE = ("bucket_cap_mb", "world")
FSDP_COMPARE = ("prefetch", "world")


def _ddp_compare(compare: str | None, fsdp: bool = False) -> tuple[str, list] | None:
    """``--compare bucket_cap_mb=1,5,25`` / ``world=8,64,512`` (with --fsdp: ``prefetch=0,1,2`` /
    ``world=...``): (key, values), or None for another key."""
    if not compare or compare.partition("=")[0] not in (FSDP_COMPARE if fsdp else DDP_COMPARE):
        return None
    from autograd_run.cli.ddp_options import parse_ddp
    from autograd_run.parallel.collectives import MAX_WORLD
    key, _, text = compare.partition("=")
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--compare {key}=: give the values to compare, e.g. "
                         + ("bucket_cap_mb=1,5,25,100" if key == "bucket_cap_mb" else "world=8,64,512"))
    if len(items) > MAX_COMPARED:
        raise UsageError(f"--compare {key}: at most {MAX_COMPARED} values, got {len(items)}")
    if key == "world":
        from autograd_run.cli.ddp_options import whole_in
        worlds = [whole_in(v, 1, MAX_WORLD) for v in items]
        if None in worlds:
            raise UsageError(f"--compare world: world sizes are whole numbers from 1 to {MAX_WORLD}, got "
                             f"{items[worlds.index(None)][:40]!r}")
        return key, worlds
    if key == "prefetch":
        from autograd_run.cli.ddp_options import parse_fsdp
        return key, [parse_fsdp(f"prefetch={v}")["prefetch"] for v in items]
    return key, [parse_ddp(f"bucket_cap_mb={v}", "--compare")["bucket_cap_mb"] for v in items]


def _ddp_args(ddp, world, network, compare, straggler=None, fsdp: bool = False) -> dict | None:
    """``simulate_ddp``'s (or with ``fsdp``, ``simulate_fsdp``'s: ``ddp`` is then the --fsdp text) arguments from
    --ddp, --world, --network and --straggler (usage errors for a partial set); ``network`` stays a
    ``parallel.networks.Network`` (the link depends on the world size)."""
    opt = "--fsdp" if fsdp else "--ddp"
    if ddp is None:
        for value, name in ((world, "--world"), (network, "--network"), (straggler, "--straggler")):
            if value is not None:
                raise UsageError(f"{name} goes with --ddp" + (" or --fsdp" if name != "--straggler" else ""))
        return None
    versus = _ddp_compare(compare, fsdp)
    if compare and versus is None:
        key = compare.partition("=")[0] if "=" in compare else "policy"
        settings = ("(--compare prefetch=... or world=... compare FSDP settings)" if fsdp else
                    "(--compare bucket_cap_mb=... or world=... compare DDP settings)")
        if key in ("policy", "devices"):
            raise UsageError(f"{opt} goes with one simulation, not with --compare policy/devices {settings}")
        raise UsageError(f"--compare {key[:60]}=... is not a setting of {opt} {settings}")
    if versus and versus[0] == "world":
        if world is not None:
            raise UsageError("--world and --compare world=...: give the world sizes in --compare only")
        worlds = versus[1]
    elif world is None:
        raise UsageError(f"{opt} needs --world N (the data-parallel ranks)")
    else:
        worlds = [world]
    from autograd_run.cli.ddp_options import parse_ddp, parse_fsdp, parse_network, parse_straggler
    options = parse_fsdp(ddp) if fsdp else parse_ddp(ddp)
    if versus and versus[0] == "prefetch" and "prefetch" in options:
        raise UsageError("--fsdp prefetch=... and --compare prefetch=...: give the values in --compare only")
    if versus and versus[0] == "bucket_cap_mb" and "bucket_cap_mb" in options:
        raise UsageError("--ddp bucket_cap_mb=... and --compare bucket_cap_mb=...: give the sizes in --compare only")
    if network is None and max(worlds) > 1:
        raise UsageError(f"{opt} needs --network alpha_us=A,gbps=B (the link between ranks)")
    from autograd_run.parallel.networks import Network
    from autograd_run.parallel.collectives import Link
    net = parse_network(network) if network else Network("none", {0: Link(0.0, 1.0, "none")})
    lag = parse_straggler(straggler, max(worlds)) if straggler else None
    return {"world": worlds[0], "network": net, "options": options, "versus": versus, "straggler": lag}


def _run_ddp(graph, first, args: dict, opts) -> list:
    """The DDP results: one, or one per --compare value, with the straggler's backward simulated once."""
    import dataclasses
    from autograd_run.sim.costs import parse_scale
    from autograd_run.sim.ddp import simulate_ddp
    from autograd_run.sim.session import simulate_session
    slow = None
    if args["straggler"] is not None:
        rank, factor = args["straggler"]
        base = opts.scale if isinstance(opts.scale, dict) else parse_scale(opts.scale)
        devices = {str(n.device) for n in first.graph.nodes}
        scale = {**base, **{d: base.get(d, 1.0) * factor for d in devices}}
        slow_report = simulate_session(graph, dataclasses.replace(opts, scale=scale, slack_top=0,
                                                                  scale_must_apply=False))
        slow = (rank, factor, slow_report)
    from autograd_run.cli.ddp_options import captured_ddp
    base_options = captured_ddp(graph, args["options"])
    versus = args["versus"]
    values = versus[1] if versus else [None]
    out = []
    for v in values:
        world = v if versus and versus[0] == "world" else args["world"]
        kw = dict(base_options)
        if versus and versus[0] == "bucket_cap_mb":
            kw.pop("bucket_cap_mb_list", None)  # one cap replaces a captured model's per-bucket limits
            kw["bucket_cap_mb"] = v
        link, note = args["network"].link_for(world)
        if note:
            echo(f"note: {note}", err=True)  # (a network file names the link: escaped)
        if slow is not None and slow[0] >= world:
            raise UsageError(f"--straggler: rank {slow[0]} is not below the world size {world}")
        result = simulate_ddp(first, world, link, straggler=slow, **kw)
        if not versus and world > 1:  # the collectives' slack (cheap: the backward is not simulated again)
            from autograd_run.sim.ddp import collective_slack
            result.slack = collective_slack(first, world, link, result, kw, opts.slack_speedup, slow)
        out.append((v, result))
    return out


def _run_fsdp(graph, first, args: dict, opts) -> list:
    """The FSDP results: one, or one per --compare value (prefetch or world)."""
    from autograd_run.sim.fsdp import simulate_fsdp
    versus = args["versus"]
    out = []
    for v in (versus[1] if versus else [None]):
        world = v if versus and versus[0] == "world" else args["world"]
        kw = dict(args["options"])
        if versus and versus[0] == "prefetch":
            kw["prefetch"] = v
        link, note = args["network"].link_for(world)
        if note:
            echo(f"note: {note}", err=True)  # (a network file names the link: escaped)
        if world % kw.get("replicate", 1):
            raise UsageError(f"--fsdp replicate={kw['replicate']} does not divide the world size {world}")
        result = simulate_fsdp(first, world, link, **kw)
        if not versus and world > 1:  # the collectives' slack (the backward is not simulated again)
            from autograd_run.sim.fsdp import fsdp_slack
            result.slack = fsdp_slack(first, world, link, result, kw, opts.slack_speedup)
        out.append((v, result))
    return out


def _calibrations_read(spec: str | None, network: str | None) -> list[str]:
    """The calibrations in the user cache folder a simulation reads (``--spec local``/``local-torch``, the default
    spec, ``--network local-gloo``): inputs too, which no output may overwrite (a trace written over
    ``local-spec.json`` left every later simulation without its default spec)."""
    from autograd_run.parallel.networks import LOCAL_GLOO, local_gloo_path
    from autograd_run.sim.specs import LOCAL, local_spec_path
    out = [local_spec_path(spec)] if spec in LOCAL else [local_spec_path(n) for n in LOCAL] if spec is None else []
    if network is not None and network.strip() == LOCAL_GLOO:
        out.append(local_gloo_path())
    return out


def _compare_conflicts(compare: str, trace_path, order_out) -> None:
    """Options that --compare would silently override or apply to one variant only: usage errors."""
    from click.core import ParameterSource
    from autograd_run.errors import UsageError
    ctx = click.get_current_context()
    given = {name for name in ("policy", "devices", "slack")
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}
    key = compare.partition("=")[0] if "=" in compare else "policy"
    if key in given:
        raise UsageError(f"--{key} and --compare {key}=...: give the {key} values in --compare only")
    if "slack" in given:
        raise UsageError("--slack goes with one simulation, not with --compare")
    if trace_path or order_out:
        raise UsageError(f"{'--trace' if trace_path else '--order-out'} writes one simulation: with --compare, "
                         "simulate the variant you want written on its own")


def confidence_line(r) -> str:
    """The spec a simulation used and why, and how far off it may be (``sim.confidence``)."""
    e = r.expected_error
    sure = (f"expected error +-{e['relative']:.0%}" if e.get("relative") is not None else "expected error unknown")
    return f"spec {r.spec.name}: {r.spec_reason}; {sure} ({e.get('basis', '')})"


def first_pass_line(r) -> str:
    """What a fresh process's first pass would take (``sim.first_pass``)."""
    from autograd_run.cli.render import fmt_ns
    rel = r.first_pass_error.get("relative")
    sure = f", expected error +-{rel:.0%}" if rel is not None else ""
    return (f"a fresh process's first pass: {fmt_ns(r.wall_ns + r.first_pass_ns)} ({fmt_ns(r.first_pass_ns)} more: "
            f"its code paths run cold once, as calibrate measured in fresh processes{sure})")


def _trace_folder(trace_path, trace_format, trace_ranks, ddp_args, compare, open_trace) -> bool:
    """Whether ``--trace`` names a folder for one Kineto trace per rank (a path ending in a separator, or an
    existing folder); refuses the options that do not go with it, before any work."""
    from autograd_run.errors import RequestError
    folder = bool(trace_path) and (trace_path.endswith(("/", os.sep)) or os.path.isdir(trace_path))
    if not folder:
        if trace_ranks is not None:
            raise UsageError("--trace-ranks goes with a folder --trace DIR/ and --ddp or --fsdp")
        return False
    if ddp_args is None:
        raise UsageError(f"--trace {trace_path}: a folder gets one trace per rank: it goes with --ddp or --fsdp "
                         "(a single trace is a file: --trace FILE)")
    if trace_format not in ("auto", "kineto"):
        raise UsageError(f"--trace {trace_path}: a folder of rank traces is Kineto JSON, not --trace-format "
                         f"{trace_format}")
    if compare:
        raise UsageError(f"--trace {trace_path}: one set of rank traces is one simulation: not with --compare")
    if open_trace:
        raise UsageError("--open shows one trace file, not a folder of rank traces")
    folder_path = os.path.abspath(trace_path.rstrip("/" + os.sep) or os.sep)
    if os.path.exists(folder_path) and not os.path.isdir(folder_path):
        raise RequestError(f"{trace_path}: not a folder (a file is there)", "trace_path")
    parent = os.path.dirname(folder_path)
    if not os.path.isdir(parent):
        raise RequestError(f"{trace_path}: no such directory: {parent}", "trace_path")
    if not os.access(folder_path if os.path.isdir(folder_path) else parent, os.W_OK):
        raise RequestError(f"{trace_path}: the directory is not writable", "trace_path")
    return True


def _ranks_written(ddp_args, trace_ranks) -> int:
    """The ranks a folder ``--trace`` gets: ``--trace-ranks``, else every rank up to 8, never beyond the world."""
    world = ddp_args["world"]
    return min(world, trace_ranks if trace_ranks is not None else 8)


def _write_sim_trace(path: str, fmt: str, rec, ddp_result, folder: bool, ranks: int, report) -> None:
    """The simulated trace: one file in its format, or (``folder``) one Kineto trace per rank, rank files
    ``rank-R.kineto.json`` (ranks are symmetric in the model: each shows the same timeline as its rank)."""
    from autograd_run.traces.kineto import write_kineto_trace
    from autograd_run.traces.trace_file import format_of, write_trace
    world = ddp_result.world if ddp_result is not None else 1
    device = report.spec.accelerator.name if getattr(report.spec, "accelerator", None) else None
    eng = report.spec.engine  # what each node's span holds beyond its own cost (simulate --costs takes it out)
    meta = {"spec": report.spec.name,
            "engine_ns": {"node": int(eng.node_overhead_us * 1e3),
                          "device_node": int((eng.device_overhead_us or eng.node_overhead_us) * 1e3)}}
    if folder:
        os.makedirs(path, exist_ok=True)
        for r in range(ranks):
            rank_path = os.path.join(path, f"rank-{r}.kineto.json")
            write_kineto_trace(rank_path, rec, rank=r, world=world, device_name=device, meta=meta)
            if r == 0 and ranks > 1:
                _check_room_for_ranks(path, os.path.getsize(rank_path), ranks - 1)
    elif format_of(path, fmt).name == "kineto":
        write_kineto_trace(path, rec, world=world, device_name=device, meta=meta)
    else:
        warning = write_trace(path, rec, fmt=fmt)
        if warning:
            click.echo(warning, err=True)


def _memory_left() -> int | None:
    from autograd_run.graphs.validate import memory_available
    return memory_available()


def _check_room_for_ranks(folder: str, rank_bytes: int, more: int) -> None:
    """After the first rank's trace: the other ranks' (each about its size) must fit on the folder's disk, with
    a tenth to spare, or none of them is written."""
    import shutil
    from autograd_run.errors import RequestError
    from autograd_run.graphs.validate import format_bytes
    need = rank_bytes * more
    free = shutil.disk_usage(folder).free
    if need + need // 10 > free:
        raise RequestError(f"{folder}: {more} more rank traces of about {format_bytes(rank_bytes)} each take "
                           f"{format_bytes(need)}, and the disk has {format_bytes(free)} free (fewer with "
                           f"--trace-ranks N)", "trace_path")


def _report_json(r, memory: bool = True) -> dict:
    from autograd_run.cli.render import samples_json
    return {"spec": r.spec.name, "spec_reason": r.spec_reason, "expected_error": r.expected_error,
            "warnings": r.warnings, "policy": r.options.policy, "devices": r.options.devices,
            "placement": r.options.placement, "wall_ns": r.wall_ns, "engine_done_ns": r.engine_done_ns,
            "first_pass_wall_ns": None if r.first_pass_ns is None else r.wall_ns + r.first_pass_ns,
            "first_pass_expected_error": r.first_pass_error or None,
            "first_call_taken_ns": r.first_call_taken_ns,
            "cost_sources": r.cost_sources, "measured": _measured_json(r.measured, r.measured.event_us(r.spec.engine) if r.measured else 0.0,
                                       r.spec.engine.profiler_event_us), "summary": r.summary.to_dict(),
            "samples": samples_json(r.recording), "memory": r.memory.to_dict() if memory else None,
            "slack": [s.__dict__ for s in r.slack],
            "slack_skipped": None if r.slack_skipped is None else {"count": r.slack_skipped[0],
                                                                   "simulation_s": round(r.slack_skipped[1], 3)}}


def _measured_json(m, event_us: float = 0.0, plain_us: float | None = None) -> dict | None:
    if m is None:
        return None
    cov = m.coverage
    out = {"origin": m.origin, "path": m.path, "nodes": len(m.nodes), "steps": m.steps, "step": m.step,
           "info": m.info, "coverage": cov.to_dict() if hasattr(cov, "to_dict") else cov}
    if m.use is not None:
        u = m.use
        out["use"] = {"used": u.used, "calls": u.calls, "left_out": u.left_out, "outside_ops": u.outside_ops,
                      "outside_runs": u.outside_runs, "events_per_call": u.events, "first_call": u.first_call,
                      "event_us_seen": u.event_us_seen, "shapes": u.shapes, "later": u.later,
                      "event_us": event_us,
                      "line": u.line(event_us, plain_us)}
    return out


@click.command()
@click.option("-o", "--output", default=None, metavar="FILE",
              help="Where to write the spec  [default: the user cache folder, used as --spec local / local-torch]")
@click.option("--nodes", type=Whole(200, 1_000_000), default=4000, show_default=True, metavar="N",
              help="Chain length of the engine measurements.")
@click.option("--torch", "torch_engine", is_flag=True,
              help="Measure PyTorch's engine instead (per-node and per-call overhead outside the profiled nodes, "
                   "the profiler's own cost per event, this CPU through torch ops): the `local-torch` spec, for "
                   "simulations with costs from PyTorch profiles.")
@click.option("--gloo", "gloo_worlds", default=None, metavar="N,N,...", is_flag=False, flag_value="2,4",
              help="Measure the local gloo backend's all-reduce on N local processes (default 2,4): the "
                   "`local-gloo` network of `simulate --ddp --network local-gloo`.")
def calibrate(output, nodes, torch_engine, gloo_worlds):
    """Measure this machine (engine cost per node, hand-off latency, FLOP/s, bandwidth) for `simulate --spec local`.

    With --torch, PyTorch's own engine and ops on this CPU, for `--spec local-torch`
    (the default spec when the costs come from a PyTorch profile).

    \b
    Example:
      autograd-run calibrate && autograd-run simulate example:pipeline --spec local
      autograd-run calibrate --torch && autograd-run simulate model.json --costs profile.json
    """
    from autograd_run.outputs import check_output_path
    from autograd_run.sim.calibrate import cache_folder_ready, write_local
    # a bad path (or a cache folder that cannot be written) is told before the measurement, not after it
    if output:
        check_output_path(output, "output", [])
    else:
        from autograd_run.parallel.networks import local_gloo_path
        from autograd_run.sim.specs import local_spec_path
        cache_folder_ready(local_gloo_path() if gloo_worlds is not None else
                           local_spec_path("local-torch" if torch_engine else "local"))
    if gloo_worlds is not None:
        if torch_engine:
            raise UsageError("--gloo and --torch are separate measurements: give one")
        _calibrate_gloo(gloo_worlds, output)
        return
    if torch_engine:
        from autograd_run.capture.first_call_probe import measure as first_call
        from autograd_run.sim.calibrate_torch import calibrate_torch
        from autograd_run.sim.specs import local_spec_path
        spec = calibrate_torch(log=lambda m: click.echo(m, err=True), first_call=first_call)
        path = write_local(spec, output or local_spec_path("local-torch"))
        e, h = spec.engine, spec.host
        click.echo(f"PyTorch engine: {e.node_overhead_us:.2f} us per node outside its evaluate_function span, "
                   f"{e.call_overhead_us:.1f} us per backward call")
        click.echo(f"PyTorch profiler: {e.profiler_event_us:.2f} us per recorded event inside a span "
                   f"({e.profiler_event_shapes_us:.2f} us with record_shapes, "
                   f"{e.profiler_event_shapes_later_us:.2f} in a session's later calls)")
        st = e.first_call_setup_us or {}
        click.echo(f"a process's first backward: {e.first_call_ns_per_byte:.3f} ns per byte of new memory, "
                   f"{st.get('call', 0):.0f} us at its first node, the first node of an op "
                   f"{st.get('op', {}).get('*', 0):.0f} us (median; a convolution "
                   f"{st.get('op', {}).get('ConvolutionBackward0', 0):.0f}), a later first of its kind "
                   f"{st.get('kind', {}).get('*', 0):.1f} us (a convolution "
                   f"{st.get('kind', {}).get('ConvolutionBackward0', 0):.0f})")
        click.echo(f"host (torch): float32 {h.peak_flops['float32'] / 1e9:.1f} GFLOP/s, float64 "
                   f"{h.peak_flops['float64'] / 1e9:.1f} GFLOP/s, {h.mem_bw / 1e9:.1f} GB/s, smallest node "
                   f"{h.min_kernel_us:.2f} us")
        echo(f"wrote {path}")
        return
    from autograd_run.sim.calibrate import calibrate as measure
    spec = measure(nodes=nodes, log=lambda m: click.echo(m, err=True))
    path = write_local(spec, output)
    e, h = spec.engine, spec.host

    def apart(key: str) -> str:
        return f" (rounds within {e.spread[key]:.0%})" if key in e.spread else ""
    write(f"engine: {e.node_overhead_us:.2f} us per node{apart('node_overhead_us')} ({e.device_overhead_us:.2f} on a "
          f"device's thread{apart('device_overhead_us')}; a cost node {e.cost_node_us:.2f} more"
          f"{apart('cost_node_us')}), hand-off {e.handoff_us:.1f} us{apart('handoff_us')} "
          f"({e.device_handoff_us or e.handoff_us:.1f} between two devices{apart('device_handoff_us')}), a GIL-free wait that "
          f"sleeps ends {e.wait_overhead_us:.1f} us late{apart('wait_overhead_us')} (holds the GIL), "
          f"{e.call_overhead_us:.1f} us per backward call{apart('call_overhead_us')}, the GIL taken over in "
          f"{e.gil_handoff_us or e.handoff_us:.1f} us{apart('gil_handoff_us')}")
    if e.first_pass_us or e.first_pass_device_us:
        write(f"a fresh process's first pass: {e.first_pass_us:.0f} us more than a later one on the CPU, "
              f"{e.first_pass_device_us:.0f} us with devices")
    write(f"host: {h.cores} cores, float32 {h.peak_flops['float32'] / 1e9:.1f} GFLOP/s, float64 "
          f"{h.peak_flops['float64'] / 1e9:.1f} GFLOP/s, {h.mem_bw / 1e9:.1f} GB/s, smallest call "
          f"{h.min_kernel_us:.2f} us")
    echo(f"wrote {path}")
