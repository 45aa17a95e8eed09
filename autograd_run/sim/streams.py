"""Stream timelines of a simulation: when each accelerator stream's last kernel ends, events, waits.

The engine's ``InputBuffer`` decides which stream records and which waits
(``engine.input_buffer``); here a record is an event at the stream's current
end and a wait moves a stream's end on to the event's time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from autograd_run.engine.streams import stream_name


@dataclass(slots=True)
class SimEvent:
    time: int
    stream: tuple
    node: Any
    id: int


def stream_key(stream) -> tuple:
    """A stream ``(Device, id)`` as (device type, index, id): equal for equal streams, hashed without calling
    back into Python (a ``Device`` is a frozen dataclass, whose ``__hash__`` is Python code)."""
    dev = stream[0]
    return (dev.type, dev.index, stream[1])


class SimStreams:
    """Stream timelines: records are events at a stream's current end, waits delay a stream's next kernel."""

    def __init__(self, sim):  # the scheduler.Simulator whose streams these are (its kernel(), clock, records)
        self.sim = sim
        self._ids = itertools.count(1)
        #: stream_key -> the stream's name in records (``streams.stream_name``)
        self._names: dict = {}

    def name(self, stream) -> str:
        key = stream_key(stream)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = stream_name(stream)
        return name

    def record(self, gt, stream, node) -> SimEvent:
        sim = self.sim
        ev = SimEvent(sim.stream_free.get(stream_key(stream), 0), stream, node, next(self._ids))
        sim.stream_events.append((sim.now, gt.id, "record", node, self.name(stream), ev.id))
        return ev

    def wait(self, gt, stream, event: SimEvent, node) -> None:
        sim = self.sim
        key = stream_key(stream)
        sim.stream_free[key] = max(sim.stream_free.get(key, 0), event.time)
        sim.stream_events.append((sim.now, gt.id, "wait", node, self.name(stream), event.id))
        if event.node is not None and event.node is not node:
            sim.syncs.append((sim.now, gt.id, event.node, node, self.name(event.stream), self.name(stream)))

    def on_stream(self, stream):
        return _Accumulate(self.sim, stream)

    def sums_inline(self) -> bool:
        """Whether entering ``on_stream(stream)`` only moves the stream's end on by the simulator's ``kernel`` of
        ``sum_kernel_ns`` (this class's ``on_stream``, the simulator's own ``kernel``): the compiled loop then does
        that itself while routing (``sim_sum_inline`` in ``engine/csrc/sim_loop.c``), with no context manager
        made and entered per sum (1.25 of a random DAG's 5.5 us a node on two devices)."""
        return type(self).on_stream is SimStreams.on_stream and self.sim.kernel_is_default


class _Accumulate:
    """Summing two gradients on a stream: a small kernel (the accelerator's shortest) on that stream's timeline.

    The simulator's own ``kernel`` (``kernel_is_default``: a subclass may override it) is done here inline,
    on its ``stream_free``: the routing code enters one of these per sum, a hundred thousand times in a
    large fan-in graph, and under cProfile the call to ``kernel`` was 1.6 of the 2.4 s the sums' ``__enter__``
    took (docs/performance.md section (n)). ``test_simulate`` checks the inline copy against ``kernel``."""

    __slots__ = ("sim", "stream")

    def __init__(self, sim, stream):
        self.sim, self.stream = sim, stream

    def __enter__(self):
        sim, stream = self.sim, self.stream
        if not sim.kernel_is_default:
            sim.kernel(stream, None, sim.sum_kernel_ns)
            return
        dev = stream[0]
        key = (dev.type, dev.index, stream[1])  # stream_key, inline
        free = sim.stream_free
        start, now = free.get(key, 0), sim.now
        free[key] = (start if start > now else now) + sim.sum_kernel_ns

    def __exit__(self, *exc):
        return False
