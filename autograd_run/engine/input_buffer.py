"""InputBuffer: the gradients arriving at one node, one slot per input.

The first gradient for a slot is stored as given. Later ones are added: in
place when the buffer owns the stored array (it was created by an earlier
addition here), otherwise out of place, since the first array may still be
referenced elsewhere (a rule may return one array for several outputs, as
AddBackward0 does). ``producers`` remembers which node produced each slot's
gradient, so the consumer can report cross-stream and cross-device syncs.

An InputBuffer is touched only under its GraphTask's lock while it sits in
``not_ready``, and by one worker after it was pushed; it needs no lock.
"""

from __future__ import annotations


class InputBuffer:
    __slots__ = ("grads", "owned", "producers")

    def __init__(self, size: int):
        self.grads: list = [None] * size
        #: Per slot: does the buffer own the stored array (allocated lazily).
        self.owned: list[bool] | None = None
        #: Per slot: the node that produced it, kept only when syncs matter (lazily).
        self.producers: list | None = None

    def add(self, pos: int, grad, producer=None) -> None:
        if grad is None:
            return
        grads = self.grads
        old = grads[pos]
        if old is None:
            grads[pos] = grad
            if producer is not None:
                if self.producers is None:
                    self.producers = [None] * len(grads)
                self.producers[pos] = producer
            return
        owned = self.owned
        if owned is None:
            owned = self.owned = [False] * len(grads)
        if owned[pos]:
            old += grad
        else:
            grads[pos] = old + grad
            owned[pos] = True

    def __len__(self) -> int:
        return len(self.grads)
