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
