"""Random saved tensors seeded in bulk (``graphs.seeding``) are, value for value, what one generator per
spec draws (``numpy.random.Generator(PCG64(seed + seed_offset))``): every dtype (bfloat16 through
ml_dtypes), both distributions, big tensors drawn in chunks, seeds beyond 64 bits."""

import numpy as np
import pytest

from autograd_run.graphs import seeding
from autograd_run.graphs.tensors import SideFiles, materialize, materialize_random_many


def plain(seed: int, shape: tuple, dtype: str, dist: str) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.asarray(rng.random(shape) if dist == "uniform" else rng.standard_normal(shape), dtype=dtype)


@pytest.mark.parametrize("offset", [0, 7])
def test_bulk_seeding_draws_what_one_generator_per_spec_draws(offset):
    side = SideFiles(None, None)
    side.seed_offset = offset
    rnd = np.random.default_rng(0)
    specs = []
    for k in range(200):
        seed = int(rnd.integers(0, 2**63)) if k % 3 else k
        if k % 17 == 0:
            seed = 2**64 + k  # beyond 64 bits: drawn the plain way
        specs.append({"random": seed, "shape": [int(rnd.integers(0, 5)), 3],
                      "dtype": ["float32", "float64", "float16", "bfloat16", "complex64"][k % 5],
                      "dist": "uniform" if k % 2 else "normal"})
    many = materialize_random_many(specs, side)
    for spec, got in zip(specs, many):
        want = plain(spec["random"] + offset, tuple(spec["shape"]), spec["dtype"], spec["dist"])
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), spec
        one = materialize(spec, side)
        assert one.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_big_tensor_is_drawn_in_chunks_with_the_same_values(dtype, monkeypatch):
    monkeypatch.setattr(seeding, "RANDOM_CHUNK", 1000)
    side = SideFiles(None, None)
    spec = {"random": 12345, "shape": [7, 501], "dtype": dtype}
    got = materialize(spec, side)
    assert got.tobytes() == plain(12345, (7, 501), dtype, "normal").tobytes() and got.shape == (7, 501)


def _mixed_specs(count: int, seed: int = 1) -> list[tuple]:
    """(seed, shape, dtype, dist) specs of every kind the drawing treats apart: tiny tensors cut as rows,
    0-d and empty ones, ones past ``ROWS_MAX`` and past ``NATIVE_MAX``, seeds of every size."""
    rnd = np.random.default_rng(seed)
    shapes = [(1,), (3,), (2, 2), (), (0,), (4, 0, 2), (seeding.ROWS_MAX + 1,), (5, 40),
              (seeding.NATIVE_MAX + 3,)]
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**80 + 3]
    out = []
    for k in range(count):
        s = seeds[k] if k < len(seeds) else int(rnd.integers(0, 2**63))
        out.append((s, shapes[k % len(shapes)], ["float32", "float64", "float16", "bfloat16", "complex64",
                                                  "int64"][k % 6], "uniform" if k % 4 == 1 else "normal"))
    return out


def test_the_compiled_drawing_gives_numpys_values_for_every_kind_of_spec():
    if not seeding.NATIVE:
        pytest.skip("the compiled drawing is not built (or AUTOGRAD_RUN_PURE_PYTHON is set)")
    specs = _mixed_specs(300)
    got = seeding.draw_many(specs)
    for sp, arr in zip(specs, got):
        want = plain(*sp)
        assert arr.dtype == want.dtype and arr.shape == want.shape, sp
        assert arr.tobytes() == want.tobytes(), sp
        assert arr.flags.writeable


def test_drawn_tensors_do_not_share_values():
    """Tiny tensors are rows of one block: writing one leaves every other as drawn."""
    specs = [(s, (2,), "float32", "normal") for s in range(50)]
    got = seeding.draw_many(specs)
    got[7][:] = 0
    again = seeding.draw_many(specs)
    for k in range(50):
        if k != 7:
            assert got[k].tobytes() == again[k].tobytes()
    assert not got[7].any() and again[7].any()


def test_the_tail_of_the_ziggurat_is_drawn_as_numpy_draws_it():
    """Long normal streams reach the ziggurat's rare paths (the wedges and the tail past 3.65)."""
    specs = [(s, (60_000,), "float64", "normal") for s in (3, 99)]
    got = seeding.draw_many(specs)
    for sp, arr in zip(specs, got):
        want = plain(*sp)
        assert np.abs(want).max() > 3.65  # the tail was drawn
        assert arr.tobytes() == want.tobytes()


def test_the_compiled_drawing_works_in_bounded_batches(monkeypatch):
    """Each call of the compiled drawing makes at most ``BATCH`` values (its float64 buffer is bounded
    whatever the graph); groups split across batches still give numpy's values."""
    if not seeding.NATIVE:
        pytest.skip("the compiled drawing is not built (or AUTOGRAD_RUN_PURE_PYTHON is set)")
    calls = []
    real = seeding._native.draw

    class Spy:
        @staticmethod
        def draw(seeds, counts, uniform):
            calls.append(sum(np.frombuffer(counts, dtype=np.int64)))
            return real(seeds, counts, uniform)
    monkeypatch.setattr(seeding, "_native", Spy)
    monkeypatch.setattr(seeding, "BATCH", 100)
    specs = [(s, [(3,), (40,), (7, 9), (150,), (0,)][s % 5], "float32", "normal") for s in range(60)]
    got = seeding.draw_many(specs)
    for sp, arr in zip(specs, got):
        assert arr.tobytes() == plain(*sp).tobytes(), sp
    assert len(calls) > 5 and max(calls) <= 150  # a 150-value tensor is drawn alone, the rest within 100
    assert all(c <= 100 for c in calls if c != 150)
