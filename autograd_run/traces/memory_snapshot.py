"""A memory snapshot that PyTorch's own viewer opens: the pass's allocations in ``torch.cuda.memory._snapshot()``'s
structure, pickled (``run`` and ``simulate --memory-snapshot FILE.pickle``).

MemoryViz (https://pytorch.org/memory_viz: drag the file onto the page) and ``torch.cuda._memory_viz`` (``python -m
torch.cuda._memory_viz trace_plot FILE.pickle -o out.html``, ``trace``; the module's ``segsum``) read what PyTorch
writes in ``_snapshot()``; the fields here are the ones they read, the same that PyTorch's own
``_memory_viz._profile_to_snapshot`` makes from a CPU profile:

  device_traces   per device a list of entries in the order they happened: ``alloc`` (a block made), then
                  ``free_requested`` and ``free_completed`` (its last holder let go), each with ``addr``, ``size``,
                  ``stream`` (0), ``time_us`` (the end of the node whose run did it, since the pass's start),
                  ``frames`` (one frame naming what made the block: ``saved by MulBackward0 mul_3 (other)``,
                  ``output 0 of ...``, ``leaf w0``, ``root gradient 0``) and ``category`` (the summary's holder
                  kind). The blocks alive when the pass starts (leaves, saved tensors, root gradients) are
                  allocated first, at time 0, so the timeline starts at the pass's starting level. Each trace
                  ends with a ``snapshot`` entry of category ``unknown`` (see ``_Layout.entries``).
  segments        per device one segment over every address the device's blocks used (what a caching allocator
                  that never releases would hold reserved), the blocks alive at the end in it
                  (``active_allocated``) and the gaps between them (``inactive``), so that every block of the
                  trace lies in a segment (MemoryViz's allocator view looks each one up).

Devices are numbered as PyTorch numbers them: ``cuda:N`` is N, the CPU comes after the accelerators (as
``_profile_to_snapshot`` places it). Addresses are made up: each device's blocks are laid out by a simple
allocator (a freed block's range is reused by the next block of the same size, else the next free address,
aligned to 512 bytes as the caching allocator's blocks are), so a block's address is unique while it lives.
The bytes are the memory model's (``analysis.memory``): its allocated bytes, not a caching allocator's reserved
segments (``segsum``'s "reserved" is the span of the addresses the layout used).

A pure function of the ``Memory`` (``snapshot``); ``write`` pickles the same dict atomically, a batch of entries
at a time (a hundred thousand nodes make some 300,000 entries: held at once as Python dicts they would take
several times the file's size).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from typing import Iterator

import numpy as np

from autograd_run.analysis.memory import LEAF
from autograd_run.errors import RequestError
from autograd_run.outputs import atomic_writer, check_output_path

#: Addresses are aligned to this (the CUDA caching allocator's block size).
ALIGN = 512
#: Where the made-up addresses of a device's blocks start (a round number, far from zero).
BASE = 1 << 40


def check_path(path: str, inputs: list, others: tuple = (), option: str = "memory_snapshot") -> None:
    """Refuse (``RequestError``), before any work, a snapshot path that is no ``.pickle`` (or ``.pkl``), one of
    ``inputs`` or one of the command's ``others`` outputs."""
    if not path.lower().endswith((".pickle", ".pkl")):
        raise RequestError(f"{path}: a memory snapshot is a pickle (what MemoryViz opens): name it FILE.pickle",
                           option)
    check_output_path(path, option, [p for p in inputs if p])
    for other in others:
        if other and os.path.abspath(other) == os.path.abspath(path):
            raise RequestError(f"{path}: another output is written there already", option)


def _device_numbers(labels: list[str]) -> list[int]:
    """PyTorch's device number for each of the memory's devices: ``cuda:N`` (any accelerator ``type:N``) N, the CPU
    after the highest accelerator."""
    index = [int(m.group(1)) if (m := re.fullmatch(r"[a-z]+:(\d+)", lab)) and not lab.startswith("cpu") else None
             for lab in labels]
    cpu = max([i for i in index if i is not None], default=-1) + 1
    return [i if i is not None else cpu for i in index]


class _Layout:
    """Each block's made-up address and whether it is alive at the end (one pass over the events, in order);
    each device's number, the next address never used, and per block its frames and category."""

    def __init__(self, mem, source: str):
        if len(mem.block_size) == 0 and any(d.peak for d in mem.devices):
            raise ValueError("a memory snapshot needs the memory's events: memory_of(..., events=True)")
        self.mem, self.source = mem, source
        self.numbers = _device_numbers([d.device for d in mem.devices])
        self.n_dev = max(self.numbers, default=-1) + 1
        self.addr = np.zeros(len(mem.block_size), np.int64)
        self.alive = np.zeros(len(mem.block_size), bool)
        self.top = [BASE] * self.n_dev  # per device: the next address never used
        free_at: list[dict] = [{} for _ in range(self.n_dev)]  # per device: rounded size -> addresses to reuse
        sizes, devs = mem.block_size, mem.block_dev
        for e in mem.events.tolist():
            b = e if e >= 0 else ~e
            size = int(sizes[b])
            if size == 0:
                continue
            d = self.numbers[int(devs[b])]
            span = -(-size // ALIGN) * ALIGN
            if e >= 0:
                pool = free_at[d].get(span)
                if pool:
                    self.addr[b] = pool.pop()
                else:
                    self.addr[b] = self.top[d]
                    self.top[d] += span
                self.alive[b] = True
            else:
                self.alive[b] = False
                free_at[d].setdefault(span, []).append(int(self.addr[b]))
        self._made: dict[int, tuple] = {}

    def frame(self, b: int) -> tuple[list, str]:
        """Block ``b``'s frames (one, naming what made it) and category."""
        got = self._made.get(b)
        if got is None:
            kind, text = self.mem.holder(b)
            if kind == LEAF:
                text = f"leaf {text}"
            got = self._made[b] = ([{"filename": self.source, "line": 0, "name": text}], kind)
        return got

    def entries(self, d: int) -> Iterator[dict]:
        """Device ``d``'s trace entries in order (see the module docstring)."""
        mem = self.mem
        mine = [k for k, n in enumerate(self.numbers) if n == d]
        events = mem.events
        blocks = np.where(events >= 0, events, ~events)
        keep = np.isin(mem.block_dev[blocks], mine) & (mem.block_size[blocks] > 0) if len(events) else \
            np.zeros(0, bool)
        last = None
        for e, ts in zip(events[keep].tolist(), mem.event_ts[keep].tolist()):
            b = e if e >= 0 else ~e
            frames, kind = self.frame(b)
            entry = {"addr": int(self.addr[b]), "size": int(mem.block_size[b]), "stream": 0, "time_us": ts // 1000,
                     "frames": frames, "category": kind}
            if e >= 0:
                yield dict(entry, action="alloc")
            else:
                yield dict(entry, action="free_requested")
                yield dict(entry, action="free_completed")
            last = ts
        if last is not None:
            # MemoryViz.js's annotate_snapshot adds the category 'unknown' when the trace's categories lack it,
            # through a misspelt field (`snapshot.categores.push`), which stops the page: a "snapshot" entry (what
            # the allocator records where a snapshot is taken) of category 'unknown' ends each trace
            yield {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": last // 1000, "frames": [],
                   "category": "unknown"}

    def segments(self) -> list[dict]:
        """Per device one segment over every address used, the blocks alive at the end in it."""
        mem, out = self.mem, []
        for d in range(self.n_dev):
            if self.top[d] == BASE:
                continue
            live = sorted((int(self.addr[b]), int(mem.block_size[b]), b) for b in np.flatnonzero(self.alive)
                          if self.numbers[int(mem.block_dev[b])] == d)
            blocks, at = [], BASE
            for a, size, b in [*live, (self.top[d], 0, None)]:
                if a > at:
                    blocks.append({"address": at, "size": a - at, "requested_size": 0, "state": "inactive",
                                   "frames": []})
                if b is not None:
                    blocks.append({"address": a, "size": size, "requested_size": size, "state": "active_allocated",
                                   "frames": self.frame(b)[0]})
                    at = a + size
            active = sum(size for _, size, _ in live)
            out.append({"device": d, "address": BASE, "total_size": self.top[d] - BASE, "allocated_size": active,
                        "active_size": active, "requested_size": active, "stream": 0, "segment_type": "large",
                        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
        return out


def snapshot(mem, source: str = "") -> dict:
    """``mem`` (an ``analysis.memory.Memory``) as ``torch.cuda.memory._snapshot()``'s dict (see the module
    docstring), made with its events (``memory_of(..., events=True)``). ``source``: the graph file, named in every
    frame."""
    lay = _Layout(mem, source)
    return {"device_traces": [list(lay.entries(d)) for d in range(lay.n_dev)], "segments": lay.segments()}


#: Entries pickled at a time by ``write``.
BATCH = 1000


def _fragment(obj) -> bytes:
    """``obj`` pickled (protocol 3) without its header and STOP: opcodes that push it, valid anywhere in a stream.
    Its memo (``BINPUT``/``BINGET``, explicit indices from 0) refers to its own objects only, each put before it is
    got, so a fragment that reuses an index another one used reads its own object."""
    buf = io.BytesIO()
    pickle.Pickler(buf, protocol=3).dump(obj)
    return buf.getvalue()[2:-1]


def _items(batch: list) -> bytes:
    """Opcodes that append ``batch``'s items to the list on the stack: the batch pickled as a list, less the
    opcodes that make the list and memoize it."""
    frag = _fragment(batch)
    if not frag.startswith(b"]q\x00"):
        raise AssertionError("pickle's list layout changed")
    return frag[3:]


def write(path: str, mem, source: str = "", option: str = "memory_snapshot") -> None:
    """``snapshot(mem, source)`` pickled to ``path`` atomically, its entries a batch at a time: a dict
    ``{"device_traces": [[entry, ...], ...], "segments": [...]}`` that ``pickle.load`` (and MemoryViz's own
    unpickler: protocol 3) reads back as ``snapshot`` returns it."""
    lay = _Layout(mem, source)
    with atomic_writer(path, option) as f:
        f.write(b"\x80\x03}(" + _fragment("device_traces") + b"](")  # {"device_traces": [ ...
        for d in range(lay.n_dev):
            f.write(b"]")  # this device's list: its entries appended a batch at a time
            batch: list[dict] = []
            for entry in lay.entries(d):
                batch.append(entry)
                if len(batch) == BATCH:
                    f.write(_items(batch))
                    batch.clear()
            if batch:
                f.write(_items(batch))
        f.write(b"e" + _fragment("segments") + _fragment(lay.segments()) + b"u.")  # ... ], "segments": [...]}
