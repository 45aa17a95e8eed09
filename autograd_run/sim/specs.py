"""Device specs: what the simulation needs to know about a machine, from data sheets or measured here.

A ``MachineSpec`` has a ``host`` (the CPU that runs the engine's threads and
CPU nodes) and an ``accelerator`` (what ``cuda:N``/``TYPE:N`` devices are),
each a ``DeviceSpec``: peak FLOP/s per dtype, memory bandwidth and the
fraction of both that real kernels reach, the smallest kernel time, and for
accelerators the CPU time to launch a kernel and the links between devices
and to the host. The host part also carries the engine's own costs: the
fixed CPU time per node outside the node's function, the latency of handing
a task to another worker thread, and whether the engine's per-node work
holds Python's GIL (true for autograd-run's own engine, measured by
``autograd-run calibrate``; false for PyTorch's C++ engine).

Shipped specs (``specs/*.json``): ``h100``, ``h200``, ``a100``, ``l4`` from
their public data sheets, and ``cpu`` (a generic host); ``local`` is the
spec ``calibrate`` measured on this machine (in the user cache folder), and
``local-torch`` the one ``calibrate --torch`` measured: PyTorch's own engine
(its per-node overhead outside the nodes, its profiler's cost per event)
and this CPU as torch ops see it.
A user's own spec is a JSON or YAML file of the same shape.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from typing import Any

from autograd_run.errors import RequestError
from autograd_run.graphs.tensors import short
from autograd_run.ops.cost import ITEMSIZE


@dataclass
class DeviceSpec:
    name: str
    #: Peak FLOP/s by dtype (dtypes not listed use float32's; a spec file must give float32's, a spec made in
    #: code without it gets 1e9).
    peak_flops: dict[str, float] = field(default_factory=dict)
    #: Memory bandwidth, bytes/s.
    mem_bw: float = 20e9
    #: Fractions of peak FLOP/s and bandwidth that kernels reach.
    flops_efficiency: float = 0.6
    bw_efficiency: float = 0.7
    #: The smallest time one kernel (or numpy call) takes, µs.
    min_kernel_us: float = 1.0
    #: CPU time to launch one kernel from the engine's thread, µs (accelerators).
    launch_us: float = 0.0
    #: Device-to-device link (one direction), bytes/s, and its latency, µs.
    link_bw: float = 0.0
    link_latency_us: float = 0.0
    #: Host link (PCIe, one direction), bytes/s, and its latency, µs.
    host_bw: float = 0.0
    host_latency_us: float = 0.0
    #: CPU cores the engine's threads share (the host): CPU work (the engine's per-node work, GIL-holding
    #: nodes, a wait's busy tail) runs on at most this many threads at once, the others wait for a core.
    #: 0: as many as there are threads (a data sheet's server host).
    cores: int = 0

    def flops_per_s(self, dtype: str) -> float:
        return self.peak_flops.get(dtype) or self.peak_flops.get("float32", 1e9)


@dataclass
class EngineSpec:
    """The engine's own costs on the host."""

    #: CPU time per node outside its function (pop, validate, route, push), µs.
    node_overhead_us: float = 2.0
    #: From a push onto an idle worker's queue until that worker runs, µs.
    handoff_us: float = 20.0
    #: Whether the per-node engine work holds Python's GIL (autograd-run's engine: yes).
    overhead_holds_gil: bool = False
    #: PyTorch's profiler: its own time per event recorded inside a measured span, µs (``calibrate --torch``);
    #: a PyTorch profile's node costs are corrected by it.
    profiler_event_us: float = 0.0
    #: The same with ``record_shapes=True`` (a trace whose ops carry "Input Dims"), in a profiler session's first
    #: backward call (each op described to the profiler for the first time).
    profiler_event_shapes_us: float = 0.0
    #: The same in a session's later calls (a trace of several calls: ``schedule``, or a profile around several
    #: steps); 0: ``profiler_event_shapes_us``.
    profiler_event_shapes_later_us: float = 0.0
    #: CPU time of a backward call beyond its nodes (entering the engine, the graph task, returning), µs.
    call_overhead_us: float = 0.0
    #: A cost node that waits without the GIL (``wait``/``sleep``) takes this much longer than it states in
    #: autograd-run's engine (its thread's wake-up after the sleep, running cold after it), µs; measured by
    #: ``calibrate`` (0 in the shipped specs: a GPU kernel's time is what was measured).
    wait_overhead_us: float = 0.0
    #: The last stretch of a ``wait`` cost node that busy-waits on a core (without the GIL) after its sleep,
    #: µs (autograd-run's engine: ``engine.waits.SPIN_TAIL``; a wait no longer than this spins throughout).
    #: 0: a wait uses no core (a kernel on an accelerator, as the shipped specs describe).
    wait_spin_us: float = 0.0
    #: ``node_overhead_us`` on a device's worker thread, µs (autograd-run's engine does more per node there:
    #: streams, events; ``calibrate`` measures it); 0: the same as ``node_overhead_us``.
    device_overhead_us: float = 0.0
    #: A ``cost`` node's own CPU time beyond its stated time and the fixed cost, holding the GIL, µs (in
    #: autograd-run's engine: its Python path for a node with attrs, and the cost function's own Python).
    cost_node_us: float = 0.0
    #: An AccumulateGrad node's own CPU time beyond the fixed cost, holding the GIL as the engine's per-node
    #: work does, µs (autograd-run's engine: the leaf's gradient stored or summed in Python); 0: the op's cost.
    accumulate_us: float = 0.0
    #: ``handoff_us`` from one device's worker to another device's (autograd-run's engine: both are Python
    #: threads running the engine's Python path, so the woken one more often waits for the GIL too; measured
    #: by ``calibrate``); 0: the same as ``handoff_us``.
    device_handoff_us: float = 0.0
    #: A thread that waits for the GIL another holds takes it this long after its release, µs (CPython hands
    #: the GIL over by waking the waiter: one wake-up, where a queue's hand-off is a wake-up and then the GIL);
    #: 0: the same as ``handoff_us``.
    gil_handoff_us: float = 0.0
    #: A fresh process's first backward call takes this much longer than its later ones when every node
    #: runs on the CPU, µs: the interpreter's code paths and the threads' stacks run cold once (measured by
    #: ``calibrate`` in fresh processes, ``sim.calibrate.first_pass``); 0: not modelled (the shipped specs).
    first_pass_us: float = 0.0
    #: The same for a graph with nodes on accelerator devices (their threads' first wake-ups, the stream and
    #: copy paths run cold too), µs; 0: not modelled.
    first_pass_device_us: float = 0.0
    #: A PyTorch profile of a process's first backward call (``sim.first_call``, measured by ``calibrate --torch`` in
    #: fresh processes): the time to touch one byte of new memory for the first time, ns (0: not corrected) ...
    first_call_ns_per_byte: float = 0.0
    #: ... and what a node met first takes beyond a later call's span: ``{"call": us}`` (the call's first node),
    #: ``"op"`` (the first node of an op name) and ``"kind"`` (a later first node of its kind), each by op name
    #: with ``"*"`` for the others. Empty: not corrected.
    first_call_setup_us: dict = field(default_factory=dict)
    #: How far ``calibrate``'s rounds lay apart, per figure above (its name): the range of the rounds'
    #: values over their median (0.1: within 10%). Empty for a spec that was not measured in rounds.
    spread: dict = field(default_factory=dict)


@dataclass
class MachineSpec:
    name: str
    host: DeviceSpec
    accelerator: DeviceSpec
    engine: EngineSpec = field(default_factory=EngineSpec)
    #: Where the figures come from (a data sheet, or ``calibrate`` with the date and machine).
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(doc: Any, where: str = "spec") -> "MachineSpec":
        if not isinstance(doc, dict):
            raise RequestError(f"{where}: a spec is a mapping with 'name', 'host', 'accelerator'", "spec")
        extra = sorted(set(doc) - {"name", "source", "host", "accelerator", "engine"}, key=str)
        if extra:  # a graph file, a summary or a trace given as a spec
            raise RequestError(f"{where}: unknown field {extra[0]!r} (a spec has name, source, host, accelerator, "
                               "engine)", "spec")
        for key, most in (("name", 200), ("source", 2000)):  # (shown in summaries and written into traces)
            if key in doc and not (isinstance(doc[key], str) and len(doc[key]) <= most):
                raise RequestError(f"{where}: {key} must be a string of at most {most} characters, got "
                                   f"{short(doc[key])}", "spec")
        missing = [k for k in ("host", "accelerator") if k not in doc]
        if missing:
            raise RequestError(f"{where}: a spec needs {missing[0]!r}", "spec")
        try:
            host = _device(doc.get("host", {}), f"{where}: host")
            acc = _device(doc.get("accelerator", {}), f"{where}: accelerator")
            eng = EngineSpec(**_known(EngineSpec, doc.get("engine", {}), f"{where}: engine"))
        except TypeError as exc:
            raise RequestError(f"{where}: {exc}", "spec") from None
        return MachineSpec(str(doc.get("name", where)), host, acc, eng, str(doc.get("source", "")))


def _known(cls, d: Any, where: str) -> dict:
    if not isinstance(d, dict):
        raise RequestError(f"{where}: expected a mapping", "spec")
    names = {f.name for f in fields(cls)}
    flags = {f.name for f in fields(cls) if f.type in (bool, "bool")}
    extra = sorted(set(d) - names)
    if extra:
        raise RequestError(f"{where}: unknown field {extra[0]!r}", "spec")
    for k, v in d.items():
        if k == "cores":
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_CORES:
                raise RequestError(f"{where}: cores must be a whole number from 0 (as many as there are threads) "
                                   f"to {MAX_CORES}, got {short(v)}", "spec")
            continue
        if k in flags:
            if not isinstance(v, bool):
                raise RequestError(f"{where}: {k} must be true or false, got {short(v)}", "spec")
            continue
        if k == "name":  # shown in summaries and written into traces (a Kineto trace's deviceProperties)
            if not isinstance(v, str) or len(v) > 200:
                raise RequestError(f"{where}: name must be a string of at most 200 characters, got {short(v)}",
                                   "spec")
            continue
        if k == "peak_flops":
            continue
        if isinstance(v, bool):  # a bool is an int to Python: efficiency: false divided by zero
            raise RequestError(f"{where}: {k} must be a number, got {short(v)}", "spec")
        if k == "spread":
            if not isinstance(v, dict) or not all(isinstance(x, str) and x in names for x in v) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1e6 for x in v.values()):
                raise RequestError(f"{where}: spread maps the names of the figures above to numbers from 0 "
                                   "(the rounds agreed) upwards", "spec")
            continue
        if k == "first_call_setup_us":
            _setup_table(v, where)
            continue
        low, high = _LOWER.get(k, 0), _LIMITS.get(k[k.rfind("_") + 1:], MAX_RATE)
        if not isinstance(v, (int, float)) or not low <= v <= high:
            raise RequestError(f"{where}: {k} must be a number from {low:g} to {high:g}, got {short(v)}", "spec")
        if k.endswith("_bw") and 0 < v < MIN_RATE:
            raise RequestError(f"{where}: {k} must be 0 (no such link) or at least {MIN_RATE:g} bytes/s, "
                               f"got {short(v)}", "spec")
    return d


def _setup_table(v: Any, where: str) -> None:
    """``first_call_setup_us``: ``{"call": us, "op": {name: us}, "kind": {name: us}}``, each part optional."""
    def us(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1e9

    def table(t) -> bool:
        return isinstance(t, dict) and len(t) <= 10_000 and all(
            isinstance(n, str) and 0 < len(n) <= 200 and us(x) for n, x in t.items())
    if not (isinstance(v, dict) and set(v) <= {"call", "op", "kind"} and us(v.get("call", 0))
            and table(v.get("op", {})) and table(v.get("kind", {}))):
        raise RequestError(f"{where}: first_call_setup_us must be a mapping of \"call\" to microseconds, and of "
                           "\"op\" and \"kind\" to mappings of op names to microseconds (0 to 1e9)", "spec")


#: The largest FLOP/s or bytes/s a spec may give (a divisor of every analytic cost: with bounds on
#: both sides, no cost overflows the simulation's integer nanoseconds).
MAX_RATE = 1e21
#: The smallest FLOP/s (``peak_flops``) or bytes/s (``mem_bw``; ``link_bw`` and ``host_bw`` unless 0, no such
#: link) a spec may give: a million, below any machine that runs PyTorch.
MIN_RATE = 1e6
#: The smallest ``flops_efficiency`` / ``bw_efficiency``: a thousandth of the peak. With ``MIN_RATE``, a
#: 4096x4096 matmul costs at most a few years, not more than a 64-bit count of nanoseconds holds (a 1e-320
#: efficiency made an infinite cost: an OverflowError).
MIN_EFFICIENCY = 1e-3
#: The most cores a spec may give.
MAX_CORES = 1 << 16
#: Bounds by the last word of a field's name: fractions of the peak, microseconds (1000 s at most).
_LIMITS = {"efficiency": 1.0, "us": 1e9, "byte": 1e6}
#: Lower bounds above 0, by field: a fraction of the peak is more than none, memory has a bandwidth (0 was
#: taken for an infinite one).
_LOWER = {"flops_efficiency": MIN_EFFICIENCY, "bw_efficiency": MIN_EFFICIENCY, "mem_bw": MIN_RATE}


def _device(d: Any, where: str) -> DeviceSpec:
    d = dict(_known(DeviceSpec, d, where))
    flops = d.get("peak_flops", {})
    if not isinstance(flops, dict):
        raise RequestError(f"{where}: peak_flops maps dtypes to FLOP/s from {MIN_RATE:g} to {MAX_RATE:g}, "
                           f"got {short(flops)}", "spec")
    for dtype, v in flops.items():
        if dtype not in ITEMSIZE:  # a typo (flaot16) would quietly take float32's figure
            raise RequestError(f"{where}: peak_flops: unknown dtype {short(dtype)} (dtypes: "
                               f"{', '.join(ITEMSIZE)})", "spec")
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and MIN_RATE <= v <= MAX_RATE):
            raise RequestError(f"{where}: peak_flops maps dtypes to FLOP/s from {MIN_RATE:g} to {MAX_RATE:g}, "
                               f"got {short(v)} for {short(dtype)}", "spec")
    if "float32" not in flops:  # the figure of every dtype not listed: without it a matmul took 1e9 FLOP/s
        raise RequestError(f"{where}: peak_flops must give float32's FLOP/s (the figure of every dtype it does "
                           "not list)", "spec")
    d.setdefault("name", where)
    return DeviceSpec(**d)


SHIPPED = ("h100", "h200", "a100", "l4", "cpu")


#: Specs measured here: ``local`` (autograd-run's engine, ``calibrate``) and ``local-torch``
#: (PyTorch's engine and ops on this CPU, ``calibrate --torch``).
LOCAL = {"local": ("local-spec.json", "autograd-run calibrate"),
         "local-torch": ("local-torch-spec.json", "autograd-run calibrate --torch")}


def local_spec_path(name: str = "local") -> str:
    from autograd_run.outputs import cache_dir
    return cache_dir(LOCAL[name][0])


#: A machine spec file (untrusted): at most this big, this many values once YAML aliases expand, this deep.
MAX_SPEC_FILE_BYTES = 1 << 20
MAX_SPEC_FILE_VALUES = 100_000
MAX_SPEC_FILE_DEPTH = 32


def load_spec(ref: str) -> MachineSpec:
    """A shipped spec by name, ``local`` / ``local-torch`` (calibrated here), or a JSON/YAML file."""
    if ref in SHIPPED:
        text = resources.files("autograd_run.sim").joinpath("specs").joinpath(f"{ref}.json").read_text()
        return MachineSpec.from_dict(json.loads(text), ref)
    path = local_spec_path(ref) if ref in LOCAL else ref
    if ref in LOCAL and not os.path.lexists(path):
        raise RequestError(f"no {ref} spec yet: run `{LOCAL[ref][1]}` first", "spec")
    if os.path.exists(path) and not os.path.isfile(path):
        raise RequestError(f"{ref}: not a regular file (a folder, a device or a FIFO)", "spec")
    if not os.path.isfile(path):
        raise RequestError(f"{ref}: not a shipped spec ({', '.join(SHIPPED)}, local, local-torch) nor a file", "spec")
    from autograd_run import untrusted
    try:
        data = untrusted.read_regular_file(path, MAX_SPEC_FILE_BYTES)
        if path.lower().endswith((".yaml", ".yml")):
            doc = untrusted.load_yaml(data, MAX_SPEC_FILE_VALUES, MAX_SPEC_FILE_DEPTH)[1]
        else:
            doc = untrusted.load_json(data)
    except untrusted.Problem as p:
        where = f" ({p.where})" if p.where else ""
        raise RequestError(f"{path}{where}: {p.what}", "spec") from None
    except (ValueError, RecursionError) as exc:  # JSON (UnicodeDecodeError is a ValueError)
        raise RequestError(f"{path}: not a valid spec file: {str(exc)[:300]}", "spec") from None
    return MachineSpec.from_dict(doc, path)


def default_spec(pytorch_costs: bool = False) -> MachineSpec:
    """``local`` when calibrated, else H100 accelerators on a generic host.

    With costs measured by PyTorch's profiler, ``local-torch`` when calibrated:
    the per-node engine overhead around them is then PyTorch's own.
    """
    return default_spec_and_reason(pytorch_costs)[0]


def _calibrated(name: str) -> MachineSpec:
    """The calibrated spec ``name`` taken by default: one that cannot be read is said to be the calibration kept
    here, not a ``--spec`` the user gave (nor passed over silently for another)."""
    try:
        return load_spec(name)
    except RequestError as exc:
        path = local_spec_path(name)
        why = str(exc)
        for prefix in (path + ": ", name + ": "):
            why = why[len(prefix):] if why.startswith(prefix) else why
        raise RequestError(f"the calibration kept at {path} (the default spec) cannot be used: {why}; run "
                           f"`{LOCAL[name][1]}` again, or give --spec") from None


def default_spec_and_reason(pytorch_costs: bool = False) -> tuple[MachineSpec, str]:
    """``default_spec``, and why it is that one (a line for the user)."""
    if pytorch_costs and os.path.lexists(local_spec_path("local-torch")):
        return _calibrated("local-torch"), ("the default for costs from a PyTorch profile: local-torch (PyTorch's "
                                            "engine as `calibrate --torch` measured it here)")
    if os.path.lexists(local_spec_path()):
        return _calibrated("local"), "the default: local (autograd-run's engine as `calibrate` measured it here)"
    how = "`autograd-run calibrate --torch`" if pytorch_costs else "`autograd-run calibrate`"
    return load_spec("h100"), f"the default without a calibration here: h100 (run {how} to simulate this machine)"
