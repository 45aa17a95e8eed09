"""The end of a backward's compute, timed from inside the backward call (the DDP and FSDP oracles).

PyTorch's engine runs a graph task's final callbacks after its last node, in the order they were queued.
A pre-hook on the loss's node runs before any other node, so the callback it queues comes ahead of the ones
DDP's Reducer (once its last bucket is ready) and FSDP2's root (in its pre-backward) queue: its time is
the end of the compute. From there to the backward call's return the rank only waits for its collectives
and copies their results back: the exposed communication as ``simulate`` defines it (``sim/ddp.py``,
``sim/fsdp.py``: from the end of the last compute node to the end of the last collective).
"""

from __future__ import annotations

import time


def mark_compute_end(loss, marks: list):
    """Arrange for the end of ``loss.backward()``'s compute (``time.perf_counter_ns()``) to be appended to
    ``marks``; returns the hook's handle (remove it after the call)."""
    import torch
    engine = torch.autograd.Variable._execution_engine

    def queue(grads):
        engine.queue_callback(lambda: marks.append(time.perf_counter_ns()))

    return loss.grad_fn.register_prehook(queue)
