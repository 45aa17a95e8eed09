"""Check a replay against the PyTorch reference stored in a captured graph.

``check_graph(graph)`` replays the graph with multithreading off and compares
(1) the executed order with ``meta.reference.order`` (name, sequence number;
the first divergence is reported; and each run's reentrant depth with
``meta.reference.depths`` where capture recorded them) and (2) each leaf's gradient with the
reference (max absolute and relative error). Gradients are not compared
when the graph has opaque nodes (ops without a rule compute zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autograd_run.engine import Engine, GraphState
from autograd_run.engine.run import run_graph
from autograd_run.errors import GraphFileError
from autograd_run.graphs import tensors
from autograd_run.graphs.model import Graph
from autograd_run.ops import OPAQUE
from autograd_run.traces.order import first_divergence
from autograd_run.traces.order_recorder import OrderRecorder

#: Default tolerances by dtype: (rtol, atol).
TOLERANCE = {"float64": (1e-6, 1e-9), "float32": (1e-4, 1e-6), "float16": (1e-2, 1e-3), "bfloat16": (5e-2, 5e-3),
             "complex128": (1e-6, 1e-9), "complex64": (1e-4, 1e-6)}


@dataclass
class GradCheck:
    name: str
    max_abs: float | None
    max_rel: float | None
    ok: bool
    note: str = ""


@dataclass
class CheckReport:
    order_ok: bool
    order_len: tuple[int, int]
    divergence: dict | None
    grads: list[GradCheck] = field(default_factory=list)
    grads_compared: bool = True
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.order_ok and all(g.ok for g in self.grads)


def check_graph(graph: Graph, rtol: float | None = None, atol: float | None = None) -> CheckReport:
    ref = (graph.meta or {}).get("reference")
    if not isinstance(ref, dict) or "order" not in ref:
        raise GraphFileError(graph.source, "meta.reference", "no PyTorch reference in this graph "
                             "(capture it with `autograd-run capture`)")
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=False)
    res = run_graph(eng, graph, GraphState(graph), retain_graph=True, allow_unused=True)
    acc_var = {n.id: n.variable for n in graph.nodes}
    got = [[r.name, r.seq, acc_var.get(r.node_id)] for r in rec.executed()]
    want = [list(x) for x in ref["order"]]
    d = first_divergence(want, got)
    divergence = None if d is None else {"position": d.position, "expected": d.expected, "got": d.got}
    if divergence is None:
        divergence = _depth_divergence(ref, want, [r.depth for r in rec.executed()])
    report = CheckReport(divergence is None, (len(want), len(got)), divergence)
    opaque = [n.id for n in graph.nodes if n.op is OPAQUE]
    if opaque:
        report.grads_compared = False
        report.note = f"gradients not compared: {len(opaque)} opaque node(s) without a rule (e.g. {opaque[0]})"
        return report
    for name, spec in (ref.get("grads") or {}).items():
        ours = res.grads.get(name)
        if spec is None or ours is None:
            ok = (spec is None) == (ours is None)
            report.grads.append(GradCheck(name, None, None, ok, "" if ok else
                                          ("reference has no gradient" if spec is None else "ours has no gradient")))
            continue
        theirs = tensors.materialize(spec, graph.side_files)
        ours = np.asarray(ours)
        if ours.shape != theirs.shape:
            report.grads.append(GradCheck(name, None, None, False, f"shape {list(ours.shape)} != {list(theirs.shape)}"))
            continue
        r, a = TOLERANCE.get(str(theirs.dtype), (1e-4, 1e-6))
        r, a = (rtol if rtol is not None else r), (atol if atol is not None else a)
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        scale = np.abs(theirs.astype(np.float64))
        max_rel = float((diff / np.maximum(scale, 1e-300)).max()) if diff.size else 0.0
        ok = bool(np.all(diff <= a + r * scale))
        report.grads.append(GradCheck(name, max_abs, max_rel, ok))
    if not report.ok:
        report.note = _hooks_note(graph) or report.note
    return report


def _depth_divergence(ref: dict, order: list, got: list) -> dict | None:
    """The first node run at another reentrant depth than PyTorch's (``meta.reference.depths``, from capture)."""
    want = ref.get("depths")
    if not isinstance(want, list) or len(want) != len(order):
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
    names = [str(h.get("tensor")) for h in hooks if isinstance(h, dict)]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return (f"PyTorch ran hooks that the graph file does not hold ({', '.join(names[:3])}{more}; see meta.hooks): "
            "its gradients include their effect, the replay's do not")
