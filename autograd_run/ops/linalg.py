"""Matrix products: mm, addmm, bmm."""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import each
from autograd_run.ops.spec import op


@op("MmBackward0", saved="self:tensor? mat2:tensor? self_sym_sizes:sizes? mat2_sym_sizes:sizes?",
    cost=cost.MATMUL)
def mm(node, grads, ctx):
    """a @ b: g @ b.T and a.T @ g."""
    g = grads[0]
    s = ctx.saved(node)
    return each(node, lambda i: g @ s["mat2"].T if i == 0 else s["self"].T @ g)


def _addmm_flops(s: cost.Shapes) -> float:
    bias = s.numel(s.outputs[0]) if s.outputs else 0
    return float(bias + cost.MATMUL.flops(cost.Shapes(s.inputs, [None, *s.outputs[1:]])))


@op("AddmmBackward0", saved="mat1:tensor? mat2:tensor? alpha:scalar? beta:scalar?",
    cost=cost.CostModel(_addmm_flops))
def addmm(node, grads, ctx):
    """beta * c + alpha * (a @ b)."""
    g = grads[0]
    sv = ctx.saved(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return g if beta == 1 else g * beta
        r = g @ sv["mat2"].T if i == 1 else sv["mat1"].T @ g
        return r if alpha == 1 else r * alpha
    return each(node, out)


@op("BmmBackward0", saved="self:tensor? mat2:tensor?", cost=cost.MATMUL)
def bmm(node, grads, ctx):
    """Batched a @ b."""
    g = grads[0]
    sv = ctx.saved(node)
    return each(node, lambda i: g @ sv["mat2"].swapaxes(-1, -2) if i == 0 else sv["self"].swapaxes(-1, -2) @ g)
