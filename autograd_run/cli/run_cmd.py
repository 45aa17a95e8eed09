"""``autograd-run run`` (also the default command): run a graph, trace it, check its order."""

from __future__ import annotations

import json
import sys
import threading
import traceback

import click

from autograd_run.errors import BackwardError, OrderMismatch, UsageError


def _err(msg: str) -> None:
    click.echo(f"Error: {msg}", err=True)


def read_order_file(path: str) -> list[dict]:
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise UsageError(f"{path}: line {n}: not JSON: {exc}") from None
                if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                    raise UsageError(f"{path}: line {n}: each line needs an object with a string 'id'")
                rows.append(row)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return rows


class _Progress:
    """A progress bar on stderr for long work; silent when stderr is not a terminal."""

    def __init__(self, total_passes: int, nodes: int, rec):
        self.enabled = sys.stderr.isatty() and (total_passes > 1 or nodes >= 50_000)
        self.total, self.nodes, self.rec = total_passes, nodes, rec
        self.done = 0
        self._stop = threading.Event()

    def __enter__(self):
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        self.bar = Progress(TextColumn("backward"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self.bar.start()
        self.task = self.bar.add_task("run", total=1.0)
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.1):
            # ~4 events per node (push, pop, start, end): a cheap estimate within a pass.
            within = min(1.0, len(self.rec.events) / max(1, 4 * self.nodes * (self.done + 1)) * (self.done + 1)
                         - self.done) if self.rec is not None else 0.0
            self.bar.update(self.task, completed=(self.done + max(0.0, within)) / self.total)

    def step(self):
        self.done += 1

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self.thread.join()
            self.bar.stop()


@click.command()
@click.argument("graph")
@click.option("--trace", "trace_path", default=None, help="Write a Chrome/Perfetto trace here.")
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
def run(graph, trace_path, mode, inputs, retain_graph, create_graph, no_multithreading, devices, anomaly,
        inject_error, inject_nan, repeat, seed, allow_python, order_out, expect_order, summary, json_out, verbose):
    """Run a graph's backward pass (GRAPH is a file or example:NAME).

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run example:mlp --no-multithreading --order-out golden.jsonl
      autograd-run example:mlp --no-multithreading --expect-order golden.jsonl
      autograd-run example:pipeline --repeat 20 --json
    """
    from autograd_run.cli.render import _host, render_grads, render_summary
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.traces.order import OrderRecorder, compare_orders
    from autograd_run.traces.recorder import Recorder
    from autograd_run.traces.summary import summarize

    g = load_graph(graph)
    if seed is not None:
        g.side_files.seed_offset = seed
    faults = {}
    for nid in inject_error:
        if nid not in g.by_id:
            raise UsageError(f"--inject-error: no node {nid!r} in {graph}")
        faults[nid] = "error"
    for nid in inject_nan:
        if nid not in g.by_id:
            raise UsageError(f"--inject-nan: no node {nid!r} in {graph}")
        faults[nid] = "nan"
    expected = read_order_file(expect_order) if expect_order else None
    rec = Recorder()
    order = OrderRecorder(snapshots=expected is not None) if (order_out or expected is not None) else None
    tracer = rec if order is None else _Both(rec, order)
    devs = DeviceSet(devices)
    engine = Engine(devs, tracer=tracer, multithreading=not no_multithreading, allow_python=allow_python)
    names = [s for s in inputs.split(",") if s] if inputs else None
    error = result = None
    try:
        with _Progress(repeat, len(g.nodes), rec) as progress:
            for _ in range(repeat):
                state = GraphState(g)
                state.prepare()  # saved tensors exist before the timed backward, as after a forward
                result = run_graph(engine, g, state, mode=mode, inputs=names,
                                   retain_graph=retain_graph or None, create_graph=create_graph,
                                   anomaly=anomaly, faults=faults)
                progress.step()
    except BackwardError as exc:
        error = exc
    finally:
        engine.shutdown(timeout=5)
    if trace_path:
        from autograd_run.traces.chrome import write_chrome_trace
        try:
            write_chrome_trace(trace_path, rec.events, rec.threads, rec.os_tids)
        except OSError as exc:
            raise UsageError(f"--trace {trace_path}: {exc.strerror or exc}") from None
    rows = order.rows() if order is not None else None
    if order_out:
        try:
            with open(order_out, "w") as f:
                for row in rows:
                    row = {k: v for k, v in row.items() if k != "ready"}
                    f.write(json.dumps(row) + "\n")
        except OSError as exc:
            raise UsageError(f"--order-out {order_out}: {exc.strerror or exc}") from None
    s = summarize(rec.events, rec.threads)
    if json_out:
        doc = {"graph": graph, "devices": devs.kind, "error": None if error is None else
               {"node": error.node_id, "name": error.node_name, "message": str(error)},
               "summary": s.to_dict(),
               "grads": {} if result is None else {k: None if v is None else _host(v).tolist()
                                                    for k, v in result.grads.items()}}
        click.echo(json.dumps(doc))
    elif summary:
        from rich.console import Console
        console = Console()
        dev_line = devs.describe() if any(not d.is_cpu for d in g.devices) else None
        render_summary(console, s, f"{graph}: {len(g.nodes)} nodes", devices=dev_line)
        if result is not None:
            render_grads(console, result)
        if trace_path:
            console.print(f"trace written to {trace_path} (open it in https://ui.perfetto.dev)")
    if error is not None:
        where = f"node {error.node_id!r} ({error.node_name})" if error.node_id else "backward"
        if verbose and error.__cause__ is not None:
            traceback.print_exception(error.__cause__, file=sys.stderr)
        note = getattr(error, "anomaly_note", None)
        if note:
            click.echo(note, err=True)
        _err(f"{where}: {error}")
        sys.exit(1)
    if expected is not None:
        workers = {r["thread"] for r in rows}
        per_worker = not no_multithreading and len(workers) > 1
        if repeat > 1:  # a golden file describes one pass: compare the first
            rows = rows[: len(rows) // repeat]
        d = compare_orders(expected, rows, per_worker)
        if d is not None:
            click.echo(d.describe(), err=True)
            raise OrderMismatch(f"executed order differs from {expect_order}")
        if not json_out:
            click.echo(f"order matches {expect_order} ({len(rows)} nodes"
                       + (", compared per worker)" if per_worker else ")"))


class _Both:
    """Fan the engine's hooks out to the recorder and the order recorder."""

    enabled = True

    def __init__(self, rec, order):
        self.rec, self.order = rec, order

    def __getattr__(self, name):
        a, b = getattr(self.rec, name), getattr(self.order, name)

        def both(*args):
            a(*args)
            b(*args)
        setattr(self, name, both)
        return both
