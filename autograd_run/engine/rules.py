"""Backward rules: one entry per ``Op``, computing input gradients from output gradients.

A rule is ``fn(node, grads, gt) -> list`` with one entry per next edge
(None where that edge is invalid or the gradient is not defined).
``grads`` are the node's input gradients (one per input slot, None if
undefined); ``gt.saved(node)`` gives its saved values, with the fields that
``ops.SAVED_TENSORS`` names as arrays (those are released after a backward
without ``retain_graph``). Gradients need not match the consumer's shape exactly:
``validate_outputs`` reduces broadcast shapes with ``sum_to``, as PyTorch
does. Arrays are numpy (or cupy on a real GPU): rules use ``gt.xp(node)``.
"""

from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autograd_run.engine import rules_conv as conv
from autograd_run.engine import rules_more as more
from autograd_run.graphs.ops import Op


@dataclass(frozen=True)
class Rule:
    fn: Callable


def _each(node, value_for):
    """``value_for(i)`` for each valid next edge i, None elsewhere."""
    return [None if e is None else value_for(i) for i, e in enumerate(node.next)]


def sum_to(xp, grad, shape):
    """Reduce ``grad`` to ``shape`` by summing broadcast dimensions (PyTorch's ``sum_to``)."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    if not shape:
        return grad.sum().reshape(())
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    out = grad.sum(axis=axes, keepdims=True) if axes else grad
    if lead:
        out = out.reshape(out.shape[lead:])
    return out.reshape(shape)


def accumulate_grad(node, grads, gt):
    g = grads[0]
    if g is not None:
        gt.state.accumulate(node.variable, g, gt.create_graph)
    return []


def add(node, grads, gt):
    g = grads[0]
    nxt = node.next
    if len(nxt) == 1:
        return [g]
    alpha = node.saved.get("alpha", 1)
    return [None if nxt[0] is None else g, None if nxt[1] is None else (g if alpha == 1 else g * alpha)]


def sub(node, grads, gt):
    g = grads[0]
    alpha = node.saved.get("alpha", 1)
    return [None if node.next[0] is None else g,
            None if len(node.next) < 2 or node.next[1] is None else -g * alpha]


def mul(node, grads, gt):
    g = grads[0]
    s = gt.saved(node)
    nxt = node.next
    if len(nxt) != 2:
        return _each(node, lambda i: g * (s["other"] if i == 0 else s["self"]))
    return [None if nxt[0] is None else g * s["other"], None if nxt[1] is None else g * s["self"]]


def div(node, grads, gt):
    g = grads[0]
    s = gt.saved(node)
    return _each(node, lambda i: g / s["other"] if i == 0 else -g * s["self"] / (s["other"] * s["other"]))


def neg(node, grads, gt):
    return _each(node, lambda i: -grads[0])


def mm(node, grads, gt):
    g = grads[0]
    s = gt.saved(node)
    return _each(node, lambda i: g @ s["mat2"].T if i == 0 else s["self"].T @ g)


def t(node, grads, gt):
    return _each(node, lambda i: grads[0].T)


def sum_all(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    xp = gt.xp(node)
    return _each(node, lambda i: xp.broadcast_to(grads[0], sizes))


def sum_dim(node, grads, gt):
    return more.expand_reduced(node, grads[0], gt.xp(node))


def mean_all(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    n = node.saved.get("self_sym_numel", math.prod(sizes))
    xp = gt.xp(node)
    return _each(node, lambda i: xp.broadcast_to(grads[0] / n, sizes))


def relu(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: grads[0] * (r > 0))


def exp(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: grads[0] * r)


def tanh(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: grads[0] * (1 - r * r))


def sigmoid(node, grads, gt):
    r = gt.saved(node)["result"]
    return _each(node, lambda i: grads[0] * (1 - r) * r)


def passthrough(node, grads, gt):
    return _each(node, lambda i: grads[0])


def view(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    return _each(node, lambda i: grads[0].reshape(sizes))


def expand(node, grads, gt):
    sizes = tuple(node.saved["self_sym_sizes"])
    return _each(node, lambda i: sum_to(gt.xp(node), grads[0], sizes))


def to_copy(node, grads, gt):
    """The gradient goes back to the input's dtype and device (a cross-device copy)."""
    def convert(i):
        e = node.next[i]
        meta = e.node.inputs[e.input_nr]
        return gt.engine.devices.transfer(grads[0], node.device, meta.device).astype(meta.dtype, copy=False)
    return _each(node, convert)


def opaque(node, grads, gt):
    """No rule is known: zeros of the shapes the consumers declare."""
    def zeros(i):
        e = node.next[i]
        meta = e.node.inputs[e.input_nr]
        return gt.xp(node).zeros(meta.shape, dtype=meta.dtype)
    return _each(node, zeros)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


#: Default throughput a ``spin``/``sleep`` cost node assumes to turn FLOPs into time.
COST_FLOPS_PER_SECOND = 1e9


def cost(node, grads, gt):
    """Do real work for the node's declared cost, then emit zeros of the consumers' shapes.

    ``attrs.cost``: ``{"us": microseconds}`` or ``{"flops": count}``, and
    ``mode``: ``spin`` (busy loop, holds the GIL), ``sleep`` (releases it) or
    ``matmul`` (a square float32 matmul of that many FLOPs, releases the GIL).
    """
    spec = node.attrs.get("cost") or {}
    mode = spec.get("mode", "spin")
    if "us" in spec:
        seconds = float(spec["us"]) * 1e-6
        flops = seconds * COST_FLOPS_PER_SECOND
    else:
        flops = float(spec.get("flops", 0))
        seconds = flops / COST_FLOPS_PER_SECOND
    if mode == "matmul" and flops > 0:
        n = max(1, int(round((flops / 2) ** (1 / 3))))
        xp = gt.xp(node)
        a = xp.ones((n, n), dtype=np.float32)
        a @ a
    elif mode == "sleep":
        time.sleep(seconds)
    elif seconds > 0:
        _spin(seconds)
    return opaque(node, grads, gt)


def python(node, grads, gt):
    """A Python callable ``fn(ctx, grads) -> grads``; it may call the engine again (reentrant)."""
    fn = gt.state.python_fns.get(node)
    if fn is None:
        target = node.attrs.get("callable")
        if not gt.allow_python:
            raise RuntimeError(
                f"node {node.id!r} runs Python code ({target!r}); pass --allow-python to allow it")
        if not isinstance(target, str) or ":" not in target:
            raise RuntimeError(f"node {node.id!r}: attrs.callable must be 'module:function'")
        mod, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(mod), attr)
    from autograd_run.engine.reentrant_ctx import PythonNodeContext
    out = fn(PythonNodeContext(gt, node), list(grads))
    return list(out) if out is not None else [None] * len(node.next)


def graph_root(node, grads, gt):
    return list(node.attrs["grads"])


RULES: dict[Op, Rule] = {
    Op.ACCUMULATE_GRAD: Rule(accumulate_grad),
    Op.ADD: Rule(add),
    Op.SUB: Rule(sub),
    Op.MUL: Rule(mul),
    Op.DIV: Rule(div),
    Op.NEG: Rule(neg),
    Op.MM: Rule(mm),
    Op.T: Rule(t),
    Op.SUM: Rule(sum_all),
    Op.SUM_DIM: Rule(sum_dim),
    Op.MEAN: Rule(mean_all),
    Op.RELU: Rule(relu),
    Op.EXP: Rule(exp),
    Op.TANH: Rule(tanh),
    Op.SIGMOID: Rule(sigmoid),
    Op.CLONE: Rule(passthrough),
    Op.TO_COPY: Rule(to_copy),
    Op.VIEW: Rule(view),
    Op.RESHAPE_ALIAS: Rule(view),
    Op.UNSAFE_VIEW: Rule(view),
    Op.LOG: Rule(more.log),
    Op.POW: Rule(more.pow_scalar),
    Op.ADDMM: Rule(more.addmm),
    Op.BMM: Rule(more.bmm),
    Op.TRANSPOSE: Rule(more.transpose),
    Op.PERMUTE: Rule(more.permute),
    Op.MEAN_DIM: Rule(more.mean_dim),
    Op.GELU: Rule(more.gelu),
    Op.SOFTMAX: Rule(more.softmax),
    Op.LOG_SOFTMAX: Rule(more.log_softmax),
    Op.LAYER_NORM: Rule(more.layer_norm),
    Op.CAT: Rule(more.cat),
    Op.STACK: Rule(more.stack),
    Op.SELECT: Rule(more.select),
    Op.SLICE: Rule(more.slice_),
    Op.EMBEDDING: Rule(more.embedding),
    Op.SPLIT: Rule(more.split),
    Op.SPLIT_WITH_SIZES: Rule(more.split),
    Op.UNBIND: Rule(more.unbind),
    Op.SQRT: Rule(more.sqrt),
    Op.RSQRT: Rule(more.rsqrt),
    Op.RSUB: Rule(more.rsub_scalar),
    Op.ABS: Rule(more.abs_),
    Op.SILU: Rule(more.silu),
    Op.LEAKY_RELU: Rule(more.leaky_relu),
    Op.CLAMP: Rule(more.clamp),
    Op.SIN: Rule(more.sin),
    Op.COS: Rule(more.cos),
    Op.WHERE: Rule(more.where),
    Op.UNSQUEEZE: Rule(more.unsqueeze),
    Op.SQUEEZE: Rule(more.squeeze),
    Op.SQUEEZE_DIM: Rule(more.squeeze),
    Op.SQUEEZE_DIMS: Rule(more.squeeze),
    Op.MAX: Rule(more.max_all),
    Op.MIN: Rule(more.max_all),
    Op.AMAX: Rule(more.amax),
    Op.AMIN: Rule(more.amax),
    Op.MSE_LOSS: Rule(more.mse_loss),
    Op.NLL_LOSS: Rule(more.nll_loss),
    Op.NLL_LOSS_2D: Rule(more.nll_loss),
    Op.CONVOLUTION: Rule(conv.convolution),
    Op.MAX_POOL_1D: Rule(conv.max_pool),
    Op.MAX_POOL_2D: Rule(conv.max_pool),
    Op.MAX_POOL_3D: Rule(conv.max_pool),
    Op.AVG_POOL_2D: Rule(conv.avg_pool),
    Op.AVG_POOL_3D: Rule(conv.avg_pool),
    Op.BATCH_NORM: Rule(conv.batch_norm),
    Op.EXPAND: Rule(expand),
    Op.IDENTITY: Rule(passthrough),
    Op.COST: Rule(cost),
    Op.OPAQUE: Rule(opaque),
    Op.PYTHON: Rule(python),
    Op.GRAPH_ROOT: Rule(graph_root),
}
