"""The compiled core and its pure-Python twin: built where a compiler is, and the same decisions."""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from autograd_run.engine import core
from autograd_run.engine import ready_queue as pure

pytestmark = pytest.mark.timeout(300)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_core_is_compiled_where_a_compiler_is():
    if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("the pure-Python twin is forced")
    assert core.COMPILED, core.WHY


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
@pytest.mark.parametrize("seed", range(5))
def test_the_heaps_pop_in_the_same_order(seed):
    """Many ties (as many AccumulateGrad nodes ready at once), keys beyond 64 bits, pushes and pops interleaved."""
    rnd = random.Random(seed)
    c, p = core.ReadyQueue("c"), pure.ReadyQueue("p")
    out_c, out_p = [], []
    for step in range(3000):
        if rnd.random() < 0.6 or not len(p):
            key = rnd.choice([(rnd.randint(0, 3) << 64) | rnd.randint(0, 5), (0 << 64) | (2**64 - 1), 1 << 100])
            item = ("gt", step, None)
            c.push(key, item)
            p.push(key, item)
        else:
            out_c.append(c.pop()[1])
            out_p.append(p.pop()[1])
    while len(p):
        out_c.append(c.pop()[1])
        out_p.append(p.pop()[1])
    assert out_c == out_p and len(c) == 0


ORDERS = r'''
import json, sys
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.session import RunOptions, run_session
graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint")]
graphs += [loads_graph(dumps(generate("random", nodes=300, leaves=50, seed=s), "json"), "r.json") for s in range(3)]
graphs.append(loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json"))
out = []
for g in graphs:
    rep = run_session(g, RunOptions(multithreading=False, record_order=True))
    out.append([[r["id"], r["depth"]] for r in rep.order])
    out.append({k: None if v is None else float(abs(v).sum()) for k, v in rep.result.grads.items()})
print(json.dumps(out))
'''


def orders(pure_python: bool):
    env = {**os.environ, "AUTOGRAD_RUN_PURE_PYTHON": "1" if pure_python else "0"}
    out = subprocess.run([sys.executable, "-c", ORDERS], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
def test_compiled_and_pure_engines_agree():
    compiled, pure_python = orders(False), orders(True)
    assert compiled == pure_python


HALF = r'''
import hashlib, json
from autograd_run.graphs.load import loads_graph
from autograd_run.session import RunOptions, run_session
text = json.dumps({"format": "autograd-graph/1",
                   "roots": [{"node": "cs", "grad": {"random": 1, "shape": [4096], "dtype": "float16"}}],
                   "variables": [{"name": "x", "shape": [4096], "dtype": "float16"}],
                   "nodes": [{"id": "cs", "name": "CumsumBackward0", "next": [["acc", 0]],
                              "inputs": [{"shape": [4096], "dtype": "float16"}], "saved": {"dim": 0}},
                             {"id": "acc", "name": "AccumulateGrad", "variable": "x"}]})
r = run_session(loads_graph(text, "h.json"), RunOptions(multithreading=False))
print(hashlib.sha1(r.result.grads["x"].tobytes()).hexdigest())
'''


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
def test_a_float16_node_computes_in_float32_in_the_compiled_loop_too():
    """A float16 node's incoming gradients are upcast (its formula computes in float32, rounded once): the
    compiled loop hands such a node to the Python path, which does it (a cumulative sum of float16 values
    rounds at every step otherwise)."""
    digests = []
    for pure_python in (False, True):
        env = {**os.environ, "AUTOGRAD_RUN_PURE_PYTHON": "1" if pure_python else "0"}
        out = subprocess.run([sys.executable, "-c", HALF], env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr
        digests.append(out.stdout)
    assert digests[0] == digests[1]


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_a_signal_reaches_the_main_thread_while_it_waits_on_an_empty_queue(impl):
    """The caller sleeping in ``pop`` (its graph's nodes all on device threads) must still see Ctrl-C:
    Python's own lock waits let a signal handler run, so the compiled wait must too."""
    import signal
    import time
    if impl == "compiled" and not core.COMPILED:
        pytest.skip("the compiled core is not built")
    q = core.ReadyQueue("c") if impl == "compiled" else pure.ReadyQueue("p")

    class Rang(Exception):
        pass

    def ring(signum, frame):
        raise Rang()

    old = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Rang):
            q.pop()
        assert time.monotonic() - t0 < 2.0
        # the queue still works after the interrupted wait
        q.push(1, ("gt", "item", None))
        assert q.pop()[1] == "item" and len(q) == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- the compiled worker loop, event log, lock and summary loops against their twins -------------------

compiled = pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")


def fake_clock():
    t = [0]

    def clock():
        t[0] += 10
        return t[0]
    return clock


class _GT:
    def __init__(self, i, depth=0):
        self.id, self.reentrant_depth = i, depth


class _Q:
    def __init__(self, name):
        self.name = name


@compiled
def test_the_event_logs_keep_the_same_records_and_tables():
    from autograd_run.record.event_log import EventLogPy
    named = {"c": [], "p": []}
    c = core.EventLog(fake_clock(), named["c"].append)
    p = EventLogPy(fake_clock(), named["p"].append)
    nodes = [object() for _ in range(5)]
    q1, q2 = _Q("cpu"), _Q("cuda:0")
    gts = [_GT(0), _GT(7, depth=2)]
    rnd = random.Random(0)
    for step in range(400):
        kind = rnd.randrange(5)
        gt, node, q = rnd.choice(gts), rnd.choice(nodes + [None]), rnd.choice([q1, q2])
        waited = rnd.choice([None, gt])
        for log in (c, p):
            if kind == 0:
                log.push(q, gt if node is not None else None, node, step % 9)
            elif kind == 1:
                log.pop(q, gt, node, step % 7)
            elif kind == 2 and node is not None:
                log.start(gt, node)
            elif kind == 3 and node is not None:
                log.end(gt, node)
            elif kind == 4:
                log.idle(q, step, step + 5, waited)
        if step in (150, 300):  # as Recorder.drain does: the node table goes with the records
            taken = c.take(True), p.take(True)
            assert taken[0] == taken[1] and taken[0][0] and taken[0][1]
            assert c.take() == p.take() == (b"", [], taken[0][2], taken[0][3])
    assert len(c) == len(p) > 0
    dc, nc, tc, qc = c.take()
    dp, np_, tp, qp = p.take()
    assert dc == dp and nc == np_ and tc == tp and qc == qp
    assert named["c"] == named["p"] and len(c) == 0 and c.take()[0] == b""


@compiled
def test_the_compiled_lock_behaves_as_a_lock():
    import threading
    lock = core.Lock()
    assert lock.acquire() and lock.locked() and not lock.acquire(False)
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    counter = [0]

    def bump():
        for _ in range(2000):
            with lock:
                counter[0] += 1
    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 8000 and not lock.locked()


@compiled
@pytest.mark.parametrize("seed", range(4))
def test_the_summary_loops_agree_with_their_twins(seed):
    import numpy as np
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.record import kernels
    g = loads_graph(dumps(generate("random", nodes=200, leaves=30, seed=seed), "json"), "r.json")
    rnd = np.random.default_rng(seed)
    nodes = list(g.nodes)
    rnd.shuffle(nodes)
    for attr, identity in (("name", False), ("op", True), ("device", True), ("id", False), ("stream", False)):
        a, va = kernels.attr_codes(nodes, attr, identity)
        b, vb = kernels.attr_codes_py(nodes, attr, identity)
        assert np.array_equal(a, b) and all(x is y or x == y for x, y in zip(va, vb)) and len(va) == len(vb)

    class Obj:  # not a Node: read through getattr; equal values as distinct objects (big ints made apart)
        def __init__(self, k):
            self.v = int(str(10**20 + k % 3))
    objs = [Obj(k) for k in rnd.integers(0, 7, 50).tolist()]
    for identity in (False, True):
        a, va = kernels.attr_codes(objs, "v", identity)
        b, vb = kernels.attr_codes_py(objs, "v", identity)
        assert np.array_equal(a, b) and len(va) == len(vb) == (50 if identity else len(set(va)))
    m = 300
    node = rnd.integers(0, len(nodes), m)
    gt = rnd.integers(0, 2, m)
    weight = rnd.integers(0, 5, m)  # small: many ties
    start = rnd.integers(0, 50, m)
    order = np.argsort(-start, kind="stable")
    def path(*args):  # the compiled walk's (int64 rows, total) as the twin's (list, total)
        rows, total = kernels.critical_path(*args)
        assert rows.dtype == np.int64
        return rows.tolist(), total

    assert path(nodes, gt, node, weight, start, order) == kernels.critical_path_py(nodes, gt, node, weight, start, order)
    one = np.zeros(m, dtype=np.int64)  # one graph task: the compiled walk keeps a node's last run in an array
    assert path(nodes, one, node, weight, start, order) == \
        kernels.critical_path_py(nodes, one, node, weight, start, order)
    # nodes of two graphs (their indices repeat): found by address instead of by index
    other = loads_graph(dumps(generate("random", nodes=50, leaves=10, seed=seed + 1), "json"), "o.json")
    both = nodes + list(other.nodes)
    node2 = rnd.integers(0, len(both), m)
    for g2 in (gt, one):
        assert path(both, g2, node2, weight, start, order) == \
            kernels.critical_path_py(both, g2, node2, weight, start, order)


@compiled
def test_fill_formats_as_its_twin():
    """The trace writers' template loop: every op, strings that need escaping or are not valid UTF-8."""
    import numpy as np
    from autograd_run.traces import encode as E
    rng = np.random.default_rng(0)
    n = 400
    cols = [rng.integers(-5, 10**12, n), rng.integers(0, 3, n), rng.integers(-1, 2, n),
            np.full(n, 2**64 - 1, dtype=np.uint64).view(np.int64), rng.integers(0, 2**40, n).cumsum()]
    tables = [['a"b\\c\n\x01é\t', "x", b"raw"], [b"\x00\x01", "zz", "ü\ud800"]]
    lits = [b"{", b"}", b","]
    t0 = E.template((E.LIT, 0), (E.I64, 0), (E.US, 0), (E.DUR, 0), (E.MICRO, 0), (E.JSTR, 0, 1), (E.JESC, 1, 1),
                    (E.RAW, 0, 1), (E.SKIPNEG, 2, 2), (E.LIT, 2), (E.U64, 3), (E.LIT, 1))
    t1 = E.template((E.PB_BEGIN, 1), (E.PB_DELTA, 8, 4), (E.PB_VARINT, 3, 1), (E.PB_BEGIN, 11),
                    (E.PB_STR, 5, 1, 1), (E.PB_FIXED64, 47, 3), (E.PB_BEGIN, 2), (E.RAW, 0, 1), (E.PB_END,),
                    (E.PB_END,), (E.PB_END,))
    kinds = rng.integers(0, 2, n)
    index = np.argsort(cols[4] % 97, kind="stable")
    for idx in (None, index):
        a = E.fill([t0, t1], kinds, cols, tables, lits, -7, 0, n, idx)
        b = E.fill_py([t0, t1], kinds, [np.asarray(c).view(np.int64) for c in cols], tables, lits, -7, 0, n, idx)
        assert a == b and len(a) > 1000
    long = ["y" * 300]  # a nested message longer than 127 bytes: a two-byte length
    t2 = E.template((E.PB_BEGIN, 1), (E.RAW, 0, 0), (E.PB_END,))
    z = [np.zeros(1, dtype=np.int64)]
    assert E.fill([t2], None, z, [long], []) == E.fill_py([t2], None, z, [long], [], 0, 0, 1) == \
        b"\x0a\xac\x02" + b"y" * 300


@compiled
def test_the_node_tables_and_saved_split_agree_with_their_twins():
    import numpy as np
    from autograd_run.engine.state import split_saved_py
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import load_graph, loads_graph
    from autograd_run.record import kernels
    graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint")]
    graphs.append(loads_graph(dumps(generate("transformer", layers=1, devices=2), "json"), "t.json"))
    for g in graphs:
        nodes = list(g.nodes)
        a, b = kernels.node_columns(nodes), kernels.node_columns_py(nodes)
        assert a[0] == b[0] and a[1] == b[1] and all(np.array_equal(x, y) for x, y in zip(a[2:], b[2:]))
        ca, sa = kernels.input_shape_codes(nodes)
        cb, sb = kernels.input_shape_codes_py(nodes)
        assert np.array_equal(ca, cb) and sa == sb
        released, cached = set(nodes[:2]), {nodes[2]: {}}
        assert core.split_saved(nodes, released, cached) == split_saved_py(nodes, released, cached)
        # rows by identity and edges within a table: the whole graph, a part of it (edges out of it dropped), in
        # another order; objects that are not in the table
        import random
        rng = random.Random(len(nodes))
        for table in (nodes, nodes[::2], rng.sample(nodes, len(nodes))):
            objs = nodes + [object(), None] + table[:3]
            assert np.array_equal(kernels.node_rows(table, objs), kernels.node_rows_py(table, objs))
            assert all(np.array_equal(x, y) for x, y in zip(kernels.node_edges(table), kernels.node_edges_py(table)))
        src, dst = kernels.node_edges(nodes)
        assert len(src) == sum(e is not None for n in nodes for e in n.next)  # every edge is within the graph
        assert all(nodes[d] is nodes[j].next[k][0] for j, d, k in
                   zip(src.tolist(), dst.tolist(), _edge_slots(nodes)))


def _edge_slots(nodes):
    return [k for n in nodes for k, e in enumerate(n.next) if e is not None]


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
def test_the_compiled_accumulate_grad_adds_as_its_twin():
    """A first gradient copied in (the caller's array untouched later), then added in place; out of place
    under create_graph; None passes; an overridden ``accumulate`` (instance or subclass) is the one called."""
    import numpy as np

    from autograd_run.engine.builtin_nodes import EngineContext, accumulate_grad_py
    from autograd_run.engine.state import GraphState
    from autograd_run.graphs.load import load_graph

    g = load_graph("example:pipeline")
    acc = next(n for n in g.nodes if n.variable is not None)
    results = []
    for run in (core.accumulate_grad, accumulate_grad_py):
        state = GraphState(g)
        ctx = EngineContext(None, None, None, create_graph=False, state=state)
        first = np.full(acc.inputs[0].shape, 2.0, dtype=np.float32)
        assert run(acc, [first], ctx) == []
        held = state.grads[acc.variable]
        assert held is not first and np.array_equal(held, first)
        run(acc, [first], ctx)
        assert state.grads[acc.variable] is held and float(held.flat[0]) == 4.0  # in place
        assert float(first.flat[0]) == 2.0
        assert run(acc, [None], ctx) == [] and state.grads[acc.variable] is held
        ctx.create_graph = True
        run(acc, [first], ctx)
        assert state.grads[acc.variable] is not held and float(held.flat[0]) == 4.0  # a new array
        results.append(state.grads[acc.variable].tobytes())

        seen = []
        state.accumulate = lambda name, grad, cg, seen=seen: seen.append((name, cg))
        run(acc, [first], ctx)
        assert seen == [(acc.variable, True)]

        class Mine(GraphState):
            def accumulate(self, name, grad, create_graph):
                seen.append("subclass")
        run(acc, [first], EngineContext(None, None, None, state=Mine(g)))
        assert seen[-1] == "subclass"
    assert results[0] == results[1]


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
def test_the_compiled_loop_releases_saved_values_as_release_does():
    """Without retain_graph each node that saves tensors is marked released and its values dropped, by the
    compiled loop itself; a state whose ``release`` is overridden has its own called instead."""
    import numpy as np

    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.engine.state import GraphState, SavedTensorReleased
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph

    g = loads_graph(__import__("json").dumps(generate("mlp", layers=3, width=2, batch=2)), "mlp.json")
    saving = {n for n in g.nodes if n.saves_tensors}
    eng = Engine(multithreading=False)
    try:
        state = GraphState(g)
        state.prepare()
        assert saving <= set(state._saved)
        run_graph(eng, g, state)
        assert state._released == saving and not saving & set(state._saved)
        with pytest.raises(SavedTensorReleased):
            state.saved(next(iter(saving)))

        calls = []

        class Mine(GraphState):
            def release(self, node):
                calls.append(node)
        mine = Mine(g)
        run_graph(eng, g, mine)
        assert set(calls) == saving and not mine._released
        again = run_graph(eng, g, mine)  # nothing was released: a second backward runs
        assert all(v is None or np.isfinite(v).all() for v in again.grads.values())
    finally:
        eng.shutdown()


@compiled
@pytest.mark.parametrize("name", ["example:checkpoint", "example:reentrant", "example:pipeline", "random"])
def test_the_compiled_node_scans_match_their_python_twins(name):
    """``max_seq`` (GraphState's next sequence number: AccumulateGrad's 2**64-1 left out) and ``nodes_of_op``
    (the checkpoint nodes whose recomputation inputs a run's gradients leave out)."""
    from autograd_run.graphs.checkpoints import checkpoint_nodes
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import load_graph, loads_graph
    from autograd_run.ops import CHECKPOINT
    g = loads_graph(dumps(generate("random", nodes=120, leaves=20, seed=3), "json"), "r.json") \
        if name == "random" else load_graph(name)
    assert core.max_seq(g.nodes, 2**63) == max((n.seq for n in g.nodes if n.seq < 2**63), default=0)
    assert core.max_seq([], 2**63) == 0
    assert core.max_seq([n for n in g.nodes if n.seq >= 2**63], 2**63) == 0  # AccumulateGrad alone
    assert core.nodes_of_op(g.nodes, CHECKPOINT) == checkpoint_nodes(g)
    assert (name == "example:checkpoint") <= bool(checkpoint_nodes(g))


def test_each_part_of_the_compiled_core_names_its_python_twin():
    """``_core.c`` is one translation unit built from the files of ``engine/csrc/``: it includes every one,
    each opens with the path of its pure-Python twin (which exists), and its map lists every file."""
    import pathlib
    import re
    engine = pathlib.Path(__file__).resolve().parents[1] / "autograd_run" / "engine"
    core = (engine / "_core.c").read_text()
    parts = sorted(p.name for p in (engine / "csrc").iterdir())
    assert sorted(re.findall(r'^#include "csrc/([a-z_]+\.[ch])"$', core, re.M)) == parts
    for name in parts:
        assert f"csrc/{name}" in core.split("*/")[0], f"_core.c's map does not list csrc/{name}"
        if name.endswith(".c"):
            head = (engine / "csrc" / name).read_text().split("\n", 1)[0]
            twins = re.findall(r"autograd_run/[a-z_/]+\.py", head)
            assert head.startswith("/* Python twin: ") and twins, (name, head)
            for twin in twins:
                assert (engine.parents[1] / twin).exists(), (name, twin)


@compiled
@pytest.mark.parametrize("source", ["examples", "generated", "placed", "models"])
def test_the_compiled_signature_is_its_twins(source, tmp_path):
    """The cost lookup's key (``sim.signature``): the compiled one equals ``signature_py``'s, element by element
    and type by type, over every node of the examples, generated graphs, graphs placed on devices (copies,
    streams) and real models captured from PyTorch (every saved kind their nodes hold)."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import GENERATORS, generate
    from autograd_run.graphs.load import load_graph, loads_graph
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.placement import place
    from autograd_run.sim.signature import signature_py
    from autograd_run.sim.specs import default_spec
    if source == "examples":
        graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint", "reentrant",
                                                        "failing")]
    elif source in ("generated", "placed"):
        graphs = [loads_graph(dumps(generate(kind), "json"), f"{kind}.json") for kind in GENERATORS]
        graphs.append(loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json"))
        if source == "placed":
            spec = default_spec()
            graphs = [place(g, k, how, CostResolver(spec)) for g in graphs for k, how in ((2, "layer"),
                                                                                          (3, "round-robin"),
                                                                                          (4, "greedy"))]
    else:
        pytest.importorskip("torch")
        from zoo import models  # noqa: F401  (registers the models)
        from zoo.registry import ZOO, build
        from autograd_run.capture import from_torch
        graphs = []
        for name in ("resnet_block", "lstm_classifier", "gpt_block", "multihead_attention", "unet"):
            case = build(ZOO[name])
            path = str(tmp_path / f"{name}.json")
            from_torch(case.outputs, names=dict(case.names), path=path, reference=False)
            graphs.append(load_graph(path))
    seen = 0
    for g in graphs:
        for n in g.nodes:
            a, b = core.signature(n), signature_py(n)
            assert a == b and repr(a) == repr(b), (g.source, n.id)
            seen += a is not None and bool(a[1])
    assert source in ("generated", "placed") or seen  # some nodes carry saved values


@compiled
def test_costs_of_finds_each_nodes_cost_as_a_call_does():
    """``CostResolver.many`` (``_core.costs_of``): the same cost, in order, as calling the resolver per node,
    with the same nodes resolved; a plain cost function is called per node, and what it raises comes out."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import GENERATORS, generate
    from autograd_run.graphs.load import load_graph, loads_graph
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.placement import place
    from autograd_run.sim.specs import default_spec, load_spec
    graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint", "failing")]
    graphs += [loads_graph(dumps(generate(kind), "json"), f"{kind}.json") for kind in GENERATORS]
    for spec in (default_spec(), load_spec("h100")):
        graphs += [place(g, 3, "round-robin", CostResolver(spec)) for g in graphs[-len(GENERATORS):]]
        for g in graphs:
            nodes = g.nodes[::-1] + g.nodes[:3]  # any order, a node twice
            many, one = CostResolver(spec, scale={"MulBackward0": 2.0}), CostResolver(spec, scale={"MulBackward0": 2.0})
            assert many.many(nodes) == [one(n) for n in nodes], g.source
            assert many.resolved == one.resolved
    seen = []
    assert core.costs_of(lambda n: seen.append(n) or n.id, None, graphs[0].nodes) == [n.id for n in graphs[0].nodes]
    assert seen == graphs[0].nodes

    def broken(n):
        raise ZeroDivisionError(n.id)
    with pytest.raises(ZeroDivisionError):
        core.costs_of(broken, None, graphs[0].nodes)


@compiled
def test_costs_of_tells_nodes_alike_from_nodes_that_only_look_alike():
    """The compiled lookup reuses a cost for a node alike to one whose key it found (the same op, device, metas
    and saved items), without building the node's key. Nodes next to such an exemplar that differ from it in
    one saved item (a shape, a dtype, the items' order, one more item, a shape as a tuple, a value that makes
    the node costed on its own) get the cost the resolver gives them one by one, in any order."""
    import dataclasses
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.specs import default_spec
    g = loads_graph(dumps(generate("mlp", layers=3), "json"), "mlp.json")
    mm = next(n for n in g.nodes if n.name == "MmBackward0")
    self_ = {**mm.saved["self"], "shape": [4096, 1024]}  # large enough to cost more than the floor
    mat2 = {**mm.saved["mat2"], "shape": [1024, 1024]}
    base = dataclasses.replace(mm, saved={"self": self_, "mat2": mat2})

    def like(saved):
        return dataclasses.replace(mm, id=f"v{len(variants)}", saved=saved)
    variants: list = []
    for saved in ({"self": dict(self_), "mat2": dict(mat2)},                            # alike
                  {"self": {**self_, "shape": [self_["shape"][0] * 4, self_["shape"][1]]}, "mat2": mat2},
                  {"self": {**self_, "dtype": "float64"}, "mat2": {**mat2, "dtype": "float64"}},
                  {"mat2": mat2, "self": self_},                                        # another order
                  {"self": self_, "mat2": mat2, "alpha": 2},                            # one more item
                  {"self": {**self_, "shape": tuple(self_["shape"])}, "mat2": mat2},    # equal key, not alike
                  {"self": self_, "mat2": {"random": 3}},                               # no shape: on its own
                  {"self": self_, "mat2": mat2, "dims": [1, 2.5]}):                      # not all ints: on its own
        variants.append(like(saved))
    nodes = [base, base] + [n for v in variants for n in (v, base)]
    spec = default_spec()
    for order in (nodes, nodes[::-1], nodes[1::2] + nodes[::2]):
        many, one = CostResolver(spec), CostResolver(spec)
        got, want = many.many(order), [one(n) for n in order]
        assert got == want
        assert many.resolved == one.resolved
    one = CostResolver(spec)
    assert one(variants[1]).cpu_ns > one(base).cpu_ns and one(variants[2]).cpu_ns > one(base).cpu_ns


@compiled
def test_costs_of_tells_nodes_apart_by_where_their_edges_lead():
    """Nodes alike but for the input a next edge leads to (a gradient of another shape: more bytes to write)
    cost what the resolver gives them one by one, whichever node the compiled lookup keeps as its exemplar (each
    edge compared with the exemplar's edge in its place; these nodes have no saved values, which share one empty
    mapping: alike on that count)."""
    import json
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.specs import default_spec
    big, small = [2048, 2048], [1, 2048]
    edges = {"a1": ("x", "y"), "a1b": ("x", "y"), "a2": ("x", "s"), "a2b": ("x", "s"), "a3": ("s", "x"),
             "a3b": ("s", "x"), "c": ("x", "x"), "d": ("s", "s"), "e": ("y", "x")}
    nodes = [{"id": k, "name": "AddBackward0", "seq": 20 - i, "inputs": [{"shape": big}],
              "next": [[f"acc_{t}", 0] for t in v]} for i, (k, v) in enumerate(edges.items())]
    nodes += [{"id": f"acc_{v}", "name": "AccumulateGrad", "variable": v,
               "inputs": [{"shape": small if v == "s" else big}]} for v in "xys"]
    doc = {"format": "autograd-graph/1", "nodes": nodes, "roots": [{"node": k} for k in edges],
           "variables": [{"name": v, "shape": small if v == "s" else big} for v in "xys"]}
    g = loads_graph(json.dumps(doc), "edges.json")
    by = {n.id: n for n in g.nodes}
    spec = default_spec()
    one = CostResolver(spec)
    assert one(by["a1"]) != one(by["a2"]) != one(by["d"])  # the edges' shapes change the cost
    for order in (["a1", "a1b", "c", "e", "a2", "d"], ["a2", "a2b", "c", "a1", "d"], ["a3", "a3b", "c", "d", "a2"],
                  ["a2", "a2b", "a3", "a3b", "c", "d", "e", "a1", "a1b"]):
        ns = [by[k] for k in order]
        assert CostResolver(spec).many(ns) == [CostResolver(spec)(n) for n in ns], order


@compiled
def test_the_compiled_stream_walk_is_its_twin(monkeypatch):
    """``analysis.streams``' critical path through threads and streams: the compiled walk (``stream_walk``) and
    ``stream_walk_py`` give the same report (``to_dict``), on simulated runs with kernels of every generator on
    1-4 devices, each placement and policy, with cross-stream waits (a placed random DAG), DDP's all-reduces and
    FSDP's collectives (communication streams)."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from autograd_run.analysis import streams
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import load_graph, loads_graph
    from autograd_run.sim.ddp import collective_kernels, simulate_ddp
    from autograd_run.sim.fsdp import add_to_recording as fsdp_add, simulate_fsdp
    from autograd_run.sim.session import SimOptions, simulate_session
    from test_fsdp_sim import LINK as FLINK, _report, three_units
    from test_ddp_sim import LINK, two_layers
    graphs = [load_graph("example:" + n) for n in ("pipeline", "mlp", "checkpoint")]
    graphs += [loads_graph(dumps(generate(kind, **kw), "json"), f"{kind}.json") for kind, kw in
               [("chain", {"n": 60}), ("mlp", {"layers": 3}), ("transformer", {"layers": 2, "devices": 2}),
                ("random", {"nodes": 120, "leaves": 15, "seed": 4}), ("fanout", {"width": 9})]]
    recordings = []
    for g in graphs:
        for k, how, policy in ((None, "keep", "pytorch"), (2, "layer", "fifo"), (3, "round-robin", "pytorch"),
                               (4, "greedy", "critical-path")):
            r = simulate_session(g, SimOptions(spec="h100", devices=k, placement=how, policy=policy, slack_top=0,
                                               detail=True))
            recordings.append((r.recording, []))
    rep = simulate_session(two_layers(), SimOptions(spec="h100", slack_top=0))
    for cap in (0.01, 1, 25):
        recordings.append((rep.recording, collective_kernels(simulate_ddp(rep, 2, LINK, bucket_cap_mb=cap),
                                                             rep.recording)[0]))
    rep = _report(three_units())
    recordings.append((rep.recording, collective_kernels(simulate_fsdp(rep, 4, FLINK), rep.recording, fsdp_add)[0]))
    walked = 0
    for rec, extra in recordings:
        compiled_report = streams.streams_of(rec, extra)
        with monkeypatch.context() as m:
            m.setattr(core, "stream_walk", None)
            twin_report = streams.streams_of(rec, extra)
        if compiled_report is None:
            assert twin_report is None
            continue
        assert compiled_report.to_dict() == twin_report.to_dict()
        walked += bool(compiled_report.path)
    assert walked >= 20
    with pytest.raises(ValueError, match="26 columns"):
        core.stream_walk((), [], [], 0, 0, 1)


@pytest.mark.parametrize("impl", ["python", pytest.param("compiled", marks=compiled)])
def test_the_stream_walk_breaks_ties_as_its_docstring_says(impl):
    """Hand-made columns where ties decide: a kernel whose previous kernel on its stream and the kernel its
    stream waited for end at the same time goes back to the previous one (the first option); a node whose
    producer ran twice, both runs ending at the same time, goes back to the earlier run in the recording."""
    from types import SimpleNamespace as NS
    import numpy as np
    from autograd_run.analysis.streams import stream_walk_py
    walk = core.stream_walk if impl == "compiled" else stream_walk_py
    i64 = lambda *v: np.array(v, dtype=np.int64)
    # kernels: k0 (stream 0, 0-10), k1 (stream 0, 10-20, enqueued at 8), k2 (stream 1, 0-10); stream 0 waited
    # at 5 for an event stream 1 recorded. Slices: s0 A 2-5 (thread 0), s1 A 3-5 (thread 1, after s3), s2 B
    # 5-9 (thread 2), s3 C 0-3 (thread 1). B's producer is A.
    nodes = [NS(id="a", name="A"), NS(id="b", name="B"), NS(id="c", name="C")]
    k_nodes = [NS(id="k0", name="K"), NS(id="k1", name="K"), NS(id="k2", name="K")]
    arrays = (i64(0, 10, 0), i64(10, 20, 10), i64(0, 0, 1), i64(0, 1, 0), i64(-1, -1, -1), i64(0, 8, 0), i64(0, 0, 0),
              i64(2, 3, 5, 0), i64(5, 5, 9, 3), i64(0, 1, 2, 1), i64(0, 1, 0, 0), i64(0, 0, 0, 0), i64(0, 0, 1, 2),
              i64(0, 2, 3), i64(0, 1, 2), i64(10, 20, 10), i64(0, 1, 0),
              i64(0, 1, 3, 4), i64(0, 3, 1, 2),
              i64(0, 1, 1), i64(5), i64(1),
              i64(0, 0, 1, 1), i64(0), i64(0, 2, 3, 4), i64(0, 1, 2, 3))
    from autograd_run.analysis.streams import StreamReport
    steps, cpu, gpu, wait = walk(arrays, k_nodes, nodes, 1, 20, 100)
    assert steps == [("kernel", k_nodes[0], 10), ("kernel", k_nodes[1], 10)] and (cpu, gpu, wait) == (0, 20, 0)
    assert StreamReport(steps=steps).path == [("kernel", "k0 K", 10), ("kernel", "k1 K", 10)]
    steps, cpu, gpu, wait = walk(arrays, k_nodes, nodes, 3 + 2, 9, 100)
    assert steps == [("cpu", nodes[0], 3), ("cpu", nodes[1], 4)] and (cpu, gpu, wait) == (7, 0, 0)
    assert StreamReport(steps=steps).path == [("cpu", "a A", 3), ("cpu", "b B", 4)]


@compiled
def test_the_compiled_routing_pushes_onto_a_simulators_queue_itself_but_for_wake_ups(monkeypatch):
    """``SimQueue.push``'s common case (the task onto the heap, no samples, no wake-up to schedule) is done by
    the compiled routing (``sim_queue_push_fast``); the method is still called where it has more to do: a wake-up
    of an idle consumer, queue samples with ``detail``. The results are the same either way (sim_dump)."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim import tasks
    from autograd_run.sim.session import SimOptions, simulate_session
    assert tasks.PUSH_COMPILED
    g = loads_graph(dumps(generate("chain", n=200), "json"), "c.json")
    calls = []
    real = tasks.SimQueue.push
    monkeypatch.setattr(tasks.SimQueue, "push", lambda self, key, task: calls.append(task) or real(self, key, task))
    plain = simulate_session(g, SimOptions(spec="h100", devices=2, placement="layer", slack_top=0))
    fast_calls = len(calls)
    assert 0 < fast_calls < 10  # the root's push and the wake-ups where the chain changes device
    calls.clear()
    detailed = simulate_session(g, SimOptions(spec="h100", devices=2, placement="layer", slack_top=0, detail=True))
    assert len(calls) > 200  # every push samples its queue: the method's
    assert plain.wall_ns == detailed.wall_ns and [s[2].id for s in plain.sim.slices] == [
        s[2].id for s in detailed.sim.slices]


@compiled
def test_the_compiled_slice_columns_are_their_twins():
    """``sim.result``'s slice columns (``_core.sim_slices``) against ``_slice_columns_py``: simulated runs on 0-3
    devices with nested calls (pool threads), and hand-made slices with what a simulation leaves unset (no queue,
    no node); a time past 64 bits is the same error."""
    import numpy as np
    from autograd_run.errors import RequestError
    from autograd_run.graphs.load import load_graph
    from autograd_run.sim import result
    from autograd_run.sim.session import SimOptions, simulate_session

    def same(slices):
        a, b = core.sim_slices(slices), result._slice_columns_py(slices)
        assert a[0] == b[0] and a[7] == b[7]
        for x, y in zip(a[1:7] + a[8:], b[1:7] + b[8:]):
            assert np.array_equal(np.frombuffer(x, dtype=np.int64), y)

    for name in ("pipeline", "mlp", "checkpoint", "reentrant", "seed"):
        g = load_graph("example:" + name)
        for k in (None, 2, 3):
            r = simulate_session(g, SimOptions(spec="h100", devices=k, placement="greedy" if k else "keep",
                                               slack_top=0))
            same(r.sim.slices)
    node = object()
    same([(1, 0, node, 5, 10, 20, "cpu", 3), (1, 0, None, 5, 20, 30, None, None), (2, 1, node, 6, 0, 5, "cuda:0", 0),
          (2, 1, object(), 6, 5, 9, "cpu", 4)])
    same([])

    class Named:  # equal by name: one code for equal objects, as a dict gives them (Nodes are coded by address)
        def __init__(self, name):
            self.name = name

        def __eq__(self, other):
            return isinstance(other, Named) and other.name == self.name

        def __hash__(self):
            return hash(self.name)

    mixed = [(1, 0, Named("a"), 5, 0, 1, None, None), (1, 0, node, 5, 1, 2, None, None),
             (1, 0, Named("a"), 5, 2, 3, None, None), (1, 0, Named("b"), 5, 3, 4, None, None),
             (1, 0, node, 5, 4, 5, None, None)]
    same(mixed)
    assert np.frombuffer(core.sim_slices(mixed)[1], dtype=np.int64).tolist() == [0, 1, 0, 2, 1]
    with pytest.raises(RequestError, match="64-bit"):
        result._slice_columns([(1, 0, node, 5, 10, 2 ** 64, "cpu", 3)])
    with pytest.raises(TypeError):
        core.sim_slices([(1, 2)])


def _deep_bytes(slices) -> int:
    """The memory a simulation's slices take: the container, and for a list its tuples and their time ints
    (the nodes, ids and queue names are shared with the graph and the simulator)."""
    import sys
    total = sys.getsizeof(slices)
    if isinstance(slices, list):
        ints = {id(v): v for s in slices for v in (s[4], s[5], s[7]) if isinstance(v, int) and not -5 <= v <= 256}
        total += sum(map(sys.getsizeof, slices)) + sum(map(sys.getsizeof, ints.values()))
    return total


@compiled
def test_a_simulation_keeps_its_slices_as_columns():
    """A million-node simulation's slices took ~200 MB as tuples; the compiled core keeps them as columns
    (``SliceLog``): under 60 bytes a slice, read back as the tuples appended, and its columns read as a list's."""
    import pickle
    import numpy as np
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.session import SimOptions, simulate_session

    for kind, kw in (("chain", dict(n=20000)), ("transformer", dict(layers=40, devices=2))):
        g = loads_graph(dumps(generate(kind, **kw), "json"), f"{kind}.json")
        sim = simulate_session(g, SimOptions(spec="h100", slack_top=0)).sim
        assert len(sim.slices) == len(g.nodes)
        assert _deep_bytes(sim.slices) < 60 * len(sim.slices), kind
        rows = list(sim.slices)
        assert core.SliceLog(rows)[:] == rows and sim.slices[-1] == rows[-1] and sim.slices[-len(rows)] == rows[0]
        a, b = core.sim_slices(sim.slices), core.sim_slices(rows)
        assert a[0] == b[0] and a[7] == b[7] and all(x == y for x, y in zip(a[1:7] + a[8:], b[1:7] + b[8:]))
    node = object()
    odd = [(1, 0, node, 5, 10, 20, "cpu", 3),          # the common form
           (1, 0, None, 5, 20, 30, None, None),        # no node, no queue
           (1, 0, node, True, 30, 40, "cpu", 4),       # a bool: kept as given, not as the int 1
           (1, 0, node, 5, 40.5, 50, "cpu", 5),         # a float time
           (1, 0, node, 5, 50, 2 ** 64, "cpu", 6),     # past 64 bits
           (2, 1, node, 6, -2 ** 63, 2 ** 63 - 1, "cuda:0", -2 ** 63),  # int64's ends
           (1, 2), "not a slice"]
    log = core.SliceLog()
    for s in odd:
        log.append(s)
    assert len(log) == len(odd) and list(log) == odd and log[::-1] == odd[::-1] and log[-2] == (1, 2)
    assert [type(v) for v in log[2]] == [type(v) for v in odd[2]] and [type(v) for v in log[3]] == [type(v) for v in odd[3]]
    named = [s[:2] + ("node",) + s[3:] if len(s) == 8 else s for s in odd]  # (an object() is not the same unpickled)
    assert pickle.loads(pickle.dumps(core.SliceLog(named))) == named
    with pytest.raises(IndexError):
        log[len(odd)]
    with pytest.raises(TypeError):
        log["0"]
    common = odd[:2] + odd[5:6]
    x, y = core.sim_slices(core.SliceLog(common)), core.sim_slices(common)
    assert x[0] == y[0] and x[7] == y[7] and all(u == v for u, v in zip(x[1:7] + x[8:], y[1:7] + y[8:]))
    assert np.frombuffer(x[5], dtype=np.int64).tolist() == [10, 20, -2 ** 63]
    for bad in ([odd[4]], [odd[6]]):  # the errors a list of the same slices gives
        with pytest.raises(Exception) as e_list:
            core.sim_slices(bad)
        with pytest.raises(type(e_list.value)):
            core.sim_slices(core.SliceLog(bad))
    log.clear()
    assert len(log) == 0 and list(log) == []


@compiled
def test_the_compiled_kernel_slices_are_their_twins():
    """``sim.result._kernel_slices`` (``_core.kernel_slices``) against ``_kernel_slices_py``: the kernels of
    simulated runs on 1-3 devices, and hand-made ones where two stream objects are
    equal but not the same, a stream is None, or a name function fails; the slices are KernelSlice tuples that
    hold their values (no reference lost or kept)."""
    import sys
    from autograd_run.graphs.load import load_graph
    from autograd_run.record.recording import KernelSlice
    from autograd_run.sim import result
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.graphs.model import Device

    def same(kernels):
        a, b = result._kernel_slices(kernels), result._kernel_slices_py(kernels)
        assert a == b and all(type(x) is KernelSlice for x in a)
        assert [(x.stream, x.node, x.start, x.end) for x in a] == [tuple(y) for y in b]
        return a
    runs = 0
    for name in ("pipeline", "mlp", "seed"):
        g = load_graph("example:" + name)
        for k in (1, 2, 3):
            r = simulate_session(g, SimOptions(spec="h100", devices=k, placement="layer", slack_top=0))
            runs += bool(same(r.sim.kernels))
    assert runs >= 6
    node, start = object(), 10 ** 12 + 7
    s1, s2 = (Device("cuda", 0), 1), (Device("cuda", 0), 1)  # equal, not the same object
    before = sys.getrefcount(start), sys.getrefcount(node)
    got = same([(s1, node, start, start + 1), (s2, node, 3, 4), (None, None, 5, 6), (s1, node, 7, 8)])
    assert [x.stream for x in got] == ["cuda:0/s1", "cuda:0/s1", "-", "cuda:0/s1"]
    assert (sys.getrefcount(start), sys.getrefcount(node)) == (before[0] + 1, before[1] + 3)  # got holds them
    del got
    assert (sys.getrefcount(start), sys.getrefcount(node)) == before
    assert same([]) == []
    with pytest.raises(TypeError):
        core.kernel_slices([(1, 2)], KernelSlice, str)
    with pytest.raises(ZeroDivisionError):
        core.kernel_slices([(s1, node, 1, 2)], KernelSlice, lambda st: 1 / 0)


@compiled
def test_the_compiled_signature_of_odd_saved_values():
    """Saved values as a hand-written file may hold them: a dict without a shape or with a null one, a list
    that is not all ints (bools, floats), a tuple shape, a dict's missing dtype, strings, None; and a shape
    that is no sequence raises the same error both ways."""
    from autograd_run.graphs.load import load_graph
    from autograd_run.sim.signature import signature_py
    n = next(n for n in load_graph("example:seed").nodes if n.next)
    cases = [{}, {"a": 1}, {"a": [1, 2]}, {"a": [1, True]}, {"a": [1.0]}, {"a": []}, {"a": {"dtype": "f"}},
             {"a": {"shape": None}}, {"a": {"shape": [2, 3]}}, {"a": {"shape": (2,), "dtype": "float64"}},
             {"a": "s", "b": None, "c": 2.5, "d": {"shape": []}}, {"b": [3], "a": {"shape": [1]}}]
    for saved in cases:
        n.saved = saved
        assert core.signature(n) == signature_py(n) and repr(core.signature(n)) == repr(signature_py(n)), saved
    n.saved = {"a": {"shape": 3}}
    with pytest.raises(TypeError) as one:
        signature_py(n)
    with pytest.raises(TypeError) as two:
        core.signature(n)
    assert str(one.value) == str(two.value)


@compiled
@pytest.mark.parametrize("kind", ["transformer", "random", "mlp"])
def test_the_compiled_routing_keeps_the_stream_rules_of_its_twin(kind, monkeypatch):
    """Routing accelerator gradients: the compiled ``route`` does the stream rules' commonest case itself (a
    slot's first gradient made on the consumer's own stream) and hands the rest to ``StreamRules``; every
    kernel, record, wait, sync and slice of a simulation on 1-3 devices is what ``route_py`` gives."""
    from autograd_run.engine import worker
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim import scheduler
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.placement import place
    from autograd_run.sim.specs import default_spec
    g = loads_graph(dumps(generate(kind), "json"), f"{kind}.json")
    spec = default_spec()

    def simulate(placed):
        sim = scheduler.Simulator(placed, spec, CostResolver(spec), detail=True)
        gt = sim.run([r.edge for r in placed.roots], placed.input_edges() or None, placed.mode != "grad")
        ids = {t.id: k for k, t in enumerate(sim.graph_tasks)}
        def plain(rows):
            return [tuple(ids.get(x, x) if i == 1 else getattr(x, "id", x) for i, x in enumerate(r)) for r in rows]
        return (gt.end - gt.start, [(s[2].id,) + s[3:] for s in sim.slices], [(str(k[0]), k[1].id if k[1] else None)
                + k[2:] for k in sim.kernels], plain(sim.stream_events), plain(sim.syncs), len(sim.queue_samples))
    for k, how in ((1, "layer"), (2, "layer"), (3, "round-robin")):
        placed = place(g, k, how, CostResolver(spec))
        compiled_run = simulate(placed)
        monkeypatch.setattr(scheduler, "route", worker.route_py)
        python_run = simulate(placed)
        monkeypatch.undo()
        assert compiled_run == python_run, (kind, k, how)
        assert compiled_run[2]  # kernels ran on the devices


@compiled
@pytest.mark.slow  # every bench/sim_dump case simulated twice (10 s here): make test, not make test-fast
def test_the_compiled_event_loop_simulates_as_its_twin(monkeypatch, tmp_path):
    """``_core.sim_loop`` against the scheduler's Python event methods: every case of ``bench/sim_dump`` (the
    examples, each generator, a 64-deep checkpoint chain, measured costs; every policy, 1-3 devices, each
    placement, four specs, scales, the slack what-ifs) gives the same order, times, slices, kernels, stream
    events, syncs, idles, skips, queue samples and summary both ways, and most of them take the compiled loop."""
    from bench import sim_dump
    from autograd_run.sim import scheduler
    monkeypatch.setattr(sim_dump, "WORK", str(tmp_path))
    monkeypatch.setattr(sim_dump, "EXTRA", None)
    took = {True: 0, False: 0}
    real = scheduler.Simulator._compiled_loop

    def counted(self):
        took[real(self)] += 1
        return real(self)
    monkeypatch.setattr(scheduler.Simulator, "_compiled_loop", counted)
    cases = list(sim_dump.cases())
    compiled_runs = [sim_dump.outcome(g, kw) for _, g, kw in cases]
    assert took[True] > 2 * took[False] > 0
    monkeypatch.setattr(core, "sim_loop", None)
    for (name, g, kw), want in zip(cases, compiled_runs):
        assert sim_dump.outcome(g, kw) == want, name
    assert sum("error" in r for r in compiled_runs) < 10


@compiled
def test_cost_nodes_alike_by_their_objects_are_costed_by_what_they_say(monkeypatch):
    """The compiled loop remembers a cost node's cost by the objects its key is read from (its attrs, name and
    device objects, its cpu flag: the loader shares one attrs dict among nodes that write the same text). Nodes
    with the same attrs text but another name, device (scaled apart) or mode, or other attrs, get their own cost:
    every node's cost is the one the resolver gives it alone, and the simulation is the Python loop's."""
    import json
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.sim.specs import load_spec
    kinds = [({"cost": {"us": 30}}, "cpu"), ({"cost": {"us": 30}}, "cuda:0"), ({"cost": {"us": 30}}, "cuda:1"),
             ({"cost": {"us": 30, "mode": "sleep"}}, "cpu"), ({"cost": {"us": 70}}, "cuda:0"),
             ({"cost": {"flops": 5e9}}, "cuda:1")]
    nodes = []
    n = 60
    for i in range(n):
        attrs, dev = kinds[i % len(kinds)]
        nxt = [[f"n{i + 1}", 0]] if i + 1 < n else []
        meta = {"shape": [4]} if dev == "cpu" else {"shape": [4], "device": dev}
        nodes.append({"id": f"n{i}", "name": ("A", "B")[(i // 6) % 2], "op": "cost", "next": nxt, "inputs": [meta],
                      "attrs": attrs})
    doc = {"format": "autograd-graph/1", "roots": [{"node": "n0"}], "nodes": nodes}
    g = loads_graph(json.dumps(doc).encode(), "g.json")
    assert g.nodes[0].attrs is g.nodes[6].attrs  # (shared by the loader: what the memo is keyed by)
    scale = {"A": 2.0, "cuda:1": 3.0}  # (a node's name and device change its cost)
    options = SimOptions(spec="h100", slack_top=0, scale=dict(scale))
    compiled = simulate_session(g, options)
    spec = load_spec("h100")
    for node in g.nodes:
        assert compiled.sim.costs.resolved[node] == CostResolver(spec, scale=dict(scale))(node), node.id
    monkeypatch.setattr(core, "sim_loop", None)
    python = simulate_session(g, options)
    rows = lambda r: [(s[1], s[2].id, *s[3:]) for s in r.sim.slices]  # noqa: E731
    assert rows(compiled) == rows(python) and compiled.wall_ns == python.wall_ns


@compiled
@pytest.mark.slow  # every bench/sim_dump case simulated twice (7 s here): make test, not make test-fast
def test_the_compiled_sequential_loop_simulates_as_its_twin(monkeypatch, tmp_path):
    """``_core.sim_sequential`` (a call on the CPU alone) against ``Simulator._run_sequential``'s Python loop:
    every case of ``bench/sim_dump`` gives the same results both ways, and many take the compiled loop."""
    from bench import sim_dump
    monkeypatch.setattr(sim_dump, "WORK", str(tmp_path))
    monkeypatch.setattr(sim_dump, "EXTRA", None)
    calls = []
    real = core.sim_sequential
    monkeypatch.setattr(core, "sim_sequential", lambda *a: (calls.append(1), real(*a))[1])
    cases = list(sim_dump.cases())
    compiled_runs = [sim_dump.outcome(g, kw) for _, g, kw in cases]
    assert len(calls) > 80  # of 406 cases: the others run on devices, or skip nodes for grad()
    monkeypatch.setattr(core, "sim_sequential", None)
    for (name, g, kw), want in zip(cases, compiled_runs):
        assert sim_dump.outcome(g, kw) == want, name


@compiled
def test_the_compiled_sequential_loop_raises_what_a_cost_model_raises():
    """An error inside the loop (a cost model's) comes out as it is, with the simulator's clock where it stopped."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.scheduler import Simulator
    from autograd_run.sim.specs import default_spec
    g = loads_graph(dumps(generate("chain", n=5), "json"), "c.json")
    seen = []

    def costs(node):
        seen.append(node.id)
        if len(seen) == 3:
            raise LookupError(f"no cost for {node.id}")
        from autograd_run.sim.costs import NodeCost
        return NodeCost(1000, 0, True, "test")
    sim = Simulator(g, default_spec(), costs)
    with pytest.raises(LookupError, match="no cost for mul_2"):
        sim.run([r.edge for r in g.roots])
    assert len(sim.slices) == 2 and sim.now == sim.slices[-1][5]


@compiled
def test_the_compiled_event_loop_raises_what_a_cost_model_raises():
    """An error inside the loop (here a cost model's) leaves it as it is, and the simulator's ``at`` is its own
    method again."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.scheduler import Simulator
    from autograd_run.sim.specs import default_spec
    g = loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json")

    def costs(node):
        raise LookupError(f"no cost for {node.id}")
    sim = Simulator(g, default_spec(), costs)
    assert sim._compiled_loop()
    with pytest.raises(LookupError, match="no cost for"):
        sim.run([r.edge for r in g.roots])
    assert "at" not in vars(sim)


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_waiting_counts_the_workers_blocked_in_pop(impl):
    """``waiting``: a test's way to know a worker is asleep on an empty queue (not merely between pops)."""
    import threading
    import time
    if impl == "compiled" and not core.COMPILED:
        pytest.skip("the compiled core is not built")
    q = core.ReadyQueue("c") if impl == "compiled" else pure.ReadyQueue("p")
    assert q.waiting == 0
    got = []
    t = threading.Thread(target=lambda: got.append(q.pop()))
    t.start()
    deadline = time.monotonic() + 10
    while not q.waiting and time.monotonic() < deadline:
        time.sleep(0.001)
    assert q.waiting == 1 and not got
    q.push(1, ("gt", "item", None))
    t.join(10)
    assert got and got[0][1] == "item" and q.waiting == 0


@pytest.mark.skipif(core.compute_dependencies is None, reason="the compiled core is not built")
def test_compute_dependencies_compiled_and_twin_alike():
    """The dependency counts, and the order they are entered in, from the compiled pass and its Python twin,
    on generated graphs of every kind (with and without a floor on the topological number) and the examples."""
    from types import SimpleNamespace
    from autograd_run.engine.graph_task import compute_dependencies_py
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import example_names, load_graph, loads_graph
    from autograd_run.graphs.dump import dumps
    graphs = [loads_graph(dumps(generate(kind, **kw), "json"), "g.json") for kind, kw in (
        ("chain", dict(n=300)), ("mlp", dict(layers=20, width=3, batch=2)),
        ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8, devices=2)),
        ("random", dict(nodes=2000, leaves=50, width=2, seed=3)), ("fanout", dict(width=40)))]
    graphs += [load_graph(f"example:{name}") for name in example_names()]
    for g in graphs:
        root = g.roots[0].edge.node
        for floor in (0, max(n.topo_nr for n in g.nodes) // 2):
            compiled, twin = {}, SimpleNamespace(dependencies={})
            core.compute_dependencies(root, compiled, floor)
            compute_dependencies_py(root, twin, floor)
            assert list(compiled.items()) == list(twin.dependencies.items()), g.source


@pytest.mark.skipif(core.NodeMap is None, reason="the compiled core is not built")
def test_compute_dependencies_into_a_node_map_counts_as_the_twin():
    """Into a NodeMap the compiled pass takes the nodes a batch at a time and fetches what it reads ahead for
    nodes that lie apart in memory (a random DAG's, made in random order here so that every batch is spread): the
    same counts as the Python twin's dict, with and without a floor, on random DAGs whose file order is shuffled
    and on the other generated kinds (their nodes lie together: the batch is not fetched ahead)."""
    import json
    import random
    from types import SimpleNamespace
    from autograd_run.engine.graph_task import compute_dependencies_py
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    docs = []
    for seed in (1, 2):
        doc = generate("random", nodes=3000, leaves=60, width=3, seed=seed)
        random.Random(seed).shuffle(doc["nodes"])
        docs.append(doc)
    docs += [generate("mlp", layers=30, width=3, batch=2), generate("chain", n=500),
             generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2)]
    for doc in docs:
        g = loads_graph(json.dumps(doc).encode(), "g.json")
        root = g.roots[0].edge.node
        spread = max(id(n) for n in g.nodes) - min(id(n) for n in g.nodes)
        for floor in (0, max(n.topo_nr for n in g.nodes) // 3):
            m, twin = core.NodeMap(len(g.nodes)), SimpleNamespace(dependencies={})
            core.compute_dependencies(root, m, floor)
            compute_dependencies_py(root, twin, floor)
            assert dict(m) == twin.dependencies and len(m) == len(twin.dependencies), (g.source, floor, spread)
            assert sum(m.values()) == sum(twin.dependencies.values())


@pytest.mark.parametrize("loop", ["compiled sequential", "python sequential", "event loop"])
def test_a_node_with_more_outputs_than_the_simulators_list_routes_every_one(monkeypatch, loop):
    """The simulator's list of ones (one count per output of the node it routes) starts short and grows where a
    node has more outputs: a node fanning out to 40 leaves routes all 40 in every loop (route reads no further
    than the list it is given, so a list that did not grow would drop leaves and the task would never finish)."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.session import SimOptions, simulate_session
    n = 40
    doc = {"format": "autograd-graph/1", "roots": [{"node": "fan", "grad": "ones"}],
           "variables": [{"name": f"v{i}", "shape": [2]} for i in range(n)],
           "nodes": [{"id": "fan", "name": "CostBackward", "op": "cost", "attrs": {"cost": {"us": 5}},
                      "inputs": [{"shape": [2]}], "next": [[f"acc{i}", 0] for i in range(n)]},
                     *({"id": f"acc{i}", "name": "torch::autograd::AccumulateGrad", "variable": f"v{i}",
                        "inputs": [{"shape": [2]}]} for i in range(n))]}
    g = loads_graph(dumps(doc, "json"), "fan.json")
    if loop != "compiled sequential":
        monkeypatch.setattr(core, "sim_sequential", None)
    if loop == "event loop":
        monkeypatch.setattr(core, "sim_loop", None, raising=False)
    calls = []
    if loop == "compiled sequential" and core.sim_sequential is not None:
        real = core.sim_sequential
        monkeypatch.setattr(core, "sim_sequential", lambda *a: (calls.append(1), real(*a))[1])
    rep = simulate_session(g, SimOptions(spec="h100", policy="pytorch" if loop == "event loop"
                                         else "single-thread", slack_top=0))
    ran = [r["id"] for r in rep.order]
    assert sorted(ran) == sorted(["fan"] + [f"acc{i}" for i in range(n)])
    assert loop != "compiled sequential" or core.sim_sequential is None or calls
