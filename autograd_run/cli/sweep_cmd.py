"""``autograd-run sweep``: a grid of simulations (or runs) over many graphs, on Dask distributed."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import click
from rich.console import Console
from rich.text import Text

from autograd_run.cli.common import Whole, echo, error_line, escape, write
from autograd_run.cli.terminal import PlainTable as Table, make_console
from autograd_run.cli.render import fmt_ns
from autograd_run.sweep.spec import MAX_REPEAT, MODES

MAX_SHOWN_ERRORS = 20


@click.command()
@click.argument("spec_file", required=False, metavar="[SPEC.yaml]")
@click.option("-g", "--graph", "graphs", multiple=True, metavar="PATH|GLOB",
              help="A graph file, a glob (quote it) or example:NAME; repeatable. Replaces the spec's graphs.")
@click.option("--devices", default=None, metavar="K,K,...", help="Device counts ('file': as the graph places its nodes).")
@click.option("--placement", default=None, metavar="A,B,...", help="Placements: keep, round-robin, layer, greedy.")
@click.option("--policy", default=None, metavar="A,B,...", help="Scheduling policies (see `simulate --help`).")
@click.option("--scale", multiple=True, metavar="NAME=F,...", help="A cost scaling; repeatable, one value each.")
@click.option("--spec", "machine", default=None, metavar="NAME|FILE,...", help="Machine specs: h100, a100, ..., local, files.")
@click.option("--mode", type=click.Choice(MODES), default=None, help="Simulate each point (default) or really run it.")
@click.option("--repeat", type=Whole(1, MAX_REPEAT), default=None, metavar="N", help="mode run: passes per point.")
@click.option("--out", default=None, metavar="DIR", help="Write results.csv, results.json, results.parquet and plots/ there.")
@click.option("--cache", "cache_dir", default=None, metavar="DIR",
              help="Results cache  [default: ~/.cache/autograd-run/sweep]")
@click.option("--no-cache", is_flag=True, help="Recompute every point (the cache is refreshed).")
@click.option("--scheduler", default=None, metavar="tcp://HOST:PORT", help="Use a running Dask scheduler's workers.")
@click.option("--workers", type=Whole(0, 1024), default=None, metavar="N",
              help="Worker processes of the embedded cluster  [default: one per CPU]; 0: this process, no Dask.")
@click.option("--transfer", type=click.Choice(["send", "path"]), default="send", show_default=True,
              help="Send each graph to the cluster once, or let workers read its path (a shared filesystem).")
@click.option("--batch", type=Whole(1, 10_000), default=None, metavar="N", help="Points per task  [default: automatic]")
@click.option("--plot", "plot_fmt", type=click.Choice(["png", "svg", "none"]), default="png", show_default=True,
              help="Plot format in DIR/plots (with --out).")
@click.option("--top", type=Whole(1, 1000), default=3, show_default=True, metavar="N", help="Rows shown per graph.")
@click.option("--json", "json_out", is_flag=True, help="Print the results as JSON.")
@click.option("--verbose", is_flag=True, help="Show Dask's own log messages.")
def sweep(spec_file, graphs, devices, placement, policy, scale, machine, mode, repeat, out, cache_dir, no_cache,
          scheduler, workers, transfer, batch, plot_fmt, top, json_out, verbose):
    """Simulate (or run) every point of a grid over many graphs, on Dask distributed.

    SPEC.yaml lists `graphs:` (paths or globs, relative to its folder, or absolute) and a
    list per dimension: devices, placement, policy, scale, spec; `mode: run`
    runs each point for real. Options give the same values for a quick grid
    (and replace the spec's). Results are cached by the hash of the graph,
    the point and the tool, so a rerun computes only what changed. Exit 1
    when a point failed (the others are still reported).

    \b
    Examples:
      autograd-run sweep sweep.yaml --out results/
      autograd-run sweep -g 'models/*.json' --devices 1,2,4 --policy pytorch,fifo
      autograd-run sweep sweep.yaml --scheduler tcp://10.0.0.5:8786 --json
    """
    from autograd_run.errors import UsageError
    from autograd_run.sweep.grid import build_grid
    from autograd_run.sweep.plots import FORMATS, draw_all, plot_names, require_matplotlib
    from autograd_run.sweep.results import has_pyarrow, output_files, prepare_out, report_json, write_results
    from autograd_run.sweep.runner import SweepOptions, run_sweep
    from autograd_run.sweep.spec import from_options, read_spec_file

    if scheduler and workers is not None:
        raise UsageError("--workers sizes the embedded cluster; with --scheduler the scheduler's workers are used")
    if scheduler and workers == 0:
        raise UsageError("--workers 0 runs in this process; it does not combine with --scheduler")
    from click.core import ParameterSource
    given = click.get_current_context().get_parameter_source
    if not out and given("plot_fmt") is not ParameterSource.DEFAULT:
        raise UsageError("--plot goes with --out DIR (the plots are written to DIR/plots)")
    if json_out and given("top") is not ParameterSource.DEFAULT:
        raise UsageError("--top sets the rows of the table; --json holds every point")
    if workers == 0 and given("transfer") is not ParameterSource.DEFAULT:
        raise UsageError("--transfer says how graphs reach Dask's workers; --workers 0 runs in this process")
    base = read_spec_file(spec_file) if spec_file else None
    spec = from_options(list(graphs), devices, placement, policy, list(scale), machine, mode, repeat, base)
    grid = build_grid(spec)
    if workers != 0:
        from autograd_run.sweep.cluster import check_distributed
        check_distributed()  # told before any work; imported only when a point is left to compute
    files, plots, names = {}, None, []
    if out:
        import os
        files = output_files(out, has_pyarrow())
        plots = os.path.join(out, "plots") if plot_fmt in FORMATS else None
        if plots:
            require_matplotlib()
            names = plot_names(grid.graphs, plot_fmt)
        prepare_out(out, [*files.values(), *(os.path.join(plots, n) for n in names)], grid.inputs)

    err = make_console(stderr=True)
    progress = _progress(err) if err.is_terminal and not json_out else None
    task = None

    def on_start(total, cached, todo, where):
        nonlocal task
        if progress is not None and todo:
            progress.start()
            from rich.markup import escape as markup_escape  # a progress description is read as markup
            task = progress.add_task(f"sweep on {markup_escape(escape(where))}", total=total, completed=cached)

    def on_row(row):
        if progress is not None and task is not None and not row.get("cached"):
            progress.advance(task)

    try:
        with _ctrl_c() as stop_requested:
            opts = SweepOptions(scheduler=scheduler, workers=workers, cache_dir=cache_dir, use_cache=not no_cache,
                                transfer=transfer, batch=batch, verbose=verbose, on_start=on_start, on_row=on_row,
                                stop_requested=stop_requested)
            report = run_sweep(grid, opts)
    finally:
        if progress is not None:
            progress.stop()
    written = []
    if out:
        written = list(files.values())
        kept = None if no_cache else report.cache_dir  # derived files beside the points (sweep.cache)
        if plots:
            written += draw_all(plots, names, grid.graphs, report.rows, plot_fmt,
                                kept and os.path.join(kept, "plots"), report.tool)
        write_results(files, report, written, kept and os.path.join(kept, "tables"))
    if json_out:
        from autograd_run.cli import jsonout
        write(jsonout.dumps(report_json(report, written)))
    else:
        render(make_console(), report, top, written)
    never = report.scale_never_applied()
    if never:
        echo(f"Warning: --scale {', '.join(never)} named no op and no device in any point: nothing was scaled by "
             f"{'it' if len(never) == 1 else 'them'} (a typo?)", err=True)
    if report.interrupted:
        done = len(report.rows) - report.cancelled
        error_line(f"interrupted: {done} of {len(report.rows)} points finished (kept"
                   f"{' in ' + out if out else ''} and in the cache); {report.cancelled} cancelled")
        sys.exit(130)
    if report.failed:
        error_line(f"{report.failed} of {len(report.rows)} points failed (the table of failed points says why)"
                   if not json_out else f"{report.failed} of {len(report.rows)} points failed (their errors are in "
                   "the JSON's rows)")
        sys.exit(1)


@contextlib.contextmanager
def _ctrl_c():
    """Ctrl-C while a sweep runs: a KeyboardInterrupt, as by default, and a flag the sweep polls after each batch
    (``SweepOptions.stop_requested``). A KeyboardInterrupt raised inside a destructor (a Dask future's, run as
    the client lets go of it) is swallowed by Python, which prints "Exception ignored in ..." and goes on: the
    sweep then finished as if nothing was pressed. The flag stops it at the next batch, and that message is not
    printed for it (any other stays)."""
    hit = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield hit.is_set
        return

    def on_sigint(signum, frame):
        hit.set()
        raise KeyboardInterrupt

    def unraisable(u):
        if not (hit.is_set() and u.exc_type is KeyboardInterrupt):
            previous_hook(u)
    previous, previous_hook = signal.signal(signal.SIGINT, on_sigint), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield hit.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook


def _progress(console: Console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _config(r: dict, columns=("policy", "devices", "placement", "spec", "scale")) -> list[str]:
    shown = {"devices": "file" if r["devices"] is None else str(r["devices"]), "spec": r["spec"] or "-",
             "scale": r["scale"] or "-"}
    return [shown.get(c, r[c]) for c in columns]


def render(console: Console, report, top: int, written: list[str]) -> None:
    """The fastest configurations per graph, the failures, and a closing line."""
    from autograd_run.sweep.results import ranked
    # The dimensions that vary get a column (policy and devices always do).
    columns = [c for c in ("policy", "devices", "placement", "spec", "scale")
               if c in ("policy", "devices") or len({r[c] for r in report.rows}) > 1]
    t = Table(title=f"sweep: {len(report.rows)} points, fastest first per graph", title_justify="left")
    t.add_column("graph", fold_words=True)  # paths and specs come from the user: they may fold
    for c in columns:
        t.add_column(c, justify="right" if c == "devices" else "left", fold_words=c == "spec")
    for c in ("wall", "critical path", "vs best"):
        t.add_column(c, justify="right", no_wrap=True)
    for name, rows in ranked(report.rows).items():
        for k, r in enumerate(rows[:top]):
            best = rows[0]["wall_ns"] or 1
            cells = [escape(name) if k == 0 else "", *(escape(c) for c in _config(r, columns)), fmt_ns(r["wall_ns"]),
                     fmt_ns(r.get("critical_path_ns") or 0), f"{r['wall_ns'] / best:.2f}x"]
            t.add_row(*(Text(c, style="bold" if k == 0 else "") for c in cells))
        if len(rows) > top:
            t.add_row(Text(""), Text(f"... {len(rows) - top} more"), *(Text("") for _ in range(len(columns) + 2)))
    console.print(t)
    failed = [r for r in report.rows if r["status"] == "error"]
    if failed:
        f = Table(title=f"{len(failed)} failed points", title_justify="left")
        for c in ("graph", "configuration", "error"):
            f.add_column(c, fold_words=True)
        for r in failed[:MAX_SHOWN_ERRORS]:
            f.add_row(Text(escape(r["graph"])), Text(escape(", ".join(_config(r)))), Text(escape(r["error"])))
        if len(failed) > MAX_SHOWN_ERRORS:
            f.add_row(Text(f"... {len(failed) - MAX_SHOWN_ERRORS} more (see the CSV or --json)"), Text(""), Text(""))
        console.print(f)
    line = (f"{len(report.rows)} points: {report.computed} computed, {report.cached} from the cache, "
            f"{report.failed} failed" + (f", {report.cancelled} cancelled" if report.cancelled else "")
            + f", in {report.seconds:.1f} s ({report.ran_on})")
    console.print(Text(escape(line)))
    if report.cache_write_errors:
        console.print(Text(escape(f"warning: {report.cache_write_errors} results could not be written to the cache "
                                  f"{report.cache_dir}")))
    if written:
        console.print(Text(escape("wrote " + ", ".join(written))))
