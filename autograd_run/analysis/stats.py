"""Statistics for comparing two runs, in plain Python (no SciPy).

``mann_whitney(a, b)``  the two-sided Mann–Whitney U test of "a and b come
                        from the same distribution": exact (the null
                        distribution of U counted as a Gaussian binomial)
                        when both samples have at most ``EXACT_MAX`` values
                        and no value is tied; else the normal approximation
                        with the tie and continuity corrections.
``min_p(n, m)``         the smallest two-sided p-value any n and m values can
                        give (2 / C(n+m, n)): below it, no difference can be
                        called significant, however large.
``holm(ps)``            Holm–Bonferroni adjusted p-values (many nodes tested
                        at once, the family-wise error stays at alpha).
``kendall_tau(a, b)``   Kendall's tau between two orders of the same items
                        (the items both contain), counted by merge sort.
``median(xs)``          the median (the mean of the two middle values).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Sequence

EXACT_MAX = 30


class UTest(NamedTuple):
    u: float
    p: float
    exact: bool


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        raise ValueError("median of no values")
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many of the C(n+m, n) arrangements give U = 0, 1, ..., n*m: the coefficients of the
    Gaussian binomial [n+m choose n]_q = prod_{k=1..n} (1 - q^(m+k)) / (1 - q^k)."""
    poly = [1] + [0] * (n * m)
    for k in range(1, n + 1):
        step = m + k
        for u in range(len(poly) - 1, step - 1, -1):  # times (1 - q^step)
            poly[u] -= poly[u - step]
        for u in range(k, len(poly)):                  # divided by (1 - q^k)
            poly[u] += poly[u - k]
    return tuple(poly)


def min_p(n: int, m: int) -> float:
    """The smallest two-sided p-value of the U test with n and m values."""
    if n < 1 or m < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n + m, n))


def _ranks(values: list[float]) -> tuple[list[float], float]:
    """Mid-ranks (1-based) of ``values`` and the tie term sum(t^3 - t) over tied groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = r
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    return ranks, ties


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> UTest:
    """Two-sided Mann–Whitney U test; U is a's statistic (pairs where a's value is the larger)."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("the U test needs values on both sides")
    ranks, ties = _ranks([float(x) for x in a] + [float(x) for x in b])
    u = sum(ranks[:n]) - n * (n + 1) / 2
    if ties == 0 and n <= EXACT_MAX and m <= EXACT_MAX:
        counts = _u_counts(n, m)
        total = math.comb(n + m, n)
        k = int(round(u))
        below = sum(counts[:k + 1])
        above = sum(counts[k:])
        return UTest(u, min(1.0, 2 * min(below, above) / total), True)
    big = n + m
    var = n * m / 12 * ((big + 1) - ties / (big * (big - 1)))
    if var <= 0:
        return UTest(u, 1.0, False)
    z = max(0.0, abs(u - n * m / 2) - 0.5) / math.sqrt(var)
    return UTest(u, min(1.0, math.erfc(z / math.sqrt(2))), False)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input's order."""
    k = len(ps)
    order = sorted(range(k), key=lambda i: ps[i])
    out = [1.0] * k
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * ps[i]))
        out[i] = running
    return out


def _inversions(xs: list[int]) -> int:
    """Pairs i < j with xs[i] > xs[j], by an iterative merge sort."""
    n = len(xs)
    cur = list(xs)
    inv = 0
    width = 1
    while width < n:
        nxt = []
        for lo in range(0, n, 2 * width):
            left, right = cur[lo:lo + width], cur[lo + width:lo + 2 * width]
            i = j = 0
            while i < len(left) and j < len(right):
                if right[j] < left[i]:
                    inv += len(left) - i
                    nxt.append(right[j])
                    j += 1
                else:
                    nxt.append(left[i])
                    i += 1
            nxt.extend(left[i:])
            nxt.extend(right[j:])
        cur = nxt
        width *= 2
    return inv


def kendall_tau(a: Sequence, b: Sequence) -> tuple[float, int]:
    """Kendall's tau between the orders ``a`` and ``b`` over the items both contain (each once), and
    how many items that is: 1 for the same order, -1 for the reverse."""
    pos = {x: i for i, x in enumerate(b)}
    seq = [pos[x] for x in a if x in pos]
    n = len(seq)
    if n < 2:
        return 1.0, n
    return 1.0 - 4.0 * _inversions(seq) / (n * (n - 1)), n
