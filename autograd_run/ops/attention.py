"""Attention: the fused scaled-dot-product attention kernels (CPU flash; CUDA flash, memory-efficient, cuDNN;
the overrideable backend), one formula for all of them.

Forward: S = scale * Q K^T + bias (the float mask, or -inf outside a causal
mask), P = softmax(S) over the keys, O = P V. Backward, with dO the incoming
gradient: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
dQ = scale * dS K, dK = scale * dS^T Q, and d(bias) = dS for the kernels that
differentiate their bias. P is recomputed from Q, K and the mask (the kernels
use their saved log-sum-exp for that; recomputing in the graph's precision
gives the same P without depending on each kernel's layout of it). Rows that
the mask hides entirely get P = 0, as the kernels give them a zero output.

Keys and values may have fewer heads than queries (grouped-query attention:
each key/value head serves consecutive query heads); their gradients are
summed over the heads they serve. Dropout is not replayed: its mask comes from
the kernel's random state, which the graph does not hold.
"""

from __future__ import annotations

import math

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, number, out_meta, sum_to
from autograd_run.ops.spec import op


def _attention_flops(s: cost.Shapes) -> float:
    """Recompute Q K^T (2 L S E) and P, then dV, dP, dQ, dK (2 L S (E or Ev) each), softmax backward (~4 L S)."""
    q = s.saved.get("query")
    k = s.saved.get("key")
    v = s.saved.get("value")
    if q is None or k is None:
        g = s.inputs[0][0] if s.inputs else ()
        return float(10 * math.prod(g)) if g else 0.0
    *batch, length, e = q[0]
    keys = k[0][-2]
    ev = v[0][-1] if v is not None else e
    pairs = math.prod(batch) * length * keys
    return float(pairs * (2 * e + 2 * ev + 2 * ev + 2 * e + 2 * e + 9))


ATTENTION = cost.CostModel(_attention_flops)


def _probabilities(xp, q, k, scale, bias, causal, bottom_right):
    """softmax(scale * Q K^T + bias) over the keys, with a causal mask; fully hidden rows are zero."""
    scores = (q @ k.swapaxes(-1, -2)) * scale
    if bias is not None:
        if bias.dtype == bool:  # a boolean mask in a hand-written file: True keeps the position
            bias = xp.where(bias, 0.0, -xp.inf)
        scores = scores + bias
    if causal:
        length, keys = scores.shape[-2], scores.shape[-1]
        shift = keys - length if bottom_right else 0
        hidden = xp.arange(keys)[None, :] > xp.arange(length)[:, None] + shift
        scores = xp.where(hidden, -xp.inf, scores)
    top = scores.max(axis=-1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    e = xp.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    return e / xp.where(total == 0, 1, total)


def _repeat_heads(xp, t, heads):
    """Keys/values with fewer heads than the queries, each head repeated for the query heads it serves."""
    if t.ndim < 3 or t.shape[-3] == heads:
        return t
    return xp.repeat(t, heads // t.shape[-3], axis=-3)


def _fold_heads(t, heads):
    """The gradient of ``_repeat_heads``: sum over the query heads that shared a key/value head."""
    if t.ndim < 3 or t.shape[-3] == heads:
        return t
    rep = t.shape[-3] // heads
    return t.reshape(t.shape[:-3] + (heads, rep) + t.shape[-2:]).sum(axis=-3)


def attention_backward(node, grads, ctx, *, bias_field=None, bias_edge=None, bottom_right=False):
    """The gradients of (query, key, value[, bias]) for the fused attention node ``node``."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    dropout = float(number(sv.get("dropout_p") or 0.0))
    if dropout > 0:
        raise RuntimeError(f"{node.name} {node.id!r}: dropout_p={dropout} cannot be replayed (its mask comes "
                           f"from the kernel's random state)")
    q, k, v = sv["query"], sv["key"], sv["value"]
    g = grads[0]
    scale = sv.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(number(scale))
    bias = sv.get(bias_field) if bias_field else None
    heads = q.shape[-3] if q.ndim >= 3 else None
    kr, vr = _repeat_heads(xp, k, heads), _repeat_heads(xp, v, heads)
    p = _probabilities(xp, q, kr, scale, bias, bool(sv.get("is_causal", False)), bottom_right)
    dp = g @ vr.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))

    def out(i):
        if i == 0:
            r = (ds @ kr) * scale
        elif i == 1:
            r = _fold_heads((ds.swapaxes(-1, -2) @ q) * scale, k.shape[-3] if k.ndim >= 3 else None)
        elif i == 2:
            r = _fold_heads(p.swapaxes(-1, -2) @ g, v.shape[-3] if v.ndim >= 3 else None)
        elif i == bias_edge:
            r = ds
        else:
            return None
        return sum_to(xp, r, out_meta(node, i).shape)
    return each(node, out)


def _no_dropout(saved):
    p = saved.get("dropout_p") or 0.0
    if isinstance(p, (int, float)) and p > 0:
        return f"attention with dropout_p={p}: the dropout mask comes from the kernel's random state"
    return None


@op("ScaledDotProductFlashAttentionForCpuBackward0", outputs=3,
    saved="query:tensor key:tensor value:tensor output:tensor? logsumexp:tensor? attn_mask:tensor? "
          "dropout_p:scalar? is_causal:bool? scale:scalar?",
    cost=ATTENTION, unsupported=_no_dropout)
def flash_cpu(node, grads, ctx):
    """F.scaled_dot_product_attention on the CPU (nn.Transformer layers, nn.MultiheadAttention without weights).

    The softmax(Q K^T) V backward; the float mask is not differentiated; causal is top-left aligned.
    """
    return attention_backward(node, grads, ctx, bias_field="attn_mask")


@op("ScaledDotProductFlashAttentionBackward0", outputs=3,
    saved="query:tensor key:tensor value:tensor output:tensor? logsumexp:tensor? cum_seq_q:tensor? "
          "cum_seq_k:tensor? max_q:int? max_k:int? dropout_p:scalar? is_causal:bool? rng_state:tensor? "
          "unused:tensor? scale:scalar?",
    cost=ATTENTION, unsupported=_no_dropout)
def flash_cuda(node, grads, ctx):
    """F.scaled_dot_product_attention through CUDA flash attention (no mask).

    Causal is bottom-right aligned, as in FlashAttention 2 (PyTorch picks flash for square causal attention only).
    """
    return attention_backward(node, grads, ctx, bottom_right=True)


@op("ScaledDotProductEfficientAttentionBackward0", outputs=4,
    saved="query:tensor key:tensor value:tensor attn_bias:tensor? output:tensor? log_sumexp:tensor? "
          "philox_seed:tensor? philox_offset:tensor? dropout_p:scalar? is_causal:bool? scale:scalar?",
    cost=ATTENTION, unsupported=_no_dropout)
def efficient_cuda(node, grads, ctx):
    """F.scaled_dot_product_attention through CUDA memory-efficient attention, the bias differentiated too.

    Causal is top-left aligned.
    """
    return attention_backward(node, grads, ctx, bias_field="attn_bias", bias_edge=3)


@op("ScaledDotProductCudnnAttentionBackward0", outputs=3,
    saved="query:tensor key:tensor value:tensor output:tensor? logsumexp:tensor? philox_seed:tensor? "
          "philox_offset:tensor? attn_bias:tensor? cum_seq_q:tensor? cum_seq_k:tensor? max_q:int? max_k:int? "
          "dropout_p:scalar? is_causal:bool? scale:scalar?",
    cost=ATTENTION, unsupported=_no_dropout)
def cudnn_cuda(node, grads, ctx):
    """F.scaled_dot_product_attention through cuDNN attention (the bias is not differentiated).

    Causal is top-left aligned.
    """
    return attention_backward(node, grads, ctx, bias_field="attn_bias")


@op("ScaledDotProductFusedAttentionOverrideableBackward0", outputs=4,
    saved="query:tensor key:tensor value:tensor attn_bias:tensor? output:tensor? logsumexp:tensor? "
          "cum_seq_q:tensor? cum_seq_k:tensor? max_q:int? max_k:int? philox_seed:tensor? philox_offset:tensor? "
          "dropout_p:scalar? is_causal:bool? scale:scalar?",
    cost=ATTENTION, unsupported=_no_dropout)
def overrideable(node, grads, ctx):
    """F.scaled_dot_product_attention through an out-of-tree backend (XPU, ...), the bias differentiated too.

    Causal is top-left aligned.
    """
    return attention_backward(node, grads, ctx, bias_field="attn_bias", bias_edge=3)
