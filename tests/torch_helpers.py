"""Test helpers: turn a real PyTorch backward graph into our format, and record PyTorch's order.

This is the test suite's own small capture (the product's capture command is
a separate feature); it walks ``grad_fn`` the way PyTorch's engine sees it.
"""

from __future__ import annotations

import numpy as np

from autograd_run.graphs.ops import op_from_string

torch = None


def _torch():
    global torch
    if torch is None:
        import torch as t
        torch = t
    return torch


def _value(v):
    t = _torch()
    if isinstance(v, t.Tensor):
        arr = v.detach().cpu().numpy()
        return {"data": arr.tolist(), "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float, str)):
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return None


def walk(roots):
    """All grad_fn nodes reachable from the root tensors' grad_fns, in DFS order."""
    seen, out, stack = set(), [], [r.grad_fn for r in roots]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        for nf, _ in reversed(fn.next_functions):
            stack.append(nf)
    return out


def capture(outputs, grad_outputs=None, leaves=None, inputs=None, mode="backward", opaque_all=False):
    """Our graph dict for the backward of ``outputs`` (one root per output)."""
    t = _torch()
    names = {id(v): k for k, v in (leaves or {}).items()}
    fns = walk(outputs)
    ids = {fn: f"n{i}" for i, fn in enumerate(fns)}
    variables, nodes = [], []
    for fn in fns:
        name = fn.name()
        metas = []
        for m in fn._input_metadata:
            metas.append({"shape": list(m.shape), "dtype": str(m.dtype).replace("torch.", ""),
                          "device": str(m.device)})
        d = {"id": ids[fn], "name": name, "seq": fn._sequence_nr(), "inputs": metas,
             "next": [None if nf is None else [ids[nf], nr] for nf, nr in fn.next_functions]}
        if name == "torch::autograd::AccumulateGrad":
            var = fn.variable
            vname = names.get(id(var), f"leaf_{ids[fn]}")
            d["variable"] = vname
            del d["next"]
            d.pop("seq")
            variables.append({"name": vname, "shape": list(var.shape),
                              "dtype": str(var.dtype).replace("torch.", "")})
        else:
            if opaque_all or op_from_string(name) is None:
                d["op"] = "opaque"
            saved = {}
            for attr in dir(fn):
                if attr.startswith("_saved_"):
                    try:
                        v = _value(getattr(fn, attr))
                    except Exception:
                        continue
                    if v is not None:
                        saved[attr[len("_saved_"):]] = v
            if saved:
                d["saved"] = saved
        nodes.append(d)
    roots = []
    grad_outputs = grad_outputs or [None] * len(outputs)
    for out, g in zip(outputs, grad_outputs):
        roots.append({"node": ids[out.grad_fn], "input_nr": out.output_nr,
                      "grad": "ones" if g is None else {"data": g.detach().numpy().tolist(), "shape": list(g.shape),
                                                        "dtype": str(g.dtype).replace("torch.", "")}})
    doc = {"format": "autograd-graph/1", "mode": mode, "roots": roots, "variables": variables, "nodes": nodes}
    if inputs:
        doc["inputs"] = [names[id(x)] for x in inputs]
    return doc


def torch_order(outputs, grad_outputs=None, inputs=None, mode="backward"):
    """PyTorch's executed order as (name, seq) pairs, recorded with node pre-hooks."""
    t = _torch()
    order, handles = [], []
    for fn in walk(outputs):
        handles.append(fn.register_prehook(lambda g, fn=fn: order.append((fn.name(), fn._sequence_nr()))))
    grad_outputs = grad_outputs or [t.ones_like(o) for o in outputs]
    with t.autograd.set_multithreading_enabled(False):
        if mode == "grad":
            t.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True, allow_unused=True)
        else:
            t.autograd.backward(outputs, grad_outputs, retain_graph=True, inputs=inputs)
    for h in handles:
        h.remove()
    return order


def our_order(doc, multithreading=False):
    from autograd_run.engine import Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.traces.order import OrderRecorder
    g = loads_graph(dumps(doc, "json"), "captured.json")
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=multithreading)
    try:
        res = run_graph(eng, g, retain_graph=True)
    finally:
        eng.shutdown()
    order = [(r.name, r.seq) for r in rec.records if r.name != "GraphRoot"]
    return order, res, g
