"""The model zoo: real ``torch.nn`` models captured, checked against PyTorch, and replayed with threads on.

Each model in ``tests/zoo/models.py`` is captured to a JSON file with its
``.npz`` side file, then

1. ``check_graph`` replays it single-threaded: the executed order (nested
   checkpoint graphs included, with their reentrant depths) must be
   PyTorch's exactly, and every leaf's gradient must agree (float64 and
   float32: the check's tolerances; half precision: ``zoo.registry.tolerance``);
2. a session replays it with the engine's threads on, recording the order
   again, and its gradients are compared in the same way;
3. the same graph with every slot on a (virtual) accelerator, ``cuda:0``:
   now the engine's device worker thread runs every node while the caller
   waits, and order and gradients are compared once more.

The ``external`` family (``tests/zoo/external.py``) holds models nobody here wrote: torchvision, timm and
Hugging Face transformers; each skips, saying why, when its library is not installed.

Only the models that declare it may keep opaque nodes (custom Functions
whose backward builds no graph). ``docs/zoo.md`` lists every model.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the zoo compares with a real PyTorch")

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.capture.check import check_graph  # noqa: E402
from autograd_run.graphs import tensors  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from autograd_run.session import RunOptions, run_session  # noqa: E402
from zoo import external, models  # noqa: E402,F401  (registers the models)
from zoo.registry import ZOO, build, tolerance  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "zoo.md")


def capture_model(name, folder):
    entry = ZOO[name]
    case = build(entry)
    path = str(folder / f"{name}.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's own (checkpoint inputs, deprecations)
        doc = from_torch(case.outputs, case.inputs, grad_outputs=case.grad_outputs, names=case.names, path=path,
                         mode=case.mode)
    return entry, doc, path


def on_accelerator(path: str) -> str:
    """The captured file with every input slot and variable on ``cuda:0`` (virtual without a GPU)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    for n in doc["nodes"]:
        for m in n.get("inputs", ()):
            m["device"] = "cuda:0"
    for v in doc["variables"]:
        v["device"] = "cuda:0"
    moved = path[:-5] + "_cuda.json"
    with open(moved, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.link(path[:-5] + ".npz", moved[:-5] + ".npz")
    return moved


def compare_grads(got, want, rtol, atol):
    for leaf, theirs in want.items():
        ours = got.get(leaf)
        assert (ours is None) == (theirs is None), leaf
        if theirs is not None:
            ours = ours.get() if hasattr(ours, "get") and not isinstance(ours, np.ndarray) else ours  # real CUDA
            assert ours.dtype == theirs.dtype, leaf
            np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=rtol, atol=atol,
                                       err_msg=leaf)


def reference_grads(graph):
    return {k: None if v is None else tensors.materialize(v, graph.side_files)
            for k, v in graph.meta["reference"]["grads"].items()}


def test_the_zoo_is_big_and_varied():
    families = {e.family for e in ZOO.values()}
    assert len(ZOO) >= 30 and len(families) >= 10, (len(ZOO), sorted(families))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_replays_like_pytorch(name, tmp_path):
    why = ZOO[name].unavailable()
    if why:
        pytest.skip(why)
    entry, doc, path = capture_model(name, tmp_path)
    assert os.path.exists(path[:-5] + ".npz")
    opaque = {n["id"]: n["attrs"]["reason"] for n in doc["nodes"] if n.get("op") == "opaque"}
    assert len(opaque) == entry.opaque, opaque
    assert sum(n.get("op") == "python" for n in doc["nodes"]) == entry.python
    assert "hooks" not in doc["meta"], doc["meta"]["hooks"]  # no zoo model has hooks: none may be reported
    graph = load_graph(path)
    want = reference_grads(graph)
    largest = max((float(np.abs(g.astype(np.float64)).max()) for g in want.values() if g is not None and g.size),
                  default=0.0)
    rtol, atol = tolerance(entry, largest)

    allow = bool(entry.python)  # custom Functions replayed by calling their own backward
    report = check_graph(graph, rtol, atol, allow_python=allow)
    assert report.order_ok, report.divergence
    assert report.order_len[0] == report.order_len[1]
    if entry.opaque:
        assert not report.grads_compared
    else:
        assert report.grads_compared, report.note
        assert report.grads and all(g.ok for g in report.grads), [g for g in report.grads if not g.ok]

    ref = graph.meta["reference"]
    expected = [(name, seq, depth) for (name, seq, _), depth in zip(ref["order"], ref["depths"])]
    # Threads on: the engine's default mode, through the session as `autograd-run run` does; then the same
    # graph on a virtual accelerator, whose worker thread runs the nodes.
    for g, worker in ((graph, "caller"), (load_graph(on_accelerator(path)), "autograd-run cuda:0")):
        rep = run_session(g, RunOptions(multithreading=True, record_order=True, profile=False, retain_graph=True,
                                        allow_python=allow))
        assert rep.error is None, rep.error
        assert [(r["name"], r["seq"], r["depth"]) for r in rep.order] == expected
        if worker != "caller":
            assert {r["thread"] for r in rep.order if r["depth"] == 0} == {worker}
        if not entry.opaque:
            compare_grads(rep.result.grads, want, rtol, atol)


def test_every_model_is_in_the_coverage_doc():
    text = open(DOC, encoding="utf-8").read()
    missing = [name for name in ZOO if f"`{name}`" not in text]
    assert not missing, f"docs/zoo.md does not list {missing} (regenerate: python tests/zoo/report.py --write)"


def test_the_makefile_installs_the_zoo_extra():
    """`make test` installs the external family's libraries: the Makefile's list is pyproject's `zoo` extra."""
    import re
    import tomllib
    root = os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["zoo"]
    make = open(os.path.join(root, "Makefile"), encoding="utf-8").read()
    listed = re.search(r"^ZOO_EXTRAS := (.*)$", make, re.M).group(1)
    assert re.findall(r"'([^']+)'", listed) == extra
