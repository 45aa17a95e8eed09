"""Capture real PyTorch models and check the replay: order exact, gradients within 1e-6 (float64)."""

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="capture needs torch (pip install 'autograd-run[torch]')")
nn = torch.nn
F = torch.nn.functional

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.capture.check import check_graph  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from builders import run_cli  # noqa: E402

pytestmark = pytest.mark.torch


def capture_and_check(tmp_path, outputs, **kw):
    path = str(tmp_path / "g.json")
    from_torch(outputs, path=path, **kw)
    g = load_graph(path)
    report = check_graph(g)
    assert report.divergence is None, report.divergence
    assert report.grads_compared, report.note
    assert report.grads and all(gc.ok for gc in report.grads), report.grads
    return g, report


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def test_mlp(tmp_path):
    m = mlp()
    x, t = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    loss = ((m(x) - t) ** 2).mean()
    g, report = capture_and_check(tmp_path, loss, names=dict(m.named_parameters()))
    assert {gc.name for gc in report.grads} == {n for n, _ in m.named_parameters()}
    # The side file holds the saved tensors.
    assert (tmp_path / "g.npz").exists()


class Residual(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_residual_block(tmp_path):
    torch.manual_seed(1)
    m = Residual(8).double()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    names = dict(m.named_parameters(), x=x)
    capture_and_check(tmp_path, m(x).sum(), names=names)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h, self.d = heads, d
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.h), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return x + self.out(y)


def test_attention_block(tmp_path):
    torch.manual_seed(2)
    m = Attention(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    loss = m(x).pow(2).mean()
    g, _ = capture_and_check(tmp_path, loss, names=dict(m.named_parameters()))
    names = {n.name for n in g.nodes}
    assert {"BmmBackward0", "SoftmaxBackward0", "NativeLayerNormBackward0"} <= names


def test_shared_weights(tmp_path):
    torch.manual_seed(3)
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 4, dtype=torch.float64)
    h = torch.tanh(x @ w)
    y = torch.sigmoid(h @ w) @ w
    capture_and_check(tmp_path, y.sum(), names={"w": w})


def test_several_outputs(tmp_path):
    torch.manual_seed(4)
    m = mlp()
    x = torch.randn(5, 6, dtype=torch.float64)
    out = m(x)
    a, b = out[:, 0].exp().sum(), (out[:, 1:] ** 2).mean()
    capture_and_check(tmp_path, [a, b], names=dict(m.named_parameters()),
                      grad_outputs=[torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)])


def test_grad_inputs_subset(tmp_path):
    m = mlp()
    x = torch.randn(5, 6, dtype=torch.float64)
    loss = m(x).sum()
    params = dict(m.named_parameters())
    subset = [params["0.weight"], params["4.bias"]]
    g, report = capture_and_check(tmp_path, loss, inputs=subset, names=params)
    assert g.mode == "grad" and g.inputs == ["0.weight", "4.bias"]
    assert {gc.name for gc in report.grads} == {"0.weight", "4.bias"}
    # grad() does not touch .grad
    assert all(p.grad is None for p in m.parameters())


def test_a_named_non_leaf_input_keeps_its_name(tmp_path):
    """``grad`` of a non-leaf tensor named in ``names``: its node takes the name as its id, so the results say
    ``h``, not ``n1`` (a review of unusual models); a name like the ids made here (``n3``) is not taken."""
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, dtype=torch.float64, requires_grad=True)
    h = torch.tanh(w @ v)
    out = torch.stack([h, h ** 2]).sum()
    g, report = capture_and_check(tmp_path, out, inputs=[w, h], names={"w": w, "v": v, "h": h})
    assert g.inputs == ["w", "h"] and g.by_id["h"].name == "TanhBackward0"
    assert {gc.name for gc in report.grads} == {"w", "h"}
    t = torch.tanh(w @ v)
    doc = from_torch([(t * 2).sum() + (w * 3).sum()], names={"n0": t}, reference=False)
    ids = [n["id"] for n in doc["nodes"]]
    assert len(set(ids)) == len(ids) and ids[0] == "n0" and ids.count("n0") == 1


def test_opaque_ops_are_captured_with_shapes(tmp_path):
    class _Cube(torch.autograd.Function):
        """Defined in a function: not importable by name, so its node (_CubeBackward) stays opaque (an
        importable one becomes a python node: tests/test_capture_custom_function.py)."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x ** 2 * g

    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    loss = _Cube.apply(x * 2).sum()
    path = str(tmp_path / "ce.json")
    from_torch(loss, names={"x": x}, path=path)
    g = load_graph(path)
    assert any(n.op.name == "opaque" for n in g.nodes)
    report = check_graph(g)
    assert report.order_ok and not report.grads_compared and "opaque" in report.note


def test_a_wrong_replay_is_reported(tmp_path):
    """Tamper with a saved tensor: the order still matches, the gradient check fails."""
    import json
    torch.manual_seed(5)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    loss = (w * torch.arange(3.0, dtype=torch.float64)).sum()
    path = tmp_path / "g.json"
    doc = from_torch(loss, names={"w": w})
    mul = next(n for n in doc["nodes"] if n["name"] == "MulBackward0")
    mul["saved"]["other"]["data"] = [5.0, 5.0, 5.0]
    path.write_text(json.dumps(doc))
    report = check_graph(load_graph(str(path)))
    assert report.order_ok and not report.ok
    assert report.grads[0].max_abs == pytest.approx(5.0)


def test_capture_and_check_commands(tmp_path, capsys):
    import numpy as np
    script = tmp_path / "model.py"
    script.write_text(
        "import torch\n"
        "def main():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()\n"
        "    loss = m(torch.randn(2, 3, dtype=torch.float64)).sum()\n"
        "    return loss, dict(m.named_parameters())\n")
    out = tmp_path / "m.json"
    code, _, err = run_cli(["capture", f"{script}:main", "-o", str(out)], capsys)
    assert code == 0, err
    code, text, _ = run_cli(["check", str(out)], capsys)
    assert code == 0 and "same as PyTorch" in text and "0.weight" in text
    # A tampered reference gradient makes check exit 3.
    arrs = dict(np.load(tmp_path / "m.npz"))
    arrs["ref.0.weight"] = arrs["ref.0.weight"] + 1
    np.savez(tmp_path / "m.npz", **arrs)
    assert run_cli(["check", str(out)], capsys)[0] == 3
    code, _, err = run_cli(["capture", f"{script}:nope", "-o", str(out)], capsys)
    assert code == 2 and "no function 'nope'" in err


def test_classifier_with_cross_entropy(tmp_path):
    torch.manual_seed(6)
    m = nn.Sequential(nn.Linear(10, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 4)).double().eval()
    x, y = torch.randn(8, 10, dtype=torch.float64), torch.randint(0, 4, (8,))
    loss = F.cross_entropy(m(x), y)
    capture_and_check(tmp_path, loss, names=dict(m.named_parameters()))


def test_small_cnn(tmp_path):
    torch.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1),
                      nn.SiLU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 5)).double()
    x = torch.randn(2, 1, 12, 12, dtype=torch.float64)
    loss = F.cross_entropy(m(x), torch.tensor([1, 3]))
    g, _ = capture_and_check(tmp_path, loss, names=dict(m.named_parameters()))
    assert {"ConvolutionBackward0", "NativeBatchNormBackward0", "MaxPool2DWithIndicesBackward0"} <= {n.name for n in g.nodes}


def test_transposed_convolution_replays_with_gradients(tmp_path):
    torch.manual_seed(8)
    m = nn.ConvTranspose2d(2, 3, 3, stride=2, output_padding=1).double()
    loss = m(torch.randn(1, 2, 5, 5, dtype=torch.float64)).sum()
    path = str(tmp_path / "t.json")
    from_torch(loss, names=dict(m.named_parameters()), path=path)
    g = load_graph(path)
    assert all(n.op.name != "opaque" for n in g.nodes)
    report = check_graph(g)
    assert report.ok and report.grads_compared


def test_capture_prints_only_its_own_lines_on_a_real_terminal_stream(tmp_path):
    """PyTorch's profiler writes ``USDT: ... profiler_start`` to descriptor 2 whenever it starts (capture
    probes the forward thread id with it): a user must see our output only, and stderr must still work."""
    pytest.importorskip("torch")
    from cli_proc import cli
    script = tmp_path / "m.py"
    script.write_text("import torch\n"
                      "def main():\n"
                      "    x = torch.ones(3, requires_grad=True)\n"
                      "    return (x * 2).sum(), {'x': x}\n"
                      "def broken():\n"
                      "    return 5\n")
    p = cli(["capture", f"{script}:main", "-o", tmp_path / "g.json"], timeout=180)
    assert p.code == 0, p.err
    assert "USDT" not in p.err and "profiler_start" not in p.err and p.err == ""
    p = cli(["capture", f"{script}:broken", "-o", tmp_path / "h.json"], timeout=180)
    assert p.code == 2 and p.err.startswith("Error: ") and "USDT" not in p.err


def test_a_leaf_as_the_output_is_captured_as_pytorch_runs_it(tmp_path):
    """``x.backward()`` on a leaf that requires grad runs its AccumulateGrad node alone (x.grad = ones),
    so capture keeps that one-node graph rather than refusing it."""
    torch = pytest.importorskip("torch")
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import loads_graph
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    doc = from_torch(x, names={"x": x})
    assert [n["name"] for n in doc["nodes"]] == ["torch::autograd::AccumulateGrad"]
    assert doc["meta"]["reference"]["order"] == [["torch::autograd::AccumulateGrad", 2**64 - 1, "x"]]
    report = check_graph(loads_graph(json.dumps(doc), "leaf.json"))
    assert report.ok and x.grad is None


def test_a_saved_buffer_the_backward_never_reads_is_stored_as_zeros():
    """RReLU in eval mode saves a noise buffer PyTorch never fills (uninitialised memory: NaN at times,
    which made the capture fail now and then); its backward uses the mean slope, so capture stores zeros."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from autograd_run.graphs.load import loads_graph
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4).requires_grad_()
    y = torch.nn.functional.rrelu(x, 0.1, 0.3, training=False)
    doc = from_torch((y * y).sum(), names={"x": x})
    node = next(n for n in doc["nodes"] if n["name"] == "RreluWithNoiseBackward0")
    assert np.array(node["saved"]["noise"]["data"]).tolist() == np.zeros((3, 4)).tolist()
    assert check_graph(loads_graph(json.dumps(doc), "rrelu.json")).ok


class _Headed(nn.Module):
    """A head the loss never reaches, and one weight shared by two layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4).double(), nn.Linear(4, 4).double()
        self.b.weight = self.a.weight
        self.unused = nn.Linear(4, 2).double()

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_parameters_are_recorded_in_registration_order_with_the_unreached_ones(tmp_path):
    """``parameters=model``: the document's ``parameters`` is named_parameters() (a shared weight once, as DDP
    counts it); the head no node reaches stays a variable without a node; replay and check still agree."""
    m = _Headed()
    loss = m(torch.randn(3, 4, dtype=torch.float64)).sum()
    g, report = capture_and_check(tmp_path, loss, parameters=m)
    assert g.parameters == [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias", "b.bias",
                                                                     "unused.weight", "unused.bias"]
    assert "unused.weight" in g.variables and not any(n.variable == "unused.weight" for n in g.nodes)
    wrapped = type("Wrapper", (nn.Module,), {})()  # DDP-like: indexes its .module's parameters
    wrapped.module = m
    doc = from_torch(m(torch.randn(3, 4, dtype=torch.float64)).sum(), parameters=wrapped, reference=False)
    assert doc["parameters"] == g.parameters
    with pytest.raises(ValueError, match=r"parameters\[0\] must be a \(name, tensor\) pair"):
        from_torch(loss, parameters=[1], reference=False)


@pytest.mark.parametrize("value,message", [
    (["nope"], "unknown parameter 'nope': not a variable"),
    (["w", "w"], "parameter 'w' is listed twice"),
    (["x"], "parameter 'x' does not require grad"),
])
def test_a_bad_parameters_section_names_its_place(value, message):
    from autograd_run.errors import GraphFileError
    from autograd_run.graphs.load import loads_graph
    d = {"format": "autograd-graph/1", "roots": [{"node": "m"}],
         "nodes": [{"id": "m", "name": "NegBackward0", "next": [["acc", 0]], "inputs": [{"shape": [2]}]},
                   {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w"}],
         "variables": [{"name": "w", "shape": [2]}, {"name": "x", "shape": [2], "requires_grad": False}],
         "parameters": value}
    with pytest.raises(GraphFileError, match="parameters") as err:
        loads_graph(json.dumps(d), "p.json")
    assert message in str(err.value)


def test_a_relative_error_is_over_elements_pytorch_has_not_at_zero():
    """A reference of exactly 0 (a BatchNorm's bias before another BatchNorm) made a relative error of 1e-7 / 1e-300:
    `check` showed "max rel err 6.98e+290" (a held-out model review). Relative errors are over PyTorch's nonzero
    values; the absolute error tells the rest."""
    import numpy as np
    from autograd_run.capture.check import _compare
    ours, theirs = np.array([1e-7, 2.2, 5.0]), np.array([0.0, 2.0, 5.0])
    g = _compare("b", ours, theirs, "float64", 1e-6, 1e-9)
    assert g.max_abs == pytest.approx(0.2) and g.max_rel == pytest.approx(0.1) and not g.ok
    g = _compare("b", np.array([1e-7, 5.0]), np.array([0.0, 5.0]), "float64", None, None, largest=10.0)
    assert g.max_abs == pytest.approx(1e-7) and g.max_rel == 0.0
    g = _compare("b", np.array([np.nan, 1.0]), np.array([1.0, 1.0]), "float64", None, None)
    assert g.max_rel == np.inf and not g.ok  # NaN on one side only: as far off as can be
