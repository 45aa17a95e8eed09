"""``autograd-run run`` (also the default command): parse options, run a session, render, exit."""

from __future__ import annotations

import json
import sys
import threading
import traceback

import click

from autograd_run.cli.common import error_line, escape
from autograd_run.cli.view_cmd import require_viewer, show_trace
from autograd_run.engine.tracer import Tracer
from autograd_run.errors import OrderMismatch, UsageError


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
        from rich.console import Console
        from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn
        self.bar = Bar(TextColumn("backward"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                       TimeElapsedColumn(), console=Console(stderr=True), transient=True)
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
@click.argument("graph")
@click.option("--trace", "trace_path", default=None, metavar="FILE",
              help="Write a trace here: Chrome JSON (.json; .json.gz compressed) or Perfetto protobuf "
                   "(.pftrace, about 4x smaller).")
@click.option("--open", "open_trace", is_flag=True,
              help="Then open the trace in the Perfetto UI served on 127.0.0.1 (needs --trace; see `view`).")
@click.option("--grad", "mode", flag_value="grad", default=None, help="Return gradients of --inputs (torch.autograd.grad).")
@click.option("--backward", "mode", flag_value="backward", help="Accumulate into variables (Tensor.backward).")
@click.option("--inputs", default=None, help="Comma-separated variable names or node ids.")
@click.option("--retain-graph", is_flag=True, help="Keep saved tensors (allows another pass).")
@click.option("--create-graph", is_flag=True, help="Run nodes in grad mode (sets retain_graph).")
@click.option("--no-multithreading", is_flag=True, help="Run every node on the calling thread.")
@click.option("--devices", type=click.Choice(["auto", "virtual", "cuda"]), default="auto", show_default=True,
              help="cuda:N devices: real GPUs (cupy), virtual (numpy on worker threads), or auto.")
@click.option("--anomaly", is_flag=True, help="Anomaly mode: fail on NaN gradients, show forward traces.")
@click.option("--inject-error", multiple=True, metavar="NODE", help="Make NODE raise when it runs.")
@click.option("--inject-nan", multiple=True, metavar="NODE", help="Make NODE return NaN gradients.")
@click.option("--repeat", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
              help="Run N backward passes (fresh state each); the summary shows their distribution.")
@click.option("--seed", type=click.IntRange(0, 2**62), default=None,
              help="Offset every random tensor's seed: another reproducible draw.")
@click.option("--allow-python", is_flag=True, help="Allow python nodes to import and run their callables.")
@click.option("--order-out", default=None, help="Write the executed order as JSON Lines.")
@click.option("--expect-order", default=None, help="Compare the executed order with a JSON Lines golden file "
              "(exact when deterministic, else per worker); exit 3 on a mismatch.")
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the summary tables.")
@click.option("--json", "json_out", is_flag=True, help="Print the summary and gradients as JSON on stdout.")
@click.option("--verbose", is_flag=True, help="Show a failing node's traceback.")
def run(graph, trace_path, open_trace, mode, inputs, retain_graph, create_graph, no_multithreading, devices, anomaly,
        inject_error, inject_nan, repeat, seed, allow_python, order_out, expect_order, summary, json_out, verbose):
    """Run a graph's backward pass (GRAPH is a file or example:NAME).

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run graph.yaml --trace out.json --open
      autograd-run example:mlp --no-multithreading --order-out golden.jsonl
      autograd-run example:mlp --no-multithreading --expect-order golden.jsonl
      autograd-run example:pipeline --repeat 20 --json
    """
    from autograd_run.cli.render import render_grads, render_summary, report_json
    from autograd_run.graphs.load import load_graph
    from autograd_run.session import RunOptions, run_session
    from autograd_run.traces.order import read_order

    if open_trace:
        if not trace_path:
            raise UsageError("--open needs --trace FILE")
        require_viewer()
    g = load_graph(graph)
    progress = Progress(repeat, len(g.nodes))
    options = RunOptions(
        mode=mode, inputs=inputs.split(",") if inputs is not None else None, retain_graph=retain_graph,
        create_graph=create_graph, multithreading=not no_multithreading, devices=devices, anomaly=anomaly,
        inject_error=inject_error, inject_nan=inject_nan, repeat=repeat, seed=seed, allow_python=allow_python,
        profile=summary or json_out or bool(trace_path), trace_path=trace_path, order_out=order_out,
        expected_order=read_order(expect_order) if expect_order else None, expected_order_path=expect_order,
        tracers=(progress,))
    if options.inputs is not None:
        options.inputs = [s for s in options.inputs if s]
    with progress:
        report = run_session(g, options)
    error = report.error
    if json_out:
        click.echo(json.dumps(report_json(report, graph)))
    elif summary:
        from rich.console import Console
        console = Console()
        dev_line = report.devices.describe() if any(not d.is_cpu for d in g.devices) else None
        render_summary(console, report.summary, f"{graph}: {len(g.nodes)} nodes", devices=dev_line)
        if report.result is not None:
            render_grads(console, report.result)
        if trace_path and not open_trace:
            console.print(f"trace written to {escape(trace_path)} (open it with `autograd-run view`, or in "
                          "https://ui.perfetto.dev)", markup=False, highlight=False, soft_wrap=True)
    if open_trace:
        show_trace(trace_path, url_to_stderr=json_out)
    if error is not None:
        where = f"node {error.node_id!r} ({error.node_name})" if error.node_id else "backward"
        if verbose and error.__cause__ is not None:
            traceback.print_exception(error.__cause__, file=sys.stderr)
        note = getattr(error, "anomaly_note", None)
        if note:
            click.echo(note, err=True)
        error_line(f"{where}: {error}")
        sys.exit(1)
    if report.divergence is not None:
        click.echo(report.divergence.describe(), err=True)
        raise OrderMismatch(f"executed order differs from {expect_order}")
    if expect_order and not json_out:
        click.echo(f"order matches {expect_order} ({len(report.order)} nodes"
                   + (", compared per worker)" if report.per_worker else ")"))
