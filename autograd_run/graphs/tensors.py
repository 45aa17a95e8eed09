"""Tensor values in graph files: specs, their checks, and turning them into arrays.

A tensor value is one of:

* ``"ones"`` / ``"zeros"``: filled with the shape and dtype the context gives;
* a number or nested list: the values themselves;
* ``{"data": [...], "dtype": ..., "shape": [...]}``: the same, with dtype/shape;
* ``{"npz": KEY, "file": NAME}``: an array in an ``.npz`` side file in the
  graph's folder (``file`` defaults to the graph's stem + ``.npz``); with
  ``dtype``, the array is cast to it (``bfloat16`` tensors are stored as their
  exact float32 values, which every npz reader can open);
* ``{"random": SEED, "shape": [...], "dtype": ..., "dist": "normal"|"uniform"}``:
  seeded random values, the same on every machine: ``standard_normal`` (or
  ``random``) of ``numpy.random.Generator(numpy.random.PCG64(SEED))`` (seeded
  in bulk by ``graphs.seeding``, value for value the same).

Saved values that are not tensors (sizes, dims, scalars) are plain JSON values.

Side files are untrusted too. ``SideFiles`` opens them with ``zipfile`` and
reads each member's ``.npy`` header (shape and dtype) before any data: only
numeric dtypes (never objects, so never pickles), the same element cap as
inline tensors, and a member whose stored size is exactly what its header
declares, so decompressing it cannot produce more than the checked bytes.
``check_tensor`` returns the bytes a value will take once materialised; the
validator adds them up against the graph's memory budget.
"""

from __future__ import annotations

import io
import math
import os
import re
import stat
import threading
import zipfile
from typing import Any, Callable

import numpy as np

from autograd_run.graphs.model import DTYPES, SAVED_DTYPES
from autograd_run.graphs.seeding import draw_many

TENSOR_KEYS = ("data", "npz", "random")
#: Refuse any single tensor larger than this many elements (graph files are untrusted).
MAX_NUMEL = 1 << 31
MAX_DIMS = 16
#: Side files: most members an archive may list, largest central directory and ``.npy`` header.
MAX_NPZ_MEMBERS = 100_000
MAX_NPZ_DIRECTORY = 64 << 20
MAX_NPY_HEADER = 10_000

Err = Callable[[tuple, str], Exception]

_ITEMSIZE = {name: 2 if name == "bfloat16" else np.dtype(name).itemsize for name in SAVED_DTYPES}


def itemsize(dtype: str | None) -> int:
    return _ITEMSIZE.get(dtype or "float32", 8)


def is_tensor_spec(value: Any) -> bool:
    return isinstance(value, dict) and any(k in value for k in TENSOR_KEYS)


def quick_random_numel(value: dict) -> int:
    """The element count of a well-formed ``{"random": seed, "shape": [...]}`` spec, else -1.

    The common saved-tensor form, checked without the general (slower) path.
    """
    if len(value) != 2:
        return -1
    seed = value.get("random")
    shape = value.get("shape")
    if type(seed) is not int or not 0 <= seed < 2**63 or type(shape) is not list or len(shape) > MAX_DIMS:
        return -1
    numel = 1
    for s in shape:
        if type(s) is not int or s < 0:
            return -1
        numel *= s
    return numel if numel <= MAX_NUMEL else -1


def quick_random_ok(value: dict) -> bool:
    """True for the common well-formed ``{"random": seed, "shape": [...]}`` spec (no slow checks needed)."""
    return quick_random_numel(value) >= 0


def short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters, for messages that quote untrusted values; a date or time that YAML read
    from the file as its text (``2001-01-01 (a date)``), not as Python's ``datetime.date(2001, 1, 1)``."""
    import datetime
    try:
        if isinstance(value, (datetime.date, datetime.time)):  # (a datetime is a date)
            return f"{value.isoformat()} (a {type(value).__name__})"[:limit]
        r = repr(value)
    except (ValueError, RecursionError):  # e.g. an int too long to print
        r = f"<{type(value).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def check_shape(shape: Any, path: tuple, err: Err) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or any(
        isinstance(s, bool) or not isinstance(s, int) for s in shape
    ):
        raise err(path, f"a shape must be a list of integers, got {short(shape)}")
    if len(shape) > MAX_DIMS:
        raise err(path, f"a shape may have at most {MAX_DIMS} dimensions, got {len(shape)}")
    numel = 1
    for s in shape:
        if s < 0:
            raise err(path, f"a shape must not have negative sizes, got {short(list(shape))}")
        numel *= s
    if numel > MAX_NUMEL:
        raise err(path, f"shape {short(list(shape))} has {numel:.3g} elements, more than the limit of {MAX_NUMEL}"
                  if numel > 10**15 else
                  f"shape {list(shape)} has {numel} elements, more than the limit of {MAX_NUMEL}")
    return tuple(shape)


def check_dtype(dtype: Any, path: tuple, err: Err, allowed: tuple = DTYPES) -> str:
    if not isinstance(dtype, str) or dtype not in allowed:
        raise err(path, f"unsupported dtype {short(dtype)}; expected one of {', '.join(allowed)}")
    return dtype


_NUMBER_TYPES = {int, float, bool}


def _same_values(got: tuple, want) -> bool:
    """Nested values of shape ``got`` fill a tensor of shape ``want``: one number for one element, or the
    nested lists of an empty tensor, which stop at its first zero dim (a (0, 3) tensor lists as ``[]``, a
    (2, 0, 4) one as ``[[], []]``)."""
    want = tuple(want)
    if got == () and math.prod(want) == 1:
        return True
    return 0 in want and got == want[:want.index(0) + 1]


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
        if set(map(type, value)) <= _NUMBER_TYPES:  # a row of numbers: no call per element
            return (len(value),)
        inner = _nested_shape(value[0], path, err, depth + 1)
        for v in value[1:]:
            if _nested_shape(v, path, err, depth + 1) != inner:
                raise err(path, "nested list is ragged: rows have different lengths")
        shape = (len(value),) + inner
        if math.prod(shape) > MAX_NUMEL:
            raise err(path, f"values have {math.prod(shape)} elements, more than the limit of {MAX_NUMEL}")
        return shape
    if isinstance(value, str):
        raise err(path, f"expected a tensor value, got the string {short(value)}")
    raise err(path, f"expected a tensor value, got {type(value).__name__}")


def _side_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a side file, or None."""
    if not isinstance(name, str):
        return f"'file' must be the name of an .npz file in the graph's folder, got {short(name)}"
    if name == "":
        return ("'file' is empty: name an .npz file in the graph's folder, or leave 'file' out "
                "for the default (the graph's stem + .npz)")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"side file name {short(name)} contains a NUL or control character"
    if os.path.isabs(name) or name.startswith("~"):
        return f"side file {short(name)} must be a path relative to the graph's folder"
    if not name.endswith(".npz"):
        return f"side file must be an .npz file, got {short(name)}"
    return None


class SideFiles:
    """Opens ``.npz`` side files once per graph, refusing paths outside its folder.

    Members are read with ``zipfile`` and ``numpy.lib.format`` directly (never
    ``np.load``): headers are checked before any data is read.
    """

    def __init__(self, base_dir: str | None, default_name: str | None, source: str = "<memory>"):
        self.base_dir = base_dir
        self.default_name = default_name
        #: The graph's display name, for errors found while materialising (a side file changed).
        self.source = source
        self._open: dict[str, zipfile.ZipFile] = {}
        #: (file, member) -> (shape, dtype, fortran_order, ZipInfo) from the member's header.
        self._headers: dict[tuple[str, str], tuple] = {}
        #: side file name as the graph gives it -> its real path, once ``resolve`` has checked it. Not under the
        #: lock: two threads racing on one name store the same path.
        self._resolved: dict[str, str] = {}
        #: Added to every random spec's seed (``--seed``): another reproducible draw.
        self.seed_offset = 0
        self._lock = threading.Lock()  # guards _open/_headers and reads (nodes materialize from several threads)

    def resolve(self, name: Any, path: tuple, err: Err) -> str:
        """The real path of side file ``name`` (None: the default), checked to be a regular file in the folder."""
        if name is None:  # the graph's own stem + .npz: named by the user who named the graph, not by the file
            name = self.default_name
            if name is None or self.base_dir is None:
                raise err(path, "npz side files need a graph loaded from a file")
        else:
            problem = _side_name_problem(name)
            if problem:
                raise err(path, problem)
        if self.base_dir is None:
            raise err(path, "npz side files need a graph loaded from a file")
        full = self._resolved.get(name)
        if full is not None:  # checked once per name: later reads go to the archive opened from that path
            return full
        try:
            base = os.path.realpath(self.base_dir)
            full = os.path.realpath(os.path.join(base, name))
            inside = os.path.commonpath([base, full]) == base
        except (ValueError, OSError):
            inside = False
        if not inside:
            raise err(path, f"side file {short(name)} lies outside the graph's folder")
        try:
            st = os.stat(full)
        except (OSError, ValueError):
            raise err(path, f"side file {short(name)} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise err(path, f"side file {short(name)} is not a regular file")
        self._resolved[name] = full
        return full

    def opened(self) -> list[str]:
        """The real paths of the side files read so far (after loading: every side file the graph names)."""
        with self._lock:
            return sorted(self._open)

    def _archive(self, full: str, path: tuple, err: Err) -> zipfile.ZipFile:
        zf = self._open.get(full)
        if zf is not None:
            return zf
        label = os.path.basename(full)
        try:
            # O_NONBLOCK: a FIFO swapped in after resolve() cannot block the open.
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise err(path, f"cannot read side file {label!r}: {exc.strerror or exc}") from None
        f = os.fdopen(fd, "rb")
        problem = None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                problem = f"side file {label!r} is not a regular file"
            else:
                problem = self._directory_problem(f, label)
                if problem is None:
                    zf = zipfile.ZipFile(f)
        except Exception as exc:  # a corrupt side file is bad input, not a crash
            problem = f"cannot read side file {label!r}: not an .npz (zip) archive ({_why(exc)})"
        if problem is not None:
            f.close()
            raise err(path, problem)
        self._open[full] = zf
        return zf

    @staticmethod
    def _directory_problem(f, label: str) -> str | None:
        """Refuse archives whose central directory lists absurdly many members (before reading it)."""
        end = getattr(zipfile, "_EndRecData", None)  # private but stable; without it zipfile's own checks remain
        if end is None:
            return None
        rec = end(f)
        if rec is None:
            raise zipfile.BadZipFile("no end of central directory record")
        entries, size = rec[zipfile._ECD_ENTRIES_TOTAL], rec[zipfile._ECD_SIZE]
        if entries > MAX_NPZ_MEMBERS or size > MAX_NPZ_DIRECTORY:
            return (f"side file {label!r} lists {entries} members in {size} bytes of directory, "
                    f"more than the limit of {MAX_NPZ_MEMBERS} members or {MAX_NPZ_DIRECTORY >> 20} MiB")
        return None

    def header(self, full: str, key: Any, path: tuple, err: Err) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of member ``key`` (checked), read from its ``.npy`` header only."""
        label = os.path.basename(full)
        if not isinstance(key, str):
            raise err(path, "npz key must be a string")
        with self._lock:
            cached = self._headers.get((full, key))
            if cached is not None:
                return cached[0], cached[1]
            zf = self._archive(full, path, err)
            info = None
            for name in (key + ".npy", key):
                info = zf.NameToInfo.get(name)
                if info is not None:
                    break
            if info is None:
                raise err(path, f"key {short(key)} is not in side file {label!r}")
            where = f"side file {label!r} member {short(key)}"
            if info.flag_bits & 0x1:
                raise err(path, f"{where} is encrypted")
            try:
                with zf.open(info) as f:
                    shape, fortran, dtype, offset = _read_npy_header(f)
            except _NpyProblem as exc:
                raise err(path, f"{where}: {exc}") from None
            except Exception as exc:
                raise err(path, f"{where} cannot be read: {_why(exc)}") from None
            if len(shape) > MAX_DIMS:
                raise err(path, f"{where} has {len(shape)} dimensions, more than the limit of {MAX_DIMS}")
            numel = math.prod(shape)
            if numel > MAX_NUMEL:
                raise err(path, f"{where} declares shape {short(list(shape))} ({numel:.3g} elements), "
                                f"more than the limit of {MAX_NUMEL}")
            expected = offset + numel * dtype.itemsize
            if info.file_size != expected:
                raise err(path, f"{where} holds {info.file_size} bytes but its header declares "
                                f"{expected} (shape {list(shape)}, {dtype.name}): the member is corrupt")
            self._headers[(full, key)] = (shape, dtype, fortran, info, path)
            return shape, dtype

    def read(self, full: str, key: str) -> np.ndarray:
        """The data of a member checked by ``header`` (raises ``GraphFileError`` if it changed or is corrupt)."""
        from autograd_run.errors import GraphFileError
        label = os.path.basename(full)
        fail = lambda p, m: GraphFileError(self.source, None, m)  # noqa: E731
        self.header(full, key, (), fail)
        with self._lock:
            shape, dtype, fortran, info, _ = self._headers[(full, key)]
            try:
                with self._open[full].open(info) as f:
                    _read_npy_header(f)
                    arr = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
                    view = memoryview(arr.reshape(-1, order="A").view(np.uint8)) if arr.size else memoryview(b"")
                    done, total = 0, arr.nbytes
                    while done < total:
                        n = f.readinto(view[done: done + (16 << 20)])
                        if not n:
                            raise _NpyProblem(f"the data ends after {done} of {total} bytes")
                        done += n
                    if f.read(1):  # also makes zipfile check the CRC at the end of the member
                        raise _NpyProblem("there is data after the array")
            except Exception as exc:
                raise GraphFileError(self.source, None,
                                     f"side file {label!r} member {short(key)} cannot be read: {_why(exc)}") from None
        return arr

    def verify(self, err: Err) -> None:
        """Read every member checked so far to its end (in chunks), so that a corrupt or
        truncated member (bad CRC, short deflate stream) is found now rather than at run."""
        with self._lock:
            for (full, key), (shape, dtype, fortran, info, path) in list(self._headers.items()):
                label = os.path.basename(full)
                try:
                    with self._open[full].open(info) as f:
                        left = info.file_size
                        while left > 0:
                            chunk = f.read(min(left, 16 << 20))
                            if not chunk:
                                raise _NpyProblem(f"the data ends {left} bytes early")
                            left -= len(chunk)
                        if f.read(1):
                            raise _NpyProblem("there is data after the array")
                except Exception as exc:
                    raise err(path, f"side file {label!r} member {short(key)} is corrupt: {_why(exc)}") from None

    def close(self) -> None:
        with self._lock:
            for zf in self._open.values():
                try:
                    zf.fp.close() if zf.fp else None
                    zf.close()
                except Exception:
                    pass
            self._open.clear()


class _NpyProblem(Exception):
    pass


def _why(exc: BaseException) -> str:
    """A short description of a read error, never suggesting to load pickles."""
    msg = str(exc) or type(exc).__name__
    if "pickle" in msg.lower():
        msg = "it holds Python objects, which autograd-run never loads"
    return msg[:200]


#: The header numpy itself writes for a numeric array (np.save/np.savez), exactly: descr, fortran_order,
#: shape, in that order, then the padding. Other headers (hand-made, reordered) take numpy's own parser,
#: which builds the dict with ast.literal_eval: 46 us a header here against 10 us for this pattern.
_NUMPY_HEADER = re.compile(rb"\{'descr': '([<>|=]?[a-zA-Z]\d{0,2})', 'fortran_order': (True|False), "
                           rb"'shape': \((|\d{1,19},|\d{1,19}(?:, \d{1,19})+)\), \} *\n")


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Parse an ``.npy`` header from a file-like object; refuse non-numeric dtypes."""
    fmt = np.lib.format
    magic = f.read(len(fmt.MAGIC_PREFIX) + 2)
    if len(magic) < len(fmt.MAGIC_PREFIX) + 2 or not magic.startswith(fmt.MAGIC_PREFIX):
        raise _NpyProblem("not a .npy array (no NumPy magic string)")
    version = (magic[-2], magic[-1])
    if version not in ((1, 0), (2, 0)):
        raise _NpyProblem(f"unsupported .npy format version {version[0]}.{version[1]}")
    width = 2 if version == (1, 0) else 4  # of the header's length field
    size_bytes = f.read(width)
    if len(size_bytes) != width:
        raise _NpyProblem("the .npy header ends early")
    size = int.from_bytes(size_bytes, "little")
    if size > MAX_NPY_HEADER:
        raise _NpyProblem(f"its .npy header is {size} bytes, more than the limit of {MAX_NPY_HEADER}")
    header = f.read(size)
    if len(header) != size:
        raise _NpyProblem("the .npy header ends early")
    m = _NUMPY_HEADER.fullmatch(header)
    if m is not None:
        try:
            dtype = np.dtype(m.group(1).decode("ascii"))
        except (TypeError, ValueError) as exc:
            raise _NpyProblem(f"its header names no dtype numpy knows ({_why(exc)})") from None
        fortran = m.group(2) == b"True"
        shape = tuple(int(d) for d in m.group(3).replace(b",", b" ").split())
    else:
        fake = io.BytesIO(magic + size_bytes + header)
        fake.seek(len(magic))
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(fake, max_header_size=MAX_NPY_HEADER)
    offset = len(magic) + len(size_bytes) + size
    if dtype.hasobject:
        raise _NpyProblem("it holds Python objects (pickled data), which autograd-run never loads; "
                          "save numeric arrays")
    if dtype.names is not None or dtype.subdtype is not None:
        raise _NpyProblem(f"it has a structured dtype {short(str(dtype))}; expected a numeric array")
    if dtype.kind in "SUaV":
        raise _NpyProblem(f"it holds strings or raw bytes ({dtype.str}), not numbers")
    if dtype.name not in SAVED_DTYPES:
        raise _NpyProblem(f"unsupported dtype {dtype.name!r}; expected one of {', '.join(SAVED_DTYPES)}")
    if not isinstance(shape, tuple) or any(type(s) is not int or s < 0 for s in shape):
        raise _NpyProblem(f"its header has an invalid shape {short(shape)}")
    return shape, bool(fortran), dtype, offset


def check_tensor(value: Any, path: tuple, err: Err, side: SideFiles,
                 shape: tuple[int, ...] | None = None, dtype: str | None = None,
                 allow_fill: bool = False) -> int:
    """Raise ``err(path, ...)`` unless ``value`` is a well-formed tensor spec; return its size in bytes.

    ``shape``/``dtype``, when given, are what the context expects (a root
    gradient, a variable's grad); explicit values must have exactly that
    shape. ``allow_fill``: the context is a gradient (``ones``/``zeros``
    allowed, dtypes limited to gradient dtypes).
    """
    if allow_fill and isinstance(value, bool):  # (a saved mask may be true/false; a gradient may not)
        raise err(path, "a gradient's values are numbers, not true or false")
    if isinstance(value, str):
        if allow_fill and value in ("ones", "zeros"):
            if shape is None:
                raise err(path, f"'{value}' needs a shape from the context")
            return math.prod(shape) * itemsize(dtype)
        raise err(path, f"unknown tensor value {short(value)}" + ("; expected 'ones', 'zeros', numbers or a spec" if allow_fill else ""))
    if isinstance(value, dict):
        kinds = [k for k in TENSOR_KEYS if k in value]
        if len(kinds) != 1:
            raise err(path, "a tensor spec needs exactly one of 'data', 'npz', 'random'")
        kind = kinds[0]
        allowed = {"data": {"data", "dtype", "shape"}, "npz": {"npz", "file", "dtype"},
                   "random": {"random", "shape", "dtype", "dist"}}[kind]
        extra = sorted(set(value) - allowed, key=str)
        if extra:
            raise err(path, f"unknown field {short(extra[0])} in a {kind!r} tensor spec")
        vdtype = None
        if "dtype" in value:
            vdtype = check_dtype(value["dtype"], path + ("dtype",), err, DTYPES if allow_fill else SAVED_DTYPES)
        declared = check_shape(value["shape"], path + ("shape",), err) if "shape" in value else None
        if declared is not None and shape is not None and declared != tuple(shape):
            raise err(path + ("shape",), f"shape {list(declared)} does not match the expected {list(shape)}")
        size = max(itemsize(vdtype or dtype), itemsize(dtype))
        if kind == "data":
            got = _nested_shape(value["data"], path + ("data",), err)
            want = declared if declared is not None else shape
            if want is not None and got != tuple(want) and not _same_values(got, want):
                raise err(path + ("data",), f"values have shape {list(got)}, expected {list(want)}")
            return math.prod(want if want is not None else got) * size
        if kind == "npz":
            full = side.resolve(value.get("file"), path + ("npz",), err)
            got, got_dtype = side.header(full, value["npz"], path + ("npz",), err)
            where = f"array {short(value['npz'])} in {os.path.basename(full)!r}"
            if shape is not None and got != tuple(shape) and not (math.prod(got) == 1 == math.prod(shape)):
                raise err(path + ("npz",), f"{where} has shape {list(got)}, expected {list(shape)}")
            if allow_fill and got_dtype.kind == "c" and dtype is not None and not dtype.startswith("complex"):
                raise err(path + ("npz",), f"{where} is {got_dtype.name}, but the gradient is {dtype}: "
                                           "casting would drop the imaginary part")
            if allow_fill and got_dtype.kind not in "fciub":
                raise err(path + ("npz",), f"{where} is {got_dtype.name}, not a number type")
            return math.prod(shape if shape is not None else got) * max(got_dtype.itemsize, size)
        seed = value["random"]
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise err(path + ("random",), "random seed must be a non-negative integer")
        if value.get("dist", "normal") not in ("normal", "uniform"):
            raise err(path + ("dist",), "dist must be 'normal' or 'uniform'")
        if declared is None and shape is None:
            raise err(path, "a random tensor needs a shape")
        return math.prod(declared if declared is not None else shape) * size
    got = _nested_shape(value, path, err)
    if shape is not None and got != tuple(shape) and not _same_values(got, shape):
        raise err(path, f"values have shape {list(got)}, expected {list(shape)}")
    return math.prod(shape if shape is not None else got) * itemsize(dtype)


def spec_shape(value: Any, side: SideFiles | None = None) -> tuple[int, ...] | None:
    """The shape of a checked tensor spec (None when the context gives it)."""
    if isinstance(value, dict):
        if "shape" in value:
            return tuple(value["shape"])
        if "data" in value:
            return _nested_shape(value["data"], (), lambda p, m: ValueError(m))
        if "npz" in value and side is not None:
            fail = lambda p, m: ValueError(m)  # noqa: E731 - checked at load already
            return side.header(side.resolve(value.get("file"), (), fail), value["npz"], (), fail)[0]
        return None
    if isinstance(value, (list, int, float)):
        return _nested_shape(value, (), lambda p, m: ValueError(m))
    return None


def spec_dtype(value: Any, side: SideFiles | None = None) -> str | None:
    """The dtype name of a checked tensor spec (None: the context's, float32 by default)."""
    if isinstance(value, dict):
        if "dtype" in value:
            return value["dtype"]
        if "npz" in value and side is not None:
            fail = lambda p, m: ValueError(m)  # noqa: E731 - checked at load already
            return side.header(side.resolve(value.get("file"), (), fail), value["npz"], (), fail)[1].name
    return None


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
            from autograd_run.errors import GraphFileError
            fail = lambda p, m: GraphFileError(side.source, None, m)  # noqa: E731 - checked at load already
            full = side.resolve(value.get("file"), (), fail)
            arr = side.read(full, value["npz"])
            if shape is not None and arr.shape != tuple(shape):
                arr = arr.reshape(shape)
            return arr.astype(dt, copy=False) if dt else arr
        # seeded in bulk (graphs.seeding), big tensors drawn in chunks: the same values either way
        return draw_many([_random_spec(value, side, shp, dt)])[0]
    arr = np.asarray(value, dtype=dtype or "float32")
    return arr.reshape(shape) if shape is not None else arr


def _random_spec(value: dict, side: SideFiles, shape, dtype) -> tuple:
    return (value["random"] + side.seed_offset, shape, dtype or "float32", value.get("dist", "normal"))


def materialize_random_many(values: list[dict], side: SideFiles) -> list[np.ndarray]:
    """``materialize`` of many (checked) ``random`` specs that carry their shapes, seeded in bulk
    (``graphs.seeding``: the same values, several times faster than one at a time)."""
    off = side.seed_offset
    return draw_many([(v["random"] + off, tuple(v["shape"]), v.get("dtype") or "float32", v.get("dist", "normal"))
                      for v in values])
