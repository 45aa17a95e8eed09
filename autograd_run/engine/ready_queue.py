"""ReadyQueue: a blocking max-heap of NodeTasks with libstdc++'s exact tie-breaking.

PyTorch keeps ready tasks in ``std::priority_queue`` (a vector plus
``push_heap``/``pop_heap``). When keys tie (e.g. several AccumulateGrad
nodes ready at once) the pop order is whatever that heap algorithm yields,
which differs from ``heapq``. ``_push`` and ``_pop`` reproduce libstdc++'s
sift-up and its "move the hole down to a leaf, then sift up" pop, so ties
break exactly as in PyTorch.

State (all guarded by ``_lock``):
  ``_keys``  the heap's priority keys (larger pops first);
  ``_items`` the tasks, parallel to ``_keys``.
``_not_empty`` (a Condition on ``_lock``) wakes a worker blocked in ``pop``.
A task is a tuple ``(graph_task, node, input_buffer)``; ``node`` is None for
a wake-up task; ``SHUTDOWN`` is the shutdown task.
"""

from __future__ import annotations

import threading
import time

from autograd_run.engine.priority import SHUTDOWN_KEY, WAKEUP_KEY

SHUTDOWN = ("shutdown", None, None)


class ReadyQueue:
    __slots__ = ("name", "_keys", "_items", "_lock", "_not_empty", "_waiting", "tracer")

    def __init__(self, name: str, tracer=None):
        self.name = name
        self._keys: list[int] = []
        self._items: list = []
        self._lock = threading.Lock()  # guards _keys and _items
        self._not_empty = threading.Condition(self._lock)
        self._waiting = 0  # workers blocked in pop (guarded by _lock); notify only then
        self.tracer = tracer

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)

    def empty(self) -> bool:
        """Whether the queue is empty now (a hint: read without the lock)."""
        return not self._keys

    @property
    def waiting(self) -> int:
        """Workers blocked in ``pop`` now (a hint: stale once the lock is released)."""
        with self._lock:
            return self._waiting

    def push(self, key: int, item) -> None:
        tracer = self.tracer
        if tracer is not None and tracer.enabled:
            waited = 0
            if not self._lock.acquire(False):  # contended: measure the wait
                t0 = time.perf_counter_ns()
                self._lock.acquire()
                waited = time.perf_counter_ns() - t0
            try:
                self._push(key, item)
                depth = len(self._keys)
                if self._waiting:
                    self._not_empty.notify()
            finally:
                self._lock.release()
            if item is SHUTDOWN:
                return
            if waited:
                tracer.lock_wait(f"queue {self.name}", item[0], waited)
            tracer.task_pushed(self, item[0], item[1], depth)
            return
        with self._lock:
            self._push(key, item)
            if self._waiting:
                self._not_empty.notify()

    def push_wakeup(self, graph_task) -> None:
        self.push(WAKEUP_KEY, (graph_task, None, None))

    def push_shutdown(self) -> None:
        self.push(SHUTDOWN_KEY, SHUTDOWN)

    def pop(self, waiting_for=None):
        """The top task, blocking while the queue is empty.

        ``waiting_for`` is the GraphTask whose completion the popping loop waits
        for (None for a device thread serving its queue); it only tells the
        tracer what a blocked thread was waiting for.
        """
        tracer = self.tracer
        waited = 0
        if tracer is None or not tracer.enabled:
            self._lock.acquire()
        elif not self._lock.acquire(False):  # contended: measure the wait
            t0 = time.perf_counter_ns()
            self._lock.acquire()
            waited = time.perf_counter_ns() - t0
        try:
            if not self._keys:
                t0 = time.perf_counter_ns() if tracer is not None and tracer.enabled else 0
                self._waiting += 1
                try:
                    while not self._keys:
                        self._not_empty.wait()
                finally:
                    self._waiting -= 1
                if t0:
                    tracer.worker_idle(self, t0, time.perf_counter_ns(), waiting_for)
                waited = 0  # waiting for the lock was part of going idle
            item = self._pop()
            depth = len(self._keys)
        finally:
            self._lock.release()
        if tracer is not None and tracer.enabled and item is not SHUTDOWN:
            if waited:
                tracer.lock_wait(f"queue {self.name}", item[0], waited)
            tracer.task_popped(self, item[0], item[1], depth)
        return item

    def rekey(self, match, new_key) -> None:
        """Give the queued items that ``match`` the key ``new_key(item)`` in place, without re-heaping.

        PyTorch's comparator reads a task's depth from its GraphTask at every
        comparison, so when a GraphTask expires its queued tasks change rank
        where they stand; changing the stored keys in place reproduces that.
        """
        with self._lock:
            items = self._items
            for i in range(len(items)):
                if match(items[i]):
                    self._keys[i] = new_key(items[i])

    def snapshot(self) -> list[tuple[int, object]]:
        """The queued (key, item) pairs, in heap order (for diagnostics)."""
        with self._lock:
            return list(zip(self._keys, self._items))

    # -- libstdc++ heap algorithms (caller holds _lock) ------------------------
    def _push(self, key: int, item) -> None:
        keys, items = self._keys, self._items
        keys.append(key)
        items.append(item)
        hole = len(keys) - 1
        while hole > 0:
            parent = (hole - 1) >> 1
            if not keys[parent] < key:
                break
            keys[hole] = keys[parent]
            items[hole] = items[parent]
            hole = parent
        keys[hole] = key
        items[hole] = item

    def _pop(self):
        keys, items = self._keys, self._items
        top = items[0]
        last_key = keys.pop()
        last_item = items.pop()
        length = len(keys)
        if length == 0:
            return top
        # __adjust_heap(first, 0, length, last): walk the hole down to a leaf,
        # always taking the larger child (the right one on ties)...
        hole = 0
        child = 0
        limit = (length - 1) >> 1
        while child < limit:
            child = child + child + 2
            right = keys[child]
            left = keys[child - 1]
            if right < left:
                child -= 1
                keys[hole] = left
            else:
                keys[hole] = right
            items[hole] = items[child]
            hole = child
        if (length & 1) == 0 and child == (length - 2) >> 1:
            child = 2 * (child + 1)
            keys[hole] = keys[child - 1]
            items[hole] = items[child - 1]
            hole = child - 1
        # ...then __push_heap the former last element up from that leaf (the same
        # sift-up as _push, inlined: both run once per node on the hot path).
        while hole > 0:
            parent = (hole - 1) >> 1
            if not keys[parent] < last_key:
                break
            keys[hole] = keys[parent]
            items[hole] = items[parent]
            hole = parent
        keys[hole] = last_key
        items[hole] = last_item
        return top
