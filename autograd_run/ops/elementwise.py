"""Elementwise arithmetic and math: add, sub, mul, div, pow, exp/log families, trigonometry, rounding,
clamp/min/max, lerp, addcmul/addcdiv, fmod/remainder, xlogy, where, and complex views (conj, angle,
view_as_real/view_as_complex, polar, complex).

Formulas follow PyTorch's ``derivatives.yaml`` (re-derived, not copied).
Complex inputs follow PyTorch's conjugate Wirtinger convention: a
holomorphic op multiplies the gradient by the conjugate of its
derivative, and a real input of a complex result gets a real gradient
(``numeric.real_for``). Gradients may come out broadcast; the engine's
``validate_outputs`` sums them down to each consumer's shape, as PyTorch does.
"""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, keep_where, out_meta
from autograd_run.ops.numeric import (conj, digamma, erfinv, i0, i0e, i1, i1e, is_complex, num, polygamma, real_for,
                                      sgn, trigamma)
from autograd_run.ops.spec import op

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _zeros_for(node, i, xp, like=None):
    """Zeros of the shape and dtype next edge ``i`` expects."""
    meta = out_meta(node, i)
    return xp.zeros(meta.shape, dtype=meta.dtype if like is None else like.dtype)


def _alpha_is_one(node) -> bool:
    """Whether the node's ``alpha`` is 1 (absent or None too): then its second output is the gradient itself."""
    alpha = node.saved.get("alpha")
    return alpha is None or (not isinstance(alpha, (str, bool)) and alpha == 1)


def _scaled(g, alpha):
    """``g * conj(alpha)``, skipping the multiply for alpha == 1."""
    return g if alpha == 1 else g * conj(num(alpha))


# --- add, sub, mul, div, neg ------------------------------------------------------------------------------


@op("AddBackward0", outputs=2, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(0),
    views=lambda node: ("same", "same" if _alpha_is_one(node) else ""))
def add(node, grads, ctx):
    """a + alpha * b: the gradient passes to a, times conj(alpha) to b."""
    g = grads[0]
    nxt = node.next
    if g.dtype.kind == "c":
        return each(node, lambda i: real_for(node, i, g if i == 0 else _scaled(g, node.saved.get("alpha", 1))))
    alpha = node.saved.get("alpha", 1)
    return [None if nxt[0] is None else g, None if nxt[1] is None else (g if alpha == 1 else g * num(alpha))]


@op("AddBackward1", outputs=1, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(0), views="same")
def add_scalar(node, grads, ctx):
    """a + other (a number): the gradient passes through."""
    return each(node, lambda i: real_for(node, i, grads[0]))


@op("SubBackward0", outputs=2, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(1),
    views=lambda node: ("same", ""))
def sub(node, grads, ctx):
    """a - alpha * b."""
    g = grads[0]
    alpha = node.saved.get("alpha", 1)
    if g.dtype.kind == "c":
        return each(node, lambda i: real_for(node, i, g if i == 0 else -_scaled(g, alpha)))
    return [None if node.next[0] is None else g, None if node.next[1] is None else -g * num(alpha)]


@op("SubBackward1", outputs=1, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(0), views="same")
def sub_scalar(node, grads, ctx):
    """a - other (a number): the gradient passes through."""
    return each(node, lambda i: real_for(node, i, grads[0]))


@op("RsubBackward0", outputs=2, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(1))
def rsub(node, grads, ctx):
    """other - alpha * a (torch.rsub(a, other)): -alpha g to a, g to other."""
    g = grads[0]
    alpha = node.saved.get("alpha", 1)
    return each(node, lambda i: real_for(node, i, -_scaled(g, alpha) if i == 0 else g))


@op("RsubBackward1", outputs=1, saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(1))
def rsub_scalar(node, grads, ctx):
    """other - alpha * a, other a number."""
    alpha = node.saved.get("alpha", 1)
    return each(node, lambda i: real_for(node, i, -_scaled(grads[0], alpha)))


@op("MulBackward0", outputs=2, saved="self:tensor? other:tensor?", elementwise=True, cost=cost.pointwise(1),
    needed_for_output=((0, "other"), (1, "self")))
def mul(node, grads, ctx):
    """a * b: each side gets the gradient times the other's conjugate."""
    g = grads[0]
    s = ctx.saved(node)
    nxt = node.next
    if g.dtype.kind == "c":  # a real gradient means real operands: no conjugation
        return each(node, lambda i: real_for(node, i, g * conj(s["other"] if i == 0 else s["self"])))
    return [None if nxt[0] is None else g * s["other"], None if nxt[1] is None else g * s["self"]]


@op("MulBackward1", outputs=1, saved="other:scalar", elementwise=True, cost=cost.pointwise(1))
def mul_scalar(node, grads, ctx):
    """a * other, other a number."""
    other = num(node.saved["other"])
    return each(node, lambda i: real_for(node, i, grads[0] * conj(other)))


def _div(node, g, s):
    if g.dtype.kind != "c":
        return each(node, lambda i: g / s["other"] if i == 0 else -g * s["self"] / (s["other"] * s["other"]))

    def out(i):
        if i == 0:
            return real_for(node, 0, g / conj(s["other"]))
        b = s["other"]
        return real_for(node, 1, -g * conj(s["self"] / b / b))
    return each(node, out)


@op("DivBackward0", outputs=2, saved="self:tensor? other:tensor?", elementwise=True, cost=cost.pointwise(3),
    needed_for_output=((0, "other"), (1, "self"), (1, "other")))
def div(node, grads, ctx):
    """a / b: g / conj(b) and -g conj(a / b**2)."""
    return _div(node, grads[0], ctx.saved(node))


@op("DivBackward1", outputs=1, saved="other:scalar", elementwise=True, cost=cost.pointwise(1))
def div_scalar(node, grads, ctx):
    """a / other, other a number."""
    other = num(node.saved["other"])
    return each(node, lambda i: real_for(node, i, grads[0] / conj(other)))


@op("DivBackward2", outputs=2, saved="self:tensor? other:tensor? rounding_mode:str?", elementwise=True,
    cost=cost.pointwise(3))
def div_mode(node, grads, ctx):
    """a / b with a rounding mode: zero gradients ('trunc', 'floor'); as a / b without one."""
    s = ctx.saved(node)
    if s.get("rounding_mode") is None:
        return _div(node, grads[0], s)
    xp = ctx.xp(node)
    return each(node, lambda i: _zeros_for(node, i, xp))


@op("DivBackward3", outputs=1, saved="other:scalar rounding_mode:str?", elementwise=True, cost=cost.pointwise(1))
def div_scalar_mode(node, grads, ctx):
    """a / other (a number) with a rounding mode: a zero gradient; as a / other without one."""
    if node.saved.get("rounding_mode") is None:
        other = num(node.saved["other"])
        return each(node, lambda i: real_for(node, i, grads[0] / conj(other)))
    xp = ctx.xp(node)
    return each(node, lambda i: _zeros_for(node, i, xp))


@op("NegBackward0", outputs=1, elementwise=True, cost=cost.pointwise(1))
def neg(node, grads, ctx):
    """-a."""
    return each(node, lambda i: -grads[0])


# --- powers, exponentials, logarithms ---------------------------------------------------------------------


@op("PowBackward0", outputs=1, saved="self:tensor exponent:scalar", elementwise=True, cost=cost.pointwise(3))
def pow_scalar(node, grads, ctx):
    """a ** e with a number e: g * conj(e * a**(e-1)); zero for e == 0."""
    sv = ctx.saved(node)
    x, e = sv["self"], num(sv["exponent"])
    if e == 0:
        return each(node, lambda i: ctx.xp(node).zeros_like(x))
    if x.dtype.kind != "c" and not isinstance(e, complex):
        return each(node, lambda i: grads[0] * (e * x ** (e - 1)))
    return each(node, lambda i: real_for(node, i, grads[0] * conj(e * x ** (e - 1))))


@op("PowBackward1", outputs=2,
    saved="self:tensor exponent:tensor result:tensor", elementwise=True, cost=cost.pointwise(8))
def pow_tensor(node, grads, ctx):
    """a ** b, both tensors: g conj(b a**(b-1)) (0 where b == 0) and g conj(result log a) (0 where a == 0 <= b)."""
    sv = ctx.saved(node)
    x, e = sv["self"], sv["exponent"]
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        with np.errstate(divide="ignore", invalid="ignore"):
            if i == 0:
                return real_for(node, 0, xp.where(e == 0, 0, g * conj(e * x ** (e - 1))))
            at_zero = (x == 0) & ((e.real >= 0) & (e.imag == 0) if is_complex(e) else (e >= 0))
            logx = xp.log(x.astype(xp.result_type(x, e), copy=False))
            return real_for(node, 1, g * xp.where(at_zero, 0, conj(sv["result"] * logx)))
    return each(node, out)


@op("PowBackward2", outputs=1,
    saved="self:scalar exponent:tensor result:tensor", elementwise=True, cost=cost.pointwise(3))
def pow_scalar_base(node, grads, ctx):
    """base ** b, base a number: g conj(result log base) (0 where base == 0 <= b)."""
    sv = ctx.saved(node)
    base, e, r = num(sv["self"]), sv["exponent"], sv["result"]
    xp = ctx.xp(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        logb = np.log(np.asarray(base, dtype=r.dtype))
        d = conj(r * logb)
    if base == 0:
        ok = (e.real >= 0) & (e.imag == 0) if is_complex(e) else e >= 0
        d = xp.where(ok, 0, d)
    return each(node, lambda i: real_for(node, i, grads[0] * d))


@op("ExpBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(1))
def exp(node, grads, ctx):
    """exp(a): g * conj(result)."""
    r = ctx.saved(node)["result"]
    if r.dtype.kind == "c":
        r = r.conj()
    return each(node, lambda i: grads[0] * r)


@op("Exp2Backward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(2))
def exp2(node, grads, ctx):
    """2 ** a: g * conj(result) * ln 2."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * conj(r) * _LN2)


@op("Expm1Backward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(2))
def expm1(node, grads, ctx):
    """exp(a) - 1: g * (conj(result) + 1)."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * (conj(r) + 1))


@op("LogBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(1))
def log(node, grads, ctx):
    """log(a): g / conj(a)."""
    s = ctx.saved(node)["self"]
    if s.dtype.kind == "c":
        s = s.conj()
    return each(node, lambda i: grads[0] / s)


@op("Log2Backward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def log2(node, grads, ctx):
    """log2(a): g / (conj(a) ln 2)."""
    s = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / (conj(s) * _LN2))


@op("Log10Backward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def log10(node, grads, ctx):
    """log10(a): g / (conj(a) ln 10)."""
    s = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / (conj(s) * _LN10))


@op("Log1PBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def log1p(node, grads, ctx):
    """log(1 + a): g / conj(1 + a)."""
    s = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / conj(s + 1))


@op("SqrtBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(2))
def sqrt(node, grads, ctx):
    """sqrt(a): g / (2 conj(result))."""
    r = ctx.saved(node)["result"]
    if r.dtype.kind == "c":
        r = r.conj()
    return each(node, lambda i: grads[0] / (2 * r))


@op("RsqrtBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(4))
def rsqrt(node, grads, ctx):
    """1/sqrt(a): -g conj(result**3) / 2."""
    r = ctx.saved(node)["result"]
    if r.dtype.kind == "c":
        r = r.conj()
    return each(node, lambda i: -0.5 * grads[0] * r * r * r)


@op("ReciprocalBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(2))
def reciprocal(node, grads, ctx):
    """1/a: -g conj(result**2)."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: -grads[0] * conj(r * r))


@op("XlogyBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(4))
def xlogy(node, grads, ctx):
    """x log y: g log y (0 where g == 0, or x == 0 and y <= 0) to x; g x / y to y."""
    sv = ctx.saved(node)
    x, y, g = sv["self"], sv["other"], grads[0]
    xp = ctx.xp(node)

    def out(i):
        with np.errstate(divide="ignore", invalid="ignore"):
            if i == 0:
                d = xp.where(g == 0, 0, g * xp.log(y))
                return xp.where((x == 0) & (y <= 0), 0, d)
            return g * x / y
    return each(node, out)


@op("XlogyBackward1", outputs=1, saved="self:scalar other:tensor", elementwise=True, cost=cost.pointwise(2))
def xlogy_scalar_self(node, grads, ctx):
    """x log y with x a number: g x / y."""
    sv = ctx.saved(node)
    return each(node, lambda i: grads[0] * num(sv["self"]) / sv["other"])


@op("XlogyBackward2", outputs=1, saved="self:tensor other:scalar", elementwise=True, cost=cost.pointwise(2))
def xlogy_scalar_other(node, grads, ctx):
    """x log y with y a number: g log y (0 where g == 0; also where x == 0 if y <= 0)."""
    sv = ctx.saved(node)
    x, y, g = sv["self"], num(sv["other"]), grads[0]
    xp = ctx.xp(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = xp.where(g == 0, 0, g * np.log(np.asarray(y, dtype=g.dtype)))
    if not y > 0:
        d = xp.where(x == 0, 0, d)
    return each(node, lambda i: d)


# --- absolute value, sign, rounding -------------------------------------------------------------------------


@op("AbsBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def abs_(node, grads, ctx):
    """|a|: g * sgn(a) (a / |a| for complex a; 0 at a NaN a, as PyTorch's sign)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * sgn(ctx.xp(node), x))


@op("SgnBackward0", outputs=1, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(6))
def sgn_(node, grads, ctx):
    """sgn(a) = a / |a|: (g - sgn**2 conj(g)) / (2|a|) for complex a (0 at 0); zero for real a."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    xp = ctx.xp(node)
    g = grads[0]
    if not is_complex(x):
        return each(node, lambda i: xp.zeros(xp.broadcast_shapes(g.shape, x.shape), dtype=g.dtype))
    a = xp.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (g - r * r * conj(g)) / (2 * a)
    return each(node, lambda i: xp.where(a == 0, 0, d))


def _zero_grad(node, grads, ctx):
    xp = ctx.xp(node)
    return each(node, lambda i: xp.zeros_like(grads[0]))


@op("SignBackward0", "FloorBackward0", "CeilBackward0", "RoundBackward0", "RoundBackward1", "TruncBackward0", outputs=1,
    elementwise=True, cost=cost.pointwise(0))
def zero_grad(node, grads, ctx):
    """sign, floor, ceil, round, trunc: piecewise constant, a zero gradient."""
    return _zero_grad(node, grads, ctx)


@op("FracBackward0", outputs=1, elementwise=True, cost=cost.VIEW)
def frac(node, grads, ctx):
    """frac(a) = a - trunc(a): the gradient passes through."""
    return each(node, lambda i: grads[0])


@op("NanToNumBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def nan_to_num(node, grads, ctx):
    """nan_to_num(a): the gradient where a is finite."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * ctx.xp(node).isfinite(x))


@op("Deg2RadBackward0", outputs=1, elementwise=True, cost=cost.pointwise(1))
def deg2rad(node, grads, ctx):
    """a * pi / 180."""
    return each(node, lambda i: grads[0] * (math.pi / 180.0))


@op("Rad2DegBackward0", outputs=1, elementwise=True, cost=cost.pointwise(1))
def rad2deg(node, grads, ctx):
    """a * 180 / pi."""
    return each(node, lambda i: grads[0] * (180.0 / math.pi))


@op("CopysignBackward0", outputs=2, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(3))
def copysign(node, grads, ctx):
    """copysign(a, b): g * result / a (0 where a == 0) to a; zero to b."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    xp = ctx.xp(node)

    def out(i):
        if i == 1:
            return _zeros_for(node, 1, xp)
        with np.errstate(divide="ignore", invalid="ignore"):
            return grads[0] * xp.where(x == 0, 0, r / x)
    return each(node, out)


@op("CopysignBackward1", outputs=1, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(3))
def copysign_scalar(node, grads, ctx):
    """copysign(a, number): g * result / a (0 where a == 0)."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    xp = ctx.xp(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = grads[0] * xp.where(x == 0, 0, r / x)
    return each(node, lambda i: d)


# --- trigonometric and hyperbolic ---------------------------------------------------------------------------


@op("SinBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def sin(node, grads, ctx):
    """sin(a): g conj(cos a)."""
    x = ctx.saved(node)["self"]
    if x.dtype.kind != "c":
        return each(node, lambda i: grads[0] * ctx.xp(node).cos(x))
    return each(node, lambda i: grads[0] * conj(ctx.xp(node).cos(x)))


@op("CosBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def cos(node, grads, ctx):
    """cos(a): -g conj(sin a)."""
    x = ctx.saved(node)["self"]
    if x.dtype.kind != "c":
        return each(node, lambda i: -grads[0] * ctx.xp(node).sin(x))
    return each(node, lambda i: -grads[0] * conj(ctx.xp(node).sin(x)))


@op("TanBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(3))
def tan(node, grads, ctx):
    """tan(a): g conj(1 + result**2)."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * conj(1 + r * r))


@op("SinhBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def sinh(node, grads, ctx):
    """sinh(a): g conj(cosh a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * conj(ctx.xp(node).cosh(x)))


@op("CoshBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def cosh(node, grads, ctx):
    """cosh(a): g conj(sinh a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * conj(ctx.xp(node).sinh(x)))


@op("AsinBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def asin(node, grads, ctx):
    """asin(a): g conj(1 / sqrt(1 - a**2))."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * conj(1 / ctx.xp(node).sqrt(1 - x * x)))


@op("AcosBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def acos(node, grads, ctx):
    """acos(a): -g conj(1 / sqrt(1 - a**2))."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: -grads[0] * conj(1 / ctx.xp(node).sqrt(1 - x * x)))


@op("AtanBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(3))
def atan(node, grads, ctx):
    """atan(a): g / conj(1 + a**2)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / conj(1 + x * x))


@op("AsinhBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def asinh(node, grads, ctx):
    """asinh(a): g conj(1 / sqrt(a**2 + 1))."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * conj(1 / ctx.xp(node).sqrt(x * x + 1)))


@op("AcoshBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def acosh(node, grads, ctx):
    """acosh(a): g / sqrt(a**2 - 1) (complex: g conj(1 / (sqrt(a + 1) sqrt(a - 1))))."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    if is_complex(x):
        return each(node, lambda i: grads[0] * conj(1 / (xp.sqrt(x + 1) * xp.sqrt(x - 1))))
    return each(node, lambda i: grads[0] / xp.sqrt(x * x - 1))


@op("AtanhBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(3))
def atanh(node, grads, ctx):
    """atanh(a): g / conj(1 - a**2)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / conj(1 - x * x))


@op("Atan2Backward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(5))
def atan2(node, grads, ctx):
    """atan2(y, x): g x / (x**2 + y**2) to y, -g y / (x**2 + y**2) to x."""
    sv = ctx.saved(node)
    y, x = sv["self"], sv["other"]
    r = grads[0] / (x * x + y * y)
    return each(node, lambda i: r * x if i == 0 else -r * y)


@op("HypotBackward0", outputs=2,
    saved="self:tensor other:tensor result:tensor", elementwise=True, cost=cost.pointwise(2))
def hypot(node, grads, ctx):
    """hypot(a, b) = sqrt(a**2 + b**2): g a / result and g b / result."""
    sv = ctx.saved(node)
    return each(node, lambda i: grads[0] * (sv["self"] if i == 0 else sv["other"]) / sv["result"])


@op("SincBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(8))
def sinc(node, grads, ctx):
    """sin(pi a) / (pi a): g conj((pi a cos(pi a) - sin(pi a)) / (pi a**2)), 0 at a == 0."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    px = math.pi * x
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (px * xp.cos(px) - xp.sin(px)) / (px * x)
    return each(node, lambda i: xp.where(x == 0, 0, grads[0] * conj(d)))


# --- special functions ------------------------------------------------------------------------------------


@op("ErfBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def erf_(node, grads, ctx):
    """erf(a): g 2/sqrt(pi) exp(-a**2)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * (_TWO_OVER_SQRT_PI * ctx.xp(node).exp(-x * x)))


@op("ErfcBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def erfc(node, grads, ctx):
    """erfc(a): -g 2/sqrt(pi) exp(-a**2)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * (-_TWO_OVER_SQRT_PI * ctx.xp(node).exp(-x * x)))


@op("ErfinvBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(30))
def erfinv_(node, grads, ctx):
    """erfinv(a): g sqrt(pi)/2 exp(erfinv(a)**2)."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    y = erfinv(xp, x)
    return each(node, lambda i: grads[0] * (math.sqrt(math.pi) / 2 * xp.exp(y * y)))


@op("LgammaBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(30))
def lgamma(node, grads, ctx):
    """lgamma(a): g digamma(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * digamma(ctx.xp(node), x))


@op("DigammaBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(30))
def digamma_(node, grads, ctx):
    """digamma(a): g trigamma(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * trigamma(ctx.xp(node), x))


@op("LogitBackward0", outputs=1, saved="self:tensor eps:scalar?", elementwise=True, cost=cost.pointwise(4))
def logit(node, grads, ctx):
    """log(a / (1 - a)): g / (a (1 - a)); outside [eps, 1 - eps] zero, or NaN outside [0, 1] without eps."""
    sv = ctx.saved(node)
    x, eps = sv["self"], num(sv.get("eps"))
    xp = ctx.xp(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = grads[0] / (x * (1 - x))
    if eps is None or eps < 0:
        d = xp.where((x < 0) | (x > 1), xp.nan, d)
    else:
        d = xp.where((x < eps) | (x > 1 - eps), 0, d)
    return each(node, lambda i: d)


@op("LogaddexpBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(4))
def logaddexp(node, grads, ctx):
    """log(exp a + exp b): g / (1 + exp(b - a)) to a, g / (1 + exp(a - b)) to b."""
    sv = ctx.saved(node)
    a, b = sv["self"], sv["other"]
    xp = ctx.xp(node)
    with np.errstate(over="ignore"):
        return each(node, lambda i: grads[0] / conj(1 + xp.exp(b - a if i == 0 else a - b)))


@op("Logaddexp2Backward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(4))
def logaddexp2(node, grads, ctx):
    """log2(2**a + 2**b): g / (1 + 2**(b - a)) to a, g / (1 + 2**(a - b)) to b."""
    sv = ctx.saved(node)
    a, b = sv["self"], sv["other"]
    with np.errstate(over="ignore"):
        return each(node, lambda i: grads[0] / (1 + 2.0 ** (b - a if i == 0 else a - b)))


@op("I0Backward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(40))
def i0_(node, grads, ctx):
    """I0(a): g I1(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * i1(ctx.xp(node), x))


@op("SpecialI0EBackward0", outputs=1, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(40))
def i0e_(node, grads, ctx):
    """exp(-|a|) I0(a): g (I1e(a) - sgn(a) I0e(a))."""
    sv = ctx.saved(node)
    x, r, xp = sv["self"], sv["result"], ctx.xp(node)
    return each(node, lambda i: grads[0] * (i1e(xp, x) - xp.sign(x) * r))


def _tiny_guarded(xp, x, r, rest):
    """PyTorch's ``i1_backward`` / ``i1e_backward`` guard: where |a| is above the dtype's epsilon the
    derivative ``rest(a, 1/a)``, else its limit 0.5 (the formula would divide by zero)."""
    eps = np.finfo(x.dtype).eps
    ok = xp.abs(x) > eps
    safe = xp.where(ok, x, x.dtype.type(eps))
    return xp.where(ok, rest(safe, 1.0 / safe), x.dtype.type(0.5))


@op("SpecialI1Backward0", outputs=1, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(40))
def i1_(node, grads, ctx):
    """I1(a): g (I0(a) - I1(a) / a); 0.5 g where |a| <= eps."""
    sv = ctx.saved(node)
    x, r, xp = sv["self"], sv["result"], ctx.xp(node)
    d = _tiny_guarded(xp, x, r, lambda s, inv: i0(xp, s) - r * inv)
    return each(node, lambda i: grads[0] * d)


@op("SpecialI1EBackward0", outputs=1, saved="self:tensor result:tensor", elementwise=True, cost=cost.pointwise(40))
def i1e_(node, grads, ctx):
    """exp(-|a|) I1(a): g (I0e(a) - I1e(a) (sgn(a) + 1/a)); 0.5 g where |a| <= eps."""
    sv = ctx.saved(node)
    x, r, xp = sv["self"], sv["result"], ctx.xp(node)
    d = _tiny_guarded(xp, x, r, lambda s, inv: i0e(xp, s) - r * (xp.sign(s) + inv))
    return each(node, lambda i: grads[0] * d)


@op("PolygammaBackward0", outputs=1, saved="n:int self:tensor", elementwise=True, cost=cost.pointwise(60))
def polygamma_(node, grads, ctx):
    """polygamma(n, a): g polygamma(n + 1, a)."""
    sv = ctx.saved(node)
    return each(node, lambda i: grads[0] * polygamma(ctx.xp(node), int(sv["n"]) + 1, sv["self"]))


@op("MvlgammaBackward0", outputs=1, saved="p:int self:tensor", elementwise=True, cost=cost.pointwise(60))
def mvlgamma_(node, grads, ctx):
    """The multivariate log-gamma of order p: g times the sum over k < p of digamma(a - k/2)."""
    sv = ctx.saved(node)
    x, p, xp = sv["self"], int(sv["p"]), ctx.xp(node)
    offsets = (-p / 2.0 + 0.5 + 0.5 * np.arange(p)).astype(x.dtype)  # PyTorch: arange(-p/2 + 0.5, 0.5, 0.5)
    return each(node, lambda i: grads[0] * digamma(xp, x[..., None] + xp.asarray(offsets)).sum(-1))


def _xlog1py_self(xp, g, x, y):
    """The gradient of x log1p(y) to x: g log1p(y), 0 where g == 0, and 0 where x == 0 and y <= -1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = xp.where(g == 0, g.dtype.type(0), g * xp.log1p(y))
    return xp.where((x == 0) & (y <= -1), d.dtype.type(0), d)


@op("SpecialXlog1PyBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True,
    cost=cost.pointwise(4))
def xlog1py(node, grads, ctx):
    """x log1p(y): g log1p(y) (0 where g == 0, or x == 0 and y <= -1) to x; g x / (y + 1) to y."""
    sv = ctx.saved(node)
    x, y, g, xp = sv["self"], sv["other"], grads[0], ctx.xp(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        return each(node, lambda i: _xlog1py_self(xp, g, x, y) if i == 0 else g * x / (y + 1))


@op("SpecialXlog1PyBackward1", outputs=1, saved="self:scalar other:tensor", elementwise=True,
    cost=cost.pointwise(2))
def xlog1py_scalar_self(node, grads, ctx):
    """x log1p(y) with x a number: g x / (y + 1)."""
    sv = ctx.saved(node)
    with np.errstate(divide="ignore", invalid="ignore"):
        return each(node, lambda i: grads[0] * num(sv["self"]) / (sv["other"] + 1))


@op("SpecialXlog1PyBackward2", outputs=1, saved="self:tensor other:scalar", elementwise=True,
    cost=cost.pointwise(2))
def xlog1py_scalar_other(node, grads, ctx):
    """x log1p(y) with y a number: g log1p(y) (0 where g == 0; also where x == 0 if y <= -1)."""
    sv = ctx.saved(node)
    g, xp = grads[0], ctx.xp(node)
    y = xp.asarray(num(sv["other"]), dtype=g.dtype)
    return each(node, lambda i: _xlog1py_self(xp, g, sv["self"], y))


@op("SpecialEntrBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def entr(node, grads, ctx):
    """-a log a: -g (1 + log a)."""
    x = ctx.saved(node)["self"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return each(node, lambda i: grads[0] * (-(1 + ctx.xp(node).log(x))))


@op("SpecialNdtriBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(4))
def ndtri(node, grads, ctx):
    """The normal quantile r = ndtri(a): g sqrt(2 pi) exp(r**2 / 2)."""
    r = ctx.saved(node)["result"]
    with np.errstate(over="ignore", invalid="ignore"):
        return each(node, lambda i: grads[0] * math.sqrt(2 * math.pi) * ctx.xp(node).exp(r * r / 2))


@op("SpecialLogNdtrBackward0", outputs=1, saved="self:tensor result:tensor", elementwise=True,
    cost=cost.pointwise(4))
def log_ndtr(node, grads, ctx):
    """r = log Phi(a): g / sqrt(2 pi) exp(-(r + a**2 / 2))."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    with np.errstate(over="ignore", invalid="ignore"):
        return each(node, lambda i: grads[0] / math.sqrt(2 * math.pi) * ctx.xp(node).exp(-(r + x ** 2 / 2)))


@op("SpecialErfcxBackward0", outputs=1, saved="self:tensor result:tensor", elementwise=True,
    cost=cost.pointwise(4))
def erfcx(node, grads, ctx):
    """r = exp(a**2) erfc(a): (2 a r - 2/sqrt(pi)) g."""
    sv = ctx.saved(node)
    x, r = sv["self"], sv["result"]
    with np.errstate(over="ignore", invalid="ignore"):
        return each(node, lambda i: (2.0 * x * r - _TWO_OVER_SQRT_PI) * grads[0])


@op("NextafterBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(1))
def nextafter(node, grads, ctx):
    """nextafter(a, b), one step of a towards b: the gradient passes to a where a != b (0 where they tie),
    zeros to b."""
    sv = ctx.saved(node)
    x, y, g, xp = sv["self"], sv["other"], grads[0], ctx.xp(node)
    return each(node, lambda i: xp.where(x != y, g, g.dtype.type(0)) if i == 0 else _zeros_for(node, 1, xp, g))


@op("FrexpBackward0", outputs=1, saved="exponent:tensor", elementwise=True, cost=cost.pointwise(2))
def frexp(node, grads, ctx):
    """The mantissa m = a / 2**e of frexp: g / 2**e (2**e in float32, as PyTorch's exp2 of the int exponent)."""
    e = ctx.saved(node)["exponent"]
    xp = ctx.xp(node)
    with np.errstate(divide="ignore", over="ignore"):
        return each(node, lambda i: grads[0] / xp.exp2(e.astype(np.float32)))


def _int_pow2(xp, e):
    """2**e for an integer array as an integer power computes it: 0 for a negative e, wrapping past the type."""
    bits = np.iinfo(e.dtype).bits
    ok = (e >= 0) & (e < bits)
    one = xp.ones_like(e)
    return xp.where(ok, xp.left_shift(one, xp.where(ok, e, 0)), 0)


@op("LdexpBackward0", outputs=2, saved="other:tensor result:tensor", elementwise=True, cost=cost.pointwise(4))
def ldexp(node, grads, ctx):
    """r = a 2**b: g 2**b to a (an integer power for an integer b), g r ln 2 to b."""
    sv = ctx.saved(node)
    b, r, g, xp = sv["other"], sv["result"], grads[0], ctx.xp(node)

    def out(i):
        with np.errstate(over="ignore", invalid="ignore"):
            if i == 0:
                scale = _int_pow2(xp, b) if b.dtype.kind in "iu" else xp.power(b.dtype.type(2), b)
                return g * scale.astype(g.dtype, copy=False)
            return g * r * _LN2
    return each(node, out)


# --- clamp, minimum, maximum, where -----------------------------------------------------------------------


@op("ClampBackward1", outputs=1, saved="self:tensor min:scalar? max:scalar?", elementwise=True, cost=cost.pointwise(2))
def clamp(node, grads, ctx):
    """clamp(a, min, max) with numbers: the gradient where min <= a <= max, zero elsewhere."""
    sv = ctx.saved(node)
    x, lo, hi = sv["self"], num(sv.get("min")), num(sv.get("max"))
    mask = True
    if lo is not None:
        mask = x >= lo
    if hi is not None:
        mask = mask & (x <= hi)
    return each(node, lambda i: keep_where(ctx.xp(node), mask, grads[0]))


@op("ClampBackward0", outputs=3, saved="self:tensor min:tensor? max:tensor?", elementwise=True, cost=cost.pointwise(4))
def clamp_tensor(node, grads, ctx):
    """clamp(a, min, max), tensors: to a inside [min, max], to min where a < min < max, to max past it or min > max."""
    sv = ctx.saved(node)
    x, lo, hi = sv["self"], sv.get("min"), sv.get("max")
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        if i == 0:
            mask = True
            if lo is not None:
                mask = x >= lo
            if hi is not None:
                mask = mask & (x <= hi)
            return keep_where(xp, mask, g)
        if i == 1:
            return keep_where(xp, (x < lo) & (lo < hi) if hi is not None else x < lo, g)
        return keep_where(xp, (x > hi) | (lo > hi) if lo is not None else x > hi, g)
    return each(node, out)


@op("ClampMinBackward0", outputs=1, saved="self:tensor min:scalar", elementwise=True, cost=cost.pointwise(2))
def clamp_min(node, grads, ctx):
    """clamp_min(a, number): the gradient where a >= min, zero elsewhere."""
    sv = ctx.saved(node)
    return each(node, lambda i: keep_where(ctx.xp(node), sv["self"] >= num(sv["min"]), grads[0]))


@op("ClampMaxBackward0", outputs=1, saved="self:tensor max:scalar", elementwise=True, cost=cost.pointwise(2))
def clamp_max(node, grads, ctx):
    """clamp_max(a, number): the gradient where a <= max, zero elsewhere."""
    sv = ctx.saved(node)
    return each(node, lambda i: keep_where(ctx.xp(node), sv["self"] <= num(sv["max"]), grads[0]))


@op("ClampMinBackward1", outputs=2, saved="self:tensor min:tensor", elementwise=True, cost=cost.pointwise(2))
def clamp_min_tensor(node, grads, ctx):
    """clamp_min(a, tensor): the gradient to a where a >= min, to min where a < min (to neither at a NaN)."""
    sv = ctx.saved(node)
    x, lo = sv["self"], sv["min"]
    return each(node, lambda i: keep_where(ctx.xp(node), x >= lo if i == 0 else x < lo, grads[0]))


@op("ClampMaxBackward1", outputs=2, saved="self:tensor max:tensor", elementwise=True, cost=cost.pointwise(2))
def clamp_max_tensor(node, grads, ctx):
    """clamp_max(a, tensor): the gradient to a where a <= max, to max where a > max (to neither at a NaN)."""
    sv = ctx.saved(node)
    x, hi = sv["self"], sv["max"]
    return each(node, lambda i: keep_where(ctx.xp(node), x <= hi if i == 0 else x > hi, grads[0]))


def _min_max(node, grads, ctx, self_loses, other_loses):
    sv = ctx.saved(node)
    a, b = sv["self"], sv["other"]
    xp = ctx.xp(node)
    g = grads[0]
    split = xp.where(a == b, g / 2, g)
    return each(node, lambda i: xp.where(self_loses(xp, a, b) if i == 0 else other_loses(xp, a, b), 0, split))


@op("MaximumBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def maximum(node, grads, ctx):
    """maximum(a, b): the gradient to the larger, split in half on ties."""
    return _min_max(node, grads, ctx, lambda xp, a, b: a < b, lambda xp, a, b: a > b)


@op("MinimumBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def minimum(node, grads, ctx):
    """minimum(a, b): the gradient to the smaller, split in half on ties."""
    return _min_max(node, grads, ctx, lambda xp, a, b: a > b, lambda xp, a, b: a < b)


def _pick(node, grads, ctx, self_wins):
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    win = self_wins(xp, sv["self"], sv["other"])
    g = grads[0]
    return each(node, lambda i: xp.where(win if i == 0 else ~win, g, 0))


@op("FmaxBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def fmax(node, grads, ctx):
    """fmax(a, b): the whole gradient to a where a >= b or b is NaN (ties included), to b elsewhere."""
    return _pick(node, grads, ctx, lambda xp, a, b: (a >= b) | xp.isnan(b))


@op("FminBackward0", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def fmin(node, grads, ctx):
    """fmin(a, b): the whole gradient to a where a <= b or b is NaN (ties included), to b elsewhere."""
    return _pick(node, grads, ctx, lambda xp, a, b: (a <= b) | xp.isnan(b))


@op("WhereBackward0", outputs=2, saved="condition:tensor", cost=cost.pointwise(1))
def where(node, grads, ctx):
    """where(c, a, b): the gradient to a where c holds, to b elsewhere."""
    c = ctx.saved(node)["condition"]
    xp = ctx.xp(node)
    g = grads[0]
    if g.dtype.kind != "c":
        return each(node, lambda i: xp.where(c, g, 0) if i == 0 else xp.where(c, 0, g))
    return each(node, lambda i: real_for(node, i, xp.where(c, g, 0) if i == 0 else xp.where(c, 0, g)))


# --- lerp, addcmul, addcdiv, fmod, remainder ---------------------------------------------------------------


@op("LerpBackward0", outputs=2, saved="weight:scalar", elementwise=True, cost=cost.pointwise(2))
def lerp_scalar(node, grads, ctx):
    """a + w (b - a), w a number: g (1 - conj w) to a, g conj(w) to b."""
    w = num(node.saved["weight"])
    return each(node, lambda i: grads[0] * ((1 - conj(w)) if i == 0 else conj(w)))


@op("LerpBackward1", outputs=3, saved="self:tensor? end:tensor? weight:tensor", elementwise=True,
    cost=cost.pointwise(3), needed_for_output=((2, "self"), (2, "end")))
def lerp_tensor(node, grads, ctx):
    """a + w (b - a), w a tensor: g conj(1 - w), g conj(w), g conj(b - a).

    ``self`` and ``end`` are saved only when the weight needs a gradient (``torch.quantile``'s lerp
    between two gathered values does not)."""
    sv = ctx.saved(node)
    w, g = sv["weight"], grads[0]

    def out(i):
        d = 1 - w if i == 0 else w if i == 1 else sv["end"] - sv["self"]
        return real_for(node, i, g * conj(d))
    return each(node, out)


@op("AddcmulBackward0", outputs=3, saved="tensor1:tensor? tensor2:tensor? value:scalar", elementwise=True,
    cost=cost.pointwise(2))
def addcmul(node, grads, ctx):
    """a + value t1 t2: g, g conj(value t2), g conj(value t1)."""
    sv = ctx.saved(node)
    v = num(sv["value"])
    g = grads[0]

    def out(i):
        if i == 0:
            return real_for(node, 0, g)
        return real_for(node, i, g * conj((sv["tensor2"] if i == 1 else sv["tensor1"]) * v))
    return each(node, out)


@op("AddcdivBackward0", outputs=3, saved="tensor1:tensor? tensor2:tensor value:scalar", elementwise=True,
    cost=cost.pointwise(4))
def addcdiv(node, grads, ctx):
    """a + value t1 / t2: g, g conj(value / t2), -g conj(value t1 / t2**2)."""
    sv = ctx.saved(node)
    v = num(sv["value"])
    g = grads[0]
    t2 = sv["tensor2"]

    def out(i):
        if i == 0:
            return real_for(node, 0, g)
        if i == 1:
            return real_for(node, 1, g * conj(v / t2))
        return real_for(node, 2, -g * conj(v * sv["tensor1"] / (t2 * t2)))
    return each(node, out)


@op("FmodBackward0", "RemainderBackward0", outputs=1, elementwise=True, cost=cost.VIEW)
def fmod_scalar(node, grads, ctx):
    """fmod / remainder by a number: the gradient passes through."""
    return each(node, lambda i: grads[0])


@op("FmodBackward1", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def fmod(node, grads, ctx):
    """fmod(a, b) = a - trunc(a / b) b: g to a, -g trunc(a / b) to b."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    return each(node, lambda i: grads[0] if i == 0 else -grads[0] * xp.trunc(sv["self"] / sv["other"]))


@op("RemainderBackward1", outputs=2, saved="self:tensor other:tensor", elementwise=True, cost=cost.pointwise(3))
def remainder(node, grads, ctx):
    """remainder(a, b) = a - floor(a / b) b: g to a, -g floor(a / b) to b."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    return each(node, lambda i: grads[0] if i == 0 else -grads[0] * xp.floor(sv["self"] / sv["other"]))


@op("NativeDropoutBackward0", outputs=1,
    saved="result1:tensor p:scalar train:bool?", elementwise=True, cost=cost.pointwise(2))
def native_dropout(node, grads, ctx):
    """native_dropout(a, p, train): g * mask / (1 - p) (0 for p == 1); g * mask when train is False.

    PyTorch does not expose ``train`` on the node; a node recorded in a graph is taken as training
    dropout unless the file says ``train: false``.
    """
    sv = ctx.saved(node)
    p = num(sv["p"])
    scale = 1.0 if sv.get("train", True) is False else (0.0 if p == 1 else 1.0 / (1.0 - p))
    return each(node, lambda i: grads[0] * sv["result1"] * scale)


#: Samplers of one tensor (``normal(mean, 1.0)``, ``bernoulli_(a, 0.5)``, ...), and of two:
#: ``bernoulli_(a, p)`` with a tensor p, ``normal(mean, std)`` with tensors for both.
_SAMPLERS = ("BernoulliBackward0", "BernoulliBackward2", "NormalBackward0", "NormalBackward1", "NormalBackward2",
             "UniformBackward0", "PoissonBackward0", "ExponentialBackward0", "CauchyBackward0", "GeometricBackward0",
             "LogNormalBackward0", "RandomBackward0", "RandomBackward1", "RandomBackward2")
_SAMPLERS_2 = ("BernoulliBackward1", "NormalBackward3")


@op(*_SAMPLERS, outputs=1, saved="mean_sym_sizes:sizes? std_sym_sizes:sizes?", cost=cost.COPY)
@op(*_SAMPLERS_2, outputs=2, saved="mean_sym_sizes:sizes? std_sym_sizes:sizes?", cost=cost.COPY)
def sampled(node, grads, ctx):
    """random sampling (bernoulli, normal, uniform, ...): a zero gradient for every input."""
    xp = ctx.xp(node)
    return each(node, lambda i: _zeros_for(node, i, xp))


@op("FakeQuantizePerTensorAffineCachemaskBackward0", "FakeQuantizePerChannelAffineCachemaskBackward0",
    "FakeQuantizePerTensorAffineCachemaskTensorQparamsBackward0", "FusedMovingAvgObsFqHelperBackward0", outputs=1,
    saved="mask:tensor", elementwise=True, cost=cost.pointwise(1))
def fake_quantize(node, grads, ctx):
    """Fake quantization (QAT's FakeQuantize, fused observer too): the gradient where the value was not clamped."""
    mask = ctx.saved(node)["mask"]
    return each(node, lambda i: grads[0] * mask)


@op("CloneBackward0", outputs=1, elementwise=True, cost=cost.VIEW, views="same")
def clone(node, grads, ctx):
    """clone(a): the gradient passes through."""
    return each(node, lambda i: grads[0])


# --- complex numbers ----------------------------------------------------------------------------------------


@op("ConjBackward0", "ConjPhysicalBackward0", outputs=1, elementwise=True, cost=cost.pointwise(1))
def conj_(node, grads, ctx):
    """conj(a): the conjugate of the gradient."""
    return each(node, lambda i: conj(grads[0]))


@op("AngleBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(5))
def angle(node, grads, ctx):
    """angle(a): g i a / |a|**2 for complex a (0 at 0); zero for real a."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    g = grads[0]
    if not is_complex(x):
        return each(node, lambda i: xp.zeros(xp.broadcast_shapes(g.shape, x.shape), dtype=g.dtype))
    a2 = (x * x.conj()).real
    with np.errstate(divide="ignore", invalid="ignore"):
        d = g * x / a2 * 1j
    return each(node, lambda i: xp.where(x == 0, 0, d))


@op("ViewAsRealBackward0", outputs=1, cost=cost.COPY)
def view_as_real(node, grads, ctx):
    """view_as_real(a), (..., 2) real from complex: g[..., 0] + i g[..., 1]."""
    g = grads[0]

    def out(i):
        meta = out_meta(node, i)
        r = g[..., 0] + 1j * g[..., 1]
        return r.astype(meta.dtype, copy=False)
    return each(node, out)


@op("ViewAsComplexBackward0", outputs=1, cost=cost.COPY)
def view_as_complex(node, grads, ctx):
    """view_as_complex(a), complex from (..., 2) real: the real and imaginary parts of g, stacked last."""
    g = grads[0]
    xp = ctx.xp(node)
    return each(node, lambda i: xp.stack([g.real, g.imag], axis=-1))


@op("ComplexBackward0", outputs=2, saved="real:tensor? imag:tensor?", elementwise=True, cost=cost.COPY)
def complex_(node, grads, ctx):
    """complex(re, im): the real part of g to re, its imaginary part to im."""
    g = grads[0]
    return each(node, lambda i: g.real if i == 0 else g.imag)


@op("PolarBackward0", outputs=2, saved="result:tensor", elementwise=True, cost=cost.pointwise(6))
def polar(node, grads, ctx):
    """polar(r, theta) = r exp(i theta): Re(conj(g) sgn(result)) to r, Re(conj(g) i result) to theta."""
    z = ctx.saved(node)["result"]
    xp = ctx.xp(node)
    gc = conj(grads[0])
    return each(node, lambda i: (gc * sgn(xp, z)).real if i == 0 else (gc * z * 1j).real)
