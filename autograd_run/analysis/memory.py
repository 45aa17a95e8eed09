"""Memory of a backward pass: live bytes per device over time, the peak, and what holds it.

``memory_of(graph, recording)`` replays the tensors a pass holds over the
order and times of a ``Recording`` (a real run's or a simulation's: one
implementation for both) and returns a ``Memory``. It is a pure function:
it reads the graph's shapes, dtypes, saved values and the op table's
``views``, never the engine.

The model, as PyTorch's Engine and its tensors behave (``engine.cpp``'s
``evaluate_function``, ``input_buffer.cpp``, ``accumulate_grad.h``):

  blocks        a block is one storage (an allocation): its bytes, its
                device, how many holders it has; freed when the last one
                lets go. Views share their base's block.
  saved         each node's saved tensors (fields of kind ``tensor``, and the
                tensors of ``tensors`` lists) exist before the pass starts;
                with the graph's ``storage`` section (``capture`` records it)
                tensors that share a storage are one block, of the storage's
                size, and a block a leaf owns (a parameter, ``W.t()``) is the
                leaf's, never freed; without it each saved tensor is a block
                of its own size. A block is freed after the last node that
                saved it has run (``release_variables``), unless
                ``retain_graph``. A reentrant checkpoint's nested graph saves
                its tensors when the checkpoint starts (the recomputation).
  roots         the root gradients exist at the start, in their nodes'
                input buffers.
  outputs       a node's outputs are allocated while it runs (its inputs are
                still held: the peak of a node is its inputs plus its
                outputs), one per next edge, the size of the consumer's input
                slot; an output the op declares a view of its incoming
                gradient (``OpSpec.views``: ``grad`` itself, ``grad.t()``,
                ``grad.narrow()``, ``grad.expand()``) is no new memory while
                its element count, dtype and device stay the gradient's (a
                ``sum_to`` or a cast allocates).
  after a node  its input buffer is dropped, its saved tensors released, then
                each output goes into its consumer's input buffer: the first
                gradient is stored; a later one is added in place when the
                buffer holds the only reference to a dense block, else
                ``old + new`` is a new block and both are dropped.
  AccumulateGrad  the first gradient of a leaf is stolen (it becomes
                ``.grad`` without a copy) when nothing else holds its block
                and it is dense, else copied; a later one is added into
                ``.grad`` in place.
  at the end    what is left: the leaves' gradients, the gradients ``grad()``
                returns, saved tensors under ``retain_graph``, the leaves.

Accelerator devices count allocated bytes as PyTorch's CUDA caching
allocator does (each block rounded up to a multiple of 512 bytes); the CPU
counts exact sizes. Reserved bytes (the allocator's cached segments) are not
modelled. Temporaries inside a node's formula are not modelled either, so a
pass's measured peak can be above this one by a formula's scratch space.

A model over the pass may add blocks of its own (``Extra``): data parallelism's buffers, such as DDP's
gradient buckets (allocated before the pass, held throughout) or FSDP's unsharded parameters (made when
their all-gather is issued, at a node's start; gone at a unit's post-backward, after a node or at the
pass's end); ``grads_in`` names the leaves whose ``.grad`` is a view of such a block (DDP's
``gradient_as_bucket_view``: the gradient AccumulateGrad made is copied into the bucket and let go);
``grads_out`` the leaves whose ``.grad`` is taken at a moment (FSDP's post-backward reduce-scatters the
unsharded gradients and drops them); ``leaves_out`` the leaves that are not alive throughout (FSDP's
unsharded parameters: an ``Extra`` stands for them).

Only the first top-level pass of the recording is replayed (``--repeat``
passes are alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autograd_run.graphs import tensors as T
from autograd_run.ops import ACCUMULATE_GRAD, CHECKPOINT, is_graph_root
from autograd_run.record.recording import Counter, Recording

#: PyTorch's CUDA caching allocator rounds every block up to this many bytes (``kMinBlockSize``).
CUDA_BLOCK = 512
#: How many of the largest holders at a peak are listed.
TOP_HOLDERS = 8

# what a block holds (the holder kinds the summary groups by)
SAVED = "saved tensors"
GRADIENT = "gradient buffers"
LEAF_GRAD = "leaf gradients (.grad)"
ROOT = "root gradients"
OUTPUT = "outputs being made"
PARALLEL = "data-parallel buffers"
LEAF = "leaves (parameters, inputs)"
KINDS = (SAVED, GRADIENT, OUTPUT, ROOT, LEAF_GRAD, LEAF, PARALLEL)


@dataclass(frozen=True)
class Extra:
    """A block a model over the pass adds (``PARALLEL``): ``what`` it is, its bytes, its device, and its
    lifetime: ``made`` None (before the pass) or ``("start", node id)`` (when that node starts); ``gone``
    None (never), ``("start", node id)`` (once that node has started), ``("end", node id)`` (after that node
    ran) or ``("final",)`` (at the pass's end)."""

    what: str
    bytes: int
    device: Any
    made: tuple | None = None
    gone: tuple | None = None


@dataclass
class Holder:
    """One block alive at a moment: what it is, its bytes."""

    kind: str
    what: str
    bytes: int


@dataclass
class DeviceMemory:
    """One device's live bytes over the pass (``bytes``: allocated, as the module docstring defines them)."""

    device: str
    #: Live at the pass's start: saved tensors, root gradients, existing ``.grad``, the leaves.
    start: int = 0
    #: The highest live bytes, when (ns since the recording's start) and which node was running.
    peak: int = 0
    peak_ns: int = 0
    peak_node: str | None = None
    peak_name: str | None = None
    #: Live at the pass's end.
    end: int = 0
    #: At the peak: bytes by holder kind (``KINDS``) and the largest blocks.
    at_peak: dict = field(default_factory=dict)
    holders: list[Holder] = field(default_factory=list)
    #: At the end: bytes by holder kind.
    at_end: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"device": self.device, "start_bytes": self.start, "peak_bytes": self.peak,
                "peak_ns": self.peak_ns, "peak_node": self.peak_node, "peak_name": self.peak_name,
                "end_bytes": self.end, "at_peak": dict(self.at_peak),
                "largest_at_peak": [{"kind": h.kind, "what": h.what, "bytes": h.bytes} for h in self.holders],
                "at_end": dict(self.at_end)}


@dataclass
class OverLimit:
    """The first moment the pass would not fit in ``limit`` bytes on ``device``."""

    device: str
    limit: int
    bytes: int
    ns: int
    node: str
    name: str

    def to_dict(self) -> dict:
        return {"device": self.device, "limit_bytes": self.limit, "bytes": self.bytes, "ns": self.ns,
                "node": self.node, "name": self.name}


@dataclass
class Memory:
    devices: list[DeviceMemory] = field(default_factory=list)
    #: Where shared storage came from: ``captured`` (the graph's ``storage`` section) or ``per tensor``.
    storage: str = "per tensor"
    retain_graph: bool = False
    over_limit: OverLimit | None = None
    #: Live bytes after each event: times (ns since the recording's start), device index into ``devices``,
    #: bytes. What the trace's counter track shows.
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Per node id: bytes its run freed less the bytes it allocated (what ``draw`` colours by).
    freed: dict = field(default_factory=dict)
    #: The recording's time that ``ts`` counts from (ns).
    t0: int = 0
    #: Every block (storage) of the replay: its bytes, its device (index into ``devices``) and what held it when
    #: made (``holder(b)``); and every allocation and free in order (``events``: ``b`` made, ``~b`` freed) with its
    #: time (``event_ts``, ns since ``t0``: the end of the node whose run made it). What a memory snapshot shows;
    #: kept when asked for (``memory_of(..., events=True)``), else empty.
    block_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    block_dev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    events: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    event_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Per block, the kind and the holder it had when made (the replay's own lists).
    holders: tuple = field(default=((), ()), repr=False)

    def holder(self, b: int) -> tuple[str, str]:
        """(kind, description) of what held block ``b`` when it was made."""
        kind, what = self.holders[0][b], self.holders[1][b]
        return kind, describe(kind, what)

    def counters(self) -> list[Counter]:
        """One counter track per device, its allocated bytes over the pass (``Recording.counters``)."""
        out = []
        for d, dm in enumerate(self.devices):
            at = self.dev == d
            out.append(Counter(f"{dm.device} memory", "allocated", self.ts[at] + self.t0, self.live[at]))
        return out

    def to_dict(self) -> dict:
        d = {"storage": self.storage, "retain_graph": self.retain_graph,
             "devices": [m.to_dict() for m in self.devices]}
        if self.over_limit is not None:
            d["over_limit"] = self.over_limit.to_dict()
        return d


def nbytes(shape, dtype: str | None) -> int:
    return math.prod(shape) * T.itemsize(dtype)


def describe(kind: str, what) -> str:
    """A block's holder as the summary names it (made only for the blocks it shows)."""
    if kind == SAVED:
        node, name = what
        return f"saved by {node.name} {node.id} ({name})"
    if kind == GRADIENT:
        return f"gradient for {what.name} {what.id}"
    if kind == OUTPUT:
        node, i = what
        return f"output {i} of {node.name} {node.id}"
    if kind == ROOT:
        return f"root gradient {what}"
    if kind == PARALLEL:
        return str(what)
    if kind == LEAF_GRAD:
        return f"{what}.grad"
    return str(what)


class _State:
    """The blocks (storages) and how many holders each has, as the replay goes."""

    def __init__(self, events: bool = False):
        self.size: list[int] = []
        self.dev: list[int] = []
        self.refs: list[int] = []
        self.kind: list[str] = []       # per block: its holder now
        self.what: list = []
        self.kind0: list[str] = []      # per block: its holder when made
        self.what0: list = []
        self.index: dict = {}           # Device -> index
        self.by_id: dict = {}           # id(Device) -> index
        self.keep: list = []            # the Devices whose ids by_id holds
        self.labels: list[str] = []
        self.rounding: list[int] = []   # per device: block rounding (1: none)
        self.live: list[int] = []
        self.dirty: set = set()         # devices whose live bytes changed since the last sample
        #: The sample the replay is at; per block, the sample that saw it made and the one that saw it go (-1:
        #: alive), and its changes of holder (block, sample, kind, what): what held a peak, read afterwards.
        self.now = 0
        self.born: list[int] = []
        self.died: list[int] = []
        self.changes: list[tuple] = []
        #: Every allocation and free in the order they happen (``b`` made, ``~b`` freed: what a memory snapshot's
        #: device trace lists), and per sample the length the log had then and the sample's time.
        self.log: list[int] | None = [] if events else None
        self.marks: list[int] = []
        self.mark_ts: list[int] = []

    def hold(self, b: int, kind: str, what) -> None:
        """Block ``b`` is now held as ``kind`` by ``what``."""
        self.kind[b], self.what[b] = kind, what
        self.changes.append((b, self.now, kind, what))

    def device_index(self, device) -> int:
        i = self.by_id.get(id(device))  # by identity first: a Device's own hash and == are Python code
        if i is None:
            i = self.index.get(device)
            if i is None:
                i = self.index[device] = len(self.labels)
                self.labels.append(str(device))
                self.rounding.append(1 if device.is_cpu else CUDA_BLOCK)
                self.live.append(0)
            self.by_id[id(device)] = i
            self.keep.append(device)  # the id stays this device's while the replay runs
        return i

    def new(self, size: int, device, kind: str, what, refs: int = 1) -> int:
        d = self.by_id.get(id(device))
        if d is None:
            d = self.device_index(device)
        r = self.rounding[d]
        if r > 1 and size:
            size = -(-size // r) * r
        b = len(self.size)
        self.size.append(size)
        self.dev.append(d)
        self.refs.append(refs)
        self.kind.append(kind)
        self.what.append(what)
        self.kind0.append(kind)
        self.what0.append(what)
        self.born.append(self.now)
        self.died.append(-1)
        if self.log is not None:
            self.log.append(b)
        if size:
            self.live[d] += size
            self.dirty.add(d)
        return b

    def drop(self, b: int) -> None:
        refs = self.refs
        refs[b] -= 1
        if refs[b] == 0:
            self.died[b] = self.now
            if self.log is not None:
                self.log.append(~b)
        if refs[b] == 0 and self.size[b]:
            d = self.dev[b]
            self.live[d] -= self.size[b]
            self.dirty.add(d)

    def at(self, sample: int, d: int) -> list[tuple[int, str, Any]]:
        """(bytes, kind, what) of each block on device ``d`` alive at ``sample`` (made at or before it, gone
        after it), with the holder it had then."""
        kind, what = {}, {}
        for b, when, k, w in self.changes:
            if when <= sample:
                kind[b], what[b] = k, w
        out = []
        for b, size in enumerate(self.size):
            if size and self.dev[b] == d and self.born[b] <= sample and not (0 <= self.died[b] <= sample):
                if b in kind:
                    out.append((size, kind[b], what[b]))
                else:
                    out.append((size, self.kind0[b], self.what0[b]))
        return out


# how a gradient tensor is laid out (what decides whether PyTorch adds into it in place, or steals it as .grad)
CONTIGUOUS = "C"     # row-major
TRANSPOSED = "T"     # its last two dims swapped, it is row-major (a matrix whose .t() is row-major)
STRIDED = "X"        # dense, another order (a permute, a narrow of an inner dim)
EXPANDED = "E"       # overlapping (stride 0): not dense


def _norm(layout: str, shape) -> str:
    """A layout that is row-major after all: a dense one with at most one dimension longer than 1, or an
    expanded one of one element."""
    if layout == EXPANDED:
        return CONTIGUOUS if math.prod(shape) <= 1 else EXPANDED
    if layout != CONTIGUOUS and sum(1 for s in shape if s != 1) <= 1:
        return CONTIGUOUS
    return layout


class _Grad:
    """A gradient tensor: its block, its layout, its own bytes (a view's, not the block's), its holders."""

    __slots__ = ("block", "layout", "nbytes", "refs")

    def __init__(self, block: int, layout: str, nbytes: int):
        self.block, self.layout, self.nbytes, self.refs = block, layout, nbytes, 1


def first_pass(rec: Recording) -> tuple[list, np.ndarray, np.ndarray]:
    """(node objects, starts, ends) of the recording's first top-level backward call (and the calls nested in
    it), in end order."""
    c = rec.columns()
    S = c.slices
    if not len(S):
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    keep = None
    tops = [g for g in rec.graph_tasks if g.depth == 0]
    if len(tops) > 1:
        first = min(tops, key=lambda g: g.start)
        end = first.end if first.end is not None else int(S.end.max())
        keep = (S.start >= first.start) & (S.end <= end)
    node, start, end_ = S.node, S.start, S.end
    if keep is not None:
        node, start, end_ = node[keep], start[keep], end_[keep]
    table = c.nodes
    return [table[i] for i in node.tolist()], start, end_


def _saved_tensors(node) -> list[tuple[str, Any]]:
    """(field, value) of each saved tensor of ``node``: fields of kind tensor given as tensors, and tensor specs."""
    out = []
    fields = node.op.tensor_fields
    for k, v in node.saved.items():
        if type(v) is dict:
            if "random" in v or "npz" in v or "data" in v:
                out.append((k, v))
        elif k in fields and v is not None and type(v) is not str and type(v) is not bool:
            out.append((k, v))
    return out


def _spec_bytes(value, side) -> int:
    if type(value) is dict:
        q = T.quick_random_numel(value)
        if q >= 0:
            return q * 4
        try:
            shape = T.spec_shape(value, side)
            dtype = T.spec_dtype(value, side)
        except Exception:  # noqa: BLE001 - an unreadable side file: the run reports it; no size here
            return 0
        return 0 if shape is None else nbytes(shape, dtype or "float32")
    if isinstance(value, (int, float, complex)):
        return 8  # a wrapped scalar: a 0-dim double tensor
    if isinstance(value, list):
        return int(np.asarray(value).size) * 4
    return 0


def _inner_nodes(graph) -> dict:
    """Checkpoint node -> the nodes of its nested graph (reachable only through ``attrs.inner``)."""
    checkpoints = graph.nodes_of(CHECKPOINT)
    if not checkpoints:
        return {}
    by_id = graph.by_id

    def reach(starts) -> set:
        seen, stack = set(), list(starts)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(e.node for e in n.next if e is not None)
        return seen
    outer = reach(r.edge.node for r in graph.roots)
    out = {}
    for c in checkpoints:
        starts = [by_id[ref[0]] for ref in c.attrs["inner"]["roots"] if ref is not None and ref[0] in by_id]
        out[c] = [n for n in reach(starts) if n not in outer]
    return out


def memory_of(graph, rec: Recording, retain_graph: bool = False, limit: int | None = None,
              extras: tuple = (), grads_in: dict | None = None, grads_out: dict | None = None,
              leaves_out=(), events: bool = False) -> Memory:
    """The pass's memory per device (see the module docstring); ``limit``: bytes per device to check;
    ``extras``: ``Extra`` blocks; ``grads_in``: leaf name -> index in ``extras`` of the block its ``.grad``
    is a view of; ``grads_out``: leaf name -> the moment its ``.grad`` is taken (as ``Extra.gone``);
    ``leaves_out``: leaf names not counted as alive throughout; ``events``: keep every allocation and free in
    order (``Memory.events``, what a memory snapshot shows; about a tenth more time)."""
    run = first_pass(rec)
    replay = _Replay(graph, rec, run, retain_graph, limit, extras, grads_in or {}, grads_out or {},
                     set(leaves_out), events)
    replay.run()
    mem = Memory(retain_graph=retain_graph, storage="captured" if graph.storage is not None else "per tensor")
    st = replay.st
    for d, label in enumerate(st.labels):
        ts, node = replay.peak_at[d]
        dm = DeviceMemory(label, start=replay.start_live[d], peak=replay.peaks[d], peak_ns=ts,
                          peak_node=node.id if node is not None else None,
                          peak_name=node.name if node is not None else None, end=st.live[d])
        dm.at_end = _by_kind(st, d)
        mem.devices.append(dm)
    mem.over_limit = replay.over
    mem.ts = np.asarray(replay.samples_ts, np.int64)
    mem.dev = np.asarray(replay.samples_dev, np.int32)
    mem.live = np.asarray(replay.samples_live, np.int64)
    mem.freed = replay.freed
    mem.t0 = replay.t0
    # what held each device's peak: the blocks alive at the sample that reached it, as they were held then
    for d, dm in enumerate(mem.devices):
        live = st.at(replay.peak_sample[d], d)
        by_kind: dict = {}
        for size, kind, _ in live:
            by_kind[kind] = by_kind.get(kind, 0) + size
        dm.at_peak = {k: by_kind[k] for k in KINDS if by_kind.get(k)}
        live.sort(key=lambda x: -x[0])
        dm.holders = [Holder(kind, describe(kind, what), size) for size, kind, what in live[:TOP_HOLDERS]]
    order = sorted(range(len(mem.devices)), key=lambda d: (mem.devices[d].device != "cpu", mem.devices[d].device))
    remap = np.zeros(max(len(order), 1), np.int32)
    for new, old in enumerate(order):
        remap[old] = new
    mem.devices = [mem.devices[d] for d in order]
    if len(mem.dev):
        mem.dev = remap[mem.dev]
    if st.log is None:
        return mem
    # the allocations and frees in order, each at the time of the first sample taken after it
    mem.block_size = np.asarray(st.size, np.int64)
    mem.block_dev = remap[np.asarray(st.dev, np.int64)].astype(np.int32) if st.dev else np.zeros(0, np.int32)
    mem.events = np.asarray(st.log, np.int64)
    at = np.searchsorted(np.asarray(st.marks, np.int64), np.arange(len(st.log)), side="right")
    mark_ts = np.asarray(st.mark_ts + [st.mark_ts[-1] if st.mark_ts else 0], np.int64)
    mem.event_ts = mark_ts[np.minimum(at, len(mark_ts) - 1)]
    mem.holders = (st.kind0, st.what0)
    return mem


class _Replay:
    """One replay of the pass over its events (the module docstring's model)."""

    def __init__(self, graph, rec: Recording, run: tuple, retain_graph: bool, limit: int | None,
                 extras: tuple = (), grads_in: dict | None = None, grads_out: dict | None = None,
                 leaves_out: set = frozenset(), events: bool = False):
        self.graph, self.retain_graph, self.limit = graph, retain_graph, limit
        self.extras, self.grads_in, self.leaves_out = extras, grads_in or {}, leaves_out
        self.extra_blocks: list[int | None] = [None] * len(extras)
        #: What happens at a node's start, after a node, at the end: ("make" | "free", extra index) or
        #: ("take", leaf name), in the order given.
        self.at: dict[tuple, list] = {}
        for k, x in enumerate(extras):
            if x.made is not None:
                self.at.setdefault(tuple(x.made), []).append(("make", k))
            if x.gone is not None:  # (made and gone at one moment: gone after what comes there)
                self.at.setdefault(tuple(x.gone), []).append(("free" if x.gone != x.made else "free-last", k))
        for name, when in (grads_out or {}).items():
            self.at.setdefault(tuple(when), []).append(("take", name))
        order = {"free": 0, "make": 1, "take": 2, "free-last": 3}  # what goes, what comes, gradients taken
        for acts in self.at.values():
            acts.sort(key=lambda a: order[a[0]])
        self.starts_at = {w[1] for w in self.at if w[0] == "start"}
        self.nodes, self.starts, self.ends = run
        self.t0 = rec.start if rec.start else (int(self.starts.min()) if len(self.starts) else 0)
        self.st = _State(events)
        self.grads: dict[str, _Grad] = {}
        self.buffers: dict = {}
        self.node_blocks: dict = {}
        self.users: dict[int, int] = {}
        self.captured: dict[int, int] = {}
        storage = graph.storage or {}
        self.blocks = storage.get("blocks", [])
        self.saved_map = storage.get("saved", {})
        self.inner = _inner_nodes(graph)
        #: Non-reentrant checkpoint regions (the storage section's recompute groups): the nodes waiting for
        #: each, the groups each node waits for, the groups made so far.
        self.pending: dict[int, list] = {}
        self.group_of: dict = {}
        self.recomputed: set = set()
        self.peaks: list[int] = []
        self.peak_at: list = []
        self.peak_sample: list[int] = []
        self.start_live: list[int] = []
        self.samples_ts: list[int] = []
        self.samples_dev: list[int] = []
        self.samples_live: list[int] = []
        self.n_samples = 0
        self.over: OverLimit | None = None
        self.freed: dict = {}

    # -- the pass's start ---------------------------------------------------------------
    def saved_of(self, node, only: int | None = None) -> list[int]:
        """The blocks of ``node``'s saved tensors, made where new (``only``: those of one recompute group)."""
        st = self.st
        fields = self.saved_map.get(node.id)
        mine: list[int] = []
        users = self.users
        for name, value in _saved_tensors(node):
            fb = fields.get(name) if fields else None
            if fb is not None:
                size, var, group = self.blocks[fb]
                if var is not None:
                    continue  # a leaf's storage: counted with the leaves, never freed
                if only is not None and group != only:
                    continue
                if group is not None and group not in self.recomputed:
                    # recomputed in the backward (a non-reentrant checkpoint's region): made when the first
                    # node that needs one of the region's tensors starts
                    self.pending.setdefault(group, []).append(node)
                    self.group_of.setdefault(node, set()).add(group)
                    continue
                b = self.captured.get(fb)
                if b is None:
                    b = self.captured[fb] = st.new(size, node.device, SAVED, (node, name))
            elif only is not None:
                continue
            else:
                b = st.new(_spec_bytes(value, self.graph.side_files), node.device, SAVED, (node, name))
            if b not in mine:
                mine.append(b)
                users[b] = users.get(b, 0) + 1
        return mine

    def recompute(self, group: int) -> None:
        """A non-reentrant checkpoint region's saved tensors, made again (once) for the nodes that need them."""
        if group in self.recomputed:
            return
        self.recomputed.add(group)
        for node in self.pending.pop(group, ()):
            mine = self.node_blocks.setdefault(node, [])
            for b in self.saved_of(node, only=group):
                if b not in mine:
                    mine.append(b)
                else:
                    self.users[b] -= 1

    def put(self, node, slot: int, g: "_Grad", ts: int | None = None, producer=None) -> None:
        """A gradient into ``node``'s input buffer slot: stored; or added in place when the buffer holds the
        only reference to a dense tensor and its block; or summed out of place (the sum, the old and the new
        gradient alive at once: sampled at ``ts`` when given)."""
        st = self.st
        buf = self.buffers.get(node)
        if buf is None:
            buf = self.buffers[node] = [None] * max(node.num_inputs, slot + 1)
        old = buf[slot]
        if old is None:
            buf[slot] = g
            if st.kind[g.block] is OUTPUT:
                st.hold(g.block, GRADIENT, node)
            return
        if old.layout != EXPANDED and old.refs == 1 and st.refs[old.block] == 1:
            self.let_go(g)  # added into the buffer's tensor in place
            return
        meta = node.inputs[slot] if slot < node.num_inputs else None
        size = nbytes(meta.shape, meta.dtype) if meta is not None else old.nbytes
        device = meta.device if meta is not None else node.device
        buf[slot] = _Grad(st.new(size, device, GRADIENT, node), CONTIGUOUS, size)
        if ts is not None:
            self.sample(ts, producer)
        self.let_go(old)
        self.let_go(g)

    def let_go(self, g: "_Grad") -> None:
        """One holder of gradient ``g`` lets it go."""
        g.refs -= 1
        self.st.drop(g.block)

    def share(self, g: "_Grad") -> "_Grad":
        """One more holder of gradient ``g`` (the same tensor)."""
        g.refs += 1
        self.st.refs[g.block] += 1
        return g

    def view(self, g: "_Grad", layout: str, size: int) -> "_Grad":
        """A new view of ``g``'s block."""
        self.st.refs[g.block] += 1
        return _Grad(g.block, layout, size)

    def begin(self) -> None:
        graph, st = self.graph, self.st
        inner_of = {n for ns in self.inner.values() for n in ns}
        for v in graph.variables.values():  # the leaves' values: alive throughout
            if v.name not in self.leaves_out:
                st.new(nbytes(v.shape, v.dtype), v.device, LEAF, v.name)
        for k, x in enumerate(self.extras):  # data-parallel buffers made before the pass
            if x.made is None:
                self.extra_blocks[k] = st.new(x.bytes, x.device, PARALLEL, x.what)
        for v in graph.variables.values():
            if v.grad is not None:
                size = nbytes(v.shape, v.dtype)
                self.grads[v.name] = _Grad(st.new(size, v.device, LEAF_GRAD, v.name), CONTIGUOUS, size)
        node_blocks = self.node_blocks
        for n in graph.nodes:
            if n.saves_tensors and n not in inner_of:
                node_blocks[n] = self.saved_of(n)
        for k, r in enumerate(graph.roots):
            node, slot = r.edge
            meta = node.inputs[slot] if slot < node.num_inputs else None
            size = nbytes(meta.shape, meta.dtype) if meta is not None else 4
            g = _Grad(st.new(size, meta.device if meta is not None else node.device, ROOT, k), CONTIGUOUS, size)
            self.put(node, slot, g)

    def happen(self, when: tuple, ts: int, node) -> None:
        """What the extras do at moment ``when`` (``Extra.made`` / ``gone``, ``grads_out``)."""
        acts = self.at.get(when)
        if not acts:
            return
        st = self.st
        for act, arg in acts:
            if act == "make" and self.extra_blocks[arg] is None:
                x = self.extras[arg]
                self.extra_blocks[arg] = st.new(x.bytes, x.device, PARALLEL, x.what)
                self.sample(ts, node)
            elif act in ("free", "free-last") and self.extra_blocks[arg] is not None and self.extra_blocks[arg] >= 0:
                st.drop(self.extra_blocks[arg])
                self.extra_blocks[arg] = -1  # gone (not to be made again)
            elif act == "take":
                g = self.grads.pop(arg, None)
                if g is not None:
                    self.let_go(g)
        self.sample(ts, node)

    # -- samples ------------------------------------------------------------------------
    def sample(self, ts: int, node) -> None:
        st = self.st
        rel = ts - self.t0
        live = st.live
        while len(self.peaks) < len(live):
            self.peaks.append(0)
            self.peak_at.append((rel, None))
            self.peak_sample.append(self.n_samples)
            self.start_live.append(0)
        for d in st.dirty:
            v = live[d]
            if v > self.peaks[d]:
                self.peaks[d] = v
                self.peak_at[d] = (rel, node)
                self.peak_sample[d] = self.n_samples
            if self.over is None and self.limit is not None and v > self.limit and node is not None:
                self.over = OverLimit(st.labels[d], self.limit, v, rel, node.id, node.name)
            self.samples_ts.append(rel)
            self.samples_dev.append(d)
            self.samples_live.append(v)
        st.dirty.clear()
        if st.log is not None:
            st.marks.append(len(st.log))
            st.mark_ts.append(rel)
        self.n_samples += 1
        st.now = self.n_samples

    # -- the replay ---------------------------------------------------------------------
    def run(self) -> None:
        st = self.st
        self.begin()
        self.start_live = list(st.live)
        self.peaks = list(st.live)
        self.peak_at = [(0, None)] * len(st.live)
        self.peak_sample = [0] * len(st.live)
        st.dirty = set(range(len(st.live)))
        self.sample(self.t0, None)
        nodes, ends = self.nodes, self.ends.tolist()
        if self.inner or self.group_of or self.starts_at:  # a recomputation's start is an event too
            starts = self.starts.tolist()
            events = [(e, 1, n) for n, e in zip(nodes, ends)]
            events += [(s, 0, n) for n, s in zip(nodes, starts)
                       if n in self.inner or n in self.group_of or n.id in self.starts_at]
            events.sort(key=lambda e: (e[0], -e[1]))  # at one instant, a node ends before the next starts
        else:
            events = zip(ends, [1] * len(ends), nodes)
        finish = self.finish
        for ts, kind, node in events:
            if kind == 0:  # a recomputation: a checkpoint's nested graph, or a non-reentrant region's tensors
                for n in self.inner.get(node, ()):
                    if n.saves_tensors and n not in self.node_blocks:
                        self.node_blocks[n] = self.saved_of(n)
                for group in self.group_of.get(node, ()):
                    self.recompute(group)
                self.happen(("start", node.id), ts, node)
                self.sample(ts, node)
            elif not is_graph_root(node):
                finish(node, ts)
        self.end()

    def finish(self, node, ts: int) -> None:
        """``node`` has run: its outputs made, its inputs and saved tensors let go, its outputs delivered."""
        st, grads = self.st, self.grads
        before = sum(st.live)
        held = self.buffers.pop(node, None) or ()
        outs = []
        op = node.op
        if op is not ACCUMULATE_GRAD:
            kinds = op.views
            if kinds and not isinstance(kinds, str):
                kinds = kinds(node)
            src = None
            for g in held:
                if g is not None:
                    src = g
                    break
            names = node.attrs.get("inner", {}).get("inputs") if op is CHECKPOINT else None
            for i, e in enumerate(node.next):
                if e is None:
                    continue
                target, slot = e
                if slot >= len(target.inputs):
                    continue
                meta = target.inputs[slot]
                size = nbytes(meta.shape, meta.dtype)
                kind = kinds if type(kinds) is str else (kinds[i] if i < len(kinds) else "")
                g = None
                if names is not None and i < len(names) and names[i] in grads:
                    g = grads.pop(names[i])  # the nested backward's gradient of the detached input
                elif kind and kind != "t-new" and src is not None:
                    g = self.derived(node, src, kind, size, meta)
                if g is None:
                    layout = TRANSPOSED if kind == "t-new" and len(meta.shape) >= 2 else CONTIGUOUS
                    g = _Grad(st.new(size, meta.device, OUTPUT, (node, i)), _norm(layout, meta.shape), size)
                outs.append((target, slot, g))
        if outs:
            self.sample(ts, node)  # the node's own peak: its inputs and its outputs
        if op is ACCUMULATE_GRAD and node.variable is not None and held and held[0] is not None:
            g = held[0]
            name = node.variable
            if grads.get(name) is None:
                var = self.graph.variables.get(name)
                if g.refs == 1 and g.layout == CONTIGUOUS:
                    grads[name] = self.share(g)  # stolen: .grad takes the tensor itself
                else:  # copied (held elsewhere too, or not laid out as the variable is)
                    size = nbytes(var.shape, var.dtype)
                    grads[name] = _Grad(st.new(size, var.device, LEAF_GRAD, name), CONTIGUOUS, size)
                    self.sample(ts, node)  # the copy and the gradient it copies, alive at once
                st.hold(grads[name].block, LEAF_GRAD, name)
                k = self.grads_in.get(name)
                if k is not None:  # copied into its bucket, and .grad becomes the bucket's view of it
                    self.sample(ts, node)
                    made = grads[name]
                    bucket = self.extra_blocks[k]
                    st.refs[bucket] += 1
                    grads[name] = _Grad(bucket, CONTIGUOUS, made.nbytes)
                    self.let_go(made)
            # else: added into .grad in place
        for g in held:
            if g is not None:
                self.let_go(g)
        if not self.retain_graph:
            mine = self.node_blocks.pop(node, None)
            if mine:
                users = self.users
                for b in mine:
                    users[b] -= 1
                    if users[b] == 0:
                        st.drop(b)
        put = self.put
        for target, slot, g in outs:
            put(target, slot, g, ts, node)
        self.freed[node.id] = before - sum(st.live)
        self.sample(ts, node)
        if self.at:
            self.happen(("end", node.id), ts, node)

    def derived(self, node, src: "_Grad", kind: str, size: int, meta) -> "_Grad | None":
        """Output ``kind`` of ``node`` made from its incoming gradient ``src``: the gradient itself or a view
        of it, or None where it is new memory (another device or dtype, a ``sum_to``, a reshape's copy)."""
        st = self.st
        if st.device_index(meta.device) != st.dev[src.block]:
            return None
        if kind == "same":
            return self.share(src) if size == src.nbytes else None
        if kind == "expand":
            return self.view(src, _norm(EXPANDED, meta.shape), size)
        if kind == "part":
            dim = node.saved.get("dim", 0)
            dim = dim if isinstance(dim, int) else 0
            leading = [s for s in meta.shape[:dim] if s != 1] if 0 <= dim < len(meta.shape) else [0]
            layout = src.layout if src.layout == EXPANDED or (src.layout == CONTIGUOUS and not leading) else STRIDED
            return self.view(src, _norm(layout, meta.shape), size)
        if size != src.nbytes:
            return None
        if kind == "view":
            return self.view(src, src.layout, size)
        if kind == "reshape":
            if src.layout in (CONTIGUOUS, EXPANDED):
                return self.view(src, src.layout, size)
            return None  # reshape copies a gradient it cannot view
        if kind == "transpose":
            flip = {CONTIGUOUS: TRANSPOSED, TRANSPOSED: CONTIGUOUS}
            if _last_two(node, len(meta.shape)):
                layout = flip.get(src.layout, src.layout)
            else:
                layout = src.layout if src.layout == EXPANDED else STRIDED
            return self.view(src, _norm(layout, meta.shape), size)
        if kind == "permute":
            dims = node.saved.get("dims")
            same = isinstance(dims, list) and dims == list(range(len(dims)))
            layout = src.layout if same or src.layout == EXPANDED else STRIDED
            return self.view(src, _norm(layout, meta.shape), size)
        return None

    def end(self) -> None:
        """Buffers of nodes that never ran go, except the gradients ``grad()`` returns."""
        graph, st = self.graph, self.st
        requested = {e.node for e in graph.input_edges()} if graph.mode == "grad" else set()
        for node, buf in list(self.buffers.items()):
            if node in requested:
                continue
            for g in buf:
                if g is not None:
                    self.let_go(g)
            del self.buffers[node]
        end_ts = int(self.ends.max()) if len(self.ends) else self.t0
        self.happen(("final",), end_ts, None)
        st.dirty = set(range(len(st.live)))
        self.sample(end_ts, None)


def _last_two(node, ndim: int) -> bool:
    """Whether a transpose node swaps the last two dims (``TBackward0``'s matrix; ``dim0``/``dim1`` saved as
    PyTorch writes them, -1 as 2**64-1)."""
    if ndim < 2:
        return False
    if "dim0" not in node.saved:
        return ndim == 2
    dims = set()
    for k in ("dim0", "dim1"):
        d = node.saved.get(k)
        if not isinstance(d, int):
            return False
        d = d - (1 << 64) if d >= 1 << 63 else d
        dims.add(d % ndim)
    return dims == {ndim - 2, ndim - 1}


def _by_kind(st: _State, d: int) -> dict:
    out = {k: 0 for k in KINDS}
    for b in range(len(st.size)):
        if st.dev[b] == d and st.refs[b] > 0:
            out[st.kind[b]] += st.size[b]
    return {k: v for k, v in out.items() if v}

def static_frees(graph) -> dict:
    """Per node, the bytes its run would free less those it would allocate, from the graph alone (no order):
    its saved tensors (a block shared by k nodes counted 1/k), its input gradients, less its outputs that are
    new memory. What the ``memory`` scheduling policy ranks ready nodes by."""
    storage = graph.storage or {}
    blocks = storage.get("blocks", [])
    saved_map = storage.get("saved", {})
    savers: dict[int, int] = {}
    for nid, fields in saved_map.items():
        for b in set(fields.values()):
            savers[b] = savers.get(b, 0) + 1
    out = {}
    for node in graph.nodes:
        freed = 0
        fields = saved_map.get(node.id, {})
        seen = set()
        for name, value in _saved_tensors(node):
            fb = fields.get(name)
            if fb is None:
                freed += _spec_bytes(value, graph.side_files)
            elif fb not in seen and blocks[fb][1] is None:
                seen.add(fb)
                freed += blocks[fb][0] // max(savers.get(fb, 1), 1)
        freed += sum(nbytes(m.shape, m.dtype) for m in node.inputs)
        if node.op is not ACCUMULATE_GRAD:
            kinds = node.op.view_kinds(node)
            for i, e in enumerate(node.next):
                if e is None or e.input_nr >= e.node.num_inputs:
                    continue
                kind = kinds if isinstance(kinds, str) else (kinds[i] if i < len(kinds) else "")
                meta = e.node.inputs[e.input_nr]
                size = nbytes(meta.shape, meta.dtype)
                src = node.inputs[0] if node.inputs else None
                view = (kind and src is not None and src.device == meta.device
                        and (kind != "same" or nbytes(src.shape, src.dtype) == size))
                if not view:
                    freed -= size  # new memory (a view of the incoming gradient is none)
        else:
            freed -= sum(nbytes(m.shape, m.dtype) for m in node.inputs)  # the gradient stays, as .grad
        out[node] = freed
    return out
