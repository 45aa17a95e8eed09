"""Every backward rule against PyTorch's own gradient, in float64, to 1e-6.

Each case builds a small forward program in PyTorch, captures its backward
graph (names, sequence numbers, edges, metadata, saved tensors), replays it
here and compares every leaf gradient and the executed order.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from torch_helpers import capture, our_order, torch_order  # noqa: E402

pytestmark = pytest.mark.torch


def leaf(*shape, positive=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = torch.randn(*shape, dtype=torch.float64, generator=g)
    if positive:
        t = t.abs() + 0.5
    return t.requires_grad_(True)


def weigh(y, seed=99):
    """A non-uniform downstream gradient: (y * w).sum() with a fixed random w."""
    g = torch.Generator().manual_seed(seed)
    return (y * torch.randn(y.shape, dtype=torch.float64, generator=g)).sum()


CASES = {
    "add_broadcast": lambda L: torch.add(L["a"], L["b"], alpha=2.0),
    "sub": lambda L: torch.sub(L["a"], L["b"], alpha=0.5),
    "mul": lambda L: L["a"] * L["b"],
    "div": lambda L: L["a"] / L["p"],
    "neg": lambda L: -L["a"],
    "pow": lambda L: L["p"] ** 3,
    "mm": lambda L: L["m"].mm(L["n"]),
    "addmm": lambda L: torch.addmm(L["b4"], L["m"], L["n"], beta=0.5, alpha=2.0),
    "bmm": lambda L: torch.bmm(L["x"], L["y"]),
    "t": lambda L: L["m"].t(),
    "transpose": lambda L: L["x"].transpose(0, 2),
    "permute": lambda L: L["x"].permute(2, 0, 1),
    "view": lambda L: L["x"].view(6, 4),
    "reshape_alias": lambda L: L["x"].transpose(0, 1).reshape(12, 2),
    "flatten": lambda L: L["x"].flatten(),
    "expand": lambda L: L["b"].expand(4, 3, 4),
    "sum": lambda L: L["x"].sum().reshape(1) * L["b"][0],
    "sum_dim": lambda L: L["x"].sum(dim=(0, 2)),
    "sum_dim_keepdim": lambda L: L["x"].sum(dim=1, keepdim=True),
    "mean": lambda L: L["x"].mean().reshape(1) * L["b"][:1],
    "mean_dim": lambda L: L["x"].mean(dim=-1),
    "relu": lambda L: torch.relu(L["a"]),
    "gelu": lambda L: F.gelu(L["a"]),
    "gelu_tanh": lambda L: F.gelu(L["a"], approximate="tanh"),
    "tanh": lambda L: torch.tanh(L["a"]),
    "sigmoid": lambda L: torch.sigmoid(L["a"]),
    "exp": lambda L: torch.exp(L["a"]),
    "log": lambda L: torch.log(L["p"]),
    "softmax": lambda L: torch.softmax(L["x"], dim=-1),
    "log_softmax": lambda L: torch.log_softmax(L["x"], dim=1),
    "layer_norm": lambda L: F.layer_norm(L["x"], (4,), L["w4"], L["b4"]),
    "layer_norm_2d_no_affine": lambda L: F.layer_norm(L["x"], (3, 4)),
    "cat": lambda L: torch.cat([L["x"], L["x"] * 2, L["z"]], 1),
    "stack": lambda L: torch.stack([L["a"], L["a"] * 3], 1),
    "select": lambda L: L["x"][:, 1],
    "slice": lambda L: L["x"][:, 1:3],
    "slice_step": lambda L: L["x"][..., ::2],
    "embedding": lambda L: F.embedding(torch.tensor([[0, 2], [1, 2]]), L["e"]),
    "embedding_padding": lambda L: F.embedding(torch.tensor([0, 2, 1, 2]), L["e"], padding_idx=2),
    "clone": lambda L: L["a"].clone(),
    "conv2d": lambda L: F.conv2d(L["img"], L["cw"], L["cb"], stride=2, padding=1),
    "conv2d_groups_dilation": lambda L: F.conv2d(L["img"], L["cwg"], None, padding=2, dilation=2, groups=2),
    "conv1d": lambda L: F.conv1d(L["img"][:, :, 0], L["cw"][:, :, 0], L["cb"], stride=1, padding=1),
    "conv3d": lambda L: F.conv3d(L["img"][:, :2, None].expand(2, 2, 3, 7, 7), L["cw"][:, :2, None].expand(3, 2, 2, 3, 3)),
    "max_pool2d": lambda L: F.max_pool2d(L["img"], 2),
    "max_pool2d_overlap": lambda L: F.max_pool2d(L["img"], 3, stride=2, padding=1),
    "max_pool1d": lambda L: F.max_pool1d(L["img"][:, :, 0], 2),
    "avg_pool2d": lambda L: F.avg_pool2d(L["img"], 2),
    "avg_pool2d_pad_exclude": lambda L: F.avg_pool2d(L["img"], 3, stride=2, padding=1, count_include_pad=False),
    "avg_pool2d_pad_include": lambda L: F.avg_pool2d(L["img"], 3, stride=2, padding=1),
    "batch_norm_train": lambda L: F.batch_norm(L["img"], torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64),
                                               L["bnw"], L["bnb"], training=True),
    "batch_norm_eval": lambda L: F.batch_norm(L["img"], torch.full((4,), 0.1, dtype=torch.float64),
                                              torch.full((4,), 2.0, dtype=torch.float64), L["bnw"], L["bnb"], training=False),
    "sqrt": lambda L: torch.sqrt(L["p"]),
    "rsqrt": lambda L: torch.rsqrt(L["p"]),
    "rsub": lambda L: 1 - L["a"],
    "abs": lambda L: L["a"].abs(),
    "silu": lambda L: F.silu(L["a"]),
    "leaky_relu": lambda L: F.leaky_relu(L["a"], 0.2),
    "clamp": lambda L: L["a"].clamp(-0.5, 0.7),
    "clamp_min": lambda L: L["a"].clamp(min=0.1),
    "sin_cos": lambda L: L["a"].sin() + L["x"].cos().sum(),
    "where": lambda L: torch.where(L["a"] > 0, L["a"], L["p"] * 2),
    "unsqueeze_squeeze": lambda L: L["x"].unsqueeze(1).squeeze(1).unsqueeze(-1).squeeze(),
    "squeeze_dim": lambda L: L["x"][:1].squeeze(0),
    "max_min": lambda L: L["x"].max() - L["x"].min(),
    "amax_amin": lambda L: L["x"].amax(dim=1).sum() * L["x"].amin(dim=(0, 2), keepdim=True),
    "mse_mean": lambda L: F.mse_loss(L["x"], L["z"][:, :1].expand(2, 3, 4).detach() * 0 + 0.5),
    "mse_sum": lambda L: F.mse_loss(L["x"], torch.full((2, 3, 4), 0.3, dtype=torch.float64), reduction="sum"),
    "cross_entropy": lambda L: F.cross_entropy(L["m"], torch.tensor([0, 2, 1, 0, 1])),
    "nll_weighted_ignore": lambda L: F.nll_loss(torch.log_softmax(L["m"], 1), torch.tensor([0, 2, -100, 0, 1]),
                                                weight=torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)),
    "nll_none_2d": lambda L: F.nll_loss(torch.log_softmax(L["x"], 1), torch.tensor([[0, 2, 1, 1], [2, 2, 0, 1]]),
                                        reduction="none"),
    "split_unused_piece": lambda L: L["x"].split(3, dim=-1)[0] * 2,
    "split_with_sizes": lambda L: torch.cat([p * (k + 1) for k, p in enumerate(L["x"].split([1, 3], dim=-1))], -1),
    "chunk": lambda L: sum(c.exp() for c in L["x"].chunk(2, dim=1)),
    "unbind": lambda L: L["x"].unbind(1)[2] - L["x"].unbind(1)[0],
    "to_copy": lambda L: (L["a"].float() * 2).double(),
    "linear": lambda L: F.linear(L["x"], L["w44"], L["b4"]),
}


def leaves():
    return {"a": leaf(4, 3, 4), "b": leaf(3, 4, seed=1), "p": leaf(4, 3, 4, positive=True, seed=2),
            "m": leaf(5, 3, seed=3), "n": leaf(3, 4, seed=4), "x": leaf(2, 3, 4, seed=5), "y": leaf(2, 4, 5, seed=6),
            "z": leaf(2, 2, 4, seed=7), "w4": leaf(4, seed=8), "b4": leaf(4, seed=9), "e": leaf(3, 5, seed=10),
            "w44": leaf(4, 4, seed=11), "img": leaf(2, 4, 7, 7, seed=12), "cw": leaf(3, 4, 3, 3, seed=13),
            "cb": leaf(3, seed=14), "cwg": leaf(4, 2, 3, 3, seed=15), "bnw": leaf(4, seed=16), "bnb": leaf(4, seed=17)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_pytorch(case):
    L = leaves()
    out = weigh(CASES[case](L))
    doc = capture([out], leaves=L)
    names = {n["name"] for n in doc["nodes"]}
    assert all("op" not in n for n in doc["nodes"]), f"a node has no rule: {names}"
    expected_order = torch_order([out])  # runs PyTorch's backward once (leaves get .grad)
    got_order, res, _ = our_order(doc)
    assert got_order == expected_order
    for name, t in L.items():
        if t.grad is None:
            assert res.grads.get(name) is None, name
        else:
            assert res.grads[name].dtype == np.float64
            np.testing.assert_allclose(res.grads[name], t.grad.numpy(), rtol=1e-6, atol=1e-9, err_msg=name)
