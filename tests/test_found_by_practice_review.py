"""What a review of 175 training-practice programs found (2026-12-07, eighth stop; 166 were exact): a saved
ZeroTensor (forward-mode AD's zeros, saved by a Hessian-vector product) made capture fail, and four nodes had no
rule: the double backward of fractional max pooling (2-d and 3-d) and of an embedding, and PyTorch's own
``torch::autograd::Identity`` (forward-mode AD's make_dual/unpack_dual). Each against PyTorch."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, leaf  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_saved_zerotensor_is_captured(tmp_path):
    """jvp of grad (a Hessian-vector product, as torch.func.hessian makes) saves a ZeroTensor in the outer graph:
    its storage answers but its address raises, and capture stopped there."""
    from torch.func import grad, jvp
    w = leaf(3, seed=1)
    xs = torch.randn(2, 3, dtype=D, generator=torch.Generator().manual_seed(2))
    hvp = jvp(grad(lambda x: (x * w).pow(2).sum()), (xs[0],), (xs[1],))[1]
    check(hvp.sum() + (w * 0.3).sin().sum(), {"w": w}, path=tmp_path / "g.json")


@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool_double_backward(dims):
    """A gradient penalty through fractional max pooling: FractionalMaxPool{2,3}DBackwardBackward0, PyTorch's
    max_pool_double_backward (the gradient read at the saved indices) and zeros to the input."""
    x = leaf(1, 2, *([5] * dims), seed=3)
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    samples = torch.rand(1, 2, dims, dtype=D, generator=torch.Generator().manual_seed(4))
    out = pool(x * 2, 2, output_size=(3,) * dims, _random_samples=samples)
    g, = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    names = check(g.pow(2).sum() + out.sum(), {"x": x})
    assert f"FractionalMaxPool{dims}DBackwardBackward0" in names


@pytest.mark.parametrize("padding_idx, scale", [(None, False), (0, False), (3, True)])
def test_embedding_double_backward(padding_idx, scale):
    """A gradient-norm penalty over an embedding's weight: EmbeddingDenseBackwardBackward0, the weight's gradient
    rows read back at the indices, the padding rows zero, and no second scaling by frequency (PyTorch's
    embedding_dense_double_backward)."""
    w = leaf(6, 3, seed=5)
    i = torch.tensor([[0, 1, 2, 2], [5, 1, 0, 3]])
    e = F.embedding(i, w, padding_idx=padding_idx, scale_grad_by_freq=scale)
    loss = (e ** 3).sum()
    g, = torch.autograd.grad(loss, w, create_graph=True)
    names = check(loss + g.pow(2).sum(), {"w": w})
    assert "EmbeddingDenseBackwardBackward0" in names


def test_forward_mode_ad_identity_passes_the_gradient():
    """A tangent used in a loss (make_dual/unpack_dual) puts PyTorch's own Identity nodes in the backward graph:
    they pass their one gradient through (they were opaque, and check could not compare the gradients)."""
    import torch.autograd.forward_ad as fwAD
    w = leaf(3, seed=6)
    x = torch.randn(3, dtype=D, generator=torch.Generator().manual_seed(7))
    t = torch.randn(3, dtype=D, generator=torch.Generator().manual_seed(8))
    with fwAD.dual_level():
        y = (fwAD.make_dual(x, t) * w).sin()
        jt = fwAD.unpack_dual(y).tangent
    names = check(jt.pow(2).sum(), {"w": w})
    assert "torch::autograd::Identity" in names
