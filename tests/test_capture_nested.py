"""Capturing what exists only during PyTorch's backward: reentrant checkpoints and custom Functions as their
nested graphs, the ones that cannot be kept (opaque, with the reason), and hooks (warned about, listed)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="capture needs torch")
nn = torch.nn
F = torch.nn.functional

from torch.utils.checkpoint import checkpoint  # noqa: E402

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.capture.check import check_graph  # noqa: E402
from autograd_run.engine import Engine  # noqa: E402
from autograd_run.engine.run import run_graph  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from autograd_run.session import RunOptions, run_session  # noqa: E402
from builders import run_cli  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]
D = torch.float64


def capture(tmp_path, outputs, **kw):
    path = str(tmp_path / "g.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = from_torch(outputs, path=path, **kw)
    return doc, load_graph(path)


def nested_model():
    """loss = head(ckpt_outer(x)); the outer segment checkpoints an inner block; w is used inside and outside."""
    torch.manual_seed(0)
    a, b, head = nn.Linear(3, 3).double(), nn.Linear(3, 3).double(), nn.Linear(3, 1).double()
    x = torch.randn(4, 3, dtype=D, requires_grad=True)

    def inner(t):
        return torch.sigmoid(b(t))

    def outer(t):
        return checkpoint(inner, torch.tanh(a(t)), use_reentrant=True) * 2
    y = checkpoint(outer, x, use_reentrant=True)
    loss = head(y).pow(2).sum() + a.weight.sum()
    names = {"x": x, **{f"a.{k}": v for k, v in a.named_parameters()},
             **{f"b.{k}": v for k, v in b.named_parameters()}, **{f"head.{k}": v for k, v in head.named_parameters()}}
    return loss, names


def test_nested_checkpoints_are_captured_as_their_graphs(tmp_path):
    loss, names = nested_model()
    before = {k: None if v.grad is None else v.grad.clone() for k, v in names.items()}
    doc, g = capture(tmp_path, loss, names=names)
    # The user's leaves keep their .grad (also those found only inside checkpoints).
    assert all(v.grad is None for v in names.values()) and all(b is None for b in before.values())
    ckpts = [n for n in doc["nodes"] if n["name"] == "CheckpointFunctionBackward"]
    assert len(ckpts) == 2 and all(n["op"] == "checkpoint" for n in ckpts)
    for n in ckpts:
        inner = n["attrs"]["inner"]
        assert inner["inputs"] == [f"{n['id']}.input0"]
        assert "mode" not in inner and "checkpoint" not in inner
        root = g.by_id[inner["roots"][0][0]]
        assert root.name in ("MulBackward0", "SigmoidBackward0")
    # The reference order is PyTorch's, inner nodes included, and the replay matches it.
    ref = doc["meta"]["reference"]
    # Every node ran once, and a.weight's AccumulateGrad twice: in the outer backward and in the nested one.
    assert len(ref["order"]) == len(doc["nodes"]) + 1
    assert set(ref["grads"]) == set(names)
    report = check_graph(g)
    assert report.ok and report.grads_compared, (report.divergence, report.grads)
    # Depths: the outer checkpoint's graph runs one level deeper, the inner one two.
    rep = run_session(g, RunOptions(multithreading=False, record_order=True, profile=False))
    depth = {r["id"]: r["depth"] for r in rep.order}
    sig = next(n["id"] for n in doc["nodes"] if n["name"] == "SigmoidBackward0")
    tanh = next(n["id"] for n in doc["nodes"] if n["name"] == "TanhBackward0")
    assert (depth[ckpts[0]["id"]], depth[tanh], depth[sig]) == (0, 1, 2)
    # The detached inputs are not user leaves.
    assert not any(k.endswith(".input0") for k in rep.result.grads)


def test_discovered_without_a_reference_too():
    loss, names = nested_model()
    doc = from_torch(loss, names=names, reference=False)
    assert "meta" not in doc
    assert sum(n.get("op") == "checkpoint" for n in doc["nodes"]) == 2


def test_a_checkpoint_replays_with_threads_and_repeats(tmp_path):
    loss, names = nested_model()
    _, g = capture(tmp_path, loss, names=names)
    rep = run_session(g, RunOptions(multithreading=True, repeat=3, profile=False))
    assert rep.error is None
    want = {k: v.grad for k, v in names.items()}
    loss.backward(retain_graph=True)
    for k, v in names.items():
        np.testing.assert_allclose(rep.result.grads[k], v.grad.numpy(), rtol=1e-10, err_msg=k)
    del want


class RecomputeTanh(torch.autograd.Function):
    """Saves its input; backward differentiates a recomputation with torch.autograd.grad."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.tanh(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            return torch.autograd.grad(torch.tanh(xd), xd, g)


class ScaledRecompute(RecomputeTanh):
    """The same, but it scales the nested gradient: not the nested call's result any more."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            (dx,) = torch.autograd.grad(torch.tanh(xd), xd, g)
        return dx * 0.5


class CubeKeepingAModule(torch.autograd.Function):
    """A Python-only backward whose ctx holds a module: no file can hold it (an importable Function with
    data-only ctx becomes a python node instead: tests/test_capture_custom_function.py)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.act = torch.nn.Tanh()
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g


def test_a_custom_function_with_a_nested_grad_call_is_kept_and_runs_under_grad(tmp_path):
    torch.manual_seed(1)
    w = torch.randn(3, 3, dtype=D, requires_grad=True)
    x = torch.randn(2, 3, dtype=D, requires_grad=True)
    loss = RecomputeTanh.apply(x @ w).pow(2).sum()
    doc, g = capture(tmp_path, loss, names={"w": w, "x": x})
    node = next(n for n in doc["nodes"] if n["name"] == "RecomputeTanhBackward")
    assert node["op"] == "checkpoint"
    assert node["attrs"]["inner"]["mode"] == "grad" and node["attrs"]["inner"]["checkpoint"] is False
    assert check_graph(g).ok
    # Unlike torch.utils.checkpoint, it runs inside grad(): compare with PyTorch's grad().
    (theirs,) = torch.autograd.grad(loss, [w], retain_graph=True)
    res = run_graph(Engine(multithreading=False), g, mode="grad", inputs=["w"])
    np.testing.assert_allclose(res.grads["w"], theirs.numpy(), rtol=1e-10)


@pytest.mark.parametrize("fn, why", [
    (CubeKeepingAModule, "builds no autograd graph (no nested backward() or grad() call whose graph could be "
                         "replayed), and its ctx.act is a Tanh a graph file cannot hold"),
    (ScaledRecompute, "is not one its nested grad() computed"),
])
def test_custom_functions_that_cannot_be_kept_are_opaque_saying_why(tmp_path, fn, why):
    torch.manual_seed(2)
    x = torch.randn(4, dtype=D, requires_grad=True)
    loss = fn.apply(x * 2).sum()
    doc, g = capture(tmp_path, loss, names={"x": x})
    node = next(n for n in doc["nodes"] if n["name"] == f"{fn.__name__}Backward")
    assert node["op"] == "opaque"
    reason = node["attrs"]["reason"]
    assert reason.startswith(f"custom autograd.Function {fn.__module__}.{fn.__qualname__}: ") and why in reason
    report = check_graph(g)
    assert report.order_ok and not report.grads_compared


def test_non_reentrant_checkpoints_leave_a_plain_graph(tmp_path):
    torch.manual_seed(3)
    lin = nn.Linear(3, 3).double()
    x = torch.randn(2, 3, dtype=D, requires_grad=True)
    loss = checkpoint(lambda t: torch.tanh(lin(t)).exp(), x, use_reentrant=False).sum()
    doc, g = capture(tmp_path, loss, names={"x": x, **dict(lin.named_parameters())})
    assert not any(n.get("op") in ("checkpoint", "opaque") for n in doc["nodes"])
    assert check_graph(g).ok
    # Unlike the reentrant kind, it may be differentiated with grad().
    (tx,) = torch.autograd.grad(loss, [x], retain_graph=True)
    res = run_graph(Engine(multithreading=False), g, mode="grad", inputs=["x"])
    np.testing.assert_allclose(res.grads["x"], tx.numpy(), rtol=1e-10)


# --- hooks ----------------------------------------------------------------------------------------------


def hooked(transform=lambda g: g.abs().sqrt()):
    torch.manual_seed(4)
    lin = nn.Linear(3, 3).double()
    x = torch.randn(4, 3, dtype=D, requires_grad=True)
    h = lin(x)
    h.register_hook(transform)                            # a hook on an activation no data kind describes
    y = torch.tanh(h)
    y.register_hook(lambda g: None)                       # an observer: changes nothing
    return y.sum(), {"x": x, **dict(lin.named_parameters())}


def test_tensor_hooks_are_named_and_explain_the_mismatch(tmp_path):
    loss, names = hooked()
    path = str(tmp_path / "g.json")
    with pytest.warns(UserWarning, match=r"output 0 of AddmmBackward0 \(node n\d+\)") as rec:
        doc = from_torch(loss, names=names, path=path)
    assert len([w for w in rec if "tensor hooks" in str(w.message)]) == 1
    hooks = doc["meta"]["hooks"]
    assert [h["tensor"].split(" (")[0] for h in hooks] == ["output 0 of AddmmBackward0"]
    report = check_graph(load_graph(path))
    assert report.order_ok and not report.ok
    assert "hooks that the graph file does not hold" in report.note


def test_gradient_clipping_on_an_activation_is_held_as_observed(tmp_path):
    """The same activation clipped by value (a kind one observation fixes): held on AddmmBackward0's slot, as
    far as the captured gradient shows it (all its entries are positive here: only the upper bound is seen)."""
    loss, names = hooked(lambda g: g.clamp(-0.05, 0.05))
    path = str(tmp_path / "g.json")
    with pytest.warns(UserWarning, match=r"held as data.*clamp\(max=0.05\) \(observed\)"):
        doc = from_torch(loss, names=names, path=path)
    assert doc["meta"]["hooks"][0]["held"]
    assert check_graph(load_graph(path)).ok


def test_leaf_and_module_hooks_are_named():
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU()).double()
    m[0].register_full_backward_hook(lambda mod, gi, go: None)
    m[0].weight.register_hook(lambda g: g * 2)
    m[0].bias.register_post_accumulate_grad_hook(lambda p: None)
    loss = m(torch.randn(2, 3, dtype=D, requires_grad=True)).sum()
    with pytest.warns(UserWarning) as rec:
        doc = from_torch(loss, names=dict(m.named_parameters()))
    text = " ".join(str(w.message) for w in rec)
    assert "leaf '0.weight'" in text and "leaf '0.bias'" in text and "BackwardHookFunctionBackward" in text
    hows = {h["tensor"]: h["how"] for h in doc["meta"]["hooks"]}
    assert hows["leaf '0.weight'"] == "register_hook"
    assert hows["leaf '0.bias'"] == "register_post_accumulate_grad_hook"
    # The hook nodes themselves replay (they pass gradients through): nothing opaque.
    assert not any(n.get("op") == "opaque" for n in doc["nodes"])


def test_no_hooks_no_warning():
    torch.manual_seed(6)
    lin = nn.Linear(3, 3).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        doc = from_torch(lin(torch.randn(2, 3, dtype=D)).sum(), names=dict(lin.named_parameters()))
    assert "hooks" not in doc["meta"]


def test_capture_command_prints_hooks_and_nested_graphs(tmp_path, capsys):
    script = tmp_path / "m.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.checkpoint import checkpoint\n"
        "def main():\n"
        "    torch.manual_seed(0)\n"
        "    lin = torch.nn.Linear(3, 3).double()\n"
        "    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)\n"
        "    h = checkpoint(lin, x, use_reentrant=True)\n"
        "    h.register_hook(lambda g: g.cumsum(0))\n"
        "    return h.sum(), dict(lin.named_parameters(), x=x)\n")
    out = tmp_path / "m.json"
    code, text, err = run_cli(["capture", f"{script}:main", "-o", str(out)], capsys)
    assert code == 0, err
    assert "1 checkpoint(s) with their nested graphs" in text
    assert err.count("Warning: tensor hooks are not part of the graph file") == 1
    code, text, _ = run_cli(["check", str(out)], capsys)
    assert code == 3 and "hooks that the graph file does not hold" in text


def test_checkpoints_nested_past_the_hand_off_depth(tmp_path):
    """64 nested checkpoints: PyTorch runs the nested backward 60 levels deep on a pool thread; capture follows
    it there, leaves .grad untouched, and the replay (which hands off at the same depth) matches."""
    import functools

    def nested(k, t, w):
        if k == 0:
            return torch.tanh(t * w)
        return checkpoint(functools.partial(nested, k - 1, w=w), t, use_reentrant=True)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, generator=g, dtype=D).requires_grad_()
    w = torch.randn(4, generator=g, dtype=D).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = nested(64, x, w).sum()
    doc, graph = capture(tmp_path, loss, names={"x": x, "w": w})
    assert x.grad is None and w.grad is None
    assert sum(n.get("op") == "checkpoint" for n in doc["nodes"]) == 64
    assert not any(n.get("op") == "opaque" for n in doc["nodes"])
    report = check_graph(graph)
    assert report.ok and report.grads_compared, (report.divergence, report.grads)
    rep = run_session(graph, RunOptions(multithreading=True, record_order=True, profile=False))
    assert max(r["depth"] for r in rep.order) == 64
    assert any(r["thread"].startswith("autograd-run reentrant") for r in rep.order)


def test_pytorchs_depths_are_recorded_and_compared(tmp_path):
    import json
    loss, names = nested_model()
    doc, g = capture(tmp_path, loss, names=names)
    ref = doc["meta"]["reference"]
    assert sorted(set(ref["depths"])) == [0, 1, 2] and len(ref["depths"]) == len(ref["order"])
    rep = run_session(g, RunOptions(multithreading=False, record_order=True, profile=False))
    assert [r["depth"] for r in rep.order] == ref["depths"]
    # A reference whose depths differ is a divergence, named with the depths.
    k = ref["depths"].index(1)
    ref["depths"][k] = 0
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    (tmp_path / "tampered.npz").write_bytes((tmp_path / "g.npz").read_bytes())
    report = check_graph(load_graph(str(path)))
    assert not report.order_ok and report.divergence["position"] == k
    assert report.divergence["expected"][-1] == "depth 0" and report.divergence["got"][-1] == "depth 1"


def test_outputs_that_are_leaves_and_outputs_without_grad():
    w = torch.tensor([1.0, 2.0], dtype=D, requires_grad=True)
    doc = from_torch([(w * 3).sum(), w], grad_outputs=[None, torch.tensor([0.5, 0.25], dtype=D)], names={"w": w})
    g = load_graph_doc(doc)
    res = run_graph(Engine(multithreading=False), g)
    np.testing.assert_allclose(res.grads["w"], [3.5, 3.25])
    with pytest.raises(RuntimeError) as theirs:
        torch.autograd.backward([torch.ones(2, dtype=D)])
    with pytest.raises(ValueError) as ours:
        from_torch([torch.ones(2, dtype=D)])
    assert str(ours.value) == str(theirs.value)


def load_graph_doc(doc):
    import json
    from autograd_run.graphs.load import loads_graph
    return loads_graph(json.dumps(doc), "doc.json")


# --- what inline JSON cannot hold, sparse gradients ------------------------------------------------------------


def test_inline_capture_refuses_non_finite_and_complex_tensors_clearly(tmp_path):
    lp = torch.randn(6, 2, 4, dtype=D, requires_grad=True)
    loss = F.ctc_loss(lp.log_softmax(-1), torch.tensor([[1, 2], [3, 1]]), (6, 5), (2, 2), reduction="sum")
    with pytest.raises(ValueError, match="inf or nan values cannot be written inline"):
        from_torch(loss, names={"lp": lp}, reference=False)
    w = torch.randn(2, 2, dtype=torch.complex128, requires_grad=True)
    with pytest.raises(ValueError, match="complex tensor cannot be written inline"):
        from_torch((w * w).abs().sum(), names={"w": w}, reference=False)
    # With a path both go to the .npz file and replay.
    for out, names in ((loss, {"lp": lp}), ((w * w).abs().sum(), {"w": w})):
        _, g = capture(tmp_path, out, names=names)
        assert check_graph(g).ok


def test_sparse_gradients_are_captured_dense(tmp_path):
    torch.manual_seed(7)
    emb = nn.Embedding(6, 3, sparse=True).double()
    loss = emb(torch.tensor([1, 4, 1])).pow(2).sum()
    doc, g = capture(tmp_path, loss, names=dict(emb.named_parameters()))
    report = check_graph(g)
    assert report.ok and report.grads_compared
