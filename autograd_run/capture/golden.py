"""Golden orders of real PyTorch: its executed order of a captured backward, kept in a file and compared.

A *golden order* is PyTorch's own executed order of a model's backward pass
(captured by ``capture.from_torch``, which runs PyTorch's backward once with
a pre-hook on every node), written as an order file (``traces.order``):
one JSON object per executed node with the fields ``run --order-out``
writes (``position``, ``id``, ``name``, ``seq``, ``device``, ``thread``,
``depth``, ``graph_task``, ``pass``) and three more:

``nth``      the node's rank by sequence number among the captured graph's
             nodes of its name, counted from the loss (0: the last such node
             the forward created, the first the backward reaches;
             ``AddmmBackward0 #2`` is the third linear layer from the output);
             null for leaves;
``leaf``     the leaf's name for an AccumulateGrad node (a parameter name
             when names were given, else ``leaf<k>``); null otherwise;
``torch``    the PyTorch version that recorded the order.

``id`` is the node's id in the captured graph (``n<k>``, its position in the
graph walk), so a golden order written beside a captured graph file is also
a golden for ``run GRAPH --no-multithreading --expect-order``. ``seq`` is the
absolute sequence number, as information only.

Comparing: two orders are compared position by position by *node identity*
``(name, nth, leaf)``. PyTorch's sequence numbers count every autograd
node a thread has created, so the same model gets other absolute numbers in
another process or after other tests; the rank of a node among its own
graph's nodes of the same name does not change, and it rests on PyTorch's
own facts (names and its scheduling key), not on this package's graph walk
(which ``id`` depends on). Ranking within a name rather than over the whole
graph, and counting from the loss, keeps a change local: one more
multiplication, or a ReLU made a GELU, shifts only the ranks of that name's
nodes created before it in the forward, which the backward reaches after
it, so the first divergence is where the backward reaches the change, not
at the root. A leaf's AccumulateGrad node has no rank (PyTorch gives all of
them the largest number) and is known by its leaf's name.

On a divergence, ``explain`` replays the captured graph's structure on this
package's engine and reports the ready set at the pop that went differently
(the queue pops the largest (reentrant depth, seq)), and why the expected
node was not popped: not in the graph any more, ready with a lower
priority, or still waiting for gradients from named nodes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from autograd_run.errors import AutogradRunError, RequestError
from autograd_run.outputs import atomic_write
from autograd_run.text import md_section, visible
from autograd_run.traces.order import Divergence, dumps_order, first_divergence, node_label, read_order

ACC = "torch::autograd::AccumulateGrad"
#: The fields a golden order adds to an order file's rows.
GOLDEN_FIELDS = ("nth", "leaf", "torch")
_MAX_SEQ = 2**64 - 1


# -- capturing ---------------------------------------------------------------------------------

@dataclass
class Captured:
    """One capture: the graph document (structure only unless captured with values) and PyTorch's order."""

    doc: dict
    rows: list[dict]

    @property
    def torch(self) -> str:
        return str(self.doc["meta"]["reference"].get("torch", "?"))


def capture_order(outputs, names: Mapping[str, Any] | None = None, inputs: Sequence | None = None,
                  grad_outputs: Sequence | None = None, mode: str | None = None) -> Captured:
    """PyTorch's executed order of ``outputs``' backward (``backward``, or ``grad`` for ``inputs``).

    The graph is captured without saved values (fast; see ``capture``); the
    leaves keep their ``.grad`` and the graph is retained, so the test can
    go on with it.
    """
    from autograd_run.capture import from_torch
    doc = from_torch(outputs, inputs, grad_outputs=grad_outputs, names=names, mode=mode, values=False)
    return Captured(doc, golden_rows(doc))


def golden_rows(doc: dict, thread: str | None = None) -> list[dict]:
    """PyTorch's order in a captured graph document (``meta.reference.order``) as golden rows.

    ``thread`` is the thread that ran PyTorch's backward (default: this one;
    the capture runs it with multithreading off on the calling thread).
    """
    ref = (doc.get("meta") or {}).get("reference")
    if not isinstance(ref, dict) or "order" not in ref:
        raise ValueError("the graph has no PyTorch reference order (capture it with reference=True)")
    thread = thread or threading.current_thread().name
    ops = [n for n in doc["nodes"] if "variable" not in n]
    rank = nth_of(doc)
    by_seq: dict[tuple, list[dict]] = {}
    for n in ops:
        by_seq.setdefault((n["name"], n["seq"]), []).append(n)
    by_leaf = {n["variable"]: n for n in doc["nodes"] if "variable" in n}
    rows = []
    for name, seq, leaf in ref["order"]:
        node = by_leaf.get(leaf) if leaf is not None else (by_seq.get((name, seq)) or [None]).pop(0)
        if node is None:
            raise ValueError(f"PyTorch ran a node the capture did not see: {name} (seq {seq})")
        rows.append({"position": len(rows), "id": node["id"], "name": name, "seq": seq,
                     "device": _device(node), "thread": thread, "depth": 0, "graph_task": 0, "pass": 0,
                     "nth": rank.get(node["id"]), "leaf": leaf, "torch": str(ref.get("torch", "?"))})
    return rows


def _device(node: dict) -> str:
    """The device a node runs on, as the graph loader derives it: its first non-CPU input's, else the CPU."""
    for m in node.get("inputs") or ():
        dev = m.get("device") or "cpu"
        if dev != "cpu":
            return dev
    return "cpu"


# -- identity and labels -------------------------------------------------------------------------

def node_key(row: Mapping) -> tuple:
    """A node's identity across processes: ``(name, nth, leaf)``."""
    return (row.get("name"), row.get("nth"), row.get("leaf"))


def label(row: Mapping | None) -> str:
    """``AddmmBackward0 #12`` (an op and its rank) or ``AccumulateGrad(fc.weight)``; made visible."""
    return node_label(row)


def nth_of(doc: dict) -> dict[str, int]:
    """Each op node's rank among the document's nodes of its name, the largest sequence number first
    (ties, from a forward on several threads: walk order)."""
    out: dict[str, int] = {}
    count: dict[str, int] = {}
    ops = [(n["seq"], k, n) for k, n in enumerate(doc["nodes"]) if "variable" not in n]
    for _, _, n in sorted(ops, key=lambda t: (-t[0], t[1])):
        out[n["id"]] = count.get(n["name"], 0)
        count[n["name"]] = out[n["id"]] + 1
    return out


def doc_keys(doc: dict) -> dict[str, dict]:
    """Every node of a captured document (by id) as a row-like ``{name, nth, leaf, seq}``."""
    nth = nth_of(doc)
    return {n["id"]: ({"name": n["name"], "nth": None, "leaf": n["variable"], "seq": _MAX_SEQ} if "variable" in n
                      else {"name": n["name"], "nth": nth[n["id"]], "leaf": None, "seq": n["seq"]})
            for n in doc["nodes"]}


# -- golden files ---------------------------------------------------------------------------------

@dataclass
class Golden:
    path: str
    rows: list[dict]

    @property
    def torch(self) -> str | None:
        return next((str(r["torch"]) for r in self.rows if r.get("torch") is not None), None)


def read_golden(path: str, option: str = "expected_order") -> Golden:
    """A golden order file; ``RequestError`` (naming ``option``) when it is not one."""
    rows = read_order(path)
    for n, row in enumerate(rows, 1):
        if "nth" not in row and "leaf" not in row:
            raise RequestError(f"{path}: row {n}: no 'nth' or 'leaf': not a golden order of PyTorch "
                               "(write one with `autograd-run capture SCRIPT --order-out FILE`)", option)
        rel, leaf = row.get("nth"), row.get("leaf")
        if rel is not None and (isinstance(rel, bool) or not isinstance(rel, int) or rel < 0):
            raise RequestError(f"{path}: row {n}: 'nth' must be a non-negative integer or null", option)
        if leaf is not None and not isinstance(leaf, str):
            raise RequestError(f"{path}: row {n}: 'leaf' must be a string or null", option)
        if (rel is None) == (leaf is None):
            raise RequestError(f"{path}: row {n}: exactly one of 'nth' (an op) and 'leaf' (a leaf) is set", option)
        if not isinstance(row.get("name"), str):
            raise RequestError(f"{path}: row {n}: 'name' must be a string", option)
        if row.get("pass", 0) != 0:
            raise RequestError(f"{path}: row {n}: a golden order of PyTorch has one pass", option)
        if row.get("torch") is not None and not (isinstance(row["torch"], str) and len(row["torch"]) <= 100):
            raise RequestError(f"{path}: row {n}: 'torch' (the PyTorch version that recorded it) must be a string "
                               "of at most 100 characters or null", option)
    return Golden(path, rows)


def write_golden(path: str, rows: list[dict], option: str = "order_out") -> None:
    """Write golden rows atomically (a temporary file beside ``path`` renamed into place)."""
    atomic_write(path, dumps_order(rows), option)


# -- comparing -------------------------------------------------------------------------------------

@dataclass
class OrderCheck:
    """PyTorch's order now against a golden one."""

    golden: Golden
    captured: Captured
    divergence: Divergence | None
    #: What explains the divergence (overall difference, ready set, why the expected node was not popped).
    explanation: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.divergence is None

    @property
    def torch_note(self) -> str | None:
        """A line saying the golden was recorded with another PyTorch, or None."""
        g, now = self.golden.torch, self.captured.torch
        if g is not None and g != now:
            return visible(f"the golden order was recorded with PyTorch {g}; this is PyTorch {now}")
        return None

    def lines(self) -> list[str]:
        """The divergence, what explains it and the version note, each line made visible."""
        out = []
        d = self.divergence
        if d is not None:
            before = self.golden.rows[d.position - 1] if 0 < d.position <= len(self.golden.rows) else None
            after = f" (after {label(before)})" if before is not None else ""
            out.append(f"order differs at position {d.position}{after}: expected {label(d.expected)}, "
                       f"got {label(d.got)}")
            out += [visible(x) for x in self.explanation]
        if self.torch_note:
            out.append("note: " + self.torch_note)
        return out

    def describe(self) -> str:
        return "\n".join(self.lines())

    def markdown(self, header: list[str]) -> str:
        """A Markdown section for a CI job summary: ``header`` lines (test, files), then the description."""
        return md_section("Backward order differs from the golden", header + [""] + self.lines())


def compare(golden: Golden, captured: Captured, explain_it: bool = True) -> OrderCheck:
    """The first position where PyTorch's order now differs from the golden (by node identity)."""
    d = first_divergence(golden.rows, captured.rows, None, key=node_key)
    check = OrderCheck(golden, captured, d)
    if d is not None and explain_it:
        check.explanation = explain(golden.rows, captured, d)
    return check


def explain(golden_rows: list[dict], captured: Captured, d: Divergence) -> list[str]:
    """What changed overall, then the ready set our engine computes at the divergent pop."""
    lines = []
    now_keys = {node_key(r) for r in captured.rows}
    gold_keys = {node_key(r) for r in golden_rows}
    lines.append(f"golden: {len(golden_rows)} nodes run, now: {len(captured.rows)}")
    for what, rows, other in (("only in the golden", golden_rows, now_keys),
                              ("only now", captured.rows, gold_keys)):
        missing = [label(r) for r in rows if node_key(r) not in other]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            lines.append(f"{what}: {', '.join(missing[:5])}{more}")
    if d.got is None:
        lines.append(f"PyTorch's order ends there; the golden has {len(golden_rows) - d.position} more node(s)")
        return lines
    return lines + ready_set(captured, d, golden_rows)


def _census(row: Mapping, rows: list[dict]) -> str:
    """How many nodes of ``row``'s name ran (``3 ReluBackward0``), or whether its leaf's node ran."""
    if row.get("leaf") is not None:
        ran = any(r.get("leaf") == row["leaf"] for r in rows)
        return visible(f"{'an' if ran else 'no'} AccumulateGrad node of {row['leaf']}")
    return visible(f"{sum(r.get('name') == row.get('name') for r in rows)} {row.get('name')}")


def structure_only(doc: dict) -> dict:
    """A captured document without values: every op opaque, root gradients of ones (the order is the same)."""
    nodes = []
    for n in doc["nodes"]:
        m = {k: v for k, v in n.items() if k not in ("saved", "op", "attrs")}
        if "variable" not in n:
            m["op"] = "opaque"
        nodes.append(m)
    rest = {k: v for k, v in doc.items() if k not in ("nodes", "roots", "meta")}
    return {**rest, "roots": [{**r, "grad": "ones"} for r in doc["roots"]], "nodes": nodes}


def replay(doc: dict):
    """Replay a captured document's structure on the engine (multithreading off); the order records, with ready sets."""
    from autograd_run.engine import Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.record.order_recorder import OrderRecorder
    graph = loads_graph(dumps(structure_only(doc), "json"), source="<captured graph>.json")
    rec = OrderRecorder(snapshots=True)
    engine = Engine(tracer=rec, multithreading=False)
    try:
        run_graph(engine, graph, GraphState(graph), retain_graph=True)
    finally:
        engine.shutdown(timeout=5)
    return rec.executed()


def ready_set(captured: Captured, d: Divergence, golden_rows: list[dict]) -> list[str]:
    """The ready set at pop ``d.position`` as our engine computes it, and why the expected node was not popped."""
    p = d.position
    try:
        ours = replay(captured.doc)
    except AutogradRunError as exc:
        return [f"(no ready set: the engine could not replay the captured graph: {exc})"]
    keys = doc_keys(captured.doc)
    id_of = {node_key(v): k for k, v in keys.items()}
    now = [node_key(r) for r in captured.rows]
    for q in range(min(p + 1, max(len(ours), len(now)))):
        mine = node_key(keys[ours[q].node_id]) if q < len(ours) else None
        theirs = now[q] if q < len(now) else None
        if mine != theirs:
            return [f"(no ready set: this engine's replay departs from PyTorch's order at position {q}; "
                    "`autograd-run capture SCRIPT --check` compares them)"]
    ready = ours[p].ready
    lines = ["ready set at that pop, as this engine computes it (node, reentrant depth, seq; "
             "the queue pops the largest (depth, seq)):"]
    if not ready:
        lines.append("  (not recorded at that pop)")
    for k, (nid, depth, seq) in enumerate(ready):
        seq_text = "max (AccumulateGrad)" if seq == _MAX_SEQ else str(seq)
        mark = "  <- popped" if k == 0 else ""
        lines.append(f"  {label(keys.get(nid, {'name': nid})):<36} depth {depth:<3} seq {seq_text}{mark}")
    e = d.expected
    if e is None:
        return lines
    want = node_key(e)
    nid = id_of.get(want)
    if nid is None:
        lines.append(f"{label(e)} is not in the graph now: {_census(e, golden_rows)} ran in the golden, "
                     f"{_census(e, captured.rows)} now")
    elif any(r[0] == nid for r in ready):
        lines.append(f"{label(e)} was ready too, with a lower priority: PyTorch ran {label(d.got)} first")
    elif nid in {r.node_id for r in ours[:p]}:
        lines.append(f"{label(e)} had run already, earlier than in the golden order")
    else:
        ran = {r.node_id for r in ours[:p]}
        runs = {r.node_id for r in ours}
        waiting = [label(keys[n["id"]]) for n in captured.doc["nodes"] if n["id"] in runs and n["id"] not in ran
                   and any(edge and edge[0] == nid for edge in n.get("next") or ())]
        if waiting:
            more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
            lines.append(f"{label(e)} was not ready: it still waited for gradients from "
                         f"{', '.join(waiting[:3])}{more}")
        else:
            lines.append(f"{label(e)} was not ready at that pop (PyTorch does not run it now)")
    return lines
