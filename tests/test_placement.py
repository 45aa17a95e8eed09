"""Placement builds the remapped graph on the loaded one; the truth is the loader: writing the placed graph
out and loading it again (every check of a graph file) must give the same graph, field by field.

The examples and generated graphs of every kind, every placement, 1-4 devices; a variable with its own
tensor hooks, a checkpoint, a graph with a side file.
"""

from __future__ import annotations

import numpy as np
import pytest

from autograd_run.graphs.dump import dumps, graph_to_dict
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import example_names, load_graph, loads_graph
from autograd_run.sim.costs import CostResolver
from autograd_run.graphs.model import ensure_consumers
from autograd_run.sim.placement import PLACEMENTS, place
from autograd_run.sim.specs import load_spec


def _derived(g):
    ensure_consumers(g)  # (a loaded graph makes them when first needed; a placed one has them)
    nodes = [(n.id, n.index, n.topo_nr, str(n.device), n.stream, n.cpu, n.saves_tensors, n.saved_strings, n.seq,
              [(c.id, nr) for c, nr in n.consumers], [None if e is None else (e.node.id, e.input_nr) for e in n.next],
              [(m.shape, m.dtype, str(m.device), m.stream) for m in n.inputs], n.op.name)
             for n in g.nodes]
    variables = [(v.name, str(v.device), v.node.id if v.node is not None else None, v.requires_grad, v.hooks)
                 for v in g.variables.values()]
    roots = [(r.edge.node.id, r.edge.input_nr, repr(r.grad)) for r in g.roots]
    return (nodes, variables, roots, g.max_device_index, sorted(n.id for n in g.hooked_nodes), g.inputs, g.mode,
            g.parameters, sorted(g.by_id) == sorted(n.id for n in g.nodes))


def _graphs():
    out = [(name, load_graph(f"example:{name}")) for name in example_names()]
    for kind, kw in [("chain", {"n": 30}), ("fanout", {"width": 6}), ("mlp", {"layers": 3}),
                     ("transformer", {"layers": 2, "devices": 2}), ("random", {"nodes": 60, "leaves": 9, "seed": 3})]:
        out.append((kind, loads_graph(dumps(generate(kind, **kw), "json"), f"{kind}.json")))
    return out


GRAPHS = _graphs()


@pytest.mark.parametrize("how", [p for p in PLACEMENTS if p != "keep"])
@pytest.mark.parametrize("name,graph", GRAPHS, ids=[n for n, _ in GRAPHS])
def test_placed_graph_is_what_loading_it_gives(name, graph, how):
    cost_of = CostResolver(load_spec("h100"), None, {})
    for k in (1, 2, 4):
        placed = place(graph, k, how, cost_of)
        assert placed is not graph
        doc = graph_to_dict(placed)
        again = loads_graph(dumps(doc, "json"), placed.source, "json", graph.base_dir,
                            graph.side_files.default_name if graph.side_files is not None else None)
        assert graph_to_dict(again) == doc
        assert _derived(placed) == _derived(again)
        assert placed.slot_dtypes is None or placed.slot_dtypes >= again.slot_dtypes
        # A parameter lives where its gradient is accumulated.
        for v in placed.variables.values():
            if v.node is not None:
                assert v.device == v.node.device, v.name
        # Every non-CPU node is on one of the k devices; each crossing edge goes through a copy on the producer's.
        for n in placed.nodes:
            assert n.device.type == "cuda" and n.device.index < k
            for e in n.next:
                if e is not None and e.node.device != n.device:
                    assert n.op.name == "ToCopyBackward0", f"{n.id} -> {e.node.id} crosses devices without a copy"
    # The input graph is never changed.
    assert _derived(graph) == _derived(loads_graph(dumps(graph_to_dict(graph), "json"), graph.source, "json",
                                                  graph.base_dir, graph.side_files.default_name
                                                  if graph.side_files is not None else None))


def test_copies_sit_before_their_producer_with_its_sequence_number():
    g = loads_graph(dumps(generate("chain", n=8), "json"), "c.json")
    placed = place(g, 2, "round-robin", CostResolver(load_spec("h100"), None, {}))
    ids = [n.id for n in placed.nodes]
    copies = [n for n in placed.nodes if n.id.startswith("copy")]
    assert copies, "a round-robin chain crosses devices at every edge"
    for c in copies:
        producer = c.consumers[0][0]
        assert ids.index(c.id) == ids.index(producer.id) - 1
        assert c.seq == producer.seq and c.device == producer.device
        assert c.inputs[0].shape == c.next[0].node.inputs[c.next[0].input_nr].shape


def test_hooks_side_files_and_inputs_survive_placement(tmp_path):
    import numpy as np
    doc = generate("mlp", layers=2, width=4, batch=2)
    doc["variables"][0]["hooks"] = [{"kind": "scale", "by": 0.5}]
    name = doc["variables"][0]["name"]
    np.savez(tmp_path / "g.npz", seed=np.full(tuple(doc["variables"][0]["shape"]), 2.0, dtype=np.float32))
    doc["variables"][0]["grad"] = {"npz": "seed"}
    doc["inputs"] = [name]
    path = tmp_path / "g.json"
    path.write_bytes(dumps(doc, "json"))
    g = load_graph(str(path))
    placed = place(g, 3, "greedy", CostResolver(load_spec("h100"), None, {}))
    v = placed.variables[name]
    assert v.hooks == g.variables[name].hooks and v.grad == {"npz": "seed"}
    assert placed.inputs == [name] and placed.input_edges()[0].node is v.node
    assert placed.side_files is not g.side_files and placed.side_files.base_dir == g.side_files.base_dir
    again = loads_graph(dumps(graph_to_dict(placed), "json"), placed.source, "json", g.base_dir,
                        g.side_files.default_name)
    assert _derived(placed) == _derived(again)


def test_the_layer_cut_in_columns_equals_its_sum_node_by_node():
    """``_layers`` takes numpy where the products fit 64 bits: against the cut computed node by node with
    Python's integers (hand-checkable: device ``min(k - 1, work_before * k // total)``), on random costs from
    a few nanoseconds to past 2**64 (where it must fall back), negative CPU costs (clamped to 1 ns), 1-7
    devices and lists on either side of the size where numpy takes over. The seed is printed."""
    import random
    from autograd_run.sim.placement import _layers

    class Node:
        def __init__(self, index):
            self.index = index
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(300):
        n = rnd.choice([1, 5, 63, 64, 65, 200, 1000])
        size = n + rnd.randrange(5)  # AccumulateGrad nodes are not in the order: they keep -1
        order = [Node(i) for i in rnd.sample(range(size), n)]
        top = rnd.choice([10, 10**6, 10**12, 10**17, 2**62, 2**70])
        cpu = [rnd.randrange(-5, top) for _ in range(n)]
        gpu = [rnd.randrange(0, top) for _ in range(n)]
        k = rnd.choice([1, 2, 3, 4, 7])
        want, before = [-1] * size, 0
        total = sum(max(1, a + b) for a, b in zip(cpu, gpu))
        for node, a, b in zip(order, cpu, gpu):
            want[node.index] = min(k - 1, before * k // total)
            before += max(1, a + b)
        index = [node.index for node in order]
        assert _layers(index, cpu, gpu, k, size) == want, (seed, n, top, k)
        if top < 2**62:  # as the placement gives them: int64 arrays (past 64 bits' products: Python's integers)
            assert _layers(np.array(index), np.array(cpu), np.array(gpu), k, size) == want, (seed, n, top, k)
    # by hand: works 1, 3, 4 (total 8) on two devices: before 0, 1, 4 -> 0 * 2 // 8, 1 * 2 // 8, 4 * 2 // 8
    assert _layers([0, 1, 2], [1, 3, 4], [0, 0, 0], 2, 3) == [0, 0, 1]


@pytest.mark.parametrize("kind, kw", [("random", {"nodes": 400, "leaves": 30, "seed": 5}),
                                      ("mlp", {"layers": 4}), ("transformer", {"layers": 3})])
def test_the_layer_cut_reads_in_file_order_what_it_cuts_in_topological_order(kind, kw):
    """The layer and round-robin placements read the nodes in the file's order (where they lie in memory) and order
    them as numbers: the same codes as walking ``_topological``'s order node by node."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.ops import ACCUMULATE_GRAD
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.placement import _topological, assign
    from autograd_run.sim.specs import load_spec
    g = loads_graph(dumps(generate(kind, **kw), "json"), "g.json")
    costs = CostResolver(load_spec("h100"))
    order = [n for n in _topological(g) if n.op is not ACCUMULATE_GRAD]
    work = [max(1, costs(n).cpu_ns + costs(n).gpu_ns) for n in order]
    for k in (2, 3, 4):
        want, before = [-1] * len(g.nodes), 0
        for node, w in zip(order, work):
            want[node.index] = min(k - 1, before * k // sum(work))
            before += w
        assert assign(g, k, "layer", CostResolver(load_spec("h100"))) == want
        want = [-1] * len(g.nodes)  # round-robin: the i-th node from the roots on device i % k
        for i, node in enumerate(order):
            want[node.index] = i % k
        assert assign(g, k, "round-robin", costs) == want
