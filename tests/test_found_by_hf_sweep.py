"""What a sweep of Hugging Face transformers architectures found (2026-12-07, eighth stop: 167 cases built from
small configs, 156 exact): an in-place write into a view (``CopySlices`` over fill_, masked_fill_, index_put_)
turned a non-finite gradient in the written place into NaN where PyTorch writes 0 (Longformer's global
attention), and a custom Function keeping a dict on its ctx (YOSO's config) was left opaque. Each against
PyTorch."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")

import custom_functions as cf  # noqa: E402
from rules_torch_cases import D, check, leaf  # noqa: E402

pytestmark = pytest.mark.torch


def _written(doc) -> list:
    return [n["saved"].get("written") for n in doc["nodes"] if "CopySlices" in n["name"]]


@pytest.mark.parametrize("write", ["fill", "masked_fill", "index_put"])
def test_a_write_into_a_view_drops_a_nan_there(write, tmp_path):
    """A row set to -inf in place on a view, then a softmax: the row's gradient is NaN, and PyTorch's CopySlices
    writes the wrapped backward's zeros over it (the row's inputs get 0); the replay multiplied 0 by NaN."""
    x = leaf(2, 3, seed=1)
    s = x * 1.0
    if write == "fill":
        s[1].fill_(float("-inf"))
    elif write == "masked_fill":
        s[1].masked_fill_(torch.tensor([True, True, True]), float("-inf"))
    else:
        s[1].index_put_((torch.tensor([0, 1, 2]),), torch.tensor(float("-inf"), dtype=D))
    p = torch.softmax(s, dim=-1)
    check(p[0].square().sum() + p[1].nan_to_num().sum(), {"x": x}, path=tmp_path / "g.json")


def test_the_written_value_reads_only_its_places(tmp_path):
    """masked_fill_ of a tensor value on a view: the value's gradient is the sum at the masked places only;
    an infinite gradient elsewhere (d sqrt at 0) made it NaN in the replay (0 times inf)."""
    x = leaf(2, 3, seed=2)
    v = torch.tensor(0.5, dtype=D, requires_grad=True)
    s = x * 1.0
    s[0].masked_fill_(torch.tensor([True, False, False]), v)
    z = s[0, 1:] - s[0, 1:].detach()
    check(s[0, 0] * 3 + z.sqrt().sum(), {"x": x, "v": v}, path=tmp_path / "g.json")


def test_a_multiplication_by_zero_keeps_its_nan(tmp_path):
    """``x[1] *= 0`` multiplies: PyTorch's gradient is 0 * inf = NaN there, and so is the replay's (the zero
    factors of a multiplication are not places left unread)."""
    from autograd_run.capture import from_torch
    x = leaf(2, 3, seed=3)
    s = x * 1.0
    s[1] *= 0
    loss = s.sqrt().sum()  # d sqrt(0) = inf in row 1
    doc = from_torch(loss, names={"x": x}, path=str(tmp_path / "probe.json"))
    assert sorted(map(str, _written(doc))) == ["None", "[0]"]  # the multiplication's; s[1]'s copy back writes
    check(loss, {"x": x}, path=tmp_path / "g.json")


def test_a_dict_on_ctx_is_kept_and_given_back(tmp_path):
    """The ctx's dict (str keys; ints, bools, strs, a list) is written into the graph and rebuilt for the replay's
    call of the Function's backward; it was opaque ('a dict a graph file cannot hold')."""
    from autograd_run.capture.check import check_graph
    from autograd_run.capture.graph import from_torch
    from autograd_run.graphs.load import load_graph
    w = leaf(3, seed=4)
    y = cf.ScaleByConfig.apply(w * 2, {"k": 3, "shift": True, "name": "ab", "dims": [1, 2, 5]})
    doc = from_torch([(y * y).sum()], names={"w": w}, path=str(tmp_path / "g.json"))
    fn = [n for n in doc["nodes"] if n["name"] == "ScaleByConfigBackward"]
    assert fn and fn[0].get("op") == "python" and fn[0]["attrs"]["ctx"]["config"]["dict"][0] == ["k", 3], fn
    result = check_graph(load_graph(str(tmp_path / "g.json"), allow_python=True), allow_python=True)
    assert result.ok, result
