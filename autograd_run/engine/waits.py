"""Occupying a worker thread for a stated time, with or without Python's GIL.

``spin(seconds)`` busy-waits in Python: it holds the GIL throughout, as a
node that runs Python code does. ``wait(seconds)`` occupies the thread
without holding the GIL, as a C++ kernel in PyTorch's engine does: it
sleeps (timer slack lowered to 1 ns on Linux, the measured overshoot
subtracted) and busy-waits the last stretch, in compiled code without the
GIL when the native extension is built, else in Python (holding the GIL
for at most ``SPIN_TAIL`` seconds).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

#: The last stretch of a wait is a busy wait (a sleep overshoots by tens of µs).
SPIN_TAIL = 150e-6

_slack_set = threading.local()


def _find_prctl():
    """Linux's ``prctl``, found once: ``ctypes.CDLL(None)`` is a ``dlopen`` that costs 50-90 µs, which a
    thread's first wait paid while holding the GIL (a fresh process's first pass, every device thread)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


def _lower_timer_slack() -> None:
    """Linux: this thread's sleeps wake within ~µs of their deadline (PR_SET_TIMERSLACK = 1 ns)."""
    if getattr(_slack_set, "done", False):
        return
    _slack_set.done = True
    if _PRCTL is not None:
        _PRCTL(29, 1, 0, 0, 0)


#: A long wait checks this often whether it should stop early (its backward call was stopped).
CHECK_EVERY = 0.02


def spin(seconds: float, stopped=None) -> None:
    """Busy-wait ``seconds`` holding the GIL; ``stopped()`` true ends it early."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if stopped is not None and stopped():
            return


def sleep(seconds: float, stopped=None) -> None:
    """``time.sleep(seconds)``, in slices of ``CHECK_EVERY`` when ``stopped`` is given."""
    if stopped is None:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while not stopped():
        left = end - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, CHECK_EVERY))


def _native_spin_until():
    from autograd_run.engine import core  # the compiled core, when built
    return core.spin_until


_SPIN_UNTIL = _native_spin_until()


def wait(seconds: float, stopped=None) -> None:
    """Occupy this thread for ``seconds`` without holding the GIL (see the module docstring);
    ``stopped()`` true ends it early (checked every ``CHECK_EVERY`` of a long wait)."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    if seconds > SPIN_TAIL:
        _lower_timer_slack()
        if stopped is None or seconds < CHECK_EVERY:
            time.sleep(seconds - SPIN_TAIL)
        else:
            sleep(seconds - SPIN_TAIL, stopped)
            if stopped():
                return
    if _SPIN_UNTIL is not None:
        _SPIN_UNTIL(end)
    else:
        while time.perf_counter() < end:
            pass
