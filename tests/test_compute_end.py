"""``tests/support/compute_end.py`` against PyTorch's engine: the callback it queues runs after the last node
and ahead of a final callback queued later in the backward (as DDP's Reducer and FSDP2's root queue theirs),
so the time it takes is the compute's end and what follows is the wait the benchmarks call exposed."""

import time

import pytest

torch = pytest.importorskip("torch")

from tests.support.compute_end import mark_compute_end  # noqa: E402


def test_the_mark_falls_between_the_last_node_and_a_later_callback():
    engine = torch.autograd.Variable._execution_engine
    seen = {}

    def late():  # stands for DDP's finalize: waits for the collectives
        seen["late_start"] = time.perf_counter_ns()
        time.sleep(0.05)

    class Slow(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            engine.queue_callback(late)  # queued by a node, as the Reducer's hook does
            time.sleep(0.02)
            seen["node_end"] = time.perf_counter_ns()
            return g * 2

    x = torch.ones(3, requires_grad=True)
    loss = Slow.apply(x).sum()
    marks = []
    hook = mark_compute_end(loss, marks)
    loss.backward()
    end = time.perf_counter_ns()
    hook.remove()
    assert len(marks) == 1
    assert seen["node_end"] <= marks[0] <= seen["late_start"]
    assert end - marks[0] >= 50_000_000  # the later callback's wait is after the mark
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    loss = Slow.apply(x).sum()
    loss.backward()  # the hook is gone: nothing more is marked
    assert len(marks) == 1
