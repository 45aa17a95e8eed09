"""Plots of a sweep: predicted (or measured) wall time against device count, one line per policy, per graph.

Drawn with matplotlib's object API on its Agg (PNG) or SVG backend, never an
interactive one, and never through ``pyplot``'s global state. A policy's
line takes, at each device count, its fastest configuration over the other
dimensions (placement, machine spec, scaling); the title says when there were
several. A point simulated "as in the file" is drawn at the file's device
count. Text from files (graph names) is shown literally: control characters
made visible and ``$`` not read as math.
"""

from __future__ import annotations

import os
import re

from autograd_run.errors import UsageError
from autograd_run.outputs import atomic_write_with
from autograd_run.sweep.cache import copy_derived, derived, keep_derived
from autograd_run.sweep.results import ranked
from autograd_run.text import visible

FORMATS = ("png", "svg")


def require_matplotlib():
    """A usage error when matplotlib is not installed, found without importing it (plots from the cache
    never import it)."""
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("plots need matplotlib: pip install 'autograd-run[sweep]' (or --plot none)")


def plot_names(graphs, fmt: str) -> list[str]:
    """A file name per graph (its stem made safe, and a short hash so two graphs never share one)."""
    names, used = [], set()
    for g in graphs:
        stem = os.path.splitext(os.path.basename(g.name.replace("example:", "example-")))[0]
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", stem)[:60].lstrip(".") or "graph"
        name = f"{stem}-{g.sha[:8]}.{fmt}"
        k = 2
        while name in used:
            name = f"{stem}-{g.sha[:8]}-{k}.{fmt}"
            k += 1
        used.add(name)
        names.append(name)
    return names


def series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """policy -> [(device count, fastest wall in ms)], sorted by device count."""
    best: dict[str, dict[int, float]] = {}
    for r in rows:
        x = r["devices"] if r["devices"] is not None else max(1, r.get("devices_used") or 1)
        ms = r["wall_ns"] / 1e6
        cur = best.setdefault(r["policy"], {})
        if x not in cur or ms < cur[x]:
            cur[x] = ms
    return {p: sorted(d.items()) for p, d in best.items()}


def shown(text: str) -> str:
    """A name from a file as a plot shows it: control characters visible (``text.visible``)."""
    return visible(text)


def draw(path: str, title: str, rows: list[dict], fmt: str) -> None:
    """One graph's plot, written to ``path`` atomically."""
    from matplotlib.figure import Figure
    lines = series(rows)
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for policy, pts in sorted(lines.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=policy)
    xs = sorted({x for pts in lines.values() for x, _ in pts})
    ax.set_xticks(xs)
    ax.set_xlabel("devices")
    what = "measured" if rows and rows[0]["mode"] == "run" else "predicted"
    ax.set_ylabel(f"{what} wall time (ms)")
    varied = _varied(rows)
    sub = f"\nfastest over {', '.join(varied)}" if varied else ""
    ax.set_title(shown(title) + sub, parse_math=False, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    if lines:
        ax.legend(title="policy", fontsize=8)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, format=fmt), "out")


def _varied(rows: list[dict]) -> list[str]:
    """The dimensions other than policy and devices that take several values (a line is the fastest over them)."""
    return [k for k in ("placement", "spec", "scale") if len({r[k] for r in rows}) > 1]


def plot_key(title: str, rows: list[dict], fmt: str, tool: str) -> str:
    """Everything a plot shows (its lines, title, axis label, format), the tool and matplotlib's version, hashed:
    one key, one picture."""
    import hashlib
    import json
    from importlib.metadata import version
    what = {"title": title, "fmt": fmt, "series": series(rows), "mode": rows[0]["mode"], "varied": _varied(rows),
            "tool": tool, "matplotlib": version("matplotlib")}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def draw_all(folder: str, names: list[str], graphs, rows: list[dict], fmt: str, cache: str | None = None,
             tool: str = "") -> list[str]:
    """A plot per graph with at least one successful point; the paths written. With ``cache`` (a folder), a plot
    whose ``plot_key`` was drawn before is copied from there (matplotlib is then not even imported), and each
    plot drawn is kept there."""
    by_graph = ranked(rows)
    out = []
    for g, name in zip(graphs, names):
        rs = by_graph.get(g.name) or []
        if not rs:
            continue
        path = os.path.join(folder, name)
        key = plot_key(g.name, rs, fmt, tool) if cache is not None else None
        cached = derived(cache, key, f".{fmt}") if key else None
        if cached is None or not copy_derived(cached, path):
            draw(path, g.name, rs, fmt)
            if cached is not None:
                keep_derived(path, cached)
        out.append(path)
    return out
