"""Rendering a comparison (``analysis.diff.Diff``): rich tables for the terminal, Markdown for CI.

Both come from one list of sections (title, columns, rows of plain
strings) built by ``sections``; everything from the inputs (ids, names,
paths, worker labels) is escaped for the target: control characters made
visible, never read as rich markup (``rich.text.Text``), and in Markdown
never as markup, HTML, links or @-mentions.
"""

from __future__ import annotations

import html

from rich.console import Console
from rich.text import Text

from autograd_run.cli.common import escape
from autograd_run.cli.terminal import PlainTable as Table
from autograd_run.cli.render import fmt_ns


def _verdict(c) -> str:
    if c.delta == 0:
        return "same"
    if c.significant is None:
        return "untested"
    return "beyond noise" if c.significant else "within noise"


def _pct(c) -> str:
    rel = c.relative
    return "new" if rel is None else f"{rel:+.1%}"


def _p(c) -> str:
    return "-" if c.p is None else f"{c.p:.3g}"


def _time_row(label: str, c) -> list[str]:
    return [label, fmt_ns(c.a), fmt_ns(c.b), f"{'+' if c.delta >= 0 else '-'}{fmt_ns(abs(c.delta))} ({_pct(c)})",
            _p(c), _verdict(c)]


def _ready(ready) -> str:
    if not ready:
        return "-"
    parts = [f"{r[0]} (depth {r[1]}, seq {r[2]})" for r in ready[:8]]
    return ", ".join(parts) + (f", ... {len(ready) - 8} more" if len(ready) > 8 else "")


def _row_name(row) -> str:
    if row is None:
        return "(end of order)"
    seq = f", seq {row['seq']}" if row.get("seq") is not None else ""
    return f"{row['id']} ({row.get('name')}{seq})"


def sections(d, a, b, verdicts, top: int = 10) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison as (title, column headers, rows) in display order; cells are plain text."""
    out = []
    out.append(("inputs", ["side", "source", "what"],
                [["A", a.source, a.describe()], ["B", b.source, b.describe()]]))
    test = f"Mann–Whitney U, two-sided, alpha {d.alpha}, Holm-adjusted per table"
    if d.wall is not None:
        rows = [_time_row("wall (median)", d.wall)]
        if d.critical_path is not None:
            rows.append(_time_row("critical path (median)", d.critical_path))
        out.append((f"time ({test})", ["", "A", "B", "change", "p", "verdict"], rows))
    o = d.order
    if o.compared:
        rows = []
        dv = o.divergence
        if dv is None:
            rows.append(["first divergence", "none" + (" (A's own passes differ: each B pass matches one of them)"
                                                       if o.a_varies else "")])
        else:
            where = f"pass {dv.pass_index}, position {dv.position}" + (f" of worker {dv.worker}" if dv.worker else "")
            rows.append(["first divergence", f"{where}: A ran {_row_name(dv.a)}, B ran {_row_name(dv.b)}"])
            rows.append(["A around it", " > ".join(dv.a_context)])
            rows.append(["B around it", " > ".join(dv.b_context)])
            if dv.b is not None:
                rows.append(["A ran B's node", "never" if dv.a_position_of_b is None
                             else f"at position {dv.a_position_of_b}"])
            if dv.a is not None:
                rows.append(["B ran A's node", "never" if dv.b_position_of_a is None
                             else f"at position {dv.b_position_of_a}"])
            if dv.a_ready:
                rows.append(["A's ready set (popped first)", _ready(dv.a_ready)])
            if dv.b_ready:
                rows.append(["B's ready set (popped first)", _ready(dv.b_ready)])
            if o.a_varies:
                rows.append(["note", "A's own passes differ (a nondeterministic order); B's matches none of them"])
        rows.append(["Kendall tau (start order)", f"{o.kendall_tau:.3f} over {o.tau_nodes} nodes"])
        rows.append(["compared", "each worker's own sequence" if o.per_worker else "the whole order"])
        if o.only_a:
            rows.append([f"only in A ({len(o.only_a)})", ", ".join(o.only_a[:top]) + (" ..." if len(o.only_a) > top else "")])
        if o.only_b:
            rows.append([f"only in B ({len(o.only_b)})", ", ".join(o.only_b[:top]) + (" ..." if len(o.only_b) > top else "")])
        if o.changed:
            rows.append([f"another op ({len(o.changed)})", ", ".join(f"{i}: {x} -> {y}" for i, x, y in o.changed[:top])
                         + (" ..." if len(o.changed) > top else "")])
        rows.append(["nodes on another worker", str(len(o.moved))])
        out.append(("order", ["", ""], rows))
        if o.moved:
            out.append((f"nodes on another worker (top {min(top, len(o.moved))})", ["node", "A", "B"],
                        [list(m) for m in o.moved[:top]]))
    if d.critical_joined or d.critical_left:
        rows = [["joined (in B)", ", ".join(d.critical_joined) or "-"],
                ["left (in A only)", ", ".join(d.critical_left) or "-"]]
        out.append(("critical path", ["", "nodes"], rows))
    if d.workers:
        rows = [[c.name, f"{c.a:.0%}", f"{c.b:.0%}", f"{c.delta * 100:+.1f} points", _p(c), _verdict(c)]
                for c in d.workers[:top]]
        out.append(("worker utilisation (median)", ["worker", "A", "B", "change", "p", "verdict"], rows))
    for title, family, first in (("ops (total per pass, median)", d.ops, "op"),
                                 ("nodes (run time, median)", d.nodes, "node")):
        changed = [c for c in family if c.delta != 0]
        if family and not changed:
            out.append((title, [first], [[f"{len(family)} compared, none changed"]]))
        elif family:
            shown = changed[:top]
            rows = [_time_row(c.name, c) for c in shown]
            more = len(changed) - len(shown)
            out.append((f"{title}: largest changes" + (f", {more} more" if more > 0 else ""),
                        [first, "A", "B", "change", "p", "verdict"], rows))
    if verdicts:
        out.append(("thresholds (--fail-on)", ["threshold", "result", "detail"],
                    [[v.threshold, "CROSSED" if v.crossed else "ok", v.detail] for v in verdicts]))
    if d.notes:
        out.append(("notes", ["note"], [[n] for n in d.notes]))
    return out


def render(console: Console, d, a, b, verdicts, top: int = 10) -> None:
    """The comparison as rich tables (every cell a ``Text``: nothing from the inputs is markup)."""
    for title, cols, rows in sections(d, a, b, verdicts, top):
        t = Table(title=Text(title), title_justify="left", show_header=any(cols))
        for c in cols:
            t.add_column(Text(c), fold_words=True)  # cells name nodes and ops from the graphs
        for r in rows:
            t.add_row(*(Text(escape(x)) for x in r))
        console.print(t)


def md_escape(text: str) -> str:
    """``text`` for a Markdown table cell: no markup, HTML, links, @-mentions, issue references or line breaks."""
    s = html.escape(escape(str(text)), quote=False)
    for ch in "\\`*_[]|~#":
        s = s.replace(ch, "\\" + ch) if ch != "#" else s.replace(ch, "&#35;")
    return s.replace("@", "&#64;").replace("://", "&#58;//").replace("www.", "www&#46;")


def markdown(d, a, b, verdicts, top: int = 10) -> str:
    """The comparison as GitHub-flavoured Markdown (a CI job summary or a pull-request comment)."""
    crossed = [v for v in verdicts if v.crossed]
    head = "## autograd-run diff"
    if verdicts:
        head += f": {len(crossed)} threshold{'s' if len(crossed) != 1 else ''} crossed" if crossed else \
            ": no threshold crossed"
    lines = [head, ""]
    for title, cols, rows in sections(d, a, b, verdicts, top):
        lines.append(f"### {md_escape(title)}")
        lines.append("")
        cols = [c or " " for c in cols]
        lines.append("| " + " | ".join(md_escape(c) for c in cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
        for r in rows:
            lines.append("| " + " | ".join(md_escape(x) for x in r) + " |")
        lines.append("")
    return "\n".join(lines)
