"""Preloaded into each worker process of the embedded LocalCluster (Dask's ``preload``).

Ctrl-C in a terminal reaches the whole foreground process group, the
LocalCluster's worker processes included. The client is the one that answers
it (cancelling the unfinished tasks and closing the cluster), so a worker
ignores SIGINT instead of dying with a traceback of its own. It runs again
in a worker that its nanny restarts.
"""

from __future__ import annotations

import signal
import threading


def dask_setup(worker=None) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
