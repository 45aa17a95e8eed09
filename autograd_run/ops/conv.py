"""Convolutional networks and normalisation: convolution, max/avg pooling, batch norm, layer norm.

N-dimensional (1d, 2d, 3d) and grouped; the input is windowed with
``as_strided`` (no copy) and contracted with ``einsum``; the input gradient
is scattered back window offset by window offset. Transposed convolutions
and ceil-mode average pooling have no rule here: capture marks them opaque
(``unsupported``) and the rules refuse them.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each
from autograd_run.ops.spec import op
def _stride_tricks(xp):
    if xp is np:
        return np.lib.stride_tricks.as_strided
    import cupy
    return cupy.lib.stride_tricks.as_strided


def _windows(xp, xpad, ks, out, stride, dilation):
    """View of shape (N, C, *ks, *out): element [n, c, k..., o...] = xpad[n, c, o*stride + k*dilation]."""
    k = len(ks)
    s = xpad.strides
    shape = xpad.shape[:2] + tuple(ks) + tuple(out)
    strides = s[:2] + tuple(s[2 + i] * dilation[i] for i in range(k)) + tuple(s[2 + i] * stride[i] for i in range(k))
    return _stride_tricks(xp)(xpad, shape, strides)


def _scatter(dxpad, dwin, ks, out, stride, dilation, channels=slice(None)):
    """Add window gradients (N, C, *ks, *out) back into the padded input gradient."""
    k = len(ks)
    for kk in itertools.product(*(range(n) for n in ks)):
        sl = tuple(slice(kk[i] * dilation[i], kk[i] * dilation[i] + stride[i] * (out[i] - 1) + 1, stride[i])
                   for i in range(k))
        dxpad[(slice(None), channels) + sl] += dwin[(slice(None), slice(None)) + kk]


def _crop(dxpad, padding):
    return dxpad[(slice(None), slice(None)) + tuple(slice(p, dxpad.shape[2 + i] - p) for i, p in enumerate(padding))]


def _conv_flops(s: cost.Shapes) -> float:
    """2 * (grad elements) * (input channels per group * kernel elements), per produced input/weight gradient."""
    g = s.inputs[0][0] if s.inputs else ()
    w = s.outputs[1][0] if len(s.outputs) > 1 and s.outputs[1] is not None else s.saved.get("weight", ((),))[0]
    if len(w) < 2:
        return float(2 * math.prod(g))
    per_out = 2.0 * math.prod(g) * w[1] * math.prod(w[2:])
    n = sum(1 for m in s.outputs[:2] if m is not None)
    bias = math.prod(g) if len(s.outputs) > 2 and s.outputs[2] is not None else 0
    return per_out * n + bias


def _transposed(saved) -> str | None:
    return "transposed convolutions have no backward rule here" if saved.get("transposed") else None


def _ceil_mode(saved) -> str | None:
    return "ceil_mode pooling has no backward rule here" if saved.get("ceil_mode") else None


@op("ConvolutionBackward0",
    saved="input:tensor weight:tensor stride:ints padding:ints dilation:ints groups:int? transposed:bool? "
          "output_padding:ints? bias_sym_sizes_opt:sizes?",
    cost=cost.CostModel(_conv_flops), unsupported=_transposed)
def convolution(node, grads, ctx):
    """convolution (1d-3d, grouped, strided, dilated, padded): input, weight and bias gradients."""
    sv = ctx.saved(node)
    if sv.get("transposed"):
        raise RuntimeError(f"{node.name} node {node.id!r}: transposed convolutions have no backward rule here")
    xp = ctx.xp(node)
    x, w, g = sv["input"], sv["weight"], grads[0]
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x, g = x[None], g[None]
    k = x.ndim - 2
    stride, padding = list(sv["stride"]), list(sv["padding"])
    dilation, groups = list(sv["dilation"]), int(sv.get("groups", 1))
    ks, out = w.shape[2:], g.shape[2:]
    xpad = xp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    win = _windows(xp, xpad, ks, out, stride, dilation)
    C, O = x.shape[1], w.shape[0]
    cg, og = C // groups, O // groups
    K = "ijl"[:k]
    S = "xyz"[:k]

    def grad_input():
        dxpad = xp.zeros(xpad.shape, dtype=x.dtype)
        for q in range(groups):
            dwin = xp.einsum(f"no{S},oc{K}->nc{K}{S}", g[:, q * og:(q + 1) * og], w[q * og:(q + 1) * og])
            _scatter(dxpad, dwin, ks, out, stride, dilation, slice(q * cg, (q + 1) * cg))
        dx = _crop(dxpad, padding)
        return dx[0] if unbatched else dx

    def grad_weight():
        parts = [xp.einsum(f"no{S},nc{K}{S}->oc{K}", g[:, q * og:(q + 1) * og], win[:, q * cg:(q + 1) * cg])
                 for q in range(groups)]
        return xp.concatenate(parts, axis=0)

    def grad_bias():
        return g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return each(node, lambda i: (grad_input, grad_weight, grad_bias)[i]())


@op("MaxPool1DWithIndicesBackward0", "MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0",
    saved="self:tensor result1:tensor kernel_size:ints stride:ints? padding:ints? dilation:ints? ceil_mode:bool?",
    cost=cost.COPY)
def max_pool(node, grads, ctx):
    """max pooling with indices: each output's gradient goes to the input position it chose."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, idx, g = sv["self"], sv["result1"].astype(np.int64, copy=False), grads[0]
    k = len(sv["kernel_size"])
    lead = x.shape[:-k]
    rows = int(math.prod(lead))
    flat = xp.zeros((rows, int(math.prod(x.shape[-k:]))), dtype=g.dtype)
    r = xp.arange(rows)[:, None]
    idx2 = idx.reshape(rows, -1)
    g2 = g.reshape(rows, -1)
    if xp is np:
        np.add.at(flat, (xp.broadcast_to(r, idx2.shape), idx2), g2)
    else:
        import cupyx
        cupyx.scatter_add(flat, (xp.broadcast_to(r, idx2.shape), idx2), g2)
    return each(node, lambda i: flat.reshape(x.shape))


@op("AvgPool2DBackward0", "AvgPool3DBackward0",
    saved="self:tensor kernel_size:ints stride:ints? padding:ints? ceil_mode:bool? count_include_pad:bool? "
          "divisor_override:int?",
    cost=cost.pointwise(1), unsupported=_ceil_mode)
def avg_pool(node, grads, ctx):
    """average pooling: each output's gradient spread evenly over its window."""
    sv = ctx.saved(node)
    if sv.get("ceil_mode"):
        raise RuntimeError(f"{node.name} node {node.id!r}: ceil_mode pooling has no backward rule here")
    xp = ctx.xp(node)
    x, g = sv["self"], grads[0]
    ks = list(sv["kernel_size"])
    k = len(ks)
    unbatched = x.ndim == k + 1
    if unbatched:
        x, g = x[None], g[None]
    stride = list(sv.get("stride") or ks)
    padding = list(sv.get("padding") or [0] * k)
    if len(stride) == 1 and k > 1:
        stride = stride * k
    if len(padding) == 1 and k > 1:
        padding = padding * k
    ones = [1] * k
    out = g.shape[2:]
    padded = tuple(n + 2 * p for n, p in zip(x.shape[2:], padding))
    override = sv.get("divisor_override")
    if override:
        div = float(override)
    elif sv.get("count_include_pad", True) or not any(padding):
        div = float(math.prod(ks))
    else:  # count only the input elements each window covers
        valid = xp.pad(xp.ones(x.shape[2:], dtype=g.dtype), [(p, p) for p in padding])[None, None]
        div = _windows(xp, valid, ks, out, stride, ones).sum(axis=tuple(range(2, 2 + k)))
    share = g / div
    dxpad = xp.zeros(x.shape[:2] + padded, dtype=g.dtype)
    dwin = xp.broadcast_to(share[(slice(None), slice(None)) + (None,) * k], x.shape[:2] + tuple(ks) + tuple(out))
    _scatter(dxpad, dwin, ks, out, stride, ones)
    dx = _crop(dxpad, padding)
    return each(node, lambda i: dx[0] if unbatched else dx)


@op("NativeBatchNormBackward0",
    saved="input:tensor weight:tensor? running_mean:tensor? running_var:tensor? result1:tensor? result2:tensor? "
          "training:bool? eps:scalar?",
    cost=cost.pointwise(8))
def batch_norm(node, grads, ctx):
    """batch norm, training (batch statistics) and eval (running statistics)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, g = sv["input"], grads[0]
    w = sv.get("weight")
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if sv.get("training"):
        mean, invstd = sv["result1"].reshape(shape), sv["result2"].reshape(shape)
    else:
        mean = sv["running_mean"].reshape(shape)
        invstd = (1.0 / xp.sqrt(sv["running_var"] + sv.get("eps", 1e-5))).reshape(shape)
    xhat = (x - mean) * invstd
    wv = w.reshape(shape) if w is not None else 1.0

    def out(i):
        if i == 0:
            dxhat = g * wv
            if not sv.get("training"):
                return dxhat * invstd
            m = x.size // x.shape[1]
            return invstd / m * (m * dxhat - dxhat.sum(axis=axes, keepdims=True)
                                 - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True))
        if i == 1:
            return (g * xhat).sum(axis=axes)
        return g.sum(axis=axes)
    return each(node, out)


@op("NativeLayerNormBackward0",
    saved="input:tensor result1:tensor result2:tensor normalized_shape:sizes weight:tensor? bias:tensor?",
    cost=cost.pointwise(8))
def layer_norm(node, grads, ctx):
    """layer norm over the last len(normalized_shape) dims: input, weight and bias gradients."""
    sv = ctx.saved(node)
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
    return each(node, out)
