"""What PyTorch's OpInfo database (tests/opinfo_cases.py) found outside the op families' own test files, against
PyTorch: quantile's lerp (LerpBackward1 without ``self`` and ``end``), and empty tensors of any shape written
inline (``[]`` for a (0, 3) tensor) in a captured file."""

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
