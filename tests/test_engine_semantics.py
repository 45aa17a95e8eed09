"""The engine against PyTorch's engine.cpp / input_buffer.cpp semantics, one divergence fixed per test.

Where real PyTorch can observe the behaviour on this machine the test compares
with it; the multi-device oracle (a CPU-backed accelerator) checks the rest in
``test_pt_oracle``. Otherwise the test states the source behaviour it checks.
"""

import functools
import threading
import time

import numpy as np
import pytest

from autograd_run.engine import DeviceSet, Engine, GraphState
from autograd_run.engine.callables import ERR_CHECKPOINT_INVALID
from autograd_run.engine.input_buffer import InputBuffer
from autograd_run.engine.run import run_graph
from autograd_run.errors import BackwardError, RequestError
from autograd_run.graphs.model import Device
from autograd_run.record.order_recorder import OrderRecorder
from autograd_run.record.recorder import Recorder

pytestmark = pytest.mark.timeout(60)

CUDA0, CUDA1 = Device("cuda", 0), Device("cuda", 1)


from builders import parts_graph  # noqa: E402  (tests/ is on sys.path)

graph = functools.partial(parts_graph, source="semantics.json")


def m(shape=(2,), device="cpu", stream=0):
    return {"shape": list(shape), "device": device, "stream": stream}


class FakeStreams:
    """Records the record/wait calls InputBuffer makes."""

    def __init__(self):
        self.calls = []

    def record(self, gt, stream, node):
        self.calls.append(("record", stream, node))
        return ("event", stream, node)

    def wait(self, gt, stream, event, node):
        self.calls.append(("wait", stream, event))

    def on_stream(self, stream):
        import contextlib
        self.calls.append(("sum on", stream))
        return contextlib.nullcontext()


# -- 1. InputBuffer::add stream rules ---------------------------------------------------------

def test_first_producer_on_the_consumer_device_accumulates_on_the_consumer_stream():
    """Case A: the gradient is on the consumer's device: accumulation stream = consumer's; an event on
    the producer's stream because the consumer's differs."""
    fs, buf = FakeStreams(), InputBuffer(1)
    buf.add_on_device(0, np.ones(2), CUDA0, (CUDA1, 0), (CUDA0, 2), "P", "C", fs, None)
    assert buf.accum_streams == [(CUDA0, 2)]
    assert fs.calls == [("record", (CUDA1, 0), "P")]
    assert buf.ready_streams == [(CUDA1, 0)]
    assert buf.ready_waits((CUDA0, 2)) == [(0, ("event", (CUDA1, 0), "P"))]


def test_first_producer_on_the_producer_device_accumulates_on_the_producer_stream():
    """Case B: not on the consumer's device but on the producer's: accumulation stream = producer's."""
    fs, buf = FakeStreams(), InputBuffer(1)
    buf.add_on_device(0, np.ones(2), CUDA1, (CUDA1, 3), (CUDA0, 0), "P", "C", fs, None)
    assert buf.accum_streams == [(CUDA1, 3)]
    assert fs.calls == [("record", (CUDA1, 3), "P")]  # the consumer's stream still differs


def test_first_producer_on_neither_device_uses_the_current_stream():
    """Case C: on neither device: the gradient device's current stream."""
    fs, buf = FakeStreams(), InputBuffer(1)
    buf.add_on_device(0, np.ones(2), CUDA1, (CUDA0, 1), (CUDA0, 2), "P", "C", fs, None)
    assert buf.accum_streams == [(CUDA1, 0)]


def test_same_stream_producer_and_consumer_record_nothing():
    fs, buf = FakeStreams(), InputBuffer(1)
    buf.add_on_device(0, np.ones(2), CUDA0, (CUDA0, 1), (CUDA0, 1), "P", "C", fs, None)
    assert fs.calls == [] and buf.ready_waits((CUDA0, 1)) == []


def test_later_producer_waits_and_accumulates_on_the_accumulation_stream():
    """Nth producer: the accumulation stream waits on an event of the new producer's stream and on
    the slot's previous ready event, sums there, and records a new ready event for the consumer."""
    fs, buf = FakeStreams(), InputBuffer(1)
    buf.add_on_device(0, np.ones(2), CUDA0, (CUDA0, 1), (CUDA0, 2), "P1", "C", fs, None)
    fs.calls.clear()
    buf.add_on_device(0, np.full(2, 2.0), CUDA0, (CUDA0, 3), (CUDA0, 2), "P2", "C", fs, None)
    assert fs.calls == [
        ("record", (CUDA0, 3), "P2"),
        ("wait", (CUDA0, 2), ("event", (CUDA0, 3), "P2")),
        ("wait", (CUDA0, 2), ("event", (CUDA0, 1), "P1")),
        ("sum on", (CUDA0, 2)),
    ]
    np.testing.assert_array_equal(buf.grads[0], [3.0, 3.0])
    assert buf.ready_streams == [(CUDA0, 2)] and buf.ready_waits((CUDA0, 2)) == []


def two_stream_fan_in():
    """
        root (s0) --> a (s1) --+
                 \\--> b (s2) --+--> acc w  (cuda:0, s0)
    Two producers on two streams feed one slot of a node on a third stream.
    """
    return graph([
        {"id": "root", "name": "CloneBackward0", "seq": 3, "next": [["a", 0], ["b", 0]],
         "op": "identity", "inputs": [m(device="cuda:0", stream=0)]},
        {"id": "a", "name": "A", "op": "identity", "seq": 2, "next": [["acc", 0]], "inputs": [m(device="cuda:0", stream=1)]},
        {"id": "b", "name": "B", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m(device="cuda:0", stream=2)]},
        {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:0", stream=0)]},
    ], [{"node": "root"}], [{"name": "w", "shape": [2], "device": "cuda:0"}])


class Events(Recorder):
    def __init__(self):
        super().__init__()
        self.stream_events = []

    def event_record(self, gt, node, stream, event_id):
        self.stream_events.append(("record", node.id if node else None, stream))

    def event_wait(self, gt, node, stream, event_id):
        self.stream_events.append(("wait", node.id if node else None, stream))


def test_fan_in_across_streams_records_and_waits_like_pytorch():
    rec = Events()
    eng = Engine(DeviceSet("virtual"), tracer=rec, multithreading=False)
    res = run_graph(eng, two_stream_fan_in())
    eng.shutdown()
    np.testing.assert_array_equal(res.grads["w"], [2.0, 2.0])
    assert rec.stream_events == [
        ("record", "root", "cuda:0/s0"), ("record", "root", "cuda:0/s0"),  # root routes to a (s1) and b (s2)
        ("wait", "a", "cuda:0/s1"),                                         # a waits before it runs
        ("record", "a", "cuda:0/s1"),                                       # a: first producer into acc (s0)
        ("wait", "b", "cuda:0/s2"),
        ("record", "b", "cuda:0/s2"), ("wait", "acc", "cuda:0/s0"),        # b: acc's accumulation stream waits
        ("wait", "acc", "cuda:0/s0"),                                       # on b, and on a's ready event;
    ]                                                                       # acc then runs on s0 with no wait
    syncs = [(s.producer.id, s.consumer.id) for s in rec.recording().syncs]
    assert syncs == [("root", "a"), ("root", "b"), ("b", "acc"), ("a", "acc")]


# -- 2. root gradient stream and leaf streams ---------------------------------------------------

def test_leaf_on_a_side_stream_is_synced_back_to_the_callers_stream():
    """exec_post_processing: the caller's current stream (s0) waits on every leaf stream that differs."""
    g = graph([{"id": "n", "name": "N", "op": "identity", "seq": 1, "next": [["acc", 0]],
                "inputs": [m(device="cuda:0", stream=1)]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:0", stream=1)]}],
              [{"node": "n"}], [{"name": "w", "shape": [2], "device": "cuda:0"}])
    rec = Events()
    eng = Engine(DeviceSet("virtual"), tracer=rec)
    run_graph(eng, g)
    eng.shutdown()
    # the root gradient comes from the caller's stream (s0) into n's stream (s1); at the end s0 waits on s1
    assert rec.stream_events == [("record", None, "cuda:0/s0"), ("wait", "n", "cuda:0/s1"),
                                 ("record", None, "cuda:0/s1"), ("wait", None, "cuda:0/s0")]


# -- 3. GraphRoot placement ------------------------------------------------------------------------

def test_graph_root_runs_on_the_device_of_the_root_gradients():
    """GraphRoot's input metadata are the root gradients': with roots on cuda:1 it runs on that worker."""
    g = graph([{"id": "a", "name": "A", "op": "identity", "seq": 2, "next": [["acc", 0]], "inputs": [m(device="cuda:1")]},
               {"id": "b", "name": "B", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m(device="cuda:1")]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:1")]}],
              [{"node": "a"}, {"node": "b"}], [{"name": "w", "shape": [2], "device": "cuda:1"}])
    order = OrderRecorder()
    eng = Engine(DeviceSet("virtual"), tracer=order)
    run_graph(eng, g)
    eng.shutdown()
    root = [r for r in order.records if r.graph_root]
    assert len(root) == 1 and root[0].thread == "autograd-run cuda:1" and root[0].device == "cuda:1"


# -- 4. shutdown never strands a caller ----------------------------------------------------------

def slow_device_graph(us=200_000):
    return graph([{"id": "slow", "name": "Slow", "op": "cost", "seq": 1, "next": [["acc", 0]],
                   "inputs": [m(device="cuda:0")], "attrs": {"cost": {"us": us, "mode": "sleep"}}},
                  {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:0")]}],
                 [{"node": "slow"}], [{"name": "w", "shape": [2], "device": "cuda:0"}])


def test_shutdown_waits_for_a_running_backward_call():
    g = slow_device_graph()
    eng = Engine(DeviceSet("virtual"))
    eng.start_device_threads(1)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("res", run_graph(eng, g)))
    t.start()
    time.sleep(0.05)  # the slow node is running on the device thread
    eng.shutdown(timeout=5)
    t.join(5)
    assert not t.is_alive() and box["res"].grads["w"] is not None
    assert eng.device_threads == {}


def test_shutdown_leaves_threads_running_when_a_call_outlasts_the_deadline():
    g = slow_device_graph(us=300_000)
    eng = Engine(DeviceSet("virtual"))
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("res", run_graph(eng, g)))
    t.start()
    time.sleep(0.05)
    eng.shutdown(timeout=0.01)  # a call is still running: nothing is stopped
    t.join(5)
    assert not t.is_alive() and box["res"].grads["w"] is not None
    eng.shutdown(timeout=5)


# -- 5. device threads start together; indices beyond the count are refused -----------------------

def test_all_device_threads_start_at_the_first_backward_call():
    g = graph([{"id": "n", "name": "N", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m(device="cuda:2")]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:2")]}],
              [{"node": "n"}], [{"name": "w", "shape": [2], "device": "cuda:2"}])
    eng = Engine(DeviceSet("virtual"))
    run_graph(eng, g)
    assert set(eng.device_threads) == {0, 1, 2}
    assert all(t.is_alive() for t in eng.device_threads.values())
    eng.shutdown()


def test_a_device_index_beyond_the_count_is_refused():
    g = graph([{"id": "n", "name": "N", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m(device="cuda:3")]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:3")]}],
              [{"node": "n"}], [{"name": "w", "shape": [2], "device": "cuda:3"}])
    eng = Engine(DeviceSet("virtual", count=2))
    with pytest.raises(RequestError, match="device index 3 is out of range: there are 2 device"):
        run_graph(eng, g)
    eng.shutdown()


# -- 6. tasks of a failed call left in a queue ------------------------------------------------------

def test_tasks_left_by_a_failed_call_change_rank_where_they_stand():
    """std::priority_queue with a comparator that reads the depth lazily: after the expiry the task at
    the top (9) still pops first, since pop takes the top without comparing it; every later
    comparison ranks the expired tasks (INT_MAX depth) above any live one (8, pushed after)."""
    from autograd_run.engine.priority import EXPIRED_DEPTH
    from autograd_run.engine.ready_queue import ReadyQueue

    class GT:
        expired = False
    old, new = GT(), GT()

    class N:
        def __init__(self, seq):
            self.seq = seq
    q = ReadyQueue("q")
    for seq in (5, 3, 4):
        q.push(seq, (old, N(seq), None))
    q.push(9, (new, N(9), None))
    # PyTorch's comparator reads an expired GraphTask's depth as INT_MAX at every comparison
    q.rekey(lambda it: it[0] is old, lambda it: (EXPIRED_DEPTH << 64) | it[1].seq)
    q.push(8, (new, N(8), None))
    popped = [q.pop()[1].seq for _ in range(5)]
    assert popped == [9, 5, 4, 3, 8]


def test_a_failed_call_leaves_nothing_behind_for_the_next():
    """
        root --> a0 .. a5 (cuda:0, a5 fails first) --> acc
    The failure leaves a0..a4 in cuda:0's queue; the next call runs exactly the reference order.
    """
    nodes = [{"id": "root", "name": "Root", "op": "identity", "seq": 10, "inputs": [m()],
              "next": [[f"a{i}", 0] for i in range(6)]}]
    nodes += [{"id": f"a{i}", "name": f"A{i}", "op": "identity", "seq": i + 1, "next": [["acc", 0]],
               "inputs": [m(device="cuda:0")]} for i in range(6)]
    nodes.append({"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:0")]})
    g = graph(nodes, [{"node": "root"}], [{"name": "w", "shape": [2], "device": "cuda:0"}])
    order = OrderRecorder()
    eng = Engine(DeviceSet("virtual"), tracer=order)
    with pytest.raises(BackwardError):
        run_graph(eng, g, faults={"a5": "error"})
    failed = [r.node_id for r in order.executed()]
    deadline = time.monotonic() + 5
    while len(eng.device_queue(0)) and time.monotonic() < deadline:  # the worker drops them unseen
        time.sleep(0.001)
    assert len(eng.device_queue(0)) == 0
    while not eng.device_queue(0).waiting and time.monotonic() < deadline:  # asleep again: the next call's
        time.sleep(0.001)                                                  # pushes all land before it wakes
    assert eng.device_queue(0).waiting == 1
    res = run_graph(eng, g)
    second = [r.node_id for r in order.executed()][len(failed):]
    eng.shutdown()
    assert "a4" not in failed  # nothing of the failed call ran after its failure
    assert second == ["root", "a5", "a4", "a3", "a2", "a1", "a0", "acc"]
    np.testing.assert_array_equal(res.grads["w"], [6.0, 6.0])


# -- 7. checkpoints under grad()/inputs= --------------------------------------------------------------

def test_checkpoint_text_matches_pytorch():
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint
    x = torch.ones(3, requires_grad=True)
    y = checkpoint(lambda t: (t * 2).sin(), x, use_reentrant=True).sum()
    with pytest.raises(RuntimeError) as err:
        torch.autograd.grad(y, [x])
    assert str(err.value) == ERR_CHECKPOINT_INVALID


def test_reentrant_checkpoint_is_refused_under_grad_with_pytorchs_text():
    from autograd_run.graphs.load import load_graph
    g = load_graph("example:reentrant")
    eng = Engine(allow_python=True)
    with pytest.raises(BackwardError) as err:
        run_graph(eng, g, mode="grad", inputs=[next(iter(g.variables))])
    assert str(err.value) == ERR_CHECKPOINT_INVALID
    run_graph(eng, g)  # plain backward: checkpoints are valid
    eng.shutdown()


# -- 8. thread-local state is per task -----------------------------------------------------------------

def test_nothing_of_a_task_leaks_onto_its_thread_after_it():
    from autograd_run.engine.tracer import Tracer
    g = two_stream_fan_in()
    seen = []

    class Probe(Tracer):
        enabled = True

        def task_popped(self, queue, gt, node, depth):
            # between tasks on a device thread: no GraphTask is current
            seen.append((eng.tls.frame, eng.grad_enabled()))
            try:
                eng.queue_callback(lambda: None)
                seen.append("queued")
            except RuntimeError as exc:
                seen.append(str(exc))
    eng = Engine(DeviceSet("virtual"), tracer=Probe())
    run_graph(eng, g, create_graph=True)
    eng.shutdown()
    assert seen and all(s == "Final callbacks can only be installed during backward pass." or s == (None, False)
                        for s in seen)


# -- 9. root gradients first -------------------------------------------------------------------------

def test_root_gradients_are_validated_before_grad_needs_inputs():
    g = graph([{"id": "n", "name": "N", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m((3,))]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m((3,))]}],
              [{"node": "n"}], [{"name": "w", "shape": [3]}])
    eng = Engine()
    with pytest.raises(RuntimeError, match=r"invalid gradient at index 0 - got \[4\] but expected shape"):
        eng.execute(GraphState(g), [("n", 0)], [np.ones(4, dtype=np.float32)], accumulate_grad=False, inputs=[])
    with pytest.raises(ValueError, match="grad requires non-empty inputs"):
        eng.execute(GraphState(g), [("n", 0)], [np.ones(3, dtype=np.float32)], accumulate_grad=False, inputs=[])


# -- 10. hooks and waits at the edges --------------------------------------------------------------------

def test_capture_only_node_still_runs_retains_grad_hooks():
    """evaluate_function: a node that only captures for grad() calls tensor pre-hooks *and* retains-grad hooks."""
    g = graph([{"id": "n", "name": "N", "op": "identity", "seq": 2, "next": [["x", 0]], "inputs": [m()]},
               {"id": "x", "name": "X", "op": "identity", "seq": 1, "next": [["acc", 0]], "inputs": [m()]},
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m()]}],
              [{"node": "n"}], [{"name": "w", "shape": [2]}])
    state = GraphState(g)
    calls = []
    state.register_tensor_pre_hook(g.by_id["x"], 0, lambda grad: calls.append("pre") or grad * 2)
    state.register_retains_grad_hook(g.by_id["x"], 0, lambda grad: calls.append("retain") or None)
    eng = Engine()
    (captured,) = eng.grad(state, [("n", 0)], [np.ones(2, dtype=np.float32)], inputs=[("x", 0)])
    eng.shutdown()
    assert calls == ["pre", "retain"]
    np.testing.assert_array_equal(captured, [2.0, 2.0])


def test_cpu_producer_feeding_a_device_node_waits_only_when_streams_differ():
    def run(stream):
        g = graph([{"id": "c", "name": "C", "op": "identity", "seq": 2, "next": [["d", 0]], "inputs": [m()]},
                   {"id": "d", "name": "D", "op": "identity", "seq": 1, "next": [["acc", 0]],
                    "inputs": [m(device="cuda:0", stream=stream)]},
                   {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:0", stream=stream)]}],
                  [{"node": "c"}], [{"name": "w", "shape": [2], "device": "cuda:0"}])
        rec = Events()
        eng = Engine(DeviceSet("virtual"), tracer=rec)
        run_graph(eng, g)
        eng.shutdown()
        return [e for e in rec.stream_events if e[1] != None or e[0] == "record"]  # noqa: E711
    # a CPU producer has no stream: its gradient counts as made on the device's current stream (0)
    assert run(0) == []
    assert run(1)[:2] == [("record", "c", "cuda:0/s0"), ("wait", "d", "cuda:0/s1")]


def test_a_device_thread_the_os_refuses_is_a_clear_error_and_leaves_no_thread_behind():
    """The OS refuses the second worker's thread (a real limit: its stack does not fit the address
    space left); the run fails with one message, the first worker ends, and shutdown does not raise."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import resource, threading
        from autograd_run.engine import DeviceSet, Engine
        from autograd_run.errors import AutogradRunError
        eng = Engine(DeviceSet("virtual", count=2))
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * resource.getpagesize()
        threading.stack_size(1 << 30)  # 1 GiB stacks: the second one cannot fit under the limit
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30) + (256 << 20),) * 2)
        try:
            eng.start_device_threads()
        except AutogradRunError as exc:
            print("refused:", exc)
        threading.stack_size(0)
        eng.shutdown(timeout=2)
        print("threads:", sorted(t.name for t in threading.enumerate() if t.name.startswith("autograd-run")))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "refused: cannot start the worker thread of device 1 of 2:" in r.stdout
    assert "threads: []" in r.stdout


def test_shutdown_after_a_failed_call_stops_every_device_thread():
    """
        root (cpu: AddBackward0) ---> bad (cuda:0, fails at once)
                                 |--> slow1 (cuda:1, 200 ms) -> w
                                 \--> slow2 (cuda:1, 200 ms) -> w
    The call fails while cuda:1 runs one slow node, the other's task still queued behind it for a
    call that has returned. Shutdown stops both workers anyway (an engine per run leaks no thread).
    """
    slow = {"name": "Slow", "op": "cost", "next": [["acc", 0]], "inputs": [m(device="cuda:1")],
            "attrs": {"cost": {"us": 200_000, "mode": "sleep"}}}
    g = graph([{"id": "root", "name": "Split", "op": "cost", "seq": 3, "next": [["bad", 0], ["slow1", 0], ["slow2", 0]],
                "inputs": [m()], "attrs": {"cost": {"us": 0}}},
               {"id": "bad", "name": "Bad", "op": "cost", "seq": 2, "next": [None], "inputs": [m(device="cuda:0")],
                "attrs": {"cost": {"us": 0}, "fail": "boom"}},
               dict(slow, id="slow1", seq=1), dict(slow, id="slow2", seq=0),
               {"id": "acc", "name": "AccumulateGrad", "variable": "w", "inputs": [m(device="cuda:1")]}],
              [{"node": "root"}], [{"name": "w", "shape": [2], "device": "cuda:1"}])
    before = {t.ident for t in threading.enumerate()}
    eng = Engine(DeviceSet("virtual"))
    with pytest.raises(BackwardError, match="boom"):
        run_graph(eng, g)
    eng.shutdown(timeout=5)
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == [] and eng.device_threads == {}
