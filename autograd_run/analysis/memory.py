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
LEAF = "leaves (parameters, inputs)"
KINDS = (SAVED, GRADIENT, OUTPUT, ROOT, LEAF_GRAD, LEAF)


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

    def counters(self) -> list[Counter]:
        """One counter track per device, its allocated bytes over the pass (``Recording.counters``)."""
        out = []
        for d, dm in enumerate(self.devices):
            at = self.dev == d
            out.append(Counter(f"{dm.device} memory", "allocated", self.ts[at] + self.t0, self.live[at]))
        return out

    @property
    def peak(self) -> int:
        return max((d.peak for d in self.devices), default=0)

    def to_dict(self) -> dict:
        d = {"storage": self.storage, "retain_graph": self.retain_graph,
             "devices": [m.to_dict() for m in self.devices]}
        if self.over_limit is not None:
            d["over_limit"] = self.over_limit.to_dict()
        return d


def nbytes(shape, dtype: str | None) -> int:
    return math.prod(shape) * T.itemsize(dtype)


class _State:
    """The blocks and who holds them, as the replay goes."""

    def __init__(self, devices: dict, rounding: dict):
        self.size: list[int] = []
        self.dev: list[int] = []
        self.refs: list[int] = []
        self.kind: list[str] = []
        self.what: list[str] = []
        self.devices = devices          # device label -> index
        self.rounding = rounding        # device index -> block rounding (1: none)
        self.live = [0] * len(devices)

    def device_index(self, label: str) -> int:
        i = self.devices.get(label)
        if i is None:
            i = self.devices[label] = len(self.devices)
            self.live.append(0)
            self.rounding[i] = 1 if label == "cpu" else CUDA_BLOCK
        return i

    def new(self, size: int, device: str, kind: str, what: str, refs: int = 1) -> int:
        d = self.device_index(device)
        r = self.rounding[d]
        if r > 1:
            size = -(-size // r) * r if size else 0
        b = len(self.size)
        self.size.append(size)
        self.dev.append(d)
        self.refs.append(refs)
        self.kind.append(kind)
        self.what.append(what)
        self.live[d] += size
        return b

    def drop(self, b: int) -> None:
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.live[self.dev[b]] -= self.size[b]


class _Grad:
    """A gradient tensor: its block and whether it is dense (an expanded view is not)."""

    __slots__ = ("block", "dense")

    def __init__(self, block: int, dense: bool = True):
        self.block, self.dense = block, dense


def first_pass(rec: Recording) -> list:
    """The slices of the recording's first top-level backward call (and the calls nested in it), in end order."""
    slices = rec.slices
    tops = [g for g in rec.graph_tasks if g.depth == 0]
    if not tops:
        return list(slices)
    first = min(tops, key=lambda g: g.start)
    end = first.end if first.end is not None else max((s.end for s in slices), default=0)
    return [s for s in slices if first.start <= s.start and s.end <= end]


def _saved_tensors(node) -> list[tuple[str, Any]]:
    """(field, value) of each saved tensor of ``node``: fields of kind tensor given as tensors, and tensor specs."""
    out = []
    fields = node.op.tensor_fields
    for k, v in node.saved.items():
        if type(v) is dict and T.is_tensor_spec(v):
            out.append((k, v))
        elif k in fields and v is not None and not isinstance(v, (str, bool)):
            out.append((k, v))
    return out


def _spec_bytes(value, side) -> int:
    if isinstance(value, (int, float, complex)):
        return 8  # a wrapped scalar: a 0-dim double tensor
    if isinstance(value, list):
        return int(np.asarray(value).size) * 4
    try:
        shape = T.spec_shape(value, side)
        dtype = T.spec_dtype(value, side)
    except Exception:  # noqa: BLE001 - an unreadable side file: the run reports it; no size here
        return 0
    return 0 if shape is None else nbytes(shape, dtype or "float32")


def _inner_nodes(graph) -> dict:
    """Checkpoint node -> the nodes of its nested graph (reachable only through ``attrs.inner``)."""
    checkpoints = [n for n in graph.nodes if n.op is CHECKPOINT]
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


def memory_of(graph, rec: Recording, retain_graph: bool = False, limit: int | None = None) -> Memory:
    """The pass's memory per device (see the module docstring); ``limit``: bytes per device to check."""
    slices = first_pass(rec)
    replay = _Replay(graph, rec, slices, retain_graph, limit)
    replay.run()
    mem = Memory(retain_graph=retain_graph, storage="captured" if graph.storage is not None else "per tensor")
    st = replay.st
    labels = replay.labels()
    for d, label in enumerate(labels):
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
    # what holds each device's peak: the same replay again, stopped at the sample that reached it
    for d, dm in enumerate(mem.devices):
        again = _Replay(graph, rec, slices, retain_graph, None)
        again.run(stop_after=replay.peak_sample[d])
        dm.at_peak = _by_kind(again.st, d)
        live = [(again.st.size[b], b) for b in range(len(again.st.size))
                if again.st.dev[b] == d and again.st.refs[b] > 0 and again.st.size[b]]
        live.sort(key=lambda x: (-x[0], x[1]))
        dm.holders = [Holder(again.st.kind[b], again.st.what[b], size) for size, b in live[:TOP_HOLDERS]]
    order = sorted(range(len(mem.devices)), key=lambda d: (mem.devices[d].device != "cpu", mem.devices[d].device))
    remap = np.zeros(max(len(order), 1), np.int32)
    for new, old in enumerate(order):
        remap[old] = new
    mem.devices = [mem.devices[d] for d in order]
    if len(mem.dev):
        mem.dev = remap[mem.dev]
    return mem


class _Stop(Exception):
    """Raised by a replay told to stop after a given sample."""


class _Replay:
    """One replay of the pass over its events (the module docstring's model)."""

    def __init__(self, graph, rec: Recording, slices: list, retain_graph: bool, limit: int | None):
        self.graph, self.slices, self.retain_graph, self.limit = graph, slices, retain_graph, limit
        self.t0 = rec.start if rec.start else min((s.start for s in slices), default=0)
        self.st = _State({}, {})
        self.grads: dict[str, _Grad] = {}
        self.buffers: dict = {}
        self.node_blocks: dict = {}
        self.users: dict[int, int] = {}
        self.captured: dict[int, int] = {}
        storage = graph.storage or {}
        self.blocks = storage.get("blocks", [])
        self.saved_map = storage.get("saved", {})
        self.inner = _inner_nodes(graph)
        self.peaks: list[int] = []
        self.peak_at: list = []
        self.peak_sample: list[int] = []
        self.start_live: list[int] = []
        self.samples_ts: list[int] = []
        self.samples_dev: list[int] = []
        self.samples_live: list[int] = []
        self.n_samples = 0
        self.stop_after: int | None = None
        self.over: OverLimit | None = None
        self.freed: dict = {}

    def labels(self) -> list[str]:
        out = [""] * len(self.st.devices)
        for label, i in self.st.devices.items():
            out[i] = label
        return out

    # -- the pass's start ---------------------------------------------------------------
    def saved_of(self, node) -> list[int]:
        st = self.st
        fields = self.saved_map.get(node.id, {})
        mine: list[int] = []
        for name, value in _saved_tensors(node):
            what = f"saved by {node.name} {node.id} ({name})"
            fb = fields.get(name)
            if fb is not None:
                size, var = self.blocks[fb]
                if var is not None:
                    continue  # a leaf's storage: counted with the leaves, never freed
                b = self.captured.get(fb)
                if b is None:
                    b = self.captured[fb] = st.new(size, str(node.device), SAVED, what)
            else:
                b = st.new(_spec_bytes(value, self.graph.side_files), str(node.device), SAVED, what)
            if b not in mine:
                mine.append(b)
                self.users[b] = self.users.get(b, 0) + 1
        return mine

    def put(self, node, slot: int, g: _Grad) -> None:
        """A gradient into ``node``'s input buffer slot (stored, added in place, or summed out of place)."""
        st = self.st
        buf = self.buffers.get(node)
        if buf is None:
            buf = self.buffers[node] = [None] * max(node.num_inputs, slot + 1)
        old = buf[slot]
        what = f"gradient for {node.name} {node.id}"
        if old is None:
            buf[slot] = g
            if st.kind[g.block] not in (LEAF_GRAD, ROOT):
                st.kind[g.block], st.what[g.block] = GRADIENT, what
            return
        if old.dense and st.refs[old.block] == 1:
            st.drop(g.block)  # added into the buffer's block in place
            return
        meta = node.inputs[slot] if slot < node.num_inputs else None
        size = nbytes(meta.shape, meta.dtype) if meta is not None else st.size[old.block]
        dev = str(meta.device) if meta is not None else _device_label(st, st.dev[old.block])
        buf[slot] = _Grad(st.new(size, dev, GRADIENT, what))
        st.drop(old.block)
        st.drop(g.block)

    def begin(self) -> None:
        graph, st = self.graph, self.st
        inner_of = {n for ns in self.inner.values() for n in ns}
        for v in graph.variables.values():  # the leaves' values: alive throughout
            st.new(nbytes(v.shape, v.dtype), str(v.device), LEAF, v.name)
        for v in graph.variables.values():
            if v.grad is not None:
                self.grads[v.name] = _Grad(st.new(nbytes(v.shape, v.dtype), str(v.device), LEAF_GRAD,
                                                  f"{v.name}.grad"))
        for n in graph.nodes:
            if n.saves_tensors and n not in inner_of:
                self.node_blocks[n] = self.saved_of(n)
        for k, r in enumerate(graph.roots):
            node, slot = r.edge
            meta = node.inputs[slot] if slot < node.num_inputs else None
            size = nbytes(meta.shape, meta.dtype) if meta is not None else 4
            g = _Grad(st.new(size, str(meta.device) if meta is not None else "cpu", ROOT, f"root gradient {k}"))
            self.put(node, slot, g)

    # -- samples ------------------------------------------------------------------------
    def sample(self, ts: int, node) -> None:
        live = self.st.live
        rel = ts - self.t0
        for d in range(len(live)):
            if d >= len(self.peaks):
                self.peaks.append(0)
                self.peak_at.append((rel, None))
                self.peak_sample.append(self.n_samples)
                self.start_live.append(0)
            v = live[d]
            if v > self.peaks[d]:
                self.peaks[d] = v
                self.peak_at[d] = (rel, node)
                self.peak_sample[d] = self.n_samples
            if self.over is None and self.limit is not None and v > self.limit and node is not None:
                self.over = OverLimit(_device_label(self.st, d), self.limit, v, rel, node.id, node.name)
            self.samples_ts.append(rel)
            self.samples_dev.append(d)
            self.samples_live.append(v)
        if self.stop_after is not None and self.n_samples >= self.stop_after:
            raise _Stop
        self.n_samples += 1

    # -- the replay ---------------------------------------------------------------------
    def run(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        try:
            self._run()
        except _Stop:
            pass

    def _run(self) -> None:
        st, graph = self.st, self.graph
        self.begin()
        self.start_live = list(st.live)
        self.peaks = list(st.live)
        self.peak_at = [(0, None)] * len(st.live)
        self.peak_sample = [0] * len(st.live)
        self.sample(self.t0, None)
        events = []
        for s in self.slices:
            if s.node in self.inner:
                events.append((s.start, 0, s))
            events.append((s.end, 1, s))
        events.sort(key=lambda e: (e[0], e[1]))
        for ts, kind, s in events:
            node = s.node
            if kind == 0:  # a checkpoint starts: its recomputation saves the nested graph's tensors
                for n in self.inner[node]:
                    if n.saves_tensors and n not in self.node_blocks:
                        self.node_blocks[n] = self.saved_of(n)
                self.sample(ts, node)
                continue
            if not is_graph_root(node):
                self.finish(node, ts)
        self.end()

    def finish(self, node, ts: int) -> None:
        """``node`` has run: its outputs made, its inputs and saved tensors let go, its outputs delivered."""
        st, grads = self.st, self.grads
        before = sum(st.live)
        held = self.buffers.pop(node, None) or []
        outs = []
        if node.op is not ACCUMULATE_GRAD:
            kinds = node.op.view_kinds(node)
            src = next((g for g in held if g is not None), None)
            names = node.attrs.get("inner", {}).get("inputs") if node.op is CHECKPOINT else None
            for i, e in enumerate(node.next):
                if e is None:
                    continue
                target, slot = e
                if slot >= target.num_inputs:
                    continue
                meta = target.inputs[slot]
                size = nbytes(meta.shape, meta.dtype)
                kind = kinds if isinstance(kinds, str) else (kinds[i] if i < len(kinds) else "")
                g = None
                if names is not None and i < len(names) and names[i] in grads:
                    g = grads.pop(names[i])  # the nested backward's gradient of the detached input
                elif kind and src is not None and _fits(st, src, size, meta, kind):
                    st.refs[src.block] += 1
                    g = _Grad(src.block, src.dense and kind != "expand")
                if g is None:
                    g = _Grad(st.new(size, str(meta.device), OUTPUT, f"output {i} of {node.name} {node.id}"))
                outs.append((target, slot, g))
        self.sample(ts, node)  # the node's own peak: its inputs and its outputs
        if node.op is ACCUMULATE_GRAD and node.variable is not None and held and held[0] is not None:
            g = held[0]
            var = graph_var = self.graph.variables.get(node.variable)
            if var is not None and grads.get(node.variable) is None:
                if g.dense and st.refs[g.block] == 1:
                    st.refs[g.block] += 1  # stolen: .grad takes the buffer's reference
                    grads[node.variable] = g
                else:  # copied (another holder, or an expanded view)
                    grads[node.variable] = _Grad(st.new(nbytes(graph_var.shape, graph_var.dtype),
                                                        str(graph_var.device), LEAF_GRAD, f"{node.variable}.grad"))
                b = grads[node.variable].block
                st.kind[b], st.what[b] = LEAF_GRAD, f"{node.variable}.grad"
            # else: added into .grad in place
        for g in held:
            if g is not None:
                st.drop(g.block)
        if not self.retain_graph:
            users = self.users
            for b in self.node_blocks.pop(node, ()):
                users[b] -= 1
                if users[b] == 0:
                    st.drop(b)
        for target, slot, g in outs:
            self.put(target, slot, g)
        self.freed[node.id] = before - sum(st.live)
        self.sample(ts, node)

    def end(self) -> None:
        """Buffers of nodes that never ran go, except the gradients ``grad()`` returns."""
        graph, st = self.graph, self.st
        requested = {e.node for e in graph.input_edges()} if graph.mode == "grad" else set()
        for node, buf in list(self.buffers.items()):
            if node in requested:
                continue
            for g in buf:
                if g is not None:
                    st.drop(g.block)
            del self.buffers[node]
        end_ts = max((s.end for s in self.slices), default=self.t0)
        self.sample(end_ts, None)


def _fits(st: _State, src: _Grad, size: int, meta, kind: str) -> bool:
    """Whether a view output of ``src`` needs no memory of its own (else the engine's sum_to or cast allocates)."""
    d = st.dev[src.block]
    if _device_label(st, d) != str(meta.device):
        return False
    if kind in ("part", "expand"):
        return True
    return st.size[src.block] == _rounded(st, size, d)


def _rounded(st: _State, size: int, d: int) -> int:
    r = st.rounding[d]
    return -(-size // r) * r if r > 1 and size else size


def _device_label(st: _State, d: int) -> str:
    for label, i in st.devices.items():
        if i == d:
            return label
    return "cpu"


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
