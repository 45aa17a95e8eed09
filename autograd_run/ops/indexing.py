"""Indexing: select, slice, embedding."""

from __future__ import annotations

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed
from autograd_run.ops.spec import op


@op("SelectBackward0", saved="self_sym_sizes:sizes dim:int index:int", cost=cost.COPY)
def select(node, grads, ctx):
    """a.select(dim, index): the gradient placed at that index, zeros elsewhere."""
    sizes = tuple(node.saved["self_sym_sizes"])
    dim = signed(node.saved["dim"]) % len(sizes)
    index = signed(node.saved["index"])
    xp = ctx.xp(node)

    def out(i):
        z = xp.zeros(sizes, dtype=grads[0].dtype)
        idx = [slice(None)] * len(sizes)
        idx[dim] = index
        z[tuple(idx)] = grads[0]
        return z
    return each(node, out)


@op("SliceBackward0", saved="self_sym_sizes:sizes dim:int start:int? end:int? step:int?", cost=cost.COPY)
def slice_(node, grads, ctx):
    """a[start:end:step] along dim: the gradient placed in that slice, zeros elsewhere."""
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    dim = signed(sv["dim"]) % len(sizes)
    start, end, step = sv.get("start"), sv.get("end"), sv.get("step", 1)
    xp = ctx.xp(node)

    def out(i):
        z = xp.zeros(sizes, dtype=grads[0].dtype)
        idx = [slice(None)] * len(sizes)
        idx[dim] = slice(None if start is None else signed(start), None if end is None else signed(end), step)
        z[tuple(idx)] = grads[0]
        return z
    return each(node, out)


@op("EmbeddingBackward0",
    saved="indices:tensor weight_sym_argsize_0:int padding_idx:int? scale_grad_by_freq:bool? sparse:bool?",
    cost=cost.COPY)
def embedding(node, grads, ctx):
    """embedding(indices, weight): rows of the gradient added into the weight's rows."""
    sv = ctx.saved(node)
    indices = sv["indices"].astype(np.int64, copy=False)
    num = int(sv["weight_sym_argsize_0"])
    pad = signed(sv.get("padding_idx", -1))
    g = grads[0]
    xp = ctx.xp(node)
    flat_idx = indices.reshape(-1)
    flat_g = g.reshape((flat_idx.shape[0],) + g.shape[indices.ndim:])
    if pad is not None and pad >= 0:
        keep = flat_idx != pad
        flat_idx, flat_g = flat_idx[keep], flat_g[keep]
    if sv.get("scale_grad_by_freq"):
        counts = xp.bincount(flat_idx, minlength=num)
        flat_g = flat_g / counts[flat_idx].reshape((-1,) + (1,) * (flat_g.ndim - 1))

    def out(i):
        w = xp.zeros((num,) + g.shape[indices.ndim:], dtype=g.dtype)
        if xp is np:
            np.add.at(w, flat_idx, flat_g)
        else:
            import cupyx
            cupyx.scatter_add(w, flat_idx, flat_g)
        return w
    return each(node, out)
