"""One run of a graph as a library call: ``run_session(graph, options) -> RunReport``.

The command line's ``run``, the benchmarks, the tests and the Python API
all run graphs through here. A session:

1. checks the request against the graph (requested inputs, injected
   faults, output paths: an output may never overwrite an input, and a
   bad path is reported before any work is done);
2. assembles the tracers it needs (the profiler ``Recorder`` when a
   summary or trace is wanted, the ``OrderRecorder`` when an order is
   written or compared, and any the caller passes, e.g. a progress hook)
   behind one ``Tracers`` fan-out;
3. runs ``repeat`` backward passes, each on a fresh ``GraphState`` whose
   saved tensors are materialised before the pass (as after a forward);
   with measured costs, opaque nodes take their measured time;
4. writes the trace and the order file, and compares the order with a
   golden one.

It raises ``RequestError`` (naming the request field, not a command-line
flag) for a request that cannot be carried out; a failing backward pass is
not raised but reported in ``RunReport.error``.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

from autograd_run.engine import DeviceSet, Engine, GraphState
from autograd_run.engine.run import RunResult, root_gradients, run_graph
from autograd_run.engine.tracer import Tracer, Tracers
from autograd_run.errors import BackwardError, RequestError, RunInterrupted
from autograd_run.graphs.load import gc_paused
from autograd_run.graphs.model import Graph
from autograd_run.graphs.validate import MAX_COST_US
from autograd_run.ops import ACCUMULATE_GRAD, OPAQUE
from autograd_run.outputs import check_output_path
from autograd_run.stopping import INTERRUPTED, TIMEOUT, RunStop, Watchdog
from autograd_run.traces.order import Divergence, compare_orders, write_order
from autograd_run.record.order_recorder import OrderRecorder
from autograd_run.record.recorder import Recorder
from autograd_run.record.recording import Recording
from autograd_run.analysis.samples import Samples, pass_samples
from autograd_run.analysis.summary import Summary, SummaryBuilder, summarize
from autograd_run.analysis.memory import Memory, memory_of


@dataclass
class RunOptions:
    #: ``backward`` or ``grad``; None: as the graph file says.
    mode: str | None = None
    #: Variable names or node ids to take gradients for; None: as the graph file says.
    inputs: Sequence[str] | None = None
    retain_graph: bool = False
    create_graph: bool = False
    #: ``grad()``: an input the graph does not reach gets None instead of PyTorch's error.
    allow_unused: bool = False
    #: False: every node runs on the calling thread (``set_multithreading_enabled(False)``).
    multithreading: bool = True
    #: ``auto`` | ``virtual`` | ``cuda`` (see ``engine.devices``).
    devices: str = "auto"
    anomaly: bool = False
    #: Node ids made to raise, or to return NaN gradients.
    inject_error: Sequence[str] = ()
    inject_nan: Sequence[str] = ()
    repeat: int = 1
    #: Offset of every random tensor's seed (another reproducible draw); None: the file's seeds.
    seed: int | None = None
    allow_python: bool = False
    #: Record the profile (summary, trace). A trace path implies it.
    profile: bool = True
    #: Record the executed order (``RunReport.order``). An order file or a golden order implies it.
    record_order: bool = False
    #: Keep, in each order row, the ready set (with priority keys) at the pop that chose the node.
    order_ready: bool = False
    #: Golden order rows to compare with (``traces.order.read_order``).
    expected_order: list[dict] | None = None
    #: Where the golden order came from (an input: never overwritten).
    expected_order_path: str | None = None
    trace_path: str | None = None
    #: The trace's format (``traces.trace_file.FORMAT_NAMES``); None or ``auto``: from the path's ending.
    trace_format: str | None = None
    order_out: str | None = None
    #: More tracers (e.g. a progress hook), called after the built-in ones.
    tracers: Sequence[Tracer] = ()
    #: Measured costs (``sim.session.read_costs``: a PyTorch profile, a trace, a graph file with measured
    #: costs): each ``opaque`` node (an op without a rule here) takes its measured time when it runs, so a
    #: replay of a captured model spends what PyTorch spent there. Nodes with rules run their own formula.
    costs: str | None = None
    #: With a PyTorch profile: its N-th backward call of this graph instead of the median.
    costs_step: int | None = None
    #: Keep every pass's samples (``analysis.samples``: what ``diff`` compares) when the passes are folded
    #: into the summary one by one (``--repeat`` without a trace): memory then grows with passes x nodes.
    samples: bool = False
    #: Seconds the whole run (every pass) may take; then it is stopped as by ``stop``. None: no limit.
    timeout: float | None = None
    #: A handle to stop the run from outside (``stopping.RunStop``; Ctrl-C in the command line).
    stop: RunStop | None = None
    #: Keep every pass's events in ``RunReport.recording``. Without a trace to write, a run of several
    #: passes folds each pass into the summary and drops its events (memory stays flat with ``repeat``);
    #: the report's recording is then the last pass's. None: keep them when a trace is written.
    keep_recording: bool | None = None
    #: Bytes per device the pass must fit in: ``RunReport.memory.over_limit`` names the first node past it.
    memory_limit: int | None = None
    #: A trace gets each device's allocated bytes as counter tracks (``analysis.memory``).
    memory_trace: bool = True
    #: Write the pass's memory as a snapshot PyTorch's MemoryViz opens (``traces.memory_snapshot``; needs
    #: ``memory_trace``).
    memory_snapshot: str | None = None


@dataclass
class RunReport:
    graph: Graph
    options: RunOptions
    devices: DeviceSet
    #: The last pass's gradients (None when a pass failed before finishing).
    result: RunResult | None = None
    #: The failing pass's error (its node named), or None.
    error: BackwardError | None = None
    recording: Recording | None = None
    #: Order rows (``traces.order``) when the order was recorded.
    order: list[dict] | None = None
    #: The first difference from the golden order, when one was given.
    divergence: Divergence | None = None
    #: Whether the order was compared per worker thread.
    per_worker: bool = False
    #: Seconds: ``backward`` (all passes), ``trace`` and ``order`` (writing them).
    timings: dict[str, float] = field(default_factory=dict)
    #: The measured costs given (``RunOptions.costs``) and the opaque node ids that took their measured time.
    measured: object = None
    measured_applied: list[str] = field(default_factory=list)
    #: Why the run was stopped before it finished (``interrupted``, ``timeout``), or None.
    #: Its recording, trace and order then hold what ran, and the files are marked incomplete.
    interrupted: str | None = None
    #: Passes that ran to completion.
    passes_done: int = 0
    #: Lines for the user about the outputs (a very large plain JSON trace), shown on stderr by the CLI.
    warnings: list[str] = field(default_factory=list)
    _summary: Summary | None = None
    _samples: Samples | None = None
    _folded: bool = False
    _memory: Memory | None = None

    @property
    def memory(self) -> Memory | None:
        """The pass's memory per device (``analysis.memory``) over its recording; None without a recording,
        or when the pass failed or was stopped."""
        if self._memory is None and self.recording is not None and not self.recording.empty \
                and self.error is None and self.interrupted is None:
            self._memory = memory_of(self.graph, self.recording, retain_graph=self.options.retain_graph,
                                     limit=self.options.memory_limit, events=bool(self.options.memory_snapshot))
        return self._memory

    @property
    def samples(self) -> Samples | None:
        """Per-pass samples (``analysis.samples``); None when the passes were folded without keeping them."""
        if self._samples is None and self.recording is not None and not self._folded:
            self._samples = pass_samples(self.recording)
        return self._samples

    @property
    def summary(self) -> Summary:
        if self._summary is None:
            self._summary = summarize(self.recording) if self.recording is not None else Summary()
        return self._summary


def faults_of(graph: Graph, inject_error: Sequence[str], inject_nan: Sequence[str]) -> dict[str, str]:
    """The fault map (node id -> ``error``/``nan``); refuses unknown ids and faults that cannot apply."""
    faults: dict[str, str] = {}
    for nid in inject_error:
        if nid not in graph.by_id:
            raise RequestError(f"no node {nid!r} in {graph.source}", "inject_error")
        faults[nid] = "error"
    for nid in inject_nan:
        node = graph.by_id.get(nid)
        if node is None:
            raise RequestError(f"no node {nid!r} in {graph.source}", "inject_nan")
        if faults.get(nid) == "error":
            raise RequestError(f"node {nid!r} cannot both raise and return NaN", "inject_nan")
        if node.op is ACCUMULATE_GRAD:
            raise RequestError(f"node {nid!r} is an AccumulateGrad node: it returns no gradient to make NaN",
                               "inject_nan")
        faults[nid] = "nan"
    return faults


def _check_request(graph: Graph, o: RunOptions) -> None:
    if o.repeat < 1:
        raise RequestError("repeat must be at least 1", "repeat")
    if o.timeout is not None and not o.timeout > 0:  # NaN too: it compares false
        raise RequestError(f"a time limit is a number of seconds, more than 0, not {o.timeout!r}", "timeout")
    if o.inputs is not None:
        bad = [n for n in o.inputs if n not in graph.variables and n not in graph.by_id]
        if not o.inputs:
            raise RequestError("no inputs given", "inputs")
        if bad:
            raise RequestError(f"{bad[0]!r} is neither a variable nor a node id of {graph.source}", "inputs")
    mode = o.mode or graph.mode
    if mode == "grad" and not (o.inputs if o.inputs is not None else graph.inputs):
        raise RequestError("`inputs` argument to `grad()` cannot be empty.", "inputs")
    if o.allow_unused and mode != "grad":
        raise RequestError(f"applies to grad() only (--grad, or a graph file in grad mode); {graph.source} runs "
                           "backward(), where an input the graph does not reach is no error", "allow_unused")
    inputs = [*graph.files(), o.expected_order_path or "", o.costs or ""]
    for path, option in ((o.trace_path, "trace_path"), (o.order_out, "order_out")):
        if path:
            check_output_path(path, option, inputs)
    if o.trace_path and o.order_out and os.path.abspath(o.trace_path) == os.path.abspath(o.order_out):
        raise RequestError(f"{o.order_out}: the trace is written there already", "order_out")
    if o.memory_snapshot:
        if not o.memory_trace:
            raise RequestError("a memory snapshot needs the memory model (memory_trace)", "memory_snapshot")
        from autograd_run.traces.memory_snapshot import check_path
        check_path(o.memory_snapshot, inputs, (o.trace_path, o.order_out))


def _opaque_times(graph: Graph, o: RunOptions) -> tuple[dict, object]:
    """The measured time of each opaque node (``RunOptions.costs``), and the costs read."""
    if o.costs is None:
        if o.costs_step is not None:
            raise RequestError("a step is picked from measured costs: give them too", "step")
        return {}, None
    from autograd_run.sim.session import read_costs
    measured = read_costs(o.costs, graph, o.costs_step)
    out = {}
    for n in graph.nodes:
        m = measured.nodes.get(n.id) if measured is not None else None
        if m is not None and n.op is OPAQUE and "cost" not in n.attrs:
            if m.cpu_ns > MAX_COST_US * 1000:  # the run waits this long: bounded as a file's attrs.cost is
                raise RequestError(f"{o.costs}: node {n.id!r} took {m.cpu_ns / 1e9:.4g} s there, more than the "
                                   f"{MAX_COST_US / 1e6:g} s a run waits for one opaque node", "costs")
            out[n] = m.cpu_ns
    return out, measured


def run_session(graph: Graph, options: RunOptions | None = None) -> RunReport:
    """Run ``graph`` as ``options`` say; see the module docstring."""
    o = options or RunOptions()
    _check_request(graph, o)
    faults = faults_of(graph, o.inject_error, o.inject_nan)
    measured_ns, measured = _opaque_times(graph, o)
    if o.seed is not None:
        graph.side_files.seed_offset = o.seed
    profile = o.profile or bool(o.trace_path)
    want_order = o.record_order or o.order_ready or bool(o.order_out) or o.expected_order is not None
    recorder = Recorder() if profile else None
    order = OrderRecorder(snapshots=o.expected_order is not None or o.order_ready) if want_order else None
    tracer = Tracers(recorder, order, *o.tracers)
    devices = DeviceSet(o.devices, needed=graph.max_device_index + 1)
    report = RunReport(graph, o, devices)
    report.measured, report.measured_applied = measured, sorted(n.id for n in measured_ns)
    engine = Engine(devices, tracer=tracer if tracer.enabled else None, multithreading=o.multithreading,
                    allow_python=o.allow_python)
    stopper = o.stop if o.stop is not None else (RunStop() if o.timeout is not None else None)
    keep = o.keep_recording if o.keep_recording is not None else (bool(o.trace_path) or o.repeat == 1)
    if o.trace_path and not keep:
        raise RequestError("a trace needs every pass's events: keep_recording cannot be False", "trace_path")
    builder = SummaryBuilder() if recorder is not None and not keep else None
    fold = _folder(report, recorder, builder, o.samples) if builder is not None else None
    try:
        if stopper is None:
            _run_passes(engine, graph, o, faults, report, None, fold, measured_ns)
        else:
            def stop(reason: str) -> None:
                engine.interrupt(RunInterrupted(reason, _stop_message(reason, o.timeout)))
            with Watchdog(stopper, o.timeout, stop):
                _run_passes(engine, graph, o, faults, report, stopper, fold, measured_ns)
    finally:
        engine.shutdown(timeout=5)
        if stopper is not None and o.stop is None:
            stopper.close()
    if builder is not None:
        fold()  # what the workers recorded after the last pass's end
        report._summary = builder.summary()
    elif recorder is not None:
        # The last pass's state (saved values, released nodes) goes before the recording is made: a
        # GraphTask that failed holds it in a cycle (the nodes' context refers back to the task), young
        # since the collector was paused for the run, so a collection of the youngest generation frees
        # it once the event log has let go of the task. A run that ended well left no such cycle (its
        # state went with its last reference): no collection then (it walked every object the run made).
        recorder.flush()
        if report.error is not None or report.interrupted is not None:
            gc.collect(0)
        report.recording = recorder.drain()  # nothing of it kept in the recorder: the run's last read
    if o.trace_path:
        from autograd_run.traces.trace_file import write_trace
        t = time.perf_counter()
        if o.memory_trace and report.memory is not None:  # the counter tracks of each device's allocated bytes
            report.recording.counters.extend(report.memory.counters())
        warning = write_trace(o.trace_path, report.recording, incomplete=report.interrupted, fmt=o.trace_format)
        if warning:
            report.warnings.append(warning)
        report.timings["trace"] = time.perf_counter() - t
    if o.memory_snapshot and report.memory is not None:  # (none for a pass that failed or was stopped)
        from autograd_run.traces.memory_snapshot import write as write_snapshot
        write_snapshot(o.memory_snapshot, report.memory, graph.source)
    if order is not None:
        report.order = order.rows()
        if o.order_out:
            t = time.perf_counter()
            write_order(o.order_out, report.order, incomplete=report.interrupted)
            report.timings["order"] = time.perf_counter() - t
        if o.expected_order is not None and report.error is None:
            threads = {r["thread"] for r in report.order}
            report.per_worker = o.multithreading and len(threads) > 1
            report.divergence = compare_orders(o.expected_order, report.order, report.per_worker)
    return report


def _folder(report: RunReport, recorder: Recorder, builder: SummaryBuilder, samples: bool):
    """What folds the events recorded since the last call into the summary (and the samples)."""
    report._folded = True
    if samples:
        report._samples = Samples()

    def fold() -> None:
        rec = _last(report, recorder.drain())
        builder.add(rec)
        if report._samples is not None and rec.graph_tasks:
            report._samples.extend(pass_samples(rec))
    return fold


def _last(report: RunReport, rec: Recording) -> Recording:
    """Keep ``rec`` as the report's recording when it holds a backward call (not only trailing events)."""
    if rec.graph_tasks:
        report.recording = rec
    return rec


def _run_passes(engine: Engine, graph: Graph, o: RunOptions, faults: dict, report: RunReport,
                stopper: RunStop | None, fold=None, measured_ns=None) -> None:
    """The timed passes; a failing pass ends them (``report.error``), so does a stop request. ``fold``,
    when given, is called after each pass (outside the clock) to fold its events into the summary."""
    inputs = list(o.inputs) if o.inputs is not None else None
    elapsed = 0.0
    try:
        # Set-up is not part of the backward call: device threads (and BLAS limits) start before the clock.
        engine.start_device_threads(graph.max_device_index + 1)
        for _ in range(o.repeat):
            if stopper is not None and stopper.requested:
                raise RunInterrupted(stopper.reason, _stop_message(stopper.reason, o.timeout))
            # The collector stays off for the pass's state's whole life (the engine pauses it for the
            # backward call alone): its saved values and buffers, made before the call, are freed by
            # reference counting at the end of the pass, never scanned by a collection of the young
            # generation in between (on a 2e5-node MLP: two scans of ~1e6 objects, 0.3 us/node).
            ran = False
            try:
                with gc_paused():
                    state = GraphState(graph)
                    state.measured_ns = measured_ns
                    state.prepare()  # saved tensors exist before the timed backward, as after a forward
                    grads = root_gradients(graph)
                    ran = True
                    t = time.perf_counter()
                    try:
                        report.result = run_graph(engine, graph, state, mode=o.mode, inputs=inputs,
                                                  retain_graph=o.retain_graph or None, create_graph=o.create_graph,
                                                  anomaly=o.anomaly, faults=faults, grads=grads,
                                                  allow_unused=o.allow_unused)
                    finally:
                        elapsed += time.perf_counter() - t
                        state = grads = None
            finally:
                if ran and fold is not None:
                    fold()
            report.passes_done += 1
    except RunInterrupted as exc:
        report.error, report.result, report.interrupted = exc, None, exc.reason
    except KeyboardInterrupt:  # a second Ctrl-C, or a library caller's own: stop here, keep what was recorded
        # From another thread, with a bound: the interrupt may have left a lock of this thread's held.
        t = threading.Thread(target=engine.interrupt, args=(RunInterrupted(INTERRUPTED),), daemon=True)
        t.start()
        t.join(1.0)
        report.error, report.result, report.interrupted = RunInterrupted(INTERRUPTED), None, INTERRUPTED
    except BackwardError as exc:
        report.error = exc
        report.result = None
    report.timings["backward"] = elapsed


def _stop_message(reason: str, timeout: float | None) -> str:
    if reason == TIMEOUT:
        return f"the run took longer than its time limit of {timeout:g} s and was stopped"
    return "the run was interrupted"
