"""Our executed order and gradients against real PyTorch (multithreading off on both sides).

Order is recorded in PyTorch with ``Node.register_prehook``; ours with the
OrderRecorder. Both are lists of (node name, sequence number).
"""

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests (pip install torch==2.13.0)")

from torch_helpers import capture, our_order, torch_order  # noqa: E402

pytestmark = pytest.mark.torch


def check(outputs, leaves, grad_outputs=None, inputs=None, mode="backward", compare_grads=True):
    doc = capture(outputs, grad_outputs, leaves, inputs=inputs, mode=mode)
    expected = torch_order(outputs, grad_outputs, inputs=inputs, mode=mode)
    got, res, _ = our_order(doc)
    assert got == expected
    if compare_grads:
        if mode == "grad":
            ref = torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
            for name, r in zip(doc["inputs"], ref):
                np.testing.assert_allclose(res.grads[name], r.numpy(), rtol=1e-6, atol=1e-9)
        else:
            for name, leaf in leaves.items():
                if leaf.grad is None:
                    assert res.grads.get(name) is None
                else:
                    np.testing.assert_allclose(res.grads[name], leaf.grad.numpy(), rtol=1e-6, atol=1e-9)
    return got


def test_seed_chapter_graph_runs_c_before_b():
    """
    a --*2--> b --\\
     \\            +--> (b + c).sum()
      --*3--> c --/
    c's MulBackward0 (seq 1) runs before b's (seq 0).
    """
    a = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    b = a * 2
    c = a * 3
    d = (b + c).sum()
    got = check([d], {"a": a})
    names = [n for n, _ in got]
    assert names == ["SumBackward0", "AddBackward0", "MulBackward0", "MulBackward0",
                     "torch::autograd::AccumulateGrad"]
    assert got[2][1] > got[3][1]


def test_mlp_linear_layers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 1)).double()
    x = torch.randn(4, 5, dtype=torch.float64)
    loss = model(x).sum()
    check([loss], dict(model.named_parameters()), compare_grads=False)


def test_mlp_with_rules_matches_gradients():
    """mm + bias + relu layers: every node has a rule, so gradients are compared too."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, dtype=torch.float64, generator=g)
    w1 = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b1 = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    w2 = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    h = torch.relu(x.mm(w1) + b1)
    loss = torch.sigmoid(h.mm(w2)).mean()
    check([loss], {"w1": w1, "b1": b1, "w2": w2})


def test_residual_block():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w1 = torch.randn(4, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w2 = torch.randn(4, 4, dtype=torch.float64, generator=g, requires_grad=True)
    h = torch.relu(x.mm(w1))
    y = h.mm(w2) + x
    z = torch.tanh(y).mm(w1) + y
    check([z.sum()], {"x": x, "w1": w1, "w2": w2})


def test_cat_of_six_leaves():
    """Six AccumulateGrad nodes become ready at once: ties broken as libstdc++'s heap does."""
    leaves = {f"l{i}": torch.randn(2, dtype=torch.float64, requires_grad=True) for i in range(6)}
    out = torch.cat(list(leaves.values())).sum()
    got = check([out], leaves, compare_grads=False)
    assert [n for n, _ in got].count("torch::autograd::AccumulateGrad") == 6


def test_multi_root_backward():
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    c = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y1 = (a * b).sum()
    y2 = torch.exp(a + c)
    g2 = torch.linspace(0.5, 1.5, 3, dtype=torch.float64)
    check([y1, y2], {"a": a, "b": b, "c": c}, grad_outputs=[torch.ones((), dtype=torch.float64), g2])


def random_program(seed: int, n_leaves: int = 30, n_ops: int = 200):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    leaves = {f"v{i}": torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True) for i in range(n_leaves)}
    values = list(leaves.values())
    for _ in range(n_ops):
        k = rng.random()
        a = values[rng.randrange(max(0, len(values) - 24), len(values))]
        b = values[rng.randrange(len(values))]
        if k < 0.3:
            v = a * b
        elif k < 0.6:
            v = a + b
        elif k < 0.75:
            v = torch.relu(a)
        elif k < 0.85:
            v = torch.tanh(a)
        else:
            v = a - b
        values.append(v)
    out = sum((v.sum() for v in values[-6:]), torch.zeros((), dtype=torch.float64))
    return out, leaves


@pytest.mark.parametrize("seed", range(6))
def test_random_dags_with_many_leaves(seed):
    out, leaves = random_program(seed)
    check([out], leaves)


def test_grad_with_inputs_subset_runs_only_the_path():
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = (torch.exp(a) * b + torch.relu(b)).sum()
    got = check([y], {"a": a, "b": b}, inputs=[a], mode="grad")
    assert "ReluBackward0" not in [n for n, _ in got]


def test_backward_with_inputs_accumulates_only_those():
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = (a * b).sum()
    doc = capture([y], leaves={"a": a, "b": b}, inputs=[b])
    expected = torch_order([y], inputs=[b])
    got, res, _ = our_order(doc)
    assert got == expected
    assert res.grads["a"] is None
    np.testing.assert_allclose(res.grads["b"], a.detach().numpy())
