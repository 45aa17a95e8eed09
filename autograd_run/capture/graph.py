"""Capture a real PyTorch backward graph into a graph file, with PyTorch's own reference run.

``from_torch(outputs, inputs=None, grad_outputs=None, names=None, path=None)``
walks ``grad_fn`` from the outputs: each node's name, ``_sequence_nr()``,
its forward thread (``fwd_thread``, see ``forward_thread_id``),
``next_functions``, input metadata (shape, dtype, device) and saved values
(the ``_saved_*`` attributes; tensors go to an ``.npz`` side file beside
``path``, so the replay computes real gradients). Nodes without a backward
rule here are captured as ``opaque`` with their shapes. AccumulateGrad
nodes carry their leaf's name (from ``names``, else ``leaf<k>``); a node whose
output 0 is a tensor named in ``names`` (a non-leaf) has that name as its id,
the others ``n<k>``.

It then runs PyTorch's own backward once (multithreading off, node
pre-hooks on every node) and stores PyTorch's reference in ``meta.reference``:
the executed order as ``[name, seq, leaf]``, each run's reentrant depth
(``depths``: 0, or more in a nested backward) and the leaf gradients. Leaves'
``.grad`` are left as they were. That run also finds what exists only while
it runs: the graphs that reentrant checkpoints and other custom Functions
build and differentiate (``capture.inner``), and the effect of tensor hooks
(``capture.hooks``); with ``reference=False`` it still runs when the graph
has custom Functions.

``values=False`` captures the structure only (for golden orders,
``autograd_run.capture.golden``): no saved values and no reference gradients, every
node but the leaves' ``opaque``. Such a graph replays PyTorch's scheduling
(the order does not depend on values) but not its gradients, and capturing
it costs a walk and one backward instead of copying every saved tensor.

torch is optional: it is imported only here (``pip install autograd-run[torch]``).
"""

from __future__ import annotations

import math
import os
import re
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from autograd_run.capture.inner import custom_function_reason, function_state, is_custom_function
from autograd_run.graphs.model import FORMAT
from autograd_run.ops import IDENTITY, OPAQUE, lookup

ACC = "torch::autograd::AccumulateGrad"
COPY_SLICES = "torch::autograd::CopySlices"
_TORCH_DTYPES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128",
                 "bool", "int8", "int16", "int32", "int64", "uint8"}


def _torch():
    try:
        import torch
    except ImportError as exc:  # torch is an optional extra
        raise RuntimeError("capturing needs PyTorch: pip install 'autograd-run[torch]'") from exc
    return torch


def _dtype(t) -> str:
    return str(t).replace("torch.", "")


def forward_thread_id(torch) -> int | None:
    """RecordFunction's id of the calling thread: the "Fwd thread id" of the nodes a forward on it creates.

    PyTorch stores it on each node (``Node::thread_id_``) but does not expose
    it to Python, so a one-op backward is profiled with the light legacy
    profiler (about 10 ms) and its node's forward thread read back. Nodes
    the captured forward created on other threads get this thread's id too;
    ``capture --profile`` reads each node's own from its profile. None when
    a profiler is already running or the probe fails. A thread's id does not
    change: it is probed once per thread (``_FWD_THREAD``).
    """
    known = getattr(_FWD_THREAD, "id", None)
    if known is not None:
        return known
    got = _probe_forward_thread(torch)
    if got is not None:
        _FWD_THREAD.id = got
    return got


#: The calling thread's RecordFunction id once probed (thread-local: it dies with its thread, whose Python ident
#: a later thread may reuse).
_FWD_THREAD = threading.local()


def _probe_forward_thread(torch) -> int | None:
    from autograd_run.native_stderr import silenced
    try:
        probe = torch.ones(1, requires_grad=True)
        with silenced(), torch.autograd.profiler.profile(use_kineto=False) as prof:
            (probe * 2).sum().backward()
        for e in prof.function_events:
            if e.name == "MulBackward0" and e.sequence_nr >= 0:
                return int(e.fwd_thread)
    except Exception:  # noqa: BLE001 - a profiler already active, or an API change: no thread recorded
        return None
    return None


def walk_grad_fns(roots, known=()) -> list:
    """Every grad_fn node reachable from ``roots`` (grad_fns), depth first, each once; nodes in ``known``
    are neither returned nor walked through."""
    seen, out, stack = set(known), [], list(reversed(roots))
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        for nf, _ in reversed(fn.next_functions):
            stack.append(nf)
    return out


def _storage_short(arr) -> bool:
    """Whether ``arr``'s storage holds fewer bytes than its view reaches (freed by ``resize_(0)``); False for a
    tensor whose storage cannot be asked (a subclass or layout without one: read as before)."""
    try:
        nbytes = arr.untyped_storage().nbytes()
        reach = arr.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(arr.shape, arr.stride()))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return nbytes < arr.element_size() * reach


class _Arrays:
    """Tensors to store: inline (no path) or in the side file."""

    def __init__(self, inline: bool):
        self.inline = inline
        self.arrays: dict[str, np.ndarray] = {}

    def put(self, key: str, t) -> dict:
        arr = t.detach().cpu()
        if arr.layout != _torch().strided:  # sparse gradients (Embedding(sparse=True)): the same values, dense
            arr = arr.to_dense()
        if arr.numel() and _storage_short(arr):
            # its storage was freed (resize_(0)): reading it reads freed memory (a segfault, or torch's "data is
            # not allocated yet"). Seen: FSDP2 with activation checkpointing, where reading a saved tensor
            # recomputes the checkpointed forward and FSDP's post-forward reshards the parameter it views.
            raise ValueError(f"{key}: the saved tensor's storage has been freed (an FSDP2 unit's resharded "
                             "parameter, recomputed under activation checkpointing?): its values cannot be read; "
                             "capture with values=False for the structure only")
        if arr.is_conj() or arr.is_neg():  # lazy conjugate/negative views: materialise them first
            arr = arr.resolve_conj().resolve_neg()
        dt = _dtype(arr.dtype)
        if dt not in _TORCH_DTYPES:
            raise ValueError(f"cannot capture a tensor of dtype {dt} ({key})")
        if dt == "bfloat16":  # numpy has no bfloat16: its exact float32 values, cast back on load
            arr = arr.float().numpy()
            if self.inline:
                return {"data": arr.tolist(), "shape": list(arr.shape), "dtype": dt}
            self.arrays[key] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
            return {"npz": key, "dtype": dt}
        # a copy: numpy() marks the tensor's own storage non-resizable, and FSDP2 frees and re-allocates
        # its unsharded parameters' storage (resize_) in the backward that capture runs next
        arr = arr.clone(memory_format=_torch().contiguous_format).numpy()
        if self.inline:
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                raise ValueError(f"{key}: a tensor with inf or nan values cannot be written inline (JSON has no "
                                 "spelling for them); capture with a path, which stores tensors in an .npz file")
            if arr.dtype.kind == "c":
                raise ValueError(f"{key}: a complex tensor cannot be written inline; capture with a path, which "
                                 "stores tensors in an .npz file")
            return {"data": arr.tolist(), "shape": list(arr.shape), "dtype": dt}
        # (np.ascontiguousarray would turn a 0-d array into shape (1,))
        self.arrays[key] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        return {"npz": key}


def _tensors(torch, value, what: str, allow_none: bool = False) -> list:
    """``value`` (a tensor or a list/tuple of them) as a list; a ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, torch.Tensor):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a tensor or a list of tensors, got {type(value).__name__}")
    for k, t in enumerate(value):
        if not (isinstance(t, torch.Tensor) or (allow_none and t is None)):
            raise ValueError(f"{what}[{k}] must be a tensor, got {type(t).__name__}")
    return list(value)


def _saved_value(torch, v, key: str, arrays: _Arrays):
    if isinstance(v, torch.Tensor):
        return arrays.put(key, v)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "inf", "-inf", "nan": JSON has no spelling for them (rules read them back)
    if isinstance(v, complex):
        return str(v)  # "(2-1j)", "1j": likewise
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    if isinstance(v, torch.dtype):
        return _dtype(v)
    return None  # options, devices, layouts, symbolic values: not needed by any rule


class _Storages:
    """Which storage each saved tensor lives in (the file's ``storage`` section, read by ``analysis.memory``).

    PyTorch frees a saved activation when the last node that saved it has run, and views of one tensor
    (a ``ReluBackward0``'s result and the ``AddmmBackward0`` after it that saved it as ``mat1``) are one
    allocation: a block is one storage, keyed by its device, data pointer and size, written as its size in
    bytes and, when a leaf (a parameter) owns it, the variable's name (the backward never frees those).
    """

    def __init__(self):
        self.index: dict = {}   # (device, data_ptr, nbytes) -> block index
        self.blocks: list[list] = []
        self.saved: dict[str, dict[str, int]] = {}
        self.groups: dict[int, int] = {}  # id(a non-reentrant checkpoint's frame) -> recompute group
        self.frames: list = []  # those frames, kept so that their ids stay theirs

    def group_of(self, fn, field: str) -> int | None:
        """The recompute group of saved tensor ``field`` of node ``fn``: a non-reentrant checkpoint packs it
        with a saved-tensor hook and recomputes it in the backward (its unpack hook closes over the
        region's frame); None for a tensor the graph holds itself."""
        raw = getattr(fn, f"_raw_saved_{field}", None)
        hook = getattr(raw, "unpack_hook", None)
        for cell in getattr(hook, "__closure__", None) or ():
            try:
                frame = cell.cell_contents
            except ValueError:
                continue
            if type(frame).__name__ == "_CheckpointFrame":
                k = self.groups.get(id(frame))
                if k is None:
                    k = self.groups[id(frame)] = len(self.groups)
                    self.frames.append(frame)
                return k
        return None

    @staticmethod
    def key(t) -> tuple | None:
        """(device, address, bytes) of ``t``'s storage; None for a tensor without one: a subclass, a nested
        tensor, or a ZeroTensor (forward-mode AD's zeros, saved by a Hessian-vector product or
        ``torch.func.hessian``: its storage answers, its address raises)."""
        try:
            st = t.untyped_storage()
            return (str(t.device), st.data_ptr(), st.nbytes())
        except (RuntimeError, NotImplementedError):
            return None

    def note(self, nid: str, field: str, t, group: int | None = None) -> None:
        key = self.key(t)
        if key is None or key[1] == 0:
            return
        if group is not None:
            key = key + (group,)
        block = self.index.get(key)
        if block is None:
            block = self.index[key] = len(self.blocks)
            self.blocks.append([key[2]] if group is None else [key[2], None, group])
        self.saved.setdefault(nid, {})[field] = block

    def section(self, leaves: Mapping[str, Any]) -> dict | None:
        """The document's ``storage`` section; ``leaves`` maps variable names to their tensors."""
        if not self.blocks:
            return None
        self.mark_leaves(leaves)
        self.frames.clear()
        return {"blocks": self.blocks, "saved": self.saved}

    def mark_leaves(self, leaves: Mapping[str, Any]) -> None:
        """Name the blocks that leaves own. Called before the reference backward too: FSDP2 frees its
        unsharded parameters' storage there (``resize_(0)``), and a freed storage starts nowhere."""
        # a leaf's storage by where it starts (its size may differ from a saved view's: FSDP2's unsharded
        # parameters are storages resized in place)
        by_start = {}
        for key, block in self.index.items():
            by_start.setdefault(key[:2], []).append(block)
        for name, t in leaves.items():
            key = self.key(t)
            for block in by_start.get(key[:2], ()) if key is not None else ():
                if len(self.blocks[block]) == 1:
                    self.blocks[block].append(name)


def _is_tensor_list(torch, v) -> bool:
    return (isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v)
            and all(x is None or isinstance(x, torch.Tensor) for x in v))


def _saved_tensor_list(v, field: str, nid: str, arrays: _Arrays) -> dict:
    """A saved list of tensors (kind ``tensors``): each tensor in a field of its own, named in the list."""
    out: dict[str, Any] = {}
    names = []
    for k, t in enumerate(v):
        if t is None:
            names.append(None)
        else:
            key = f"{field}.{k}"
            out[key] = arrays.put(f"{nid}.{key}", t)
            names.append(key)
    out[field] = names
    return out


def _op_stem(node_name: str) -> str:
    """``ConvolutionBackward0`` -> ``convolution``, ``NativeLayerNormBackward0`` -> ``native_layer_norm``,
    ``torch::autograd::CopySlices`` -> ``copy_slices``; '' for a name without letters."""
    base = re.sub(r"Backward\d*$", "", node_name.rsplit("::", 1)[-1])
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower().strip("_")


def _copy_slices(torch, fn, nid: str, arrays: _Arrays) -> tuple[dict, str | None]:
    """What replaying a CopySlices node needs, found by calling it (PyTorch exposes none of it).

    CopySlices (an in-place op on a view, e.g. ``x[:, 1] *= 2``) copies the
    gradient into a tensor laid out like the base, views the written region,
    runs the in-place op's backward on it, and writes the result back. Calling
    the node under a dispatch mode shows the base's layout
    (``new_empty_strided``) and the view's (``as_strided``). The wrapped
    backward is recorded as per-element factors: the region of the result is
    ``result_scale * region`` and next edge i gets ``sum_to(input_scales[i] *
    region)``, measured with a gradient of ones and checked with a random one;
    a wrapped backward that is not elementwise is left opaque.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    layout: dict[str, Any] = {}

    class _Layouts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name == "aten.new_empty_strided.default" and "base" not in layout:
                layout["base"] = (list(args[1]), list(args[2]))
            elif name == "aten.as_strided.default" and "base" in layout and "view" not in layout:
                layout["view"] = (list(args[1]), list(args[2]), int(args[3]) if len(args) > 3 else 0)
            return func(*args, **(kwargs or {}))

    meta = fn._input_metadata[0]
    dtype, shape = meta.dtype, tuple(meta.shape)
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(shape, dtype=dtype, generator=gen).to(meta.device)
    with torch.no_grad():
        with _Layouts():
            on_random = fn(probe)
        on_ones = fn(torch.ones(shape, dtype=dtype, device=meta.device))
    if "view" not in layout:
        return {}, "CopySlices over a view replayed by a view function (no as_strided)"
    (bsz, bst), (vsz, vst, voff) = layout["base"], layout["view"]
    on_random = on_random if isinstance(on_random, tuple) else (on_random,)
    on_ones = on_ones if isinstance(on_ones, tuple) else (on_ones,)

    def region(t):
        base_idx = _strided_index(bsz, bst, 0)
        view_idx = _strided_index(vsz, vst, voff)
        buf = np.zeros(max(base_idx.max(initial=-1), view_idx.max(initial=-1)) + 1, dtype=t.dtype)
        buf[base_idx] = t
        return buf[view_idx]
    g = region(probe.cpu().numpy())
    tol = dict(rtol=1e-6, atol=1e-9) if dtype in (torch.float64, torch.complex128) else dict(rtol=1e-3, atol=1e-4)
    scales = []
    for i, (ones, rand) in enumerate(zip(on_ones, on_random)):
        if ones is None or (i > 0 and fn.next_functions[i][0] is None):
            scales.append(np.zeros(vsz, dtype=g.dtype) if i == 0 else None)  # an undefined result: zeros
            continue
        ones, rand = ones.detach().cpu().numpy(), rand.detach().cpu().numpy()
        if i == 0:
            ones, rand = region(ones), region(rand)
        else:  # what the engine passes on: the wrapped backward's result summed to the edge's shape
            nf, nr = fn.next_functions[i]
            edge = tuple(nf._input_metadata[nr].shape)
            if ones.shape != edge:
                try:
                    ones, rand = _sum_to(ones, edge), _sum_to(rand, edge)
                except (ValueError, IndexError):
                    return {}, "CopySlices whose wrapped backward changes shapes"
        # Next edge i's input may have been broadcast onto the view: its factor is spread evenly (and checked),
        # else measured copy by copy (a value written into masked rows: x[mask] = v).
        copies = math.prod(vsz) // max(ones.size, 1)
        try:
            scale = np.broadcast_to(ones.astype(g.dtype) / max(copies, 1), tuple(vsz)).copy()
        except ValueError:
            return {}, "CopySlices whose wrapped backward changes shapes"
        if not np.allclose(_sum_to(scale * g, rand.shape), rand, **tol):
            scale = _factor_by_copies(torch, fn, i, meta, layout, rand.shape, g.dtype) if i > 0 else None
            if scale is None or not np.allclose(_sum_to(scale * g, rand.shape), rand, **tol):
                return {}, "CopySlices wrapping a backward that is not elementwise"
        scales.append(scale)
    saved: dict[str, Any] = {"base_sizes": bsz, "base_strides": bst, "view_sizes": vsz, "view_strides": vst,
                             "view_offset": voff}
    written = _written(torch, fn, probe, scales, (bsz, bst), (vsz, vst, voff))
    if written:
        saved["written"] = written
    saved["result_scale"] = arrays.put(f"{nid}.result_scale", torch.from_numpy(scales[0]))
    saved.update(_saved_tensor_list([None if t is None else torch.from_numpy(t) for t in [None] + scales[1:]],
                                    "input_scales", nid, arrays))
    return saved, None


def _written(torch, fn, probe, scales: list, base: tuple, view: tuple) -> list[int]:
    """The outputs of a CopySlices node whose zero factors are places the wrapped backward does not read (it
    writes a value there, as fill_, masked_fill_ and index_put_ do; or, for the written value's own gradient,
    reads only the others): PyTorch's result there is 0 whatever the gradient holds, where a factor of 0 times a
    NaN or an infinity would be NaN. Found by calling the node with NaN at those places of the probe: an output
    that stays finite does not read them; one that turns NaN multiplies (``x[1] *= 0``)."""
    base_idx, view_idx = _strided_index(*base, 0), _strided_index(*view)
    values = probe.cpu().numpy()
    size = max(base_idx.max(initial=-1), view_idx.max(initial=-1)) + 1
    out = []
    for i, scale in enumerate(scales):
        if scale is None or not (scale == 0).any():
            continue
        buf = np.zeros(size, dtype=values.dtype)
        buf[base_idx] = values
        buf[view_idx[np.broadcast_to(scale == 0, view_idx.shape)]] = np.nan
        with torch.no_grad():
            got = fn(torch.from_numpy(buf[base_idx]).to(probe.device))
        got = got[i] if isinstance(got, tuple) else got
        if got is not None and bool(torch.isfinite(got).all()):
            out.append(i)
    return out


def _sum_to(x: np.ndarray, shape) -> np.ndarray:
    """``x`` summed over the dims that ``shape`` broadcasts (leading ones, and size-1 dims)."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + k for k, m in enumerate(shape) if m == 1 and x.shape[lead + k] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


#: At most this many calls of a CopySlices node to measure one input's factors copy by copy.
_MAX_COPY_PROBES = 4096


def _factor_by_copies(torch, fn, i: int, meta, layout: dict, in_shape, dtype) -> np.ndarray | None:
    """Input ``i``'s per-element factor over the view, one call of ``fn`` per copy of the input.

    The input (shape ``in_shape``) is broadcast onto the view; its gradient is ``sum_to(factor * g)``.
    A gradient that is one on copy c's positions of the view and zero elsewhere gives copy c's factors
    directly. None when there are more copies than ``_MAX_COPY_PROBES``.
    """
    (bsz, bst), (vsz, vst, voff) = layout["base"], layout["view"]
    in_shape, vsz = tuple(in_shape), tuple(vsz)
    lead = len(vsz) - len(in_shape)
    if lead < 0:
        return None
    bdims = [d for d in range(len(vsz)) if d < lead or (in_shape[d - lead] == 1 and vsz[d] != 1)]
    copies = math.prod(vsz[d] for d in bdims)
    if copies > _MAX_COPY_PROBES:
        return None
    base_idx = _strided_index(bsz, bst, 0).ravel()
    view_idx = _strided_index(list(vsz), vst, voff)
    inv = np.full(max(int(base_idx.max(initial=-1)), int(view_idx.max(initial=-1))) + 1, -1, dtype=np.int64)
    inv[base_idx] = np.arange(base_idx.size)
    pos = inv[view_idx]  # the base element behind each view element
    if (pos < 0).any():
        return None
    factor = np.zeros(vsz, dtype=dtype)
    numel = math.prod(tuple(meta.shape))
    with torch.no_grad():
        for c in np.ndindex(*[vsz[d] for d in bdims]):
            sel = [slice(None)] * len(vsz)
            for d, k in zip(bdims, c):
                sel[d] = k
            flat = np.zeros(numel)
            flat[pos[tuple(sel)].ravel()] = 1
            probe = torch.from_numpy(flat.reshape(tuple(meta.shape))).to(meta.dtype).to(meta.device)
            out = fn(probe)
            out = out if isinstance(out, tuple) else (out,)
            if out[i] is None:
                return None
            got = out[i].detach().cpu().numpy()
            got = _sum_to(got, in_shape) if got.shape != in_shape else got
            sub = [slice(None)] * len(in_shape)
            for d, k in zip(bdims, c):
                if d >= lead:
                    sub[d - lead] = 0
            factor[tuple(sel)] = got[tuple(sub)]
    return factor


def _dirichlet_factor(torch, fn) -> dict:
    x, concentration = fn.saved_tensors
    total = concentration.sum(-1, True).expand_as(concentration)
    return {"result": x, "grad_factor": torch._dirichlet_grad(x, concentration, total)}


def _cat_sizes(torch, fn) -> dict:
    """CatBackward0 does not expose its inputs' sizes. Where inputs without a gradient edge come before one
    with an edge, the rule needs them: found by calling the node on a gradient that numbers the positions
    along dim (each input's slice then starts with its offset)."""
    nexts = [nf for nf, _ in fn.next_functions]
    missing = [i for i, nf in enumerate(nexts) if nf is None]
    known = [i for i, nf in enumerate(nexts) if nf is not None]
    if len(missing) < 2 or not known or missing[0] > known[-1]:
        return {}
    meta = fn._input_metadata[0]
    shape = tuple(meta.shape)
    if not shape:
        return {}
    dim = int(fn._saved_dim) % len(shape)
    total = shape[dim]
    exact = {torch.float16: 2048, torch.bfloat16: 256}.get(meta.dtype, 1 << 24)
    if total > exact:
        return {}
    probe = torch.arange(total, dtype=torch.float64).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    with torch.no_grad():
        outs = fn(probe.expand(shape).to(meta.dtype).contiguous())
    outs = outs if isinstance(outs, tuple) else (outs,)
    sizes, cursor, pending = [], 0, None
    for i, out in enumerate(outs):
        if nexts[i] is None or out is None:
            sizes.append(0)
            pending = i if pending is None else pending
            continue
        n = out.shape[dim] if out.dim() > dim else 0
        start = int(out.select(dim, 0).reshape(-1)[0].real.item()) if n else cursor
        if pending is not None:
            sizes[pending] = start - cursor
            pending = None
        sizes.append(n)
        cursor = start + n
    if pending is not None:
        sizes[pending] = total - cursor
    return {"sizes": sizes}


#: What capture measures or derives for nodes whose rule needs more than PyTorch exposes: a special function
#: of the saved values that PyTorch evaluates with its own approximations (``grad_factor``), or the sizes a
#: cat does not expose.
def _unused_saved(fn) -> set:
    """Saved fields a node holds but its backward never reads, whose memory PyTorch left unset: stored
    as zeros (their bytes are whatever the allocator had, NaN among them, and change from run to run)."""
    if fn.name() == "RreluWithNoiseBackward0" and not getattr(fn, "_saved_training", True):
        return {"noise"}  # eval mode: the slope is (lower + upper) / 2; the noise buffer is never filled
    return set()


def _as_strided_geometry(torch, fn) -> dict:
    """Where as_strided's input lies in its storage: PyTorch keeps the input's strides and storage offset on the
    node without exposing them, and its backward scatters through the storage into that layout. A leaf tells
    them (``self_strides``, ``self_storage_offset``); any other input is measured by calling the node with a
    random gradient: where that differs from the rule's default (the input contiguous from the storage's
    start), the node is marked with ``geometry_unknown`` and stays opaque."""
    nf = fn.next_functions[0][0] if fn.next_functions else None
    var = getattr(nf, "variable", None)
    if var is not None:
        return {"self_strides": [int(s) for s in var.stride()], "self_storage_offset": int(var.storage_offset())}
    size, stride, offset = list(fn._saved_size), list(fn._saved_stride), int(fn._saved_storage_offset or 0)
    n = int(np.prod(size)) if size else 1
    if n > 1_000_000:  # too big to measure here: the rule's default
        return {}
    g = torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    try:
        with torch.no_grad():
            got = fn(g)
    except RuntimeError:
        return {}
    got = got.detach().to(torch.float64).numpy()
    in_sizes = list(got.shape)
    got = got.reshape(-1)
    m = got.size
    pos = _strided_index(size, stride, offset).reshape(-1)
    storage = np.zeros(max(int(pos.max()) + 1 if pos.size else 0, m), dtype=np.float64)
    np.add.at(storage, pos, g.reshape(-1).numpy())
    if np.allclose(storage[:m], got, rtol=1e-12, atol=1e-12):
        return {}
    found = _input_geometry(storage, got.reshape(in_sizes))
    return found if found is not None else {"geometry_unknown": True}


def _input_geometry(storage: np.ndarray, got: np.ndarray) -> dict | None:
    """The input's strides and storage offset, read off the node's answer to a random gradient: each of
    the input's gradient values is the sum that landed on one storage position (values drawn at random
    are told apart), so two neighbours along a dimension whose positions are known give its stride, and
    any known element then the offset; the layout found is checked on every element. None when no two
    neighbours along some dimension are known (elements where nothing landed have gradient 0), or the
    layout does not explain every value (an input that overlaps itself, which PyTorch's formula divides
    by the overlap)."""
    if got.size == 0 or storage.size == 0:
        return None
    order = np.argsort(storage, kind="stable")
    values = storage[order]
    flat = got.reshape(-1)
    k = np.clip(np.searchsorted(values, flat), 1, values.size - 1) if values.size > 1 else np.zeros(flat.size, int)
    pos = np.full(flat.size, -1, dtype=np.int64)
    for cand in (k - 1, k):
        near = np.abs(values[cand] - flat) <= 1e-9 * np.maximum(1.0, np.abs(flat))
        pos = np.where((pos < 0) & near & (flat != 0.0), order[cand], pos)
    pos = pos.reshape(got.shape)
    strides = []
    for d, n in enumerate(got.shape):
        if n == 1:
            strides.append(1)
            continue
        a, b = np.moveaxis(pos, d, 0)[:-1], np.moveaxis(pos, d, 0)[1:]
        both = (a >= 0) & (b >= 0)
        if not both.any():
            return None
        step = int((b - a)[both].flat[0])
        if step < 0:
            return None
        strides.append(step)
    known = np.argwhere(pos >= 0)
    if not known.size:
        return None
    e = known[0]
    offset = int(pos[tuple(e)]) - int(sum(int(x) * st for x, st in zip(e, strides)))
    if offset < 0:
        return None
    idx = _strided_index(list(got.shape), strides, offset)
    if int(idx.max()) >= storage.size:  # the input reaches past the last position the view wrote: nothing there
        storage = np.concatenate([storage, np.zeros(int(idx.max()) + 1 - storage.size)])
    if not np.allclose(storage[idx], got, rtol=1e-12, atol=1e-12):
        return None
    return {"self_strides": strides, "self_storage_offset": offset}


_MEASURED = {
    "AsStridedBackward0": _as_strided_geometry,
    "AsStridedBackward0_copy": _as_strided_geometry,
    "StandardGammaBackward0": lambda torch, fn: {
        "grad_factor": torch._standard_gamma_grad(fn._saved_self, fn._saved_result)},
    "_DirichletBackward": _dirichlet_factor,
    "CatBackward0": _cat_sizes,
}


def _strided_index(sizes, strides, offset) -> np.ndarray:
    """The storage position of each element of a (sizes, strides, offset) layout."""
    idx = np.full(tuple(sizes), offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    return idx


class _Capture:
    """One capture's growing document: node ids, node and variable entries, the tensors to store.

    Nodes are added by walks from roots (``add``): the outer graph first, then
    each graph a custom Function's backward builds while the reference
    backward runs (``capture.inner``). Nodes already seen keep their ids, so a
    parameter's AccumulateGrad node is shared by the outer and inner graphs.
    """

    def __init__(self, torch, names: Mapping[str, Any], arrays: _Arrays, values: bool = True,
                 fwd_thread: int | None = None):
        self.torch = torch
        #: False: structure only (every node but the leaves' opaque, nothing saved).
        self.values = values
        #: The forward thread id every node is given (``forward_thread_id``), or None.
        self.fwd_thread = fwd_thread
        self.names = dict(names)
        self.leaf_name = {id(t): n for n, t in self.names.items()}
        #: A named tensor that is a node's output 0 (a non-leaf, such as a requested input of ``grad``): its node
        #: takes the name as its id (the first name given for it; none that looks like the ids made here, ``n3``).
        self.node_name: dict = {}
        for n, t in self.names.items():
            fn = getattr(t, "grad_fn", None)
            if fn is not None and getattr(t, "output_nr", 0) == 0 and not re.fullmatch(r"n\d+", n):
                self.node_name.setdefault(fn, n)
        self.arrays = arrays
        self.ids: dict = {}
        self.docs: dict = {}
        self.nodes: list[dict] = []
        self.variables: list[dict] = []
        self.var_doc: dict[str, dict] = {}
        self.var_of: dict = {}
        #: Custom autograd.Function nodes without a rule: resolved by the reference run (``capture.inner``).
        self.custom: list = []
        #: custom Function node -> what replaying its backward as Python needs (``python_function``), or why not
        self.custom_state: dict = {}
        #: The storage of every saved tensor (the document's ``storage`` section).
        self.storages = _Storages()
        #: grad_fn -> (the first node in walk order with an edge to it, that edge's index).
        self.consumer: dict = {}

    def add(self, roots) -> list:
        """Describe every node reachable from ``roots`` (grad_fns) not seen before; returns them in walk order."""
        new = walk_grad_fns(roots, known=self.ids)
        for fn in new:
            self.ids[fn] = self.node_name.get(fn) or f"n{len(self.ids)}"
        for fn in new:  # an unnamed leaf is named after its first consumer in walk order (``_leaf_name``)
            for k, (nf, _) in enumerate(fn.next_functions):
                if nf is not None:
                    self.consumer.setdefault(nf, (fn, k))
        for fn in new:
            doc = self._describe(fn)
            self.docs[fn] = doc
            self.nodes.append(doc)
        return new

    def add_unreached(self, t) -> str:
        """A requested leaf without an AccumulateGrad node here: a variable without a node (PyTorch's
        unreachable input, or a tensor that does not require grad)."""
        name = self._leaf_name(t)
        if name in self.var_doc:
            return name
        vdoc = {"name": name, "shape": list(t.shape), "dtype": _dtype(t.dtype), "device": str(t.device)}
        if not t.requires_grad:
            vdoc["requires_grad"] = False
        self.variables.append(vdoc)
        self.var_doc[name] = vdoc
        return name

    def var_names_by_id(self) -> dict:
        """{id(leaf tensor): variable name} of every leaf with an AccumulateGrad node here."""
        return {id(fn.variable): name for fn, name in self.var_of.items()}

    @staticmethod
    def reachable(roots) -> list:
        """Every node reachable from ``roots``, seen before or not."""
        return walk_grad_fns(roots)

    def _leaf_name(self, var, consumer=None) -> str:
        """``names``' name for ``var``; else after what it is: input k of the op that consumes it
        (``convolution.input0``: a model's input on which the model set ``requires_grad``), or ``leaf<k>``."""
        name = self.leaf_name.get(id(var))
        if name is not None:
            return name
        if consumer is not None:
            stem = _op_stem(consumer[0].name())
            if stem:
                base = f"{stem}.input{consumer[1]}"
                name, k = base, 2
                while name in self.var_doc or name in self.names:
                    name, k = f"{base}_{k}", k + 1
                return name
        k = len(self.variables)
        while f"leaf{k}" in self.var_doc or f"leaf{k}" in self.names:
            k += 1
        return f"leaf{k}"

    def rename_variable(self, old: str, new: str) -> None:
        """Give a variable (and its AccumulateGrad node) another name: a custom node's detached input."""
        var = self.var_doc.pop(old)
        var["name"] = new
        self.var_doc[new] = var
        for fn, name in self.var_of.items():
            if name == old:
                self.var_of[fn] = new
                self.docs[fn]["variable"] = new

    def _describe(self, fn) -> dict:
        torch, ids, arrays = self.torch, self.ids, self.arrays
        nid = ids[fn]
        name = fn.name()
        metas = [{"shape": list(m.shape), "dtype": _dtype(m.dtype), "device": str(m.device)}
                 for m in fn._input_metadata]
        for m in metas:
            if m["device"].startswith("cuda") and ":" not in m["device"]:
                m["device"] = "cuda:0"
        d: dict[str, Any] = {"id": nid, "name": name}
        if name == ACC:
            var = fn.variable
            vname = self._leaf_name(var, self.consumer.get(fn))
            self.var_of[fn] = vname
            d["variable"] = vname
            vdoc = {"name": vname, "shape": list(var.shape), "dtype": _dtype(var.dtype),
                    "device": metas[0]["device"] if metas else "cpu"}
            self.variables.append(vdoc)
            self.var_doc[vname] = vdoc
        else:
            d["seq"] = fn._sequence_nr()
            if self.fwd_thread is not None:
                d["fwd_thread"] = self.fwd_thread
            d["next"] = [None if nf is None else [ids[nf], nr] for nf, nr in fn.next_functions]
            op = lookup(name)
            reason = None
            if op is None and is_custom_function(fn):
                self.custom.append(fn)
                reason = custom_function_reason(fn, "its backward did not run in the reference backward")
                if self.values:  # read now: the reference backward frees the saved tensors
                    self.custom_state[fn] = function_state(_torch(), fn, nid, arrays)
            elif op is None or (op.engine and not (op is IDENTITY and len(metas) == 1 == len(d["next"]))):
                # PyTorch's own nodes never run as one of our synthetic kinds, but for its Identity (forward-mode
                # AD's make_dual and unpack_dual) of one gradient: passed through, as our identity does
                op, reason = None, f"no backward rule for {name}"
            if not self.values and not (op is None and is_custom_function(fn)):
                op, reason = None, "captured without saved values (order only)"
            saved = {}
            if op is not None:
                unused = _unused_saved(fn)
                for attr in dir(fn):
                    if attr.startswith("_saved_"):
                        field = attr[len("_saved_"):]
                        try:
                            v = getattr(fn, attr)
                        except RuntimeError as e:
                            if "modified by an inplace operation" in str(e):
                                raise  # PyTorch's backward would stop on it too, with this text
                            continue  # already freed, or not saved for this call
                        if isinstance(v, torch.Tensor):
                            self.storages.note(nid, field, v, self.storages.group_of(fn, field))
                        elif _is_tensor_list(torch, v):
                            for k, t in enumerate(v):
                                if t is not None:
                                    self.storages.note(nid, f"{field}.{k}", t)
                        if field in unused and isinstance(v, torch.Tensor):
                            v = torch.zeros_like(v)
                        if _is_tensor_list(torch, v):
                            saved.update(_saved_tensor_list(v, field, nid, arrays))
                            continue
                        v = _saved_value(torch, v, f"{nid}.{field}", arrays)
                        if v is not None:
                            saved[field] = v
            if op is not None and name == COPY_SLICES:
                saved, reason = _copy_slices(torch, fn, nid, arrays)
            if op is not None and name in _MEASURED:
                for field, v in _MEASURED[name](torch, fn).items():
                    saved[field] = arrays.put(f"{nid}.{field}", v) if isinstance(v, torch.Tensor) else v
            if saved.pop("geometry_unknown", False) and not reason:
                reason = "as_strided of an input that does not start its storage contiguously (its layout is not saved)"
            if op is not None and op.unsupported is not None and not reason:
                reason = op.unsupported(saved)  # a variant of the op without a rule here
            attrs = {}
            if reason:
                d["op"] = OPAQUE.name
                attrs["reason"] = reason
            if saved:
                d["saved"] = saved
            trace = fn.metadata.get("traceback_") if hasattr(fn, "metadata") else None
            if trace:
                attrs["trace"] = "".join(trace) if isinstance(trace, list) else str(trace)
            if attrs:
                d["attrs"] = attrs
        d["inputs"] = metas
        return d


def _ddp_settings(module) -> dict | None:
    """DistributedDataParallel's settings of ``module`` when it is one (the graph file's ``ddp``)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch without distributed
        return None
    if not isinstance(module, DistributedDataParallel):
        return None
    out = {} if getattr(module, "bucket_bytes_cap_default", False) else \
        {"bucket_cap_mb": module.bucket_bytes_cap / (1 << 20)}  # left out: DDP's default (25, the first 1 MiB)
    caps = list(getattr(module, "bucket_bytes_cap_list", None) or [])  # bucket_cap_mb_list (per-bucket limits)
    if caps:
        out["bucket_cap_mb_list"] = [c / (1 << 20) for c in caps]
    out.update({"find_unused_parameters": bool(module.find_unused_parameters),
                "static_graph": bool(module.static_graph),
                "gradient_as_bucket_view": bool(module.gradient_as_bucket_view)})
    try:
        import torch.distributed as dist
        out["world_size"] = int(dist.get_world_size(module.process_group))
    except (RuntimeError, ValueError, AttributeError):
        pass
    return out


def _ddp_pairs(module, ignore) -> list:
    """The module's (name, parameter) pairs in registration order, less those DDP is told to ignore (a
    ``DistributedDataParallel``'s ``parameters_to_ignore``, from
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model`` or ``delay_all_reduce_named_params``;
    on a bare module its ``_ddp_params_and_buffers_to_ignore``): DDP's ``_build_params_for_reducer`` leaves them
    out of the Reducer's parameters, so the indices it gives the others shift. As DDP does: each module's own
    parameters, in ``named_modules()`` order, checked under the name ``f"{module}.{param}"`` (a shared parameter
    stays if one of its names is not ignored)."""
    if not ignore:
        return list(module.named_parameters())
    ignore = set(ignore)
    return [(f"{mn}.{pn}" if mn else pn, p) for mn, m in module.named_modules()
            for pn, p in m.named_parameters(recurse=False) if f"{mn}.{pn}" not in ignore]


def _parameters(torch, parameters) -> list:
    """``from_torch``'s ``parameters``: [(name, tensor)] of those that require grad, registration order."""
    if parameters is None:
        return []
    if isinstance(parameters, torch.nn.Module):
        inner = getattr(parameters, "module", None)  # DistributedDataParallel indexes its module's parameters
        module = inner if isinstance(inner, torch.nn.Module) else parameters
        from autograd_run.capture import fsdp
        if fsdp.fsdp_states(module):  # fully_shard: the unsharded tensors the backward accumulates into
            fsdp.gather_for_capture(module)
            pairs = fsdp.parameter_pairs(module)
        else:
            pairs = _ddp_pairs(module, getattr(parameters, "parameters_to_ignore", None) if module is inner
                               else getattr(module, "_ddp_params_and_buffers_to_ignore", None))
    else:
        pairs = list(parameters.items() if isinstance(parameters, Mapping) else parameters)
    out, seen = [], set()
    for k, item in enumerate(pairs):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise ValueError(f"parameters[{k}] must be a (name, tensor) pair")
        if item[1].requires_grad and id(item[1]) not in seen:  # a shared tensor is one parameter
            seen.add(id(item[1]))
            out.append(item)
    return out


def from_torch(outputs, inputs: Sequence | None = None, *, grad_outputs: Sequence | None = None,
               names: Mapping[str, Any] | None = None, path: str | None = None,
               mode: str | None = None, reference: bool = True, values: bool = True,
               parameters=None) -> dict:
    """Capture the backward graph of ``outputs``; write it to ``path`` (JSON or YAML) when given.

    Returns the graph document. ``inputs`` requests gradients for those tensors
    (``mode`` then defaults to ``grad``, as ``torch.autograd.grad``).
    Custom autograd.Function nodes (a reentrant checkpoint among them) are
    resolved by running PyTorch's backward once even when ``reference`` is
    False: the graph their backward builds exists only while it runs.
    ``values=False``: the structure only (see the module docstring).
    ``parameters``: the model's parameters in registration order (a ``torch.nn.Module``, a
    ``DistributedDataParallel`` wrapper of one, or ``(name, tensor)`` pairs): written as the document's
    ``parameters`` (the indices DDP's Reducer gives them), named in ``names``, and those the graph does not
    reach kept as variables without a node (DDP still buckets them).
    """
    torch = _torch()
    outputs = _tensors(torch, outputs, "outputs")
    if not outputs:
        raise ValueError("outputs: no tensors to capture the backward graph of")
    from torch.autograd.graph import get_gradient_edge
    for k, o in enumerate(outputs):
        if not o.requires_grad:  # PyTorch's text (torch.autograd.backward and grad)
            raise ValueError(f"element {k} of tensors does not require grad and does not have a grad_fn")
    edges = [get_gradient_edge(o) for o in outputs]  # a leaf output: its AccumulateGrad node
    grad_outputs = (_tensors(torch, grad_outputs, "grad_outputs", allow_none=True) if grad_outputs is not None
                    else [None] * len(outputs))
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad_outputs: {len(grad_outputs)} given for {len(outputs)} output(s)")
    if inputs is not None:
        inputs = _tensors(torch, inputs, "inputs")
    mode = mode or ("grad" if inputs else "backward")
    if names is not None and not isinstance(names, Mapping):
        raise ValueError(f"names must be a mapping of names to tensors, got {type(names).__name__}")
    for n, t in (names or {}).items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"names[{n!r}] must be a tensor, got {type(t).__name__}")
    params = _parameters(torch, parameters)
    if params:
        names = {**{n: t for n, t in params}, **(names or {})}
    cap = _Capture(torch, names or {}, _Arrays(inline=path is None), values=values,
                   fwd_thread=forward_thread_id(torch))
    arrays = cap.arrays
    cap.add([e.node for e in edges])
    cap.storages.mark_leaves({name: fn.variable for fn, name in cap.var_of.items()})

    roots = []
    for k, (e, g) in enumerate(zip(edges, grad_outputs)):
        grad = "ones" if g is None else arrays.put(f"root{k}", g)
        roots.append({"node": cap.ids[e.node], "input_nr": e.output_nr, "grad": grad})
    doc: dict[str, Any] = {"format": FORMAT, "mode": mode, "roots": roots, "variables": cap.variables}
    req = []
    if inputs:
        acc_of = {id(fn.variable): fn for fn in cap.var_of}
        for t in inputs:
            if t.grad_fn is None and id(t) in acc_of:
                req.append(cap.var_of[acc_of[id(t)]])
            elif t.grad_fn is not None and t.grad_fn in cap.ids:
                if t.output_nr != 0:
                    raise ValueError("requested inputs that are a node's output other than 0 are not supported")
                req.append(cap.ids[t.grad_fn])
            elif t.grad_fn is None:
                req.append(cap.add_unreached(t))  # a leaf the graph does not reach, or one without grad
            else:
                raise ValueError("a requested input is not part of the graph")
        doc["inputs"] = req
    hook_watch = None
    from autograd_run.capture.fsdp import FsdpWatch, section
    fsdp_watch = FsdpWatch(parameters) if isinstance(parameters, torch.nn.Module) else None
    if fsdp_watch is not None and not fsdp_watch.groups:
        fsdp_watch = None
    if reference or cap.custom or fsdp_watch is not None:  # FSDP's units are seen as the backward runs
        ref, hook_watch = _reference(cap, outputs, grad_outputs, inputs, req, mode, keep_grads=values,
                                     fsdp_watch=fsdp_watch)
        if reference:
            doc["meta"] = {"reference": ref}
    if fsdp_watch is not None:
        doc["fsdp"] = section(parameters, fsdp_watch, cap.ids, cap.var_names_by_id())
    if params:  # after the reference run: a parameter reached only inside a custom Function's backward (a
        # reentrant checkpoint's recomputation) has its AccumulateGrad node only now (before, it was added again
        # as an unreached variable of the same name)
        known = cap.var_names_by_id()
        doc["parameters"] = [known.get(id(t)) or cap.add_unreached(t) for _, t in params]
        ddp = _ddp_settings(parameters)
        if ddp:
            doc["ddp"] = ddp
    _report_hooks(doc, cap, hook_watch)
    storage = cap.storages.section({name: fn.variable for fn, name in cap.var_of.items()})
    if storage is not None and values:
        # only what the document's nodes still save (a custom Function resolved by the reference run is
        # described again, or kept opaque without its saved values)
        saved_now = {d["id"]: d.get("saved", {}) for d in cap.nodes}
        storage["saved"] = {nid: kept for nid, fields in storage["saved"].items() if nid in saved_now
                            for kept in [{f: b for f, b in fields.items() if f in saved_now[nid]}] if kept}
        doc["storage"] = storage
    doc["nodes"] = cap.nodes
    if path is not None:
        _write(doc, arrays, path)
    return doc


def _reference(cap: _Capture, outputs, grad_outputs, inputs, input_names, mode, keep_grads: bool = True,
               fsdp_watch=None) -> dict:
    """Run PyTorch's backward once, recording order and leaf gradients (not kept without ``keep_grads``);
    leaves' .grad are restored.

    Custom Function nodes are watched while it runs (``capture.inner``): the
    graph a node's backward builds and differentiates is added to the capture,
    with pre-hooks on its nodes, so the order includes them as PyTorch ran them.
    """
    from autograd_run.capture.hooks import HookWatch
    from autograd_run.capture.inner import NestedCapture
    torch = cap.torch
    order, handles = [], []
    hooks = HookWatch(torch, cap)
    leaves: dict = {}     # AccumulateGrad fn -> its variable, for every user leaf (inner ones as found)
    before: dict = {}     # and that variable's .grad before the run

    def watch(fns) -> None:
        for fn in fns:
            # name and sequence number read as the node runs: torch 2.11 refuses them on a custom Function's
            # node once its nested backward is over (seen on checkpoint_nested: "legacy access pattern")
            handles.append(fn.register_prehook(
                lambda g, fn=fn: order.append((fn, nested.depth, fn.name(), fn._sequence_nr()))))
            handles.extend(hooks.handles(fn))
            if fn in cap.var_of:
                v = fn.variable
                leaves[fn], before[fn] = v, v.grad
                v.grad = None

    nested = NestedCapture(cap, watch, on_call=hooks.roots, position=lambda: len(order))
    watch(list(cap.docs))
    gos = [torch.ones_like(o) if g is None else g for o, g in zip(outputs, grad_outputs)]
    grads = {}
    from torch.autograd.graph import get_gradient_edge
    hooks.roots([get_gradient_edge(o) for o in outputs], gos)
    try:
        import contextlib
        with torch.autograd.set_multithreading_enabled(False), nested, (fsdp_watch or contextlib.nullcontext()):
            if mode == "grad":
                res = torch.autograd.grad(outputs, list(inputs), gos, retain_graph=True, allow_unused=True)
                grads = dict(zip(input_names, res))
                for t, g in zip(inputs, res):  # a non-leaf input whose node did not run: its hooks ran on it
                    if t.grad_fn is not None and g is not None:
                        hooks.captured(t.grad_fn, t.output_nr, g)
            else:
                torch.autograd.backward(outputs, gos, retain_graph=True, inputs=list(inputs) if inputs else None)
                hidden = nested.inner_variables()
                taken = fsdp_watch.grads if fsdp_watch is not None else {}  # FSDP moved them to its shards
                grads = {fn: (v.grad if v.grad is not None else taken.get(id(v))) for fn, v in leaves.items()
                         if cap.var_of[fn] not in hidden}
    finally:
        for fn, v in leaves.items():
            v.grad = before[fn]
        for h in handles:
            h.remove()
    skip = nested.dropped_positions()
    dropped = nested.finish()
    order = [run for i, run in enumerate(order) if i not in skip]
    if mode != "grad":
        grads = {cap.var_of[fn]: g for fn, g in grads.items() if fn not in dropped}
    ref_grads = {}
    for k, g in (grads.items() if keep_grads else ()):
        ref_grads[str(k)] = None if g is None else cap.arrays.put(f"ref.{k}", g)
    return {"torch": str(torch.__version__),
            "order": [[name, seq, cap.var_of.get(fn)] for fn, _, name, seq in order],
            "depths": [depth for _, depth, _, _ in order],
            "grads": ref_grads}, hooks


def _report_hooks(doc: dict, cap: _Capture, watch) -> None:
    """Warn about tensor hooks the graph file cannot hold, naming the tensors; list them in ``meta.hooks``."""
    import warnings
    from autograd_run.capture.hooks import describe, hold_leaf_hooks, hold_node_hooks, leaf_hooks, warning_text
    held = hold_leaf_hooks(_torch(), cap) if cap.values else {}
    held_nodes = hold_node_hooks(_torch(), cap, watch) if cap.values else {}
    found = describe(cap, watch, leaf_hooks(cap), held, held_nodes)
    if found:
        doc.setdefault("meta", {})["hooks"] = found
        warnings.warn(warning_text(found), UserWarning, stacklevel=3)


def _write(doc: dict, arrays: _Arrays, path: str) -> None:
    from autograd_run.graphs.dump import dumps
    fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    if arrays.arrays:
        side = os.path.splitext(path)[0] + ".npz"
        np.savez(side, **arrays.arrays)
    with open(path, "wb") as f:
        f.write(dumps(doc, fmt))
