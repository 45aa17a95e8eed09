"""Convolutional networks, normalisation and resampling.

* Convolution (1d-3d, grouped, strided, dilated, padded, transposed with
  output padding) and its double backward; unfold/fold (im2col/col2im);
  pixel shuffle/unshuffle.
* Pooling: max (with indices, adaptive), average (ceil mode, padding,
  divisor override), adaptive average; and their double backward.
* Normalisation: batch (also ``_native_batch_norm_legit`` and ``_batch_norm_with_update`` / ``_no_update``),
  layer, group, weight norm, in the order of PyTorch's CPU kernels, with their fused multiply-adds
  (``_fma``): near zero, where their terms cancel, the textbook forms give other rounding noise.
* Dropout's double backward (``native_dropout_backward`` differentiated).
* Resampling: nearest / nearest-exact / (bi/tri)linear / bicubic
  (antialiased too) interpolation, reflection and replication padding;
  and their double backward.

The input is windowed with ``as_strided`` (no copy) and contracted with
``einsum``; the input gradient is scattered back window offset by window
offset. Average pooling, adaptive average pooling, upsampling and padding
are separable linear maps: each spatial dim gets a small (out, in) matrix,
built once per call, and the gradient is contracted with them dim by dim
(the forward map, used by double backward, with the same matrices). A
gradient with NaN or infinite values follows the maps' entries instead, one
by one as PyTorch's loops visit them (``Taps``), so the NaN reaches what
PyTorch's does and no more.
Complex convolutions conjugate the other operand, as PyTorch does.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import add_at, each, signed
from autograd_run.ops.numeric import conj, num
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


def _scatter(dxpad, dwin, ks, out, stride, dilation):
    """Add window gradients (N, C, *ks, *out) back into the padded input gradient."""
    k = len(ks)
    for kk in itertools.product(*(range(n) for n in ks)):
        sl = tuple(slice(kk[i] * dilation[i], kk[i] * dilation[i] + stride[i] * (out[i] - 1) + 1, stride[i])
                   for i in range(k))
        dxpad[(slice(None), slice(None)) + sl] += dwin[(slice(None), slice(None)) + kk]


def _crop(dxpad, padding):
    return dxpad[(slice(None), slice(None)) + tuple(slice(p, dxpad.shape[2 + i] - p) for i, p in enumerate(padding))]


def _pad(xp, x, padding):
    if not any(padding):
        return x
    return xp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])


def _letters(k):
    return "ijl"[:k], "xyz"[:k]


def _grouped(a, groups, axis):
    """``a`` with axis ``axis`` split into (groups, size / groups): a view, also of a strided window view."""
    return a.reshape(a.shape[:axis] + (groups, a.shape[axis] // groups) + a.shape[axis + 1:])


def conv_forward(xp, x, w, stride, padding, dilation, groups):
    """The convolution (cross-correlation) of batched ``x`` (N, C, *) with ``w`` (O, C/groups, *k).

    Groups are one more index of the contraction (``g`` below), not a loop: a depthwise convolution has as
    many groups as channels."""
    k = x.ndim - 2
    ks = w.shape[2:]
    xpad = _pad(xp, x, padding)
    out = tuple((xpad.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(k))
    win = _windows(xp, xpad, ks, out, stride, dilation)
    K, S = _letters(k)
    if groups == 1:
        return xp.einsum(f"nc{K}{S},oc{K}->no{S}", win, w)
    y = xp.einsum(f"ngc{K}{S},goc{K}->ngo{S}", _grouped(win, groups, 1), _grouped(w, groups, 0))
    return y.reshape((y.shape[0], w.shape[0]) + y.shape[3:])


def conv_grad_input(xp, g, w, in_spatial, stride, padding, dilation, groups):
    """The adjoint of ``conv_forward`` in its input: ``g`` (N, O, *out) back to (N, C, *in_spatial)."""
    k = g.ndim - 2
    ks, out = w.shape[2:], g.shape[2:]
    C = w.shape[1] * groups
    padded = tuple(n + 2 * p for n, p in zip(in_spatial, padding))
    dxpad = xp.zeros((g.shape[0], C) + padded, dtype=xp.result_type(g, w))
    K, S = _letters(k)
    if groups == 1:
        dwin = xp.einsum(f"no{S},oc{K}->nc{K}{S}", g, w)
    else:
        dwin = xp.einsum(f"ngo{S},goc{K}->ngc{K}{S}", _grouped(g, groups, 1), _grouped(w, groups, 0))
        dwin = dwin.reshape((g.shape[0], C) + dwin.shape[3:])
    _scatter(dxpad, dwin, ks, out, stride, dilation)
    return _crop(dxpad, padding)


def conv_grad_weight(xp, g, x, ks, stride, padding, dilation, groups):
    """The adjoint of ``conv_forward`` in its weight: sum over positions of ``g`` times the windows of ``x``."""
    k = x.ndim - 2
    out = g.shape[2:]
    win = _windows(xp, _pad(xp, x, padding), ks, out, stride, dilation)
    K, S = _letters(k)
    if groups == 1:
        return xp.einsum(f"no{S},nc{K}{S}->oc{K}", g, win)
    dw = xp.einsum(f"ngo{S},ngc{K}{S}->goc{K}", _grouped(g, groups, 1), _grouped(win, groups, 1))
    return dw.reshape((g.shape[1],) + dw.shape[2:])


def _conv_flops(s: cost.Shapes) -> float:
    """2 * (grad elements) * (input channels per group * kernel elements), per produced input/weight gradient.

    For a transposed convolution the roles swap: the larger side is the produced input gradient's
    spatial extent times the weight's per-group output channels, which the same product covers
    when counted on the gradient with the more elements.
    """
    g = s.inputs[0][0] if s.inputs else ()
    w = s.outputs[1][0] if len(s.outputs) > 1 and s.outputs[1] is not None else s.saved.get("weight", ((),))[0]
    if len(w) < 2:
        return float(2 * math.prod(g))
    if s.values.get("transposed"):
        x = s.outputs[0][0] if s.outputs and s.outputs[0] is not None else s.saved.get("input", ((),))[0]
        per_out = 2.0 * max(math.prod(x), 1) * w[1] * math.prod(w[2:])
    else:
        per_out = 2.0 * math.prod(g) * w[1] * math.prod(w[2:])
    n = sum(1 for m in s.outputs[:2] if m is not None)
    bias = math.prod(g) if len(s.outputs) > 2 and s.outputs[2] is not None else 0
    return per_out * n + bias


def _per_dim(values, k, default):
    """A saved per-dim list as ``k`` ints: PyTorch saves one entry for all dims where it was given one
    (``padding="valid"`` saves ``[0]``), and none for the default."""
    values = [int(signed(v)) for v in (values or [])] or [default]
    return values * k if len(values) == 1 else values


def _conv_params(sv, k):
    stride, padding = _per_dim(sv["stride"], k, 1), _per_dim(sv["padding"], k, 0)
    dilation = _per_dim(sv.get("dilation"), k, 1)
    return stride, padding, dilation, int(signed(sv.get("groups", 1)))


@op("ConvolutionBackward0", outputs=3,
    saved="input:tensor weight:tensor stride:ints padding:ints dilation:ints groups:int? transposed:bool? "
          "output_padding:ints? bias_sym_sizes_opt:sizes?",
    cost=cost.CostModel(_conv_flops))
def convolution(node, grads, ctx):
    """convolution, plain or transposed (1d-3d, groups, stride, dilation, padding, output padding): all three."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, w, g = sv["input"], sv["weight"], grads[0]
    unbatched = x.ndim == w.ndim - 1
    if unbatched:
        x, g = x[None], g[None]
    k = x.ndim - 2
    stride, padding, dilation, groups = _conv_params(sv, k)
    transposed = bool(sv.get("transposed"))
    if x.size == 0:  # no input (zero batch or zero channels): every gradient is zero; PyTorch's output for
        # zero channels is (N, 0, *out), not (N, O, *out), so the formulas below cannot contract it with w
        dtype = xp.result_type(g, w)
        shapes = (sv["input"].shape, w.shape, tuple(sv.get("bias_sym_sizes_opt") or (w.shape[1] * groups
                                                                                       if transposed else w.shape[0],)))
        return each(node, lambda i: xp.zeros(shapes[i], dtype=dtype))

    def grad_input():
        if transposed:  # the outputs past the input's extent read only the output padding: cropped
            dx = conv_forward(xp, g, conj(w), stride, padding, dilation, groups)
            dx = dx[(slice(None), slice(None)) + tuple(slice(0, n) for n in x.shape[2:])]
        else:
            dx = conv_grad_input(xp, g, conj(w), x.shape[2:], stride, padding, dilation, groups)
        return dx[0] if unbatched else dx

    def grad_weight():
        if transposed:
            return conv_grad_weight(xp, conj(x), g, w.shape[2:], stride, padding, dilation, groups)
        return conv_grad_weight(xp, g, conj(x), w.shape[2:], stride, padding, dilation, groups)

    def grad_bias():
        return g.sum(axis=(0,) + tuple(range(2, g.ndim)))
    return each(node, lambda i: (grad_input, grad_weight, grad_bias)[i]())


@op("ConvolutionBackwardBackward0", outputs=3,
    saved="grad_output:tensor input:tensor weight:tensor stride:ints padding:ints dilation:ints groups:int? "
          "transposed:bool? output_padding:ints?",
    cost=cost.CostModel(lambda s: 2 * _conv_flops(s)))
def convolution_backward_backward(node, grads, ctx):
    """convolution's backward differentiated again: to grad_output, input and weight (plain or transposed)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    go, x, w = sv["grad_output"], sv["input"], sv["weight"]
    unbatched = x.ndim == w.ndim - 1
    ggi, ggw, ggb = (list(grads) + [None] * 3)[:3]
    if unbatched:
        go, x = go[None], x[None]
        ggi = None if ggi is None else ggi[None]
    k = x.ndim - 2
    stride, padding, dilation, groups = _conv_params(sv, k)
    transposed = bool(sv.get("transposed"))
    args = (stride, padding, dilation, groups)
    if x.size == 0:  # no input (a zero batch): PyTorch leaves the input's and weight's terms undefined
        ggi = ggw = None

    def grad_grad_output():
        total = None
        if ggi is not None:
            t = (conv_grad_input(xp, ggi, w, go.shape[2:], *args) if transposed
                 else conv_forward(xp, ggi, w, *args))
            total = t
        if ggw is not None:
            t = (conv_grad_input(xp, x, ggw, go.shape[2:], *args) if transposed
                 else conv_forward(xp, x, ggw, *args))
            total = t if total is None else total + t
        if ggb is not None:
            t = ggb.reshape((1, -1) + (1,) * k)
            total = xp.broadcast_to(t, go.shape) if total is None else total + t
        if total is None:
            return None
        return total[0] if unbatched else total

    def grad_input():
        if ggw is None:
            return None
        if transposed:  # cropped to the input, as in the first backward
            dx = conv_forward(xp, go, conj(ggw), *args)
            dx = dx[(slice(None), slice(None)) + tuple(slice(0, n) for n in x.shape[2:])]
        else:
            dx = conv_grad_input(xp, go, conj(ggw), x.shape[2:], *args)
        return dx[0] if unbatched else dx

    def grad_weight():
        if ggi is None:
            return None
        if transposed:
            return conv_grad_weight(xp, conj(ggi), go, w.shape[2:], *args)
        return conv_grad_weight(xp, go, conj(ggi), w.shape[2:], *args)
    return each(node, lambda i: (grad_grad_output, grad_input, grad_weight)[i]())


# --- unfold / fold, pixel shuffle ------------------------------------------------------------------------


def _im2col(xp, x, ks, dilation, padding, stride):
    """(N, C, H, W) -> (N, C * kh * kw, L), PyTorch's unfold layout."""
    xpad = _pad(xp, x, padding)
    out = tuple((xpad.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(2))
    win = _windows(xp, xpad, ks, out, stride, dilation)
    return win.reshape(x.shape[0], x.shape[1] * ks[0] * ks[1], out[0] * out[1])


def _col2im(xp, cols, size, ks, dilation, padding, stride):
    """(N, C * kh * kw, L) -> (N, C, H, W): the adjoint of ``_im2col`` (overlapping windows add up)."""
    n = cols.shape[0]
    c = cols.shape[1] // (ks[0] * ks[1])
    padded = tuple(s + 2 * p for s, p in zip(size, padding))
    out = tuple((padded[i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(2))
    dwin = cols.reshape((n, c) + tuple(ks) + out)
    dxpad = xp.zeros((n, c) + padded, dtype=cols.dtype)
    _scatter(dxpad, dwin, ks, out, stride, dilation)
    return _crop(dxpad, padding)


@op("Im2ColBackward0", outputs=1,
    saved="kernel_size:ints dilation:ints padding:ints stride:ints self_sym_argsize_minus_2:int "
          "self_sym_argsize_minus_1:int", cost=cost.COPY)
def im2col(node, grads, ctx):
    """unfold (im2col): the column gradients added back into their windows (col2im)."""
    sv = node.saved
    g = grads[0]
    unbatched = g.ndim == 2
    if unbatched:
        g = g[None]
    size = (signed(sv["self_sym_argsize_minus_2"]), signed(sv["self_sym_argsize_minus_1"]))
    dx = _col2im(ctx.xp(node), g, size, list(sv["kernel_size"]), list(sv["dilation"]), list(sv["padding"]),
                 list(sv["stride"]))
    return each(node, lambda i: dx[0] if unbatched else dx)


@op("Col2ImBackward0", outputs=1, saved="kernel_size:ints dilation:ints padding:ints stride:ints", cost=cost.COPY)
def col2im(node, grads, ctx):
    """fold (col2im): the gradient read back window by window (im2col)."""
    sv = node.saved
    g = grads[0]
    unbatched = g.ndim == 3
    if unbatched:
        g = g[None]
    cols = _im2col(ctx.xp(node), g, list(sv["kernel_size"]), list(sv["dilation"]), list(sv["padding"]),
                   list(sv["stride"]))
    return each(node, lambda i: cols[0] if unbatched else cols)


def _pixel_shuffle(xp, t, r):
    """(*, C r r, H, W) -> (*, C, H r, W r)."""
    *lead, c, h, w = t.shape
    t = t.reshape(tuple(lead) + (c // (r * r), r, r, h, w))
    n = len(lead)
    t = t.transpose(tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return t.reshape(tuple(lead) + (c // (r * r), h * r, w * r))


def _pixel_unshuffle(xp, t, r):
    """(*, C, H r, W r) -> (*, C r r, H, W)."""
    *lead, c, h, w = t.shape
    t = t.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    n = len(lead)
    t = t.transpose(tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return t.reshape(tuple(lead) + (c * r * r, h // r, w // r))


@op("PixelShuffleBackward0", outputs=1, saved="upscale_factor:int", cost=cost.COPY)
def pixel_shuffle(node, grads, ctx):
    """pixel_shuffle(a, r): the gradient unshuffled."""
    return each(node, lambda i: _pixel_unshuffle(ctx.xp(node), grads[0], int(node.saved["upscale_factor"])))


@op("PixelUnshuffleBackward0", outputs=1, saved="downscale_factor:int", cost=cost.COPY)
def pixel_unshuffle(node, grads, ctx):
    """pixel_unshuffle(a, r): the gradient shuffled."""
    return each(node, lambda i: _pixel_shuffle(ctx.xp(node), grads[0], int(node.saved["downscale_factor"])))


# --- separable linear maps: pooling, upsampling, padding ---------------------------------------------------


class Taps:
    """One spatial dim of a separable linear map (in -> out) as PyTorch's kernels visit it: (out, in, weight)
    entries, repeats and zero weights kept, and the dense (out, in) matrix they sum to.

    A finite gradient goes through the dense matrix. A NaN or infinite one follows the entries, as in PyTorch's
    loops: each entry adds weight * g, so a zero-weight entry still carries NaN (0 * inf) and an element no entry
    reaches stays 0, where a product with the dense matrix would spread NaN everywhere (0 * nan).
    """

    __slots__ = ("shape", "out", "inp", "weight", "dense")

    def __init__(self, n_out, n_in, out, inp, weight):
        self.shape = (n_out, n_in)
        self.out = np.asarray(out, dtype=np.int64).reshape(-1)
        self.inp = np.asarray(inp, dtype=np.int64).reshape(-1)
        self.weight = np.broadcast_to(np.asarray(weight, dtype=np.float64), self.out.shape)
        self.dense = np.zeros(self.shape)
        add_at(np, self.dense, (self.out, self.inp), self.weight)


def _follow_taps(xp, t, taps, axis, adjoint):
    """``t`` mapped along ``axis`` entry by entry (in -> out, or out -> in for the adjoint)."""
    src, dst = (taps.out, taps.inp) if adjoint else (taps.inp, taps.out)
    n_dst = taps.shape[1] if adjoint else taps.shape[0]
    moved = xp.moveaxis(t, axis, 0)
    w = xp.asarray(taps.weight, dtype=t.dtype).reshape((-1,) + (1,) * (moved.ndim - 1))
    out = xp.zeros((n_dst,) + moved.shape[1:], dtype=t.dtype)
    add_at(xp, out, xp.asarray(dst), moved[xp.asarray(src)] * w)
    return xp.moveaxis(out, 0, axis)


def apply_dims(xp, t, maps, adjoint):
    """Map the last ``len(maps)`` dims of ``t`` (``Taps``): in -> out, or (adjoint) out -> in."""
    k = len(maps)
    finite = bool(xp.isfinite(t).all())
    for j, m in enumerate(maps):
        axis = t.ndim - k + j
        if finite:
            mat = xp.asarray(m.dense.T if adjoint else m.dense, dtype=t.dtype)
            t = xp.moveaxis(xp.tensordot(t, mat, axes=([axis], [1])), -1, axis)
        else:
            t = _follow_taps(xp, t, m, axis, adjoint)
    return t


def _scale_value(scale, n_in, n_out):
    """PyTorch's compute_scales_value: 1 / scale when a scale was given, else in / out."""
    scale = num(scale)
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def nearest_matrix(n_in, n_out, scale=None, exact=False):
    """Nearest upsampling along one dim: which input element each output reads."""
    dst = np.arange(n_out)
    if n_out == n_in:
        src = dst
    elif n_out == 2 * n_in and not exact:
        src = dst >> 1
    else:  # PyTorch computes the index in single precision
        s = np.float32(_scale_value(scale, n_in, n_out))
        pos = (dst.astype(np.float32) + np.float32(0.5)) * s if exact else dst.astype(np.float32) * s
        src = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
    return Taps(n_out, n_in, dst, src, 1.0)


def identity_taps(n):
    return Taps(n, n, np.arange(n), np.arange(n), 1.0)


def _linear_ratio(n_in, n_out, align_corners, scale):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return _scale_value(scale, n_in, n_out)


def _source_index(ratio, dst, align_corners, cubic):
    if align_corners:
        return ratio * dst
    src = ratio * (dst + 0.5) - 0.5
    return src if cubic else np.maximum(src, 0.0)


def linear_matrix(n_in, n_out, align_corners=False, scale=None):
    """Linear interpolation along one dim (PyTorch's source index and lambda): two taps per output, the second
    of weight 0 on the same element when the sizes are equal."""
    dst = np.arange(n_out)
    if n_out == n_in:
        return Taps(n_out, n_in, np.repeat(dst, 2), np.repeat(dst, 2), np.tile([1.0, 0.0], n_out))
    real = _source_index(_linear_ratio(n_in, n_out, align_corners, scale), dst.astype(np.float64), align_corners,
                         False)
    i0 = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
    lam1 = np.clip(real - i0, 0.0, 1.0)
    i1 = i0 + (i0 < n_in - 1)
    return Taps(n_out, n_in, np.concatenate([dst, dst]), np.concatenate([i0, i1]), np.concatenate([1.0 - lam1, lam1]))


def _cubic_weights(t, a=-0.75):
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return far(t + 1), near(t), near(1 - t), far(2 - t)


def cubic_matrix(n_in, n_out, align_corners=False, scale=None):
    """Bicubic (a = -0.75) interpolation along one dim: four taps per output, clamped at the borders."""
    dst = np.arange(n_out)
    real = _source_index(_linear_ratio(n_in, n_out, align_corners, scale), dst.astype(np.float64), align_corners,
                         True)
    i = np.floor(real).astype(np.int64)
    t = real - i
    outs, ins, ws = [], [], []
    for off, wt in zip((-1, 0, 1, 2), _cubic_weights(t)):
        outs.append(dst)
        ins.append(np.clip(i + off, 0, n_in - 1))
        ws.append(wt)
    return Taps(n_out, n_in, np.concatenate(outs), np.concatenate(ins), np.concatenate(ws))


def _triangle(x):
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _keys_cubic(x, a=-0.5):
    x = np.abs(x)
    return np.where(x < 1.0, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2.0, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def antialias_matrix(n_in, n_out, align_corners=False, scale=None, cubic=False):
    """Antialiased (PIL-style) bilinear or bicubic resampling along one dim.

    Downsampling widens the filter by the scale; each output's weights are normalised to sum to one.
    """
    ratio = _linear_ratio(n_in, n_out, align_corners, scale)
    interp = 4 if cubic else 2
    support = interp / 2 * ratio if ratio >= 1.0 else interp / 2
    invscale = 1.0 / ratio if ratio >= 1.0 else 1.0
    max_taps = int(math.ceil(support)) * 2 + 1
    filt = _keys_cubic if cubic else _triangle
    outs, ins, ws = [], [], []
    for i in range(n_out):
        center = ratio * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        size = min(max(min(int(center + support + 0.5), n_in) - lo, 0), max_taps)
        w = filt((np.arange(size) + lo - center + 0.5) * invscale)
        total = w.sum()
        outs.append(np.full(size, i))
        ins.append(np.arange(lo, lo + size))
        ws.append(w / total if total != 0.0 else w)
    return Taps(n_out, n_in, np.concatenate(outs), np.concatenate(ins), np.concatenate(ws))


def _window_taps(n_out, n_in, windows):
    """Taps of outputs that each spread one weight over a window of inputs: (a, b, weight) per output."""
    outs, ins, ws = [], [], []
    for o, (a, b, w) in enumerate(windows):
        if b > a:
            outs.append(np.full(b - a, o))
            ins.append(np.arange(a, b))
            ws.append(np.full(b - a, w))
    if not outs:
        return Taps(n_out, n_in, [], [], [])
    return Taps(n_out, n_in, np.concatenate(outs), np.concatenate(ins), np.concatenate(ws))


def adaptive_avg_matrix(n_in, n_out):
    """Output o averages inputs floor(o in / out) to ceil((o + 1) in / out)."""
    windows = []
    for o in range(n_out):
        a, b = (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)
        windows.append((a, b, 1.0 / (b - a)))
    return _window_taps(n_out, n_in, windows)


def avg_pool_matrix(n_in, n_out, k, stride, pad, count_include_pad=True, unit=False):
    """Averaging weights of one dim of average pooling (PyTorch's window and divisor rules)."""
    windows = []
    for o in range(n_out):
        start = o * stride - pad
        end = min(start + k, n_in + pad)
        size = end - start
        a, b = max(start, 0), min(end, n_in)
        windows.append((a, b, 1.0 if unit else 1.0 / (size if count_include_pad else max(b - a, 1))))
    return _window_taps(n_out, n_in, windows)


def pool_out_size(n_in, k, stride, pad, ceil_mode, dilation=1):
    span = n_in + 2 * pad - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= n_in + pad:
        out -= 1
    return out


def pad_matrix(n_in, left, right, mode):
    """Reflection or replication padding along one dim: the input element each padded one copies."""
    n_out = n_in + left + right
    src = np.arange(n_out) - left
    if mode == "reflect":
        src = np.abs(src)
        src = np.where(src >= n_in, 2 * (n_in - 1) - src, src)
    else:
        src = np.clip(src, 0, n_in - 1)
    return Taps(n_out, n_in, np.arange(n_out), src, 1.0)


def _spatial_k(name: str) -> int:
    for k in (1, 2, 3):
        if f"{k}D" in name:
            return k
    raise ValueError(name)


def _scales(sv, k):
    keys = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}[k]
    return [sv.get(key) for key in keys]


def _upsample_mats(name, sv, in_spatial, out_spatial):
    k = len(in_spatial)
    scales = _scales(sv, k)
    if "Nearest" in name:
        exact = "Exact" in name
        return [nearest_matrix(i, o, s, exact) for i, o, s in zip(in_spatial, out_spatial, scales)]
    ac = bool(sv.get("align_corners"))
    if name.startswith(("UpsampleBilinear2DAa", "UpsampleBicubic2DAa")):
        cubic = "Bicubic" in name
        return [antialias_matrix(i, o, ac, s, cubic) for i, o, s in zip(in_spatial, out_spatial, scales)]
    if "Bicubic" in name:
        if tuple(in_spatial) == tuple(out_spatial):  # PyTorch copies (no taps of weight 0 around each element)
            return [identity_taps(n) for n in in_spatial]
        return [cubic_matrix(i, o, ac, s) for i, o, s in zip(in_spatial, out_spatial, scales)]
    return [linear_matrix(i, o, ac, s) for i, o, s in zip(in_spatial, out_spatial, scales)]


_UPSAMPLE = ("UpsampleNearest1D", "UpsampleNearest2D", "UpsampleNearest3D", "UpsampleNearestExact1D",
             "UpsampleNearestExact2D", "UpsampleNearestExact3D", "UpsampleLinear1D", "UpsampleBilinear2D",
             "UpsampleTrilinear3D", "UpsampleBicubic2D", "UpsampleBilinear2DAa", "UpsampleBicubic2DAa")


@op(*(f"{n}Backward0" for n in _UPSAMPLE), outputs=1,
    saved="output_size:sizes self_sym_sizes:sizes align_corners:bool? scales:scalar? scales_d:scalar? "
          "scales_h:scalar? scales_w:scalar?",
    cost=cost.reduction(2))
def upsample(node, grads, ctx):
    """nearest / nearest-exact / linear / bilinear / trilinear / bicubic (also antialiased) resampling: each
    output's gradient back to the inputs it read, with its interpolation weights."""
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    k = _spatial_k(node.name)
    mats = _upsample_mats(node.name, sv, sizes[-k:], tuple(sv["output_size"]))
    return each(node, lambda i: apply_dims(ctx.xp(node), grads[0], mats, adjoint=True))


@op(*(f"{n}BackwardBackward0" for n in _UPSAMPLE), outputs=1,
    saved="output_size:sizes align_corners:bool? scales:scalar? scales_d:scalar? scales_h:scalar? scales_w:scalar?",
    cost=cost.reduction(2))
def upsample_backward_backward(node, grads, ctx):
    """upsampling's backward is linear in its gradient: the upsampled gradient (the forward map)."""
    sv = node.saved
    g = grads[0]
    k = _spatial_k(node.name)
    mats = _upsample_mats(node.name, sv, g.shape[-k:], tuple(sv["output_size"]))
    return each(node, lambda i: apply_dims(ctx.xp(node), g, mats, adjoint=False))


@op("AdaptiveAvgPool2DBackward0", "AdaptiveAvgPool3DBackward0", outputs=1, saved="self:tensor", cost=cost.reduction(1))
def adaptive_avg_pool(node, grads, ctx):
    """adaptive average pooling: each output's gradient spread evenly over its (possibly overlapping) window."""
    x = ctx.saved(node)["self"]
    g = grads[0]
    k = _spatial_k(node.name)
    mats = [adaptive_avg_matrix(i, o) for i, o in zip(x.shape[-k:], g.shape[-k:])]
    return each(node, lambda i: apply_dims(ctx.xp(node), g, mats, adjoint=True))


@op("AdaptiveAvgPool2DBackwardBackward0", "AdaptiveAvgPool3DBackwardBackward0", outputs=2,
    saved="grad_output_sym_argsize_minus_3:int? grad_output_sym_argsize_minus_2:int "
          "grad_output_sym_argsize_minus_1:int", cost=cost.reduction(1))
def adaptive_avg_pool_backward_backward(node, grads, ctx):
    """adaptive average pooling's backward, differentiated: the pooled gradient to grad_output; zero to the input."""
    sv = node.saved
    g = grads[0]
    k = _spatial_k(node.name)
    out = [int(sv[f"grad_output_sym_argsize_minus_{j}"]) for j in range(k, 0, -1)]
    mats = [adaptive_avg_matrix(i, o) for i, o in zip(g.shape[-k:], out)]
    xp = ctx.xp(node)
    return each(node, lambda i: apply_dims(xp, g, mats, adjoint=False) if i == 0 else xp.zeros_like(g))


def _avg_pool_mats(sv, in_spatial, out_spatial=None):
    ks = list(sv["kernel_size"])
    k = len(in_spatial)
    if len(ks) == 1:
        ks = ks * k
    stride = list(sv.get("stride") or ks)
    padding = list(sv.get("padding") or [0] * k)
    stride = stride * k if len(stride) == 1 else stride
    padding = padding * k if len(padding) == 1 else padding
    ceil_mode = bool(sv.get("ceil_mode"))
    if out_spatial is None:
        out_spatial = [pool_out_size(n, kk, s, p, ceil_mode) for n, kk, s, p in zip(in_spatial, ks, stride, padding)]
    override = signed(sv.get("divisor_override"))
    include = sv.get("count_include_pad", True)
    mats = [avg_pool_matrix(n, o, kk, s, p, include, unit=bool(override))
            for n, o, kk, s, p in zip(in_spatial, out_spatial, ks, stride, padding)]
    return mats, (float(override) if override else None)


@op("AvgPool2DBackward0", "AvgPool3DBackward0", outputs=1,
    saved="self:tensor kernel_size:ints stride:ints? padding:ints? ceil_mode:bool? count_include_pad:bool? "
          "divisor_override:int?",
    cost=cost.reduction(1))
def avg_pool(node, grads, ctx):
    """average pooling (padding, ceil mode, count_include_pad, divisor_override): each output's gradient spread
    over its window."""
    sv = ctx.saved(node)
    x, g = sv["self"], grads[0]
    k = _spatial_k(node.name)
    mats, override = _avg_pool_mats(sv, x.shape[-k:], g.shape[-k:])
    dx = apply_dims(ctx.xp(node), g, mats, adjoint=True)
    return each(node, lambda i: dx / override if override else dx)


@op("AvgPool2DBackwardBackward0", "AvgPool3DBackwardBackward0", outputs=2,
    saved="kernel_size:ints stride:ints? padding:ints? ceil_mode:bool? count_include_pad:bool? divisor_override:int?",
    cost=cost.reduction(1))
def avg_pool_backward_backward(node, grads, ctx):
    """average pooling's backward, differentiated: the pooled gradient to grad_output; zero to the input."""
    g = grads[0]
    k = _spatial_k(node.name)
    mats, override = _avg_pool_mats(node.saved, g.shape[-k:])
    xp = ctx.xp(node)

    def out(i):
        if i == 1:
            return xp.zeros_like(g)
        y = apply_dims(xp, g, mats, adjoint=False)
        return y / override if override else y
    return each(node, out)


def _pad_mats(padding, in_spatial, mode):
    k = len(in_spatial)
    pads = list(padding)
    return [pad_matrix(n, signed(pads[2 * (k - 1 - j)]), signed(pads[2 * (k - 1 - j) + 1]), mode)
            for j, n in enumerate(in_spatial)]


_PADS = ("ReflectionPad1D", "ReflectionPad2D", "ReflectionPad3D", "ReplicationPad1D", "ReplicationPad2D",
         "ReplicationPad3D")


@op(*(f"{n}Backward0" for n in _PADS), outputs=1, saved="self:tensor padding:ints", cost=cost.reduction(1))
def reflection_replication_pad(node, grads, ctx):
    """reflection / replication padding: each padded element's gradient back to the element it copies."""
    x = ctx.saved(node)["self"]
    k = _spatial_k(node.name)
    mode = "reflect" if node.name.startswith("Reflection") else "replicate"
    mats = _pad_mats(node.saved["padding"], x.shape[-k:], mode)
    return each(node, lambda i: apply_dims(ctx.xp(node), grads[0], mats, adjoint=True))


@op(*(f"{n}BackwardBackward0" for n in _PADS), outputs=2, saved="padding:ints", cost=cost.reduction(1))
def pad_backward_backward(node, grads, ctx):
    """padding's backward, differentiated: the padded gradient to grad_output; zero to the input."""
    g = grads[0]
    k = _spatial_k(node.name)
    mode = "reflect" if node.name.startswith("Reflection") else "replicate"
    mats = _pad_mats(node.saved["padding"], g.shape[-k:], mode)
    xp = ctx.xp(node)
    return each(node, lambda i: apply_dims(xp, g, mats, adjoint=False) if i == 0 else xp.zeros_like(g))


# --- max pooling ------------------------------------------------------------------------------------------


def _scatter_indices(xp, g, idx, in_shape, k):
    """Add ``g`` into zeros of ``in_shape`` at flat spatial ``idx`` (the last ``k`` dims), row by row."""
    lead = in_shape[:-k]
    rows = int(math.prod(lead))
    flat = xp.zeros((rows, int(math.prod(in_shape[-k:]))), dtype=g.dtype)
    r = xp.arange(rows)[:, None]
    per_row = int(math.prod(idx.shape[-k:]))  # explicit: -1 cannot be inferred with zero rows
    idx2 = idx.reshape(rows, per_row)
    g2 = g.reshape(rows, per_row)
    add_at(xp, flat, (xp.broadcast_to(r, idx2.shape), idx2), g2)
    return flat.reshape(in_shape)


def _gather_indices(xp, g, idx, k):
    """Read ``g`` at flat spatial ``idx`` (the last ``k`` dims of ``g``), row by row: the adjoint of the scatter."""
    lead = g.shape[:-k]
    rows = int(math.prod(lead))
    out = xp.take_along_axis(g.reshape(rows, int(math.prod(g.shape[-k:]))),
                             idx.reshape(rows, int(math.prod(idx.shape[-k:]))), axis=1)
    return out.reshape(idx.shape)


@op("MaxPool1DWithIndicesBackward0", "MaxPool2DWithIndicesBackward0", "MaxPool3DWithIndicesBackward0", outputs=1,
    saved="self:tensor result1:tensor kernel_size:ints stride:ints? padding:ints? dilation:ints? ceil_mode:bool?",
    cost=cost.COPY)
def max_pool(node, grads, ctx):
    """max pooling with indices (any padding, dilation, ceil mode): each output's gradient to the input it chose."""
    sv = ctx.saved(node)
    x, idx = sv["self"], sv["result1"].astype(np.int64, copy=False)
    dx = _scatter_indices(ctx.xp(node), grads[0], idx, x.shape, _spatial_k(node.name))
    return each(node, lambda i: dx)


@op("AdaptiveMaxPool2DBackward0", "AdaptiveMaxPool3DBackward0", "FractionalMaxPool2DBackward0",
    "FractionalMaxPool3DBackward0", outputs=1, saved="self:tensor result1:tensor kernel_size:ints? output_size:ints?",
    cost=cost.COPY)
def adaptive_max_pool(node, grads, ctx):
    """adaptive and fractional max pooling: each output's gradient to the input it chose."""
    sv = ctx.saved(node)
    x, idx = sv["self"], sv["result1"].astype(np.int64, copy=False)
    dx = _scatter_indices(ctx.xp(node), grads[0], idx, x.shape, _spatial_k(node.name))
    return each(node, lambda i: dx)


@op("MaxPool2DWithIndicesBackwardBackward0", "MaxPool3DWithIndicesBackwardBackward0",
    "AdaptiveMaxPool2DBackwardBackward0", "AdaptiveMaxPool3DBackwardBackward0",
    "FractionalMaxPool2DBackwardBackward0", "FractionalMaxPool3DBackwardBackward0", outputs=2, saved="indices:tensor",
    cost=cost.COPY)
def max_pool_backward_backward(node, grads, ctx):
    """max (adaptive, fractional) pooling's backward, differentiated: the gradient at the chosen inputs to
    grad_output; zero to the input."""
    idx = ctx.saved(node)["indices"].astype(np.int64, copy=False)
    g = grads[0]
    xp = ctx.xp(node)
    k = _spatial_k(node.name)
    return each(node, lambda i: _gather_indices(xp, g, idx, k) if i == 0 else xp.zeros_like(g))


@op("MaxUnpool2DBackward0", "MaxUnpool3DBackward0", outputs=1, saved="indices:tensor", cost=cost.COPY)
def max_unpool(node, grads, ctx):
    """max_unpool(x, indices): x was written at the flat spatial indices, so its gradient is read there."""
    idx = ctx.saved(node)["indices"].astype(np.int64, copy=False)
    g = grads[0]
    k = 2 if node.name.startswith("MaxUnpool2D") else 3
    return each(node, lambda i: _gather_indices(ctx.xp(node), g, idx, k))


# --- normalisation ----------------------------------------------------------------------------------------


_SPLIT = 134217729.0  # 2**27 + 1: Veltkamp's split of a double into two 26-bit halves


def _fma(xp, a, b, c):
    """``a * b + c`` rounded once, as the fused multiply-adds the compiler makes of PyTorch's CPU kernels.

    Error-free transformations (Dekker's product, Knuth's sum): the exact product's rounding error is
    added back before the one rounding. Where those overflow, the plain ``a * b + c``. float32 and float16:
    in float64, where their product is exact, rounded back once more.
    """
    with np.errstate(all="ignore"):
        p = a * b
        dt = getattr(p, "dtype", None)
        if dt in (np.float32, np.float16):
            f = xp.float64
            return (xp.asarray(a, dtype=f) * xp.asarray(b, dtype=f) + xp.asarray(c, dtype=f)).astype(dt)
        if dt != np.float64:
            return p + c
        t = _SPLIT * a
        ah = t - (t - a)
        t = _SPLIT * b
        bh = t - (t - b)
        al, bl = a - ah, b - bh
        e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
        s = p + c
        v = s - p
        r = s + (((p - (s - v)) + (c - v)) + e)
        return xp.where(xp.isfinite(r), r, p + c)


def _batch_norm_backward(node, grads, ctx, mean_key, invstd_key, training, eps):
    """native_batch_norm_backward in the order of PyTorch's CPU kernel (contiguous input).

    Per channel c over its m = N * image elements: sum = sum(g), dotp = sum((x - mean) g);
    training: k = dotp invstd^2 / m, dx = (g - sum / m - (x - mean) k) invstd w, the last product fused
    (fma) where the image has more than one element (PyTorch's contiguous kernel; the channels-last one
    that runs for an (N, C) or (N, C, 1, ...) input does not fuse it); eval: dx = g invstd w with
    invstd = 1 / sqrt(running_var + eps) and mean the running mean; dw = dotp invstd, dbias = sum.
    Only the output's gradient counts: PyTorch's formula ignores those of the saved statistics.
    """
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, g = sv["input"], grads[0]
    if g is None:
        return [None] * len(node.next)
    w = sv.get("weight")
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if training:
        mean, invstd = sv[mean_key].reshape(shape), sv[invstd_key].reshape(shape)
    else:
        mean = sv["running_mean"].reshape(shape)
        invstd = (1.0 / xp.sqrt(sv["running_var"] + eps)).reshape(shape)
    image = int(math.prod(x.shape[2:]))
    m = x.size // x.shape[1] if x.shape[1] else 0
    centered = x - mean
    total = g.sum(axis=axes, keepdims=True)
    dotp = (centered * g).sum(axis=axes, keepdims=True)

    def out(i):
        if i == 0:
            if not training:
                dx = g * invstd
                return dx * w.reshape(shape) if w is not None else dx
            with np.errstate(divide="ignore", invalid="ignore"):
                k = dotp * invstd * invstd / m
                grad_mean = total / m
            t = _fma(xp, -centered, k, g - grad_mean) if image > 1 else g - grad_mean - centered * k
            t = t * invstd
            return t * w.reshape(shape) if w is not None else t
        if i == 1:
            return (dotp * invstd).reshape(x.shape[1])
        return total.reshape(x.shape[1])
    return each(node, out)


@op("NativeBatchNormBackward0", "NativeBatchNormLegitBackward0", "NativeBatchNormLegitBackward1", outputs=3,
    saved="input:tensor weight:tensor? running_mean:tensor? running_var:tensor? result1:tensor? result2:tensor? "
          "training:bool? eps:scalar?",
    cost=cost.pointwise(8))
def batch_norm(node, grads, ctx):
    """batch norm, training (batch statistics) and eval (running statistics); also ``_native_batch_norm_legit``
    (with running statistics: ...Backward0; without: ...Backward1), the same formula."""
    sv = node.saved
    return _batch_norm_backward(node, grads, ctx, "result1", "result2", bool(sv.get("training")),
                                num(sv.get("eps", 1e-5)))


@op("NativeBatchNormLegitNoTrainingBackward0", "BatchNormNoUpdateBackward0", outputs=3,
    saved="input:tensor weight:tensor? running_mean:tensor running_var:tensor result1:tensor? result2:tensor? "
          "result3:tensor? eps:scalar?",
    cost=cost.pointwise(4))
def batch_norm_eval(node, grads, ctx):
    """batch norm with the running statistics (``_native_batch_norm_legit_no_training``, ``_batch_norm_no_update``):
    native_batch_norm_backward with training false."""
    return _batch_norm_backward(node, grads, ctx, "result1", "result2", False, num(node.saved.get("eps", 1e-5)))


@op("BatchNormWithUpdateBackward0", outputs=3,
    saved="input:tensor weight:tensor? running_mean:tensor? running_var:tensor? result1:tensor result2:tensor "
          "result3:tensor? eps:scalar?",
    cost=cost.pointwise(8))
def batch_norm_with_update(node, grads, ctx):
    """``_batch_norm_with_update`` (training, running statistics updated): PyTorch's batch_norm_backward with
    update true, on the CPU native_batch_norm_backward with the batch statistics (result1 the mean, result2
    the inverse std; result3 is the empty reserve)."""
    return _batch_norm_backward(node, grads, ctx, "result1", "result2", True, num(node.saved.get("eps", 1e-5)))


@op("CudnnBatchNormBackward0", "MiopenBatchNormBackward0", outputs=3,
    saved="input:tensor weight:tensor? running_mean:tensor? running_var:tensor? result1:tensor? result2:tensor? "
          "result3:tensor? training:bool? epsilon:scalar?",
    cost=cost.pointwise(8))
def vendor_batch_norm(node, grads, ctx):
    """cuDNN / MIOpen batch norm: the same maths; result1 is the batch mean, result2 the inverse std."""
    sv = node.saved
    return _batch_norm_backward(node, grads, ctx, "result1", "result2", bool(sv.get("training", True)),
                                num(sv.get("epsilon", 1e-5)))


@op("NativeLayerNormBackward0", outputs=3,
    saved="input:tensor result1:tensor result2:tensor normalized_shape:sizes weight:tensor? bias:tensor?",
    cost=cost.pointwise(8))
def layer_norm(node, grads, ctx):
    """layer norm over the last len(normalized_shape) dims: input, weight and bias gradients (from the output's
    gradient only: PyTorch's formula ignores those of mean and rstd).

    PyTorch's CPU kernel, per row of n normalised elements, with a = rstd and its fused multiply-adds:
    ds = sum(g x w), db = sum(g w), b = fma(db, mean, -ds) a^3 / n, c = fma(-b, mean, -db a / n),
    dx = fma(b, x, a g w) + c; dw = sum over rows of g fma(a, x, -a mean); dbias = sum over rows of g.
    Where the row's values are far from zero (a large mean) the fused and unfused forms differ by
    far more than rounding (the terms cancel), so the fused ones are followed.
    """
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, mean, rstd = sv["input"], sv["result1"], sv["result2"]
    w = sv.get("weight")
    if w is not None and not hasattr(w, "ndim"):
        w = None
    k = len(sv["normalized_shape"])
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    g = grads[0]
    if g is None:
        return [None] * len(node.next)
    n = int(math.prod(x.shape[x.ndim - k:]))
    scale = 1.0 / n if n else 0.0

    def out(i):
        if i == 0:
            ds = (g * x if w is None else g * x * w).sum(axis=axes, keepdims=True)
            db = (g if w is None else g * w).sum(axis=axes, keepdims=True)
            a = rstd
            b = _fma(xp, db, mean, -ds) * a * a * a * scale
            c = _fma(xp, -b, mean, -(db * a * scale))
            return _fma(xp, b, x, a * g if w is None else a * g * w) + c
        if i == 1:
            t = g * _fma(xp, rstd, x, -rstd * mean)
            return t.sum(axis=lead) if lead else t
        return g.sum(axis=lead) if lead else g
    return each(node, out)


def _norm_double_backward(xp, x, go, w, mean, rstd, axes, ggx, ggw, ggb):
    """Batch / layer norm's backward (training statistics), differentiated again.

    The first backward maps (go, x, w) to dx = rstd/m (m d - sum d - xhat sum(d xhat)) with d = go w,
    dw = sum(go xhat), db = sum(go), sums over ``axes`` (m elements), xhat = (x - mean) rstd, and the
    statistics themselves functions of x. Returns the gradients for go and x, and the weight's
    gradient before its sum over the non-normalised axes (None where nothing flows).
    """
    m = 1
    for a in axes:
        m *= x.shape[a]

    def total(t):
        return t.sum(axis=axes, keepdims=True)
    xhat = (x - mean) * rstd
    d = go * w if w is not None else go
    g_go = g_x = g_w = None

    def add(acc, t):
        return t if acc is None else acc + t
    if ggx is not None:
        sg, q = total(ggx), total(ggx * xhat)
        dd = rstd / m * (m * ggx - sg - xhat * q)  # d's gradient: the first backward's map applied to ggx
        g_go = add(g_go, dd * w if w is not None else dd)
        if w is not None:
            g_w = dd * go
        a, b = total(d), total(d * xhat)
        p = total(ggx * d) - a * sg / m
        r2m = rstd * rstd / m
        g_x = add(g_x, -r2m * xhat * (p - b * q / m)
                  - r2m * (q * (d - a / m - xhat * b / m) + b * (ggx - sg / m - xhat * q / m)))
    if ggw is not None:
        e = ggw * go
        g_x = add(g_x, rstd / m * (m * e - total(e) - xhat * total(e * xhat)))
        g_go = add(g_go, ggw * xhat)
    if ggb is not None:
        g_go = add(g_go, xp.broadcast_to(ggb, x.shape))
    return g_go, g_x, g_w


@op("NativeBatchNormBackwardBackward0", outputs=5,
    saved="grad_out:tensor input:tensor weight:tensor? running_mean:tensor? running_var:tensor? save_mean:tensor? "
          "save_invstd:tensor? train:bool? eps:scalar?",
    cost=cost.pointwise(24))
def batch_norm_backward_backward(node, grads, ctx):
    """batch norm's backward differentiated again (training or eval statistics): to grad_out, input and weight."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, go, w = sv["input"], sv["grad_out"], sv.get("weight")
    ggx, ggw, ggb = (list(grads) + [None] * 3)[:3]
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    wv = None if w is None else w.reshape(shape)
    ggw = None if ggw is None else ggw.reshape(shape)
    ggb = None if ggb is None else ggb.reshape(shape)
    if sv.get("train"):
        g_go, g_x, g_w = _norm_double_backward(xp, x, go, wv, sv["save_mean"].reshape(shape),
                                               sv["save_invstd"].reshape(shape), axes, ggx, ggw, ggb)
    else:  # eval: dx = go w invstd is linear in go, dw = sum(go xhat) with fixed statistics
        mean = sv["running_mean"].reshape(shape)
        invstd = (1.0 / xp.sqrt(sv["running_var"] + num(sv.get("eps", 1e-5)))).reshape(shape)
        g_go = g_x = g_w = None
        if ggx is not None:
            g_go = ggx * invstd * (wv if wv is not None else 1.0)
            g_w = ggx * invstd * go if wv is not None else None
        if ggw is not None:
            g_go = (0 if g_go is None else g_go) + ggw * (x - mean) * invstd
            g_x = ggw * go * invstd
        if ggb is not None:
            g_go = (0 if g_go is None else g_go) + xp.broadcast_to(ggb, x.shape)

    def out(i):
        if i == 0:
            return g_go
        if i == 1:
            return g_x
        if i == 2 and g_w is not None:
            return g_w.sum(axis=axes)
        return None
    return each(node, out)


@op("NativeLayerNormBackwardBackward0", outputs=6,
    saved="grad_out:tensor input:tensor mean:tensor rstd:tensor normalized_shape:sizes weight:tensor?",
    cost=cost.pointwise(24))
def layer_norm_backward_backward(node, grads, ctx):
    """layer norm's backward differentiated again: to grad_out, input and weight (nothing to mean, rstd, bias).

    The next edges follow native_layer_norm_backward's signature: grad_out, input, mean, rstd, weight, bias.
    """
    sv = ctx.saved(node)
    x, go, w = sv["input"], sv["grad_out"], sv.get("weight")
    k = len(sv["normalized_shape"])
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    ggx, ggw, ggb = (list(grads) + [None] * 3)[:3]
    g_go, g_x, g_w = _norm_double_backward(ctx.xp(node), x, go, w, sv["mean"], sv["rstd"], axes, ggx, ggw, ggb)

    def out(i):
        if i == 0:
            return g_go
        if i == 1:
            return g_x
        if i == 4 and g_w is not None:
            return g_w.sum(axis=lead) if lead else g_w
        return None
    return each(node, out)


def _lanes_sum(xp, a, b, axis):
    """sum(a * b) over ``axis`` (kept) as PyTorch's CPU kernels add a short row: blocks of 8 lanes with fused
    multiply-adds, the lanes then added in order, and what is left over added one by one, fused."""
    a, b = xp.moveaxis(a, axis, -1), xp.moveaxis(b, axis, -1)
    n = a.shape[-1]
    full = n // 8 * 8
    acc = xp.zeros(a.shape[:-1], dtype=xp.result_type(a, b))
    if full:
        lanes = xp.zeros(a.shape[:-1] + (8,), dtype=acc.dtype)
        for j in range(0, full, 8):
            lanes = _fma(xp, a[..., j:j + 8], b[..., j:j + 8], lanes)
        for j in range(8):
            acc = acc + lanes[..., j]
    for j in range(full, n):
        acc = _fma(xp, a[..., j], b[..., j], acc)
    return xp.expand_dims(acc, axis)


@op("NativeGroupNormBackward0", outputs=3,
    saved="input:tensor result1:tensor result2:tensor weight:tensor? N:int C:int HxW:int group:int eps:scalar?",
    cost=cost.pointwise(8))
def group_norm(node, grads, ctx):
    """group norm (each group of D = C / group channels and all HxW positions of a sample normalised): input,
    weight and bias, from the gradients of the output, the mean and rstd.

    With only the output's gradient and no create_graph, PyTorch's CPU kernel (its fused multiply-adds too):
    per (n, channel) ds = sum(g x), db = sum(g); per group dsg = sum(ds w), dbg = sum(db w),
    c2 = fma(dbg, mean, -dsg) rstd^3 / (D HxW), c3 = -c2 mean - dbg rstd / (D HxW), dx = fma(rstd w, g, c2 x) + c3;
    dw = sum over n of fma(-db, mean, ds) rstd; dbias = sum over n of db. With the mean's or rstd's gradient
    too, or create_graph, PyTorch's composite ``infinitely_differentiable_native_group_norm_backward``:
    the same terms in separate (unfused) ops, plus, only where both the mean's and the rstd's gradients are
    defined, var_mean's backward of (-rstd^3 / 2 drstd, dmean) over each group.
    """
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    gy = grads[0]
    dmean, drstd = (list(grads) + [None, None])[1:3]
    x, w = sv["input"], sv.get("weight")
    n, c, hw, groups = int(sv["N"]), int(sv["C"]), int(sv["HxW"]), int(sv["group"])
    d = c // groups
    shape4 = (n, groups, d, hw)
    x4 = x.reshape(shape4)
    mean = sv["result1"].reshape(n, groups, 1, 1)
    rstd = sv["result2"].reshape(n, groups, 1, 1)
    w4 = None if w is None else w.reshape(1, groups, d, 1)
    s = 1.0 / (d * hw) if d * hw else 0.0
    composite = ctx.create_graph or dmean is not None or drstd is not None
    g4 = None if gy is None else gy.reshape(shape4)
    if g4 is not None:
        ds = (g4 * x4).sum(axis=3, keepdims=True)
        db = g4.sum(axis=3, keepdims=True)

    def grad_input():
        dx = None
        if g4 is not None:
            if composite:
                a = rstd if w4 is None else rstd * w4
                b = (ds if w4 is None else ds * w4).sum(axis=2, keepdims=True)
                cc = (db if w4 is None else db * w4).sum(axis=2, keepdims=True)
                b = (cc * mean - b) * (rstd * rstd * rstd) * s
                cc = -b * mean - cc * rstd * s
                dx = a * g4 + b * x4 + cc
            else:
                wb = xp.ones((n, groups, d, 1), dtype=x.dtype) if w4 is None else xp.broadcast_to(w4, (n, groups, d, 1))
                dsg, dbg = _lanes_sum(xp, ds, wb, 2), _lanes_sum(xp, db, wb, 2)
                c2 = _fma(xp, dbg, mean, -dsg) * rstd * rstd * rstd * s
                c3 = -c2 * mean - dbg * rstd * s
                dx = _fma(xp, rstd if w4 is None else rstd * w4, g4, c2 * x4) + c3
        if dmean is not None and drstd is not None:
            m = d * hw
            dvar = (-0.5 * (rstd * rstd * rstd)) * drstd.reshape(n, groups, 1, 1)
            gv = (2.0 / m) * dvar * (x4 - x4.mean(axis=(2, 3), keepdims=True))
            gm = xp.broadcast_to(dmean.reshape(n, groups, 1, 1), shape4) / m
            t = gv + gm
            dx = t if dx is None else dx + t
        return None if dx is None else dx.reshape(x.shape)

    def grad_weight():
        if g4 is None:
            return None
        t = ((ds - db * mean) if composite else _fma(xp, -db, mean, ds)) * rstd
        return t.sum(axis=0).reshape(w.shape)

    def grad_bias():
        if g4 is None:
            return None
        return db.sum(axis=0).reshape(c)
    return each(node, lambda i: (grad_input, grad_weight, grad_bias)[i]())


@op("WeightNormInterfaceBackward0", outputs=2, saved="v:tensor g:tensor result1:tensor dim:int", cost=cost.pointwise(6))
def weight_norm(node, grads, ctx):
    """weight norm w = g v / ||v|| (norm over every dim but ``dim``): gradients to v and g."""
    sv = ctx.saved(node)
    v, gain, norm = sv["v"], sv["g"], sv["result1"]
    dim = signed(sv["dim"])
    gw = grads[0]
    if dim == -1:
        axes = tuple(range(v.ndim))
    else:
        dim %= v.ndim
        axes = tuple(a for a in range(v.ndim) if a != dim)
    shape = tuple(1 if a in axes else s for a, s in enumerate(v.shape))
    norm = norm.reshape(shape)
    gain = gain.reshape(shape)
    dot = (gw * v).sum(axis=axes, keepdims=True)

    def out(i):
        if i == 0:
            return gain / norm * (gw - v * (dot / (norm * norm)))
        return (dot / norm).reshape(sv["g"].shape)
    return each(node, out)


# --- dropout's double backward -------------------------------------------------------------------------
# (here because the file that declares dropout itself, elementwise, belongs to another family's owner)


@op("NativeDropoutBackwardBackward0", outputs=2, saved="grad_output:tensor? mask:tensor scale:scalar",
    elementwise=True, cost=cost.pointwise(2))
def native_dropout_backward_backward(node, grads, ctx):
    """native_dropout_backward(grad_output, mask, scale) = grad_output * mask * scale, differentiated:
    PyTorch's native_dropout_double_backward, ggI * (mask * scale) in grad_output's dtype, to grad_output;
    nothing to the mask (PyTorch: not implemented)."""
    sv = ctx.saved(node)
    g = grads[0]
    go = sv.get("grad_output")
    dtype = go.dtype if go is not None else g.dtype
    scale = num(sv["scale"])

    def out(i):
        if i != 0:
            return None
        return g.astype(dtype, copy=False) * (sv["mask"].astype(dtype) * scale)
    return each(node, out)
