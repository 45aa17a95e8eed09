"""One simulation as a library call: ``simulate_session(graph, SimOptions) -> SimReport``.

The ``simulate`` command, the benchmarks and the tests call this. Steps: load
the machine spec; resolve costs (``costs``); remap the graph onto the
requested devices (``placement``); pick the policy (``policies``); run the
simulator (``scheduler``) for the graph's backward call; estimate, by
simulating again, how much the pass shortens when each of the slowest
critical-path nodes is made faster (``slack``). What happened becomes a
``Recording`` (the same summary and trace writer as a real run: ``result``)
and order rows (``order``) when the report is first asked for them.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from operator import attrgetter
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.graphs.load import gc_paused
from autograd_run.graphs.model import Graph
from autograd_run.sim.costs import CostResolver, NodeCost, parse_scale
from autograd_run.costs.measured import MeasuredCosts, load_costs
from autograd_run.sim.order import predicted_order
from autograd_run.sim.order import order_rows
from autograd_run.sim.placement import place
from autograd_run.sim.policies import make_policy
from autograd_run.sim.result import last_times, nonempty, span, to_recording, too_big
from autograd_run.sim.scheduler import Simulator
from autograd_run.sim import first_call as first_call_costs, first_pass
from autograd_run.sim.confidence import choose_spec, expected_error, first_call, mismatch
from autograd_run.sim.specs import MachineSpec
from autograd_run.record.recording import Recording
from autograd_run.analysis.summary import Summary, longest_runs, summarize
from autograd_run.analysis.memory import Memory, memory_of


#: The what-ifs by default: the slowest critical-path nodes, made faster one at a time.
SLACK_TOP = 5
#: Above this many nodes, the what-ifs that are a whole simulation each are left out by default.
SLACK_AUTO_NODES = 100_000


@dataclass
class SimOptions:
    #: A shipped spec name, ``local``, a spec file, or a ``MachineSpec``; None: ``local`` if calibrated, else h100.
    spec: str | MachineSpec | None = None
    #: Remap onto this many devices (None: keep the file's).
    devices: int | None = None
    placement: str = "keep"
    policy: str = "pytorch"
    #: ``NAME=FACTOR,...`` or a mapping: scale the costs of an op name or a device.
    scale: str | dict | None = None
    #: Measured costs (``read_costs``): a PyTorch profiler trace, a trace of ``run --trace``, a graph
    #: file with measured costs, ``analytic`` (none), or already loaded ``MeasuredCosts``; None: the graph's own
    #: ``meta.measured`` when it has them.
    costs: str | MeasuredCosts | None = None
    #: With a PyTorch profile: the costs of this step (from 1) instead of the median over its steps.
    step: int | None = None
    #: How many of the slowest critical-path nodes get a what-if (0: none; None: ``SLACK_TOP`` where the
    #: what-ifs are cheap: one CPU worker (no simulation again) or at most ``SLACK_AUTO_NODES`` nodes, else
    #: none, noted in ``SimReport.slack_skipped``).
    slack_top: int | None = 5
    #: The what-if speed-up of each (0.2: 20% faster).
    slack_speedup: float = 0.2
    #: Keep what a trace shows beyond the summary (queue depths over time).
    detail: bool = False
    #: Refuse a ``scale`` key that names no op and no device of the (placed) graph (a typo would scale
    #: nothing, silently). False (a sweep, whose grid crosses one scale with many graphs and device
    #: counts): such a key leaves this simulation unscaled and is listed in ``SimReport.scale_unused``.
    scale_must_apply: bool = True
    #: node id -> ns the node waits (asleep, on no core) before it computes: communication the node waited
    #: for, found by a model over a first simulation (``sim.fsdp``'s stalls), put back into the schedule.
    extra_ns: dict | None = None
    #: Bytes per device the pass must fit in: ``SimReport.memory.over_limit`` names the first node past it.
    memory_limit: int | None = None
    #: The memory keeps every allocation and free in order (``Memory.events``: what a memory snapshot shows).
    memory_events: bool = False


@dataclass
class Slack:
    """Making ``node`` ``speedup`` faster shortens the simulated pass by ``saved_ns``."""

    node: str
    name: str
    duration_ns: int
    saved_ns: int


@dataclass
class SimReport:
    """One simulation's results. ``recording``, ``order`` and ``summary`` are made from the finished
    simulation ``sim`` on first use (a run that shows none of them never makes them)."""

    graph: Graph | None  # (None once ``settle``d, as ``sim``)
    options: SimOptions
    spec: MachineSpec
    sim: Simulator | None
    #: When the engine's work ended (the backward call returned) and when the last kernel ended.
    engine_done_ns: int
    wall_ns: int
    #: Where the node costs came from: source -> node count.
    cost_sources: dict[str, int] = field(default_factory=dict)
    #: The measured costs used (with a PyTorch profile's coverage report), or None.
    measured: MeasuredCosts | None = None
    slack: list[Slack] = field(default_factory=list)
    #: The default what-ifs left out (``SimOptions.slack_top`` None on a big graph): how many, and the
    #: seconds this simulation took (each what-if is one more); None when none were left out.
    slack_skipped: tuple[int, float] | None = None
    #: ``scale`` keys that named nothing here (only with ``SimOptions.scale_must_apply`` False).
    scale_unused: list[str] = field(default_factory=list)
    #: Why the simulation used this spec (``confidence.choose_spec``).
    spec_reason: str = ""
    #: How far off it may be: ``{"relative": r or None, "basis": text}`` (``confidence.expected_error``).
    expected_error: dict = field(default_factory=dict)
    #: Lines for the user: costs whose source does not fit the spec (``confidence.mismatch``).
    warnings: list[str] = field(default_factory=list)
    #: A PyTorch profile of a process's first backward: the one-time set-up taken out of its spans
    #: (``sim.first_call``), ns; None where nothing was taken out.
    first_call_taken_ns: float | None = None
    #: What a fresh process's first pass adds to ``wall_ns`` (``sim.first_pass``), ns; None where the spec does
    #: not model it.
    first_pass_ns: int | None = None
    #: How far off that first pass's prediction may be (``expected_error`` for it), when it is made.
    first_pass_error: dict = field(default_factory=dict)
    _recording: Recording | None = None
    _order: list[dict] | None = None
    _summary: Summary | None = None
    _memory: Memory | None = None
    _extras: dict = field(default_factory=dict)

    def settle(self, memory: bool) -> None:
        """Keep the figures a comparison of variants shows (the summary's, without the critical path's runs,
        and the memory where asked) and let the simulation, its records and the placed graph go (``graph`` and
        ``sim`` become None): a ``--compare`` of many variants then holds one simulation at a time."""
        self.summary.critical_path = []  # (its runs read the recording's columns; its length stays)
        if memory:
            self.memory
        self.graph = self.sim = self._recording = self._order = None

    @property
    def memory(self) -> Memory:
        """The simulated pass's memory per device (``analysis.memory``, the model a real run's uses)."""
        if self._memory is None:
            rec = self.recording
            with gc_paused():
                self._memory = memory_of(self.graph, rec, limit=self.options.memory_limit,
                                         events=self.options.memory_events, **self._extras)
        return self._memory

    def add_memory(self, extras: tuple, grads_in: dict | None = None, grads_out: dict | None = None,
                   leaves_out=()) -> None:
        """What a model over this pass adds to its memory (``DdpResult.memory_extras``,
        ``FsdpResult.memory_extras``; ``analysis.memory.memory_of``'s arguments): the memory is made again."""
        self._extras = {"extras": tuple(extras), "grads_in": dict(grads_in or {}),
                        "grads_out": dict(grads_out or {}), "leaves_out": tuple(leaves_out)}
        self._memory = None

    @property
    def recording(self) -> Recording:
        if self._recording is None:
            with gc_paused():
                self._recording = to_recording(self.sim)
        return self._recording

    @property
    def order(self) -> list[dict]:
        """The simulated executed order as order-file rows (``traces.order``)."""
        if self._order is None:
            with gc_paused():
                self._order = order_rows(self.sim)
        return self._order

    @property
    def summary(self) -> Summary:
        if self._summary is None:
            rec = self.recording
            with gc_paused():
                self._summary = summarize(rec)
        return self._summary

    @property
    def label(self) -> str:
        o = self.options
        devices = f"{o.devices} devices ({o.placement})" if o.devices else "devices as in the file"
        return f"{self.spec.name}, policy {o.policy}, {devices}"


def _sources(resolved) -> dict[str, int]:
    """How many nodes took their cost from each source (``NodeCost.source``), by source name: the same whether
    ``resolved`` is a dict (in the order nodes were costed) or a NodeMap (by node index)."""
    return dict(sorted(Counter(map(attrgetter("source"), resolved.values())).items()))


def _simulate(graph: Graph, spec: MachineSpec, model: CostResolver, policy: str, detail: bool = False):
    priority, multithreading = make_policy(policy, graph, model)
    sim = Simulator(graph, spec, model, priority=priority, multithreading=multithreading, detail=detail)
    gt = sim.run([r.edge for r in graph.roots], graph.input_edges() or None, graph.mode != "grad")
    return sim, gt


def _check_scale(graph: Graph, scale: dict[str, float], count: int | None, strict: bool = True) -> list[str]:
    """Every ``--scale`` key names an op of the (placed) graph or one of its devices (with ``--devices K``,
    any of cuda:0..K-1): a typo, or a device index the run does not have (``cuda:1000``), would
    otherwise scale nothing, silently. Not ``strict``: the keys that apply to nothing, returned."""
    if not scale:  # nothing to check: no pass over the graph's nodes
        return []
    names = {n.name for n in graph.nodes}
    devices = {str(d) for d in graph.devices} | {f"cuda:{k}" for k in range(count or 0)}
    unused = []
    for key in scale:
        if key in names or key in devices:
            continue
        if not strict:
            unused.append(key)
            continue
        if ":" in key or key in ("cpu", "cuda"):
            raise RequestError(f"{key!r}: no such device in {graph.source} (it has "
                               f"{', '.join(sorted(devices, key=_device_order))})", "scale")
        raise RequestError(f"{key!r} is neither an op name nor a device of {graph.source}", "scale")
    return unused


def _device_order(name: str) -> tuple:
    kind, _, index = name.partition(":")
    return (kind != "cpu", kind, int(index) if index.isdigit() else -1)


def simulate_session(graph: Graph, options: SimOptions | None = None) -> SimReport:
    """Simulate ``graph``'s backward call as ``options`` say (see the module docstring).

    The cyclic GC is paused meanwhile, as while loading: a simulation allocates millions of small objects
    (records, tasks) and frees none of them in cycles."""
    with gc_paused():
        return _simulate_session(graph, options or SimOptions())


def read_costs(ref, graph: Graph, step: int | None = None, option: str = "costs") -> MeasuredCosts | None:
    """``costs.measured.load_costs`` with the order a profile's AccumulateGrad runs are matched by: the one
    PyTorch's engine runs the graph in, simulated (``sim.order.predicted_order``) when it is needed."""
    return load_costs(ref, graph, step, option, order=lambda: predicted_order(graph))


def _simulate_session(graph: Graph, o: SimOptions) -> SimReport:
    measured = o.costs if isinstance(o.costs, MeasuredCosts) else read_costs(o.costs, graph, o.step)
    spec, reason = choose_spec(o.spec, measured)
    scale = o.scale if isinstance(o.scale, dict) else parse_scale(o.scale)
    use = getattr(measured, "use", None)
    taken = None  # a process's first backward profiled: what of it is one-time set-up (sim.first_call)
    if use is not None and use.first_call and measured.from_pytorch and first_call_costs.applies(graph, spec):
        taken = first_call_costs.FirstCall(first_call_costs.corrections(graph, spec))
    model = CostResolver(spec, measured, scale, taken, len(graph.nodes))
    if o.devices is not None:
        graph = place(graph, o.devices, o.placement, model)
        if taken is not None:  # (what the placement's costs took is not the simulation's)
            taken = first_call_costs.FirstCall(taken.take)
        model = CostResolver(spec, measured, scale, taken, len(graph.nodes))  # costs of the placed graph's nodes
    elif o.placement != "keep":
        raise RequestError("a placement needs a device count", "placement")
    scale_unused = _check_scale(graph, scale, o.devices, o.scale_must_apply)
    for nid, ns in (o.extra_ns or {}).items():
        node = graph.by_id.get(nid)
        if node is None:
            raise RequestError(f"{graph.source}: no node {nid!r} to wait at", "extra_ns")
        base = model(node)
        model.resolved[node] = NodeCost(base.cpu_ns + int(ns), base.gpu_ns, base.holds_gil, base.source,
                                        base.blocking, base.sleep_ns + int(ns))
    took = time.perf_counter()
    try:
        sim, gt = _simulate(graph, spec, model, o.policy, o.detail)
    except OverflowError:  # every input is bounded; a combination of extremes can still pass 2**63 ns
        raise too_big() from None
    took = time.perf_counter() - took
    start, end = span(sim)
    if max(abs(start), abs(end), gt.returned or 0) >= 1 << 62:  # (what comes after reads them as 64-bit integers)
        raise too_big()
    report = SimReport(graph, o, spec, sim, (gt.returned or gt.end or 0) - gt.start, end - start,
                       _sources(model.resolved), measured)
    report.scale_unused = scale_unused
    report.spec_reason = reason
    if taken is not None:
        report.first_call_taken_ns = taken.taken_ns
    report.expected_error = expected_error(spec, measured, report.cost_sources, graph.max_device_index + 1,
                                           first_call_corrected=taken is not None)
    report.warnings = [w for w in (mismatch(spec, measured), first_call(measured, report.first_call_taken_ns))
                       if w]
    report.first_pass_ns = first_pass.extra_ns(spec.engine, graph.max_device_index >= 0)
    if report.first_pass_ns is not None:
        report.first_pass_error = expected_error(spec, measured, report.cost_sources, graph.max_device_index + 1,
                                                 first_pass=True)
    top = o.slack_top
    if top is None:
        top = SLACK_TOP if sim.cpu_only_one_worker or len(graph.nodes) <= SLACK_AUTO_NODES else 0
        if not top:
            report.slack_skipped = (SLACK_TOP, took)
    if top > 0:
        report.slack = _slack(graph, spec, model, dataclasses.replace(o, slack_top=top), report)
    return report


def _slack(graph, spec, model: CostResolver, o: SimOptions, report: SimReport) -> list[Slack]:
    """Re-simulate with each of the slowest critical-path nodes ``slack_speedup`` faster.

    Each what-if shares ``model``'s resolved costs (one node's replaced) and reads only the simulated span.
    Where one worker ran every node on the CPU (``Simulator.cpu_only_one_worker``), the call's end is a sum
    over the nodes that ran, in any order: the node's CPU time saved comes off it as it would in a new
    simulation, which is not run.
    """
    path = longest_runs(report.summary.critical_path, o.slack_top)
    factor = 1.0 - o.slack_speedup
    start0, end0 = last_times(report.sim)
    out = []
    for run in path:
        node = graph.by_id.get(run.id)
        if node is None:
            continue
        base = model(node)
        faster = NodeCost(int(base.cpu_ns * factor), int(base.gpu_ns * factor), base.holds_gil, base.source,
                          base.blocking, int(base.sleep_ns * factor))
        if report.sim.cpu_only_one_worker:  # the node ran once, on the CPU: its end moves by what it saves
            start, end = nonempty(start0, end0 - (base.cpu_ns - faster.cpu_ns))
        else:
            what_if = _simulate(graph, spec, model.with_cost(node, faster), o.policy)[0]
            start, end = span(what_if)
            what_if.release()
        out.append(Slack(run.id, run.name, run.duration_ns, report.wall_ns - (end - start)))
    return out
