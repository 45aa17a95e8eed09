"""ReadyQueue: PyTorch's priority and libstdc++'s tie-breaking, checked against an independent heap."""

import random

from autograd_run.engine.ready_queue import ReadyQueue


class StdHeap:
    """A direct transcription of the C++ standard's heap operations on (key, item) pairs."""

    def __init__(self):
        self.v = []

    def push(self, k, x):
        v = self.v
        v.append((k, x))
        i = len(v) - 1
        while i > 0 and v[(i - 1) // 2][0] < k:
            v[i] = v[(i - 1) // 2]
            i = (i - 1) // 2
        v[i] = (k, x)

    def pop(self):
        v = self.v
        top = v[0]
        last = v.pop()
        n = len(v)
        if n:
            hole, child = 0, 0
            while child < (n - 1) // 2:
                child = 2 * (child + 1)
                if v[child][0] < v[child - 1][0]:
                    child -= 1
                v[hole] = v[child]
                hole = child
            if n % 2 == 0 and child == (n - 2) // 2:
                child = 2 * (child + 1)
                v[hole] = v[child - 1]
                hole = child - 1
            while hole > 0 and v[(hole - 1) // 2][0] < last[0]:
                v[hole] = v[(hole - 1) // 2]
                hole = (hole - 1) // 2
            v[hole] = last
        return top[1]


def test_leaf_ties_follow_libstdcxx():
    """Measured in PyTorch: 4 tied leaves run as 0,2,1,3 and 6 as 0,2,5,4,1,3 (heapq gives 0,1,2,...)."""
    for n, expected in ((4, [0, 2, 1, 3]), (6, [0, 2, 5, 4, 1, 3])):
        q = ReadyQueue("t")
        for i in range(n):
            q.push(7, (None, i, None))
        assert [q.pop()[1] for _ in range(n)] == expected


def test_priority_classes():
    q = ReadyQueue("t")
    q.push((0 << 64) | 5, (None, "seq5", None))
    q.push((1 << 64) | 1, (None, "deeper", None))
    q.push_wakeup("gt")
    q.push((0 << 64) | 9, (None, "seq9", None))
    q.push_shutdown()
    assert q.pop()[0] == "shutdown"
    assert q.pop()[1] is None  # wake-up
    assert [q.pop()[1] for _ in range(3)] == ["deeper", "seq9", "seq5"]


def test_random_interleavings_match_the_standard_heap():
    rng = random.Random(0)
    for _ in range(200):
        q, ref = ReadyQueue("t"), StdHeap()
        n = 0
        for _ in range(rng.randrange(1, 60)):
            if ref.v and rng.random() < 0.4:
                assert q.pop()[1] == ref.pop()
            else:
                k = rng.randrange(4)
                q.push(k, (None, n, None))
                ref.push(k, n)
                n += 1
        while ref.v:
            assert q.pop()[1] == ref.pop()
