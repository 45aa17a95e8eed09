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
see the same machine.

After the last step, each session's trace is exported as PyTorch's Chrome
trace (not between steps: writing and reading a trace disturbs the next
step's timing) and read back
through the same reader and matcher ``--costs`` uses
(``traces.torch_profile``, ``sim.profile_match``): the steps' sequence
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
        from autograd_run.capture import ACC, walk_grad_fns
        for fn in walk_grad_fns([o.grad_fn for o in outputs if o.grad_fn is not None]):
            if fn.name() == ACC:
                v = fn.variable
                self.restore.setdefault(v, v.grad)
                v.grad = None
        return lambda: torch.autograd.backward(outputs, gos, inputs=list(inputs) if inputs else None), outputs


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
    from autograd_run.sim.measured import from_profile, to_meta
    from autograd_run.traces.torch_profile import merge_traces, read_torch_profile

    step = _Step(torch, forward, doc.get("mode", "backward"))
    walls, cpus, profs, on_gpu = [], [], [], False
    try:
        for k in range(warmup + steps):
            backward, outputs = step.prepare()
            on_gpu = on_gpu or any(o.is_cuda for o in outputs)
            sync = torch.cuda.synchronize if on_gpu else (lambda: None)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
            if k < warmup - 1:
                backward()
            elif k == warmup - 1:
                with silenced(), profile(activities=activities):
                    backward()
                    sync()
            else:
                sync()
                gc.disable()
                try:
                    t, c = time.perf_counter_ns(), time.thread_time_ns()
                    backward()
                    sync()
                    cpus.append(time.thread_time_ns() - c)
                    walls.append(time.perf_counter_ns() - t)
                finally:
                    gc.enable()
                backward, _ = step.prepare()
                with silenced(), profile(activities=activities) as prof:
                    backward()
                    sync()
                profs.append(prof)  # exported after the loop: writing traces between steps disturbs the timing
            del backward, outputs
    finally:
        for v, g in step.restore.items():
            v.grad = g
    traces = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, prof in enumerate(profs):
            trace_path = os.path.join(tmp, f"step{k}.json")
            prof.export_chrome_trace(trace_path)
            traces.append(read_torch_profile(trace_path, "profile"))
            if keep_trace and k == len(profs) - 1:
                shutil.copyfile(trace_path, keep_trace)
    graph = load_graph(path)
    costs = from_profile(merge_traces(traces), graph)
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
                                                        "thread_cpu_median": statistics.median(cpus)})
    doc.setdefault("meta", {})["measured"] = measured
    fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    atomic_write(path, dumps(doc, fmt), "output")
    return measured
