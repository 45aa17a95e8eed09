"""InputBuffer: the gradients arriving at one node, one slot per input, with PyTorch's stream rules.

CPU gradients (``add``): the first gradient for a slot is stored as given;
later ones are added, in place when the buffer owns the stored array (it
was created by an earlier addition here), otherwise out of place, since the
first array may still be referenced elsewhere (a rule may return one array
for several outputs, as AddBackward0 does).

Accelerator gradients (``add_on_device``), as PyTorch's ``InputBuffer::add``:
the first producer of a slot decides its accumulation stream (the
consumer's stream when the gradient is on the consumer's device, else the
producer's when on the producer's device, else the device's current
stream) and, when the consumer or the accumulation stream differs from the
producer's, an event is recorded on the producer's stream. A later
producer makes the accumulation stream wait on an event of its own stream
and on the slot's previous ready event, the sum runs on the accumulation
stream, and a new ready event is recorded there when the consumer's stream
differs. The consumer waits on each slot's ready event before it runs
(``ready_waits``).

An InputBuffer is touched only under its GraphTask's lock while it sits in
``not_ready``, and by one worker after it was pushed; it needs no lock.
The engine uses ``engine.core.InputBuffer``: this class, or the same rules
over slots kept in C by the compiled core. The compiled ``route`` does the
two commonest cases of ``add_on_device`` itself (a slot's first gradient,
made on the consumer's own stream of the gradient's device: no event; a later
one where the producer, the slot's ready stream and the consumer are all the
accumulation stream: the sum inside ``streams.on_stream``, no event) and
calls these rules for every other one.
"""

from __future__ import annotations

from autograd_run.engine.streams import current_stream


class StreamRules:
    """PyTorch's stream rules for accelerator gradients, over the slots of an InputBuffer."""

    __slots__ = ()

    def add_on_device(self, pos: int, grad, device, producer_stream, consumer_stream, producer, consumer,
                      streams, gt) -> None:
        """Add a gradient that lives on accelerator ``device`` (see the module docstring).

        ``producer_stream``/``consumer_stream`` are the producing and consuming
        nodes' canonical streams (None for a CPU node, or for the caller's root
        gradient: then the device's current stream); ``streams`` carries out
        records and waits (``streams.StreamOps``) and reports them for ``gt``.
        """
        if grad is None:
            return
        if producer_stream is None:
            producer_stream = current_stream(device)
        if consumer_stream is None:
            consumer_stream = current_stream(device)
        if self.accum_streams is None:
            n = len(self.grads)
            self.accum_streams, self.ready_streams, self.ready_events = [None] * n, [None] * n, [None] * n
        accum = self.accum_streams[pos]
        if accum is None:  # first producer
            if consumer_stream[0] == device:
                accum = consumer_stream
            elif producer_stream[0] == device:
                accum = producer_stream
            else:
                accum = current_stream(device)
            self.accum_streams[pos] = accum
            self.grads[pos] = grad
            if consumer_stream != producer_stream or accum != producer_stream:
                self.ready_events[pos] = streams.record(gt, producer_stream, producer)
            self.ready_streams[pos] = producer_stream
            return
        # a later producer: both gradients must be ready on the accumulation stream
        if accum != producer_stream:
            streams.wait(gt, accum, streams.record(gt, producer_stream, producer), consumer)
        if accum != self.ready_streams[pos]:
            streams.wait(gt, accum, self.ready_events[pos], consumer)
        with streams.on_stream(accum):
            self._sum(pos, self.grads[pos], grad)
        if consumer_stream != accum:
            self.ready_events[pos] = streams.record(gt, accum, producer)
        self.ready_streams[pos] = accum

    def ready_waits(self, parent_stream):
        """(slot, event) pairs the consumer running on ``parent_stream`` must wait on."""
        ready = self.ready_streams
        if ready is None:
            return ()
        return [(pos, self.ready_events[pos]) for pos, s in enumerate(ready)
                if s is not None and self.grads[pos] is not None and s != parent_stream]


class InputBuffer(StreamRules):
    """The pure-Python InputBuffer (the compiled core has the slots in C: ``engine.core``)."""

    __slots__ = ("grads", "owned", "accum_streams", "ready_streams", "ready_events")

    def __init__(self, size: int):
        self.grads: list = [None] * size
        #: Per slot: does the buffer own the stored array (allocated lazily).
        self.owned: list[bool] | None = None
        #: Per slot, for accelerator gradients only (allocated lazily): where sums run, which
        #: stream the stored gradient is ready on, and the event to wait on for it (or None).
        self.accum_streams: list | None = None
        self.ready_streams: list | None = None
        self.ready_events: list | None = None

    def add(self, pos: int, grad) -> None:
        """Add a CPU gradient into slot ``pos``."""
        if grad is None:
            return
        grads = self.grads
        old = grads[pos]
        if old is None:
            grads[pos] = grad
            return
        self._sum(pos, old, grad)

    def _sum(self, pos: int, old, grad) -> None:
        owned = self.owned
        if owned is None:
            owned = self.owned = [False] * len(self.grads)
        if owned[pos]:
            old += grad
        else:
            self.grads[pos] = old + grad
            owned[pos] = True

    def __len__(self) -> int:
        return len(self.grads)
