"""Backward rules for convolutional networks: convolution, max/avg pooling, batch norm.

N-dimensional (1d, 2d, 3d) and grouped; the input is windowed with
``as_strided`` (no copy) and contracted with ``einsum``; the input gradient
is scattered back window offset by window offset. Transposed convolutions
and ceil-mode pooling have no rule here and say so.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from autograd_run.engine.rules_more import _each


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


def convolution(node, grads, gt):
    sv = gt.saved(node)
    if sv.get("transposed"):
        raise RuntimeError(f"{node.name} node {node.id!r}: transposed convolutions have no backward rule here")
    xp = gt.xp(node)
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
    return _each(node, lambda i: (grad_input, grad_weight, grad_bias)[i]())


def max_pool(node, grads, gt):
    """MaxPool{1,2,3}DWithIndicesBackward0: each output's gradient goes to the input position it chose."""
    sv = gt.saved(node)
    xp = gt.xp(node)
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
    return _each(node, lambda i: flat.reshape(x.shape))


def avg_pool(node, grads, gt):
    """AvgPool{1,2,3}DBackward0: each output's gradient spread evenly over its window."""
    sv = gt.saved(node)
    if sv.get("ceil_mode"):
        raise RuntimeError(f"{node.name} node {node.id!r}: ceil_mode pooling has no backward rule here")
    xp = gt.xp(node)
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
    return _each(node, lambda i: dx[0] if unbatched else dx)


def batch_norm(node, grads, gt):
    """NativeBatchNormBackward0, training (batch statistics) and eval (running statistics)."""
    sv = gt.saved(node)
    xp = gt.xp(node)
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
    return _each(node, out)
