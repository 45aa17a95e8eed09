"""The Engine: backward calls, device worker threads and the reentrant thread pool.

Scheduling policy (PyTorch's): each backward call is a GraphTask whose CPU
work goes to the calling thread's own ready queue, drained by the calling
thread itself; each accelerator device index has one worker thread and one
queue shared by every backward call and every device type with that index.
All device threads start together at the first backward call (one per
index below the device count) and the call waits until they run. A ready
node goes to the queue of *its* device. Priority within a queue is
``priority`` (PyTorch's by default). A node that calls the engine again is
a reentrant backward: it runs on the same thread one level deeper until the
thread's nesting reaches ``max_depth`` (60), then on a pool thread.

Thread-local state (``tls``, one per engine, never shared):
  ``worker_device``  NO_DEVICE outside the engine, CPU_DEVICE on a thread
                     driving a backward call, else the device index;
  ``queue``          this thread's ready queue (created once per thread);
  ``current_depth``  reentrant calls nested on this thread;
  ``total_depth``    reentrant depth of the GraphTask this thread runs;
  ``frame``          None between tasks, else (GraphTask of the running task,
                     whether reentrant checkpoints are valid); set around
                     every task and put back after it. The GraphTask gives
                     the grad mode (``create_graph``) and the context.

Locks:
  ``_threads_lock`` guards starting the device threads (``_device_queues``,
  ``_device_threads``, ``_started``; read without it once started);
  ``_active_lock`` (with ``_active_cond``) guards ``_active``, the
  top-level backward calls running now, which ``shutdown`` waits for,
  ``_running``, every GraphTask running now (nested ones too), and
  ``_interrupt``, the error every call fails with after ``interrupt``;
  ``_pool_lock`` (with ``_pool_cond``) guards ``_pool_tasks``,
  ``_pool_idle`` and ``pool_threads``;
  ``_gc_lock`` guards ``_gc_calls``/``_gc_was_enabled``: the cyclic GC is
  paused while any backward call of this engine runs (``pause_gc``) and
  restored when the last one returns.
GraphTask and ReadyQueue locks are documented in their modules; the lock
order is GraphTask lock, then a ReadyQueue lock.

Injected, never global: the devices (``DeviceSet``), the tracer (hooks whose
default does nothing) and the priority policy. Process-wide, as in PyTorch:
once any engine started device threads, a child forked afterwards refuses
every backward call (``ERR_FORK``; ``os.register_at_fork``).
"""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
from typing import Sequence

from autograd_run.engine.builtin_nodes import make_graph_root
from autograd_run.engine.devices import DeviceSet
from autograd_run.engine.graph_task import GraphTask, compute_dependencies, init_to_execute
from autograd_run.engine.core import InputBuffer, ReadyQueue
from autograd_run.engine.priority import EXPIRED_DEPTH, PyTorchPriority
from autograd_run.engine.streams import StreamOps, current_stream, node_stream
from autograd_run.engine.threads import device_thread_name, pool_thread_name
from autograd_run.engine.tracer import NULL_TRACER
from autograd_run.engine.worker import thread_main, validate_outputs
from autograd_run.errors import AutogradRunError, BackwardError, RequestError, RunInterrupted
from autograd_run.graphs.model import Edge

NO_DEVICE = -2
CPU_DEVICE = -1
MAX_DEPTH = 60

#: PyTorch's text (torch/csrc/autograd/engine.cpp) in a process forked after the engine's threads started.
ERR_FORK = ("Unable to handle autograd's threading in combination with fork-based multiprocessing. "
            "See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")

# A child forked after any engine started device threads cannot use them (threads do not survive fork):
# as PyTorch, every backward call in such a child is refused. Process-wide, registered once.
_fork_lock = threading.Lock()  # guards _fork_tracked
_fork_tracked = False
_in_bad_fork = False


def _forked_child() -> None:
    global _in_bad_fork
    _in_bad_fork = True


def _track_bad_forks() -> None:
    """Mark fork children as unable to run backward (``os.register_at_fork``, once per process)."""
    global _fork_tracked
    with _fork_lock:
        if not _fork_tracked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forked_child)
            _fork_tracked = True


class _TLS(threading.local):
    def __init__(self):
        self.worker_device = NO_DEVICE
        self.queue = None
        self.current_depth = 0
        self.total_depth = 0
        self.frame = None


class Engine:
    def __init__(self, devices: DeviceSet | None = None, tracer=None, priority=None, *,
                 multithreading: bool = True, max_depth: int = MAX_DEPTH, allow_python: bool = False,
                 pause_gc: bool = True):
        self.devices = devices or DeviceSet("virtual")
        self.tracer = tracer or NULL_TRACER
        self.streams = StreamOps(self.devices, self.tracer)
        self.priority = priority or PyTorchPriority()
        #: PyTorch's rule is inlined on the hot path; other policies are called.
        self.default_priority = type(self.priority) is PyTorchPriority
        self.multithreading = multithreading
        self.max_depth = max_depth
        self.allow_python = allow_python
        self.tls = _TLS()
        self._threads_lock = threading.Lock()  # guards starting the device threads
        self._device_queues: list[ReadyQueue] = []
        self._device_threads: list[threading.Thread] = []
        self._started = False
        self._active_lock = threading.Lock()  # guards _active
        self._active_cond = threading.Condition(self._active_lock)
        self._active = 0
        self._running: set[GraphTask] = set()
        self._interrupt: BaseException | None = None
        self._pool_lock = threading.Lock()  # guards _pool_tasks, _pool_idle, pool_threads
        self._pool_cond = threading.Condition(self._pool_lock)
        self._pool_tasks: collections.deque = collections.deque()
        self._pool_idle = 0
        self.pool_threads: list[threading.Thread] = []
        #: Pause Python's cyclic GC while backward calls run: the hot loop allocates many
        #: short-lived objects (and a tracer's event list grows), which otherwise costs 1.5-3x.
        self.pause_gc = pause_gc
        self._gc_lock = threading.Lock()  # guards _gc_calls and _gc_was_enabled
        self._gc_calls = 0
        self._gc_was_enabled = False

    # -- public API ------------------------------------------------------------
    def execute(self, state, roots: Sequence, grads: Sequence, *, retain_graph: bool | None = None,
                create_graph: bool = False, accumulate_grad: bool = True, inputs: Sequence | None = None,
                anomaly: bool | None = None, faults: dict[str, str] | None = None,
                context: dict | None = None) -> list:
        """Run one backward call; returns the captured gradients (``grad()``), else ``[]``.

        ``roots``/``inputs`` are Edges (or ``(node_or_id, input_nr)`` pairs);
        ``grads`` one array per root. ``faults`` maps node ids to ``"error"`` or
        ``"nan"`` (fault injection). Raises ``BackwardError`` naming the node.
        A nested (reentrant) call inherits what it is not given from the call
        whose node made it: anomaly mode (thread-local in PyTorch, so a nested
        backward checks too and names its own node) and the injected faults.
        """
        graph = state.graph
        roots = [_edge(graph, r) for r in roots]
        outputs = [_edge(graph, r) for r in (inputs or ())]
        if self.devices.count is not None and graph.max_device_index >= self.devices.count:
            raise RequestError(f"device index {graph.max_device_index} is out of range: there are "
                               f"{self.devices.count} device(s)", "backend")
        grads = [self.devices.to_device(g, e.node.inputs[e.input_nr].device) if g is not None else None
                 for g, e in zip(grads, roots)]
        validate_outputs(roots, grads, "", devices=self.devices)
        if not accumulate_grad and not outputs:
            raise ValueError("grad requires non-empty inputs.")
        if _in_bad_fork:
            raise BackwardError(ERR_FORK)
        self.start_device_threads(graph.max_device_index + 1)
        if graph.max_device_index >= len(self._device_queues) and graph.max_device_index >= 0:
            raise RequestError(f"device index {graph.max_device_index} is out of range: there are "
                               f"{len(self._device_queues)} device(s)", "backend")
        keep_graph = create_graph if retain_graph is None else retain_graph
        tls = self.tls
        if tls.queue is None:
            tls.queue = ReadyQueue(f"cpu:{threading.current_thread().name}", self.tracer)
        reentrant = tls.worker_device != NO_DEVICE
        frame = tls.frame
        parent = frame[0] if frame is not None else None
        if context is None:
            context = parent.context if parent is not None else {}
        if anomaly is None:
            anomaly = parent.anomaly if parent is not None else False
        if faults is None:
            faults = parent.faults if parent is not None else None
        gt = GraphTask(self, state, keep_graph=keep_graph, create_graph=create_graph,
                       reentrant_depth=tls.total_depth + 1 if reentrant else 0, cpu_queue=tls.queue,
                       anomaly=anomaly, multithreading=self.multithreading,
                       allow_python=self.allow_python, context=dict(context))
        gt.faults = faults or {}
        if len(roots) == 1:
            graph_root = roots[0].node
            buf = InputBuffer(len(graph_root.inputs))
            slot = roots[0].input_nr
            device = graph_root.inputs[slot].device
            if device.type == "cpu":
                buf.add(slot, grads[0])
            else:  # the root gradient is the caller's, made on its current stream
                buf.add_on_device(slot, grads[0], device, None, node_stream(graph_root), None, graph_root,
                                  self.streams, gt)
        else:
            graph_root = make_graph_root(roots, grads, state.next_seq())
            buf = InputBuffer(0)
        gt.graph_root = graph_root
        min_topo = min((e.node.topo_nr for e in outputs), default=0)
        compute_dependencies(graph_root, gt, min_topo)
        if outputs:
            init_to_execute(gt, graph_root, outputs, accumulate_grad, min_topo)
        if self.tracer.enabled:
            self.tracer.graph_task_start(gt)
        with self._active_lock:
            if not reentrant:
                self._active += 1
            self._running.add(gt)
            stopped = self._interrupt
        if stopped is not None:  # interrupted before it started: fails at once, runs nothing
            gt.set_error(stopped, None)
            gt.finishing = True
            self._complete(gt)
        if self.pause_gc:
            self._gc_enter()
        try:
            if stopped is None:
                self._execute_with_graph_task(gt, graph_root, buf)
            gt.done.wait()
        finally:
            if self.pause_gc:
                self._gc_exit()
            if gt.error is not None:
                self._expire(gt)
            with self._active_lock:
                self._running.discard(gt)
                if not reentrant:
                    self._active -= 1
                    self._active_cond.notify_all()
            if gt.error is None:
                # The node context refers back to the GraphTask (its bound methods): without this cycle
                # the call's state (saved tensors, gradients) is freed now, not at some later cyclic
                # collection, so repeated calls run in flat memory. Every node of a call that completed
                # without an error has finished; a failed call's stragglers may still read it.
                gt.ctx = None
        if gt.error is not None:
            raise _as_backward_error(gt)
        return gt.captured

    def backward(self, state, roots, grads, inputs=None, **kw) -> None:
        self.execute(state, roots, grads, accumulate_grad=True, inputs=inputs, **kw)

    def grad(self, state, roots, grads, inputs, **kw) -> list:
        return self.execute(state, roots, grads, accumulate_grad=False, inputs=inputs, **kw)

    def _gc_enter(self) -> None:
        with self._gc_lock:
            if self._gc_calls == 0:
                self._gc_was_enabled = gc.isenabled()
                gc.disable()
            self._gc_calls += 1

    def _gc_exit(self) -> None:
        with self._gc_lock:
            self._gc_calls -= 1
            if self._gc_calls == 0 and self._gc_was_enabled:
                gc.enable()

    def grad_enabled(self) -> bool:
        """Grad mode of the node running on this thread (create_graph of its backward call)."""
        frame = self.tls.frame
        return frame is not None and frame[0].create_graph

    def current_context(self) -> dict:
        """The thread-local context captured when the running node's backward call started."""
        frame = self.tls.frame
        return frame[0].context if frame is not None else {}

    def is_checkpoint_valid(self) -> bool:
        """False inside a node of a call with requested inputs (``grad()``/``inputs=``), or one nested in it."""
        frame = self.tls.frame
        return frame is None or frame[1]

    # -- stopping a run from outside ----------------------------------------------
    def interrupt(self, exc: BaseException) -> None:
        """Make every backward call running now (nested ones too), and every one started later, fail
        with ``exc``; their callers return at once, raising it (as a ``BackwardError``, ``exc`` itself
        when it is one). A node that is running finishes first (cost nodes stop waiting early); queued
        tasks are dropped. Call it from any thread but a signal handler (it takes locks); ``resume``
        lets later calls run again.
        """
        with self._active_lock:
            self._interrupt = exc
            running = list(self._running)
        for gt in running:
            gt.set_error(exc, None)
            with gt.lock:
                if gt.finishing:
                    continue
                gt.finishing = True
                owner = gt.owner
            self._complete(gt)
            if owner is not None:  # wake its caller, which may be waiting on an empty queue
                self.queue_by_index(gt, owner).push_wakeup(gt)

    def resume(self) -> None:
        """Let backward calls run again after ``interrupt``."""
        with self._active_lock:
            self._interrupt = None

    # -- device threads ------------------------------------------------------
    def start_device_threads(self, needed: int = 0) -> None:
        """Start one worker thread per device index, all at once, and wait until they run.

        The count is the devices' (``DeviceSet.count``); for virtual devices
        without one, ``needed`` (the first graph's highest index + 1) fixes it.
        Started once per engine, as PyTorch's engine starts its pool once.
        """
        if self._started:
            return
        with self._threads_lock:
            if self._started:
                return
            count = self.devices.count if self.devices.count is not None else needed
            if count > 0:
                _track_bad_forks()  # as PyTorch: only once device threads exist
                self.devices.limit_blas()
                ready = threading.Barrier(count + 1)
                queues, threads = [], []
                try:
                    for index in range(count):
                        q = ReadyQueue(f"cuda:{index}", self.tracer)
                        t = threading.Thread(target=self._device_thread_main, args=(index, q, ready),
                                             name=device_thread_name(index), daemon=True)
                        t.start()
                        queues.append(q)
                        threads.append(t)
                except RuntimeError as exc:  # the OS refused a thread (a limit on threads or memory)
                    ready.abort()  # the threads already started see it and end
                    for t in threads:
                        t.join(1.0)
                    self.devices.restore_blas()
                    raise AutogradRunError(f"cannot start the worker thread of device {index} of {count}: {exc} "
                                           "(the process is at its limit of threads or memory)") from None
                self._device_queues, self._device_threads = queues, threads
                ready.wait()
            self._started = True

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the device threads once no backward call runs, as PyTorch's ``Engine::stop``.

        Waits (within ``timeout``) for running top-level calls to finish; then,
        only if every device queue is empty, pushes a shutdown task to each and
        joins the threads against one deadline. Otherwise the threads are left
        running (daemons), so no caller's queued task is ever stranded.
        """
        deadline = time.monotonic() + timeout
        with self._active_lock:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._active_cond.wait(left)
        with self._threads_lock:
            queues, threads = list(self._device_queues), list(self._device_threads)
            if any(len(q) for q in queues):
                return
            self._device_queues, self._device_threads, self._started = [], [], False
        for q in queues:
            q.push_shutdown()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if threads:
            self.devices.restore_blas()

    @property
    def device_threads(self) -> dict[int, threading.Thread]:
        return dict(enumerate(self._device_threads))

    def _device_thread_main(self, index: int, queue: ReadyQueue, ready: threading.Barrier) -> None:
        tls = self.tls
        tls.worker_device = index
        tls.queue = queue
        try:
            ready.wait()
        except threading.BrokenBarrierError:  # another device's thread could not start: none runs
            return
        thread_main(self, None)

    # -- routing ---------------------------------------------------------------
    def ready_queue(self, gt, device) -> ReadyQueue:
        if device.type == "cpu" or not gt.multithreading:
            return gt.cpu_queue
        return self._device_queues[device.index]

    def queue_by_index(self, gt, index: int) -> ReadyQueue:
        return gt.cpu_queue if index == CPU_DEVICE else self._device_queues[index]

    def device_queue(self, index: int) -> ReadyQueue:
        """The queue of device index ``index``'s worker thread."""
        return self._device_queues[index]

    # -- one backward call -----------------------------------------------------
    def _execute_with_graph_task(self, gt: GraphTask, graph_root, buf: InputBuffer) -> None:
        tls = self.tls
        key = self.priority.key(gt.reentrant_depth, graph_root)
        gt.lock.acquire()
        queue = self.ready_queue(gt, graph_root.device)
        if tls.worker_device == NO_DEVICE:
            tls.worker_device = CPU_DEVICE
            gt.owner = CPU_DEVICE
            gt.outstanding += 1
            queue.push(key, (gt, graph_root, buf))
            gt.lock.release()
            try:
                thread_main(self, gt)
            finally:
                tls.worker_device = NO_DEVICE
            return
        gt.owner = tls.worker_device
        gt.outstanding += 1
        queue.push(key, (gt, graph_root, buf))
        gt.lock.release()
        if tls.current_depth >= self.max_depth:
            self._add_pool_task(gt)
            return
        tls.total_depth += 1
        tls.current_depth += 1
        try:
            thread_main(self, gt)
        finally:
            tls.current_depth -= 1
            tls.total_depth -= 1

    def _expire(self, gt: GraphTask) -> None:
        """The caller is done with a failed GraphTask: its queued tasks rank first and are dropped."""
        with gt.lock:
            gt.expired = True
            gt.reentrant_depth = EXPIRED_DEPTH
        for q in [gt.cpu_queue, *self._device_queues]:
            q.rekey(lambda item: item[0] is gt and item[1] is not None,
                    lambda item: (EXPIRED_DEPTH << 64) | item[1].seq)

    # -- completion and errors (called by workers) -------------------------------
    def on_exception(self, gt: GraphTask, node, exc: BaseException) -> None:
        gt.set_error(exc, node)
        if self.tracer.enabled:
            self.tracer.error(gt, node, exc)
        with gt.lock:
            if gt.finishing:
                return
            gt.finishing = True
        self._complete(gt)

    def mark_completed(self, gt: GraphTask) -> None:
        """Run post-processing once (not_ready check, leaf stream syncs, final callbacks), then complete."""
        with gt.lock:
            if gt.finishing:
                return
            gt.finishing = True
        try:
            if gt.not_ready:
                raise RuntimeError("could not compute gradients for some functions")
            self._sync_leaf_streams(gt)
            tls = self.tls
            prev = tls.frame
            tls.frame = (gt, (prev is None or prev[1]) and not gt.exec_info)
            try:
                i = 0
                while True:
                    with gt.callbacks_lock:
                        if i >= len(gt.final_callbacks):
                            break
                        cb = gt.final_callbacks[i]
                    i += 1
                    cb()  # on the caller's current streams: each device's stream 0
            finally:
                tls.frame = prev
        except BaseException as exc:  # captured as a value, re-raised by the caller
            gt.set_error(exc, None)
        self._complete(gt)

    def _sync_leaf_streams(self, gt: GraphTask) -> None:
        """The caller's current stream on each leaf stream's device waits for that leaf stream."""
        for leaf in sorted(gt.leaf_streams, key=lambda s: (s[0].type, s[0].index, s[1])):
            caller = current_stream(leaf[0])
            if caller != leaf:
                self.streams.wait(gt, caller, self.streams.record(gt, leaf, None), None)

    def _complete(self, gt: GraphTask) -> None:
        gt.completed = True
        gt.done.set()
        if self.tracer.enabled:
            self.tracer.graph_task_end(gt)

    def queue_callback(self, fn) -> None:
        """Add a final callback to the GraphTask whose node runs on this thread."""
        frame = self.tls.frame
        if frame is None:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        frame[0].queue_callback(fn)

    # -- reentrant thread pool ---------------------------------------------------
    def _add_pool_task(self, gt: GraphTask) -> None:
        with self._pool_lock:
            create = self._pool_idle <= len(self._pool_tasks)
            self._pool_tasks.append(gt)
            if create:
                t = threading.Thread(target=self._pool_thread_main,
                                     name=pool_thread_name(len(self.pool_threads)), daemon=True)
                self.pool_threads.append(t)
            self._pool_cond.notify()
        if create:
            t.start()

    def _pool_thread_main(self) -> None:
        tls = self.tls
        while True:
            with self._pool_lock:
                self._pool_idle += 1
                while not self._pool_tasks:
                    self._pool_cond.wait()
                self._pool_idle -= 1
                gt = self._pool_tasks.popleft()
            tls.worker_device = gt.owner
            tls.queue = self.queue_by_index(gt, gt.owner)
            tls.total_depth = gt.reentrant_depth
            tls.current_depth = 0
            tls.frame = None
            thread_main(self, gt)


def _edge(graph, ref) -> Edge:
    if isinstance(ref, Edge):
        return ref
    node, nr = ref
    if isinstance(node, str):
        node = graph.by_id[node]
    return Edge(node, nr)


def _as_backward_error(gt: GraphTask) -> BaseException:
    err = gt.error
    if isinstance(err, BackwardError):
        return err
    if isinstance(err, KeyboardInterrupt):  # Ctrl-C while a node ran: the run was interrupted, no node failed
        stopped = RunInterrupted("interrupted")
        stopped.__cause__ = err
        return stopped
    node = gt.error_node
    msg = str(err) if isinstance(err, RuntimeError) else f"{type(err).__name__}: {err}"
    be = BackwardError(msg, node.id if node is not None else None, node.name if node is not None else None)
    be.__cause__ = err
    if gt.anomaly and node is not None:
        trace = node.attrs.get("trace")
        #: PyTorch's anomaly-mode warning, as its first line and the forward trace from the graph file.
        be.anomaly_header = f"Error detected in {node.name}. Traceback of forward call that caused the error:"
        be.anomaly_trace = str(trace) if trace else None
        be.anomaly_note = (f"{be.anomaly_header}\n"
                           f"{trace if trace else '(no forward trace recorded in the graph file)'}")
    return be
