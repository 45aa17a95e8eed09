"""Test helpers: PyTorch graphs into our format (through the product's capture), PyTorch's order."""

from __future__ import annotations

from autograd_run.capture.graph import from_torch, walk_grad_fns
from builders import graph, run_traced


def capture(outputs, grad_outputs=None, leaves=None, inputs=None, mode="backward"):
    """Our graph document for the backward of ``outputs``, tensors inline, no reference run."""
    check_outputs(outputs)
    return from_torch(outputs, inputs, grad_outputs=grad_outputs, names=leaves, mode=mode, reference=False)


def check_outputs(outputs) -> None:
    """Each PyTorch node behind ``outputs`` has as many next functions as its op declares outputs.

    Ops whose count is read per node (``Outputs``: cat's saved sizes, ...) are checked when the
    captured file loads: capture copies ``next_functions`` edge for edge into ``next``. Each rule
    then returns exactly that many gradients when the graph runs: the loader refuses another count
    of next edges, and the engine's ``validate_outputs`` another count of gradients.
    """
    from autograd_run.ops import lookup
    for fn in walk(outputs):
        spec = lookup(fn.name())
        if spec is not None and not spec.engine and type(spec.outputs) is int:
            n = len(fn.next_functions)
            assert n == spec.outputs, f"PyTorch's {fn.name()} has {n} next functions; {spec.name} declares {spec.outputs}"


def walk(outputs):
    return walk_grad_fns([o.grad_fn for o in outputs])


def torch_order(outputs, grad_outputs=None, inputs=None, mode="backward"):
    """PyTorch's executed order as (name, seq) pairs, recorded with node pre-hooks."""
    import torch
    order, handles = [], []
    for fn in walk(outputs):
        handles.append(fn.register_prehook(lambda g, fn=fn: order.append((fn.name(), fn._sequence_nr()))))
    grad_outputs = grad_outputs or [torch.ones_like(o) for o in outputs]
    with torch.autograd.set_multithreading_enabled(False):
        if mode == "grad":
            torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
        else:
            torch.autograd.backward(outputs, grad_outputs, retain_graph=True, inputs=inputs)
    for h in handles:
        h.remove()
    return order


def our_order(doc, multithreading=False):
    """Our executed order as (name, seq) pairs, the run's result and the loaded graph."""
    from autograd_run.record.order_recorder import OrderRecorder
    g = graph(doc)
    rec = OrderRecorder()
    res = run_traced(g, rec, multithreading=multithreading, retain_graph=True)
    return [(r.name, r.seq) for r in rec.executed()], res, g
