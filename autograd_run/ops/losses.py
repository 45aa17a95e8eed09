"""Losses: mean squared error, negative log likelihood (1d and 2d targets)."""

from __future__ import annotations

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed
from autograd_run.ops.spec import op


@op("MseLossBackward0", saved="self:tensor target:tensor reduction:int?", cost=cost.pointwise(3))
def mse_loss(node, grads, ctx):
    """mse_loss(a, t): 2 (a - t) g, over numel for 'mean'; the negation for t."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    g = grads[0]
    d = 2 * (x - t) * g
    if sv.get("reduction", 1) == 1:
        d = d / x.size
    return each(node, lambda i: d if i == 0 else -d)


@op("NllLossBackward0", "NllLoss2DBackward0",
    saved="self:tensor target:tensor weight:tensor? total_weight:tensor? reduction:int? ignore_index:int?",
    cost=cost.pointwise(2))
def nll_loss(node, grads, ctx):
    """nll_loss: -weight[target] * grad at the target class, over total_weight for 'mean'."""
    sv = ctx.saved(node)
    x = sv["self"]
    target = sv["target"].astype(np.int64, copy=False)
    weight = sv.get("weight")
    reduction = sv.get("reduction", 1)
    ignore = signed(sv.get("ignore_index", -100))
    xp = ctx.xp(node)
    g = grads[0]
    batched = x.ndim >= 2
    cls_axis = 1 if batched else 0
    valid = target != ignore
    safe_t = xp.where(valid, target, 0)
    w = (weight[safe_t] if weight is not None else xp.ones(safe_t.shape, dtype=x.dtype)) * valid
    scale = -w * g
    if reduction == 1:
        scale = scale / sv["total_weight"]

    def out(i):
        grad_in = xp.zeros(x.shape, dtype=x.dtype)
        idx = xp.expand_dims(safe_t, cls_axis)
        vals = xp.expand_dims(xp.asarray(scale, dtype=x.dtype) * xp.ones(safe_t.shape, dtype=x.dtype), cls_axis)
        xp.put_along_axis(grad_in, idx, vals, axis=cls_axis)
        return grad_in
    return each(node, out)
