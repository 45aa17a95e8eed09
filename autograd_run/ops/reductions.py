"""Reductions: sum, mean (all or over dims), max/min (all), amax/amin (over dims)."""

from __future__ import annotations

import math

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed
from autograd_run.ops.spec import op


def reduced_dims(node, ndim: int) -> list[int]:
    """The (non-negative, sorted) dims a SumBackward1/MeanBackward1 reduced; none saved means all."""
    dims = node.saved.get("dim")
    if dims is None or dims == []:
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(signed(d) % ndim for d in dims) if ndim else []


def expand_reduced(node, g, xp, scale=None):
    """The gradient of a reduction over ``reduced_dims``: unsqueeze (unless keepdim), then expand."""
    sizes = tuple(node.saved["self_sym_sizes"])
    dims = reduced_dims(node, len(sizes))
    if not node.saved.get("keepdim", False):
        for d in dims:
            g = xp.expand_dims(g, d)
    if scale is not None:
        count = 1
        for d in dims:
            count *= sizes[d]
        g = g / count
    return each(node, lambda i: xp.broadcast_to(g, sizes))


@op("SumBackward0", saved="self_sym_sizes:sizes", cost=cost.reduction(0))
def sum_all(node, grads, ctx):
    """a.sum(): the gradient broadcast to the input's sizes."""
    sizes = tuple(node.saved["self_sym_sizes"])
    xp = ctx.xp(node)
    return each(node, lambda i: xp.broadcast_to(grads[0], sizes))


@op("SumBackward1", saved="self_sym_sizes:sizes dim:ints? keepdim:bool?", cost=cost.reduction(0))
def sum_dim(node, grads, ctx):
    """a.sum(dims, keepdim)."""
    return expand_reduced(node, grads[0], ctx.xp(node))


@op("MeanBackward0", saved="self_sym_sizes:sizes self_sym_numel:int?", cost=cost.reduction(1))
def mean_all(node, grads, ctx):
    """a.mean(): the gradient over numel, broadcast."""
    sizes = tuple(node.saved["self_sym_sizes"])
    n = node.saved.get("self_sym_numel", math.prod(sizes))
    xp = ctx.xp(node)
    return each(node, lambda i: xp.broadcast_to(grads[0] / n, sizes))


@op("MeanBackward1", saved="self_sym_sizes:sizes dim:ints? keepdim:bool? self_sym_numel:int?",
    cost=cost.reduction(1))
def mean_dim(node, grads, ctx):
    """a.mean(dims, keepdim)."""
    return expand_reduced(node, grads[0], ctx.xp(node), scale=True)


@op("MaxBackward1", "MinBackward1", saved="self:tensor result:tensor", cost=cost.reduction(3))
def max_all(node, grads, ctx):
    """a.max() / a.min(): the gradient split evenly over the positions equal to the result."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    mask = x == r
    return each(node, lambda i: mask * (grads[0] / mask.sum()))


@op("AmaxBackward0", "AminBackward0", saved="self:tensor result:tensor dim:ints? keepdim:bool?",
    cost=cost.reduction(3))
def amax(node, grads, ctx):
    """amax / amin over dims: split evenly over the extremal positions of each reduced slice."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    xp = ctx.xp(node)
    dims = reduced_dims(node, x.ndim)
    g = grads[0]
    if not sv.get("keepdim", False):
        for d in dims:
            g = xp.expand_dims(g, d)
            r = xp.expand_dims(r, d)
    mask = x == r
    return each(node, lambda i: mask * (g / mask.sum(axis=tuple(dims), keepdims=True)))
