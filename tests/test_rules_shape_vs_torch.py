"""Rules for shape, indexing, reduction, attention and product ops against PyTorch, in float64 (and complex128).

Each case builds a small forward in PyTorch, captures its backward graph to
a file (saved tensors in the ``.npz`` side file, as a real capture does),
replays it here and compares the executed order and every leaf gradient
with PyTorch's, to 1e-6.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from autograd_run.ops import lookup  # noqa: E402
from test_rules_vs_torch import leaf, weigh  # noqa: E402
from torch_helpers import torch_order  # noqa: E402

pytestmark = pytest.mark.torch

D = torch.float64
C = torch.complex128


def cleaf(*shape, seed=0):
    """A complex128 leaf."""
    g = torch.Generator().manual_seed(seed + 7 * sum(shape))
    return torch.randn(*shape, dtype=C, generator=g).requires_grad_(True)


def idx(*values):
    return torch.tensor(values, dtype=torch.long)


def replay(tmp_path, outputs, leaves, grad_outputs=None):
    """Capture ``outputs`` to a file, replay it; (our order, PyTorch's order, our leaf gradients)."""
    from autograd_run.capture import from_torch
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.record.order_recorder import OrderRecorder
    path = str(tmp_path / "g.json")
    doc = from_torch(outputs, grad_outputs=grad_outputs, names=leaves, path=path, reference=False)
    opaque = [n["name"] for n in doc["nodes"] if "op" in n]
    assert not opaque, f"nodes without a rule: {opaque}"
    expected = torch_order(outputs, grad_outputs)
    g = load_graph(path)
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=False)
    try:
        res = run_graph(eng, g, retain_graph=True)
    finally:
        eng.shutdown()
    got = [(r.name, r.seq) for r in rec.executed()]
    return got, expected, res.grads, doc


def check(tmp_path, build, leaves, complex_out=False, names=None):
    """Run ``build(leaves)``, backward through a fixed random weighting, compare with PyTorch."""
    y = build(leaves)
    ys = list(y) if isinstance(y, (tuple, list)) else [y]
    if complex_out:
        gen = torch.Generator().manual_seed(5)
        gos = [torch.randn(t.shape, dtype=t.dtype, generator=gen) for t in ys]
        outs = ys
    else:
        outs, gos = [sum(weigh(t, seed=99 + k) for k, t in enumerate(ys))], None
    for t in leaves.values():
        t.grad = None
    got, expected, grads, doc = replay(tmp_path, outs, leaves, gos)
    if names is not None:
        present = {n["name"] for n in doc["nodes"]}
        assert set(names) <= present, f"expected {names} in {sorted(present)}"
    assert got == expected
    for name, t in leaves.items():
        if t.grad is None:
            assert grads.get(name) is None, name
            continue
        ours = grads[name]
        assert ours is not None, name
        assert ours.dtype == t.grad.numpy().dtype, name
        np.testing.assert_allclose(ours, t.grad.numpy(), rtol=1e-6, atol=1e-9, err_msg=name)


def cases(table):
    return pytest.mark.parametrize("case", sorted(table))


# --- shape --------------------------------------------------------------------------------------------------------

def shape_leaves():
    return {"x": leaf(2, 3, 4, seed=1), "m": leaf(4, 5, seed=2), "img": leaf(2, 8, 3, 5, seed=3),
            "sq": leaf(3, 1, 4, seed=4), "v": leaf(6, seed=5), "e": leaf(2, 4, seed=6)}


SHAPE = {
    # name: (build, node names that must appear)
    "unsafe_split": (lambda L: [p * (k + 1) for k, p in enumerate(L["x"].unsafe_split(2, dim=-1))],
                     ["UnsafeSplitBackward0"]),
    "unsafe_split_unused": (lambda L: L["x"].unsafe_split(2, dim=1)[1].exp(), ["UnsafeSplitBackward0"]),
    "unsafe_split_with_sizes": (lambda L: L["x"].unsafe_split_with_sizes([1, 3], dim=2)[1],
                                ["UnsafeSplitWithSizesBackward0"]),
    "lstm": (lambda L: torch.nn.LSTM(4, 5, num_layers=2).double()(L["x"])[0], ["UnsafeSplitBackward0"]),
    "gru": (lambda L: torch.nn.GRU(4, 3, batch_first=True).double()(L["x"])[0], ["UnsafeSplitBackward0"]),
    "transpose_": (lambda L: L["x"].clone().transpose_(0, -1), ["TransposeBackward1"]),
    "t_": (lambda L: L["m"].clone().t_(), ["TBackward1"]),
    "squeeze_": (lambda L: L["sq"].clone().squeeze_(), ["SqueezeBackward3"]),
    "squeeze_dim_": (lambda L: L["sq"].clone().squeeze_(-2), ["SqueezeBackward4"]),
    "squeeze_dims_": (lambda L: L["sq"].clone().squeeze_((1,)), ["SqueezeBackward5"]),
    "unsqueeze_": (lambda L: L["x"].clone().unsqueeze_(-1), ["UnsqueezeBackward1"]),
    "pad": (lambda L: F.pad(L["x"], (1, 2, 0, 1), value=0.5), ["ConstantPadNdBackward0"]),
    "pad_negative": (lambda L: F.pad(L["x"], (-1, 2, 1, -2)), ["ConstantPadNdBackward0"]),
    "pad_3dims": (lambda L: F.pad(L["x"], (1, 0, 0, 0, 2, 1)), ["ConstantPadNdBackward0"]),
    "repeat": (lambda L: L["x"].repeat(2, 1, 1, 3), ["RepeatBackward0"]),
    "repeat_same_rank": (lambda L: L["m"].repeat(3, 2), ["RepeatBackward0"]),
    "flip": (lambda L: L["x"].flip(0, -1), ["FlipBackward0"]),
    "fliplr": (lambda L: L["m"].fliplr(), ["FlipBackward0"]),
    "roll": (lambda L: L["x"].roll((1, -2), (0, 2)), ["RollBackward0"]),
    "roll_flat": (lambda L: L["x"].roll(5), ["RollBackward0"]),
    "roll_neg_dim": (lambda L: L["x"].roll(-1, -2), ["RollBackward0"]),
    "rot90": (lambda L: L["x"].rot90(1, (1, 2)), ["Rot90Backward0"]),
    "rot90_k3_neg": (lambda L: L["x"].rot90(-3, (-1, 0)), ["Rot90Backward0"]),
    "channel_shuffle": (lambda L: F.channel_shuffle(L["img"], 4), ["ChannelShuffleBackward0"]),
    "diagonal": (lambda L: L["x"].diagonal(1, 1, 2), ["DiagonalBackward0"]),
    "diagonal_neg": (lambda L: L["x"].diagonal(-1, -1, 0), ["DiagonalBackward0"]),
    "diag_matrix": (lambda L: torch.diag(L["m"], 1), ["DiagonalBackward0_copy"]),
    "diag_embed": (lambda L: torch.diag_embed(L["e"], offset=-1, dim1=0, dim2=2), ["DiagEmbedBackward0"]),
    "diag_vector": (lambda L: torch.diag(L["v"]), ["DiagEmbedBackward0"]),
    "tril_triu": (lambda L: L["m"].tril(-1) + L["m"].triu(2), ["TrilBackward0", "TriuBackward0"]),
    "tril_batched": (lambda L: L["x"].tril(1), ["TrilBackward0"]),
    "unfold": (lambda L: L["x"].unfold(2, 2, 1), ["UnfoldBackward0"]),
    "unfold_step": (lambda L: L["img"].unfold(-1, 2, 2), ["UnfoldBackward0"]),
    "unfold_gap": (lambda L: L["v"].unfold(0, 1, 3), ["UnfoldBackward0"]),
    "narrow_copy": (lambda L: L["x"].narrow_copy(1, 1, 2), ["NarrowCopyBackward0"]),
    "narrow_copy_neg": (lambda L: L["x"].narrow_copy(-1, -3, 2), ["NarrowCopyBackward0"]),
    "slice_scatter": (lambda L: torch.slice_scatter(L["x"], L["x"][..., :2].exp(), 2, 1, 4, 2),
                      ["SliceScatterBackward0"]),
    "select_scatter": (lambda L: torch.select_scatter(L["x"], L["e"], -2, 0), ["SelectScatterBackward0"]),
    "diagonal_scatter": (lambda L: torch.diagonal_scatter(L["m"], L["v"][:3], -1), ["DiagonalScatterBackward0"]),
    "alias": (lambda L: torch.ops.aten.alias(L["x"]), ["AliasBackward0"]),
    "as_strided": (lambda L: L["x"].as_strided((3, 2), (1, 3), 2), ["AsStridedBackward0"]),
    "as_strided_overlap": (lambda L: L["v"].as_strided((4, 3), (1, 1)), ["AsStridedBackward0"]),
    "as_strided_": (lambda L: L["x"].clone().as_strided_((2, 5), (4, 2), 1), ["AsStridedBackward1"]),
    "cat_constant_middle": (lambda L: torch.cat([L["x"], torch.ones(2, 2, 4, dtype=D), L["x"] * 2], 1),
                            ["CatBackward0"]),
    "cat_constant_first": (lambda L: torch.cat([torch.zeros(2, 3, 1, dtype=D), L["x"]], -1), ["CatBackward0"]),
    "cat_constants_last": (lambda L: torch.cat([L["x"], torch.zeros(1, 3, 4, dtype=D), torch.ones(3, 3, 4, dtype=D)]),
                           ["CatBackward0"]),
    "unet_skip": (lambda L: torch.cat([F.conv2d(L["img"], torch.ones(2, 8, 1, 1, dtype=D)),
                                       torch.ones(2, 1, 3, 5, dtype=D)], 1).relu(), ["CatBackward0"]),
    "fill": (lambda L: torch.cat([torch.fill(L["x"], 3.0), (L["x"] * 2).fill_(1.0), L["x"]]),
             ["FillBackward0", "FillBackward2"]),
    "fill_tensor": (lambda L: torch.cat([torch.fill(L["x"], L["v"][1] * 2), (L["x"] * 2).fill_(L["v"][0]), L["x"]]),
                    ["FillBackward1", "FillBackward3"]),
    "zero_": (lambda L: (L["x"] * 2).zero_() + L["x"], ["ZeroBackward0"]),
    "copy_": (lambda L: torch.zeros(2, 3, 4, dtype=D).copy_(L["x"] * 2), ["torch::autograd::CopyBackwards"]),
    "copy_broadcast": (lambda L: (L["x"] * 2).copy_(L["m"][:3, :4]), ["torch::autograd::CopyBackwards"]),
    "copy_from_complex": (lambda L: (L["x"] * 1).copy_(L["x"].to(C) * (1 - 2j)), ["torch::autograd::CopyBackwards"]),
    "block_diag": (lambda L: torch.block_diag(L["m"], L["v"], torch.ones(2, 3, dtype=D), L["e"][0, 0]),
                   ["BlockDiagBackward0"]),
    "block_diag_constant_last": (lambda L: torch.block_diag(L["e"], torch.ones(1, 2, dtype=D),
                                                            torch.ones(3, 3, dtype=D)), ["BlockDiagBackward0"]),
    "pack_padded": (lambda L: torch.nn.utils.rnn.pack_padded_sequence(L["x"].transpose(0, 1), [3, 1]).data,
                    ["PackPaddedSequenceBackward0"]),
    "pack_padded_batch_first_unsorted": (
        lambda L: torch.nn.utils.rnn.pack_padded_sequence(L["x"], [1, 3], batch_first=True, enforce_sorted=False).data,
        ["PackPaddedSequenceBackward0"]),
    "lstm_packed": (lambda L: torch.nn.LSTM(4, 3, batch_first=True).double()(
        torch.nn.utils.rnn.pack_padded_sequence(L["x"], [3, 2], batch_first=True))[0].data,
        ["PackPaddedSequenceBackward0"]),
}


@cases(SHAPE)
@pytest.mark.filterwarnings("ignore:Casting complex values to real")
def test_shape_rule(case, tmp_path):
    build, names = SHAPE[case]
    torch.manual_seed(0)
    check(tmp_path, build, shape_leaves(), names=names)


COMPLEX_SHAPE = {
    "flip": lambda L: L["z"].flip(-1),
    "roll": lambda L: L["z"].roll(1, 0),
    "repeat": lambda L: L["z"].repeat(2, 1),
    "pad": lambda L: F.pad(L["z"], (1, 1)),
    "diagonal": lambda L: L["z"].diagonal(),
    "tril": lambda L: L["z"].tril(),
    "unfold": lambda L: L["z"].unfold(1, 2, 1),
}


@cases(COMPLEX_SHAPE)
def test_shape_rule_complex(case, tmp_path):
    check(tmp_path, COMPLEX_SHAPE[case], {"z": cleaf(3, 4)}, complex_out=True)


# --- indexing -----------------------------------------------------------------------------------------------------

def index_leaves():
    return {"x": leaf(2, 3, 4, seed=11), "s": leaf(2, 2, 4, seed=12), "m": leaf(5, 3, seed=13), "v": leaf(6, seed=14),
            "r": leaf(2, 4, seed=15), "c": torch.tensor(0.7, dtype=D, requires_grad=True),
            "ties": torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, -1.0, 2.0]], dtype=D).requires_grad_(True),
            "zs": torch.tensor([[0.0, 3.0, 2.0, 0.0], [1.5, 0.0, -1.0, 2.0]], dtype=D).requires_grad_(True)}


GI = idx(0, 2, 1, 2, 0, 0, 1, 2).reshape(2, 1, 4).expand(2, 2, 4).contiguous()
SI = torch.tensor([[[0, 2, 1, 2], [0, 0, 1, 2]], [[1, 1, 1, 0], [2, 0, 2, 1]]])
MASK = torch.tensor([[True, False, True, False], [False, False, True, True], [True, True, False, True]])


def _index_put(L, accumulate):
    y = L["x"] * 1
    value = L["m"][:3, :1] if accumulate else L["x"][0] * 2  # broadcast, or the indexed result's shape
    return y.index_put((idx(1, 0, 1), idx(2, 2, 0)), value, accumulate=accumulate)


def _setitem(y, where, value):
    y[where] = value
    return y


INDEXING = {
    "gather": (lambda L: L["x"].gather(1, GI), ["GatherBackward0"]),
    "gather_neg_dim": (lambda L: L["x"].gather(-1, idx(3, 0, 0).reshape(1, 1, 3).expand(2, 2, 3)), ["GatherBackward0"]),
    "take_along_dim": (lambda L: torch.take_along_dim(L["x"], idx(2, 0).reshape(1, 2, 1), 1), ["GatherBackward0"]),
    "scatter_add": (lambda L: L["x"].scatter_add(1, SI, L["s"]), ["ScatterAddBackward0"]),
    "scatter_add_neg_dim": (lambda L: L["x"].scatter_add(-2, SI, L["s"] * 3), ["ScatterAddBackward0"]),
    "scatter_src": (lambda L: L["x"].scatter(1, idx(0, 2, 1, 0, 1, 2, 2, 1).reshape(2, 1, 4), L["s"][:, :1]),
                    ["ScatterBackward0"]),
    "scatter_value": (lambda L: L["x"].scatter(2, SI[:, :, :2], 1.5), ["ScatterBackward1"]),
    "scatter_reduce_sum": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "sum"), ["ScatterReduceBackward0"]),
    "scatter_reduce_mean": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "mean"), ["ScatterReduceBackward0"]),
    "scatter_reduce_mean_excl": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "mean", include_self=False),
                                 ["ScatterReduceBackward0"]),
    "scatter_reduce_amax": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "amax"), ["ScatterReduceBackward0"]),
    "scatter_reduce_amin_excl": (lambda L: L["x"].scatter_reduce(-2, SI, L["s"] + 0.5, "amin", include_self=False),
                                 ["ScatterReduceBackward0"]),
    # x[0, 0, 0] == s[0, 0, 0]: PyTorch counts self's tie although self is excluded.
    "scatter_reduce_amin_excl_self_tie": (lambda L: L["x"].scatter_reduce(-2, SI, L["x"][:, :2] * 1, "amin",
                                                                          include_self=False),
                                          ["ScatterReduceBackward0"]),
    "scatter_reduce_amax_ties": (lambda L: L["ties"].scatter_reduce(0, idx(0, 0, 1, 0, 1, 1, 0, 0).reshape(2, 4),
                                                                   L["ties"] * 1, "amax"), ["ScatterReduceBackward0"]),
    "scatter_reduce_prod": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "prod"), ["ScatterReduceBackward0"]),
    "scatter_reduce_prod_zeros": (lambda L: L["zs"].scatter_reduce(0, idx(0, 0, 1, 0, 1, 1, 0, 0).reshape(2, 4),
                                                                   L["zs"] * 1, "prod"), ["ScatterReduceBackward0"]),
    "scatter_reduce_prod_excl": (lambda L: L["x"].scatter_reduce(1, SI, L["s"], "prod", include_self=False),
                                 ["ScatterReduceBackward0"]),
    "index_select": (lambda L: L["x"].index_select(-1, idx(0, 0, 3)), ["IndexSelectBackward0"]),
    "index_select_dim0": (lambda L: L["m"].index_select(0, idx(4, 1, 1, 0)), ["IndexSelectBackward0"]),
    "repeat_interleave_tensor": (lambda L: L["x"].repeat_interleave(idx(1, 2, 0), dim=1), ["IndexSelectBackward0"]),
    "index_int": (lambda L: L["x"][idx(1, 0, 1)], ["IndexBackward0"]),
    "index_two_tensors": (lambda L: L["x"][idx(1, 0), :, idx(0, 3)], ["IndexBackward0"]),
    "index_adjacent": (lambda L: L["x"][:, idx(2, 2, 0), idx(1, 3, 3)], ["IndexBackward0"]),
    "index_broadcast": (lambda L: L["x"][idx(0, 1).reshape(2, 1), idx(2, 0, 1).reshape(1, 3)], ["IndexBackward0"]),
    "index_negative": (lambda L: L["m"][idx(-1, 0, -1)], ["IndexBackward0"]),
    "index_mask": (lambda L: L["x"][L["x"] > 0], ["IndexBackward0"]),
    "index_mask_2d": (lambda L: L["x"][:, MASK], ["IndexBackward0"]),
    "index_put": (lambda L: _index_put(L, False), ["IndexPutBackward0"]),
    "index_put_accumulate": (lambda L: _index_put(L, True), ["IndexPutBackward0"]),
    "setitem_tensor": (lambda L: L["m"].clone().index_put_((idx(0, 3),), L["r"][:, :3]), ["IndexPutBackward0"]),
    "setitem_mask_scalar": (lambda L: _setitem(L["x"] * 1, L["x"] > 0.5, 0.0), ["IndexPutBackward0"]),
    "setitem_broadcast": (lambda L: _setitem(L["m"] * 1, idx(0, 2), L["r"][0, :3]), ["IndexPutBackward0"]),
    "setitem_slice_and_tensors": (lambda L: _setitem(L["x"] * 1, (idx(1, 0, 1), slice(None), idx(3, 3, 0)),
                                                     L["m"][:3]), ["IndexPutBackward0"]),
    "masked_fill": (lambda L: L["x"].masked_fill(L["x"] > 0.3, -1.0), ["MaskedFillBackward0"]),
    "masked_fill_broadcast_mask": (lambda L: L["x"].masked_fill(MASK[0], 0.0), ["MaskedFillBackward0"]),
    "masked_fill_tensor": (lambda L: L["x"].masked_fill(MASK, L["c"] * 2), ["MaskedFillBackward1"]),
    "masked_scatter": (lambda L: L["x"].masked_scatter(MASK, L["v"].repeat(3)), ["MaskedScatterBackward0"]),
    "masked_select": (lambda L: L["x"].masked_select(MASK), ["MaskedSelectBackward0"]),
    "masked_select_broadcast": (lambda L: L["r"][0].masked_select(MASK), ["MaskedSelectBackward0"]),
    "index_add": (lambda L: L["x"].index_add(1, idx(0, 2), L["s"], alpha=2.5), ["IndexAddBackward0"]),
    "index_add_repeat": (lambda L: L["m"].index_add(0, idx(1, 1, 4), L["m"][:3] * 2), ["IndexAddBackward0"]),
    "index_copy": (lambda L: L["x"].index_copy(-1, idx(3, 1), L["x"][..., :2].exp()), ["IndexCopyBackward0"]),
    "index_fill": (lambda L: L["x"].index_fill(1, idx(0, 2), 3.0), ["IndexFillBackward0"]),
    "index_fill_tensor": (lambda L: L["x"].index_fill(-1, idx(1, 3, 1), L["c"] * 3), ["IndexFillBackward1"]),
    "take": (lambda L: L["x"].take(idx(0, 5, 5, -1, 23)), ["TakeBackward0"]),
}


@cases(INDEXING)
def test_indexing_rule(case, tmp_path):
    build, names = INDEXING[case]
    check(tmp_path, build, index_leaves(), names=names)


COMPLEX_INDEXING = {
    "gather": lambda L: L["z"].gather(1, idx(0, 2, 2, 1).reshape(2, 2)),
    "index": lambda L: L["z"][idx(2, 0, 2)],
    "index_put": lambda L: (L["z"] * 1).index_put((idx(0, 1),), L["w"]),
    "masked_fill": lambda L: L["z"].masked_fill(MASK[:, :4], 0),
    "index_select": lambda L: L["z"].index_select(0, idx(1, 1)),
    "scatter_add": lambda L: L["z"].scatter_add(0, idx(0, 2, 1, 0).reshape(1, 4), L["w"][:1]),
}


@cases(COMPLEX_INDEXING)
def test_indexing_rule_complex(case, tmp_path):
    check(tmp_path, COMPLEX_INDEXING[case], {"z": cleaf(3, 4), "w": cleaf(2, 4, seed=3)}, complex_out=True)


# --- reductions ---------------------------------------------------------------------------------------------------

def reduction_leaves():
    return {"x": leaf(2, 3, 4, seed=21), "m": leaf(5, 3, seed=22),
            "p": leaf(2, 3, 4, positive=True, seed=23),
            "zeros": torch.tensor([[0.0, 2.0, -1.5, 0.5, 3.0], [1.5, -2.0, 0.0, 0.0, 2.0],
                                   [0.5, 0.25, -3.0, 1.0, 0.0], [2.0, 1.0, 0.5, -1.0, 1.5]],
                                  dtype=D).requires_grad_(True),
            "ties": torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, -1.0, 2.0], [0.0, 0.0, 0.0, 0.0]],
                                 dtype=D).requires_grad_(True),
            "nan": torch.tensor([[1.0, float("nan"), 3.0], [2.0, 0.5, float("nan")]], dtype=D).requires_grad_(True)}


REDUCTIONS = {
    "max_dim": (lambda L: L["x"].max(dim=1)[0], ["MaxBackward0"]),
    "max_dim_keepdim_neg": (lambda L: L["x"].max(dim=-1, keepdim=True)[0], ["MaxBackward0"]),
    "min_dim": (lambda L: L["x"].min(0).values, ["MinBackward0"]),
    "max_dim_ties": (lambda L: L["ties"].max(1)[0], ["MaxBackward0"]),
    "kthvalue": (lambda L: L["x"].kthvalue(2, 1)[0], ["KthvalueBackward0"]),
    "median_dim": (lambda L: L["x"].median(-1, keepdim=True)[0], ["MedianBackward1"]),
    "nanmedian_dim": (lambda L: L["nan"].nanmedian(1)[0], ["NanmedianBackward1"]),
    "mode": (lambda L: L["ties"].mode(1)[0], ["ModeBackward0"]),
    "median_all": (lambda L: L["ties"].median().reshape(1), ["MedianBackward0"]),
    "nanmedian_all": (lambda L: L["nan"].nanmedian().reshape(1), ["NanmedianBackward0"]),
    "aminmax": (lambda L: torch.aminmax(L["x"], dim=1), ["AminmaxBackward0"]),
    "aminmax_all_ties": (lambda L: torch.aminmax(L["ties"]), ["AminmaxBackward0"]),
    "aminmax_max_only": (lambda L: torch.aminmax(L["ties"], dim=-1, keepdim=True)[1], ["AminmaxBackward0"]),
    "sort": (lambda L: L["x"].sort(dim=1)[0], ["SortBackward0"]),
    "sort_descending_neg": (lambda L: L["x"].sort(dim=-1, descending=True)[0], ["SortBackward0"]),
    "topk": (lambda L: L["x"].topk(2, dim=-1)[0], ["TopkBackward0"]),
    "topk_smallest_dim0": (lambda L: L["m"].topk(3, dim=0, largest=False)[0], ["TopkBackward0"]),
    "cummax": (lambda L: L["x"].cummax(1)[0], ["CummaxBackward0"]),
    "cummin_ties": (lambda L: L["ties"].cummin(-1)[0], ["CumminBackward0"]),
    "cumsum": (lambda L: L["x"].cumsum(1), ["CumsumBackward0"]),
    "cumsum_neg": (lambda L: L["x"].cumsum(-1), ["CumsumBackward0"]),
    "cumprod": (lambda L: L["x"].cumprod(1), ["CumprodBackward0"]),
    "cumprod_zeros": (lambda L: L["zeros"].cumprod(-1), ["CumprodBackward0"]),
    "cumprod_zeros_dim0": (lambda L: L["zeros"].cumprod(0), ["CumprodBackward0"]),
    "logcumsumexp": (lambda L: L["x"].logcumsumexp(1), ["LogcumsumexpBackward0"]),
    "logcumsumexp_neg": (lambda L: L["m"].logcumsumexp(-2), ["LogcumsumexpBackward0"]),
    "prod": (lambda L: L["x"].prod().reshape(1), ["ProdBackward0"]),
    "prod_one_zero": (lambda L: L["zeros"][0].prod().reshape(1), ["ProdBackward0"]),
    "prod_two_zeros": (lambda L: L["zeros"][1].prod().reshape(1), ["ProdBackward0"]),
    "prod_dim": (lambda L: L["x"].prod(1), ["ProdBackward1"]),
    "prod_dim_keepdim_zeros": (lambda L: L["zeros"].prod(-1, keepdim=True), ["ProdBackward1"]),
    "std": (lambda L: L["x"].std().reshape(1), ["StdBackward0"]),
    "std_dims_correction0": (lambda L: L["x"].std(dim=(0, 2), correction=0, keepdim=True), ["StdBackward0"]),
    "std_neg_dim": (lambda L: L["x"].std(-1), ["StdBackward0"]),
    "std_zero": (lambda L: L["ties"].std(1), ["StdBackward0"]),
    "var": (lambda L: L["x"].var(1), ["VarBackward0"]),
    "var_all_correction2": (lambda L: L["x"].var(correction=2).reshape(1), ["VarBackward0"]),
    "var_keepdim": (lambda L: L["m"].var(0, keepdim=True, unbiased=False), ["VarBackward0"]),
    "var_mean": (lambda L: torch.var_mean(L["x"], 1), ["VarMeanBackward0"]),
    "var_mean_only_mean": (lambda L: torch.var_mean(L["x"], (0, -1), keepdim=True)[1], ["VarMeanBackward0"]),
    "std_mean": (lambda L: torch.std_mean(L["x"], -1, correction=0), ["StdMeanBackward0"]),
    "logsumexp": (lambda L: L["x"].logsumexp(1), ["LogsumexpBackward0"]),
    "logsumexp_dims_keepdim": (lambda L: L["x"].logsumexp((0, -1), keepdim=True), ["LogsumexpBackward0"]),
    "nansum": (lambda L: L["nan"].nansum(1), ["NansumBackward0"]),
    "nansum_all": (lambda L: L["nan"].nansum().reshape(1), ["NansumBackward0"]),
}


@cases(REDUCTIONS)
def test_reduction_rule(case, tmp_path):
    build, names = REDUCTIONS[case]
    check(tmp_path, build, reduction_leaves(), names=names)


COMPLEX_REDUCTIONS = {
    "cumsum": lambda L: L["z"].cumsum(1),
    "cumprod": lambda L: L["z"].cumprod(1),
    "cumprod_zero": lambda L: (L["z"] * torch.tensor([1, 0, 1, 1], dtype=C)).cumprod(1),
    "prod": lambda L: L["z"].prod().reshape(1),
    "prod_dim": lambda L: L["z"].prod(0),
    "var": lambda L: L["z"].var(1),
    "std": lambda L: L["z"].std(0),
}


@cases(COMPLEX_REDUCTIONS)
def test_reduction_rule_complex(case, tmp_path):
    check(tmp_path, COMPLEX_REDUCTIONS[case], {"z": cleaf(3, 4)},
          complex_out=case not in ("var", "std"))


# --- products -----------------------------------------------------------------------------------------------------

def product_leaves():
    return {"c": leaf(2, 3, 5, seed=31), "a": leaf(2, 3, 4, seed=32), "b": leaf(2, 4, 5, seed=33),
            "c1": leaf(3, 1, seed=34), "u": leaf(3, 4, seed=35), "w": leaf(6, 4, 5, seed=36), "v": leaf(3, 5, seed=37),
            "bias": leaf(6, seed=38)}


PRODUCTS = {
    "baddbmm": (lambda L: torch.baddbmm(L["c"], L["a"], L["b"]), ["BaddbmmBackward0"]),
    "baddbmm_scaled_broadcast": (lambda L: torch.baddbmm(L["c1"], L["a"], L["b"], beta=0.5, alpha=-2.0),
                                 ["BaddbmmBackward0"]),
    "addbmm": (lambda L: torch.addbmm(L["c"][0, :, :1], L["a"], L["b"], beta=2.0, alpha=0.5), ["AddbmmBackward0"]),
    "addmv": (lambda L: torch.addmv(L["bias"][:3], L["u"], L["u"][0] * 2, beta=0.5, alpha=3.0), ["AddmvBackward0"]),
    "addmv_broadcast": (lambda L: torch.addmv(L["bias"][:1], L["u"], L["v"][0, :4]), ["AddmvBackward0"]),
    "addr": (lambda L: torch.addr(L["u"], L["v"][:, 0], L["bias"][:4], beta=-1.0, alpha=2.0), ["AddrBackward0"]),
    "addr_broadcast": (lambda L: torch.addr(L["bias"][:4], L["v"][:, 1], L["u"][1]), ["AddrBackward0"]),
    "bilinear": (lambda L: F.bilinear(L["u"], L["v"], L["w"], L["bias"]), ["TrilinearBackward0"]),
    "bilinear_module_batched": (lambda L: torch.nn.Bilinear(4, 5, 2).double()(L["a"][:, :2], L["c"][:, :2]),
                                ["TrilinearBackward0"]),
    "trilinear_raw": (lambda L: torch.ops.aten._trilinear(L["u"], L["w"], L["v"], [1, 3], [0], [1, 2], [2, 3]),
                      ["TrilinearBackward0"]),
    "trilinear_keep_dims": (lambda L: torch.ops.aten._trilinear(L["u"], L["w"][0], L["v"][:, :4],
                                                                [2], [0], [2], [1]),
                            ["TrilinearBackward0"]),
}


@cases(PRODUCTS)
def test_product_rule(case, tmp_path):
    build, names = PRODUCTS[case]
    check(tmp_path, build, product_leaves(), names=names)


COMPLEX_PRODUCTS = {
    "baddbmm": lambda L: torch.baddbmm(L["c"], L["a"], L["b"], alpha=0.5),
    "addbmm": lambda L: torch.addbmm(L["c"][0], L["a"], L["b"], beta=2.0),
    "addmv": lambda L: torch.addmv(L["c"][0, 0, :3], L["a"][0], L["b"][0, :, 0], alpha=-1.5),
    "addr": lambda L: torch.addr(L["a"][0], L["c"][0, :, 0], L["b"][0, :, 0], beta=0.5),
}


def test_complex_scalars_are_conjugated():
    """A complex alpha (saved as a string: JSON has no complex numbers) multiplies the gradients conjugated."""
    gen = torch.Generator().manual_seed(4)
    m, v, c = (torch.randn(*s, dtype=C, generator=gen).requires_grad_() for s in ((3, 4), (4,), (3,)))
    g = torch.randn(3, dtype=C, generator=gen)
    out = torch.addmv(c, m, v, beta=0.5, alpha=1 - 2j)
    expected = torch.autograd.grad(out, [c, m, v], g)
    meta = {"dtype": "complex128"}
    doc = {"format": "autograd-graph/1", "variables": [dict(meta, name=n, shape=list(x.shape))
                                                       for n, x in zip("cmv", (c, m, v))],
           "nodes": [{"id": "n", "name": "AddmvBackward0", "seq": 1, "next": [["c", 0], ["m", 0], ["v", 0]],
                      "inputs": [dict(meta, shape=[3])],
                      "saved": {"mat": {"npz": "mat"}, "vec": {"npz": "vec"}, "alpha": "(1-2j)", "beta": 0.5}}]
           + [{"id": n, "name": "AccumulateGrad", "variable": n, "inputs": [dict(meta, shape=list(x.shape))]}
              for n, x in zip("cmv", (c, m, v))],
           "roots": [{"node": "n", "grad": {"npz": "g"}}]}
    import json
    import tempfile
    import pathlib
    d = pathlib.Path(tempfile.mkdtemp())
    np.savez(d / "g.npz", mat=m.detach().numpy(), vec=v.detach().numpy(), g=g.numpy())
    (d / "g.json").write_text(json.dumps(doc))
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    eng = Engine(multithreading=False)
    try:
        ours = run_graph(eng, load_graph(str(d / "g.json")), retain_graph=True).grads
    finally:
        eng.shutdown()
    for n, want in zip("cmv", expected):
        np.testing.assert_allclose(ours[n], want.numpy(), rtol=1e-6, atol=1e-9, err_msg=n)


@cases(COMPLEX_PRODUCTS)
def test_product_rule_complex(case, tmp_path):
    L = {"c": cleaf(2, 3, 5), "a": cleaf(2, 3, 4, seed=1), "b": cleaf(2, 4, 5, seed=2)}
    check(tmp_path, COMPLEX_PRODUCTS[case], L, complex_out=True)


# --- attention ----------------------------------------------------------------------------------------------------

def attention_leaves():
    return {"q": leaf(2, 3, 6, 4, seed=41), "k": leaf(2, 3, 6, 4, seed=42), "v": leaf(2, 3, 6, 4, seed=43),
            "q5": leaf(2, 3, 5, 4, seed=44), "k8": leaf(2, 3, 8, 4, seed=45), "v8": leaf(2, 3, 8, 4, seed=46),
            "x": leaf(2, 5, 8, seed=47)}


SDPA = F.scaled_dot_product_attention
CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
BOOL_MASK = torch.tensor([[True, False, True, True, False, True], [False] * 6, [True] * 6,
                          [True, True, False, False, False, True], [False, True] * 3, [True] + [False] * 5])
FLOAT_MASK = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(3), dtype=D)
KEY_PADDING = torch.tensor([[False, False, False, True, True], [False] * 5])


def _mha(L, **kw):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    return m(L["x"], L["x"] * 0.5, L["x"], need_weights=False, **kw)[0]


def _encoder(L, **kw):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    return layer(L["x"], **kw)


ATTENTION = {
    "sdpa": lambda L: SDPA(L["q"], L["k"], L["v"]),
    "sdpa_scale": lambda L: SDPA(L["q"], L["k"], L["v"], scale=0.3),
    "sdpa_causal": lambda L: SDPA(L["q"], L["k"], L["v"], is_causal=True),
    "sdpa_causal_fewer_queries": lambda L: SDPA(L["q5"], L["k8"], L["v8"], is_causal=True),
    "sdpa_causal_more_queries": lambda L: SDPA(L["q"], L["k8"][:, :, :4], L["v8"][:, :, :4], is_causal=True),
    "sdpa_bool_mask_hidden_row": lambda L: SDPA(L["q"], L["k"], L["v"], attn_mask=BOOL_MASK),
    "sdpa_float_mask": lambda L: SDPA(L["q"], L["k"], L["v"], attn_mask=FLOAT_MASK, scale=0.7),
    "sdpa_cross_lengths": lambda L: SDPA(L["q5"], L["k8"], L["v8"]),
    "cpu_flash_mask_and_causal": lambda L: CPU_FLASH(L["q"], L["k"], L["v"], is_causal=True,
                                                     attn_mask=FLOAT_MASK)[0],
    "mha": lambda L: _mha(L),
    "mha_key_padding": lambda L: _mha(L, key_padding_mask=KEY_PADDING),
    "transformer_encoder_layer": lambda L: _encoder(L),
    "transformer_encoder_layer_causal": lambda L: _encoder(
        L, src_mask=torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D), is_causal=True),
}


@cases(ATTENTION)
def test_attention_rule(case, tmp_path):
    check(tmp_path, ATTENTION[case], attention_leaves(), names=["ScaledDotProductFlashAttentionForCpuBackward0"])


def test_attention_with_dropout_has_no_rule():
    """The CPU kernel refuses dropout; CUDA captures with dropout become opaque nodes (their masks are random)."""
    for name in ("ScaledDotProductFlashAttentionForCpuBackward0", "ScaledDotProductFlashAttentionBackward0",
                 "ScaledDotProductEfficientAttentionBackward0", "ScaledDotProductCudnnAttentionBackward0"):
        spec = lookup(name)
        assert "dropout" in spec.unsupported({"dropout_p": 0.1})
        assert spec.unsupported({"dropout_p": 0.0}) is None


def _math_attention(q, k, v, scale, bias=None, causal=None):
    """softmax(scale q k^T + bias) v in plain torch ops, keys/values repeated for grouped-query attention."""
    rep = q.shape[-3] // k.shape[-3]
    kr, vr = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    s = q @ kr.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    if causal is not None:
        length, keys = s.shape[-2:]
        shift = keys - length if causal == "bottom_right" else 0
        hidden = torch.ones(length, keys, dtype=torch.bool).triu(1 + shift)
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, -1)
    return p @ vr, torch.logsumexp(s, -1)


def _cuda_attention_doc(name, L, grad, *, scale=None, causal=None, bias=None, bias_edge=False, saved=None):
    """A graph with one CUDA attention node over leaves q, k, v (and bias), saved values computed in torch."""
    def t(x):
        return {"data": x.detach().tolist(), "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape)}
    q, k, v = L["q"], L["k"], L["v"]
    sc = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out, lse = _math_attention(q, k, v, sc, bias, causal)
    names = ["q", "k", "v"] + (["bias"] if bias_edge else [])
    values = {"query": t(q), "key": t(k), "value": t(v), "output": t(out), "dropout_p": 0.0,
              "is_causal": causal is not None, "scale": scale}
    for key, value in (saved or {}).items():
        values[key] = value(t, out, lse) if callable(value) else value
    meta = {"dtype": "float64", "device": "cuda:0"}
    # One edge per output, as PyTorch's node has: the bias of the kernels that differentiate it is an output
    # even where it is a constant or absent (a null edge).
    edges = [[n, 0] for n in names]
    edges += [None] * (lookup(name).outputs - len(edges))
    nodes = [{"id": "att", "name": name, "seq": 1, "next": edges,
              "inputs": [dict(meta, shape=list(out.shape))], "saved": values}]
    variables = []
    for n in names:
        nodes.append({"id": n, "name": "AccumulateGrad", "variable": n,
                      "inputs": [dict(meta, shape=list(L[n].shape))]})
        variables.append(dict(meta, name=n, shape=list(L[n].shape)))
    doc = {"format": "autograd-graph/1", "mode": "backward", "variables": variables, "nodes": nodes,
           "roots": [{"node": "att", "input_nr": 0, "grad": t(grad)}]}
    expected = torch.autograd.grad(out, [L[n] for n in names], grad)
    return doc, dict(zip(names, expected))


def _run_doc(doc):
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    g = loads_graph(dumps(doc, "json"), "attention.json")
    eng = Engine(multithreading=False)
    try:
        return run_graph(eng, g, retain_graph=True).grads
    finally:
        eng.shutdown()


def _zeros(*shape, dtype="int64"):
    return {"data": np.zeros(shape, dtype=dtype).tolist(), "dtype": dtype, "shape": list(shape)}


def _padded_lse(t, out, lse):
    """The memory-efficient kernel's log-sum-exp: padded to a multiple of 32 queries."""
    pad = -lse.shape[-1] % 32
    return t(F.pad(lse, (0, pad)))


FLASH_SAVED = {"logsumexp": lambda t, o, lse: t(lse), "cum_seq_q": _zeros(0), "cum_seq_k": _zeros(0),
               "max_q": 6, "max_k": 6, "rng_state": _zeros(2), "unused": _zeros(0, dtype="float64")}
EFFICIENT_SAVED = {"log_sumexp": _padded_lse, "philox_seed": _zeros(), "philox_offset": _zeros()}
CUDNN_SAVED = {"logsumexp": lambda t, o, lse: t(lse[..., None]), "philox_seed": _zeros(), "philox_offset": _zeros(),
               "cum_seq_q": _zeros(0), "cum_seq_k": _zeros(0), "max_q": 6, "max_k": 6}

CUDA_ATTENTION = {
    "flash": ("ScaledDotProductFlashAttentionBackward0", {}, FLASH_SAVED),
    "flash_causal_scale": ("ScaledDotProductFlashAttentionBackward0", {"causal": "top_left", "scale": 0.4},
                           FLASH_SAVED),
    "flash_causal_bottom_right": ("ScaledDotProductFlashAttentionBackward0", {"causal": "bottom_right", "keys": 9},
                                  FLASH_SAVED),
    "flash_grouped_query": ("ScaledDotProductFlashAttentionBackward0", {"kv_heads": 1}, FLASH_SAVED),
    "efficient": ("ScaledDotProductEfficientAttentionBackward0", {}, EFFICIENT_SAVED),
    "efficient_causal": ("ScaledDotProductEfficientAttentionBackward0", {"causal": "top_left", "keys": 9},
                         EFFICIENT_SAVED),
    "efficient_bias_grad": ("ScaledDotProductEfficientAttentionBackward0", {"bias": (2, 1, 6, 6), "bias_edge": True},
                            EFFICIENT_SAVED),
    "efficient_bias_broadcast_grad": ("ScaledDotProductEfficientAttentionBackward0",
                                      {"bias": (6, 6), "bias_edge": True, "scale": 1.3}, EFFICIENT_SAVED),
    "efficient_bias_constant": ("ScaledDotProductEfficientAttentionBackward0", {"bias": (2, 3, 6, 6)},
                                EFFICIENT_SAVED),
    "cudnn": ("ScaledDotProductCudnnAttentionBackward0", {}, CUDNN_SAVED),
    "cudnn_causal_bias": ("ScaledDotProductCudnnAttentionBackward0", {"causal": "top_left", "bias": (1, 1, 6, 6)},
                          CUDNN_SAVED),
    "overrideable_bias_grad": ("ScaledDotProductFusedAttentionOverrideableBackward0",
                               {"bias": (2, 3, 6, 6), "bias_edge": True}, FLASH_SAVED),
}


@cases(CUDA_ATTENTION)
def test_cuda_attention_rule(case):
    """CUDA kernels cannot run here: a hand-written node with torch-computed saved values vs. math attention."""
    name, opts, saved = CUDA_ATTENTION[case]
    gen = torch.Generator().manual_seed(7)
    keys, kv_heads = opts.get("keys", 6), opts.get("kv_heads", 3)
    L = {"q": torch.randn(2, 3, 6, 4, dtype=D, generator=gen).requires_grad_(),
         "k": torch.randn(2, kv_heads, keys, 4, dtype=D, generator=gen).requires_grad_(),
         "v": torch.randn(2, kv_heads, keys, 4, dtype=D, generator=gen).requires_grad_()}
    bias = None
    if "bias" in opts:
        bias = torch.randn(*opts["bias"][:-1], keys, dtype=D, generator=gen)
        bias.requires_grad_(opts.get("bias_edge", False))
        L["bias"] = bias
    grad = torch.randn(2, 3, 6, 4, dtype=D, generator=gen)
    extra = dict(saved)
    if bias is not None:
        extra["attn_bias"] = lambda t, o, lse: t(bias)
    doc, expected = _cuda_attention_doc(name, L, grad, scale=opts.get("scale"), causal=opts.get("causal"),
                                        bias=bias, bias_edge=opts.get("bias_edge", False), saved=extra)
    ours = _run_doc(doc)
    assert set(ours) == set(expected)
    for n, t in expected.items():
        np.testing.assert_allclose(ours[n], t.numpy(), rtol=1e-6, atol=1e-9, err_msg=n)


def test_cuda_attention_dropout_is_refused():
    gen = torch.Generator().manual_seed(1)
    L = {n: torch.randn(1, 1, 3, 2, dtype=D, generator=gen).requires_grad_() for n in "qkv"}
    doc, _ = _cuda_attention_doc("ScaledDotProductFlashAttentionBackward0", L, torch.ones(1, 1, 3, 2, dtype=D),
                                 saved=dict(FLASH_SAVED, dropout_p=0.1))
    with pytest.raises(Exception, match="dropout"):
        _run_doc(doc)


# --- declarations -------------------------------------------------------------------------------------------------

#: Saved fields declared here that PyTorch does not save: extensions for hand-written files, and as_strided's
#: input layout, which PyTorch keeps on the node unexposed (capture records it for a leaf input).
EXTENSIONS = {("CatBackward0", "sizes")} | {(n, f) for n in ("AsStridedBackward0", "AsStridedBackward1",
                                                             "AsStridedBackward0_copy")
                                            for f in ("self_strides", "self_storage_offset")}


@pytest.mark.parametrize("family", ["shape", "indexing", "reductions", "attention", "products", "spectral"])
def test_saved_fields_are_pytorchs(family):
    """Every op of these families is a PyTorch node class, and declares exactly the ``_saved_`` fields it has."""
    from autograd_run.ops import REGISTRY
    specs = [s for s in REGISTRY if s.family == family]
    assert specs
    for spec in specs:
        if spec.name == "torch::autograd::CopySlices":  # saves nothing in PyTorch; capture measures its fields
            continue
        cls = getattr(torch._C._functions, spec.name.split("::")[-1], None)
        assert cls is not None, f"{spec.name} is not a PyTorch node"
        exposed = {a[len("_saved_"):] for a in dir(cls) if a.startswith("_saved_")}
        declared = set(spec.saved) - {f for n, f in EXTENSIONS if n == spec.name}
        assert declared == exposed, spec.name
        assert spec.doc and spec.cost is not None, spec.name


# --- in-place ops on views (CopySlices) ---------------------------------------------------------------------------

def _inplace(fn):
    """``fn(x, L)`` applied in place to a clone of leaf ``a``."""
    def build(L):
        x = L["a"].clone()
        fn(x, L)
        return x
    return build


def _setitem_(where, value):
    return lambda x, L: x.__setitem__(where, value(L) if callable(value) else value)


COPY_SLICES = {
    "imul_column": _inplace(lambda x, L: x[:, 1].__imul__(2)),
    "imul_setitem_column": _inplace(lambda x, L: x.__setitem__((slice(None), 1), x[:, 1] * 2)),
    "augmented_column": lambda L: (lambda x: (x.__getitem__((slice(None), 1)).mul_(3), x)[1])(L["a"].clone()),
    "mul_tensor": _inplace(lambda x, L: x[1:].mul_(L["w"])),
    "add_alpha": _inplace(lambda x, L: x[:, 1:3].add_(L["w"][:, :2].t().contiguous()[:1].expand(3, 2), alpha=0.5)),
    "setitem_broadcast": _inplace(_setitem_(slice(1, None), lambda L: L["y"])),
    "setitem_scalar": _inplace(_setitem_((0, 0), 5.0)),
    "relu_transposed_view": _inplace(lambda x, L: x.t()[1].relu_()),
    "sigmoid_strided": _inplace(lambda x, L: x[::2].sigmoid_()),
    "diagonal_zero": _inplace(lambda x, L: x.diagonal().zero_()),
    "fill_row": _inplace(lambda x, L: x[2].fill_(1.5)),
    "copy_from_leaf": _inplace(lambda x, L: x[:, :2].copy_(L["w"][:, :3].t())),
    "non_contiguous_base": lambda L: (lambda b: (b.__setitem__(slice(1, None), L["y"][:3] * 2), b)[1])(
        L["a"].t().clone()),
    "two_writes": _inplace(lambda x, L: (x[0].mul_(L["y"]), x[:, 0].div_(4.0))),
    "circular_pad": lambda L: F.pad(L["a"][None], (1, 2), mode="circular"),
}


@cases(COPY_SLICES)
def test_copy_slices(case, tmp_path):
    check(tmp_path, COPY_SLICES[case], {"a": leaf(3, 4, seed=51), "w": leaf(2, 4, seed=52), "y": leaf(4, seed=53)},
          names=["torch::autograd::CopySlices"])


def test_copy_slices_complex(tmp_path):
    def build(L):
        z = L["z"] * 1
        z[:, 1] *= 1 + 2j
        z[0].mul_(L["w"][0])
        return z
    check(tmp_path, build, {"z": cleaf(3, 4), "w": cleaf(2, 4, seed=1)}, complex_out=True,
          names=["torch::autograd::CopySlices"])


def test_copy_slices_over_a_non_elementwise_backward_is_opaque():
    from autograd_run.capture import from_torch
    a = leaf(3, 4, seed=51)
    x = a.clone()
    x[1:].cumsum_(1)
    doc = from_torch([x.sum()], names={"a": a}, reference=False)
    node = next(n for n in doc["nodes"] if n["name"] == "torch::autograd::CopySlices")
    assert node["op"] == "opaque" and "not elementwise" in node["attrs"]["reason"]


# --- view_copy ops, plain copies, more indexing and reductions ------------------------------------------------------

A = torch.ops.aten

MORE = {
    "view_copy": (lambda L: A.view_copy(L["x"], [6, 4]), ["ViewBackward0_copy"]),
    "transpose_copy": (lambda L: A.transpose_copy(L["x"], 0, -1), ["TransposeBackward0_copy"]),
    "permute_copy": (lambda L: A.permute_copy(L["x"], [2, 0, 1]), ["PermuteBackward0_copy"]),
    "expand_copy": (lambda L: A.expand_copy(L["x"][:, :1], [2, 3, 4]), ["ExpandBackward0_copy"]),
    "select_copy": (lambda L: A.select_copy(L["x"], 1, -1), ["SelectBackward0_copy"]),
    "slice_copy": (lambda L: A.slice_copy(L["x"], 2, 1, 3), ["SliceBackward0_copy"]),
    "squeeze_copies": (lambda L: A.squeeze_copy(L["x"][:, :1]) + A.squeeze_copy.dim(L["x"][:, 1:2], 1)
                       + A.squeeze_copy.dims(L["x"][:, 2:], [1]), ["SqueezeBackward0_copy", "SqueezeBackward1_copy",
                                                                   "SqueezeBackward2_copy"]),
    "unsqueeze_copy": (lambda L: A.unsqueeze_copy(L["x"], -1), ["UnsqueezeBackward0_copy"]),
    "t_copy": (lambda L: A.t_copy(L["x"][0]), ["TBackward0_copy"]),
    "split_copies": (lambda L: [A.split_copy(L["x"], 2, 2)[1], A.split_with_sizes_copy(L["x"], [1, 3], 2)[0]],
                     ["SplitBackward0_copy", "SplitWithSizesBackward0_copy"]),
    "unbind_copy": (lambda L: A.unbind_copy(L["x"], 1)[2], ["UnbindBackward0_copy"]),
    "unfold_copy": (lambda L: A.unfold_copy(L["x"], 2, 2, 1), ["UnfoldBackward0_copy"]),
    "as_strided_copy": (lambda L: A.as_strided_copy(L["x"], [3, 2], [1, 3], 2), ["AsStridedBackward0_copy"]),
    "alias_lift_clone": (lambda L: [A.alias_copy(L["x"]), A.lift_fresh(L["x"] * 2), A.lift_fresh_copy(L["x"] * 3),
                                    A.lift(L["x"] * 4), A._lazy_clone(L["x"])],
                         ["AliasBackward0_copy", "LiftFreshBackward0", "LiftFreshBackward0_copy", "LiftBackward0",
                          "LazyCloneBackward0"]),
    "reshape_copies": (lambda L: [A._reshape_alias_copy(L["x"], [6, 4], [4, 1]), A._reshape_copy(L["x"], [4, 6])],
                       ["ReshapeAliasBackward0_copy", "ReshapeCopyBackward0"]),
    "sort_stable": (lambda L: L["x"].sort(dim=1, stable=True)[0], ["SortBackward1"]),
    "put": (lambda L: L["x"].put(idx(0, 5, -1), L["v"][:3]), ["PutBackward0"]),
    "put_accumulate": (lambda L: L["x"].put(idx(0, 5, 5), L["v"][:3] * 2, accumulate=True), ["PutBackward0"]),
    "unsafe_index": (lambda L: A._unsafe_index(L["m"], [idx(0, 3, 3)]), ["UnsafeIndexBackward0"]),
    "unsafe_index_put": (lambda L: A._unsafe_index_put(L["m"], [idx(0, 3)], L["m"][:2] * 2, False),
                         ["UnsafeIndexPutBackward0"]),
    "index_put_impl": (lambda L: A._index_put_impl_(L["m"] * 1, [idx(1, 1)], L["m"][1:3].exp(), True, False),
                       ["IndexPutImplBackward0"]),
    "trace": (lambda L: L["m"].trace().reshape(1), ["TraceBackward0"]),
    "trace_square": (lambda L: L["x"][0, :, :3].trace().reshape(1), ["TraceBackward0"]),
}


@cases(MORE)
def test_more_rules(case, tmp_path):
    build, names = MORE[case]
    check(tmp_path, build, shape_leaves(), names=names)


def _second_order(first, wrt="x"):
    """The gradient of (first(L) * w).sum() with respect to L[wrt], with create_graph: a double-backward graph."""
    def build(L):
        y = first(L)
        w = torch.randn(y.shape, dtype=D, generator=torch.Generator().manual_seed(9)) * L["w"].sum()
        return torch.autograd.grad((y * w).sum(), L[wrt], create_graph=True)[0]
    return build


DOUBLE = {
    "select": (_second_order(lambda L: L["x"].select(1, -1)), ["SelectBackwardBackward0"]),
    "slice": (_second_order(lambda L: L["x"][:, 1:3]), ["SliceBackwardBackward0"]),
    "slice_step": (_second_order(lambda L: L["x"][..., ::2]), ["SliceBackwardBackward0"]),
    "diagonal": (_second_order(lambda L: L["x"].diagonal(1, -2, -1)), ["DiagonalBackwardBackward0"]),
    "unfold": (_second_order(lambda L: L["x"].unfold(2, 2, 1)), ["UnfoldBackwardBackward0"]),
    "masked_scatter": (_second_order(lambda L: L["x"].masked_scatter(MASK.expand(2, 3, 4), L["s"]), "s"),
                       ["MaskedScatterBackwardBackward0"]),
}


@cases(DOUBLE)
def test_double_backward_rule(case):
    build, names = DOUBLE[case]
    import tempfile
    import pathlib
    L = {"x": leaf(2, 3, 4, seed=61), "s": leaf(16, seed=62), "w": leaf(3, seed=63)}
    check(pathlib.Path(tempfile.mkdtemp()), build, L, names=names)


# --- spectral -----------------------------------------------------------------------------------------------------


R2C, C2R, C2C = "FftR2CBackward0", "FftC2RBackward0", "FftC2CBackward0"
SPECTRAL = {
    "rfft": (lambda L: torch.fft.rfft(L["x"]), R2C),
    "rfft_odd_ortho": (lambda L: torch.fft.rfft(L["o"], norm="ortho"), R2C),
    "rfft_forward_norm_dim0": (lambda L: torch.fft.rfft(L["x"], dim=0, norm="forward"), R2C),
    "fft_of_real": (lambda L: torch.fft.fft(L["x"]), R2C),
    "rfft2": (lambda L: torch.fft.rfft2(L["x"]), R2C),
    "rfftn_padded": (lambda L: torch.fft.rfftn(L["x"], s=(4, 10)), R2C),
    "fft": (lambda L: torch.fft.fft(L["z"]), C2C),
    "ifft_ortho": (lambda L: torch.fft.ifft(L["z"], norm="ortho"), C2C),
    "fft2_forward": (lambda L: torch.fft.fft2(L["z"], norm="forward"), C2C),
    "ifftn_dims": (lambda L: torch.fft.ifftn(L["z"], dim=(0,)), C2C),
    "irfft": (lambda L: torch.fft.irfft(L["z"]), C2R),
    "irfft_odd_n": (lambda L: torch.fft.irfft(L["z"], n=9, norm="ortho"), C2R),
    "irfft2": (lambda L: torch.fft.irfft2(L["z"], norm="forward"), C2R),
    # A spectral filter (real weights: complex multiplication is the elementwise family's, checked elsewhere).
    "spectral_filter": (lambda L: torch.fft.irfft(torch.fft.rfft(L["x"]) * torch.linspace(1, 0, 5, dtype=D), n=8),
                        C2R),
}


@cases(SPECTRAL)
def test_spectral_rule(case, tmp_path):
    L = {"x": leaf(3, 8, seed=71), "o": leaf(3, 7, seed=72), "z": cleaf(3, 8, seed=73)}
    build, name = SPECTRAL[case]
    check(tmp_path, build, L, complex_out=build(L).is_complex(), names=[name])


def test_stft(tmp_path):
    """torch.stft of a signal (framing, window, real FFT), as spectral losses use it."""
    def build(L):
        window = torch.hann_window(8, dtype=D)
        return torch.stft(L["audio"], 8, hop_length=2, window=window, center=False, return_complex=True)
    check(tmp_path, build, {"audio": leaf(2, 32, seed=74)}, complex_out=True, names=["FftR2CBackward0"])


@pytest.mark.parametrize("family", ["shape", "indexing", "reductions", "attention", "products", "spectral"])
def test_cost_models_give_finite_figures(family):
    from autograd_run.ops import REGISTRY
    from autograd_run.ops.cost import Shapes
    meta = ((2, 3, 6, 4), "float64")
    saved = {"query": meta, "key": meta, "value": meta, "i1": ((3, 1, 4, 1), "float64"),
             "i2": ((1, 2, 4, 5), "float64"), "i3": ((3, 1, 1, 5), "float64")}
    for spec in (s for s in REGISTRY if s.family == family):
        for shapes in (Shapes([meta], [meta, None, meta]), Shapes([meta], [meta], saved, {"dim": [1]})):
            flops, moved = spec.cost.flops(shapes), spec.cost.bytes(shapes)
            assert math.isfinite(flops) and flops >= 0 and math.isfinite(moved) and moved >= 0, spec.name


# --- small real-model graphs that lean on these families ---------------------------------------------------------

def _lstm_lm(L):
    torch.manual_seed(1)
    emb, lstm = torch.nn.Embedding(20, 8).double(), torch.nn.LSTM(8, 6, bidirectional=True, batch_first=True).double()
    tok = torch.tensor([[1, 5, 7, 2, 9, 3, 4], [4, 4, 8, 1, 0, 0, 0], [3, 2, 0, 0, 0, 0, 0]])
    packed = torch.nn.utils.rnn.pack_padded_sequence(emb(tok) * L["scale"], [7, 4, 2], batch_first=True)
    h, _ = torch.nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True)
    return h @ L["head"]


def _gnn(L):
    src, dst = idx(0, 1, 2, 3, 4, 5, 0), idx(1, 2, 3, 4, 5, 0, 3)
    msg = (L["nodes"] @ L["w"])[src]
    total = torch.zeros(6, 4, dtype=D).index_add(0, dst, msg)
    peak = torch.zeros(6, 4, dtype=D).scatter_reduce(0, dst[:, None].expand(-1, 4), msg, "amax", include_self=False)
    mean = torch.zeros(6, 4, dtype=D).scatter_reduce(0, dst[:, None].expand(-1, 4), msg, "mean")
    return total.relu() + peak + mean


def _returns(L):
    ret = torch.flip(torch.cumsum(torch.flip(L["rewards"], [0]), 0), [0])
    return (ret - ret.mean()) / (ret.std() + 1e-8)


MODELS = {
    "lstm_language_model_packed": (_lstm_lm, ["PackPaddedSequenceBackward0", "UnsafeSplitBackward0"]),
    "gnn_message_passing": (_gnn, ["IndexBackward0", "IndexAddBackward0", "ScatterReduceBackward0"]),
    "normalised_returns": (_returns, ["FlipBackward0", "CumsumBackward0", "StdBackward0"]),
    "sdpa_grouped_query_cpu": (lambda L: SDPA(L["q"], L["kv"], L["kv"] * 2, enable_gqa=True),
                               ["ScaledDotProductFlashAttentionForCpuBackward0"]),
    "vit_patchify": (lambda L: torch.cat([L["cls"], L["img"].unfold(2, 4, 4).unfold(3, 4, 4).reshape(2, 3, 4, 4, 16)
                                          .permute(0, 2, 3, 1, 4).flatten(1, 2).flatten(2)], 1),
                     ["UnfoldBackward0", "CatBackward0"]),
}


@cases(MODELS)
def test_model(case, tmp_path):
    build, names = MODELS[case]
    L = {"scale": leaf(8, seed=81), "head": leaf(12, 5, seed=82), "nodes": leaf(6, 4, seed=83),
         "w": leaf(4, 4, seed=84), "rewards": leaf(9, seed=85), "q": leaf(2, 4, 5, 8, seed=86),
         "kv": leaf(2, 2, 5, 8, seed=87), "img": leaf(2, 3, 16, 16, seed=88), "cls": leaf(2, 1, 48, seed=89)}
    check(tmp_path, build, L, names=names)
