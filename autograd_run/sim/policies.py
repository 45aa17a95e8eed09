"""Scheduling policies (``--policy``, ``sweep``'s ``policy`` axis), as PyTorch's proposals frame them: one table.

Each row of ``TABLE`` is a ``Policy``: its name, its priority (how a ready
queue ranks tasks: the engine's ``priority.key(depth, node)`` interface),
its threading choice (multithreaded backward on or off for a graph), and
whether a real run can take it (``in_run``: a real engine run changes only
its threading, so only the policies with PyTorch's priority). The
simulator, the sweep and the CLI all read this table; a new policy is one
row here (and its test).

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
``memory``          the ready task whose node frees the most bytes first (its saved tensors and
                    input gradients, less the new memory of its outputs: ``analysis.memory``'s
                    ``static_frees``), one worker per device; the engine's dependencies as PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autograd_run.engine.priority import FifoPriority, PyTorchPriority
from autograd_run.engine.reference import reference_backward
from autograd_run.errors import RequestError

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


def memory_ranks(graph) -> dict:
    """The bytes each node's run frees (``analysis.memory.static_frees``), shifted to ranks >= 1."""
    from autograd_run.analysis.memory import static_frees
    frees = static_frees(graph)
    low = min(frees.values(), default=0)
    return {node: f - low + 1 for node, f in frees.items()}


def _accelerators(graph) -> int:
    return len({str(d) for d in graph.devices if not d.is_cpu})


@dataclass(frozen=True)
class Policy:
    name: str
    #: (graph, cost_of) -> the ready queues' priority.
    priority: Callable
    #: graph -> multithreaded backward on (one worker per device) or off (every node on the caller).
    threading: Callable
    #: A real run (``run``, ``sweep`` in run mode) can take it: it changes the threading only.
    in_run: bool


def _on(graph) -> bool:
    return True


TABLE = (
    Policy("pytorch", lambda g, c: PyTorchPriority(), _on, True),
    Policy("fifo", lambda g, c: FifoPriority(), _on, False),
    Policy("critical-path", lambda g, c: RankPriority("critical-path", critical_path_ranks(g, c)), _on, False),
    Policy("single-thread", lambda g, c: PyTorchPriority(), lambda g: False, True),
    Policy("caller-thread", lambda g, c: PyTorchPriority(), lambda g: _accelerators(g) > 1, True),
    Policy("predicted-order", lambda g, c: RankPriority("predicted-order", predicted_ranks(g)), _on, False),
    Policy("memory", lambda g, c: RankPriority("memory", memory_ranks(g)), _on, False),
)
POLICIES = tuple(p.name for p in TABLE)
RUN_POLICIES = tuple(p.name for p in TABLE if p.in_run)
_BY_NAME = {p.name: p for p in TABLE}


def policy(name: str) -> Policy:
    """The table's row for ``name``; a ``RequestError`` naming the choices for another name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise RequestError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}", "policy") from None


def make_policy(name: str, graph, cost_of) -> tuple[object, bool]:
    """(priority, multithreading) of a policy for ``graph``."""
    p = policy(name)
    return p.priority(graph, cost_of), p.threading(graph)
