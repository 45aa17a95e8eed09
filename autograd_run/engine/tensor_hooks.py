"""Tensor hooks held as data: a leaf's ``register_hook`` transforms, replayed as tensor pre-hooks.

PyTorch runs the hooks registered on a leaf tensor (``w.register_hook(fn)``)
as tensor pre-hooks of its AccumulateGrad node, in registration order, before
the gradient is accumulated; a hook's result replaces the gradient. A graph
file holds such hooks on the variable (``variables[i].hooks``, checked by
``graphs.validate``), one mapping per hook:

``{"kind": "scale", "by": c}``
    ``g * c``;
``{"kind": "clamp", "min": lo, "max": hi}``
    ``g.clamp(lo, hi)`` (either bound may be absent: the gradient-value
    clipping pattern, ``clip_grad_value_`` done per tensor);
``{"kind": "clip_norm", "max_norm": m, "norm_type": p, "eps": e}``
    ``g * min(1, m / (||g||_p + e))`` (``clip_grad_norm_``'s coefficient,
    with its eps 1e-6, applied to one tensor; ``norm_type`` 2 by default,
    ``"inf"`` for the largest magnitude);
``{"kind": "python", "callable": "module:function"}``
    a hook function importable by name, called with the gradient as a torch
    tensor (needs torch, and ``--allow-python`` to load the file).

``register(state, graph)`` puts them on the state; ``make_hook`` builds one.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from autograd_run.graphs.model import HOOK_KINDS as KINDS  # the graph format's hook kinds and their fields


def describe(spec: dict) -> str:
    """One hook in a few words, for messages: ``clamp(min=-1, max=1)``."""
    kind = spec.get("kind")
    args = ", ".join(f"{k}={spec[k]!r}" if isinstance(spec[k], str) else f"{k}={spec[k]:g}"
                     for k in KINDS.get(kind, ()) if spec.get(k) is not None)
    return f"{kind}({args})"


def _norm(xp, g, p: float):
    a = xp.abs(g).reshape(-1)
    if a.size == 0:
        return 0.0
    if math.isinf(p):
        return float(a.max())
    if p == 2:
        return float(xp.sqrt((a * a).sum()))
    return float((a ** p).sum() ** (1.0 / p))


def make_hook(spec: dict) -> Callable[[Any], Any]:
    """The tensor hook ``fn(grad) -> grad`` that ``spec`` describes (already validated)."""
    kind = spec["kind"]
    if kind == "scale":
        c = float(spec["by"])
        return lambda g: g * g.dtype.type(c) if g.dtype.kind != "c" else g * c
    if kind == "clamp":
        lo, hi = spec.get("min"), spec.get("max")

        def clamp(g):  # maximum/minimum keep NaN, as torch.clamp does
            out = g if lo is None else _xp(g).maximum(g, g.dtype.type(lo))
            return out if hi is None else _xp(g).minimum(out, g.dtype.type(hi))
        return clamp
    if kind == "clip_norm":
        m = float(spec["max_norm"])
        p = spec.get("norm_type", 2.0)
        p = math.inf if p in ("inf", "Infinity") else float(p)
        eps = float(spec.get("eps", 1e-6))

        def clip(g):
            coef = m / (_norm(_xp(g), g, p) + eps)
            return g * g.dtype.type(min(coef, 1.0))
        return clip
    if kind == "python":
        return _python_hook(str(spec["callable"]))
    raise ValueError(f"unknown hook kind {kind!r}")


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy  # pragma: no cover - needs a GPU
    return cupy


def _python_hook(target: str) -> Callable[[Any], Any]:
    def hook(g):
        import importlib

        import torch
        mod, _, qual = target.partition(":")
        fn = importlib.import_module(mod)
        for part in qual.split("."):
            fn = getattr(fn, part)
        host = g.get() if hasattr(g, "get") else g
        t = torch.from_numpy(np.array(host, copy=True))
        with torch.no_grad():
            r = fn(t)
        out = t if r is None else r  # None: the hook may have changed the tensor in place
        return out.detach().numpy()
    return hook


def register(state, graph) -> None:
    """Register the held hooks on ``state``: every variable's as tensor pre-hooks of its AccumulateGrad node,
    every node's (``attrs.hooks``: a non-leaf tensor's hooks, on the slot of its consumer node) on its slot."""
    for v in graph.variables.values():
        if v.hooks and v.node is not None:
            for spec in v.hooks:
                state.register_tensor_pre_hook(v.node, 0, make_hook(spec))
    for node in graph.hooked_nodes:
        for spec in node.attrs.get("hooks") or ():
            state.register_tensor_pre_hook(node, int(spec["slot"]), make_hook(spec))
