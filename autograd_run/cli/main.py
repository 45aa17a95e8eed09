"""``autograd-run``: commands ``run`` (the default), ``validate``, ``gen``, ``examples``.

Exit codes: 0 success; 1 the backward raised; 2 a usage or graph-file
error; 3 an order mismatch. Errors are printed as ``Error: ...`` on stderr,
never as a traceback (``--verbose`` shows a failing node's traceback).
"""

from __future__ import annotations

import sys

import click

from autograd_run.cli.common import error_line, graph_format
from autograd_run.errors import AutogradRunError, GraphFileError, RequestError, UsageError

#: The command-line flag of each session request field, for error messages.
FLAGS = {"output": "-o", "inputs": "--inputs", "inject_error": "--inject-error", "inject_nan": "--inject-nan",
         "trace_path": "--trace", "order_out": "--order-out", "expected_order": "--expect-order",
         "devices": "--devices", "repeat": "--repeat", "spec": "--spec", "scale": "--scale", "costs": "--costs",
         "policy": "--policy", "placement": "--placement", "cache": "--cache", "scheduler": "--scheduler",
         "workers": "--workers", "out": "--out", "transfer": "--transfer", "batch": "--batch"}


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
            error_line(str(exc))
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
    from autograd_run.outputs import atomic_write, check_output_path
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
    fmt = graph_format(output)
    check_output_path(output, "output", [])
    doc = generate(kind, **kw)
    atomic_write(output, dumps(doc, fmt), "output")
    click.echo(f"{output}: {len(doc['nodes'])} nodes")


from autograd_run.cli.run_cmd import run  # noqa: E402  (registers the run command below)
from autograd_run.cli.sim_cmd import calibrate, simulate  # noqa: E402
from autograd_run.cli.capture_cmd import capture, check  # noqa: E402
from autograd_run.cli.sweep_cmd import sweep  # noqa: E402

cli.add_command(run)
cli.add_command(simulate)
cli.add_command(calibrate)
cli.add_command(capture)
cli.add_command(check)
cli.add_command(sweep)


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="autograd-run", standalone_mode=False)
    except click.exceptions.Abort:
        error_line("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RequestError as exc:
        flag = FLAGS.get(exc.option or "")
        error_line(f"{flag}: {exc}" if flag else str(exc))
        sys.exit(exc.exit_code)
    except AutogradRunError as exc:
        error_line(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
