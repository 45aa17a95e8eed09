"""``capture --profile``: measure a captured graph's node costs with PyTorch's profiler, in the capturing process.

``profile_capture(path, doc, forward, steps=, warmup=)`` runs real steps
of the captured program: ``forward()`` is its forward pass again (fresh
tensors, fresh graph: PyTorch's sequence numbers move on, as in a training
loop), then the backward, with the leaves' ``.grad`` set to None first (as
``zero_grad()`` does). ``warmup`` steps first (the last one under a
throw-away profiler session, which starts the profiler's machinery), then
``steps`` rounds of: one step whose backward is timed without the profiler
(the reference a simulation is checked against: wall time and the calling
thread's CPU time), one step under its own ``torch.profiler`` session (CPU
activity, and CUDA when the graph is on a GPU). Alternating them lets both
see the same machine. On a GPU the ``steps`` timed steps come first, back to
back, then the ``steps`` profiled ones, each session starting with a tiny
fill on the device and exported as soon as it ends (``_gpu_step`` says why).

After the last step, each session's trace is exported as PyTorch's Chrome
trace (on the CPU not between steps: writing and reading a trace disturbs the
next step's timing) and read back
through the same reader and matcher ``--costs`` uses
(``traces.torch_profile``, ``costs.profile_match``): the steps' sequence
offsets are found there, and each node's own forward thread is read from
its runs.

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
import shutil
import statistics
import tempfile
import time
from typing import Callable

from autograd_run.native_stderr import silenced


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


class _Step:
    """One step of the program: a fresh forward, then the backward as the capture's mode says."""

    def __init__(self, torch, forward: Callable, mode: str):
        self.torch, self.forward, self.mode = torch, forward, mode
        self.restore: dict = {}  # leaf -> its .grad before the first step

    def prepare(self):
        torch = self.torch
        outputs, grad_outputs, inputs = self.forward()
        outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        gos = [torch.ones_like(o) if g is None else g
               for o, g in zip(outputs, list(grad_outputs) if grad_outputs is not None else [None] * len(outputs))]
        if self.mode == "grad":
            return lambda: torch.autograd.grad(outputs, list(inputs), gos, allow_unused=True), outputs
        from autograd_run.capture.graph import ACC, walk_grad_fns
        for fn in walk_grad_fns([o.grad_fn for o in outputs if o.grad_fn is not None]):
            if fn.name() == ACC:
                v = fn.variable
                self.restore.setdefault(v, v.grad)
                v.grad = None
        return lambda: torch.autograd.backward(outputs, gos, inputs=list(inputs) if inputs else None), outputs


def _gpu_step(torch, backward, sync, activities, device, i: int, steps: int, timed, export) -> None:
    """Step ``i`` of the measured ones on a GPU: the first ``steps`` timed back to back, then ``steps`` profiled.

    Unlike on the CPU, the two kinds are not alternated: a profiler session leaves the next step's launches
    slower for a while (a small model's backward took twice as long just after one, on an H200), which
    would bias the reference. Each session starts with a one-element fill on the device before the
    backward: a session's first GPU activity pays the profiler's own set-up (its activity buffers, the
    first launch callback: 0.3-2 ms seen), which would otherwise land in the first node. And each trace is
    exported at once: after a later session has started, an earlier session's GPU activities come out
    with no times (ts and dur 0).
    """
    from torch.profiler import profile
    if i < steps:
        timed(backward, sync)
        return
    sync()
    with silenced(), profile(activities=activities) as prof:
        torch.empty(1, device=device).fill_(0)
        sync()
        backward()
        sync()
    export(prof, i - steps)


def minor_faults() -> int:
    """This process's minor page faults so far (memory touched for the first time since the system gave it: a
    CPU backward's share of them depends on the allocator's state, docs/costs.md); 0 where not counted."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


def profile_capture(path: str, doc: dict, forward: Callable, *, steps: int = 10, warmup: int = 3,
                    keep_trace: str | None = None) -> dict:
    """Profile ``steps`` backward calls of the program captured into ``doc`` at ``path``; returns ``meta.measured``.

    ``forward()`` runs the program's forward pass again and returns
    ``(outputs, grad_outputs or None, inputs or None)``.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import load_graph
    from autograd_run.outputs import atomic_write
    from autograd_run.costs.measured import from_profile, to_meta
    from autograd_run.sim.order import predicted_order
    from autograd_run.traces.torch_profile import merge_traces, read_torch_profile

    step = _Step(torch, forward, doc.get("mode", "backward"))
    walls, cpus, profs, traces, on_gpu = [], [], [], [], False
    faults, profiled_faults = [], []  # minor page faults of each timed and each profiled backward (docs/costs.md)

    def timed(backward, sync):
        sync()
        gc.disable()
        try:
            f, t, c = minor_faults(), time.perf_counter_ns(), time.thread_time_ns()
            backward()
            sync()
            cpus.append(time.thread_time_ns() - c)
            walls.append(time.perf_counter_ns() - t)
            faults.append(minor_faults() - f)
        finally:
            gc.enable()

    with tempfile.TemporaryDirectory() as tmp:
        def export(prof, k):
            trace_path = os.path.join(tmp, f"step{k}.json")
            prof.export_chrome_trace(trace_path)
            traces.append(read_torch_profile(trace_path, "profile"))
            if keep_trace and k == steps - 1:
                shutil.copyfile(trace_path, keep_trace)

        try:
            k, total = 0, warmup + steps
            while k < total:
                backward, outputs = step.prepare()
                if k == 0:
                    device = next((o.device for o in outputs if o.is_cuda), None)
                    on_gpu = device is not None
                    total = warmup + 2 * steps if on_gpu else total  # on a GPU: timed and profiled apart
                sync = torch.cuda.synchronize if on_gpu else (lambda: None)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
                if k < warmup - 1:
                    backward()
                elif k == warmup - 1:
                    with silenced(), profile(activities=activities):
                        backward()
                        sync()
                elif not on_gpu:
                    timed(backward, sync)
                    backward, _ = step.prepare()
                    with silenced(), profile(activities=activities) as prof:
                        f = minor_faults()
                        backward()
                        sync()
                        profiled_faults.append(minor_faults() - f)
                    profs.append(prof)  # exported after the loop: writing traces between steps disturbs the timing
                else:
                    _gpu_step(torch, backward, sync, activities, device, k - warmup, steps, timed, export)
                del backward, outputs
                k += 1
        finally:
            for v, g in step.restore.items():
                v.grad = g
        for k, prof in enumerate(profs):
            export(prof, k)
    graph = load_graph(path)
    costs = from_profile(merge_traces(traces), graph, order=lambda: predicted_order(graph))
    # The profile names each node's own forward thread (the capture probed only its own thread's id).
    first = costs.coverage.steps[0] if costs.coverage.steps else None
    if first is not None:
        by_id = {d["id"]: d for d in doc["nodes"]}
        for nid, e in first.nodes.items():
            if e.fwd_tid is not None and "seq" in by_id[nid]:
                by_id[nid]["fwd_thread"] = e.fwd_tid
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    measured = to_meta(costs, torch=str(torch.__version__), device=_device(torch, on_gpu), date=when,
                       warmup=warmup, backward_wall_ns={"median": statistics.median(walls), "runs": len(walls),
                                                        "thread_cpu_median": statistics.median(cpus),
                                                        "faults_median": statistics.median(faults),
                                                        **({"profiled_faults_median": statistics.median(profiled_faults)}
                                                           if profiled_faults else {})})
    doc.setdefault("meta", {})["measured"] = measured
    fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    atomic_write(path, dumps(doc, fmt), "output")
    return measured
