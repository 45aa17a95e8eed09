"""``_core.NodeMap`` (engine/csrc/node_map.c): a mapping from a graph's nodes to values kept in slots by node
index, which the simulator uses for its top-level call's dependency counts and its costs by node where a dict
would be (its Python twin is that dict). The truth here is a dict: the same operations, drawn at random from a printed seed, on
keys of every kind it must take (nodes in range, nodes of another graph with the same indices, nodes past
its size, objects that are not nodes), give the same answers and the same contents."""

from __future__ import annotations

import gc
import random
import sys

import pytest

from autograd_run.engine import core

pytestmark = pytest.mark.skipif(core.NodeMap is None, reason="the compiled core is not built")


def _graph(n: int, seed: int):
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    return loads_graph(dumps(generate("random", nodes=n, leaves=8, width=2, seed=seed), "json"), "g.json")


def test_it_answers_as_a_dict_does():
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    a, b = _graph(60, 1), _graph(60, 2)  # b's nodes have the same indices as a's
    size = len(a.nodes) - 10  # a's last ten nodes have indices past the map's slots
    keys = a.nodes + b.nodes[:30] + ["a string", 7, (1, 2)]
    for _ in range(20):
        m, d = core.NodeMap(size), {}
        for _ in range(400):
            k = rng.choice(keys)
            op = rng.randrange(9)
            if op <= 2:
                v = rng.randrange(5)
                m[k] = v
                d[k] = v
            elif op == 3:
                assert m.get(k) == d.get(k) and m.get(k, "none") == d.get(k, "none")
            elif op == 4:
                if k in d:
                    del m[k]
                    del d[k]
                else:
                    with pytest.raises(KeyError):
                        del m[k]
            elif op == 5:
                assert (k in m) == (k in d)
                if k in d:
                    assert m[k] == d[k]
                else:
                    with pytest.raises(KeyError):
                        m[k]
            elif op == 6:
                assert m.pop(k, None) == d.pop(k, None)
            elif op == 7:
                v = rng.randrange(5)
                assert m.setdefault(k, v) == d.setdefault(k, v)
            else:
                assert len(m) == len(d) and bool(m) == bool(d)
        assert len(m) == len(d)
        assert sorted(map(id, m)) == sorted(map(id, d)) == sorted(map(id, m.keys()))
        assert sorted((id(k), v) for k, v in m.items()) == sorted((id(k), v) for k, v in d.items())
        assert sorted(m.values()) == sorted(d.values())
        assert dict(m) == d
        c = m.copy()
        assert type(c) is core.NodeMap and dict(c) == d
        c[keys[0]] = "changed"
        assert dict(m) == d
        m.clear()
        assert dict(c) == {**d, keys[0]: "changed"}
        assert len(m) == 0 and not m and m.get(keys[0]) is None


def test_a_key_held_aside_moves_into_its_slot_once_free():
    """A node whose slot another node holds goes to the rest; once that slot is free, setting it again puts it
    in its slot and takes it out of the rest (a key is never in both)."""
    a, b = _graph(10, 1), _graph(10, 2)
    x, y = a.nodes[3], b.nodes[3]
    assert x.index == y.index == 3
    m = core.NodeMap(len(a.nodes))
    m[x] = 1
    m[y] = 2  # slot 3 is x's: y goes aside
    del m[x]
    m[y] = 5  # slot 3 is free now
    assert len(m) == 1 and m[y] == 5 and x not in m
    del m[y]
    assert len(m) == 0 and y not in m


def test_it_holds_its_keys_and_values_and_lets_go_of_them():
    g = _graph(30, 3)
    node, value = g.nodes[5], object()
    before = sys.getrefcount(node), sys.getrefcount(value)
    m = core.NodeMap(len(g.nodes))
    m[node] = value
    assert (sys.getrefcount(node), sys.getrefcount(value)) == (before[0] + 1, before[1] + 1)
    m[node] = 1
    assert sys.getrefcount(value) == before[1]
    del m[node]
    assert sys.getrefcount(node) == before[0]
    m[node] = value
    del m
    gc.collect()
    assert (sys.getrefcount(node), sys.getrefcount(value)) == before


def test_a_cycle_through_it_is_collected():
    g = _graph(10, 4)
    m = core.NodeMap(len(g.nodes))
    m[g.nodes[0]] = m  # the map holds itself
    m[g.nodes[1]] = [m]
    import weakref
    try:
        ref = weakref.ref(m)
    except TypeError:
        ref = None
    del m
    gc.collect()
    if ref is not None:
        assert ref() is None


def test_its_slots_are_freed_when_it_empties_by_clear():
    """The simulator clears a finished task's counts (``_let_go_of_counts``): the slots' memory goes with them."""
    g = _graph(2000, 5)
    m = core.NodeMap(len(g.nodes))
    small = sys.getsizeof(m)
    m[g.nodes[0]] = 1
    assert sys.getsizeof(m) >= small + 16 * len(g.nodes)
    m.clear()
    assert sys.getsizeof(m) == small < 1000


def test_the_top_level_simulated_call_counts_in_one_and_agrees_with_a_dict(monkeypatch):
    """The simulator's top-level task counts its dependencies and keeps its waiting buffers, and its cost resolver
    keeps its costs by node, in NodeMaps; with dicts instead (their twin) the simulation is the same, slice by slice, and so are its cost
    sources and its slack what-ifs (each a copy of the costs with one changed)."""
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.graphs.load import load_graph
    for graph in (_graph(400, 6), load_graph("example:reentrant"), load_graph("example:mlp")):
        for devices in (None, 2):
            o = SimOptions(spec="h100", slack_top=0, devices=devices, placement="layer" if devices else "keep")
            report = simulate_session(graph, o)
            with_map = report.sim
            assert type(with_map.graph_tasks[0].dependencies) is type(with_map.graph_tasks[0].not_ready) is core.NodeMap
            assert type(with_map.costs.resolved) is core.NodeMap and len(with_map.costs.resolved) > 0
            with monkeypatch.context() as mp:
                mp.setattr(core, "NodeMap", None)
                twin = simulate_session(graph, o)
                with_dict = twin.sim
            assert type(with_dict.graph_tasks[0].dependencies) is type(with_dict.graph_tasks[0].not_ready) is dict
            assert type(with_dict.costs.resolved) is dict
            assert report.cost_sources == twin.cost_sources and list(report.cost_sources) == \
                list(twin.cost_sources) and report.slack == twin.slack
            # (a slice's first field numbers its call among every simulated one in the process; a placed graph's
            # nodes are made anew by each simulation: compared by id)
            def rows(sim):
                return [tuple(getattr(f, "id", f) for f in s[1:]) for s in sim.slices]
            assert rows(with_map) == rows(with_dict) and len(rows(with_map)) >= 5, graph.source
            assert with_map.now == with_dict.now


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        core.NodeMap(-1)
    with pytest.raises(TypeError):
        core.NodeMap("3")
