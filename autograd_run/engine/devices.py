"""Devices: which array module computes a node's gradients, streams, events, copies.

``cpu`` is numpy. ``cuda:N`` is cupy on a real GPU when cupy is installed
and ``cupy.is_available()`` (imported lazily, only then), otherwise a
*virtual* device: numpy again, run on that device index's own worker thread
with its own ready queue, so multi-device scheduling is exercised on any
machine. ``mode`` forces one or the other: ``auto`` | ``virtual`` | ``cuda``.

Streams: on real CUDA each (device, stream id) gets one cupy Stream (id 0 is
the device's null stream); a node runs on its stream. Which events are
recorded and waited on is decided by the engine (``streams``,
``input_buffer``); here they are carried out on real CUDA and are no-ops on
virtual devices.

``_lock`` guards the stream cache (``_streams``).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from autograd_run.errors import RequestError


def _cupy_status() -> tuple[object | None, str]:
    try:
        import cupy
    except Exception as exc:
        return None, f"cupy is not installed ({type(exc).__name__})"
    try:
        if cupy.is_available():
            return cupy, "cupy found a CUDA device"
    except Exception as exc:
        return None, f"cupy cannot reach a GPU ({type(exc).__name__})"
    return None, "cupy found no usable CUDA device"


class DeviceSet:
    """The accelerator devices a run has: their count, array modules, streams, events and transfers.

    ``count`` is the number of device indices (one worker thread each, shared
    by every device type, as PyTorch's engine): the GPUs cupy sees, or for
    virtual devices the number asked for (None: fixed by the engine at its
    first backward call, from the graph).
    """

    def __init__(self, mode: str = "auto", blas_threads_per_device: int | None = 1, count: int | None = None,
                 needed: int = 0):
        """``needed``: the device indices the graph uses (its highest + 1). Real GPUs fewer than that:
        ``auto`` runs on virtual devices (and says why), ``cuda`` is a request error."""
        if mode not in ("auto", "virtual", "cuda"):
            raise RequestError(f"the backend must be auto, virtual or cuda, not {mode!r}", "backend")
        cupy, why = _cupy_status() if mode != "virtual" else (None, "virtual devices were requested")
        have = cupy.cuda.runtime.getDeviceCount() if cupy is not None else None
        if have is not None and needed > have:
            why = f"the graph uses cuda:{needed - 1} and cupy sees {have} CUDA device{'' if have == 1 else 's'}"
            if mode == "cuda":
                raise RequestError(f"{why}: its devices cannot all be real (virtual devices run it anywhere)",
                                   "backend")
            cupy = None
        if mode == "cuda" and cupy is None:
            raise RequestError(f"no usable CUDA device: {why}", "backend")
        self.mode = mode
        self.real_cuda = cupy is not None
        #: Why devices are real or virtual, said once in the run's output.
        self.reason = why
        self.blas_threads_per_device = blas_threads_per_device
        self._cupy = cupy
        if count is not None and count < 0:
            raise RequestError(f"device count must be non-negative, got {count}", "backend")
        self.count = have if cupy is not None else count
        self._lock = threading.Lock()  # guards _streams
        self._streams: dict[tuple[int, int], object] = {}
        self._blas_limiter = None

    @property
    def kind(self) -> str:
        return "cuda" if self.real_cuda else "virtual"

    def describe(self) -> str:
        return f"cuda:N devices are {'real' if self.real_cuda else 'virtual'} ({self.reason})"

    def xp(self, device):
        if device.is_cpu or not self.real_cuda:
            return np
        return self._cupy

    def to_device(self, array, device):
        """Place a host array (a saved tensor, a root gradient) on ``device``."""
        if not self.real_cuda or device.is_cpu or not isinstance(array, np.ndarray):
            return array
        with self._cupy.cuda.Device(device.index):
            return self._cupy.asarray(array)

    def transfer(self, array, src, dst):
        """Move ``array`` to device ``dst`` (a no-op between numpy-backed devices)."""
        if not self.real_cuda:
            return array
        cp = self._cupy
        if dst.is_cpu:
            return cp.asnumpy(array) if not isinstance(array, np.ndarray) else array
        with cp.cuda.Device(dst.index):
            return cp.asarray(array)

    def device_of(self, array):
        """The array's device where it can be told (real CUDA), else None (virtual devices)."""
        if not self.real_cuda:
            return None
        from autograd_run.graphs.model import CPU, device
        if isinstance(array, (np.ndarray, np.generic)):  # numpy scalars too: NumPy 2 gives them .device "cpu"
            return CPU
        return device("cuda", int(array.device.id))

    # -- streams and events (real CUDA only) -----------------------------------
    def stream(self, device, stream_id: int):
        key = (device.index, stream_id)
        s = self._streams.get(key)
        if s is None:
            with self._lock:
                s = self._streams.get(key)
                if s is None:
                    with self._cupy.cuda.Device(device.index):
                        s = self._cupy.cuda.Stream.null if stream_id == 0 else self._cupy.cuda.Stream(non_blocking=True)
                    self._streams[key] = s
        return s

    def record_event_on(self, stream):
        """Record an event on ``stream`` (a ``(device, id)`` pair): a cupy event on real CUDA, else None."""
        if not self.real_cuda:
            return None
        with self._cupy.cuda.Device(stream[0].index):
            ev = self._cupy.cuda.Event(disable_timing=True)
            ev.record(self.stream(stream[0], stream[1]))
        return ev

    def wait_event_on(self, stream, handle) -> None:
        """Make ``stream`` wait for a recorded cupy event (real CUDA only)."""
        with self._cupy.cuda.Device(stream[0].index):
            self.stream(stream[0], stream[1]).wait_event(handle)

    def on_stream(self, stream):
        """Run the enclosed work on ``stream`` (real CUDA), else do nothing."""
        if not self.real_cuda:
            return contextlib.nullcontext()
        return self._on_stream(stream)

    @contextlib.contextmanager
    def _on_stream(self, stream):
        with self._cupy.cuda.Device(stream[0].index):
            with self.stream(stream[0], stream[1]):
                yield

    # -- threads ----------------------------------------------------------------
    def limit_blas(self) -> None:
        """Make BLAS single-threaded (process-wide) so N device workers use N cores, not N x cores."""
        if self.blas_threads_per_device is None or self._blas_limiter is not None:
            return
        try:
            from threadpoolctl import threadpool_limits
            self._blas_limiter = threadpool_limits(self.blas_threads_per_device, user_api="blas")
        except Exception:  # threadpoolctl is an optimisation; never fatal
            self._blas_limiter = None

    def restore_blas(self) -> None:
        if self._blas_limiter is not None:
            self._blas_limiter.restore_original_limits()
            self._blas_limiter = None
