"""``autograd-run capture`` and ``check``: a real PyTorch backward graph into a file, and a replay against it."""

from __future__ import annotations

import os

import click

from autograd_run.cli import capture_golden
from autograd_run.cli.common import escape, graph_format
from autograd_run.errors import OrderMismatch, UsageError


@click.command()
@click.argument("script")
@click.option("-o", "--output", default=None, help="Graph file to write (.json or .yaml); tensors go to a .npz beside it.")
@click.option("--order-out", default=None, help="Write PyTorch's executed order as a golden order (JSON Lines).")
@click.option("--expect-order", default=None, help="Compare PyTorch's executed order with a golden order "
              "(exit 3 with the first divergence).")
@click.option("--check", "check_replay", is_flag=True, help="Also replay the graph and compare order and gradients "
              "with PyTorch's (as `check`).")
def capture(script, output, order_out, expect_order, check_replay):
    """Capture a PyTorch backward graph: SCRIPT.py[:FUNC] (FUNC defaults to `main`).

    FUNC takes no arguments and returns the outputs (a tensor, e.g. a loss, or a
    list), or `(outputs, names)` with names a mapping of leaves (e.g.
    `dict(model.named_parameters())`), or a dict with keys `outputs`, `names`,
    `inputs` (tensors to take gradients for) and `grad_outputs`.

    Golden orders: `--order-out` writes PyTorch's own executed order (the
    order file of `run --order-out`, with each node's identity across
    processes: name and rank among the graph's nodes of that name counted
    from the loss, or the leaf's name; and the PyTorch version);
    `--expect-order` compares it with
    one (exit 3 with the first divergence and the ready set at that pop).

    \b
    Example:
      autograd-run capture model.py:main -o model.json
      autograd-run check model.json
      autograd-run capture model.py:main --order-out golden.jsonl
      autograd-run capture model.py:main --expect-order golden.jsonl --check
    """
    import runpy
    from autograd_run.capture import from_torch
    from autograd_run.outputs import check_output_path
    path, _, func = script.partition(":")
    func = func or "main"
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    if not (output or order_out or expect_order or check_replay):
        raise UsageError("give -o FILE, --order-out FILE, --expect-order FILE or --check")
    if output:
        graph_format(output)
        check_output_path(output, "output", [path])
    golden = capture_golden.prepare(path, output, order_out, expect_order)
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
    if order_out or expect_order or check_replay:
        return capture_golden.finish(outputs, kw, output, order_out, expect_order, check_replay, golden,
                                     _describe)
    try:
        doc = from_torch(outputs, path=output, **kw)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"capture failed: {exc}") from exc
    click.echo(escape(_describe(output, doc)))


def _describe(output: str, doc: dict) -> str:
    """The line a written capture is reported with."""
    opaque = sum(1 for n in doc["nodes"] if n.get("op") == "opaque")
    return (f"{output}: {len(doc['nodes'])} nodes, {len(doc['variables'])} leaves"
            + (f", {opaque} opaque (no rule)" if opaque else "")
            + f"; PyTorch reference: {len(doc['meta']['reference']['order'])} nodes run")


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
    if not report.ok:
        raise OrderMismatch(f"{graph}: replay differs from the PyTorch reference")
