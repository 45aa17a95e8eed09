/* Seeded random tensors in bulk: what numpy's Generator(PCG64(seed)) draws, value for value.

   ``draw(seeds, counts, uniform) -> bytes``: for spec k, the first counts[k] values of
   ``Generator(PCG64(seeds[k])).standard_normal`` (or ``.random`` where uniform[k] is 1), all specs'
   values one after the other as float64 (native byte order).

   How it stays identical to numpy: the seeding is numpy's SeedSequence (the seed_seq_fe hash of the
   seed's 32-bit words into a pool of four, then eight words generated from the pool) and PCG64's
   srandom, written out here as graphs/seeding.py writes them with numpy arrays; the 128-bit LCG
   step and XSL-RR output are PCG64's; the distributions are numpy's own code, linked from the
   ``libnpyrandom`` static library numpy ships for this purpose (``random_standard_normal``: the
   ziggurat; ``random_standard_uniform``: 53 bits of one draw). tests/test_seeding.py compares the
   values with numpy's generator for many seeds, both distributions and the tail of the ziggurat.

   Seeds are below 2**64 (graphs/seeding.py draws larger ones the plain way). No state is kept
   between calls; the GIL is released while drawing. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "numpy/random/bitgen.h"
#include "numpy/random/distributions.h"

typedef __uint128_t u128;

#define PCG_MULT (((u128)0x2360ED051FC65DA4ULL << 64) | (u128)0x4385DF649FCCF645ULL)

typedef struct {
    u128 state, inc;
} pcg64;

static inline uint64_t pcg_next64(void *st) {
    pcg64 *r = (pcg64 *)st;
    r->state = r->state * PCG_MULT + r->inc;
    uint64_t hi = (uint64_t)(r->state >> 64), lo = (uint64_t)r->state;
    unsigned rot = (unsigned)(r->state >> 122);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((-rot) & 63));
}

static uint32_t pcg_next32(void *st) {  /* not used by the two distributions; numpy buffers halves */
    return (uint32_t)(pcg_next64(st) >> 32);
}

static double pcg_next_double(void *st) {
    return (double)(pcg_next64(st) >> 11) * (1.0 / 9007199254740992.0);
}

/* SeedSequence(seed).generate_state(4, uint64) for a seed below 2**64, then PCG64's srandom. */
#define INIT_A 0x43b0d7e5U
#define MULT_A 0x931e8875U
#define INIT_B 0x8b51f9ddU
#define MULT_B 0x58f38dedU
#define MIX_L 0xca01f9ddU
#define MIX_R 0x4973f715U

static inline uint32_t hashmix(uint32_t value, uint32_t *hash_const, uint32_t mult) {
    value ^= *hash_const;
    *hash_const *= mult;
    value *= *hash_const;
    return value ^ (value >> 16);
}

static inline uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = MIX_L * x - MIX_R * y;
    return r ^ (r >> 16);
}

static void seed_pcg(uint64_t seed, pcg64 *r) {
    uint32_t entropy[4] = {(uint32_t)seed, (uint32_t)(seed >> 32), 0, 0};
    uint32_t pool[4], hc = INIT_A;
    for (int i = 0; i < 4; i++)
        pool[i] = hashmix(entropy[i], &hc, MULT_A);
    for (int src = 0; src < 4; src++)
        for (int dst = 0; dst < 4; dst++)
            if (src != dst)
                pool[dst] = mix(pool[dst], hashmix(pool[src], &hc, MULT_A));
    uint32_t hb = INIT_B;
    uint64_t words[8];
    for (int i = 0; i < 8; i++)
        words[i] = hashmix(pool[i % 4], &hb, MULT_B);
    uint64_t v[4];
    for (int k = 0; k < 4; k++)
        v[k] = words[2 * k] | (words[2 * k + 1] << 32);
    u128 initstate = ((u128)v[0] << 64) | v[1];
    u128 initseq = ((u128)v[2] << 64) | v[3];
    r->inc = (initseq << 1) | 1;
    r->state = (r->inc + initstate) * PCG_MULT + r->inc;
}

static PyObject *draw(PyObject *self, PyObject *args) {
    Py_buffer seeds, counts, uniform;
    if (!PyArg_ParseTuple(args, "y*y*y*", &seeds, &counts, &uniform))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = seeds.len / 8;
    if (seeds.len % 8 || counts.len != seeds.len || uniform.len != n) {
        PyErr_SetString(PyExc_ValueError, "draw: seeds and counts are 8 bytes per spec, uniform 1 byte per spec");
        goto done;
    }
    const uint64_t *sd = (const uint64_t *)seeds.buf;
    const int64_t *cn = (const int64_t *)counts.buf;
    const uint8_t *un = (const uint8_t *)uniform.buf;
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (cn[k] < 0 || cn[k] > (PY_SSIZE_T_MAX / 8) - total) {
            PyErr_SetString(PyExc_ValueError, "draw: counts must be non-negative and fit in memory");
            goto done;
        }
        total += cn[k];
    }
    out = PyBytes_FromStringAndSize(NULL, total * 8);
    if (out == NULL)
        goto done;
    double *dst = (double *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    pcg64 st;
    bitgen_t bg = {&st, pcg_next64, pcg_next32, pcg_next_double, pcg_next64};
    for (Py_ssize_t k = 0; k < n; k++) {
        seed_pcg(sd[k], &st);
        int64_t c = cn[k];
        if (un[k])
            for (int64_t i = 0; i < c; i++)
                *dst++ = random_standard_uniform(&bg);
        else
            for (int64_t i = 0; i < c; i++)
                *dst++ = random_standard_normal(&bg);
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&seeds);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&uniform);
    return out;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS,
     "draw(seeds, counts, uniform) -> bytes: float64 values of Generator(PCG64(seed)).standard_normal "
     "(or .random) per spec, one spec after the other."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draw", NULL, -1, methods};

PyMODINIT_FUNC PyInit__draw(void) { return PyModule_Create(&module); }
