"""What colours a picture: per node a time (from a trace, a summary or a simulation), a cost, or a change.

``from_profile(graph, profile, metric)``  medians over the passes of each
    node's run time (``duration``), queue wait (``wait``) or start from the
    pass's start (``start``); the critical path the input recorded (the
    nodes on it in at least half of the passes), else the longest chain of
    queue wait + run time through the graph;
``from_costs(graph, profile)``  run times only, as costs: the critical path
    is the longest chain of costs through the graph (no schedule);
``from_diff(graph, diff, a, b)``  each node's relative change of median
    run time, B against A (a change within the noise counts as none); B's
    critical path.

A group of collapsed nodes (``view.Item``) takes the sum of its members'
times (the earliest start), or the change of their summed times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autograd_run.draw.colors import fmt_bytes, fmt_ns
from autograd_run.analysis.diff import typical_path
from autograd_run.analysis.stats import median

METRICS = ("duration", "wait", "start", "freed")
_TITLES = {"duration": "run time", "wait": "queue wait", "start": "start (from the pass's start)"}


@dataclass
class Colouring:
    #: ``time`` (values in ns) or ``change`` (relative, B against A).
    kind: str
    title: str
    #: Per node id: the value (time in ns) or, for changes, (A's time, B's time).
    values: dict = field(default_factory=dict)
    #: Per node id: lines for its tooltip.
    details: dict = field(default_factory=dict)
    #: The critical path, root first (node ids), and the same as a set.
    path: list = field(default_factory=list)
    critical: set = field(default_factory=set)
    metric: str = "duration"

    def value_of(self, nodes) -> float | None:
        """The value of one node or a group (sum of times, earliest start, change of summed times)."""
        vals = [self.values[n.id] for n in nodes if n.id in self.values]
        if not vals:
            return None
        if self.kind == "change":
            a = sum(v[0] for v in vals)
            b = sum(v[1] for v in vals)
            return (b - a) / a if a else (0.0 if b == a else float("inf"))
        return min(vals) if self.metric == "start" else sum(vals)


def _med(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None


def longest_chain(graph, weight) -> list[str]:
    """Node ids of the chain from a root with the largest summed ``weight(node)`` (a static critical path)."""
    best: dict = {}
    nxt: dict = {}
    for n in sorted(graph.nodes, key=lambda n: n.topo_nr):
        top, arg = 0.0, None
        for e in n.next:
            if e is not None and best.get(e.node, -1.0) > top:
                top, arg = best[e.node], e.node
        best[n] = (weight(n) or 0.0) + top
        nxt[n] = arg
    roots = [r.edge.node for r in graph.roots] or list(graph.nodes[:1])
    if not roots:
        return []
    n = max(roots, key=lambda r: best.get(r, 0.0))
    path = []
    while n is not None:
        path.append(n.id)
        n = nxt.get(n)
    return path


def from_profile(graph, profile, metric: str = "duration") -> Colouring:
    c = Colouring("time", f"{_TITLES[metric]} (median of {profile.passes} pass{'es' if profile.passes != 1 else ''})",
                  metric=metric)
    waits: dict = {}
    durs: dict = {}
    for nid, ns in profile.nodes.items():
        d, w, s = _med(ns.duration_ns), _med(ns.queue_wait_ns), _med(ns.start_ns)
        if d is None:
            continue
        durs[nid], waits[nid] = d, w or 0.0
        c.values[nid] = {"duration": d, "wait": w or 0.0, "start": s or 0.0}[metric]
        workers = sorted({x for x in ns.worker if x is not None})
        c.details[nid] = [f"start {fmt_ns(s or 0)} (from the pass's start)", f"run time {fmt_ns(d)}",
                          f"queue wait {fmt_ns(w or 0)}", f"worker {', '.join(workers) or '?'}"]
        if profile.passes > 1:
            c.details[nid].append(f"medians of {sum(1 for x in ns.duration_ns if x is not None)} passes")
    path = typical_path(profile)
    if not path:
        path = longest_chain(graph, lambda n: (durs.get(n.id, 0.0) + waits.get(n.id, 0.0)))
    c.path, c.critical = path, set(path)
    return c


def from_memory(graph, memory) -> Colouring:
    """Each node by the bytes its run freed less those it allocated (``analysis.memory``; a node that leaves
    more than it found is at the scale's low end); the critical path: the chain that frees the most."""
    c = Colouring("bytes", "bytes freed by each node's run (its saved tensors and inputs, less its outputs)",
                  metric="freed")
    for nid, freed in memory.freed.items():
        c.values[nid] = float(freed)
        c.details[nid] = [f"frees {fmt_bytes(freed)}" if freed >= 0 else f"adds {fmt_bytes(-freed)}"]
    c.path = longest_chain(graph, lambda n: max(c.values.get(n.id, 0.0), 0.0))
    c.critical = set(c.path)
    return c


def from_costs(graph, profile) -> Colouring:
    c = Colouring("time", "cost (median run time)")
    for nid, ns in profile.nodes.items():
        d = _med(ns.duration_ns)
        if d is not None:
            c.values[nid] = d
            c.details[nid] = [f"cost {fmt_ns(d)}"]
    c.path = longest_chain(graph, lambda n: c.values.get(n.id, 0.0))
    c.critical = set(c.path)
    return c


def from_diff(graph, d, a, b) -> Colouring:
    c = Colouring("change", "run time change, B against A")
    for ch in d.nodes:
        verdict = ("untested" if ch.significant is None else
                   "beyond the noise" if ch.significant else "within the noise")
        p = "" if ch.p is None else f", p={ch.p:.3g}"
        rel = ch.relative
        c.details[ch.name] = [f"A {fmt_ns(ch.a)}, B {fmt_ns(ch.b)}",
                              ("new" if rel is None else f"{rel:+.1%}") + f" ({verdict}{p})"]
        # A change within the noise is drawn as no change.
        c.values[ch.name] = (ch.a, ch.b) if ch.counts else (ch.a, ch.a)
    for nid in d.order.only_a:
        c.details.setdefault(nid, []).append("ran in A only")
    for nid in d.order.only_b:
        c.details.setdefault(nid, []).append("ran in B only")
    for nid, wa, wb in d.order.moved:
        c.details.setdefault(nid, []).append(f"worker {wa} in A, {wb} in B")
    c.path = typical_path(b)
    c.critical = set(c.path)
    return c
