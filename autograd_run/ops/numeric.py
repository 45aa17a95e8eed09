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

def _chbevl(xp, y, coeffs):
    """Cephes' Chebyshev series sum (PyTorch's ``chbevl``), elementwise."""
    b0 = xp.full_like(y, coeffs[0])
    b1 = xp.zeros_like(y)
    b2 = xp.zeros_like(y)
    for c in coeffs[1:]:
        b2 = b1
        b1 = b0
        b0 = y * b1 - b2 + c
    return 0.5 * (b0 - b2)


#: Cephes' Chebyshev coefficients (PyTorch's ``chebyshev_coefficients_i0e_A/B``, ``..._i1e_A/B`` for double).
_I0E_A = (-4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16,
          1.71539128555513303061E-15, -1.16853328779934516808E-14, 7.67618549860493561688E-14,
          -4.85644678311192946090E-13, 2.95505266312963983461E-12, -1.72682629144155570723E-11,
          9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
          -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7,
          1.11738753912010371815E-6, -4.41673835845875056359E-6, 1.64484480707288970893E-5,
          -5.75419501008210370398E-5, 1.88502885095841655729E-4, -5.76375574538582365885E-4,
          1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
          -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2,
          1.71620901522208775349E-1, -3.04682672343198398683E-1, 6.76795274409476084995E-1)
_I0E_B = (-7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17,
          3.46122286769746109310E-17, -2.82762398051658348494E-16, -3.42548561967721913462E-16,
          1.77256013305652638360E-15, 3.81168066935262242075E-15, -9.55484669882830764870E-15,
          -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
          7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11,
          -3.14991652796324136454E-11, 1.18891471078464383424E-11, 4.94060238822496958910E-10,
          3.39623202570838634515E-9, 2.26666899049817806459E-8, 2.04891858946906374183E-7,
          2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
          8.04490411014108831608E-1)
_I1E_A = (2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16,
          -1.10559694773538630805E-15, 7.60068429473540693410E-15, -5.04218550472791168711E-14,
          3.22379336594557470981E-13, -1.98397439776494371520E-12, 1.17361862988909016308E-11,
          -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
          9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7,
          -8.56872026469545474066E-7, 3.47025130813767847674E-6, -1.32731636560394358279E-5,
          4.78156510755005422638E-5, -1.61760815825896745588E-4, 5.12285956168575772895E-4,
          -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
          2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1,
          -1.76416518357834055153E-1, 2.52587186443633654823E-1)
_I1E_B = (7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17,
          -3.20952592199342395980E-17, 2.96262899764595013876E-16, 3.30820231092092828324E-16,
          -1.88035477551078244854E-15, -3.81440307243700780478E-15, 1.04202769841288027642E-14,
          4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
          -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11,
          3.25260358301548823856E-11, -1.89749581235054123450E-11, -5.58974346219658380687E-10,
          -3.83538038596423702205E-9, -2.63146884688951950684E-8, -2.51223623787020892529E-7,
          -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
          7.78576235018280120474E-1)


def _bessel(xp, x, kind):
    """I0, I0e, I1 or I1e of real x, as PyTorch's CPU ``calc_i0`` / ``calc_i0e`` / ``calc_i1`` / ``calc_i1e``:
    Cephes' Chebyshev series of exp(-|x|) I(|x|) on [0, 8] (times |x| for I1), of exp(-|x|) sqrt(|x|) I(|x|)
    beyond; the plain functions multiply by exp(|x|); I1 and I1e are odd. Evaluated in float64, returned in
    x's dtype (PyTorch's float kernel uses the same series; the difference is float32's rounding)."""
    x = xp.asarray(x)
    dt = x.dtype
    a = xp.abs(x.astype(np.float64))
    odd = kind in ("i1", "i1e")
    A, B = (_I1E_A, _I1E_B) if odd else (_I0E_A, _I0E_B)
    small = a <= 8.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lo = _chbevl(xp, a / 2.0 - 2.0, A)
        if odd:
            lo = lo * a
        big = xp.where(small, 9.0, a)  # keeps the series' argument finite where it is not used
        hi = _chbevl(xp, 32.0 / big - 2.0, B) / xp.sqrt(big)
        out = xp.where(small, lo, hi)
        if kind in ("i0", "i1"):
            out = xp.exp(a) * out
        if odd:
            out = xp.where(x < 0, -out, out)
        return out.astype(dt, copy=False)


def i0(xp, x):
    """The modified Bessel function I0 (PyTorch's CPU ``calc_i0``)."""
    return _bessel(xp, x, "i0")


def i0e(xp, x):
    """exp(-|x|) I0(x) (PyTorch's CPU ``calc_i0e``)."""
    return _bessel(xp, x, "i0e")


def i1(xp, x):
    """The modified Bessel function I1 (PyTorch's CPU ``calc_i1``)."""
    return _bessel(xp, x, "i1")


def i1e(xp, x):
    """exp(-|x|) I1(x) (PyTorch's CPU ``calc_i1e``)."""
    return _bessel(xp, x, "i1e")


#: The Euler-Maclaurin denominators of Cephes' ``zeta`` (PyTorch's ``zeta`` in ``Math.h``).
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)
_MACHEP = 1.11022302462515654042E-16


def _zeta_one(x: float, q: float) -> float:
    """The Hurwitz zeta function zeta(x, q), one value, as Cephes' (PyTorch's CPU ``zeta``) computes it."""
    if x == 1:
        return math.inf
    if x < 1 or math.isnan(x) or math.isnan(q):
        return math.nan
    if q <= 0:
        if q == math.floor(q):
            return math.inf
        if x != math.floor(x):
            return math.nan
    try:
        s = q ** -x
    except ZeroDivisionError:
        return math.inf
    except OverflowError:
        s = math.inf
    a = q
    i = 0
    b = 0.0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1.0
        b = a ** -x
        s += b
        if -_MACHEP * s < b < _MACHEP * s:
            return s
    w = a
    s += b * w / (x - 1.0)
    s -= 0.5 * b
    a = 1.0
    k = 0.0
    for i in range(12):
        a *= x + k
        b /= w
        t = a * b / _ZETA_A[i]
        s = s + t
        if abs(t / s) < _MACHEP:
            return s
        k += 1.0
        a *= x + k
        b /= w
        k += 1.0
    return s


def polygamma(xp, n: int, x):
    """The polygamma function psi^(n)(x) for real x, as PyTorch's CPU kernel: digamma for n = 0, trigamma for
    n = 1, else (-1)^(n+1) n! zeta(n + 1, x) (``calc_polygamma``: exp(lgamma(n + 1)) times Cephes' Hurwitz
    zeta). Computed in float64 (numpy; a GPU array goes through the host), returned in x's dtype."""
    n = int(n)
    if n == 0:
        return digamma(xp, x)
    if n == 1:
        return trigamma(xp, x)
    x = xp.asarray(x)
    dt = x.dtype
    host = np.asarray(x.get() if hasattr(x, "get") else x, dtype=np.float64)
    z = np.frompyfunc(lambda q: _zeta_one(float(n + 1), float(q)), 1, 1)(host)
    z = np.asarray(z, dtype=np.float64).reshape(host.shape)
    factor = (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0))
    with np.errstate(invalid="ignore", over="ignore"):
        out = factor * z
    return xp.asarray(out).astype(dt, copy=False)
