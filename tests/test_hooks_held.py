"""A leaf's register_hook transforms held as data in the graph file (``engine.tensor_hooks``): capture probes
each hook and writes scale, clamp or norm clipping as data, an importable hook function as a python hook, and
says what it did; the replay runs them as PyTorch does (tensor pre-hooks of the leaf's AccumulateGrad, in order)
and `check` agrees with PyTorch. Hostile hook entries are refused with the place."""

import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")

import custom_functions as cf  # noqa: E402
from rules_torch_cases import leaf, weigh  # noqa: E402

pytestmark = pytest.mark.torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _clip(max_norm, p=2.0, eps=1e-6):
    def hook(g):
        coef = max_norm / (torch.linalg.vector_norm(g, p) + eps)
        return g * torch.clamp(coef, max=1.0)
    return hook


def _inplace_clamp(g):
    g.clamp_(-0.2, 0.3)


HOOKS = {
    "clamp": (lambda g: g.clamp(-0.5, 0.5), [{"kind": "clamp", "min": -0.5, "max": 0.5}]),
    "clamp_min_only": (lambda g: g.clamp(min=0.0), [{"kind": "clamp", "min": 0.0}]),
    "scale": (lambda g: g * 0.25, [{"kind": "scale", "by": 0.25}]),
    "clip_norm": (_clip(0.3), [{"kind": "clip_norm", "max_norm": 0.3, "norm_type": 2.0, "eps": 1e-6}]),
    "clip_max_norm": (_clip(0.05, math.inf, 0.0), [{"kind": "clip_norm", "max_norm": 0.05, "norm_type": "inf",
                                                     "eps": 0.0}]),
    "in_place": (_inplace_clamp, [{"kind": "clamp", "min": -0.2, "max": 0.3}]),
    "python": (cf.signed_sqrt, [{"kind": "python", "callable": "custom_functions:signed_sqrt"}]),
}


def _model(seed=1):
    w = leaf(4, 3, seed=seed).requires_grad_(True)
    b = leaf(3, seed=seed + 1).requires_grad_(True)
    x = leaf(6, 4, seed=seed + 2).detach()
    return w, b, lambda: weigh(torch.tanh(x @ w + b) * 3)


def _capture(loss, names, path):
    from autograd_run.capture.graph import from_torch
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        doc = from_torch([loss], names=names, path=str(path))
    return doc, " ".join(str(w.message) for w in rec)


def _approx(specs, want):
    assert len(specs) == len(want)
    for s, w in zip(specs, want):
        assert s.keys() == w.keys() and s["kind"] == w["kind"]
        for k, v in w.items():
            assert s[k] == v if isinstance(v, str) else s[k] == pytest.approx(v, rel=1e-9, abs=1e-12), (k, s)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_a_held_hook_replays_as_pytorch(name, tmp_path):
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    hook, want = HOOKS[name]
    w, b, f = _model()
    w.register_hook(hook)
    doc, said = _capture(f(), {"w": w, "b": b}, tmp_path / "g.json")
    (vw,) = [v for v in doc["variables"] if v["name"] == "w"]
    _approx(vw["hooks"], want)
    assert "held as data" in said and "leaf 'w'" in said and "runs without them" not in said
    (entry,) = doc["meta"]["hooks"]
    assert entry["held"]
    report = check_graph(load_graph(str(tmp_path / "g.json")), rtol=1e-12, atol=1e-14, allow_python=True)
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_two_hooks_run_in_registration_order(tmp_path):
    """clamp then scale differs from scale then clamp: the order is PyTorch's."""
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    w, b, f = _model(seed=5)
    w.register_hook(lambda g: g.clamp(-0.1, 0.1))
    w.register_hook(lambda g: g * 3.0)
    doc, _ = _capture(f(), {"w": w, "b": b}, tmp_path / "g.json")
    (vw,) = [v for v in doc["variables"] if v["name"] == "w"]
    assert [h["kind"] for h in vw["hooks"]] == ["clamp", "scale"]
    assert check_graph(load_graph(str(tmp_path / "g.json")), rtol=1e-12, atol=1e-14).ok


def test_without_its_hooks_the_replay_would_differ(tmp_path):
    """The held hook is what makes the gradients agree (the test of the test)."""
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    w, b, f = _model(seed=7)
    w.register_hook(lambda g: g * 0.5)
    doc, _ = _capture(f(), {"w": w, "b": b}, tmp_path / "g.json")
    for v in doc["variables"]:
        v.pop("hooks", None)
    (tmp_path / "h.json").write_text(json.dumps(doc))
    os.replace(tmp_path / "g.npz", tmp_path / "h.npz")
    assert not check_graph(load_graph(str(tmp_path / "h.json"))).ok


def test_a_hook_nothing_describes_is_reported_not_held(tmp_path):
    w, b, f = _model(seed=9)
    w.register_hook(lambda g: g.sign() * g.abs().sqrt())  # a lambda: no data kind, not importable
    doc, said = _capture(f(), {"w": w, "b": b}, tmp_path / "g.json")
    (vw,) = [v for v in doc["variables"] if v["name"] == "w"]
    assert "hooks" not in vw
    assert "runs without them" in said and "leaf 'w'" in said
    assert "held" not in doc["meta"]["hooks"][0]


def test_a_python_hook_needs_allow_python(tmp_path):
    from autograd_run.errors import GraphFileError
    from autograd_run.graphs.load import load_graph
    w, b, f = _model(seed=11)
    w.register_hook(cf.signed_sqrt)
    _capture(f(), {"w": w, "b": b}, tmp_path / "g.json")
    with pytest.raises(GraphFileError, match=r"variable 'w' hooks\[0\].*custom_functions:signed_sqrt.*--allow-python"):
        load_graph(str(tmp_path / "g.json"), allow_python=False)


def _refused_by_validate(doc: dict, where: str, what: str, tmp_path) -> None:
    """``autograd-run validate`` on ``doc`` exits 2 with ``Error:`` naming ``where`` and ``what``, no traceback."""
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "autograd_run", "validate", str(p)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("Error:") and where in r.stderr and what in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("hooks, where, what", [
    ([{"kind": "rm -rf"}], "hooks[0].kind", "must be one of"),
    ([{"kind": "scale"}], "hooks[0].by", "needs by"),
    ([{"kind": "scale", "by": "nan"}], "hooks[0].by", "finite number"),
    ([{"kind": "scale", "by": True}], "hooks[0].by", "finite number"),
    ([{"kind": "clamp"}], "hooks[0]", "needs min or max"),
    ([{"kind": "clamp", "min": 2, "max": 1}], "hooks[0]", "above max"),
    ([{"kind": "clip_norm", "max_norm": -1}], "hooks[0].max_norm", "at least 0"),
    ([{"kind": "clip_norm", "max_norm": 1, "norm_type": 0}], "hooks[0].norm_type", "at least"),
    ([{"kind": "scale", "by": 2, "extra": 1}], "hooks[0].extra", "unknown field"),
    ([{"kind": "python", "callable": "os.system"}], "hooks[0].callable", "module:function"),
    ([{"kind": "scale", "by": 1}] * 17, "hooks", "limit of 16"),
    ("scale", "hooks", "must be a list"),
    ([{"kind": []}], "hooks[0].kind", "must be one of"),
    ([{"kind": {"a": 1}}], "hooks[0].kind", "must be one of"),
])
def test_hostile_hooks_are_refused_with_the_place(hooks, where, what, tmp_path):
    doc = {"format": "autograd-graph/1", "nodes": [{"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": [2]}]}],
           "roots": [{"node": "acc", "grad": [1.0, 1.0]}],
           "variables": [{"name": "w", "shape": [2], "hooks": hooks}]}
    _refused_by_validate(doc, where, what, tmp_path)


@pytest.mark.parametrize("cmd", ["run", "validate", "simulate"])
def test_a_python_hook_on_a_node_needs_allow_python(cmd, tmp_path):
    """A non-leaf tensor's hook is held on its consumer node (``attrs.hooks``); a python one there imports and
    calls code named by the file, so like a variable's it is refused without ``--allow-python`` (a review found
    it ran)."""
    marker = tmp_path / "ran"
    mod = tmp_path / "evil_hook_mod.py"
    mod.write_text(f"def hook(g):\n    open({str(marker)!r}, 'w').write('x')\n    return g\n")
    doc = {"format": "autograd-graph/1", "nodes": [{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None],
                      "saved": {"other": {"data": [3.0, -4.0], "shape": [2], "dtype": "float64"}},
                      "inputs": [{"shape": [2], "dtype": "float64"}],
                      "attrs": {"hooks": [{"kind": "python", "callable": "evil_hook_mod:hook", "slot": 0}]}},
                     {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": [2], "dtype": "float64"}]}],
           "roots": [{"node": "mul", "grad": {"data": [1.0, 1.0], "shape": [2], "dtype": "float64"}}],
           "variables": [{"name": "w", "shape": [2], "dtype": "float64"}]}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "autograd_run", cmd, str(p)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    if cmd == "simulate":  # the virtual clock runs no gradient code, so it needs no permission and calls nothing
        assert r.returncode == 0 and not marker.exists(), r.stdout + r.stderr
        return
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("Error:") and "attrs.hooks[0]" in r.stderr and "--allow-python" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists()
    if cmd == "run":  # with the flag it runs, and the hook is what ran
        r = subprocess.run([sys.executable, "-m", "autograd_run", cmd, str(p), "--allow-python"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert marker.exists()


def test_run_command_replays_held_hooks(tmp_path):
    """The whole user path: a hand-written file with a clamp on a leaf, run from the command line."""
    doc = {"format": "autograd-graph/1", "nodes": [{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None],
                      "saved": {"other": {"data": [3.0, -4.0], "shape": [2], "dtype": "float64"}},
                      "inputs": [{"shape": [2], "dtype": "float64"}]},
                     {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": [2], "dtype": "float64"}]}],
           "roots": [{"node": "mul", "grad": {"data": [1.0, 1.0], "shape": [2], "dtype": "float64"}}],
           "variables": [{"name": "w", "shape": [2], "dtype": "float64",
                          "hooks": [{"kind": "clamp", "min": -1.0, "max": 2.5}]}]}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, "-m", "autograd_run", "run", str(p), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    grads = out.get("grads") or out.get("gradients")
    assert grads is not None, sorted(out)
    np.testing.assert_allclose(np.asarray(grads["w"]["data"] if isinstance(grads["w"], dict) else grads["w"]),
                               [2.5, -1.0])


# -- hooks on non-leaf tensors: held as what they did (observed) -------------------------------------------------


def _chain(seed):
    w = leaf(4, 3, seed=seed).requires_grad_(True)
    x = leaf(5, 4, seed=seed + 1).detach()
    h = x @ w
    z = torch.tanh(h) * 3
    return w, h, z


def test_non_leaf_hooks_are_held_as_observed(tmp_path):
    """A clamp on one intermediate and a gradient reversal (scale -0.5) on another: held on the consumer nodes'
    slots as what they did to the captured gradient; the replay agrees with PyTorch."""
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    w, h, z = _chain(21)
    h.register_hook(lambda g: g.clamp(-0.05, 0.05))
    z.register_hook(lambda g: g * -0.5)
    doc, said = _capture(weigh(torch.sin(z)), {"w": w}, tmp_path / "g.json")
    held = {n["name"]: n["attrs"]["hooks"] for n in doc["nodes"] if (n.get("attrs") or {}).get("hooks")}
    assert held == {"MmBackward0": [{"slot": 0, "kind": "clamp", "min": -0.05, "max": 0.05, "observed": True}],
                    "MulBackward0": [{"slot": 0, "kind": "scale", "by": -0.5, "observed": True}]}
    assert "held as data" in said and "(observed)" in said and "runs without them" not in said
    report = check_graph(load_graph(str(tmp_path / "g.json")), rtol=1e-12, atol=1e-14)
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_a_non_leaf_hook_nothing_fits_is_still_reported(tmp_path):
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    w, h, z = _chain(23)
    z.register_hook(lambda g: g.abs().sqrt())
    doc, said = _capture(weigh(torch.sin(z)), {"w": w}, tmp_path / "g.json")
    assert not any((n.get("attrs") or {}).get("hooks") for n in doc["nodes"])
    assert "runs without them" in said
    report = check_graph(load_graph(str(tmp_path / "g.json")))
    assert not report.ok and "does not hold" in report.note


@pytest.mark.parametrize("hooks, where, what", [
    ([{"kind": "scale", "by": 2}], "attrs.hooks[0].slot", "input slot"),
    ([{"kind": "scale", "by": 2, "slot": 3}], "attrs.hooks[0].slot", "input slot of the node (0 to 0)"),
    ([{"kind": "scale", "by": 2, "slot": 0, "observed": "yes"}], "attrs.hooks[0].observed", "true or false"),
    ([{"kind": "clamp", "slot": 0}], "attrs.hooks[0]", "needs min or max"),
])
def test_hostile_node_hooks_are_refused_with_the_place(hooks, where, what, tmp_path):
    doc = {"format": "autograd-graph/1",
           "nodes": [{"id": "neg", "name": "NegBackward0", "next": [["acc", 0]], "attrs": {"hooks": hooks},
                      "inputs": [{"shape": [2]}]},
                     {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": [2]}]}],
           "roots": [{"node": "neg", "grad": [1.0, 1.0]}],
           "variables": [{"name": "w", "shape": [2]}]}
    _refused_by_validate(doc, where, what, tmp_path)


def test_a_node_hook_runs_before_the_node(tmp_path):
    """attrs.hooks on a hand-written file: the slot's gradient is clamped before NegBackward0 negates it."""
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    doc = {"format": "autograd-graph/1",
           "nodes": [{"id": "neg", "name": "NegBackward0", "next": [["acc", 0]],
                      "attrs": {"hooks": [{"slot": 0, "kind": "clamp", "min": -1.0, "max": 0.5}]},
                      "inputs": [{"shape": [3], "dtype": "float64"}]},
                     {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": [3], "dtype": "float64"}]}],
           "roots": [{"node": "neg", "grad": {"data": [2.0, -3.0, 0.25], "shape": [3], "dtype": "float64"}}],
           "variables": [{"name": "w", "shape": [3], "dtype": "float64"}]}
    p = tmp_path / "g.json"
    p.write_text(json.dumps(doc))
    eng = Engine(multithreading=False)
    try:
        res = run_graph(eng, load_graph(str(p)))
    finally:
        eng.shutdown()
    np.testing.assert_array_equal(res.grads["w"], [-0.5, 1.0, -0.25])


# -- nn.Module full backward hooks ------------------------------------------------------------------------------
#
# register_full_backward_hook replaces a module's grad_input and register_full_backward_pre_hook its grad_output,
# as post-hooks of the BackwardHookFunctionBackward pass-throughs around the module. The reference backward sees
# what such a node received and what it sent; a change one observation fits is held on the node's slot.

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 5)
        self.b = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _net(seed):
    torch.manual_seed(seed)
    m = _Net().double()
    return m, torch.randn(6, 4, dtype=torch.float64)


def _module_case(tmp_path, seed, setup, x_requires_grad=False):
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    m, x = _net(seed)
    setup(m)
    x.requires_grad_(x_requires_grad)
    names = dict(m.named_parameters(), **({"x": x} if x_requires_grad else {}))
    doc, said = _capture(weigh(m(x) * 2), names, tmp_path / "g.json")
    report = check_graph(load_graph(str(tmp_path / "g.json")), rtol=1e-12, atol=1e-14)
    held = [h for n in doc["nodes"] if n["name"] == "BackwardHookFunctionBackward"
            for h in (n.get("attrs") or {}).get("hooks", [])]
    return doc, said, report, held


def test_a_module_hook_that_scales_grad_input_is_held(tmp_path):
    doc, said, report, held = _module_case(
        tmp_path, 31, lambda m: m.b.register_full_backward_hook(lambda mod, gi, go: tuple(g * -0.5 for g in gi)))
    assert held == [{"slot": 0, "kind": "scale", "by": -0.5, "observed": True}]
    assert "held as data" in said and "runs without them" not in said
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_a_module_pre_hook_that_clamps_grad_output_is_held(tmp_path):
    doc, said, report, held = _module_case(
        tmp_path, 32, lambda m: m.b.register_full_backward_pre_hook(lambda mod, go: tuple(g.clamp(-0.1, 0.1)
                                                                                        for g in go)))
    assert [h["kind"] for h in held] == ["clamp"] and held[0]["max"] == pytest.approx(0.1)
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_a_module_hook_on_the_inputs_of_a_model_whose_input_is_a_leaf(tmp_path):
    doc, said, report, held = _module_case(
        tmp_path, 33, lambda m: m.register_full_backward_hook(lambda mod, gi, go: tuple(g * 3.0 for g in gi)),
        x_requires_grad=True)
    assert held == [{"slot": 0, "kind": "scale", "by": 3.0, "observed": True}]
    assert report.ok and {g.name for g in report.grads} >= {"x"}


def test_module_hooks_that_only_look_are_said_to_change_nothing(tmp_path):
    seen = []
    doc, said, report, held = _module_case(
        tmp_path, 34, lambda m: (m.a.register_full_backward_hook(lambda mod, gi, go: seen.append("a")),
                                 m.b.register_full_backward_pre_hook(lambda mod, go: seen.append("b"))))
    assert seen and not held
    assert all(e.get("unchanged") is True for e in doc["meta"]["hooks"])
    assert "changed no gradient" in said and "runs without them" not in said
    assert report.ok and "does not hold" not in (report.note or "")


def test_a_module_hook_nothing_fits_is_still_reported(tmp_path):
    doc, said, report, held = _module_case(
        tmp_path, 35, lambda m: m.b.register_full_backward_hook(lambda mod, gi, go: tuple(g.abs().sqrt()
                                                                                        for g in gi)))
    assert not held
    assert "runs without them" in said
    assert not report.ok and "does not hold" in report.note


def test_a_tensor_hook_and_a_module_pre_hook_on_one_pass_through_run_in_pytorchs_order(tmp_path):
    """The module's output has a tensor hook (scale) and the module a pre-hook (clamp) on the same node:
    PyTorch runs the tensor hook first; the held hooks keep that order (clamp then scale would differ)."""
    def setup(m):
        m.b.register_full_backward_pre_hook(lambda mod, go: tuple(g.clamp(-0.2, 0.2) for g in go))
        orig = m.forward

        def forward(x):
            y = orig(x)
            y.register_hook(lambda g: g * 4.0)
            return y
        m.forward = forward
    doc, said, report, held = _module_case(tmp_path, 36, setup)
    assert [h["kind"] for h in held] == ["scale", "clamp"]
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_a_hook_on_a_requested_non_leaf_input_whose_node_does_not_run_is_held(tmp_path):
    """grad(y, [h]) with a hook on h: h's node is not needed, so PyTorch runs h's hooks on the gradient and
    captures the result; no node pre-hook sees that, the captured result does."""
    from autograd_run.capture.check import check_graph
    from autograd_run.capture.graph import from_torch
    from autograd_run.graphs.load import load_graph
    a = leaf(3, seed=31).requires_grad_(True)
    h = a.exp()
    h.register_hook(lambda g: g * 2)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        doc = from_torch([(h * h).sum()], [h], names={"a": a}, path=str(tmp_path / "g.json"))
    said = " ".join(str(w.message) for w in rec)
    held = {n["name"]: n["attrs"]["hooks"] for n in doc["nodes"] if (n.get("attrs") or {}).get("hooks")}
    assert held == {"ExpBackward0": [{"slot": 0, "kind": "scale", "by": 2.0, "observed": True}]}, said
    report = check_graph(load_graph(str(tmp_path / "g.json")), rtol=1e-12, atol=1e-14)
    assert report.ok, (report.note, [(g.name, g.max_abs) for g in report.grads])


def test_a_node_post_hook_that_changes_a_gradient_is_reported(tmp_path):
    """grad_fn.register_hook(fn) returning new grad_inputs: not held, but said (not a silent difference)."""
    from autograd_run.capture.check import check_graph
    from autograd_run.graphs.load import load_graph
    a = leaf(3, seed=32).requires_grad_(True)
    y = a.exp() * 3
    y.grad_fn.register_hook(lambda gi, go: (gi[0] * 2, None))
    doc, said = _capture(y.sum(), {"a": a}, tmp_path / "g.json")
    assert "runs without them" in said and "node n1 (MulBackward0)" in said, said
    assert [e["how"].split(" (")[0] for e in doc["meta"]["hooks"]] == ["a node post-hook"]
    report = check_graph(load_graph(str(tmp_path / "g.json")))
    assert not report.ok and "does not hold" in report.note


def test_a_node_post_hook_that_only_looks_is_not_reported(tmp_path):
    a = leaf(3, seed=33).requires_grad_(True)
    y = a.exp() * 3
    seen = []
    y.grad_fn.register_hook(lambda gi, go: seen.append(1))
    doc, said = _capture(y.sum(), {"a": a}, tmp_path / "g.json")
    assert seen and "hooks" not in doc.get("meta", {}) and "hook" not in said


def test_a_hook_on_a_complex_intermediate_is_reported_with_its_modulus_and_no_torch_warning(tmp_path):
    a = torch.tensor([1 + 2j, -0.5j, 3.0], dtype=torch.complex128, requires_grad=True)
    h = a * 2
    h.register_hook(lambda g: g * 0.5)
    doc, said = _capture(h.abs().sum(), {"a": a}, tmp_path / "g.json")
    assert "Casting complex values to real" not in said, said
    entry, = doc["meta"]["hooks"]
    assert entry["how"] == "a hook changed its gradient (max abs change 0.5)"
