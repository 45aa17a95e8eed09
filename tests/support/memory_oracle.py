"""PyTorch's own allocations during a backward pass on the CPU, as the truth the memory model is held to.

``measure(build)`` runs ``loss = build()`` (a function that makes the model's input, runs the forward and
returns the loss, keeping no other reference to the activations) and ``loss.backward()`` under
``torch.profiler`` with ``profile_memory=True``, which reports every CPU allocation and free with the
allocator's running total ("Total Allocated"). The forward is profiled too, so that the saved activations'
frees during the backward are seen. Returns the live bytes at the backward's start, its peak and its end,
all counted from the profile's start (parameters made before it are not in them: compare differences).
"""

from __future__ import annotations

import json
import os
import tempfile


def measure(build) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = build()
        with record_function(SPAN):
            loss.backward()
        del loss
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return read(path)


#: The profiler range around the backward call that ``read`` looks for.
SPAN = "autograd_run.memory_oracle.backward"


def read(path: str) -> dict:
    """start, peak and end live bytes of the backward in a trace made as ``measure`` makes it."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    span = next(e for e in events if e.get("name") == "autograd_run.memory_oracle.backward" and e.get("ph") == "X")
    b0, b1 = float(span["ts"]), float(span["ts"]) + float(span["dur"])
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: float(e["ts"]))
    start = 0
    peak = None
    end = None
    for e in mem:
        ts, total = float(e["ts"]), int(e["args"]["Total Allocated"])
        if ts < b0:
            start = total
        elif ts <= b1:
            peak = total if peak is None else max(peak, total)
            end = total
    peak = start if peak is None else max(peak, start)
    end = start if end is None else end
    return {"start": start, "peak": peak, "end": end}
