"""Golden orders of real PyTorch (autograd_run.capture.golden) and `capture --order-out / --expect-order / --check`.

PyTorch's executed order is captured from real models, written in the order
file format, and compared by node identity (name and rank among the graph's
nodes of that name, or the leaf's name), which holds when PyTorch's absolute
sequence numbers move.
"""

import json

import pytest

torch = pytest.importorskip("torch", reason="golden orders are PyTorch's (pip install 'autograd-run[torch]')")
nn = torch.nn

from autograd_run.capture import golden  # noqa: E402
from autograd_run.errors import RequestError  # noqa: E402
from autograd_run.traces.order import read_order  # noqa: E402
from builders import run_cli  # noqa: E402

pytestmark = pytest.mark.torch

RUN_FIELDS = ("position", "id", "name", "seq", "device", "thread", "depth", "graph_task", "pass")


def residual_loss(scale_block=None):
    """Three residual blocks; ``scale_block=k`` adds one multiplication inside block k (a local change)."""
    torch.manual_seed(1)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)) for _ in range(3))
    x = torch.randn(5, 6)
    for k, b in enumerate(blocks):
        y = b(x)
        if k == scale_block:
            y = y * 0.5
        x = torch.relu(x + y)
    return x.sum(), dict(blocks.named_parameters())


def capture(loss_and_names):
    loss, names = loss_and_names
    return golden.capture_order(loss, names)


def golden_of(tmp_path, captured, name="g.jsonl"):
    path = tmp_path / name
    golden.write_golden(str(path), captured.rows)
    return golden.read_golden(str(path))


def test_rows_are_order_file_rows_with_identity_fields(tmp_path):
    loss, names = residual_loss()
    c = golden.capture_order(loss, names)
    g = golden_of(tmp_path, c)
    rows = read_order(g.path)  # the order file reader of `run --expect-order` reads it
    assert rows == c.rows
    assert [r["position"] for r in rows] == list(range(len(rows)))
    for r in rows:
        assert set(RUN_FIELDS) <= set(r) and r["torch"] == torch.__version__
        assert (r["nth"] is None) == (r["leaf"] is not None)
    assert rows[0]["name"] == "SumBackward0" and rows[0]["nth"] == 0
    # Each leaf is known by its parameter name; each op by its rank among its name's nodes.
    assert {r["leaf"] for r in rows if r["leaf"]} == set(names)
    addmm = sorted(r["nth"] for r in rows if r["name"] == "AddmmBackward0")
    assert addmm == list(range(6))
    # PyTorch's order is also what the graph file's PyTorch reference says.
    ref = [[r["name"], r["seq"], r["leaf"]] for r in rows]
    assert ref == [list(x) for x in c.doc["meta"]["reference"]["order"]]


def test_structure_only_capture_leaves_the_graph_and_grads_alone():
    loss, names = residual_loss()
    w = names["0.0.weight"]
    w.grad = torch.full_like(w, 7.0)
    c = golden.capture_order(loss, names)
    assert all(n.get("op") == "opaque" and "saved" not in n for n in c.doc["nodes"] if "variable" not in n)
    assert c.doc["meta"]["reference"]["grads"] == {}
    assert torch.equal(w.grad, torch.full_like(w, 7.0))
    loss.backward()  # the graph was retained
    assert not torch.equal(w.grad, torch.full_like(w, 7.0))


def test_identity_does_not_depend_on_absolute_sequence_numbers(tmp_path):
    first = capture(residual_loss())
    g = golden_of(tmp_path, first)
    junk = torch.ones(3, requires_grad=True)
    for _ in range(25):  # other autograd nodes created on this thread move every sequence number
        junk = junk * 1.5
    again = capture(residual_loss())
    assert [r["seq"] for r in again.rows] != [r["seq"] for r in first.rows]
    result = golden.compare(g, again)
    assert result.ok and result.lines() == []


def test_a_local_change_diverges_where_the_new_node_runs(tmp_path):
    g = golden_of(tmp_path, capture(residual_loss()))
    result = golden.compare(g, capture(residual_loss(scale_block=1)))
    d = result.divergence
    assert not result.ok and d.got["name"] == "MulBackward0" and d.got["nth"] == 0
    assert d.position > 5  # not at the root: block 2's nodes ran as before
    text = result.describe()
    assert text.startswith(f"order differs at position {d.position} (after ")
    assert "only now: MulBackward0 #0" in text and "only in the golden" not in text
    assert "ready set at that pop" in text and "MulBackward0 #0" in text.split("ready set")[1]
    # The node PyTorch ran before was waiting for the new one's gradient.
    assert f"{golden.label(d.expected)} was not ready: it still waited for gradients from MulBackward0 #0" in text


def two_branches(sin_first):
    x = torch.randn(4, requires_grad=True)
    if sin_first:
        q = x.sin()
        p = x.exp()
    else:
        p = x.exp()
        q = x.sin()
    return (p + q).sum(), {"x": x}


def test_a_reordered_forward_shows_the_expected_node_ready_with_a_lower_priority(tmp_path):
    g = golden_of(tmp_path, capture(two_branches(sin_first=False)))
    result = golden.compare(g, capture(two_branches(sin_first=True)))
    d = result.divergence
    assert (d.position, d.expected["name"], d.got["name"]) == (2, "SinBackward0", "ExpBackward0")
    lines = result.lines()
    ready = lines[lines.index(next(x for x in lines if x.startswith("ready set"))) + 1:]
    assert ready[0].split()[0] == "ExpBackward0" and ready[0].endswith("<- popped")
    assert ready[1].split()[0] == "SinBackward0"
    assert "SinBackward0 #0 was ready too, with a lower priority: PyTorch ran ExpBackward0 #0 first" in lines


def test_a_swap_of_two_alike_branches_is_caught_by_the_leaf_names(tmp_path):
    def model(w_first):
        a = torch.ones(3, requires_grad=True)
        b = torch.ones(3, requires_grad=True)
        x = torch.randn(3)
        p, q = (x * a, x * b) if w_first else (x * b, x * a)
        return (p + q).sum(), {"a": a, "b": b}
    g = golden_of(tmp_path, capture(model(True)))
    result = golden.compare(g, capture(model(False)))
    assert not result.ok
    assert {result.divergence.expected["leaf"], result.divergence.got["leaf"]} == {"a", "b"}


def test_a_shorter_order_is_reported_at_its_end(tmp_path):
    c = capture(residual_loss())
    golden.write_golden(str(tmp_path / "g.jsonl"), c.rows + [dict(c.rows[-1], position=len(c.rows),
                                                                      leaf="extra")])
    result = golden.compare(golden.read_golden(str(tmp_path / "g.jsonl")), c)
    assert result.divergence.got is None
    assert result.lines()[0].endswith("expected AccumulateGrad(extra), got (end of order)")
    assert "PyTorch's order ends there; the golden has 1 more node(s)" in result.lines()


def test_another_torch_version_is_a_note_not_a_failure(tmp_path):
    c = capture(residual_loss())
    golden.write_golden(str(tmp_path / "g.jsonl"), [dict(r, torch="1.13.1") for r in c.rows])
    result = golden.compare(golden.read_golden(str(tmp_path / "g.jsonl")), c)
    assert result.ok
    assert result.torch_note == f"the golden order was recorded with PyTorch 1.13.1; this is PyTorch {torch.__version__}"
    assert result.lines() == ["note: " + result.torch_note]


@pytest.mark.parametrize("row, what", [
    ({"id": "n0", "name": "SumBackward0", "seq": 3}, "no 'nth' or 'leaf': not a golden order of PyTorch"),
    ({"id": "n0", "name": "SumBackward0", "nth": -1, "leaf": None}, "'nth' must be a non-negative integer"),
    ({"id": "n0", "name": "SumBackward0", "nth": True, "leaf": None}, "'nth' must be a non-negative integer"),
    ({"id": "n0", "name": "X", "nth": 0, "leaf": "w"}, "exactly one of 'nth'"),
    ({"id": "n0", "name": "X", "nth": None, "leaf": 3}, "'leaf' must be a string"),
    ({"id": "n0", "name": None, "nth": 0, "leaf": None}, "'name' must be a string"),
    ({"id": "n0", "name": "X", "nth": 0, "leaf": None, "pass": 1}, "one pass"),
])
def test_a_file_that_is_not_a_golden_order_is_refused_naming_the_row(tmp_path, row, what):
    p = tmp_path / "g.jsonl"
    p.write_text(json.dumps({"id": "n1", "name": "A", "nth": 0, "leaf": None}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(RequestError) as info:
        golden.read_golden(str(p))
    # a field every order file types (the name) is refused by read_order, by line
    assert str(info.value).startswith((f"{p}: row 2: ", f"{p}: line 2: ")) and what in str(info.value)
    assert info.value.option == "expected_order"


def test_names_from_a_file_are_shown_escaped_and_markdown_cannot_break_out(tmp_path):
    c = capture(two_branches(sin_first=False))
    hostile = "```Evil\x1b[31m\n```\n<img src=x>"
    rows = [dict(r, name=hostile) if k == 1 else r for k, r in enumerate(c.rows)]
    golden.write_golden(str(tmp_path / "g.jsonl"), rows)
    result = golden.compare(golden.read_golden(str(tmp_path / "g.jsonl")), c)
    text = result.describe()
    assert "\x1b" not in text and "```Evil\\x1b[31m\\n```\\n<img src=x> #0" in text
    assert all(ch >= " " for line in text.split("\n") for ch in line)
    md = result.markdown(["test: t"])
    fence = md.split("\n")[2]
    assert fence == "````text" and md.rstrip("\n").endswith("\n````")  # longer than the ``` in the name
    # Only the block's own fences are fences: the body's lines starting with ``` cannot close it.
    assert [line for line in md.split("\n") if line.startswith("````")] == ["````text", "````"]
    assert any(line.startswith("```Evil") for line in md.split("\n"))


# -- the command line ------------------------------------------------------------------------------

MODEL = """\
import os, torch
def main():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)]
    m = torch.nn.Sequential(*layers).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    h = m[1](m[0](x))
    if os.environ.get("AUTOGRAD_RUN_TEST_CHANGE"):
        h = h * 0.5
    return m[4](m[3](m[2](h))).sum(), dict(m.named_parameters())
"""


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return p


def test_capture_order_out_then_expect_order(tmp_path, model, capsys, monkeypatch):
    golden_file = tmp_path / "golden.jsonl"
    code, out, err = run_cli(["capture", f"{model}:main", "--order-out", str(golden_file)], capsys)
    assert code == 0, err
    assert out == f"PyTorch {torch.__version__} ran 15 nodes\norder written to {golden_file}\n"
    code, out, err = run_cli(["capture", f"{model}:main", "--expect-order", str(golden_file)], capsys)
    assert (code, err) == (0, "") and f"order matches {golden_file} (15 nodes)" in out
    monkeypatch.setenv("AUTOGRAD_RUN_TEST_CHANGE", "1")
    code, out, err = run_cli(["capture", f"{model}:main", "--expect-order", str(golden_file)], capsys)
    assert code == 3
    assert "order differs at position 10 (after AccumulateGrad(2.weight)): expected TanhBackward0 #1, got MulBackward0 #0" in err
    assert "ready set at that pop" in err and "still waited for gradients from MulBackward0 #0" in err
    assert err.rstrip("\n").endswith(f"Error: PyTorch's order differs from {golden_file}")


def test_capture_check_replays_and_compares_with_pytorch(tmp_path, model, capsys):
    golden_file = tmp_path / "golden.jsonl"
    assert run_cli(["capture", f"{model}:main", "--order-out", str(golden_file)], capsys)[0] == 0
    code, out, err = run_cli(["capture", f"{model}:main", "--expect-order", str(golden_file), "--check"], capsys)
    assert (code, err) == (0, "")
    assert "replay: order same as PyTorch (15 nodes)" in out
    assert "replay: gradients of 6 of 6 leaves within tolerance" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.jsonl", "model.py"]  # the replay's files are gone


def test_capture_golden_is_a_golden_for_run_expect_order(tmp_path, model, capsys):
    graph, order = tmp_path / "g.json", tmp_path / "o.jsonl"
    code, out, err = run_cli(["capture", f"{model}:main", "-o", str(graph), "--order-out", str(order)], capsys)
    assert code == 0, err
    assert out.startswith(f"{graph}: 15 nodes, 6 leaves; PyTorch reference: 15 nodes run\n")
    code, out, err = run_cli([str(graph), "--no-multithreading", "--no-summary", "--expect-order", str(order)], capsys)
    assert (code, err) == (0, "") and "order matches" in out


def test_capture_in_grad_mode(tmp_path, capsys):
    script = tmp_path / "m.py"
    script.write_text("import torch\n"
                      "def main():\n"
                      "    w = torch.ones(3, requires_grad=True)\n"
                      "    b = torch.ones(3, requires_grad=True)\n"
                      "    return {'outputs': (w.exp() * b).sum(), 'names': {'w': w, 'b': b}, 'inputs': [w]}\n")
    order = tmp_path / "o.jsonl"
    assert run_cli(["capture", f"{script}:main", "--order-out", str(order)], capsys)[0] == 0
    rows = read_order(str(order))
    # torch.autograd.grad(loss, [w]) runs no AccumulateGrad node: w's gradient is captured at ExpBackward0.
    assert [golden.label(r) for r in rows] == ["SumBackward0 #0", "MulBackward0 #0", "ExpBackward0 #0"]


@pytest.mark.parametrize("args, message", [
    ([], "Error: give -o FILE, --order-out FILE, --expect-order FILE or --check"),
    (["--order-out", "{tmp}/o.jsonl", "--expect-order", "{tmp}/o.jsonl"],
     "Error: --order-out: {tmp}/o.jsonl: is an input of this run; refusing to overwrite it"),
    (["--order-out", "{tmp}/model.py"], "Error: --order-out: {tmp}/model.py: is an input of this run"),
    (["-o", "{tmp}/g.json", "--order-out", "{tmp}/g.json"], "Error: --order-out: {tmp}/g.json: the graph is written"),
    (["--order-out", "{tmp}/nodir/o.jsonl"], "Error: --order-out: {tmp}/nodir/o.jsonl: no such directory"),
    (["--expect-order", "{tmp}/missing.jsonl"], "Error: --expect-order: {tmp}/missing.jsonl: no such file"),
    # The graph and its .npz never go over the golden read, nor the order and the profiler trace over the .npz.
    (["-o", "{tmp}/o.json", "--expect-order", "{tmp}/o.json"], "Error: -o: {tmp}/o.json: is an input of this run"),
    (["-o", "{tmp}/o.json", "--expect-order", "{tmp}/o.npz"], "Error: -o: {tmp}/o.npz: is an input of this run"),
    (["-o", "{tmp}/g.json", "--order-out", "{tmp}/g.npz"],
     "Error: --order-out: {tmp}/g.npz: the graph's .npz is written there already"),
    (["-o", "{tmp}/g.json", "--profile", "--profile-trace", "{tmp}/g.npz"],
     "Error: --profile-trace: {tmp}/g.npz: the graph's .npz is written there already"),
    (["-o", "{tmp}/g.json", "--profile", "--profile-trace", "{tmp}/p.json", "--order-out", "{tmp}/p.json"],
     "Error: --order-out: {tmp}/p.json: the profiler trace is written there already"),
    (["-o", "{tmp}/g.json", "--steps", "10"], "Error: --steps, --warmup and --profile-trace go with --profile"),
    (["-o", "{tmp}/g.json", "--warmup", "3"], "Error: --steps, --warmup and --profile-trace go with --profile"),
])
def test_capture_golden_usage_errors_are_reported_before_the_script_runs(tmp_path, model, capsys, args, message):
    (tmp_path / "o.jsonl").write_text("")
    for golden_file in ("o.json", "o.npz"):
        (tmp_path / golden_file).write_text('{"id": "SumBackward0"}\n')
    marker = tmp_path / "ran"
    model.write_text(f"open({str(marker)!r}, 'w').close()\n" + MODEL)
    code, out, err = run_cli(["capture", f"{model}:main", *[a.format(tmp=tmp_path) for a in args]], capsys)
    assert code == 2 and err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1
    assert not marker.exists()


class Block(nn.Module):
    def __init__(self, c, act):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.act = act()

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))))


def resnet_loss(acts):
    """A small residual CNN (stem, one block per activation, pooled head) on a batch of 2."""
    torch.manual_seed(3)
    stem = nn.Conv2d(3, 8, 3, padding=1)
    blocks = nn.Sequential(*(Block(8, a) for a in acts))
    head = nn.Linear(8, 4)
    x = torch.randn(2, 3, 8, 8)
    loss = head(blocks(stem(x)).mean((2, 3))).logsumexp(1).mean()
    return loss, dict(stem=stem.weight, **dict(blocks.named_parameters()), head=head.weight)


def test_a_residual_cnn_with_another_activation_in_one_block(tmp_path):
    g = golden_of(tmp_path, capture(resnet_loss([nn.ReLU, nn.ReLU, nn.ReLU])))
    again = capture(resnet_loss([nn.ReLU, nn.ReLU, nn.ReLU]))
    assert golden.compare(g, again).ok
    result = golden.compare(g, capture(resnet_loss([nn.ReLU, nn.GELU, nn.ReLU])))
    d = result.divergence
    # Ranks count from the loss: block 2 and block 1's outer ReLU keep theirs, and the divergence is where the
    # backward reaches block 1's inner activation (after its second convolution's parameters).
    assert result.lines()[0] == (f"order differs at position {d.position} (after AccumulateGrad(1.conv2.bias)): "
                                 "expected ReluBackward0 #3, got GeluBackward0 #0")
    assert "only in the golden: ReluBackward0 #5" in result.lines() and "only now: GeluBackward0 #0" in result.lines()
    assert [golden.label(r) for r in g.rows[:d.position]] == [golden.label(r) for r in again.rows[:d.position]]
    assert d.position > 20


def test_a_leaf_that_is_gone_is_named(tmp_path):
    def model(insert):
        torch.manual_seed(0)
        layers = [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)]
        if insert:
            layers.insert(1, nn.LayerNorm(8))  # Sequential's later parameters get other names
        m = nn.Sequential(*layers)
        return m(torch.randn(3, 4)).sum(), dict(m.named_parameters())
    g = golden_of(tmp_path, capture(model(False)))
    result = golden.compare(g, capture(model(True)))
    assert result.lines()[0].endswith("expected AccumulateGrad(2.bias), got AccumulateGrad(3.bias)")
    assert result.lines()[-1] == ("AccumulateGrad(2.bias) is not in the graph now: an AccumulateGrad node of 2.bias "
                                  "ran in the golden, no AccumulateGrad node of 2.bias now")
