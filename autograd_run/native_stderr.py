"""Silencing what native code writes to the process's stderr (file descriptor 2) for a moment.

PyTorch's profiler (its Kineto library) prints ``USDT: ... profiler_start``
lines straight to descriptor 2 each time a profiler starts and stops, past
Python's ``sys.stderr`` and any logging setting. ``silenced()`` points
descriptor 2 at the null device while a profiler runs inside ``capture``
and puts it back afterwards, so a user sees our output only. Python's own
writes in that window are flushed before and after; an exception still
propagates (it is reported after the descriptor is restored).
"""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def silenced():
    """Descriptor 2 goes to the null device inside the block (a no-op where it cannot be redirected)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
        finally:
            os.close(null)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
