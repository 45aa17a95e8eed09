"""Activations and softmax: relu, gelu, tanh, sigmoid, silu, mish, elu/selu/celu, leaky/parametric/randomized relu,
hardtanh (relu6), hardswish, hardsigmoid, softplus, log-sigmoid, shrinkage, threshold, glu, softmax, log-softmax;
and the double-backward nodes these leave in ``create_graph=True`` graphs (``TanhBackwardBackward0``, ...).

tanh and sigmoid accept complex inputs (the gradient times the conjugate
derivative); the others are real-only in PyTorch.
"""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, filled, keep_where, nonpositive, signed, sum_to, zero_where
from autograd_run.ops.numeric import conj, erf, num
from autograd_run.ops.spec import op

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _sigmoid(xp, x):
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


@op("ReluBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(1))
def relu(node, grads, ctx):
    """relu(a): threshold_backward(g, result, 0), zero where the result is <= 0 (a NaN result passes g)."""
    r = ctx.saved(node)["result"]  # unpacked first, as PyTorch does (released: the backward-twice error)
    return [None if node.next[0] is None else zero_where(ctx.xp(node), nonpositive(r), grads[0])]


@op("TanhBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(3))
def tanh(node, grads, ctx):
    """tanh(a): g conj(1 - result**2)."""
    r = ctx.saved(node)["result"]
    if r.dtype.kind == "c":
        r = r.conj()
    return each(node, lambda i: grads[0] * (1 - r * r))


@op("SigmoidBackward0", outputs=1, saved="result:tensor", elementwise=True, cost=cost.pointwise(3))
def sigmoid(node, grads, ctx):
    """sigmoid(a): g conj((1 - result) result)."""
    r = ctx.saved(node)["result"]
    if r.dtype.kind == "c":
        r = r.conj()
    return each(node, lambda i: grads[0] * (1 - r) * r)


def _gelu_derivative(xp, x, approximate):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        t = xp.tanh(inner)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1 + erf(xp, x / math.sqrt(2.0)))
    return cdf + x * xp.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _gelu_second_derivative(xp, x, approximate):
    if approximate == "tanh":
        k, c = _SQRT_2_OVER_PI, 0.044715
        u = k * (x + c * x ** 3)
        du = k * (1 + 3 * c * x * x)
        ddu = k * 6 * c * x
        t = xp.tanh(u)
        s = 1 - t * t  # sech**2
        # d/dx [0.5 (1 + t) + 0.5 x s du]
        return 0.5 * s * du + 0.5 * s * du + 0.5 * x * (-2 * t * s * du * du + s * ddu)
    return xp.exp(-0.5 * x * x) * _INV_SQRT_2PI * (2 - x * x)


@op("GeluBackward0", outputs=1, saved="self:tensor approximate:str?", elementwise=True, cost=cost.pointwise(12))
def gelu(node, grads, ctx):
    """gelu(a), exact (erf) or tanh approximation."""
    sv = ctx.saved(node)
    d = _gelu_derivative(ctx.xp(node), sv["self"], sv.get("approximate", "none"))
    return each(node, lambda i: grads[0] * d)


@op("SiluBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(6))
def silu(node, grads, ctx):
    """silu(a) = a sigmoid(a)."""
    x = ctx.saved(node)["self"]
    s = _sigmoid(ctx.xp(node), x)
    return each(node, lambda i: grads[0] * s * (1 + x * (1 - s)))


@op("MishBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(10))
def mish(node, grads, ctx):
    """mish(a) = a tanh(softplus(a)): g (tanh(sp) + a sigmoid(a) (1 - tanh(sp)**2))."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    t = xp.tanh(xp.logaddexp(0, x))
    return each(node, lambda i: grads[0] * (t + x * _sigmoid(xp, x) * (1 - t * t)))


@op("LeakyReluBackward0", outputs=1,
    saved="self:tensor negative_slope:scalar?", elementwise=True, cost=cost.pointwise(2))
def leaky_relu(node, grads, ctx):
    """leaky_relu(a, slope): g where a > 0, slope * g elsewhere."""
    sv = ctx.saved(node)
    x, slope = sv["self"], num(sv.get("negative_slope", 0.01))
    return each(node, lambda i: grads[0] * ctx.xp(node).where(x > 0, 1.0, slope).astype(grads[0].dtype))


@op("LeakyReluBackward1", outputs=1,
    saved="result:tensor negative_slope:scalar?", elementwise=True, cost=cost.pointwise(2))
def leaky_relu_inplace(node, grads, ctx):
    """in-place leaky_relu_(a, slope) (result saved): g where the result is > 0, slope * g elsewhere."""
    sv = ctx.saved(node)
    r, slope = sv["result"], num(sv.get("negative_slope", 0.01))
    return each(node, lambda i: grads[0] * ctx.xp(node).where(r > 0, 1.0, slope).astype(grads[0].dtype))


def _elu_factor(xp, x, alpha, scale, input_scale, is_result):
    """d elu / d input, from the input or (in-place variants) the result."""
    if is_result:
        return xp.where(x <= 0, input_scale * (x + alpha * scale), scale)
    return xp.where(x <= 0, input_scale * alpha * scale * xp.exp(xp.minimum(x, 0) * input_scale), scale)


@op("EluBackward0", outputs=1, saved="self:tensor alpha:scalar? scale:scalar? input_scale:scalar?", elementwise=True,
    cost=cost.pointwise(4))
def elu(node, grads, ctx):
    """elu / selu: g scale where a > 0, g input_scale alpha scale exp(input_scale a) elsewhere."""
    sv = ctx.saved(node)
    d = _elu_factor(ctx.xp(node), sv["self"], num(sv.get("alpha", 1)), num(sv.get("scale", 1)),
                    num(sv.get("input_scale", 1)), False)
    return each(node, lambda i: grads[0] * d)


@op("EluBackward1", outputs=1, saved="result:tensor alpha:scalar? scale:scalar? input_scale:scalar?", elementwise=True,
    cost=cost.pointwise(4))
def elu_inplace(node, grads, ctx):
    """in-place elu_ / selu_ (result saved): g scale where it is > 0, g input_scale (result + alpha scale) elsewhere."""
    sv = ctx.saved(node)
    d = _elu_factor(ctx.xp(node), sv["result"], num(sv.get("alpha", 1)), num(sv.get("scale", 1)),
                    num(sv.get("input_scale", 1)), True)
    return each(node, lambda i: grads[0] * d)


@op("CeluBackward0", outputs=1, saved="self:tensor alpha:scalar?", elementwise=True, cost=cost.pointwise(4))
def celu(node, grads, ctx):
    """celu(a, alpha): g where a > 0, g exp(a / alpha) elsewhere."""
    sv = ctx.saved(node)
    alpha = num(sv.get("alpha", 1.0))
    d = _elu_factor(ctx.xp(node), sv["self"], alpha, 1, 1.0 / alpha, False)
    return each(node, lambda i: grads[0] * d)


@op("CeluBackward1", outputs=1, saved="result:tensor alpha:scalar?", elementwise=True, cost=cost.pointwise(4))
def celu_inplace(node, grads, ctx):
    """in-place celu_(a, alpha) (result saved): g where the result is > 0, g (result / alpha + 1) elsewhere."""
    sv = ctx.saved(node)
    alpha = num(sv.get("alpha", 1.0))
    d = _elu_factor(ctx.xp(node), sv["result"], alpha, 1, 1.0 / alpha, True)
    return each(node, lambda i: grads[0] * d)


@op("HardtanhBackward0", outputs=1, saved="self:tensor min_val:scalar? max_val:scalar?", elementwise=True,
    cost=cost.pointwise(2))
def hardtanh(node, grads, ctx):
    """hardtanh(a, min, max) (relu6 too): the gradient where min < a < max, zero elsewhere.

    At a NaN input PyTorch's vectorized kernel gives zero (this rule too), its scalar loop (tensors of a few
    elements, the tails of others) the gradient.
    """
    sv = ctx.saved(node)
    x = sv["self"]
    lo, hi = num(sv.get("min_val", -1.0)), num(sv.get("max_val", 1.0))
    return each(node, lambda i: keep_where(ctx.xp(node), (x > lo) & (x < hi), grads[0]))


@op("HardswishBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(4))
def hardswish(node, grads, ctx):
    """hardswish(a) = a relu6(a + 3) / 6: 0 up to -3, g (a / 3 + 1/2) strictly inside, g from 3 on."""
    x = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    d = xp.where(x < 3, x / 3 + 0.5, 1.0)
    return each(node, lambda i: zero_where(xp, x <= -3, grads[0] * d))


@op("HardsigmoidBackward0", outputs=1, saved="self:tensor", elementwise=True, cost=cost.pointwise(3))
def hardsigmoid(node, grads, ctx):
    """hardsigmoid(a) = relu6(a + 3) / 6: g / 6 where -3 < a < 3, zero elsewhere.

    PyTorch's CPU kernel multiplies by ``1.0f / 6.0f``, the float32 sixth, in every dtype (float64 too:
    3e-8 from 1/6): so does this."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: keep_where(ctx.xp(node), (x > -3) & (x < 3), grads[0] * _SIXTH_F32))


#: ``1.0f / 6.0f``: the float32 sixth PyTorch's hardsigmoid backward multiplies by, as a Python float.
_SIXTH_F32 = float(np.float32(1.0) / np.float32(6.0))


def _softplus_factor(xp, x, beta, threshold):
    z = x * beta
    return xp.where(z > threshold, 1.0, _sigmoid(xp, z))


@op("SoftplusBackward0", outputs=1, saved="self:tensor beta:scalar? threshold:scalar?", elementwise=True,
    cost=cost.pointwise(4))
def softplus(node, grads, ctx):
    """softplus(a, beta, threshold): g sigmoid(beta a), or g where beta a > threshold (linear there)."""
    sv = ctx.saved(node)
    d = _softplus_factor(ctx.xp(node), sv["self"], num(sv.get("beta", 1)), num(sv.get("threshold", 20)))
    return each(node, lambda i: grads[0] * d)


def _log_sigmoid_factor(xp, x):
    """d log(sigmoid(a)) / da = sigmoid(-a), computed without overflow."""
    z = xp.exp(-xp.abs(x))
    return xp.where(x < 0, 1 / (1 + z), z / (1 + z))


@op("LogSigmoidBackward0", outputs=1, saved="self:tensor buffer:tensor?", elementwise=True, cost=cost.pointwise(4))
def log_sigmoid(node, grads, ctx):
    """log(sigmoid(a)): g sigmoid(-a) (the saved buffer is not needed)."""
    x = ctx.saved(node)["self"]
    return each(node, lambda i: grads[0] * _log_sigmoid_factor(ctx.xp(node), x))


@op("HardshrinkBackward0", "SoftshrinkBackward0", outputs=1, saved="self:tensor lambd:scalar?", elementwise=True,
    cost=cost.pointwise(2))
def shrink(node, grads, ctx):
    """hardshrink / softshrink(a, lambd): the gradient where |a| > lambd, zero elsewhere.

    At a NaN input zero, as PyTorch's vectorized kernel (its scalar loop passes the gradient there).
    """
    sv = ctx.saved(node)
    x, lam = sv["self"], num(sv.get("lambd", 0.5))
    return each(node, lambda i: keep_where(ctx.xp(node), (x > lam) | (x < -lam), grads[0]))


@op("ThresholdBackward0", "ThresholdBackward1", outputs=1, saved="self:tensor threshold:scalar", elementwise=True,
    cost=cost.pointwise(1))
def threshold(node, grads, ctx):
    """threshold(a, t, v): the gradient, zero where a <= t."""
    sv = ctx.saved(node)
    return each(node, lambda i: zero_where(ctx.xp(node), sv["self"] <= num(sv["threshold"]), grads[0]))


@op("RreluWithNoiseBackward0", outputs=1, saved="self:tensor noise:tensor lower:scalar? upper:scalar? training:bool?",
    elementwise=True, cost=cost.pointwise(2))
def rrelu(node, grads, ctx):
    """rrelu: g times the sampled noise in training, else leaky relu with slope (lower + upper) / 2."""
    sv = ctx.saved(node)
    lower, upper = num(sv.get("lower", 0.125)), num(sv.get("upper", 1.0 / 3))
    if sv.get("training") and upper - lower > 1e-6:
        return each(node, lambda i: grads[0] * sv["noise"])
    slope = (lower + upper) / 2
    return each(node, lambda i: grads[0] * ctx.xp(node).where(sv["self"] > 0, 1.0, slope))


@op("PreluKernelBackward0", outputs=2, saved="self:tensor weight:tensor", cost=cost.pointwise(4))
def prelu(node, grads, ctx):
    """prelu(a, w): g where a > 0, w g elsewhere to a; a g where a <= 0 to w, summed to w's shape."""
    sv = ctx.saved(node)
    x, w = sv["self"], sv["weight"]
    xp = ctx.xp(node)
    g = grads[0]
    pos = x > 0

    def out(i):
        if i == 0:
            return xp.where(pos, g, w * g)
        return sum_to(xp, xp.where(pos, 0, x * g), w.shape)
    return each(node, out)


@op("GluBackward0", outputs=1, saved="self:tensor dim:int", cost=cost.pointwise(6))
def glu(node, grads, ctx):
    """glu(a, dim) = first half * sigmoid(second half): both halves' gradients, concatenated."""
    sv = ctx.saved(node)
    x, dim = sv["self"], signed(sv["dim"])
    xp = ctx.xp(node)
    g = grads[0]
    a, b = xp.split(x, 2, axis=dim)
    s = _sigmoid(xp, b)
    return each(node, lambda i: xp.concatenate([g * s, g * a * s * (1 - s)], axis=dim))


@op("SoftmaxBackward0", "SafeSoftmaxBackward0", outputs=1, saved="result:tensor dim:int", cost=cost.pointwise(4))
def softmax(node, grads, ctx):
    """softmax(a, dim) (and _safe_softmax, zeros on fully masked rows): y (g - sum(g y))."""
    sv = ctx.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    return each(node, lambda i: y * (g - (g * y).sum(axis=dim, keepdims=True)))


@op("LogSoftmaxBackward0", outputs=1, saved="result:tensor dim:int", cost=cost.pointwise(4))
def log_softmax(node, grads, ctx):
    """log_softmax(a, dim): g - exp(y) sum(g)."""
    sv = ctx.saved(node)
    y, dim = sv["result"], signed(sv["dim"])
    g = grads[0]
    xp = ctx.xp(node)
    return each(node, lambda i: g - xp.exp(y) * g.sum(axis=dim, keepdims=True))


# --- double backward: the backward formulas above, differentiated again ---------------------------------------
# Each node's inputs are the gradients of the first backward's outputs (here one: its grad_input);
# its next edges are the first backward's inputs: grad_output, then the saved tensors it used.


@op("TanhBackwardBackward0", outputs=2, saved="grad_output:tensor output:tensor", cost=cost.pointwise(6))
def tanh_backward_backward(node, grads, ctx):
    """tanh_backward(go, y) = go (1 - y**2): g (1 - y**2) to go, -2 g go y to y."""
    sv = ctx.saved(node)
    go, y = sv["grad_output"], conj(sv["output"])
    g = grads[0]
    return each(node, lambda i: g * (1 - y * y) if i == 0 else conj(g) * (-2 * y * go))


@op("SigmoidBackwardBackward0", outputs=2, saved="grad_output:tensor output:tensor", cost=cost.pointwise(6))
def sigmoid_backward_backward(node, grads, ctx):
    """sigmoid_backward(go, y) = go y (1 - y): g y (1 - y) to go, g go (1 - 2y) to y."""
    sv = ctx.saved(node)
    go, y = sv["grad_output"], conj(sv["output"])
    g = grads[0]
    return each(node, lambda i: g * (1 - y) * y if i == 0 else conj(g) * go * (1 - 2 * y))


@op("ThresholdBackwardBackward0", outputs=2, saved="self:tensor threshold:scalar", cost=cost.pointwise(1))
def threshold_backward_backward(node, grads, ctx):
    """threshold_backward(go, a, t) (relu's gradient): g, zero where a <= t, to go; zero to a."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    return each(node, lambda i: zero_where(xp, x <= num(sv["threshold"]), grads[0]) if i == 0 else xp.zeros_like(x))


@op("HardtanhBackwardBackward0", outputs=2, saved="self:tensor min_val:scalar? max_val:scalar?", cost=cost.pointwise(2))
def hardtanh_backward_backward(node, grads, ctx):
    """hardtanh_backward(go, a): g where min < a < max (zero elsewhere) to go; zero to a."""
    sv = ctx.saved(node)
    x = sv["self"]
    lo, hi = num(sv.get("min_val", -1.0)), num(sv.get("max_val", 1.0))
    xp = ctx.xp(node)
    return each(node, lambda i: keep_where(xp, (x > lo) & (x < hi), grads[0]) if i == 0 else xp.zeros_like(x))


@op("LeakyReluBackwardBackward0", outputs=2, saved="self:tensor negative_slope:scalar?", cost=cost.pointwise(2))
def leaky_relu_backward_backward(node, grads, ctx):
    """leaky_relu_backward(go, a, slope): g where a > 0, slope g elsewhere, to go; zero to a."""
    sv = ctx.saved(node)
    x, slope = sv["self"], num(sv.get("negative_slope", 0.01))
    xp = ctx.xp(node)
    return each(node, lambda i: grads[0] * xp.where(x > 0, 1.0, slope) if i == 0 else xp.zeros_like(x))


@op("GeluBackwardBackward0", outputs=2,
    saved="grad_output:tensor self:tensor approximate:str?", cost=cost.pointwise(20))
def gelu_backward_backward(node, grads, ctx):
    """gelu_backward(go, a) = go gelu'(a): g gelu'(a) to go, g go gelu''(a) to a."""
    sv = ctx.saved(node)
    x, approx = sv["self"], sv.get("approximate", "none")
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return g * _gelu_derivative(xp, x, approx)
        return g * sv["grad_output"] * _gelu_second_derivative(xp, x, approx)
    return each(node, out)


@op("EluBackwardBackward0", outputs=2,
    saved="grad_output:tensor self_or_result:tensor alpha:scalar? scale:scalar? input_scale:scalar? is_result:bool?",
    cost=cost.pointwise(6))
def elu_backward_backward(node, grads, ctx):
    """elu_backward(go, a or result): g elu'(a) to go; g go elu''(a) (from the result: g go input_scale) to a.

    The second times (a < 0), as PyTorch: zero at a >= 0, but a NaN or infinite g stays NaN there.
    """
    sv = ctx.saved(node)
    x = sv["self_or_result"]
    alpha, scale, iscale = num(sv.get("alpha", 1)), num(sv.get("scale", 1)), num(sv.get("input_scale", 1))
    is_result = bool(sv.get("is_result"))
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return g * _elu_factor(xp, x, alpha, scale, iscale, is_result)
        scaled = g * sv["grad_output"] * iscale
        if not is_result:
            scaled = scaled * _elu_factor(xp, x, alpha, scale, iscale, False)
        return scaled * (x < 0)
    return each(node, out)


@op("SoftplusBackwardBackward0", outputs=2, saved="grad_output:tensor self:tensor beta:scalar? threshold:scalar?",
    cost=cost.pointwise(6))
def softplus_backward_backward(node, grads, ctx):
    """softplus_backward(go, a): g sigmoid(beta a) to go; g go beta s (1 - s) (beta a < threshold) to a.

    The mask multiplies, as PyTorch's: zero in the linear region, but a NaN or infinite g stays NaN there.
    """
    sv = ctx.saved(node)
    x, beta, thr = sv["self"], num(sv.get("beta", 1)), num(sv.get("threshold", 20))
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return g * _softplus_factor(xp, x, beta, thr)
        z = x * beta
        s = _sigmoid(xp, z)
        return g * sv["grad_output"] * (1 - s) * s * (z < thr) * beta
    return each(node, out)


@op("LogSigmoidBackwardBackward0", outputs=2,
    saved="self:tensor buffer:tensor? grad_output:tensor", cost=cost.pointwise(6))
def log_sigmoid_backward_backward(node, grads, ctx):
    """log_sigmoid_backward(go, a) = go sigmoid(-a): g sigmoid(-a) to go; -g go s (1 - s) to a."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return g * _log_sigmoid_factor(xp, x)
        s = _sigmoid(xp, x)
        return -g * sv["grad_output"] * s * (1 - s)
    return each(node, out)


@op("SoftmaxBackwardDataBackward0", outputs=2, saved="grad_output:tensor output:tensor dim:int", cost=cost.pointwise(8))
def softmax_backward_backward(node, grads, ctx):
    """softmax_backward(go, y) = y (go - sum(go y)): its gradients to go and y."""
    sv = ctx.saved(node)
    go, y, dim = sv["grad_output"], sv["output"], signed(sv["dim"])
    g = grads[0]

    def out(i):
        if i == 0:
            return y * (g - (g * y).sum(axis=dim, keepdims=True))
        return (g * go - g * (y * go).sum(axis=dim, keepdims=True)
                - go * (g * y).sum(axis=dim, keepdims=True))
    return each(node, out)


@op("LogSoftmaxBackwardDataBackward0", outputs=2,
    saved="grad_output:tensor output:tensor dim:int", cost=cost.pointwise(6))
def log_softmax_backward_backward(node, grads, ctx):
    """log_softmax_backward(go, y) = go - exp(y) sum(go): its gradients to go and y."""
    sv = ctx.saved(node)
    go, y, dim = sv["grad_output"], sv["output"], signed(sv["dim"])
    xp = ctx.xp(node)
    g = grads[0]
    e = xp.exp(y)

    def out(i):
        if i == 0:
            return g - (g * e).sum(axis=dim, keepdims=True)
        return -go.sum(axis=dim, keepdims=True) * e * g
    return each(node, out)


@op("PreluKernelBackwardBackward0", outputs=3,
    saved="grad_output:tensor self:tensor weight:tensor", cost=cost.pointwise(8))
def prelu_backward_backward(node, grads, ctx):
    """prelu's backward (gradients for a and w) differentiated again: to grad_output, a and w."""
    sv = ctx.saved(node)
    go, x, w = sv["grad_output"], sv["self"], sv["weight"]
    xp = ctx.xp(node)
    ga, gw = filled(node, grads, xp)
    pos = x >= 0  # PyTorch's double backward puts a == 0 on the positive side

    def out(i):
        if i == 0:
            return xp.where(pos, ga, ga * w + gw * x)
        if i == 1:
            return xp.where(pos, 0, go * gw)
        return sum_to(xp, xp.where(pos, 0, go * ga), w.shape)
    return each(node, out)


@op("HardswishBackwardBackward0", outputs=2, saved="grad_output:tensor self:tensor", cost=cost.pointwise(4))
def hardswish_backward_backward(node, grads, ctx):
    """hardswish_backward(go, a): hardswish'(a) g to go; g go / 3 strictly inside (-3, 3) to a."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return zero_where(xp, x <= -3, g * xp.where(x < 3, x / 3 + 0.5, 1.0))
        return xp.where((x > -3) & (x < 3), g * sv["grad_output"] / 3, 0)
    return each(node, out)


@op("HardshrinkBackwardBackward0", "SoftshrinkBackwardBackward0", outputs=2, saved="self:tensor lambd:scalar?",
    cost=cost.pointwise(2))
def shrink_backward_backward(node, grads, ctx):
    """hard/softshrink_backward(go, a): g where |a| > lambd (zero elsewhere) to go; zero to a."""
    sv = ctx.saved(node)
    x, lam = sv["self"], num(sv.get("lambd", 0.5))
    xp = ctx.xp(node)
    return each(node, lambda i: keep_where(xp, (x > lam) | (x < -lam), grads[0]) if i == 0 else xp.zeros_like(x))


@op("RreluWithNoiseBackwardBackward0", outputs=2,
    saved="self:tensor noise:tensor lower:scalar? upper:scalar? training:bool?", cost=cost.pointwise(2))
def rrelu_backward_backward(node, grads, ctx):
    """rrelu's backward is linear in go: the same factor times g to go; zero to a."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    lower, upper = num(sv.get("lower", 0.125)), num(sv.get("upper", 1.0 / 3))
    if sv.get("training") and upper - lower > 1e-6:
        factor = sv["noise"]
    else:
        factor = xp.where(sv["self"] > 0, 1.0, (lower + upper) / 2)
    return each(node, lambda i: grads[0] * factor if i == 0 else xp.zeros_like(sv["self"]))


@op("GluBackwardBackward0", outputs=2, saved="grad_output:tensor self:tensor dim:int", cost=cost.pointwise(10))
def glu_backward_backward(node, grads, ctx):
    """glu_backward(go, [a, b]) = [go s, go a s (1 - s)] with s = sigmoid(b), differentiated: to go and to a, b."""
    sv = ctx.saved(node)
    x, go, dim = sv["self"], sv["grad_output"], signed(sv["dim"])
    xp = ctx.xp(node)
    a, b = xp.split(x, 2, axis=dim)
    ga, gb = xp.split(grads[0], 2, axis=dim)
    s = _sigmoid(xp, b)
    ds = s * (1 - s)

    def out(i):
        if i == 0:
            return ga * s + gb * a * ds
        return xp.concatenate([gb * go * ds, ga * go * ds + gb * go * a * ds * (1 - 2 * s)], axis=dim)
    return each(node, out)
