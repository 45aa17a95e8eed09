"""``autograd-run diff``: compare two runs (files, or one graph run two ways) for CI."""

from __future__ import annotations

import json
import sys

import click

from autograd_run.cli.common import Finite, Whole
from autograd_run.errors import AutogradRunError, RequestError, UsageError


class ThresholdCrossed(AutogradRunError):
    """A ``--fail-on`` threshold was crossed (exit 3, like any mismatch)."""

    exit_code = 3


@click.command()
@click.argument("inputs", nargs=-1, required=True, metavar="A B | GRAPH")
@click.option("--a", "side_a", default=None, metavar="OPTIONS",
              help="With GRAPH: side A's options, as for `run` (e.g. '--repeat 20'), or 'simulate ...'.")
@click.option("--b", "side_b", default=None, metavar="OPTIONS", help="With GRAPH: side B's options.")
@click.option("--warmup", type=Whole(0, 1000), default=1, show_default=True, metavar="N",
              help="With GRAPH: discarded passes per run side before measuring.")
@click.option("--fail-on", default=None, metavar="RULES",
              help="Exit 3 when one is crossed, e.g. 'wall>10%,critical-path>5%,node>2ms,order'. "
                   "Keys: wall, critical-path, node, op, utilization (>VALUE); order, workers, "
                   "critical-path-nodes, structure.")
@click.option("--alpha", type=Finite(0, 1, min_open=True, max_open=True), default=0.01, metavar="P",
              show_default=True, help="Significance level of the Mann–Whitney U test (Holm-adjusted per table).")
@click.option("--top", type=Whole(1, 10_000), default=10, show_default=True, metavar="N",
              help="Rows per table.")
@click.option("--json", "json_out", is_flag=True, help="Print the comparison as JSON.")
@click.option("--markdown", is_flag=True, help="Print the comparison as Markdown (a CI job summary, a PR comment).")
def diff(inputs, side_a, side_b, warmup, fail_on, alpha, top, json_out, markdown):
    """Compare two runs: order, structure and time (B against the baseline A).

    A and B are order files (--order-out), traces (--trace) or JSON summaries
    (--json) of `run` or `simulate`, told apart by their content. With one
    GRAPH and --a/--b, the graph is run (or simulated) both ways, passes
    alternating, and compared. With passes on both sides, a time difference
    counts only when the two-sided Mann–Whitney U test puts it beyond the
    noise (p < --alpha).

    \b
    Examples:
      autograd-run diff base.json new.json --fail-on 'wall>10%,critical-path>5%,order'
      autograd-run diff golden.jsonl new.jsonl
      autograd-run diff graph.json --a '--repeat 20' --b '--repeat 20 --no-multithreading'
      autograd-run diff graph.json --a 'simulate' --b 'simulate --policy fifo' --markdown
    """
    from autograd_run.analysis.diff import check, compare, parse_fail_on

    if json_out and markdown:
        raise UsageError("--json and --markdown: choose one")
    thresholds = parse_fail_on(fail_on) if fail_on is not None else []
    if len(inputs) == 2:
        if side_a is not None or side_b is not None:
            raise UsageError("--a/--b go with one GRAPH, not with two files to compare")
        from click.core import ParameterSource
        if click.get_current_context().get_parameter_source("warmup") is not ParameterSource.DEFAULT:
            raise UsageError("--warmup goes with one GRAPH run two ways, not with two files to compare")
        a, b = _read_pair(inputs)
    elif len(inputs) == 1:
        if side_a is None and side_b is None:
            raise UsageError("one input: give --a and/or --b to run GRAPH two ways (or give two files)")
        if inputs[0] == "-":
            raise UsageError("-: GRAPH is read once per side; give it as a file, not on stdin")
        a, b = _measure(inputs[0], side_a or "", side_b or "", warmup)
    else:
        raise UsageError(f"expected A B (two files) or one GRAPH with --a/--b; got {len(inputs)} arguments")
    d = compare(a, b, alpha)
    verdicts = check(d, thresholds)
    if json_out:
        doc = {"a": {"source": a.source, "kind": a.kind, "passes": a.passes, "simulated": a.simulated},
               "b": {"source": b.source, "kind": b.kind, "passes": b.passes, "simulated": b.simulated},
               "test": {"name": "Mann-Whitney U, two-sided, Holm-adjusted per family", "alpha": alpha},
               "diff": d.to_dict(), "thresholds": [v.to_dict() for v in verdicts],
               "crossed": any(v.crossed for v in verdicts)}
        click.echo(json.dumps(doc))
    elif markdown:
        from autograd_run.cli.diff_render import markdown as render_md
        click.echo(render_md(d, a, b, verdicts, top))
    else:
        from autograd_run.cli.diff_render import render
        from autograd_run.cli.terminal import make_console
        render(make_console(), d, a, b, verdicts, top)
    crossed = [v for v in verdicts if v.crossed]
    if crossed:
        raise ThresholdCrossed("crossed: " + "; ".join(f"{v.threshold} ({v.detail})" for v in crossed))


def _read_pair(paths):
    from autograd_run.traces.read_profile import read_profile
    return read_profile(paths[0]), read_profile(paths[1])


def _measure(graph: str, text_a: str, text_b: str, warmup: int):
    from autograd_run.cli.flags import FLAGS
    from autograd_run.cli.sides import parse_side
    from autograd_run.compare import SideFailed, measure_pair
    sa, sb = parse_side(text_a, "--a"), parse_side(text_b, "--b")
    opts = [s.run_options(repeat=s.repeat) if s.kind == "run" else s.sim_options() for s in (sa, sb)]
    labels = (f"A: {text_a.strip() or sa.kind}", f"B: {text_b.strip() or sb.kind}")
    try:
        return measure_pair(graph, opts[0], opts[1], warmup, labels, progress=_progress())
    except SideFailed as exc:
        where = f"node {exc.node_id!r}" + (f" ({exc.node_name})" if exc.node_name else "") if exc.node_id else "backward"
        raise _Failed(f"--{exc.side}: {where}: {exc}") from None
    except RequestError as exc:
        side, _, option = (exc.option or "").partition(":")
        if side in ("a", "b"):
            flag = FLAGS.get(option)
            raise UsageError(f"--{side}: " + (f"{flag}: " if flag else "") + str(exc)) from None
        raise


class _Failed(AutogradRunError):
    exit_code = 1


def _progress():
    """A one-line pass counter on stderr when it is a terminal (the comparison can take a while)."""
    if not sys.stderr.isatty():
        return None

    def show(side, done, total):
        end = "\n" if done == total else ""
        click.echo(f"\rmeasuring: pass {done}/{total}", err=True, nl=False)
        if end:
            click.echo("\r" + " " * 40 + "\r", err=True, nl=False)
    return show
