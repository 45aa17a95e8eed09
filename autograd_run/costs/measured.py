"""Measured node costs: from a trace file (format told by its content) or stored in the graph file.

``load_costs(ref, graph, step=None, order=...) -> MeasuredCosts | None``:

* ``ref`` None: the costs ``capture --profile`` stored in the graph
  (``meta.measured``), or None when there are none;
* ``analytic``: None (the analytic model, even when the graph has measured costs);
* a file, read bounded (plain or gzipped, see ``traces.jsonfile``), one reader per format:
  - a PyTorch profiler trace (``torch.profiler`` ``export_chrome_trace``): its backward
    node runs matched to the graph (``profile_match``), per node the median over the
    matched steps (or step ``step``, from 1) of the evaluate_function span on its
    engine thread and of its kernel time per stream;
  - a Chrome trace written by ``autograd-run run --trace``: per node id, the median of
    its slices;
  - an autograd-run graph file with ``meta.measured`` (a graph captured with
    ``--profile``): its costs, by node id.

``MeasuredCost`` keeps the raw figures; ``CostResolver`` turns them into a
``NodeCost`` (it subtracts the profiler's own time inside a span, when the
spec knows it, see ``EngineSpec.profiler_event_us``).
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from autograd_run.errors import GraphFileError, RequestError
from autograd_run.graphs.model import FORMAT, Graph
from autograd_run.graphs import tensors

#: Where costs came from: a PyTorch profile (C++ nodes: no GIL held) or autograd-run's own trace.
PYTORCH = "pytorch profile"
OURS = "autograd-run trace"


@dataclass(slots=True)
class MeasuredCost:
    #: CPU time of the node on its engine thread (PyTorch: the evaluate_function span), ns.
    cpu_ns: float
    #: Kernel (and copy) time the node launched, by stream (``cuda:D/sS``), ns.
    gpu_ns: dict[str, float] = field(default_factory=dict)
    #: Profiler events recorded inside the span (each adds the profiler's own time to it).
    nested: float = 0.0

    @property
    def gpu_total(self) -> float:
        return sum(self.gpu_ns.values())


@dataclass
class MeasuredCosts:
    nodes: dict[str, MeasuredCost]
    #: ``PYTORCH`` or ``OURS``.
    origin: str
    #: The file they were read from (the graph itself for stored costs).
    path: str
    #: How a PyTorch profile matched the graph (None for other sources).
    coverage: Any = None
    #: How many steps (backward calls) the figures are the median of, and the one picked.
    steps: int = 1
    step: int | None = None
    #: When, where and with what they were measured (``capture --profile``): torch, device, date...
    info: dict = field(default_factory=dict)
    #: A PyTorch profile: which of its backward calls were used and what was left out (see ``ProfileUse``).
    use: Any = None
    #: Costs read from a simulation's trace (its times are the spec's it was simulated on, not a machine's).
    simulated: bool = False
    #: The engine's per-node time inside each span, to take out (a simulation's Kineto trace says what it
    #: charged: ``{"node": ns, "device_node": ns}``); None: none known.
    engine_ns: dict | None = None

    @property
    def from_pytorch(self) -> bool:
        return self.origin == PYTORCH

    def event_us(self, engine) -> float:
        """The profiler's own time per event recorded inside a node span, µs, on ``engine`` (an ``EngineSpec``):
        its figure with shapes for a trace made with ``record_shapes=True`` (where the spec has one: a session's
        later calls' where the costs are theirs, ``ProfileUse.later``, else its first call's), else the plain
        one; 0 for costs that are not a PyTorch profile's."""
        if not self.from_pytorch:
            return 0.0
        if self.use is not None and self.use.shapes and engine.profiler_event_shapes_us:
            if self.use.later and engine.profiler_event_shapes_later_us:
                return engine.profiler_event_shapes_later_us
            return engine.profiler_event_shapes_us
        return engine.profiler_event_us

    def describe(self) -> str:
        cov = self.coverage
        n = cov["matched"] if isinstance(cov, dict) and cov.get("trace") else len(self.nodes)  # (the graph's)
        nodes = "1 node" if n == 1 else f"{n} nodes"
        what = (f"{nodes}{chr(39)}{'s' if n == 1 else ''} simulated times ({self.origin} of a simulation, {self.path}"
                if self.simulated else f"{nodes} measured ({self.origin}, {self.path}")
        if self.info.get("device") or self.info.get("torch"):
            what += f"; {self.info.get('device', '?')}, torch {self.info.get('torch', '?')}"
            if self.info.get("date"):
                what += f", {self.info['date']}"
        what += ")"
        if self.step is not None:
            what += f", step {self.step} of {self.steps}"
        elif self.use is not None and len(self.use.used) != self.steps:
            what += f", median of {len(self.use.used)} of its {self.steps} steps"
        elif self.steps > 1:
            what += f", median of {self.steps} steps"
        return what


@dataclass
class ProfileUse:
    """What a PyTorch profile's costs are made of: the calls used, what was left out and why."""

    used: list[str]
    calls: int
    left_out: list[str]
    #: Top-level ops outside every backward node (forward, optimizer), and node runs outside the matched calls.
    outside_ops: int
    outside_runs: int
    #: Profiler events recorded inside the used calls' node spans, per call (the median call).
    events: float
    #: Every used call is its process's first backward (one-time set-up in its times).
    first_call: bool
    #: The profiler's own time per recorded event that the used spans show (us; None: they cannot tell).
    event_us_seen: float | None = None
    #: FSDP2's collectives inside the node spans (``traces.torch_profile.FSDP_COLLECTIVES``), per call (the
    #: median call), ns: taken out of the nodes' costs, since ``simulate --fsdp`` models them.
    fsdp_ns: float = 0.0
    #: FSDP2's root final callback's own time after the used calls (``TorchTrace.final_callbacks``), the median,
    #: ns: no node's, so ``simulate --fsdp`` adds it after the compute (0: none seen).
    fsdp_final_ns: float = 0.0
    #: The used calls' node events recorded their inputs' shapes (``record_shapes=True``): the profiler's time per
    #: event is then its figure with shapes (``EngineSpec.profiler_event_shapes_us``).
    shapes: bool = False
    #: The costs are a session's later calls': the median of several calls, or one call after an earlier one in
    #: its trace (the ops were described to the profiler before: ``EngineSpec.profiler_event_shapes_later_us``).
    later: bool = False

    def line(self, event_us: float, plain_us: float | None = None) -> str:
        """One line: what was used, what was left out, and the profiler's own time taken out (``event_us`` a
        recorded event; ``plain_us``: the figure without ``record_shapes``, which is what the spans of a trace made
        with it show: describing an op's inputs falls inside the op's own event, not in the node's span)."""
        names = self.used if len(self.used) <= 4 else self.used[:2] + ["..."] + self.used[-1:]
        what = (f"{len(self.used)} of {self.calls} backward call{'s' if self.calls != 1 else ''} "
                f"({', '.join(names)}{'; median per node' if len(self.used) > 1 else ''})")
        left = list(self.left_out)
        if self.outside_ops:
            left.append(f"{self.outside_ops} top-level op{'s' if self.outside_ops != 1 else ''} outside the backward "
                        "(forward, optimizer, the seed gradient)")
        if self.outside_runs:
            left.append(f"{self.outside_runs} node run{'s' if self.outside_runs != 1 else ''} outside the matched calls")
        if self.fsdp_ns:
            left.append(f"FSDP's collectives inside the nodes ({self.fsdp_ns / 1e6:.2f} ms a call: "
                        "--fsdp models them)")
        if self.fsdp_final_ns:
            left.append(f"FSDP's final callback ({self.fsdp_final_ns / 1e6:.2f} ms a call: --fsdp adds it after "
                        "the compute)")
        notes = []
        if event_us and self.events:
            notes.append(f"profiler's own time taken out: {event_us:.2f} us x {self.events:.0f} events a call "
                         f"({event_us * self.events / 1e3:.2f} ms{', with record_shapes' if self.shapes else ''})")
        seen = self.event_us_seen
        ref = plain_us if self.shapes else event_us
        if seen is not None and self.events and (ref is not None or not self.shapes):
            check = f"this trace's spans show {seen:.2f} us per event" + (
                " outside the ops (the figure without record_shapes)" if self.shapes else "")
            if ref and not ref / 2 <= seen <= ref * 2:
                check += " (not the spec's figure: profiled on another machine, or with other settings?)"
            notes.append(check)
        taken = "".join("; " + n for n in notes)
        return f"{what}; left out: {', '.join(left) if left else 'nothing'}{taken}"


def load_costs(ref: str | None, graph: Graph, step: int | None = None, option: str = "costs", *,
               order=None) -> MeasuredCosts | None:
    """The measured costs ``ref`` names for ``graph`` (see the module docstring). ``order``: for a PyTorch
    profile, the graph's per-worker order (or a callable giving it), see ``profile_match.match_profile``."""
    if step is not None and step < 1:
        raise RequestError(f"step must be at least 1, got {step}", "step")
    if ref is None or ref == "analytic":
        if step is not None:
            raise RequestError("a step is picked from a PyTorch profile: give one with --costs", "step")
        return None if ref == "analytic" else stored_costs(graph)
    if ref.lower().endswith((".yaml", ".yml")):
        return _from_graph_file(ref, graph, step, option)
    if os.path.isdir(ref):
        return _from_folder(ref, graph, step, option, order)
    from autograd_run.traces.jsonfile import read_bounded
    from autograd_run.traces.torch_profile import decode_chrome, is_torch_profile, parse_torch_profile
    doc = decode_chrome(read_bounded(ref, option), ref, option)
    if doc.format is not None:
        if doc.format != FORMAT:
            raise RequestError(f"{ref}: a document of format {doc.format!r}: neither a trace nor a graph file "
                               f"({FORMAT})", option)
        return _from_graph_file(ref, graph, step, option)
    if doc.traceEvents is None:
        raise RequestError(f"{ref}: not a trace (no traceEvents) nor a graph file", option)
    if doc.autogradRun is not None:  # our own Kineto trace (written by run or simulate)
        if step is not None:
            raise RequestError(f"{ref}: --step picks a step of a PyTorch profile; this is autograd-run's own "
                               "trace", "step")
        return _matched(_from_our_kineto(doc, ref, graph, option), graph, ref, option)
    if is_torch_profile(doc):
        return from_profile(parse_torch_profile(doc, ref, option), graph, step, order)
    if step is not None:
        raise RequestError(f"{ref}: --step picks a step of a PyTorch profile; this is autograd-run's own trace",
                           "step")
    return _matched(_from_ours(doc, ref, graph, option), graph, ref, option)


#: The largest per-node engine time a simulation's Kineto trace may say it charged (``autogradRun.engine_ns``): 1 s.
MAX_ENGINE_NS = 10**9


def _matched(costs: MeasuredCosts, graph: Graph, path: str, option: str) -> MeasuredCosts:
    """An autograd-run trace's costs with how many of ``graph``'s nodes they cover (``coverage``: ``{"matched",
    "nodes", "other"}``, ``other`` the trace's node ids that are not the graph's: a trace of a graph since edited
    names nodes the graph no longer has); refused when they cover none."""
    ids = {n.id for n in graph.nodes}
    matched = sum(1 for k in costs.nodes if k in ids)
    if not matched:
        raise RequestError(f"{path}: no node of {graph.source} has a measured duration there "
                           "(a trace of another graph?)", option)
    # (the others stay: a placement's copy nodes, made after the costs are read, may be among them)
    costs.coverage = {"matched": matched, "nodes": len(ids), "other": len(costs.nodes) - matched, "trace": True}
    return costs


#: At most this many rank traces in a ``--costs`` folder (a distributed profile's files).
MAX_RANK_FILES = 1024


def trace_files(ref: str) -> list[str]:
    """The files ``--costs REF`` reads: ``REF`` itself, or a folder's trace files (``_from_folder``): inputs,
    which no output of the run may overwrite."""
    if not ref or ref == "analytic":
        return []
    if not os.path.isdir(ref):
        return [ref]
    try:
        names = os.listdir(ref)
    except OSError:  # (reading it says why)
        return [ref]
    return [ref, *(os.path.join(ref, n) for n in sorted(names) if n.lower().endswith((".json", ".json.gz")))]


def _from_folder(ref: str, graph: Graph, step, option: str, order) -> MeasuredCosts:
    """Costs from a folder of PyTorch profiler traces, one per rank (a distributed profile: ``*.json`` and
    ``*.json.gz``): each rank's backward calls matched to ``graph``, every rank's used calls pooled (medians
    per node over all of them); or of autograd-run's own rank traces (``simulate --trace DIR/``), the median
    per node over the ranks."""
    from autograd_run.traces.jsonfile import read_bounded
    from autograd_run.traces.torch_profile import decode_chrome, is_torch_profile, parse_torch_profile
    names = sorted(n for n in os.listdir(ref) if n.lower().endswith((".json", ".json.gz")))
    if not names:
        raise RequestError(f"{ref}: a folder without trace files (*.json, *.json.gz)", option)
    if len(names) > MAX_RANK_FILES:
        raise RequestError(f"{ref}: {len(names)} trace files; at most {MAX_RANK_FILES} ranks are read", option)
    traces, ours = [], []
    for name in names:
        path = os.path.join(ref, name)
        doc = decode_chrome(read_bounded(path, option), path, option)
        if doc.traceEvents is not None and doc.autogradRun is not None:  # our own rank traces (simulate)
            ours.append(_from_our_kineto(doc, path, graph, option))
            continue
        if doc.traceEvents is None or not is_torch_profile(doc):
            raise RequestError(f"{path}: not a PyTorch profiler trace (a folder's traces are one per rank)", option)
        traces.append(parse_torch_profile(doc, path, option))
    if ours and traces:
        raise RequestError(f"{ref}: holds both PyTorch profiles and autograd-run traces: one kind per folder", option)
    if ours:
        if step is not None:
            raise RequestError(f"{ref}: --step picks a step of a PyTorch profile; these are autograd-run's own "
                               "traces", "step")
        nodes = {}
        for nid in dict.fromkeys(n for c in ours for n in c.nodes):
            have = [c.nodes[nid] for c in ours if nid in c.nodes]
            streams = sorted({k for m in have for k in m.gpu_ns})
            nodes[nid] = MeasuredCost(statistics.median(m.cpu_ns for m in have),
                                      {k: statistics.median(m.gpu_ns.get(k, 0.0) for m in have) for k in streams})
        first = ours[0]
        return _matched(MeasuredCosts(nodes, OURS, ref, steps=len(ours), simulated=first.simulated,
                                      engine_ns=first.engine_ns), graph, ref, option)
    costs = from_profile(traces, graph, step, order)
    costs.path = ref
    return costs


def from_profile(trace, graph: Graph, step: int | None = None, order=None) -> MeasuredCosts:
    """Costs from a parsed PyTorch profiler trace (or a list of them, one per rank: their calls pooled),
    matched to ``graph``."""
    from autograd_run.costs.profile_match import match_profile
    traces = trace if isinstance(trace, list) else [trace]
    matched = [match_profile(graph, t, order) for t in traces]
    m, trace = matched[0], traces[0]
    steps, left, finals, firsts = [], [], [], 0
    for t, mt in zip(traces, matched):
        s, lo = _used_steps(t, mt.steps, step)
        firsts += sum(1 for x in s if x is mt.steps[0])  # a trace's first backward call: its session's first
        steps += s
        left += lo
        finals += _final_after(t, s)
    if len(traces) > 1:
        left = [f"{len(traces)} ranks pooled"] + left[:3] + ([f"... {len(left) - 3} more"] if len(left) > 3 else [])
    per: dict[str, list] = {}
    for s in steps:
        for nid, e in s.nodes.items():
            per.setdefault(nid, []).append(e)
    nodes = {}
    for nid, evs in per.items():
        streams = sorted({k for e in evs for k in e.gpu_ns})
        # FSDP's collectives called by its hooks inside a node's span are the FSDP model's (sim.fsdp), not the node's
        nodes[nid] = MeasuredCost(statistics.median(e.dur_ns - e.overhead_ns - e.fsdp_ns for e in evs),
                                  {k: statistics.median(e.gpu_ns.get(k, 0) for e in evs) for k in streams},
                                  statistics.median(e.nested - e.fsdp_events for e in evs))
    events = statistics.median(sum(e.nested - e.fsdp_events for e in s.nodes.values()) for s in steps) if steps \
        else 0.0
    fsdp = statistics.median(sum(e.fsdp_ns for e in s.nodes.values()) for s in steps) if steps else 0.0
    from autograd_run.traces.torch_profile import event_cost_in
    use = ProfileUse([s.label for s in steps], len(m.steps), left, trace.outside_ops, m.coverage.outside, events,
                     bool(steps) and all(s.first_forward for s in steps),
                     event_cost_in([e for s in steps for e in s.nodes.values()]), fsdp,
                     statistics.median(finals) if finals else 0.0,
                     any(e.shapes is not None for s in steps for e in s.nodes.values()),
                     len(steps) > 1 or (len(steps) == 1 and not firsts))
    return MeasuredCosts(nodes, PYTORCH, trace.path, m.coverage, sum(len(x.steps) for x in matched), step, use=use)


def _final_after(trace, steps: list) -> list[int]:
    """The own time of the FSDP final callback that follows each of ``steps`` (the first to start after its last
    node ends and before any later node starts), where one does."""
    calls = trace.final_callbacks
    if not calls:
        return []
    starts = [c[0] for c in calls]
    node_starts = [e.start_ns for e in trace.events]  # (by start)
    out = []
    for s in steps:
        if not s.nodes:
            continue
        end = max(e.start_ns + e.dur_ns for e in s.nodes.values())
        k = bisect.bisect_left(starts, end)
        n = bisect.bisect_left(node_starts, end)
        if k < len(calls) and (n == len(node_starts) or calls[k][0] < node_starts[n]):
            out.append(calls[k][1])
    return out


def _used_steps(trace, steps: list, step: int | None) -> tuple[list, list[str]]:
    """The calls of one trace the costs use, and what was left out."""
    if step is not None:
        if step > len(steps):
            raise RequestError(f"step {step}: {trace.path} holds {len(steps)} backward call(s) of this graph", "step")
        left = [f"{len(steps) - 1} other call{'s' if len(steps) != 2 else ''} (--step {step})"] if len(steps) > 1 else []
        return [steps[step - 1]], left
    if len(steps) > 1 and steps[0].first_forward:
        # A process's first backward runs 1.3-2.5x slower here (first allocations, kernel set-up): when the
        # trace holds later calls, they are the ones a simulation of a training step should use.
        return steps[1:], [f"{steps[0].label} (the process's first backward: one-time set-up)"]
    return steps, []


def _from_ours(doc, path: str, graph: Graph, option: str) -> MeasuredCosts:
    from autograd_run.traces.layout import SIMULATED_PROCESS_NAME, slice_node
    by_id: dict[str, list[float]] = {}
    simulated = False  # a simulation's trace: its times are the spec's it was simulated on, not a machine's
    for e in doc.traceEvents:
        if e.ph == "M" and e.name == "process_name" and isinstance(e.args, dict):
            simulated |= e.args.get("name") == SIMULATED_PROCESS_NAME
        if e.ph == "X" and e.cat == "node":
            node = slice_node(e.name, e.args) if isinstance(e.args, dict) else None
            if node is not None and e.dur >= 0 and math.isfinite(e.dur):
                by_id.setdefault(node[0], []).append(e.dur * 1000.0)
    if not by_id:
        raise RequestError(f"{path}: neither a PyTorch profiler trace nor an autograd-run trace "
                           "(no backward node events)", option)
    if not any(n.id in by_id for n in graph.nodes):
        raise RequestError(f"{path}: no node of {graph.source} has a measured duration there "
                           "(a trace of another graph?)", option)
    return MeasuredCosts({k: MeasuredCost(statistics.median(v)) for k, v in by_id.items()}, OURS, path,
                         simulated=simulated)


def _from_our_kineto(doc, path: str, graph: Graph, option: str) -> MeasuredCosts:
    """Costs from autograd-run's Kineto trace: each node's ``cpu_op`` span, and the kernels (memcpys) its
    launches started, by the engine stream their track names (``stream N cuda:D/sS``); medians over runs."""
    streams: dict[tuple, str] = {}
    for e in doc.traceEvents:
        if e.ph == "M" and e.name == "thread_name" and isinstance(e.args.get("name"), str):
            parts = e.args["name"].split(" ")
            if len(parts) == 3 and parts[0] == "stream" and "/s" in parts[2]:
                streams[(e.pid, e.tid)] = parts[2]
    cpu: dict[str, list[float]] = {}
    launched: dict[int, str] = {}  # External id of a node's cpu_op -> node id
    gpu: dict[tuple, float] = {}    # (node, external id, stream) -> kernel ns of that run
    for e in doc.traceEvents:
        if e.ph != "X" or not (e.dur >= 0 and math.isfinite(e.dur)):
            continue
        a = e.args if isinstance(e.args, dict) else {}
        if e.cat == "cpu_op" and isinstance(a.get("node"), str):
            cpu.setdefault(a["node"], []).append(e.dur * 1000.0)
            if isinstance(a.get("External id"), int):
                launched[a["External id"]] = a["node"]
        elif e.cat in ("kernel", "gpu_memcpy", "gpu_memset") and isinstance(a.get("node"), str):
            name = streams.get((e.pid, e.tid), f"cuda:{e.pid}/s0")
            key = (a["node"], a.get("External id"), name)
            gpu[key] = gpu.get(key, 0.0) + e.dur * 1000.0
    if not cpu:
        raise RequestError(f"{path}: an autograd-run Kineto trace without node spans (cpu_op with a node)", option)
    if not any(n.id in cpu for n in graph.nodes):
        raise RequestError(f"{path}: no node of {graph.source} has a measured duration there "
                           "(a trace of another graph?)", option)
    per_stream: dict[str, dict[str, list[float]]] = {}
    for (nid, _, name), ns in gpu.items():
        per_stream.setdefault(nid, {}).setdefault(name, []).append(ns)
    nodes = {nid: MeasuredCost(statistics.median(v),
                               {s: statistics.median(x) for s, x in per_stream.get(nid, {}).items()})
             for nid, v in cpu.items()}
    engine = doc.autogradRun.get("engine_ns")
    if engine is not None and not (isinstance(engine, dict) and all(
            type(engine.get(k)) is int and 0 <= engine[k] <= MAX_ENGINE_NS for k in ("node", "device_node"))):
        raise RequestError(f"{path}: at autogradRun.engine_ns: expected {{\"node\": ns, \"device_node\": ns}}, "
                           f"whole numbers from 0 to {MAX_ENGINE_NS:,} (what the simulation charged a node), got "
                           f"{tensors.short(engine)}", option)
    return MeasuredCosts(nodes, OURS, path, simulated=bool(doc.autogradRun.get("simulated")), engine_ns=engine)


def _from_graph_file(path: str, graph: Graph, step, option: str) -> MeasuredCosts:
    from autograd_run.graphs.load import load_graph
    other = load_graph(path)
    if step is not None:
        raise RequestError(f"{path}: a graph file's stored costs are already one figure per node", "step")
    got = stored_costs(other)
    if got is None:
        raise RequestError(f"{path}: a graph file without measured costs (capture it with --profile)", option)
    if not any(n.id in got.nodes for n in graph.nodes):
        raise RequestError(f"{path}: its measured costs name no node of {graph.source}", option)
    return got


# -- stored in the graph file (meta.measured) -------------------------------------------------

def stored_costs(graph: Graph) -> MeasuredCosts | None:
    """``meta.measured`` of ``graph`` (written by ``capture --profile``), checked; None when absent."""
    block = graph.meta.get("measured") if isinstance(graph.meta, dict) else None
    if block is None:
        return None

    def bad(where: str, what: str):
        return GraphFileError(graph.source, f"meta.measured{where}", what)
    if not isinstance(block, dict) or not isinstance(block.get("nodes"), dict):
        raise bad("", "expected a mapping with 'nodes' (node id -> {cpu_ns, gpu_ns, nested})")
    nodes = {}
    for nid, rec in block["nodes"].items():
        where = f".nodes[{nid!r}]"
        if nid not in graph.by_id:
            raise bad(where, f"no node {nid!r} in the graph")
        if not isinstance(rec, dict):
            raise bad(where, "expected a mapping {cpu_ns, gpu_ns, nested}")
        extra = sorted(set(rec) - {"cpu_ns", "gpu_ns", "nested"})
        if extra:
            raise bad(f"{where}.{extra[0]}", "unknown field")
        cpu = _number(rec.get("cpu_ns"), bad, f"{where}.cpu_ns")
        nested = _number(rec.get("nested", 0), bad, f"{where}.nested", "number of events")
        gpu = rec.get("gpu_ns", {})
        if not isinstance(gpu, dict):
            raise bad(f"{where}.gpu_ns", "expected a mapping stream -> ns")
        nodes[nid] = MeasuredCost(cpu, {str(k): _number(v, bad, f"{where}.gpu_ns[{k!r}]") for k, v in gpu.items()},
                                  nested)
    wall = block.get("backward_wall_ns")
    if wall is not None:  # written by capture --profile; shown in the summary
        if not isinstance(wall, dict) or "median" not in wall:
            raise bad(".backward_wall_ns", "expected a mapping {median, runs, thread_cpu_median}")
        for k in ("median", "thread_cpu_median"):
            if k in wall:
                _number(wall[k], bad, f".backward_wall_ns.{k}")
        for k in ("faults_median", "profiled_faults_median"):
            if k in wall:
                _number(wall[k], bad, f".backward_wall_ns.{k}", "number of page faults")
        runs = wall.get("runs", 1)
        if type(runs) is not int or not 1 <= runs <= 10**9:
            raise bad(".backward_wall_ns.runs", f"expected a number of runs from 1, got {tensors.short(runs)}")
    cov = block.get("coverage")
    if cov is not None:
        if not isinstance(cov, dict):
            raise bad(".coverage", "expected a mapping")
        for k in ("nodes", "matched"):
            if k in cov and (type(cov[k]) is not int or cov[k] < 0):
                raise bad(f".coverage.{k}", f"expected a number of nodes, got {tensors.short(cov[k])}")
    info = {k: block[k] for k in ("source", "torch", "device", "date", "steps", "warmup", "backward_wall_ns")
            if k in block}
    origin = OURS if block.get("source") == "autograd-run" else PYTORCH
    steps = block.get("steps")
    return MeasuredCosts(nodes, origin, graph.source, block.get("coverage"),
                         steps if isinstance(steps, int) and steps > 0 else 1, None, info)


def _number(v, bad, where: str, what: str = "number of ns") -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v > 1e15:
        raise bad(where, f"expected a non-negative {what}, got {v!r}")
    return float(v)


def to_meta(costs: MeasuredCosts, **info) -> dict:
    """The ``meta.measured`` block for ``costs`` (``info``: torch, device, date, steps, warmup, ...)."""
    nodes = {}
    for nid, c in costs.nodes.items():
        rec: dict[str, Any] = {"cpu_ns": int(round(c.cpu_ns))}
        if c.gpu_ns:
            rec["gpu_ns"] = {k: int(round(v)) for k, v in c.gpu_ns.items()}
        if c.nested:
            rec["nested"] = c.nested
        nodes[nid] = rec
    out: dict[str, Any] = {"source": "torch.profiler" if costs.from_pytorch else "autograd-run", **info}
    out["steps"] = costs.steps
    if costs.coverage is not None and hasattr(costs.coverage, "to_dict"):
        cov = costs.coverage.to_dict()
        cov.pop("trace", None)
        out["coverage"] = cov
    out["nodes"] = nodes
    return out
