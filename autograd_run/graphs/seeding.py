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
"""

from __future__ import annotations

import math

import numpy as np

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
    out: list = [None] * len(specs)
    bulk = [k for k, sp in enumerate(specs) if 0 <= sp[0] < 2**64]
    for k, sp in enumerate(specs):
        if not 0 <= sp[0] < 2**64:
            out[k] = _draw(np.random.Generator(np.random.PCG64(sp[0])), sp)
    if not bulk:
        return out
    states, incs = pcg64_states(np.array([specs[k][0] for k in bulk], dtype=np.uint64))
    bit_gen = np.random.PCG64()
    gen = np.random.Generator(bit_gen)
    full = {"bit_generator": "PCG64", "state": {"state": 0, "inc": 0}, "has_uint32": 0, "uinteger": 0}
    inner = full["state"]
    for k, state, inc in zip(bulk, states, incs):
        inner["state"], inner["inc"] = state, inc
        bit_gen.state = full
        out[k] = _draw(gen, specs[k])
    return out


def _draw(gen: np.random.Generator, spec: tuple) -> np.ndarray:
    _, shape, dtype, dist = spec
    draw = gen.random if dist == "uniform" else gen.standard_normal
    n = math.prod(shape)
    if n <= RANDOM_CHUNK:
        return np.asarray(draw(shape), dtype=dtype)
    out = np.empty(n, dtype=dtype)
    for i in range(0, n, RANDOM_CHUNK):
        out[i: i + RANDOM_CHUNK] = draw(min(RANDOM_CHUNK, n - i))
    return out.reshape(shape)
