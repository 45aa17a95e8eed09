"""Devices, streams, cost and opaque nodes: virtual everywhere, real CUDA where there is one."""

import time

import numpy as np
import pytest

from autograd_run.engine import DeviceSet
from autograd_run.engine.devices import _cupy_status
from autograd_run.engine.run import run_graph
from autograd_run.record.recorder import Recorder
from builders import doc, fan, graph, leaf, meta, node, recording, run_traced

pytestmark = pytest.mark.timeout(120)

HAVE_CUDA = _cupy_status()[0] is not None
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs cupy and a CUDA GPU: " + _cupy_status()[1])


def two_stream_graph(device="cuda:0"):
    """
    sum (s0) -> mul (s1) -> relu (s0) -> acc w
    Gradients cross from stream 0 to 1 and back: two syncs per pass.
    """
    return graph(doc(
        node("sum", "SumBackward0", seq=3, next=["mul"], inputs=[meta([], device, stream=0)],
             saved={"self_sym_sizes": [64, 64]}),
        node("mul", "MulBackward0", seq=2, next=["relu", None], inputs=[meta([64, 64], device, stream=1)],
             saved={"other": {"random": 1, "shape": [64, 64]}}),
        node("relu", "ReluBackward0", seq=1, next=["acc"], inputs=[meta([64, 64], device, stream=0)],
             saved={"result": {"random": 2, "shape": [64, 64]}}),
        leaf("w", [64, 64], id="acc", device=device),
    ))


def cross_device_graph():
    """cuda:0 computes, a ToCopyBackward0 brings the gradient back to a CPU leaf:

    sum -> exp -> copy (cuda:0) -> acc x (cpu)
    """
    return graph(doc(
        node("sum", "SumBackward0", seq=3, next=["exp"], inputs=[meta([], "cuda:0")], saved={"self_sym_sizes": [8]}),
        node("exp", "ExpBackward0", seq=2, next=["copy"], inputs=[meta([8], "cuda:0")],
             saved={"result": {"data": [1, 2, 3, 4, 5, 6, 7, 8], "dtype": "float32"}}),
        node("copy", "ToCopyBackward0", seq=1, next=["acc"], inputs=[meta([8], "cuda:0")]),
        leaf("x", [8], id="acc"),
    ))


def test_virtual_streams_report_syncs():
    rec = recording(two_stream_graph(), devices="virtual")
    syncs = [(s.producer.id, s.consumer.id, s.src, s.dst) for s in rec.syncs]
    assert syncs == [("sum", "mul", "cuda:0/s0", "cuda:0/s1"), ("mul", "relu", "cuda:0/s1", "cuda:0/s0")]


def test_cross_device_copy_on_virtual_devices():
    rec = Recorder()
    res = run_traced(cross_device_graph(), rec, devices="virtual")
    np.testing.assert_allclose(res.grads["x"], np.arange(1, 9, dtype=np.float32))
    # The copy's output is a CPU gradient: as in PyTorch, a CPU consumer gets no engine-side wait.
    assert rec.recording().syncs == []


def test_forcing_cuda_without_a_gpu_is_a_request_error():
    if HAVE_CUDA:
        pytest.skip("a GPU is present")
    from autograd_run.errors import RequestError
    with pytest.raises(RequestError, match="no usable CUDA device") as info:
        DeviceSet("cuda")
    assert info.value.option == "backend"
    assert DeviceSet("auto").kind == "virtual"
    assert "virtual" in DeviceSet("auto").describe()


def cost_graph(mode, us, devices=("cuda:0", "cuda:1")):
    r"""
         root
        /    \
      c0      c1    one cost node per device, each taking ``us`` µs
        \    /
        acc x
    """
    branches = [node(f"c{k}", "CostBackward", op="cost", seq=1, next=["acc"], inputs=[meta([4], d)],
                     attrs={"cost": {"us": us, "mode": mode}}) for k, d in enumerate(devices)]
    return graph(doc(*branches, fan("root", [b["id"] for b in branches], seq=5, shape=[4]), leaf("x", [4], id="acc"),
                     roots="root"))


@pytest.mark.parametrize("mode", ["spin", "sleep"])
def test_cost_nodes_take_their_time_and_emit_declared_shapes(engine_factory, mode):
    g = cost_graph(mode, 20_000, devices=("cpu",))
    eng = engine_factory()
    t = time.perf_counter()
    res = run_graph(eng, g)
    assert time.perf_counter() - t >= 0.02
    np.testing.assert_array_equal(res.grads["x"], np.zeros(4, dtype=np.float32))


def test_sleeping_cost_nodes_on_two_virtual_devices_overlap(engine_factory):
    g = cost_graph("sleep", 100_000)
    eng = engine_factory()
    run_graph(eng, g)  # warm up the device threads
    t = time.perf_counter()
    run_graph(eng, g)
    elapsed = time.perf_counter() - t
    assert elapsed < 0.19  # two 0.1 s nodes ran at the same time on their two workers


def test_opaque_node_emits_zeros_of_consumer_shapes():
    g = graph(doc(
        node("o", "FancyOpBackward0", op="opaque", seq=1, next=["acc"], inputs=[[5]]),
        leaf("x", [2, 3], id="acc"),
    ))
    res = run_traced(g, None)
    assert res.grads["x"].shape == (2, 3) and not res.grads["x"].any()


@needs_cuda
@pytest.mark.cuda
def test_cuda_two_streams_match_virtual():
    g = two_stream_graph()
    out = {mode: run_traced(g, None, devices=mode).grads["w"] for mode in ("virtual", "cuda")}
    import cupy
    np.testing.assert_allclose(cupy.asnumpy(out["cuda"]), out["virtual"], rtol=1e-5)


@needs_cuda
@pytest.mark.cuda
def test_cuda_cross_device_copy_returns_to_host():
    res = run_traced(cross_device_graph(), None, devices="cuda")
    assert isinstance(res.grads["x"], np.ndarray)
    np.testing.assert_allclose(res.grads["x"], np.arange(1, 9, dtype=np.float32))


def test_a_graph_on_more_devices_than_the_engine_has_is_a_request_error():
    """The check comes before anything is placed on a device (on real GPUs, before cupy is asked for it)."""
    from autograd_run.engine import Engine
    from autograd_run.errors import RequestError
    eng = Engine(DeviceSet("virtual", count=1))
    try:
        with pytest.raises(RequestError, match=r"device index 1 is out of range: there are 1 device\(s\)"):
            run_graph(eng, two_stream_graph("cuda:1"))
    finally:
        eng.shutdown()


@needs_cuda
@pytest.mark.cuda
def test_a_graph_on_more_gpus_than_there_are_runs_virtual_under_auto_and_is_refused_under_cuda():
    import cupy
    from autograd_run.errors import RequestError
    from autograd_run.session import RunOptions, run_session
    n = cupy.cuda.runtime.getDeviceCount()
    g = two_stream_graph(f"cuda:{n}")
    rep = run_session(g, RunOptions(devices="auto", profile=False))
    assert not rep.devices.real_cuda and f"the graph uses cuda:{n}" in rep.devices.reason
    np.testing.assert_allclose(rep.result.grads["w"], run_traced(two_stream_graph(), None, devices="virtual").grads["w"])
    with pytest.raises(RequestError, match=f"the graph uses cuda:{n} and cupy sees {n} CUDA device"):
        run_session(g, RunOptions(devices="cuda", profile=False))


@needs_cuda
@pytest.mark.cuda
def test_numpy_scalars_are_host_values_and_a_0_dim_one_moves_to_the_gradients_device():
    """NumPy 2 gives scalars a ``.device`` of "cpu" (a str): a rule's scalar result once failed here on a GPU."""
    import cupy
    from autograd_run.graphs.model import CPU, Device
    from autograd_run.engine.worker import validate_outputs
    from autograd_run.graphs.model import Edge
    d = DeviceSet("cuda")
    assert d.device_of(np.float32(2)) == CPU and d.device_of(np.ones(2)) == CPU
    assert d.device_of(cupy.ones(2)) == Device("cuda", 0)
    g = graph(doc(node("sum", "SumBackward0", seq=1, next=["acc"], inputs=[meta([], "cuda:0")],
                       saved={"self_sym_sizes": []}),
                  leaf("w", [], id="acc", device="cuda:0")))
    grads = [np.float32(3)]
    validate_outputs([Edge(g.by_id["acc"], 0)], grads, "", cupy, d)
    assert isinstance(grads[0], cupy.ndarray) and float(grads[0]) == 3.0


def test_equal_devices_are_one_object():
    """Loaded graphs and placements share one Device object per (type, index), so the engine's compiled code
    compares devices by identity; a Device made directly still equals it."""
    from autograd_run.graphs.model import CPU, Device, device
    assert Device.parse("cuda:1") is Device.parse("cuda:1") is device("cuda", 1)
    assert Device.parse("xpu") is device("xpu", 0) and Device.parse("cpu") is CPU is device("cpu", -1)
    assert Device("cuda", 1) == device("cuda", 1) and Device("cuda", 1) is not device("cuda", 1)
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.graphs.dump import dumps
    from autograd_run.sim.placement import place
    g = loads_graph(dumps(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2), "json"), "t.json")
    devices = {id(m.device) for n in g.nodes for m in n.inputs}
    assert len(devices) == len({m.device for n in g.nodes for m in n.inputs}) == 2
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.specs import load_spec
    placed = place(g, 3, "layer", CostResolver(load_spec("h100"), None, {}))
    assert {m.device for n in placed.nodes for m in n.inputs} <= {device("cuda", k) for k in range(3)}
    assert len({id(m.device) for n in placed.nodes for m in n.inputs}) <= 3
