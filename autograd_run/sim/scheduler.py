"""The engine on a virtual clock: a deterministic discrete-event simulation of PyTorch's scheduling.

It runs the engine's own scheduling code (``worker.route`` for dependency
counting, InputBuffers and their stream rules; ``compute_dependencies``;
``init_to_execute``; the exact libstdc++ heap of ``ReadyQueue``; the
priority policy; ``make_graph_root``) against simulated workers, queues and
streams, so a simulated order is the engine's order by construction where
the real order is deterministic (one worker, or per worker when arrival
order does not race).

What it models:
  * workers: the caller thread (the CPU worker of its call) and one thread
    per device index; each takes its queue's highest task whenever it is
    free; a push onto an idle worker's queue from another thread wakes it
    after the spec's hand-off latency;
  * per node, CPU time on its worker: the engine's fixed overhead (on a
    device's thread its own figure; a ``cost`` node's own extra added) plus the
    node's CPU cost (``costs.CostResolver``); the overhead and GIL-holding
    costs take the GIL, a shared resource granted in request order; a
    thread that finds it held by another waits for its release and then
    the hand-off latency (it sleeps, and is woken as from a queue);
  * accelerator nodes: a kernel on the node's stream after its launch, the
    stream a timeline of its own, so a device thread runs ahead of its
    streams; events recorded and waited on exactly where the engine's
    ``InputBuffer`` and worker record and wait them; a copy to the host
    blocks its worker until its stream is done;
  * reentrant checkpoints (``checkpoint`` nodes, and ``python`` nodes
    running the shipped checkpoint callable): a nested call one level deeper
    on the same worker, handed to a pool thread past the depth limit;
  * completion: a wake-up to the caller when another worker finishes the
    call, and the caller's streams waiting on the leaf streams;
  * the fixed CPU cost of a top-level backward call (the spec's
    ``call_overhead_us``) on the caller before its root is pushed.

State of one simulation (``Simulator``): ``now`` (ns), the event heap
``_events`` of (time, order, function, argument), the workers (``SimWorker``:
queue, busy/idle, reentrant depth), ``_gil_free_at`` and ``_gil_holder``, the stream timelines
``stream_free`` (stream -> ns when its last kernel ends), and the records of
what happened (``slices``, ``kernels``, the start order, ...), turned into a
``Recording`` by ``result.to_recording``. A queued task carries the time of
its push, so the slice of its node records how long it waited. The simulated
threads, queues and GraphTasks are in ``tasks``, the stream timelines in
``streams``. Where one worker runs everything (``_run_sequential``), a plain
loop replaces the events. Where the compiled core is built, a call without
nested backward calls runs its events in C
(``_run_compiled``: ``engine/csrc/sim_loop.c``, whose twin is this module's
event methods): the same events in the same order.
"""

from __future__ import annotations

import heapq
import itertools
from operator import attrgetter
from typing import Callable

from autograd_run.engine import core
from autograd_run.engine.builtin_nodes import make_graph_root
from autograd_run.engine.graph_task import compute_dependencies, init_to_execute
from autograd_run.engine.core import InputBuffer
from autograd_run.engine.priority import WAKEUP_KEY, PyTorchPriority
from autograd_run.engine.streams import current_stream, node_stream
from autograd_run.engine.threads import device_thread_name, pool_thread_name
from autograd_run.engine.tracer import NULL_TRACER
from autograd_run.engine.worker import route
from autograd_run.graphs.model import Edge
from autograd_run.ops import CHECKPOINT, COST, PYTHON
from autograd_run.sim.costs import CostResolver
from autograd_run.sim.specs import MachineSpec
from autograd_run.sim.streams import SimStreams, stream_key
from autograd_run.sim.tasks import SimRun, SimQueue, SimTask, SimWorker

#: The event methods ``_core.sim_loop`` stands in for (a subclass overriding any of them gets the Python loop).
_LOOP_METHODS = ("at", "wake", "_step", "_run_node", "_function", "_busy_tail", "_launched", "_cpu", "kernel",
                 "_done", "_retire", "_go_on", "_complete")

MAX_DEPTH = 60
CALLER = -1
_CHECKPOINT = "autograd_run.engine.callables:checkpoint"


def _resolver_tables(costs):
    """A CostResolver's tables, which the compiled loops read where a node's cost is known without a call
    (resolved already, or its ``_resolve``'s shared case); None for any other cost function."""
    return costs.tables() if type(costs) is CostResolver else None


class Simulator:
    """One simulated backward call (``run``) of ``graph`` on ``spec``'s machine (see the module docstring)."""

    def __init__(self, graph, spec: MachineSpec, costs: CostResolver | None = None, *, priority=None,
                 multithreading: bool = True, device_count: int | None = None, detail: bool = True):
        self.graph = graph
        self.spec = spec
        #: node -> NodeCost: a ``CostResolver``, or any such callable.
        self.costs = costs or CostResolver(spec)
        self.priority = priority or PyTorchPriority()
        self.default_priority = type(self.priority) is PyTorchPriority
        self.multithreading = multithreading
        #: Record queue depths (for a trace's counters); off, a large simulation keeps less.
        self.detail = detail
        self.streams = SimStreams(self)
        #: A sum of two gradients on a stream: the accelerator's shortest kernel (``streams._Accumulate``),
        #: done inline unless a subclass overrides ``kernel``.
        self.sum_kernel_ns = int(spec.accelerator.min_kernel_us * 1e3)
        self.kernel_is_default = type(self).kernel is Simulator.kernel
        self.overhead_ns = int(spec.engine.node_overhead_us * 1e3)
        #: The fixed cost on a device's node (0 in the spec: the same), and a cost node's extra.
        self.device_overhead_ns = int((spec.engine.device_overhead_us or spec.engine.node_overhead_us) * 1e3)
        self.cost_node_ns = int(spec.engine.cost_node_us * 1e3)
        self.handoff_ns = int(spec.engine.handoff_us * 1e3)
        #: The hand-off between two devices' workers (0 in the spec: ``handoff_ns``); ``tasks.SimQueue.push``.
        self.device_handoff_ns = int((spec.engine.device_handoff_us or spec.engine.handoff_us) * 1e3)
        #: A thread waiting for the GIL takes it this long after its release (0 in the spec: ``handoff_ns``).
        self.gil_handoff_ns = int((spec.engine.gil_handoff_us or spec.engine.handoff_us) * 1e3)
        self.call_ns = int(spec.engine.call_overhead_us * 1e3)
        self.overhead_gil = spec.engine.overhead_holds_gil
        self.now = 0
        self._events: list = []
        self._nests: bool | None = None  # ``_nests_calls``
        #: Workers to go on once the current event's calls return (``_retire``, ``_go_on``).
        self._pending: list = []
        self._order = itertools.count()
        self._tids = itertools.count(1)
        self.caller = self._worker("MainThread", CALLER, "cpu:MainThread")
        count = device_count if device_count is not None else graph.max_device_index + 1
        self.devices = [self._worker(device_thread_name(i), i, f"cuda:{i}") for i in range(count)]
        #: The device workers' tids: a push from one of them onto another device's idle worker costs
        #: ``device_handoff_ns``.
        self.device_tids = frozenset(w.tid for w in self.devices)
        self.pool: list[SimWorker] = []
        self._pool_idle: list[SimWorker] = []
        self._gil_free_at = 0
        self._gil_holder = None  # the worker of the latest GIL-holding CPU work
        #: When each of the host's cores is next free (a heap), or None when cores are not modelled.
        cores = spec.host.cores
        self._core_free: list | None = [0] * cores if cores and multithreading else None
        #: stream_key -> when the stream's last kernel ends (a kernel starts no earlier; waits move it on).
        self.stream_free: dict = {}
        # What happened, as plain tuples (``result.to_recording`` makes a Recording of them).
        #: (gt, depth, node, tid, start, end, queue, pushed), in end order: a list of tuples, or the compiled
        #: core's SliceLog (the same sequence of tuples to a reader, kept as columns: ~36 bytes a slice, not ~200)
        self.slices = core.SliceLog()
        self.kernels: list = []     # (stream, node, start, end)
        self.queue_samples: list = []
        self.syncs: list = []
        self.stream_events: list = []
        self.idles: list = []
        self.skips: list = []
        self.graph_tasks: list[SimTask] = []
        # Nodes in the order their functions started: (gt id, depth, node, worker), as node pre-hooks see it;
        # None when one worker ran everything (then it is the order of ``slices``): read it with ``starts()``.
        self._started: list | None = []
        #: Whether ``run`` took the one-worker loop with every node on the CPU (no stream, no GIL, no hand-off):
        #: then the call ended at its start plus the call overhead plus, over the nodes that ran, the engine's
        #: overhead and each node's CPU time, in whatever order they ran (``_run_sequential``).
        self.cpu_only_one_worker = False
        #: The gradients routing hands on, a 1 for each output of the node routed (routing reads no more than the
        #: list has): grown by ``_ones_for`` (and the compiled loops) where a node has more outputs, rather than
        #: sized by a pass over every node (30 ms a simulation at 1e6 nodes).
        self._ones = [1] * max(len(graph.roots), 8)

    def _ones_for(self, n: int) -> list:
        """``_ones``, at least ``n`` long."""
        if n > len(self._ones):
            self._ones = [1] * n
        return self._ones

    def release(self) -> None:
        """Drop what the simulation recorded (a what-if whose span was read keeps nothing else). The
        simulator's parts refer to each other (a queue to its simulator): without this its records would
        wait for the cyclic GC, which ``simulate_session`` pauses."""
        for records in (self.slices, self.kernels, self.queue_samples, self.syncs, self.stream_events, self.idles,
                        self.skips, self.graph_tasks, self._events):
            records.clear()
        self._started = []

    def starts(self):
        """(gt id, depth, node, worker) of each node run, in the order their functions started."""
        if self._started is not None:
            return self._started
        return ((s[0], s[1], s[2], self.caller) for s in self.slices)

    # -- engine-facing API (duck-typed for worker.route) -------------------------
    def device_queue(self, index: int) -> SimQueue:
        return self.devices[index].queue

    def _worker(self, name: str, index: int, queue_name: str | None) -> SimWorker:
        w = SimWorker(name, index, None, next(self._tids))
        if queue_name is not None:
            w.queue = SimQueue(queue_name, self)
            w.queue.consumers.append(w)
        return w

    # -- the event loop ----------------------------------------------------------
    def at(self, t: int, action: Callable, arg=None) -> None:
        """Call ``action(arg)`` at virtual time ``t`` (events at one time run in the order they were made)."""
        heapq.heappush(self._events, (t, next(self._order), action, arg))

    def run(self, roots: list[Edge], inputs: list[Edge] | None = None, accumulate_grad: bool = True) -> SimTask:
        """Simulate one top-level backward call from the caller; returns its (completed) task."""
        caller = self.caller
        caller.idle = False
        start = self.now
        self.now += self.call_ns  # entering the engine: the caller's own CPU time before the root is pushed
        gt = self._new_task(roots, inputs or [], accumulate_grad, caller, 0)
        gt.start = start
        self.cpu_only_one_worker = False
        if self._one_worker():
            self._run_sequential(gt)
            self.cpu_only_one_worker = self.graph.max_device_index < 0
            self._let_go_of_counts()
            return gt
        caller.waiting_for.append(gt)
        self.at(self.now, self._step, caller)
        if self._compiled_loop():
            self._run_compiled()
        else:
            events = self._events
            pop = heapq.heappop
            pending = self._pending
            while events:
                t, _, action, arg = pop(events)
                self.now = t
                action(arg)
                if pending:
                    self._go_on()
        if not gt.completed:
            raise RuntimeError("simulation stalled: the backward call never completed")
        self._let_go_of_counts()
        return gt

    def _let_go_of_counts(self) -> None:
        """A finished task's dependency counts and buffers are all gone, but a dict keeps the table it grew to (50
        MB for a million nodes), and a NodeMap its slots, until cleared; the tasks stay in ``graph_tasks``, so the
        tables would too."""
        for task in self.graph_tasks:
            if not task.dependencies:
                task.dependencies.clear()
            if not task.not_ready:
                task.not_ready.clear()

    def _compiled_loop(self) -> bool:
        """Whether the compiled core's event loop (``engine/csrc/sim_loop.c``) runs this call: it is built, no
        node makes a nested backward call (checkpoint and python nodes), and the event methods and routing are
        this module's own (a subclass or a patched ``route`` gets the Python loop). The host's cores, where they
        are modelled, are the C loop's too (``_core_free`` in, and back when it ends)."""
        if core.sim_loop is None or route is not core.route_impl:
            return False
        if any(getattr(type(self), m) is not getattr(Simulator, m) for m in _LOOP_METHODS):
            return False
        return not self._nests_calls()

    def _nests_calls(self) -> bool:
        """Whether a node may make a nested backward call (a checkpoint or python node); read once."""
        if self._nests is None:
            ops = self.graph.op_set or set(map(attrgetter("op"), self.graph.nodes))
            self._nests = PYTHON in ops or CHECKPOINT in ops
        return self._nests

    def _run_compiled(self) -> None:
        """The events so far and every later one, run by ``_core.sim_loop``: the Python methods' events, in the
        same order (one counter orders both), without their frames. While it runs, ``self.at`` is its own (a
        queue's push schedules a wake-up through it) and ``self.now`` is kept current."""
        costs = self.costs
        resolved = _resolver_tables(costs)
        events, self._events = self._events, []
        order = next(self._order)
        self.now, self._gil_free_at, self._gil_holder, order = core.sim_loop(
            self, events, order, Simulator.wake, Simulator._step, costs, resolved, self.slices, self.kernels,
            self._started, self.skips, self.idles, self.queue_samples, self.stream_free, self.streams, self._ones,
            NULL_TRACER, COST, self.now, self.overhead_ns, self.device_overhead_ns, self.cost_node_ns,
            self.gil_handoff_ns, self.detail, self.overhead_gil, self._gil_free_at, self._gil_holder, self._core_free)
        self._order = itertools.count(order)

    def _one_worker(self) -> bool:
        """Whether the caller alone runs everything (then nothing competes: no events are needed)."""
        if self.multithreading and self.graph.max_device_index >= 0:
            return False
        return not self._nests_calls()

    def _run_sequential(self, gt: SimTask) -> None:
        """The one-worker case as a plain loop: each popped node runs right after the previous one (in C,
        ``_core.sim_sequential``, where every node runs on the CPU: ~2.5x faster per node)."""
        w = self.caller
        self._started = None  # the start order is the slices' order: one worker runs each node to its end
        heap = w.queue.heap
        pop = heap.pop
        costs, overhead, route_, streams = self.costs, self.overhead_ns, route, self.streams
        dev_overhead, cost_node = self.device_overhead_ns, self.cost_node_ns
        # A CostResolver's costs asked for already, read without a call (the slack what-ifs start with them all).
        known = getattr(costs, "resolved", {}).get
        slices, samples, ones = self.slices, self.queue_samples, self._ones
        append = slices.append
        qname, tid, detail = w.queue.name, w.tid, self.detail
        exec_info, gid = gt.exec_info, gt.id
        self.current_tid = tid
        t = self.now
        if (core.sim_sequential is not None and self.graph.max_device_index < 0 and not exec_info and not detail
                and type(heap) is core.ReadyQueue):
            # the loop below in C (every node on the CPU, nothing skipped, no queue samples): the same slices
            resolved = _resolver_tables(costs)
            t = self.now = core.sim_sequential(self, gt, heap, costs, resolved, slices, ones, NULL_TRACER, COST, t,
                                               overhead, cost_node, tid, qname, gid)
        while len(heap):
            (task_gt, node, buf), pushed = pop()
            if detail:
                samples.append((t, tid, qname, task_gt.id, node, len(heap), False))
            if node is None:
                continue
            start = t
            if node.cpu:
                parent = None
            else:
                parent = node_stream(node)
                for _, event in buf.ready_waits(parent):
                    streams.wait(gt, parent, event, node)
            if exec_info:
                fi = exec_info.get(node)
                if fi is not None and not fi.needed:
                    if fi.captures and parent is not None:
                        gt.leaf_streams.add(parent)
                    self.skips.append((t, tid, gid, node))
                    gt.outstanding -= 1
                    continue
            c = known(node) or costs(node)
            t += (overhead if node.cpu else dev_overhead) + c.cpu_ns
            if node.op is COST:
                t += cost_node
            if parent is not None and c.gpu_ns:
                end = self.kernel(parent, node, c.gpu_ns, not_before=t)
                if c.blocking and end > t:
                    t = end
            self.now = t
            append((gid, 0, node, tid, start, t, qname, pushed))
            if node.next:
                if len(node.next) > len(ones):  # (the check inline: this loop is per node)
                    ones = self._ones_for(len(node.next))
                route_(self, gt, node, ones, exec_info, NULL_TRACER, parent)
            else:
                if parent is not None:
                    gt.leaf_streams.add(parent)
                gt.outstanding -= 1
        self._complete(w, gt)
        gt.returned = self.now
        w.idle = True

    def _new_task(self, roots, outputs, accumulate_grad, owner: SimWorker, depth: int) -> SimTask:
        gt = SimTask(depth, owner.queue, self.multithreading, owner)
        gt.start = self.now
        if len(roots) == 1:
            root = roots[0].node
            buf = InputBuffer(len(root.inputs))
            slot = roots[0].input_nr
            device = root.inputs[slot].device
            if device.type == "cpu":
                buf.add(slot, 1)
            else:
                buf.add_on_device(slot, 1, device, None, node_stream(root), None, root, self.streams, gt)
        else:
            root = make_graph_root(roots, [1] * len(roots), 2**63 - 1)
            buf = InputBuffer(0)
        gt.graph_root = root
        if depth == 0 and core.NodeMap is not None:
            # the top-level call counts (about) every node of the graph, and may hold a buffer for any of them: its
            # counts and buffers in slots by node index (engine/csrc/node_map.c), not dicts' tables (a random DAG
            # of 1e7 nodes: 101 -> 86 s); nested calls count a part and keep dicts
            gt.dependencies = core.NodeMap(len(self.graph.nodes))
            gt.not_ready = core.NodeMap(len(self.graph.nodes))
        min_topo = min((e.node.topo_nr for e in outputs), default=0)
        compute_dependencies(root, gt, min_topo)
        if outputs:
            init_to_execute(gt, root, outputs, accumulate_grad, min_topo)
        self.graph_tasks.append(gt)
        queue = gt.cpu_queue if root.cpu or not self.multithreading else self.device_queue(root.device.index)
        gt.outstanding += 1
        key = ((depth << 64) | root.seq) if self.default_priority else self.priority.key(depth, root)
        queue.push(key, (gt, root, buf))
        return gt

    # -- workers ----------------------------------------------------------------
    #: The thread that is routing (pushing) now, for the queue samples.
    current_tid = 0

    def wake(self, w: SimWorker) -> None:
        """The hand-off has passed: a worker that slept on its empty queue takes its next task (``tasks.SimQueue``
        schedules this when it pushes to a sleeping consumer)."""
        w.wake_pending = False
        if w.idle:
            if w.idle_since is not None and self.now > w.idle_since:
                waiting = w.waiting_for[-1].id if w.waiting_for else None
                self.idles.append((w.idle_since, self.now, w.tid, w.queue.name, waiting))
            w.idle = False
            self._step(w)

    def _step(self, w: SimWorker) -> None:
        """Worker ``w`` is free: leave the loops whose call completed, or pop and run its next task."""
        waiting = w.waiting_for
        if waiting and waiting[-1].completed:
            gt = waiting.pop()
            done, gt.on_done = gt.on_done, []
            for fn in done:
                fn()
            if not done and not waiting:  # the top-level call returned: the caller is done
                gt.returned = self.now
                w.idle = True
                w.idle_since = None
            return
        q = w.queue
        if not len(q):
            w.idle = True
            w.idle_since = self.now
            return
        (gt, node, buf), pushed = q.pop()
        if self.detail:
            self.queue_samples.append((self.now, w.tid, q.name, gt.id, node, len(q), False))
        if node is None:  # a wake-up: the loop condition is checked again
            self._step(w)
            return
        self._run_node(w, gt, node, buf, q.name, pushed)

    def _run_node(self, w: SimWorker, gt: SimTask, node, buf: InputBuffer, queue: str, pushed: int) -> None:
        """Run ``node`` on ``w`` from now (its task was pushed onto ``queue`` at ``pushed``): the engine's
        overhead, then its function (``_function``), its kernel (``_launched``), its routing (``_done``)."""
        start = self.now
        parent = node_stream(node)
        if parent is not None:
            for _, event in buf.ready_waits(parent):
                self.streams.wait(gt, parent, event, node)
        fi = gt.exec_info.get(node) if gt.exec_info else None
        if fi is not None and not fi.needed:  # captured for grad() only: the node does not run
            if fi.captures and parent is not None:
                gt.leaf_streams.add(parent)
            self.skips.append((self.now, w.tid, gt.id, node))
            self._retire(w, gt, None)
            return
        cost = self.costs(node)
        self._started.append((gt.id, gt.reentrant_depth, node, w))
        checkpoint = node.op is CHECKPOINT or (node.op is PYTHON and node.attrs.get("callable") == _CHECKPOINT)
        run = SimRun(w, gt, node, start, parent, queue, pushed, cost, checkpoint)
        overhead = self.overhead_ns if node.cpu else self.device_overhead_ns
        if node.op is COST:
            overhead += self.cost_node_ns
        self._cpu(overhead, self.overhead_gil, self._function, run)

    def _function(self, run: SimRun) -> None:
        """The engine's overhead is done: the node's function (a nested call for a checkpoint)."""
        if run.checkpoint:
            self._nested_call(run)
            return
        cost = run.cost
        if cost.sleep_ns and self._core_free is not None and cost.cpu_ns > 0:
            # asleep first (no GIL, no core), then busy to the deadline set when the function started
            run.deadline = self.now + cost.cpu_ns
            self.at(self.now + min(cost.sleep_ns, cost.cpu_ns), self._busy_tail, run)
            return
        if self._core_free is not None and cost.holds_gil and cost.source == "attrs":
            run.deadline = -1  # a spin: to the deadline it sets when it starts
        self._cpu(cost.cpu_ns, cost.holds_gil, self._launched, run)

    def _busy_tail(self, run: SimRun) -> None:
        """A wait's sleep is over: it busy-waits on a core until its deadline."""
        self._cpu(max(0, run.deadline - self.now), run.cost.holds_gil, self._launched, run)

    def _launched(self, run: SimRun) -> None:
        """The function's CPU part is done: its kernel goes onto the node's stream."""
        t, cost = self.now, run.cost
        if run.parent is not None and cost.gpu_ns:
            end = self.kernel(run.parent, run.node, cost.gpu_ns, not_before=t)
            if cost.blocking and end > t:  # a copy to the host: the worker waits for its stream
                self.at(end, self._done, run)
                return
        self._done(run)

    def _cpu(self, ns: int, gil: bool, then: Callable, run: SimRun) -> None:
        """CPU work of ``ns`` from now (once the GIL is free, when it takes the GIL); then ``then(run)``."""
        if ns <= 0:
            then(run)
            return
        t = self.now
        if gil and self._gil_free_at > t and self._gil_holder is not run.w:
            # held by another thread: this one sleeps until it is released, and is woken as a thread
            # waiting on a queue is (the hand-off latency), as CPython's GIL hands itself over
            t = self._gil_free_at + self.gil_handoff_ns
        end = t + ns
        cores = self._core_free
        if cores is not None:
            if cores[0] > t:  # every core busy: runnable, it runs when the first one frees
                got = cores[0]
                deadline = run.deadline if then == self._launched else None  # (bound methods: equal, not one)
                # work with a deadline (a wait's or spin's end) loses only what is past the deadline
                end = got + ns if deadline is None else max(end if deadline < 0 else deadline, got)
            heapq.heapreplace(cores, end)
        if gil:
            self._gil_free_at = end
            self._gil_holder = run.w
        self.at(end, then, run)

    def kernel(self, stream, node, ns: int, not_before: int | None = None) -> int:
        """Enqueue a kernel on ``stream``; returns when it ends."""
        key = stream_key(stream)
        start = max(self.stream_free.get(key, 0), self.now if not_before is None else not_before)
        end = start + ns
        self.stream_free[key] = end
        if node is not None:
            self.kernels.append((stream, node, start, end))
        return end

    def _done(self, run: SimRun) -> None:
        """The node is done: record its slice, route its outputs, retire its task, go on."""
        w, gt, node, parent = run.w, run.gt, run.node, run.parent
        self.slices.append((gt.id, gt.reentrant_depth, node, w.tid, run.start, self.now, run.queue, run.pushed))
        if not node.next:  # AccumulateGrad and other nodes without outputs
            if parent is not None:
                gt.leaf_streams.add(parent)
            self._retire(w, gt, None)
            return
        self.current_tid = w.tid
        finished = route(self, gt, node, self._ones_for(len(node.next)), gt.exec_info, NULL_TRACER, parent)
        self._retire(w, gt, finished)

    def _retire(self, w: SimWorker, gt: SimTask, finished) -> None:
        """The task is done: retire it from its call (unless routing did), complete the call; the worker goes on
        (``_go_on``) once this event's calls have returned, before any other event: nodes that take no time
        would otherwise nest one call deeper per node."""
        if finished is None:
            gt.outstanding -= 1
            finished = gt.outstanding == 0
        if finished:
            self._complete(w, gt)
        self._pending.append(w)

    def _go_on(self) -> None:
        """The workers whose task was retired take their next one (``_retire``)."""
        pending = self._pending
        while pending:
            self._step(pending.pop())

    def _complete(self, w: SimWorker, gt: SimTask) -> None:
        gt.completed = True
        gt.end = self.now
        for leaf in sorted(gt.leaf_streams, key=lambda s: (s[0].type, s[0].index, s[1])):
            caller = current_stream(leaf[0])
            if caller != leaf:
                self.streams.wait(gt, caller, self.streams.record(gt, leaf, None), None)
        owner = gt.owner
        if owner.index != w.index:  # the owner may be asleep on its queue: wake it
            self.current_tid = w.tid
            owner.queue.push(WAKEUP_KEY, (gt, None, None))

    # -- reentrant checkpoints ---------------------------------------------------------
    def _nested_call(self, run: SimRun) -> None:
        """A checkpoint node's function: a nested backward over its segment, one level deeper."""
        w, node = run.w, run.node
        resume = lambda: self.at(self.now, self._done, run)  # noqa: E731
        by_id = self.graph.by_id
        if node.op is CHECKPOINT:  # backward() over the recomputed graph
            roots = [Edge(by_id[r[0]], r[1]) for r in node.attrs["inner"]["roots"] if r is not None]
            nested = self._new_task(roots, [], True, w, w.total_depth + 1)
        else:  # the shipped python checkpoint: grad() of the segment's input
            seg_root, seg_input = by_id[node.attrs["segment_root"]], by_id[node.attrs["segment_input"]]
            nested = self._new_task([Edge(seg_root, 0)], [Edge(seg_input, 0)], False, w, w.total_depth + 1)
        if w.current_depth >= MAX_DEPTH:  # handed to a pool thread; this thread blocks until it is done
            p = self._pool_idle.pop() if self._pool_idle else self._new_pool_worker()
            p.queue, p.index = w.queue, w.index
            p.total_depth, p.current_depth = nested.reentrant_depth, 0
            w.queue.consumers.append(p)

            def pool_done():
                w.queue.consumers.remove(p)
                self._pool_idle.append(p)
                resume()
            nested.on_done.append(pool_done)
            p.waiting_for.append(nested)
            p.idle = False
            self.at(self.now + self.handoff_ns, self._step, p)
            return
        w.current_depth += 1
        w.total_depth += 1

        def leave():
            w.current_depth -= 1
            w.total_depth -= 1
            resume()
        nested.on_done.append(leave)
        w.waiting_for.append(nested)
        self._step(w)

    def _new_pool_worker(self) -> SimWorker:
        p = self._worker(pool_thread_name(len(self.pool)), CALLER, None)
        self.pool.append(p)
        return p
