"""Rules the model zoo found missing, against PyTorch: grid_sample (every mode, padding, alignment; 2-d and
3-d), affine_grid, max unpooling, multi-label margin loss, Gamma, Dirichlet and Beta samples, index_reduce,
fake quantization (QAT), fractional max pooling, QR and the pseudo-inverse, and a cat whose constant inputs come before one with a gradient."""

import itertools

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch


def _grid(*shape, seed, spread=1.3):
    """Grid points partly outside [-1, 1] (so every padding mode matters), away from the integer lattice."""
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(*shape, dtype=D, generator=g) * 2 - 1) * spread).requires_grad_(True)


@pytest.mark.parametrize("mode, padding, align", list(itertools.product(
    ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [False, True])))
def test_grid_sample_2d(mode, padding, align):
    x = leaf(2, 3, 5, 4, seed=1)
    grid = _grid(2, 3, 6, 2, seed=2)
    y = F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
    check(weigh(y), {"x": x, "grid": grid}, expect_names=["GridSampler2DBackward0"])


@pytest.mark.parametrize("mode, padding, align", list(itertools.product(
    ["bilinear", "nearest"], ["zeros", "border", "reflection"], [False, True])))
def test_grid_sample_3d(mode, padding, align):
    x = leaf(1, 2, 3, 4, 5, seed=3)
    grid = _grid(1, 2, 3, 2, 3, seed=4)
    y = F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
    check(weigh(y), {"x": x, "grid": grid}, expect_names=["GridSampler3DBackward0"])


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 1, 1, 3], [2, 1, 3, 2, 4]])
def test_affine_grid_through_grid_sample(size, align):
    k = len(size) - 2
    theta = (torch.eye(k, k + 1, dtype=D).expand(size[0], k, k + 1) + 0.2 * leaf(size[0], k, k + 1, seed=5)).detach()
    theta.requires_grad_(True)
    grid = F.affine_grid(theta, size, align_corners=align)
    x = leaf(*size, seed=6)
    y = F.grid_sample(x, grid, align_corners=align)
    check(weigh(y) + weigh(grid, seed=7), {"theta": theta, "x": x}, expect_names=["AffineGridGeneratorBackward0"])


@pytest.mark.parametrize("dims", [2, 3])
def test_max_unpool(dims):
    x = leaf(2, 2, *([4] * dims), seed=8)
    pool, unpool = (F.max_pool2d, F.max_unpool2d) if dims == 2 else (F.max_pool3d, F.max_unpool3d)
    p, idx = pool(x, 2, return_indices=True)
    y = unpool(p * 1.5, idx, 2)
    check(weigh(y), {"x": x}, expect_names=[f"MaxUnpool{dims}DBackward0"])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss(reduction):
    x = leaf(3, 5, seed=9)
    target = torch.tensor([[3, 0, -1, 1, 2], [1, 1, 4, -1, 0], [0, 1, 2, 3, 4]])
    out = F.multilabel_margin_loss(x * 0.3, target, reduction=reduction)
    check(weigh(out) if reduction == "none" else out * 2.0, {"x": x},
          expect_names=["MultilabelMarginLossBackward0"])


def test_multilabel_margin_loss_one_sample():
    x = leaf(4, seed=10)
    check(F.multilabel_margin_loss(x * 0.2, torch.tensor([2, 0, -1, 3])), {"x": x})


def test_gamma_dirichlet_and_beta_samples():
    torch.manual_seed(11)
    a = leaf(4, positive=True, seed=12)
    conc = leaf(2, 3, positive=True, seed=13)
    b1, b2 = leaf(3, positive=True, seed=14), leaf(3, positive=True, seed=15)
    s = (weigh(torch.distributions.Gamma(a, 2.0).rsample())
         + weigh(torch.distributions.Dirichlet(conc).rsample((2,)))
         + weigh(torch.distributions.Beta(b1, b2).rsample()))
    check(s, {"a": a, "conc": conc, "b1": b1, "b2": b2},
          expect_names=["StandardGammaBackward0", "_DirichletBackward"])


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x = leaf(4, 3, seed=16)
    src = leaf(5, 3, seed=17)
    with torch.no_grad():  # ties and a zero, so that sharing and zero handling matter
        src[2, 1] = src[0, 1]
        src[3, 0] = 0.0
    index = torch.tensor([0, 2, 0, 3, 2])
    y = x.index_reduce(0, index, src, reduce, include_self=include_self)
    check(weigh(y), {"x": x, "src": src}, expect_names=["IndexReduceBackward0"])


def test_fake_quantization_masks():
    x = leaf(3, 4, seed=18, dtype=torch.float32)
    w = leaf(2, 4, seed=19, dtype=torch.float32)
    xq = torch.fake_quantize_per_tensor_affine(x * 4, 0.1, 0, -20, 20)
    wq = torch.fake_quantize_per_channel_affine(w * 4, torch.tensor([0.05, 0.1]), torch.zeros(2, dtype=torch.int32),
                                                0, -30, 30)
    xq2 = torch.fake_quantize_per_tensor_affine(x, torch.tensor([0.2]), torch.tensor([1], dtype=torch.int32), 0, 8)
    out = (xq @ wq.t()).sum() + (xq2 * torch.arange(4.0)).sum()
    check(out, {"x": x, "w": w}, rtol=1e-5, atol=1e-6,
          expect_names=["FakeQuantizePerTensorAffineCachemaskBackward0",
                        "FakeQuantizePerChannelAffineCachemaskBackward0"])


def test_cat_with_constants_before_a_tensor_with_gradient(tmp_path):
    """cat does not expose its inputs' sizes; capture measures them when constants come first."""
    a = leaf(2, 3, seed=20)
    c1, c2 = torch.ones(2, 2, dtype=D), torch.zeros(2, 1, dtype=D)
    b = leaf(2, 2, seed=21)
    y = torch.cat([c1, a, c2, torch.ones(2, 4, dtype=D), b, c2], dim=1)
    check(weigh(y), {"a": a, "b": b}, expect_names=["CatBackward0"])


@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool(dims):
    torch.manual_seed(22)
    x = leaf(1, 2, *([7] * dims), seed=23)
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    check(weigh(pool(x, 2, output_size=4)), {"x": x}, expect_names=[f"FractionalMaxPool{dims}DBackward0"])


# mode 'complete' with more rows than columns is not differentiable in PyTorch (test_qr_refusals).
QR_CASES = [(shape, mode) for shape in [(5, 3), (3, 3), (3, 5), (2, 4, 3)] for mode in ["reduced", "complete"]
            if not (mode == "complete" and shape[-2] > shape[-1])]


@pytest.mark.parametrize("shape, mode", QR_CASES)
@pytest.mark.parametrize("dtype", [D, torch.complex128])
@pytest.mark.parametrize("which", ["both", "Q", "R"])
def test_qr(tmp_path, shape, dtype, mode, which):
    a = leaf(*shape, seed=24, dtype=dtype)
    q, r = torch.linalg.qr(a, mode=mode)
    out = {"both": weigh(q) + weigh(r, seed=5), "Q": weigh(q), "R": weigh(r, seed=5)}[which]
    check(out, {"a": a}, path=tmp_path / "g.json", expect_names=["LinalgQrBackward0"])


def test_qr_refusals():
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.errors import BackwardError
    from torch_helpers import capture
    from builders import graph
    for mode, shape in (("r", (3, 4)), ("complete", (4, 3))):
        a = leaf(*shape, seed=25)
        out = torch.linalg.qr(a, mode=mode)
        loss = out[1].sum() if mode == "r" else out[0].sum() + out[1].sum()
        with pytest.raises(RuntimeError) as theirs:
            loss.backward(retain_graph=True)
        with pytest.raises(BackwardError) as ours:
            run_graph(Engine(multithreading=False), graph(capture([loss], leaves={"a": a})))
        assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [D, torch.complex128])
def test_pinv(tmp_path, shape, dtype):
    a = leaf(*shape, seed=26, dtype=dtype)
    check(weigh(torch.linalg.pinv(a)), {"a": a}, path=tmp_path / "g.json", expect_names=["LinalgPinvBackward0"])
