"""A small sequential reference executor: the test oracle for the engine.

Kahn's algorithm on one thread with one ready heap and the same priority
and tie-breaking as the engine (libstdc++'s heap via ``ReadyQueue``), no
device queues, no locks, no reentrancy. What it computes (order, gradients)
is what the engine must compute with multithreading off; with several
devices each device's own sequence must be a valid order of the same
dependency graph.
"""

from __future__ import annotations

import numpy as np

from autograd_run.engine.builtin_nodes import RUNNERS, EngineContext, make_graph_root
from autograd_run.ops.dtypes import upcast
from autograd_run.engine.priority import PyTorchPriority
from autograd_run.engine.ready_queue import ReadyQueue
from autograd_run.engine.worker import validate_outputs
from autograd_run.ops import ACCUMULATE_GRAD


def _numpy(node):
    return np


def _no_transfer(array, src, dst):
    return array


def reference_backward(state, roots, grads, *, inputs=None, accumulate_grad=True,
                       retain_graph=False, create_graph=False, priority=None, execute=True) -> tuple[list, list]:
    """Run a backward call sequentially; returns (executed nodes in order, captured grads).

    ``execute=False`` only schedules: no node's function runs (the order that
    ``get_current_graph_task_execution_order`` predicts).
    """
    key = (priority or PyTorchPriority()).key
    keep_graph = retain_graph or create_graph
    ctx = EngineContext(state.saved, _numpy, _no_transfer, create_graph, state=state)
    if len(roots) == 1:
        root = roots[0].node
        start = [None] * len(root.inputs)
        start[roots[0].input_nr] = grads[0]
    else:
        root = make_graph_root(roots, grads, state.next_seq())
        start = []
    deps: dict = {}
    stack, seen = [root], set()
    while stack:
        fn = stack.pop()
        for e in fn.next:
            if e is not None:
                deps[e.node] = deps.get(e.node, 0) + 1
                if e.node not in seen:
                    seen.add(e.node)
                    stack.append(e.node)
    # With requested inputs: which nodes lie on a path to one (plain reachability,
    # post-order), which of them run, and where grad() captures.
    runs = None      # None: everything reachable runs
    pushed = None    # nodes that get a task (run, or only capture)
    captures: dict = {}
    if inputs:
        for i, e in enumerate(inputs):
            captures.setdefault(e.node, []).append((e.input_nr, i))
        post, visited, stack = [], {root}, [(root, 0)]
        while stack:
            fn, k = stack[-1]
            if k < len(fn.next):
                stack[-1] = (fn, k + 1)
                e = fn.next[k]
                if e is not None and e.node not in visited:
                    visited.add(e.node)
                    stack.append((e.node, 0))
            else:
                stack.pop()
                post.append(fn)
        on_path = set()
        for fn in post:
            if fn in captures or any(e is not None and e.node in on_path for e in fn.next):
                on_path.add(fn)
        # backward(inputs=) runs the inputs' nodes; grad() only captures there,
        # unless the node also leads to another requested input.
        runs = {fn for fn in on_path if accumulate_grad or fn not in captures
                or any(e is not None and e.node in on_path for e in fn.next)}
        runs.add(root)
        pushed = runs | set(captures)
        if accumulate_grad:
            captures = {}
    captured = [None] * (len(inputs) if inputs and not accumulate_grad else 0)
    buffers: dict = {root: start}
    heap = ReadyQueue("reference")
    heap.push(key(0, root), (None, root, None))
    executed = []
    while len(heap):
        _, fn, _ = heap.pop()
        grads_in = buffers.pop(fn)
        for slot, idx in captures.get(fn, ()):
            captured[idx] = grads_in[slot]
        if runs is not None and fn not in runs:
            continue
        executed.append(fn)
        if not execute:
            outs = [None] * len(fn.next)
        else:
            grads = list(grads_in)
            if fn in state.half_nodes:  # float16/bfloat16: computed in float32, rounded by validate_outputs
                grads = [upcast(g) for g in grads]
            outs = RUNNERS[fn.op](fn, grads, ctx)
            if fn.op is not ACCUMULATE_GRAD:
                validate_outputs(fn.next, outs, f"Function {fn.name} returned an ")
            if not keep_graph:
                state.release(fn)
        for i, out in enumerate(outs):
            e = fn.next[i]
            if e is None:
                continue
            nxt = e.node
            deps[nxt] -= 1
            if pushed is not None and nxt not in pushed:
                continue
            buf = buffers.setdefault(nxt, [None] * len(nxt.inputs))
            if out is not None:
                buf[e.input_nr] = out if buf[e.input_nr] is None else buf[e.input_nr] + out
            if deps[nxt] == 0:
                heap.push(key(0, nxt), (None, nxt, None))
    return executed, captured
