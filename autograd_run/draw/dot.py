"""The DOT text of a graph picture, written by our own code (Graphviz only lays it out).

Labelled as torchviz labels a backward graph: each node a grey box with
its op name and id; the variables (leaves) as light blue boxes with their
shape, below the AccumulateGrad node that feeds them; each root's output
as a green box above the node it enters; with ``saved``, each saved value
as an orange box beside its node. Edges follow the gradient, from a node
to its next nodes. Nodes sit in one cluster per device, and per stream
when a device has several.

With a ``Colouring`` the nodes are filled by value on a ``Scale`` (its
colour bar drawn in the picture), the critical path is drawn bold, and
each node's tooltip lists its times.

Nothing from the graph file is ever a DOT identifier (nodes are ``n0``,
``n1``, ...); ids, names and values appear only inside quoted strings,
escaped by ``text``: control characters made visible, backslashes and
quotes escaped, and ``& < >`` written as entities, so a hostile id can
neither end a string nor inject markup into the SVG Graphviz makes of it.
"""

from __future__ import annotations

from collections import Counter

from autograd_run.draw.colors import Scale, text_colour
from autograd_run.draw.view import Item, View
from autograd_run.ops import ACCUMULATE_GRAD
from autograd_run.text import visible

#: Longest text shown for one label line (ids and values past it are cut with an ellipsis).
MAX_TEXT = 60


def text(s, limit: int = MAX_TEXT) -> str:
    """``s`` as the inside of a DOT quoted string (one label line)."""
    s = str(s)
    if len(s) > limit:
        s = s[:limit - 1] + "…"
    s = visible(s)
    s = s.replace("\\", "\\\\").replace('"', '\\"')
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def lines(*parts, limit: int = MAX_TEXT, left: bool = False) -> str:
    """A quoted DOT string of several lines (each escaped; ``left``: each line left-justified)."""
    if left:
        return '"' + "".join(text(p, limit) + "\\l" for p in parts) + '"'
    return '"' + "\\n".join(text(p, limit) for p in parts) + '"'


def _attrs(**kw) -> str:
    """``[k=v, ...]``; values are already quoted DOT strings or plain numbers/words."""
    return "[" + ", ".join(f"{k}={v}" for k, v in kw.items() if v is not None) + "]"


def shape_text(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _saved_text(name: str, value) -> str:
    if isinstance(value, dict):
        if "shape" in value:
            return f"{name}\n{shape_text(value['shape'])}"
        if "data" in value:
            return f"{name}\n{shape_text(_nested_shape(value['data']))}"
        if "npz" in value:
            return f"{name}\n(npz {value['npz']})"
        return f"{name}\n(tensor)"
    return f"{name} = {value!r}"


def _nested_shape(v) -> tuple:
    shape = []
    while isinstance(v, list):
        shape.append(len(v))
        v = v[0] if v else None
    return tuple(shape)


def _item_label(it: Item) -> list[str]:
    n = it.nodes
    if it.single:
        return [n[0].name, n[0].id]
    if it.kind == "rest":
        return [f"{len(n)} more nodes", "(not drawn)"]
    ops = Counter(x.name for x in n).most_common()
    if len(ops) == 1:
        head = f"{ops[0][0]} ×{len(n)}"
    else:
        head = f"{len(n)} nodes: " + ", ".join(f"{k} ×{c}" for k, c in ops[:2]) + (" ..." if len(ops) > 2 else "")
    kind = "chain" if it.kind == "chain" else "repeated"
    return [head, f"{kind}: {n[0].id} … {n[-1].id}"]


def _device(it: Item) -> tuple[str, int] | None:
    keys = {(str(n.device), n.stream) for n in it.nodes}
    devs = {k[0] for k in keys}
    if len(devs) != 1:
        return None
    return next(iter(devs)), (next(iter(keys))[1] if len(keys) == 1 else -1)


def to_dot(graph, view: View, colouring=None, *, saved: bool = False, log: bool = False,
           title: str | None = None) -> str:
    """The picture of ``view`` (see the module docstring) as DOT text."""
    names = {it: f"n{k}" for k, it in enumerate(view.items)}
    scale = None
    if colouring is not None:
        values = [colouring.value_of(it.nodes) for it in view.items if it.kind != "rest"]
        scale = Scale.for_values(colouring.kind, [v for v in values if v is not None], log, colouring.title)
    crit = colouring.critical if colouring is not None else set()
    bold = set()  # (from item, to item) of critical-path edges
    if colouring is not None:
        pairs = set(zip(colouring.path, colouring.path[1:]))
        for n in graph.nodes:
            for e in n.next:
                if e is not None and (n.id, e.node.id) in pairs:
                    a, b = view.item_of.get(n), view.item_of.get(e.node)
                    if a is not None and b is not None:
                        bold.add((a, b))
    out = ["digraph autograd {"]
    head = [title or f"backward graph {graph.source}"] + view.notes
    if colouring is not None and crit:
        head.append("bold: the critical path")
    out.append(f"  graph {_attrs(rankdir='TB', newrank='true', ranksep='0.35', nodesep='0.25', fontname='Helvetica', fontsize='11', labelloc='t', labeljust='l', label=lines(*head, limit=200, left=True))};")
    out.append('  node [shape=box, style="filled", fillcolor="lightgrey", fontname="Helvetica", fontsize=10, '
               'height=0.2, margin="0.08,0.04"];')
    out.append("  edge [arrowsize=0.6];")

    clusters: dict = {}
    loose: list = []
    for it in view.items:
        dev = _device(it)
        (clusters.setdefault(dev[0], {}).setdefault(dev[1], []) if dev else loose).append(it)

    def node_lines(it: Item, indent: str) -> list[str]:
        name = names[it]
        ids = it.nodes
        attrs = {"label": lines(*_item_label(it))}
        tip = [f"{ids[0].id} ({ids[0].name})" if it.single else _item_label(it)[0]]
        tip.append(f"device {ids[0].device}" + (f", stream {ids[0].stream}" if ids[0].stream else ""))
        style = ["filled"]
        if not it.single:
            style.append("rounded")
            attrs["peripheries"] = "2"
        if it.hidden_edges:
            style.append("dashed")
            tip.append(f"{it.hidden_edges} edges to nodes not shown")
        if scale is not None:
            v = colouring.value_of(ids) if it.kind != "rest" else None
            fill = scale.colour(v) if it.kind != "rest" else "#d3d3d3"
            attrs["fillcolor"] = f'"{fill}"'
            attrs["fontcolor"] = f'"{text_colour(fill)}"'
            if it.single:
                tip += colouring.details.get(ids[0].id, ["no time in this input"])
            elif v is not None:
                tip.append(f"{colouring.title}: {scale.label(v)} over {len(ids)} nodes")
            if any(n.id in crit for n in ids):
                attrs["penwidth"] = "3"
                tip.append("on the critical path")
        attrs["style"] = '"' + ",".join(style) + '"'
        attrs["tooltip"] = lines(*tip, limit=200)
        res = [f"{indent}{name} {_attrs(**attrs)};"]
        if it.single:
            n = ids[0]
            if n.op is ACCUMULATE_GRAD and n.variable in graph.variables:
                var = graph.variables[n.variable]
                res.append(f'{indent}{name}_var {_attrs(label=lines(var.name, shape_text(var.shape)), fillcolor="lightblue", tooltip=lines("variable " + var.name, f"{var.dtype} {shape_text(var.shape)} on {var.device}", limit=200))};')
                res.append(f"{indent}{name} -> {name}_var;")
            if saved and n.saved:
                for j, (k, v) in enumerate(n.saved.items()):
                    t = _saved_text(k, v).split("\n")
                    res.append(f'{indent}{name}_s{j} {_attrs(label=lines(*t), fillcolor="orange", tooltip=lines("saved " + k + " of " + n.id, limit=200))};')
                    res.append(f'{indent}{name}_s{j} -> {name} [style=dashed, arrowhead=none];')
        return res

    for k, (dev, streams) in enumerate(sorted(clusters.items())):
        out.append(f"  subgraph cluster_d{k} {{")
        out.append(f'    graph [label={lines(dev)}, style="rounded", color="grey60", fontcolor="grey30"];')
        split = len(streams) > 1
        for j, (stream, items) in enumerate(sorted(streams.items())):
            indent = "    "
            if split:
                out.append(f"    subgraph cluster_d{k}_s{j} {{")
                label = "mixed streams" if stream < 0 else f"stream {stream}"
                out.append(f'      graph [label={lines(label)}, style="dashed", color="grey70"];')
                indent = "      "
            for it in items:
                out += node_lines(it, indent)
            if split:
                out.append("    }")
        out.append("  }")
    for it in loose:
        out += node_lines(it, "  ")

    for k, root in enumerate(graph.roots):
        tgt = view.item_of.get(root.edge.node)
        if tgt is None:
            continue
        meta = root.edge.node.inputs[root.edge.input_nr] if root.edge.input_nr < len(root.edge.node.inputs) else None
        label = ["output" if len(graph.roots) == 1 else f"output {k}"]
        if meta is not None:
            label.append(shape_text(meta.shape))
        out.append(f'  o{k} {_attrs(label=lines(*label), fillcolor="darkolivegreen1", tooltip=lines("root gradient into " + root.edge.node.id, limit=200))};')
        out.append(f"  o{k} -> {names[tgt]};")

    for (a, b), count in view.edges().items():
        attrs = {}
        if count > 1:
            attrs["label"] = lines(f"×{count}")
            attrs["fontsize"] = "9"
        if (a, b) in bold:
            attrs["penwidth"] = "3"
        out.append(f"  {names[a]} -> {names[b]}" + (f" {_attrs(**attrs)}" if attrs else "") + ";")

    if scale is not None:
        out.append(f"  legend [shape=plaintext, style=\"\", label={scale.bar()}];")
        out.append("  { rank=sink; legend; }")
    out.append("}")
    return "\n".join(out) + "\n"
