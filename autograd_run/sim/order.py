"""The simulated executed order as order-file rows (``traces.order``): a golden order for ``run --expect-order``."""

from __future__ import annotations

from autograd_run.ops import is_graph_root


def order_rows(sim) -> list[dict]:
    rows = []
    for gt, depth, node, w in sim.starts():
        if is_graph_root(node):
            continue
        rows.append({"position": len(rows), "id": node.id, "name": node.name, "seq": node.seq,
                     "device": str(node.device), "thread": w.name, "depth": depth, "graph_task": gt, "pass": 0})
    return rows
