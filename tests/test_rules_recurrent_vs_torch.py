"""``MkldnnRnnLayerBackward0`` (a float32 ``nn.LSTM`` on the CPU, through oneDNN) against PyTorch: the
graph captured from the real module, replayed, its order and every leaf's gradient compared with
``torch.autograd.grad`` (``check_graph``), over layouts, depths, directions, biases and initial states."""

import json
import random

import numpy as np
import pytest

from autograd_run.capture.check import check_graph
from autograd_run.graphs.load import loads_graph
from builders import run_traced

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("batch_first, bidirectional, layers, bias, state, grads_of", [
    (False, False, 1, True, False, "out h c"),
    (True, False, 2, True, True, "out h c"),
    (False, True, 2, True, False, "out h c"),
    (True, True, 1, False, True, "out c"),  # no bias: no b_ih/b_hh edges; h_T's gradient undefined
    (False, False, 3, True, True, "h"),     # only h_T: the output sequence's gradient undefined
])
def test_lstm_layers_replay_as_pytorch_runs_them(batch_first, bidirectional, layers, bias, state, grads_of):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    torch.manual_seed(seed)
    m = torch.nn.LSTM(3, 5, num_layers=layers, batch_first=batch_first, bidirectional=bidirectional, bias=bias)
    steps, batch = 4, 3
    x = torch.randn(*((batch, steps) if batch_first else (steps, batch)), 3, requires_grad=True)
    names = dict(m.named_parameters())
    names["x"] = x
    args = [x]
    if state:
        d = 2 if bidirectional else 1
        h0 = torch.randn(layers * d, batch, 5, requires_grad=True)
        c0 = torch.randn(layers * d, batch, 5, requires_grad=True)
        names.update(h0=h0, c0=c0)
        args.append((h0, c0))
    out, (h, c) = m(*args)
    parts = {"out": out, "h": h, "c": c}
    loss = sum((t * torch.randn_like(t)).sum() for k, t in parts.items() if k in grads_of.split())
    doc = from_torch_checked(loss, names)
    assert any(n["name"] == "MkldnnRnnLayerBackward0" for n in doc["nodes"])
    graph = loads_graph(json.dumps(doc), "lstm.json")
    report = check_graph(graph)
    assert report.ok, [(g.name, g.max_rel, g.note) for g in report.grads if not g.ok]
    want = torch.autograd.grad(loss, list(names.values()))
    got = run_traced(graph, None).grads
    for name, w in zip(names, want):  # and by hand: float32's rounding, oneDNN's own kernel on the other side
        np.testing.assert_allclose(np.asarray(got[name]), w.numpy(), rtol=1e-4, atol=1e-5 * float(w.abs().max()))


def from_torch_checked(loss, names) -> dict:
    from autograd_run.capture import from_torch
    doc = from_torch(loss, names=names)
    opaque = [n["name"] for n in doc["nodes"] if n.get("op") == "opaque"]
    assert not opaque, opaque
    return doc


def test_the_simulation_costs_the_layer_from_its_shapes():
    """The cost model reads the saved input's and w_hh's shapes: 8 (T B 4H (I + H)) FLOPs of products."""
    from autograd_run.ops import REGISTRY
    from autograd_run.ops.cost import Shapes
    spec = REGISTRY["MkldnnRnnLayerBackward0"]
    s = Shapes(inputs=[((4, 3, 5), "float32")], outputs=[((4, 3, 3), "float32")] + [None] * 6,
               saved={"input": ((4, 3, 3), "float32"), "weight1": ((20, 5), "float32")})
    assert spec.cost.flops(s) == 8 * 4 * 3 * 20 * (3 + 5) + 30 * 4 * 3 * 20
