"""Capture of in-place writes into views, against PyTorch: a value written into masked rows of a view
(CopySlices over IndexPutBackward0, as Hugging Face's wav2vec2 writes its SpecAugment embedding), leaves the
caller never named (named after the op that consumes them), and a saved tensor modified in place (PyTorch's
own error, at capture)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")

from rules_torch_cases import D, check, leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch


def _mask(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) < 0.4


@pytest.mark.parametrize("dtype", [D, torch.float32])
def test_masked_rows_of_a_view_take_a_vector(dtype):
    h0, emb = leaf(14, 4, seed=1, dtype=dtype), leaf(4, seed=2, dtype=dtype)
    h = (h0 * 1).view(2, 7, 4)
    h[_mask(2, 7, seed=3)] = emb
    assert h.grad_fn.name() == "AsStridedBackward0"
    names = check(weigh(h), {"h0": h0, "emb": emb}, rtol=1e-6 if dtype == D else 1e-5, atol=1e-9 if dtype == D else 1e-6)
    assert "torch::autograd::CopySlices" in names


def test_masked_columns_of_a_transposed_view_take_a_matrix():
    h0, v = leaf(5, 6, seed=4), leaf(5, seed=5)
    h = (h0 * 2).t()  # (6, 5), a view
    m = _mask(6, seed=6)
    h[m] = v.expand(int(m.sum()), 5) * 3
    check(weigh(h), {"h0": h0, "v": v})


def test_a_leaf_the_caller_never_named_is_named_after_its_consumer():
    from autograd_run.capture.graph import from_torch
    conv = torch.nn.Conv1d(1, 2, 3, dtype=D)
    x = torch.randn(2, 10, dtype=D)[:, None]
    x.requires_grad = True  # what Hugging Face's audio feature encoders do to their input in training
    out = conv(x).pow(2).sum()
    doc = from_torch([out], names={"w": conv.weight, "b": conv.bias}, reference=False)
    assert sorted(v["name"] for v in doc["variables"]) == ["b", "convolution.input0", "w"]
    check(out, {"w": conv.weight, "b": conv.bias, "convolution.input0": x})


def test_two_unnamed_inputs_of_one_op_get_distinct_names():
    from autograd_run.capture.graph import from_torch
    a = torch.randn(3, dtype=D, requires_grad=True)
    b = torch.randn(3, dtype=D, requires_grad=True)
    doc = from_torch([(a * b).sum(), (a + b).sum()], reference=False)
    assert sorted(v["name"] for v in doc["variables"]) == ["mul.input0", "mul.input1"]


def test_a_saved_tensor_modified_in_place_stops_capture_with_pytorchs_text():
    from autograd_run.capture.graph import from_torch
    w = leaf(4, 5, seed=7)
    y = w.sigmoid()
    y.narrow(0, 1, 2).copy_(torch.ones(2, 5, dtype=D))
    with pytest.raises(RuntimeError) as theirs:
        y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError) as ours:
        from_torch([y.sum()], names={"w": w}, reference=False)
    assert str(ours.value) == str(theirs.value)
    assert "modified by an inplace operation" in str(ours.value)
