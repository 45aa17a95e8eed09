"""Bag-of-embeddings lookups: embedding_bag (sum, mean, max; offsets; per-sample weights; padding index;
scale_grad_by_freq). The weight gradient is dense (``sparse=True`` produces the same values).

``scale_grad_by_freq`` divides each row's gradient by how often its index
occurs, as documented and as ``embedding`` does. PyTorch 2.13's CPU kernel
for embedding_bag reads that count at the wrong position of its sorted
indices, so with unequal counts its gradient differs from this rule.
"""

from __future__ import annotations

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import add_at, each, keep_where, signed
from autograd_run.ops.spec import op

SUM, MEAN, MAX = 0, 1, 2


def _offset2bag(xp, offsets, n):
    """The bag of each of ``n`` indices, from the bags' start offsets (when the forward did not save it)."""
    marks = xp.zeros(n + 1, dtype=np.int64)
    starts = offsets[(offsets >= 0) & (offsets <= n)]  # every bag's start, empty bags (repeated offsets) too
    add_at(xp, marks, starts, xp.ones(starts.shape, dtype=np.int64))
    marks[0] -= 1  # the first bag is bag 0
    return xp.cumsum(marks)[:n]


@op("EmbeddingBagBackward0", outputs=2,
    saved="indices:tensor offsets:tensor result1:tensor? result2:tensor? result3:tensor? mode:int? "
          "padding_idx:int? per_sample_weights:tensor? weight:tensor? scale_grad_by_freq:bool? sparse:bool? "
          "weight_sym_argsize_0:int",
    cost=cost.COPY)
def embedding_bag(node, grads, ctx):
    """embedding_bag: each bag's gradient back to the rows it read (times the sample weights; over the bag size
    for 'mean'; to the arg-max rows for 'max'); the sample weights get the gradient dotted with their rows."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    g = grads[0]
    idx = sv["indices"].astype(np.int64, copy=False).reshape(-1)
    mode = int(sv.get("mode", SUM))
    pad = signed(sv.get("padding_idx", -1))
    psw = sv.get("per_sample_weights")
    num_weights = int(sv["weight_sym_argsize_0"])
    bag = sv.get("result1")
    if bag is None or bag.size != idx.size:
        bag = _offset2bag(xp, sv["offsets"].astype(np.int64, copy=False), idx.size)
    bag = bag.astype(np.int64, copy=False)
    keep = idx != pad if pad >= 0 else xp.ones(idx.shape, dtype=bool)

    def grad_weight():
        dw = xp.zeros((num_weights, g.shape[-1]), dtype=g.dtype)
        if mode == MAX:
            arg = sv["result3"].astype(np.int64, copy=False)
            cols = xp.broadcast_to(xp.arange(g.shape[-1]), arg.shape)
            # An empty bag's output is zeros with arg-max 0 (or -1): no gradient flows from it.
            ok = (arg >= 0) & (sv["result2"].reshape(-1, 1) > 0)
            add_at(xp, dw, (arg[ok], cols[ok]), g[ok])
            return dw
        rows = g[bag]
        if psw is not None:
            rows = rows * psw.reshape(-1, 1)
        if mode == MEAN:
            size = sv["result2"].astype(g.dtype)
            rows = rows / xp.maximum(size[bag], 1).reshape(-1, 1)
        if sv.get("scale_grad_by_freq"):
            counts = xp.bincount(idx, minlength=num_weights)
            rows = rows / counts[idx].reshape(-1, 1)
        add_at(xp, dw, idx[keep], rows[keep])  # padding_idx's entries skipped, as PyTorch's (not times 0)
        return dw

    def grad_per_sample_weights():
        w = sv["weight"]
        return keep_where(xp, keep, (g[bag] * w[idx]).sum(axis=-1)).astype(g.dtype, copy=False)
    return each(node, lambda i: grad_weight() if i == 0 else grad_per_sample_weights())
