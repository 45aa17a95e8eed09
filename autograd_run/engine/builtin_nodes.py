"""The node kinds the engine implements itself, and the context every node runs with.

``RUNNERS`` maps each ``OpSpec`` to the function that runs it: the op's
own backward formula (``autograd_run.ops``), or for the engine's own kinds
(``ops.engine_ops``) the functions below: AccumulateGrad, GraphRoot,
identity, cost, opaque, python and checkpoint nodes. An import-time check makes sure
every declared op has exactly one runner.

``EngineContext`` is the ``RuleContext`` a node sees when the engine (or
the reference executor) runs it; op formulas use only the narrow
``RuleContext`` part, the engine's own kinds also reach the run state and
(python nodes) the GraphTask. ``make_graph_root`` builds the synthetic
root of a backward call with several roots, for the engine and the
reference executor alike.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from autograd_run.engine import core, waits
from autograd_run.graphs.model import CPU, InputMeta, Node
from autograd_run.ops import (
    ACCUMULATE_GRAD, CHECKPOINT, COST, GRAPH_ROOT, IDENTITY, OPAQUE, PYTHON, REGISTRY, RuleContext,
)
from autograd_run.ops.arrays import each, out_meta


@dataclass(slots=True)
class EngineContext(RuleContext):
    """A RuleContext plus what the engine's own node kinds need."""

    #: The ``GraphState`` (variable gradients for AccumulateGrad, python callables).
    state: Any = None
    #: The running GraphTask (python nodes re-enter the engine through it); None in the reference executor.
    graph_task: Any = None
    allow_python: bool = False


def make_graph_root(roots, grads, seq: int) -> Node:
    """The GraphRoot of a backward call with several roots: one output per root edge.

    As PyTorch's, its inputs describe the root gradients (on the caller's
    current stream, 0), so it runs on the first accelerator device among
    them (else the CPU); its topological number is one above its highest root's.
    """
    metas = [InputMeta(m.shape, m.dtype, m.device, 0) for m in (e.node.inputs[e.input_nr] for e in roots)]
    root = Node("GraphRoot", "GraphRoot", GRAPH_ROOT, seq, list(roots), metas, attrs={"grads": list(grads)})
    root.topo_nr = 1 + max((e.node.topo_nr for e in roots), default=-1)
    device = next((m.device for m in metas if m.device.type != "cpu"), CPU)
    root.device, root.stream, root.cpu = device, 0, device.type == "cpu"
    return root


def accumulate_grad_py(node, grads, ctx):
    """AccumulateGrad: the gradient added into its variable's (``GraphState.accumulate``); no outputs."""
    g = grads[0]
    if g is not None:
        ctx.state.accumulate(node.variable, g, ctx.create_graph)
    return []


#: The compiled twin takes the state's lock and adds without a Python frame (the MLP's 80,001 leaves).
accumulate_grad = core.accumulate_grad or accumulate_grad_py


def graph_root(node, grads, ctx):
    return list(node.attrs["grads"])


def identity(node, grads, ctx):
    return each(node, lambda i: grads[0])


def opaque(node, grads, ctx):
    """No rule is known: zeros of the shapes the consumers declare (after the node's measured time, if any)."""
    state = ctx.state
    if state is not None and state.measured_ns:
        ns = state.measured_ns.get(node)
        if ns:
            waits.wait(ns * 1e-9)
    return _zeros(node, ctx)


def _zeros(node, ctx):
    xp = ctx.xp(node)
    return each(node, lambda i: xp.zeros(out_meta(node, i).shape, dtype=out_meta(node, i).dtype))


#: Default throughput a ``spin``/``sleep`` cost node assumes to turn FLOPs into time.
COST_FLOPS_PER_SECOND = 1e9


def cost(node, grads, ctx):
    """Do real work for the node's declared cost, then emit zeros of the consumers' shapes.

    ``attrs.cost``: ``{"us": microseconds}`` or ``{"flops": count}``, and
    ``mode``: ``spin`` (busy loop, holds the GIL, as Python code does), ``wait``
    (occupies the worker without the GIL, to the µs, as a C++ kernel does),
    ``sleep`` (a plain sleep) or ``matmul`` (a square float32 matmul of that
    many FLOPs, releases the GIL). The default is ``wait`` on an accelerator
    device and ``spin`` on the CPU.
    """
    spec = node.attrs.get("cost") or {}
    mode = spec.get("mode") or ("spin" if node.cpu else "wait")
    if "us" in spec:
        seconds = float(spec["us"]) * 1e-6
        flops = seconds * COST_FLOPS_PER_SECOND
    else:
        flops = float(spec.get("flops", 0))
        seconds = flops / COST_FLOPS_PER_SECOND
    gt = ctx.graph_task
    stopped = (lambda: gt.has_error) if gt is not None else None  # the call failed or was stopped: stop early
    if mode == "matmul" and flops > 0:
        n = max(1, int(round((flops / 2) ** (1 / 3))))
        a = ctx.xp(node).ones((n, n), dtype=np.float32)
        a @ a
    elif mode == "sleep":
        waits.sleep(seconds, stopped)
    elif mode == "wait":
        waits.wait(seconds, stopped)
    elif seconds > 0:
        waits.spin(seconds, stopped)
    return _zeros(node, ctx)


def python(node, grads, ctx):
    """A Python callable ``fn(ctx, grads) -> grads``; it may call the engine again (reentrant)."""
    fn = ctx.state.python_fns.get(node)
    if fn is None:
        target = node.attrs.get("callable")
        if not ctx.allow_python:
            raise RuntimeError(
                f"node {node.id!r} runs Python code ({target!r}); pass --allow-python to allow it")
        if not isinstance(target, str) or ":" not in target:
            raise RuntimeError(f"node {node.id!r}: attrs.callable must be 'module:function'")
        mod, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(mod), attr)
    if ctx.graph_task is None:
        raise RuntimeError(f"node {node.id!r}: python nodes run only in the engine")
    from autograd_run.engine.reentrant_ctx import PythonNodeContext
    out = fn(PythonNodeContext(ctx.graph_task, node), list(grads))
    return list(out) if out is not None else [None] * len(node.next)


def checkpoint(node, grads, ctx):
    """A reentrant checkpoint: a nested backward over the recomputed graph, then its inputs' gradients.

    ``attrs.inner``: ``roots`` (one ``[node, input_nr]`` or null per input slot
    of this node: the recomputed outputs' nodes), ``inputs`` (one variable
    name or null per next edge: the recomputation's detached inputs, whose
    gradients are this node's outputs), ``mode`` (``backward``, the default:
    they accumulate into those variables, as ``torch.autograd.backward``; or
    ``grad``: they are captured, as ``torch.autograd.grad``) and
    ``checkpoint`` (default true: ``torch.utils.checkpoint``'s node, which
    refuses to run where checkpoints are not valid, inside ``grad()`` or
    ``inputs=``; false for another custom Function whose backward makes a
    nested call). An undefined incoming gradient is passed on as zeros, as
    PyTorch materialises it for a custom Function. The recomputed graph is
    kept (``retain_graph``): PyTorch recomputes it on every pass.
    """
    from autograd_run.engine.callables import ERR_CHECKPOINT_INVALID
    from autograd_run.graphs.model import Edge
    from autograd_run.ops.dtypes import np_dtype
    gt = ctx.graph_task
    if gt is None:
        raise RuntimeError(f"node {node.id!r}: checkpoint nodes run only in the engine")
    engine = gt.engine
    inner = node.attrs["inner"]
    if inner.get("checkpoint", True) and not engine.is_checkpoint_valid():
        raise RuntimeError(ERR_CHECKPOINT_INVALID)
    by_id = ctx.state.graph.by_id
    roots, root_grads = [], []
    for slot, ref in enumerate(inner["roots"]):
        if ref is not None:
            g = grads[slot]
            if g is None:
                meta = node.inputs[slot]
                g = ctx.xp(node).zeros(meta.shape, dtype=np_dtype(meta.dtype))
            roots.append((by_id[ref[0]], ref[1]))
            root_grads.append(g)
    if not roots:
        raise RuntimeError("none of output has requires_grad=True, this checkpoint() is not necessary")
    state = ctx.state
    names = inner["inputs"]
    kw = dict(retain_graph=True, create_graph=gt.create_graph, anomaly=gt.anomaly, faults=gt.faults)
    if inner.get("mode", "backward") == "grad":
        wanted = [name for name in names if name is not None]
        edges = [Edge(state.graph.variables[name].node, 0) for name in wanted]
        got = dict(zip(wanted, engine.execute(state, roots, root_grads, accumulate_grad=False, inputs=edges, **kw)))
        return [None if e is None or name is None else got[name] for e, name in zip(node.next, names)]
    for name in names:
        if name is not None:
            state.grads[name] = None
    engine.execute(state, roots, root_grads, **kw)
    out = []
    for e, name in zip(node.next, names):
        out.append(None if e is None or name is None else state.grads.get(name))
    for name in names:
        if name is not None:
            state.grads[name] = None
    return out


_BUILTIN = {ACCUMULATE_GRAD: accumulate_grad, GRAPH_ROOT: graph_root, IDENTITY: identity, COST: cost,
            OPAQUE: opaque, PYTHON: python, CHECKPOINT: checkpoint}


def _runners() -> dict:
    table = {}
    for spec in REGISTRY:
        if spec.engine:
            if spec not in _BUILTIN:
                raise RuntimeError(f"engine op {spec.name} is declared but not implemented")
            table[spec] = _BUILTIN[spec]
        else:
            table[spec] = spec.backward
    extra = set(_BUILTIN) - set(table)
    if extra:
        raise RuntimeError(f"implemented but not declared: {sorted(s.name for s in extra)}")
    return table


#: OpSpec -> ``fn(node, grads, ctx) -> list``: every op, exactly once.
RUNNERS = _runners()
