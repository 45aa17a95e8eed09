"""Tensor values in graph files: specs, their checks, and turning them into arrays.

A tensor value is one of:

* ``"ones"`` / ``"zeros"``: filled with the shape and dtype the context gives;
* a number or nested list: the values themselves;
* ``{"data": [...], "dtype": ..., "shape": [...]}``: the same, with dtype/shape;
* ``{"npz": KEY, "file": NAME}``: an array in an ``.npz`` side file in the
  graph's folder (``file`` defaults to the graph's stem + ``.npz``);
* ``{"random": SEED, "shape": [...], "dtype": ..., "dist": "normal"|"uniform"}``:
  seeded random values, the same on every machine: ``standard_normal`` (or
  ``random``) of ``numpy.random.Generator(numpy.random.PCG64(SEED))`` (seeded
  in bulk by ``graphs.seeding``, value for value the same).

Saved values that are not tensors (sizes, dims, scalars) are plain JSON values.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable

import numpy as np

from autograd_run.graphs.model import DTYPES, SAVED_DTYPES
from autograd_run.graphs.seeding import draw_many

TENSOR_KEYS = ("data", "npz", "random")
#: Refuse any single tensor larger than this many elements (graph files are untrusted).
MAX_NUMEL = 1 << 31
MAX_DIMS = 16

Err = Callable[[tuple, str], Exception]


def is_tensor_spec(value: Any) -> bool:
    return isinstance(value, dict) and any(k in value for k in TENSOR_KEYS)


def quick_random_ok(value: dict) -> bool:
    """True for the common well-formed ``{"random": seed, "shape": [...]}`` spec (no slow checks needed)."""
    if len(value) != 2:
        return False
    seed = value.get("random")
    shape = value.get("shape")
    if type(seed) is not int or not 0 <= seed < 2**63 or type(shape) is not list or len(shape) > MAX_DIMS:
        return False
    numel = 1
    for s in shape:
        if type(s) is not int or s < 0:
            return False
        numel *= s
    return numel <= MAX_NUMEL


def check_shape(shape: Any, path: tuple, err: Err) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or any(
        isinstance(s, bool) or not isinstance(s, int) for s in shape
    ):
        raise err(path, f"a shape must be a list of integers, got {shape!r:.60}")
    if len(shape) > MAX_DIMS:
        raise err(path, f"a shape may have at most {MAX_DIMS} dimensions, got {len(shape)}")
    numel = 1
    for s in shape:
        if s < 0:
            raise err(path, f"a shape must not have negative sizes, got {list(shape)}")
        numel *= s
    if numel > MAX_NUMEL:
        raise err(path, f"shape {list(shape)} has {numel} elements, more than the limit of {MAX_NUMEL}")
    return tuple(shape)


def check_dtype(dtype: Any, path: tuple, err: Err, allowed: tuple = DTYPES) -> str:
    if dtype not in allowed:
        raise err(path, f"unsupported dtype {dtype!r}; expected one of {', '.join(allowed)}")
    return dtype


def _nested_shape(value: Any, path: tuple, err: Err, depth: int = 0) -> tuple[int, ...]:
    if depth > MAX_DIMS:
        raise err(path, "nested list is too deep for a tensor")
    if value is None:
        raise err(path, f"tensor values must be numbers, got {value!r}")
    if isinstance(value, (int, float)):  # bools too: masks are saved as bool tensors
        return ()
    if isinstance(value, list):
        if not value:
            return (0,)
        inner = _nested_shape(value[0], path, err, depth + 1)
        for v in value[1:]:
            if _nested_shape(v, path, err, depth + 1) != inner:
                raise err(path, "nested list is ragged: rows have different lengths")
        return (len(value),) + inner
    raise err(path, f"expected a tensor value, got {type(value).__name__}")


class SideFiles:
    """Opens ``.npz`` side files once per graph, refusing paths outside its folder."""

    def __init__(self, base_dir: str | None, default_name: str | None):
        self.base_dir = base_dir
        self.default_name = default_name
        self._open: dict[str, Any] = {}
        #: Added to every random spec's seed (``--seed``): another reproducible draw.
        self.seed_offset = 0
        self._lock = threading.Lock()  # guards _open (nodes materialize from several threads)

    def resolve(self, name: str | None, path: tuple, err: Err) -> str:
        name = name or self.default_name
        if self.base_dir is None or name is None:
            raise err(path, "npz side files need a graph loaded from a file")
        if not isinstance(name, str) or not name.endswith(".npz"):
            raise err(path, f"side file must be an .npz file, got {name!r}")
        base = os.path.realpath(self.base_dir)
        full = os.path.realpath(os.path.join(base, name))
        if os.path.commonpath([base, full]) != base:
            raise err(path, f"side file {name!r} lies outside the graph's folder")
        if not os.path.isfile(full):
            raise err(path, f"side file {name!r} is missing")
        return full

    def archive(self, full: str, path: tuple, err: Err):
        with self._lock:
            arc = self._open.get(full)
            if arc is None:
                try:
                    arc = np.load(full, allow_pickle=False)
                except Exception as exc:  # a corrupt side file is bad input, not a crash
                    raise err(path, f"cannot read side file {os.path.basename(full)!r}: {exc}") from None
                if not hasattr(arc, "files"):
                    raise err(path, f"side file {os.path.basename(full)!r} is not an .npz archive")
                self._open[full] = arc
            return arc


def check_tensor(value: Any, path: tuple, err: Err, side: SideFiles,
                 shape: tuple[int, ...] | None = None, dtype: str | None = None,
                 allow_fill: bool = False) -> None:
    """Raise ``err(path, ...)`` unless ``value`` is a well-formed tensor spec.

    ``shape``/``dtype``, when given, are what the context expects; explicit
    values must have exactly that shape.
    """
    if isinstance(value, str):
        if allow_fill and value in ("ones", "zeros"):
            if shape is None:
                raise err(path, f"'{value}' needs a shape from the context")
            return
        raise err(path, f"unknown tensor value {value!r}" + ("; expected 'ones', 'zeros', numbers or a spec" if allow_fill else ""))
    if isinstance(value, dict):
        kinds = [k for k in TENSOR_KEYS if k in value]
        if len(kinds) != 1:
            raise err(path, "a tensor spec needs exactly one of 'data', 'npz', 'random'")
        kind = kinds[0]
        allowed = {"data": {"data", "dtype", "shape"}, "npz": {"npz", "file"},
                   "random": {"random", "shape", "dtype", "dist"}}[kind]
        extra = sorted(set(value) - allowed)
        if extra:
            raise err(path, f"unknown field {extra[0]!r} in a {kind!r} tensor spec")
        if "dtype" in value:
            check_dtype(value["dtype"], path + ("dtype",), err, DTYPES if allow_fill else SAVED_DTYPES)
        declared = check_shape(value["shape"], path + ("shape",), err) if "shape" in value else None
        if declared is not None and shape is not None and declared != tuple(shape):
            raise err(path + ("shape",), f"shape {list(declared)} does not match the expected {list(shape)}")
        if kind == "data":
            got = _nested_shape(value["data"], path + ("data",), err)
            want = declared if declared is not None else shape
            if want is not None and got != tuple(want) and not (got == () and math.prod(want) == 1):
                raise err(path + ("data",), f"values have shape {list(got)}, expected {list(want)}")
        elif kind == "npz":
            key = value["npz"]
            if not isinstance(key, str):
                raise err(path + ("npz",), "npz key must be a string")
            full = side.resolve(value.get("file"), path + ("npz",), err)
            arc = side.archive(full, path + ("npz",), err)
            if key not in arc.files:
                raise err(path + ("npz",), f"key {key!r} is not in side file {os.path.basename(full)!r}")
        else:
            seed = value["random"]
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise err(path + ("random",), "random seed must be a non-negative integer")
            if value.get("dist", "normal") not in ("normal", "uniform"):
                raise err(path + ("dist",), "dist must be 'normal' or 'uniform'")
            if declared is None and shape is None:
                raise err(path, "a random tensor needs a shape")
        return
    got = _nested_shape(value, path, err)
    if shape is not None and got != tuple(shape) and not (got == () and math.prod(shape) == 1):
        raise err(path, f"values have shape {list(got)}, expected {list(shape)}")


def materialize(value: Any, side: SideFiles, shape: tuple[int, ...] | None = None,
                dtype: str | None = None) -> np.ndarray:
    """The numpy array a (checked) tensor spec denotes."""
    if isinstance(value, str):
        fill = np.ones if value == "ones" else np.zeros
        return fill(shape, dtype=dtype or "float32")
    if isinstance(value, dict):
        dt = value.get("dtype", dtype)
        shp = tuple(value["shape"]) if "shape" in value else shape
        if "data" in value:
            arr = np.asarray(value["data"], dtype=dt or "float32")
            return arr.reshape(shp) if shp is not None else arr
        if "npz" in value:
            fail = lambda p, m: ValueError(m)  # noqa: E731 - checked at load already
            full = side.resolve(value.get("file"), (), fail)
            arr = np.asarray(side.archive(full, (), fail)[value["npz"]])
            return arr.astype(dt, copy=False) if dt else arr
        return draw_many([_random_spec(value, side, shp, dt)])[0]
    arr = np.asarray(value, dtype=dtype or "float32")
    return arr.reshape(shape) if shape is not None else arr


def _random_spec(value: dict, side: SideFiles, shape, dtype) -> tuple:
    return (value["random"] + side.seed_offset, shape, dtype or "float32", value.get("dist", "normal"))


def materialize_random_many(values: list[dict], side: SideFiles) -> list[np.ndarray]:
    """``materialize`` of many (checked) ``random`` specs that carry their shapes, seeded in bulk
    (``graphs.seeding``: the same values, several times faster than one at a time)."""
    return draw_many([_random_spec(v, side, tuple(v["shape"]), v.get("dtype")) for v in values])
