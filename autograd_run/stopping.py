"""Stopping a run from outside: on request (Ctrl-C) or at a time limit.

``RunStop`` is the handle a caller keeps: ``request(reason)`` may be called
from any thread and from a signal handler (it sets one attribute and writes
one byte to a pipe: no lock, no allocation that could deadlock the
interrupted main thread). ``Watchdog`` is the thread that acts on it: it
sleeps in ``select`` on that pipe (no polling, no GIL held) until a request
arrives, the time limit passes, or the run ends; on a request or the time
limit it calls ``stop(reason)`` once (the session interrupts its engine
there), from its own thread, where taking the engine's locks is safe.
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Callable

#: Why a run was stopped: Ctrl-C (or a caller's request), or its time limit.
INTERRUPTED = "interrupted"
TIMEOUT = "timeout"

_END = b"e"
_STOP = b"!"


class RunStop:
    """A request to stop a run; ``reason`` is set by the first ``request``."""

    def __init__(self):
        self.reason: str | None = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)

    def request(self, reason: str = INTERRUPTED) -> None:
        """Ask the run to stop (safe in a signal handler and from any thread)."""
        if self.reason is None:
            self.reason = reason
        self._poke(_STOP)

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def _poke(self, byte: bytes) -> None:
        try:
            os.write(self._w, byte)
        except OSError:  # the pipe is full (a request is pending anyway) or closed (the run is over)
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1


#: The longest single wait of the watchdog (a timeout beyond it is waited for in turns).
MAX_WAIT_S = 86400.0


class Watchdog:
    """A thread that calls ``stop(reason)`` once, when ``stopper`` is requested or ``timeout`` passes."""

    def __init__(self, stopper: RunStop, timeout: float | None, stop: Callable[[str], None]):
        self.stopper = stopper
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._stop = stop
        self._thread = threading.Thread(target=self._main, name="autograd-run watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopper._poke(_END)
        self._thread.join()

    def _main(self) -> None:
        fd = self.stopper._r
        while True:
            left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            # select takes at most what the platform's time_t holds: a far deadline is waited for by the day
            ready, _, _ = select.select([fd], [], [], None if left is None else min(left, MAX_WAIT_S))
            if not ready and left is not None and left > MAX_WAIT_S:
                continue
            if not ready:  # the time limit passed
                if self.stopper.reason is None:
                    self.stopper.reason = TIMEOUT
                self._stop(self.stopper.reason)
                return
            data = os.read(fd, 64)
            if _STOP in data:
                self._stop(self.stopper.reason or INTERRUPTED)
                return
            if _END in data or not data:
                return
