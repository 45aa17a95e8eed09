"""Devices, streams, cost and opaque nodes: virtual everywhere, real CUDA where there is one."""

import time

import numpy as np
import pytest

from autograd_run.engine import DeviceSet, Engine
from autograd_run.engine.devices import _cupy_status
from autograd_run.engine.run import run_graph
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.load import loads_graph
from autograd_run.traces.recorder import Recorder

pytestmark = pytest.mark.timeout(120)

HAVE_CUDA = _cupy_status()[0] is not None
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs cupy and a CUDA GPU: " + _cupy_status()[1])


def two_stream_graph(device="cuda:0"):
    """
    sum (s0) -> mul (s1) -> relu (s0) -> acc w
    Gradients cross from stream 0 to 1 and back: two syncs per pass.
    """
    m = lambda shape, s: {"shape": shape, "device": device, "stream": s}  # noqa: E731
    return loads_graph(dumps({
        "format": "autograd-graph/1", "roots": [{"node": "sum", "grad": "ones"}],
        "variables": [{"name": "w", "shape": [64, 64], "device": device}],
        "nodes": [
            {"id": "sum", "name": "SumBackward0", "seq": 3, "next": [["mul", 0]], "inputs": [m([], 0)],
             "saved": {"self_sym_sizes": [64, 64]}},
            {"id": "mul", "name": "MulBackward0", "seq": 2, "next": [["relu", 0], None], "inputs": [m([64, 64], 1)],
             "saved": {"other": {"random": 1, "shape": [64, 64]}}},
            {"id": "relu", "name": "ReluBackward0", "seq": 1, "next": [["acc", 0]], "inputs": [m([64, 64], 0)],
             "saved": {"result": {"random": 2, "shape": [64, 64]}}},
            {"id": "acc", "name": "AccumulateGrad", "variable": "w"}]}, "json"), "two_stream.json")


def cross_device_graph():
    """cuda:0 computes, a ToCopyBackward0 brings the gradient back to a CPU leaf."""
    return loads_graph(dumps({
        "format": "autograd-graph/1", "roots": [{"node": "sum", "grad": "ones"}],
        "variables": [{"name": "x", "shape": [8]}],
        "nodes": [
            {"id": "sum", "name": "SumBackward0", "seq": 3, "next": [["exp", 0]],
             "inputs": [{"shape": [], "device": "cuda:0"}], "saved": {"self_sym_sizes": [8]}},
            {"id": "exp", "name": "ExpBackward0", "seq": 2, "next": [["copy", 0]],
             "inputs": [{"shape": [8], "device": "cuda:0"}],
             "saved": {"result": {"data": [1, 2, 3, 4, 5, 6, 7, 8], "dtype": "float32"}}},
            {"id": "copy", "name": "ToCopyBackward0", "seq": 1, "next": [["acc", 0]],
             "inputs": [{"shape": [8], "device": "cuda:0"}]},
            {"id": "acc", "name": "AccumulateGrad", "variable": "x"}]}, "json"), "cross.json")


def test_virtual_streams_report_syncs():
    g = two_stream_graph()
    rec = Recorder()
    eng = Engine(DeviceSet("virtual"), tracer=rec)
    try:
        run_graph(eng, g)
    finally:
        eng.shutdown()
    syncs = [(s.producer.id, s.consumer.id, s.src, s.dst) for s in rec.recording().syncs]
    assert syncs == [("sum", "mul", "cuda:0/s0", "cuda:0/s1"), ("mul", "relu", "cuda:0/s1", "cuda:0/s0")]


def test_cross_device_copy_on_virtual_devices():
    g = cross_device_graph()
    rec = Recorder()
    eng = Engine(DeviceSet("virtual"), tracer=rec)
    try:
        res = run_graph(eng, g)
    finally:
        eng.shutdown()
    np.testing.assert_allclose(res.grads["x"], np.arange(1, 9, dtype=np.float32))
    # The copy's output is a CPU gradient: as in PyTorch, a CPU consumer gets no engine-side wait.
    assert rec.recording().syncs == []


def test_forcing_cuda_without_a_gpu_is_a_request_error():
    if HAVE_CUDA:
        pytest.skip("a GPU is present")
    from autograd_run.errors import RequestError
    with pytest.raises(RequestError, match="no usable CUDA device") as info:
        DeviceSet("cuda")
    assert info.value.option == "devices"
    assert DeviceSet("auto").kind == "virtual"
    assert "virtual" in DeviceSet("auto").describe()


def cost_graph(mode, us, devices=("cuda:0", "cuda:1")):
    nodes = []
    for k, d in enumerate(devices):
        nodes.append({"id": f"c{k}", "name": "CostBackward", "op": "cost", "seq": 1, "next": [["acc", 0]],
                      "inputs": [{"shape": [4], "device": d}], "attrs": {"cost": {"us": us, "mode": mode}}})
    nodes.append({"id": "root", "name": "Fan", "op": "identity", "seq": 5, "next": [[f"c{k}", 0] for k in range(len(devices))],
                  "inputs": [{"shape": [4]}]})
    nodes.append({"id": "acc", "name": "AccumulateGrad", "variable": "x"})
    return loads_graph(dumps({"format": "autograd-graph/1", "roots": [{"node": "root", "grad": "ones"}],
                              "variables": [{"name": "x", "shape": [4]}], "nodes": nodes}, "json"), "cost.json")


@pytest.mark.parametrize("mode", ["spin", "sleep"])
def test_cost_nodes_take_their_time_and_emit_declared_shapes(mode):
    g = cost_graph(mode, 20_000, devices=("cpu",))
    eng = Engine()
    t = time.perf_counter()
    res = run_graph(eng, g)
    assert time.perf_counter() - t >= 0.02
    np.testing.assert_array_equal(res.grads["x"], np.zeros(4, dtype=np.float32))


def test_sleeping_cost_nodes_on_two_virtual_devices_overlap():
    g = cost_graph("sleep", 100_000)
    eng = Engine()
    try:
        run_graph(eng, g)  # warm up the device threads
        t = time.perf_counter()
        run_graph(eng, g)
        elapsed = time.perf_counter() - t
    finally:
        eng.shutdown()
    assert elapsed < 0.19  # two 0.1 s nodes ran at the same time on their two workers


def test_opaque_node_emits_zeros_of_consumer_shapes():
    g = loads_graph(dumps({"format": "autograd-graph/1", "roots": [{"node": "o", "grad": "ones"}],
                           "variables": [{"name": "x", "shape": [2, 3]}],
                           "nodes": [{"id": "o", "name": "FancyOpBackward0", "op": "opaque", "seq": 1,
                                      "next": [["acc", 0]], "inputs": [{"shape": [5]}]},
                                     {"id": "acc", "name": "AccumulateGrad", "variable": "x"}]}, "json"), "o.json")
    res = run_graph(Engine(), g)
    assert res.grads["x"].shape == (2, 3) and not res.grads["x"].any()


@needs_cuda
@pytest.mark.cuda
def test_cuda_two_streams_match_virtual():
    g = two_stream_graph()
    out = {}
    for mode in ("virtual", "cuda"):
        eng = Engine(DeviceSet(mode))
        try:
            out[mode] = run_graph(eng, g).grads["w"]
        finally:
            eng.shutdown()
    import cupy
    np.testing.assert_allclose(cupy.asnumpy(out["cuda"]), out["virtual"], rtol=1e-5)


@needs_cuda
@pytest.mark.cuda
def test_cuda_cross_device_copy_returns_to_host():
    g = cross_device_graph()
    eng = Engine(DeviceSet("cuda"))
    try:
        res = run_graph(eng, g)
    finally:
        eng.shutdown()
    assert isinstance(res.grads["x"], np.ndarray)
    np.testing.assert_allclose(res.grads["x"], np.arange(1, 9, dtype=np.float32))
