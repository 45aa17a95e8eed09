"""The worker loop and running one node: PyTorch's ``thread_main`` and ``evaluate_function``.

``thread_main(engine, gt)`` pops tasks from this thread's ready queue and
runs them until ``gt`` completes (``gt`` None: forever, for device threads,
until a shutdown task). Around every task the thread-local frame (the
running GraphTask, which gives the grad mode and context, and whether
reentrant checkpoints are valid) is set and afterwards put back. Tasks of a
GraphTask whose caller has returned after a failure are dropped unseen.
Running a node (``evaluate_function``):

1. an accelerator node runs on its stream, which first waits on the ready
   event of each input gradient made ready on another stream;
2. with exec_info: capture inputs for ``grad()`` (tensor pre-hooks and
   retains-grad hooks run first when the node itself will not run), and
   stop if the node is not needed;
3. tensor pre-hooks, retains-grad hooks, node pre-hooks, the op's
   function, ``validate_outputs``, post-hooks;
4. release saved tensors unless ``retain_graph``;
5. a node without outputs records its stream as a leaf stream;
6. anomaly mode: refuse NaN outputs;
7. under the GraphTask lock, hand each output to its next node's
   InputBuffer (with PyTorch's stream rules for accelerator gradients) and
   push the nodes that became ready onto the queue of *their* device.

Errors are captured as values on the GraphTask (first one wins) and
re-raised in the calling thread; the worker goes on serving other tasks.
"""

from __future__ import annotations

import time

import numpy as np

from autograd_run.engine import core
from autograd_run.engine.builtin_nodes import RUNNERS
from autograd_run.engine.core import InputBuffer
from autograd_run.engine.ready_queue import SHUTDOWN
from autograd_run.engine.streams import node_stream
from autograd_run.ops import ACCUMULATE_GRAD, PYTHON
from autograd_run.ops.arrays import sum_to
from autograd_run.ops.dtypes import NP_DTYPES, upcast


_NP_DTYPES = NP_DTYPES  # the format's names -> numpy dtypes (bfloat16 once registered: ops.dtypes)
#: The compiled core's check that gradients already have their slots' shapes and dtypes (or None).
_outputs_match = core.outputs_match
#: Hot-path constants: the function that runs each op, and the leaf op.
_RULE_FN = RUNNERS
_ACC = ACCUMULATE_GRAD


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _pfx(prefix) -> str:
    """Message prefix: a string as given, or for a node "Function NAME returned an "."""
    return prefix if isinstance(prefix, str) else f"Function {prefix.name} returned an "


def validate_outputs(edges, grads, prefix, xp=None, devices=None) -> None:
    """PyTorch's validate_outputs: count, then per gradient shape (with sum_to), dtype, device.

    ``prefix`` is prepended to each message (``"Function NAME returned an "``
    for node outputs, empty for root gradients). Mutates ``grads`` in place.
    Gradients are cast to the expected dtype, as PyTorch does. Devices are
    checked where arrays know theirs (real CUDA); 0-dim gradients are moved.
    """
    if len(grads) != len(edges):
        raise RuntimeError(f"{_pfx(prefix)}invalid number of gradients - expected {len(edges)}, but got {len(grads)}")
    for i, e in enumerate(edges):
        if e is None:
            continue
        g = grads[i]
        if g is None:
            continue
        meta = e.node.inputs[e.input_nr]
        shape = meta.shape
        gshape = g.shape
        if gshape != shape:
            nd, td = len(shape), len(gshape)
            reduce = nd != td
            if nd > td:
                raise RuntimeError(f"{_pfx(prefix)}invalid gradient at index {i} - got {_fmt_shape(gshape)} "
                                   f"but expected shape compatible with {_fmt_shape(shape)}")
            for k in range(1, nd + 1):
                s, t = shape[-k], gshape[-k]
                if s == 1:
                    if t != 1:
                        reduce = True
                elif s != t:
                    raise RuntimeError(f"{_pfx(prefix)}invalid gradient at index {i} - got {_fmt_shape(gshape)} "
                                       f"but expected shape compatible with {_fmt_shape(shape)}")
            if reduce:
                # only size-1 dimensions to drop or keep: the sum of one element is that element
                g = g.reshape(shape) if g.size == _numel(shape) else sum_to(xp or np, g, shape)
        want = _NP_DTYPES[meta.dtype]
        if g.dtype is not want and g.dtype != want:
            g = g.astype(want)
        if devices is not None and devices.real_cuda:
            dev = devices.device_of(g)
            if dev is not None and dev != meta.device:
                if g.ndim == 0:
                    g = devices.transfer(g, dev, meta.device)
                else:
                    raise RuntimeError(f"{_pfx(prefix)}invalid gradient at index {i} - expected device "
                                       f"{meta.device} but got {dev}")
        grads[i] = g


def _slot_hooks(hooks, grads: list) -> None:
    """Tensor hooks ``(slot, fn)``: ``fn(grad)`` may return a replacement for that slot."""
    for slot, fn in hooks or ():
        r = fn(grads[slot])
        if r is not None:
            grads[slot] = r


def _missing_saved(node, exc: KeyError) -> RuntimeError:
    return RuntimeError(f"{node.name} node {node.id!r} needs saved value {exc.args[0]!r}, "
                        f"which the graph file does not provide")


def _call_function(engine, gt, node, inputs):
    state = gt.state
    grads = inputs.grads
    if not (state.has_hooks or state.half_nodes or gt.faults or node.attrs):
        try:
            outputs = _RULE_FN[node.op](node, grads, gt.ctx)
        except KeyError as exc:
            raise _missing_saved(node, exc) from exc
        if node.op is not _ACC and not (_outputs_match is not None and not engine.devices.real_cuda
                                        and _outputs_match(node.next, outputs, _NP_DTYPES)):
            validate_outputs(node.next, outputs, node, None, engine.devices)
        return outputs
    _tensor_pre_hooks(state, node, grads)
    hooks = state.pre_hooks.get(node)
    if hooks:
        for fn in hooks:
            r = fn(tuple(grads))
            if r is not None:
                grads = list(r)
    if node in state.half_nodes:  # float16/bfloat16: computed in float32, rounded by validate_outputs
        grads = [upcast(g) for g in grads]
    fault = gt.faults.get(node.id) if gt.faults else None
    if fault == "error" or "fail" in node.attrs:
        msg = node.attrs.get("fail") if "fail" in node.attrs else f"injected error in node {node.id!r}"
        raise RuntimeError(str(msg))
    try:
        outputs = _RULE_FN[node.op](node, grads, gt.ctx)
    except KeyError as exc:
        if node.op is PYTHON:
            raise
        raise _missing_saved(node, exc) from exc
    if fault == "nan" or node.attrs.get("nan"):
        xp = gt.xp(node)
        outputs = [None if o is None else xp.full(o.shape, xp.nan, dtype=o.dtype) for o in outputs]
    if node.op is not _ACC:
        validate_outputs(node.next, outputs, node, gt.xp(node) if engine.devices.real_cuda else None,
                         engine.devices)
    hooks = state.post_hooks.get(node)
    if hooks:
        for fn in hooks:
            r = fn(tuple(outputs), tuple(grads))
            if r is not None:
                outputs = list(r)
    return outputs


def _tensor_pre_hooks(state, node, grads: list) -> None:
    """Tensor pre-hooks, then retains-grad hooks, on the node's input slots (PyTorch's order)."""
    _slot_hooks(state.tensor_pre_hooks.get(node), grads)
    _slot_hooks(state.retains_grad_hooks.get(node), grads)


def evaluate_function(engine, gt, node, inputs: InputBuffer):
    """Run one node (see the module docstring); returns whether its task finished the GraphTask (None: unknown)."""
    if node.cpu:
        return _evaluate(engine, gt, node, inputs, None)
    parent = node_stream(node)
    streams = engine.streams
    for _, event in inputs.ready_waits(parent):
        streams.wait(gt, parent, event, node)
    with streams.on_stream(parent):
        return _evaluate(engine, gt, node, inputs, parent)


def _evaluate(engine, gt, node, inputs: InputBuffer, parent):
    tracer = engine.tracer

    exec_info = gt.exec_info
    if exec_info:
        fi = exec_info[node]
        if fi.captures:
            grads = list(inputs.grads)
            if not fi.needed:  # tensor pre-hooks run once: here, or when the node runs
                _tensor_pre_hooks(gt.state, node, grads)
            with gt.lock:
                for slot, idx in fi.captures:
                    gt.captured[idx] = grads[slot]
                if parent is not None:
                    gt.leaf_streams.add(parent)
        if not fi.needed:
            if tracer.enabled:
                tracer.node_skipped(gt, node)
            return None

    if tracer.enabled:
        tracer.node_start(gt, node)
        try:
            outputs = _call_function(engine, gt, node, inputs)
        finally:
            tracer.node_end(gt, node)
    else:
        outputs = _call_function(engine, gt, node, inputs)

    if node.saves_tensors and not gt.keep_graph:
        gt.state.release(node)
    if not outputs:
        if parent is not None:
            with gt.lock:
                gt.leaf_streams.add(parent)
        return None

    if gt.anomaly:
        xp = gt.xp(node)
        for i, out in enumerate(outputs):
            if out is not None and bool(xp.isnan(out).any()):
                if tracer.enabled:
                    tracer.nan_detected(gt, node, i)
                raise RuntimeError(f"Function '{node.name}' returned nan values in its {i}th output.")

    return route(engine, gt, node, outputs, exec_info, tracer, parent)


def route_py(engine, gt, node, outputs, exec_info, tracer, parent) -> bool:
    """Step 7: under the GraphTask lock, hand each output to its next node; push the ready ones.

    Under the same lock it also retires this task (``outstanding -= 1``, which
    the worker loop would otherwise do under a second acquisition) and returns
    whether that finished the GraphTask.

    The simulation calls this same function with its own engine, GraphTask and
    queues (duck-typed: ``engine.default_priority``, ``engine.priority``,
    ``engine.device_queue(i)``, ``engine.streams``; ``gt.lock``,
    ``dependencies``, ``not_ready``, ``outstanding``, ``reentrant_depth``,
    ``cpu_queue``, ``multithreading``; ``queue.push(key, task)``), so a
    simulated schedule makes exactly the engine's decisions. ``route`` is this
    function or its compiled twin (``engine.core``).
    """
    key = None if engine.default_priority else engine.priority.key
    cpu_queue = gt.cpu_queue
    multithreading = gt.multithreading
    if not tracer.enabled:
        gt.lock.acquire()
    elif not gt.lock.acquire(False):  # contended: measure the wait
        t0 = time.perf_counter_ns()
        gt.lock.acquire()
        tracer.lock_wait("GraphTask", gt, time.perf_counter_ns() - t0)
    depth = gt.reentrant_depth  # read under the lock: an expired call's depth changes
    depth_bits = depth << 64
    try:
        deps = gt.dependencies
        not_ready = gt.not_ready
        for e, out in zip(node.next, outputs):
            if e is None:
                continue
            nxt, input_nr = e
            count = deps.get(nxt)
            if count is None:
                raise RuntimeError(f"dependency not found for {nxt.name}")
            if count == 1:
                del deps[nxt]
                ready = True
            else:
                deps[nxt] = count - 1
                ready = False
            buf = not_ready.get(nxt)
            if buf is None:
                if exec_info:
                    fi = exec_info.get(nxt)
                    if fi is None or not fi.should_execute():
                        continue
                buf = InputBuffer(len(nxt.inputs))
                if not ready:
                    not_ready[nxt] = buf
            elif ready:
                del not_ready[nxt]
            if nxt.cpu:
                buf.add(input_nr, out)
            else:
                device = nxt.inputs[input_nr].device
                if device.type == "cpu":
                    buf.add(input_nr, out)
                else:
                    buf.add_on_device(input_nr, out, device, parent, node_stream(nxt), node, nxt,
                                      engine.streams, gt)
            if not ready:
                continue
            gt.outstanding += 1
            queue = cpu_queue if nxt.cpu or not multithreading else engine.device_queue(nxt.device.index)
            queue.push(depth_bits | nxt.seq if key is None else key(depth, nxt), (gt, nxt, buf))
        gt.outstanding -= 1
        return gt.outstanding == 0
    finally:
        gt.lock.release()


#: ``route_py``, or its compiled twin (``engine.core``): the same decisions in the same order.
route = core.route_impl or route_py


def thread_main_py(engine, graph_task) -> None:
    """Run tasks from this thread's queue until ``graph_task`` completes (None: until shutdown).

    The thread-local frame of a task is installed before it runs and kept while this thread runs
    more tasks of the same GraphTask; it is put back before a pop that may block (an empty queue)
    or run Python tracer hooks, before a task of another GraphTask, before the completion and
    skipped-node hooks, and when the loop returns: no Python code outside a task's node ever sees
    it (the compiled loop does the same).
    """
    tls = engine.tls
    queue = tls.queue
    tracer = engine.tracer
    held = None  # the GraphTask whose frame is installed
    prev = None  # the frame that was there before it
    # whether a pop may run Python tracer hooks other than an event log's
    pop_hooks = tracer.enabled and (tracer.event_log is None or tracer.others is not None)
    try:
        while graph_task is None or not graph_task.completed:
            if held is not None and (pop_hooks or queue.empty()):
                tls.frame, held = prev, None
            item = queue.pop(graph_task)
            if item is SHUTDOWN:
                break
            gt, node, buf = item
            if gt.expired:  # its caller returned after a failure: drop the task unseen, as PyTorch does
                continue
            finished = None
            if node is not None:
                if not gt.has_error:
                    if held is not gt:
                        if held is not None:
                            tls.frame = prev
                        prev = tls.frame
                        tls.frame = (gt, (prev is None or prev[1]) and not gt.exec_info)
                        held = gt
                    try:
                        finished = evaluate_function(engine, gt, node, buf)
                    except BaseException as exc:  # captured as a value, re-raised by the caller
                        finished = None
                        engine.on_exception(gt, node, exc)
                elif tracer.enabled:
                    if held is not None:
                        tls.frame, held = prev, None
                    tracer.node_skipped(gt, node)
            if finished is None:  # not retired while routing: retire the task here
                with gt.lock:
                    gt.outstanding -= 1
                    finished = gt.outstanding == 0
            if finished:
                if held is not None:
                    tls.frame, held = prev, None
                engine.mark_completed(gt)
                if tls.worker_device != gt.owner:
                    engine.queue_by_index(gt, gt.owner).push_wakeup(gt)
    finally:
        if held is not None:
            tls.frame = prev


def _direct_rules() -> dict:
    """OpSpec -> formula, for the ops whose runner is ``undefined_passthrough`` around a formula.

    The compiled loop calls the formula itself after the same all-undefined check, saving a frame.
    """
    return {spec: fn.__wrapped__ for spec, fn in RUNNERS.items() if getattr(fn, "undefined_passthrough", False)}


#: ``thread_main_py``, or its compiled twin (``engine.core``), which runs the common node
#: (CPU, no hooks, faults, anomaly mode or requested inputs) without Python frames of its own and
#: every other one through ``evaluate_function``.
if core.thread_main_impl is not None:
    from autograd_run.engine.graph_task import GraphTask as _GraphTask
    from autograd_run.graphs.model import InputMeta as _InputMeta, Node as _Node
    #: Which classes the compiled loop reads at their slot offsets (the rest through getattr).
    DIRECT_READS = core.configure_worker(_Node, _GraphTask, _InputMeta, np.empty((2, 3), np.float32), RUNNERS,
                                         _direct_rules(), _ACC, _NP_DTYPES, validate_outputs, _missing_saved,
                                         evaluate_function, thread_main_py)
thread_main = core.thread_main_impl or thread_main_py
