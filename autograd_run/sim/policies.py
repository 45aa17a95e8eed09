"""Scheduling policies a simulation can try (``--policy``), as PyTorch's proposals frame them.

Each policy is a priority (how a ready queue ranks tasks: the engine's
``priority.key(depth, node)`` interface) and a threading choice:

``pytorch``         PyTorch's engine: (reentrant depth, sequence number), one worker per device.
``fifo``            tasks in the order they became ready, one worker per device.
``critical-path``   the task with the longest remaining path (by cost) first, one worker per device.
``single-thread``   PyTorch's order with every node on the calling thread
                    (multithreaded backward off, as proposed for the default).
``caller-thread``   the calling thread runs everything when the graph uses at most one
                    device, else PyTorch's threads (the proposal to skip the hand-off).
``predicted-order`` each worker runs its nodes in the order
                    ``get_current_graph_task_execution_order`` predicts (a static order
                    computed before the pass), one worker per device.
"""

from __future__ import annotations

from autograd_run.engine.priority import FifoPriority, PyTorchPriority
from autograd_run.engine.reference import reference_backward
from autograd_run.errors import RequestError

POLICIES = ("pytorch", "fifo", "critical-path", "single-thread", "caller-thread", "predicted-order")


class RankPriority:
    """Rank tasks by a precomputed integer per node (larger first), deeper reentrant calls first."""

    def __init__(self, name: str, rank: dict):
        self.name = name
        self.rank = rank

    def key(self, depth: int, node) -> int:
        return (depth << 64) | self.rank.get(node, node.seq & ((1 << 63) - 1))


def critical_path_ranks(graph, cost_of) -> dict:
    """Per node, the longest path (ns of CPU + stream time) from it to a leaf, itself included."""
    longest: dict = {}
    for node in sorted(graph.nodes, key=lambda n: n.topo_nr):
        c = cost_of(node)
        below = max((longest[e.node] for e in node.next if e is not None and e.node in longest), default=0)
        longest[node] = c.cpu_ns + c.gpu_ns + below
    return longest


def predicted_ranks(graph) -> dict:
    """Position in the single-thread order (the predicted execution order), earliest highest."""
    from autograd_run.engine import GraphState
    from autograd_run.engine.run import root_gradients
    state = GraphState(graph)
    order, _ = reference_backward(state, [r.edge for r in graph.roots], root_gradients(graph),
                                  inputs=graph.input_edges() or None, accumulate_grad=graph.mode != "grad",
                                  retain_graph=True, execute=False)
    n = len(order)
    return {node: n - i for i, node in enumerate(order)}


def make_policy(name: str, graph, cost_of) -> tuple[object, bool]:
    """(priority, multithreading) of a policy."""
    if name == "pytorch":
        return PyTorchPriority(), True
    if name == "fifo":
        return FifoPriority(), True
    if name == "critical-path":
        return RankPriority(name, critical_path_ranks(graph, cost_of)), True
    if name == "single-thread":
        return PyTorchPriority(), False
    if name == "caller-thread":
        return PyTorchPriority(), len({str(d) for d in graph.devices if not d.is_cpu}) > 1
    if name == "predicted-order":
        return RankPriority(name, predicted_ranks(graph)), True
    raise RequestError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}", "policy")
