"""New backward rules (elementwise, activations, products and norms, losses, double backward) against PyTorch.

Each case builds a small float64 forward in PyTorch, captures its
backward graph, replays it here and compares the executed order and every
leaf gradient with PyTorch's (rtol 1e-6). Inputs include ties and
boundary values where a rule has a case split.
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, grad_penalty, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch

aten = torch.ops.aten
#: Zeros at a few positions (exact zeros with a gradient edge, without indexing ops).
_ZMASK = (torch.arange(60).reshape(4, 3, 5) % 7 != 3).to(D)
#: -inf on some entries and on whole rows (attention masks).
_MASK_ROWS = torch.zeros(4, 3, 5, dtype=D)
_MASK_ROWS[0, 1] = float("-inf")
_MASK_ROWS[2, :, 1:3] = float("-inf")


def leaves():
    L = {"a": leaf(4, 3, 5), "b": leaf(3, 5, seed=1), "p": leaf(4, 3, 5, positive=True, seed=2),
         "u": leaf(4, 3, 5, seed=3, low=-0.9, high=0.9), "q": leaf(4, 3, 5, seed=4, low=0.05, high=0.95),
         "m": leaf(5, 4, seed=5), "v": leaf(4, seed=6), "w": leaf(4, seed=7), "x": leaf(2, 3, 4, seed=8),
         "c": leaf(4, 3, 5, seed=9)}
    # Exact ties and boundary values for the rules with case splits.
    with torch.no_grad():
        L["t"] = torch.tensor([[-3.0, -1.0, 0.0, 1.0, 3.0, 6.0], [-0.5, 0.5, 2.0, -2.0, 0.25, 1.5]],
                              dtype=D).requires_grad_(True)
        L["t2"] = torch.tensor([[-3.0, 0.0, 0.0, 2.0, 3.0, 6.0], [0.5, 0.5, -2.0, -2.0, 1.0, 1.5]],
                               dtype=D).requires_grad_(True)
        L["lo"] = torch.tensor([0.0, 0.0, -1.0, 2.0, 4.0, 1.0], dtype=D).requires_grad_(True)
        L["hi"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 1.5], dtype=D).requires_grad_(True)
    return L


ELEMENTWISE = {
    "add_scalar_aten": lambda L: aten.add.Scalar(L["a"], 2.5),
    "sub_scalar_aten": lambda L: aten.sub.Scalar(L["a"], 2.5, alpha=2),
    "mul_scalar_aten": lambda L: aten.mul.Scalar(L["a"], -1.5),
    "div_scalar_aten": lambda L: aten.div.Scalar(L["a"], 4.0),
    "div_scalar_mode": lambda L: torch.div(L["a"], 2, rounding_mode="floor") + L["a"],
    "div_scalar_mode_aten": lambda L: aten.div.Scalar_mode(L["a"], 2.0, rounding_mode="trunc") + aten.div.Scalar_mode(
        L["a"], 3.0, rounding_mode=None),
    "div_tensor_floor": lambda L: torch.div(L["a"], L["p"], rounding_mode="floor") + L["a"] * L["p"],
    "div_tensor_trunc_bcast": lambda L: torch.div(L["a"], L["b"], rounding_mode="trunc") * 0 + L["b"] / L["p"],
    "rsub_tensor": lambda L: torch.rsub(L["a"], L["b"], alpha=0.5),
    "minimum_ties": lambda L: torch.minimum(L["t"], L["t2"]),
    "maximum_bcast": lambda L: torch.maximum(L["a"], L["b"]),
    "maximum_ties": lambda L: torch.maximum(L["t"], L["t2"]),
    "fmax_fmin": lambda L: torch.fmax(L["t"], L["t2"]) + 2 * torch.fmin(L["t"], L["t2"]),
    "pow_tensor": lambda L: L["p"] ** L["a"],
    "pow_tensor_bcast_zero": lambda L: (L["p"] * _ZMASK) ** (L["p"][0] * _ZMASK[0]),
    "pow_scalar_base": lambda L: 2.5 ** L["a"],
    "pow_scalar_base_zero": lambda L: 0.0 ** L["p"],
    "pow_scalar_fractional": lambda L: L["p"] ** 0.5 + L["p"] ** -1.5,
    "pow_zero_exponent": lambda L: L["a"] ** 0 + L["a"],
    "atan2": lambda L: torch.atan2(L["a"], L["b"]),
    "reciprocal": lambda L: L["p"].reciprocal(),
    "rdiv": lambda L: 3.0 / L["p"],
    "expm1_log1p": lambda L: L["a"].expm1() + L["p"].log1p(),
    "exp2": lambda L: L["a"].exp2(),
    "log2_log10": lambda L: L["p"].log2() + 3 * L["p"].log10(),
    "tan": lambda L: L["u"].tan(),
    "asin_acos_atan": lambda L: L["u"].asin() + 2 * L["u"].acos() + 3 * L["a"].atan(),
    "sinh_cosh": lambda L: L["a"].sinh() + 2 * L["a"].cosh(),
    "asinh_acosh_atanh": lambda L: L["a"].asinh() + (L["p"] + 1).acosh() + L["u"].atanh(),
    "erf_erfc": lambda L: L["a"].erf() + 2 * L["a"].erfc(),
    "erfinv": lambda L: L["u"].erfinv(),
    "sign_floor_ceil_round": lambda L: L["a"].sign() + L["a"].floor() + L["a"].ceil() + L["a"].round() + L["a"].trunc()
    + L["a"].round(decimals=1) + L["a"],
    "frac": lambda L: (3 * L["a"]).frac(),
    "lerp_scalar": lambda L: torch.lerp(L["a"], L["b"], 0.3),
    "lerp_tensor": lambda L: torch.lerp(L["a"], L["c"], L["q"]),
    "lerp_tensor_bcast": lambda L: torch.lerp(L["b"], L["a"], L["q"][0]),
    "addcmul": lambda L: torch.addcmul(L["a"], L["b"], L["c"], value=0.5),
    "addcdiv": lambda L: torch.addcdiv(L["a"], L["c"], L["p"], value=-2.0),
    "addcdiv_bcast": lambda L: torch.addcdiv(L["b"], L["a"], L["p"]),
    "fmod_remainder_scalar": lambda L: torch.fmod(L["a"], 0.7) + torch.remainder(L["a"], 0.7),
    "fmod_tensor": lambda L: torch.fmod(L["a"], L["p"]),
    "remainder_tensor": lambda L: torch.remainder(L["a"], L["p"]),
    "square": lambda L: L["a"].square(),
    "xlogy": lambda L: torch.xlogy(L["q"], L["p"]),
    "xlogy_zero_self": lambda L: torch.xlogy(L["q"] * _ZMASK, L["c"] * _ZMASK),
    "xlogy_scalar_self": lambda L: torch.xlogy(2.0, L["p"]),
    "xlogy_scalar_other": lambda L: torch.xlogy(L["q"], 3.0),
    "xlogy_scalar_other_neg": lambda L: torch.xlogy(L["q"] * 0, -1.0) + torch.xlogy(L["q"], 0.5),
    "logit": lambda L: torch.logit(L["q"]),
    "logit_eps": lambda L: torch.logit(L["t"] / 4 + 0.5, eps=0.2),
    "hypot": lambda L: torch.hypot(L["a"], L["b"]),
    "logaddexp": lambda L: torch.logaddexp(L["a"], L["b"]) + torch.logaddexp2(L["a"], L["c"]),
    "copysign": lambda L: torch.copysign(L["a"], L["c"]) + torch.copysign(L["a"], -1.0),
    "nan_to_num": lambda L: torch.nan_to_num(L["a"]),
    "deg_rad": lambda L: torch.deg2rad(L["a"]) + torch.rad2deg(L["a"]),
    "sinc": lambda L: torch.sinc(torch.cat([L["a"].flatten(), L["t"].flatten()])),
    "lgamma_digamma": lambda L: L["p"].lgamma() + L["p"].digamma() + (L["a"] - 0.3).lgamma(),
    "clamp_min_scalar": lambda L: torch.clamp_min(L["t"], 0.0),
    "clamp_max_scalar": lambda L: torch.clamp_max(L["t"], 1.0),
    "clamp_min_tensor": lambda L: torch.clamp_min(L["t"], L["lo"]),
    "clamp_max_tensor": lambda L: torch.clamp_max(L["t"], L["hi"]),
    "clamp_tensor_both": lambda L: torch.clamp(L["t"], L["lo"], L["hi"]),
    "clamp_tensor_min_only": lambda L: torch.clamp(L["t"], min=L["lo"]),
    "clamp_tensor_max_only": lambda L: torch.clamp(L["t"], max=L["hi"]),
    "clamp_scalar_ties": lambda L: L["t"].clamp(-1.0, 1.0),
    "where_bcast": lambda L: torch.where(L["a"] > 0, L["b"], L["p"]),
}

ACTIVATIONS = {
    "relu6": lambda L: F.relu6(L["t"] * 2),
    "hardtanh": lambda L: F.hardtanh(L["t"], -1.0, 3.0),
    "logsigmoid": lambda L: F.logsigmoid(torch.cat([L["a"].flatten(), 40 * L["b"].flatten()])),
    "softplus": lambda L: F.softplus(L["a"] * 10, beta=0.5, threshold=3),
    "softplus_default": lambda L: F.softplus(L["a"]),
    "elu": lambda L: F.elu(L["a"], 0.7),
    "selu": lambda L: F.selu(L["a"]),
    "celu": lambda L: F.celu(L["a"], 0.5),
    "elu_inplace": lambda L: F.elu(L["a"] * 1, 0.7, inplace=True),
    "selu_inplace": lambda L: F.selu(L["a"] * 1, inplace=True),
    "celu_inplace": lambda L: F.celu(L["a"] * 1, 0.5, inplace=True),
    "leaky_relu_inplace": lambda L: F.leaky_relu(L["a"] * 1, 0.2, inplace=True),
    "hardswish_ties": lambda L: F.hardswish(L["t"]),
    "hardswish": lambda L: F.hardswish(L["a"] * 3),
    "hardsigmoid_ties": lambda L: F.hardsigmoid(L["t"]),
    "mish": lambda L: F.mish(L["a"] * 3),
    "prelu_shared": lambda L: F.prelu(L["a"], L["w"][:1]),
    "prelu_channels": lambda L: F.prelu(L["x"].reshape(2, 4, 3), L["w"]),
    "prelu_module_zero": lambda L: F.prelu(L["t"].reshape(2, 6, 1), torch.cat([L["w"], L["w"][:2]])),
    "glu_last": lambda L: F.glu(L["m"], -1),
    "glu_dim0": lambda L: F.glu(L["x"], 0),
    "hardshrink_softshrink": lambda L: F.hardshrink(L["a"], 0.3) + F.softshrink(L["a"], 0.6),
    "threshold": lambda L: F.threshold(L["t"], 0.5, 7.0),
    "threshold_inplace": lambda L: F.threshold(L["t"] * 1, 0.5, 7.0, inplace=True),
    "rrelu_eval": lambda L: F.rrelu(L["a"], 0.1, 0.3, training=False),
    "rrelu_noise": lambda L: aten.rrelu_with_noise(L["a"], torch.full((4, 3, 5), 0.2, dtype=D), 0.1, 0.3, True),
    "softmin": lambda L: F.softmin(L["a"], dim=0),
    "safe_softmax_masked_rows": lambda L: aten._safe_softmax(L["a"] + _MASK_ROWS, -1),
    "tanhshrink_softsign": lambda L: F.tanhshrink(L["a"]) + F.softsign(L["a"]),
}

PRODUCTS = {
    "mv": lambda L: L["m"].mv(L["v"]),
    "matmul_mv": lambda L: L["m"] @ L["v"],
    "dot": lambda L: torch.dot(L["v"], L["w"]),
    "dot_self": lambda L: L["v"] @ L["v"],
    "vdot": lambda L: torch.vdot(L["v"], L["w"]),
    "outer": lambda L: torch.outer(L["v"], L["w"]),
    "vector_norm_2": lambda L: torch.linalg.vector_norm(L["a"], dim=-1),
    "vector_norm_1_keepdim": lambda L: torch.linalg.vector_norm(L["a"], 1, dim=(0, 2), keepdim=True),
    "vector_norm_inf": lambda L: torch.linalg.vector_norm(L["a"], float("inf"), dim=1),
    "vector_norm_inf_ties": lambda L: torch.linalg.vector_norm(L["t2"], float("inf"), dim=1),
    "vector_norm_neg_inf": lambda L: torch.linalg.vector_norm(L["a"], float("-inf")),
    "vector_norm_3": lambda L: torch.linalg.vector_norm(L["a"], 3, dim=-2),
    "vector_norm_1_5": lambda L: torch.linalg.vector_norm(L["a"], 1.5),
    "vector_norm_0_5": lambda L: torch.linalg.vector_norm(L["a"], 0.5, dim=0),
    "vector_norm_0": lambda L: torch.linalg.vector_norm(L["a"], 0, dim=0) * 0 + L["a"].sum(),
    "vector_norm_zero_row": lambda L: torch.linalg.vector_norm(L["t"] * torch.tensor([[0.0], [1.0]], dtype=D), dim=1),
    "norm_fro": lambda L: L["x"].norm(),
    "norm_dim_p": lambda L: torch.norm(L["x"], p=3, dim=1),
    "norm_scalar_aten": lambda L: aten.norm.Scalar(L["x"], 3) * aten.norm.ScalarOpt_dtype(L["x"], 1.5, dtype=D),
    "norm_dim_dtype_aten": lambda L: aten.norm.ScalarOpt_dim_dtype(L["x"], 4, [-1, 0], True, dtype=D),
    "norm_dim_default_p_aten": lambda L: aten.norm.ScalarOpt_dim(L["x"], None, [1]),
    "normalize": lambda L: F.normalize(L["a"], dim=1),
    "cosine_similarity": lambda L: F.cosine_similarity(L["a"], L["c"], dim=-1),
    "pairwise_distance": lambda L: F.pairwise_distance(L["m"], L["m"].detach() * 0.5 + 0.1, p=3),
    "dist": lambda L: torch.dist(L["a"], L["c"], 3),
    "dist_2": lambda L: torch.dist(L["a"], L["b"]),
}


def _t(*vals):
    return torch.tensor(vals)


LOSSES = {
    "bce_logits": lambda L: F.binary_cross_entropy_with_logits(L["a"], L["q"].detach()),
    "bce_logits_target_grad": lambda L: F.binary_cross_entropy_with_logits(L["a"], L["q"]),
    "bce_logits_weight_posweight": lambda L: F.binary_cross_entropy_with_logits(
        L["a"], L["q"], weight=torch.rand(5, dtype=D), pos_weight=torch.rand(5, dtype=D) + 0.5),
    "bce_logits_sum": lambda L: F.binary_cross_entropy_with_logits(L["a"] * 20, L["q"], reduction="sum",
                                                                    pos_weight=torch.full((5,), 2.0, dtype=D)),
    "bce_logits_none": lambda L: F.binary_cross_entropy_with_logits(L["a"], L["q"], reduction="none"),
    "bce": lambda L: F.binary_cross_entropy(L["q"], torch.rand(4, 3, 5, dtype=D)),
    "bce_target_weight_sum": lambda L: F.binary_cross_entropy(L["q"], 1 - L["q"] ** 2, weight=torch.rand(3, 5, dtype=D),
                                                              reduction="sum"),
    "bce_none": lambda L: F.binary_cross_entropy(torch.sigmoid(L["a"]), L["q"], reduction="none"),
    "smooth_l1": lambda L: F.smooth_l1_loss(L["a"], L["c"], beta=0.5),
    "smooth_l1_target_none": lambda L: F.smooth_l1_loss(L["a"], L["b"].expand(4, 3, 5), reduction="none"),
    "smooth_l1_beta0_sum": lambda L: F.smooth_l1_loss(L["a"], L["c"], beta=0.0, reduction="sum"),
    "huber": lambda L: F.huber_loss(L["a"], L["c"], delta=0.5),
    "huber_sum": lambda L: F.huber_loss(L["a"] * 3, L["c"], delta=2.0, reduction="sum"),
    "huber_none": lambda L: F.huber_loss(L["a"], L["c"], reduction="none"),
    "l1": lambda L: F.l1_loss(L["a"], L["c"]),
    "kl_div_batchmean": lambda L: F.kl_div(torch.log_softmax(L["m"], 1), torch.softmax(L["m"].detach() * 2, 1),
                                           reduction="batchmean"),
    "kl_div_log_target": lambda L: F.kl_div(L["a"], L["c"], reduction="sum", log_target=True),
    "soft_margin": lambda L: F.soft_margin_loss(L["a"], torch.sign(L["c"].detach())),
    "soft_margin_none": lambda L: F.soft_margin_loss(L["a"], torch.sign(L["c"].detach()), reduction="none"),
    "multi_margin": lambda L: F.multi_margin_loss(L["m"], _t(0, 3, 1, 1, 2)),
    "multi_margin_p2_weight": lambda L: F.multi_margin_loss(L["m"], _t(0, 3, 1, 1, 2), p=2, margin=0.7,
                                                            weight=torch.rand(4, dtype=D)),
    "multi_margin_none": lambda L: F.multi_margin_loss(L["m"], _t(0, 3, 1, 1, 2), reduction="none"),
    "multi_margin_sum_1d": lambda L: F.multi_margin_loss(L["v"], _t(2), reduction="sum"),
    "cross_entropy_probs": lambda L: F.cross_entropy(L["m"], torch.softmax(L["m"].detach(), 1)),
    "poisson_nll": lambda L: F.poisson_nll_loss(L["a"], L["p"].detach()),
    "gaussian_nll": lambda L: F.gaussian_nll_loss(L["a"], L["c"], L["p"]),
    "hinge_embedding": lambda L: F.hinge_embedding_loss(L["a"], torch.sign(L["c"].detach())),
    "triplet_margin": lambda L: F.triplet_margin_loss(L["m"], L["m"].detach() * 0.5, L["m"].detach().flip(0)),
    "cosine_embedding": lambda L: F.cosine_embedding_loss(L["m"], L["m"].detach().flip(0), _t(1, -1, 1, -1, 1)),
    "cross_entropy_2d": lambda L: F.cross_entropy(L["x"].reshape(1, 2, 3, 4), torch.tensor([[[0, 1, 1, 0]] * 3])),
    "multilabel_soft_margin": lambda L: F.multilabel_soft_margin_loss(L["m"], (L["m"].detach() > 0).double()),
}

ALL = {**{f"ew_{k}": v for k, v in ELEMENTWISE.items()}, **{f"act_{k}": v for k, v in ACTIVATIONS.items()},
       **{f"prod_{k}": v for k, v in PRODUCTS.items()}, **{f"loss_{k}": v for k, v in LOSSES.items()}}


@pytest.mark.parametrize("case", sorted(ALL))
def test_rule_matches_pytorch(case):
    L = leaves()
    check(weigh(ALL[case](L)), L)


def _w(*shape, seed=21):
    return leaf(*shape, seed=seed)


DOUBLE = {
    "tanh": lambda x, W: torch.tanh(x @ W),
    "sigmoid": lambda x, W: torch.sigmoid(x @ W),
    "relu": lambda x, W: torch.relu(x @ W),
    "softmax": lambda x, W: torch.softmax(x @ W, -1) * torch.arange(5.0, dtype=D),
    "log_softmax": lambda x, W: torch.log_softmax(x @ W, 0) * torch.arange(5.0, dtype=D),
    "gelu": lambda x, W: F.gelu(x @ W),
    "gelu_tanh": lambda x, W: F.gelu(x @ W, approximate="tanh"),
    "silu": lambda x, W: F.silu(x @ W),
    "elu": lambda x, W: F.elu(x @ W, 0.8),
    "selu": lambda x, W: F.selu(x @ W),
    "elu_inplace": lambda x, W: F.elu(x @ W, 0.8, inplace=True),
    "leaky_relu": lambda x, W: F.leaky_relu(x @ W, 0.1) ** 2,
    "softplus": lambda x, W: F.softplus(x @ W, beta=2, threshold=2),
    "hardtanh": lambda x, W: F.hardtanh(x @ W) ** 2,
    "logsigmoid": lambda x, W: F.logsigmoid(x @ W),
    "mish": lambda x, W: F.mish(x @ W),
    "prelu": lambda x, W: F.prelu(x @ W, W.sum().reshape(1)) ** 2,
    "mse": lambda x, W: F.mse_loss(x @ W, torch.linspace(-1, 1, 15, dtype=D).reshape(3, 5)),
    "mse_none": lambda x, W: F.mse_loss(x @ W, (x @ W).flatten().cos().reshape(3, 5), reduction="none"),
    "smooth_l1": lambda x, W: F.smooth_l1_loss(x @ W, (x @ W).flatten().sin().reshape(3, 5), beta=0.8),
    "huber": lambda x, W: F.huber_loss(x @ W, (x @ W).flatten().sin().reshape(3, 5), delta=0.8, reduction="sum"),
    "cross_entropy": lambda x, W: F.cross_entropy(x @ W, torch.tensor([0, 4, 2])),
    "nll_weighted": lambda x, W: F.nll_loss(torch.log_softmax(x @ W, 1), torch.tensor([0, 4, -100]),
                                            weight=torch.linspace(0.5, 1.5, 5, dtype=D)),
    "exp_sin": lambda x, W: (x @ W).exp() * (x @ W).sin(),
    "hardswish": lambda x, W: F.hardswish(x @ W * 3),
    "hardshrink_softshrink": lambda x, W: F.hardshrink(x @ W) ** 2 + F.softshrink(x @ W, 0.3) ** 2,
    "rrelu_eval": lambda x, W: F.rrelu(x @ W, 0.1, 0.3) ** 2,
    "rrelu_noise": lambda x, W: aten.rrelu_with_noise(x @ W, torch.full((3, 5), 0.2, dtype=D), 0.1, 0.3, True) ** 2,
    "glu": lambda x, W: F.glu(torch.cat([x @ W, (x @ W).sin()], 1), 1),
    "glu_dim0": lambda x, W: F.glu(torch.cat([x @ W, (x @ W).cos() * 2], 0), 0),
    "soft_margin": lambda x, W: F.soft_margin_loss(x @ W, torch.sign((x @ W).detach()) * -1),
    "soft_margin_none": lambda x, W: F.soft_margin_loss(x @ W, torch.ones(3, 5, dtype=D), reduction="none"),
    "bce_weight_target": lambda x, W: F.binary_cross_entropy(torch.sigmoid(x @ W), torch.sigmoid((x @ W).cos()),
                                                             weight=torch.linspace(0.5, 1.5, 5, dtype=D)),
    "bce_sum": lambda x, W: F.binary_cross_entropy(torch.sigmoid(x @ W), torch.full((3, 5), 0.3, dtype=D),
                                                   reduction="sum"),
    "cross_entropy_2d": lambda x, W: F.cross_entropy((x @ W).reshape(1, 5, 3, 1), torch.tensor([[[0], [4], [2]]]),
                                                     ignore_index=4),
}


@pytest.mark.parametrize("case", sorted(DOUBLE))
def test_double_backward_matches_pytorch(case):
    x, W = leaf(3, 4, seed=30), leaf(4, 5, seed=31)
    out = grad_penalty(DOUBLE[case], x, W)
    check(out, {"x": x, "W": W})


def _ctc_inputs(seed, t=7, n=3, c=5, unbatched=False):
    logits = leaf(t, c, seed=seed) if unbatched else leaf(t, n, c, seed=seed)
    return logits


CTC = {
    "mean_padded": lambda z: F.ctc_loss(z.log_softmax(-1), torch.tensor([[1, 2, 2], [3, 1, 0], [4, 4, 4]]),
                                        (7, 6, 7), (3, 2, 3)),
    "sum_concatenated_blank2": lambda z: F.ctc_loss(z.log_softmax(-1), torch.tensor([1, 0, 0, 3, 1, 4]),
                                                    (7, 5, 7), (3, 1, 2), blank=2, reduction="sum"),
    "none_empty_target": lambda z: F.ctc_loss(z.log_softmax(-1), torch.tensor([[1, 2], [0, 0], [3, 3]]),
                                              (7, 4, 7), (2, 0, 2), reduction="none"),
    "zero_infinity": lambda z: F.ctc_loss(z.log_softmax(-1), torch.tensor([[1, 1, 1, 1], [1, 2, 3, 4], [2, 3, 2, 3]]),
                                          (7, 3, 7), (4, 4, 4), zero_infinity=True),
    "raw_log_probs": lambda z: F.ctc_loss(z, torch.tensor([[1, 2], [2, 1], [3, 3]]), (7, 7, 6), (2, 2, 2),
                                          reduction="sum"),
}


@pytest.mark.parametrize("case", sorted(CTC))
def test_ctc_loss_matches_pytorch(case, tmp_path):
    z = _ctc_inputs(80)
    check(weigh(CTC[case](z)), {"z": z}, path=tmp_path / "g.json", expect_names=("CtcLossBackward0",))


def test_ctc_loss_unbatched(tmp_path):
    z = _ctc_inputs(81, unbatched=True)
    out = F.ctc_loss(z.log_softmax(-1), torch.tensor([1, 3, 3]), (7,), (3,))
    check(out, {"z": z}, path=tmp_path / "g.json", expect_names=("CtcLossBackward0",))


def test_native_dropout_training():
    x = leaf(4, 6, seed=90)
    torch.manual_seed(3)
    check(weigh(torch.native_dropout(x, 0.3, True)[0]), {"x": x}, expect_names=("NativeDropoutBackward0",))


def test_native_dropout_eval_when_the_file_says_so():
    import numpy as np

    from torch_helpers import capture, our_order
    x = leaf(4, 6, seed=91)
    out = weigh(torch.native_dropout(x, 0.3, False)[0])
    doc = capture([out], leaves={"x": x})
    for n in doc["nodes"]:
        if n["name"] == "NativeDropoutBackward0":
            n["saved"]["train"] = False
    _, res, _ = our_order(doc)
    out.backward()
    np.testing.assert_allclose(res.grads["x"], x.grad.numpy(), rtol=1e-12)


def test_linalg_cross():
    a, b = leaf(4, 3, seed=92), leaf(3, seed=93)
    check(weigh(torch.linalg.cross(a, b.expand(4, 3))), {"a": a, "b": b}, expect_names=("LinalgCrossBackward0",))
    c, d = leaf(3, 5, seed=94), leaf(3, 5, seed=95)
    check(weigh(torch.cross(c, d, dim=0)), {"c": c, "d": d})


@pytest.mark.parametrize("name", ["CudnnBatchNormBackward0", "MiopenBatchNormBackward0"])
@pytest.mark.parametrize("training", [True, False])
def test_vendor_batch_norm_replays_native_maths(training, name):
    """cuDNN/MIOpen batch norm nodes (GPU-only in PyTorch) run the native maths: a CPU graph relabelled."""
    import numpy as np

    from torch_helpers import capture, our_order
    x, w, b = leaf(3, 4, 5, seed=96), leaf(4, seed=97), leaf(4, seed=98)
    rm, rv = torch.linspace(-0.2, 0.2, 4, dtype=D), torch.linspace(0.5, 1.5, 4, dtype=D)
    out = weigh(F.batch_norm(x, rm, rv, w, b, training=training, eps=1e-3))
    doc = capture([out], leaves={"x": x, "w": w, "b": b})
    for n in doc["nodes"]:
        if n["name"] == "NativeBatchNormBackward0":
            n["name"] = name
            n["saved"]["epsilon"] = n["saved"].pop("eps")
    _, res, _ = our_order(doc)
    out.backward()
    for k, t in {"x": x, "w": w, "b": b}.items():
        np.testing.assert_allclose(res.grads[k], t.grad.numpy(), rtol=1e-9, err_msg=k)


SAMPLERS = {
    "bernoulli": lambda p: torch.bernoulli(p) + p,
    "bernoulli_inplace": lambda p: (p * 1).bernoulli_(0.3) + (p * 2).bernoulli_(p.detach()) + p,
    "normal": lambda p: torch.normal(p, 1.0) + torch.normal(0.0, p) + torch.normal(p, p + 1),
    "normal_uniform_inplace": lambda p: (p * 1).normal_() + (p * 1).uniform_() + (p * 1).exponential_() + p,
    "cauchy_geometric_lognormal": lambda p: (p * 1).cauchy_() + (p * 1).geometric_(0.5) + (p * 1).log_normal_() + p,
    "random": lambda p: (p * 1).random_() * 0 + (p * 1).random_(5) + (p * 1).random_(1, 5) + p,
    "poisson": lambda p: torch.poisson(p) + p,
    "fill_zero": lambda p: (p * 1).fill_(2.0) + (p * 3).zero_() + torch.fill(p * 2, 3.0) + p,
    "fill_tensor": lambda p: torch.fill(p * 2, (p * p).sum()) + (p * 3).fill_((p + 1).sum()),
}


@pytest.mark.parametrize("case", sorted(SAMPLERS))
def test_sampling_and_fill_nodes(case):
    p = leaf(3, 4, seed=99, low=0.1, high=0.9)
    torch.manual_seed(0)
    check(weigh(SAMPLERS[case](p)), {"p": p})
