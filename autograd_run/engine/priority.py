"""Ready-queue priority: which ready task runs first.

A policy maps a task to an integer key; the ready queue pops the largest
key first, breaking ties exactly as libstdc++'s ``std::priority_queue``
does (see ``ready_queue``). PyTorch's rule (``CompareNodeTaskTime``):
shutdown tasks, then wake-up tasks, then the larger reentrant depth, then
the larger sequence number; AccumulateGrad nodes carry 2**64-1.
"""

from __future__ import annotations

#: Keys above every node key (depth < 2**31, seq < 2**64).
WAKEUP_KEY = 1 << 100
SHUTDOWN_KEY = 1 << 101
#: The depth PyTorch ranks a task of an expired GraphTask with (INT_MAX): such tasks pop first.
EXPIRED_DEPTH = 2**31 - 1


class PyTorchPriority:
    """PyTorch's order: deeper reentrant GraphTasks first, then higher sequence number."""

    name = "pytorch"

    @staticmethod
    def key(depth: int, node) -> int:
        return (depth << 64) | node.seq


class FifoPriority:
    """An alternative for what-if studies: tasks run in the order they became ready."""

    name = "fifo"

    def __init__(self):
        import itertools
        self._counter = itertools.count()

    def key(self, depth: int, node) -> int:
        return (depth << 64) | ((1 << 64) - 1 - next(self._counter))
