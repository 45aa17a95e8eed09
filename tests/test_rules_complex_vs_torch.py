"""Complex gradients against PyTorch: complex128 leaves, a real loss, every leaf gradient to 1e-6.

PyTorch's convention is the conjugate Wirtinger derivative (grad_in =
grad_out * conj(d out / d in) for holomorphic ops); a real input of a
complex result gets a real gradient. Graphs go through a JSON file with
an ``.npz`` side file, since complex tensors cannot be written inline.
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch

C = torch.complex128


def leaves():
    return {"z": leaf(3, 4, seed=1, dtype=C), "w": leaf(3, 4, seed=2, dtype=C), "r": leaf(3, 4, seed=3),
            "s": leaf(4, seed=4, dtype=C), "m": leaf(4, 5, seed=5, dtype=C), "b": leaf(2, 3, 4, seed=6, dtype=C),
            "y": leaf(2, 4, 2, seed=7, dtype=C), "bias": leaf(5, seed=8, dtype=C),
            "rp": leaf(3, 4, seed=9, positive=True),
            "small": (0.4 * leaf(3, 4, seed=10, dtype=C)).detach().requires_grad_(True),
            "ci": leaf(2, 3, 6, seed=11, dtype=C), "cw": leaf(4, 3, 2, seed=12, dtype=C),
            "cwt": leaf(3, 2, 2, seed=13, dtype=C), "ci2": leaf(1, 3, 5, 4, seed=14, dtype=C),
            "cw2": leaf(2, 3, 2, 2, seed=15, dtype=C), "cb": leaf(2, seed=16, dtype=C)}


CASES = {
    "mul": lambda L: L["z"] * L["w"],
    "mul_real_complex": lambda L: L["z"] * L["r"],
    "mul_scalar_complex_tensor": lambda L: L["z"] * torch.tensor(2.0 - 1.0j, dtype=C),
    "div": lambda L: L["z"] / L["w"],
    "div_real_by_complex": lambda L: L["r"] / L["w"],
    "add_sub_real_complex": lambda L: torch.add(L["z"], L["r"], alpha=2) - torch.sub(L["r"], L["w"]),
    "neg_conj": lambda L: -L["z"].conj() * L["w"],
    "conj_physical": lambda L: torch.conj_physical(L["z"]) * L["w"],
    "mm": lambda L: L["z"] @ L["m"],
    "addmm": lambda L: torch.addmm(L["bias"], L["z"], L["m"], beta=0.5, alpha=2.0),
    "bmm": lambda L: torch.bmm(L["b"], L["y"]),
    "matmul_batched": lambda L: L["b"] @ L["m"],
    "mv": lambda L: L["z"].mv(L["s"]),
    "dot": lambda L: torch.dot(L["s"], L["z"][0]),
    "vdot": lambda L: torch.vdot(L["s"], L["z"][0]),
    "exp": lambda L: L["small"].exp(),
    "exp2_expm1": lambda L: L["small"].exp2() + L["small"].expm1(),
    "log_family": lambda L: L["z"].log() + L["z"].log2() + L["z"].log10() + L["z"].log1p(),
    "sqrt_rsqrt": lambda L: L["z"].sqrt() + L["z"].rsqrt(),
    "reciprocal": lambda L: L["z"].reciprocal(),
    "pow_scalar": lambda L: L["z"] ** 3 + L["z"] ** 0.5,
    "pow_square": lambda L: L["z"].square(),
    "pow_tensor": lambda L: L["z"] ** L["small"],
    "pow_real_base_complex_exponent": lambda L: L["rp"] ** L["small"],
    "pow_scalar_base": lambda L: 2.0 ** L["small"],
    "sin_cos_tan": lambda L: L["small"].sin() + L["small"].cos() + L["small"].tan(),
    "sinh_cosh": lambda L: L["small"].sinh() * L["small"].cosh(),
    "inverse_trig": lambda L: L["small"].asin() + L["small"].acos() + L["small"].atan(),
    "inverse_hyperbolic": lambda L: L["small"].asinh() + (L["z"] + 3).acosh() + L["small"].atanh(),
    "tanh": lambda L: torch.tanh(L["small"]),
    "sigmoid": lambda L: torch.sigmoid(L["small"]),
    "abs": lambda L: L["z"].abs(),
    "abs_squared": lambda L: L["z"].abs() ** 2,
    "sgn": lambda L: L["z"].sgn(),
    "angle": lambda L: L["z"].angle(),
    "real_imag": lambda L: L["z"].real * 2 + L["w"].imag,
    "view_as_real": lambda L: torch.view_as_real(L["z"]) * torch.arange(2.0, dtype=torch.float64),
    "view_as_complex": lambda L: torch.view_as_complex(torch.stack([L["r"], L["rp"]], -1)) * L["z"],
    "polar": lambda L: torch.polar(L["rp"], L["r"]),
    "complex": lambda L: torch.complex(L["r"], L["rp"]) * L["w"],
    "lerp": lambda L: torch.lerp(L["z"], L["w"], 0.3) + torch.lerp(L["z"], L["w"], L["small"]),
    "addcmul_addcdiv": lambda L: torch.addcmul(L["z"], L["w"], L["small"], value=0.5)
    + torch.addcdiv(L["z"], L["w"], L["z"] + 3, value=2.0),
    "sinc": lambda L: torch.sinc(L["small"]),
    "where": lambda L: torch.where(L["r"] > 0, L["z"], L["w"]),
    "vector_norm_2": lambda L: torch.linalg.vector_norm(L["z"], dim=1),
    "vector_norm_1": lambda L: torch.linalg.vector_norm(L["z"], 1),
    "vector_norm_inf": lambda L: torch.linalg.vector_norm(L["z"], float("inf"), dim=0),
    "vector_norm_3": lambda L: torch.linalg.vector_norm(L["z"], 3, dim=-1, keepdim=True),
    "vector_norm_half": lambda L: torch.linalg.vector_norm(L["z"], 0.5),
    "l1_loss": lambda L: F.l1_loss(L["z"], L["w"]),
    "mean_sum": lambda L: L["z"].mean() * L["w"].sum(),
    "power_spectrum": lambda L: (L["z"] * L["z"].conj()).real.sqrt(),
    "mul_complex_number": lambda L: L["z"] * (2 - 1j) + L["w"] / 1j,
    "conv1d": lambda L: F.conv1d(L["ci"], L["cw"], stride=2, padding=1),
    "conv2d_bias": lambda L: F.conv2d(L["ci2"], L["cw2"], L["cb"], padding=1),
    "conv_transpose1d": lambda L: F.conv_transpose1d(L["ci"], L["cwt"], stride=2, output_padding=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_complex_rule_matches_pytorch(case, tmp_path):
    L = leaves()
    check(weigh(CASES[case](L)), L, path=tmp_path / "g.json")


def test_conj_is_free_on_real_arrays():
    import numpy as np

    from autograd_run.ops.numeric import conj, real_for
    a = np.ones(3)
    assert conj(a) is a
    z = np.ones(3, dtype=np.complex128) * (1 + 2j)
    assert np.array_equal(conj(z), z.conj())
    assert conj(2.0) == 2.0 and conj(1 + 1j) == 1 - 1j

    class _Meta:
        dtype = "float64"

    class _Node:
        inputs = [_Meta()]

    class _Edge:
        node, input_nr = _Node(), 0

    holder = type("N", (), {"next": [_Edge()]})()
    assert real_for(holder, 0, a) is a
    assert real_for(holder, 0, z).dtype == np.float64


def test_zero_dim_saved_tensors_keep_their_shape_through_the_side_file(tmp_path):
    import numpy as np

    from autograd_run.capture import from_torch
    z = leaf(3, seed=20)
    out = torch.linalg.vector_norm(z, float("inf")) * 2  # LinalgVectorNormBackward0 saves a 0-d result
    path = tmp_path / "g.json"
    from_torch(out, names={"z": z}, path=str(path), reference=False)
    arrays = np.load(tmp_path / "g.npz")
    assert any(arrays[k].shape == () for k in arrays.files)
