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
    out: list = [None] * len(specs)
    bulk = [k for k, sp in enumerate(specs) if 0 <= sp[0] < 2**64]
    for k, sp in enumerate(specs):
        if not 0 <= sp[0] < 2**64:
            out[k] = _draw(np.random.Generator(np.random.PCG64(sp[0])), sp)
    if not bulk:
        return out
    if _native is not None:
        small = [k for k in bulk if math.prod(specs[k][1]) <= NATIVE_MAX]
        if small:
            _draw_native(specs, small, out)
            if len(small) == len(bulk):
                return out
            bulk = [k for k in bulk if out[k] is None]
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


#: Tensors of at most this many elements (and at least one dimension) of one shape and dtype are cut
#: from one cast block, as its rows: views that keep the block (a few hundred bytes a tensor) alive
#: until the last of them goes. Bigger ones are copies of their own, freed as each is released.
ROWS_MAX = 64


#: Values drawn per call of the compiled drawing, at most (its float64 buffer: 32 MiB), so the drawing
#: never holds more than this beside the arrays it makes (a graph of many mid-sized tensors would
#: otherwise need a float64 copy of them all at once).
BATCH = 1 << 22


def _draw_native(specs: list, which: list[int], out: list) -> None:
    """``out[k]`` for each k in ``which`` from the compiled drawing (module docstring), in batches of at most
    ``BATCH`` values, group by group (one shape and dtype), so that a group's values lie together and are
    cast at once, as ``np.asarray(values, dtype)`` casts them."""
    groups: dict = {}
    for k in which:
        sp = specs[k]
        key = (sp[1], sp[2])
        g = groups.get(key)
        if g is None:
            groups[key] = [k]
        else:
            g.append(k)
    runs = [(shape, np.dtype(dtype), math.prod(shape), g) for (shape, dtype), g in groups.items()]
    batch: list = []  # (shape, dtype, n, specs) runs of at most BATCH values in all
    size = 0
    for shape, dt, n, g in runs:
        i = 0
        while i < len(g):
            take = len(g) - i if n == 0 else max(1, min(len(g) - i, (BATCH - size) // n))
            if batch and size + take * n > BATCH:
                _draw_batch(specs, batch, out)
                batch, size = [], 0
                continue
            batch.append((shape, dt, n, g[i: i + take]))
            size += take * n
            i += take
    if batch:
        _draw_batch(specs, batch, out)


def _draw_batch(specs: list, runs: list, out: list) -> None:
    order = [k for *_, g in runs for k in g]
    counts: list = []
    for _, _, n, g in runs:
        counts += [n] * len(g)
    values = np.frombuffer(_native.draw(np.array([specs[k][0] for k in order], dtype=np.uint64).tobytes(),
                                        np.array(counts, dtype=np.int64).tobytes(),
                                        bytes(specs[k][3] == "uniform" for k in order)), dtype=np.float64)
    at = 0
    for shape, dt, n, g in runs:
        block = values[at: at + n * len(g)]
        at += n * len(g)
        if shape and n <= ROWS_MAX:
            for k, row in zip(g, block.astype(dt).reshape((len(g), *shape))):
                out[k] = row
        else:
            for i, k in enumerate(g):
                out[k] = block[i * n: (i + 1) * n].reshape(shape).astype(dt)


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
