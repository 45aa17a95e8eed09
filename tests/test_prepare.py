"""``GraphState.prepare`` (every node's saved values made in bulk before the timed backward) gives, value for
value, what ``saved()`` makes for one node at a time, for every kind of saved value: random specs of every
dtype and distribution (drawn in groups), literal tensors, tensors given as lists, Scalar strings, nodes
that compute in float16, plain numbers and sizes; and the compiled walk (``_core.group_saved``) groups
and sorts the nodes as its Python twin does."""

import numpy as np
import pytest

from autograd_run.engine import core
from autograd_run.engine.state import GraphState, group_saved_py, split_saved_py
from autograd_run.graphs.generators import generate

from builders import doc, graph, leaf, node


def _mixed_doc() -> dict:
    """A chain whose nodes save one kind of value each (and some several)."""
    r = lambda seed, **kw: {"random": seed, "shape": [3], **kw}  # noqa: E731
    nodes = [
        node("m1", "MulBackward0", seq=9, next=["m2", None], inputs=[[3]],
             saved={"self": r(1), "other": r(2, dtype="float64", dist="uniform")}),
        node("m2", "MulBackward0", seq=8, next=["m3", None], inputs=[[3]],
             saved={"self": {"data": [1.0, 2.0, 3.0]}, "other": r(3)}),
        node("m3", "MulBackward0", seq=7, next=["a1", None], inputs=[[3]],
             saved={"self": [4.0, 5.0, 6.0], "other": r(4)}),  # a tensor field given as a list
        node("a1", "AddBackward0", seq=6, next=["m4", None], inputs=[[3]], saved={"alpha": "inf"}),
        node("m4", "MulBackward0", seq=5, next=["h1", None], inputs=[[3]],
             saved={"self": r(5, dist="uniform"), "other": 2.5}),
        node("h1", "MulBackward0", seq=4, next=["r1", None], inputs=[{"shape": [3], "dtype": "float16"}],
             saved={"self": r(6, dtype="float16"), "other": r(7, dtype="float16")}),
        node("r1", "ReluBackward0", seq=3, next=["r2"], inputs=[[3]], saved={"result": r(1)}),  # seed again
        node("r2", "ReluBackward0", seq=2, next=["acc"], inputs=[[3]], saved={"result": r(2**63 - 1)}),
        leaf("x", [3], id="acc"),
    ]
    return doc(*nodes)


GRAPHS = {
    "mixed": lambda: graph(_mixed_doc()),
    "mlp": lambda: graph(generate("mlp", layers=6, width=3, batch=2, seed=5)),
    "random": lambda: graph(generate("random", nodes=150, leaves=20, seed=2)),
}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    return type(a) is type(b) and (a == b or (a != a and b != b))


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("offset", [0, 11])
def test_prepared_values_are_what_saved_makes_one_node_at_a_time(name, offset):
    g = GRAPHS[name]()
    g.side_files.seed_offset = offset
    bulk, one = GraphState(g), GraphState(g)
    bulk.prepare()
    checked = 0
    for n in g.nodes:
        want, got = one.saved(n), bulk.saved(n)
        assert want.keys() == got.keys(), n.id
        for k in want:
            assert _same(got[k], want[k]), (n.id, k, got[k], want[k])
            checked += isinstance(want[k], np.ndarray)
    assert checked > 3


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("offset", [0, 7, 2**70])  # 0: the seeds kept as they are; 2**70: past a C long
def test_the_compiled_walk_matches_its_python_twin(name, offset):
    if core.group_saved is None:
        pytest.skip("the compiled core is not built (or AUTOGRAD_RUN_PURE_PYTHON is set)")
    g = GRAPHS[name]()
    state = GraphState(g)
    _, todo = split_saved_py(g.nodes, set(), {})
    want = group_saved_py(todo, state.half_nodes, offset)
    got = core.group_saved(todo, state.half_nodes, offset)
    assert got[0] == want[0]  # the same groups, the same seeds in the same order
    assert {k: [(m, nm) for m, nm in v] for k, v in got[1].items()} == \
        {k: [(m, nm) for m, nm in v] for k, v in want[1].items()}
    for i in (2, 3):  # done, slow: the same nodes, each with a copy of its mapping
        assert [n for n, _ in got[i]] == [n for n, _ in want[i]]
        assert all(m == n.saved and m is not n.saved for n, m in got[i])


def test_the_mixed_graph_sorts_its_nodes_as_described():
    g = graph(_mixed_doc())
    state = GraphState(g)
    _, todo = split_saved_py(g.nodes, set(), {})
    for walk in filter(None, (group_saved_py, core.group_saved)):
        groups, sinks, done, slow = walk(todo, state.half_nodes, 0)
        # a literal tensor, a tensor field as a list, float16 formulas (h1's input, m4's gradient into it);
        # a1 saves no tensor: its Scalar string is read when it runs
        assert sorted(n.id for n, _ in slow) == ["h1", "m2", "m3", "m4"]
        assert sorted(n.id for n, _ in done) == ["m1", "r1", "r2"]
        assert groups[((3,), "float32", "normal")] == [1, 3, 4, 1, 2**63 - 1]  # in the nodes' order
        assert groups[((3,), "float64", "uniform")] == [2]
        assert groups[((3,), "float16", "normal")] == [6, 7]
        assert sum(map(len, groups.values())) == 9 == sum(map(len, sinks.values()))
