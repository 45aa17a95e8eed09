"""Devices: which array module computes a node's gradients, and copies between devices.

``cpu`` is numpy. ``cuda:N`` is cupy on a real GPU when cupy is installed
and ``cupy.is_available()`` (imported lazily), otherwise a *virtual* device:
numpy again, but run on that device index's own worker thread with its own
ready queue, so multi-device scheduling is exercised on any machine.
``mode`` forces one or the other: ``auto`` | ``virtual`` | ``cuda``.
"""

from __future__ import annotations

import threading

import numpy as np

from autograd_run.errors import UsageError


def cuda_available() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


class DeviceSet:
    def __init__(self, mode: str = "auto", blas_threads_per_device: int | None = 1):
        if mode not in ("auto", "virtual", "cuda"):
            raise UsageError(f"devices must be auto, virtual or cuda, not {mode!r}")
        real = cuda_available() if mode != "virtual" else False
        if mode == "cuda" and not real:
            raise UsageError("--devices cuda: no usable CUDA device (cupy missing or no GPU)")
        self.mode = mode
        self.real_cuda = real
        self.blas_threads_per_device = blas_threads_per_device
        self._lock = threading.Lock()  # guards nothing mutable yet; kept for backend caches
        if real:
            import cupy
            self._cupy = cupy
        else:
            self._cupy = None

    @property
    def kind(self) -> str:
        return "cuda" if self.real_cuda else "virtual"

    def xp(self, device):
        if device.is_cpu or not self.real_cuda:
            return np
        return self._cupy

    def transfer(self, array, src, dst):
        """Move ``array`` to device ``dst`` (a no-op between numpy-backed devices)."""
        if not self.real_cuda or (src.is_cpu and dst.is_cpu):
            return array
        cp = self._cupy
        if dst.is_cpu:
            return cp.asnumpy(array)
        with cp.cuda.Device(dst.index):
            return cp.asarray(array)

    def worker_init(self, device_index: int):
        """Per device thread: limit BLAS threads so N devices really run on N cores."""
        if self.blas_threads_per_device is None:
            return None
        try:
            from threadpoolctl import threadpool_limits
            return threadpool_limits(self.blas_threads_per_device)
        except Exception:  # threadpoolctl is an optimisation; never fatal
            return None
