"""The simulation's stand-ins for the engine's threads, queues and GraphTasks (``scheduler`` drives them).

``SimQueue``   a worker's ready queue: the engine's own queue, items carry their push time;
``SimTask``    the fields of a GraphTask that the engine's routing code reads and writes;
``SimWorker``  a simulated thread: its queue, whether it sleeps, its reentrant depth;
``SimRun``    a node being run by a worker, carried from event to event.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from autograd_run.engine import core
from autograd_run.engine.core import Lock, ReadyQueue


class SimHost(Protocol):
    """What a ``SimQueue`` reads of the simulator that drives it (``scheduler.Simulator``)."""

    now: int
    detail: bool
    handoff_ns: int
    #: The hand-off between two devices' workers, and those workers' tids.
    device_handoff_ns: int
    device_tids: frozenset
    #: The thread routing (pushing) now, and the queue samples a push appends to (with ``detail``).
    current_tid: int
    queue_samples: list

    def at(self, t: int, action: Callable, arg=None) -> None: ...

    def wake(self, w: "SimWorker") -> None: ...


class SimQueue:
    """A ready queue for the simulation: the engine's ready queue (its exact heap, compiled where the core is
    built), whose items are ``(task, pushed)`` (the engine's task and the virtual time of its push); a push
    wakes the queue's consumer.

    ``consumers`` is a stack: the worker serving the queue is the last one (a
    pool thread serves the queue of the thread it stands in for while that
    thread is blocked in a reentrant call).
    """

    __slots__ = ("name", "heap", "sim", "consumers")

    def __init__(self, name: str, sim: SimHost):
        self.name = name
        self.heap = ReadyQueue(name)
        self.sim = sim
        self.consumers: list[SimWorker] = []

    def push(self, key: int, task) -> None:
        """Queue ``task`` (routing calls this); sample the queue (with ``detail``); wake its sleeping consumer."""
        sim = self.sim
        now = sim.now
        self.heap.push(key, (task, now))
        if sim.detail:
            sim.queue_samples.append((now, sim.current_tid, self.name, task[0].id, task[1], len(self.heap), True))
        w = self.consumers[-1]
        if w.idle and not w.wake_pending:  # asleep on its queue: woken from another thread
            w.wake_pending = True
            # from one device's worker to another's: both Python threads on the engine's Python path
            between_devices = w.tid in sim.device_tids and sim.current_tid in sim.device_tids
            sim.at(now + (sim.device_handoff_ns if between_devices else sim.handoff_ns), sim.wake, w)

    def pop(self) -> tuple:
        """The top ``(task, pushed)`` (the queue is not empty: the simulation pops only then)."""
        return self.heap.pop()

    def __len__(self) -> int:
        return len(self.heap)


class SimTask:
    """The slice of a GraphTask that the engine's routing code reads and writes, for one simulated call."""

    _ids = itertools.count()

    def __init__(self, depth: int, cpu_queue: SimQueue, multithreading: bool, owner: "SimWorker"):
        self.id = next(SimTask._ids)
        self.reentrant_depth = depth
        self.cpu_queue = cpu_queue
        self.multithreading = multithreading
        self.owner = owner
        self.lock = Lock()  # never contended (one simulated thread runs at a time); routing takes it
        self.dependencies: dict = {}
        self.not_ready: dict = {}
        self.exec_info: dict = {}
        self.captured: list = []
        self.outstanding = 0
        self.completed = False
        self.start = 0
        self.end: int | None = None
        #: When the owner saw the completion and the call returned (top-level calls).
        self.returned: int | None = None
        self.tid = owner.tid
        self.leaf_streams: set = set()
        self.graph_root = None
        #: Called when the call completes (the node that made a nested call resumes).
        self.on_done: list[Callable] = []


@dataclass(slots=True)
class SimWorker:
    name: str
    index: int
    queue: Any
    tid: int
    idle: bool = True
    idle_since: int | None = None
    #: The calls this worker's nested thread_main loops wait for, innermost last (empty: a device loop).
    waiting_for: list = field(default_factory=list)
    current_depth: int = 0
    total_depth: int = 0
    wake_pending: bool = False


#: Whether the compiled routing pushes onto a SimQueue itself where ``SimQueue.push`` would only put the task on
#: its heap (no queue samples, no wake-up to schedule): ``engine/csrc/sim_loop.c`` ``sim_queue_push_fast``.
PUSH_COMPILED = core.COMPILED and core.configure_sim_queue(SimQueue, SimWorker)


@dataclass(slots=True, eq=False)
class SimRun:
    """A node being run by a worker: what its later steps (events) need."""

    w: SimWorker
    gt: "SimTask"
    node: Any
    start: int
    #: The node's stream (None on the CPU).
    parent: tuple | None
    #: The queue its task was popped from, and when the task was pushed there.
    queue: str
    pushed: int
    cost: Any
    checkpoint: bool
    #: Work that runs to a deadline (with cores modelled): -1, fixed when its CPU part starts (a ``spin``);
    #: a time, fixed when the function started (a ``wait``'s busy tail); None: a fixed amount of work.
    deadline: int | None = None
