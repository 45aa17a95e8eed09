"""``capture --order-out / --expect-order / --check``: PyTorch's own order as a golden file, compared, replayed.

``prepare`` checks the paths and reads the golden before the script runs
(an output never overwrites an input; a bad golden is reported before any
work); ``finish`` captures (structure only unless a graph file is wanted:
``-o``, or ``--check``, which replays a capture in a temporary folder),
writes PyTorch's order, compares it with the golden by node identity
(``autograd_run.capture.golden``) and, with ``--check``, replays the graph and
compares our order and gradients with PyTorch's. A difference is exit 3.
"""

from __future__ import annotations

import os
import tempfile

import click

from autograd_run.cli.common import escape
from autograd_run.errors import OrderMismatch, RequestError, UsageError


def claim(written: dict[str, str], path: str, option: str, what: str, inputs: list[str | None]) -> None:
    """Check an output ``path`` (``what`` is written there) before any work: not one of ``inputs``, not
    where another output (``written``: path -> what) goes, creatable; then add it to ``written``."""
    from autograd_run.outputs import check_output_path
    for other, owner in written.items():
        if os.path.realpath(path) == os.path.realpath(other):
            raise RequestError(f"{path}: {owner} is written there already", option)
    check_output_path(path, option, [p for p in inputs if p])
    written[path] = what


def prepare(script: str, written: dict[str, str], order_out: str | None, expect_order: str | None):
    """Check ``--order-out`` against the inputs and the other outputs (``written``: path -> what) and read
    ``--expect-order`` (a ``golden.Golden``, or None), before any work."""
    from autograd_run.capture.golden import read_golden
    if order_out:
        claim(written, order_out, "order_out", "the order", [script, expect_order])
    return read_golden(expect_order, "expected_order") if expect_order else None


def finish(outputs, kw: dict, output: str | None, order_out: str | None, expect_order: str | None,
           check_replay: bool, golden, describe, what: str = "the script") -> dict:
    """Capture, write and compare as the options say; ``OrderMismatch`` (exit 3) on a difference.
    Returns the captured document.

    ``describe(output, doc)`` is the line ``capture -o`` prints for a written graph; ``what`` names
    the user's function in an error.
    """
    from autograd_run.capture import from_torch
    from autograd_run.capture.golden import Captured, compare, golden_rows, write_golden
    failed = []
    with tempfile.TemporaryDirectory(prefix="autograd-run-capture-") as tmp:
        graph_file = output or (os.path.join(tmp, "capture.json") if check_replay else None)
        try:
            doc = from_torch(outputs, path=graph_file, values=graph_file is not None, **kw)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise UsageError(f"{what} returned what cannot be captured: {exc}") from exc
        if output:
            click.echo(escape(describe(output, doc)))
        captured = Captured(doc, golden_rows(doc))
        click.echo(escape(f"PyTorch {captured.torch} ran {len(captured.rows)} nodes"))
        if order_out:
            write_golden(order_out, captured.rows, "order_out")
            click.echo(escape(f"order written to {order_out}"))
        if golden is not None:
            result = compare(golden, captured)
            if result.ok:
                click.echo(escape(f"order matches {expect_order} ({len(captured.rows)} nodes)"))
                if result.torch_note:
                    click.echo("note: " + result.torch_note)
            else:
                for line in result.lines():
                    click.echo(line, err=True)
                failed.append(f"PyTorch's order differs from {expect_order}")
        if check_replay and not _replay_agrees(graph_file):
            failed.append("the replay differs from PyTorch")
    if failed:
        raise OrderMismatch("; ".join(failed))
    return doc


def _replay_agrees(graph_file: str) -> bool:
    """Replay the captured graph and compare order and gradients with PyTorch's (as ``check``); print the outcome."""
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    # python nodes call the custom Functions of the script this capture has just run: the same code, trusted
    report = check_graph(load_graph(graph_file), allow_python=True)
    if report.order_ok:
        click.echo(f"replay: order same as PyTorch ({report.order_len[1]} nodes)")
    else:
        d = report.divergence
        click.echo(escape(f"replay: order differs at position {d['position']}: expected {d['expected']}, "
                          f"got {d['got']}"), err=True)
    if not report.grads_compared:
        click.echo(escape(f"replay: {report.note}"))
    for g in report.grads:
        if not g.ok:
            err = "" if g.max_abs is None else f": max abs err {g.max_abs:.3g}, max rel err {g.max_rel:.3g}"
            click.echo(escape(f"replay: gradient of {g.name} differs{err}" + (f" ({g.note})" if g.note else "")),
                       err=True)
    if report.grads_compared and report.grads:
        ok = sum(g.ok for g in report.grads)
        click.echo(f"replay: gradients of {ok} of {len(report.grads)} leaves within tolerance")
    return report.ok
