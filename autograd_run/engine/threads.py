"""Names and kinds of the engine's threads, in one place.

The engine names its threads ``autograd-run cuda:N`` (the worker of
device index N, shared by every device type with that index) and
``autograd-run reentrant-K`` (reentrant pool threads); any other thread is
a caller driving its own backward calls (the CPU worker of its GraphTasks).
Trace writers, summaries and order files classify and sort threads with
these helpers only.
"""

from __future__ import annotations

import enum
import os
import re

_PREFIX = "autograd-run "
_DEVICE = re.compile(r"autograd-run cuda:(\d+)$")
_POOL = re.compile(r"autograd-run reentrant-(\d+)$")


class ThreadKind(enum.IntEnum):
    """In display order: callers first, then device workers, then reentrant pool threads."""

    CALLER = 0
    DEVICE = 1
    POOL = 2


def device_thread_name(index: int) -> str:
    return f"{_PREFIX}cuda:{index}"


def pool_thread_name(k: int) -> str:
    return f"{_PREFIX}reentrant-{k}"


def thread_kind(name: str) -> ThreadKind:
    if _DEVICE.match(name):
        return ThreadKind.DEVICE
    if _POOL.match(name):
        return ThreadKind.POOL
    return ThreadKind.CALLER


def thread_sort_key(name: str) -> tuple:
    """Callers (by name), then device workers by index, then pool threads by number."""
    m = _DEVICE.match(name) or _POOL.match(name)
    return (int(thread_kind(name)), int(m.group(1)) if m else 0, name)


def worker_label(name: str) -> str:
    """A short label for tables and trace tracks: ``cuda:0``, ``reentrant-2``, or the caller's name."""
    return name[len(_PREFIX):] if thread_kind(name) is not ThreadKind.CALLER else name


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; the machine's count where that is not known)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
