"""``--json`` output that is always valid JSON (RFC 8259), whatever the gradients hold.

Python's ``json`` writes ``NaN`` and ``Infinity`` bare, which no strict
parser accepts, and cannot write complex numbers at all. Here:

* a non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or
  ``"-Infinity"`` (anywhere: gradients and summary statistics alike);
* a complex array is written as ``{"real": [...], "imag": [...]}`` (each a
  nested list of the array's shape; a complex scalar the same, with numbers);
* a real array as a nested list of its shape (a 0-d array as a number).

``dumps`` refuses anything else that is not JSON (``allow_nan=False``), so an
invalid document can never be printed.
"""

from __future__ import annotations

import json
import math

import numpy as np

_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _finite(x: float):
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else _NONFINITE[x]


def _clean(obj):
    """``obj`` with every non-finite float replaced by its string (lists, tuples and dicts walked)."""
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, complex):
        return {"real": _finite(obj.real), "imag": _finite(obj.imag)}
    if isinstance(obj, np.ndarray):
        return array_json(obj)
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


def array_json(arr) -> object:
    """A gradient as JSON data (see the module docstring)."""
    arr = np.asarray(arr)
    if np.iscomplexobj(arr):
        return {"real": array_json(arr.real), "imag": array_json(arr.imag)}
    values = arr.tolist()
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        values = _clean(values)
    return values


def dumps(obj) -> str:
    """``obj`` as strict JSON: non-finite floats as strings, complex numbers as ``{real, imag}``."""
    return json.dumps(_clean(obj), allow_nan=False)
