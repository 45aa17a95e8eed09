"""What a picture shows of a graph: a ``View`` of items (a node, or a group of collapsed nodes) and edges.

``around(graph, node_id, depth)`` keeps the nodes within ``depth`` edges
of a node (either direction); ``collapse(view, max_nodes)`` shrinks a view
that is too big, in this order, until it fits:

1. chains: a run of nodes each handing its gradient to exactly one next
   node, which gets it from nobody else (``mul9 -> mul8 -> ... -> mul0``),
   becomes its first node, one item for the middle, and its last node
   (whole chains become one item only when that is not enough);
2. repeated siblings: items with the same op and the same neighbours on
   both sides (the branches of a fan-out, the heads of a layer) become one
   item;
3. if it still does not fit, the items farthest from the roots (breadth
   first) become one "more nodes" item.

Every collapse is described in ``View.notes`` so the picture says what it
hides. Edges follow the gradient: from a node to its next nodes.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.graphs.model import ensure_consumers


@dataclass(eq=False)
class Item:
    #: The graph nodes it stands for (one for a plain node).
    nodes: list
    #: ``node``, ``chain``, ``siblings`` or ``rest``.
    kind: str = "node"
    #: Edges to nodes outside the view (``around``): drawn as a dashed border with a count.
    hidden_edges: int = 0

    @property
    def single(self) -> bool:
        return self.kind == "node"


@dataclass
class View:
    items: list[Item]
    #: Which item each shown node belongs to.
    item_of: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def edges(self) -> dict[tuple[Item, Item], int]:
        """(from item, to item) -> how many graph edges it stands for (edges inside an item left out)."""
        out: dict = {}
        for it in self.items:
            for n in it.nodes:
                for e in n.next:
                    if e is None:
                        continue
                    tgt = self.item_of.get(e.node)
                    if tgt is not None and tgt is not it:
                        out[(it, tgt)] = out.get((it, tgt), 0) + 1
        return out


def whole(graph) -> View:
    v = View([Item([n]) for n in graph.nodes])
    v.item_of = {it.nodes[0]: it for it in v.items}
    return v


def around(graph, node_id: str, depth: int) -> View:
    """The nodes within ``depth`` edges of ``node_id`` (following next edges and consumers)."""
    start = graph.by_id.get(node_id)
    if start is None:
        raise RequestError(f"no node {node_id!r} in {graph.source}", "around")
    ensure_consumers(graph)
    dist = {start: 0}
    q = deque([start])
    while q:
        n = q.popleft()
        if dist[n] >= depth:
            continue
        for m in [e.node for e in n.next if e is not None] + [c for c, _ in n.consumers]:
            if m not in dist:
                dist[m] = dist[n] + 1
                q.append(m)
    keep = [n for n in graph.nodes if n in dist]
    v = View([Item([n]) for n in keep])
    v.item_of = {it.nodes[0]: it for it in v.items}
    hidden_total = 0
    for it in v.items:
        n = it.nodes[0]
        neigh = [e.node for e in n.next if e is not None] + [c for c, _ in n.consumers]
        it.hidden_edges = sum(1 for m in neigh if m not in dist)
        hidden_total += it.hidden_edges
    v.notes.append(f"{len(keep)} of {len(graph.nodes)} nodes: those within {depth} edges of {node_id}"
                   + (f"; {hidden_total} edges to nodes not shown (dashed borders)" if hidden_total else ""))
    return v


def _neighbours(v: View):
    succ: dict = {it: set() for it in v.items}
    pred: dict = {it: set() for it in v.items}
    for (a, b) in v.edges():
        succ[a].add(b)
        pred[b].add(a)
    return succ, pred


def _merge(v: View, groups: list[list[Item]], kind: str) -> tuple[int, int]:
    """Replace each group of items by one item of ``kind`` (at the place of its first item)."""
    first: dict = {}
    gone = set()
    for g in groups:
        nodes = [n for it in g for n in it.nodes]
        new = Item(nodes, kind, sum(it.hidden_edges for it in g))
        first[g[0]] = new
        gone.update(g[1:])
        for n in nodes:
            v.item_of[n] = new
    v.items = [first.get(it, it) for it in v.items if it not in gone]
    return len(groups), sum(len(it.nodes) for g in groups for it in g)


def _chains(v: View, keep_ends: bool) -> tuple[int, int]:
    """Collapse chains (see the module docstring); with ``keep_ends`` a chain's first and last node stay."""
    succ, pred = _neighbours(v)
    link = {a: next(iter(succ[a])) for a in v.items if len(succ[a]) == 1 and len(pred[next(iter(succ[a]))]) == 1}
    heads = [a for a in link if not any(a in succ[p] and p in link for p in pred[a])]
    groups = []
    for h in heads:
        chain = [h]
        while chain[-1] in link and len(chain) <= len(v.items):
            chain.append(link[chain[-1]])
        if keep_ends:
            chain = chain[1:-1]
        if len(chain) >= (2 if keep_ends else 3):
            groups.append(chain)
    return _merge(v, groups, "chain")


def _signature(it: Item) -> tuple:
    return tuple(sorted(Counter(n.name for n in it.nodes).items()))


def _siblings(v: View) -> tuple[int, int]:
    succ, pred = _neighbours(v)
    by_key: dict = {}
    for it in v.items:
        key = (_signature(it), frozenset(map(id, succ[it])), frozenset(map(id, pred[it])))
        by_key.setdefault(key, []).append(it)
    return _merge(v, [g for g in by_key.values() if len(g) >= 2], "siblings")


def collapse(v: View, max_nodes: int, roots: list) -> View:
    """Shrink ``v`` to at most ``max_nodes`` items (see the module docstring); notes say what was done."""
    if len(v.items) <= max_nodes:
        return v
    before = len(v.items)
    keep_ends = True
    while len(v.items) > max_nodes:
        chains, _ = _chains(v, keep_ends)
        if len(v.items) <= max_nodes:
            break
        siblings, _ = _siblings(v)
        if not chains and not siblings:
            if not keep_ends:
                break
            keep_ends = False  # stalled: whole chains may go, ends included
    for kind, what in (("chain", "in chains (one next node each)"),
                       ("siblings", "repeated as siblings (same op, same neighbours)")):
        groups = [it for it in v.items if it.kind == kind]
        if groups:
            v.notes.append(f"{sum(len(it.nodes) for it in groups)} nodes {what} drawn as {len(groups)} "
                           f"box{'es' if len(groups) > 1 else ''}")
    if len(v.items) > max_nodes:
        order = _bfs_order(v, roots)
        rest = order[max_nodes - 1:]
        count = sum(len(it.nodes) for it in rest)
        _merge(v, [rest], "rest")
        v.notes.append(f"{count} nodes farthest from the roots drawn as one box (draw less with --around)")
    v.notes.append(f"{before} boxes collapsed to {len(v.items)} (--max-nodes {max_nodes})")
    return v


def _bfs_order(v: View, roots: list) -> list[Item]:
    succ, _ = _neighbours(v)
    seen: dict = {}
    q = deque(v.item_of[r] for r in roots if r in v.item_of)
    for it in q:
        seen[it] = None
    while q:
        it = q.popleft()
        for nxt in sorted(succ[it], key=lambda x: x.nodes[0].index):
            if nxt not in seen:
                seen[nxt] = None
                q.append(nxt)
    order = list(seen)
    order += [it for it in v.items if it not in seen]
    return order
