"""What PyTorch's OpInfo database (tests/opinfo_cases.py) found outside the op families' own test files, against
PyTorch: quantile's lerp (LerpBackward1 without ``self`` and ``end``), and empty tensors of any shape written
inline (``[]`` for a (0, 3) tensor) in a captured file."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")

from rules_torch_cases import D, check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("q", [0.3, [0.1, 0.5, 0.9]])
@pytest.mark.parametrize("interpolation", ["linear", "midpoint"])
def test_quantile_lerp_without_saved_ends(q, interpolation):
    x = leaf(4, 7, seed=1)
    qs = torch.tensor(q, dtype=D) if isinstance(q, list) else q
    y = torch.quantile(x, qs, dim=1, interpolation=interpolation)
    check(weigh(y), {"x": x}, expect_names=["LerpBackward1"])


def test_lerp_tensor_weight_still_needs_its_ends():
    a, b, w = leaf(3, 4, seed=2), leaf(3, 4, seed=3), leaf(3, 4, seed=4, low=0.0, high=1.0)
    check(weigh(torch.lerp(a, b, w)), {"a": a, "b": b, "w": w}, expect_names=["LerpBackward1"])


@pytest.mark.parametrize("shape", [(0, 3), (0, 0), (2, 0, 4), (0,)])
def test_empty_saved_tensors_inline(shape):
    """A saved empty tensor is written as [] whatever its shape; the loader accepts it for any empty shape."""
    x = leaf(*shape, seed=5)
    w = leaf(*shape[::-1], seed=6) if len(shape) == 2 else None
    y = (x @ w) if w is not None else (x * x)
    leaves = {"x": x} if w is None else {"x": x, "w": w}
    check(weigh(y) + 0 * x.sum(), leaves)


def test_empty_data_for_a_nonempty_shape_is_still_refused():
    from autograd_run.capture.graph import from_torch
    from autograd_run.errors import GraphFileError
    from builders import graph
    x, w = leaf(2, 3, seed=7), leaf(2, 3, seed=8)
    doc = from_torch([(x * w).sum()], names={"x": x, "w": w}, reference=False)
    (mul,) = [n for n in doc["nodes"] if n["name"] == "MulBackward0"]
    mul["saved"]["other"] = {"data": [], "shape": [2, 3]}
    with pytest.raises(GraphFileError, match=r"saved.other.data: values have shape \[0\], expected \[2, 3\]"):
        graph(doc)


@pytest.mark.parametrize("seed", range(4))
def test_ctc_loss_float32_rounds_as_pytorch_does(seed, tmp_path):
    """float32 CTC: PyTorch's saved log-alpha, beta and the per-label sums in its kernel's order, exp and log
    correctly rounded: within a few float32 ulps of PyTorch (a float64 computation was 1e-5 away)."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(40, 3, 12, generator=g).log_softmax(-1).requires_grad_(True)
    targets = torch.randint(1, 12, (3, 8), generator=g)
    loss = torch.nn.functional.ctc_loss(lp, targets, torch.tensor([40, 35, 30]), torch.tensor([8, 6, 3]),
                                        reduction="sum")
    check(loss, {"lp": lp}, path=tmp_path / "g.json", rtol=0, atol=2e-7)


# --- special functions: Bessel I0/I1 (and scaled), polygamma, mvlgamma, xlog1py, entr, ndtri, log_ndtr, erfcx,
# --- nextafter, frexp, ldexp ------------------------------------------------------------------------------------

SPECIAL = {
    "i0": lambda L: torch.i0(L["a"]),
    "i0e": lambda L: torch.special.i0e(L["a"]),
    "i1": lambda L: torch.special.i1(L["a"]),
    "i1e": lambda L: torch.special.i1e(L["a"]),
    "polygamma2": lambda L: torch.polygamma(2, L["p"]),
    "polygamma4": lambda L: torch.polygamma(4, L["p"]),
    "mvlgamma3": lambda L: torch.mvlgamma(L["p"] + 2, 3),
    "xlog1py": lambda L: torch.special.xlog1py(L["a"], L["p"]),
    "xlog1py_number_self": lambda L: torch.special.xlog1py(2.5, L["p"]),
    "xlog1py_number_other": lambda L: torch.special.xlog1py(L["a"], 0.75),
    "entr": lambda L: torch.special.entr(L["p"]),
    "ndtri": lambda L: torch.special.ndtri(L["u"]),
    "log_ndtr": lambda L: torch.special.log_ndtr(L["a"]),
    "erfcx": lambda L: torch.special.erfcx(L["u"] * 4 - 1),
    "nextafter": lambda L: torch.nextafter(L["a"], L["b"]),
    "frexp": lambda L: torch.frexp(L["a"] * 100)[0],
    "ldexp": lambda L: torch.ldexp(L["a"], L["b"]),
    "ldexp_int": lambda L: torch.ldexp(L["a"], torch.tensor([[1, -3, 0, 7, -1]])),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_functions_against_torch(name, dtype):
    """The special functions' rules against PyTorch, with values past the Bessel series' switch at |x| = 8,
    zeros (I1's limit 0.5 and nextafter's ties) and negative integer exponents (ldexp's integer power is 0)."""
    a = leaf(3, 5, seed=11, dtype=dtype) * 5
    with torch.no_grad():
        a[0, 0], a[0, 1], a[1, 0] = 0.0, 9.5, -12.0
    b = leaf(3, 5, seed=12, dtype=dtype)
    with torch.no_grad():
        b[0, 0] = a[0, 0]  # a tie: nextafter's gradient is 0 there
    L = {"a": a, "b": b, "p": leaf(3, 5, seed=13, dtype=dtype, low=0.2, high=6.0),
         "u": leaf(3, 5, seed=14, dtype=dtype, low=0.05, high=0.95)}
    for t in L.values():
        t.requires_grad_(True)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    check(weigh(SPECIAL[name](L)), L, **tol)


# --- linalg: cholesky (deprecated form), cholesky_inverse, triangular_solve, renorm ----------------------------


def _spd(n, seed, batch=()):
    m = leaf(*batch, n, n, seed=seed)
    return (m @ m.mT + n * torch.eye(n, dtype=D)).detach()


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_its_inverse(upper):
    a = _spd(4, 20, (2,)).requires_grad_(True)
    with warnings.catch_warnings():  # deprecated (warned once per process)
        warnings.simplefilter("ignore")
        f = torch.cholesky(a, upper=upper)
    check(weigh(f), {"a": a}, expect_names=["CholeskyBackward0"])
    fac = torch.linalg.cholesky(_spd(4, 21)).detach()
    fac = (fac.mT if upper else fac).requires_grad_(True)
    check(weigh(torch.cholesky_inverse(fac, upper=upper)), {"fac": fac}, expect_names=["CholeskyInverseBackward0"])


@pytest.mark.parametrize("upper, transpose, unit", [(True, False, False), (False, True, False),
                                                    (True, True, True), (False, False, True)])
def test_triangular_solve_with_broadcast_batches(upper, transpose, unit):
    """Both outputs used (the solution and A's copy); B broadcast over A's batch."""
    a = (_spd(3, 22, (2,)) + leaf(2, 3, 3, seed=23)).requires_grad_(True)
    b = leaf(3, 2, seed=24).requires_grad_(True)
    with warnings.catch_warnings():  # deprecated (warned once per process)
        warnings.simplefilter("ignore")
        x, m = torch.triangular_solve(b, a, upper=upper, transpose=transpose, unitriangular=unit)
    check(weigh(x) + weigh(m, seed=5), {"a": a, "b": b}, expect_names=["TriangularSolveBackward0"])


@pytest.mark.parametrize("p, dim", [(2, 0), (1, 1), (3.5, -1), (float("inf"), 0)])
def test_renorm(p, dim):
    a = leaf(3, 4, 2, seed=25).requires_grad_(True)
    check(weigh(torch.renorm(a, p, dim, 1.2)), {"a": a}, expect_names=["RenormBackward0"])


# --- 0-d and empty tensors through index, product and determinant rules ----------------------------------------


ZERO_D = {
    "gather": lambda x, v: x.gather(0, torch.tensor([0])),
    "scatter": lambda x, v: x.scatter(0, torch.tensor(0), v),
    "put": lambda x, v: x.put(torch.tensor(0), v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([0]), v),
    "index_copy": lambda x, v: x.index_copy(0, torch.tensor([0]), v),
    "index_reduce_prod": lambda x, v: x.index_reduce(0, torch.tensor([0]), v, "prod"),
    "index_reduce_amax": lambda x, v: x.index_reduce(0, torch.tensor([0]), v, "amax", include_self=False),
    "transpose": lambda x, v: x.transpose(0, -1) * v,
}


@pytest.mark.parametrize("name", sorted(ZERO_D))
def test_zero_dim_tensors_index_as_one_element(name):
    """PyTorch's index ops treat a 0-d tensor as one of shape (1,): the gradients agree, zero where written."""
    x, v = torch.tensor(1.7, dtype=D, requires_grad=True), torch.tensor(-0.6, dtype=D, requires_grad=True)
    check(weigh(ZERO_D[name](x, v)), {"x": x, "v": v})


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty_products_and_determinants(shape):
    x = torch.zeros(shape, dtype=D, requires_grad=True)
    check(weigh(x.prod()) + weigh(x.prod(-1)) + weigh(x.cumprod(-1)), {"x": x})
    m = torch.zeros((*shape[:-1], 0, 0), dtype=D, requires_grad=True)
    check(weigh(torch.linalg.det(m)), {"m": m})


# --- as_strided on a view of a bigger storage ---------------------------------------------------------------------


@pytest.mark.parametrize("offset", [None, 0, 10, 7])
def test_as_strided_of_a_leaf_that_is_a_view(offset):
    """A leaf made from a slice of a bigger tensor: as_strided indexes the storage, and the gradient reaches
    only the leaf's own part of it (zero where the view reads outside it)."""
    base = leaf(20, seed=30).detach()
    x = base[5:15].requires_grad_(True)
    y = x.as_strided((2, 2), (1, 2)) if offset is None else x.as_strided((2, 2), (1, 2), offset)
    check(weigh(y), {"x": x})


def test_as_strided_of_an_unknown_layout_is_opaque_at_capture():
    from autograd_run.capture.graph import from_torch
    a = leaf(20, seed=31).requires_grad_(True)
    y = (a * 2)[5:15].as_strided((2, 2), (1, 2), 0)
    doc = from_torch([weigh(y)], names={"a": a}, reference=False)
    (node,) = [n for n in doc["nodes"] if n["name"] == "AsStridedBackward0"]
    assert "does not start its storage contiguously" in node["attrs"]["reason"]
    y = (a * 2)[:12].as_strided((2, 3), (1, 2), 1)  # contiguous from the storage's start: replayed
    check(weigh(y), {"a": a}, expect_names=["AsStridedBackward0"])


CASES_NOT_AT_STORAGE_START = {
    "transposed": lambda a: (a * 2).t().as_strided((3, 4), (1, 2), 1),
    "sliced": lambda a: (a * 2)[1:, 2:].as_strided((2, 3), (6, 1), 8),
    "chunks": lambda a: (a * 2).t().contiguous().view(2, 12)[:, 2:].as_strided((2, 2, 4), (12, 3, 1), 2),
}


@pytest.mark.parametrize("case", sorted(CASES_NOT_AT_STORAGE_START))
def test_as_strided_of_a_view_whose_layout_capture_reads_off(case):
    """The input of as_strided is itself a view (transposed, sliced, a slice of a reshaped copy): capture reads
    its strides and storage offset off the node's answer to a random gradient, and the replay matches PyTorch."""
    from autograd_run.capture.graph import from_torch
    a = leaf(4, 6, seed=32).requires_grad_(True)
    y = CASES_NOT_AT_STORAGE_START[case](a)
    doc = from_torch([weigh(y)], names={"a": a}, reference=False)
    (node,) = [n for n in doc["nodes"] if n["name"] == "AsStridedBackward0"]
    assert node.get("op") != "opaque", node["attrs"]
    assert "self_strides" in node["saved"] and "self_storage_offset" in node["saved"]
    check(weigh(CASES_NOT_AT_STORAGE_START[case](a)), {"a": a}, expect_names=["AsStridedBackward0"])


def test_as_strided_of_an_input_that_overlaps_itself_stays_opaque():
    """An expanded input (stride 0) overlaps itself; PyTorch divides by the overlap, which no strides and offset
    express, so the node is recorded opaque with its reason rather than replayed wrong."""
    from autograd_run.capture.graph import from_torch
    a = leaf(4, 6, seed=33).requires_grad_(True)
    y = (a * 2).unsqueeze(0).transpose(1, 2).as_strided((2, 3), (0, 1), 0)
    doc = from_torch([weigh(y)], names={"a": a}, reference=False)
    (node,) = [n for n in doc["nodes"] if n["name"] == "AsStridedBackward0"]
    assert node.get("op") == "opaque" and "does not start its storage contiguously" in node["attrs"]["reason"]


# --- embedding_bag with empty bags when PyTorch saves no offset2bag (float32's fast path) -------------------------


@pytest.mark.parametrize("offsets", [[0, 0, 3], [0, 2, 2, 5], [0, 5]])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_empty_bags_float32(offsets, mode):
    w = leaf(10, 4, seed=32, dtype=torch.float32).requires_grad_(True)
    idx = torch.tensor([1, 5, 4, 5, 9])
    psw = leaf(5, seed=33, dtype=torch.float32).requires_grad_(True) if mode == "sum" else None
    y = torch.nn.functional.embedding_bag(idx, w, torch.tensor(offsets), mode=mode, per_sample_weights=psw)
    check(weigh(y), {"w": w, "psw": psw}, rtol=1e-5, atol=1e-6)


# --- the masked index ops of decompositions -------------------------------------------------------------------------


def test_unsafe_masked_index_and_put_accumulate():
    """Out-of-range indices where the mask is false are clamped, as PyTorch's CPU kernels do."""
    x = leaf(4, 5, seed=34).requires_grad_(True)
    v = leaf(3, 3, seed=35).requires_grad_(True)
    mask = torch.tensor([[True], [False], [True]])
    i0, i1 = torch.tensor([[0], [9], [3]]), torch.tensor([[1, 2, 4]])
    y = torch.ops.aten._unsafe_masked_index(x, mask, [i0, i1], 0.5)
    z = torch.ops.aten._unsafe_masked_index_put_accumulate(x * 1.5, mask, [i0, i1], v)
    check(weigh(y) + weigh(z, seed=3), {"x": x, "v": v},
          expect_names=["UnsafeMaskedIndexBackward0", "UnsafeMaskedIndexPutAccumulateBackward0"])


# --- the LU family -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3), (2, 4, 4)])
def test_linalg_lu_square_wide_tall(shape):  # (LU without pivoting is CUDA-only in PyTorch)
    a = (leaf(*shape, seed=40) + 3 * torch.eye(*shape[-2:], dtype=D)).requires_grad_(True)
    p, low, up = torch.linalg.lu(a)
    check(weigh(low) + weigh(up, seed=7), {"a": a}, expect_names=["LinalgLuBackward0"])
    check(weigh(up, seed=8), {"a": a})  # only U used: L's gradient undefined


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3)])
def test_lu_factor_and_unpack(shape):
    a = leaf(*shape, seed=41).requires_grad_(True)
    lu, piv = torch.linalg.lu_factor(a)
    check(weigh(lu), {"a": a}, expect_names=["LinalgLuFactorExBackward0"])
    lu2 = lu.detach().requires_grad_(True)
    _, low, up = torch.lu_unpack(lu2, piv)
    check(weigh(low) + weigh(up, seed=9), {"lu": lu2}, expect_names=["LuUnpackBackward0"])
    check(weigh(low), {"lu": lu2})


@pytest.mark.parametrize("left, adjoint", [(True, False), (True, True), (False, False), (False, True)])
def test_lu_solve_every_side_and_adjoint(left, adjoint):
    a = leaf(2, 4, 4, seed=42) + 4 * torch.eye(4, dtype=D)
    lu, piv = torch.linalg.lu_factor(a)
    lu = lu.detach().requires_grad_(True)
    b = leaf(2, 4, 3, seed=43) if left else leaf(2, 3, 4, seed=43)
    b.requires_grad_(True)
    x = torch.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
    check(weigh(x), {"lu": lu, "b": b}, expect_names=["LinalgLuSolveBackward0"])


# --- lstsq (solution and residuals), as_strided_scatter, segment_reduce ----------------------------------------


@pytest.mark.parametrize("shape_a, shape_b", [((6, 3), (6, 2)), ((3, 5), (3, 2)), ((2, 5, 3), (2, 5, 4)),
                                              ((6, 3), (6,))])
def test_lstsq_solution_and_residuals(shape_a, shape_b):
    """Residuals exist for a tall full-rank A (driver gelsd): their gradient reaches A and B too."""
    a, b = leaf(*shape_a, seed=50).requires_grad_(True), leaf(*shape_b, seed=51).requires_grad_(True)
    r = torch.linalg.lstsq(a, b, driver="gelsd")
    loss = weigh(r.solution)
    if r.residuals.numel():
        loss = loss + weigh(r.residuals, seed=3)
    check(loss, {"a": a, "b": b}, expect_names=["LinalgLstsqBackward0"])


def test_as_strided_scatter_as_pytorch_computes_it():
    """PyTorch 2.13 gives self the gradient inside the scattered view and zero outside (its backward copies the
    gradient's slice into zeros); the replay reproduces that, and src's gradient, including overlapping views."""
    x, s = leaf(3, 3, seed=52).requires_grad_(True), leaf(2, 2, seed=53).requires_grad_(True)
    check(weigh(torch.as_strided_scatter(x * 1.5, s, (2, 2), (1, 2), 1)), {"x": x, "s": s},
          expect_names=["AsStridedScatterBackward0"])
    x2, s2 = leaf(4, seed=54).requires_grad_(True), leaf(3, 2, seed=55).requires_grad_(True)
    check(weigh(torch.as_strided_scatter(x2, s2, (3, 2), (1, 1), 0)), {"x": x2, "s": s2})


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(reduce, initial, tmp_path):
    """Ties (max/min share a positive gradient only), zeros (prod), an empty segment, a 2-d batch of lengths."""
    d = torch.tensor([3., 3., 1., 2., 2., 0., 5., 0., -1.5], dtype=D, requires_grad=True)
    lengths = torch.tensor([3, 2, 0, 4])
    y = torch.segment_reduce(d * 1.0, reduce, lengths=lengths, initial=initial)
    g = torch.tensor([1.0, -2.0, 4.0, 3.0], dtype=D)
    # an empty segment's output is nan / inf (mean, max, min without initial): captured through a file
    check((y * g).nan_to_num(0.0, 0.0, 0.0).sum(), {"d": d}, path=tmp_path / "a.json",
          expect_names=["SegmentReduceBackward0"])
    x = leaf(3, 5, 2, seed=56).requires_grad_(True)
    lens = torch.tensor([[2, 3], [5, 0], [1, 4]])
    y = torch.segment_reduce(x, reduce, lengths=lens, axis=1, initial=initial)
    check(weigh(y.nan_to_num(0.0, 0.0, 0.0)), {"x": x}, path=tmp_path / "b.json")


# --- linalg.eig ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [(), (2,)])
def test_eig_eigenvalues_and_phase_invariant_eigenvectors(batch, tmp_path):
    """A real A with complex eigenpairs: the gradient is real; |V| is invariant to the eigenvectors' phase."""
    a = leaf(*batch, 4, 4, seed=60).requires_grad_(True)
    lam, v = torch.linalg.eig(a)
    check(weigh(lam) + weigh(v.abs(), seed=4), {"a": a}, path=tmp_path / "a.json",
          expect_names=["LinalgEigBackward0"])
    check(weigh(torch.linalg.eigvals(a)), {"a": a}, path=tmp_path / "b.json")


def test_eig_a_loss_that_depends_on_the_phase_raises_pytorchs_error(tmp_path):
    from autograd_run.capture.graph import from_torch
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.ops.linalg import ERR_EIG_PHASE
    a = leaf(4, 4, seed=61).requires_grad_(True)
    loss = torch.linalg.eig(a)[1].real.sum()
    with pytest.raises(RuntimeError) as want:
        torch.autograd.grad(loss, a, retain_graph=True)
    assert str(want.value) == ERR_EIG_PHASE
    from_torch([loss], names={"a": a}, path=str(tmp_path / "g.json"), reference=False)
    eng = Engine(multithreading=False)
    try:
        with pytest.raises(Exception) as got:
            run_graph(eng, load_graph(str(tmp_path / "g.json")))
    finally:
        eng.shutdown()
    assert ERR_EIG_PHASE in str(got.value)


# --- Householder products ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 3), (4, 4), (2, 6, 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_householder_product(shape, dtype, tmp_path):
    a = leaf(*shape, seed=70).to(dtype).detach().requires_grad_(True)
    tau = (leaf(*shape[:-2], shape[-1], seed=71, low=0.2, high=1.5)).to(dtype).detach().requires_grad_(True)
    q = torch.linalg.householder_product(a, tau)
    check(weigh(q), {"a": a, "tau": tau}, path=tmp_path / "g.json",
          expect_names=["LinalgHouseholderProductBackward0"])


@pytest.mark.parametrize("left, transpose", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_ormqr_every_side_and_transpose(left, transpose, dtype, tmp_path):
    a = leaf(5, 3, seed=72).to(dtype).detach().requires_grad_(True)
    tau = leaf(3, seed=73, low=0.2, high=1.5).to(dtype).detach().requires_grad_(True)
    c = (leaf(5, 2, seed=74) if left else leaf(2, 5, seed=74)).to(dtype).detach().requires_grad_(True)
    y = torch.ormqr(a, tau, c, left=left, transpose=transpose)
    check(weigh(y), {"a": a, "tau": tau, "c": c}, path=tmp_path / "g.json", expect_names=["OrmqrBackward0"])
