"""Matrix and vector products and norms: mm, addmm, bmm, mv, dot, vdot, vector norms (linalg.vector_norm,
torch.norm, dist).

Complex operands follow PyTorch: the other operand enters conjugated
(``g @ conj(b).T``), and norms take ``sgn`` (``a / |a|``) for complex ``a``.
"""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed
from autograd_run.ops.numeric import conj, num, sgn
from autograd_run.ops.spec import op


def _same(x):
    return x


@op("MmBackward0", saved="self:tensor? mat2:tensor? self_sym_sizes:sizes? mat2_sym_sizes:sizes?",
    cost=cost.MATMUL)
def mm(node, grads, ctx):
    """a @ b: g @ conj(b).T and conj(a).T @ g."""
    g = grads[0]
    s = ctx.saved(node)
    if g.dtype.kind != "c":
        return each(node, lambda i: g @ s["mat2"].T if i == 0 else s["self"].T @ g)
    return each(node, lambda i: g @ conj(s["mat2"]).T if i == 0 else conj(s["self"]).T @ g)


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
    cj = conj if g.dtype.kind == "c" else _same

    def out(i):
        if i == 0:
            return g if beta == 1 else g * cj(num(beta))
        r = g @ cj(sv["mat2"]).T if i == 1 else cj(sv["mat1"]).T @ g
        return r if alpha == 1 else r * cj(num(alpha))
    return each(node, out)


@op("BmmBackward0", saved="self:tensor? mat2:tensor?", cost=cost.MATMUL)
def bmm(node, grads, ctx):
    """Batched a @ b."""
    g = grads[0]
    sv = ctx.saved(node)
    cj = conj if g.dtype.kind == "c" else _same
    return each(node, lambda i: g @ cj(sv["mat2"]).swapaxes(-1, -2) if i == 0
                else cj(sv["self"]).swapaxes(-1, -2) @ g)


def _mv_flops(s: cost.Shapes) -> float:
    """2 m n per produced gradient of a (m, n) matrix times an n-vector."""
    mat = next((m for m in s.outputs if m is not None and len(m[0]) == 2), None)
    n = math.prod(mat[0]) if mat else s.numel(s.inputs[0]) * max((s.numel(m) for m in s.outputs if m), default=1)
    return 2.0 * n * sum(1 for m in s.outputs if m is not None)


@op("MvBackward0", saved="self:tensor? vec:tensor?", cost=cost.CostModel(_mv_flops))
def mv(node, grads, ctx):
    """matrix @ vector: outer(g, conj(vec)) to the matrix, conj(matrix).T @ g to the vector."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    return each(node, lambda i: xp.multiply.outer(g, conj(sv["vec"])) if i == 0 else conj(sv["self"]).T @ g)


@op("DotBackward0", saved="self:tensor? tensor:tensor?", cost=cost.pointwise(1))
def dot(node, grads, ctx):
    """dot(a, b) = sum(a b): g conj(b) and g conj(a)."""
    g = grads[0]
    sv = ctx.saved(node)
    return each(node, lambda i: g * conj(sv["tensor"] if i == 0 else sv["self"]))


@op("VdotBackward0", saved="self:tensor? other:tensor?", cost=cost.pointwise(1))
def vdot(node, grads, ctx):
    """vdot(a, b) = sum(conj(a) b): conj(g) b to a, g a to b."""
    g = grads[0]
    sv = ctx.saved(node)
    return each(node, lambda i: conj(g) * sv["other"] if i == 0 else g * sv["self"])


def _reduced(dims, ndim: int) -> tuple[int, ...]:
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(signed(d) % ndim for d in dims)) if ndim else ()


def norm_backward(xp, g, x, p, norm, dims, keepdim):
    """The gradient of a p-norm of ``x`` over ``dims`` (PyTorch's norm_backward); None for p == 0."""
    p = float(num(p if p is not None else 2.0))
    axes = _reduced(dims, x.ndim)
    if not keepdim and x.ndim:
        keep_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        g = xp.reshape(g, keep_shape)
        norm = xp.reshape(norm, keep_shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        if p == 0.0:
            return None
        if p == 1.0:
            return sgn(xp, x) * g
        if p == 2.0:
            return g * xp.where(norm == 0, 0, x / norm)
        if math.isinf(p):
            a = xp.abs(x)
            # The extremal |a| recomputed here: PyTorch's complex abs may differ from numpy's in the last bit.
            ext = a.max(axis=axes, keepdims=True) if p > 0 else a.min(axis=axes, keepdims=True)
            mask = (a == ext) | xp.isnan(a)
            return sgn(xp, x) * (g / mask.sum(axis=axes, keepdims=True) * mask)
        a = xp.abs(x)
        if p < 1.0:
            scaled = xp.where(x == 0, 0, sgn(xp, x) * a ** (p - 1))
            return scaled * g * norm ** (1 - p)
        if p < 2.0:
            scaled = sgn(xp, x) * a ** (p - 1)
        else:
            scaled = x * a ** (p - 2)
        return scaled * xp.where(norm == 0, 0, g / norm ** (p - 1))


def _norm_flops(s: cost.Shapes) -> float:
    return 4.0 * s.out_numel


@op("LinalgVectorNormBackward0", saved="self:tensor result:tensor ord:scalar? dim:ints? keepdim:bool?",
    cost=cost.CostModel(_norm_flops))
def vector_norm(node, grads, ctx):
    """linalg.vector_norm(a, ord, dim, keepdim): ord 2, 1, +-inf (ties share), 0 (no gradient), any p."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"], sv.get("ord", 2), sv["result"], sv.get("dim"),
                      bool(sv.get("keepdim", False)))
    return each(node, lambda i: r)


@op("NormBackward0", "NormBackward1", "NormBackward2", "NormBackward3",
    saved="self:tensor result:tensor p:scalar? dim:ints? keepdim:bool?", cost=cost.CostModel(_norm_flops))
def norm(node, grads, ctx):
    """torch.norm(a, p[, dim, keepdim][, dtype]): as linalg.vector_norm."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"], sv.get("p"), sv["result"], sv.get("dim"),
                      bool(sv.get("keepdim", False)))
    return each(node, lambda i: r)


@op("DistBackward0", saved="self:tensor other:tensor result:tensor p:scalar?", cost=cost.CostModel(_norm_flops))
def dist(node, grads, ctx):
    """dist(a, b, p) = norm(a - b, p): the norm's gradient to a, its negation to b."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"] - sv["other"], sv.get("p", 2), sv["result"], None, False)
    return each(node, lambda i: None if r is None else (r if i == 0 else -r))


@op("LinalgCrossBackward0", saved="self:tensor other:tensor dim:int?", cost=cost.pointwise(6))
def cross(node, grads, ctx):
    """linalg.cross(a, b, dim): cross(conj(b), g) to a, cross(g, conj(a)) to b."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    g = grads[0]
    dim = signed(sv.get("dim", -1))

    def c(u, v):
        return xp.cross(u, v, axisa=dim, axisb=dim, axisc=dim)
    return each(node, lambda i: c(conj(sv["other"]), g) if i == 0 else c(g, conj(sv["self"])))
