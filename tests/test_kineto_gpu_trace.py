"""The kernel-join path, on a small hand-written trace shaped like Kineto's (no GPU here to record one).

The fields this relies on, as PyTorch 2.x / Kineto write them:

* backward runs: ``"ph": "X"``, ``"cat": "cpu_op"``, ``name``
  ``autograd::engine::evaluate_function: NAME`` with ``args`` ``"Sequence number"``,
  ``"Fwd thread id"``, ``"External id"``; the node's own ``NAME`` event nested
  inside; AccumulateGrad without a sequence number (``"Input Dims"`` on its own
  event with ``record_shapes``);
* the op that launches a kernel (``cpu_op``, its ``"External id"``), nested in a run;
* the runtime call (``"cat": "cuda_runtime"``, e.g. ``cudaLaunchKernel``) on the
  launching thread, ``args`` ``"correlation"`` and ``"External id"``;
* the GPU activity (``"cat"`` ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``; ``pid`` the
  device, ``tid`` the stream; ``args`` ``"device"``, ``"stream"``, ``"correlation"`` and,
  when Kineto linked it to a CPU op, ``"External id"``);
* ``ac2g`` flow events (``"ph": "s"``/``"f"``, ``id`` = correlation) joining the two, which
  the reader does not need (the ``args`` carry the same ids).
"""

import gzip
import json
import os

import pytest

from autograd_run.errors import RequestError
from autograd_run.graphs.load import loads_graph
from autograd_run.sim.session import read_costs
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.sim.specs import DeviceSpec, EngineSpec, MachineSpec
from autograd_run.traces.torch_profile import read_torch_profile

CPU, DEV = (100, 100), (100, 200)  # the caller thread, the device thread (pt_autograd_0)


def op(name, ts, dur, thread=DEV, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": thread[0], "tid": thread[1], "ts": ts, "dur": dur,
            "args": args}


def kernel(name, ts, dur, stream, corr, ext=None, cat="kernel"):
    args = {"device": 0, "stream": stream, "correlation": corr}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def flow(corr, ts, start, thread):
    return {"ph": "s" if start else "f", "id": corr, "pid": thread[0], "tid": thread[1], "ts": ts, "cat": "ac2g",
            "name": "ac2g", **({} if start else {"bp": "e"})}


def backward(name, seq, ts, dur, ext):
    meta = {"Sequence number": seq, "Fwd thread id": 1} if seq is not None else {}
    return [op(f"autograd::engine::evaluate_function: {name}", ts, dur, **{"External id": ext, **meta}),
            op(name, ts + 1, dur - 2, **{"External id": ext + 1, **meta})]


def gpu_trace() -> dict:
    ev = [
        # the forward: a kernel launched outside any backward node (not a node's cost)
        op("aten::neg", 10, 5, CPU, **{"External id": 1}),
        op("cudaLaunchKernel", 11, 2, CPU, cat="cuda_runtime", **{"External id": 1, "correlation": 1001}),
        kernel("neg_fwd", 20, 3, 7, 1001, ext=1),
        # NegBackward0 (seq 111): joined through External id 12
        *backward("NegBackward0", 111, 100, 30, 10),
        op("aten::neg", 102, 20, **{"External id": 12}),
        op("cudaLaunchKernel", 103, 4, cat="cuda_runtime", **{"External id": 12, "correlation": 2001}),
        kernel("neg_kernel", 140, 8, 7, 2001, ext=12), flow(2001, 103, True, DEV), flow(2001, 140, False, (0, 7)),
        # NegBackward0 (seq 110): a kernel without External id (joined through its runtime call) and a copy
        *backward("NegBackward0", 110, 200, 30, 20),
        op("aten::neg", 202, 20, **{"External id": 22}),
        op("cudaLaunchKernel", 203, 4, cat="cuda_runtime", **{"correlation": 2002}),
        op("cudaMemcpyAsync", 208, 3, cat="cuda_runtime", **{"External id": 22, "correlation": 2003}),
        kernel("neg_kernel", 240, 6, 7, 2002),
        kernel("Memcpy DtoD (Device -> Device)", 250, 2, 9, 2003, ext=22, cat="gpu_memcpy"),
        # AccumulateGrad: no sequence number; its add_ kernel
        op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 300, 10, **{"External id": 30}),
        op("torch::autograd::AccumulateGrad", 301, 8, **{"External id": 31, "Input Dims": [[4]]}),
        op("aten::add_", 302, 5, **{"External id": 32}),
        op("cudaLaunchKernel", 303, 2, cat="cuda_runtime", **{"External id": 32, "correlation": 2004}),
        kernel("add_kernel", 320, 1, 7, 2004, ext=32),
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Hand-written GPU"}], "traceEvents": ev}


def graph():
    doc = {"format": "autograd-graph/1", "roots": [{"node": "n0"}],
           "variables": [{"name": "x", "shape": [4], "device": "cuda:0"}],
           "nodes": [
               {"id": "n0", "name": "NegBackward0", "seq": 11, "fwd_thread": 1, "next": [["n1", 0]],
                "inputs": [{"shape": [4], "device": "cuda:0"}]},
               {"id": "n1", "name": "NegBackward0", "seq": 10, "fwd_thread": 1, "next": [["acc", 0]],
                "inputs": [{"shape": [4], "device": "cuda:0"}]},
               {"id": "acc", "name": "torch::autograd::AccumulateGrad", "variable": "x",
                "inputs": [{"shape": [4], "device": "cuda:0"}]}]}
    return loads_graph(json.dumps(doc).encode(), "gpu.json")


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "gpu-trace.json"
    p.write_text(json.dumps(gpu_trace()))
    return str(p)


def test_kernels_join_their_backward_node_by_external_id_or_correlation(trace_file):
    t = read_torch_profile(trace_file)
    assert t.gpus == ["Hand-written GPU"]
    assert t.gpu_activities == 5 and t.gpu_attributed == 4  # the forward's kernel belongs to no node
    runs = {(e.name, e.seq): e for e in t.events}
    assert runs[("NegBackward0", 111)].gpu_ns == {"cuda:0/s7": 8000}
    assert runs[("NegBackward0", 110)].gpu_ns == {"cuda:0/s7": 6000, "cuda:0/s9": 2000}
    assert runs[("torch::autograd::AccumulateGrad", None)].gpu_ns == {"cuda:0/s7": 1000}
    assert runs[("torch::autograd::AccumulateGrad", None)].shapes == [[4]]
    # Recorded events inside: its own and the op (runtime calls come from CUPTI, not RecordFunction).
    assert runs[("NegBackward0", 111)].nested == 2


def test_gpu_costs_reach_the_simulation_on_their_own_tracks(trace_file):
    g = graph()
    costs = read_costs(trace_file, g)
    cov = costs.coverage
    assert cov.matched_count == 3 and cov.methods == {"sequence": 2, "leaf shape": 1}
    assert cov.alignment() == ["graph forward thread 1 -> trace forward thread 1: sequence offset +100 (1 call)"]
    assert costs.nodes["n0"].cpu_ns == 30000 and costs.nodes["n0"].gpu_ns == {"cuda:0/s7": 8000}
    assert costs.nodes["n1"].gpu_total == 8000
    host = DeviceSpec("host", {"float32": 1e12}, 1e12, 1.0, 1.0, min_kernel_us=1.0)
    acc = DeviceSpec("acc", {"float32": 1e15}, 1e15, 1.0, 1.0, min_kernel_us=1.0, launch_us=2.0)
    spec = MachineSpec("t", host, acc, EngineSpec(node_overhead_us=1.0, handoff_us=10.0))
    r = simulate_session(g, SimOptions(spec=spec, costs=trace_file, slack_top=0))
    assert r.cost_sources == {"measured": 3}
    kernels = {k.node.id: k.end - k.start for k in r.recording.kernels}
    assert kernels == {"n0": 8000, "n1": 8000, "acc": 1000}
    cpu = {s.node.id: s.end - s.start for s in r.recording.slices}
    assert cpu == {"n0": 31000, "n1": 31000, "acc": 11000}  # overhead + the evaluate_function span


# -- real traces recorded on an H200 (tests/support/kineto_h200/README.md) --------------------------------------
H200 = os.path.join(os.path.dirname(__file__), "support", "kineto_h200")


def _raw(name: str) -> list[dict]:
    with gzip.open(os.path.join(H200, name), "rt") as f:
        return json.load(f)["traceEvents"]


def test_a_real_h200_trace_joins_every_kernel_to_the_node_that_launched_it():
    raw = _raw("mlp_backward.json.gz")
    t = read_torch_profile(os.path.join(H200, "mlp_backward.json.gz"))
    kernels = [e for e in raw if e.get("cat") == "kernel"]
    assert len(t.events) == 21 and t.gpu_activities == len(kernels) == t.gpu_attributed
    assert sum(sum(e.gpu_ns.values()) for e in t.events) == sum(round(k["dur"] * 1000) for k in kernels)
    assert {k for e in t.events for k in e.gpu_ns} == {"cuda:0/s7"}  # the default stream, as CUPTI numbers it


def test_the_profilers_own_buffer_request_is_not_the_first_nodes_cost():
    raw = _raw("mlp_backward.json.gz")
    (buf,) = [e for e in raw if e.get("cat") == "overhead"]
    t = read_torch_profile(os.path.join(H200, "mlp_backward.json.gz"))
    first = t.events[0]
    assert first.name == "NllLossBackward0" and first.overhead_ns == round(buf["dur"] * 1000)
    assert all(e.overhead_ns == 0 for e in t.events[1:])
    assert first.dur_ns - first.overhead_ns < first.dur_ns // 2  # what measured costs keep of the node


def test_a_trace_exported_after_a_later_session_is_refused_not_read_as_free_kernels():
    raw = _raw("mlp_backward_late_export.json.gz")
    assert all(e["ts"] == 0 and e["dur"] == 0 for e in raw if e.get("cat") == "kernel")
    with pytest.raises(RequestError, match=r"mlp_backward_late_export\.json\.gz: GPU activity .* has no time \(ts 0\)"):
        read_torch_profile(os.path.join(H200, "mlp_backward_late_export.json.gz"))


def test_the_profilers_own_work_inside_a_node_is_not_its_measured_cost(tmp_path):
    """Kineto's ``overhead`` event (pid -1, drawn apart) ran inline on the thread whose span holds it: the
    node's measured CPU time is its span less that stretch (hand-computed: 30 us - 12 us)."""
    doc = gpu_trace()
    doc["traceEvents"].append({"ph": "X", "cat": "overhead", "name": "Activity Buffer Request", "pid": -1,
                               "tid": 0, "ts": 104, "dur": 12})
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    costs = read_costs(str(p), graph())
    assert costs.nodes["n0"].cpu_ns == 30000 - 12000
    assert costs.nodes["n1"].cpu_ns == 30000  # the other nodes keep their spans


def test_a_late_exported_trace_names_the_option_it_came_from(tmp_path):
    raw = _raw("mlp_backward_late_export.json.gz")
    p = tmp_path / "late.json"
    p.write_text(json.dumps({"traceEvents": raw}))
    with pytest.raises(RequestError) as info:
        read_torch_profile(str(p), "profile")
    assert info.value.option == "profile"


def test_a_spans_own_time_and_the_profilers_time_per_event_it_shows():
    """A span's own time is its time outside its direct children (a grandchild counts once, inside its
    parent); across spans, the profiler's time per recorded event is the slope of the median own time over
    the nested count (hand-built: 1 us fixed + 0.15 us per event, one outlier span that the medians ignore)."""
    from autograd_run.traces.torch_profile import BackwardEvent, decode_chrome, event_cost_in, parse_torch_profile
    ev = [op("autograd::engine::evaluate_function: MulBackward0", 0, 100, **{"Sequence number": 3}),
          op("MulBackward0", 10, 20), op("aten::mul", 12, 10),  # a grandchild: inside its parent's 20
          op("aten::sum", 40, 10)]
    doc = decode_chrome(json.dumps({"traceEvents": ev}).encode(), "t.json", "costs")
    (run,) = parse_torch_profile(doc, "t.json").events
    assert (run.nested, run.own_ns) == (3, (100 - 20 - 10) * 1000)

    def span(n, own):
        return BackwardEvent("X", 1, 1, CPU, 0, 10**6, nested=n, own_ns=own)
    spans = [span(n, 1000 + 150 * n) for n in (2, 4, 8) for _ in range(3)] + [span(4, 90_000)]
    assert event_cost_in(spans) == pytest.approx(0.15)
    assert event_cost_in(spans[:6]) is None  # two counts only: nothing to tell
