"""``autograd-run draw``: a picture of a graph (DOT, SVG, PNG or HTML), optionally coloured by time or change."""

from __future__ import annotations

import click

from autograd_run.cli.common import Whole
from autograd_run.draw.timing import METRICS
from autograd_run.errors import RequestError, UsageError


class _DrawCommand(click.Command):
    """``--simulate`` alone, ``--simulate='--policy fifo'`` or ``--simulate '--policy fifo'`` (a quoted value
    that is not one of draw's own options): click cannot take an optional value that starts with a dash."""

    def parse_args(self, ctx, args):
        own = {o for p in self.params for o in getattr(p, "opts", [])}
        out, i = [], 0
        while i < len(args):
            a = args[i]
            if a == "--":
                out += args[i:]
                break
            if a.startswith("--simulate="):
                out += ["--simulate-options", a[len("--simulate="):]]
            elif (a == "--simulate" and i + 1 < len(args) and args[i + 1].startswith("-")
                  and args[i + 1].split("=")[0] not in own):
                out += ["--simulate-options", args[i + 1]]
                i += 1
            else:
                out.append(a)
            i += 1
        return super().parse_args(ctx, out)


@click.command(cls=_DrawCommand)
@click.argument("graph")
@click.option("-o", "--output", required=True, metavar="FILE", help="Output: .dot, .svg, .png or .html.")
@click.option("--saved", is_flag=True, help="Show saved tensors (orange) with their shapes.")
@click.option("--trace", "trace_path", default=None, metavar="FILE",
              help="Colour by the times in a trace or JSON summary of `run`/`simulate`.")
@click.option("--simulate", "simulate_flag", is_flag=True, metavar="[=OPTIONS]",
              help="Colour by a simulation; its options as for `simulate`: --simulate='--policy fifo'.")
@click.option("--simulate-options", "simulate_opts", default=None, hidden=True)
@click.option("--costs", "costs_path", default=None, metavar="FILE",
              help="Colour by node costs (median run times in a trace or JSON summary); bold: the longest "
                   "chain of costs.")
@click.option("--diff", "diff_paths", nargs=2, default=None, metavar="A B",
              help="Colour by the change of each node's run time from A to B (files as for `diff`).")
@click.option("--color-by", "metric", type=click.Choice(METRICS), default="duration", show_default=True,
              help="With --trace or --simulate: which time colours the nodes; `freed` (with --simulate): the bytes "
                   "each node's run frees (the memory model, docs/memory.md).")
@click.option("--log-scale", is_flag=True, help="A logarithmic colour scale (times spread over decades).")
@click.option("--around", "around_node", default=None, metavar="NODE", help="Only the nodes near NODE.")
@click.option("--depth", type=Whole(0, 10_000), default=2, show_default=True, metavar="N",
              help="With --around: how many edges away from NODE.")
@click.option("--max-nodes", type=Whole(2, 1_000_000), default=300, show_default=True, metavar="N",
              help="Collapse repeated structure beyond this many boxes (the picture says what).")
def draw(graph, output, saved, trace_path, simulate_flag, simulate_opts, costs_path, diff_paths, metric, log_scale, around_node,
         depth, max_nodes):
    """Draw GRAPH (a file, example:NAME, or - for stdin): nodes by device (and stream), leaves and outputs
    marked, optionally coloured by time.

    DOT is written by autograd-run itself; SVG, PNG and HTML need Graphviz
    (the `dot` program and `pip install 'autograd-run[draw]'`).

    \b
    Examples:
      autograd-run draw example:seed -o seed.svg --saved
      autograd-run draw model.json -o model.html --trace trace.json
      autograd-run draw model.json -o model.svg --simulate='--devices 2 --placement layer'
      autograd-run draw model.json -o change.svg --diff base.json new.json
      autograd-run draw big.json -o part.png --around mm_12 --depth 3
    """
    from autograd_run.draw import dot, render, timing, view
    from autograd_run.cli.common import load_graph_arg
    from autograd_run.outputs import atomic_write, check_output_path
    from autograd_run.traces.read_profile import read_profile

    if simulate_flag and simulate_opts is None:
        simulate_opts = ""
    sources = [s for s in (trace_path, simulate_opts, costs_path, diff_paths) if s is not None]
    if len(sources) > 1:
        raise UsageError("--trace, --simulate, --costs and --diff: choose one")
    from click.core import ParameterSource
    given = {name for name in ("depth", "metric")
             if click.get_current_context().get_parameter_source(name) is not ParameterSource.DEFAULT}
    if around_node is None and "depth" in given:
        raise UsageError("--depth goes with --around")
    if "metric" in given and (costs_path is not None or diff_paths is not None):
        raise UsageError("--color-by goes with --trace or --simulate (--costs and --diff colour by run time)")
    fmt = render.output_format(output)
    g = load_graph_arg(graph, keep=True)
    side = None
    if simulate_opts is not None:
        from autograd_run.cli.sides import parse_side
        side = parse_side(simulate_opts, "--simulate", default_kind="simulate")
        if side.kind != "simulate":
            raise UsageError("--simulate takes the options of `simulate`, not of `run`")
    inputs = [*g.files(), trace_path or "", costs_path or "", *(diff_paths or ()),
              (side.params.get("costs") or "") if side is not None else ""]
    check_output_path(output, "output", inputs)

    colouring = None
    if metric == "freed" and side is None:
        raise UsageError("--color-by freed needs --simulate (the memory model runs over a simulated pass)")
    if trace_path is not None:
        colouring = timing.from_profile(g, _profile_of(g, read_profile(trace_path, "trace_path"), "trace_path"),
                                        metric)
    elif costs_path is not None:
        colouring = timing.from_costs(g, _profile_of(g, read_profile(costs_path, "costs"), "costs"))
    elif diff_paths is not None:
        from autograd_run.analysis.diff import compare
        a, b = read_profile(diff_paths[0], "diff"), read_profile(diff_paths[1], "diff")
        _profile_of(g, a, "diff")
        _profile_of(g, b, "diff")
        colouring = timing.from_diff(g, compare(a, b), a, b)
    elif side is not None and metric == "freed":
        from autograd_run.sim.session import simulate_session
        report = simulate_session(g, side.sim_options())
        g = report.graph
        colouring = timing.from_memory(g, report.memory)
    elif side is not None:
        g, profile = _simulate(g, side)
        colouring = timing.from_profile(g, profile, metric)
    elif "metric" in given or log_scale:
        raise UsageError("--color-by and --log-scale need --trace or --simulate (or --costs, --diff)")

    v = view.around(g, around_node, depth) if around_node is not None else view.whole(g)
    v = view.collapse(v, max_nodes, [r.edge.node for r in g.roots])
    title = f"{g.source}: {len(g.nodes)} nodes" + (f", {colouring.title}" if colouring is not None else "")
    text = dot.to_dot(g, v, colouring, saved=saved, log=log_scale, title=title)
    data = render.render(text, fmt, title, v.notes)
    atomic_write(output, data, "output")
    from autograd_run.cli.common import escape
    click.echo(escape(f"{output}: {len(v.items)} boxes for {len(g.nodes)} nodes"))
    for note in v.notes:
        click.echo(escape(f"  {note}"))


def _profile_of(g, profile, option: str):
    """``profile``, refused when it has no times or none for ``g``'s nodes (a file of another graph)."""
    if not profile.has_times:
        raise RequestError(f"{profile.source}: {profile.describe()}: it has no times to colour by", option)
    if not profile.nodes:
        raise RequestError(f"{profile.source}: no per-node times (a summary from an older version?)", option)
    if not any(n.id in profile.nodes for n in g.nodes):
        raise RequestError(f"{profile.source}: no node of {g.source} has a time there (a file of another graph?)",
                           option)
    return profile


def _simulate(g, side):
    """The graph as simulated (a placement may move nodes) and the simulation's profile."""
    from autograd_run.sim.session import simulate_session
    from autograd_run.analysis.profile import from_recording
    report = simulate_session(g, side.sim_options())
    return report.graph, from_recording(report.recording, "simulation", "simulation", report.order)


