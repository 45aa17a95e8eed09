"""Recurrent layers: ``MkldnnRnnLayerBackward0``, one direction of one layer of a float32 ``nn.LSTM`` on the CPU.

PyTorch 2.x runs a float32 (or bfloat16) LSTM on the CPU through oneDNN,
one ``mkldnn_rnn_layer`` call per layer and direction, whose backward node
saves the layer's input ``(T, B, I)`` (time first whatever ``batch_first``:
the module transposes around it), its weights ``weight0..3`` (``w_ih`` (4H,
I), ``w_hh`` (4H, H), ``b_ih``, ``b_hh``), the initial state ``hx_``/``cx_``
(B, H), and its outputs (``result0`` (T, B, H), ``result1`` h_T, ``result2``
c_T; ``result3`` is oneDNN's workspace, bytes no formula here reads). The
node's gradients flow to input, weight0..3, hx_ and cx_ (``derivatives.yaml``'s
``mkldnn_rnn_layer`` entry). ``reverse`` runs the layer from the last time
step to the first (the backward direction of a bidirectional LSTM).

The formula recomputes the gates from the saved input, state and weights
(gate order i, f, g, o, as ``nn.LSTM`` lays out its weights) and runs
backpropagation through time, in float64 for a float32 layer, cast to the
layer's dtype at the end: oneDNN's kernel is not reproducible bit for bit
anyway (its own blocking and fused gate arithmetic), and float64 keeps our
error well under float32's rounding. Packed sequences (``batch_sizes``) and
the other modes never reach this op in PyTorch's CPU build (they take the
native kernels, whose nodes are the ordinary ones): they are refused.
"""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.spec import op

#: ``mode`` values of ``mkldnn_rnn_layer`` (``at::native::rnn``'s enum): only the LSTM reaches it.
LSTM_MODE = 2


def _lstm_flops(s: cost.Shapes) -> float:
    """Per time step the gate products again (forward recompute) and three products back: 8 (B x 4H x (I+H))."""
    x = s.saved.get("input")
    w_hh = s.saved.get("weight1")
    if x is None or w_hh is None or len(x[0]) != 3:
        return cost.pointwise(20).flops(s)
    t, b, i = x[0]
    four_h, h = w_hh[0]
    return float(8 * t * b * four_h * (i + h) + 30 * t * b * four_h)


@op("MkldnnRnnLayerBackward0", outputs=7,
    saved="input:tensor weight0:tensor weight1:tensor weight2:tensor? weight3:tensor? hx_:tensor cx_:tensor "
          "result0:tensor? result1:tensor? result2:tensor? reverse:bool? batch_sizes:ints? mode:int? "
          "hidden_size:int? num_layers:int? has_biases:bool? bidirectional:bool? batch_first:bool? train:bool?",
    cost=cost.CostModel(_lstm_flops))
def mkldnn_rnn_layer(node, grads, ctx):
    """LSTM layer backward through time: gradients of input, w_ih, w_hh, b_ih, b_hh, h0 and c0 from those
    of the output sequence, h_T and c_T (each may be undefined: zero)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    mode = sv.get("mode", LSTM_MODE)
    if mode != LSTM_MODE:
        raise ValueError(f"MkldnnRnnLayerBackward0 with mode {mode}: only the LSTM (mode {LSTM_MODE}) is modelled")
    if sv.get("batch_sizes"):
        raise ValueError("MkldnnRnnLayerBackward0 over a packed sequence (batch_sizes) is not modelled")
    x = sv["input"]
    dtype = x.dtype
    f64 = xp.float64
    x = x.astype(f64)
    w_ih, w_hh = sv["weight0"].astype(f64), sv["weight1"].astype(f64)
    has_bias = sv.get("has_biases", True) and sv.get("weight2") is not None and getattr(sv["weight2"], "size", 0)
    bias = (sv["weight2"].astype(f64) + sv["weight3"].astype(f64)) if has_bias else 0.0
    h = sv["hx_"].astype(f64)
    c = sv["cx_"].astype(f64)
    steps = x.shape[0]
    hidden = w_hh.shape[1]
    order = range(steps - 1, -1, -1) if sv.get("reverse") else range(steps)

    def sigmoid(z):
        return 1.0 / (1.0 + xp.exp(-z))
    tape = []  # per step, in the order run: (t, h_prev, c_prev, i, f, g, o, tanh c)
    for t in order:
        z = x[t] @ w_ih.T + h @ w_hh.T + bias
        i, f = sigmoid(z[:, :hidden]), sigmoid(z[:, hidden:2 * hidden])
        g, o = xp.tanh(z[:, 2 * hidden:3 * hidden]), sigmoid(z[:, 3 * hidden:])
        c_new = f * c + i * g
        tc = xp.tanh(c_new)
        tape.append((t, h, c, i, f, g, o, tc))
        h, c = o * tc, c_new

    def given(k, shape):
        return xp.zeros(shape, dtype=f64) if grads[k] is None else grads[k].astype(f64)
    g_out = given(0, (steps, x.shape[1], hidden))
    dh, dc = given(1, h.shape), given(2, c.shape)
    dx = xp.zeros_like(x)
    dw_ih, dw_hh = xp.zeros_like(w_ih), xp.zeros_like(w_hh)
    db = xp.zeros(w_hh.shape[0], dtype=f64)
    for t, h_prev, c_prev, i, f, g, o, tc in reversed(tape):
        dh = dh + g_out[t]
        dc = dc + dh * o * (1.0 - tc * tc)
        dz = xp.concatenate([dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g * g),
                             dh * tc * o * (1.0 - o)], axis=1)
        dx[t] = dz @ w_ih
        dw_ih += dz.T @ x[t]
        dw_hh += dz.T @ h_prev
        db += dz.sum(axis=0)
        dh, dc = dz @ w_hh, dc * f
    results = [dx, dw_ih, dw_hh, db if has_bias else None, db if has_bias else None, dh, dc]
    return [None if e is None or r is None else r.astype(dtype) for e, r in zip(node.next, results)]
