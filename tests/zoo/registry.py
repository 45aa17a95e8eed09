"""The zoo's registry: a model is one decorated function that builds it and returns its loss.

::

    @model("resnet_block", "vision")
    def resnet_block():
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        return m(torch.randn(2, 3, 8, 8)).square().mean(), m

The function runs with ``torch``'s default dtype set to the entry's dtype
(float64 unless stated) and a fixed seed, so plain ``torch.nn`` code builds
the model in that precision. It returns ``(outputs, leaves...)``: the
outputs (a tensor or a list) followed by modules (their named parameters),
mappings of name -> tensor and single tensors (named ``x``, ``x1``, ...),
or a ``Case`` when it needs more (``inputs`` for ``grad()``, ``grad_outputs``,
a capture ``mode``). ``build(entry)`` gives the ``Case``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Case:
    outputs: Any
    names: dict[str, torch.Tensor] = field(default_factory=dict)
    inputs: list | None = None
    grad_outputs: list | None = None
    mode: str | None = None


@dataclass
class Entry:
    name: str
    family: str
    fn: Callable
    dtype: torch.dtype = torch.float64
    #: (rtol, atol) for the gradient check; None: the check's defaults for the dtype.
    tol: tuple[float, float] | None = None
    #: Opaque nodes this model is expected to keep (custom Functions that cannot be traced).
    opaque: int = 0
    #: Python nodes it is expected to have (custom Functions replayed by calling their own backward: the replay
    #: needs allow_python).
    python: int = 0
    #: The half type the model computes in (its own dtype, or an autocast's), None for float32/float64.
    half: torch.dtype | None = None
    note: str = ""
    #: The library an external model comes from (``torchvision``, ``timm``, ``transformers``), else "".
    external: str = ""

    def unavailable(self) -> str:
        """Why this model cannot be built here ("" when it can): an external model's library is missing."""
        if not self.external:
            return ""
        from zoo.external import unavailable
        return unavailable(self.external)


ZOO: dict[str, Entry] = {}


def model(name: str, family: str, *, dtype: torch.dtype = torch.float64, tol=None, opaque: int = 0,
          half: torch.dtype | None = None, note: str = "", external: str = "", python: int = 0):
    """Register the decorated builder under ``name``."""
    def register(fn):
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} registered twice")
        h = half or (dtype if dtype in (torch.float16, torch.bfloat16) else None)
        ZOO[name] = Entry(name, family, fn, dtype, tol, opaque, python, h,
                          note or " ".join((fn.__doc__ or "").split()), external)
        return fn
    return register


@contextlib.contextmanager
def _default_dtype(dtype):
    before = torch.get_default_dtype()
    # Half-precision defaults are not allowed; such models build in float32 and cast themselves.
    torch.set_default_dtype(dtype if dtype in (torch.float32, torch.float64) else torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _leaves(parts) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    k = 0
    for p in parts:
        if isinstance(p, torch.nn.Module):
            prefix = f"m{k}." if any(isinstance(q, torch.nn.Module) for q in parts if q is not p) else ""
            k += 1
            for n, t in p.named_parameters():
                out[prefix + n] = t
        elif isinstance(p, dict):
            out.update(p)
        elif isinstance(p, torch.Tensor):
            out["x" if "x" not in out else f"x{len(out)}"] = p
        else:
            raise TypeError(f"a zoo model returned {type(p).__name__} as a leaf")
    return {n: t for n, t in out.items() if t.requires_grad and t.grad_fn is None}


def build(entry: Entry) -> Case:
    """Run the entry's builder (default dtype, seed 0) and normalise what it returns."""
    torch.manual_seed(0)
    with _default_dtype(entry.dtype):
        got = entry.fn()
    if isinstance(got, Case):
        return got
    if not isinstance(got, tuple):
        got = (got,)
    return Case(got[0], _leaves(got[1:]))


#: Half-precision tolerances, (rtol, atol as a fraction of the model's largest reference gradient). PyTorch's
#: half kernels round intermediate sums to the half type in places (batch and layer norm weight gradients
#: accumulate per-thread buffers in bfloat16, so even PyTorch's result depends on its thread count); a gradient
#: that is only rounding noise (a convolution bias before a batch norm: zero in exact arithmetic) is compared
#: against the model's gradient scale, not its own.
HALF_TOLERANCE = {torch.bfloat16: (3e-2, 1e-2), torch.float16: (4e-3, 2e-3)}
#: float64 and float32: the check's defaults (float64: rtol 1e-6, atol 1e-9; float32: rtol 1e-4, atol 1e-6).
EXACT_TOLERANCE = {torch.float64: (1e-6, 1e-9), torch.float32: (1e-4, 1e-6)}


def tolerance(entry: Entry, largest_gradient: float) -> tuple[float, float]:
    """(rtol, atol) for comparing this model's gradients with PyTorch's."""
    if entry.tol is not None:
        return entry.tol
    half = entry.half
    if half is not None:
        rtol, scale = HALF_TOLERANCE[half]
        return rtol, scale * largest_gradient
    return EXACT_TOLERANCE[entry.dtype]
