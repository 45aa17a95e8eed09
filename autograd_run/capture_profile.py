"""``capture --profile``: measure a captured graph's node costs with PyTorch's profiler, in the capturing process.

``profile_capture(path, doc, outputs, ...)`` runs the captured backward
``warmup`` times, then ``steps`` times under ``torch.profiler`` (CPU
activity, and CUDA when the graph is on a GPU; one ``ProfilerStep#N`` per
backward), each with the leaves' ``.grad`` set to None first (as
``zero_grad()`` does) and the graph retained; then ``steps`` times without
the profiler, timing each call (the reference a simulation is checked
against). The profile is exported as PyTorch's Chrome trace and read back
through the same reader and matcher ``--costs`` uses
(``traces.torch_profile``, ``sim.profile_match``); the graph and the
profile come from the same process, so sequence numbers agree exactly and
each node's own forward thread is read from it.

The graph file is then rewritten (atomically; its ``.npz`` is unchanged)
with ``meta.measured``: per node the median evaluate_function span, the
profiler events inside it and the kernel time per stream, with the device,
PyTorch version, date, step counts, the unprofiled backward times and the
matching's coverage. Leaves' ``.grad`` are restored afterwards.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import tempfile
import time


def _device(torch, on_gpu: bool) -> str:
    if on_gpu:
        return f"cuda ({torch.cuda.get_device_name(0)})"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu ({name}, {os.cpu_count()} CPUs, {torch.get_num_threads()} intra-op threads)"


def profile_capture(path: str, doc: dict, outputs, *, grad_outputs=None, inputs=None, steps: int = 10,
                    warmup: int = 3, keep_trace: str | None = None) -> dict:
    """Profile the backward of ``outputs`` (captured into ``doc`` at ``path``); returns ``meta.measured``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from autograd_run.capture import ACC, walk_grad_fns
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import load_graph
    from autograd_run.outputs import atomic_write
    from autograd_run.sim.measured import from_profile, to_meta
    from autograd_run.traces.torch_profile import read_torch_profile

    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    gos = [torch.ones_like(o) if g is None else g
           for o, g in zip(outputs, list(grad_outputs) if grad_outputs is not None else [None] * len(outputs))]
    mode = doc.get("mode", "backward")
    leaves = [fn.variable for fn in walk_grad_fns([o.grad_fn for o in outputs]) if fn.name() == ACC]
    before = [v.grad for v in leaves]

    def once():
        if mode == "grad":
            torch.autograd.grad(outputs, list(inputs), gos, retain_graph=True, allow_unused=True)
        else:
            for v in leaves:
                v.grad = None
            torch.autograd.backward(outputs, gos, retain_graph=True, inputs=list(inputs) if inputs else None)

    on_gpu = any(o.is_cuda for o in outputs)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace_path = keep_trace or os.path.join(tmp, "profile.json")
            with profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                         on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
                for _ in range(warmup + steps):
                    once()
                    sync()
                    prof.step()
            trace = read_torch_profile(trace_path, "profile")
        walls, cpus = [], []
        for _ in range(steps):
            gc.disable()
            try:
                t, c = time.perf_counter_ns(), time.thread_time_ns()
                once()
                sync()
                cpus.append(time.thread_time_ns() - c)
                walls.append(time.perf_counter_ns() - t)
            finally:
                gc.enable()
    finally:
        for v, g in zip(leaves, before):
            v.grad = g
    graph = load_graph(path)
    costs = from_profile(trace, graph)
    # The profile names each node's own forward thread (the capture probed only its own thread's id).
    last = costs.coverage.steps[-1] if costs.coverage.steps else None
    if last is not None:
        by_id = {d["id"]: d for d in doc["nodes"]}
        for nid, e in last.nodes.items():
            if e.fwd_tid is not None and "seq" in by_id[nid]:
                by_id[nid]["fwd_thread"] = e.fwd_tid
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured = to_meta(costs, torch=str(torch.__version__), device=_device(torch, on_gpu), date=when,
                       warmup=warmup, backward_wall_ns={"median": statistics.median(walls), "runs": len(walls),
                                                        "thread_cpu_median": statistics.median(cpus)})
    doc.setdefault("meta", {})["measured"] = measured
    fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    atomic_write(path, dumps(doc, fmt), "output")
    return measured
