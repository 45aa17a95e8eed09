"""Semantic validation: a decoded ``GraphSpec`` becomes a checked ``Graph``.

Every problem raises ``GraphFileError`` naming the file, the place (through
the locator) and what is wrong. Checks, in order: format and mode; node ids,
ops, sequence numbers, input metadata, the number of next edges (the op's
``outputs``); variables; edges (targets exist,
input_nr in range); AccumulateGrad wiring; cycles (reported as a path of
ids); gradient shapes between producers and consumers; saved values against
their op's declared kinds (``autograd_run.ops.spec``), saved tensor specs
and side files; attrs; roots and their gradients; requested inputs;
``meta.reference``; and last the memory budget: the bytes the graph will
materialise (saved tensors, root gradients, variable gradients, reference
gradients, the largest single gradient) must fit ``max_bytes``.

``check_python_nodes`` is separate: a graph with ``python`` nodes is valid,
but running it imports and calls code, so callers refuse it unless allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from itertools import compress
from operator import attrgetter
from typing import Any

from autograd_run.errors import GraphFileError
from autograd_run.graphs import tensors
from autograd_run.graphs.checkpoints import check_checkpoints
from autograd_run.graphs.model import (
    ACCUMULATE_GRAD_SEQ, CPU, EMPTY, FORMAT, TORCH_DEVICE_TYPES, Device, Edge, Graph, InputMeta, Node, Root, Variable,
    derive, has_scalar_strings, saves_tensors,
)
from autograd_run.graphs.schema import UNSET, GraphSpec, NodeSpec
from autograd_run.ops import ACCUMULATE_GRAD, COST, GRAPH_ROOT, PYTHON, OpSpec, Outputs, lookup
from autograd_run.ops.arrays import number, signed

#: The largest DDP bucket cap (``bucket_cap_mb``, ``first_bucket_mb``) a graph file or a simulation takes, in MiB:
#: 1e9 MiB (about a petabyte), far past any model, and small enough that the cap in bytes (doubled by the
#: slack's what-if) stays a whole number well below ``sys.maxsize``.
MAX_CAP_MB = 1e9
#: The most nodes a graph file may have (ten million: the scale work's goal, with room); what loading one
#: takes is checked against the machine's memory before parsing (``load.load_memory_estimate``).
MAX_NODES = 20_000_000
MAX_STREAM = 1 << 16
#: A cost node may spin or sleep at most a minute, or multiply at most 8192x8192 matrices.
MAX_COST_US = 60e6
MAX_COST_FLOPS = 2 * 8192 ** 3
#: Saved ``ints``/``sizes`` lists: at most this many entries (a cat of this many tensors).
MAX_SAVED_LIST = 65_536
#: Saved ``int``/``ints`` values: int64, or PyTorch's uint64 spelling of negatives (2**64-1 is -1).
INT_MIN, INT_END = -(2**63), 2**64
SIZE_END = 2**63

#: Memory budget where nothing says what the machine has: the bytes a graph may ask to materialise, unless
#: ``max_bytes`` says otherwise (``default_max_bytes`` takes half of the memory available instead).
DEFAULT_MAX_BYTES = 4 << 30

_KIND_TEXT = {
    "tensor": "a tensor (a number, a nested list of numbers, or a spec with 'data', 'npz' or 'random')",
    "sizes": "a list of non-negative integers (sizes)",
    "ints": "a list of integers",
    "int": "an integer",
    "scalar": "a number",
    "bool": "true or false",
    "str": "a string",
    "tensors": "a list whose entries are null, the name of another saved field, inline 'data' or numbers",
}


def _number_text(text: str) -> bool:
    """Whether ``text`` spells a real or complex number, as ``ops.arrays.number`` reads saved Scalars."""
    if len(text) > 64:
        return False
    try:
        number(text)
    except ValueError:
        return False
    return True


def _address_space_used() -> int:
    """Bytes of address space the process maps now (Linux ``/proc/self/statm``; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0


def _available_bytes() -> int | None:
    """The memory the system reports available (``MemAvailable`` in ``/proc/meminfo``), else the physical
    memory, else None (nothing known)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_available() -> int | None:
    """The memory this process may still take: what the system reports available, at most what a cgroup
    (container) memory limit leaves and what the process's address-space limit (``RLIMIT_AS``) leaves
    above the address space it already uses (thread stacks and allocator arenas count there); None where
    nothing says."""
    limit = _available_bytes()
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text.isdigit():
            used = 0
            try:
                with open("/sys/fs/cgroup/memory.current") as f:
                    used = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            left = max(int(text) - used, 0)
            limit = left if limit is None else min(limit, left)
    except OSError:
        pass
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            left = max(soft - _address_space_used(), 0)
            limit = left if limit is None else min(limit, left)
    except (ImportError, ValueError, OSError):
        pass
    return limit


def default_max_bytes() -> int:
    """The default memory budget: half of what ``memory_available`` says (4 GiB where nothing says), so a
    limit is never all data."""
    available = memory_available()
    return max(available // 2 if available is not None else DEFAULT_MAX_BYTES, 1 << 20)


def format_bytes(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def parse_byte_size(text: str) -> int:
    """``"8GiB"``, ``"512 MiB"``, ``"2G"``, ``"1e9"`` or a plain byte count; ValueError otherwise."""
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("tib", 1 << 40), ("gib", 1 << 30), ("mib", 1 << 20), ("kib", 1 << 10),
                         ("tb", 10**12), ("gb", 10**9), ("mb", 10**6), ("kb", 10**3),
                         ("t", 1 << 40), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            t, m = t[: -len(suffix)], mult
            break
    else:
        m = 1
    try:
        v = float(t)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 8GiB, 512MiB)") from None
    if not math.isfinite(v) or v <= 0 or v * m > 2**62:
        raise ValueError(f"not a size: {text!r} (e.g. 8GiB, 512MiB)")
    return int(v * m)


_hooks_of = attrgetter("hooks")


def check_python_nodes(graph: Graph, allow_python: bool = False) -> None:
    """Refuse a graph with ``python`` nodes unless ``allow_python``: running them imports and calls code.

    Call it before running a graph (``run`` and ``validate`` take ``--allow-python``).
    """
    if allow_python:
        return
    variables = graph.variables.values()
    for v in compress(variables, map(_hooks_of, variables)):  # (the few with hooks, picked at C speed)
        for k, h in enumerate(v.hooks):
            if h.get("kind") == "python":
                raise GraphFileError(graph.source, f"variable {tensors.short(v.name)} hooks[{k}]",
                                     f"a python hook (it calls {h.get('callable')!r:.80}): running it imports and "
                                     "calls Python code named by the file; pass --allow-python if you trust this file")
    for n in graph.hooked_nodes:  # a non-leaf tensor's hooks, held on its consumer node's slot
        for k, h in enumerate(n.attrs.get("hooks") or ()):
            if h.get("kind") == "python":
                raise GraphFileError(graph.source, f"node {tensors.short(n.id)} at $.nodes[{n.index}].attrs.hooks[{k}]",
                                     f"a python hook (it calls {h.get('callable')!r:.80}): running it imports and "
                                     "calls Python code named by the file; pass --allow-python if you trust this file")
    found = graph.nodes_of(PYTHON)
    if not found:
        return
    n = found[0]
    # a custom autograd.Function captured with its backward names its class; other python nodes their callable
    call = (n.attrs.get("function") or n.attrs.get("callable")) if n.attrs else None
    if isinstance(call, str) and n.attrs.get("script"):
        call = f"{call} from {n.attrs['script']}"
    what = ("a python node" + (f" (it calls {call!r:.80})" if isinstance(call, str) else "")
            + (f", and {len(found) - 1} more" if len(found) > 1 else "")
            + ": running it imports and calls Python code named by the file; "
              "pass --allow-python if you trust this file")
    raise GraphFileError(graph.source, f"node {tensors.short(n.id)} at $.nodes[{n.index}]", what)


def is_expandable_to(shape: tuple[int, ...], desired: tuple[int, ...]) -> bool:
    """PyTorch's ``is_expandable_to``: can ``shape`` broadcast up to ``desired``?"""
    if len(shape) > len(desired):
        return False
    for i in range(1, len(shape) + 1):
        s, d = shape[-i], desired[-i]
        if s != d and s != 1:
            return False
    return True


_NUMBERS = frozenset((int, float))


_BACKWARD_SUFFIX = re.compile(r"Backward\d+(_copy)?$")


def _forward_name(op_name: str) -> str | None:
    """PyTorch's forward op of a generated node name (``AddBackward0``: add,
    ``MaxPool2DWithIndicesBackward0``: max_pool2d_with_indices); None for other names."""
    m = _BACKWARD_SUFFIX.search(op_name)
    if m is None or not op_name[:1].isupper():
        return None
    stem = re.sub(r"(\d)D", r"\1d", op_name[:m.start()])
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem).lower() + (m.group(1) or "")


def outputs_mismatch(op: OpSpec, node_id: str, have: int, want: int) -> str:
    """The message for a node of ``op`` with ``have`` next edges where the op has ``want`` outputs."""
    if isinstance(op.outputs, Outputs):
        why = op.outputs.text
    else:
        fwd = _forward_name(op.name)
        why = f"one per differentiable input of the forward {fwd}" if fwd else "one per input of its forward op"
    return (f"{op.name} node {tensors.short(node_id)} has {have} next edge{'' if have == 1 else 's'}; "
            f"{op.name} has {want} output{'' if want == 1 else 's'} ({why}; an input that needs no gradient "
            "keeps its place as a null edge)")


def _shape_like(name: str) -> bool:
    """A ``sizes`` field that is a tensor's shape (``self_sym_sizes``), not a list of lengths (cat's ``sizes``)."""
    return name.endswith(("_sym_sizes", "_sizes_opt")) or name == "normalized_shape"



def _out_shape(node: Node, edges: int) -> tuple | list | None:
    """The shape of the gradient a node sends along each of its ``edges`` where its op fixes it, else None: an
    elementwise op's is its incoming gradient's; an op that expands its gradient (``OpSpec.expands_to``) gives
    those sizes; an op that declares ``OpSpec.grad_shapes`` (a matrix product, t()) gives a list, one per edge
    (None where not known), from its gradient and its saved matrices where the file writes them as specs."""
    op = node.op
    if op.expands_to:
        sizes = node.saved.get(op.expands_to)
        return tuple(sizes) if type(sizes) is list else None
    if op.grad_shapes == "part":
        return _PART
    if op.grad_shapes is not None:
        return [_grad_shape(node, op.grad_shapes.get(k)) for k in range(edges)]
    return node.inputs[0].shape if op.elementwise and node.inputs else None


#: ``_out_shape`` of an op whose gradient k is a part of its incoming one (``OpSpec.grad_shapes`` "part"): known
#: edge by edge, with the consumer's shape (``_part_shape``).
_PART = object()


def _part_shape(node: Node, k: int, want: tuple) -> tuple | None:
    """A cat's gradient k: its incoming gradient with the saved ``dim`` (default 0) sized as its saved ``sizes[k]``,
    or else as the consumer's slot ``want`` there (then only the other dims are checked). None where not known
    (a 1-d empty input, which cat skips, or values of other types: the saved-value checks speak of those)."""
    grad = node.inputs[0].shape if node.inputs else ()
    dim = node.saved.get("dim", 0)
    if not grad or type(dim) is not int or not -(1 << 63) <= dim < (1 << 64):
        return None
    if want == (0,):  # a legacy 1-d empty input: cat skips it, its gradient is (0,) too
        return None
    d = signed(dim) % len(grad)
    sizes = node.saved.get("sizes")
    if type(sizes) is list:
        size = sizes[k] if k < len(sizes) else None
    elif len(want) > d:
        size = want[d]
    else:
        return None
    if type(size) is not int:
        return None
    return grad[:d] + (size,) + grad[d + 1:]


def _grad_shape(node: Node, spec) -> tuple | None:
    if spec is None or not node.inputs:
        return None
    grad = node.inputs[0].shape
    if spec == "reversed":
        return tuple(reversed(grad))
    out = []
    for src, d in spec:
        if src == "grad":
            shape = grad
        else:
            v = node.saved.get(src)
            shape = v.get("shape") if type(v) is dict else None
            if type(shape) is not list:
                return None
        if d >= len(shape) or type(shape[d]) is not int:
            return None
        out.append(shape[d])
    return tuple(out)


def _is_result(field: str) -> bool:
    """Whether a saved field is an op's output (``result``, ``result0``, ``result1``...): in PyTorch a tensor,
    never a wrapped Python number (those are inputs), so a plain number there is refused at load (the rules
    read a result's dtype)."""
    return field == "result" or (field.startswith("result") and field[6:].isdigit())

#: A key that is not a string, in the id table while the node loops fill it (taken out after them): a dict
#: that ever held one keeps each entry's hash beside its key, so a probe that meets another id compares
#: hashes in the table instead of reading that id's string from wherever it lies (CPython's dicts of
#: string keys keep no hashes). At 1e6 nodes, where each such read misses the cache: load 2.54 -> 2.44 s.
_GENERAL_KEYS = None


class _Build:
    """What the node loops share (``_Checker.build_nodes``, ``link_edges``), Python's and the compiled ones."""

    __slots__ = ("variables", "metas", "nodes", "by_id", "ops", "default_seqs", "max_device_index", "forward",
                 "nexts", "ints")

    def __init__(self, variables: dict, metas: dict, size: int):
        self.variables = variables
        #: Each distinct input metadata spec's checked ``InputMeta`` (the checker's, shared).
        self.metas = metas
        self.nodes: list[Node] = []
        #: Made at the graph's size where the compiled loops are (no resizing through a million inserts).
        self.by_id: dict[str, Node] = _FAST.presized(size + 1) if _FAST is not None else {}
        self.by_id[_GENERAL_KEYS] = None
        #: op text -> (OpSpec, required saved fields, declared fields, OpSpec.needed_for_output, fields
        #: that take plain numbers, the fixed number of outputs (-1: none), the per-node count (an
        #: Outputs or None), the op's tensor_fields, its scalar_fields, the rank its input 0 must have (-1: any),
        #: the dims its saved matrices share with that input (OpSpec.matrix_dims) or None)
        self.ops: dict[str, tuple] = {}
        #: Some node had no seq (given the topological number once the graph is whole).
        self.default_seqs = False
        self.max_device_index = -1
        #: Every edge so far points to a later node in the list.
        self.forward = True
        #: Each node's next edges as the file gives them (its spec's ``next``), kept from its spec (let go
        #: once its node is made) until ``link_edges`` makes its edges (then None).
        self.nexts: list = []
        #: The compiled loops' table of int objects by value, for the nodes' index, seq and topo_nr: slot v holds
        #: the first int of value v put in a node (None before), so equal numbers share one object (``_build``'s
        #: shared_int; the Python loops make their own). Empty: nothing shared.
        self.ints: list = []


def _compiled_loops():
    """(the compiled node loops ``_build`` or None, why): None where it is not built, AUTOGRAD_RUN_PURE_PYTHON
    is set, or ``Node``/``NodeSpec`` are no longer laid out as it expects."""
    if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
        return None, "Python (AUTOGRAD_RUN_PURE_PYTHON is set)"
    try:
        from autograd_run.graphs import _build
    except ImportError as exc:
        return None, f"Python (the compiled loops are not built: {exc})"
    names = tuple(f.name for f in dataclasses.fields(Node))
    if not _build.configure(Node, names, NodeSpec, Edge, UNSET, CPU, EMPTY, ACCUMULATE_GRAD, ACCUMULATE_GRAD_SEQ):
        return None, "Python (Node or NodeSpec is not laid out as the compiled loops expect)"
    # check_value's quick paths: quick_random_numel's limits; the dtypes narrower than float32 (check_broadcast)
    # and check_cost's limits (an attrs that is only a cost check_attrs would pass is not handed to it)
    _build.configure_checks(tensors.MAX_DIMS, tensors.MAX_NUMEL,
                            frozenset(d for d in tensors.SAVED_DTYPES if tensors.itemsize(d) < tensors.itemsize(None)),
                            MAX_COST_US, MAX_COST_FLOPS)
    return _build, "compiled"


def _compiled_variables() -> bool:
    """Whether the compiled loops may make the variables too (``Variable`` and ``VariableSpec`` laid out as
    ``_build`` expects, ``Variable``'s defaults from ``grad`` on handed to it)."""
    if _FAST is None:
        return False
    from autograd_run.graphs.schema import VariableSpec
    fields = dataclasses.fields(Variable)
    names = tuple(f.name for f in fields)
    if names[:4] != ("name", "shape", "dtype", "device"):
        return False
    return _FAST.configure_variables(Variable, names, tuple(f.default for f in fields[4:]), VariableSpec,
                                     VariableSpec.__struct_fields__)


def _compiled_colons():
    """``_build.kept_colons`` where the compiled loops run and MetaSpec's and NodeSpec's fields are the ones it
    counts (``load._json_has_no_duplicates``), else None."""
    if _FAST is None:
        return None
    from autograd_run.graphs.schema import MetaSpec
    if not _FAST.configure_colons(MetaSpec, NodeSpec.__struct_fields__, MetaSpec.__struct_fields__):
        return None
    return _FAST.kept_colons


#: The compiled node loops in use (None: the Python ones), and why (``--version`` shows it).
_FAST, WHY = _compiled_loops()
#: Whether ``_FAST`` makes the common variables too.
_FAST_VARS = _compiled_variables()
#: The colons msgspec's encoder would write for a list of node specs, counted without encoding them (or None
#: for a value it does not count), where compiled; None here.
KEPT_COLONS = _compiled_colons()


class _Checker:
    def __init__(self, spec: GraphSpec, source: str, base_dir: str | None, locator,
                 side_name: str | None = None, max_bytes: int | None = None, check_data: bool = False):
        self.spec = spec
        self.check_data = check_data
        self.source = source
        self.locator = locator
        if side_name is None and base_dir:
            side_name = os.path.splitext(os.path.basename(source))[0] + ".npz"
        self.side = tensors.SideFiles(base_dir, side_name, source)
        self._metas: dict = {}
        #: The device type PyTorch does not name (a renamed PrivateUse1 backend), by where it was first seen.
        self._renamed: dict[str, tuple] = {}
        #: Nodes whose attrs hold tensor hooks (``attrs.hooks``): the graph's ``hooked_nodes``.
        self.hooked: list = []
        #: The path where each distinct input metadata was first seen (for the budget message).
        self._meta_paths: dict = {}
        self.base_dir = base_dir
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        #: Memory budget: bytes by category, and the largest contributors as (bytes, path).
        self.bytes = {"saved tensors": 0, "root gradients": 0, "variable gradients": 0,
                      "reference gradients": 0, "working gradients": 0}
        self._top: list[tuple[int, tuple, str]] = []
        self._top_min = 0

    def err(self, path: tuple, what: str) -> GraphFileError:
        return GraphFileError(self.source, self.locator.where(path), what)

    # -- memory budget ------------------------------------------------------
    def count(self, nbytes: int, category: str, path: tuple) -> None:
        self.bytes[category] += nbytes
        if nbytes > self._top_min:
            self._note(nbytes, path, category)

    def _note(self, nbytes: int, path: tuple, category: str = "saved tensors") -> None:
        top = self._top
        top.append((nbytes, path, category))
        if len(top) > 5:
            top.sort(key=lambda t: -t[0])
            del top[5:]
            self._top_min = top[-1][0]

    def gradient(self, nbytes: int, path: tuple) -> None:
        """One gradient the run may hold (an input slot, a shape a rule allocates).

        The largest counts twice ("working gradients"): a node holds its incoming
        gradient while it makes the next one. An estimate, not a bound: many
        gradients may wait in input buffers at once.
        """
        if 2 * nbytes > self.bytes["working gradients"]:
            self.bytes["working gradients"] = 2 * nbytes
            self._top = [t for t in self._top if t[2] != "working gradients"]  # one entry: the largest
            self._top_min = 0
            self._note(2 * nbytes, path, "working gradients")

    def check_budget(self) -> None:
        total = sum(self.bytes.values())
        if total <= self.max_bytes:
            return
        top = sorted(self._top, key=lambda t: -t[0])[:3]
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.bytes.items() if v)
        largest = "; ".join(f"{format_bytes(b)} at {self._label(p)} ({c})" for b, p, c in top)
        raise self.err(top[0][1] if top else (),
                       f"the graph needs {format_bytes(total)} of memory ({parts}), more than the memory budget "
                       f"of {format_bytes(self.max_bytes)}; largest: {largest}; raise the budget "
                       f"(--max-memory) only if this machine has the memory")

    def _label(self, path: tuple) -> str:
        from autograd_run.graphs.locate import format_path
        if len(path) >= 2 and path[0] == "nodes" and isinstance(path[1], int) and path[1] < len(self.spec.nodes):
            return f"node {tensors.short(self.spec.nodes[path[1]].id)} at {format_path(path)}"
        return format_path(path)

    # -- pieces -------------------------------------------------------------
    #: At most this many hooks on one variable.
    MAX_HOOKS = 16

    def hooks(self, value: Any, path: tuple, slots: int | None = None) -> tuple:
        """A variable's ``hooks`` (``engine.tensor_hooks``): a list of known kinds with finite numbers; a node's
        (``slots``: its input count) also name the ``slot`` each runs on, and may be ``observed``."""
        from autograd_run.graphs.model import HOOK_KINDS as KINDS
        if not isinstance(value, list):
            raise self.err(path, f"must be a list of hooks, got {tensors.short(value)}")
        if len(value) > self.MAX_HOOKS:
            raise self.err(path, f"{len(value)} hooks is more than the limit of {self.MAX_HOOKS}")
        out = []
        for k, h in enumerate(value):
            p = path + (k,)
            if not isinstance(h, dict) or not isinstance(h.get("kind"), str) or h["kind"] not in KINDS:
                raise self.err(p + ("kind",), f"must be one of {', '.join(KINDS)}, got "
                               f"{tensors.short(h.get('kind') if isinstance(h, dict) else h)}")
            kind = h["kind"]
            extra = ("slot", "observed") if slots is not None else ()
            for key in h:
                if key != "kind" and key not in KINDS[kind] and key not in extra:
                    raise self.err(p + (key,), f"unknown field for a {kind} hook (fields: "
                                   f"{', '.join(KINDS[kind] + extra)})")
            if slots is not None:
                slot = h.get("slot")
                if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < slots:
                    raise self.err(p + ("slot",), f"must be an input slot of the node (0 to {slots - 1}), "
                                   f"got {tensors.short(slot)}")
                if not isinstance(h.get("observed", False), bool):
                    raise self.err(p + ("observed",), "must be true or false")

            def number(key, required=False, low=None):
                v = h.get(key)
                if v is None:
                    if required:
                        raise self.err(p + (key,), f"a {kind} hook needs {key}")
                    return None
                if key == "norm_type" and v in ("inf", "Infinity"):
                    return v
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise self.err(p + (key,), f"must be a finite number, got {tensors.short(v)}")
                if low is not None and v < low:
                    raise self.err(p + (key,), f"must be at least {low}, got {v}")
                return v
            if kind == "scale":
                number("by", required=True)
            elif kind == "clamp":
                lo, hi = number("min"), number("max")
                if lo is None and hi is None:
                    raise self.err(p, "a clamp hook needs min or max")
                if lo is not None and hi is not None and lo > hi:
                    raise self.err(p, f"min {lo} is above max {hi}")
            elif kind == "clip_norm":
                number("max_norm", required=True, low=0)
                nt = number("norm_type", low=1e-6)
                number("eps", low=0)
                if nt is not None and not isinstance(nt, str) and nt <= 0:
                    raise self.err(p + ("norm_type",), "must be above 0")
            else:
                target = h.get("callable")
                if not isinstance(target, str) or ":" not in target or len(target) > 400:
                    raise self.err(p + ("callable",), f"must be 'module:function', got {tensors.short(target)}")
            out.append(dict(h))
        return tuple(out)

    def device(self, text: Any, path: tuple) -> Device:
        dev = Device.parse(text) if isinstance(text, str) else None
        if dev is None:
            raise self.err(path, Device.explain(text) or f"unknown device {tensors.short(text)}")
        if dev.type not in TORCH_DEVICE_TYPES:  # a renamed PrivateUse1 backend: PyTorch has one name for it
            self._renamed.setdefault(dev.type, path)
            if len(self._renamed) > 1:
                other = next(t for t in self._renamed if t != dev.type)
                raise self.err(path, f"device type {dev.type!r} is unknown to PyTorch, and so is {other!r} ("
                                     f"{self.locator.where(self._renamed[other])}): a process has at most one "
                                     "renamed PrivateUse1 backend, so one of them is a typo")
        return dev

    def _meta(self, m, path: tuple) -> InputMeta:
        shape = tensors.check_shape(m.shape, path + ("shape",), self.err)
        dtype = "float32" if m.dtype is UNSET else m.dtype
        tensors.check_dtype(dtype, path + ("dtype",), self.err)
        dev = CPU if m.device is UNSET else self.device(m.device, path + ("device",))
        stream = 0 if m.stream is UNSET else m.stream
        if not 0 <= stream < MAX_STREAM:
            raise self.err(path + ("stream",), f"stream must be in [0, {MAX_STREAM}), got {tensors.short(stream)}")
        meta = InputMeta(shape, dtype, dev, stream)
        self._meta_paths[meta] = path
        return meta

    def resolve_op(self, ns, i: int) -> OpSpec:
        p = ("nodes", i)
        if not ns.name:
            raise self.err(p + ("name",), "node name must not be empty")
        explicit = ns.op is not UNSET and ns.op is not None
        op_text = ns.op if explicit else ns.name
        op = lookup(op_text)
        if op is GRAPH_ROOT:
            raise self.err(p + ("op",) if explicit else p + ("name",),
                           "GraphRoot nodes are created by the engine, not declared in a file")
        if op is None:
            where = p + ("op",) if explicit else p + ("name",)
            hint = "" if explicit else " (give 'op: opaque' to replay it without a rule)"
            raise self.err(where, f"unknown op {tensors.short(op_text)}{hint}")
        return op

    #: The ``ddp`` section's fields: (type test, what it must be).
    DDP_FIELDS = {
        "bucket_cap_mb": (lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                          and v * (1 << 20) >= 1 and v <= MAX_CAP_MB,
                          f"a size in MiB of at least one byte and at most {MAX_CAP_MB:g}"),
        "bucket_cap_mb_list": (lambda v: isinstance(v, list) and 1 <= len(v) <= 1 << 16 and all(
            not isinstance(c, bool) and isinstance(c, (int, float)) and math.isfinite(c) and c * (1 << 20) >= 1
            and c <= MAX_CAP_MB for c in v),
            f"a list of 1 to 65536 sizes in MiB, each of at least one byte and at most {MAX_CAP_MB:g}"),
        "find_unused_parameters": (lambda v: isinstance(v, bool), "true or false"),
        "static_graph": (lambda v: isinstance(v, bool), "true or false"),
        "gradient_as_bucket_view": (lambda v: isinstance(v, bool), "true or false"),
        "world_size": (lambda v: type(v) is int and 1 <= v <= 1 << 20, "a whole number from 1 to 1048576"),
    }

    def check_ddp(self, d: dict, has_parameters: bool) -> dict:
        """The ``ddp`` section: DistributedDataParallel's settings when the graph was captured under it."""
        if not has_parameters:
            raise self.err(("ddp",), "a ddp section needs the parameters section (DDP's parameter order)")
        for key, value in d.items():
            rule = self.DDP_FIELDS.get(key)
            if rule is None:
                raise self.err(("ddp", key), f"unknown field (fields: {', '.join(self.DDP_FIELDS)})")
            if not rule[0](value):
                raise self.err(("ddp", key), f"must be {rule[1]}, got {tensors.short(value)}")
        return dict(d)

    #: The ``storage`` section: at most this many blocks and saved-tensor entries; a block's size in bytes below
    #: 2**50 (a bound on what one storage can be).
    MAX_STORAGE_BLOCKS = 20_000_000
    MAX_BLOCK_BYTES = 1 << 50

    def check_storage(self, d: Any, variables: dict, by_id: dict) -> dict:
        """The ``storage`` section (``capture``'s record of which storage each saved tensor lives in)."""
        short = tensors.short
        if not isinstance(d, dict):
            raise self.err(("storage",), f"must be a mapping with 'blocks' and 'saved', got {short(d)}")
        for key in d:
            if key not in ("blocks", "saved"):
                raise self.err(("storage", key), "unknown field (fields: blocks, saved)")
        blocks = d.get("blocks")
        if not isinstance(blocks, list):
            raise self.err(("storage", "blocks"), f"must be a list of [bytes] or [bytes, variable], got {short(blocks)}")
        if len(blocks) > self.MAX_STORAGE_BLOCKS:
            raise self.err(("storage", "blocks"), f"at most {self.MAX_STORAGE_BLOCKS} blocks, got {len(blocks)}")
        out_blocks = []
        for k, b in enumerate(blocks):
            p = ("storage", "blocks", k)
            if not isinstance(b, list) or not 1 <= len(b) <= 3:
                raise self.err(p, f"a block must be [bytes], [bytes, variable] or [bytes, null, group], "
                               f"got {short(b)}")
            nbytes = b[0]
            if type(nbytes) is not int or not 0 <= nbytes < self.MAX_BLOCK_BYTES:
                raise self.err(p + (0,), f"a block's size must be a whole number of bytes from 0 to 2**50, "
                               f"got {short(nbytes)}")
            var = b[1] if len(b) >= 2 else None
            if var is not None and (not isinstance(var, str) or var not in variables):
                raise self.err(p + (1,), f"unknown variable {short(var)}")
            group = b[2] if len(b) == 3 else None
            if len(b) == 3 and (type(group) is not int or not 0 <= group < self.MAX_STORAGE_BLOCKS or var is not None):
                raise self.err(p + (2,), f"a recompute group is a whole number from 0 (and the block no "
                               f"variable's), got {short(group)}")
            out_blocks.append((nbytes, var, group))
        saved = d.get("saved", {})
        if not isinstance(saved, dict):
            raise self.err(("storage", "saved"), f"must map node ids to {{field: block}}, got {short(saved)}")
        n = len(out_blocks)
        count = 0
        for nid, fields in saved.items():
            p = ("storage", "saved", nid)
            node = by_id.get(nid)
            if node is None:
                raise self.err(p, f"unknown node {short(nid)}")
            if not isinstance(fields, dict):
                raise self.err(p, f"must map saved fields to block indices, got {short(fields)}")
            count += len(fields)
            if count > self.MAX_STORAGE_BLOCKS:
                raise self.err(p, f"at most {self.MAX_STORAGE_BLOCKS} saved tensors in all")
            for field_name, block in fields.items():
                if field_name not in node.saved:
                    raise self.err(p + (field_name,), f"node {short(nid)} saves no field {short(field_name)}")
                if type(block) is not int or not 0 <= block < n:
                    raise self.err(p + (field_name,), f"must be a block index from 0 to {n - 1}, got {short(block)}")
        return {"blocks": out_blocks, "saved": saved}

    #: The ``fsdp`` section's fields and those of one of its units.
    FSDP_FIELDS = ("units", "root", "final_order", "world_size", "recompute")
    FSDP_UNIT_FIELDS = ("name", "parameters", "reshard_after_forward", "pre_backward", "post_backward",
                        "backward_prefetch", "forward_prefetch", "param_dtype", "reduce_dtype", "reduce_grads",
                        "all_reduce_grads", "reshard_after_backward", "unshard_in_backward", "forward_calls")
    #: At most this many units (one per module at the most; a bound on the work before it starts).
    MAX_FSDP_UNITS = 100_000

    def check_fsdp(self, d: dict, variables: dict, by_id: dict) -> dict:
        """The ``fsdp`` section: FSDP2's units (``capture.fsdp``), every name checked against the graph."""
        short = tensors.short
        for key in d:
            if key not in self.FSDP_FIELDS:
                raise self.err(("fsdp", key), f"unknown field (fields: {', '.join(self.FSDP_FIELDS)})")
        units = d.get("units")
        if not isinstance(units, list) or not units:
            raise self.err(("fsdp", "units"), f"must be a non-empty list of units, got {short(units)}")
        if len(units) > self.MAX_FSDP_UNITS:
            raise self.err(("fsdp", "units"), f"at most {self.MAX_FSDP_UNITS} units, got {len(units)}")
        names: set[str] = set()
        owner: dict[str, str] = {}
        out_units = []
        for k, u in enumerate(units):
            p = ("fsdp", "units", k)
            if not isinstance(u, dict):
                raise self.err(p, f"a unit must be a mapping, got {short(u)}")
            for key in u:
                if key not in self.FSDP_UNIT_FIELDS:
                    raise self.err(p + (key,), f"unknown field (fields: {', '.join(self.FSDP_UNIT_FIELDS)})")
            name = u.get("name")
            if not isinstance(name, str) or len(name) > 1000:
                raise self.err(p + ("name",), f"must be the module's name (a string), got {short(name)}")
            if name in names:
                raise self.err(p + ("name",), f"unit {short(name)} is listed twice")
            names.add(name)
            params = u.get("parameters")
            if not isinstance(params, list):
                raise self.err(p + ("parameters",), f"must be a list of variable names, got {short(params)}")
            for j, pname in enumerate(params):
                var = variables.get(pname) if isinstance(pname, str) else None
                if var is None:
                    raise self.err(p + ("parameters", j), f"unknown parameter {short(pname)}: not a variable")
                if not var.requires_grad:
                    raise self.err(p + ("parameters", j), f"parameter {short(pname)} does not require grad")
                if pname in owner:
                    raise self.err(p + ("parameters", j), f"parameter {short(pname)} is in unit "
                                                          f"{short(owner[pname])} already")
                owner[pname] = name
            rec = {"name": name, "parameters": list(params)}
            raf = u.get("reshard_after_forward", True)
            if not isinstance(raf, bool):
                raise self.err(p + ("reshard_after_forward",), f"must be true or false, got {short(raf)}")
            rec["reshard_after_forward"] = raf
            for key in ("reduce_grads", "all_reduce_grads", "reshard_after_backward", "unshard_in_backward"):
                if key in u:  # (FSDP's defaults: true)
                    if not isinstance(u[key], bool):
                        raise self.err(p + (key,), f"must be true or false, got {short(u[key])}")
                    rec[key] = u[key]
            for key in ("pre_backward", "post_backward"):
                nid = u.get(key)
                if nid is not None and not (isinstance(nid, str) and nid in by_id):
                    raise self.err(p + (key,), f"must be a node id of this graph or null, got {short(nid)}")
                rec[key] = nid
            for key in ("param_dtype", "reduce_dtype"):
                if u.get(key) is not None:
                    tensors.check_dtype(u[key], p + (key,), self.err)
                    rec[key] = u[key]
            if "forward_calls" in u:  # how many times its module ran in the forward (written when more than once)
                n = u["forward_calls"]
                if not (type(n) is int and 1 <= n <= 1 << 20):
                    raise self.err(p + ("forward_calls",), f"must be a whole number from 1 to 1048576, got {short(n)}")
                rec["forward_calls"] = n
            for key in ("backward_prefetch", "forward_prefetch"):
                if u.get(key) is not None:  # (null: none set, as for the dtypes)
                    rec[key] = u[key]
            out_units.append(rec)
        for k, rec in enumerate(out_units):
            for key in ("backward_prefetch", "forward_prefetch"):
                targets = rec.get(key)
                if targets is None:
                    continue
                if not isinstance(targets, list) or len(targets) > len(out_units):
                    raise self.err(("fsdp", "units", k, key), f"must be a list of unit names, got {short(targets)}")
                for j, t in enumerate(targets):
                    if not isinstance(t, str) or t not in names:
                        raise self.err(("fsdp", "units", k, key, j), f"unknown unit {short(t)}")
        out = {"units": out_units}
        if "root" in d:
            if not isinstance(d["root"], str) or d["root"] not in names:
                raise self.err(("fsdp", "root"), f"must be the name of one of the units, got {short(d['root'])}")
            out["root"] = d["root"]
        if "final_order" in d:
            order = d["final_order"]
            if not (isinstance(order, list) and all(isinstance(n, str) for n in order)
                    and sorted(order) == sorted(names)):
                raise self.err(("fsdp", "final_order"), f"must list every unit's name once, got {short(order)}")
            out["final_order"] = list(order)
        if "recompute" in d:  # [[node id, unit name], ...]: pre-forwards that activation checkpointing re-ran
            rec = d["recompute"]
            if not isinstance(rec, list) or len(rec) > self.MAX_FSDP_UNITS:
                raise self.err(("fsdp", "recompute"), f"must be a list of at most {self.MAX_FSDP_UNITS} "
                                                      f"[node id, unit name] pairs, got {short(rec)}")
            for j, pair in enumerate(rec):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise self.err(("fsdp", "recompute", j), f"must be [node id, unit name], got {short(pair)}")
                if not (isinstance(pair[0], str) and pair[0] in by_id):
                    raise self.err(("fsdp", "recompute", j, 0), f"must be a node id of this graph, "
                                                                f"got {short(pair[0])}")
                if not (isinstance(pair[1], str) and pair[1] in names):
                    raise self.err(("fsdp", "recompute", j, 1), f"unknown unit {short(pair[1])}")
            out["recompute"] = [list(pair) for pair in rec]
        if "world_size" in d:
            w = d["world_size"]
            if not (type(w) is int and 1 <= w <= 1 << 20):
                raise self.err(("fsdp", "world_size"), f"must be a whole number from 1 to 1048576, got {short(w)}")
            out["world_size"] = w
        return out

    def check_accumulate(self, ns, i: int, inputs: list, variables: dict) -> list:
        p = ("nodes", i)
        if ns.variable is UNSET or ns.variable is None:
            raise self.err(p, "an AccumulateGrad node needs 'variable'")
        var = variables.get(ns.variable)
        if var is None:
            raise self.err(p + ("variable",), f"unknown variable {tensors.short(ns.variable)}")
        if var.node is not None:
            raise self.err(p + ("variable",), f"variable {tensors.short(ns.variable)} already has AccumulateGrad node {tensors.short(var.node.id)}")
        if not var.requires_grad:
            raise self.err(p + ("variable",), f"variable {tensors.short(ns.variable)} does not require grad: it has no AccumulateGrad node")
        if ns.next:
            raise self.err(p + ("next",), "an AccumulateGrad node has no next edges")
        if not inputs:
            inputs = [InputMeta(var.shape, var.dtype, var.device, 0)]
        if len(inputs) != 1:
            raise self.err(p + ("inputs",), "an AccumulateGrad node has exactly one input")
        if inputs[0].shape != var.shape:
            raise self.err(p + ("inputs", 0, "shape"),
                           f"input shape {list(inputs[0].shape)} does not match variable {tensors.short(var.name)} shape {list(var.shape)}")
        if inputs[0].device != var.device:  # (an AccumulateGrad's input is its variable's, as PyTorch makes it)
            raise self.err(p + ("inputs", 0, "device"),
                           f"input device {inputs[0].device} does not match variable {tensors.short(var.name)} "
                           f"device {var.device}")
        return inputs

    # -- the whole graph ----------------------------------------------------
    def run(self) -> Graph:
        spec = self.spec
        if spec.format != FORMAT:
            raise self.err(("format",), f"unsupported format {tensors.short(spec.format)}; expected {FORMAT!r}")
        mode = "backward" if spec.mode is UNSET else spec.mode
        if mode not in ("backward", "grad"):
            raise self.err(("mode",), f"mode must be 'backward' or 'grad', got {tensors.short(mode)}")
        if len(spec.nodes) > MAX_NODES:
            raise self.err(("nodes",), f"{len(spec.nodes)} nodes is more than the limit of {MAX_NODES}")
        if not spec.nodes:
            raise self.err(("nodes",), "a graph needs at least one node")

        variables: dict[str, Variable] = {}
        initial_grads: dict[str, int] = {}
        # (shape, dtype, device) as written -> checked (shape, dtype, device, bytes of a gradient): a model's
        # parameters come in a few shapes, each checked once.
        checked: dict[tuple, tuple] = {}
        var_bytes: list[int] = []
        spec_vars = spec.variables or []
        fast_vars = _FAST if _FAST_VARS else None
        self._loop(len(spec_vars),
                   fast_vars and (lambda i: fast_vars.build_variables(spec_vars, i, variables, checked, var_bytes)),
                   lambda lo, hi: self._variables_py(spec_vars, lo, hi, variables, initial_grads, checked,
                                                     var_bytes))
        del checked

        st = _Build(variables, self._metas, len(spec.nodes))
        if _FAST is not None:  # values up to twice the node count: indexes, seqs and topological numbers
            st.ints = [None] * (2 * len(spec.nodes) + 16)
        self.build_nodes(st)
        self.link_edges(st)
        del st.by_id[_GENERAL_KEYS]
        self.check_segments(st)
        nodes, by_id, metas, forward = st.nodes, st.by_id, st.metas, st.forward
        max_device_index, default_seqs = st.max_device_index, st.default_seqs

        graph = Graph(nodes, [], variables, list(spec.inputs or ()), mode, dict(spec.meta or {}),
                      self.source, self.base_dir, by_id)
        graph.max_device_index = max_device_index
        graph.hooked_nodes = self.hooked
        # Every input slot's meta is one of the interned metas, or an AccumulateGrad's made from its variable.
        graph.slot_dtypes = frozenset({m.dtype for m in metas.values()} | {v.dtype for v in variables.values()})
        # Every node's op was resolved through the op-text cache, so its values are the graph's ops.
        graph.op_set = frozenset(info[0] for info in st.ops.values())
        try:
            ints = st.ints
            derive(graph, prepared=True, forward=forward,
                   topo_in=_FAST and (lambda nodes, reverse: _FAST.topo_in(nodes, reverse, ints)))
        except ValueError as exc:
            cycle = exc.args[0]
            src = cycle[-2]
            k = next(k for k, e in enumerate(src.next) if e is not None and e.node is cycle[-1])
            raise self.err(("nodes", src.index, "next", k), "cycle: " + " -> ".join(n.id for n in cycle)) from None
        st.ints = ints = []  # the table goes (16 MB at a million nodes); the nodes keep the ints they share
        # Default sequence numbers: the topological number (nodes nearer the root run first).
        if default_seqs:
            for node in nodes:
                if node.seq < 0:
                    node.seq = node.topo_nr
        check_checkpoints(graph, self.err)

        for i, r in enumerate(spec.roots):
            p = ("roots", i)
            target = by_id.get(r.node)
            if target is None:
                raise self.err(p + ("node",), f"root edge to missing node {tensors.short(r.node)}")
            input_nr = 0 if r.input_nr is UNSET else r.input_nr
            if not 0 <= input_nr < len(target.inputs):
                raise self.err(p + ("input_nr",),
                               f"input_nr {tensors.short(input_nr)} out of range: node {tensors.short(r.node)} has {len(target.inputs)} input(s)")
            meta = target.inputs[input_nr]
            grad = "ones" if r.grad is UNSET else r.grad
            nbytes = tensors.check_tensor(grad, p + ("grad",), self.err, self.side, meta.shape, meta.dtype,
                                          allow_fill=True)
            self.count(nbytes, "root gradients", p + ("grad",))
            graph.roots.append(Root(Edge(target, input_nr), grad))
        if not graph.roots:
            raise self.err(("roots",), "a graph needs at least one root")

        for i, name in enumerate(graph.inputs):
            var = variables.get(name)
            if var is None and name not in by_id:
                raise self.err(("inputs", i), f"unknown input {tensors.short(name)}: not a variable or node id")
        if mode == "grad" and not graph.inputs:
            raise self.err(("inputs",), "mode 'grad' needs 'inputs' (grad requires non-empty inputs)")
        seen_params: set[str] = set()
        for i, name in enumerate(spec.parameters or ()):
            var = variables.get(name)
            if var is None:
                raise self.err(("parameters", i), f"unknown parameter {tensors.short(name)}: not a variable")
            if not var.requires_grad:
                raise self.err(("parameters", i), f"parameter {tensors.short(name)} does not require grad")
            if name in seen_params:
                raise self.err(("parameters", i), f"parameter {tensors.short(name)} is listed twice")
            seen_params.add(name)
        graph.parameters = list(spec.parameters or ())
        if spec.ddp is not UNSET:
            graph.ddp = self.check_ddp(spec.ddp, bool(graph.parameters))
        if spec.fsdp is not UNSET:
            if not isinstance(spec.fsdp, dict):
                raise self.err(("fsdp",), f"must be a mapping, got {tensors.short(spec.fsdp)}")
            graph.fsdp = self.check_fsdp(spec.fsdp, variables, by_id)
        if spec.storage is not UNSET:
            graph.storage = self.check_storage(spec.storage, variables, by_id)

        values = list(variables.values())
        self._loop(len(values),
                   fast_vars and (lambda i: fast_vars.variable_bytes(self, values, var_bytes, initial_grads, i)),
                   lambda lo, hi: self._variable_bytes_py(values, var_bytes, initial_grads, lo, hi))
        self.check_reference(graph)
        for meta, path in self._meta_paths.items():
            self.gradient(math.prod(meta.shape) * tensors.itemsize(meta.dtype), path)
        self.check_budget()
        if self.check_data:
            self.side.verify(self.err)
        return graph

    # -- variables ------------------------------------------------------------
    # As for the nodes below: the compiled ``_build`` does the common variables, and hands the rest (one at a
    # time) to these loops, which are the whole definition.
    def _variables_py(self, spec_vars: list, lo: int, hi: int, variables: dict, initial_grads: dict,
                      checked: dict, var_bytes: list) -> None:
        """Variables lo..hi-1: each checked, its ``Variable`` made; the bytes of its gradient kept in
        ``var_bytes`` (counted once the nodes say which variables are reached: ``_variable_bytes_py``)."""
        for i in range(lo, hi):
            v = spec_vars[i]
            name = v.name
            if not name or name in variables:
                p = ("variables", i, "name")
                raise self.err(p, "variable name must not be empty" if not name
                               else f"duplicate variable name {tensors.short(name)}")
            key = (tuple(v.shape), v.dtype, v.device)
            got = checked.get(key)
            if got is None:
                p = ("variables", i)
                shape = tensors.check_shape(v.shape, p + ("shape",), self.err)
                dtype = "float32" if v.dtype is UNSET else v.dtype
                tensors.check_dtype(dtype, p + ("dtype",), self.err)
                dev = CPU if v.device is UNSET else self.device(v.device, p + ("device",))
                got = checked[key] = (shape, dtype, dev, math.prod(shape) * tensors.itemsize(dtype))
            shape, dtype, dev, nbytes = got
            var_bytes.append(nbytes)
            if v.grad is UNSET and v.requires_grad is UNSET and v.hooks is UNSET:  # the common variable
                variables[name] = Variable(name, shape, dtype, dev)  # (positional, defaults: half the time)
                continue
            grad = None if v.grad is UNSET else v.grad
            if grad is not None:
                initial_grads[name] = tensors.check_tensor(grad, ("variables", i, "grad"), self.err, self.side,
                                                           shape, dtype, allow_fill=True)
            requires_grad = v.requires_grad is UNSET or v.requires_grad
            hooks = () if v.hooks is UNSET else self.hooks(v.hooks, ("variables", i, "hooks"))
            variables[name] = Variable(name, shape, dtype, dev, grad, requires_grad=requires_grad, hooks=hooks)

    def _variable_bytes_py(self, values: list, var_bytes: list, initial_grads: dict, lo: int, hi: int) -> None:
        """Count variables lo..hi-1's gradients in the budget: one a variable's node makes, or its initial
        ``.grad``, whichever is larger."""
        count = self.count
        for i in range(lo, hi):
            v = values[i]
            own = var_bytes[i] if v.node is not None else 0
            if initial_grads:
                own = max(own, initial_grads.get(v.name, 0))
            count(own, "variable gradients", ("variables", i))

    # -- nodes and edges ------------------------------------------------------
    # Both loops run in the compiled ``_build`` where it is built: it does every node it can and hands
    # the first one it cannot (an unknown op text or metadata met for the first time, an
    # AccumulateGrad, a saved null, anything wrong: every error) to the Python loop here, for that one
    # node, then goes on. The Python loops are the whole definition; the compiled one is a subset.
    def build_nodes(self, st: "_Build") -> None:
        """Make each node spec's ``Node`` (checked, its derived fields set), in file order."""
        self._loop(len(self.spec.nodes), _FAST and (lambda i: _FAST.build_nodes(self, self.spec.nodes, st, i)),
                   lambda lo, hi: self._nodes_py(st, lo, hi))

    def link_edges(self, st: "_Build") -> None:
        """Each node's next edges (``Edge`` tuples to their targets); consumers are left to ``ensure_consumers``."""
        self._loop(len(self.spec.nodes), _FAST and (lambda i: _FAST.link_edges(st.nexts, st, i)),
                   lambda lo, hi: self._edges_py(st, lo, hi))

    @staticmethod
    def _loop(n: int, fast, slow) -> None:
        """Items 0..n-1 through ``fast(i)`` (the compiled loop: returns the first index it did not do), each
        one it leaves through ``slow(i, i + 1)``; all of them through ``slow`` where there is no ``fast``."""
        if fast is None:
            slow(0, n)
            return
        i = fast(0)
        while i < n:
            slow(i, i + 1)
            i = fast(i + 1)

    def _nodes_py(self, st: "_Build", lo: int, hi: int) -> None:
        spec_nodes = self.spec.nodes
        nodes, by_id, ops, metas, variables, nexts = st.nodes, st.by_id, st.ops, st.metas, st.variables, st.nexts
        new_node = Node
        intern = sys.intern  # one name object per distinct name (~60 B a node)
        acc = ACCUMULATE_GRAD
        max_seq = ACCUMULATE_GRAD_SEQ
        unset = UNSET
        check_value = self.check_value
        numbers = _NUMBERS
        default_seqs = st.default_seqs
        max_device_index = st.max_device_index
        last_text = None
        for i in range(lo, hi):
            ns = spec_nodes[i]
            nid = ns.id
            if not nid or nid in by_id:
                p = ("nodes", i, "id")
                raise self.err(p, "node id must not be empty" if not nid else f"duplicate node id {tensors.short(nid)}")
            op_text = ns.op
            if op_text is unset or op_text is None:
                op_text = ns.name
            if op_text != last_text:
                info = ops.get(op_text)
                if info is None:
                    op = self.resolve_op(ns, i)
                    info = ops[op_text] = (op, tuple(k for k, f in op.saved.items() if not f.optional), op.saved,
                                           op.needed_for_output or None,
                                           frozenset(k for k, f in op.saved.items() if f.kind == "scalar" or
                                                     (f.kind == "tensor" and op.matrix_rank is None
                                                      and not _is_result(k))),
                                           op.outputs if type(op.outputs) is int else -1,
                                           op.outputs if isinstance(op.outputs, Outputs) else None,
                                           op.tensor_fields, op.scalar_fields,
                                           -1 if op.matrix_rank is None else op.matrix_rank, op.matrix_dims)
                op, required, fields, needs, takes_numbers, n_out, count_out = info[:7]
                rank = info[9]
                last_text = op_text
            seq = ns.seq
            if seq is unset:
                seq = None
            elif seq is not None and not 0 <= seq <= max_seq:
                raise self.err(("nodes", i, "seq"), f"seq must be in [0, 2**64-1], got {tensors.short(seq)}")
            fwd_thread = ns.fwd_thread
            if fwd_thread is unset:
                fwd_thread = None
            elif fwd_thread is not None and not 0 <= fwd_thread < 2**63:
                raise self.err(("nodes", i, "fwd_thread"), f"fwd_thread must be in [0, 2**63), got {tensors.short(fwd_thread)}")
            ins = ns.inputs
            device, stream, cpu = CPU, 0, True
            if not ins:
                inputs = []
            elif len(ins) == 1:  # the common case, without a comprehension's frame
                meta = metas.get(ins[0])
                if meta is None:
                    meta = metas[ins[0]] = self._meta(ins[0], ("nodes", i, "inputs", 0))
                inputs = [meta]
                d = meta.device
                if d is not CPU and d.type != "cpu":
                    device, stream, cpu = d, meta.stream, False
            else:
                inputs = [metas.get(m) for m in ins]
                if None in inputs:
                    for j, m in enumerate(ins):
                        if inputs[j] is None:
                            inputs[j] = metas[m] = self._meta(m, ("nodes", i, "inputs", j))
            variable = ns.variable
            if op is acc:
                inputs = self.check_accumulate(ns, i, inputs, variables)
                if seq is None:
                    seq = max_seq
            elif variable is not unset and variable is not None:
                raise self.err(("nodes", i, "variable"), "only AccumulateGrad nodes name a variable")
            else:
                variable = None
            if rank >= 0 and inputs and len(inputs[0].shape) != rank:
                raise self.err(("nodes", i, "inputs", 0, "shape"),
                               f"input 0 of {op.name} node {tensors.short(nid)} has shape {list(inputs[0].shape)}, "
                               f"but the gradient it receives, of {_forward_name(op.name)}'s result, has {rank} "
                               "dimensions")
            saved = ns.saved
            attrs = ns.attrs
            # Derived here rather than in a pass of their own (model.derive_node does the same):
            # index, device/stream/cpu (the first non-CPU input), saves_tensors (consumers: when needed).
            if len(inputs) > 1 or op is acc:
                device, stream, cpu = CPU, 0, True
                for meta in inputs:
                    d = meta.device
                    if d is not CPU and d.type != "cpu":
                        device, stream, cpu = d, meta.stream, False
                        break
            if not cpu and device.index > max_device_index:
                max_device_index = device.index
            if seq is None:
                seq = -1
                default_seqs = True
            # its next list: the file's own, whose edges link_edges makes in place (no second list a node)
            node = new_node(nid, intern(ns.name), op, seq, ns.next if type(ns.next) is list else [], inputs,
                            saved or EMPTY, attrs or EMPTY, variable, fwd_thread, i, 0, device, stream, None, cpu)
            if op is acc:
                variables[variable].node = node
            nodes.append(node)
            by_id[nid] = node
            if saved:
                if saves_tensors(op, saved):
                    node.saves_tensors = True
                # Saved values against the op's declared kinds: plain numbers where numbers are
                # expected pass here; everything else (tensor specs, lists, errors) in check_value.
                nulls = None
                for key, value in saved.items():
                    if key in takes_numbers and type(value) in numbers:
                        continue
                    check_value(node, i, key, value, fields.get(key))
                    if value is None and key in op.scalar_fields:
                        nulls = (nulls or []) + [key]
                if nulls:  # an optional Scalar written null is absent (the rule's default), never None
                    node.saved = saved = {k: v for k, v in saved.items() if k not in nulls} or EMPTY
                if has_scalar_strings(op, saved):
                    node.saved_strings = True
            else:
                saved = EMPTY
            if required:
                self.check_required(node, i, required)
            # One next edge per output: an int compare on the common path (about 30 ns a node).
            if n_out >= 0:
                nxt = ns.next
                if (len(nxt) if nxt else 0) != n_out:
                    raise self.err(("nodes", i, "next"), outputs_mismatch(op, nid, len(nxt or ()), n_out))
            elif count_out is not None:
                nxt = ns.next
                want = count_out.count(node)
                if want is not None and len(nxt or ()) != want:
                    raise self.err(("nodes", i, "next"), outputs_mismatch(op, nid, len(nxt or ()), want))
            if needs is not None:
                nxt = ns.next or ()
                for k, key in needs:
                    if k < len(nxt) and nxt[k] is not None and saved.get(key) is None:
                        raise self.err(("nodes", i, "saved") if saved else ("nodes", i),
                                       f"{op.name} node {tensors.short(nid)} needs saved field {key!r} ({_KIND_TEXT['tensor']}) "
                                       f"for the gradient of its output {k}, which the file does not give")
            if attrs:
                self.check_attrs(node, i, attrs)
            # Its next edges kept for link_edges; the spec let go (the Node takes its place in the list, so an
            # error's place still names the node's id): its other objects are freed as the loop goes on, and
            # the nodes made next reuse their memory (a 1e6-node chain's load peaks at ~1.2 KB a node, not 1.5).
            nexts.append(ns.next)
            spec_nodes[i] = node
        st.default_seqs = default_seqs
        st.max_device_index = max_device_index

    def _edges_py(self, st: "_Build", lo: int, hi: int) -> None:
        # Edges, whether they all point forward in the list (model.derive's fast path), and gradient shapes out of
        # elementwise nodes. The file's edges of each node are let go once its edges are made.
        make_edge = tuple.__new__
        forward = st.forward
        nexts = st.nexts
        nodes, by_id = st.nodes, st.by_id
        for i in range(lo, hi):
            nxt = nexts[i]
            if not nxt:
                continue
            nexts[i] = None
            node = nodes[i]
            out = node.next
            in_place = out is nxt  # the file's list, made the node's (build_nodes): its items become the edges
            out_shape = _out_shape(node, len(nxt))
            for k, e in enumerate(nxt):
                if e is None:
                    if not in_place:
                        out.append(None)
                    continue
                tid, nr = e
                target = by_id.get(tid)
                if target is None:
                    raise self.err(("nodes", i, "next", k, 0), f"edge to missing node {tensors.short(tid)}")
                if not 0 <= nr < len(target.inputs):
                    raise self.err(("nodes", i, "next", k, 1),
                                   f"input_nr {tensors.short(nr)} out of range: node {tensors.short(tid)} has {len(target.inputs)} input(s)")
                got = out_shape[k] if type(out_shape) is list else out_shape
                if got is _PART:
                    got = _part_shape(node, k, target.inputs[nr].shape)
                if got is not None:
                    want = target.inputs[nr].shape
                    if want != got and not is_expandable_to(want, got):
                        raise self.err(("nodes", i, "next", k),
                                       f"{node.name} produces a gradient of shape {list(got)} for "
                                       f"{tensors.short(tid)} input {nr}, whose shape {list(want)} is not compatible")
                if in_place:
                    out[k] = make_edge(Edge, (target, nr))
                else:
                    out.append(make_edge(Edge, (target, nr)))
                if target.index <= i:
                    forward = False
        st.forward = forward

    def check_attrs(self, node: Node, i: int, attrs: dict) -> None:
        """The attrs the engine acts on must be well-formed and bounded (files are untrusted)."""
        p = ("nodes", i, "attrs")
        if "fail" in attrs and not isinstance(attrs["fail"], str):
            raise self.err(p + ("fail",), "attrs.fail must be a message string")
        if "nan" in attrs and not isinstance(attrs["nan"], bool):
            raise self.err(p + ("nan",), "attrs.nan must be true or false")
        if "trace" in attrs and not isinstance(attrs["trace"], str):
            raise self.err(p + ("trace",), "attrs.trace must be a string")
        if "hooks" in attrs:  # tensor hooks on the node's input slots (a non-leaf tensor's register_hook)
            self.hooks(attrs["hooks"], p + ("hooks",), slots=len(node.inputs))
            self.hooked.append(node)
        if node.op is PYTHON and "callable" in attrs and not (
                isinstance(attrs["callable"], str) and ":" in attrs["callable"]):
            raise self.err(p + ("callable",), "attrs.callable must be 'module:function'")
        if node.op is COST:
            self.check_cost(attrs.get("cost"), p + ("cost",))

    #: The shipped reentrant checkpoint callable (``engine.callables.checkpoint``), which the run and the
    #: simulation follow into its segment: ``attrs.segment_root`` and ``attrs.segment_input``.
    CHECKPOINT_CALLABLE = "autograd_run.engine.callables:checkpoint"

    def check_segments(self, st) -> None:
        """A shipped checkpoint node's segment names nodes of this graph, each with an input slot."""
        if all(info[0] is not PYTHON for info in st.ops.values()):  # no python node (st.ops: every node's op)
            return
        for node in st.nodes:
            if node.op is not PYTHON or not node.attrs or node.attrs.get("callable") != self.CHECKPOINT_CALLABLE:
                continue
            for key in ("segment_root", "segment_input"):
                nid = node.attrs.get(key)
                target = st.by_id.get(nid) if isinstance(nid, str) else None
                if target is None or not target.inputs:
                    raise self.err(("nodes", node.index, "attrs", key),
                                   f"must be the id of a node with an input slot (the checkpoint's segment), got "
                                   f"{tensors.short(nid)}")

    def check_cost(self, cost, p: tuple) -> None:
        if cost is None:
            return
        if not isinstance(cost, dict) or not set(cost) <= {"us", "flops", "mode"}:
            raise self.err(p, "attrs.cost must be a mapping with 'us' or 'flops' and an optional 'mode'")
        mode = cost.get("mode", "spin")
        if mode not in ("spin", "wait", "sleep", "matmul"):
            raise self.err(p + ("mode",), f"cost mode must be spin, wait, sleep or matmul, got {tensors.short(mode)}")
        for key, limit in (("us", MAX_COST_US), ("flops", MAX_COST_FLOPS)):
            if key not in cost:
                continue
            v = cost[key]  # null too: the run and the simulation read a given key as a number
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= limit:
                raise self.err(p + (key,), f"cost {key} must be a number in [0, {limit:g}], got {tensors.short(v)}")

    # -- saved values ---------------------------------------------------------
    def check_required(self, node: Node, i: int, required: tuple) -> None:
        saved = node.saved
        for key in required:
            if key not in saved:
                f = node.op.saved[key]
                raise self.err(("nodes", i, "saved") if saved else ("nodes", i),
                               f"{node.op.name} node {tensors.short(node.id)} needs saved field {key!r} ({_KIND_TEXT[f.kind]}), "
                               "which the file does not give")

    def check_value(self, node: Node, i: int, key: str, value: Any, f) -> None:
        """One saved value against its declared field ``f`` (None: undeclared, then only tensor specs are checked).

        Numbers where numbers are expected never get here (the caller's fast
        path); well-formed random specs take a short path. Undeclared fields
        are accepted: captures carry more than the rules read.
        """
        t = type(value)
        if f is None:
            if t is dict and tensors.is_tensor_spec(value):
                kind, optional = "tensor", True
            else:
                return
        else:
            kind, optional = f.kind, f.optional
        path = ("nodes", i, "saved", key)
        if kind == "tensor" and t is dict:
            n = tensors.quick_random_numel(value)
            if n >= 0 and (f is None or (len(value["shape"]) == (node.op.matrix_rank or len(value["shape"]))
                                         and self._fits(node, key, value["shape"]))):
                self.bytes["saved tensors"] += 4 * n
                if 4 * n > self._top_min:
                    self._note(4 * n, path)
                if node.op.elementwise and node.inputs:
                    self.check_broadcast(tuple(value["shape"]), node, path, key)
                return
        elif (kind == "int" and t is int and INT_MIN <= value < INT_END) or (kind == "bool" and t is bool) \
                or (kind == "str" and t is str):
            return
        if value is None:
            if optional:
                return
            raise self.err(path, f"saved {key!r} of {node.op.name} must be {_KIND_TEXT[kind]}, got null "
                                 "(it is not optional)")

        def bad(detail: str = "") -> GraphFileError:
            return self.err(path, f"saved {key!r} of {node.op.name} must be {_KIND_TEXT[kind]}, got "
                                  f"{tensors.short(value)}{detail}")
        rank = node.op.matrix_rank if kind == "tensor" and f is not None else None
        if kind == "tensor":
            if t is bool or t is int or t is float:  # a wrapped scalar
                if rank is not None:
                    raise bad(f" (a {rank}-dim array for {node.op.name}, not a number)")
                if _is_result(key):
                    raise self.err(path, f"saved {key!r} of {node.op.name} must be a tensor (a nested list of "
                                         "numbers, or a spec with 'data', 'npz' or 'random'), got the number "
                                         f"{tensors.short(value)}: an op's result is never a wrapped number")
                return
            if t is dict:
                if not tensors.is_tensor_spec(value):
                    raise bad()
                self.count(tensors.check_tensor(value, path, self.err, self.side), "saved tensors", path)
                shape = tensors.spec_shape(value, self.side)
                dtype = tensors.spec_dtype(value, self.side)
            elif t is list:
                shape = tensors._nested_shape(value, path, self.err)
                dtype = node.inputs[0].dtype if node.inputs else "float32"
                self.count(math.prod(shape) * tensors.itemsize(dtype), "saved tensors", path)
            else:
                raise bad()
            if shape is not None and node.op.elementwise and node.inputs:
                self.check_broadcast(shape, node, path, key, dtype)
            if rank is not None and shape is not None and len(shape) != rank:
                raise bad(f" (a {rank}-dim array for {node.op.name}, not one of shape {list(shape)})")
            if rank is not None and shape is not None and node.inputs:
                grad = node.inputs[0].shape
                for d, e in (node.op.matrix_dims or {}).get(key, ()):
                    if shape[d] != grad[e]:
                        raise self.err(path, f"saved {key!r} of {node.op.name} has shape {list(shape)}, which does "
                                             f"not fit the gradient the node receives, of shape {list(grad)} "
                                             f"({_forward_name(node.op.name)}'s result): its dim {d} "
                                             f"must be {grad[e]}")
        elif kind == "scalar":
            if t is str:  # what JSON cannot hold, as capture writes it ("(1-2j)", "inf", "nan"); YAML 1.1's "1e-3"
                if not _number_text(value):
                    raise bad(" (a string is accepted only when it spells a number, e.g. \"1e-3\", \"inf\", \"(1-2j)\")")
            elif t is not bool and t is not int and t is not float:  # a Scalar may be a bool in PyTorch
                raise bad()
        elif kind == "int":
            if t is int:
                raise bad(" (out of range: integers must lie in [-2**63, 2**64))")
            raise bad()
        elif kind in ("ints", "sizes"):
            if t is not list:
                raise bad()
            if len(value) > MAX_SAVED_LIST:
                raise bad(f" ({len(value)} entries, more than the limit of {MAX_SAVED_LIST})")
            lo, end = (0, SIZE_END) if kind == "sizes" else (INT_MIN, INT_END)
            for j, s in enumerate(value):
                if type(s) is not int:
                    raise self.err(path + (j,), f"saved {key!r} of {node.op.name} must be {_KIND_TEXT[kind]}; "
                                                f"entry {j} is {tensors.short(s)}")
                if not lo <= s < end:
                    raise self.err(path + (j,), f"saved {key!r} of {node.op.name} must be {_KIND_TEXT[kind]}; "
                                                f"entry {j} ({tensors.short(s)}) is out of range")
            if kind == "sizes" and _shape_like(key):
                if len(value) > tensors.MAX_DIMS:
                    raise bad(f" (more than {tensors.MAX_DIMS} dimensions)")
                numel = math.prod(value)
                if numel > tensors.MAX_NUMEL:
                    raise bad(f" ({numel:.3g} elements, more than the limit of {tensors.MAX_NUMEL})")
                dtype = node.inputs[0].dtype if node.inputs else "float32"
                self.gradient(numel * tensors.itemsize(dtype), path)
            if key == node.op.expands_to and node.inputs and not is_expandable_to(node.inputs[0].shape, value):
                raise self.err(path, f"saved {key!r} of {node.op.name} is {list(value)}, but the gradient the node "
                                     f"receives, of shape {list(node.inputs[0].shape)}, cannot be expanded to it "
                                     f"(the node's formula is grad.expand({key}))")
        elif kind == "tensors":
            if t is not list:
                raise bad()
            if len(value) > MAX_SAVED_LIST:
                raise bad(f" ({len(value)} entries, more than the limit of {MAX_SAVED_LIST})")
            for j, v in enumerate(value):
                entry = path + (j,)
                if v is None:
                    continue
                if type(v) is str:  # another saved field holds it (what capture writes: ``indices.0``)
                    if v == key or v not in node.saved:
                        raise self.err(entry, f"saved {key!r} of {node.op.name}: entry {j} names saved field "
                                              f"{tensors.short(v)}, which the node does not have")
                    continue
                if type(v) is dict and set(v) - {"data", "dtype", "shape"}:
                    raise self.err(entry, f"saved {key!r} of {node.op.name}: entry {j} must be inline data "
                                          "or the name of a saved field, not another tensor spec")
                if type(v) not in (dict, list, int, float, bool):
                    raise bad(f" (entry {j} is {tensors.short(v)})")
                self.count(tensors.check_tensor(v, entry, self.err, self.side), "saved tensors", entry)
        else:  # bool, str: the right types took the fast path
            raise bad()

    @staticmethod
    def _fits(node: Node, key: str, shape: list) -> bool:
        """Whether a saved matrix of a matrix product (``OpSpec.matrix_dims``) has the gradient's sizes where it
        shares its dims (True for every other field)."""
        dims = node.op.matrix_dims
        if dims is None or key not in dims or not node.inputs:
            return True
        grad = node.inputs[0].shape
        return all(shape[d] == grad[e] for d, e in dims[key])

    def check_broadcast(self, shape: tuple, node: Node, path: tuple, key: str, dtype: str | None = None) -> None:
        """An elementwise op's saved tensor must broadcast with the gradient it multiplies.

        The product has the broadcast shape (``[n, 1]`` times ``[1, m]`` is
        ``[n, m]``): it must stay under the element cap, and counts as a gradient.
        """
        meta = node.inputs[0]
        grad = meta.shape
        if shape == grad and tensors.itemsize(dtype) <= tensors.itemsize(meta.dtype):
            return  # the product is the size of the gradient, already counted
        out = []
        for k in range(1, max(len(shape), len(grad)) + 1):
            a = shape[-k] if k <= len(shape) else 1
            b = grad[-k] if k <= len(grad) else 1
            if a != b and a != 1 and b != 1:
                raise self.err(path, f"saved {key!r} has shape {list(shape)}, which does not broadcast "
                                     f"with the node's gradient shape {list(grad)}")
            out.append(b if a == 1 else a)
        numel = math.prod(out)
        if numel > tensors.MAX_NUMEL:
            raise self.err(path, f"saved {key!r} of shape {list(shape)} times the node's gradient of shape "
                                 f"{list(grad)} makes {numel:.3g} elements, more than the limit of {tensors.MAX_NUMEL}")
        self.gradient(numel * max(tensors.itemsize(dtype), tensors.itemsize(meta.dtype)), path)

    # -- meta.reference -------------------------------------------------------
    def check_reference(self, graph: Graph) -> None:
        """``meta.reference`` (a capture's PyTorch run): its order rows, depths and gradients.

        ``check`` reads them without checking again: every malformed reference is refused here,
        with its place, before anything runs (and its gradients count toward the memory budget).
        """
        ref = graph.meta.get("reference") if graph.meta else None
        if ref is None:
            return
        p = ("meta", "reference")
        if not isinstance(ref, dict):
            raise self.err(p, f"must be a mapping with 'order' and 'grads', got {type(ref).__name__}")
        order = ref.get("order")
        # required: check compares the order first
        if not isinstance(order, list):
            raise self.err(p + ("order",), f"must be a list of [name, seq, leaf] items, got {type(order).__name__}")
        for k, item in enumerate(order):
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and (item[1] is None or (type(item[1]) is int and 0 <= item[1] < 2**64))
                    and (item[2] is None or isinstance(item[2], str))):
                raise self.err(p + ("order", k), "each item must be [name, seq, leaf] (a string, an integer "
                                                 f"or null, a string or null), got {tensors.short(item)}")
        depths = ref.get("depths")
        if depths is not None:
            n = len(order) if isinstance(order, list) else 0
            if not (isinstance(depths, list) and len(depths) == n
                    and all(type(d) is int and 0 <= d < 2**31 for d in depths)):
                raise self.err(p + ("depths",), f"must be a list of {n} non-negative integers "
                                                "(one per item of meta.reference.order)")
        grads = ref.get("grads")
        if grads is None:
            return
        if not isinstance(grads, dict):
            raise self.err(p + ("grads",), f"must be a mapping of leaf names to tensors, got {type(grads).__name__}")
        for name, value in grads.items():
            if value is None:
                continue
            var = graph.variables.get(name)
            path = p + ("grads", name)
            nbytes = tensors.check_tensor(value, path, self.err, self.side,
                                          var.shape if var is not None else None,
                                          var.dtype if var is not None else None)
            self.count(nbytes, "reference gradients", path)


def build_graph(spec: GraphSpec, source: str, base_dir: str | None, locator,
                side_name: str | None = None, max_bytes: int | None = None, check_data: bool = False) -> Graph:
    """Validate ``spec`` into a ``Graph``; ``check_data`` also reads side-file data through (CRC)."""
    checker = _Checker(spec, source, base_dir, locator, side_name, max_bytes, check_data)
    graph = checker.run()
    graph.side_files = checker.side
    return graph
