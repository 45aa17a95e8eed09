"""Reductions and scans: sum, mean, max/min (all or over a dim), amax/amin, aminmax, median, mode, kthvalue,
sort, topk, cumsum, cumprod, cummax/cummin, logcumsumexp, prod, var/std (and with mean), logsumexp, nansum."""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, keep_where, signed
from autograd_run.ops.indexing import scatter_add_along
from autograd_run.ops.numeric import num
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


@op("SumBackward0", outputs=1, saved="self_sym_sizes:sizes", cost=cost.reduction(0), views="expand",
    expands_to="self_sym_sizes")
def sum_all(node, grads, ctx):
    """a.sum(): the gradient broadcast to the input's sizes."""
    sizes = tuple(node.saved["self_sym_sizes"])
    xp = ctx.xp(node)
    return each(node, lambda i: xp.broadcast_to(grads[0], sizes))


@op("SumBackward1", outputs=1, saved="self_sym_sizes:sizes dim:ints? keepdim:bool?", cost=cost.reduction(0))
def sum_dim(node, grads, ctx):
    """a.sum(dims, keepdim)."""
    return expand_reduced(node, grads[0], ctx.xp(node))


@op("MeanBackward0", outputs=1, saved="self_sym_sizes:sizes self_sym_numel:int?", cost=cost.reduction(1),
    expands_to="self_sym_sizes")
def mean_all(node, grads, ctx):
    """a.mean(): the gradient over numel, broadcast."""
    sizes = tuple(node.saved["self_sym_sizes"])
    n = node.saved.get("self_sym_numel", math.prod(sizes))
    xp = ctx.xp(node)
    return each(node, lambda i: xp.broadcast_to(grads[0] / n, sizes))


@op("MeanBackward1", outputs=1, saved="self_sym_sizes:sizes dim:ints? keepdim:bool? self_sym_numel:int?",
    cost=cost.reduction(1))
def mean_dim(node, grads, ctx):
    """a.mean(dims, keepdim)."""
    return expand_reduced(node, grads[0], ctx.xp(node), scale=True)


def evenly_distribute(node, xp, x, r, g):
    """The gradient of a full reduction to one value (max, min, median): split evenly over the positions equal to
    it (the NaNs when it is NaN). PyTorch's CPU kernel writes it there into zeros, so a NaN or infinite gradient
    stays there; on CUDA it multiplies by the mask, so it spreads as NaN everywhere."""
    mask = (x == r) | (xp.isnan(x) & xp.isnan(r))
    share = g / mask.sum()
    if node.device.is_cpu:
        return keep_where(xp, mask, xp.broadcast_to(share, x.shape))
    return mask * share


@op("MaxBackward1", "MinBackward1", outputs=1, saved="self:tensor result:tensor", cost=cost.reduction(3))
def max_all(node, grads, ctx):
    """a.max() / a.min(): the gradient split evenly over the positions equal to the result (the NaNs if NaN)."""
    sv = ctx.saved(node)
    return each(node, lambda i: evenly_distribute(node, ctx.xp(node), sv["self"], sv["result"], grads[0]))


@op("AmaxBackward0", "AminBackward0", outputs=1, saved="self:tensor result:tensor dim:ints? keepdim:bool?",
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


def restore(xp, t, dims, keepdim):
    """``t`` with the reduced ``dims`` (sorted, non-negative) put back as size-1 axes unless ``keepdim``."""
    if keepdim:
        return t
    for d in dims:
        t = xp.expand_dims(t, d)
    return t


def _dims(sv, ndim):
    """The dims a reduction with an optional ``dim`` (one int or a list; None or [] means all) reduced."""
    dims = sv.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(ndim))
    if not isinstance(dims, (list, tuple)):
        dims = [dims]
    return sorted(signed(d) % ndim for d in dims) if ndim else []


# --- value-selecting reductions: the gradient goes to the selected positions ----------------------------------------


def _select_back(xp, g, indices, dim, sizes, keepdim):
    """zeros(sizes) with ``g`` added at ``indices`` along ``dim`` (unsqueezed there unless ``keepdim``)."""
    if not sizes:
        return g.reshape(())
    if not keepdim:
        g, indices = xp.expand_dims(g, dim), xp.expand_dims(xp.asarray(indices), dim)
    return scatter_add_along(xp, sizes, dim, indices, g)


@op("MaxBackward0", "MinBackward0", "KthvalueBackward0", "MedianBackward1", "NanmedianBackward1", "ModeBackward0",
    outputs=1, saved="dim:int indices:tensor keepdim:bool? self_sym_sizes:sizes", cost=cost.COPY)
def value_selecting(node, grads, ctx):
    """max/min/kthvalue/median/nanmedian/mode over a dim: the gradient goes to the selected index."""
    sv = ctx.saved(node)
    sizes = tuple(sv["self_sym_sizes"])
    dim = signed(sv["dim"]) % max(len(sizes), 1)
    return each(node, lambda i: _select_back(ctx.xp(node), grads[0], sv["indices"], dim, sizes,
                                             bool(sv.get("keepdim", False))))


@op("SortBackward0", "SortBackward1", "TopkBackward0", outputs=1, saved="dim:int indices:tensor self_sym_sizes:sizes",
    cost=cost.COPY)
def sort(node, grads, ctx):
    """sort / topk along a dim: each value's gradient goes back to the position it came from."""
    sv = ctx.saved(node)
    sizes = tuple(sv["self_sym_sizes"])
    dim = signed(sv["dim"]) % max(len(sizes), 1)
    return each(node, lambda i: _select_back(ctx.xp(node), grads[0], sv["indices"], dim, sizes, True))


@op("CummaxBackward0", "CumminBackward0", outputs=1, saved="dim:int indices:tensor self:tensor?", cost=cost.COPY)
def cummax(node, grads, ctx):
    """cummax / cummin along a dim: each running extreme's gradient added to the position that holds it."""
    sv = ctx.saved(node)
    g = grads[0]
    return each(node, lambda i: _select_back(ctx.xp(node), g, sv["indices"], signed(sv["dim"]) % max(g.ndim, 1),
                                             g.shape, True))


@op("MedianBackward0", "NanmedianBackward0", outputs=1, saved="self:tensor result:tensor", cost=cost.reduction(3))
def median_all(node, grads, ctx):
    """a.median() / a.nanmedian(): the gradient split evenly over the positions equal to the result (NaN: the NaNs)."""
    sv = ctx.saved(node)
    return each(node, lambda i: evenly_distribute(node, ctx.xp(node), sv["self"], sv["result"], grads[0]))


@op("AminmaxBackward0", outputs=1,
    saved="self:tensor min:tensor max:tensor dim:int? keepdim:bool?", cost=cost.reduction(3))
def aminmax(node, grads, ctx):
    """torch.aminmax: the min's and the max's gradients each split evenly over their ties."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims = _dims(sv, x.ndim)
    keep = bool(sv.get("keepdim", False))
    total = None
    for g, value in zip(grads, (sv["min"], sv["max"])):
        if g is None:
            continue
        mask = x == restore(xp, value, dims, keep)
        part = mask * (restore(xp, g, dims, keep) / mask.sum(axis=tuple(dims), keepdims=True))
        total = part if total is None else total + part
    return each(node, lambda i: total)


# --- scans ---------------------------------------------------------------------------------------------------------


def _reverse_cumsum(xp, t, axis):
    return xp.flip(xp.cumsum(xp.flip(t, axis), axis=axis), axis)


@op("CumsumBackward0", outputs=1, saved="dim:int", cost=cost.reduction(1))
def cumsum(node, grads, ctx):
    """a.cumsum(dim): the reversed cumulative sum of the gradient."""
    g = grads[0]
    if g.ndim == 0:
        return each(node, lambda i: g)
    return each(node, lambda i: _reverse_cumsum(ctx.xp(node), g, signed(node.saved["dim"]) % g.ndim))


@op("CumprodBackward0", outputs=1, saved="self:tensor result:tensor dim:int", cost=cost.reduction(6))
def cumprod(node, grads, ctx):
    """a.cumprod(dim), zeros in the input too.

    Before a slice's first zero, sum_k>=i g_k y_k / x_i over the k before it; at it, sum_k g_k times the product
    up to k that skips it, over the k before the second zero; after it, zero (conjugated for complex). The sums
    leave out the terms whose product is zero, as PyTorch's: a NaN or infinite g there does not reach them.
    """
    sv = ctx.saved(node)
    g, x, y = grads[0], sv["self"], sv["result"]
    xp = ctx.xp(node)
    if g.ndim == 0:
        return each(node, lambda i: g)
    if g.size == 0:  # an empty input: an empty gradient
        return each(node, lambda i: xp.zeros(x.shape, dtype=g.dtype))
    d = signed(sv["dim"]) % g.ndim
    g, x, y = (xp.moveaxis(t, d, -1) for t in (g, x, y))
    n = x.shape[-1]
    pos = xp.arange(n)
    is_zero = x == 0
    first = xp.where(is_zero.any(axis=-1), xp.argmax(is_zero, axis=-1), n)[..., None]
    one = xp.ones((), dtype=x.dtype)
    # only the terms before the first zero (as PyTorch: a NaN or infinite g after it does not reach them)
    before = _reverse_cumsum(xp, keep_where(xp, pos < first, g * y.conj()), -1) / xp.where(pos < first, x, one).conj()
    # At the first zero: the cumulative products of the slice with that zero replaced by one, up to the second.
    later = is_zero & (pos > first)
    second = xp.where(later.any(axis=-1), xp.argmax(later, axis=-1), n)[..., None]
    y_skip = xp.cumprod(xp.where(pos == first, one, x), axis=-1)
    at = _reverse_cumsum(xp, keep_where(xp, pos < second, g * y_skip.conj()), -1)
    out = xp.where(pos < first, before, xp.where(pos == first, at, 0))
    return each(node, lambda i: xp.moveaxis(out, -1, d))


def _reverse_logcumsumexp(xp, t, axis):
    if xp is not np:  # cupy has no logaddexp.accumulate (seen on an H200: "not supported yet"): on the host, exact
        return xp.asarray(_reverse_logcumsumexp(np, xp.asnumpy(t), axis))
    return np.flip(np.logaddexp.accumulate(np.flip(t, axis), axis=axis), axis)


@op("LogcumsumexpBackward0", outputs=1, saved="self:tensor result:tensor dim:int", cost=cost.reduction(8))
def logcumsumexp(node, grads, ctx):
    """a.logcumsumexp(dim): sum_k>=i g_k exp(x_i - r_k), in log space for the gradient's positive and negative parts."""
    sv = ctx.saved(node)
    g, x, r = grads[0], sv["self"], sv["result"]
    xp = ctx.xp(node)
    if g.ndim == 0:
        return each(node, lambda i: g)
    d = signed(sv["dim"]) % g.ndim
    with np.errstate(divide="ignore"):
        pos = _reverse_logcumsumexp(xp, xp.log(xp.where(g > 0, g, 0)) - r, d)
        neg = _reverse_logcumsumexp(xp, xp.log(xp.where(g < 0, -g, 0)) - r, d)
    return each(node, lambda i: xp.exp(x + pos) - xp.exp(x + neg))


# --- products --------------------------------------------------------------------------------------------------------


def _product_of_others(xp, x, axis):
    """For each element, the product of the others along ``axis`` (prefix times suffix products: zeros are fine)."""
    x = xp.moveaxis(x, axis, -1)
    if x.shape[-1] == 0:  # an empty slice: nothing to multiply, an empty gradient
        return xp.moveaxis(xp.zeros_like(x), -1, axis)
    ones = xp.ones(x.shape[:-1] + (1,), dtype=x.dtype)
    left = xp.concatenate([ones, xp.cumprod(x[..., :-1], axis=-1)], axis=-1)
    right = xp.flip(xp.concatenate([ones, xp.cumprod(xp.flip(x, -1)[..., :-1], axis=-1)], axis=-1), -1)
    return xp.moveaxis(left * right, -1, axis)


@op("ProdBackward0", outputs=1, saved="self:tensor result:tensor?", cost=cost.reduction(4))
def prod_all(node, grads, ctx):
    """a.prod(): each element gets the gradient times the product of all the others (conjugated).

    With two zeros or more in a, zeros (PyTorch's backward without create_graph), not the gradient times 0.
    """
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    if int((x == 0).sum()) > 1 or x.size == 0:
        return each(node, lambda i: xp.zeros(x.shape, dtype=grads[0].dtype))
    others = _product_of_others(xp, x.reshape(-1), 0).reshape(x.shape)
    return each(node, lambda i: grads[0] * others.conj())


@op("ProdBackward1", outputs=1, saved="self:tensor result:tensor? dim:int keepdim:bool?", cost=cost.reduction(4))
def prod_dim(node, grads, ctx):
    """a.prod(dim, keepdim): each element gets the gradient times the product of the others in its slice."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    if x.ndim == 0:
        return each(node, lambda i: grads[0].reshape(()))
    d = signed(sv["dim"]) % x.ndim
    g = restore(xp, grads[0], [d], bool(sv.get("keepdim", False)))
    return each(node, lambda i: g * _product_of_others(xp, x, d).conj())


# --- moments ---------------------------------------------------------------------------------------------------------


def _var_back(xp, g, x, dims, correction, keepdim, every_dim=False, no_dims=False):
    """The gradient of var(x, dims, correction): 2 (x - mean) g / (N - correction).

    With N - correction <= 0, as PyTorch: over every dim (no ``dim`` given), g times NaN where x equals the mean
    and inf elsewhere; over given dims, 2 / 0 is inf (so inf * 0 = NaN where x equals the mean).
    ``no_dims``: an empty ``dim`` list (``dim=()``): the forward reduced every dim, but PyTorch's var_backward
    counts N over the (no) dims given, N = 1 (``_safe_size``).
    """
    n = 1
    for d in () if no_dims else dims:
        n *= x.shape[d]
    c = 1 if correction is None else num(correction)
    g = restore(xp, g, dims, keepdim)
    mean = x.mean(axis=tuple(dims), keepdims=True)
    dof = n - c
    with np.errstate(invalid="ignore"):
        if dof <= 0 and every_dim:
            return g * xp.where(x == mean, xp.nan, xp.inf)
        return (2.0 / dof if dof != 0 else math.inf) * g * (x - mean)


def _no_dim(sv, x):
    """Whether var/std reduced without a ``dim`` (PyTorch's other formula when N - correction <= 0)."""
    return x.ndim == 0 or sv.get("dim") is None


def _empty_dim(sv, x):
    """Whether var/std got ``dim=()`` (an empty list, not None) for a tensor of one dim or more."""
    dims = sv.get("dim")
    return x.ndim > 0 and isinstance(dims, (list, tuple)) and not dims


def _mean_back(xp, g, x, dims, keepdim):
    n = 1
    for d in dims:
        n *= x.shape[d]
    return xp.broadcast_to(restore(xp, g, dims, keepdim) / n, x.shape)


def _std_grad(xp, g, std):
    """The std's gradient turned into the variance's: g / (2 std), zero where std is zero."""
    return xp.where(std == 0, 0, g / xp.where(std == 0, 1, 2 * std))


@op("VarBackward0", outputs=1, saved="self:tensor dim:ints? correction:scalar? keepdim:bool?", cost=cost.reduction(4))
def var(node, grads, ctx):
    """a.var(dim, correction, keepdim): 2 (x - mean) g / (N - correction)."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims, keep = _dims(sv, x.ndim), bool(sv.get("keepdim", False))
    return each(node, lambda i: _var_back(xp, grads[0], x, dims, sv.get("correction"), keep, _no_dim(sv, x),
                                          _empty_dim(sv, x)))


@op("StdBackward0", outputs=1, saved="self:tensor result:tensor dim:ints? correction:scalar? keepdim:bool?",
    cost=cost.reduction(5))
def std(node, grads, ctx):
    """a.std(dim, correction, keepdim): the variance's gradient with g / (2 std) (zero where std is zero)."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims, keep = _dims(sv, x.ndim), bool(sv.get("keepdim", False))
    return each(node, lambda i: _var_back(xp, _std_grad(xp, grads[0], sv["result"]), x, dims,
                                          sv.get("correction"), keep, _no_dim(sv, x),
                                          _empty_dim(sv, x)))


def _moments_mean(node, grads, ctx, first):
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims, keep = _dims(sv, x.ndim), bool(sv.get("keepdim", False))
    total = None
    if grads[0] is not None:
        total = _var_back(xp, first(xp, grads[0], sv), x, dims, sv.get("correction"), keep, _no_dim(sv, x),
                          _empty_dim(sv, x))
    if len(grads) > 1 and grads[1] is not None:
        m = _mean_back(xp, grads[1], x, dims, keep)
        total = m if total is None else total + m
    return each(node, lambda i: total)


@op("VarMeanBackward0", outputs=1,
    saved="self:tensor dim:ints? correction:scalar? keepdim:bool?", cost=cost.reduction(5))
def var_mean(node, grads, ctx):
    """torch.var_mean: the variance's and the mean's gradients summed."""
    return _moments_mean(node, grads, ctx, lambda xp, g, sv: g)


@op("StdMeanBackward0", outputs=1, saved="self:tensor result0:tensor dim:ints? correction:scalar? keepdim:bool?",
    cost=cost.reduction(6))
def std_mean(node, grads, ctx):
    """torch.std_mean: the std's and the mean's gradients summed."""
    return _moments_mean(node, grads, ctx, lambda xp, g, sv: _std_grad(xp, g, sv["result0"]))


@op("LogsumexpBackward0", outputs=1, saved="self:tensor result:tensor dim:ints keepdim:bool?", cost=cost.reduction(3))
def logsumexp(node, grads, ctx):
    """a.logsumexp(dim, keepdim): the gradient times softmax, exp(x - result)."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims, keep = _dims(sv, x.ndim), bool(sv.get("keepdim", False))
    r = restore(xp, sv["result"], dims, keep)
    return each(node, lambda i: restore(xp, grads[0], dims, keep) * xp.exp(x - r).conj())


@op("NansumBackward0", outputs=1, saved="self:tensor dim:ints? keepdim:bool?", cost=cost.reduction(1))
def nansum(node, grads, ctx):
    """a.nansum(dim, keepdim): the gradient broadcast back, times zero at the NaNs.

    A product, as PyTorch's: a NaN or infinite gradient stays NaN at a NaN input.
    """
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    dims, keep = _dims(sv, x.ndim), bool(sv.get("keepdim", False))
    return each(node, lambda i: restore(xp, grads[0], dims, keep) * ~xp.isnan(x))


@op("TraceBackward0", outputs=1, saved="self_sym_sizes:sizes", cost=cost.COPY)
def trace(node, grads, ctx):
    """a.trace(): the gradient on the main diagonal, zeros elsewhere (written there: a NaN stays on it)."""
    rows, cols = (int(n) for n in node.saved["self_sym_sizes"])
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        z = xp.zeros((rows, cols), dtype=g.dtype)
        d = xp.arange(min(rows, cols))
        z[d, d] = g
        return z
    return each(node, out)


# --- segment_reduce ------------------------------------------------------------------------------------------------


def _segment_grad(reduce, g, out, values, initial):
    """One segment's gradient (``values`` the segment along its axis first, ``g`` and ``out`` its output row),
    as PyTorch's CPU ``_segment_reduce_backward`` kernel: ties of max/min share a positive gradient (a gradient
    of zero or below is not divided: the kernel divides only entries above zero), prod's zeros get the product
    of the others times ``initial``."""
    n = values.shape[0]
    if n == 0:
        return values.copy()
    if reduce == "sum":
        return np.broadcast_to(g, values.shape).copy()
    if reduce == "mean":
        return np.broadcast_to(g / n, values.shape).copy()
    if reduce in ("max", "min"):
        hit = np.isnan(values) | (values == out)
        r = np.where(hit, g, 0).astype(values.dtype)
        count = hit.sum(axis=0)
        share = (count >= 2) & (r > 0)
        return np.where(share, r / np.maximum(count, 1), r)
    # prod
    with np.errstate(divide="ignore", invalid="ignore"):
        r = g * out / values
    special = np.isnan(values) | (values == 0)
    if special.any():
        for j in range(n):
            if not special[j].any():
                continue
            others = np.prod(np.delete(values, j, axis=0), axis=0) * (1.0 if initial is None else initial)
            r[j] = np.where(special[j], g * others, r[j])
    return r


def _unsupported_segment_reduce(saved):
    if saved.get("reduce") not in ("sum", "mean", "max", "min", "prod"):
        return f"segment_reduce with reduce={saved.get('reduce')!r} has no rule here"
    return None


@op("SegmentReduceBackward0", outputs=1,
    saved="data:tensor reduce:str lengths:tensor? offsets:tensor? axis:int initial:scalar? result:tensor",
    cost=cost.reduction(3), unsupported=_unsupported_segment_reduce)
def segment_reduce(node, grads, ctx):
    """torch.segment_reduce(data, reduce, lengths or offsets, axis, initial): each segment's gradient back to its
    elements (sum; mean over its length; max/min to the extremes; prod with zeros handled), per leading batch
    of the lengths (see ``_segment_grad``)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    data, out, g = sv["data"], sv["result"], grads[0]
    host = lambda a: np.asarray(a.get() if hasattr(a, "get") else a)  # noqa: E731 - the kernel runs on the host
    data_h, out_h, g_h = host(data), host(out), host(g)
    axis = signed(sv["axis"]) % max(data.ndim, 1)
    if sv.get("offsets") is not None:
        offsets = host(sv["offsets"]).astype(np.int64)
    else:
        lengths = host(sv["lengths"]).astype(np.int64)
        offsets = np.concatenate([np.zeros(lengths.shape[:-1] + (1,), np.int64), np.cumsum(lengths, -1)], -1)
    initial = sv.get("initial")
    initial = None if initial is None else float(num(initial))
    pre = data_h.shape[:axis]
    r = np.zeros_like(data_h)
    d2 = data_h.reshape((-1,) + data_h.shape[axis:])
    o2 = out_h.reshape((-1,) + out_h.shape[axis:])
    g2 = g_h.reshape((-1,) + g_h.shape[axis:])
    r2 = r.reshape(d2.shape)
    off2 = offsets.reshape((-1, offsets.shape[-1]))
    for b in range(int(np.prod(pre)) if pre else 1):
        off = off2[b if off2.shape[0] > 1 else 0]
        for j in range(off.shape[0] - 1):
            lo, hi = int(off[j]), int(off[j + 1])
            r2[b, lo:hi] = _segment_grad(str(sv["reduce"]), g2[b, j], o2[b, j], d2[b, lo:hi], initial)
    return each(node, lambda i: xp.asarray(r))
