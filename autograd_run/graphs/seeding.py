"""Seeded random tensors in bulk, value for value what ``numpy.random.PCG64(seed)`` draws.

A ``{"random": SEED, ...}`` spec is drawn from its own generator,
``Generator(PCG64(SEED))``. Making that generator costs ~15 µs, nearly all
of it in seeding: ``SeedSequence(SEED)`` hashes the seed into a pool of four
32-bit words and ``generate_state`` hashes the pool into the 128-bit PCG64
state and increment. Both are fixed sequences of 32-bit multiply / xor /
shift steps (M. E. O'Neill's ``seed_seq_fe`` design, which numpy
implements), so here they run as numpy array operations over all seeds at
once; each spec then only loads its state into one reused bit generator and
draws with numpy's own ``standard_normal`` / ``random``. The values are
identical to drawing from ``Generator(PCG64(SEED))`` (``tests`` check it on
many seeds), so existing graph files keep their gradients.

Seeds beyond 64 bits (more than two entropy words) are drawn the plain way.
A tensor of more than ``RANDOM_CHUNK`` elements is drawn in chunks into its
result (the same values: the stream is drawn in order), without a float64
temporary of the whole tensor beside it.

Where the compiled ``_draw`` is built (``setup.py``: it links numpy's own
distributions), tensors of at most ``NATIVE_MAX`` elements are drawn there,
all in one call: seeding, PCG64 and numpy's ziggurat in C, ~0.1 µs a value
instead of ~8 µs of Python per tensor (a graph of small saved tensors spent
most of its set-up here). ``AUTOGRAD_RUN_PURE_PYTHON=1`` uses the path above.
"""

from __future__ import annotations

import math
import os

import numpy as np

_native = None
if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
    WHY = "numpy, one generator at a time (AUTOGRAD_RUN_PURE_PYTHON is set)"
else:
    try:
        from autograd_run.graphs import _draw as _native
        WHY = "compiled, in bulk (numpy's distributions)"
    except ImportError as exc:
        WHY = f"numpy, one generator at a time (the compiled drawing is not built: {exc})"
#: Whether the compiled drawing is in use.
NATIVE = _native is not None
#: Tensors up to this many elements go through the compiled drawing (its float64 values are made for
#: all of them at once before each is cast; a bigger tensor is drawn on its own, in chunks).
NATIVE_MAX = 1 << 16

#: Elements drawn at once for a big tensor.
RANDOM_CHUNK = 1 << 20

# seed_seq_fe's constants (numpy.random.SeedSequence: pool of 4 uint32 words)
_POOL = 4
_INIT_A = np.uint32(0x43B0D7E5)
_MULT_A = np.uint32(0x931E8875)
_INIT_B = np.uint32(0x8B51F9DD)
_MULT_B = np.uint32(0x58F38DED)
_MIX_L = np.uint32(0xCA01F9DD)
_MIX_R = np.uint32(0x4973F715)
_SHIFT = np.uint32(16)
#: PCG64's 128-bit LCG multiplier.
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_MASK128 = (1 << 128) - 1


class _Hash:
    """The running hash constant of one pass, the same for every seed (so a scalar)."""

    def __init__(self, init: np.uint32, mult: np.uint32):
        self.const, self.mult = init, mult

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = value ^ self.const
        self.const = np.uint32(self.const * self.mult)
        value = value * self.const
        return value ^ (value >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = _MIX_L * x - _MIX_R * y
    return r ^ (r >> _SHIFT)


def pcg64_states(seeds: np.ndarray) -> tuple[list[int], list[int]]:
    """PCG64 (state, inc) after seeding with each seed (each below 2**64), as ``PCG64(seed).state``."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    with np.errstate(over="ignore"):
        # SeedSequence: the seed as little-endian 32-bit words, zero-padded to the pool (as its hash pads)
        entropy = [(seeds & np.uint64(0xFFFFFFFF)).astype(np.uint32), (seeds >> np.uint64(32)).astype(np.uint32)]
        entropy += [np.zeros(len(seeds), dtype=np.uint32)] * (_POOL - 2)
        h = _Hash(_INIT_A, _MULT_A)
        pool = [h(entropy[i]) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = _mix(pool[dst], h(pool[src]))
        # generate_state(4, uint64): eight words hashed from the pool in turn
        g = _Hash(_INIT_B, _MULT_B)
        words = [g(pool[i % _POOL]).astype(np.uint64) for i in range(8)]
        val = [words[2 * k] | (words[2 * k + 1] << np.uint64(32)) for k in range(4)]
    v0, v1, v2, v3 = (v.tolist() for v in val)
    states, incs = [], []
    for a, b, c, d in zip(v0, v1, v2, v3):
        # pcg64 srandom: inc = (initseq << 1) | 1; state = inc (a step from 0); += initstate; step
        inc = (((c << 64) | d) << 1 | 1) & _MASK128
        state = ((inc + ((a << 64) | b)) * _PCG_MULT + inc) & _MASK128
        states.append(state)
        incs.append(inc)
    return states, incs


def draw_many(specs: list[tuple[int, tuple, str, str]]) -> list[np.ndarray]:
    """Arrays for ``(seed, shape, dtype, dist)`` specs: ``Generator(PCG64(seed))``'s ``standard_normal`` (dist
    ``normal``) or ``random`` (``uniform``) of that shape, cast to dtype."""
    groups: dict = {}  # (shape, dtype, dist) -> ([seed, ...], [index into specs, ...])
    for k, (seed, shape, dtype, dist) in enumerate(specs):
        g = groups.get((shape, dtype, dist))
        if g is None:
            groups[(shape, dtype, dist)] = g = ([], [])
        g[0].append(seed)
        g[1].append(k)
    out: list = [None] * len(specs)
    drawn = draw_groups({key: seeds for key, (seeds, _) in groups.items()})
    for key, (_, where) in groups.items():
        for k, arr in zip(where, drawn[key]):
            out[k] = arr
    return out


def draw_groups(groups: dict[tuple[tuple, str, str], list[int]]) -> dict[tuple, list[np.ndarray]]:
    """``draw_many`` for specs already grouped by ``(shape, dtype, dist)``: each group's seeds in, its arrays
    out in the same order. What a caller that walks many specs uses (no tuple per spec)."""
    out: dict = {}
    native: list = []  # (shape, dtype, n, uniform, seeds, positions) of the compiled drawing
    if any(key[1] == "bfloat16" for key in groups):
        _bfloat16()
    for key, seeds in groups.items():
        shape, dtype, dist = key
        arrs: list = [None] * len(seeds)
        out[key] = arrs
        n = math.prod(shape)
        plain = []
        if _native is not None and n <= NATIVE_MAX:
            small = [k for k, s in enumerate(seeds) if 0 <= s < 2**64]
            if len(small) == len(seeds):
                native.append((shape, np.dtype(dtype), n, dist == "uniform", seeds, arrs))
                continue
            native.append((shape, np.dtype(dtype), n, dist == "uniform", [seeds[k] for k in small],
                           _Scatter(arrs, small)))
            plain = [k for k, s in enumerate(seeds) if not 0 <= s < 2**64]
        else:
            plain = range(len(seeds))
        _draw_plain(key, seeds, plain, arrs)
    if native:
        _draw_native(native)
    return out


class _Scatter:
    """A write-only list view: item i goes to ``target[where[i]]``."""

    def __init__(self, target: list, where: list[int]):
        self.target, self.where = target, where

    def __setitem__(self, i: int, value) -> None:
        self.target[self.where[i]] = value


def _draw_plain(key: tuple, seeds: list[int], which, arrs: list) -> None:
    """``arrs[k]`` for each k in ``which`` with numpy's own generator: the seed's PCG64 state set in one reused
    bit generator (seeds below 2**64, hashed in bulk), else a generator of its own."""
    spec = (None, *key)
    bulk = [k for k in which if 0 <= seeds[k] < 2**64]
    for k in which:
        if not 0 <= seeds[k] < 2**64:
            arrs[k] = _draw(np.random.Generator(np.random.PCG64(seeds[k])), spec)
    if not bulk:
        return
    states, incs = pcg64_states(np.array([seeds[k] for k in bulk], dtype=np.uint64))
    bit_gen = np.random.PCG64()
    gen = np.random.Generator(bit_gen)
    full = {"bit_generator": "PCG64", "state": {"state": 0, "inc": 0}, "has_uint32": 0, "uinteger": 0}
    inner = full["state"]
    for k, state, inc in zip(bulk, states, incs):
        inner["state"], inner["inc"] = state, inc
        bit_gen.state = full
        arrs[k] = _draw(gen, spec)


#: Tensors of at most this many elements (and at least one dimension) of one shape and dtype are cut
#: from one cast block, as its rows: views that keep the block (a few hundred bytes a tensor) alive
#: until the last of them goes. Bigger ones are copies of their own, freed as each is released.
ROWS_MAX = 64


#: Values drawn per call of the compiled drawing, at most (its float64 buffer: 32 MiB), so the drawing
#: never holds more than this beside the arrays it makes (a graph of many mid-sized tensors would
#: otherwise need a float64 copy of them all at once).
BATCH = 1 << 22


def _draw_native(groups: list) -> None:
    """Each group's arrays (``(shape, dtype, n, uniform, seeds, arrs)``: ``arrs[i]`` for ``seeds[i]``) from the
    compiled drawing (module docstring), in batches of at most ``BATCH`` values; a group's values lie
    together and are cast at once, as ``np.asarray(values, dtype)`` casts them."""
    batch: list = []  # (shape, dtype, n, uniform, seeds, arrs, first) runs of at most BATCH values in all
    size = 0
    for shape, dt, n, uniform, seeds, arrs in groups:
        i = 0
        while i < len(seeds):
            take = len(seeds) - i if n == 0 else max(1, min(len(seeds) - i, (BATCH - size) // n))
            if batch and size + take * n > BATCH:
                _draw_batch(batch)
                batch, size = [], 0
                continue
            batch.append((shape, dt, n, uniform, seeds[i: i + take], arrs, i))
            size += take * n
            i += take
    if batch:
        _draw_batch(batch)


def _draw_batch(runs: list) -> None:
    seeds = np.array([s for run in runs for s in run[4]], dtype=np.uint64)
    counts = np.concatenate([np.full(len(run[4]), run[2], dtype=np.int64) for run in runs])
    uniform = b"".join((b"\x01" if run[3] else b"\x00") * len(run[4]) for run in runs)
    values = np.frombuffer(_native.draw(seeds.tobytes(), counts.tobytes(), uniform), dtype=np.float64)
    at = 0
    for shape, dt, n, _, part, arrs, first in runs:
        m = len(part)
        block = values[at: at + n * m]
        at += n * m
        if shape and n <= ROWS_MAX:
            rows = block.astype(dt).reshape((m, *shape))
            if type(arrs) is list and first == 0 and m == len(arrs):
                arrs[:] = list(rows)
            else:
                for i, row in enumerate(rows):
                    arrs[first + i] = row
        else:
            for i in range(m):
                arrs[first + i] = block[i * n: (i + 1) * n].reshape(shape).astype(dt)


def _bfloat16() -> None:
    """numpy's bfloat16, registered when first drawn (``ops.dtypes.ensure_bfloat16``)."""
    from autograd_run.ops.dtypes import ensure_bfloat16
    ensure_bfloat16()


def _draw(gen: np.random.Generator, spec: tuple) -> np.ndarray:
    _, shape, dtype, dist = spec
    if dtype == "bfloat16":
        _bfloat16()
    draw = gen.random if dist == "uniform" else gen.standard_normal
    n = math.prod(shape)
    if n <= RANDOM_CHUNK:
        return np.asarray(draw(shape), dtype=dtype)
    out = np.empty(n, dtype=dtype)
    for i in range(0, n, RANDOM_CHUNK):
        out[i: i + RANDOM_CHUNK] = draw(min(RANDOM_CHUNK, n - i))
    return out.reshape(shape)
