"""``autograd-run``: commands ``run`` (the default), ``validate``, ``gen``, ``examples``.

Exit codes: 0 success; 1 the backward raised; 2 a usage or graph-file
error; 3 an order mismatch. Errors are printed as ``Error: ...`` on stderr,
never as a traceback (``--verbose`` shows a failing node's traceback).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import click

from autograd_run.errors import AutogradRunError, BackwardError, GraphFileError, OrderMismatch, UsageError


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a command, is a graph to ``run``."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="autograd-run")
def cli():
    """Replay and profile PyTorch-style backward graphs.

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run validate graph.json
      autograd-run gen mlp --layers 4 -o mlp.json
    """


def _err(msg: str) -> None:
    click.echo(f"Error: {msg}", err=True)


@cli.command()
@click.argument("files", nargs=-1, required=True)
def validate(files):
    """Check graph files; print one line per valid file, `Error: ...` per problem.

    \b
    Example:
      autograd-run validate graph.yaml example:mlp
    """
    from autograd_run.graphs.load import load_graph
    failed = False
    for f in files:
        try:
            g = load_graph(f)
        except GraphFileError as exc:
            _err(str(exc))
            failed = True
            continue
        devs = ", ".join(str(d) for d in g.devices)
        click.echo(f"{f}: {len(g.nodes)} nodes, {g.num_edges} edges, devices: {devs}, roots: {len(g.roots)}")
    if failed:
        sys.exit(2)


@cli.command()
def examples():
    """List the graphs shipped with autograd-run (use them as `example:NAME`)."""
    from importlib import resources
    from autograd_run.graphs.load import example_names
    folder = resources.files("autograd_run.graphs").joinpath("examples")
    for name in example_names():
        first = ""
        for ext in (".yaml", ".json"):
            f = folder.joinpath(name + ext)
            if f.is_file():
                for line in f.read_text().splitlines():
                    if line.startswith("#"):
                        first = line.lstrip("# ").strip()
                        break
        click.echo(f"example:{name:<12} {first}")


@cli.command()
@click.argument("kind", type=click.Choice(["chain", "fanout", "mlp", "transformer", "random"]))
@click.option("-o", "--output", required=True, help="Output file (.json, .yaml or .yml).")
@click.option("--n", "n", type=int, default=100, show_default=True, help="chain: number of ops.")
@click.option("--op", type=click.Choice(["mul", "add"]), default="mul", show_default=True, help="chain: op.")
@click.option("--width", type=int, default=None, help="fanout: branches; mlp: hidden width; random: tensor size.")
@click.option("--layers", type=int, default=2, show_default=True, help="mlp / transformer: layers.")
@click.option("--batch", type=int, default=8, show_default=True, help="mlp: batch size.")
@click.option("--in-features", type=int, default=None, help="mlp: input features (default: width).")
@click.option("--heads", type=int, default=4, show_default=True, help="transformer: attention heads.")
@click.option("--seq-len", type=int, default=16, show_default=True, help="transformer: sequence length.")
@click.option("--dim", type=int, default=32, show_default=True, help="transformer: model width.")
@click.option("--devices", type=int, default=0, show_default=True, help="transformer: spread over K cuda devices.")
@click.option("--nodes", type=int, default=200, show_default=True, help="random: number of op nodes.")
@click.option("--leaves", type=int, default=40, show_default=True, help="random: number of leaf variables.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (same seed, same file).")
def gen(kind, output, n, op, width, layers, batch, in_features, heads, seq_len, dim, devices, nodes, leaves, seed):
    """Generate a graph file.

    \b
    Examples:
      autograd-run gen chain --n 10000 -o chain.json
      autograd-run gen transformer --layers 4 --devices 2 -o tf.json
      autograd-run gen random --nodes 500 --leaves 100 --seed 7 -o dag.yaml
    """
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    for name, v in (("--n", n), ("--layers", layers), ("--batch", batch), ("--heads", heads),
                    ("--seq-len", seq_len), ("--dim", dim), ("--nodes", nodes)):
        if v < 1:
            raise UsageError(f"{name} must be at least 1")
    if devices < 0 or leaves < 1 or (width is not None and width < 1):
        raise UsageError("--devices must be >= 0, --leaves and --width >= 1")
    if kind == "transformer" and dim % heads:
        raise UsageError("--dim must be a multiple of --heads")
    kw = {"chain": dict(n=n, op=op, seed=seed),
          "fanout": dict(width=width or 8, seed=seed),
          "mlp": dict(layers=layers, width=width or 16, batch=batch, in_features=in_features, seed=seed),
          "transformer": dict(layers=layers, heads=heads, seq_len=seq_len, dim=dim, devices=devices, seed=seed),
          "random": dict(nodes=nodes, leaves=leaves, width=width or 4, seed=seed)}[kind]
    fmt = "yaml" if output.lower().endswith((".yaml", ".yml")) else "json"
    if not output.lower().endswith((".json", ".yaml", ".yml")):
        raise UsageError("-o must end in .json, .yaml or .yml")
    doc = generate(kind, **kw)
    with open(output, "wb") as f:
        f.write(dumps(doc, fmt))
    click.echo(f"{output}: {len(doc['nodes'])} nodes")


@cli.command()
@click.argument("graph")
@click.option("--trace", "trace_path", default=None, help="Write a Chrome/Perfetto trace here.")
@click.option("--grad", "mode", flag_value="grad", default=None, help="Return gradients of --inputs (torch.autograd.grad).")
@click.option("--backward", "mode", flag_value="backward", help="Accumulate into variables (Tensor.backward).")
@click.option("--inputs", default=None, help="Comma-separated variable names or node ids.")
@click.option("--retain-graph", is_flag=True, help="Keep saved tensors (allows another pass).")
@click.option("--create-graph", is_flag=True, help="Run nodes in grad mode (sets retain_graph).")
@click.option("--no-multithreading", is_flag=True, help="Run every node on the calling thread.")
@click.option("--devices", type=click.Choice(["auto", "virtual", "cuda"]), default="auto", show_default=True)
@click.option("--anomaly", is_flag=True, help="Anomaly mode: fail on NaN gradients, show forward traces.")
@click.option("--inject-error", multiple=True, metavar="NODE", help="Make NODE raise when it runs.")
@click.option("--inject-nan", multiple=True, metavar="NODE", help="Make NODE return NaN gradients.")
@click.option("--allow-python", is_flag=True, help="Allow python nodes to import and run their callables.")
@click.option("--order-out", default=None, help="Write the executed order as JSON Lines.")
@click.option("--summary/--no-summary", default=True, show_default=True, help="Print the summary tables.")
@click.option("--json", "json_out", is_flag=True, help="Print the summary and gradients as JSON on stdout.")
@click.option("--verbose", is_flag=True, help="Show a failing node's traceback.")
def run(graph, trace_path, mode, inputs, retain_graph, create_graph, no_multithreading, devices, anomaly,
        inject_error, inject_nan, allow_python, order_out, summary, json_out, verbose):
    """Run a graph's backward pass (GRAPH is a file or example:NAME).

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run example:pipeline --no-multithreading --order-out order.jsonl
    """
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.traces.recorder import Recorder
    from autograd_run.cli.render import _host, render_grads, render_summary

    g = load_graph(graph)
    faults = {}
    for nid in inject_error:
        if nid not in g.by_id:
            raise UsageError(f"--inject-error: no node {nid!r} in {graph}")
        faults[nid] = "error"
    for nid in inject_nan:
        if nid not in g.by_id:
            raise UsageError(f"--inject-nan: no node {nid!r} in {graph}")
        faults[nid] = "nan"
    rec = Recorder()
    devs = DeviceSet(devices)
    engine = Engine(devs, tracer=rec, multithreading=not no_multithreading, allow_python=allow_python)
    state = GraphState(g)
    names = [s for s in inputs.split(",") if s] if inputs else None
    t0 = time.perf_counter()
    error = None
    result = None
    try:
        result = run_graph(engine, g, state, mode=mode, inputs=names, retain_graph=retain_graph or None,
                           create_graph=create_graph, anomaly=anomaly, faults=faults)
    except BackwardError as exc:
        error = exc
    wall = time.perf_counter() - t0
    engine.shutdown(timeout=5)
    if trace_path:
        from autograd_run.traces.chrome import write_chrome_trace
        write_chrome_trace(trace_path, rec.events, rec.threads)
    if order_out:
        from autograd_run.cli.render import write_order
        write_order(order_out, rec)
    if json_out:
        from autograd_run.traces.summary import summarize
        doc = {"graph": graph, "devices": devs.kind, "error": None if error is None else
               {"node": error.node_id, "name": error.node_name, "message": str(error)},
               "summary": summarize(rec.events, rec.threads).to_dict(),
               "grads": {} if result is None else {k: None if v is None else _host(v).tolist()
                                                    for k, v in result.grads.items()}}
        click.echo(json.dumps(doc))
    elif summary:
        from rich.console import Console
        from autograd_run.traces.summary import summarize
        console = Console()
        title = f"{graph}: {len(g.nodes)} nodes"
        dev_line = devs.describe() if any(not d.is_cpu for d in g.devices) else None
        render_summary(console, summarize(rec.events, rec.threads), title, devices=dev_line)
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


@cli.command()
@click.argument("script")
@click.option("-o", "--output", required=True, help="Graph file to write (.json or .yaml); tensors go to a .npz beside it.")
def capture(script, output):
    """Capture a PyTorch backward graph: SCRIPT.py[:FUNC] (FUNC defaults to `main`).

    FUNC takes no arguments and returns the outputs (a tensor, e.g. a loss, or a
    list), or `(outputs, names)` with names a mapping of leaves (e.g.
    `dict(model.named_parameters())`), or a dict with keys `outputs`, `names`,
    `inputs` (tensors to take gradients for) and `grad_outputs`.

    \b
    Example:
      autograd-run capture model.py:main -o model.json
      autograd-run check model.json
    """
    import runpy
    from autograd_run.capture import from_torch
    path, _, func = script.partition(":")
    func = func or "main"
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    if not output.lower().endswith((".json", ".yaml", ".yml")):
        raise UsageError("-o must end in .json, .yaml or .yml")
    try:
        namespace = runpy.run_path(path, run_name="__autograd_run_capture__")
    except Exception as exc:
        raise UsageError(f"{path}: running the script failed: {type(exc).__name__}: {exc}") from exc
    fn = namespace.get(func)
    if not callable(fn):
        raise UsageError(f"{path}: no function {func!r}")
    result = fn()
    kw = {}
    if isinstance(result, dict):
        outputs = result.get("outputs")
        kw = {k: result[k] for k in ("names", "inputs", "grad_outputs") if k in result}
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        outputs, kw["names"] = result
    else:
        outputs = result
    try:
        doc = from_torch(outputs, path=output, **kw)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"capture failed: {exc}") from exc
    opaque = sum(1 for n in doc["nodes"] if n.get("op") == "opaque")
    click.echo(f"{output}: {len(doc['nodes'])} nodes, {len(doc['variables'])} leaves"
               + (f", {opaque} opaque (no rule)" if opaque else "")
               + f"; PyTorch reference: {len(doc['meta']['reference']['order'])} nodes run")


@cli.command()
@click.argument("graph")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default by dtype: 1e-6 for float64).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default by dtype).")
def check(graph, rtol, atol):
    """Replay a captured graph and compare order and gradients with PyTorch's reference.

    Exit 0 when they agree, 3 otherwise.

    \b
    Example:
      autograd-run check model.json --rtol 1e-5
    """
    from rich.console import Console
    from rich.table import Table
    from autograd_run.check import check_graph
    from autograd_run.graphs.load import load_graph
    report = check_graph(load_graph(graph), rtol, atol)
    console = Console()
    if report.order_ok:
        console.print(f"order: {report.order_len[1]} nodes, same as PyTorch")
    else:
        d = report.divergence
        console.print(f"order: differs at position {d['position']}: expected {d['expected']}, got {d['got']}")
    if not report.grads_compared:
        console.print(report.note)
    else:
        t = Table(title="gradients against PyTorch")
        for c in ("leaf", "max abs err", "max rel err", "ok"):
            t.add_column(c)
        for g in report.grads:
            t.add_row(g.name, "-" if g.max_abs is None else f"{g.max_abs:.3g}",
                      "-" if g.max_rel is None else f"{g.max_rel:.3g}", ("yes" if g.ok else "NO") + (f" ({g.note})" if g.note else ""))
        console.print(t)
    if not report.ok:
        raise OrderMismatch(f"{graph}: replay differs from the PyTorch reference")


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="autograd-run", standalone_mode=False)
    except click.exceptions.Abort:
        _err("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except AutogradRunError as exc:
        _err(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _err("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
