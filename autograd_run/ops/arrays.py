"""Array helpers shared by the backward formulas and by the engine's ``validate_outputs``."""

from __future__ import annotations

import math

import numpy as np


def each(node, value_for) -> list:
    """``value_for(i)`` for each valid next edge i of ``node``, None elsewhere."""
    return [None if e is None else value_for(i) for i, e in enumerate(node.next)]


def signed(v):
    """PyTorch exposes some int64 saved values as uint64 (-1 -> 2**64-1); read them back signed."""
    if v is None:
        return None
    v = int(v)
    return v - (1 << 64) if v >= (1 << 63) else v


def number(v):
    """A saved Scalar: a number, or a string for what JSON cannot hold ("(1-2j)", "inf", "nan")."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return complex(v)
    return v


def sum_to(xp, grad, shape):
    """Reduce ``grad`` to ``shape`` by summing broadcast dimensions (PyTorch's ``sum_to``)."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    if not shape:
        return grad.sum().reshape(())
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and grad.shape[lead + i] != 1)
    out = grad.sum(axis=axes, keepdims=True) if axes else grad
    if lead:
        out = out.reshape(out.shape[lead:])
    return out.reshape(shape)


#: From this many elements on, ``keep_where`` / ``zero_where`` multiply by the mask when the gradient is all finite:
#: numpy's where and putmask branch per element, ~15x a multiply on an unpredictable mask (relu's). Below it a copy
#: and a masked store cost about what the multiply does (numpy's where ~2x: it converts the scalar 0 per call).
SELECT_BY_MULTIPLY = 1024

#: A 0-d zero per numpy dtype: comparing an array with it skips the conversion and promotion of a Python
#: 0 that numpy does on every call (0.5 against 0.95 us on a one-element array).
_ZEROS: dict = {}


def nonpositive(a):
    """``a <= 0`` (False where ``a`` is NaN)."""
    if type(a) is np.ndarray:
        z = _ZEROS.get(a.dtype)
        if z is None:
            z = _ZEROS.setdefault(a.dtype, np.zeros((), a.dtype))
        return a <= z
    return a <= 0


def keep_where(xp, keep, grad):
    """``grad`` where the bool ``keep`` holds, an exact zero of its dtype elsewhere: PyTorch's
    ``where(keep, grad, 0)``. Not ``grad * keep``: a NaN or infinite ``grad`` would give NaN where ``keep`` is off
    (``nan * 0``), PyTorch 0."""
    if type(grad) is np.ndarray and type(keep) is np.ndarray and keep.shape == grad.shape:
        if grad.size < SELECT_BY_MULTIPLY:
            out = grad.copy()
            out[~keep] = 0  # a boolean index: 0.65 against 1.06 us for putmask on one element
            return out
        if np.isfinite(grad).all():
            return grad * keep
    return xp.where(keep, grad, 0)


def zero_where(xp, off, grad):
    """``grad`` with exact zeros where the bool ``off`` holds: PyTorch's ``off ? 0 : grad`` (``threshold_backward``,
    ...). A NaN comparison leaves ``off`` False, so the gradient passes there, as in PyTorch's kernels."""
    if type(grad) is np.ndarray and type(off) is np.ndarray and off.shape == grad.shape:
        if grad.size < SELECT_BY_MULTIPLY:
            out = grad.copy()
            out[off] = 0
            return out
        if np.isfinite(grad).all():
            return grad * ~off
    return xp.where(off, 0, grad)


def out_meta(node, i: int):
    """The metadata (shape, dtype, device) of the slot that next edge ``i`` feeds."""
    e = node.next[i]
    return e.node.inputs[e.input_nr]


def filled(node, grads, xp) -> list:
    """The node's input gradients with undefined ones replaced by zeros of their slot's shape."""
    return [xp.zeros(meta.shape, dtype=meta.dtype) if g is None else g for g, meta in zip(grads, node.inputs)]


def is_numpy(xp) -> bool:
    """Whether ``xp`` is numpy (else cupy)."""
    return getattr(xp, "__name__", "") == "numpy"


def add_at(xp, target, index, values) -> None:
    """``target[index] += values`` where repeated indices accumulate (numpy's ``add.at``, cupyx's ``scatter_add``).

    On numpy, a float or complex target indexed by integer arrays on its leading dims (every rule's form) is
    scattered by flat index (``_flat_terms``): with ``bincount`` when the terms are at least 1/64 of the target's
    entries (numpy's ``add.at`` with broadcast fancy indices costs ~100 ns a term here, ``bincount`` a few; a 3-d
    grid sampler's backward spent 5.6 of 10 s in it), else with ``add.at`` on the flat view, one index per term.
    Both also keep clear of numpy 2.4's ``add.at`` adding each value once when a 1-d target's index has more
    dims than the values (``add.at(zeros(1), zeros((2, 3), int), [1., 2., 3.])`` gives 6, not 12, and once
    gave 2.7e98: it reads past the values). Any other
    form, an index out of range or values that do not broadcast go to ``add.at`` as given, for its errors.
    """
    if not is_numpy(xp):  # pragma: no cover - needs a GPU
        import cupyx
        cupyx.scatter_add(target, index, values)
        return
    terms = _flat_terms(target, index, values)
    if terms is None:
        xp.add.at(target, index, values)
        return
    keys, vals = terms
    if keys.size == 0:
        return
    if keys.size * 64 >= target.size:
        # the sums in float64 (complex128), added once: a float32 target is rounded once, not once per term
        if target.dtype.kind == "c":
            sums = np.empty(target.size, dtype=np.complex128)  # parts set apart: 1j * inf makes a NaN real part
            sums.real = np.bincount(keys, weights=vals.real, minlength=target.size)
            sums.imag = np.bincount(keys, weights=vals.imag, minlength=target.size)
        else:
            sums = np.bincount(keys, weights=vals, minlength=target.size)
        target += sums.reshape(target.shape).astype(target.dtype, copy=False)
        return
    flat = target.reshape(-1)            # a view when the target is contiguous, else a copy written back
    np.add.at(flat, keys, vals)
    if not np.shares_memory(flat, target):
        target[...] = flat.reshape(target.shape)


def _flat_terms(target, index, values):
    """``(keys, values)``, both 1-d: ``add_at``'s terms by flat index into ``target``; None for another form."""
    if target.dtype.kind not in "fc":
        return None
    idx = index if isinstance(index, tuple) else (index,)
    if not idx or len(idx) > target.ndim:
        return None
    if not all(isinstance(i, np.ndarray) and i.dtype.kind in "iu" for i in idx):
        return None
    try:
        shape = np.broadcast_shapes(*(i.shape for i in idx))
    except ValueError:
        return None
    lead = target.shape[:len(idx)]
    rest = target.shape[len(idx):]
    width = math.prod(rest)
    lin = None
    for i, n in zip(idx, lead):  # the flat index over the leading dims, broadcast only at the last step
        if i.size:
            lo, hi = int(i.min()), int(i.max())
            if lo < -n or hi >= n:
                return None
            if lo < 0:
                i = (i + n) % n
        i = i.astype(np.intp, copy=False)
        lin = i if lin is None else lin * n + i
    values = np.asarray(values)
    if not np.can_cast(values.dtype, target.dtype, "same_kind"):
        return None
    try:
        vals = np.broadcast_to(values, shape + rest).astype(target.dtype, copy=False)
    except ValueError:
        return None
    lin = np.broadcast_to(lin, shape)
    keys = lin.reshape(-1) if width == 1 else (lin.reshape(-1, 1) * width + np.arange(width)).reshape(-1)
    return keys, vals.reshape(-1)


def wrap_dim(dim, ndim: int) -> int:
    """A saved dim (maybe negative, maybe uint64-encoded) as a non-negative axis of an ``ndim``-dim array."""
    return signed(dim) % max(ndim, 1)


def tensor_list(saved, name: str) -> list:
    """A saved list of tensors (kind ``tensors``), entries as arrays or None.

    An entry is None, the name of another saved field that holds the tensor
    (what capture writes: ``indices.0``, ``indices.1``, ...), or an inline
    tensor (``{"data": ..., "dtype": ...}`` or a nested list).
    """
    out = []
    for v in saved.get(name) or ():
        if v is None:
            out.append(None)
        elif isinstance(v, str):
            out.append(saved[v])
        elif isinstance(v, dict):
            if "data" not in v:
                raise ValueError(f"saved {name!r}: a listed tensor must be inline data or the name of a saved field")
            out.append(np.asarray(v["data"], dtype=v.get("dtype")))
        else:
            out.append(np.asarray(v))
    return out
