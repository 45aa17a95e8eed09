"""GraphTask: the state of one backward call, and the two passes that set it up.

Fields (guarded by ``lock`` unless noted):
  ``dependencies``  node -> number of edges from not-yet-run nodes still to
                    deliver a gradient; the node is ready at 0.
  ``not_ready``     node -> InputBuffer of a node that has some but not all
                    of its gradients.
  ``exec_info``     node -> ExecInfo, only when outputs were requested
                    (``grad(inputs=)``/``backward(inputs=)``); empty means run
                    everything. Written before the task starts, then read-only.
  ``captured``      gradients captured for ``grad()``, by output index.
  ``outstanding``   tasks pushed for this GraphTask and not yet finished.
  ``error``/``error_node``  the first failure; ``has_error`` is set with it.
  ``completed``     set once, by the thread that finishes the task;
                    ``done`` (an Event) wakes a caller blocked on it.
  ``final_callbacks``  run once at completion (``queue_callback``); guarded
                    by ``callbacks_lock``, released while each one runs.
  ``leaf_streams``  streams that nodes without outputs (and grad() captures)
                    ran on; the caller's current streams wait on them at the end.
  ``expired``       set once the caller returned from a failed call: its
                    tasks left in queues are dropped unseen (and rank first,
                    as an expired GraphTask's tasks do in PyTorch).
Immutable after creation: ``id``, ``keep_graph``, ``create_graph``,
``reentrant_depth``, ``cpu_queue``, ``owner``, ``state``, ``engine``,
``anomaly``, ``multithreading`` and the thread-local ``context``.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from autograd_run.engine.builtin_nodes import EngineContext
from autograd_run.engine import core
from autograd_run.engine.core import Lock


_ids = itertools.count()


@dataclass(slots=True)
class ExecInfo:
    needed: bool = False
    #: (input slot of this node, index in captured) pairs for grad().
    captures: list[tuple[int, int]] = field(default_factory=list)

    def should_execute(self) -> bool:
        return self.needed or bool(self.captures)


class GraphTask:
    # Slots: the compiled worker loop reads the hot fields (completed, expired, has_error,
    # outstanding, reentrant_depth) at fixed offsets.
    __slots__ = ("id", "engine", "state", "keep_graph", "create_graph", "reentrant_depth", "cpu_queue", "owner",
                 "anomaly", "multithreading", "allow_python", "context", "lock", "dependencies", "not_ready",
                 "exec_info", "captured", "outstanding", "has_error", "error", "error_node", "completed",
                 "finishing", "faults", "done", "final_callbacks", "callbacks_lock", "graph_root", "leaf_streams",
                 "expired", "ctx")

    def __init__(self, engine, state, *, keep_graph: bool, create_graph: bool, reentrant_depth: int,
                 cpu_queue, anomaly: bool, multithreading: bool, allow_python: bool, context: dict):
        self.id = next(_ids)
        self.engine = engine
        self.state = state
        self.keep_graph = keep_graph
        self.create_graph = create_graph
        self.reentrant_depth = reentrant_depth
        self.cpu_queue = cpu_queue
        self.owner = None
        self.anomaly = anomaly
        self.multithreading = multithreading
        self.allow_python = allow_python
        self.context = context
        self.lock = Lock()  # guards the mutable fields listed in the module docstring
        self.dependencies: dict = {}
        self.not_ready: dict = {}
        self.exec_info: dict = {}
        self.captured: list = []
        self.outstanding = 0
        self.has_error = False
        self.error: BaseException | None = None
        self.error_node = None
        self.completed = False
        self.finishing = False
        self.faults: dict = {}
        self.done = threading.Event()
        self.final_callbacks: list = []
        self.callbacks_lock = threading.Lock()  # guards final_callbacks
        self.graph_root = None
        self.leaf_streams: set = set()
        self.expired = False
        #: What the nodes of this call run with (their rules see only the RuleContext part).
        #: Without real GPUs ``saved`` is the state's own (the same values, one call less per node).
        saved = self.saved if engine.devices.real_cuda else state.saved
        self.ctx = EngineContext(saved, self.xp, engine.devices.transfer, create_graph,
                                 state=state, graph_task=self, allow_python=allow_python)

    # -- what the nodes' context reads -------------------------------------------
    def saved(self, node):
        values = self.state.saved(node)
        devices = self.engine.devices
        if devices.real_cuda and not node.device.is_cpu:
            return self.state.on_device(node, values, lambda a: devices.to_device(a, node.device))
        return values

    def xp(self, node):
        return self.engine.devices.xp(node.device)

    def queue_callback(self, fn) -> None:
        with self.callbacks_lock:
            self.final_callbacks.append(fn)

    # -- failure -----------------------------------------------------------------
    def set_error(self, exc: BaseException, node) -> bool:
        """Record the first error; True if this call recorded it."""
        with self.lock:
            if self.has_error:
                return False
            self.has_error = True
            self.error = exc
            self.error_node = node
            return True


def compute_dependencies(root, gt: GraphTask, min_topo_nr: int) -> None:
    """Count, for every node reachable from ``root``, the edges that lead into it.

    Iterative DFS as PyTorch's: nodes below ``min_topo_nr`` are not expanded
    (they cannot lead to a requested output). Compiled where the core is built
    (``compute_dependencies_py`` is the twin).
    """
    if core.compute_dependencies is not None:
        core.compute_dependencies(root, gt.dependencies, min_topo_nr)
    else:
        compute_dependencies_py(root, gt, min_topo_nr)


def compute_dependencies_py(root, gt: GraphTask, min_topo_nr: int) -> None:
    deps = gt.dependencies  # also the seen set: only edges lead into a node, and none into the root
    stack = [root]
    while stack:
        fn = stack.pop()
        if fn.topo_nr < min_topo_nr:
            continue
        for e in fn.next:
            if e is not None:
                nxt = e.node
                c = deps.get(nxt)
                if c is None:
                    deps[nxt] = 1
                    stack.append(nxt)
                else:
                    deps[nxt] = c + 1


def init_to_execute(gt: GraphTask, graph_root, outputs, accumulate_grad: bool, min_topo_nr: int) -> None:
    """Mark the nodes on a path from ``graph_root`` to a requested output as needed.

    ``backward(inputs=)`` (accumulate_grad) marks the output nodes needed;
    ``grad()`` marks them as capture points for their input slot instead.
    """
    info = gt.exec_info
    for idx, edge in enumerate(outputs):
        ei = info.setdefault(edge.node, ExecInfo())
        if accumulate_grad:
            ei.needed = True
        else:
            ei.captures.append((edge.input_nr, idx))
    gt.captured = [None] * (0 if accumulate_grad else len(outputs))

    def should_execute(fn) -> bool:
        ei = info.get(fn)
        return ei is not None and ei.should_execute()

    info.setdefault(graph_root, ExecInfo())
    seen = set()
    stack = [[graph_root, 0]]
    while stack:
        frame = stack[-1]
        fn = frame[0]
        nxt = fn.next
        child = None
        while frame[1] < len(nxt):
            e = nxt[frame[1]]
            frame[1] += 1
            if e is None:
                continue
            if e.node in seen:
                if should_execute(e.node):
                    info.setdefault(fn, ExecInfo()).needed = True
                continue
            seen.add(e.node)
            child = e.node
            break
        if child is not None:
            if child.topo_nr < min_topo_nr:
                continue
            stack.append([child, 0])
        else:
            stack.pop()
            if should_execute(fn) and stack:
                info.setdefault(stack[-1][0], ExecInfo()).needed = True
