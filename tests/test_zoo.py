"""The model zoo: real ``torch.nn`` models captured, checked against PyTorch, and replayed with threads on.

Each model in ``tests/zoo/models.py`` is captured to a JSON file with its
``.npz`` side file, then

1. ``check_graph`` replays it single-threaded: the executed order (nested
   checkpoint graphs included) must be PyTorch's exactly, and every leaf's
   gradient must agree (float64 and float32: the check's tolerances; half
   precision: ``zoo.registry.tolerance``);
2. a session replays it with the engine's threads on, recording the order
   again, and its gradients are compared in the same way.

Only the models that declare it may keep opaque nodes (custom Functions
whose backward builds no graph). ``docs/zoo.md`` lists every model.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the zoo compares with a real PyTorch")

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.check import check_graph  # noqa: E402
from autograd_run.graphs import tensors  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from autograd_run.session import RunOptions, run_session  # noqa: E402
from zoo import models  # noqa: E402,F401  (registers the models)
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


def reference_grads(graph):
    return {k: None if v is None else tensors.materialize(v, graph.side_files)
            for k, v in graph.meta["reference"]["grads"].items()}


def test_the_zoo_is_big_and_varied():
    families = {e.family for e in ZOO.values()}
    assert len(ZOO) >= 30 and len(families) >= 10, (len(ZOO), sorted(families))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_replays_like_pytorch(name, tmp_path):
    entry, doc, path = capture_model(name, tmp_path)
    assert os.path.exists(path[:-5] + ".npz")
    opaque = {n["id"]: n["attrs"]["reason"] for n in doc["nodes"] if n.get("op") == "opaque"}
    assert len(opaque) == entry.opaque, opaque
    graph = load_graph(path)
    want = reference_grads(graph)
    largest = max((float(np.abs(g.astype(np.float64)).max()) for g in want.values() if g is not None and g.size),
                  default=0.0)
    rtol, atol = tolerance(entry, largest)

    report = check_graph(graph, rtol, atol)
    assert report.order_ok, report.divergence
    assert report.order_len[0] == report.order_len[1]
    if entry.opaque:
        assert not report.grads_compared
    else:
        assert report.grads_compared, report.note
        assert report.grads and all(g.ok for g in report.grads), [g for g in report.grads if not g.ok]

    # Threads on: the engine's default mode, through the session as `autograd-run run` does.
    rep = run_session(graph, RunOptions(multithreading=True, record_order=True, profile=False, retain_graph=True))
    assert rep.error is None, rep.error
    expected = [tuple(r[:2]) for r in graph.meta["reference"]["order"]]
    assert [(r["name"], r["seq"]) for r in rep.order] == expected
    if not entry.opaque:
        got = rep.result.grads
        for leaf, theirs in want.items():
            ours = got.get(leaf)
            assert (ours is None) == (theirs is None), leaf
            if theirs is not None:
                assert ours.dtype == theirs.dtype, leaf
                np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=rtol, atol=atol,
                                           err_msg=leaf)


def test_every_model_is_in_the_coverage_doc():
    text = open(DOC, encoding="utf-8").read()
    missing = [name for name in ZOO if f"`{name}`" not in text]
    assert not missing, f"docs/zoo.md does not list {missing} (regenerate: python tests/zoo/report.py --write)"
