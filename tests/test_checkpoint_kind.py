"""``checkpoint`` nodes: a reentrant backward over a recomputed graph kept as data (no Python code runs)."""

import numpy as np
import pytest

from autograd_run.engine import Engine
from autograd_run.engine.callables import ERR_CHECKPOINT_INVALID
from autograd_run.engine.run import run_graph
from autograd_run.errors import BackwardError, GraphFileError
from autograd_run.graphs.dump import dumps, graph_to_dict
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.traces.order import compare_orders

pytestmark = pytest.mark.timeout(60)


def test_gradients_by_hand():
    """loss = sum(2 * exp(x * w)) with the exp(x * w) segment checkpointed:
    dx = 2 exp(x w) w, dw = 2 exp(x w) x; x = [0.5, 1, 1.5], w = 1."""
    x = np.array([0.5, 1.0, 1.5])
    res = run_graph(Engine(multithreading=False), load_graph("example:checkpoint"))
    np.testing.assert_allclose(res.grads["x"], 2 * np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(res.grads["w"], 2 * np.exp(x) * x, rtol=1e-6)
    assert "x.in" not in res.grads  # the recomputation's input is not a user leaf


def test_the_nested_call_is_one_level_deeper_and_runs_first():
    rep = run_session(load_graph("example:checkpoint"), RunOptions(multithreading=False, record_order=True))
    assert [(r["id"], r["depth"]) for r in rep.order] == [
        ("sum", 0), ("mul", 0), ("ckpt", 0), ("exp", 1), ("mul_w", 1), ("acc_x_in", 1), ("acc_w", 1), ("acc_x", 0)]


def test_no_python_needed_and_refused_under_grad():
    g = load_graph("example:checkpoint")
    with pytest.raises(BackwardError) as err:
        run_graph(Engine(), g, mode="grad", inputs=["x"])
    assert str(err.value) == ERR_CHECKPOINT_INVALID


def test_repeated_passes_recompute():
    rep = run_session(load_graph("example:checkpoint"), RunOptions(repeat=3))
    assert rep.error is None and rep.summary.graph_tasks == 6


@pytest.mark.parametrize("multithreading", [False, True])
def test_simulated_order_is_the_engines(multithreading):
    g = load_graph("example:checkpoint")
    sim = simulate_session(g, SimOptions(spec="h100", policy="pytorch" if multithreading else "single-thread",
                                         slack_top=0))
    real = run_session(g, RunOptions(multithreading=multithreading, record_order=True, profile=False))
    assert compare_orders(sim.order, real.order, per_worker=multithreading) is None


def mutated(change):
    doc = graph_to_dict(load_graph("example:checkpoint"))
    node = next(n for n in doc["nodes"] if n["id"] == "ckpt")
    change(doc, node)
    return lambda: loads_graph(dumps(doc, "json"), "ck.json")


@pytest.mark.parametrize("change, message", [
    (lambda d, n: n["attrs"].update(inner={"roots": [["nope", 0]], "inputs": ["x.in"]}), "is not an existing"),
    (lambda d, n: n["attrs"].update(inner={"roots": [["exp", 3]], "inputs": ["x.in"]}), "is not an existing"),
    (lambda d, n: n["attrs"].update(inner={"roots": [], "inputs": ["x.in"]}), "one [node, input_nr] or null"),
    (lambda d, n: n["attrs"].update(inner={"roots": [["exp", 0]], "inputs": ["nope"]}), "is not a variable"),
    (lambda d, n: n["attrs"].update(inner={"roots": [["ckpt", 0]], "inputs": ["x.in"]}), "cannot recompute itself"),
    (lambda d, n: n["attrs"].update(inner="x"), "needs attrs.inner"),
])
def test_malformed_checkpoints_are_refused(change, message):
    with pytest.raises(GraphFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mutated(change)()


def test_a_checkpoint_slot_of_another_shape_than_its_recomputed_output_is_refused():
    """A fuzzer's file (validate accepted it, run failed): the checkpoint's slot a 0-d tensor, the recomputed
    output it feeds of shape [3]. PyTorch's nested backward refuses a gradient of another shape."""
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        out = torch.ones(3, requires_grad=True).exp()
        torch.autograd.backward([out], [torch.ones(())])
    with pytest.raises(GraphFileError, match=r"roots\[0\]: the checkpoint's input slot 0 has shape \[\], but the "
                                             r"recomputed output it feeds \('exp' input 0\) has shape \[3\]"):
        mutated(lambda d, n: n["inputs"][0].update(shape=[]))()


def test_a_checkpoint_whose_recomputation_reaches_itself_is_refused():
    """ckpt recomputes exp; exp -> mul_w -> ck2, whose recomputation is... ckpt again: never ends."""
    def change(doc, node):
        mul_w = next(n for n in doc["nodes"] if n["id"] == "mul_w")
        mul_w["next"][1] = ["ck2", 0]
        doc["nodes"].append({"id": "ck2", "name": "CheckpointFunctionBackward", "op": "checkpoint", "seq": 3,
                             "next": [None], "inputs": [{"shape": [3]}],
                             "attrs": {"inner": {"roots": [["mul", 0]], "inputs": [None]}}})
    with pytest.raises(GraphFileError, match="reaches itself again"):
        mutated(change)()
