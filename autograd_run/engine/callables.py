"""Python callables shipped for ``python`` nodes (still run only with ``--allow-python``).

``checkpoint``: the reentrant pattern of ``torch.utils.checkpoint`` (the
reentrant variant). The node's ``attrs.segment_root`` names the root of a
separate segment graph and ``attrs.segment_input`` the node whose input
gradient is the segment's result; the callable runs a nested ``grad`` call
over the segment with the incoming gradient and returns what it captured.
As PyTorch's, it refuses to run inside a call with requested inputs
(``grad()`` or ``backward(inputs=)``), where checkpoints are not valid.

``autograd_function``: a custom ``torch.autograd.Function`` captured with
its state (``autograd_run.capture.inner.function_state``): imports the class
``attrs.function`` names and calls its ``backward`` with a stand-in ctx that
holds the saved tensors, the attributes the forward set, ``needs_input_grad``
and ``materialize_grads``; gradients go in and come out as torch tensors
(torch is needed to replay such a node).
"""

from __future__ import annotations

import threading


#: PyTorch's text (torch.utils.checkpoint, reentrant variant) when checkpointing is not valid.
ERR_CHECKPOINT_INVALID = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing an `inputs` "
    "parameter to .backward(). To resolve this error, you can either set use_reentrant=False, or call "
    ".backward() without passing the `inputs` argument."
)


def checkpoint(ctx, grads):
    if not ctx.engine.is_checkpoint_valid():
        raise RuntimeError(ERR_CHECKPOINT_INVALID)
    node = ctx.node
    root = ctx.edge(node.attrs["segment_root"], 0)
    target = ctx.edge(node.attrs["segment_input"], 0)
    (captured,) = ctx.grad([root], [grads[0]], inputs=[target])
    return [captured if e is not None else None for e in node.next]


class _FunctionCtx:
    """What a custom Function's backward reads from its ctx, rebuilt from the graph file."""

    def __init__(self, saved_tensors, attrs, needs_input_grad, materialize_grads):
        self.saved_tensors = saved_tensors
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = materialize_grads
        for name, value in attrs.items():
            setattr(self, name, value)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)


def _ctx_value(torch, v):
    """A ``attrs.ctx`` value back as the Python value the forward set (``function_state`` wrote it)."""
    if isinstance(v, dict):
        if "float" in v:
            return float(v["float"])
        if "dtype" in v:
            return getattr(torch, str(v["dtype"]))
        items = v.get("dict")
        if isinstance(items, list) and all(isinstance(kv, list) and len(kv) == 2 and
                                           (kv[0] is None or isinstance(kv[0], (bool, int, str))) for kv in items):
            return {k: _ctx_value(torch, x) for k, x in items}
    if isinstance(v, list):
        return tuple(_ctx_value(torch, x) for x in v)
    return v


#: Scripts loaded for python nodes (path -> module), each once per process.
_SCRIPTS: dict = {}
_SCRIPTS_LOCK = threading.Lock()  # guards _SCRIPTS (device threads may replay python nodes at once)


def _script_module(ctx, script):
    """The module of the script a custom Function was defined in (``capture SCRIPT:FUNC``): its top level run
    again (its ``if __name__ == "__main__"`` part not), from the recorded path or, when the graph moved, from
    the graph file's folder."""
    import importlib.util
    import os
    path = str(script)
    if not os.path.isfile(path):
        base = getattr(ctx.graph, "base_dir", None)
        moved = os.path.join(base, os.path.basename(path)) if base else None
        if not moved or not os.path.isfile(moved):
            raise RuntimeError(f"the script its custom Function was defined in, {path!r}, "
                               "is not there (nor beside the graph file)")
        path = moved
    with _SCRIPTS_LOCK:
        mod = _SCRIPTS.get(path)
        if mod is None:
            spec = importlib.util.spec_from_file_location(f"autograd_run_script_{len(_SCRIPTS)}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _SCRIPTS[path] = mod
    return mod


def autograd_function(ctx, grads):
    import importlib

    import numpy as np
    import torch
    node = ctx.node
    attrs = node.attrs
    mod, _, qual = str(attrs["function"]).partition(":")
    cls = _script_module(ctx, attrs["script"]) if attrs.get("script") else importlib.import_module(mod)
    for part in qual.split("."):
        cls = getattr(cls, part)
    library = bool(attrs.get("library_op"))  # a torch.library custom op: its registered backward function
    saved = ctx.saved
    count = int(attrs.get("saved_count", 0))

    def tensor(a):
        if a is None:
            return None
        host = a.get() if hasattr(a, "get") else a  # a cupy array: through the host
        return torch.from_numpy(np.array(host, copy=True))
    saved_tensors = tuple(tensor(saved.get(f"saved_tensors.{k}")) for k in range(count))
    values = {name: _ctx_value(torch, v) for name, v in (attrs.get("ctx") or {}).items()}
    values.update({k[len("ctx."):]: tensor(v) for k, v in saved.items() if k.startswith("ctx.")})
    materialize = bool(attrs.get("materialize_grads", True))
    needs = tuple(attrs.get("needs_input_grad") or ())
    # torch.library's generated backward hides its trailing metadata input from the registered function
    fctx = _FunctionCtx(saved_tensors, values, needs[:-1] if library and needs else needs, materialize)
    ins = []
    for k, g in enumerate(grads):
        if g is None and materialize:
            meta = node.inputs[k]
            g = np.zeros(meta.shape, dtype=np.dtype(meta.dtype) if meta.dtype != "bfloat16" else np.float32)
        ins.append(tensor(g))
    with torch.no_grad():
        out = cls(fctx, *ins) if library else cls.backward(fctx, *ins)
    if not isinstance(out, tuple):
        out = (out,)
    result = []
    for t in out[:len(node.next)]:
        result.append(t.detach().numpy() if isinstance(t, torch.Tensor) else None)
    result += [None] * (len(node.next) - len(result))
    return result
