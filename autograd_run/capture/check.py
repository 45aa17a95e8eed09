"""Check a replay against the PyTorch reference stored in a captured graph.

``check_graph(graph)`` replays the graph with multithreading off and compares
(1) the executed order with ``meta.reference.order`` (name, sequence number,
leaf; the first divergence is reported; then each node's reentrant depth
with ``meta.reference.depths`` where capture recorded them) and (2) each leaf's gradient with the
reference (max absolute and relative error; complex gradients as complex).

Tolerances follow the lowest precision on the way to each leaf: a float64
model that computes a norm in float32 has float32 gradients on that path, so
its leaves are compared at float32's tolerance. Each leaf's tolerance and the
dtype it comes from are in the report. ``rtol``/``atol`` override them.

Ops without a rule (opaque nodes) compute zeros, so a leaf reached through
one cannot be compared: it is reported as not compared, naming the opaque
node, and the check fails unless ``allow_opaque`` (the order is still
compared; so are the leaves no opaque node leads to).

A gradient that differs in a graph whose capture saw hooks (``meta.hooks``)
gets a note naming them: PyTorch's gradients include their effect, the
replay's cannot.

The reference is part of an untrusted file: the loader refuses a malformed
one (``graphs.validate``) with a ``GraphFileError`` naming the place
(``$.meta.reference.order[3]``), before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autograd_run.engine import Engine, GraphState
from autograd_run.engine.run import run_graph
from autograd_run.errors import BackwardError, GraphFileError
from autograd_run.graphs import tensors
from autograd_run.graphs.model import Graph
from autograd_run.ops import OPAQUE
from autograd_run.traces.order import first_divergence
from autograd_run.record.order_recorder import OrderRecorder

#: Default tolerances by dtype: (rtol, atol).
TOLERANCE = {"float64": (1e-6, 1e-9), "float32": (1e-4, 1e-6), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 5e-3),
             "complex128": (1e-6, 1e-9), "complex64": (1e-4, 1e-6)}
#: The absolute tolerance's floor as a share of the largest gradient that the node computing a leaf's gradient
#: gives any of its leaves (``_sibling_scale``), by dtype. A leaf whose gradient is zero in exact arithmetic (a
#: BatchNorm's bias feeding another BatchNorm in training mode: the mean taken out cancels it) comes out as the
#: rounding of a sum of the terms that node sums, in PyTorch and here alike (2e-7 against 1e-8 beside that
#: BatchNorm's weight gradient of 2e8, in float64, on torchvision's mnasnet and efficientnet_v2): no fixed atol
#: tells that from an error. The same node's other leaf (the weight beside the bias) sums the same terms, so
#: its size is the scale; an unrelated branch's size is not (a branch of 1e-5 gradients beside one of 1e9
#: keeps a tight floor). 1e-12 of the largest entry is the OpInfo pass's float64 bound too.
ATOL_SHARE = {"float64": 1e-12, "complex128": 1e-12, "float32": 1e-5, "complex64": 1e-5, "float16": 1e-2,
              "bfloat16": 5e-2}
#: Precision rank of each dtype (lower: less precise) and the real dtype of that precision.
_RANK = {"bfloat16": 0, "float16": 1, "float32": 2, "complex64": 2, "float64": 3, "complex128": 3}
_BY_RANK = {0: "bfloat16", 1: "float16", 2: "float32", 3: "float64"}


@dataclass
class GradCheck:
    name: str
    max_abs: float | None
    max_rel: float | None
    ok: bool
    note: str = ""
    #: The tolerances used, and the lowest-precision dtype on the way to the leaf that chose them.
    rtol: float | None = None
    atol: float | None = None
    precision: str | None = None
    #: False when the gradient could not be compared (an opaque node leads to the leaf).
    compared: bool = True
    #: It passed only on the atol floor (``ATOL_SHARE``): the gradient size it was scaled from.
    rounding_of: float | None = None


@dataclass
class CheckReport:
    order_ok: bool
    order_len: tuple[int, int]
    divergence: dict | None
    grads: list[GradCheck] = field(default_factory=list)
    #: True when every leaf's gradient was compared.
    grads_compared: bool = True
    note: str = ""
    #: Opaque nodes (ids) in the graph, and whether they were accepted (``allow_opaque``).
    opaque: list[str] = field(default_factory=list)
    allow_opaque: bool = False

    @property
    def ok(self) -> bool:
        compared_ok = all(g.ok for g in self.grads if g.compared)
        return self.order_ok and compared_ok and (self.allow_opaque or self.grads_compared)


def check_graph(graph: Graph, rtol: float | None = None, atol: float | None = None,
                allow_opaque: bool = False, allow_python: bool = False) -> CheckReport:
    order, ref_grads = read_reference(graph)
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=False, allow_python=allow_python)
    try:
        res = run_graph(eng, graph, GraphState(graph), retain_graph=True, allow_unused=True)
    except BackwardError as exc:  # which node, as `run` says it (the engine's message names only what went wrong)
        if exc.node_id is None:
            raise
        named = BackwardError(f"the replay failed at node {exc.node_id!r} ({exc.node_name}): {exc}", exc.node_id,
                              exc.node_name)
        raise named from exc.__cause__
    acc_var = {n.id: n.variable for n in graph.nodes}
    got = [[r.name, r.seq, acc_var.get(r.node_id)] for r in rec.executed()]
    d = first_divergence(order, got)
    divergence = None if d is None else {"position": d.position, "expected": d.expected, "got": d.got}
    if divergence is None:
        divergence = _depth_divergence(graph, order, [r.depth for r in rec.executed()])
    report = CheckReport(divergence is None, (len(order), len(got)), divergence, allow_opaque=allow_opaque)
    report.opaque = [n.id for n in graph.nodes_of(OPAQUE)]
    precision, through_opaque = _paths(graph)
    leaf_node = {n.variable: n for n in graph.nodes if n.variable is not None}
    fed = {e.node for n in graph.nodes for e in n.next if e is not None} | {r.edge.node for r in graph.roots}
    refs = {}
    for name, spec in ref_grads.items():
        if spec is not None:
            refs[name] = _reference_array(graph, name, spec)
    sizes = {name: _largest(t) for name, t in refs.items()}
    scale = _sibling_scale(graph, sizes)
    for name, spec in ref_grads.items():
        ours = res.grads.get(name)
        node = leaf_node.get(name)
        blocked = through_opaque.get(node) if node is not None else None
        if blocked is not None:
            report.grads.append(GradCheck(name, None, None, False, f"not compared: opaque node {blocked!r} "
                                          "(no rule) leads to it", compared=False))
            continue
        if report.opaque and spec is not None and ours is None and (node is None or node not in fed):
            # no edge of the graph reaches its AccumulateGrad: PyTorch's gradient came from a backward the graph
            # does not hold, one an opaque node ran inside its own (a Reformer-style Function calling backward)
            report.grads.append(GradCheck(name, None, None, False, "not compared: no node of the graph reaches it; "
                                          f"its gradient came from inside opaque node {report.opaque[0]!r}'s "
                                          "backward", compared=False))
            continue
        if spec is None or ours is None:
            ok = (spec is None) == (ours is None)
            report.grads.append(GradCheck(name, None, None, ok, "" if ok else
                                          ("reference has no gradient" if spec is None else "ours has no gradient")))
            continue
        report.grads.append(_compare(name, np.asarray(ours), refs[name], precision.get(node), rtol, atol,
                                     scale.get(name, 0.0)))
    for name in graph.variables:  # a leaf the replay gave a gradient that the reference does not hold
        node = leaf_node.get(name)
        if name not in ref_grads and res.grads.get(name) is not None and not (
                node is not None and through_opaque.get(node) is not None):
            report.grads.append(GradCheck(name, None, None, False, "the reference holds no gradient for it "
                                          "(meta.reference.grads has no entry)"))
    not_compared = [g.name for g in report.grads if not g.compared]
    if report.opaque:
        report.grads_compared = not not_compared
        report.note = (f"{len(report.opaque)} opaque node(s) without a rule ({', '.join(report.opaque[:5])}"
                       f"{', ...' if len(report.opaque) > 5 else ''}) compute zeros: gradients not compared for "
                       + (", ".join(not_compared) if not_compared else "no leaf (none is reached through them)"))
    if not all(g.ok for g in report.grads if g.compared):
        report.note = _hooks_note(graph) or report.note
    return report


def read_reference(graph: Graph) -> tuple[list[list], dict]:
    """``meta.reference``'s order (``[name, seq, leaf]`` items) and gradients (leaf -> spec or None).

    The loader checked their structure (``graphs.validate``); here only their presence.
    """
    ref = (graph.meta or {}).get("reference")
    if not isinstance(ref, dict) or "order" not in ref:
        raise GraphFileError(graph.source, "meta.reference", "no PyTorch reference in this graph "
                             "(capture it with `autograd-run capture`)")
    return ref["order"], ref.get("grads") or {}


def _reference_array(graph: Graph, name: str, spec) -> np.ndarray:
    """The reference gradient of leaf ``name`` as an array; a ``GraphFileError`` for a bad spec."""
    where = f"meta.reference.grads.{name}"

    def err(path, what):
        return GraphFileError(graph.source, where, what)
    try:
        tensors.check_tensor(spec, (), err, graph.side_files)
        return np.asarray(tensors.materialize(spec, graph.side_files))
    except GraphFileError:
        raise
    except Exception as exc:  # a spec the checks let through but numpy refuses: still the file's fault
        raise GraphFileError(graph.source, where, f"not a tensor: {type(exc).__name__}: {exc}") from None


def _sibling_scale(graph: Graph, sizes: dict[str, float]) -> dict[str, float]:
    """Leaf name -> the largest reference gradient among the leaves that the nodes computing its gradient feed
    (itself included): a conv's or BatchNorm's bias and weight, a shared parameter's every consumer's leaves."""
    producers: dict[str, list] = {}
    for n in graph.nodes:
        for e in n.next:
            if e is not None and e.node.variable is not None:
                producers.setdefault(e.node.variable, []).append(n)
    out = {}
    for name in sizes:
        sib = {e.node.variable for n in producers.get(name, ()) for e in n.next
               if e is not None and e.node.variable is not None}
        out[name] = max([sizes.get(v, 0.0) for v in sib] + [sizes[name]])
    return out


def _largest(t: np.ndarray) -> float:
    """The largest finite magnitude in a reference gradient (0 when none)."""
    with np.errstate(all="ignore"):
        m = np.abs(np.asarray(t, dtype=np.complex128 if np.iscomplexobj(t) else np.float64))
        m = m[np.isfinite(m)]
    return float(m.max()) if m.size else 0.0


def _compare(name: str, ours: np.ndarray, theirs: np.ndarray, precision: str | None, rtol, atol,
             largest: float = 0.0) -> GradCheck:
    """``ours`` against ``theirs`` elementwise: |ours - theirs| <= atol + rtol |theirs|, the atol at least
    ``ATOL_SHARE`` of ``largest`` (``_sibling_scale``) unless ``atol`` is given."""
    if ours.shape != theirs.shape:
        return GradCheck(name, None, None, False, f"shape {list(ours.shape)} != {list(theirs.shape)}")
    dtype = precision or _lowest(str(ours.dtype), str(theirs.dtype))
    r, a = TOLERANCE.get(dtype, (1e-4, 1e-6))
    base = a
    if atol is None:
        a = max(a, ATOL_SHARE.get(dtype, 1e-5) * largest)
    r, a = (rtol if rtol is not None else r), (atol if atol is not None else a)
    wide = np.complex128 if np.iscomplexobj(ours) or np.iscomplexobj(theirs) else np.float64
    with np.errstate(all="ignore"):
        o, t = ours.astype(wide), theirs.astype(wide)
        diff = np.abs(o - t)  # the modulus for complex values: real and imaginary parts both count
        scale = np.abs(t)
        same = (o == t) | (np.isnan(o) & np.isnan(t))  # equal infinities, NaN where PyTorch has NaN
        err = np.where(same, 0.0, diff)
        err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only: as far off as can be
        # relative to PyTorch's value where it is not 0 (elsewhere a relative error has no meaning: 1e-7 over a
        # reference of exactly 0 read as 1e+293; max_abs tells those)
        rel = np.where((err == 0) | (scale == 0), 0.0, err / np.where(scale == 0, 1.0, scale))
        rel = np.where(np.isnan(rel), np.inf, rel)
        max_abs = float(err.max()) if err.size else 0.0
        max_rel = float(rel.max()) if rel.size else 0.0
        ok = bool(np.all(same | (np.isfinite(err) & (err <= a + r * scale))))
        floor_only = ok and a > base and not bool(np.all(same | (np.isfinite(err) & (err <= base + r * scale))))
    return GradCheck(name, max_abs, max_rel, ok, rtol=r, atol=a, precision=dtype,
                     rounding_of=largest if floor_only else None)


def _lowest(*dtypes: str) -> str:
    ranks = [_RANK[d] for d in dtypes if d in _RANK]
    return _BY_RANK[min(ranks)] if ranks else "float32"


def _paths(graph: Graph) -> tuple[dict, dict]:
    """For every node reached from the roots: the lowest-precision dtype of the gradients on any path
    to it (as the real dtype of that precision: of the input slots a gradient reaches), and an opaque node on a
    path to it (or None)."""
    preds: dict = {}
    indegree: dict = {}
    for n in graph.nodes:
        indegree.setdefault(n, 0)
        for e in n.next:
            if e is not None:
                preds.setdefault(e.node, []).append(n)
                indegree[e.node] = indegree.get(e.node, 0) + 1
    # the input slots a gradient reaches (an edge or a root leads there): a custom Function's non-differentiable
    # output keeps its slot, with a made-up dtype (PyTorch's undefined input), and no gradient passes through it
    fed = {(e.node, e.input_nr) for n in graph.nodes for e in n.next if e is not None}
    fed.update((r.edge[0], r.edge[1]) for r in graph.roots)
    rank: dict = {}
    opaque: dict = {}
    ready = [n for n in graph.nodes if indegree[n] == 0]
    while ready:  # topological order from the roots: every predecessor is done before its node
        n = ready.pop()
        own = min((_RANK.get(m.dtype, 2) for k, m in enumerate(n.inputs) if (n, k) in fed), default=3)
        rank[n] = min([own] + [rank[p] for p in preds.get(n, ())])
        op = n.id if n.op is OPAQUE else None
        opaque[n] = op or next((opaque[p] for p in preds.get(n, ()) if opaque[p] is not None), None)
        for e in n.next:
            if e is not None:
                indegree[e.node] -= 1
                if indegree[e.node] == 0:
                    ready.append(e.node)
    return {n: _BY_RANK[r] for n, r in rank.items()}, opaque


def _depth_divergence(graph: Graph, order: list, got: list) -> dict | None:
    """The first node run at another reentrant depth than PyTorch's (``meta.reference.depths``, from capture)."""
    want = graph.meta["reference"].get("depths")  # checked by the loader: one integer per order item
    if want is None:
        return None
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return {"position": i, "expected": order[i] + [f"depth {w}"], "got": order[i] + [f"depth {g}"]}
    return None


def _hooks_note(graph: Graph) -> str:
    """Why gradients may differ: hooks PyTorch ran that the file cannot hold (``meta.hooks``, from capture)."""
    hooks = (graph.meta or {}).get("hooks")
    if not isinstance(hooks, list) or not hooks:
        return ""
    from autograd_run.capture.hooks import replayed
    names = [str(h.get("tensor")) for h in hooks if isinstance(h, dict) and not replayed(h)]
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return (f"PyTorch ran hooks that the graph file does not hold ({', '.join(names[:3])}{more}; see meta.hooks): "
            "its gradients include their effect, the replay's do not")
