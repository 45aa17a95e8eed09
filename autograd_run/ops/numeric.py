"""Numeric helpers for the backward formulas: complex conjugation, real parts, saved scalars, special functions.

PyTorch's convention for complex gradients is the conjugate Wirtinger
derivative: for an op holomorphic in its input, the input's gradient is the
output's gradient times the *conjugate* of the derivative. Where a real
input feeds a complex result (a real tensor times a complex one), the
input's gradient is the real part of that product (``handle_r_to_c``).

The helpers here keep the real path free: ``conj`` returns a real array
itself (``ndarray.conj`` would copy it), ``real_for`` looks at a dtype
kind and nothing else.
"""

from __future__ import annotations

import math

import numpy as np


def is_complex(x) -> bool:
    """Whether ``x`` (an array or a number) is complex."""
    if isinstance(x, complex):
        return True
    dt = getattr(x, "dtype", None)
    return dt is not None and dt.kind == "c"


def conj(x):
    """The complex conjugate of a complex array or number; anything real is returned as it is (no copy)."""
    if isinstance(x, complex):
        return x.conjugate()
    dt = getattr(x, "dtype", None)
    if dt is not None and dt.kind == "c":
        return x.conj()
    return x


def real_for(node, i: int, g):
    """``g`` for next edge ``i``: its real part when ``g`` is complex and that edge's input is real.

    PyTorch's ``handle_r_to_c``: the gradient of a real input of an op
    with a complex result is real.
    """
    dt = getattr(g, "dtype", None)
    if dt is None or dt.kind != "c":
        return g
    e = node.next[i]
    if e is not None and not e.node.inputs[e.input_nr].dtype.startswith("complex"):
        return g.real
    return g


def num(v):
    """A saved number: graph files write the non-finite and complex ones as strings (``inf``, ``nan``, ``(1-2j)``)."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return complex(v)
    return v


def sign(xp, x):
    """PyTorch's sign of a real ``x``: -1, 0 or 1, and 0 at NaN (numpy's is NaN there)."""
    s = xp.sign(x)
    return xp.where(xp.isnan(s), 0, s)


def sgn(xp, x):
    """``x / |x|`` for complex ``x`` (0 at 0), the sign for real ``x`` (0 at NaN, as PyTorch's)."""
    if not is_complex(x):
        return sign(xp, x)
    a = xp.abs(x)
    return xp.where(a == 0, 0, x / xp.where(a == 0, 1, a))


def _np_vectorize(fn, x):
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    out = np.frompyfunc(fn, 1, 1)(x)
    return np.asarray(out, dtype=x.dtype).reshape(x.shape)


def erf(xp, x):
    """The error function, elementwise (numpy through ``math.erf``; cupyx on a GPU)."""
    if xp is np:
        return _np_vectorize(math.erf, x)
    from cupyx.scipy.special import erf as cerf  # real GPU only
    return cerf(x)


def erfinv(xp, y):
    """The inverse error function on (-1, 1): a rational first guess polished by Newton steps on ``erf``."""
    if xp is not np:
        from cupyx.scipy.special import erfinv as cerfinv  # real GPU only
        return cerfinv(y)
    y = np.asarray(y)
    w = -np.log(np.clip((1.0 - y) * (1.0 + y), 1e-300, None))
    # Giles' single-precision approximation, accurate to about 1e-7; Newton finishes it.
    small = w < 5.0
    ws = w - 2.5
    p_s = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p_s = c + p_s * ws
    wl = np.sqrt(np.where(small, 5.0, w)) - 3.0
    p_l = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p_l = c + p_l * wl
    x = np.where(small, p_s, p_l) * y
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(3):
            err = erf(np, x) - y
            x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
    x = np.where(y == 1, np.inf, np.where(y == -1, -np.inf, x))
    return np.where(np.abs(y) > 1, np.nan, x).astype(y.dtype, copy=False)


#: Cephes' asymptotic coefficients for digamma, highest power first (PyTorch's ``calc_digamma``).
_PSI_A = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
          -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
          8.33333333333333333333E-2)
_PSI_10 = 2.25175258906672110764


def digamma(xp, x):
    """The digamma function psi(x) for real x, as PyTorch's CPU ``calc_digamma`` computes it (the backward of
    lgamma replays to the last bit): for x < 0 reflection through the fractional part, psi(1 - x) -
    pi / tan(pi r); else the recurrence up to x >= 10 (psi(10) exact), then Cephes' asymptotic series below
    1e17; +-inf at +-0, NaN at negative integers. Computed in float64, returned in x's dtype."""
    x = xp.asarray(x)
    dt = x.dtype
    x = x.astype(np.float64)
    neg = x < 0
    with np.errstate(invalid="ignore"):
        r = x - xp.trunc(x)  # modf's fractional part (its sign; NaN for infinities, not used there)
    xr = xp.where(neg, 1.0 - x, x)
    acc = xp.zeros_like(xr)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        while True:
            low = xr < 10  # NaN never is: the loop ends
            if not bool(low.any()):
                break
            acc = acc - xp.where(low, 1.0 / xp.where(low, xr, 1.0), 0.0)
            xr = xp.where(low, xr + 1.0, xr)
        z = 1.0 / (xr * xr)
        poly = xp.zeros_like(z)
        for c in _PSI_A:
            poly = poly * z + c
        y = xp.where(xr < 1.0e17, z * poly, 0.0)
        out = xp.where(xr == 10, acc + _PSI_10, acc + xp.log(xr) - 0.5 / xr - y)
        out = xp.where(neg, out - math.pi / xp.tan(math.pi * r), out)
    out = xp.where(neg & (x == xp.trunc(x)), xp.nan, out)
    out = xp.where(x == 0, xp.copysign(xp.inf, -x), out)
    return out.astype(dt, copy=False)


def trigamma(xp, x):
    """The trigamma function psi'(x) for real x, as PyTorch's CPU ``trigamma`` computes it: below 0.5 the
    reflection pi^2 / sin^2(pi x) less psi'(1 - x); six steps of the recurrence, then a four-term asymptotic
    series (float64 here, returned in x's dtype)."""
    x = xp.asarray(x)
    dt = x.dtype
    x = x.astype(np.float64)
    neg = x < 0.5
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        sin_pi_x = xp.sin(math.pi * x)
        result = xp.where(neg, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), 0.0)
        xr = xp.where(neg, 1.0 - x, x)
        for _ in range(6):
            result = result + 1.0 / (xr * xr)
            xr = xr + 1.0
        ixx = 1.0 / (xr * xr)
        result = result + (1.0 + 1.0 / (2.0 * xr) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / xr
    return xp.where(neg, -result, result).astype(dt, copy=False)