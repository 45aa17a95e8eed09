"""A PyTorch profile of a process's first backward: what ``sim.first_call`` takes out of its spans.

The figures are hand-counted on a generated two-layer MLP (batch 2, width 3, float32), whose run order and
gradient shapes are written out below; the measurement itself runs PyTorch in a fresh process.
"""

import json
import subprocess
import sys

import pytest

from autograd_run.errors import RequestError
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import loads_graph
from autograd_run.sim import first_call
from autograd_run.sim.costs import CostResolver
from autograd_run.sim.specs import MachineSpec, load_spec


def _mlp():
    return loads_graph(json.dumps(generate("mlp", layers=2, width=3, batch=2)), "m.json")


# The engine's order on one worker, and each node's new gradients in bytes (float32):
#   sum_7      SumBackward0  -> mm_6 (2,1): an expanded view of its gradient            0
#   mm_6       MmBackward0   -> relu_5 (2,3) 24, acc_w_out (3,1) 12                      36
#   acc_w_out  AccumulateGrad                                                             0
#   relu_5     ReluBackward0 -> add_4 (2,3)                                              24
#   add_4      AddBackward0  -> mm_3 (2,3): its gradient itself; acc_b1 (3,): a sum_to  12
#   acc_b1                                                                                0
#   mm_3       MmBackward0   -> relu_2 (2,3) 24, acc_w1 (3,3) 36                         60
#   acc_w1                                                                                0
#   relu_2     ReluBackward0                                                             24
#   add_1      AddBackward0  -> mm_0 (2,3) itself, acc_b0 (3,)                           12
#   acc_b0                                                                                0
#   mm_0       MmBackward0   -> acc_w0 (3,3) (the input x needs no gradient)             36
#   acc_w0                                                                                0
ORDER = ["sum_7", "mm_6", "acc_w_out", "relu_5", "add_4", "acc_b1", "mm_3", "acc_w1", "relu_2", "add_1", "acc_b0",
         "mm_0", "acc_w0"]
NEW = {"mm_6": 36, "relu_5": 24, "add_4": 12, "mm_3": 60, "relu_2": 24, "add_1": 12, "mm_0": 36}


def test_new_memory_is_each_gradient_that_is_no_view_of_the_incoming_one():
    g = _mlp()
    assert [n.id for n in first_call.run_order(g)] == ORDER
    assert {n.id: first_call.new_bytes(n) for n in g.nodes if first_call.new_bytes(n)} == NEW


def test_a_gradient_above_glibcs_largest_mmap_threshold_is_new_in_every_call():
    doc = generate("mlp", layers=1, width=3, batch=2)
    g = loads_graph(json.dumps(doc), "m.json")
    relu = next(n for n in g.nodes if n.name == "ReluBackward0")
    meta = relu.next[0].node.inputs[relu.next[0].input_nr]
    assert first_call.new_bytes(relu) == 24
    object.__setattr__(meta, "shape", (first_call.MMAP_MAX // 4 + 1,))  # 32 MiB and 4 bytes: mapped every call
    assert first_call.new_bytes(relu) == 0


def _spec(per_byte=2.0, setup=None) -> MachineSpec:
    spec = load_spec("cpu")
    spec.engine.first_call_ns_per_byte = per_byte
    spec.engine.first_call_setup_us = setup if setup is not None else {
        "call": 100.0, "op": {"MmBackward0": 7.0, "*": 3.0}, "kind": {"MmBackward0": 5.0, "*": 1.0}}
    return spec


def test_the_first_node_of_the_call_of_an_op_and_of_a_kind_pay_their_set_up_and_every_new_byte_its_touch():
    got = first_call.corrections(_mlp(), _spec())
    us, ns = 1000.0, 2.0  # the figures' units: set-up in us, bytes at 2 ns each
    want = {
        "sum_7": 100 * us,                      # the call's first node
        "mm_6": 7 * us + 36 * ns,               # the first MmBackward0 (its own figure)
        "acc_w_out": 3 * us,                    # the first AccumulateGrad (no figure of its own: "*")
        "relu_5": 3 * us + 24 * ns,             # the first ReluBackward0
        "add_4": 3 * us + 12 * ns,              # the first AddBackward0
        "acc_b1": 1 * us,                       # an AccumulateGrad of a new shape: a new kind
        "mm_3": 5 * us + 60 * ns,               # an MmBackward0 of new shapes
        "acc_w1": 1 * us,
        "relu_2": 24 * ns,                      # relu_5's kind again: its bytes only
        "add_1": 12 * ns,                       # add_4's kind again
        "mm_0": 5 * us + 36 * ns,               # no gradient for x: another kind than mm_3
    }                                           # acc_b0 and acc_w0: kinds met before, no new memory: nothing
    assert got == want


def test_a_spec_without_the_figures_corrects_nothing_and_a_graph_on_devices_is_not_corrected():
    g = _mlp()
    assert not first_call.applies(g, load_spec("cpu"))
    assert first_call.applies(g, _spec())
    assert first_call.applies(g, _spec(per_byte=0.0))
    g.max_device_index = 0
    assert not first_call.applies(g, _spec())


def test_a_corrected_span_keeps_a_tenth_of_itself_and_the_resolver_counts_what_it_took():
    assert first_call.corrected(1000.0, 300.0) == 700.0
    assert first_call.corrected(1000.0, 5000.0) == 100.0  # FLOOR


@pytest.mark.parametrize("bad", [
    {"call": -1},
    {"op": {"MmBackward0": "7"}},
    {"kind": []},
    {"other": {}},
    {"op": {"": 1.0}},
    {"call": True},
])
def test_a_spec_file_with_a_bad_set_up_table_is_refused(bad):
    doc = load_spec("cpu").to_dict()
    doc["engine"]["first_call_setup_us"] = bad
    with pytest.raises(RequestError, match="first_call_setup_us must be a mapping"):
        MachineSpec.from_dict(doc, "s.json")


def test_a_spec_file_with_the_figures_loads_them():
    doc = load_spec("cpu").to_dict()
    doc["engine"]["first_call_ns_per_byte"] = 0.35
    doc["engine"]["first_call_setup_us"] = {"call": 60.0, "op": {"*": 10.0}, "kind": {"*": 0.1}}
    spec = MachineSpec.from_dict(doc, "s.json")
    assert spec.engine.first_call_ns_per_byte == 0.35 and spec.engine.first_call_setup_us["op"] == {"*": 10.0}
    doc["engine"]["first_call_ns_per_byte"] = 2e6
    with pytest.raises(RequestError, match="first_call_ns_per_byte must be a number"):
        MachineSpec.from_dict(doc, "s.json")


def test_the_resolver_takes_the_set_up_out_of_a_first_calls_measured_spans_only():
    from autograd_run.costs.measured import MeasuredCost, MeasuredCosts, PYTORCH
    g = _mlp()
    spec = _spec(per_byte=0.0)
    measured = MeasuredCosts({n.id: MeasuredCost(50_000.0) for n in g.nodes}, PYTORCH, "t.json")
    taken = first_call.FirstCall(first_call.corrections(g, spec))
    model = CostResolver(spec, measured, None, taken)
    by_id = g.by_id
    assert model(by_id["mm_6"]).cpu_ns == 50_000 - 7_000
    assert model(by_id["sum_7"]).cpu_ns == 50_000 - 45_000  # 100 us asked, a tenth of the span kept
    assert model(by_id["acc_b0"]).cpu_ns == 50_000
    assert taken.taken_ns == 7_000 + 45_000
    assert CostResolver(spec, None, None, taken).first_call is None  # no PyTorch profile: nothing to take from
    assert CostResolver(spec, measured)(by_id["mm_6"]).cpu_ns == 50_000  # no corrections given: none taken


def test_calibrate_measures_a_first_backward_against_a_later_one_in_a_fresh_process():
    """The child ``calibrate --torch`` runs per block (``capture.first_call_probe``): PyTorch's own first and later backward of the MLP block,
    profiled, matched node by node with the block's captured graph in the engine's order."""
    p = subprocess.run([sys.executable, "-m", "autograd_run.capture.first_call_probe", "mlp"], capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    names = [n["name"] for n in got["nodes"]]
    assert names[0] == "SumBackward0" and names.count("AddmmBackward0") == 6 and "GeluBackward0" in names
    assert all(n["first_ns"] > 0 and n["later_ns"] > 0 for n in got["nodes"])
    # 6 Linear(16, 16) layers on a (4, 16) batch: each AddmmBackward0 makes a (4, 16) input gradient (but the
    # first layer's, whose input needs none), a (16,) bias gradient and a (16, 16) weight gradient
    addmm = [n["new_bytes"] for n in got["nodes"] if n["name"] == "AddmmBackward0"]
    assert sorted(addmm) == [4 * (16 + 256)] + [4 * (64 + 16 + 256)] * 5
    assert 0.01 < got["ns_per_byte"] < 10  # a minor fault and a zeroed page per 4 KiB: 0.2-0.4 ns a byte here


def test_a_failed_first_call_probe_leaves_the_rest_of_the_calibration_and_says_so(monkeypatch):
    pytest.importorskip("torch")
    import autograd_run.sim.calibrate_torch as cal
    monkeypatch.setattr(cal, "measure_engine", lambda torch, log=None: {
        "call_ns": 1700.0, "overhead_ns": 1500.0, "event_ns": 200.0, "event_shapes_ns": 500.0,
        "event_shapes_later_ns": 300.0})
    monkeypatch.setattr(cal, "measure_host", lambda torch, event_ns: load_spec("cpu").host)

    def broken(log=None):
        raise RuntimeError("the first-call probe of the conv block: Killed")
    lines = []
    spec = cal.calibrate_torch(log=lines.append, first_call=broken)
    assert spec.engine.node_overhead_us == 1.5 and spec.engine.profiler_event_shapes_us == 0.5
    assert spec.engine.first_call_ns_per_byte == 0.0 and spec.engine.first_call_setup_us == {}
    assert lines[-1] == ("  not measured (the first-call probe of the conv block: Killed): a profile of a process's "
                         "first backward will not be corrected")
    assert not first_call.applies(_mlp(), spec)
