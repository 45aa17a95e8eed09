"""Orders the simulator predicts.

``order_rows(sim)``          the simulated executed order as order-file rows (``traces.order``): a golden order
                             for ``run --expect-order``;
``predicted_order(graph)``   the graph's nodes per worker in the order PyTorch's engine runs them, what
                             ``costs.profile_match`` needs to match AccumulateGrad runs (they carry no sequence
                             number).
"""

from __future__ import annotations

from autograd_run.graphs.model import Graph
from autograd_run.ops import is_graph_root


def order_rows(sim) -> list[dict]:
    rows = []
    for gt, depth, node, w in sim.starts():
        if is_graph_root(node):
            continue
        rows.append({"position": len(rows), "id": node.id, "name": node.name, "seq": node.seq,
                     "device": str(node.device), "thread": w.name, "depth": depth, "graph_task": gt, "pass": 0})
    return rows


def predicted_order(graph: Graph) -> list[list]:
    """The graph's nodes per worker thread, in the order PyTorch's engine runs them (simulated).

    On one worker the order does not depend on costs (every node costs the
    same here); across workers it is an estimate.
    """
    from autograd_run.sim.costs import NodeCost
    from autograd_run.sim.scheduler import Simulator
    from autograd_run.sim.specs import load_spec
    same = NodeCost(1000)
    sim = Simulator(graph, load_spec("cpu"), lambda node: same, detail=False)
    sim.run([r.edge for r in graph.roots], graph.input_edges() or None, graph.mode != "grad")
    per: dict[int, list] = {}
    for _, _, node, worker in sim.starts():
        if node.id in graph.by_id and graph.by_id[node.id] is node:
            per.setdefault(worker.tid, []).append(node)
    return list(per.values())
