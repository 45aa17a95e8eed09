"""A memory snapshot that PyTorch's own viewer opens: the pass's allocations in ``torch.cuda.memory._snapshot()``'s
structure, pickled (``run`` and ``simulate --memory-snapshot FILE.pickle``).

MemoryViz (https://pytorch.org/memory_viz: drag the file onto the page) and ``torch.cuda._memory_viz`` (``python -m
torch.cuda._memory_viz trace_plot FILE.pickle -o out.html``, ``segsum``, ``trace``) read what PyTorch writes in
``_snapshot()``; the fields here are the ones they read, the same that PyTorch's own
``_memory_viz._profile_to_snapshot`` makes from a CPU profile:

  device_traces   per device a list of entries in the order they happened: ``alloc`` (a block made), then
                  ``free_requested`` and ``free_completed`` (its last holder let go), each with ``addr``, ``size``,
                  ``stream`` (0), ``time_us`` (the end of the node whose run did it, since the pass's start),
                  ``frames`` (one frame naming what held the block: ``saved by MulBackward0 mul_3 (other)``,
                  ``gradient for ...``, ``output 0 of ...``) and ``category`` (the summary's holder kind). The
                  blocks alive when the pass starts (leaves, saved tensors, root gradients) are allocated first,
                  at time 0, so the timeline starts at the pass's starting level.
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

A pure function of the ``Memory`` (``snapshot``); ``write`` pickles it atomically.
"""

from __future__ import annotations

import pickle
import re

import numpy as np

from autograd_run.analysis.memory import LEAF
from autograd_run.outputs import atomic_write

#: Addresses are aligned to this (the CUDA caching allocator's block size).
ALIGN = 512
#: Where the made-up addresses of a device's blocks start (a round number, far from zero).
BASE = 1 << 40


def _device_numbers(labels: list[str]) -> list[int]:
    """PyTorch's device number for each of the memory's devices: ``cuda:N`` (any accelerator ``type:N``) N, the CPU
    after the highest accelerator."""
    index = [int(m.group(1)) if (m := re.fullmatch(r"[a-z]+:(\d+)", lab)) and not lab.startswith("cpu") else None
             for lab in labels]
    cpu = max([i for i in index if i is not None], default=-1) + 1
    return [i if i is not None else cpu for i in index]


def snapshot(mem, source: str = "") -> dict:
    """``mem`` (an ``analysis.memory.Memory``) as ``torch.cuda.memory._snapshot()``'s dict (see the module
    docstring), made with its events (``memory_of(..., events=True)``). ``source``: the graph file, named in every
    frame."""
    if len(mem.block_size) == 0 and any(d.peak for d in mem.devices):
        raise ValueError("a memory snapshot needs the memory's events: memory_of(..., events=True)")
    numbers = _device_numbers([d.device for d in mem.devices])
    n_dev = max(numbers, default=-1) + 1
    traces: list[list[dict]] = [[] for _ in range(n_dev)]
    addr = np.zeros(len(mem.block_size), np.int64)
    top = [BASE] * n_dev              # per device: the next address never used
    free_at: list[dict] = [{} for _ in range(n_dev)]  # per device: rounded size -> addresses free for reuse
    frames: dict[int, list] = {}

    def frame(b: int) -> tuple[list, str]:
        kind, text = mem.holder(b)
        if kind == LEAF:
            text = f"leaf {text}"
        return [{"filename": source, "line": 0, "name": text}], kind

    alive = np.zeros(len(mem.block_size), bool)
    for e, ts in zip(mem.events.tolist(), mem.event_ts.tolist()):
        b = e if e >= 0 else ~e
        size = int(mem.block_size[b])
        if size == 0:
            continue
        d = numbers[int(mem.block_dev[b])]
        span = -(-size // ALIGN) * ALIGN
        fr, kind = frame(b)
        entry = {"addr": 0, "size": size, "stream": 0, "time_us": ts // 1000, "frames": fr, "category": kind}
        if e >= 0:
            pool = free_at[d].get(span)
            if pool:
                addr[b] = pool.pop()
            else:
                addr[b] = top[d]
                top[d] += span
            alive[b] = True
            traces[d].append(dict(entry, action="alloc", addr=int(addr[b])))
        else:
            alive[b] = False
            free_at[d].setdefault(span, []).append(int(addr[b]))
            for action in ("free_requested", "free_completed"):
                traces[d].append(dict(entry, action=action, addr=int(addr[b])))
    segments = []
    for d in range(n_dev):
        if top[d] == BASE:
            continue
        live = sorted((int(addr[b]), int(mem.block_size[b]), b) for b in np.flatnonzero(alive)
                      if numbers[int(mem.block_dev[b])] == d)
        blocks, at = [], BASE

        def gap(upto: int) -> None:
            if upto > at:
                blocks.append({"address": at, "size": upto - at, "requested_size": 0, "state": "inactive",
                               "frames": []})
        for a, size, b in live:
            gap(a)
            blocks.append({"address": a, "size": size, "requested_size": size, "state": "active_allocated",
                           "frames": frame(b)[0]})
            at = a + size
        gap(top[d])
        active = sum(size for _, size, _ in live)
        segments.append({"device": d, "address": BASE, "total_size": top[d] - BASE, "allocated_size": active,
                         "active_size": active, "requested_size": active, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
    for d, trace in enumerate(traces):
        # MemoryViz.js's annotate_snapshot adds the category 'unknown' when the trace's categories lack it, through
        # a misspelt field (`snapshot.categores.push`), which stops the page: a "snapshot" entry (what the
        # allocator records where a snapshot is taken) of category 'unknown' ends each trace
        if trace:
            trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": trace[-1]["time_us"],
                          "frames": [], "category": "unknown"})
    return {"segments": segments, "device_traces": traces}


def write(path: str, mem, source: str = "", option: str = "memory_snapshot") -> None:
    """Pickle ``snapshot(mem, source)`` to ``path`` atomically."""
    atomic_write(path, pickle.dumps(snapshot(mem, source), protocol=4), option)
