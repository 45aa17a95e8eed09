"""Losses: mean squared error, negative log likelihood (1d and 2d targets), binary cross-entropy (on
probabilities and on logits, with weights and pos_weight), smooth L1, Huber, soft margin, multi-class margin,
multi-label margin;
and the double-backward nodes of MSE, smooth L1, Huber and NLL.

``reduction`` is PyTorch's enum: 0 none, 1 mean (over all elements, or
the total weight for NLL), 2 sum. A reduced loss's gradient is a number
that broadcasts over the input.
"""

from __future__ import annotations

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, keep_where, signed
from autograd_run.ops.numeric import num
from autograd_run.ops.spec import op

NONE, MEAN, SUM = 0, 1, 2


def _mean(d, reduction, n):
    return d / n if reduction == MEAN else d


@op("MseLossBackward0", outputs=2, saved="self:tensor target:tensor reduction:int?", cost=cost.pointwise(3))
def mse_loss(node, grads, ctx):
    """mse_loss(a, t): 2 (a - t) g, over numel for 'mean'; the negation for t."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    d = _mean(2 * (x - t) * grads[0], sv.get("reduction", MEAN), x.size)
    return each(node, lambda i: d if i == 0 else -d)


def _nll_scale(xp, target, weight, ignore, dtype):
    """The targets (ignored ones as 0), their weights (0 where ignored) and which are not ignored."""
    valid = target != ignore
    safe_t = xp.where(valid, target, 0)
    w = (weight[safe_t] if weight is not None else xp.ones(safe_t.shape, dtype=dtype)) * valid
    return safe_t, w, valid


@op("NllLossBackward0", "NllLoss2DBackward0", outputs=1,
    saved="self:tensor target:tensor weight:tensor? total_weight:tensor? reduction:int? ignore_index:int?",
    cost=cost.pointwise(2))
def nll_loss(node, grads, ctx):
    """nll_loss: -weight[target] * grad at the target class, over total_weight for 'mean'."""
    sv = ctx.saved(node)
    x = sv["self"]
    target = sv["target"].astype(np.int64, copy=False)
    reduction = sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]
    cls_axis = 1 if x.ndim >= 2 else 0
    safe_t, w, valid = _nll_scale(xp, target, sv.get("weight"), signed(sv.get("ignore_index", -100)), x.dtype)
    scale = -w * g
    if reduction == MEAN:
        scale = scale / sv["total_weight"]
    scale = keep_where(xp, valid, scale)  # ignored targets skipped, as PyTorch's (not times 0, nor 0 / 0)

    def out(i):
        grad_in = xp.zeros(x.shape, dtype=x.dtype)
        idx = xp.expand_dims(safe_t, cls_axis)
        vals = xp.expand_dims(xp.asarray(scale, dtype=x.dtype) * xp.ones(safe_t.shape, dtype=x.dtype), cls_axis)
        xp.put_along_axis(grad_in, idx, vals, axis=cls_axis)
        return grad_in
    return each(node, out)


def _sigmoid(xp, x):
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


def _softplus(xp, x):
    """log(1 + exp(x)), without overflow."""
    return xp.logaddexp(0, x)


@op("BinaryCrossEntropyWithLogitsBackward0", outputs=2,
    saved="self:tensor target:tensor weight:tensor? pos_weight:tensor? reduction:int?", cost=cost.pointwise(8))
def bce_with_logits(node, grads, ctx):
    """binary_cross_entropy_with_logits(a, t, weight, pos_weight): w ((1 - t + pw t) sigmoid(a) - pw t) to a;
    w (pw softplus(-a) - softplus(a)) to t."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    w, pw = sv.get("weight"), sv.get("pos_weight")
    reduction = sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            if pw is not None:
                pt = pw * t
                d = (pt + 1 - t) * _sigmoid(xp, x) - pt
            else:
                d = _sigmoid(xp, x) - t
        else:
            d = pw * _softplus(xp, -x) - _softplus(xp, x) if pw is not None else -x
        d = d * g
        if w is not None:
            d = d * w
        return _mean(d, reduction, x.size)
    return each(node, out)


@op("BinaryCrossEntropyBackward0", outputs=2, saved="self:tensor target:tensor weight:tensor? reduction:int?",
    cost=cost.pointwise(6))
def bce(node, grads, ctx):
    """binary_cross_entropy(p, t, weight): w (p - t) / max(p (1 - p), 1e-12) to p; -w logit(p) to t."""
    sv = ctx.saved(node)
    x, t, w = sv["self"], sv["target"], sv.get("weight")
    reduction = sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        with np.errstate(divide="ignore", invalid="ignore"):
            if i == 0:
                d = (x - t) / xp.maximum((1 - x) * x, 1e-12)
            else:
                d = -xp.log(x / (1 - x))
        d = d * g
        if w is not None:
            d = d * w
        return _mean(d, reduction, x.size)
    return each(node, out)


def _smooth_l1_slope(xp, d, beta):
    if beta == 0:
        return xp.sign(d)
    return xp.where(d <= -beta, -1.0, xp.where(d >= beta, 1.0, d / beta))


@op("SmoothL1LossBackward0", outputs=2,
    saved="self:tensor target:tensor reduction:int? beta:scalar?", cost=cost.pointwise(4))
def smooth_l1_loss(node, grads, ctx):
    """smooth_l1_loss(a, t, beta): (a - t) / beta inside |a - t| < beta, its sign outside; the negation for t."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    d = _smooth_l1_slope(ctx.xp(node), x - t, num(sv.get("beta", 1.0))) * grads[0]
    d = _mean(d, sv.get("reduction", MEAN), x.size)
    return each(node, lambda i: d if i == 0 else -d)


@op("HuberLossBackward0", outputs=2,
    saved="self:tensor target:tensor reduction:int? delta:scalar?", cost=cost.pointwise(3))
def huber_loss(node, grads, ctx):
    """huber_loss(a, t, delta): a - t clipped to [-delta, delta]; the negation for t."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    delta = num(sv.get("delta", 1.0))
    d = _mean(ctx.xp(node).clip(x - t, -delta, delta) * grads[0], sv.get("reduction", MEAN), x.size)
    return each(node, lambda i: d if i == 0 else -d)


@op("SoftMarginLossBackward0", outputs=1, saved="self:tensor target:tensor reduction:int?", cost=cost.pointwise(5))
def soft_margin_loss(node, grads, ctx):
    """soft_margin_loss(a, t) = log(1 + exp(-t a)): -t sigmoid(-t a) g."""
    sv = ctx.saved(node)
    x, t = sv["self"], sv["target"]
    d = _mean(-t * _sigmoid(ctx.xp(node), -t * x) * grads[0], sv.get("reduction", MEAN), x.size)
    return each(node, lambda i: d)


@op("MultiMarginLossBackward0", outputs=1,
    saved="self:tensor target:tensor p:scalar? margin:scalar? weight:tensor? reduction:int?",
    cost=cost.pointwise(6))
def multi_margin_loss(node, grads, ctx):
    """multi_margin_loss(a, y, p, margin, weight): each class j != y with margin - a_y + a_j > 0 pushes a_j up
    and a_y down (p = 1: by 1, p = 2: by 2 (margin - a_y + a_j)), weighted by weight[y], over the class count."""
    sv = ctx.saved(node)
    x = sv["self"]
    xp = ctx.xp(node)
    p, margin = num(sv.get("p", 1)), num(sv.get("margin", 1.0))
    weight, reduction = sv.get("weight"), sv.get("reduction", MEAN)
    g = grads[0]
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    y = sv["target"].astype(np.int64, copy=False).reshape(-1)
    n, c = x2.shape
    rows = xp.arange(n)
    xy = x2[rows, y][:, None]
    z = margin - xy + x2
    active = z > 0
    active[rows, y] = False
    h = active * (1.0 if p == 1 else 2 * z)
    if weight is not None:
        h = h * weight[y][:, None]
    h = h / c
    if reduction == MEAN:
        h = h / n
    h[rows, y] = -h.sum(axis=1)
    go = g.reshape(-1, 1) if reduction == NONE and g.size == n else g
    return each(node, lambda i: (h * go).reshape(x.shape).astype(x.dtype, copy=False))


# --- double backward --------------------------------------------------------------------------------------------
# Inputs: the gradient of the first backward's grad_input; next edges: grad_output, self, target.


@op("MultilabelMarginLossBackward0", outputs=1, saved="self:tensor target:tensor is_target:tensor reduction:int?",
    cost=cost.pointwise(8))
def multilabel_margin_loss(node, grads, ctx):
    """multilabel_margin_loss(x, y): for each target j (up to the first -1) and non-target i with
    1 - (x[j] - x[i]) > 0, -1/C to x[j] and +1/C to x[i]; times the (reduced) gradient."""
    sv = ctx.saved(node)
    x, y, is_t = sv["self"], sv["target"].astype(np.int64), sv["is_target"]
    xp = ctx.xp(node)
    squeeze = x.ndim < 2
    x2, y2, t2 = (x.reshape(1, -1), y.reshape(1, -1), is_t.reshape(1, -1)) if squeeze else (x, y, is_t)
    n, c = x2.shape
    dx = xp.zeros_like(x2)
    non_target = t2 == 0
    for r in range(n):
        for j in y2[r]:
            if j < 0:
                break
            active = ((1 - (x2[r, j] - x2[r])) > 0) & non_target[r]
            dx[r] += active / c
            dx[r, j] -= active.sum() / c
    reduction = sv.get("reduction", MEAN)
    g = grads[0]
    if reduction == NONE:
        dx = dx * (g.reshape(-1, 1) if not squeeze else g)
    else:
        dx = dx * g / (n if reduction == MEAN else 1)
    dx = dx.reshape(x.shape)
    return each(node, lambda i: dx)


@op("MseLossBackwardBackward0", outputs=3, saved="grad_output:tensor self:tensor target:tensor reduction:int?",
    cost=cost.pointwise(4))
def mse_loss_backward_backward(node, grads, ctx):
    """mse_loss_backward(go, a, t) = 2 (a - t) go: 2 (a - t) g to go (summed), 2 g go to a, -2 g go to t."""
    sv = ctx.saved(node)
    x, t, go = sv["self"], sv["target"], sv["grad_output"]
    reduction = sv.get("reduction", MEAN)
    g = grads[0]

    def out(i):
        if i == 0:
            return _mean(2 * (x - t) * g, reduction, x.size)
        d = _mean(2 * g * go, reduction, x.size)
        return d if i == 1 else -d
    return each(node, out)


@op("SmoothL1LossBackwardBackward0", outputs=3,
    saved="grad_output:tensor self:tensor target:tensor reduction:int? beta:scalar?", cost=cost.pointwise(5))
def smooth_l1_loss_backward_backward(node, grads, ctx):
    """smooth_l1_loss_backward differentiated: the slope times g to go; g go / beta inside |a - t| < beta to a."""
    sv = ctx.saved(node)
    x, t, go = sv["self"], sv["target"], sv["grad_output"]
    beta, reduction = num(sv.get("beta", 1.0)), sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return _mean(_smooth_l1_slope(xp, x - t, beta) * g, reduction, x.size)
        if beta == 0:
            d = xp.zeros_like(g * go)
        else:
            d = _mean(g * go * (xp.abs(x - t) < beta) / beta, reduction, x.size)
        return d if i == 1 else -d
    return each(node, out)


@op("HuberLossBackwardBackward0", outputs=3,
    saved="grad_output:tensor self:tensor target:tensor reduction:int? delta:scalar?", cost=cost.pointwise(4))
def huber_loss_backward_backward(node, grads, ctx):
    """huber_loss_backward differentiated: the clipped difference times g to go; g go inside |a - t| < delta to a."""
    sv = ctx.saved(node)
    x, t, go = sv["self"], sv["target"], sv["grad_output"]
    delta, reduction = num(sv.get("delta", 1.0)), sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]

    def out(i):
        if i == 0:
            return _mean(xp.clip(x - t, -delta, delta) * g, reduction, x.size)
        d = _mean(g * go * (xp.abs(x - t) < delta), reduction, x.size)
        return d if i == 1 else -d
    return each(node, out)


@op("NllLossBackwardBackward0", "NllLoss2DBackwardBackward0", outputs=2,
    saved="target:tensor weight:tensor? reduction:int? ignore_index:int?", cost=cost.pointwise(2))
def nll_loss_backward_backward(node, grads, ctx):
    """nll_loss_backward is linear in go: nll_loss(g, target) to go; zero to the log-probabilities."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    g = grads[0]
    reduction = sv.get("reduction", MEAN)

    def out(i):
        if i == 1:
            return xp.zeros_like(g)
        target = sv["target"].astype(np.int64, copy=False)
        cls_axis = 1 if g.ndim >= 2 else 0
        safe_t, w, valid = _nll_scale(xp, target, sv.get("weight"), signed(sv.get("ignore_index", -100)), g.dtype)
        picked = xp.take_along_axis(g, xp.expand_dims(safe_t, cls_axis), axis=cls_axis).squeeze(cls_axis)
        losses = keep_where(xp, valid, -w * picked)  # ignored targets skipped, as PyTorch's nll_loss
        if reduction == NONE:
            return losses
        if reduction == SUM:
            return losses.sum()
        return losses.sum() / w.sum()
    return each(node, out)


@op("SoftMarginLossBackwardBackward0", outputs=2, saved="grad_output:tensor self:tensor target:tensor reduction:int?",
    cost=cost.pointwise(6))
def soft_margin_loss_backward_backward(node, grads, ctx):
    """soft_margin_loss_backward(go, a, t) = -t sigmoid(-t a) go: its gradients to go and a."""
    sv = ctx.saved(node)
    x, t, go = sv["self"], sv["target"], sv["grad_output"]
    reduction = sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]
    s = _sigmoid(xp, -t * x)

    def out(i):
        if i == 0:
            return _mean(-t * s * g, reduction, x.size)
        return _mean(g * go * t * t * s * (1 - s), reduction, x.size)
    return each(node, out)


@op("BinaryCrossEntropyBackwardBackward0", outputs=3,
    saved="grad_output:tensor self:tensor target:tensor weight:tensor? reduction:int?", cost=cost.pointwise(8))
def bce_backward_backward(node, grads, ctx):
    """binary_cross_entropy_backward(go, p, t) = go w (p - t) / (p (1 - p)): its gradients to go, p and t."""
    sv = ctx.saved(node)
    x, t, go, w = sv["self"], sv["target"], sv["grad_output"], sv.get("weight")
    reduction = sv.get("reduction", MEAN)
    xp = ctx.xp(node)
    g = grads[0]
    eps = 1e-12

    def out(i):
        with np.errstate(divide="ignore", invalid="ignore"):
            if i == 0:
                d = g * (x - t) / xp.maximum((1 - x) * x, eps)
            elif i == 1:
                d = g * go * (x * x - 2 * x * t + t) / ((x + eps) ** 2 * (1 - x + eps) ** 2)
            else:
                d = -g * go / xp.maximum((1 - x) * x, eps)
        if w is not None:
            d = d * w
        return _mean(d, reduction, x.size)
    return each(node, out)


def _exp(x):
    """exp in ``x``'s dtype, correctly rounded: float32 through float64 (as C's expf rounds; numpy's own
    float32 exp may be an ulp away, and an ulp of a log-likelihood of 50 is 4e-6 after the exp)."""
    return np.exp(x.astype(np.float64)).astype(x.dtype) if x.dtype == np.float32 else np.exp(x)


def _log(x):
    """log in ``x``'s dtype, correctly rounded (see ``_exp``)."""
    return np.log(x.astype(np.float64)).astype(x.dtype) if x.dtype == np.float32 else np.log(x)


def _logadd3(a, b, c):
    """log(exp a + exp b + exp c) as PyTorch's CPU kernel writes it: the largest taken out (0 if all are -inf)."""
    m = np.maximum(np.maximum(a, b), c)
    m = np.where(m == -np.inf, np.zeros((), m.dtype), m)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _log(_exp(a - m) + _exp(b - m) + _exp(c - m)) + m


def _ctc_grad_one(lp, labels, t_len, blank, nll, alpha=None):
    """PyTorch's CTC gradient for one sequence: exp(lp) - exp(log(sum of alpha beta over label c) + nll - lp).

    ``lp`` is (T, C) log-probabilities, ``labels`` the target, ``alpha`` the forward's saved log-alpha
    (T, 2L+1; recomputed when None). Computed in ``lp``'s dtype in the order of PyTorch's CPU kernel
    (``ctc_loss_backward_cpu_template``: beta from the last step back, the sum of alpha beta per label
    collected over s from the last to the first), so that float32 rounds as PyTorch's does. The exp(lp)
    term is PyTorch's: its gradient is the one with respect to the logits of a log_softmax, which
    log_softmax's backward leaves unchanged.
    """
    dt = lp.dtype
    big_t, c = lp.shape
    ext = np.full(2 * len(labels) + 1, blank, dtype=np.int64)
    ext[1::2] = labels
    n = ext.size
    skip = np.zeros(n, dtype=bool)  # s may come from s - 2: a label differing from the label before it
    skip[2:] = (ext[2:] != blank) & (ext[2:] != ext[:-2])
    ninf = np.array(-np.inf, dtype=dt)
    if alpha is None:
        alpha = np.full((t_len, n), ninf, dtype=dt)
        if t_len:
            alpha[0, 0] = lp[0, blank]
            if n > 1:
                alpha[0, 1] = lp[0, ext[1]]
        for t in range(1, t_len):
            prev = alpha[t - 1]
            a2 = np.concatenate([[ninf], prev[:-1]]).astype(dt)
            a3 = np.where(skip, np.concatenate([[ninf, ninf], prev[:-2]])[:n], ninf).astype(dt)
            alpha[t] = _logadd3(prev, a2, a3) + lp[t, ext]
    else:
        alpha = np.asarray(alpha, dtype=dt)[:t_len, :n]
    beta = np.full((t_len, n), ninf, dtype=dt)
    lcab = np.full((big_t, c), ninf, dtype=dt)
    if t_len:
        beta[t_len - 1, n - 1] = lp[t_len - 1, blank]
        lcab[t_len - 1, blank] = alpha[t_len - 1, n - 1] + beta[t_len - 1, n - 1]
        if n > 1:
            beta[t_len - 1, n - 2] = lp[t_len - 1, ext[n - 2]]
            lcab[t_len - 1, ext[n - 2]] = alpha[t_len - 1, n - 2] + beta[t_len - 1, n - 2]
    skip_next = np.zeros(n, dtype=bool)  # s + 2 may feed s: the label at s + 2 differs from the one at s
    skip_next[:-2] = ext[2:] != ext[:-2]
    for t in range(t_len - 2, -1, -1):
        nxt = beta[t + 1]
        b2 = np.concatenate([nxt[1:], [ninf]]).astype(dt)
        b3 = np.where(skip_next, np.concatenate([nxt[2:], [ninf, ninf]])[:n], ninf).astype(dt)
        beta[t] = _logadd3(nxt, b2, b3) + lp[t, ext]
    ab = alpha + beta
    with np.errstate(invalid="ignore", divide="ignore"):
        for s in range(n - 1, -1, -1):  # PyTorch's order: s descending, every t < T - 1
            cur, new = lcab[:t_len - 1, ext[s]], ab[:t_len - 1, s]
            m = np.maximum(cur, new)
            lcab[:t_len - 1, ext[s]] = np.where(
                cur == ninf, new, _log(_exp(cur - m) + _exp(new - m)) + m)
    nll = np.asarray(nll, dtype=dt)
    with np.errstate(invalid="ignore"):
        grad = _exp(lp) - _exp(lcab + nll - lp)
    grad[t_len:] = 0
    return grad


@op("CtcLossBackward0", outputs=1,
    saved="log_probs:tensor targets:tensor input_lengths:ints target_lengths:ints result0:tensor? result1:tensor? "
          "blank:int? zero_infinity:bool?",
    cost=cost.CostModel(lambda s: 20.0 * s.out_numel))
def ctc_loss(node, grads, ctx):
    """ctc_loss (per-sequence losses, before the reduction): forward-backward over the blank-extended targets;
    PyTorch's gradient with respect to log_probs (T, N, C) or unbatched (T, C)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    lp = sv["log_probs"]
    to_host = (lambda a: a) if xp is np else (lambda a: a.get())
    lp_h = np.asarray(to_host(lp))
    unbatched = lp_h.ndim == 2
    if unbatched:
        lp_h = lp_h[:, None]
    log_alpha = sv.get("result1")  # the forward's (N, T, 2 max L + 1), or (T, 2L + 1) unbatched
    log_alpha = None if log_alpha is None else np.asarray(to_host(log_alpha))
    if log_alpha is not None and log_alpha.ndim == 2:
        log_alpha = log_alpha[None]
    targets = np.asarray(to_host(sv["targets"])).astype(np.int64)
    in_lens = [int(v) for v in np.asarray(sv["input_lengths"]).reshape(-1)]
    tg_lens = [int(v) for v in np.asarray(sv["target_lengths"]).reshape(-1)]
    blank = int(sv.get("blank", 0))
    nll = sv.get("result0")
    nll = None if nll is None else np.asarray(to_host(nll)).reshape(-1)
    go = np.asarray(to_host(grads[0])).reshape(-1)
    out = np.zeros_like(lp_h)
    offset = 0
    for b in range(lp_h.shape[1]):
        length = tg_lens[b]
        if targets.ndim == 2:  # padded (N, S)
            labels = targets[b, :length]
        else:  # concatenated
            labels = targets[offset:offset + length]
            offset += length
        if nll is None:
            raise RuntimeError(f"{node.name} node {node.id!r} needs saved 'result0' (the losses)")
        loss = nll[b]
        if np.isinf(loss) and sv.get("zero_infinity"):
            continue
        alpha = None if log_alpha is None else log_alpha[b]
        out[:, b] = _ctc_grad_one(lp_h[:, b], labels, in_lens[b], blank, loss, alpha) * go[b if go.size > 1 else 0]
    if unbatched:
        out = out[:, 0]
    res = xp.asarray(out.astype(lp.dtype, copy=False))
    return each(node, lambda i: res)
