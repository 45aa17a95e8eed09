"""``autograd-run check``: a malformed reference is a clear error (exit 2); opaque nodes fail the
check (exit 3) unless --allow-opaque, naming what was not compared; complex gradients are compared
as complex; tolerances follow the lowest precision on the way to each leaf."""

import json

import numpy as np
import pytest

from autograd_run.capture.check import check_graph
from builders import doc, leaf, node, run_cli


def seed_with(reference, tmp_path, name="g.json", nodes=None, **fields):
    """example:seed's graph (or ``nodes``) with ``meta.reference`` = ``reference``, as a file."""
    from importlib.resources import files
    import yaml
    d = yaml.safe_load((files("autograd_run.graphs") / "examples" / "seed.yaml").read_text())
    if nodes is not None:
        d = nodes
    d["meta"] = {"reference": reference}
    d.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


SEED_ORDER = [["SumBackward0", 3, None], ["AddBackward0", 2, None], ["MulBackward0", 1, None],
              ["MulBackward0", 0, None], ["AccumulateGrad", 2**64 - 1, "a"]]


def test_a_good_reference_passes(tmp_path, capsys):
    code, out, err = run_cli(["check", str(seed_with({"order": SEED_ORDER, "grads": {"a": [5.0, 5.0]}}, tmp_path))],
                             capsys)
    assert code == 0, err + out
    assert "order: 5 nodes, same as PyTorch" in out


@pytest.mark.parametrize("grads", [{}, {"b": [1.0]}])
def test_a_reference_without_a_leafs_gradient_fails_that_leaf(grads, tmp_path, capsys):
    """``grads: {}`` passed check without comparing a gradient (found by a hostile review): a leaf the replay
    gives a gradient and the reference does not hold fails, saying so."""
    from autograd_run.graphs.load import load_graph
    path = seed_with({"order": SEED_ORDER, "grads": grads}, tmp_path)
    code, out, err = run_cli(["check", str(path)], capsys)
    assert code == 3, out + err
    [a] = [g for g in check_graph(load_graph(str(path))).grads if g.name == "a"]
    assert not a.ok and "the reference holds no gradient for it" in a.note


@pytest.mark.parametrize("reference, where, what", [
    ({"order": 5}, "meta.reference.order", "must be a list of [name, seq, leaf] items, got int"),
    ({"order": ["SumBackward0", 3]}, "meta.reference.order[0]", "each item must be [name, seq, leaf]"),
    ({"order": [["SumBackward0"]]}, "meta.reference.order[0]", "each item must be [name, seq, leaf]"),
    ({"order": [[{"a": 1}, [2], None]]}, "meta.reference.order[0]", "each item must be [name, seq, leaf]"),
    ({"order": [], "grads": [1, 2]}, "meta.reference.grads", "must be a mapping of leaf names to tensors"),
    ({"order": [], "grads": {"a": "hello"}}, "meta.reference.grads.a", "unknown tensor value 'hello'"),
    ({"order": [], "grads": {"a": [[1, 2], [3]]}}, "meta.reference.grads.a", "ragged"),
    ({"order": [], "grads": {"a": {"random": "x"}}}, "meta.reference.grads.a.random", "seed"),
    ({"order": [], "grads": {"a": {"npz": "k"}}}, "meta.reference.grads.a.npz", "missing"),
    ({"order": [], "depths": [0]}, "meta.reference.depths", "must be a list of 0 non-negative integers"),
    ({"order": 5, "grads": {}}, "meta.reference.order", "got int"),
    ([1], "meta.reference", "must be a mapping with 'order' and 'grads', got list"),
    ({"order": None, "grads": {}}, "meta.reference.order", "got NoneType"),  # was a TypeError in check
    ({"grads": {"a": [5.0, 5.0]}}, "meta.reference.order", "got NoneType"),
])
def test_a_malformed_reference_is_a_clear_error(tmp_path, capsys, reference, where, what):
    path = seed_with(reference, tmp_path)
    code, out, err = run_cli(["check", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"Error: {path}: at $.{where}: ") and what in err and err.count("\n") == 1


def opaque_graph(tmp_path):
    """d = (o(a) + b * 2).sum(): ``o`` has no rule (opaque), so a's gradient cannot be compared; b's can."""
    return seed_with({"order": [["SumBackward0", 3, None], ["AddBackward0", 2, None], ["MulBackward0", 1, None],
                                ["AccumulateGrad", 2**64 - 1, "b"], ["FancyBackward0", 0, None],
                                ["AccumulateGrad", 2**64 - 1, "a"]],
                      "grads": {"a": [7.0, 7.0], "b": [2.0, 2.0]}}, tmp_path, nodes=doc(
        node("sum", "SumBackward0", seq=3, next=["add"], inputs=[[]], saved={"self_sym_sizes": [2]}),
        node("add", "AddBackward0", seq=2, next=["o", "mul"], inputs=[[2]]),
        node("o", "FancyBackward0", op="opaque", seq=0, next=["acc_a"], inputs=[[2]]),
        node("mul", "MulBackward0", seq=1, next=["acc_b", None], inputs=[[2]], saved={"other": 2.0}),
        leaf("a", [2]), leaf("b", [2])))


def test_opaque_nodes_fail_the_check_naming_what_was_not_compared(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = opaque_graph(tmp_path)
    code, out, err = run_cli(["check", str(path)], capsys)
    assert code == 3
    assert "order: 6 nodes, same as PyTorch" in out
    assert "1 opaque node(s) without a rule (o) compute zeros: gradients not compared for a" in out
    assert "not compared: opaque node 'o'" in out
    assert err == f"Error: {path}: opaque nodes keep gradients from being compared (--allow-opaque accepts that)\n"
    report = check_graph(__import__("autograd_run.graphs.load", fromlist=["x"]).load_graph(str(path)))
    assert {g.name: (g.compared, g.ok) for g in report.grads} == {"a": (False, False), "b": (True, True)}


def test_allow_opaque_accepts_them(tmp_path, capsys):
    code, out, err = run_cli(["check", str(opaque_graph(tmp_path)), "--allow-opaque"], capsys)
    assert code == 0, err


def complex_graph(tmp_path, ref):
    np.savez(tmp_path / "g.npz", g=np.array(1 + 2j, dtype=np.complex64), ref=np.asarray(ref, dtype=np.complex64))
    return seed_with({"order": [["SumBackward0", 1, None], ["MulBackward0", 0, None],
                                ["AccumulateGrad", 2**64 - 1, "a"]], "grads": {"a": {"npz": "ref"}}}, tmp_path,
                     nodes=doc(
        node("sum", "SumBackward0", seq=1, next=["mul"], inputs=[{"shape": [], "dtype": "complex64"}],
             saved={"self_sym_sizes": [2]}),
        node("mul", "MulBackward0", seq=0, next=["acc_a", None], inputs=[{"shape": [2], "dtype": "complex64"}],
             saved={"other": 2.0}),
        {**leaf("a", [2]), "inputs": [{"shape": [2], "dtype": "complex64"}]},
        roots=[{"node": "sum", "grad": {"npz": "g"}}],
        variables=[{"name": "a", "shape": [2], "dtype": "complex64"}]))


def test_complex_gradients_are_compared_as_complex(tmp_path, capsys):
    """Ours is [2+4j, 2+4j]; a reference that differs only in the imaginary part must fail."""
    code, out, err = run_cli(["check", str(complex_graph(tmp_path, [2 + 4j, 2 + 4j]))], capsys)
    assert code == 0, out + err
    code, out, err = run_cli(["check", str(complex_graph(tmp_path, [2 - 4j, 2 + 4j]))], capsys)
    assert code == 3 and "replay differs from the PyTorch reference" in err
    row = [line for line in out.splitlines() if line.startswith("│ a ")][0]
    assert "8" in row and "NO" in row  # |(2+4j) - (2-4j)| = 8


def float32_segment(tmp_path, ref):
    """d = (a.float() * 2).double().sum() for a float64 ``a``: the gradient passes through float32."""
    f32 = {"shape": [3], "dtype": "float32"}
    return seed_with({"order": [["SumBackward0", 3, None], ["ToCopyBackward0", 2, None], ["MulBackward0", 1, None],
                                ["ToCopyBackward0", 0, None], ["AccumulateGrad", 2**64 - 1, "a"]],
                      "grads": {"a": {"data": ref, "dtype": "float64"}}}, tmp_path, nodes=doc(
        node("sum", "SumBackward0", seq=3, next=["back"], inputs=[{"shape": [], "dtype": "float64"}],
             saved={"self_sym_sizes": [3]}),
        node("back", "ToCopyBackward0", seq=2, next=["mul"], inputs=[{"shape": [3], "dtype": "float64"}]),
        node("mul", "MulBackward0", seq=1, next=["to32", None], inputs=[f32], saved={"other": 2.0}),
        node("to32", "ToCopyBackward0", seq=0, next=["acc_a"], inputs=[f32]),
        {**leaf("a", [3]), "inputs": [{"shape": [3], "dtype": "float64"}]},
        variables=[{"name": "a", "shape": [3], "dtype": "float64"}]))


def test_tolerance_follows_the_lowest_precision_on_the_way_to_the_leaf(tmp_path, capsys):
    """A float32 rounding-sized difference (1e-5 relative) passes at float32's tolerance, which the report
    states, though the leaf is float64; a larger one still fails."""
    code, out, err = run_cli(["check", str(float32_segment(tmp_path, [2.00002] * 3))], capsys)
    assert code == 0, out + err
    assert "0.0001, 2e-05 (float32)" in out   # atol: 1e-5 of the largest gradient (2.00002), above 1e-6
    code, out, err = run_cli(["check", str(float32_segment(tmp_path, [2.002] * 3))], capsys)
    assert code == 3


def test_a_float64_model_with_a_float32_part_checks_against_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    from autograd_run.capture import from_torch
    from autograd_run.graphs.load import load_graph
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    y = m(torch.randn(32, 8, dtype=torch.float64))
    w = torch.randn(4, 64)
    loss = ((y.float() @ w) ** 2).sum().sqrt().double()  # a norm, in float32, of a float32 matmul
    path = str(tmp_path / "m.json")
    from_torch(loss, path=path, names=dict(m.named_parameters()))
    report = check_graph(load_graph(path))
    assert report.ok, report.grads
    assert {g.precision for g in report.grads} == {"float32"}


def _bn_pair(tmp_path):
    """conv -> BatchNorm -> 1x1 conv -> BatchNorm, float64, training mode, with large values: the first
    conv's bias, the first BatchNorm's bias and the 1x1 conv's bias have zero gradients in exact arithmetic
    (the next BatchNorm takes the mean out), which both backwards give as rounding noise."""
    torch = pytest.importorskip("torch")
    from autograd_run.capture import from_torch
    torch.manual_seed(0)
    d = torch.float64
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(d)
    x = torch.randn(4, 3, 16, 16, dtype=d) * 100
    path = tmp_path / "bn.json"
    from_torch((m(x) * 1e4).square().sum(), path=str(path), names=dict(m.named_parameters()))
    return path


def test_an_exact_zero_gradients_rounding_passes_on_the_pass_scale(tmp_path, capsys):
    path = _bn_pair(tmp_path)
    code, out, err = run_cli(["check", str(path)], capsys)
    assert code == 0, out + err
    flagged = sorted(line.split()[1] for line in out.splitlines() if "yes*" in line)
    assert flagged == ["0.bias", "1.bias", "2.bias"], out
    assert "3 leaf gradient(s) within float64's rounding" in out and "--atol sets a fixed one" in out
    assert "the largest gradient the same node gives its leaves" in out
    code, out, _ = run_cli(["check", str(path), "--atol", "1e-9"], capsys)   # a fixed atol: the noise shows
    assert code == 3 and "NO" in out


def test_the_pass_scale_does_not_hide_an_error_in_a_large_gradient(tmp_path):
    """The same graph with one weight's reference gradient off by 1e-5 of itself: the floor (1e-12 of the
    largest gradient) is far below what rtol allows that weight, so it still fails."""
    from autograd_run.graphs.load import load_graph
    path = _bn_pair(tmp_path)
    g = load_graph(str(path))
    ref = g.meta["reference"]["grads"]
    from autograd_run.graphs import tensors
    w = np.asarray(tensors.materialize(ref["2.weight"], g.side_files), dtype=np.float64)
    doc_ = json.loads(path.read_text())
    doc_["meta"]["reference"]["grads"]["2.weight"] = {"data": (w * (1 + 1e-5)).tolist(), "dtype": "float64"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc_))
    import shutil
    shutil.copy(tmp_path / "bn.npz", tmp_path / "bad.npz")
    report = check_graph(load_graph(str(bad)))
    assert not report.ok
    assert [x.name for x in report.grads if not x.ok] == ["2.weight"]


def test_a_small_branch_beside_a_large_one_keeps_a_tight_tolerance(tmp_path):
    """Two independent branches, gradients ~1e9 and ~1e-5: the floor comes from the node that computes a leaf's
    gradient (its weight and bias), not from the pass, so a wrong small gradient (sign flipped, tripled) fails."""
    torch = pytest.importorskip("torch")
    from autograd_run.capture import from_torch
    from autograd_run.graphs import tensors
    from autograd_run.graphs.load import load_graph
    torch.manual_seed(1)
    d = torch.float64
    big, small = torch.nn.Linear(6, 4).to(d), torch.nn.Linear(6, 4).to(d)
    x = torch.randn(5, 6, dtype=d)
    loss = (big(x * 1e4) * 1e2).square().sum() + (small(x) * 1e-3).square().sum()
    path = tmp_path / "two.json"
    from_torch(loss, path=str(path), names={"big.weight": big.weight, "big.bias": big.bias,
                                            "small.weight": small.weight, "small.bias": small.bias})
    assert check_graph(load_graph(str(path))).ok
    g = load_graph(str(path))
    b = np.asarray(tensors.materialize(g.meta["reference"]["grads"]["small.bias"], g.side_files), dtype=np.float64)
    assert 0 < np.abs(b).max() < 1e-3
    doc_ = json.loads(path.read_text())
    doc_["meta"]["reference"]["grads"]["small.bias"] = {"data": (-3 * b).tolist(), "dtype": "float64"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc_))
    import shutil
    shutil.copy(tmp_path / "two.npz", tmp_path / "bad.npz")
    report = check_graph(load_graph(str(bad)))
    assert [x.name for x in report.grads if not x.ok] == ["small.bias"]


def test_leaves_only_an_opaque_functions_own_backward_reaches_are_not_compared(tmp_path, capsys, monkeypatch):
    """A Reformer-style Function: its forward runs without a graph, its backward rebuilds two sub-graphs and
    calls backward on them itself, so the parameters inside get their gradients from backwards the captured
    graph does not hold. They are 'not compared' (like leaves behind an opaque node), not 'ours has none'."""
    torch = pytest.importorskip("torch")
    from autograd_run.capture import from_torch
    d = torch.float64

    class TwoNested(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, f, g):
            ctx.f, ctx.g = f, g
            ctx.save_for_backward(x)
            with torch.no_grad():
                return g(f(x))

        @staticmethod
        def backward(ctx, dy):
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x1 = x.detach().requires_grad_()
                h = ctx.f(x1)
                h1 = h.detach().requires_grad_()
                torch.autograd.backward(ctx.g(h1), dy)
                torch.autograd.backward(h, h1.grad)
            return x1.grad, None, None

    torch.manual_seed(2)
    emb, f, g = (torch.nn.Linear(4, 8).to(d), torch.nn.Linear(8, 8).to(d), torch.nn.Linear(8, 8).to(d))
    loss = TwoNested.apply(emb(torch.randn(3, 4, dtype=d)), f, g).square().mean()
    path = tmp_path / "rev.json"
    doc_ = from_torch(loss, path=str(path), names={"emb.weight": emb.weight, "f.weight": f.weight,
                                                   "g.weight": g.weight})
    assert [n["name"] for n in doc_["nodes"] if n.get("op") == "opaque"] == ["TwoNestedBackward"]
    monkeypatch.setenv("COLUMNS", "240")
    code, out, err = run_cli(["check", str(path), "--allow-opaque"], capsys)
    assert code == 0, out + err
    assert "ours has no gradient" not in out, out
    for leaf in ("f.weight", "g.weight"):
        row = next(line for line in out.splitlines() if line.startswith(f"│ {leaf} "))
        assert "not compared: no node of the graph reaches it" in row, row
