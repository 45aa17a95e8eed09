"""Matrix decompositions and solves (inverse, det, slogdet, solve, triangular and Cholesky solves, Cholesky,
eigh) against PyTorch, real and complex, batched, left and right."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")

from rules_torch_cases import D, check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch

C = torch.complex128


def _spd(n, seed, batch=(), dtype=D):
    a = leaf(*batch, n, n, seed=seed, dtype=dtype).detach()
    a = a @ a.mH + n * torch.eye(n, dtype=dtype)
    return a.requires_grad_(True)


def _well(n, seed, batch=(), dtype=D):
    a = leaf(*batch, n, n, seed=seed, dtype=dtype).detach() + 3 * torch.eye(n, dtype=dtype)
    return a.requires_grad_(True)


def _lower(n, seed, batch=(), dtype=D):
    a = torch.linalg.cholesky(_spd(n, seed, batch, dtype).detach())
    return a.requires_grad_(True)


CASES = {
    "inv": lambda: (lambda a: torch.linalg.inv(a), [_well(4, 1)]),
    "inv_batched_complex": lambda: (lambda a: torch.linalg.inv(a), [_well(3, 2, (2,), C)]),
    "det": lambda: (lambda a: torch.linalg.det(a), [_well(4, 3)]),
    "det_batched": lambda: (lambda a: torch.linalg.det(a), [_well(3, 4, (2, 2))]),
    "det_complex": lambda: (lambda a: torch.linalg.det(a), [_well(3, 5, (), C)]),
    "det_singular": lambda: (lambda a: torch.linalg.det(a * torch.tensor([1.0, 1.0, 0.0], dtype=D)), [_well(3, 6)]),
    "slogdet": lambda: (lambda a: torch.linalg.slogdet(a)[1], [_well(4, 7)]),
    "slogdet_negative": lambda: (lambda a: torch.linalg.slogdet(-a)[1] * 2, [_well(3, 8, (2,))]),
    "slogdet_complex_sign_and_log": lambda: (lambda a: torch.linalg.slogdet(a)[0] * torch.linalg.slogdet(a)[1],
                                             [_well(3, 9, (), C)]),
    "logdet": lambda: (lambda a: torch.logdet(a), [_spd(4, 10)]),
    "solve": lambda: (lambda a, b: torch.linalg.solve(a, b), [_well(4, 11), leaf(4, 3, seed=12)]),
    "solve_vector": lambda: (lambda a, b: torch.linalg.solve(a, b), [_well(4, 13), leaf(4, seed=14)]),
    "solve_right_batched": lambda: (lambda a, b: torch.linalg.solve(a, b, left=False),
                                    [_well(3, 15, (2,)), leaf(2, 5, 3, seed=16)]),
    "solve_broadcast_complex": lambda: (lambda a, b: torch.linalg.solve(a, b), [_well(3, 17, (), C),
                                                                               leaf(2, 3, 2, seed=18, dtype=C)]),
    "solve_triangular_lower": lambda: (lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
                                       [_lower(4, 19), leaf(4, 2, seed=20)]),
    "solve_triangular_upper_right_unit": lambda: (
        lambda a, b: torch.linalg.solve_triangular(a.mT, b, upper=True, left=False, unitriangular=True),
        [_lower(3, 21), leaf(2, 3, seed=22)]),
    "cholesky": lambda: (lambda a: torch.linalg.cholesky(a), [_spd(4, 23)]),
    "cholesky_upper_batched": lambda: (lambda a: torch.linalg.cholesky(a, upper=True), [_spd(3, 24, (2,))]),
    "cholesky_complex": lambda: (lambda a: torch.linalg.cholesky(a), [_spd(3, 25, (), C)]),
    "cholesky_solve": lambda: (lambda b, l: torch.cholesky_solve(b, l), [leaf(4, 2, seed=26), _lower(4, 27)]),
    "cholesky_solve_upper": lambda: (lambda b, l: torch.cholesky_solve(b, l.mT, upper=True),
                                     [leaf(3, 2, seed=28), _lower(3, 29)]),
    "eigh_values": lambda: (lambda a: torch.linalg.eigh(a)[0], [_spd(4, 30)]),
    "eigh_vectors": lambda: (lambda a: torch.linalg.eigh(a)[1] ** 2, [_spd(4, 31)]),
    "eigh_both_batched": lambda: (lambda a: torch.linalg.eigh(a)[0][..., None] * torch.linalg.eigh(a)[1],
                                  [_spd(3, 32, (2,))]),
    "gaussian_process_nll": lambda: (
        lambda k, y: (torch.cholesky_solve(y[:, None], torch.linalg.cholesky(k)).squeeze(-1) * y).sum()
        + torch.logdet(k),
        [_spd(5, 33), leaf(5, seed=34)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_linalg_rule_matches_pytorch(case, tmp_path):
    f, args = CASES[case]()
    out = f(*args)
    leaves = {f"a{k}": t for k, t in enumerate(args)}
    check(weigh(out), leaves, path=tmp_path / "g.json")


SVD = {
    "values": lambda a: torch.linalg.svdvals(a),
    "values_via_svd": lambda a: torch.linalg.svd(a, full_matrices=False)[1],
    "u_abs_and_s": lambda a: torch.linalg.svd(a, full_matrices=False)[0].abs() * torch.linalg.svd(
        a, full_matrices=False)[1][..., None, :],
    "vh_squared": lambda a: torch.linalg.svd(a, full_matrices=False)[2] ** 2,
    "reconstruction_rank2": lambda a: (lambda u, s, vh: (u[..., :2] * s[..., None, :2]) @ vh[..., :2, :])(
        *torch.linalg.svd(a, full_matrices=False)),
    "full_matrices": lambda a: (lambda u, s, vh: u[..., :, :2].abs().sum() + vh[..., :2, :].abs().sum() + s.sum())(
        *torch.linalg.svd(a, full_matrices=True)),
    "nuclear_norm": lambda a: torch.linalg.matrix_norm(a, "nuc"),
    "spectral_norm": lambda a: torch.linalg.matrix_norm(a, 2),
}


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("case", sorted(SVD))
def test_svd_matches_pytorch(case, shape, tmp_path):
    a = leaf(*shape, seed=40)
    check(weigh(SVD[case](a)), {"a": a}, path=tmp_path / "g.json")


@pytest.mark.parametrize("case", ["values", "u_abs_and_s", "vh_squared", "reconstruction_rank2"])
def test_svd_complex_matches_pytorch(case, tmp_path):
    a = leaf(4, 3, seed=41, dtype=C)
    out = SVD[case](a)
    check(weigh(out.abs() if out.is_complex() and case == "vh_squared" else out), {"a": a}, path=tmp_path / "g.json")


DIST = {
    "cdist_p2": lambda a, b: torch.cdist(a, b),
    "cdist_p1": lambda a, b: torch.cdist(a, b, p=1),
    "cdist_p1_5_batched": lambda a, b: torch.cdist(a.reshape(2, 3, 4), b.reshape(2, 2, 4), p=1.5),
    "cdist_p3": lambda a, b: torch.cdist(a, b, p=3),
    "cdist_p0_5": lambda a, b: torch.cdist(a, b, p=0.5),
    "cdist_inf": lambda a, b: torch.cdist(a, b, p=float("inf")),
    "cdist_zero_distance": lambda a, b: torch.cdist(a, torch.cat([a[:2], b[2:]])),
    "cdist_mm": lambda a, b: torch.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
    "cdist_mm_zero_distance": lambda a, b: torch.cdist(a, torch.cat([a[:2], b[2:]]),
                                                       compute_mode="use_mm_for_euclid_dist"),
    "pdist_p2": lambda a, b: torch.pdist(a),
    "pdist_p1": lambda a, b: torch.pdist(b, p=1),
    "pdist_p3": lambda a, b: torch.pdist(a, p=3),
}


@pytest.mark.parametrize("case", sorted(DIST))
def test_distances_match_pytorch(case):
    a, b = leaf(6, 4, seed=50), leaf(4, 4, seed=51)
    check(weigh(DIST[case](a, b)), {"a": a, "b": b})


def test_expm_matches_pytorch():
    import numpy as np

    from autograd_run.ops.linalg import expm
    for scale in (0.01, 1.0, 30.0):
        a = torch.randn(3, 4, 4, dtype=D, generator=torch.Generator().manual_seed(5)) * scale
        np.testing.assert_allclose(expm(np, a.numpy()), torch.linalg.matrix_exp(a).numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", ["small", "large", "batched", "complex", "skew"])
def test_matrix_exp_matches_pytorch(case, tmp_path):
    a = {"small": lambda: leaf(3, 3, seed=60) * 0.1, "large": lambda: leaf(4, 4, seed=61) * 3,
         "batched": lambda: leaf(2, 3, 3, seed=62), "complex": lambda: leaf(3, 3, seed=63, dtype=C),
         "skew": lambda: leaf(4, 4, seed=64)}[case]().detach().requires_grad_(True)
    x = a - a.mT if case == "skew" else a
    check(weigh(torch.linalg.matrix_exp(x)), {"a": a}, path=tmp_path / "g.json")


@pytest.mark.parametrize("case", ["rows_by_offsets", "empty_group", "batched"])
def test_grouped_mm_matches_pytorch(case):
    """torch._grouped_mm (mixture-of-experts layers; float32 only on the CPU, rows 16-byte aligned): per
    group of rows, a @ b[group]. (Rows past the last offset belong to no group: PyTorch leaves their output
    unset, and its own backward then fails, so that layout is not compared; ours gives them no gradient.)"""
    f = torch.float32
    if case == "batched":
        a, b = leaf(3, 4, 8, seed=70, dtype=f), leaf(3, 8, 4, seed=71, dtype=f)
        offs = None
    else:
        a, b = leaf(12, 8, seed=72, dtype=f), leaf(3, 8, 4, seed=73, dtype=f)
        offs = torch.tensor({"rows_by_offsets": [4, 9, 12], "empty_group": [5, 5, 12]}[case], dtype=torch.int32)
    y = torch._grouped_mm(a, b, offs=offs) if offs is not None else torch._grouped_mm(a, b)
    names = check(weigh(y), {"a": a, "b": b}, rtol=1e-4, atol=1e-5)
    assert "GroupedMmBackward0" in names
