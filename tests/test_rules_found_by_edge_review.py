"""Rules a review of edge-case programs found wrong (2026-12-07: 463 small programs through capture and check;
448 exact), each against PyTorch: a flip of a 0-d tensor, nll_loss and cross_entropy whose every target is ignored
(mean reduction), var/std/var_mean/std_mean with ``dim=()``, a convolution with no input channels, and cat with a
legacy 1-d empty input."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("dims", [(0,), (-1,), ()])
def test_flip_of_a_0d_tensor_is_itself(dims):
    """PyTorch takes dim 0 and -1 of a 0-d tensor; the replay flipped axis 0 of a 0-d array (numpy's AxisError)."""
    a = torch.tensor(0.7, dtype=D, requires_grad=True)
    check(a.flip(dims) * 2.5 + a.flip(dims).sin(), {"a": a}, expect_names=["FlipBackward0"])


IGNORED = [
    ("nll_2d", lambda a: F.nll_loss(F.log_softmax(a, 1), torch.tensor([-100, -100])), (2, 3)),
    ("nll_own_index", lambda a: F.nll_loss(F.log_softmax(a, 1), torch.tensor([2, 2]), ignore_index=2), (2, 3)),
    ("nll_1d", lambda a: F.nll_loss(F.log_softmax(a, 0), torch.tensor(-100)), (4,)),
    ("nll_4d", lambda a: F.nll_loss(F.log_softmax(a, 1), torch.full((2, 2, 2), -100)), (2, 3, 2, 2)),
    ("cross_entropy", lambda a: F.cross_entropy(a, torch.tensor([-100, -100, -100])), (3, 4)),
    ("cross_entropy_smoothed", lambda a: F.cross_entropy(a, torch.tensor([-100, -100]), label_smoothing=0.1), (2, 4)),
    ("weighted", lambda a: F.nll_loss(F.log_softmax(a, 1), torch.tensor([-100, -100]),
                                      weight=torch.tensor([0.5, 2.0, 1.0], dtype=D)), (2, 3)),
]


@pytest.mark.parametrize("name, fn, shape", IGNORED, ids=[c[0] for c in IGNORED])
def test_nll_loss_whose_every_target_is_ignored_gives_zero_gradients(name, fn, shape, tmp_path):
    """The loss is 0/0 (NaN), but PyTorch skips the ignored targets in the backward: zero gradients, where the
    replay divided by the total weight 0 before masking and wrote NaN (a batch of padding only)."""
    a = leaf(*shape, seed=2)
    loss = fn(a)
    assert torch.isnan(loss)
    check(loss + (a * 0.1).sum(), {"a": a}, path=tmp_path / "graph.json")  # the NaNs saved go to an .npz


@pytest.mark.parametrize("fn", [
    lambda a: a.var(dim=(), correction=0),
    lambda a: a.std(dim=(), correction=0),
    lambda a: torch.stack(torch.var_mean(a, dim=(), correction=0)).sum(),
    lambda a: torch.stack(torch.std_mean(a, dim=[], correction=0)).sum(),
    lambda a: a.var(dim=list(range(1, a.dim()))),  # "all but the batch dim" of a 1-d tensor
], ids=["var", "std", "var_mean", "std_mean", "var_all_but_batch_1d"])
@pytest.mark.parametrize("shape", [(4,), (2, 3)])
def test_var_and_std_with_an_empty_dim_list_as_pytorch(fn, shape):
    """``dim=()`` reduces every dim in the forward, but PyTorch's var_backward counts N over the dims given (none:
    N = 1) and subtracts the mean over all: a gradient N times the usual one (inf with the default correction)."""
    a = leaf(*shape, seed=3)
    check(fn(a) * 1.5, {"a": a})


@pytest.mark.parametrize("conv, x_shape, w_shape", [
    (F.conv1d, (1, 0, 4), (3, 0, 3)),
    (F.conv2d, (2, 0, 4, 4), (3, 0, 2, 2)),
])
@pytest.mark.parametrize("bias", [False, True])
def test_convolution_with_no_input_channels_gives_zero_gradients(conv, x_shape, w_shape, bias):
    """PyTorch's output for zero input channels is (N, 0, ...), not (N, O, ...): every gradient is zero, the bias's
    of shape (O,); the replay contracted that output with the weight and failed (numpy's broadcast error)."""
    x, w = leaf(*x_shape, seed=4), leaf(*w_shape, seed=5)
    b = leaf(w_shape[0], seed=6) if bias else None
    y = conv(x, w, b)
    check(weigh(y) + (w * 0.5).sum() + (x * 0.5).sum(), {"x": x, "w": w, **({"b": b} if bias else {})},
          expect_names=["ConvolutionBackward0"])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_with_a_legacy_empty_input_gives_it_an_empty_gradient(dim):
    """cat skips a 1-d empty tensor whatever the others' rank, and its gradient is empty too."""
    a, e, c = leaf(2, 3, seed=7), leaf(0, seed=8), leaf(2, 3, seed=9)
    check(weigh(torch.cat([e, a, e, c], dim)), {"a": a, "e": e, "c": c}, expect_names=["CatBackward0"])


@pytest.mark.parametrize("bias", [False, True])
def test_double_backward_of_a_zero_batch_convolution_leaves_input_and_weight_terms_undefined(bias):
    """PyTorch's _convolution_double_backward skips the input's and the weight's terms when the input is empty:
    those gradients stay undefined (a leaf's .grad None), where the replay gave zeros; the bias's term stays."""
    x, w = leaf(0, 2, 5, seed=10), leaf(3, 2, 3, seed=11)
    b = leaf(3, seed=12) if bias else None
    y = F.conv1d(x, w, b)
    grads = torch.autograd.grad((y * y).sum(), (w, b) if bias else (w,), create_graph=True)
    out = sum((g * g).sum() for g in grads) + (w * 0.25).sum()
    check(out, {"x": x, "w": w, **({"b": b} if bias else {})}, expect_names=["ConvolutionBackwardBackward0"])
