"""Elementwise arithmetic: add, sub, mul, div, neg, pow, exp, log, sqrt, rsqrt, abs, sin, cos, clamp, where, clone.

Formulas follow PyTorch's ``derivatives.yaml`` (re-derived, not copied).
Gradients may come out broadcast; the engine's ``validate_outputs`` sums
them down to each consumer's shape, as PyTorch does.
"""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import each
from autograd_run.ops.spec import op


@op("AddBackward0", saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(0))
def add(node, grads, ctx):
    """a + alpha * b: the gradient passes to a, times alpha to b."""
    g = grads[0]
    nxt = node.next
    if len(nxt) == 1:
        return [g]
    alpha = node.saved.get("alpha", 1)
    return [None if nxt[0] is None else g, None if nxt[1] is None else (g if alpha == 1 else g * alpha)]


@op("SubBackward0", saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(1))
def sub(node, grads, ctx):
    """a - alpha * b."""
    g = grads[0]
    alpha = node.saved.get("alpha", 1)
    return [None if node.next[0] is None else g,
            None if len(node.next) < 2 or node.next[1] is None else -g * alpha]


@op("RsubBackward1", saved="alpha:scalar?", elementwise=True, cost=cost.pointwise(1))
def rsub_scalar(node, grads, ctx):
    """other - alpha * a, other a number."""
    alpha = node.saved.get("alpha", 1)
    return each(node, lambda i: -grads[0] if alpha == 1 else -alpha * grads[0])


@op("MulBackward0", saved="self:tensor? other:tensor?", elementwise=True, cost=cost.pointwise(1))
def mul(node, grads, ctx):
    """a * b: each side gets the gradient times the other."""
    g = grads[0]
    s = ctx.saved(node)
    nxt = node.next
    if len(nxt) != 2:
        return each(node, lambda i: g * (s["other"] if i == 0 else s["self"]))
    return [None if nxt[0] is None else g * s["other"], None if nxt[1] is None else g * s["self"]]


@op("DivBackward0", saved="self:tensor? other:tensor?", elementwise=True, cost=cost.pointwise(3))
def div(node, grads, ctx):
    """a / b: g / b and -g * a / b**2."""
    g = grads[0]
    s = ctx.saved(node)
    return each(node, lambda i: g / s["other"] if i == 0 else -g * s["self"] / (s["other"] * s["other"]))


@op("NegBackward0", elementwise=True, cost=cost.pointwise(1))
def neg(node, grads, ctx):
    """-a."""
    return each(node, lambda i: -grads[0])


@op("PowBackward0", saved="self:tensor exponent:scalar", elementwise=True, cost=cost.pointwise(3))
def pow_scalar(node, grads, ctx):
    """a ** e with a number e: g * e * a**(e-1)."""
    sv = ctx.saved(node)
    x, e = sv["self"], sv["exponent"]
    if e == 0:
        return each(node, lambda i: ctx.xp(node).zeros_like(x))
    return each(node, lambda i: grads[0] * (e * x ** (e - 1)))


@op("ExpBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(1))
def exp(node, grads, ctx):
    """exp(a): g * result."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * r)


@op("LogBackward0", saved="self:tensor", elementwise=True, cost=cost.pointwise(1))
def log(node, grads, ctx):
    """log(a): g / a."""
    s = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] / s)


@op("SqrtBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(2))
def sqrt(node, grads, ctx):
    """sqrt(a): g / (2 result)."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] / (2 * r))


@op("RsqrtBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(4))
def rsqrt(node, grads, ctx):
    """1/sqrt(a): -g result**3 / 2."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: -0.5 * grads[0] * r * r * r)


@op("AbsBackward0", saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def abs_(node, grads, ctx):
    """|a|: g * sign(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * ctx.xp(node).sign(x))


@op("SinBackward0", saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def sin(node, grads, ctx):
    """sin(a): g cos(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * ctx.xp(node).cos(x))


@op("CosBackward0", saved="self:tensor", elementwise=True, cost=cost.pointwise(2))
def cos(node, grads, ctx):
    """cos(a): -g sin(a)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: -grads[0] * ctx.xp(node).sin(x))


@op("ClampBackward1", saved="self:tensor min:scalar? max:scalar?", elementwise=True, cost=cost.pointwise(2))
def clamp(node, grads, ctx):
    """clamp(a, min, max): the gradient where a lies inside [min, max]."""
    sv = ctx.saved(node)
    x, lo, hi = sv["self"], sv.get("min"), sv.get("max")
    mask = True
    if lo is not None:
        mask = x >= lo
    if hi is not None:
        mask = mask & (x <= hi)
    return each(node, lambda i: grads[0] * mask)


@op("WhereBackward0", saved="condition:tensor", cost=cost.pointwise(1))
def where(node, grads, ctx):
    """where(c, a, b): the gradient to a where c holds, to b elsewhere."""
    c = ctx.saved(node)["condition"]
    xp = ctx.xp(node)
    g = grads[0]
    return each(node, lambda i: xp.where(c, g, 0) if i == 0 else xp.where(c, 0, g))


@op("CloneBackward0", elementwise=True, cost=cost.VIEW)
def clone(node, grads, ctx):
    """clone(a): the gradient passes through."""
    return each(node, lambda i: grads[0])
