"""``autograd-run capture`` and ``check``: a real PyTorch backward graph into a file, and a replay against it."""

from __future__ import annotations

import os

import click

from autograd_run.cli.common import echo, graph_format
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
    namespace = _user_call(path, "running the script", lambda: runpy.run_path(path, run_name="__autograd_run_capture__"))
    fn = namespace.get(func)
    if not callable(fn):
        raise UsageError(f"{path}: no function {func!r}")
    result = _user_call(path, f"{func}()", fn)
    kw = {}
    if isinstance(result, dict):
        if "outputs" not in result:
            raise UsageError(f"{path}: {func}() returned a dict without 'outputs'")
        outputs = result.get("outputs")
        kw = {k: result[k] for k in ("names", "inputs", "grad_outputs") if k in result}
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        outputs, kw["names"] = result
    else:
        outputs = result
    try:
        doc = from_torch(outputs, path=output, **kw)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise UsageError(f"{path}: {func}() returned what cannot be captured: {exc}") from exc
    opaque = sum(1 for n in doc["nodes"] if n.get("op") == "opaque")
    echo(f"{output}: {len(doc['nodes'])} nodes, {len(doc['variables'])} leaves"
               + (f", {opaque} opaque (no rule)" if opaque else "")
               + f"; PyTorch reference: {len(doc['meta']['reference']['order'])} nodes run")


@click.command()
@click.argument("graph", metavar="FILE")
@click.option("--rtol", type=click.FloatRange(0), default=None,
              help="Relative tolerance  [default: by the lowest precision on the way to each leaf: 1e-6 for "
                   "float64, 1e-4 for float32, 1e-2 for float16]")
@click.option("--atol", type=click.FloatRange(0), default=None,
              help="Absolute tolerance  [default: by precision: 1e-9, 1e-6, 1e-3]")
@click.option("--allow-opaque", is_flag=True,
              help="Pass although ops without a rule (opaque nodes) keep some gradients from being compared.")
def check(graph, rtol, atol, allow_opaque):
    """Replay a captured graph and compare order and gradients with PyTorch's reference.

    Exit 0 when they agree, 3 otherwise (also when opaque nodes keep a gradient
    from being compared, unless --allow-opaque).

    \b
    Example:
      autograd-run check model.json --rtol 1e-5
    """
    from autograd_run.check import check_graph
    from autograd_run.cli.render import columns
    from autograd_run.cli.terminal import PlainTable as Table, make_console, plain
    from autograd_run.cli.common import load_graph_arg
    report = check_graph(load_graph_arg(graph), rtol, atol, allow_opaque=allow_opaque)
    console = make_console()
    if report.order_ok:
        console.print(plain(f"order: {report.order_len[1]} nodes, same as PyTorch"))
    else:
        d = report.divergence
        console.print(plain(f"order: differs at position {d['position']}: expected {d['expected']}, got {d['got']}"))
    if report.note:
        console.print(plain(report.note))
    if report.grads:
        t = columns(Table(title="gradients against PyTorch"), ("leaf", "id"), ("max abs err", "num"),
                    ("max rel err", "num"), ("tolerance (rtol, atol)", "text"), ("ok", "text"))
        for g in report.grads:
            tol = "-" if g.rtol is None else f"{g.rtol:g}, {g.atol:g}" + (f" ({g.precision})" if g.precision else "")
            ok = "-" if not g.compared else ("yes" if g.ok else "NO")
            t.add_row(g.name, "-" if g.max_abs is None else f"{g.max_abs:.3g}",
                      "-" if g.max_rel is None else f"{g.max_rel:.3g}", tol, ok + (f" ({g.note})" if g.note else ""))
        console.print(t)
    if not report.ok:
        why = ("opaque nodes keep gradients from being compared (--allow-opaque accepts that)"
               if report.order_ok and all(g.ok for g in report.grads if g.compared) else
               "replay differs from the PyTorch reference")
        raise OrderMismatch(f"{graph}: {why}")


def _user_call(path: str, what: str, call):
    """Run the user's code; its failure is shown as the user's error (type, message, and where in their
    file), a usage error (exit 2), not a traceback of ours."""
    import traceback
    try:
        return call()
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise UsageError(f"{path}: {what} exited (SystemExit: {exc.code})") from None
    except BaseException as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise UsageError(f"{path}: {what} raised {type(exc).__name__}: {exc}{where}") from None
