"""Activations and softmax: relu, gelu, tanh, sigmoid, silu, leaky relu, softmax, log-softmax."""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed
from autograd_run.ops.spec import op


def _erf(xp, x):
    if xp is np:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)
    from cupyx.scipy.special import erf  # real GPU only
    return erf(x)


@op("ReluBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(1))
def relu(node, grads, ctx):
    """relu(a): the gradient where the result is positive."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * (r > 0))


@op("TanhBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(3))
def tanh(node, grads, ctx):
    """tanh(a): g (1 - result**2)."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * (1 - r * r))


@op("SigmoidBackward0", saved="result:tensor", elementwise=True, cost=cost.pointwise(3))
def sigmoid(node, grads, ctx):
    """sigmoid(a): g (1 - result) result."""
    r = ctx.saved(node)["result"]
    return each(node, lambda i: grads[0] * (1 - r) * r)


@op("GeluBackward0", saved="self:tensor approximate:str?", elementwise=True, cost=cost.pointwise(12))
def gelu(node, grads, ctx):
    """gelu(a), exact (erf) or tanh approximation."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    if sv.get("approximate", "none") == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = k * (x + 0.044715 * x ** 3)
        t = xp.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1 + _erf(xp, x / math.sqrt(2.0)))
        pdf = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        d = cdf + x * pdf
    return each(node, lambda i: grads[0] * d)


@op("SiluBackward0", saved="self:tensor", elementwise=True, cost=cost.pointwise(6))
def silu(node, grads, ctx):
    """silu(a) = a sigmoid(a)."""
    x = ctx.saved(node)["self"]
    s = 1 / (1 + ctx.xp(node).exp(-x))
    return each(node, lambda i: grads[0] * s * (1 + x * (1 - s)))


@op("LeakyReluBackward0", saved="self:tensor negative_slope:scalar?", elementwise=True, cost=cost.pointwise(2))
def leaky_relu(node, grads, ctx):
    """leaky_relu(a, slope): g where a > 0, slope * g elsewhere."""
    sv = ctx.saved(node)
    x, slope = sv["self"], sv.get("negative_slope", 0.01)
    return each(node, lambda i: grads[0] * ctx.xp(node).where(x > 0, 1.0, slope).astype(grads[0].dtype))


@op("SoftmaxBackward0", saved="result:tensor dim:int", cost=cost.pointwise(4))
def softmax(node, grads, ctx):
    """softmax(a, dim): y (g - sum(g y))."""
    sv = ctx.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    return each(node, lambda i: y * (g - (g * y).sum(axis=dim, keepdims=True)))


@op("LogSoftmaxBackward0", saved="result:tensor dim:int", cost=cost.pointwise(4))
def log_softmax(node, grads, ctx):
    """log_softmax(a, dim): g - exp(y) sum(g)."""
    sv = ctx.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    xp = ctx.xp(node)
    return each(node, lambda i: g - xp.exp(y) * g.sum(axis=dim, keepdims=True))
