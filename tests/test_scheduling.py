r"""Which node runs next: PyTorch's ready-queue rules on small graphs drawn in each test.

A graph is drawn root on top, gradients flowing down. Node names come from the
``abcde`` fixture, in both orders, so each order below is shown not to depend on names.
Multithreading is off: every node runs on the calling thread, one at a time.
"""

import numpy as np
import pytest

from builders import chain, doc, executed, fan, graph, leaf, mul, run_traced


def test_higher_sequence_number_runs_first(abcde):
    r"""
           r
         / | \
        a  b  c        seq: a 1, b 3, c 2
         \ | /
          acc x

    Ready together, b (seq 3) runs before c (seq 2) before a (seq 1).
    """
    a, b, c = abcde[:3]
    g = graph(doc(
        fan("r", [a, b, c], seq=9),
        mul(a, "acc", 2.0, seq=1, shape=[2]),
        mul(b, "acc", 3.0, seq=3, shape=[2]),
        mul(c, "acc", 4.0, seq=2, shape=[2]),
        leaf("x", [2], id="acc"),
    ))
    assert executed(g) == ["r", b, c, a, "acc"]


def test_a_node_waits_for_all_its_inputs(abcde):
    r"""
           r
          / \
         a   b         seq: a 3, b 1, c 2
         |   |
         c   |
          \ /
         acc x

    AccumulateGrad outranks every other node, yet it runs only after both c and b
    sent their gradients: a, c, then b, then acc.
    """
    a, b, c = abcde[:3]
    g = graph(doc(
        fan("r", [a, b], seq=9),
        mul(a, c, 2.0, seq=3, shape=[2]),
        mul(c, "acc", 2.0, seq=2, shape=[2]),
        mul(b, "acc", 3.0, seq=1, shape=[2]),
        leaf("x", [2], id="acc"),
    ))
    assert executed(g) == ["r", a, c, b, "acc"]
    np.testing.assert_allclose(run_traced(g, None, multithreading=False).grads["x"], [7.0, 7.0])


@pytest.mark.parametrize("op,grad", [("mul", 16.0), ("add", 1.0)])
def test_a_chain_runs_from_the_root_down(op, grad):
    r"""
    mul3 -> mul2 -> mul1 -> mul0 -> acc x        (y = x * 2 * 2 * 2 * 2; or y = x + 1 + 1 + 1 + 1)
    """
    g = graph(doc(*chain(4, op)))
    assert executed(g) == [f"{op}3", f"{op}2", f"{op}1", f"{op}0", "acc_x"]
    np.testing.assert_allclose(run_traced(g, None).grads["x"], [grad, grad])


def test_equal_priorities_pop_as_libstdcxx_heap_not_by_name(abcde):
    r"""
                  r
        / /   /   |   \   \
      l0 l1  l2   l3   l4  l5     six leaves (AccumulateGrad: all the same priority)

    The leaves become ready in edge order and pop as PyTorch's std::priority_queue
    pops ties: 0, 2, 5, 4, 1, 3 (whatever their names).
    """
    names = list(abcde) + ["f"]
    leaves = [leaf(n, [2]) for n in names]
    g = graph(doc(fan("r", [n["id"] for n in leaves], seq=9), *leaves))
    assert executed(g)[1:] == [leaves[k]["id"] for k in (0, 2, 5, 4, 1, 3)]
