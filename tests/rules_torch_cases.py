"""Shared helpers for the rule-versus-PyTorch test files: leaves, a weighted loss, and one checker.

``check(out, leaves)`` captures the backward graph of ``out``, replays it
here, and compares the executed order and every leaf gradient with
PyTorch's own backward (float64, rtol 1e-6, and float64 to 1e-12 of the largest entry: ``FLOAT64_TIGHT``). ``path`` captures through a
JSON file with an ``.npz`` side file (complex tensors cannot be inlined).
"""

from __future__ import annotations

import numpy as np
import torch

from torch_helpers import capture, check_outputs, our_order, torch_order

D = torch.float64


def leaf(*shape, positive=False, seed=0, dtype=D, low=None, high=None):
    g = torch.Generator().manual_seed(seed * 7919 + sum(shape))
    if low is not None:
        t = low + (high - low) * torch.rand(*shape, dtype=dtype, generator=g)
    else:
        t = torch.randn(*shape, dtype=dtype, generator=g)
    if positive:
        t = t.abs() + 0.5
    return t.requires_grad_(True)


def weigh(y, seed=99):
    """A real scalar with a non-uniform downstream gradient: sum(Re(y * w)) for a fixed random w."""
    g = torch.Generator().manual_seed(seed)
    if y.is_complex():
        w = torch.randn(y.shape, dtype=y.dtype, generator=g)
        return (y * w).real.sum()
    return (y * torch.randn(y.shape, dtype=y.dtype, generator=g)).sum()


def _replay_from_file(outputs, leaves, path):
    from autograd_run.capture import from_torch
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.record.order_recorder import OrderRecorder
    check_outputs(outputs)
    doc = from_torch(outputs, names=leaves, path=str(path), reference=False)
    g = load_graph(str(path))
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=False)
    try:
        res = run_graph(eng, g, retain_graph=True)
    finally:
        eng.shutdown()
    return doc, [(r.name, r.seq) for r in rec.executed()], res


def check(out, leaves, path=None, rtol=1e-6, atol=1e-9, expect_names=()):
    """Replay ``out``'s backward here and compare it with PyTorch's; returns the node names captured."""
    leaves = {k: v for k, v in leaves.items() if isinstance(v, torch.Tensor) and v.requires_grad and v.grad_fn is None}
    for t in leaves.values():
        t.grad = None
    if path is None:
        doc = capture([out], leaves=leaves)
        got_order, res, _ = our_order(doc)
    else:
        doc, got_order, res = _replay_from_file([out], leaves, path)
    names = {n["name"] for n in doc["nodes"]}
    opaque = {n["name"] for n in doc["nodes"] if "op" in n}
    assert not opaque, f"nodes without a rule: {sorted(opaque)}"
    for name in expect_names:
        assert name in names, f"{name} not in the captured graph: {sorted(names)}"
    expected_order = torch_order([out])
    assert got_order == expected_order
    for name, t in leaves.items():
        if t.grad is None:
            assert res.grads.get(name) is None, name
        else:
            got = res.grads[name]
            assert got is not None, name
            assert got.dtype == np.dtype(str(t.dtype).replace("torch.", "")), (name, got.dtype)
            want = t.grad.resolve_conj().resolve_neg()
            if want.dtype == torch.bfloat16:  # torch has no numpy bfloat16: compare in float32 (exact)
                got, want = got.astype(np.float32), want.float()
            np.testing.assert_allclose(got, want.numpy(), rtol=rtol, atol=atol, err_msg=name)
            if want.dtype == torch.float64 and got.size and rtol <= 1e-6:
                # float64 agrees to its rounding, not to the loose tolerance above: a rule that computes in
                # lower precision or with another formula (a float32 constant, a shorter series) shows here
                w = want.numpy()
                fin = np.isfinite(w) & np.isfinite(got)  # the non-finite entries matched above
                w, g64 = w[fin], np.asarray(got)[fin]
                scale = max(float(np.max(np.abs(w))), 1e-3) if w.size else 1.0
                err = float(np.max(np.abs(g64 - w))) if w.size else 0.0
                assert err <= FLOAT64_TIGHT * scale, f"{name}: float64 off by {err:.2e} (largest {scale:.2e})"
    return names


#: How far a float64 gradient may be from PyTorch's, relative to its largest entry (at least 1e-3).
FLOAT64_TIGHT = 1e-12


def grad_penalty(f, *xs):
    """(sum of squared first-order gradients of f(*xs).sum() w.r.t. xs), built with create_graph=True."""
    y = f(*xs)
    gs = torch.autograd.grad(y.sum() if y.dim() else y, list(xs), create_graph=True, allow_unused=True)
    return sum((g * torch.linspace(0.5, 1.5, g.numel(), dtype=g.dtype).reshape(g.shape)).pow(2).sum()
               for g in gs if g is not None)
