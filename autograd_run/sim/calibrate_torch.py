"""``autograd-run calibrate --torch``: PyTorch's own engine and ops on this CPU, for the ``local-torch`` spec.

A simulation with costs from a PyTorch profile needs what the profile does
not show: the engine's work per node outside each node's evaluate_function
span (popping the ready queue, the thread-local guards, counting
dependencies before the call), a fixed cost per backward call, and how much
the profiler itself adds inside each span (every event it records inside
costs time). Measured here, on long chains of 1-element tensors whose
nodes record 2 (``tanh``), 6 (``mul``) and 12 (``pow``) profiler events
each, timed without the profiler (the calling thread's CPU time, garbage
collector paused) and profiled in turns, so that both see the machine in
the same state: the median backward, and the span and recorded events of
each node (median per node over the rounds). Per node,
with the per-call cost negligible against a long chain's,

    backward / nodes = (spans - k * events) / nodes + overhead

fitted by least squares over the three chains gives ``k`` (the profiler's
time per recorded event inside a span) and ``overhead`` (the engine's time
per node outside its span). ``call`` is then what a one-op backward (two
nodes) takes beyond its nodes. With ``record_shapes`` the profiler's time
per event depends on the ops it describes (a 1-element chain's are cheap
to describe), so that figure is measured the same way on three small
networks of common layers (``_blocks``: a transformer encoder, a
convolution block, an MLP with layer norm and GELU), with the engine's
figures from the chains: the median over the networks of what their spans
hold per event beyond the backward's own time.

The host part is measured with torch ops (what analytic costs of a
PyTorch graph should assume): matmul FLOP/s, copy bandwidth, the smallest
node (the median span of a 1-element ``TanhBackward0``, profiler time taken
out). A process's first backward (what a profile of it holds beyond a later call:
``sim.first_call``) is measured in fresh processes on the same networks
(``capture.first_call_probe``, passed in by the command line).
A CPU-only PyTorch has no device threads, so the hand-off latency is
not measured: it is taken from the ``local`` spec when there is one.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import subprocess
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
        y = y.tanh() if kind == "tanh" else y * 1.0001 if kind == "mul" else y ** 1.0
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


def _paired(torch, kind: str, n: int, reps: int, shapes: bool = False) -> tuple[float, float, float, int]:
    """A chain's backward, timed and profiled in turns: (median backward, span sum, event sum, nodes)."""
    return _paired_loss(torch, lambda: _chain(torch, kind, n), reps, shapes)


def _paired_loss(torch, make, reps: int, shapes: bool = False, later: bool = False) -> tuple[float, float, float, int]:
    """The backward of ``make()``'s loss, timed and profiled in turns: (median backward, span sum, event sum,
    nodes).

    Each round times one fresh loss's backward without the profiler, then
    profiles another's in its own session: both see the machine as it is at
    that moment. The spans are per node the median over the rounds of the
    node at its place (a median per node leaves out the rounds a busy
    machine preempted it in). ``later``: the session profiles two calls, and
    the second is the one read (a session's later calls: the ops were
    described to the profiler already).
    """
    from torch.profiler import ProfilerActivity, profile
    from autograd_run.native_stderr import silenced
    from autograd_run.traces.torch_profile import read_torch_profile
    walls, profs, calls = [], [], []
    for _ in range(reps):
        backward_time(make())  # warm again after the profiler
        walls.append(backward_time(make()))
        losses = [make() for _ in range(2 if later else 1)]
        with silenced(), profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
            for loss in losses:
                loss.backward()
        profs.append(prof)  # exported afterwards: writing and reading traces between rounds disturbs the timing
        del losses
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        for prof in profs:
            prof.export_chrome_trace(path)
            events = sorted(read_torch_profile(path, "torch").events, key=lambda e: e.start_ns)
            calls.append(events[len(events) // 2:] if later else events)
    per = min(len(c) for c in calls)
    spans = sum(statistics.median(c[i].dur_ns for c in calls) for i in range(per))
    events = sum(statistics.median(c[i].nested for c in calls) for i in range(per))
    return statistics.median(walls), spans, events, per


def _lstsq(rows: list[tuple[list[float], float]]) -> list[float]:
    import numpy as np
    a = np.array([r[0] for r in rows], dtype=float)
    b = np.array([r[1] for r in rows], dtype=float)
    return [float(x) for x in np.linalg.lstsq(a, b, rcond=None)[0]]


KINDS = ("tanh", "mul", "pow")  # 2, 6 and 12 recorded events per node


#: The names of ``_blocks``' networks.
BLOCKS = ("transformer", "conv", "mlp")


def _blocks(torch) -> dict:
    """Small networks of the layers models are made of, each a function making a fresh loss: a transformer
    encoder (attention, layer norm, views and transposes), a convolution block (batch norm, pooling) and an MLP
    with layer norm and GELU. What ``record_shapes`` costs per event depends on the ops: describing a 1-element
    chain's inputs is cheaper than these layers' (here 0.33 us against 0.37-0.61 us an event, and 0.55 on a
    GPT-2 from transformers), so its figure is measured on these."""
    from torch import nn
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tf = nn.Sequential(*[nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True) for _ in range(2)])
        cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                            nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
        mlp = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU())])
    xs = {"transformer": torch.randn(2, 8, 32, generator=gen), "conv": torch.randn(2, 3, 8, 8, generator=gen),
          "mlp": torch.randn(4, 16, generator=gen)}
    nets = {"transformer": tf, "conv": cnn, "mlp": mlp}
    return {name: (lambda net=net, x=xs[name]: net(x).sum()) for name, net in nets.items()}


def measure_engine(torch, nodes: int = 400, reps: int = 21, small_reps: int = 41, log=None) -> dict:
    """PyTorch's per-node and per-call engine overhead, and the profiler's cost per recorded event."""
    rows = {False: [], True: []}
    detail = []
    for kind in KINDS:  # long chains: the per-call cost is negligible against the nodes'
        for shapes in (False, True):
            wall, spans, events, n = _paired(torch, kind, nodes, reps, shapes)
            # per node: backward / n = (spans - k * events) / n + overhead
            rows[shapes].append(([-events / n, 1.0], (wall - spans) / n))
            detail.append({"chain": kind, "nodes": n, "backward_us": wall / 1e3, "spans_us": spans / 1e3,
                           "events": events, "record_shapes": shapes})
            if log and not shapes:
                log(f"  {kind} chain of {n} nodes: backward {wall / 1e3:.0f} us, profiled spans {spans / 1e3:.0f} us")
    k, overhead = _lstsq(rows[False])
    k_chains, _ = _lstsq(rows[True])
    k, overhead = max(0.0, k), max(0.0, overhead)
    # A one-op backward: what is left beyond its nodes is the call's own cost.
    wall, spans, events, n = _paired(torch, "tanh", 1, small_reps)
    call = max(0.0, wall - (spans - k * events) - n * overhead)
    detail.append({"chain": "tanh", "nodes": n, "backward_us": wall / 1e3, "spans_us": spans / 1e3, "events": events,
                   "record_shapes": False})
    if log:
        log(f"  one-op backward ({n} nodes): {wall / 1e3:.1f} us, profiled spans {spans / 1e3:.1f} us")
    # record_shapes' time per event, on layers (``_blocks``): with the engine's figures above, what the spans
    # hold beyond the backward's own nodes, per event; the median of the blocks. A session's first call describes
    # each op to the profiler for the first time and costs more than its later calls (a GPT-2's spans with shapes:
    # 1.21 ms in its session's first call, 1.01-1.06 ms in the next ones): both are measured.
    k_blocks = {False: [], True: []}
    for name, make in _blocks(torch).items():
        for later in (False, True):
            wall, spans, events, n = _paired_loss(torch, make, reps, True, later)
            if events:
                k_blocks[later].append((spans - (wall - n * overhead - call)) / events)
            detail.append({"chain": name, "nodes": n, "backward_us": wall / 1e3, "spans_us": spans / 1e3,
                           "events": events, "record_shapes": True, "later_call": later})
            if log:
                which = "a session's second call" if later else "its first"
                log(f"  {name} block, {n} nodes: backward {wall / 1e3:.0f} us, profiled spans with shapes "
                    f"{spans / 1e3:.0f} us ({which}), {events:.0f} events")
    k_shapes, k_later = (max(0.0, statistics.median(k_blocks[x]) if k_blocks[x] else k_chains) for x in (False, True))
    return {"call_ns": call, "overhead_ns": overhead, "event_ns": k, "event_shapes_ns": k_shapes,
            "event_shapes_later_ns": k_later, "event_shapes_chains_ns": max(0.0, k_chains), "detail": detail}


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
    _, spans, events, nodes = _paired(torch, "tanh", 200, 5)
    smallest = max(0.1, (spans - event_ns * events) / nodes / 1e3)
    return DeviceSpec("this machine's CPU (torch ops)", flops, bw, 0.9, 0.9, round(smallest, 3))


def calibrate_torch(log=None, first_call=None) -> MachineSpec:
    """The ``local-torch`` spec, measured here; ``first_call``: a function giving the figures for a process's first
    backward (``capture.first_call_probe.measure``, which runs PyTorch in fresh processes), or None: not measured."""
    torch = _torch()
    eng = measure_engine(torch, log=log)
    host = measure_host(torch, eng["event_ns"])
    acc = DeviceSpec("virtual device (this machine's CPU)", dict(host.peak_flops), host.mem_bw, 0.9, 0.9,
                     host.min_kernel_us)
    handoff = 20.0
    if os.path.isfile(local_spec_path()):
        from autograd_run.sim.specs import load_spec
        handoff = load_spec("local").engine.handoff_us
    per_byte, setup = 0.0, {}
    if first_call is not None:
        if log:
            log("a process's first backward, in fresh processes:")
        try:
            per_byte, setup = first_call(log=log)
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            # the rest of the calibration stands: a first call's profile is then used as it is, and said so
            per_byte, setup = 0.0, {}
            if log:
                log(f"  not measured ({exc}): a profile of a process's first backward will not be corrected")
    engine = EngineSpec(node_overhead_us=round(eng["overhead_ns"] / 1e3, 3), handoff_us=handoff,
                        overhead_holds_gil=False, profiler_event_us=round(eng["event_ns"] / 1e3, 3),
                        profiler_event_shapes_us=round(eng["event_shapes_ns"] / 1e3, 3),
                        profiler_event_shapes_later_us=round(eng["event_shapes_later_ns"] / 1e3, 3),
                        call_overhead_us=round(eng["call_ns"] / 1e3, 3), first_call_ns_per_byte=per_byte,
                        first_call_setup_us=setup)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return MachineSpec("local-torch", host, acc, engine,
                       f"measured by autograd-run calibrate --torch (torch {torch.__version__}, "
                       f"{torch.get_num_threads()} intra-op threads) on {platform.node()} ({os.cpu_count()} CPUs) "
                       f"at {when}")
