"""The statistics behind ``diff``: Mann–Whitney U (exact and normal), Holm, Kendall's tau, against
values worked out by hand or by enumeration."""

import itertools
import math

import pytest

from autograd_run.analysis.stats import _u_counts, holm, kendall_tau, mann_whitney, median, min_p


def brute_u_counts(n, m):
    """The null distribution of U by listing every way to place n a's among n + m values."""
    counts = [0] * (n * m + 1)
    for a_pos in itertools.combinations(range(n + m), n):
        a_set = set(a_pos)
        # U counts pairs where an a is above a b: each a at position p is above the b's below it.
        u = sum(sum(1 for q in range(p) if q not in a_set) for p in a_pos)
        counts[u] += 1
    return counts


@pytest.mark.parametrize("n,m", [(1, 1), (2, 2), (3, 2), (4, 5), (6, 3)])
def test_exact_u_distribution_matches_enumeration(n, m):
    assert list(_u_counts(n, m)) == brute_u_counts(n, m)
    assert sum(_u_counts(n, m)) == math.comb(n + m, n)


def test_completely_separated_samples_give_the_smallest_p():
    t = mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert t.exact and t.u == 0
    assert t.p == pytest.approx(2 / math.comb(10, 5)) == pytest.approx(min_p(5, 5))


def test_exact_p_by_hand():
    # a = [1, 4], b = [2, 3, 5]: a's pairs above b: 4 > 2, 4 > 3 -> U = 2; distribution of U for (2, 3)
    # is [1, 1, 2, 2, 2, 1, 1] (10 arrangements): P(U <= 2) = 4/10, P(U >= 2) = 8/10 -> p = 0.8.
    t = mann_whitney([1, 4], [2, 3, 5])
    assert t.u == 2 and t.exact and t.p == pytest.approx(0.8)


def test_identical_samples_are_not_different():
    t = mann_whitney([5, 5, 5], [5, 5, 5])
    assert not t.exact and t.p == 1.0


def test_ties_use_the_normal_approximation_with_correction():
    a, b = [1, 2, 2, 3, 4, 4, 5, 6], [3, 4, 4, 5, 6, 7, 7, 8]
    t = mann_whitney(a, b)
    assert not t.exact
    # By hand: sorted, a's mid-ranks are 1, 2.5, 2.5, 4.5, 7.5, 7.5, 10.5, 12.5 (sum 48.5), so
    # U = 48.5 - 8*9/2 = 12.5; tie groups of sizes 2 (2s), 2 (3s), 4 (4s), 2, 2, 2 give
    # sum(t^3 - t) = 6 + 6 + 60 + 6 + 6 + 6 = 90; var = 64/12 * (17 - 90/240);
    # z = (|12.5 - 32| - 0.5) / sqrt(var).
    assert t.u == 12.5
    z = 19 / math.sqrt(64 / 12 * (17 - 90 / 240))
    assert t.p == pytest.approx(math.erfc(z / math.sqrt(2)))


def test_large_samples_use_the_normal_approximation():
    a = list(range(40))
    b = [x + 0.5 for x in range(40)]
    t = mann_whitney(a, b)
    assert not t.exact and 0.5 < t.p <= 1.0
    shifted = mann_whitney(a, [x + 30.5 for x in range(40)])
    assert shifted.p < 1e-6


def test_min_p():
    assert min_p(1, 1) == 1.0
    assert min_p(3, 3) == pytest.approx(0.1)
    assert min_p(5, 5) < 0.01 < min_p(4, 4)


def test_holm_adjusts_in_order_and_stays_monotone():
    # sorted p: 0.01 (x3 = 0.03), 0.02 (x2 = 0.04), 0.04 (x1 = 0.04)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_kendall_tau():
    assert kendall_tau("abcde", "abcde") == (1.0, 5)
    assert kendall_tau("abcde", "edcba") == (-1.0, 5)
    # one adjacent swap among 4 items: 1 discordant pair of 6 -> tau = 1 - 2 * 1/6 * 2 = 2/3
    tau, n = kendall_tau("abcd", "abdc")
    assert n == 4 and tau == pytest.approx(2 / 3)
    # only common items count
    assert kendall_tau("axbc", "abyc") == (1.0, 3)


def test_kendall_tau_counts_inversions_like_a_double_loop():
    import random
    rng = random.Random(3)
    items = list(range(60))
    other = items[:]
    rng.shuffle(other)
    pos = {x: i for i, x in enumerate(other)}
    seq = [pos[x] for x in items]
    inv = sum(1 for i in range(60) for j in range(i + 1, 60) if seq[i] > seq[j])
    assert kendall_tau(items, other)[0] == pytest.approx(1 - 4 * inv / (60 * 59))


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        median([])
