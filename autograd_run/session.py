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
4. writes the trace and the order file, and compares the order with a
   golden one.

It raises ``RequestError`` (naming the request field, not a command-line
flag) for a request that cannot be carried out; a failing backward pass is
not raised but reported in ``RunReport.error``.
"""

from __future__ import annotations

import gc
import glob
import os
import time
from dataclasses import dataclass, field
from typing import Sequence

from autograd_run.engine import DeviceSet, Engine, GraphState
from autograd_run.engine.run import RunResult, run_graph
from autograd_run.engine.tracer import Tracer, Tracers
from autograd_run.errors import BackwardError, RequestError
from autograd_run.graphs.model import Graph
from autograd_run.ops import ACCUMULATE_GRAD
from autograd_run.outputs import check_output_path
from autograd_run.traces.order import Divergence, compare_orders, write_order
from autograd_run.traces.order_recorder import OrderRecorder
from autograd_run.traces.recorder import Recorder
from autograd_run.traces.recording import Recording
from autograd_run.traces.summary import Summary, summarize


@dataclass
class RunOptions:
    #: ``backward`` or ``grad``; None: as the graph file says.
    mode: str | None = None
    #: Variable names or node ids to take gradients for; None: as the graph file says.
    inputs: Sequence[str] | None = None
    retain_graph: bool = False
    create_graph: bool = False
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
    #: Golden order rows to compare with (``traces.order.read_order``).
    expected_order: list[dict] | None = None
    #: Where the golden order came from (an input: never overwritten).
    expected_order_path: str | None = None
    trace_path: str | None = None
    order_out: str | None = None
    #: More tracers (e.g. a progress hook), called after the built-in ones.
    tracers: Sequence[Tracer] = ()


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
    _summary: Summary | None = None

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
    if o.inputs is not None:
        bad = [n for n in o.inputs if n not in graph.variables and n not in graph.by_id]
        if not o.inputs:
            raise RequestError("no inputs given", "inputs")
        if bad:
            raise RequestError(f"{bad[0]!r} is neither a variable nor a node id of {graph.source}", "inputs")
    mode = o.mode or graph.mode
    if mode == "grad" and not (o.inputs if o.inputs is not None else graph.inputs):
        raise RequestError("`inputs` argument to `grad()` cannot be empty.", "inputs")
    inputs = [graph.source, o.expected_order_path or "", *_side_file_paths(graph)]
    for path, option in ((o.trace_path, "trace_path"), (o.order_out, "order_out")):
        if path:
            check_output_path(path, option, inputs)
    if o.trace_path and o.order_out and os.path.abspath(o.trace_path) == os.path.abspath(o.order_out):
        raise RequestError(f"{o.order_out}: the trace is written there already", "order_out")


def _side_file_paths(graph: Graph) -> list[str]:
    """The ``.npz`` files beside the graph (the ones it reads are among them: never overwritten)."""
    side = graph.side_files
    if side is None or side.base_dir is None:
        return []
    return glob.glob(os.path.join(glob.escape(side.base_dir), "*.npz"))


def run_session(graph: Graph, options: RunOptions | None = None) -> RunReport:
    """Run ``graph`` as ``options`` say; see the module docstring."""
    o = options or RunOptions()
    _check_request(graph, o)
    faults = faults_of(graph, o.inject_error, o.inject_nan)
    if o.seed is not None:
        graph.side_files.seed_offset = o.seed
    profile = o.profile or bool(o.trace_path)
    want_order = o.record_order or bool(o.order_out) or o.expected_order is not None
    recorder = Recorder() if profile else None
    order = OrderRecorder(snapshots=o.expected_order is not None) if want_order else None
    tracer = Tracers(recorder, order, *o.tracers)
    devices = DeviceSet(o.devices)
    report = RunReport(graph, o, devices)
    engine = Engine(devices, tracer=tracer if tracer.enabled else None, multithreading=o.multithreading,
                    allow_python=o.allow_python)
    inputs = list(o.inputs) if o.inputs is not None else None
    elapsed = 0.0
    try:
        for _ in range(o.repeat):
            state = GraphState(graph)
            state.prepare()  # saved tensors exist before the timed backward, as after a forward
            t = time.perf_counter()
            try:
                report.result = run_graph(engine, graph, state, mode=o.mode, inputs=inputs,
                                          retain_graph=o.retain_graph or None, create_graph=o.create_graph,
                                          anomaly=o.anomaly, faults=faults)
            finally:
                elapsed += time.perf_counter() - t
    except BackwardError as exc:
        report.error = exc
        report.result = None
    finally:
        engine.shutdown(timeout=5)
    report.timings["backward"] = elapsed
    # The last pass's state (saved values, released nodes) goes before the recording is made: its
    # GraphTask holds it in a cycle (the nodes' context refers back to the task), young since the
    # collector was paused for the run, so a collection of the youngest generation frees it once the
    # event log has let go of the task.
    state = None
    if recorder is not None:
        recorder.flush()
    gc.collect(0)
    if recorder is not None:
        report.recording = recorder.take_recording()
    if o.trace_path:
        from autograd_run.traces.trace_file import write_trace
        t = time.perf_counter()
        write_trace(o.trace_path, report.recording)
        report.timings["trace"] = time.perf_counter() - t
    if order is not None:
        report.order = order.rows()
        if o.order_out:
            t = time.perf_counter()
            write_order(o.order_out, report.order)
            report.timings["order"] = time.perf_counter() - t
        if o.expected_order is not None and report.error is None:
            threads = {r["thread"] for r in report.order}
            report.per_worker = o.multithreading and len(threads) > 1
            report.divergence = compare_orders(o.expected_order, report.order, report.per_worker)
    return report
