"""The loader's compiled node loops (``graphs/_build.c``) against their Python twin (``validate._nodes_py``,
``_edges_py``): the same graph, field by field, from every shipped example, generated graphs of every kind
and a few hundred fuzzed files, and the same error, word for word, where a file is wrong.

The compiled loops do the nodes they can and hand every other one to the Python loop, so these tests also
check that they really do the common nodes (a chain's nodes, bar the first of its kind and the leaf's).
"""

import random

import pytest

from autograd_run.errors import GraphFileError
from autograd_run.graphs import validate
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import example_names, load_graph, loads_graph
from autograd_run.graphs.model import ensure_consumers

pytestmark = pytest.mark.skipif(validate._FAST is None, reason="the compiled loader loops are not in use "
                                                                "(not built, or AUTOGRAD_RUN_PURE_PYTHON is set)")


def snapshot(g) -> tuple:
    """Everything a loaded graph holds, as plain values (nodes by index; saved values by repr, NaN-safe);
    consumers as ``ensure_consumers`` makes them (the loader leaves them None, both ways)."""
    assert all(n.consumers is None for n in g.nodes)
    assert all(type(k) is str for k in g.by_id)  # the loops' non-string key (validate._GENERAL_KEYS) is gone
    ensure_consumers(g)
    def node(n):
        return (n.id, n.name, n.op.name, n.seq,
                tuple(None if e is None else (type(e).__name__, e.node.index, e.input_nr) for e in n.next),
                tuple((m.shape, m.dtype, str(m.device), m.stream) for m in n.inputs),
                type(n.saved).__name__, repr(n.saved), type(n.attrs).__name__, repr(n.attrs), n.variable,
                n.fwd_thread, n.index, n.topo_nr, str(n.device), n.stream,
                tuple((c.index, k) for c, k in n.consumers), n.cpu, n.saves_tensors, n.saved_strings)
    return (tuple(node(n) for n in g.nodes),
            tuple((r.edge.node.index, r.edge.input_nr, repr(r.grad)) for r in g.roots),
            tuple((k, type(v.shape).__name__, v.shape, v.dtype, str(v.device), repr(v.grad),
                   v.node.index if v.node else None, v.requires_grad, repr(v.hooks)) for k, v in g.variables.items()),
            tuple(g.inputs), g.mode, repr(g.meta), g.max_device_index, g.slot_dtypes,
            sorted(op.name for op in g.op_set), len({id(n.name) for n in g.nodes}),
            tuple((k, n.index) for k, n in g.by_id.items()), g.num_edges, tuple(map(str, g.devices)))


def outcome(load, monkeypatch, compiled: bool):
    """("ok", the graph's snapshot and the memory budget's count) or ("error", its text)."""
    monkeypatch.setattr(validate, "_FAST", validate._FAST if compiled else None)
    budget = []
    real_check = validate._Checker.check_budget

    def check_budget(self):
        budget.append((dict(self.bytes), list(self._top), self._top_min))
        return real_check(self)
    monkeypatch.setattr(validate._Checker, "check_budget", check_budget)
    try:
        return "ok", snapshot(load()), budget
    except GraphFileError as exc:
        return "error", str(exc)
    except Exception as exc:  # a bug either way: compared too, and reported by the assertion
        return type(exc).__name__, str(exc)
    finally:
        monkeypatch.undo()


def both(load, monkeypatch):
    fast = outcome(load, monkeypatch, True)
    slow = outcome(load, monkeypatch, False)
    return fast, slow


def generated():
    return [("chain", dict(n=50)), ("chain", dict(n=30, op="add")), ("fanout", dict(width=5)),
            ("mlp", dict(layers=3, width=4, batch=2)), ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8)),
            ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8, devices=2)),
            ("random", dict(nodes=60, leaves=8, width=3, seed=4))]


@pytest.mark.parametrize("name", example_names())
def test_examples_load_alike(name, monkeypatch):
    fast, slow = both(lambda: load_graph(f"example:{name}"), monkeypatch)
    assert fast == slow
    assert fast[0] == "ok"


@pytest.mark.parametrize("kind,kw", generated(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_generated_graphs_load_alike(kind, kw, fmt, monkeypatch):
    data = dumps(generate(kind, **kw), fmt)
    fast, slow = both(lambda: loads_graph(data, f"g.{fmt}"), monkeypatch)
    assert fast[0] == "ok", fast
    assert fast == slow


def test_the_compiled_loop_does_the_common_nodes(monkeypatch):
    """A 1000-node chain: the Python loop sees only the first multiply (its op text and metadata are new)
    and the leaf's AccumulateGrad; no node's edges need it."""
    seen = {"nodes": [], "edges": []}
    real_nodes, real_edges = validate._Checker._nodes_py, validate._Checker._edges_py

    def nodes_py(self, st, lo, hi):
        seen["nodes"].extend(range(lo, hi))
        return real_nodes(self, st, lo, hi)

    def edges_py(self, st, lo, hi):
        seen["edges"].extend(range(lo, hi))
        return real_edges(self, st, lo, hi)
    monkeypatch.setattr(validate._Checker, "_nodes_py", nodes_py)
    monkeypatch.setattr(validate._Checker, "_edges_py", edges_py)
    g = loads_graph(dumps(generate("chain", n=1000), "json"), "c.json")
    assert len(g.nodes) == 1001
    assert seen["nodes"] == [0, 1000]
    assert seen["edges"] == []


def _chain_doc(n=6):
    return generate("chain", n=n)


def _wrong(mutate):
    doc = _chain_doc()
    mutate(doc["nodes"])
    return dumps(doc, "json")


# Each wrong in a node the compiled loop would otherwise do (the fourth: past the first of its kind).
WRONG = {
    "duplicate id": lambda ns: ns[3].update(id=ns[2]["id"]),
    "empty id": lambda ns: ns[3].update(id=""),
    "seq too big": lambda ns: ns[3].update(seq=2**64),
    "seq negative": lambda ns: ns[3].update(seq=-1),
    "fwd_thread too big": lambda ns: ns[3].update(fwd_thread=2**63),
    "variable on an op node": lambda ns: ns[3].update(variable="x"),
    "too few next edges": lambda ns: ns[3].update(next=[ns[3]["next"][0]]),
    "edge to a missing node": lambda ns: ns[3].update(next=[["nowhere", 0], None]),
    "input_nr out of range": lambda ns: ns[3].update(next=[[ns[4]["id"], 3], None]),
    "incompatible gradient shape": lambda ns: ns[4].update(inputs=[{"shape": [3]}]),
    "saved text in a tensor field": lambda ns: ns[3].update(saved={"other": "x"}),
    "saved null": lambda ns: ns[3].update(saved={"other": None}),
    "unknown op": lambda ns: ns[3].update(name="NoSuchBackward0"),
    "attrs.fail not a string": lambda ns: ns[3].update(attrs={"fail": 3}),
    "a cycle": lambda ns: ns[4].update(next=[[ns[2]["id"], 0], None]),
    "new metadata with a bad dtype": lambda ns: ns[3].update(inputs=[{"shape": [1], "dtype": "float7"}]),
    "required field missing": lambda ns: (ns[2].update(name="SoftmaxBackward0", saved={"result": [1.0], "dim": 0},
                                                       next=ns[2]["next"][:1]),
                                          ns[3].update(name="SoftmaxBackward0", saved={"dim": 0},
                                                       next=ns[3]["next"][:1])),
    "a bad saved value where the op is known": lambda ns: ns[3].update(saved={"other": {"random": {"shape": [-1]}}}),
    "needed field missing": lambda ns: ns[3].update(saved={}),
}


def test_a_matrix_product_with_a_gradient_of_another_rank(monkeypatch):
    """An mm past the first (the compiled loop's) whose input is not a matrix: the same error both ways."""
    doc = generate("mlp", layers=3, width=4, batch=2)
    mm = [n for n in doc["nodes"] if n["name"] == "MmBackward0"]
    assert len(mm) >= 2
    first = doc["nodes"][0]["inputs"][0]
    assert len(first["shape"]) != 2 and doc["nodes"].index(mm[1]) > 0
    mm[1]["inputs"] = [dict(first)]  # metadata the loader has seen: the compiled loop reads the rank itself
    data = dumps(doc, "json")
    fast, slow = both(lambda: loads_graph(data, "m.json"), monkeypatch)
    assert fast == slow
    assert fast[0] == "error"
    assert f"has shape {first['shape']}, but the gradient it receives, of mm's result, has 2" in fast[1]


@pytest.mark.parametrize("what", sorted(WRONG))
def test_wrong_files_give_the_same_error(what, monkeypatch):
    data = _wrong(WRONG[what])
    fast, slow = both(lambda: loads_graph(data, "w.json"), monkeypatch)
    assert fast == slow
    assert fast[0] == "error", fast


def _mlp_doc():
    doc = generate("mlp", layers=2, width=3, batch=2)
    names = [n["id"] for n in doc["nodes"]]
    # the compiled loop's nodes: past the first of their op and metadata
    assert names[12] == "acc_w0" and names[8] == "relu_2" and names[10] == "mm_0"
    return doc


def _var(doc, name):
    return next(v for v in doc["variables"] if v["name"] == name)


# (what, mutation, loads): AccumulateGrad nodes and saved tensor specs the compiled loop checks itself.
MLP_CASES = [
    ("acc of an unknown variable", lambda d: d["nodes"][12].update(variable="nope"), False),
    ("acc of a variable another acc has", lambda d: d["nodes"][12].update(variable="w1"), False),
    ("acc of a variable without grad", lambda d: _var(d, "w0").update(requires_grad=False), False),
    ("acc with a next edge", lambda d: d["nodes"][12].update(next=[["acc_b0", 0]]), False),
    ("acc input of another shape", lambda d: d["nodes"][12].update(inputs=[{"shape": [3]}]), False),
    ("acc with two inputs", lambda d: d["nodes"][12].update(inputs=[{"shape": [3, 3]}] * 2), False),
    ("acc without inputs", lambda d: d["nodes"][12].pop("inputs"), True),
    ("acc with a null seq", lambda d: d["nodes"][12].update(seq=None), True),
    ("acc with a seq", lambda d: d["nodes"][12].update(seq=77), True),
    ("random spec with a negative seed", lambda d: d["nodes"][8]["saved"].update(result={"random": -1, "shape": [2, 3]}),
     False),
    ("random spec with a negative size", lambda d: d["nodes"][8]["saved"].update(result={"random": 1, "shape": [2, -3]}),
     False),
    ("random spec too big", lambda d: d["nodes"][8]["saved"].update(result={"random": 1, "shape": [2**20, 2**20]}),
     False),
    ("random spec of a huge size and a zero", lambda d: d["nodes"][10]["saved"].update(extra={"random": 1,
                                                                                            "shape": [0, 2**70]}),
     True),
    ("a matrix that does not fit the gradient", lambda d: d["nodes"][10]["saved"].update(
        self={"random": 1, "shape": [5, 3]}), False),
    # (its inner size is free of the gradient it receives, but not of the weight gradient it makes: [7, 3] for a
    # [3, 3] weight)
    ("a matrix that fits, its inner size not the weight's", lambda d: d["nodes"][10]["saved"].update(
        self={"random": 1, "shape": [2, 7]}), False),
    ("a second matrix that does not fit", lambda d: d["nodes"][10]["saved"].update(
        mat2={"random": 1, "shape": [3, 4]}), False),
    ("a matrix of the wrong rank", lambda d: d["nodes"][10]["saved"].update(self={"random": 1, "shape": [6]}), False),
    ("a saved tensor that does not broadcast", lambda d: d["nodes"][8]["saved"].update(result={"random": 1,
                                                                                               "shape": [5, 7]}),
     False),
    ("a saved tensor that broadcasts", lambda d: d["nodes"][8]["saved"].update(result={"random": 1, "shape": [1, 3]}),
     True),
    ("a random spec with a distribution", lambda d: d["nodes"][8]["saved"].update(
        result={"random": 1, "shape": [2, 3], "dist": "uniform"}), True),
    ("a float16 gradient times a float32 tensor", lambda d: d["nodes"][8].update(inputs=[{"shape": [2, 3],
                                                                                          "dtype": "float16"}]),
     True),
    ("an undeclared saved field", lambda d: d["nodes"][8]["saved"].update(extra={"random": 2, "shape": [3]}), True),
    ("an undeclared tensor that does not broadcast", lambda d: d["nodes"][8]["saved"].update(
        extra={"random": 2, "shape": [9]}), False),
    ("an undeclared non-tensor field", lambda d: d["nodes"][8]["saved"].update(extra=[1, "x"]), True),
    # a sum's formula is grad.expand(self_sym_sizes), and what it sends must fit its next node's input (sum_to)
    ("a sum whose gradient cannot expand to its sizes", lambda d: d["nodes"][0].update(inputs=[{"shape": [3]}]),
     False),
    ("a sum whose gradient expands to its sizes", lambda d: d["nodes"][0].update(inputs=[{"shape": [1]}]), True),
    ("a sum whose sizes its next input cannot take", lambda d: d["nodes"][0]["saved"].update(self_sym_sizes=[3, 1]),
     False),
    ("a sum whose sizes its next input sums to", lambda d: d["nodes"][0]["saved"].update(self_sym_sizes=[2, 5]),
     True),
    # an mm's gradients are grad @ mat2.T and self.T @ grad: each consumer must take that shape (or sum to it)
    ("an mm whose input gradient goes to a slot of another shape",
     lambda d: _node(d, "mm_3")["next"].__setitem__(0, ["acc_w1", 0]), False),
    ("an mm whose weight gradient goes to a slot that sums it",
     lambda d: _node(d, "mm_3")["next"].__setitem__(1, ["acc_b1", 0]), True),
    ("an mm whose saved matrix is inline data: its shape not read for the check",
     lambda d: _node(d, "mm_3")["saved"].update(mat2=[[0.5] * 3] * 3), True),
]


def _node(doc, nid):
    return next(n for n in doc["nodes"] if n["id"] == nid)


# Variables: the compiled loop makes those of a (shape, dtype, device) already checked that write nothing but
# a name, shape, dtype and device; each case here lands on one it would otherwise make (w1 and b1 follow w0's
# and b0's shapes).
VARIABLE_CASES = [
    ("a repeated name", lambda d: _var(d, "b1").update(name="w1"), False),
    ("an empty name", lambda d: _var(d, "w1").update(name=""), False),
    ("an initial grad", lambda d: _var(d, "w1").update(grad="zeros"), True),
    ("an initial grad of another shape", lambda d: _var(d, "w1").update(grad={"random": 1, "shape": [2]}), False),
    ("an initial grad of a variable no node reaches", lambda d: d["variables"].append(
        {"name": "spare", "shape": [3, 3], "grad": {"random": 1, "shape": [3, 3]}}), True),
    ("requires_grad false", lambda d: d["variables"].append({"name": "frozen", "shape": [3, 3],
                                                              "requires_grad": False}), True),
    ("requires_grad true, written", lambda d: _var(d, "w1").update(requires_grad=True), True),
    ("hooks", lambda d: _var(d, "w1").update(hooks=[{"kind": "scale", "by": 2.0}]), True),
    ("bad hooks", lambda d: _var(d, "w1").update(hooks=[{"kind": "nope"}]), False),
    ("a dtype written", lambda d: _var(d, "w1").update(dtype="float32"), True),
    ("a bad dtype", lambda d: _var(d, "w1").update(dtype="float7"), False),
    ("a bad device", lambda d: _var(d, "w1").update(device="cuda:x"), False),
    ("a negative size", lambda d: _var(d, "w1").update(shape=[3, -3]), False),
    ("a shape seen under another device", lambda d: _var(d, "w1").update(device="cpu"), True),
    ("a device its AccumulateGrad's input is not on", lambda d: _var(d, "w1").update(device="cuda:0"), False),
    ("many variables no node reaches", lambda d: d["variables"].extend(
        {"name": f"v{k}", "shape": [3] * (k % 3)} for k in range(40)), True),
]


@pytest.mark.parametrize("what,mutate,loads", MLP_CASES + VARIABLE_CASES,
                         ids=[c[0] for c in MLP_CASES + VARIABLE_CASES])
def test_accumulate_grad_saved_specs_and_variables_alike(what, mutate, loads, monkeypatch):
    doc = _mlp_doc()
    mutate(doc)
    data = dumps(doc, "json")
    fast, slow = both(lambda: loads_graph(data, "m.json"), monkeypatch)
    assert fast == slow
    assert fast[0] == ("ok" if loads else "error"), fast


def test_budget_counts_alike(monkeypatch):
    """The saved tensors' bytes the compiled loop adds up are the Python loop's: the same memory-budget
    refusal, with the same figures and the same largest contributors."""
    doc = generate("mlp", layers=30, width=64, batch=32)
    data = dumps(doc, "json")
    fast, slow = both(lambda: loads_graph(data, "m.json", max_bytes=1 << 20), monkeypatch)
    assert fast == slow
    assert fast[0] == "error" and "memory budget" in fast[1], fast


def test_fuzzed_files_load_alike(tmp_path, monkeypatch):
    """Hostile variants of real graphs (``bench/fuzz.py``'s mutations): the same graph or the same error."""
    from bench.fuzz import make_case, seed_graphs
    rng = random.Random(4242)
    seeds = seed_graphs()
    kinds = {"ok": 0, "error": 0}
    for k in range(250):
        folder = tmp_path / str(k)
        folder.mkdir()
        case = make_case(rng, seeds, str(folder))
        path = str(folder / case["file"])
        fast, slow = both(lambda: load_graph(path), monkeypatch)
        assert fast == slow, (k, case["steps"])
        assert fast[0] in kinds, (k, case["steps"], fast)
        kinds[fast[0]] += 1
    assert kinds["ok"] >= 15 and kinds["error"] >= 15, kinds  # both ways compared many times


def test_an_error_reading_the_gradient_shape_is_raised_as_is(monkeypatch):
    """The compiled broadcast check reads input 0's shape; where that read fails, its exception comes out as
    it is (it once called check_broadcast with the exception still set: a SystemError)."""
    class Unreadable(Exception):
        pass

    class Meta:
        __slots__ = ("dtype", "device", "stream")

        def __init__(self, m):
            self.dtype, self.device, self.stream = m.dtype, m.device, m.stream

        @property
        def shape(self):
            raise Unreadable("no shape")

    real = validate._Checker._meta
    doc = _chain_doc()
    doc["nodes"][3]["saved"] = {"other": {"random": 1, "shape": [1]}}  # the compiled loop's node
    data = dumps(doc, "json")
    for compiled in (True, False):
        monkeypatch.setattr(validate._Checker, "_meta", lambda self, m, path: Meta(real(self, m, path)))
        monkeypatch.setattr(validate, "_FAST", validate._FAST if compiled else None)
        with pytest.raises(Unreadable):
            loads_graph(data, "c.json")
        monkeypatch.undo()


def test_nodes_share_their_name_and_the_graph_knows_its_ops(monkeypatch):
    """Each distinct name is one string object (a million-node chain saves ~60 MB), both ways; the graph's
    ``op_set`` is every op its nodes use, so a search for an op it lacks looks at no node."""
    from autograd_run.ops import CHECKPOINT, PYTHON, lookup as get_op
    data = dumps(generate("mlp", layers=3, width=4, batch=2), "json")
    for compiled in (True, False):
        monkeypatch.setattr(validate, "_FAST", validate._FAST if compiled else None)
        g = loads_graph(data, "m.json")
        names = {n.name for n in g.nodes}
        assert len({id(n.name) for n in g.nodes}) == len(names) > 1
        assert g.op_set == {n.op for n in g.nodes}
        assert get_op("AccumulateGrad") in g.op_set
        assert g.nodes_of(PYTHON) == [] and g.nodes_of(CHECKPOINT) == []
        acc = [n for n in g.nodes if n.op is get_op("AccumulateGrad")]
        assert g.nodes_of(get_op("AccumulateGrad")) == acc and acc
        g.op_set = None  # unknown (a graph built in code): every node is looked at
        assert g.nodes_of(get_op("AccumulateGrad")) == acc
        monkeypatch.undo()


def test_the_compiled_topological_pass_hands_back_what_it_cannot_read():
    """``_build.topo_in`` gives the Python loop's numbers on a loaded graph, and says False (so the Python
    loop runs) for a node list that is not laid out as the loader makes it."""
    from autograd_run.graphs.model import _topo_in
    g = loads_graph(dumps(generate("random", nodes=80, leaves=6, width=3, seed=9), "json"), "r.json")
    want = [n.topo_nr for n in g.nodes]
    for n in g.nodes:
        n.topo_nr = 0
    _topo_in(reversed(g.nodes))
    assert [n.topo_nr for n in g.nodes] == want
    ordered = sorted(g.nodes, key=lambda n: -n.topo_nr)  # every edge to a later node in this list
    for n in g.nodes:
        n.topo_nr = 0
    assert validate._FAST.topo_in(ordered, True) is True
    assert [n.topo_nr for n in g.nodes] == want
    assert validate._FAST.topo_in([object()], True) is False
    odd = g.nodes[0]
    odd.next = tuple(odd.next)  # a graph built in code may hold a tuple
    assert validate._FAST.topo_in([odd], True) is False


def test_edges_and_devices_counted_by_hand():
    """``Graph.num_edges`` and ``devices``, compiled (``_build.edges_and_devices``) and in Python, against a
    count by hand on a graph over three devices whose nodes have empty (None) slots; the compiled pass
    hands back None for a node list it cannot read, so the properties then take the Python pass."""
    from autograd_run.graphs.model import Graph
    from autograd_run.sim.placement import _remapped
    base = loads_graph(dumps(generate("chain", n=120), "json"), "c.json")
    rng = random.Random(4)
    g = _remapped(base, [rng.randrange(3) for _ in base.nodes], "placed")
    by_hand = sum(1 for n in g.nodes for e in n.next if e is not None)
    nones = sum(1 for n in g.nodes for e in n.next if e is None)
    kinds = {str(n.device) for n in g.nodes}
    assert nones and len(kinds) >= 3  # the test means something: empty slots, three devices or more
    edges, devs = validate._FAST.edges_and_devices(g.nodes)
    assert edges == by_hand and sorted(map(str, devs)) == sorted(kinds)
    assert len(devs) == len({id(n.device) for n in g.nodes})  # by identity, each once
    assert [str(d) for d in g.devices] == sorted(kinds, key=lambda d: (d != "cpu", d))
    assert g.num_edges == by_hand
    odd = g.nodes[5]
    odd.next = tuple(odd.next)  # a graph built in code may hold a tuple: the Python pass counts it
    assert validate._FAST.edges_and_devices(g.nodes) is None
    assert g.num_edges == by_hand and len(g.devices) == len(kinds)
    assert validate._FAST.edges_and_devices([object()]) is None
    empty = Graph(nodes=[], roots=[], variables={})
    assert empty.num_edges == 0 and empty.devices == []


# attrs.cost values at and around check_cost's rules: the compiled loop passes the plainly valid ones itself
COSTS = [None, {}, {"us": 5}, {"us": 5.5}, {"us": 0}, {"us": -0.0}, {"us": validate.MAX_COST_US},
         {"us": validate.MAX_COST_US + 1e-6}, {"us": int(validate.MAX_COST_US) + 1}, {"us": -1}, {"us": True},
         {"us": False}, {"us": "5"}, {"us": None}, {"us": 2**70}, {"us": 10**400 // 10**380},
         {"flops": validate.MAX_COST_FLOPS}, {"flops": validate.MAX_COST_FLOPS + 1}, {"flops": 1e9, "mode": "matmul"},
         {"us": 3, "mode": "wait"}, {"us": 3, "mode": "sleep"}, {"us": 3, "mode": "spin"}, {"us": 3, "mode": "Spin"},
         {"us": 3, "mode": None}, {"us": 3, "mode": 1}, {"us": 3, "fail": "x"}, {"ms": 3}, [1], "3", 3,
         {"us": 1, "flops": 2, "mode": "wait"}]


@pytest.mark.parametrize("k", range(len(COSTS)))
@pytest.mark.parametrize("extra", [{}, {"fail": 3}, {"trace": "t"}])
def test_cost_attrs_give_the_same_outcome(k, extra, monkeypatch):
    """A cost node whose ``attrs`` is (or is not only) a cost, valid or not, after three of its kind: the same
    graph or the same error both ways (text and place)."""
    def mutate(ns):
        for n in ns[1:5]:  # three plain cost nodes, then the one under test (done by the compiled loop)
            n.update(name="cost", op="cost", saved={}, attrs={"cost": {"us": 5}}, next=[None])
        ns[4]["attrs"] = {"cost": COSTS[k]} | extra
    ns_doc = dumps(_cost_chain(mutate), "json")
    fast, slow = both(lambda: loads_graph(ns_doc, "g.json"), monkeypatch)
    assert fast == slow


def _cost_chain(mutate):
    doc = _chain_doc(8)
    mutate(doc["nodes"])
    return doc


def test_plain_cost_attrs_are_not_handed_to_check_attrs(monkeypatch):
    """Valid cost-only attrs are checked in the compiled loop (no call); any other attrs still are handed over."""
    calls = []
    real = validate._Checker.check_attrs
    monkeypatch.setattr(validate._Checker, "check_attrs", lambda self, node, i, attrs: (calls.append(i),
                                                                                        real(self, node, i, attrs)))
    def mutate(ns):
        for i, n in enumerate(ns[1:5], 1):
            n.update(name="cost", op="cost", saved={}, next=[None],
                     attrs={"cost": {"us": 10 + i, "mode": "wait"}} | ({"trace": "t"} if i == 4 else {}))
    loads_graph(dumps(_cost_chain(mutate), "json"), "g.json")
    assert calls == [1, 4]  # the first of its kind goes through the Python loop whole; the one with a trace


def _random_text(rnd: random.Random) -> str:
    return "".join(rnd.choice("ab:c::\u00e9\u2603\U0001F600 {}[],\"\\") for _ in range(rnd.randrange(6)))


def _random_json(rnd: random.Random, depth: int = 0):
    """A JSON value with colons in keys and strings, nested objects and lists, unicode, numbers of every kind."""
    pick = rnd.randrange(9 if depth < 4 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rnd.choice([True, False, 0, -7, 2 ** 70, 1.5, -1e300, 3e-9, float("nan")])
    if pick in (2, 3, 4):
        return _random_text(rnd)
    if pick in (5, 6):
        return {_random_text(rnd) + str(i): _random_json(rnd, depth + 1) for i in range(rnd.randrange(4))}
    return [_random_json(rnd, depth + 1) for _ in range(rnd.randrange(4))]


def test_kept_colons_is_what_encoding_counts():
    """``_build.kept_colons`` (load._json_has_no_duplicates' count, compiled) against the encoder's own output,
    colons counted: every shipped example, generated graphs, and node specs with random saved values and attrs
    (colons in keys, values and ids; nesting; unicode); a value nested past its depth gives None (the encoder
    then counts)."""
    import msgspec
    import yaml
    from autograd_run.graphs import load as load_mod
    from autograd_run.graphs.schema import MetaSpec, NodeSpec
    count = validate.KEPT_COLONS
    assert count is not None

    def encoded(nodes):
        return msgspec.json.encode(nodes).count(b":")
    specs = []
    for name in example_names():  # (YAML or JSON: read as data, then as the JSON loader decodes it)
        doc = yaml.safe_load(load_mod.read_source(f"example:{name}")[0])
        specs.append(load_mod._JSON_DECODER.decode(msgspec.json.encode(doc)).nodes)
    for kind, kw in generated():
        specs.append(load_mod._JSON_DECODER.decode(dumps(generate(kind, **kw), "json")).nodes)
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    for _ in range(300):
        nodes = []
        for i in range(rnd.randrange(1, 5)):
            kw = {"id": f"n:{i}" if rnd.random() < 0.3 else f"n{i}", "name": rnd.choice(["A:b", "Mul"])}
            if rnd.random() < 0.5:
                kw["op"] = rnd.choice([None, "identity", "x:y"])
            if rnd.random() < 0.5:
                kw["seq"] = rnd.choice([None, 3])
            if rnd.random() < 0.5:
                kw["next"] = [None if rnd.random() < 0.2 else (rnd.choice(["a:b", "c"]), 0) for _ in range(2)]
            if rnd.random() < 0.7:
                kw["inputs"] = [MetaSpec(shape=(2, 3), **({"dtype": "float32"} if rnd.random() < 0.5 else {}),
                                         **({"device": "cuda:1"} if rnd.random() < 0.5 else {}),
                                         **({"stream": 2} if rnd.random() < 0.3 else {}))]
            for field in ("saved", "attrs"):
                if rnd.random() < 0.6:
                    kw[field] = {f"k:{j}" if rnd.random() < 0.3 else f"k{j}": _random_json(rnd)
                                 for j in range(rnd.randrange(3))}
            if rnd.random() < 0.3:
                kw["variable"] = rnd.choice([None, "w:0"])
            nodes.append(NodeSpec(**kw))
        specs.append(nodes)
    for nodes in specs:
        assert count(nodes) == encoded(nodes), f"seed {seed}"
    deep = {}
    for _ in range(100):
        deep = {"d:": deep}
    assert count([NodeSpec(id="a", name="b", attrs=deep)]) is None
    assert count([NodeSpec(id="a", name="b", attrs={"x": object()})]) is None


def test_the_compiled_loop_does_the_common_variables(monkeypatch):
    """A 300-layer MLP's 601 variables in two shapes (and the output layer's): the Python loop sees the first
    of each; the byte count is the compiled one's throughout, and the budget's figures are the Python loop's
    (with a limit that makes the variables' gradients the largest contributors)."""
    seen = {"variables": [], "bytes": []}
    real_vars, real_bytes = validate._Checker._variables_py, validate._Checker._variable_bytes_py

    def variables_py(self, spec_vars, lo, hi, *rest):
        seen["variables"].extend(range(lo, hi))
        return real_vars(self, spec_vars, lo, hi, *rest)

    def variable_bytes_py(self, values, var_bytes, initial, lo, hi):
        seen["bytes"].extend(range(lo, hi))
        return real_bytes(self, values, var_bytes, initial, lo, hi)
    monkeypatch.setattr(validate._Checker, "_variables_py", variables_py)
    monkeypatch.setattr(validate._Checker, "_variable_bytes_py", variable_bytes_py)
    doc = generate("mlp", layers=300, width=16, batch=4)
    g = loads_graph(dumps(doc, "json"), "m.json")
    assert len(g.variables) == 601
    assert seen["variables"] == [0, 1, 600] and seen["bytes"] == []
    monkeypatch.undo()
    data = dumps(doc, "json")
    fast, slow = both(lambda: loads_graph(data, "m.json", max_bytes=300 * 16 * 16 * 4), monkeypatch)
    assert fast == slow
    assert fast[0] == "error" and "variable gradients" in fast[1], fast


def test_the_loaded_nodes_share_one_int_object_per_number(monkeypatch):
    """A node's index, seq and topo_nr: one int object per value among the compiled loops' nodes (three a node
    made each its own: 96 bytes a node at a million nodes, above the cached small ints), equal to the Python
    loop's numbers."""
    for doc in (generate("chain", n=20000), generate("random", nodes=6000, leaves=40, seed=5)):
        text = dumps(doc, "json")
        g = loads_graph(text, "g.json")
        objects = {id(v) for n in g.nodes for v in (n.seq, n.index, n.topo_nr)}
        assert len(objects) < 1.1 * len(g.nodes)
        monkeypatch.setattr(validate, "_FAST", None)
        py = loads_graph(text, "g.json")
        monkeypatch.undo()
        assert [(n.seq, n.index, n.topo_nr) for n in g.nodes] == [(n.seq, n.index, n.topo_nr) for n in py.nodes]


def test_a_copy_whose_consumer_takes_another_shape_is_refused_alike(monkeypatch):
    """ToCopyBackward0 sends its gradient in its own shape (another dtype or device): an edge retargeted to a slot
    of another shape is no PyTorch graph (its engine would refuse the gradient as it runs): the same error both
    ways, at the edge (found by the fuzzer, seed 90712)."""
    doc = generate("mlp", layers=2, width=3, batch=2)
    relu = next(n for n in doc["nodes"] if n["name"] == "ReluBackward0")
    copy = {"id": "copy", "name": "ToCopyBackward0", "next": relu["next"], "inputs": [dict(relu["inputs"][0])]}
    relu["next"] = [["copy", 0]]
    doc["nodes"].append(copy)
    assert both(lambda: loads_graph(dumps(doc, "json"), "c.json"), monkeypatch)[0][0] == "ok"
    copy["next"] = [["acc_w1", 0]]  # a (3, 3) weight's slot for a (2, 3) gradient
    fast, slow = both(lambda: loads_graph(dumps(doc, "json"), "c.json"), monkeypatch)
    assert fast == slow and fast[0] == "error"
    assert "ToCopyBackward0 produces a gradient of shape [2, 3] for 'acc_w1' input 0, whose shape [3, 3] is not " \
           "compatible" in fast[1]


@pytest.mark.parametrize("t_input, var_shape, ok", [
    ([2, 3], [3, 2], True),    # a matrix's gradient leaves transposed
    ([2, 3], [2, 3], False),   # ... so the slot of its own shape cannot take it
    ([3], [3], True),          # t() of a vector is the vector
    ([], [4, 3], False),       # a 0-d gradient cannot be summed to a matrix (PyTorch: "got [] but expected ...")
    ([4, 3], [2], False),      # nor a matrix to a vector it does not broadcast to
    ([3, 1], [3], True),       # a (1, 3) gradient sums to a (3,) slot (PyTorch's sum_to: (3,) expands to (1, 3))
    ([1, 3], [3], False),      # a (3, 1) one does not ((3,) does not expand to (3, 1))
])
def test_a_transpose_sends_its_gradient_with_its_dims_reversed(monkeypatch, t_input, var_shape, ok):
    """TBackward0's gradient is the incoming one transposed (dims reversed, as t() does for 0-2 dims): a consumer
    whose input takes neither that shape nor sums to it is refused at the edge, both ways alike (the fuzzer, seed
    42425170: an edge retargeted from a t() to a bias's AccumulateGrad, which PyTorch's engine refuses as it runs)."""
    doc = {"format": "autograd-graph/1", "roots": [{"node": "t", "input_nr": 0, "grad": "ones"}],
           "variables": [{"name": "w", "shape": var_shape}],
           "nodes": [{"id": "t", "name": "TBackward0", "next": [["acc", 0]], "inputs": [{"shape": t_input}]},
                     {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "w",
                      "inputs": [{"shape": var_shape}]}]}
    fast, slow = both(lambda: loads_graph(dumps(doc, "json"), "t.json"), monkeypatch)
    assert fast == slow
    assert fast[0] == ("ok" if ok else "error"), fast
    if not ok:
        assert f"TBackward0 produces a gradient of shape {list(reversed(t_input))} for 'acc' input 0" in fast[1]


U64_MINUS_ONE = (1 << 64) - 1  # PyTorch's uint64 of dim -1, as capture may write it


@pytest.mark.parametrize("grad, saved, shapes, bad", [
    ([4, 8], {"dim": 1}, [[4, 4], [4, 4]], None),
    ([4, 8], {}, [[4, 4], [4, 4]], ("a", [4, 8])),          # dim 0 by default: each part keeps 8 columns
    ([4, 8], {"dim": U64_MINUS_ONE}, [[4, 3], [4, 5]], None),
    ([4, 8], {"dim": -1, "sizes": [3, 5]}, [[4, 3], [4, 5]], None),
    ([4, 8], {"dim": 1, "sizes": [5, 3]}, [[4, 3], [4, 5]], ("a", [4, 5])),  # the saved sizes decide the parts
    ([2, 3], {"dim": 0}, [[2, 3], [0]], None),               # a 1-d empty input: cat skips it
    ([4, 3], {"dim": 0, "sizes": [0, 4]}, [[0], [4, 3]], None),  # ... with the sizes saved too
    ([6], {}, [[2], [4]], None),
    ([2, 3], {"dim": 0}, [[1, 3], [1, 4]], ("b", [1, 3])),
])
def test_a_cat_sends_each_input_its_part_of_the_gradient(monkeypatch, grad, saved, shapes, bad):
    """CatBackward0 gives input k the incoming gradient's part along ``dim`` (saved ``sizes[k]`` long, else as long
    as the input is there): a consumer whose other dims differ cannot take it, which PyTorch's engine refuses as it
    runs. The fuzzer (seed 186606982) found a cat without its saved ``dim`` (0 by default) feeding (4, 4) slots from
    a (4, 8) gradient: validate said yes, run said no. Now refused at the edge, both ways alike; the files it takes
    run, each leaf getting a gradient of its own shape."""
    import numpy as np
    from autograd_run.session import RunOptions, run_session
    doc = {"format": "autograd-graph/1", "roots": [{"node": "cat", "input_nr": 0, "grad": "ones"}],
           "variables": [{"name": n, "shape": s} for n, s in zip("ab", shapes)],
           "nodes": [{"id": "cat", "name": "CatBackward0", "next": [["acc_a", 0], ["acc_b", 0]],
                      "inputs": [{"shape": grad}], **({"saved": saved} if saved else {})},
                     *({"id": f"acc_{n}", "name": "torch::autograd::AccumulateGrad", "variable": n,
                        "inputs": [{"shape": s}]} for n, s in zip("ab", shapes))]}
    fast, slow = both(lambda: loads_graph(dumps(doc, "json"), "cat.json"), monkeypatch)
    assert fast == slow
    if bad is None:
        assert fast[0] == "ok", fast
        rep = run_session(loads_graph(dumps(doc, "json"), "cat.json"), RunOptions())
        assert rep.error is None
        assert [np.shape(rep.result.grads[n]) for n in "ab"] == [tuple(s) for s in shapes]
    else:
        assert fast[0] == "error", fast
        assert f"CatBackward0 produces a gradient of shape {bad[1]} for 'acc_{bad[0]}' input 0" in fast[1]


def _far_edges_doc(seed: int) -> dict:
    """A long chain (every target nearby: link_edges leaves its batches unresolved), then a random DAG of identity
    nodes whose edges reach far back and forth in the file (each batch's targets looked up ahead, from the id
    table), with null edges, a node of twelve edges (more than a batch resolves ahead) and nodes that share
    targets."""
    rng = random.Random(seed)
    nodes = [{"id": f"c{k}", "name": "ChainBackward", "op": "identity", "next": [[f"c{k + 1}", 0]],
              "inputs": [{"shape": [2]}]} for k in range(300)]
    nodes[-1]["next"] = [["r0", 0]]
    count = 400
    for k in range(count):
        later = list(range(k + 1, count))
        picks = rng.sample(later, min(len(later), rng.choice([0, 1, 2, 2, 3])))
        nxt = [[f"r{p}", 0] for p in picks]
        if nxt and rng.random() < 0.2:
            nxt.insert(rng.randrange(len(nxt) + 1), None)
        if k == 200:
            nxt = [[f"r{p}", 0] for p in rng.sample(later, 12)]
        nodes.append({"id": f"r{k}", "name": "IdentityBackward", "op": "identity", "next": nxt,
                      "inputs": [{"shape": [2]}]})
    head, tail = nodes[:300], nodes[300:]
    rng.shuffle(tail)  # file order: any; the producers anywhere after or before their consumers
    tail.sort(key=lambda n: n["id"] != "r0")
    return {"format": "autograd-graph/1", "roots": [{"node": "c0"}], "nodes": head + tail}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_edges_looked_up_ahead_in_batches_load_alike(seed, monkeypatch):
    """link_edges resolves a batch's far targets before it makes their edges (``resolve_batch``), and leaves
    batches whose targets were all nearby to the loop alone: the same graph as the Python twin's, edge by edge,
    over both, a null edge and more edges than it resolves ahead; and the same error for an edge to an id no
    node has, in the middle of a batch."""
    import json
    doc = _far_edges_doc(seed)
    data = json.dumps(doc).encode()
    fast, slow = both(lambda: loads_graph(data, "far.json"), monkeypatch)
    assert fast[0] == "ok", fast
    assert fast == slow
    g = loads_graph(data, "far.json")
    assert any(e is None for n in g.nodes for e in n.next) and max(len(n.next) for n in g.nodes) == 12
    far = [n for n in g.nodes[300:] if any(e is not None and abs(e.node.index - n.index) > 32 for e in n.next)]
    assert len(far) > 100
    bad = next(n for n in doc["nodes"][305:] if n["next"] and n["next"][-1] is not None)
    bad["next"][-1] = ["nowhere", 0]
    data = json.dumps(doc).encode()
    fast, slow = both(lambda: loads_graph(data, "far.json"), monkeypatch)
    assert fast == slow
    assert fast[0] == "error" and "nowhere" in fast[1], fast
