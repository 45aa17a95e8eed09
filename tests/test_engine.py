"""Engine behaviour: reentrancy, errors, anomaly mode, retain_graph, hooks, threads, devices.

Error texts are compared with the ones real PyTorch raises in the same situation.
"""

import json
import sys
import threading

import numpy as np
import pytest

from autograd_run.engine import ERR_BACKWARD_TWICE, GraphState
from autograd_run.engine.reference import reference_backward
from autograd_run.engine.run import root_gradients, run_graph
from autograd_run.errors import BackwardError
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph
from autograd_run.graphs.model import Edge
from autograd_run.record.order_recorder import OrderRecorder
from builders import doc, executed, graph, leaf, mul, node, total

pytestmark = pytest.mark.timeout(60)


def python_chain(levels: int):
    """``levels`` isolated python nodes p0..p{n-1} (no edges; p0 is the root); each one's rule
    calls backward on the next."""
    return graph(doc(*(node(f"p{i}", "ReentrantBackward", op="python", seq=i, inputs=[[1]]) for i in range(levels))))


def run_nested(engine, levels):
    g = python_chain(levels)
    state = GraphState(g)
    seen = []

    def make(i):
        def fn(ctx, grads):
            seen.append((i, threading.get_ident(), ctx.graph_task.reentrant_depth))
            if i + 1 < levels:
                ctx.backward([(f"p{i + 1}", 0)], [grads[0]])
            return []
        return fn
    for i in range(levels):
        state.python_fns[g.by_id[f"p{i}"]] = make(i)
    engine.execute(state, [("p0", 0)], [np.ones(1, dtype=np.float32)])
    return seen


@pytest.mark.parametrize("levels", [131, 1000])
def test_reentrant_depth_hands_off_every_61_levels(engine_factory, levels):
    seen = run_nested(engine_factory(), levels)
    assert [s[0] for s in seen] == list(range(levels))
    assert [s[2] for s in seen] == list(range(levels))  # reentrant depth = nesting level
    threads = [s[1] for s in seen]
    assert threads[0] == threading.get_ident()
    # 61 levels per thread: level L runs on the (L // 61)-th thread.
    firsts = {}
    for lvl, tid in enumerate(threads):
        firsts.setdefault(tid, lvl)
    assert sorted(firsts.values()) == list(range(0, levels, 61))
    for lvl, tid in enumerate(threads):
        assert firsts[tid] == (lvl // 61) * 61


def test_reentrant_hand_off_matches_pytorch():
    torch = pytest.importorskip("torch")
    threads = []

    class Nest(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, n):
            ctx.n = n
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            threads.append(threading.get_ident())
            if ctx.n > 1:
                with torch.enable_grad():
                    x = torch.ones(1, requires_grad=True)
                    y = Nest.apply(x, ctx.n - 1)
                    torch.autograd.grad(y, x, g)
            return g, None

    def go():
        x = torch.ones(1, requires_grad=True)
        Nest.apply(x, 131).sum().backward()
    t = threading.Thread(target=go)
    t.start()
    t.join(60)
    firsts = {}
    for lvl, tid in enumerate(threads):
        firsts.setdefault(tid, lvl)
    # PyTorch: the first 61 levels on the calling thread, then a new thread every 61.
    assert sorted(firsts.values()) == [0, 61, 122]


def test_error_on_device_thread_names_node_and_engine_stays_usable(engine_factory):
    g = load_graph("example:pipeline")
    eng = engine_factory()
    with pytest.raises(BackwardError) as info:
        run_graph(eng, g, faults={"relu": "error"})
    assert info.value.node_id == "relu"
    assert "injected error" in str(info.value)
    # The same engine (and its device threads) serves the next call.
    res = run_graph(eng, g)
    assert res.grads["w0"] is not None and res.grads["w1"] is not None


def test_error_stops_remaining_nodes(engine_factory):
    r"""
    sum -> add -> mul_c (seq 1, fails) -> acc_a
              \-> mul_b (seq 0) ---------/

    mul_c runs first (higher seq) and raises: mul_b and acc_a never run.
    """
    g = load_graph("example:failing")
    rec = OrderRecorder()
    with pytest.raises(BackwardError) as info:
        run_graph(engine_factory(tracer=rec), g)
    assert info.value.node_id == "mul_c"
    assert rec.ids() == ["sum", "add", "mul_c"]


def test_anomaly_nan_message_matches_pytorch(engine_factory):
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (a * 2).sum()

    def nan_hook(grad_inputs, grad_outputs):
        return (torch.full_like(grad_inputs[0], float("nan")), grad_inputs[1])
    mul = y.grad_fn.next_functions[0][0]
    mul.register_hook(nan_hook)
    with pytest.raises(RuntimeError) as torch_err, torch.autograd.detect_anomaly(check_nan=True), \
            pytest.warns(UserWarning):
        y.backward()
    g = load_graph("example:seed")
    with pytest.raises(BackwardError) as ours:
        run_graph(engine_factory(), g, anomaly=True, faults={"mul_b": "nan"})
    assert str(ours.value) == str(torch_err.value).split("\n")[0]
    assert "Traceback of forward call" in ours.value.anomaly_note


def test_backward_twice_message_matches_pytorch(engine_factory):
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    d = ((a * 2) + (a * 3)).sum()
    d.backward()
    with pytest.raises(RuntimeError) as torch_err:
        d.backward()
    assert str(torch_err.value) == ERR_BACKWARD_TWICE
    g = load_graph("example:seed")
    eng = engine_factory()
    state = GraphState(g)
    run_graph(eng, g, state)
    with pytest.raises(BackwardError) as ours:
        run_graph(eng, g, state)
    assert str(ours.value) == str(torch_err.value)
    # With retain_graph the second pass works and accumulates.
    state = GraphState(g)
    run_graph(eng, g, state, retain_graph=True)
    run_graph(eng, g, state)
    np.testing.assert_allclose(state.grads["a"], [10.0, 10.0])


def test_invalid_gradient_shape_message_matches_pytorch(engine_factory):
    torch = pytest.importorskip("torch")

    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return torch.ones(3)
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError) as torch_err:
        Bad.apply(x).sum().backward()
    g = graph(doc(
        node("bad", "BadBackward", op="python", seq=1, next=["acc"], inputs=[[2]]),
        leaf("x", [2], id="acc"),
    ))
    state = GraphState(g)
    state.python_fns[g.by_id["bad"]] = lambda ctx, grads: [np.ones(3, dtype=np.float32)]
    with pytest.raises(BackwardError) as ours:
        engine_factory().execute(state, [("bad", 0)], root_gradients(g))
    assert str(ours.value) == str(torch_err.value)


def test_broadcast_gradient_is_reduced_with_sum_to(engine_factory):
    g = graph(doc(
        node("p", "P", op="python", seq=1, next=["acc"], inputs=[[4, 3]]),
        leaf("b", [1, 3], id="acc"),
    ))
    state = GraphState(g)
    state.python_fns[g.by_id["p"]] = lambda ctx, grads: [np.arange(12, dtype=np.float32).reshape(4, 3)]
    engine_factory().execute(state, [("p", 0)], root_gradients(g))
    np.testing.assert_allclose(state.grads["b"], [[18.0, 22.0, 26.0]])


def test_invalid_number_of_gradients(engine_factory):
    g = graph(doc(
        node("p", "PBackward", op="python", seq=1, next=["acc"], inputs=[[2]]),
        leaf("b", [2], id="acc"),
    ))
    state = GraphState(g)
    state.python_fns[g.by_id["p"]] = lambda ctx, grads: [grads[0], grads[0]]
    with pytest.raises(BackwardError) as ours:
        engine_factory().execute(state, [("p", 0)], root_gradients(g))
    assert str(ours.value) == "Function PBackward returned an invalid number of gradients - expected 1, but got 2"


def test_hooks_run_in_pytorch_order(engine_factory):
    torch = pytest.importorskip("torch")
    calls = []
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = a * 2
    y = b.sum()
    mul_fn = b.grad_fn
    mul_fn.register_hook(lambda gi, go: calls.append("post"))
    mul_fn.register_prehook(lambda go: calls.append("pre"))
    b.register_hook(lambda g: calls.append("tensor"))
    b.retain_grad()
    y.grad_fn.register_prehook(lambda go: calls.append("sum-pre"))
    y.backward()
    torch_calls = list(calls)

    calls.clear()
    g = graph(doc(
        total("sum", "mul", seq=1, shape=[2]),  # y = b.sum()
        mul("mul", "acc", 2.0, seq=0, shape=[2]),  # b = a * 2
        leaf("a", [2], id="acc"),
    ))
    state = GraphState(g)
    mul_n = g.by_id["mul"]
    state.register_hook(mul_n, lambda gi, go: calls.append("post"))
    state.register_prehook(mul_n, lambda go: calls.append("pre"))
    state.register_tensor_pre_hook(mul_n, 0, lambda gr: calls.append("tensor"))
    state.register_retains_grad_hook(mul_n, 0, lambda gr: calls.append("retain"))
    state.register_prehook(g.by_id["sum"], lambda go: calls.append("sum-pre"))
    engine_factory().execute(state, [("sum", 0)], root_gradients(g))
    assert [c for c in calls if c != "retain"] == torch_calls
    assert calls == ["sum-pre", "tensor", "retain", "pre", "post"]


def test_final_callbacks_run_once_at_completion(engine_factory):
    g = python_chain(1)
    state = GraphState(g)
    eng = engine_factory()
    log = []

    def fn(ctx, grads):
        ctx.queue_callback(lambda: log.append("cb1"))
        ctx.queue_callback(lambda: (log.append("cb2"), eng.queue_callback(lambda: log.append("cb3"))))
        log.append("node")
        return []
    state.python_fns[g.by_id["p0"]] = fn
    eng.execute(state, [("p0", 0)], [np.ones(1, dtype=np.float32)])
    assert log == ["node", "cb1", "cb2", "cb3"]
    with pytest.raises(RuntimeError, match="Final callbacks can only be installed during backward pass."):
        eng.queue_callback(lambda: None)


def test_thread_local_state_follows_the_graph_task(engine_factory):
    g = load_graph("example:pipeline")
    eng = engine_factory()
    seen = []
    state = GraphState(g)
    orig = state.accumulate

    def spy(name, grad, create_graph):
        seen.append((threading.current_thread().name, eng.grad_enabled(), eng.current_context().get("tag")))
        orig(name, grad, create_graph)
    state.accumulate = spy
    eng.execute(state, [r.edge for r in g.roots], root_gradients(g), create_graph=True, context={"tag": "x"})
    assert {s[1] for s in seen} == {True}
    assert {s[2] for s in seen} == {"x"}
    assert {s[0] for s in seen} == {"autograd-run cuda:0", "autograd-run cuda:1"}
    seen.clear()
    eng.execute(state, [r.edge for r in g.roots], root_gradients(g))
    assert {s[1] for s in seen} == {False}


def test_devices_route_to_their_worker_threads(engine_factory):
    r"""
    cuda:1   sum -> mm1 -> copy
                     |       \
                   acc_w1     \
    cuda:0                    relu -> mm0 -> acc_w0

    Each node runs on its device's worker thread; the copy hands the gradient to cuda:0's.
    """
    g = load_graph("example:pipeline")
    rec = OrderRecorder()
    eng = engine_factory(tracer=rec)
    run_graph(eng, g)
    by_node = {r.node_id: r.thread for r in rec.records}
    assert by_node["sum"] == by_node["mm1"] == by_node["copy"] == "autograd-run cuda:1"
    assert by_node["relu"] == by_node["mm0"] == by_node["acc_w0"] == "autograd-run cuda:0"
    assert set(eng.device_threads) == {0, 1}
    eng.shutdown()
    assert not any(t.is_alive() for t in threading.enumerate() if t.name.startswith("autograd-run cuda"))


def test_no_multithreading_runs_everything_on_the_caller(engine_factory):
    g = load_graph("example:pipeline")
    rec = OrderRecorder()
    run_graph(engine_factory(tracer=rec, multithreading=False), g)
    assert {r.thread for r in rec.records} == {threading.current_thread().name}


def test_many_user_threads_share_one_engine(engine_factory):
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    eng = engine_factory()
    expected = run_graph(eng, g).grads
    results, errors = [], []

    def worker():
        try:
            for _ in range(3):
                results.append(run_graph(eng, g).grads)
        except BaseException as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 18
    for r in results:
        for k, v in expected.items():
            np.testing.assert_allclose(r[k], v)


@pytest.mark.parametrize("kind,kw", [("chain", dict(n=50)), ("fanout", dict(width=9)), ("mlp", {}),
                                     ("random", dict(nodes=300, leaves=60, seed=3)),
                                     ("random", dict(nodes=150, leaves=20, seed=4)),
                                     ("transformer", dict(devices=2))])
def test_engine_matches_sequential_reference(engine_factory, kind, kw):
    g = graph(generate(kind, **kw))
    roots = [r.edge for r in g.roots]
    ref_state = GraphState(g)
    ref_order, _ = reference_backward(ref_state, roots, root_gradients(g))
    rec = OrderRecorder()
    state = GraphState(g)
    engine_factory(tracer=rec, multithreading=False).execute(state, roots, root_gradients(g))
    assert rec.ids() == [n.id for n in ref_order]
    for k, v in ref_state.grads.items():
        if v is None:
            assert state.grads[k] is None
        else:
            np.testing.assert_allclose(state.grads[k], v, rtol=1e-6)
    # Multithreaded: the same gradients and the same nodes; CPU nodes run on the caller's thread,
    # so a CPU-only graph runs in the reference order (devices interleave freely).
    rec2 = OrderRecorder()
    state2 = GraphState(g)
    engine_factory(tracer=rec2).execute(state2, roots, root_gradients(g))
    for k, v in ref_state.grads.items():
        if v is not None:
            np.testing.assert_allclose(state2.grads[k], v, rtol=1e-5)
    assert sorted(rec2.ids()) == sorted(rec.ids())
    if all(n.device.is_cpu for n in g.nodes):
        assert rec2.ids() == rec.ids()


def test_grad_mode_captures_without_touching_variables(engine_factory):
    g = load_graph("example:seed")
    state = GraphState(g)
    rec = OrderRecorder()
    res = run_graph(engine_factory(tracer=rec), g, state, mode="grad", inputs=["a"])
    np.testing.assert_allclose(res.grads["a"], [5.0, 5.0])
    assert state.grads["a"] is None
    assert "acc_a" not in rec.ids()


def test_min_topo_pruning_skips_unneeded_subgraph(engine_factory):
    """grad w.r.t. an intermediate node: nodes below it are not expanded or run.

        sum -> add -> mul_b -> acc_a
                  \\-> mul_c -> acc_a
    grad(inputs=mul_c) captures mul_c's input gradient; nothing below runs.
    """
    g = load_graph("example:seed")
    rec = OrderRecorder()
    res = run_graph(engine_factory(tracer=rec), g, mode="grad", inputs=["mul_c"])
    np.testing.assert_allclose(res.grads["mul_c"], [1.0, 1.0])
    assert rec.ids() == ["sum", "add"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_order_does_not_depend_on_node_names(seed):
    """A random DAG with many leaves, run twice with every node id renamed (reversed and
    salted): the executed order, mapped back to the original ids, is the same."""
    import random
    original = generate("random", nodes=150, leaves=40, seed=seed)
    rng = random.Random(seed)
    new = {n["id"]: f"z{rng.randrange(10**9)}_{n['id'][::-1]}" for n in original["nodes"]}
    renamed = json.loads(json.dumps(original))
    for n in renamed["nodes"]:
        n["id"] = new[n["id"]]
        if "next" in n:
            n["next"] = [None if e is None else [new[e[0]], e[1]] for e in n["next"]]
    for r in renamed["roots"]:
        r["node"] = new[r["node"]]
    back = {v: k for k, v in new.items()}
    assert [back[i] for i in executed(graph(renamed))] == executed(graph(original))


def test_priority_policy_is_pluggable():
    """
    sum -> add -> mul_b (seq 0) -> acc_a
              \\-> mul_c (seq 1) -> acc_a
    PyTorch's rule runs mul_c (higher seq) first; FIFO runs them in the order they became ready.
    """
    from autograd_run.engine.priority import FifoPriority
    g = load_graph("example:seed")
    assert executed(g)[2:4] == ["mul_c", "mul_b"]
    assert executed(g, priority=FifoPriority())[2:4] == ["mul_b", "mul_c"]


@pytest.mark.parametrize("mode,inputs", [("grad", ["v3"]), ("grad", ["v1", "v7"]), ("backward", ["v2", "v5"])])
def test_engine_matches_reference_with_requested_inputs(engine_factory, mode, inputs):
    """exec_info pruning: the same nodes run, in the same order, with the same results, as the oracle."""
    g = graph(generate("random", nodes=80, leaves=10, seed=11))
    edges = [Edge(g.variables[n].node, 0) for n in inputs]
    roots = [r.edge for r in g.roots]
    ref_state = GraphState(g)
    ref_order, ref_captured = reference_backward(ref_state, roots, root_gradients(g), inputs=edges,
                                                 accumulate_grad=mode == "backward")
    rec = OrderRecorder()
    state = GraphState(g)
    captured = engine_factory(tracer=rec, multithreading=False).execute(
        state, roots, root_gradients(g), inputs=edges, accumulate_grad=mode == "backward")
    assert rec.ids() == [n.id for n in ref_order]
    for a, b in zip(captured, ref_captured):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    for name in g.variables:
        if ref_state.grads[name] is None:
            assert state.grads[name] is None
        else:
            np.testing.assert_allclose(state.grads[name], ref_state.grads[name], rtol=1e-6)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's (prctl)")
def test_a_sleeping_wait_lowers_its_threads_timer_slack_as_the_kernel_reports_it():
    """The kernel's own answer (PR_GET_TIMERSLACK): a thread at the 50 µs default is at 1 ns once its wait slept
    (a thread inherits its creator's slack, so the test sets the default first)."""
    from autograd_run.engine import waits
    got = {}

    def body():
        waits._PRCTL(29, 50_000, 0, 0, 0)
        got["before"] = waits._PRCTL(30, 0, 0, 0, 0)
        waits.wait(1e-3)
        got["after"] = waits._PRCTL(30, 0, 0, 0, 0)

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert got == {"before": 50_000, "after": 1}
