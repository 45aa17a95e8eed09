"""Capture a real PyTorch backward graph into a graph file, with PyTorch's own reference run.

``from_torch(outputs, inputs=None, grad_outputs=None, names=None, path=None)``
walks ``grad_fn`` from the outputs: each node's name, ``_sequence_nr()``,
``next_functions``, input metadata (shape, dtype, device) and saved values
(the ``_saved_*`` attributes; tensors go to an ``.npz`` side file beside
``path``, so the replay computes real gradients). Nodes without a backward
rule here are captured as ``opaque`` with their shapes. AccumulateGrad
nodes carry their leaf's name (from ``names``, else ``leaf<k>``).

It then runs PyTorch's own backward once (multithreading off, node
pre-hooks on every node) and stores PyTorch's reference in ``meta.reference``:
the executed order as ``[name, seq, leaf]`` and the leaf gradients. Leaves'
``.grad`` are left as they were.

torch is optional: it is imported only here (``pip install autograd-run[torch]``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from autograd_run.graphs.model import FORMAT
from autograd_run.ops import OPAQUE, lookup

ACC = "torch::autograd::AccumulateGrad"
_TORCH_DTYPES = {"float16", "float32", "float64", "complex64", "complex128",
                 "bool", "int8", "int16", "int32", "int64", "uint8"}


def _torch():
    try:
        import torch
    except ImportError as exc:  # torch is an optional extra
        raise RuntimeError("capturing needs PyTorch: pip install 'autograd-run[torch]'") from exc
    return torch


def _dtype(t) -> str:
    return str(t).replace("torch.", "")


def walk_grad_fns(roots) -> list:
    """Every grad_fn node reachable from ``roots`` (grad_fns), depth first, each once."""
    seen, out, stack = set(), [], list(reversed(roots))
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        for nf, _ in reversed(fn.next_functions):
            stack.append(nf)
    return out


class _Arrays:
    """Tensors to store: inline (no path) or in the side file."""

    def __init__(self, inline: bool):
        self.inline = inline
        self.arrays: dict[str, np.ndarray] = {}

    def put(self, key: str, t) -> dict:
        arr = t.detach().cpu()
        dt = _dtype(arr.dtype)
        if dt not in _TORCH_DTYPES:
            raise ValueError(f"cannot capture a tensor of dtype {dt} ({key})")
        arr = arr.numpy()
        if self.inline:
            return {"data": arr.tolist(), "shape": list(arr.shape), "dtype": dt}
        self.arrays[key] = np.ascontiguousarray(arr)
        return {"npz": key}


def _tensors(torch, value, what: str, allow_none: bool = False) -> list:
    """``value`` (a tensor or a list/tuple of them) as a list; a ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, torch.Tensor):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a tensor or a list of tensors, got {type(value).__name__}")
    for k, t in enumerate(value):
        if not (isinstance(t, torch.Tensor) or (allow_none and t is None)):
            raise ValueError(f"{what}[{k}] must be a tensor, got {type(t).__name__}")
    return list(value)


def _saved_value(torch, v, key: str, arrays: _Arrays):
    if isinstance(v, torch.Tensor):
        return arrays.put(key, v)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    if isinstance(v, torch.dtype):
        return _dtype(v)
    return None  # options, devices, layouts, symbolic values: not needed by any rule


def from_torch(outputs, inputs: Sequence | None = None, *, grad_outputs: Sequence | None = None,
               names: Mapping[str, Any] | None = None, path: str | None = None,
               mode: str | None = None, reference: bool = True) -> dict:
    """Capture the backward graph of ``outputs``; write it to ``path`` (JSON or YAML) when given.

    Returns the graph document. ``inputs`` requests gradients for those tensors
    (``mode`` then defaults to ``grad``, as ``torch.autograd.grad``).
    """
    torch = _torch()
    outputs = _tensors(torch, outputs, "outputs")
    if not outputs:
        raise ValueError("outputs: no tensors to capture the backward graph of")
    for k, o in enumerate(outputs):
        if o.grad_fn is None:
            what = f"output {k}" if len(outputs) > 1 else "the output"
            if o.requires_grad:
                raise ValueError(f"{what} is a leaf tensor (it requires grad, but no operation made it): "
                                 "there is no backward graph to capture; return a result computed from it")
            raise ValueError(f"{what} does not require grad: nothing it was computed from requires grad "
                             "(or it was made under torch.no_grad()), so it has no backward graph")
    grad_outputs = (_tensors(torch, grad_outputs, "grad_outputs", allow_none=True) if grad_outputs is not None
                    else [None] * len(outputs))
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad_outputs: {len(grad_outputs)} given for {len(outputs)} output(s)")
    if inputs is not None:
        inputs = _tensors(torch, inputs, "inputs")
    mode = mode or ("grad" if inputs else "backward")
    if names is not None and not isinstance(names, Mapping):
        raise ValueError(f"names must be a mapping of names to leaf tensors, got {type(names).__name__}")
    names = dict(names or {})
    for n, t in names.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"names[{n!r}] must be a tensor, got {type(t).__name__}")
    leaf_name = {id(t): n for n, t in names.items()}
    arrays = _Arrays(inline=path is None)

    fns = walk_grad_fns([o.grad_fn for o in outputs])
    ids = {fn: f"n{i}" for i, fn in enumerate(fns)}
    nodes, variables, var_of = [], [], {}
    for fn in fns:
        nid = ids[fn]
        name = fn.name()
        metas = [{"shape": list(m.shape), "dtype": _dtype(m.dtype), "device": str(m.device)}
                 for m in fn._input_metadata]
        for m in metas:
            if m["device"].startswith("cuda") and ":" not in m["device"]:
                m["device"] = "cuda:0"
        d: dict[str, Any] = {"id": nid, "name": name}
        if name == ACC:
            var = fn.variable
            vname = leaf_name.get(id(var)) or f"leaf{len(variables)}"
            var_of[fn] = vname
            d["variable"] = vname
            variables.append({"name": vname, "shape": list(var.shape), "dtype": _dtype(var.dtype),
                              "device": metas[0]["device"] if metas else "cpu"})
        else:
            d["seq"] = fn._sequence_nr()
            d["next"] = [None if nf is None else [ids[nf], nr] for nf, nr in fn.next_functions]
            op = lookup(name)
            reason = None
            if op is None or op.engine:  # PyTorch's own nodes never run as one of our synthetic kinds
                op, reason = None, f"no backward rule for {name}"
            saved = {}
            if op is not None:
                for attr in dir(fn):
                    if attr.startswith("_saved_"):
                        field = attr[len("_saved_"):]
                        try:
                            v = getattr(fn, attr)
                        except RuntimeError:
                            continue  # already freed, or not saved for this call
                        v = _saved_value(torch, v, f"{nid}.{field}", arrays)
                        if v is not None:
                            saved[field] = v
            if op is not None and op.unsupported is not None:
                reason = op.unsupported(saved)  # a variant of the op without a rule here
            attrs = {}
            if reason:
                d["op"] = OPAQUE.name
                attrs["reason"] = reason
            if saved:
                d["saved"] = saved
            trace = fn.metadata.get("traceback_") if hasattr(fn, "metadata") else None
            if trace:
                attrs["trace"] = "".join(trace) if isinstance(trace, list) else str(trace)
            if attrs:
                d["attrs"] = attrs
        d["inputs"] = metas
        nodes.append(d)

    roots = []
    for k, (o, g) in enumerate(zip(outputs, grad_outputs)):
        grad = "ones" if g is None else arrays.put(f"root{k}", g)
        roots.append({"node": ids[o.grad_fn], "input_nr": o.output_nr, "grad": grad})
    doc: dict[str, Any] = {"format": FORMAT, "mode": mode, "roots": roots, "variables": variables}
    req = []
    if inputs:
        acc_of = {id(fn.variable): fn for fn in var_of}
        for t in inputs:
            if t.grad_fn is None and id(t) in acc_of:
                req.append(var_of[acc_of[id(t)]])
            elif t.grad_fn is not None and t.grad_fn in ids:
                if t.output_nr != 0:
                    raise ValueError("requested inputs that are a node's output other than 0 are not supported")
                req.append(ids[t.grad_fn])
            else:
                raise ValueError("a requested input is not part of the graph")
        doc["inputs"] = req
    if reference:
        doc["meta"] = {"reference": _reference(torch, outputs, grad_outputs, inputs, req, mode, fns, var_of, arrays)}
    doc["nodes"] = nodes
    if path is not None:
        _write(doc, arrays, path)
    return doc


def _reference(torch, outputs, grad_outputs, inputs, input_names, mode, fns, var_of, arrays) -> dict:
    """Run PyTorch's backward once, recording order and leaf gradients; leaves' .grad are restored."""
    order, handles = [], []
    for fn in fns:
        leaf = var_of.get(fn)
        handles.append(fn.register_prehook(
            lambda g, fn=fn, leaf=leaf: order.append([fn.name(), fn._sequence_nr(), leaf])))
    gos = [torch.ones_like(o) if g is None else g for o, g in zip(outputs, grad_outputs)]
    grads = {}
    try:
        with torch.autograd.set_multithreading_enabled(False):
            if mode == "grad":
                res = torch.autograd.grad(outputs, list(inputs), gos, retain_graph=True, allow_unused=True)
                grads = dict(zip(input_names, res))
            else:
                leaves = {fn: fn.variable for fn in var_of}
                before = {fn: v.grad for fn, v in leaves.items()}
                for v in leaves.values():
                    v.grad = None
                try:
                    torch.autograd.backward(outputs, gos, retain_graph=True, inputs=list(inputs) if inputs else None)
                    grads = {var_of[fn]: v.grad for fn, v in leaves.items()}
                finally:
                    for fn, v in leaves.items():
                        v.grad = before[fn]
    finally:
        for h in handles:
            h.remove()
    ref_grads = {}
    for k, g in grads.items():
        key = f"ref.{k}"
        ref_grads[str(k)] = None if g is None else arrays.put(key, g)
    return {"torch": str(torch.__version__), "order": order, "grads": ref_grads}


def _write(doc: dict, arrays: _Arrays, path: str) -> None:
    from autograd_run.graphs.dump import dumps
    fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    if arrays.arrays:
        side = os.path.splitext(path)[0] + ".npz"
        np.savez(side, **arrays.arrays)
    with open(path, "wb") as f:
        f.write(dumps(doc, fmt))
