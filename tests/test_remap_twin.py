"""``graphs.remap.remap_nodes``: the compiled loop (``_build.c``) against its Python twin, field by field, and
against hand-checked facts (the AccumulateGrad rule, copy ids that avoid the file's, the topological order).

``tests/test_placement.py`` checks the placed graph against the loader (writing it out and loading it again),
on whichever loop is in use; this file runs both loops on the same input and compares everything they
return, identities included (what is shared with the input graph, what is new).
"""

from __future__ import annotations

import random

import pytest

from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import example_names, load_graph, loads_graph
from autograd_run.graphs.model import Device, InputMeta
from autograd_run.graphs.remap import remap_nodes_py
from autograd_run.graphs.validate import _FAST
from autograd_run.ops import ACCUMULATE_GRAD, lookup

compiled = pytest.mark.skipif(_FAST is None, reason="the compiled loops are not in use")


def _graphs():
    out = [load_graph(f"example:{name}") for name in example_names()]
    for kind, kw in [("chain", {"n": 40}), ("fanout", {"width": 5}), ("mlp", {"layers": 3}),
                     ("transformer", {"layers": 2, "devices": 2}), ("random", {"nodes": 80, "leaves": 9, "seed": 5})]:
        out.append(loads_graph(dumps(generate(kind, **kw), "json"), f"{kind}.json"))
    return out


GRAPHS = _graphs()


def _run(fn, graph, codes, k):
    devices = [Device("cuda", i) for i in range(k)]
    made = []

    def make(m, d):
        made.append(("in", m.shape, d))
        return InputMeta(m.shape, m.dtype, devices[d], m.stream)

    def make_copy(m, d):
        made.append(("copy", m.shape, d))
        return InputMeta(m.shape, m.dtype, devices[d])

    codes = list(codes)
    nodes, fresh, by_id, order, max_index = fn(graph.nodes, codes, devices, [{} for _ in devices],
                                               [{} for _ in devices], make, make_copy, lookup("ToCopyBackward0"),
                                               graph.by_id)
    return codes, nodes, fresh, by_id, order, max_index, made


def _view(graph, result):
    """Everything the loop returns, as values (and which objects are the input graph's own)."""
    codes, nodes, fresh, by_id, order, max_index, made = result
    pos = {id(n): i for i, n in enumerate(nodes)}
    olds = {id(n): n for n in graph.nodes}

    def node(n):
        assert id(n) not in olds  # every node is new
        return (n.id, n.name, n.op.name, n.seq, n.index, n.topo_nr, str(n.device), n.stream, n.cpu, n.variable,
                n.fwd_thread, n.saves_tensors, n.saved_strings, type(n.saved).__name__, dict(n.saved),
                dict(n.attrs), [None if e is None else (pos[id(e[0])], e[1], type(e).__name__) for e in n.next],
                [(m.shape, m.dtype, str(m.device), m.stream) for m in n.inputs],
                [(pos[id(c)], nr) for c, nr in n.consumers])

    shared = [(fresh[i].saved is o.saved, fresh[i].attrs is o.attrs, fresh[i].id is o.id, fresh[i].op is o.op)
              for i, o in enumerate(graph.nodes)]
    return (codes, [node(n) for n in nodes], [pos[id(n)] for n in fresh], {k: pos[id(v)] for k, v in by_id.items()},
            list(by_id), [pos[id(n)] for n in order], max_index, made, shared)


def _codes(graph, k, rng):
    return [-1 if n.op is ACCUMULATE_GRAD and rng.random() < 0.8 else rng.randrange(k) for n in graph.nodes]


@compiled
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.source for g in GRAPHS])
def test_the_compiled_variables_are_their_twins(graph):
    """``remap_variables``: each variable made again with every field of the old one but its node (the remapped
    one) and its device (that node's; the old device where it has none), compiled and twin alike, field by
    field and object by object (what is shared with the input graph)."""
    from dataclasses import fields
    from autograd_run.graphs.model import Variable
    from autograd_run.graphs.remap import remap_variables_py
    from autograd_run.graphs.validate import _FAST_VARS
    assert _FAST_VARS
    rng = random.Random(12)
    names = [f.name for f in fields(Variable)]
    for k in (1, 3):
        fresh = _run(remap_nodes_py, graph, _codes(graph, k, rng), k)[2]
        twin, made = remap_variables_py(graph.variables, fresh), _FAST.remap_variables(graph.variables, fresh)
        assert list(twin) == list(made) == list(graph.variables)
        for name, old in graph.variables.items():
            a, b = twin[name], made[name]
            assert type(b) is Variable and a is not old and b is not old
            assert [getattr(a, f) for f in names] == [getattr(b, f) for f in names]
            assert all(getattr(b, f) is getattr(a, f) for f in names), name  # the same objects as the twin's
            if old.node is not None:
                assert b.node is fresh[old.node.index] and b.device is fresh[old.node.index].device
            else:
                assert b.node is None and b.device is old.device


@compiled
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.source for g in GRAPHS])
def test_compiled_loop_is_its_twin(graph):
    rng = random.Random(11)
    for k in (1, 2, 3, 4):
        codes = _codes(graph, k, rng)
        a = _view(graph, _run(remap_nodes_py, graph, codes, k))
        b = _view(graph, _run(_FAST.remap_nodes, graph, codes, k))
        assert a == b


@pytest.mark.parametrize("fn", [remap_nodes_py, pytest.param("compiled", marks=compiled)], ids=["python", "compiled"])
def test_accumulate_follows_its_first_producer_and_copies_take_unused_ids(fn):
    fn = _FAST.remap_nodes if fn == "compiled" else fn
    doc = generate("chain", n=2)  # mul_1 -> mul_0 -> acc_x
    a, b, _ = doc["nodes"]
    a["id"], b["id"] = "a", "copy0_a"  # a node already called what the first copy would be called
    doc["roots"][0]["node"] = "a"
    a["next"][0][0] = "copy0_a"
    g = loads_graph(dumps(doc, "json"), "c.json")
    codes = [0, 1, -1]  # the edge a -> copy0_a crosses; acc_x follows copy0_a
    out_codes, nodes, fresh, by_id, order, max_index, _ = _run(fn, g, codes, 2)
    acc = [i for i, n in enumerate(g.nodes) if n.op is ACCUMULATE_GRAD]
    producer = {e[0].index: i for i, n in enumerate(g.nodes) for e in n.next if e is not None}
    for i in acc:
        assert out_codes[i] == out_codes[producer[i]]
    ids = [n.id for n in nodes]
    assert ids == ["copy0_a_", "a", "copy0_a", "acc_x"]  # the file's node keeps its id; the copy takes another
    assert out_codes == [0, 1, 1] and [str(n.device) for n in nodes] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert len(set(ids)) == len(ids) and set(by_id) == set(ids)
    # each node after the nodes its edges point to
    seen = set()
    for n in order:
        assert all(e is None or id(e[0]) in seen for e in n.next)
        seen.add(id(n))
    assert max_index == 1


@compiled
def test_compiled_loop_refuses_what_it_cannot_place():
    g = GRAPHS[-1]
    devices = [Device("cuda", 0)]
    args = lambda codes: (g.nodes, codes, devices, [{}], [{}], lambda m, d: m, lambda m, d: m,
                          lookup("ToCopyBackward0"), g.by_id)
    with pytest.raises(ValueError, match="code"):
        _FAST.remap_nodes(*args([1] * len(g.nodes)))  # no device 1
    with pytest.raises(ValueError, match="code"):
        _FAST.remap_nodes(*args([-2] * len(g.nodes)))
    with pytest.raises(ValueError, match="one code per node"):
        _FAST.remap_nodes(*args([0]))
    with pytest.raises(ValueError, match="index in the list"):
        _FAST.remap_nodes(list(reversed(g.nodes)), [0] * len(g.nodes), devices, [{}], [{}], lambda m, d: m,
                          lambda m, d: m, lookup("ToCopyBackward0"), g.by_id)
