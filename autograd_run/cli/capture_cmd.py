"""``autograd-run capture`` and ``check``: a real PyTorch backward graph into a file, and a replay against it."""

from __future__ import annotations

import os
import warnings

import click

from autograd_run.cli.common import graph_format
from autograd_run.errors import OrderMismatch, UsageError


@click.command()
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
    from autograd_run.outputs import check_output_path
    path, _, func = script.partition(":")
    func = func or "main"
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    graph_format(output)
    check_output_path(output, "output", [path])
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
        with warnings.catch_warnings():  # printed below from meta.hooks, once and plainly
            warnings.filterwarnings("ignore", message="tensor hooks are not part of the graph file")
            doc = from_torch(outputs, path=output, **kw)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"capture failed: {exc}") from exc
    hooks = doc.get("meta", {}).get("hooks")
    if hooks:
        from autograd_run.capture_hooks import warning_text
        click.echo(f"Warning: {warning_text(hooks)}", err=True)
    opaque = [n for n in doc["nodes"] if n.get("op") == "opaque"]
    nested = sum(1 for n in doc["nodes"] if n.get("op") == "checkpoint")
    click.echo(f"{output}: {len(doc['nodes'])} nodes, {len(doc['variables'])} leaves"
               + (f", {nested} checkpoint(s) with their nested graphs" if nested else "")
               + (f", {len(opaque)} opaque" if opaque else "")
               + f"; PyTorch reference: {len(doc['meta']['reference']['order'])} nodes run")
    for n in opaque[:5]:
        click.echo(f"  opaque {n['id']} {n['name']}: {n.get('attrs', {}).get('reason', '')}")
    if len(opaque) > 5:
        click.echo(f"  ... and {len(opaque) - 5} more opaque nodes")


@click.command()
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
        if report.note:
            console.print(report.note, markup=False, highlight=False)
    if not report.ok:
        raise OrderMismatch(f"{graph}: replay differs from the PyTorch reference")
