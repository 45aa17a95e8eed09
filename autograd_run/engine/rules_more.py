"""Backward rules for shape, reduction, normalisation and indexing ops.

Split from ``rules`` to keep each module small; ``rules.RULES`` registers
them. Formulas follow PyTorch's ``derivatives.yaml`` (re-derived here, not
copied). Saved integer fields that PyTorch stores as unsigned 64-bit (a dim
of -1 appears as 2**64-1) are read back as signed.
"""

from __future__ import annotations

import math

import numpy as np


def signed(v):
    """PyTorch exposes some int64 saved values as uint64 (-1 -> 2**64-1)."""
    if v is None:
        return None
    v = int(v)
    return v - (1 << 64) if v >= (1 << 63) else v


def _each(node, value_for):
    return [None if e is None else value_for(i) for i, e in enumerate(node.next)]


def _erf(xp, x):
    if xp is np:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)
    from cupyx.scipy.special import erf  # real GPU only
    return erf(x)


def log(node, grads, gt):
    s = gt.saved(node)["self"]
    return _each(node, lambda i: grads[0] / s)


def pow_scalar(node, grads, gt):
    sv = gt.saved(node)
    x, e = sv["self"], sv["exponent"]
    if e == 0:
        return _each(node, lambda i: gt.xp(node).zeros_like(x))
    return _each(node, lambda i: grads[0] * (e * x ** (e - 1)))


def addmm(node, grads, gt):
    g = grads[0]
    sv = gt.saved(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return g if beta == 1 else g * beta
        if i == 1:
            r = g @ sv["mat2"].T
        else:
            r = sv["mat1"].T @ g
        return r if alpha == 1 else r * alpha
    return _each(node, out)


def bmm(node, grads, gt):
    g = grads[0]
    sv = gt.saved(node)
    return _each(node, lambda i: g @ sv["mat2"].swapaxes(-1, -2) if i == 0 else sv["self"].swapaxes(-1, -2) @ g)


def transpose(node, grads, gt):
    d0, d1 = signed(node.saved["dim0"]), signed(node.saved["dim1"])
    return _each(node, lambda i: grads[0].swapaxes(d0, d1))


def permute(node, grads, gt):
    dims = [signed(d) % grads[0].ndim for d in node.saved["dims"]]
    inverse = [0] * len(dims)
    for k, d in enumerate(dims):
        inverse[d] = k
    return _each(node, lambda i: grads[0].transpose(inverse))


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
    return _each(node, lambda i: xp.broadcast_to(g, sizes))


def mean_dim(node, grads, gt):
    return expand_reduced(node, grads[0], gt.xp(node), scale=True)


def gelu(node, grads, gt):
    sv = gt.saved(node)
    x = sv["self"]
    xp = gt.xp(node)
    if sv.get("approximate", "none") == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = k * (x + 0.044715 * x ** 3)
        t = xp.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1 + _erf(xp, x / math.sqrt(2.0)))
        pdf = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        d = cdf + x * pdf
    return _each(node, lambda i: grads[0] * d)


def softmax(node, grads, gt):
    sv = gt.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    return _each(node, lambda i: y * (g - (g * y).sum(axis=dim, keepdims=True)))


def log_softmax(node, grads, gt):
    sv = gt.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    xp = gt.xp(node)
    return _each(node, lambda i: g - xp.exp(y) * g.sum(axis=dim, keepdims=True))


def layer_norm(node, grads, gt):
    sv = gt.saved(node)
    x, mean, rstd = sv["input"], sv["result1"], sv["result2"]
    w = sv.get("weight")
    k = len(sv["normalized_shape"])
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    g = grads[0]
    n = 1
    for a in axes:
        n *= x.shape[a]
    xhat = (x - mean) * rstd
    dxhat = g * w if w is not None and not isinstance(w, (int, float)) else g

    def out(i):
        if i == 0:
            return rstd / n * (n * dxhat - dxhat.sum(axis=axes, keepdims=True)
                               - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True))
        if i == 1:
            return (g * xhat).sum(axis=lead) if lead else g * xhat
        return g.sum(axis=lead) if lead else g
    return _each(node, out)


def _split_sizes(node, dim):
    """Sizes along ``dim`` of each input of a cat: saved ``sizes``, else the consumers' shapes."""
    sizes = node.saved.get("sizes")
    if sizes is not None:
        return list(sizes)
    out = []
    for e in node.next:
        if e is None:
            raise RuntimeError(f"{node.name} {node.id!r}: an input without a gradient edge needs saved 'sizes'")
        shape = e.node.inputs[e.input_nr].shape
        out.append(shape[dim] if shape else 1)
    return out


def cat(node, grads, gt):
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % max(g.ndim, 1)
    sizes = _split_sizes(node, dim)
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)

    def piece(i):
        idx = [slice(None)] * g.ndim
        idx[dim] = slice(starts[i], starts[i + 1])
        return g[tuple(idx)]
    return _each(node, piece)


def stack(node, grads, gt):
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % g.ndim
    return _each(node, lambda i: g.take(i, axis=dim))


def select(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    dim = signed(node.saved["dim"]) % len(sizes)
    index = signed(node.saved["index"])
    xp = gt.xp(node)

    def out(i):
        z = xp.zeros(sizes, dtype=grads[0].dtype)
        idx = [slice(None)] * len(sizes)
        idx[dim] = index
        z[tuple(idx)] = grads[0]
        return z
    return _each(node, out)


def slice_(node, grads, gt):
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    dim = signed(sv["dim"]) % len(sizes)
    start, end, step = sv.get("start"), sv.get("end"), sv.get("step", 1)
    xp = gt.xp(node)

    def out(i):
        z = xp.zeros(sizes, dtype=grads[0].dtype)
        idx = [slice(None)] * len(sizes)
        idx[dim] = slice(None if start is None else signed(start), None if end is None else signed(end), step)
        z[tuple(idx)] = grads[0]
        return z
    return _each(node, out)


def embedding(node, grads, gt):
    sv = gt.saved(node)
    indices = sv["indices"].astype(np.int64, copy=False)
    num = int(sv["weight_sym_argsize_0"])
    pad = signed(sv.get("padding_idx", -1))
    g = grads[0]
    xp = gt.xp(node)
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
    return _each(node, out)


def _filled(node, grads, xp):
    """The node's input gradients with undefined ones replaced by zeros of their slot's shape."""
    out = []
    for g, meta in zip(grads, node.inputs):
        out.append(xp.zeros(meta.shape, dtype=meta.dtype) if g is None else g)
    return out


def split(node, grads, gt):
    """SplitBackward0 / SplitWithSizesBackward0: concatenate the pieces' gradients along dim."""
    xp = gt.xp(node)
    sizes = node.saved.get("self_sym_sizes")
    dim = signed(node.saved.get("dim", 0))
    dim = dim % len(sizes) if sizes else dim
    return _each(node, lambda i: xp.concatenate(_filled(node, grads, xp), axis=dim))


def unbind(node, grads, gt):
    """UnbindBackward0: stack the slices' gradients along dim."""
    xp = gt.xp(node)
    pieces = _filled(node, grads, xp)
    dim = signed(node.saved.get("dim", 0)) % (pieces[0].ndim + 1)
    return _each(node, lambda i: xp.stack(pieces, axis=dim))


# -- more elementwise ops and losses common in real models ------------------------------

def sqrt(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: grads[0] / (2 * r))


def rsqrt(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: -0.5 * grads[0] * r * r * r)


def rsub_scalar(node, grads, gt):
    alpha = node.saved.get("alpha", 1)
    return _each(node, lambda i: -grads[0] if alpha == 1 else -alpha * grads[0])


def abs_(node, grads, gt):
    x = gt.saved(node)["self"]
    return _each(node, lambda i: grads[0] * gt.xp(node).sign(x))


def silu(node, grads, gt):
    x = gt.saved(node)["self"]
    s = 1 / (1 + gt.xp(node).exp(-x))
    return _each(node, lambda i: grads[0] * s * (1 + x * (1 - s)))


def leaky_relu(node, grads, gt):
    sv = gt.saved(node)
    x, slope = sv["self"], sv.get("negative_slope", 0.01)
    return _each(node, lambda i: grads[0] * gt.xp(node).where(x > 0, 1.0, slope).astype(grads[0].dtype))


def clamp(node, grads, gt):
    sv = gt.saved(node)
    x, lo, hi = sv["self"], sv.get("min"), sv.get("max")
    mask = True
    if lo is not None:
        mask = x >= lo
    if hi is not None:
        mask = mask & (x <= hi)
    return _each(node, lambda i: grads[0] * mask)


def sin(node, grads, gt):
    x = gt.saved(node)["self"]
    return _each(node, lambda i: grads[0] * gt.xp(node).cos(x))


def cos(node, grads, gt):
    x = gt.saved(node)["self"]
    return _each(node, lambda i: -grads[0] * gt.xp(node).sin(x))


def where(node, grads, gt):
    c = gt.saved(node)["condition"]
    xp = gt.xp(node)
    g = grads[0]
    return _each(node, lambda i: xp.where(c, g, 0) if i == 0 else xp.where(c, 0, g))


def unsqueeze(node, grads, gt):
    g = grads[0]
    dim = signed(node.saved["dim"]) % g.ndim
    return _each(node, lambda i: g.squeeze(dim))


def squeeze(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    return _each(node, lambda i: grads[0].reshape(sizes))


def max_all(node, grads, gt):
    """MaxBackward1 / MinBackward1: the gradient split evenly over the positions equal to the result."""
    sv = gt.saved(node)
    x, r = sv["self"], sv["result"]
    mask = x == r
    return _each(node, lambda i: mask * (grads[0] / mask.sum()))


def amax(node, grads, gt):
    """AmaxBackward0 / AminBackward0: split evenly over the extremal positions of each reduced slice."""
    sv = gt.saved(node)
    x, r = sv["self"], sv["result"]
    xp = gt.xp(node)
    dims = reduced_dims(node, x.ndim)
    g = grads[0]
    if not sv.get("keepdim", False):
        for d in dims:
            g = xp.expand_dims(g, d)
            r = xp.expand_dims(r, d)
    mask = x == r
    return _each(node, lambda i: mask * (g / mask.sum(axis=tuple(dims), keepdims=True)))


def mse_loss(node, grads, gt):
    sv = gt.saved(node)
    x, t = sv["self"], sv["target"]
    g = grads[0]
    d = 2 * (x - t) * g
    if sv.get("reduction", 1) == 1:
        d = d / x.size
    return _each(node, lambda i: d if i == 0 else -d)


def nll_loss(node, grads, gt):
    """NllLossBackward0: -weight[target] * grad at the target class, averaged by total_weight for 'mean'."""
    sv = gt.saved(node)
    x = sv["self"]
    target = sv["target"].astype(np.int64, copy=False)
    weight = sv.get("weight")
    reduction = sv.get("reduction", 1)
    ignore = signed(sv.get("ignore_index", -100))
    xp = gt.xp(node)
    g = grads[0]
    batched = x.ndim >= 2
    cls_axis = 1 if batched else 0
    valid = target != ignore
    safe_t = xp.where(valid, target, 0)
    w = (weight[safe_t] if weight is not None else xp.ones(safe_t.shape, dtype=x.dtype)) * valid
    if reduction == 0:
        scale = -w * g
    else:
        scale = -w * g
        if reduction == 1:
            scale = scale / sv["total_weight"]

    def out(i):
        grad_in = xp.zeros(x.shape, dtype=x.dtype)
        idx = xp.expand_dims(safe_t, cls_axis)
        vals = xp.expand_dims(xp.asarray(scale, dtype=x.dtype) * xp.ones(safe_t.shape, dtype=x.dtype), cls_axis)
        xp.put_along_axis(grad_in, idx, vals, axis=cls_axis)
        return grad_in
    return _each(node, out)
