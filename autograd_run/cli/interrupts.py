"""Ctrl-C during a run: the first press stops the run cleanly, a second one stops it at once.

``ctrl_c_stops(stopper)`` installs, for the length of the ``with`` block, a
SIGINT handler that calls ``stopper.request()`` on the first press (the run
stops, its recording is written, marked incomplete, and the command exits
130) and raises ``KeyboardInterrupt`` on the next one (for a run stuck in a
node that does not return). Outside the main thread it does nothing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from autograd_run.stopping import INTERRUPTED, RunStop


@contextmanager
def ctrl_c_stops(stopper: RunStop):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        stopper.request(INTERRUPTED)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
