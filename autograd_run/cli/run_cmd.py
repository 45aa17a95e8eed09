"""``autograd-run run`` (also the default command): parse options, run a session, render, exit."""

from __future__ import annotations

import sys
import threading

import click

from autograd_run.cli import jsonout
from autograd_run.cli.common import (
    Seconds, Whole, echo, error_line, load_graph_arg, max_memory_option, memory_limit_option,
    memory_option, memory_snapshot_option, note_lines, want_memory, write,
)
from autograd_run.cli.view_cmd import require_viewer, show_trace
from autograd_run.cli.interrupts import ctrl_c_stops
from autograd_run.cli.terminal import make_console, plain, traceback_lines
from autograd_run.engine.tracer import Tracer
from autograd_run.errors import MemoryLimitExceeded, OrderMismatch, UsageError
from autograd_run.stopping import RunStop


class Progress(Tracer):
    """A progress bar on stderr (a tracer counting finished nodes); silent unless stderr is a terminal."""

    def __init__(self, total_passes: int, nodes: int):
        self.enabled = sys.stderr.isatty() and (total_passes > 1 or nodes >= 50_000)
        self.total = max(1, total_passes * nodes)
        self.done = 0
        self._stop = threading.Event()

    def node_end(self, gt, node) -> None:
        self.done += 1  # a racy increment under threads only makes the bar approximate

    def __enter__(self):
        if not self.enabled:
            return self
        from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn
        self.bar = Bar(TextColumn("backward"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                       TimeElapsedColumn(), console=make_console(stderr=True), transient=True)
        self.bar.start()
        self.task = self.bar.add_task("run", total=1.0)
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.1):
            self.bar.update(self.task, completed=min(1.0, self.done / self.total))

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self.thread.join()
            self.bar.stop()


@click.command()
@click.argument("graph", metavar="GRAPH")
@click.option("--trace", "trace_path", default=None, metavar="FILE",
              help="Write a trace here: Chrome JSON (.json; .json.gz compressed) or Perfetto protobuf "
                   "(.pftrace, about 4x smaller).")
@click.option("--trace-format", type=click.Choice(["auto", "json", "json.gz", "pftrace", "kineto"]), default="auto",
              show_default=True, help="The trace's format: from the path's ending, or this one (kineto: the "
              "JSON torch.profiler writes, for Holistic Trace Analysis; also chosen by a .kineto.json ending).")
@click.option("--open", "open_trace", is_flag=True,
              help="Then open the trace in the Perfetto UI served on 127.0.0.1 (needs --trace; see `view`).")
@click.option("--grad", "grad_mode", is_flag=True,
              help="Return gradients of --inputs (torch.autograd.grad)  [default: as the graph file says]")
@click.option("--backward", "backward_mode", is_flag=True, help="Accumulate into variables (Tensor.backward).")
@click.option("--inputs", default=None, metavar="ID,...", help="Comma-separated variable names or node ids.")
@click.option("--allow-unused", is_flag=True, help="--grad: an input the graph does not reach gets no gradient "
              "instead of PyTorch's error (allow_unused=True).")
@click.option("--retain-graph", is_flag=True, help="Keep saved tensors (allows another pass).")
@click.option("--create-graph", is_flag=True, help="Run nodes in grad mode (sets retain_graph).")
@click.option("--no-multithreading", is_flag=True, help="Run every node on the calling thread.")
@click.option("--backend", type=click.Choice(["auto", "virtual", "cuda"]), default=None,
              help="What runs cuda:N devices: real GPUs (cupy), virtual (numpy on worker threads), or auto (cupy "
                   "when it finds as many GPUs as the graph uses)  [default: auto]")
@click.option("--devices", "backend_old", type=click.Choice(["auto", "virtual", "cuda"]), default=None, hidden=True)
@click.option("--anomaly", is_flag=True, help="Anomaly mode: fail on NaN gradients, show forward traces.")
@click.option("--inject-error", multiple=True, metavar="NODE", help="Make NODE raise when it runs.")
@click.option("--inject-nan", multiple=True, metavar="NODE", help="Make NODE return NaN gradients.")
@click.option("--repeat", type=Whole(1, 1_000_000, "1 to 1000000"), default=1, show_default=True, metavar="N",
              help="Run N backward passes (fresh state each); the summary shows their distribution.")
@click.option("--seed", type=Whole(0, 2**62, "0 to 2**62"), default=None, metavar="N",
              help="Offset every random tensor's seed: another reproducible draw  [default: the file's seeds]")
@click.option("--allow-python", is_flag=True, help="Allow python nodes to import and run their callables.")
@max_memory_option
@memory_option
@memory_limit_option
@memory_snapshot_option
@click.option("--order-out", default=None, metavar="FILE", help="Write the executed order as JSON Lines.")
@click.option("--expect-order", default=None, metavar="FILE", help="Compare the executed order with a JSON Lines "
              "golden file (exact when deterministic, else per worker); exit 3 on a mismatch.")
@click.option("--costs", default=None, metavar="FILE",
              help="Measured costs (a PyTorch profiler trace, a trace of `run --trace`, or a graph captured with "
                   "--profile): each opaque node (no rule here) takes its measured time, so a replay spends what "
                   "PyTorch spent there.")
@click.option("--step", type=Whole(1), default=None, metavar="N",
              help="With a PyTorch profile: its N-th backward call of this graph, not the median.")
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the summary tables.")
@click.option("--json", "json_out", is_flag=True,
              help="Print the summary and gradients as JSON on stdout (NaN and infinities as strings).")
@click.option("--timeout", type=Seconds(), default=None, metavar="SECONDS",
              help="Stop the run after SECONDS (all passes): what ran is written, marked incomplete; exit 124.")
@click.option("--format", "fmt", type=click.Choice(["json", "yaml"]), default=None,
              help="The format of a graph read from stdin (GRAPH is -)  [default: from its first character]")
@click.option("--verbose", is_flag=True, help="Show a failing node's traceback.")
def run(graph, trace_path, trace_format, open_trace, grad_mode, backward_mode, inputs, allow_unused, retain_graph, create_graph,
        no_multithreading, backend, backend_old, anomaly, inject_error, inject_nan, repeat, seed, allow_python, max_memory,
        memory, memory_limit, memory_snapshot, order_out, expect_order, costs, step, summary, json_out, timeout, fmt,
        verbose):
    """Run a graph's backward pass (GRAPH is a file, example:NAME, or - for stdin).

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run graph.yaml --memory-snapshot mem.pickle   # open it in pytorch.org/memory_viz
      autograd-run graph.yaml --trace out.json --open
      autograd-run example:mlp --no-multithreading --order-out golden.jsonl
      autograd-run example:mlp --no-multithreading --expect-order golden.jsonl
      autograd-run example:pipeline --repeat 20 --json
      autograd-run lstm.json --costs lstm-profile.json   # opaque nodes take PyTorch's measured time
      cat graph.json | autograd-run -
    """
    from autograd_run.cli.render import render_grads, render_memory, render_summary, report_json
    from autograd_run.session import RunOptions, run_session
    from autograd_run.traces.order import read_order

    mode = run_mode(grad_mode, backward_mode)
    if open_trace:
        if not trace_path:
            raise UsageError("--open needs --trace FILE")
        require_viewer()
    if backend and backend_old and backend != backend_old:
        raise UsageError("--devices is the old spelling of --backend: give one of them")
    devices = backend or backend_old or "auto"
    g = load_graph_arg(graph, fmt, max_bytes=max_memory, allow_python=allow_python, keep=True)
    progress = Progress(repeat, len(g.nodes))
    options = RunOptions(
        mode=mode, inputs=inputs.split(",") if inputs is not None else None, allow_unused=allow_unused,
        retain_graph=retain_graph,
        create_graph=create_graph, multithreading=not no_multithreading, devices=devices, anomaly=anomaly,
        inject_error=inject_error, inject_nan=inject_nan, repeat=repeat, seed=seed, allow_python=allow_python,
        profile=summary or json_out or bool(trace_path) or memory_limit is not None or bool(memory_snapshot),
        samples=json_out,
        trace_path=trace_path, trace_format=trace_format, order_out=order_out,
        expected_order=read_order(expect_order) if expect_order else None, expected_order_path=expect_order,
        tracers=(progress,), costs=costs, costs_step=step, timeout=timeout, stop=RunStop(),
        memory_limit=memory_limit, memory_trace=want_memory(memory, g, memory_limit, memory_snapshot),
        memory_snapshot=memory_snapshot)
    if options.inputs is not None:
        options.inputs = [s.strip() for s in options.inputs if s.strip()]  # "a, b" as "a,b"
    try:
        with ctrl_c_stops(options.stop), progress:
            report = run_session(g, options)
    finally:
        options.stop.close()
    error = report.error
    if report.interrupted:
        _stopped(report, trace_path, order_out, repeat, timeout)
    if json_out:
        write(jsonout.dumps(report_json(report, g.source, options.memory_trace)))
    elif summary:
        console = make_console()
        dev_line = report.devices.describe() if g.max_device_index >= 0 else None
        if report.measured is not None:
            from autograd_run.cli.render import render_costs
            render_costs(console, report.measured)
            applied = len(report.measured_applied)
            console.print(plain(f"measured time taken by {applied} opaque node{'s' if applied != 1 else ''}"
                                + ("" if applied else " (nodes with a rule run their own formula)")))
        render_summary(console, report.summary, f"{g.source}: {len(g.nodes)} nodes", devices=dev_line)
        if options.memory_trace:
            render_memory(console, report.memory)
        else:
            console.print(plain(memory_skipped(g)))
        if report.result is not None:
            render_grads(console, report.result)
        if trace_path and not open_trace:
            console.print(plain(f"trace written to {trace_path} (open it with `autograd-run view`, or in "
                                "https://ui.perfetto.dev)"))
    elif options.inputs and report.result is not None:  # asked for by name: shown even without the summary
        from autograd_run.engine.run import RunResult
        wanted = RunResult(report.result.mode, {k: v for k, v in report.result.grads.items() if k in options.inputs})
        render_grads(make_console(), wanted)
    for line in report.warnings:
        click.echo(line, err=True)
    if open_trace:
        show_trace(trace_path, url_to_stderr=json_out)
    if error is not None:
        where = f"node {error.node_id!r} ({error.node_name})" if error.node_id else "backward"
        if verbose and error.__cause__ is not None:
            for line in traceback_lines(error.__cause__):
                click.echo(line, err=True)
        header = getattr(error, "anomaly_header", None)
        if header:
            echo(header, err=True)
            note_lines(error.anomaly_trace or "(no forward trace recorded in the graph file)")
        error_line(f"{where}: {error}")
        sys.exit(1)
    if report.divergence is not None:
        for line in report.divergence.lines():
            echo(line, err=True)
        raise OrderMismatch(f"executed order differs from {expect_order}")
    if expect_order and not json_out:
        echo(f"order matches {expect_order} ({len(report.order)} nodes"
             + (", compared per worker)" if report.per_worker else ")"))
    if options.memory_trace:
        over_memory_limit(report.memory)


def memory_skipped(g) -> str:
    return (f"memory: not modelled for a graph of {len(g.nodes):,} nodes by default (about 10 µs a node); "
            "--memory models it")


def over_memory_limit(memory) -> None:
    """``--memory-limit`` passed: the first node past it, exit 4 (the results were shown)."""
    if memory is None or memory.over_limit is None:
        return
    from autograd_run.sim.ddp import size_text
    o = memory.over_limit
    raise MemoryLimitExceeded(f"the pass would not fit in {size_text(o.limit)} on {o.device}: "
                              f"{size_text(o.bytes)} allocated while {o.name} {o.node} ran")


def run_mode(grad: bool, backward: bool) -> str | None:
    """``--grad`` / ``--backward`` as a run mode (None: as the graph file says); both is a usage error."""
    if grad and backward:
        raise UsageError("--grad and --backward: choose one")
    return "grad" if grad else "backward" if backward else None


def _stopped(report, trace_path, order_out, repeat, timeout) -> None:
    """A stopped run: one line on stderr (what stopped it, how far it got, what was written), then exit
    130 (Ctrl-C) or 124 (--timeout)."""
    written = [p for p in (trace_path, order_out) if p]
    where = f"in pass {report.passes_done + 1} of {repeat}" if repeat > 1 else "before the backward pass finished"
    what = "interrupted" if report.interrupted == "interrupted" else f"--timeout: stopped after {timeout:g} s"
    tail = f"; wrote {' and '.join(written)} (incomplete)" if written else ""
    error_line(f"{what} {where}{tail}")
    sys.exit(report.error.exit_code)
