"""``calibrate --torch``'s figures for a process's first backward (``sim.first_call`` holds the model).

Each of ``calibrate_torch._blocks``' networks runs in fresh processes
(``python -m autograd_run.capture.first_call_probe BLOCK``): its first
backward, then ``WARM`` unprofiled steps, then a later backward, both profiled
with ``record_shapes``; the block's graph is captured (structure only) and
matched node by node with the two calls' spans in the engine's order; then
the page probe fills ``PROBE_BYTES`` buffers when new and again. The parent
(``measure``) takes, per node, what its first span holds beyond its later one
and its new memory's touch, and keeps the medians:

  ``call``   the call's first node;
  ``op``     per op name, the first node of that op in the call;
  ``kind``   per op name, a later first node of its kind (``sim.signature``);

with ``*`` in ``op`` and ``kind`` the median over the ops measured. Every
process is new, so every first call is its process's first backward, as in
the profile a user makes right after building a model. No lock: one thread.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from autograd_run.sim.first_call import new_bytes, run_order
from autograd_run.sim.signature import signature

#: The fresh buffers the page probe touches (above glibc's largest dynamic mmap threshold, so each is mapped
#: afresh), and how many.
PROBE_BYTES = 64 << 20
PROBE_ROUNDS = 5
#: Unprofiled steps between the first profiled call and the later one.
WARM = 3
#: Fresh processes per block.
PROCESSES = 2


def _probe(torch) -> float:
    """ns to touch one fresh byte: ``PROBE_BYTES`` buffers filled when new and again (with the process's intra-op
    threads, as its ops fill their outputs), the median difference per byte."""
    import time
    n = PROBE_BYTES // 4
    per = []
    for _ in range(PROBE_ROUNDS):
        x = torch.empty(n)
        t = time.perf_counter_ns()
        x.fill_(1.0)
        first = time.perf_counter_ns() - t
        t = time.perf_counter_ns()
        x.fill_(2.0)
        again = time.perf_counter_ns() - t
        per.append(max(0.0, (first - again) / PROBE_BYTES))
        del x
    return statistics.median(per)


def _child(block: str) -> dict:
    """In a fresh process: ``block``'s first backward and a later one, profiled with shapes; per node (in the
    order run) its span in each and the profiler events in them, its op name, kind and new bytes; then the probe."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from autograd_run.capture.graph import from_torch
    from autograd_run.graphs.load import loads_graph
    from autograd_run.native_stderr import silenced
    from autograd_run.sim.calibrate_torch import _blocks
    from autograd_run.traces.torch_profile import read_torch_profile
    make = _blocks(torch)[block]
    calls = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        for warm in (0, WARM):
            for _ in range(warm):
                make().backward()
            loss = make()
            with silenced(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                loss.backward()
            prof.export_chrome_trace(path)
            calls.append(sorted(read_torch_profile(path, "torch").events, key=lambda e: e.start_ns))
        doc = from_torch(make(), reference=False, values=False)
    graph = loads_graph(json.dumps(doc), f"<{block} block>")
    order = [n for n in run_order(graph) if n.name != "GraphRoot"]
    if len(order) != len(calls[0]) or len(order) != len(calls[1]):
        raise RuntimeError(f"the {block} block ran {len(calls[0])} and {len(calls[1])} nodes; its graph has "
                           f"{len(order)}")
    nodes = []
    for node, a, b in zip(order, calls[0], calls[1]):
        if not a.name.endswith(node.name.split("::")[-1]) or a.name != b.name:
            raise RuntimeError(f"the {block} block's profiled nodes ({a.name}, {b.name}) are not its graph's "
                               f"({node.name}) in the order run")
        sig = signature(node)
        nodes.append({"name": node.name, "kind": None if sig is None else repr(sig),
                      "first_ns": a.dur_ns, "later_ns": b.dur_ns, "first_events": a.nested,
                      "later_events": b.nested, "new_bytes": new_bytes(node)})
    return {"block": block, "nodes": nodes, "ns_per_byte": _probe(torch)}


def measure(processes: int = PROCESSES, log=None) -> tuple[float, dict]:
    """(``first_call_ns_per_byte``, ``first_call_setup_us``): each block in ``processes`` fresh processes."""
    from autograd_run.sim.calibrate_torch import BLOCKS
    per_byte, call, ops, kinds = [], [], {}, {}
    for _ in range(processes):
        for block in BLOCKS:
            p = subprocess.run([sys.executable, "-m", "autograd_run.capture.first_call_probe", block],
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"the first-call probe of the {block} block: {p.stderr.strip()[-400:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            c = got["ns_per_byte"]
            per_byte.append(c)
            seen_ops: set = set()
            seen: set = set()
            for k, n in enumerate(got["nodes"]):
                # beyond its later span and its new memory (the profiler's events alike in both calls)
                extra = (n["first_ns"] - n["later_ns"] - c * n["new_bytes"]) / 1e3
                if k == 0:
                    call.append(extra)
                elif n["name"] not in seen_ops:
                    ops.setdefault(n["name"], []).append(extra)
                elif n["kind"] is not None and n["kind"] not in seen:
                    kinds.setdefault(n["name"], []).append(extra)
                seen_ops.add(n["name"])
                seen.add(n["kind"])
            if log:
                first = sum(n["first_ns"] for n in got["nodes"]) / 1e3
                later = sum(n["later_ns"] for n in got["nodes"]) / 1e3
                log(f"  {block} block in a fresh process: its first backward's spans {first:.0f} us, a later "
                    f"one's {later:.0f} us; a fresh byte {c:.3f} ns")

    def table(by: dict) -> dict:
        t = {name: round(max(0.0, statistics.median(v)), 2) for name, v in sorted(by.items())}
        t["*"] = round(statistics.median(t.values()), 2) if t else 0.0
        return t
    setup = {"call": round(max(0.0, statistics.median(call)), 2), "op": table(ops), "kind": table(kinds)}
    return round(statistics.median(per_byte), 4), setup


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
