"""Spectral: the FFT kernels behind torch.fft and torch.stft/istft (real-to-complex, complex-to-real,
complex-to-complex), for spectral losses in speech, Fourier neural operators and FFT convolutions.

Each kernel is a linear map y = s F x, with F the unnormalised transform over ``dim`` and s the normalisation
(``normalization`` 0: none, 1: 1/sqrt(n), 2: 1/n, n the transformed size), so the gradient is s F^H g: the
transform the other way with the same scaling. For the real kernels, the half spectrum (``onesided``) is what
the complex side holds.
"""

from __future__ import annotations

import math

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, out_meta, signed
from autograd_run.ops.spec import op


def _fft_flops(s: cost.Shapes) -> float:
    """5 n log2 n per transformed line, over every produced gradient (the classic radix-2 count)."""
    total = 0.0
    for m in [*s.inputs, *s.outputs]:
        if m is not None and m[0]:
            n = math.prod(m[0])
            total += 5.0 * n * math.log2(max(n, 2))
    return total / 2


FFT = cost.CostModel(_fft_flops)


def _dims(node, ndim):
    return [signed(d) % ndim for d in node.saved["dim"]]


def _scale(normalization, n):
    norm = int(normalization)
    return 1.0 if norm == 0 else 1.0 / math.sqrt(n) if norm == 1 else 1.0 / n


def _c2c(xp, g, dims, normalization, forward):
    """The unnormalised transform over ``dims`` (forward: e^-i, else e^+i) times the normalisation."""
    n = math.prod(g.shape[d] for d in dims)
    y = xp.fft.fftn(g, axes=dims) if forward else xp.fft.ifftn(g, axes=dims) * n
    return y * _scale(normalization, n)


@op("FftC2CBackward0", outputs=1, saved="dim:ints normalization:int forward:bool", cost=FFT)
def fft_c2c(node, grads, ctx):
    """torch.fft.fft/ifft/fftn of a complex tensor: the transform the other way, same normalisation."""
    g = grads[0]
    sv = node.saved
    return each(node, lambda i: _c2c(ctx.xp(node), g, _dims(node, g.ndim), sv["normalization"],
                                     not bool(sv["forward"])))


@op("FftR2CBackward0", outputs=1, saved="self:tensor? dim:ints normalization:int onesided:bool", cost=FFT)
def fft_r2c(node, grads, ctx):
    """torch.fft.rfft/rfftn, fft of a real tensor, stft: the spectrum's gradient transformed back, real part.

    A half spectrum's gradient is zero-padded to the full one first; the transform is e^+i, same normalisation.
    """
    g = grads[0]
    xp = ctx.xp(node)
    dims = _dims(node, g.ndim)

    def out(i):
        full = g
        if node.saved.get("onesided"):
            last = dims[-1]
            n = out_meta(node, i).shape[last]
            pad = [(0, 0)] * g.ndim
            pad[last] = (0, n - g.shape[last])
            full = xp.pad(g, pad)
        return _c2c(xp, full, dims, node.saved["normalization"], False).real
    return each(node, out)


@op("FftC2RBackward0", outputs=1, saved="dim:ints normalization:int", cost=FFT)
def fft_c2r(node, grads, ctx):
    """torch.fft.irfft/irfftn/hfft: the real gradient's half spectrum, each bin that stands for two doubled.

    The transform is e^-i with the same normalisation; all bins but the first and (even lengths) the last
    stand for two.
    """
    g = grads[0]
    xp = ctx.xp(node)
    dims = _dims(node, g.ndim)
    last = dims[-1]
    n = g.shape[last]

    def out(i):
        half = xp.fft.rfftn(g, axes=dims) * _scale(node.saved["normalization"], math.prod(g.shape[d] for d in dims))
        twice = n - half.shape[last]
        if twice > 0:
            idx = [slice(None)] * g.ndim
            idx[last] = slice(1, 1 + twice)
            half[tuple(idx)] *= 2
        return half
    return each(node, out)
