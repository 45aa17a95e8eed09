"""``autograd-run calibrate --torch``: PyTorch's own engine and ops on this CPU, for the ``local-torch`` spec.

A simulation with costs from a PyTorch profile needs what the profile does
not show: the engine's work per node outside each node's evaluate_function
span (popping the ready queue, the thread-local guards, counting
dependencies before the call), a fixed cost per backward call, and how much
the profiler itself adds inside each span (every event it records inside
costs time). Measured here:

* ``k``, the profiler's time per recorded event (with and without
  ``record_shapes``): a loop of small ops timed with and without it;
* on chains of 1-element tensors (``tanh``: 2 recorded events per node,
  ``pow``: 12) at two lengths each: the backward without the profiler (the
  calling thread's CPU time, median of repeated calls, garbage collector
  paused), and under it the span and recorded events of each node (median
  per node over calls). Per chain

      backward = call + sum(span - k * events) + nodes * overhead

  fitted by least squares gives ``call`` and ``overhead``.

The host part is measured with torch ops (what analytic costs of a
PyTorch graph should assume): matmul FLOP/s, copy bandwidth, the smallest
node (the median span of a 1-element ``TanhBackward0``, profiler time taken
out). A CPU-only PyTorch has no device threads, so the hand-off latency is
not measured: it is taken from the ``local`` spec when there is one.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import tempfile
import time

from autograd_run.sim.specs import DeviceSpec, EngineSpec, MachineSpec, local_spec_path


def _torch():
    try:
        import torch
    except ImportError:
        from autograd_run.errors import UsageError
        raise UsageError("calibrate --torch needs PyTorch: pip install 'autograd-run[torch]'") from None
    return torch


def _chain(torch, kind: str, n: int):
    a = torch.ones(1, requires_grad=True)
    y = a
    for _ in range(n):
        y = y.tanh() if kind == "tanh" else y ** 1.0
    return y.sum()


def backward_time(loss, clock=time.thread_time_ns) -> int:
    """ns one ``loss.backward()`` takes, garbage collector paused.

    The clock is the calling thread's CPU time by default: the engine runs a
    CPU graph on the calling thread (with one intra-op thread, all of the
    work), so this is the wall time of a quiet machine, and a shared
    machine's preemptions do not count.
    """
    gc.disable()
    try:
        t = clock()
        loss.backward()
        return clock() - t
    finally:
        gc.enable()


def _walls(torch, kind: str, n: int, reps: int) -> list[float]:
    return [backward_time(_chain(torch, kind, n)) for _ in range(reps)]


def _profiled(torch, kind: str, n: int, reps: int, shapes: bool) -> tuple[float, float, int]:
    """A profiled chain's backward: (sum of the node spans, of the recorded events, nodes).

    Each call runs a fresh chain of the same shape; each node's span is the
    median over the calls of the span of the node at its place (a median per
    node leaves out the calls a busy machine preempted while it ran).
    """
    from torch.profiler import ProfilerActivity, profile
    from autograd_run.traces.torch_profile import read_torch_profile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        losses = [_chain(torch, kind, n) for _ in range(reps)]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
            for loss in losses:
                loss.backward()
        prof.export_chrome_trace(path)
        trace = read_torch_profile(path, "torch")
    per = len(trace.events) // reps
    calls = [trace.events[k * per:(k + 1) * per] for k in range(reps)]
    spans = sum(statistics.median(c[i].dur_ns for c in calls) for i in range(per))
    events = sum(statistics.median(c[i].nested for c in calls) for i in range(per))
    return spans, events, per


def _lstsq(rows: list[tuple[list[float], float]]) -> list[float]:
    import numpy as np
    a = np.array([r[0] for r in rows], dtype=float)
    b = np.array([r[1] for r in rows], dtype=float)
    return list(np.linalg.lstsq(a, b, rcond=None)[0])


def profiler_event_ns(torch, calls: int = 2000, reps: int = 7, shapes: bool = False) -> float:
    """The profiler's own time per recorded op: a loop of small ops with and without it (thread CPU time)."""
    from torch.profiler import ProfilerActivity, profile
    a = torch.ones(1)

    def loop():
        t = time.thread_time_ns()
        for _ in range(calls):
            torch.neg(a)
        return time.thread_time_ns() - t
    plain, profiled = [], []
    loop()
    for _ in range(reps):
        plain.append(loop())
        with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes):
            profiled.append(loop())
    return max(0.0, (statistics.median(profiled) - statistics.median(plain)) / calls)


def measure_engine(torch, lengths=(300, 1200), reps: int = 15, prof_reps: int = 7, log=None) -> dict:
    """PyTorch's per-call and per-node engine overhead, and the profiler's cost per recorded event."""
    k = profiler_event_ns(torch)
    k_shapes = profiler_event_ns(torch, shapes=True)
    rows = []
    detail = []
    for kind in ("tanh", "pow"):
        for n in lengths:
            _walls(torch, kind, n, 2)  # warm
            wall = statistics.median(_walls(torch, kind, n, reps))
            spans, events, nodes = _profiled(torch, kind, n, prof_reps, False)
            # wall = call + sum(span - k * events) + nodes * overhead
            rows.append(([1.0, float(nodes)], wall - (spans - k * events)))
            detail.append({"chain": kind, "nodes": nodes, "wall_us": wall / 1e3, "spans_us": spans / 1e3,
                           "events": events})
            if log:
                log(f"  {kind} chain of {n}: backward {wall / 1e3:.0f} us, profiled spans {spans / 1e3:.0f} us")
    call, overhead = _lstsq(rows)
    return {"call_ns": max(0.0, call), "overhead_ns": max(0.0, overhead), "event_ns": k, "event_shapes_ns": k_shapes,
            "detail": detail}


def _timeit(fn, reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_host(torch, event_ns: float) -> DeviceSpec:
    """This CPU as torch ops see it."""
    n = 512
    flops = {}
    for name, dt in (("float32", torch.float32), ("float64", torch.float64)):
        a = torch.ones(n, n, dtype=dt)
        flops[name] = 2 * n ** 3 / _timeit(lambda: a @ a)
    src = torch.ones(16 << 20)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 4 / _timeit(lambda: dst.copy_(src))
    spans, events, nodes = _profiled(torch, "tanh", 200, 5, False)
    smallest = max(0.1, (spans - event_ns * events) / nodes / 1e3)
    return DeviceSpec("this machine's CPU (torch ops)", flops, bw, 0.9, 0.9, round(smallest, 3))


def calibrate_torch(log=None) -> MachineSpec:
    torch = _torch()
    eng = measure_engine(torch, log=log)
    host = measure_host(torch, eng["event_ns"])
    acc = DeviceSpec("virtual device (this machine's CPU)", dict(host.peak_flops), host.mem_bw, 0.9, 0.9,
                     host.min_kernel_us)
    handoff = 20.0
    if os.path.isfile(local_spec_path()):
        from autograd_run.sim.specs import load_spec
        handoff = load_spec("local").engine.handoff_us
    engine = EngineSpec(node_overhead_us=round(eng["overhead_ns"] / 1e3, 3), handoff_us=handoff,
                        overhead_holds_gil=False, profiler_event_us=round(eng["event_ns"] / 1e3, 3),
                        profiler_event_shapes_us=round(eng["event_shapes_ns"] / 1e3, 3),
                        call_overhead_us=round(eng["call_ns"] / 1e3, 3))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return MachineSpec("local-torch", host, acc, engine,
                       f"measured by autograd-run calibrate --torch (torch {torch.__version__}, "
                       f"{torch.get_num_threads()} intra-op threads) on {platform.node()} ({os.cpu_count()} CPUs) "
                       f"at {when}")
