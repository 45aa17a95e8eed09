"""Convolution (plain, transposed, double backward), pooling, normalisation, resampling and embedding-bag rules
against PyTorch in float64 (order and every leaf gradient to 1e-6)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, grad_penalty, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch


def leaves():
    return {"x1": leaf(2, 4, 9, seed=1), "x2": leaf(2, 4, 7, 6, seed=2), "x3": leaf(2, 4, 5, 4, 6, seed=3),
            "w1": leaf(4, 3, 3, seed=4), "w2": leaf(4, 3, 3, 2, seed=5), "w3": leaf(4, 3, 2, 3, 2, seed=6),
            "wg": leaf(4, 1, 3, 3, seed=7), "b3": leaf(3, seed=8), "b6": leaf(6, seed=9), "gw": leaf(4, seed=10),
            "gb": leaf(4, seed=11), "e": leaf(7, 3, seed=12), "psw": leaf(8, seed=13, positive=True),
            "v": leaf(5, 4, seed=14), "g0": leaf(5, 1, seed=15, positive=True), "x2u": leaf(4, 7, 6, seed=16),
            "wt2": leaf(2, 2, 4, 5, seed=17), "wt3": leaf(2, 2, 4, 2, 3, seed=18)}


def _idx(*v):
    return torch.tensor(v)


CONV = {
    "conv_transpose1d": lambda L: F.conv_transpose1d(L["x1"], L["w1"], L["b3"], stride=2, padding=1, output_padding=1),
    "conv_transpose2d": lambda L: F.conv_transpose2d(L["x2"], L["w2"], L["b3"], stride=(2, 3), padding=(1, 0),
                                                     output_padding=(1, 2)),
    "conv_transpose2d_dilation": lambda L: F.conv_transpose2d(L["x2"], L["w2"], None, padding=1, dilation=(2, 1)),
    "conv_transpose2d_groups": lambda L: F.conv_transpose2d(L["x2"], L["w2"].reshape(4, 3, 3, 2)[:, :2].contiguous(),
                                                            L["gb"], stride=2, groups=2),
    "conv_transpose2d_depthwise": lambda L: F.conv_transpose2d(L["x2"], L["wg"], None, stride=2, padding=1, groups=4),
    "conv_transpose3d": lambda L: F.conv_transpose3d(L["x3"], L["w3"], L["b3"], stride=(1, 2, 2), padding=(0, 1, 0),
                                                     output_padding=(0, 1, 1)),
    "conv_transpose2d_unbatched": lambda L: F.conv_transpose2d(L["x2u"], L["w2"], L["b3"], stride=2),
    "conv2d_unbatched": lambda L: F.conv2d(L["x2u"], L["w2"].transpose(0, 1).reshape(3, 4, 3, 2)),
    "conv_transpose_module": lambda L: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                                                groups=2).double()(L["x2"]),
    "group_norm": lambda L: F.group_norm(L["x2"], 2, L["gw"], L["gb"]),
    "group_norm_no_affine_3d": lambda L: F.group_norm(L["x3"], 4),
    "group_norm_one_group_1d": lambda L: F.group_norm(L["x1"], 1, L["gw"]),
    "group_norm_2d_input": lambda L: F.group_norm(L["x2"][:, :, 0, 0], 2, L["gw"], L["gb"]),
    "weight_norm_dim0": lambda L: torch._weight_norm(L["v"], L["g0"], 0),
    "weight_norm_dim1": lambda L: torch._weight_norm(L["v"], L["g0"].reshape(1, 5)[:, :4].contiguous(), 1),
    "weight_norm_linear": lambda L: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3).double())(L["v"]),
    "rms_norm": lambda L: F.rms_norm(L["x2"], (7, 6)),
    "rms_norm_module": lambda L: torch.nn.RMSNorm(6, eps=1e-5).double()(L["x2"]),
    "instance_norm_no_affine": lambda L: F.instance_norm(L["x2"]),
    "upsample_nearest1d": lambda L: F.interpolate(L["x1"], scale_factor=2),
    "upsample_nearest1d_size": lambda L: F.interpolate(L["x1"], size=13),
    "upsample_nearest2d_size": lambda L: F.interpolate(L["x2"], size=(9, 13)),
    "upsample_nearest2d_down": lambda L: F.interpolate(L["x2"], size=(4, 5)),
    "upsample_nearest2d_scale": lambda L: F.interpolate(L["x2"], scale_factor=(1.7, 2.3)),
    "upsample_nearest3d": lambda L: F.interpolate(L["x3"], size=(7, 5, 9)),
    "upsample_nearest_exact2d": lambda L: F.interpolate(L["x2"], size=(9, 13), mode="nearest-exact"),
    "upsample_nearest_exact1d_scale": lambda L: F.interpolate(L["x1"], scale_factor=1.5, mode="nearest-exact"),
    "upsample_nearest_exact3d": lambda L: F.interpolate(L["x3"], size=(3, 7, 5), mode="nearest-exact"),
    "upsample_linear1d": lambda L: F.interpolate(L["x1"], size=14, mode="linear"),
    "upsample_linear1d_align": lambda L: F.interpolate(L["x1"], size=14, mode="linear", align_corners=True),
    "upsample_bilinear2d": lambda L: F.interpolate(L["x2"], size=(11, 5), mode="bilinear"),
    "upsample_bilinear2d_align": lambda L: F.interpolate(L["x2"], size=(11, 13), mode="bilinear", align_corners=True),
    "upsample_bilinear2d_scale": lambda L: F.interpolate(L["x2"], scale_factor=1.5, mode="bilinear"),
    "upsample_bilinear2d_down": lambda L: F.interpolate(L["x2"], size=(3, 4), mode="bilinear"),
    "upsample_trilinear3d": lambda L: F.interpolate(L["x3"], size=(7, 3, 8), mode="trilinear"),
    "upsample_trilinear3d_align": lambda L: F.interpolate(L["x3"], scale_factor=2, mode="trilinear",
                                                          align_corners=True),
    "upsample_bicubic2d": lambda L: F.interpolate(L["x2"], size=(11, 13), mode="bicubic"),
    "upsample_bicubic2d_align": lambda L: F.interpolate(L["x2"], size=(12, 9), mode="bicubic", align_corners=True),
    "upsample_bicubic2d_down": lambda L: F.interpolate(L["x2"], scale_factor=0.6, mode="bicubic"),
    "resize_bilinear_antialias_down": lambda L: F.interpolate(L["x2"], size=(3, 4), mode="bilinear", antialias=True),
    "resize_bilinear_antialias_up": lambda L: F.interpolate(L["x2"], size=(11, 9), mode="bilinear", antialias=True),
    "resize_bilinear_antialias_scale": lambda L: F.interpolate(L["x2"], scale_factor=0.45, mode="bilinear",
                                                               antialias=True),
    "resize_bilinear_antialias_align": lambda L: F.interpolate(L["x2"], size=(4, 3), mode="bilinear", antialias=True,
                                                               align_corners=True),
    "resize_bicubic_antialias_down": lambda L: F.interpolate(L["x2"], size=(3, 5), mode="bicubic", antialias=True),
    "resize_bicubic_antialias_up": lambda L: F.interpolate(L["x2"], size=(10, 13), mode="bicubic", antialias=True),
    "upsample_module": lambda L: torch.nn.Upsample(scale_factor=2, mode="bilinear")(L["x2"]),
    "avg_pool2d_ceil": lambda L: F.avg_pool2d(L["x2"], 3, 2, ceil_mode=True),
    "avg_pool2d_ceil_pad": lambda L: F.avg_pool2d(L["x2"], 3, 2, padding=1, ceil_mode=True),
    "avg_pool2d_ceil_pad_exclude": lambda L: F.avg_pool2d(L["x2"], 3, 2, padding=1, ceil_mode=True,
                                                          count_include_pad=False),
    "avg_pool2d_divisor": lambda L: F.avg_pool2d(L["x2"], (2, 3), (1, 2), padding=(1, 1), divisor_override=5),
    "avg_pool1d_ceil": lambda L: F.avg_pool1d(L["x1"], 4, 3, ceil_mode=True),
    "avg_pool3d_ceil": lambda L: F.avg_pool3d(L["x3"], 2, 2, ceil_mode=True),
    "avg_pool3d_pad_exclude": lambda L: F.avg_pool3d(L["x3"], 3, 2, padding=1, count_include_pad=False),
    "adaptive_avg_pool1d": lambda L: F.adaptive_avg_pool1d(L["x1"], 4),
    "adaptive_avg_pool2d": lambda L: F.adaptive_avg_pool2d(L["x2"], (3, 4)),
    "adaptive_avg_pool2d_up": lambda L: F.adaptive_avg_pool2d(L["x2"], (9, 7)),
    "adaptive_avg_pool3d": lambda L: F.adaptive_avg_pool3d(L["x3"], (2, 3, 4)),
    "adaptive_max_pool1d": lambda L: F.adaptive_max_pool1d(L["x1"], 4),
    "adaptive_max_pool2d": lambda L: F.adaptive_max_pool2d(L["x2"], (3, 4)),
    "adaptive_max_pool3d": lambda L: F.adaptive_max_pool3d(L["x3"], 2),
    "max_pool2d_ceil_dilation": lambda L: F.max_pool2d(L["x2"], 2, 2, padding=1, dilation=2, ceil_mode=True),
    "max_pool3d": lambda L: F.max_pool3d(L["x3"], 2, (1, 2, 2), padding=1),
    "max_pool1d_ceil": lambda L: F.max_pool1d(L["x1"], 2, ceil_mode=True),
    "reflection_pad1d": lambda L: F.pad(L["x1"], (2, 3), mode="reflect"),
    "reflection_pad2d": lambda L: F.pad(L["x2"], (1, 2, 3, 1), mode="reflect"),
    "reflection_pad3d": lambda L: F.pad(L["x3"], (1, 2, 0, 1, 2, 1), mode="reflect"),
    "replication_pad1d": lambda L: F.pad(L["x1"], (4, 1), mode="replicate"),
    "replication_pad2d": lambda L: F.pad(L["x2"], (1, 2, 3, 1), mode="replicate"),
    "replication_pad3d": lambda L: F.pad(L["x3"], (2, 2, 1, 0, 0, 3), mode="replicate"),
    "unfold": lambda L: F.unfold(L["x2"], (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
    "unfold_unbatched": lambda L: F.unfold(L["x2u"], 2),
    "fold": lambda L: F.fold(L["x2"].reshape(2, 168)[:, :144].reshape(2, 16, 9), (4, 7), (2, 2), padding=(1, 0),
                             stride=(2, 2)),
    "pixel_shuffle": lambda L: F.pixel_shuffle(L["x2"], 2),
    "pixel_unshuffle": lambda L: F.pixel_unshuffle(L["x2"][:, :, :6], 2),
    "embedding_bag_sum_offsets": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0), L["e"], _idx(0, 2, 2, 5),
                                                           mode="sum"),
    "embedding_bag_mean_2d": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0).reshape(4, 2), L["e"], mode="mean"),
    "embedding_bag_max": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0), L["e"], _idx(0, 3, 3, 6), mode="max"),
    "embedding_bag_psw": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0), L["e"], _idx(0, 2, 5),
                                                   mode="sum", per_sample_weights=L["psw"]),
    "embedding_bag_padding_mean": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0), L["e"], _idx(0, 3, 6),
                                                            mode="mean", padding_idx=3),
    # Every index occurs twice: PyTorch's CPU kernel gets the counts right only when they are all equal.
    "embedding_bag_last_offset_freq": lambda L: F.embedding_bag(_idx(0, 2, 5, 2, 5, 6, 6, 0), L["e"], _idx(0, 3, 6, 8),
                                                                mode="sum", include_last_offset=True,
                                                                scale_grad_by_freq=True),
    "embedding_bag_mean_freq": lambda L: F.embedding_bag(_idx(1, 4, 4, 1), L["e"], _idx(0, 1), mode="mean",
                                                         scale_grad_by_freq=True),
    "embedding_bag_module_psw_padding": lambda L: F.embedding_bag(_idx(0, 2, 1, 3, 3, 6, 2, 0), L["e"], _idx(0, 4),
                                                                  mode="sum", per_sample_weights=L["psw"],
                                                                  padding_idx=2),
}


def _flat(*ts):
    """Several outputs as one tensor (each weighted by ``weigh``): the gradients of all of them flow."""
    return torch.cat([t.reshape(-1) for t in ts])


_aten = torch.ops.aten

#: Found by PyTorch's OpInfo database (tests/opinfo_cases.py) and by comparing with PyTorch's CPU kernels.
CONV.update({
    # conv2d/3d with padding="valid" save padding [0] (one entry for every dim)
    "conv2d_padding_valid": lambda L: F.conv2d(L["x2"], L["w2"].transpose(0, 1), L["b3"], stride=2, padding="valid"),
    "conv3d_padding_valid": lambda L: F.conv3d(L["x3"], L["w3"].transpose(0, 1), padding="valid"),
    "conv1d_padding_same_dilated": lambda L: F.conv1d(L["x1"], L["w1"].transpose(0, 1), padding="same", dilation=2),
    # output padding past what the stride alone covers: the input gradient is cropped to the input
    "conv_transpose2d_output_padding_dilated": lambda L: F.conv_transpose2d(
        L["x2"][:, :2, :4, :4], L["wt2"], L["gb"], stride=(3, 2), padding=(1, 2),
        output_padding=(2, 3), groups=2, dilation=(4, 4)),
    "conv_transpose3d_output_padding_dilated": lambda L: F.conv_transpose3d(
        L["x3"][:, :2, :3, :3, :3], L["wt3"], None, stride=(3, 2, 1),
        padding=(1, 0, 2), output_padding=(0, 1, 2), groups=2, dilation=(3, 2, 3)),
    # native_group_norm's mean and rstd outputs have gradients too (PyTorch's composite backward then)
    "native_group_norm_all_outputs": lambda L: _flat(*torch.native_group_norm(L["x2"], L["gw"], L["gb"], 2, 4, 42, 2,
                                                                              1e-5)),
    "native_group_norm_all_outputs_no_affine": lambda L: _flat(*torch.native_group_norm(L["x1"], None, None, 2, 4, 9,
                                                                                        4, 0.5)),
    "native_group_norm_rstd_only": lambda L: _flat(*torch.native_group_norm(L["x1"], L["gw"], None, 2, 4, 9, 2,
                                                                            1e-5)[::2]),
    "group_norm_empty_batch": lambda L: F.group_norm(L["x2"][:0], 2, L["gw"], L["gb"]),
    "native_group_norm_empty_batch": lambda L: _flat(*torch.native_group_norm(L["x1"][:0], L["gw"], L["gb"], 0, 4, 9,
                                                                              1, 1e-5)),
    # far from zero with few elements per group or row: the kernel's terms cancel, so its order and its fused
    # multiply-adds show
    "group_norm_shifted": lambda L: F.group_norm(L["x2"] + 100.0, 2, L["gw"], L["gb"]),
    "group_norm_shifted_two_per_group": lambda L: F.group_norm(L["x1"][:, :, :2] + 100.0, 4, L["gw"], L["gb"]),
    "group_norm_one_per_group": lambda L: F.group_norm(L["x1"][:, :, :1] + 3.0, 2, L["gw"], L["gb"]),
    "group_norm_shifted_wide_groups": lambda L: F.group_norm(L["x3"].reshape(2, 8, 2, 5, 6)[:, :, 0] * 3 + 50.0, 1,
                                                             L["psw"]),
    "layer_norm_shifted": lambda L: F.layer_norm(L["x2"] + 100.0, (6,), L["gw"].repeat(2)[:6], L["b6"]),
    "layer_norm_shifted_two_per_row": lambda L: F.layer_norm(L["x2"][..., :2] + 100.0, (2,), L["gw"][:2], L["gb"][:2]),
    "layer_norm_shifted_no_affine": lambda L: F.layer_norm(L["x2"] * 2 + 30.0, (7, 6)),
    "layer_norm_one_element": lambda L: F.layer_norm(L["x2"][..., :1], (1,), L["gw"][:1], L["gb"][:1]),
    "native_layer_norm_all_outputs": lambda L: _flat(*torch.native_layer_norm(L["x2"], (6,), L["b6"], None, 1e-5)),
    "batch_norm_shifted": lambda L: F.batch_norm(L["x2"] + 100.0, None, None, L["gw"], L["gb"], training=True),
    "batch_norm_eval_shifted": lambda L: F.batch_norm(L["x2"] + 10.0, torch.linspace(9, 11, 4, dtype=D),
                                                      torch.linspace(0.5, 2, 4, dtype=D), L["gw"], L["gb"]),
    "native_batch_norm_legit": lambda L: _aten._native_batch_norm_legit(
        L["x2"], L["gw"], L["gb"], torch.zeros(4, dtype=D), torch.ones(4, dtype=D), True, 0.1, 1e-5)[0],
    "native_batch_norm_legit_eval": lambda L: _aten._native_batch_norm_legit(
        L["x2"], L["gw"], None, torch.linspace(-1, 1, 4, dtype=D), torch.linspace(1, 2, 4, dtype=D), False, 0.1,
        1e-5)[0],
    "native_batch_norm_legit_no_stats": lambda L: _aten._native_batch_norm_legit(L["x1"], None, L["gb"], True, 0.1,
                                                                                 1e-3)[0],
    "native_batch_norm_legit_no_training": lambda L: _aten._native_batch_norm_legit_no_training(
        L["x2"], L["gw"], L["gb"], torch.linspace(-1, 1, 4, dtype=D), torch.linspace(1, 2, 4, dtype=D), 0.1,
        1e-5)[0],
    "batch_norm_with_update": lambda L: _aten._batch_norm_with_update(
        L["x2"], L["gw"], L["gb"], torch.zeros(4, dtype=D), torch.ones(4, dtype=D), 0.1, 1e-5)[0],
    "batch_norm_with_update_2d_no_bias": lambda L: _aten._batch_norm_with_update(
        L["x1"][:, :, 0] + 5.0, L["gw"], None, torch.zeros(4, dtype=D), torch.ones(4, dtype=D), 0.1, 1e-5)[0],
    "batch_norm_no_update": lambda L: _aten._batch_norm_no_update(
        L["x3"], L["gw"], L["gb"], torch.linspace(-1, 1, 4, dtype=D), torch.linspace(1, 2, 4, dtype=D), 0.1,
        1e-5)[0],
    # a negative divisor_override is saved as uint64
    "avg_pool2d_negative_divisor": lambda L: F.avg_pool2d(L["x2"], 2, divisor_override=-2),
    "avg_pool3d_negative_divisor": lambda L: F.avg_pool3d(L["x3"], (2, 2, 3), (2, 2, 1), divisor_override=-3),
    "fractional_max_pool3d_empty_batch": lambda L: F.fractional_max_pool3d(
        L["x3"][:0], 2, output_size=2, _random_samples=torch.full((0, 4, 3), 0.5, dtype=D)),
    "fractional_max_pool2d_empty_batch": lambda L: F.fractional_max_pool2d(
        L["x2"][:0], 2, output_size=(3, 2), _random_samples=torch.full((0, 4, 2), 0.5, dtype=D)),
    "max_pool2d_empty_batch": lambda L: F.max_pool2d(L["x2"][:0], 2),
    # dropout's backward differentiated (grad_output a leaf): NativeDropoutBackwardBackward0
    "native_dropout_backward": lambda L: _aten.native_dropout_backward(L["x2"], L["x2u"][None] > 0, 1.5),
})

@pytest.mark.parametrize("case", sorted(CONV))
def test_conv_rule_matches_pytorch(case):
    L = leaves()
    check(weigh(CONV[case](L)), L)


def test_batch_norm_follows_pytorchs_cpu_kernel():
    """Two elements per channel: dx is rounding noise around zero, PyTorch's kernel's order
    ((g - sum/m - (x - mean) k) invstd w, fused) gives PyTorch's noise; the textbook form another one."""
    x = torch.tensor([[[3.0836579789629237, 3.8965755003643205]]], dtype=D, requires_grad=True)
    w = torch.tensor([2.203824123451556], dtype=D, requires_grad=True)
    g = torch.tensor([[[-1.4043285465488287, -2.656944947302302]]], dtype=D)
    check((F.batch_norm(x, None, None, w, None, training=True) * g).sum(), {"x": x, "w": w})

def test_transposed_convolution_is_no_longer_opaque():
    L = leaves()
    names = check(weigh(CONV["conv_transpose2d"](L)), L, expect_names=("ConvolutionBackward0",))
    assert "opaque" not in names


DOUBLE = {
    "conv2d": (lambda x, w: F.conv2d(x, w, stride=2, padding=1).tanh(), (2, 3, 7, 6), (4, 3, 3, 2)),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, groups=2, padding=(0, 1)).tanh(), (2, 4, 7, 6), (4, 2, 3, 2)),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1).sigmoid(),
                         (2, 4, 5, 6), (4, 3, 3, 2)),
    "conv_transpose2d_groups_dilated": (lambda x, w: F.conv_transpose2d(x, w, stride=(1, 2), dilation=2,
                                                                        groups=2).sigmoid(),
                                        (2, 4, 5, 6), (4, 1, 2, 2)),
    "conv1d_dilated": (lambda x, w: F.conv1d(x, w, padding=2, dilation=2).tanh(), (2, 3, 9), (4, 3, 3)),
    "conv3d": (lambda x, w: F.conv3d(x, w, stride=(1, 2, 1)).tanh(), (1, 2, 4, 5, 3), (3, 2, 2, 2, 2)),
    "max_pool2d": (lambda x, w: F.max_pool2d(F.conv2d(x, w), 2, ceil_mode=True) ** 2, (2, 3, 7, 6), (4, 3, 3, 2)),
    "max_pool3d": (lambda x, w: F.max_pool3d(F.conv3d(x, w), 2) ** 2, (1, 2, 5, 5, 4), (3, 2, 2, 2, 2)),
    "adaptive_max_pool2d": (lambda x, w: F.adaptive_max_pool2d(F.conv2d(x, w), (2, 3)) ** 2, (2, 3, 7, 6),
                            (4, 3, 3, 2)),
    "avg_pool2d": (lambda x, w: F.avg_pool2d(F.conv2d(x, w), 2, ceil_mode=True, padding=1) ** 2, (2, 3, 7, 6),
                   (4, 3, 3, 2)),
    "adaptive_avg_pool2d": (lambda x, w: F.adaptive_avg_pool2d(F.conv2d(x, w), (3, 2)) ** 2, (2, 3, 7, 6),
                            (4, 3, 3, 2)),
    "upsample_nearest": (lambda x, w: F.interpolate(F.conv2d(x, w), scale_factor=2) ** 2, (2, 3, 7, 6),
                         (4, 3, 3, 2)),
    "upsample_bilinear": (lambda x, w: F.interpolate(F.conv2d(x, w), size=(7, 9), mode="bilinear") ** 2,
                          (2, 3, 7, 6), (4, 3, 3, 2)),
    "upsample_bicubic_align": (lambda x, w: F.interpolate(F.conv2d(x, w), size=(6, 4), mode="bicubic",
                                                          align_corners=True) ** 2, (2, 3, 7, 6), (4, 3, 3, 2)),
    "upsample_nearest1d_linear1d": (lambda x, w: F.interpolate(F.conv1d(x, w), size=9)
                                    * F.interpolate(F.conv1d(x, w), size=9, mode="linear") ** 2,
                                    (2, 3, 7), (4, 3, 3)),
    "upsample_nearest3d_trilinear": (lambda x, w: F.interpolate(F.conv3d(x, w), scale_factor=2) ** 2
                                     + F.interpolate(F.conv3d(x, w), size=(3, 5, 4), mode="trilinear").pow(2).sum(),
                                     (1, 2, 4, 5, 3), (3, 2, 2, 2, 2)),
    "upsample_nearest_exact": (lambda x, w: F.interpolate(F.conv1d(x, w), size=8, mode="nearest-exact") ** 2,
                               (2, 3, 7), (4, 3, 3)),
    "upsample_nearest_exact2d": (lambda x, w: F.interpolate(F.conv2d(x, w), size=(8, 3), mode="nearest-exact") ** 2,
                                 (2, 3, 7, 6), (4, 3, 3, 2)),
    "upsample_nearest_exact3d": (lambda x, w: F.interpolate(F.conv3d(x, w), size=(4, 5, 2), mode="nearest-exact") ** 2,
                                 (1, 2, 4, 5, 3), (3, 2, 2, 2, 2)),
    "pools_3d": (lambda x, w: F.avg_pool3d(F.conv3d(x, w), 2, ceil_mode=True) ** 2
                 + F.adaptive_avg_pool3d(F.conv3d(x, w), (2, 3, 1)).pow(2).sum()
                 + F.adaptive_max_pool3d(F.conv3d(x, w), (2, 2, 1)).pow(2).sum(),
                 (1, 2, 4, 5, 3), (3, 2, 2, 2, 2)),
    "pads_1d": (lambda x, w: F.pad(F.conv1d(x, w), (2, 1), mode="reflect") ** 2
                + F.pad(F.conv1d(x, w), (0, 3), mode="replicate").pow(2).sum(), (2, 3, 7), (4, 3, 3)),
    "pads_3d": (lambda x, w: F.pad(F.conv3d(x, w), (1, 0, 1, 1, 0, 1), mode="reflect") ** 2
                + F.pad(F.conv3d(x, w), (0, 2, 1, 0, 1, 0), mode="replicate").pow(2).sum(),
                (1, 2, 4, 5, 3), (3, 2, 2, 2, 2)),
    "resize_antialias": (lambda x, w: F.interpolate(F.conv2d(x, w), size=(3, 2), mode="bilinear", antialias=True) ** 2
                         + F.interpolate(F.conv2d(x, w), size=(2, 3), mode="bicubic", antialias=True).pow(2).sum(),
                         (2, 3, 7, 6), (4, 3, 3, 2)),
    "reflection_pad": (lambda x, w: F.pad(F.conv2d(x, w), (1, 1, 2, 0), mode="reflect") ** 2, (2, 3, 7, 6),
                       (4, 3, 3, 2)),
    "replication_pad": (lambda x, w: F.pad(F.conv2d(x, w), (1, 1, 2, 0), mode="replicate") ** 2, (2, 3, 7, 6),
                        (4, 3, 3, 2)),
    # output padding past the stride's reach: the double backward's input gradient is cropped too
    "conv_transpose2d_output_padding_dilated": (lambda x, w: F.conv_transpose2d(
        x, w, stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=(4, 4)).sigmoid(),
        (2, 2, 4, 4), (2, 2, 4, 5)),
}


@pytest.mark.parametrize("case", sorted(DOUBLE))
def test_double_backward_matches_pytorch(case):
    f, xs, ws = DOUBLE[case]
    x, w = leaf(*xs, seed=40), leaf(*ws, seed=41)
    check(grad_penalty(f, x, w), {"x": x, "w": w})


def test_small_cnn_with_upsampling_and_group_norm():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8), torch.nn.SiLU(),
        torch.nn.ConvTranspose2d(8, 4, 2, stride=2), torch.nn.Hardswish(), torch.nn.Upsample(scale_factor=0.5,
                                                                                             mode="bilinear"),
        torch.nn.ReflectionPad2d(1), torch.nn.Conv2d(4, 4, 3, groups=2), torch.nn.AdaptiveAvgPool2d((2, 2)),
        torch.nn.Flatten(), torch.nn.Linear(16, 3)).double()
    x = leaf(2, 3, 8, 8, seed=50)
    params = {n.replace(".", "_"): p for n, p in net.named_parameters()}
    out = F.cross_entropy(net(x), torch.tensor([0, 2]))
    check(out, {"x": x, **params})


def test_conv_double_backward_with_bias():
    """The bias's first-order gradient feeds the penalty too: ConvolutionBackwardBackward0 gets all three inputs."""
    x, w, b = leaf(2, 3, 6, 5, seed=60), leaf(4, 3, 2, 2, seed=61), leaf(4, seed=62)
    out = grad_penalty(lambda x, w, b: F.conv2d(x, w, b, padding=1).tanh(), x, w, b)
    check(out, {"x": x, "w": w, "b": b}, expect_names=("ConvolutionBackwardBackward0",))


def test_embedding_bag_scale_grad_by_freq_follows_embedding():
    """With unequal counts, the rule scales as documented (and as F.embedding does), not as PyTorch's CPU bag kernel."""
    import numpy as np

    from torch_helpers import capture, our_order
    idx, offsets = torch.tensor([0, 2, 1, 3, 3, 6, 2, 0]), torch.tensor([0, 3, 6])
    e = leaf(7, 3, seed=63)
    g = torch.randn(3, 3, dtype=D, generator=torch.Generator().manual_seed(1))
    out = (F.embedding_bag(idx, e, offsets, mode="sum", scale_grad_by_freq=True) * g).sum()
    _, res, _ = our_order(capture([out], leaves={"e": e}))
    e2 = leaf(7, 3, seed=63)
    rows = F.embedding(idx, e2, scale_grad_by_freq=True)
    bags = torch.stack([rows[0:3].sum(0), rows[3:6].sum(0), rows[6:].sum(0)])
    (bags * g).sum().backward()
    np.testing.assert_allclose(res.grads["e"], e2.grad.numpy(), rtol=1e-12)


NORM_DOUBLE = {
    "batch_norm_train": lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True).tanh(),
    "batch_norm_train_no_affine": lambda x, w, b: F.batch_norm(x, None, None, training=True).sigmoid() * w.sum(),
    "batch_norm_eval": lambda x, w, b: F.batch_norm(x, torch.linspace(-0.5, 0.5, 3, dtype=D),
                                                    torch.linspace(0.5, 2.0, 3, dtype=D), w, b, training=False).tanh(),
    "layer_norm": lambda x, w, b: F.layer_norm(x.transpose(1, 3), (3,), w, b).tanh(),
    "layer_norm_2d_no_affine": lambda x, w, b: F.layer_norm(x, (6, 3)).sigmoid() * b.sum(),
    "layer_norm_weight_only": lambda x, w, b: F.layer_norm(x.transpose(1, 3), (3,), w).tanh(),
}


@pytest.mark.parametrize("case", sorted(NORM_DOUBLE))
def test_norm_double_backward_matches_pytorch(case):
    x, w, b = leaf(2, 3, 6, 3, seed=70), leaf(3, seed=71), leaf(3, seed=72)
    check(grad_penalty(NORM_DOUBLE[case], x, w, b), {"x": x, "w": w, "b": b})
