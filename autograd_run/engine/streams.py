"""Streams and events, as the engine reasons about them (PyTorch's "streaming backwards").

A stream is a ``(device, id)`` pair. A node's canonical stream is the stream
of its first input on an accelerator (any non-CPU device); a CPU node has
none (``node_stream`` returns None). The caller's current stream on a device
is stream 0 of that device.

The decisions (which stream accumulates a gradient, which event a consumer
waits on) are PyTorch's, made in ``InputBuffer.add_on_device`` and in the
worker before a node runs; carrying them out is the ``DeviceSet``'s job:
on real CUDA an ``Event`` wraps a cupy event recorded on a cupy stream,
on virtual devices it is bookkeeping only, and either way each record and
wait is reported to the tracer (``event_record``/``event_wait``, and a
``sync`` from the event's producing node to the node that waits).
"""

from __future__ import annotations

import itertools
from typing import Any

from autograd_run.graphs.model import Device

Stream = tuple  # (Device, int)

_event_ids = itertools.count(1)


class Event:
    """An event recorded on ``stream`` after ``node`` produced a gradient there (None: the caller's input)."""

    __slots__ = ("id", "stream", "node", "handle")

    def __init__(self, stream: Stream, node: Any, handle: Any = None):
        self.id = next(_event_ids)
        self.stream = stream
        self.node = node
        #: The real event (cupy) when devices are real, else None.
        self.handle = handle

    def __repr__(self) -> str:
        return f"<Event {self.id} on {stream_name(self.stream)}>"


def node_stream(node) -> Stream | None:
    """The node's canonical stream: its device and stream id when it runs on an accelerator, else None."""
    return None if node.cpu else (node.device, node.stream)


def current_stream(device: Device) -> Stream:
    """The caller's current stream on ``device`` (stream 0)."""
    return (device, 0)


def stream_name(stream: Stream | None) -> str:
    return "-" if stream is None else f"{stream[0]}/s{stream[1]}"


class StreamOps:
    """Records and waits on events for the engine: carried out by the devices, reported to the tracer."""

    __slots__ = ("devices", "tracer")

    def __init__(self, devices, tracer):
        self.devices = devices
        self.tracer = tracer

    def record(self, gt, stream: Stream, node) -> Event:
        ev = Event(stream, node, self.devices.record_event_on(stream))
        if self.tracer.enabled:
            self.tracer.event_record(gt, node, stream_name(stream), ev.id)
        return ev

    def wait(self, gt, stream: Stream, event: Event, node) -> None:
        """``stream`` waits for ``event``, on behalf of ``node`` (the consumer)."""
        if event.handle is not None:
            self.devices.wait_event_on(stream, event.handle)
        if self.tracer.enabled:
            self.tracer.event_wait(gt, node, stream_name(stream), event.id)
            if event.node is not None and event.node is not node:
                self.tracer.sync(gt, event.node, node, stream_name(event.stream), stream_name(stream))

    def on_stream(self, stream: Stream):
        return self.devices.on_stream(stream)
