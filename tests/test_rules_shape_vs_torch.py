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
    from autograd_run.traces.order import OrderRecorder
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
    got = [(r.name, r.seq) for r in rec.records if r.name != "GraphRoot"]
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
    "pixel_shuffle": (lambda L: F.pixel_shuffle(L["img"], 2), ["PixelShuffleBackward0"]),
    "pixel_unshuffle": (lambda L: F.pixel_unshuffle(L["img"][:, :, :2, :4], 2), ["PixelUnshuffleBackward0"]),
    "pixel_shuffle_5d": (lambda L: F.pixel_shuffle(L["img"].reshape(2, 2, 4, 3, 5), 2), ["PixelShuffleBackward0"]),
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
    "view_as_complex": (lambda L: torch.view_as_real(torch.view_as_complex(L["x"][..., :2].contiguous()) * 2),
                        ["ViewAsComplexBackward0", "ViewAsRealBackward0"]),
    "reflect_1d": (lambda L: F.pad(L["x"], (2, 3), mode="reflect"), ["ReflectionPad1DBackward0"]),
    "reflect_2d": (lambda L: F.pad(L["img"], (4, 1, 2, 2), mode="reflect"), ["ReflectionPad2DBackward0"]),
    "reflect_3d": (lambda L: F.pad(L["img"][None], (1, 1, 2, 0, 3, 1), mode="reflect"), ["ReflectionPad3DBackward0"]),
    "replicate_1d": (lambda L: F.pad(L["x"], (3, 1), mode="replicate"), ["ReplicationPad1DBackward0"]),
    "replicate_2d": (lambda L: F.pad(L["img"], (2, 6, 0, 1), mode="replicate"), ["ReplicationPad2DBackward0"]),
    "replicate_3d": (lambda L: F.pad(L["img"][None], (0, 1, 1, 1, 2, 2), mode="replicate"),
                     ["ReplicationPad3DBackward0"]),
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
}


@cases(SHAPE)
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
    "view_as_real": lambda L: torch.view_as_real(L["z"]),
    "unfold": lambda L: L["z"].unfold(1, 2, 1),
}


@cases(COMPLEX_SHAPE)
def test_shape_rule_complex(case, tmp_path):
    check(tmp_path, COMPLEX_SHAPE[case], {"z": cleaf(3, 4)}, complex_out=case != "view_as_real")


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
                                   [0.5, 0.25, -3.0, 1.0, 0.0], [2.0, 1.0, 0.5, -1.0, 1.5]], dtype=D).requires_grad_(True),
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
    "sort_real": lambda L: L["z"].real.sort(1)[0],
}


@cases(COMPLEX_REDUCTIONS)
def test_reduction_rule_complex(case, tmp_path):
    check(tmp_path, COMPLEX_REDUCTIONS[case], {"z": cleaf(3, 4)},
          complex_out=case not in ("var", "std", "sort_real"))
