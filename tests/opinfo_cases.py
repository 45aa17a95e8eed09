"""PyTorch's own op database (OpInfo) as the test of every rule: one sample, one verdict.

``torch.testing._internal.common_methods_invocations.op_db`` lists every op
with the inputs PyTorch's own gradient tests use. For each differentiable op
and each of its CPU samples, ``run_sample`` builds the op's output, reduces
every differentiable tensor output to one real scalar with fixed random
weights (``weigh``), captures the backward graph with the product's capture
(``from_torch``), replays it on our engine and compares the executed order
and every leaf gradient with PyTorch's own backward of the same scalar.

Verdicts (``Verdict.status``):
  ``exact``     order equal, every gradient within float64's rounding
                (``FLOAT64_TIGHT`` of the largest entry; float32: ``FLOAT32_TOL``);
                or PyTorch's backward refuses the sample and the replay raises its text;
  ``opaque``    a node without a rule (``detail`` names them);
  ``wrong``     a gradient or the order differs;
  ``error``     capture or replay raised (``detail`` has the exception);
  ``skip``      nothing to check (no output needs a gradient, an input
                layout we do not load, such as sparse or complex32).

``KNOWN`` (and ``KNOWN_FLOAT64`` / ``KNOWN_FLOAT32`` for one dtype) maps an op to the documented reason it
is not exact; the test
(``tests/test_opinfo.py``) fails on any other verdict than ``exact`` or
``skip`` for an op not listed there, and on a listed op that has become
exact (so that the list stays true). ``python -m opinfo_cases`` (from
``tests/``) prints the table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass

import numpy as np

#: How far a float64 gradient may be from PyTorch's, relative to its largest entry (at least 1e-3).
FLOAT64_TIGHT = 1e-12
#: The same for float32: its rounding (6e-8) over the summation orders of two implementations (a reduction
#: over a few hundred entries, a log-space recursion) stays below this; a wrong formula does not.
FLOAT32_TOL = 1e-4


#: Ops (``op_id``) that stay not exact, each with its reason: ``KNOWN`` for every dtype checked,
#: ``KNOWN_FLOAT64`` and ``KNOWN_FLOAT32`` for one dtype only. Kept true by tests/test_opinfo.py (a listed op that
#: has become exact fails it) and written into docs/opinfo.md (``--write-doc``).
_REPLAY = " (its order and cost replay; it passes zero gradients, and `check` refuses it without `--allow-opaque`)."
_OPAQUE = "no backward rule yet for {}: captured as an opaque node" + _REPLAY
_LIBRARY_OP = ("a torch.library custom op (its chunked samples): captured as a python node that calls the backward "
               "PyTorch registered for it, exact under `run`/`check --allow-python` (this pass replays without "
               "Python code, so it counts it as opaque); its unchunked samples are exact with our rules.")
KNOWN: dict[str, str] = {
    "chalf": "complex32 (chalf) has no numpy dtype: capture refuses its tensors (Error naming the tensor).",
    "to_sparse": _OPAQUE.format("ToSparseBackward1 and ToDenseBackward0 (sparse layouts are not loaded)"),
    "nn.functional.linear_cross_entropy.chunked": _LIBRARY_OP,
    "nn.functional.linear_cross_entropy.chunked_none": _LIBRARY_OP,
    "cov": "rounding noise, not a formula: sample 24 has float32 aweights, whose gradient is zero in exact "
           "arithmetic (-7e-15 in float64); PyTorch's float32 intermediate gives -3.8e-6 and ours 0, past the "
           "tolerance because the largest entry is zero (the input's gradient agrees).",
}
KNOWN_FLOAT64: dict[str, str] = {}
KNOWN_FLOAT32: dict[str, str] = {
    "nn.functional.normalize": "rounding noise, not a formula: sample 2 normalizes over a dim of size 1, where "
                               "the exact gradient is zero; both PyTorch's and ours are float32 rounding "
                               "(up to 5e-7), past the tolerance because the largest entry is zero.",
}


def known(op: str, dtype_name: str) -> str | None:
    """The documented reason ``op`` is not exact in ``dtype_name``, or None."""
    per_dtype = {"float64": KNOWN_FLOAT64, "float32": KNOWN_FLOAT32}.get(dtype_name, {})
    return KNOWN.get(op) or per_dtype.get(op)


def op_verdict(vs: list[Verdict]) -> str:
    """One op's verdict over its samples: the worst of error, wrong, opaque; else exact; skip if nothing ran."""
    st = {v.status for v in vs}
    for s in ("error", "wrong", "opaque"):
        if s in st:
            return s
    return "exact" if "exact" in st else "skip"


@dataclass
class Verdict:
    op: str
    sample: int
    status: str
    detail: str = ""


def differentiable_ops(dtype_name="float64"):
    """The op_db entries that support autograd in ``dtype_name`` on the CPU, in op_db's order."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    dt = getattr(torch, dtype_name)
    return [o for o in op_db if o.supports_autograd and dt in o.supported_dtypes("cpu")]


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _tensors(x):
    import torch
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _weights(t, k):
    import torch
    g = torch.Generator().manual_seed(1000 + k)
    w = torch.randn(t.shape, dtype=torch.float64, generator=g)
    return w.to(t.dtype) if not t.is_complex() else torch.complex(w, torch.randn(t.shape, dtype=torch.float64,
                                                                                generator=g)).to(t.dtype)


def _scalar(outputs):
    """sum over differentiable outputs of sum(Re(out * w)), w fixed per output."""
    total = None
    for k, o in enumerate(outputs):
        if o.layout != __import__("torch").strided:
            o = o.to_dense()
        v = (o * _weights(o, k))
        v = (v.real if v.is_complex() else v).sum()
        total = v if total is None else total + v
    return total


def run_sample(op, sample, index, folder) -> Verdict:
    """The verdict for one sample of one op (see the module docstring), its graph written into ``folder``."""
    import torch
    name = op_id(op)
    args = [sample.input, *sample.args]
    leaves = [t for t in _tensors((args, sample.kwargs)) if t.requires_grad and t.grad_fn is None]
    leaves = list({id(t): t for t in leaves}.values())
    if not leaves or any(t.layout != torch.strided for t in leaves):
        return Verdict(name, index, "skip", "no strided leaf needs a gradient")
    try:
        out = op(*args, **sample.kwargs)
    except Exception as e:  # the op itself refuses the sample (a few of op_db's samples need CUDA)
        return Verdict(name, index, "skip", f"the op raised: {type(e).__name__}: {str(e)[:120]}")
    outs = [t for t in _tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if not outs:
        return Verdict(name, index, "skip", "no output needs a gradient")
    loss = _scalar(outs)
    if loss is None or not loss.requires_grad:
        return Verdict(name, index, "skip", "no output needs a gradient")
    names = {f"x{i}": t for i, t in enumerate(leaves)}
    return _check(name, index, loss, leaves, names, os.path.join(folder, f"s{index}.json"))


def _check(name, index, loss, leaves, names, path) -> Verdict:
    import torch
    from torch_helpers import torch_order
    from autograd_run.capture.graph import from_torch
    try:  # through a file, as a user captures: complex and non-finite tensors go to the .npz side file
        doc = from_torch([loss], names=names, path=path, reference=False)
    except Exception as e:
        return Verdict(name, index, "error", f"capture: {type(e).__name__}: {str(e)[:200]}")
    opaque = sorted({n["name"] for n in doc["nodes"] if "op" in n})
    if opaque:
        return Verdict(name, index, "opaque", ", ".join(opaque))
    try:
        want_order = torch_order([loss])
        for t in leaves:
            t.grad = None
        with torch.autograd.set_multithreading_enabled(False):
            want = torch.autograd.grad([loss], leaves, allow_unused=True, retain_graph=True)
    except RuntimeError as e:  # PyTorch's backward refuses the sample: the replay must refuse it with its text
        try:
            _replay(path)
        except Exception as ours:  # noqa: BLE001 - compared by text
            if str(e) and str(e) in str(ours):
                return Verdict(name, index, "exact", f"both raise PyTorch's error: {str(e)[:80]}")
            return Verdict(name, index, "wrong", f"PyTorch raises {str(e)[:80]!r}, the replay {str(ours)[:80]!r}")
        return Verdict(name, index, "wrong", f"PyTorch raises {str(e)[:80]!r}, the replay does not")
    try:
        got_order, res = _replay(path)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return Verdict(name, index, "error",
                       f"replay: {type(e).__name__}: {str(e)[:160]} ({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})")
    if got_order != want_order:
        k = next((i for i, (a, b) in enumerate(zip(got_order, want_order)) if a != b),
                 min(len(got_order), len(want_order)))
        return Verdict(name, index, "wrong", f"order differs at {k}")
    worst = 0.0
    for (n, t), w in zip(names.items(), want):
        got = res.grads.get(n)
        if w is None:
            if got is not None and np.any(np.asarray(got) != 0):
                return Verdict(name, index, "wrong", f"{n}: a gradient where PyTorch has none")
            continue
        if got is None:
            if torch.count_nonzero(w):
                return Verdict(name, index, "wrong", f"{n}: no gradient")
            continue
        w = w.resolve_conj().resolve_neg().detach()
        if w.layout != torch.strided:
            w = w.to_dense()
        wn = w.numpy(force=True)
        got = np.asarray(got)
        if got.shape != wn.shape or got.dtype != wn.dtype:
            return Verdict(name, index, "wrong", f"{n}: {got.dtype}{list(got.shape)} for {wn.dtype}{list(wn.shape)}")
        same_nonfinite = np.array_equal(np.isnan(got), np.isnan(wn)) and np.array_equal(
            np.where(np.isinf(wn), wn, 0), np.where(np.isinf(got), got, 0))
        if not same_nonfinite:
            return Verdict(name, index, "wrong", f"{n}: non-finite entries differ")
        fin = np.isfinite(wn)
        if not fin.any():
            continue
        a, b = got[fin], wn[fin]
        scale = max(float(np.max(np.abs(b))), 1e-3)
        err = float(np.max(np.abs(a - b))) / scale
        worst = max(worst, err)
    tol = FLOAT64_TIGHT if all(t.dtype in (torch.float64, torch.complex128) for t in leaves) else FLOAT32_TOL
    if worst > tol:
        return Verdict(name, index, "wrong", f"off by {worst:.1e} of the largest entry")
    return Verdict(name, index, "exact", f"{len(doc['nodes'])} nodes")


def _replay(path):
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    from autograd_run.record.order_recorder import OrderRecorder
    g = load_graph(path)
    rec = OrderRecorder()
    eng = Engine(tracer=rec, multithreading=False)
    try:
        res = run_graph(eng, g, retain_graph=True)
    finally:
        eng.shutdown()
    return [(r.name, r.seq) for r in rec.executed()], res


def document() -> str:
    """docs/opinfo.md: what the OpInfo pass checks, how to run it, and every op that is not exact, with why."""
    import torch
    n64, n32 = len(differentiable_ops("float64")), len(differentiable_ops("float32"))
    lines = [
        "# PyTorch's op database as the test of every rule",
        "",
        "<!-- written by `python tests/opinfo_cases.py --write-doc`; tests/test_opinfo.py checks it is current -->",
        "",
        "PyTorch ships its OpInfo database (`torch.testing._internal.common_methods_invocations.op_db`): every op",
        "with the sample inputs PyTorch's own gradient tests use. `tests/test_opinfo.py` (slow: `make test`, not",
        "`make test-fast`) takes every CPU sample of every differentiable op, builds the op's outputs, reduces them",
        "to one real scalar with fixed random weights, captures the backward graph through a file with `from_torch`",
        "(as a user does: complex and non-finite tensors go to the `.npz` side file), replays it on our engine and",
        "compares the executed order and every leaf gradient with PyTorch's own backward: float64 to 1e-12 of the",
        f"largest entry, float32 to {FLOAT32_TOL:g}. With torch {torch.__version__.split('+')[0]}: {n64} ops in float64, "
        f"{n32} in float32.",
        "",
        "Run it by hand for a table of every op that is not exact (`--only NAME`, `--dtype float32`, `--limit N`):",
        "",
        "```",
        "cd tests && ../.venv/bin/python -W ignore opinfo_cases.py",
        "```",
        "",
        "## Not exact, and why",
        "",
        "| op | dtypes | reason |",
        "|---|---|---|",
    ]
    for name, reason in sorted(KNOWN.items()):
        lines.append(f"| `{name}` | all | {reason} |")
    for name, reason in sorted(KNOWN_FLOAT64.items()):
        lines.append(f"| `{name}` | float64 | {reason} |")
    for name, reason in sorted(KNOWN_FLOAT32.items()):
        lines.append(f"| `{name}` | float32 | {reason} |")
    if not KNOWN and not KNOWN_FLOAT64 and not KNOWN_FLOAT32:
        lines.append("| (none) | | |")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _cpu_seeding(torch):
    """``torch.manual_seed`` as the CPU generator's alone while no accelerator is there: op_db's sample iterator
    seeds before every sample, and on a CPU-only torch each call also queues a lazy seed for CUDA, XPU and MTIA
    with a formatted stack trace apiece (1.1 ms a call here, 16% of max_pool2d's 1440 samples). The values drawn
    are the same: those queued seeds only act when a device starts, and none can."""
    accel = [getattr(torch, m, None) for m in ("cuda", "xpu", "mtia")]
    if any(m is not None and m.is_available() for m in accel):
        yield
        return
    seed = torch.manual_seed
    torch.manual_seed = torch.default_generator.manual_seed
    try:
        yield
    finally:
        torch.manual_seed = seed


def samples(op, dtype_name="float64", limit=None):
    import torch
    dt = getattr(torch, dtype_name)
    torch.manual_seed(0)
    out = []
    with _cpu_seeding(torch):
        for i, s in enumerate(op.sample_inputs("cpu", dt, requires_grad=True)):
            if limit is not None and i >= limit:
                break
            out.append(s)
    return out


def run_op(op, dtype_name="float64", limit=None) -> list[Verdict]:
    try:
        ss = samples(op, dtype_name, limit)
    except Exception as e:
        return [Verdict(op_id(op), -1, "skip", f"sample_inputs raised {type(e).__name__}: {str(e)[:120]}")]
    tmp = tempfile.mkdtemp(prefix="opinfo-")  # one folder for the op's samples (s<i>.json, s<i>.npz)
    try:
        return [run_sample(op, s, i, tmp) for i, s in enumerate(ss)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover - a report, run by hand
    import argparse
    import collections
    import sys
    import time
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--only", default=None)
    p.add_argument("--write-doc", action="store_true", help="write docs/opinfo.md and stop")
    a = p.parse_args()
    if a.write_doc:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "opinfo.md"), "w",
                  encoding="utf-8") as f:
            f.write(document())
        sys.exit(0)
    t0 = time.time()
    per_op = collections.Counter()
    bad = []
    for op in differentiable_ops(a.dtype):
        if a.only and a.only not in op_id(op):
            continue
        vs = run_op(op, a.dtype, a.limit)
        verdict = op_verdict(vs)
        per_op[verdict] += 1
        if verdict not in ("exact", "skip"):
            v = next(v for v in vs if v.status == verdict)
            n = sum(1 for v in vs if v.status not in ("exact", "skip"))
            bad.append(f"{op_id(op):40s} {verdict:7s} {n}/{len(vs)} #{v.sample}: {v.detail}")
    print("\n".join(bad))
    print(dict(per_op), f"{time.time() - t0:.0f} s")
