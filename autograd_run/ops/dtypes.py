"""The graph format's dtype names as numpy dtypes, and how half-precision nodes compute.

numpy has ``float16``; ``bfloat16`` comes from ``ml_dtypes``, which registers
it with numpy when imported (then ``np.dtype("bfloat16")`` and
``np.zeros(..., dtype="bfloat16")`` work everywhere). Importing this module
(the ops package does) is enough.

Half-precision nodes (an input or output slot in ``float16`` or
``bfloat16``) compute as PyTorch's CPU kernels do: in float32 (the kernels'
accumulate type), rounded once to the slot's dtype at the end
(``validate_outputs``' cast). ``upcast`` gives the float32 copy of a half
array and leaves every other array as it is.
"""

from __future__ import annotations

import numpy as np

try:  # a runtime dependency; without it only bfloat16 graphs are refused
    import ml_dtypes  # noqa: F401  (registers numpy's bfloat16)
    HAVE_BFLOAT16 = True
except ImportError:  # pragma: no cover - ml_dtypes is installed with the package
    HAVE_BFLOAT16 = False

#: Dtypes that compute in float32 and round to themselves.
HALF = frozenset({"float16", "bfloat16"})


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a format dtype name (``bfloat16`` needs ml_dtypes)."""
    if name == "bfloat16" and not HAVE_BFLOAT16:
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
