"""Indexing: select, slice, embedding, gather/scatter (add, reduce), index_select/add/copy/fill, take,
advanced indexing (a[idx], a[mask], index_put), masked fill/scatter/select."""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import (add_at, each, is_numpy, keep_where, number, out_meta, signed, sum_to,
                                     tensor_list, wrap_dim)
from autograd_run.ops.spec import op


@op("SelectBackward0", "SelectBackward0_copy", outputs=1,
    saved="self_sym_sizes:sizes dim:int index:int", cost=cost.COPY)
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


@op("SliceBackward0", "SliceBackward0_copy", outputs=1,
    saved="self_sym_sizes:sizes dim:int start:int? end:int? step:int?",
    cost=cost.COPY)
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


@op("EmbeddingBackward0", outputs=1,
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
        add_at(xp, w, flat_idx, flat_g)
        return w
    return each(node, out)


@op("EmbeddingDenseBackwardBackward0", outputs=1, saved="indices:tensor padding_idx:int?", cost=cost.COPY)
def embedding_dense_backward_backward(node, grads, ctx):
    """embedding's backward, differentiated in grad_output: the weight's gradient rows read back at the indices
    (PyTorch's embedding_dense_double_backward: the padding_idx rows zero; scale_grad_by_freq is not applied
    again)."""
    sv = ctx.saved(node)
    indices = sv["indices"].astype(np.int64, copy=False)
    pad = signed(sv.get("padding_idx", -1))
    g = grads[0]
    xp = ctx.xp(node)
    flat = xp.asarray(indices).reshape(-1)

    def out(i):
        rows = g[flat]
        if pad is not None and pad >= 0:
            rows = xp.where((flat == pad).reshape((-1,) + (1,) * (rows.ndim - 1)), xp.zeros((), dtype=rows.dtype),
                            rows)
        return rows.reshape(tuple(indices.shape) + tuple(g.shape[1:]))
    return each(node, out)


# --- gather / scatter along a dim ---------------------------------------------------------------------------------


def flat_positions(xp, index, dim: int, shape) -> "object":
    """For gather(dim, index) from an array of ``shape``: the flat (C-order) position of each element read."""
    index = xp.asarray(index).astype(xp.int64, copy=False)
    if index.ndim == 0:
        return index.reshape(())
    if len(shape) == 0:  # a 0-d tensor indexes as one of shape (1,), as PyTorch's gather/scatter do
        shape = (1,)
    index = xp.where(index < 0, index + shape[dim], index)
    lin = xp.zeros(index.shape, dtype=xp.int64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        if d == dim:
            coord = index
        else:
            view = [1] * index.ndim
            view[d] = index.shape[d]
            coord = xp.arange(index.shape[d], dtype=xp.int64).reshape(view)
        lin = lin + coord * stride
        stride *= int(shape[d])
    return lin


def scatter_add_along(xp, shape, dim: int, index, values, dtype=None):
    """zeros(shape).scatter_add(dim, index, values)."""
    out = xp.zeros(int(math.prod(shape)), dtype=dtype or values.dtype)
    lin = flat_positions(xp, index, dim, shape).reshape(-1)
    add_at(xp, out, lin, values[tuple(slice(0, n) for n in index.shape)].reshape(-1))
    return out.reshape(tuple(shape))


def gather_along(xp, g, dim: int, index):
    """g.gather(dim, index)."""
    return g.reshape(-1)[flat_positions(xp, index, dim, g.shape)]


def _zero_at(xp, g, dim: int, index):
    """g.scatter(dim, index, 0): a copy with the positions index selects set to zero."""
    out = xp.array(g, copy=True)  # an array even for a 0-d g (numpy's 0-d results are scalars, copied on reshape)
    out.reshape(-1)[flat_positions(xp, index, dim, g.shape).reshape(-1)] = 0
    return out


def _sdim(sv, ndim):
    return wrap_dim(sv["dim"], ndim)


@op("GatherBackward0", outputs=1, saved="dim:int index:tensor self:tensor? sparse_grad:bool?", cost=cost.COPY)
def gather(node, grads, ctx):
    """a.gather(dim, index) (and torch.take_along_dim): the gradient added back where each element was read."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        shape = out_meta(node, i).shape
        return scatter_add_along(xp, shape, _sdim(sv, len(shape)), sv["index"], g)
    return each(node, out)


@op("ScatterAddBackward0", outputs=2, saved="dim:int index:tensor", cost=cost.COPY)
def scatter_add(node, grads, ctx):
    """a.scatter_add(dim, index, src): a gets the gradient, src the gradient gathered at index."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    return each(node, lambda i: g if i == 0 else gather_along(xp, g, _sdim(sv, g.ndim), sv["index"]))


@op("ScatterBackward0", outputs=2, saved="dim:int index:tensor", cost=cost.COPY)
def scatter(node, grads, ctx):
    """a.scatter(dim, index, src): a gets the gradient where nothing was written, src the gradient at index."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    dim = _sdim(sv, g.ndim)
    return each(node, lambda i: _zero_at(xp, g, dim, sv["index"]) if i == 0 else gather_along(xp, g, dim, sv["index"]))


@op("ScatterBackward1", outputs=1, saved="dim:int index:tensor", cost=cost.COPY)
def scatter_value(node, grads, ctx):
    """a.scatter(dim, index, value): the gradient, zero where the value was written."""
    sv = ctx.saved(node)
    g = grads[0]
    return each(node, lambda i: _zero_at(ctx.xp(node), g, _sdim(sv, g.ndim), sv["index"]))


def _scatter_multiply(xp, shape, lin, values, init):
    out = init.reshape(-1).copy()
    if not is_numpy(xp):  # pragma: no cover - needs a GPU
        raise NotImplementedError("scatter_reduce 'prod' backward runs on the CPU only")
    xp.multiply.at(out, lin, values)
    return out.reshape(shape)


def _unsupported_scatter_reduce(saved):
    reduce = saved.get("reduce")
    if reduce not in ("sum", "mean", "amax", "amin", "prod"):
        return f"scatter_reduce with reduce={reduce!r} has no rule here"
    return None


@op("ScatterReduceBackward0", outputs=2,
    saved="dim:int index:tensor reduce:str include_self:bool self:tensor src:tensor result:tensor",
    cost=cost.reduction(3), unsupported=_unsupported_scatter_reduce)
def scatter_reduce(node, grads, ctx):
    """a.scatter_reduce(dim, index, src, reduce, include_self) for sum, mean, amax/amin (ties share), prod."""
    sv = ctx.saved(node)
    g = grads[0]
    dim = _sdim(sv, g.ndim)
    gs, gsrc = _scatter_reduce_grads(ctx.xp(node), g, sv["self"], sv["src"], sv["result"], sv["index"], dim,
                                     sv["reduce"], bool(sv.get("include_self", True)))
    return each(node, lambda i: gs if i == 0 else gsrc)


@op("IndexReduceBackward0", outputs=2,
    saved="dim:int index:tensor reduce:str include_self:bool self:tensor source:tensor result:tensor",
    cost=cost.reduction(3), unsupported=_unsupported_scatter_reduce)
def index_reduce(node, grads, ctx):
    """a.index_reduce(dim, index, source, reduce, include_self): scatter_reduce's gradients with the 1-d index
    spread along dim over source's shape (mean, amax/amin with ties sharing, prod)."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    src, x, result = sv["source"], sv["self"], sv["result"]
    scalar = g.ndim == 0
    if scalar:  # a 0-d self (and source) reduces as one of shape (1,), as PyTorch's index ops treat it
        g, x, src, result = (xp.asarray(t).reshape(1) for t in (g, x, src, result))
    dim = _sdim(sv, g.ndim)
    index = xp.asarray(sv["index"]).reshape(-1).astype(xp.int64)
    shape = [1] * src.ndim
    if src.ndim:
        shape[dim] = index.shape[0]
        index = xp.broadcast_to(index.reshape(shape), src.shape)
    gs, gsrc = _scatter_reduce_grads(xp, g, x, src, result, index, dim, sv["reduce"],
                                     bool(sv.get("include_self", True)))
    if scalar:
        gs, gsrc = gs.reshape(()), gsrc.reshape(out_meta(node, 1).shape) if node.next[1] is not None else gsrc
    return each(node, lambda i: gs if i == 0 else gsrc)


def _scatter_reduce_grads(xp, g, x, src, result, index, dim, reduce, include_self):
    """Gradients of self and src of a scatter_reduce (``index`` of src's shape, or a prefix of it)."""
    shape = g.shape
    sub = tuple(slice(0, n) for n in index.shape)
    src = src[sub]
    lin = flat_positions(xp, index, dim, shape).reshape(-1)

    def count(mask_self, mask_src):
        n = mask_self.astype(g.real.dtype).reshape(-1).copy()
        add_at(xp, n, lin, mask_src.astype(g.real.dtype).reshape(-1))
        return n.reshape(shape)
    hit = count(xp.zeros(shape, dtype=bool), xp.ones(index.shape, dtype=bool)) > 0
    # Where self takes part in the reduction: everywhere with include_self, else where nothing was scattered.
    self_in = xp.ones(shape, dtype=bool) if include_self else ~hit

    if reduce == "sum":
        gs, gsrc = keep_where(xp, self_in, g), gather_along(xp, g, dim, index)
    elif reduce == "mean":
        n = count(self_in & hit, xp.ones(index.shape, dtype=bool))
        n = xp.where(n == 0, 1, n)
        gs = xp.where(self_in, g / n, 0)
        gsrc = gather_along(xp, g / n, dim, index)
    elif reduce in ("amax", "amin"):
        value = gather_along(xp, result, dim, index)
        # As PyTorch does, a tie with self is counted even where self is excluded (it then gets no share).
        is_self = x == result
        is_src = src == value
        n = count(is_self, is_src)
        share = g / xp.where(n == 0, 1, n)
        # PyTorch multiplies by the tie masks (a NaN or infinite g stays NaN off them) and writes self's zeros
        gs = keep_where(xp, self_in, is_self * share)
        gsrc = is_src * gather_along(xp, share, dim, index)
    else:  # prod: each factor's gradient is the product of the other factors (no division, zeros allowed)
        one = xp.ones((), dtype=g.dtype)
        zs = (x == 0) & self_in
        zsrc = src == 0
        zeros = count(zs, zsrc)
        nonzero = _scatter_multiply(xp, shape, lin, xp.where(zsrc, one, src).reshape(-1),
                                    xp.where(self_in & ~zs, x, one))
        others_self = xp.where(zeros == 0, nonzero / xp.where(zs, one, x), xp.where((zeros == 1) & zs, nonzero, 0))
        gs = xp.where(self_in, g * others_self.conj(), 0)
        nz_at, zc_at = gather_along(xp, nonzero, dim, index), gather_along(xp, zeros, dim, index)
        others_src = xp.where(zc_at == 0, nz_at / xp.where(zsrc, one, src), xp.where((zc_at == 1) & zsrc, nz_at, 0))
        gsrc = gather_along(xp, g, dim, index) * others_src.conj()
    return gs, gsrc


@op("IndexSelectBackward0", outputs=1, saved="dim:int index:tensor self_sym_sizes:sizes", cost=cost.COPY)
def index_select(node, grads, ctx):
    """a.index_select(dim, index) (and repeat_interleave with a tensor): rows of the gradient added back."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    sizes = tuple(sv["self_sym_sizes"])

    def out(i):
        if not sizes:
            return g.reshape(())
        dim = _sdim(sv, len(sizes))
        z = xp.zeros(sizes, dtype=g.dtype)
        add_at(xp, xp.moveaxis(z, dim, 0), xp.asarray(sv["index"]).reshape(-1), xp.moveaxis(g, dim, 0))
        return z
    return each(node, out)


def _take(xp, g, dim, index):
    """The rows of g along dim at index (a 0-d g as one of shape (1,), as PyTorch's index ops treat it)."""
    return xp.take(g.reshape(1) if g.ndim == 0 else g, xp.asarray(index).reshape(-1), axis=dim)


def _fit(xp, t, node, i):
    """``t`` reshaped (same size) or summed (broadcast) to the shape of next edge ``i``'s slot."""
    shape = out_meta(node, i).shape
    if t.shape == shape:
        return t
    if t.size == math.prod(shape):
        return t.reshape(shape)
    return sum_to(xp, t, shape)


def _index_zeroed(xp, g, dim, index):
    """g with the rows along dim at index set to zero (a 0-d g as one of shape (1,))."""
    out = xp.array(g, copy=True)
    flat = out.reshape(1) if out.ndim == 0 else out
    idx = [slice(None)] * flat.ndim
    idx[dim] = xp.asarray(index).reshape(-1)
    flat[tuple(idx)] = 0
    return out


@op("IndexAddBackward0", outputs=2,
    saved="dim:int index:tensor source:tensor? source_dim:int? alpha:scalar?", cost=cost.COPY)
def index_add(node, grads, ctx):
    """a.index_add(dim, index, source, alpha): a gets the gradient, source the selected rows times alpha."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    alpha = number(sv.get("alpha", 1))
    dim = _sdim(sv, g.ndim)

    def out(i):
        if i == 0:
            return g
        r = _fit(xp, _take(xp, g, dim, sv["index"]), node, i)
        return r if alpha == 1 else r * (alpha.conjugate() if isinstance(alpha, complex) else alpha)
    return each(node, out)


@op("IndexCopyBackward0", outputs=2, saved="dim:int index:tensor source:tensor? source_dim:int?", cost=cost.COPY)
def index_copy(node, grads, ctx):
    """a.index_copy(dim, index, source): a gets the gradient off the copied rows, source those rows."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    dim = _sdim(sv, g.ndim)
    return each(node, lambda i: _index_zeroed(xp, g, dim, sv["index"]) if i == 0
                else _fit(xp, _take(xp, g, dim, sv["index"]), node, i))


@op("IndexFillBackward0", outputs=1, saved="dim:int index:tensor", cost=cost.COPY)
def index_fill(node, grads, ctx):
    """a.index_fill(dim, index, value): the gradient, zero on the filled rows."""
    sv = ctx.saved(node)
    g = grads[0]
    return each(node, lambda i: _index_zeroed(ctx.xp(node), g, _sdim(sv, g.ndim), sv["index"]))


@op("IndexFillBackward1", outputs=2, saved="dim:int index:tensor", cost=cost.COPY)
def index_fill_tensor(node, grads, ctx):
    """a.index_fill(dim, index, value tensor): a as with a number; the value gets the filled rows' gradient summed."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    dim = _sdim(sv, g.ndim)
    return each(node, lambda i: _index_zeroed(xp, g, dim, sv["index"]) if i == 0
                else _take(xp, g, dim, xp.unique(xp.asarray(sv["index"]))).sum().reshape(out_meta(node, i).shape))


@op("TakeBackward0", outputs=1, saved="index:tensor self:tensor?", cost=cost.COPY)
def take(node, grads, ctx):
    """a.take(index) (flat indices): the gradient added back at each flat position read."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        shape = out_meta(node, i).shape
        n = math.prod(shape)
        flat = xp.zeros(n, dtype=g.dtype)
        index = xp.asarray(sv["index"]).reshape(-1).astype(xp.int64)
        add_at(xp, flat, xp.where(index < 0, index + n, index), g.reshape(-1))
        return flat.reshape(shape)
    return each(node, out)


# --- advanced indexing and masks ----------------------------------------------------------------------------------


def index_tuple(xp, indices):
    """PyTorch's ``indices`` (a list with None for ':') as a numpy index; masks become their nonzero positions."""
    out = []
    for t in indices:
        if t is None:
            out.append(slice(None))
            continue
        t = xp.asarray(t)
        if t.dtype == xp.bool_ or t.dtype == xp.uint8:
            out.extend(xp.nonzero(t.astype(bool)))
        else:
            out.append(t.astype(xp.int64, copy=False))
    return tuple(out)


@op("IndexBackward0", "UnsafeIndexBackward0", outputs=1, saved="self_sym_sizes:sizes indices:tensors", cost=cost.COPY)
def index(node, grads, ctx):
    """a[idx] (advanced indexing with integer tensors or masks): the gradient added back at the positions read."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    sizes = tuple(sv["self_sym_sizes"])

    def out(i):
        z = xp.zeros(sizes, dtype=g.dtype)
        add_at(xp, z, index_tuple(xp, tensor_list(sv, "indices")), g)
        return z
    return each(node, out)


def _clamped_indices(xp, sv, sizes):
    """The saved indices each clamped to [-n, n - 1] of the dim it indexes, as PyTorch's CPU kernels of the
    masked index ops clamp them (where the mask is false an index may be out of range)."""
    out = []
    for k, t in enumerate(tensor_list(sv, "indices")):
        out.append(None if t is None else xp.clip(xp.asarray(t), -int(sizes[k]), int(sizes[k]) - 1))
    return out


@op("UnsafeMaskedIndexBackward0", outputs=1, saved="self_sym_sizes:sizes indices:tensors mask:tensor", cost=cost.COPY)
def unsafe_masked_index(node, grads, ctx):
    """where(mask, a[idx], fill) (aten._unsafe_masked_index, from decompositions such as upsampling): the
    gradient where mask holds added back at the positions read."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    sizes = tuple(sv["self_sym_sizes"])

    def out(i):
        z = xp.zeros(sizes, dtype=g.dtype)
        add_at(xp, z, index_tuple(xp, _clamped_indices(xp, sv, sizes)), xp.where(sv["mask"], g, g.dtype.type(0)))
        return z
    return each(node, out)


@op("UnsafeMaskedIndexPutAccumulateBackward0", outputs=2, saved="indices:tensors mask:tensor", cost=cost.COPY)
def unsafe_masked_index_put_accumulate(node, grads, ctx):
    """a.index_put(idx, where(mask, values, 0), accumulate=True) (aten._unsafe_masked_index_put_accumulate):
    a gets the gradient, values the gradient read at idx where mask holds (summed to values' shape)."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        if i == 0:
            return g
        read = xp.where(sv["mask"], g[index_tuple(xp, _clamped_indices(xp, sv, g.shape))], g.dtype.type(0))
        return sum_to(xp, read, out_meta(node, i).shape)
    return each(node, out)


@op("IndexPutBackward0", "IndexPutImplBackward0", "UnsafeIndexPutBackward0", outputs=2,
    saved="indices:tensors accumulate:bool",
    cost=cost.COPY)
def index_put(node, grads, ctx):
    """a[idx] = values (index_put, accumulate or not): a keeps the gradient off written positions, values gets them."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    where = index_tuple(xp, tensor_list(sv, "indices"))

    def out(i):
        if i == 1:
            return sum_to(xp, g[where], out_meta(node, i).shape)
        if sv.get("accumulate"):
            return g
        r = xp.array(g, copy=True)
        r[where] = 0
        return r
    return each(node, out)


def _mask(xp, sv):
    return xp.asarray(sv["mask"]).astype(bool)


@op("MaskedFillBackward0", outputs=1, saved="mask:tensor", cost=cost.pointwise(1))
def masked_fill(node, grads, ctx):
    """a.masked_fill(mask, value): the gradient, zero where the mask is set."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    return each(node, lambda i: sum_to(xp, xp.where(_mask(xp, sv), 0, g), out_meta(node, i).shape))


@op("MaskedFillBackward1", outputs=2, saved="mask:tensor", cost=cost.pointwise(1))
def masked_fill_tensor(node, grads, ctx):
    """a.masked_fill(mask, value tensor): a as with a number; the value gets the masked gradient summed."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    mask = _mask(xp, sv)

    def out(i):
        if i == 0:
            return sum_to(xp, xp.where(mask, 0, g), out_meta(node, i).shape)
        return xp.where(mask, g, 0).sum().reshape(out_meta(node, i).shape)
    return each(node, out)


@op("MaskedScatterBackward0", outputs=2, saved="mask:tensor source_sym_sizes:sizes", cost=cost.COPY)
def masked_scatter(node, grads, ctx):
    """a.masked_scatter(mask, source): a gets the gradient off the mask, source the masked gradient in order."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    mask = xp.broadcast_to(_mask(xp, sv), g.shape)

    def out(i):
        if i == 0:
            return sum_to(xp, xp.where(mask, 0, g), out_meta(node, i).shape)
        sizes = tuple(sv["source_sym_sizes"])
        flat = xp.zeros(math.prod(sizes), dtype=g.dtype)
        picked = g[mask]
        flat[:picked.shape[0]] = picked
        return flat.reshape(sizes)
    return each(node, out)


@op("MaskedSelectBackward0", outputs=1, saved="mask:tensor self:tensor?", cost=cost.COPY)
def masked_select(node, grads, ctx):
    """a.masked_select(mask) (and a[mask] on some paths): the gradient written back at the mask's positions."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    mask = _mask(xp, sv)

    def out(i):
        shape = out_meta(node, i).shape
        full = xp.broadcast_shapes(tuple(shape), mask.shape) if hasattr(xp, "broadcast_shapes") else \
            xp.broadcast(xp.empty(shape), mask).shape
        z = xp.zeros(full, dtype=g.dtype)
        z[xp.broadcast_to(mask, full)] = g
        return sum_to(xp, z, shape)
    return each(node, out)


@op("PutBackward0", outputs=2, saved="index:tensor source:tensor? accumulate:bool", cost=cost.COPY)
def put(node, grads, ctx):
    """a.put(index, source, accumulate): source gets the gradient at the flat positions written.

    a keeps the gradient, zero at those positions unless accumulating.
    """
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    n = g.size
    index = xp.asarray(sv["index"]).reshape(-1).astype(xp.int64)
    index = xp.where(index < 0, index + n, index)

    def out(i):
        if i == 1:
            return g.reshape(-1)[index].reshape(out_meta(node, i).shape)
        if sv.get("accumulate"):
            return g
        r = xp.array(g, copy=True)  # an array even for a 0-d g (numpy's 0-d results are scalars)
        r.reshape(-1)[index] = 0
        return r
    return each(node, out)


@op("SelectBackwardBackward0", outputs=1, saved="dim:int index:int", cost=cost.COPY)
def select_backward_backward(node, grads, ctx):
    """The backward of select's backward (create_graph): the gradient's slice at that index."""
    g = grads[0]
    idx = [slice(None)] * g.ndim
    idx[wrap_dim(node.saved["dim"], g.ndim)] = signed(node.saved["index"])
    return each(node, lambda i: g[tuple(idx)])


@op("SliceBackwardBackward0", outputs=1, saved="dim:int start:int end:int step:int", cost=cost.COPY)
def slice_backward_backward(node, grads, ctx):
    """The backward of slicing's backward (create_graph): the gradient's slice."""
    g = grads[0]
    sv = node.saved
    idx = [slice(None)] * g.ndim
    idx[wrap_dim(sv["dim"], g.ndim)] = slice(signed(sv["start"]), signed(sv["end"]), signed(sv["step"]))
    return each(node, lambda i: g[tuple(idx)])


@op("MaskedScatterBackwardBackward0", outputs=1, saved="mask:tensor", cost=cost.COPY)
def masked_scatter_backward_backward(node, grads, ctx):
    """The backward of masked_scatter's source gradient (create_graph): the gradient scattered into the mask."""
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        shape = out_meta(node, i).shape
        mask = xp.broadcast_to(_mask(xp, sv), shape)
        z = xp.zeros(shape, dtype=g.dtype)
        count = int(mask.sum())
        z[mask] = g.reshape(-1)[:count]
        return z
    return each(node, out)
