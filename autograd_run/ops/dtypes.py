"""The graph format's dtype names as numpy dtypes, and how half-precision nodes compute.

numpy has ``float16``; ``bfloat16`` comes from ``ml_dtypes``, which registers
it with numpy when imported (then ``np.dtype("bfloat16")`` and
``np.zeros(..., dtype="bfloat16")`` work everywhere). Importing ml_dtypes
takes about 0.6 s here, so it is imported when a bfloat16 tensor is first
possible, not with the package: ``ensure_bfloat16()`` (the graph loader calls
it for a file that names bfloat16, the engine for a graph whose slots hold
it, ``np_dtype`` when asked for it). ``NP_DTYPES`` maps the format's names
to numpy dtypes, bfloat16 from then on (the compiled engine holds this dict).

Half-precision nodes (an input or output slot in ``float16`` or
``bfloat16``) compute as PyTorch's CPU kernels do: in float32 (the kernels'
accumulate type), rounded once to the slot's dtype at the end
(``validate_outputs``' cast). ``upcast`` gives the float32 copy of a half
array and leaves every other array as it is.
"""

from __future__ import annotations

import numpy as np

#: The format's dtype names as numpy dtypes (``bfloat16`` once ``ensure_bfloat16`` found ml_dtypes).
NP_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in
                                  ("float16", "float32", "float64", "complex64", "complex128")}


def ensure_bfloat16() -> bool:
    """Register numpy's bfloat16 (import ml_dtypes, once); False when ml_dtypes is missing."""
    if "bfloat16" in NP_DTYPES:
        return True
    try:  # a runtime dependency; without it only bfloat16 graphs are refused
        import ml_dtypes  # noqa: F401  (registers numpy's bfloat16)
    except ImportError:  # pragma: no cover - ml_dtypes is installed with the package
        return False
    NP_DTYPES["bfloat16"] = np.dtype("bfloat16")
    return True


#: Dtypes that compute in float32 and round to themselves.
HALF = frozenset({"float16", "bfloat16"})


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a format dtype name (``bfloat16`` needs ml_dtypes)."""
    if name == "bfloat16" and not ensure_bfloat16():
        raise RuntimeError("bfloat16 tensors need the ml_dtypes package: pip install ml_dtypes")
    return np.dtype(name)


def is_half(arr) -> bool:
    """Whether ``arr`` (an array, or anything with a dtype) is float16 or bfloat16."""
    dt = getattr(arr, "dtype", None)
    return dt is not None and dt.name in HALF


def upcast(arr):
    """A float32 copy of a float16/bfloat16 array; any other value unchanged."""
    if is_half(arr):
        return arr.astype(np.float32)
    return arr
