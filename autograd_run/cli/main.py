"""``autograd-run``: commands ``run`` (the default), ``validate``, ``gen``, ``examples``.

Exit codes: 0 success; 1 the backward raised; 2 a usage or graph-file
error; 3 an order mismatch. Errors are printed as ``Error: ...`` on stderr,
never as a traceback (``--verbose`` shows a failing node's traceback).
"""

from __future__ import annotations

import os
import sys

import click

from autograd_run.errors import AutogradRunError, GraphFileError, OrderMismatch, UsageError


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


def _byte_size(ctx, param, value):
    if value is None:
        return None
    from autograd_run.graphs.validate import parse_byte_size
    try:
        return parse_byte_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--allow-python", is_flag=True,
              help="Accept python nodes (running them imports and calls code the file names).")
@click.option("--max-memory", default=None, metavar="SIZE", callback=_byte_size,
              help="Memory budget a graph may need (e.g. 8GiB); default 4 GiB or half the machine's memory.")
def validate(files, allow_python, max_memory):
    """Check graph files; print one line per valid file, `Error: ...` per problem.

    Checks everything `run` would refuse: syntax, schema, duplicate keys,
    edges and shapes, saved values against each op's declared kinds, side
    files, and the memory the graph needs to run.

    \b
    Example:
      autograd-run validate graph.yaml example:mlp
      autograd-run validate big.json --max-memory 16GiB
    """
    from autograd_run.graphs.load import load_graph
    failed = False
    for f in files:
        try:
            g = load_graph(f, max_bytes=max_memory, allow_python=allow_python, check_data=True)
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
    """List the graphs shipped with autograd-run (use them as `example:NAME`).

    \b
    Example:
      autograd-run examples
      autograd-run example:pipeline --trace pipeline.json
    """
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


from autograd_run.cli.run_cmd import run  # noqa: E402  (registers the run command below)

cli.add_command(run)


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
