"""How sure a simulation is: which spec it used and why, its expected error, and costs that do not fit it.

Three questions a user of ``simulate`` should never have to ask:

* **Which machine was simulated, and why that one?** ``choose_spec``
  returns the spec and a reason: given by ``--spec``; or, by default,
  ``local`` (autograd-run's engine as ``calibrate`` measured it here) when
  calibrated, ``local-torch`` for costs from a PyTorch profile when
  ``calibrate --torch`` ran, else the H100 data sheet, saying how to
  calibrate.
* **How far off may it be?** ``expected_error``: a relative error with its
  basis. For a spec measured here it is the error the held-out benchmark
  (``python -m bench accuracy``: graphs drawn at run time, measured in fresh
  processes) found for that kind of prediction: ``HELD_OUT`` below holds
  the figure (about the 80th percentile of the absolute error, so it
  should cover four predictions in five) and where it was measured; a
  calibration whose rounds lay far apart widens it. For a data-sheet spec
  with analytic costs nothing here was measured against that machine, and
  it says so (``relative`` None). A prediction of a fresh process's first
  pass (``sim.first_pass``) has its own held-out figure, from the same
  benchmark's cold passes.
* **Do the costs fit the spec?** ``mismatch``: costs measured by
  autograd-run's engine (its own traces, Python holding the GIL) simulated
  on PyTorch's engine figures, or costs from a PyTorch profile simulated on
  autograd-run's engine figures, get one line saying so and what to run.
"""

from __future__ import annotations

import os
import statistics

from autograd_run.costs.measured import MeasuredCosts
from autograd_run.text import visible
from autograd_run.sim.specs import MachineSpec, default_spec_and_reason, load_spec, local_spec_path

#: The held-out benchmark's figures: kind of prediction -> (relative error that about four in five held-out
#: cases stayed within, where and when it was measured). Re-measure with ``python -m bench accuracy``.
HELD_OUT = {
    # By the device threads the graph keeps busy (the error grows with them: the GIL passed between more
    # threads than this VM has cores). 64 held-out cases (seeds 1512514036 and 128000364, 2026-12-06, a quiet
    # spell by the benchmark's control): on the CPU or one device |error| p80 6.7%, p90 8.6%, worst 10.2%; on
    # 2-4 devices p80 18.9%, p90 27.2%, worst 37.5%. (One figure for both, 10%, covered 70-84% of a run.)
    "local": (0.08, "bench accuracy, graphs on the CPU or one device, 2 runs of 32 graphs drawn at run time, "
                    "2-core VM, 2026-12-06"),
    "local several devices": (0.20, "bench accuracy, graphs on 2-4 devices, 2 runs of 32 graphs drawn at run "
                                    "time, 2-core VM, 2026-12-06"),
    # A fresh process's first pass (sim.first_pass: the warm prediction plus what calibrate measured a first
    # pass to add), against the first pass of `run` in a fresh process; seeds 1825430308 and 1510916946,
    # 2026-12-07. The machine adds single first passes 1-4 ms slower, which no model predicts.
    "local first pass": (0.12, "bench accuracy's cold passes, graphs on the CPU or one device, 2 runs of 32 "
                               "graphs drawn at run time, 2-core VM, 2026-12-07"),
    "local first pass several devices": (0.25, "bench accuracy's cold passes, graphs on 2-4 devices, 2 runs of 32 "
                                               "graphs drawn at run time, 2-core VM, 2026-12-07"),
    # PyTorch profiles (bench profiles: external models profiled five ways, by what the trace holds; 2026-12-07,
    # after the profiler's time with shapes: |error| p80 of one call 11-22%, several calls 11-20%, over three
    # draws of 16-40 cases; a draw whose profiled calls took far more page faults than the timed ones had
    # 20-70% misses: docs/costs.md); capture --profile's alternating steps (docs/costs.md) did better than these.
    "local-torch": (0.25, "bench profiles: a trace of several backward calls, external models, 2-core VM, "
                          "2026-12-07"),
    "local-torch one call": (0.30, "bench profiles: a trace of one backward call, external models, 2-core VM, "
                                   "2026-12-07"),
    "local-torch first call": (1.0, "bench profiles: a process's first backward profiled, external models, "
                                    "2-core VM, 2026-12-02"),
    # A process's first backward with its set-up taken out (sim.first_call): |error| p80 69% over 16 cases of two
    # draws (seeds 532746565 and 897873851; the same traces uncorrected: MAPE 102%, p80 above 150%).
    "local-torch first call, corrected": (0.70, "bench profiles: a process's first backward profiled, its set-up "
                                               "taken out (sim.first_call), external models, 2-core VM, 2026-12-07"),
    "gpu-profile": (0.20, "capture --profile on an H200 against PyTorch's backward (docs/costs.md, 2026-11-30)"),
}
#: A calibration whose figures' rounds lay further apart than this (range over median, on average) widens
#: the stated error by ``WIDEN`` times the excess: the held-out figure was measured with calibrations whose
#: rounds lay 30-140% apart on this VM (the spec keeps the rounds' medians, far steadier than their range).
SPREAD_AT_HELD_OUT = 1.0
WIDEN = 0.25


def choose_spec(ref, measured: MeasuredCosts | None) -> tuple[MachineSpec, str]:
    """The spec for ``--spec REF`` (None: the default), and why it is that one."""
    if isinstance(ref, MachineSpec):
        return ref, "given"
    if ref is not None:
        return load_spec(ref), f"--spec {ref}"
    return default_spec_and_reason(measured is not None and measured.from_pytorch)


def _kind(spec: MachineSpec, measured: MeasuredCosts | None) -> str | None:
    if spec.engine.overhead_holds_gil:
        return "local"  # autograd-run's Python engine: what `calibrate` measures (or a file that says it is that)
    if spec.name == "local-torch":
        return "local-torch"
    if measured is not None and measured.from_pytorch and any(c.gpu_total for c in measured.nodes.values()):
        return "gpu-profile"
    return None


def expected_error(spec: MachineSpec, measured: MeasuredCosts | None, sources: dict | None = None,
                   devices: int = 0, first_pass: bool = False, first_call_corrected: bool = False) -> dict:
    """``{"relative": r or None, "basis": text}`` (see the module docstring); ``sources``: where the node costs
    came from (source -> nodes): the held-out figures hold for stated and measured costs, not for analytic ones;
    ``devices``: the simulated graph's device count (on autograd-run's engine, two or more: a wider figure);
    ``first_pass``: the figure for the prediction of a fresh process's first pass (``sim.first_pass``)."""
    kind = _kind(spec, measured)
    sources = sources or {}
    if kind == "local" and sources.get("analytic", 0) * 2 > sum(sources.values()):
        return {"relative": None, "basis": "most node costs analytic (numpy roofline on this CPU): the held-out "
                                           "benchmark checks stated and measured costs only"}
    if kind == "local" and first_pass:
        kind = "local first pass"
    if kind in ("local", "local first pass") and devices >= 2:
        kind += " several devices"
    if kind is None:
        source = "measured costs" if measured is not None else "analytic costs (roofline)"
        return {"relative": None, "basis": f"{source} on {spec.name}'s figures, not checked against that machine "
                                           "here"}
    use = getattr(measured, "use", None)
    if kind == "local-torch" and use is not None:  # a profile read here: how it was made matters most
        kind = ("local-torch first call, corrected" if first_call_corrected else "local-torch first call") \
            if use.first_call else \
            "local-torch one call" if len(use.used) == 1 else "local-torch"
    rel, where = HELD_OUT[kind]
    spread = statistics.mean(spec.engine.spread.values()) if spec.engine.spread else 0.0
    basis = f"held-out figure for {kind} ({where})"
    if spread > SPREAD_AT_HELD_OUT:
        rel += (spread - SPREAD_AT_HELD_OUT) * WIDEN
        basis += f", widened: this calibration's rounds lay {spread:.0%} apart on average"
    return {"relative": round(rel, 3), "basis": basis}


def first_call(measured: MeasuredCosts | None, taken_ns: float | None = None) -> str | None:
    """One line when a PyTorch profile's costs come only from its process's first backward, with the fix;
    ``taken_ns``: the one-time set-up taken out of its spans (``sim.first_call``), None: none was."""
    use = getattr(measured, "use", None)
    if use is None or not use.first_call:
        return None
    what = (f"{taken_ns / 1e6:.2f} ms of it taken out as `calibrate --torch` measured it (new memory touched for the "
            "first time, the first node of each kind), an estimate" if taken_ns is not None else
            "1.3-2.5x a later call's on this machine's benchmark, not taken out (`calibrate --torch` measures it)")
    return (f"warning: {visible(measured.path)} profiles its process's first backward (the forward's sequence "
            f"numbers start at 0): its times hold one-time set-up (first allocations, kernel selection): {what}; "
            "profile a later step (after one warm-up step, or with torch.profiler.schedule(wait=1, warmup=1, "
            "active=3))")


def mismatch(spec: MachineSpec, measured: MeasuredCosts | None) -> str | None:
    """One line when the costs' source does not fit the spec's engine, with the fix; else None."""
    if measured is None or getattr(measured, "simulated", False):
        return None
    ours = not measured.from_pytorch
    if ours and not spec.engine.overhead_holds_gil:
        fix = ("--spec local" if os.path.isfile(local_spec_path()) else
               "`autograd-run calibrate`, then --spec local")
        return (f"warning: the costs in {visible(measured.path)} were measured by autograd-run's engine on this CPU, but "
                f"{spec.name}'s engine figures are PyTorch's C++ engine: the engine's own time is simulated as "
                f"that machine's, not this one's; for this machine use {fix}")
    if not ours and spec.engine.overhead_holds_gil:
        fix = ("--spec local-torch" if os.path.isfile(local_spec_path("local-torch")) else
               "`autograd-run calibrate --torch`, then --spec local-torch")
        return (f"warning: the costs in {visible(measured.path)} come from PyTorch's profiler, but {spec.name} describes "
                f"autograd-run's Python engine (it holds the GIL per node): for PyTorch's engine use {fix}")
    return None
