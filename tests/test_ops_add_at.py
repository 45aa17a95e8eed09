"""``ops.arrays.add_at``: the scatter-add every accumulating rule uses (grid_sample, embedding, index_put,
as_strided, index_add, ...). The truth is the definition, term by term in Python: for every position of the
broadcast index, ``target[index at it] += value at it``. (numpy's own ``add.at`` is not the truth: numpy 2.4
adds each value once, or reads past them, when a 1-d target's index has more dims than the values.) Cases are drawn from a printed seed."""

import numpy as np
import pytest

from autograd_run.ops.arrays import _flat_terms, add_at

SEED = np.random.SeedSequence().entropy % (1 << 32)


def by_definition(target, idx, vals):
    shape = np.broadcast_shapes(*(i.shape for i in idx))
    full = [np.broadcast_to(i, shape) for i in idx]
    v = np.broadcast_to(vals, shape + target.shape[len(idx):])
    out = target.copy()
    for p in np.ndindex(*shape):
        out[tuple(int(i[p]) for i in full)] += v[p]
    return out


def _case(rng, dtype, big_target=False):
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(rng.integers(1, 6)) for _ in range(ndim))
    if big_target:
        shape = (int(rng.integers(300, 600)),) + shape[1:]
    k = int(rng.integers(1, ndim + 1))                     # integer arrays on the first k dims
    base = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 4))))
    idx = []
    for n in shape[:k]:
        s = tuple(b if rng.random() < 0.6 else 1 for b in base)   # broadcasting between the index arrays
        idx.append(rng.integers(-n, n, size=s))                    # negative indices wrap
    sel = np.broadcast_shapes(*(i.shape for i in idx)) + shape[k:]
    vshape = sel[int(rng.integers(0, len(sel) + 1)):]              # values broadcast to the selection
    vals = rng.standard_normal(vshape) * 10.0 ** rng.integers(-3, 4, size=vshape)
    cplx = np.dtype(dtype).kind == "c"
    if cplx:
        vals = vals + 1j * rng.standard_normal(vshape)
    target = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if cplx else 0)
    return target.astype(dtype), tuple(idx), vals.astype(dtype)


@pytest.mark.parametrize("big_target", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128", "complex64"])
def test_add_at_adds_every_term(dtype, big_target):
    """Small targets take the bincount path, large ones with few terms the flat add.at path."""
    rng = np.random.default_rng(SEED)
    tol = 1e-12 if dtype in ("float64", "complex128") else 1e-5
    for case in range(200):
        target, idx, vals = _case(rng, dtype, big_target)
        want = by_definition(target, idx, vals)
        got = target.copy()
        add_at(np, got, idx, vals)
        scale = max(float(np.abs(want).max()), 1.0)
        assert np.abs(got - want).max() <= tol * scale, f"seed {SEED} case {case}: {target.shape} {idx} {vals.shape}"


def test_nonfinite_terms_land_where_they_belong():
    t = np.zeros((3, 4))
    i = (np.array([0, 0, 2, 1]), np.array([1, 1, 3, 0]))
    v = np.array([np.inf, -np.inf, np.nan, np.inf])
    want = by_definition(t, i, v)
    add_at(np, t, i, v)
    np.testing.assert_array_equal(t, want)          # inf - inf is NaN, untouched entries stay 0
    c = np.zeros(4, dtype=np.complex128)
    add_at(np, c, np.array([1, 2]), np.array([complex(1, np.inf), complex(np.inf, 0)]))
    assert c[1].real == 1 and c[1].imag == np.inf and c[2].real == np.inf and c[2].imag == 0   # no NaN from 1j*inf


@pytest.mark.parametrize("size", [4, 4000], ids=["bincount", "flat add.at"])
def test_a_non_contiguous_target_is_written_through(size):
    base = np.zeros((size, 6))
    view = base[:, ::2]                                # a strided view, as moveaxis gives
    i = np.array([0, 3, 3, 1, 0, 2, 2, 2])
    v = np.arange(24, dtype=float).reshape(8, 3)
    want = by_definition(np.zeros((size, 3)), (i,), v)
    add_at(np, view, i, v)
    np.testing.assert_array_equal(base[:, ::2], want)
    assert not base[:, 1::2].any()


def test_other_forms_keep_add_at_and_its_errors():
    t = np.zeros(5)
    assert _flat_terms(t, np.array([5]), np.ones(1)) is None            # out of range: add.at raises
    with pytest.raises(IndexError):
        add_at(np, t, np.array([5]), np.ones(1))
    ints = np.zeros(5, dtype=np.int64)
    assert _flat_terms(ints, np.array([1]), np.ones(1, dtype=np.int64)) is None
    add_at(np, ints, np.array([1, 1]), np.array([2, 3]))
    assert ints.tolist() == [0, 5, 0, 0, 0]
    assert _flat_terms(t, slice(0, 2), np.ones(2)) is None              # a slice, not an integer array
    add_at(np, t, slice(0, 2), np.ones(2))
    assert t.tolist() == [1, 1, 0, 0, 0]
    with pytest.raises(ValueError):
        add_at(np, np.zeros((3, 2)), np.array([0, 1]), np.ones(3))      # values that do not broadcast
    assert _flat_terms(np.zeros(3), np.array([0, 1]), np.ones(2, dtype=complex)) is None   # complex into real


def test_an_empty_scatter_changes_nothing():
    t = np.ones((2, 3))
    add_at(np, t, (np.zeros((0,), dtype=np.int64),), np.ones((0, 3)))
    np.testing.assert_array_equal(t, np.ones((2, 3)))


def test_a_broadcast_value_is_added_at_every_index_entry():
    """The case numpy 2.4's add.at gets wrong: a 1-d target, a 2-d index, values broadcast along its first dim
    (numpy gave 6 here, and once a number read from outside the values, 2.7e98)."""
    b = np.zeros(1)
    add_at(np, b, np.zeros((2, 3), dtype=np.int64), np.array([1.0, 2.0, 3.0]))
    assert b[0] == 12.0
    big = np.zeros(1000)
    add_at(np, big, np.zeros((2, 3), dtype=np.int64), np.array([1.0, 2.0, 3.0]))   # the flat add.at path
    assert big[0] == 12.0 and big.sum() == 12.0
