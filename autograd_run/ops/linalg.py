"""Matrix and vector products and norms: mm, addmm, bmm, mv, dot, vdot, vector norms (linalg.vector_norm,
torch.norm, dist).

Complex operands follow PyTorch: the other operand enters conjugated
(``g @ conj(b).T``), and norms take ``sgn`` (``a / |a|``) for complex ``a``.
"""

from __future__ import annotations

import math

import numpy as np

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, signed, sum_to
from autograd_run.ops.numeric import conj, num, real_for, sgn
from autograd_run.ops.spec import op


def _same(x):
    return x


def _column_major(node, name: str) -> str:
    """``t-new`` when the saved strides say matrix ``name`` was column-major in its last two dims (PyTorch's
    ``mm_mat1_backward``, ``mm_mat2_backward`` and the grouped ones then return the gradient transposed, for
    efficiency), else new contiguous memory."""
    sizes, strides = node.saved.get(f"{name}_sym_sizes"), node.saved.get(f"{name}_sym_strides")
    if isinstance(sizes, list) and isinstance(strides, list) and len(sizes) == len(strides) >= 2:
        return "t-new" if strides[-2] == 1 and strides[-1] == sizes[-2] and sizes[-2] != 1 else ""
    return ""


@op("MmBackward0", outputs=2, saved="self:tensor? mat2:tensor? self_sym_sizes:sizes? mat2_sym_sizes:sizes?",
    cost=cost.MATMUL, needed_for_output=((0, "mat2"), (1, "self")), matrix_rank=2,
    matrix_dims={"self": ((0, 0),), "mat2": ((1, 1),)},
    grad_shapes={0: (("grad", 0), ("mat2", 0)), 1: (("self", 1), ("grad", 1))},
    views=lambda node: (_column_major(node, "self"), _column_major(node, "mat2")))
def mm(node, grads, ctx):
    """a @ b: g @ conj(b).T and conj(a).T @ g."""
    g = grads[0]
    s = ctx.saved(node)
    if g.dtype.kind != "c":  # each() spelled out: the MLP benchmark's hot rule
        # ndarray.dot: for matrices the product @ gives, and 0.6 against 1.4 us per call on small ones
        nxt = node.next
        return [None if nxt[0] is None else g.dot(s["mat2"].T), None if nxt[1] is None else s["self"].T.dot(g)]
    return each(node, lambda i: g @ conj(s["mat2"]).T if i == 0 else conj(s["self"]).T @ g)


def _addmm_flops(s: cost.Shapes) -> float:
    bias = s.numel(s.outputs[0]) if s.outputs else 0
    return float(bias + cost.MATMUL.flops(cost.Shapes(s.inputs, [None, *s.outputs[1:]])))


@op("AddmmBackward0", outputs=3, saved="mat1:tensor? mat2:tensor? alpha:scalar? beta:scalar?",
    cost=cost.CostModel(_addmm_flops), needed_for_output=((1, "mat2"), (2, "mat1")), matrix_rank=2,
    matrix_dims={"mat1": ((0, 0),), "mat2": ((1, 1),)},
    grad_shapes={0: (("grad", 0), ("grad", 1)), 1: (("grad", 0), ("mat2", 0)), 2: (("mat1", 1), ("grad", 1))},
    views=lambda node: ("same" if node.saved.get("beta", 1) == 1 else "", _column_major(node, "mat1"),
                        _column_major(node, "mat2")))
def addmm(node, grads, ctx):
    """beta * c + alpha * (a @ b)."""
    g = grads[0]
    sv = ctx.saved(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)
    cj = conj if g.dtype.kind == "c" else _same

    def out(i):
        if i == 0:
            return g if beta == 1 else g * cj(num(beta))
        r = g.dot(cj(sv["mat2"]).T) if i == 1 else cj(sv["mat1"]).T.dot(g)  # matrices: dot is @, faster
        return r if alpha == 1 else r * cj(num(alpha))
    return each(node, out)


@op("BmmBackward0", outputs=2, saved="self:tensor? mat2:tensor?", cost=cost.MATMUL,
    needed_for_output=((0, "mat2"), (1, "self")), matrix_rank=3,
    matrix_dims={"self": ((0, 0), (1, 1)), "mat2": ((0, 0), (2, 2))},
    grad_shapes={0: (("grad", 0), ("grad", 1), ("mat2", 1)), 1: (("grad", 0), ("self", 2), ("grad", 2))})
def bmm(node, grads, ctx):
    """Batched a @ b."""
    g = grads[0]
    sv = ctx.saved(node)
    cj = conj if g.dtype.kind == "c" else _same
    return each(node, lambda i: g @ cj(sv["mat2"]).swapaxes(-1, -2) if i == 0
                else cj(sv["self"]).swapaxes(-1, -2) @ g)


@op("GroupedMmBackward0", outputs=2, saved="self:tensor? mat2:tensor? offs:tensor? bias:tensor?", cost=cost.MATMUL,
    views=lambda node: (_column_major(node, "self"), _column_major(node, "mat2")))
def grouped_mm(node, grads, ctx):
    """torch._grouped_mm (mixture-of-experts layers): per group, a @ b.

    2-D ``self`` (rows, k) against 3-D ``mat2`` (groups, k, n): ``offs`` (int32, cumulative) ends each group's
    rows; rows past the last offset belong to no group (their gradient is 0; PyTorch leaves their output
    unset). 3-D against 3-D without ``offs`` is a batched product. Other layouts (offsets along k, 2-D ``mat2``) are refused by name.
    """
    g = grads[0]
    sv = ctx.saved(node)
    a, b, offs = sv["self"], sv["mat2"], sv.get("offs")
    xp = ctx.xp(node)
    if sv.get("bias") is not None:
        raise RuntimeError(f"{node.name} {node.id!r}: a grouped product with a bias has no rule here")
    if a.ndim == 3 and b.ndim == 3 and offs is None:
        return each(node, lambda i: g @ b.swapaxes(-1, -2) if i == 0 else a.swapaxes(-1, -2) @ g)
    if not (a.ndim == 2 and b.ndim == 3 and offs is not None and offs.ndim == 1 and len(offs) == b.shape[0]):
        raise RuntimeError(f"{node.name} {node.id!r}: grouped product of shapes {tuple(a.shape)} x {tuple(b.shape)}"
                           f"{'' if offs is None else ' with offsets along the rows'}: only (rows, k) x (groups, k, n) "
                           "with offsets, or batched 3-D operands, have a rule here")
    ends = [int(v) for v in (offs.get() if hasattr(offs, "get") and not isinstance(offs, np.ndarray) else offs)]
    starts = [0] + ends[:-1]

    def out(i):
        if i == 0:
            r = xp.zeros_like(a)
            for e, (lo, hi) in enumerate(zip(starts, ends)):
                r[lo:hi] = g[lo:hi] @ b[e].T
            return r
        r = xp.zeros_like(b)
        for e, (lo, hi) in enumerate(zip(starts, ends)):
            r[e] = a[lo:hi].T @ g[lo:hi]
        return r
    return each(node, out)


def _mv_flops(s: cost.Shapes) -> float:
    """2 m n per produced gradient of a (m, n) matrix times an n-vector."""
    mat = next((m for m in s.outputs if m is not None and len(m[0]) == 2), None)
    n = math.prod(mat[0]) if mat else s.numel(s.inputs[0]) * max((s.numel(m) for m in s.outputs if m), default=1)
    return 2.0 * n * sum(1 for m in s.outputs if m is not None)


@op("MvBackward0", outputs=2, saved="self:tensor? vec:tensor?", cost=cost.CostModel(_mv_flops))
def mv(node, grads, ctx):
    """matrix @ vector: outer(g, conj(vec)) to the matrix, conj(matrix).T @ g to the vector."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    return each(node, lambda i: xp.multiply.outer(g, conj(sv["vec"])) if i == 0 else conj(sv["self"]).T @ g)


@op("DotBackward0", outputs=2, saved="self:tensor? tensor:tensor?", cost=cost.pointwise(1))
def dot(node, grads, ctx):
    """dot(a, b) = sum(a b): g conj(b) and g conj(a)."""
    g = grads[0]
    sv = ctx.saved(node)
    return each(node, lambda i: g * conj(sv["tensor"] if i == 0 else sv["self"]))


@op("VdotBackward0", outputs=2, saved="self:tensor? other:tensor?", cost=cost.pointwise(1))
def vdot(node, grads, ctx):
    """vdot(a, b) = sum(conj(a) b): conj(g) b to a, g a to b."""
    g = grads[0]
    sv = ctx.saved(node)
    return each(node, lambda i: conj(g) * sv["other"] if i == 0 else g * sv["self"])


def _reduced(dims, ndim: int) -> tuple[int, ...]:
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(signed(d) % ndim for d in dims)) if ndim else ()


def norm_backward(xp, g, x, p, norm, dims, keepdim):
    """The gradient of a p-norm of ``x`` over ``dims`` (PyTorch's norm_backward); None for p == 0."""
    p = float(num(p if p is not None else 2.0))
    axes = _reduced(dims, x.ndim)
    if not keepdim and x.ndim:
        keep_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        g = xp.reshape(g, keep_shape)
        norm = xp.reshape(norm, keep_shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        if p == 0.0:
            return None
        if p == 1.0:
            return sgn(xp, x) * g
        if p == 2.0:
            return g * xp.where(norm == 0, 0, x / norm)
        if math.isinf(p):
            a = xp.abs(x)
            # The extremal |a| recomputed here: PyTorch's complex abs may differ from numpy's in the last bit.
            ext = a.max(axis=axes, keepdims=True) if p > 0 else a.min(axis=axes, keepdims=True)
            mask = (a == ext) | xp.isnan(a)
            return sgn(xp, x) * (g / mask.sum(axis=axes, keepdims=True) * mask)
        a = xp.abs(x)
        if p < 1.0:
            scaled = xp.where(x == 0, 0, sgn(xp, x) * a ** (p - 1))
            return scaled * g * norm ** (1 - p)
        if p < 2.0:
            scaled = sgn(xp, x) * a ** (p - 1)
        else:
            scaled = x * a ** (p - 2)
        return scaled * xp.where(norm == 0, 0, g / norm ** (p - 1))


def _norm_flops(s: cost.Shapes) -> float:
    return 4.0 * s.out_numel


@op("LinalgVectorNormBackward0", outputs=1, saved="self:tensor result:tensor ord:scalar? dim:ints? keepdim:bool?",
    cost=cost.CostModel(_norm_flops))
def vector_norm(node, grads, ctx):
    """linalg.vector_norm(a, ord, dim, keepdim): ord 2, 1, +-inf (ties share), 0 (no gradient), any p."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"], sv.get("ord", 2), sv["result"], sv.get("dim"),
                      bool(sv.get("keepdim", False)))
    return each(node, lambda i: r)


@op("NormBackward0", "NormBackward1", "NormBackward2", "NormBackward3", outputs=1,
    saved="self:tensor result:tensor p:scalar? dim:ints? keepdim:bool?", cost=cost.CostModel(_norm_flops))
def norm(node, grads, ctx):
    """torch.norm(a, p[, dim, keepdim][, dtype]): as linalg.vector_norm."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"], sv.get("p"), sv["result"], sv.get("dim"),
                      bool(sv.get("keepdim", False)))
    return each(node, lambda i: r)


@op("DistBackward0", outputs=2,
    saved="self:tensor other:tensor result:tensor p:scalar?", cost=cost.CostModel(_norm_flops))
def dist(node, grads, ctx):
    """dist(a, b, p) = norm(a - b, p): the norm's gradient to a, its negation to b."""
    sv = ctx.saved(node)
    r = norm_backward(ctx.xp(node), grads[0], sv["self"] - sv["other"], sv.get("p", 2), sv["result"], None, False)
    return each(node, lambda i: None if r is None else (r if i == 0 else -r))


@op("LinalgCrossBackward0", outputs=2, saved="self:tensor other:tensor dim:int?", cost=cost.pointwise(6))
def cross(node, grads, ctx):
    """linalg.cross(a, b, dim): cross(conj(b), g) to a, cross(g, conj(a)) to b."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    g = grads[0]
    dim = signed(sv.get("dim", -1))

    def c(u, v):
        return xp.cross(u, v, axisa=dim, axisb=dim, axisc=dim)
    return each(node, lambda i: c(conj(sv["other"]), g) if i == 0 else c(g, conj(sv["self"])))


# --- decompositions and solves ------------------------------------------------------------------------------
# Batched over leading dims; complex matrices use the conjugate transpose (mH).


def _mh(a):
    return conj(a).swapaxes(-1, -2)


def _eye_like(xp, a):
    return xp.broadcast_to(xp.eye(a.shape[-1], dtype=a.dtype), a.shape)


def _solve(xp, a, b):
    return xp.linalg.solve(a, b)


def _cube_flops(s: cost.Shapes) -> float:
    """About 4 n**3 per matrix of each produced gradient (a few triangular solves or products)."""
    total = 0.0
    for m in s.outputs:
        if m is not None and len(m[0]) >= 2:
            n = m[0][-1]
            total += 4.0 * math.prod(m[0]) * n
    return total or float(s.out_numel)


_CUBE = cost.CostModel(_cube_flops)


@op("LinalgInvExBackward0", outputs=1, saved="inverse:tensor", cost=_CUBE)
def inv(node, grads, ctx):
    """inverse(A): -inv(A)^H g inv(A)^H."""
    b = _mh(ctx.saved(node)["inverse"])
    return each(node, lambda i: -(b @ grads[0] @ b))


def _cofactor(xp, a):
    """d det(A) / dA (the cofactor matrix, conjugated for complex A), through the SVD: right for singular A too."""
    u, s, vh = xp.linalg.svd(a)
    n = a.shape[-1]
    idx = xp.arange(n)
    prods = xp.stack([xp.prod(xp.where(idx == j, 1.0, s), axis=-1) for j in range(n)], axis=-1)
    phase = xp.linalg.det(u) * xp.linalg.det(vh)
    adj = (_mh(vh) * prods[..., None, :]) @ _mh(u) * phase[..., None, None]  # adj(A) = A^-1 det(A)
    return conj(adj).swapaxes(-1, -2)


@op("LinalgDetBackward0", outputs=1, saved="A:tensor result:tensor? LU:tensor? pivots:tensor?", cost=_CUBE)
def det(node, grads, ctx):
    """det(A): g times the conjugated cofactor matrix (g conj(det) inv(A)^H when A is invertible)."""
    a = ctx.saved(node)["A"]
    xp = ctx.xp(node)
    if a.size == 0:  # 0 x 0 matrices (det 1) or an empty batch: an empty gradient
        return each(node, lambda i: xp.zeros(a.shape, dtype=xp.result_type(a, grads[0])))
    return each(node, lambda i: grads[0][..., None, None] * _cofactor(xp, a))


@op("LinalgSlogdetBackward0", outputs=1, saved="A:tensor sign:tensor LU:tensor? pivots:tensor?", cost=_CUBE)
def slogdet(node, grads, ctx):
    """slogdet(A) = (sign, log|det|): (g_logabsdet - i Im(conj(g_sign) sign)) inv(A)^H."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, sign = sv["A"], sv["sign"]
    g_sign, g_log = (list(grads) + [None, None])[:2]
    h = xp.zeros(sign.shape, dtype=xp.result_type(a, np.float32)) if g_log is None else g_log
    if g_sign is not None and sign.dtype.kind == "c":
        h = h - 1j * (conj(g_sign) * sign).imag
    if g_log is None and (g_sign is None or sign.dtype.kind != "c"):
        return each(node, lambda i: None)
    inv_h = _mh(xp.linalg.inv(a))
    return each(node, lambda i: h[..., None, None] * inv_h)


def _as_matrix_rhs(a, x):
    """Whether the right-hand side ``x`` of a solve with ``a`` is a (batch of) vector(s)."""
    return x.ndim == a.ndim - 1 or x.ndim == 1


@op("LinalgSolveExBackward0", outputs=2,
    saved="A:tensor result:tensor left:bool? LU:tensor? pivots:tensor?", cost=_CUBE)
def solve(node, grads, ctx):
    """linalg.solve(A, B): solve(A^H, g) to B and -gB X^H to A (left); the mirror image for left=False."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, x, g = sv["A"], sv["result"], grads[0]
    left = sv.get("left", True)
    vector = _as_matrix_rhs(a, x)
    if vector:
        x, g = x[..., None], g[..., None]
    if left:
        gb = _solve(xp, _mh(a), g)
        ga = -gb @ _mh(x)
    else:  # X A = B
        gb = _mh(_solve(xp, a, _mh(g)))
        ga = -_mh(x) @ gb
    if vector:
        gb = gb[..., 0]
    return each(node, lambda i: ga if i == 0 else gb)


def _tri(xp, m, upper, k=0):
    return xp.triu(m, k) if upper else xp.tril(m, -k)


def _solve_tri(xp, a, b, upper, left=True, unit=False):
    """Solve with a triangular ``a`` (general solve on the masked matrix; numpy has no triangular solver)."""
    a = _tri(xp, a, upper)
    if unit:
        a = a - a * _eye_like(xp, a) + _eye_like(xp, a)
    if left:
        return xp.linalg.solve(a, b)
    return _mh(xp.linalg.solve(_mh(a), _mh(b)))


@op("LinalgSolveTriangularBackward0", outputs=2,
    saved="self:tensor result:tensor upper:bool left:bool? unitriangular:bool?", cost=_CUBE)
def solve_triangular(node, grads, ctx):
    """linalg.solve_triangular(A, B): the solve's gradients, A's kept on its triangle (off the unit diagonal)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, x, g = sv["self"], sv["result"], grads[0]
    upper, left, unit = bool(sv["upper"]), sv.get("left", True), bool(sv.get("unitriangular"))
    if left:
        gb = _solve_tri(xp, _mh(a), g, not upper, True, unit)
        ga = -gb @ _mh(x)
    else:
        gb = _solve_tri(xp, _mh(a), g, not upper, False, unit)
        ga = -_mh(x) @ gb
    ga = _tri(xp, ga, upper, 1 if unit else 0)
    return each(node, lambda i: ga if i == 0 else gb)


def _cholesky_grad(xp, low, gl, upper):
    """The gradient of A from that of its Cholesky factor: L^-H N L^-1, N = (tril(L^H gL) + tril(L^H gL, -1)^H)
    / 2 (as PyTorch's cholesky_backward); an upper factor U = L^H is handled through its transpose."""
    if upper:
        low, gl = _mh(low), _mh(gl)
    m = _mh(low) @ gl
    n = 0.5 * (xp.tril(m) + _mh(xp.tril(m, -1)))
    y = _solve_tri(xp, _mh(low), n, upper=True)  # L^-H N
    return _solve_tri(xp, low, y, upper=False, left=False)  # ... L^-1


@op("LinalgCholeskyExBackward0", outputs=1, saved="L:tensor upper:bool?", cost=_CUBE)
def cholesky(node, grads, ctx):
    """linalg.cholesky(A) = L (A = L L^H): see ``_cholesky_grad``."""
    sv = ctx.saved(node)
    ga = _cholesky_grad(ctx.xp(node), sv["L"], grads[0], bool(sv.get("upper")))
    return each(node, lambda i: ga)


@op("CholeskyBackward0", outputs=1, saved="result:tensor upper:bool?", cost=_CUBE)
def cholesky_old(node, grads, ctx):
    """torch.cholesky(A, upper) (deprecated, the factor saved as ``result``): as linalg.cholesky."""
    sv = ctx.saved(node)
    ga = _cholesky_grad(ctx.xp(node), sv["result"], grads[0], bool(sv.get("upper")))
    return each(node, lambda i: ga)


@op("CholeskyInverseBackward0", outputs=1, saved="self:tensor result:tensor upper:bool?", cost=_CUBE)
def cholesky_inverse(node, grads, ctx):
    """cholesky_inverse(L) = (L L^H)^-1 = R: -(R (g + g^H) R) L, or -U (R (g + g^H) R) for an upper factor."""
    sv = ctx.saved(node)
    fac, inv, g = sv["self"], sv["result"], grads[0]
    common = inv @ ((g + _mh(g)) @ inv)
    ga = -(fac @ common) if sv.get("upper") else -(common @ fac)
    return each(node, lambda i: ga)


@op("TriangularSolveBackward0", outputs=2,
    saved="self:tensor A:tensor solution:tensor upper:bool transpose:bool? unitriangular:bool?", cost=_CUBE)
def triangular_solve(node, grads, ctx):
    """torch.triangular_solve(B, A, upper, transpose, unitriangular) = (X, A's copy): op(A) X = B with op the
    transpose or not. B gets op(A)^-H g_X; A gets -gB X^H (or -conj(X) gB^T transposed), kept on A's triangle
    (off the diagonal when unit), plus the gradient of the copy; both summed over broadcast batch dims."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, b, x = sv["A"], sv["self"], sv["solution"]
    upper, trans, unit = bool(sv["upper"]), bool(sv.get("transpose")), bool(sv.get("unitriangular"))
    gx = grads[0] if grads else None
    gm = grads[1] if len(grads) > 1 else None
    m = _tri(xp, a, upper)
    if unit:
        m = m - m * _eye_like(xp, m) + _eye_like(xp, m)
    gb = ga = None
    if gx is not None:
        op_h = conj(m) if trans else _mh(m)  # op(A)^H
        gb = xp.linalg.solve(op_h, gx)
        ga = -(conj(x) @ gb.swapaxes(-1, -2)) if trans else -(gb @ _mh(x))
        ga = _tri(xp, ga, upper, 1 if unit else 0)
    if gm is not None:
        ga = gm if ga is None else ga + gm

    def out(i):
        t = gb if i == 0 else ga
        shape = (b if i == 0 else a).shape
        if t is None:
            return xp.zeros(shape, dtype=(gx if gx is not None else gm).dtype)
        return sum_to(xp, t, shape)
    return each(node, out)


@op("RenormBackward0", outputs=1, saved="self:tensor p:scalar dim:int maxnorm:scalar", cost=cost.reduction(6))
def renorm(node, grads, ctx):
    """a.renorm(p, dim, maxnorm): each slice along dim whose p-norm n exceeds maxnorm is scaled by
    f = maxnorm / (n + 1e-7); its gradient f (g - nb / (n + 1e-7)) with nb the norm's gradient times
    sum(conj(a) g) over the slice (PyTorch's renorm_backward); other slices pass g through."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x, g = sv["self"], grads[0]
    p, maxnorm = num(sv["p"]), num(sv["maxnorm"])
    d = signed(sv["dim"]) % max(x.ndim, 1)
    axes = tuple(k for k in range(x.ndim) if k != d)
    pf = float(p)
    a = xp.abs(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if math.isinf(pf):
            norm = a.max(axis=axes, keepdims=True) if pf > 0 else a.min(axis=axes, keepdims=True)
        elif pf == 0:
            norm = (x != 0).sum(axis=axes, keepdims=True).astype(a.dtype)
        elif pf == 1:
            norm = a.sum(axis=axes, keepdims=True)
        elif pf == 2:
            norm = xp.sqrt((a * a).sum(axis=axes, keepdims=True))
        else:
            norm = (a ** pf).sum(axis=axes, keepdims=True) ** (1.0 / pf)
        go = conj(x) * g
        go = (go.real if go.dtype.kind == "c" else go).sum(axis=axes, keepdims=True)
        nb = norm_backward(xp, go, x, p, norm, list(axes), True)
        if nb is None:
            nb = xp.zeros_like(g)
        inv = 1.0 / (norm + 1e-7)
        factor = inv * maxnorm
        r = xp.where(norm > maxnorm, factor * g - factor * inv * nb, g)
    return each(node, lambda i: r.astype(g.dtype, copy=False))


@op("CholeskySolveBackward0", outputs=2, saved="self:tensor input2:tensor result:tensor upper:bool?", cost=_CUBE)
def cholesky_solve(node, grads, ctx):
    """cholesky_solve(B, L): X = (L L^H)^-1 B; cholesky_solve(g, L) to B, -(gB X^H + X gB^H) L to L."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    low, x, g = sv["input2"], sv["result"], grads[0]
    upper = bool(sv.get("upper"))
    fac = _mh(low) if upper else low  # lower factor
    gb = _solve_tri(xp, _mh(fac), _solve_tri(xp, fac, g, upper=False), upper=True)
    common = gb @ _mh(x)
    common = common + _mh(common)
    return each(node, lambda i: gb if i == 0 else (-low @ common if upper else -common @ low))


#: PyTorch's texts (torch 2.13) where linalg.qr cannot be differentiated.
ERR_QR_MODE_R = ("The derivative of linalg.qr depends on Q, which is not computed when mode='r'. Please use "
                 "linalg.qr(A, mode='reduced') if you are going to differentiate through linalg.qr.")
ERR_QR_COMPLETE = "The QR decomposition is not differentiable when mode='complete' and nrows > ncols."


def _qr_tall(xp, q, r, gq, gr):
    """A = QR with m >= n (Q m x n, R n x n): [gQ + Q syminvadj(triu(gR R^H - Q^H gQ))] R^-H."""
    m = xp.zeros(r.shape, dtype=np.result_type(q, r, *(g for g in (gq, gr) if g is not None)))
    if gr is not None:
        m = m + gr @ _mh(r)
    if gq is not None:
        m = m - _mh(q) @ gq
    upper = xp.triu(m)
    diag = xp.real(xp.diagonal(upper, axis1=-2, axis2=-1))
    sym = upper + _mh(upper) - diag[..., None] * _eye_like(xp, upper)
    b = q @ sym
    if gq is not None:
        b = b + gq
    return _solve_tri(xp, _mh(r), b, upper=False, left=False)


@op("LinalgQrBackward0", outputs=1, saved="Q:tensor R:tensor mode:str?", cost=_CUBE)
def qr(node, grads, ctx):
    """linalg.qr(A) = (Q, R): for m >= n, [gQ + Q syminvadj(triu(gR R^H - Q^H gQ))] R^-H; for m < n, A = Q [X Y]
    with R = [U V]: gY = Q gV and gX the square case of (gQ + Y gV^H, gU) (PyTorch's refusals for mode 'r' and
    for 'complete' with more rows than columns)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    q, r = sv["Q"], sv["R"]
    mode = sv.get("mode", "reduced")
    gq = grads[0] if len(grads) > 0 else None
    gr = grads[1] if len(grads) > 1 else None
    if mode == "r":
        raise RuntimeError(ERR_QR_MODE_R)
    rows, cols = q.shape[-2], r.shape[-1]
    if mode == "complete" and rows > cols:
        raise RuntimeError(ERR_QR_COMPLETE)
    if rows >= cols:
        ga = _qr_tall(xp, q, r, gq, gr)
    else:
        u, v = r[..., :, :rows], r[..., :, rows:]
        gu = None if gr is None else gr[..., :, :rows]
        gv = None if gr is None else gr[..., :, rows:]
        y = q @ v
        gq2 = gq if gv is None else (y @ _mh(gv) if gq is None else gq + y @ _mh(gv))
        gx = _qr_tall(xp, q, u, gq2, gu)
        gy = xp.zeros(v.shape, dtype=gx.dtype) if gv is None else q @ gv
        ga = xp.concatenate([gx, gy.astype(gx.dtype, copy=False)], axis=-1)
    return each(node, lambda i: ga)


def _pinv_grad(a, p, g):
    """The gradient of A from that of P = pinv(A) (``LinalgPinvBackward0``; lstsq's solution is pinv(A) B)."""
    rows, cols = a.shape[-2], a.shape[-1]
    ph, gh = _mh(p), _mh(g)
    if rows <= cols:
        k = gh @ p
        kph = k @ ph
        return -_mh(p @ k) + kph - (a @ p) @ kph + (ph @ p) @ (gh - k @ a)
    k = p @ gh
    phk = ph @ k
    return -_mh(k @ p) + (gh - a @ k) @ p @ ph + phk - phk @ p @ a


@op("LinalgPinvBackward0", outputs=1, saved="self:tensor result:tensor", cost=_CUBE)
def pinv(node, grads, ctx):
    """linalg.pinv(A) = P, at constant rank: -(P K)^H + K P^H - A P K P^H + P^H P (g^H - K A), K = g^H P
    (rows <= cols; the transposed arrangement otherwise, as PyTorch, so products stay small)."""
    sv = ctx.saved(node)
    ga = _pinv_grad(sv["self"], sv["result"], grads[0])
    return each(node, lambda i: ga)


@op("LinalgEighBackward0", outputs=1, saved="eigenvalues:tensor eigenvectors:tensor", cost=_CUBE)
def eigh(node, grads, ctx):
    """eigh(A) = (w, V): V (diag(g_w) + F o skew(V^H g_V)) V^H, F_ij = 1 / (w_j - w_i) off the diagonal (Hermitian)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    w, v = sv["eigenvalues"], sv["eigenvectors"]
    gw, gv = (list(grads) + [None, None])[:2]
    inner = xp.zeros(v.shape, dtype=v.dtype)
    if gv is not None:
        diff = w[..., None, :] - w[..., :, None]
        eye = _eye_like(xp, diff).astype(bool)
        with np.errstate(divide="ignore"):
            f = xp.where(eye, 0.0, 1.0 / xp.where(eye, 1.0, diff))
        m = _mh(v) @ gv
        inner = inner + f * (0.5 * (m - _mh(m)))
    if gw is not None:
        inner = inner + gw[..., None, :] * _eye_like(xp, inner)
    ga = v @ inner @ _mh(v)
    return each(node, lambda i: ga)


@op("LinalgSvdBackward0", outputs=1, saved="U:tensor S:tensor Vh:tensor full_matrices:bool? S_sym_argsize_minus_1:int?",
    cost=_CUBE)
def svd(node, grads, ctx):
    """svd(A) = U S Vh (reduced, or full narrowed to the k singular vectors): the gradient for A from those of
    U, S, Vh, with F_ij = 1 / (s_j**2 - s_i**2) off the diagonal and the projections onto the complements."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    u, s, vh = sv["U"], sv["S"], sv["Vh"]
    gu, gs, gvh = (list(grads) + [None] * 3)[:3]
    k = s.shape[-1]
    if sv.get("full_matrices"):
        u, vh = u[..., :k], vh[..., :k, :]
        gu = None if gu is None else gu[..., :k]
        gvh = None if gvh is None else gvh[..., :k, :]
    m, n = u.shape[-2], vh.shape[-1]
    dtype = xp.result_type(u, s)
    if gu is None and gvh is None:
        ga = (u * gs[..., None, :]) @ vh
        return each(node, lambda i: ga)
    v = _mh(vh)
    s2 = s * s
    diff = s2[..., None, :] - s2[..., :, None]  # s_j**2 - s_i**2
    eye = _eye_like(xp, diff).astype(bool)
    with np.errstate(divide="ignore"):
        f = xp.where(eye, 0.0, 1.0 / xp.where(eye, 1.0, diff))
    inner = xp.zeros(s.shape[:-1] + (k, k), dtype=dtype)
    if gs is not None:
        inner = inner + gs[..., None, :] * _eye_like(xp, inner)
    sd = s[..., None, :]
    if gu is not None:
        uhgu = _mh(u) @ gu
        inner = inner + (f * (uhgu - _mh(uhgu))) * sd
        if xp.iscomplexobj(uhgu):
            inner = inner + 1j * (uhgu * _eye_like(xp, uhgu)).imag / sd  # the phase gauge, once
    if gvh is not None:
        gv = _mh(gvh)
        vhgv = _mh(v) @ gv
        inner = inner + s[..., :, None] * (f * (vhgv - _mh(vhgv)))
    ga = u @ inner @ vh
    if gu is not None and m > k:
        ga = ga + (gu - u @ (_mh(u) @ gu)) / sd @ vh
    if gvh is not None and n > k:
        gv = _mh(gvh)
        ga = ga + u @ (_mh(gv - v @ (_mh(v) @ gv)) / s[..., :, None])
    return each(node, lambda i: ga)


# --- pairwise distances -------------------------------------------------------------------------------------


def _dist_terms(xp, g, diff, dist, p):
    """g times d ||diff||_p / d diff for pairwise differences (..., P, R, M), distances and their gradients
    (..., P, R), as PyTorch's distance kernels: p = 0 gives zeros; p = 1 and inf multiply g by the sign (and the
    arg-max mask); the others write zero where the distance is 0 (for p < 1 also where the difference is),
    whatever g is there."""
    g = g[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if p == 0:
            return xp.zeros(xp.broadcast_shapes(g.shape, diff.shape), dtype=xp.result_type(g, diff))
        if p == 1:
            return g * xp.sign(diff)
        d = dist[..., None]
        if math.isinf(p):
            return g * xp.where(d == 0, 0, xp.sign(diff) * (xp.abs(diff) == d))
        if p == 2:
            t = g * diff / d
        elif p < 2:
            t = xp.sign(diff) * xp.abs(diff) ** (p - 1) * g / d ** (p - 1)
        else:
            t = diff * xp.abs(diff) ** (p - 2) * g / d ** (p - 1)
        off = (d == 0) | (diff == 0) if p < 1 else d == 0
        return xp.where(off, 0, t)


def _cdist_grads(xp, g, x1, x2, dist, p):
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    t = _dist_terms(xp, g, diff, dist, float(num(p)))
    return t.sum(axis=-2), -t.sum(axis=-3)


@op("CdistBackward0", outputs=2, saved="x1:tensor x2:tensor result:tensor p:scalar?", cost=cost.CostModel(_norm_flops))
def cdist(node, grads, ctx):
    """cdist(x1, x2, p): each distance's gradient to both points, along d ||x1_i - x2_j||_p / d x1_i."""
    sv = ctx.saved(node)
    g1, g2 = _cdist_grads(ctx.xp(node), grads[0], sv["x1"], sv["x2"], sv["result"], sv.get("p", 2.0))
    return each(node, lambda i: g1 if i == 0 else g2)


@op("EuclideanDistBackward0", outputs=2, saved="x1:tensor x2:tensor result:tensor", cost=cost.MATMUL)
def euclidean_dist(node, grads, ctx):
    """cdist(x1, x2) by matrix products (large inputs): r = g / dist (0 where dist is 0); x1 sum(r) - r @ x2, ..."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x1, x2, d = sv["x1"], sv["x2"], sv["result"]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = xp.where(d == 0, 0, grads[0] / d)
    return each(node, lambda i: x1 * r.sum(axis=-1, keepdims=True) - r @ x2 if i == 0
                else x2 * r.sum(axis=-2)[..., None] - r.swapaxes(-1, -2) @ x1)


@op("PdistBackward0", outputs=1, saved="self:tensor result:tensor p:scalar?", cost=cost.CostModel(_norm_flops))
def pdist(node, grads, ctx):
    """pdist(x, p): the condensed distances' gradients to both points of each pair i < j."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    x = sv["self"]
    n = x.shape[0]
    iu, ju = np.triu_indices(n, 1)
    gm = xp.zeros((n, n), dtype=grads[0].dtype)
    dm = xp.zeros((n, n), dtype=sv["result"].dtype)
    gm[iu, ju] = grads[0]
    dm[iu, ju] = sv["result"]
    gm, dm = gm + gm.T, dm + dm.T
    g1, g2 = _cdist_grads(xp, gm, x, x, dm, sv.get("p", 2.0))
    return each(node, lambda i: (g1 + g2) / 2)


_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0,
           1.0)


def expm(xp, a):
    """The matrix exponential of a (batch of) square matrices: scaling and squaring with a [13/13] Pade approximant."""
    norm = float(xp.abs(a).sum(axis=-2).max()) if a.size else 0.0
    s = max(0, int(math.ceil(math.log2(norm / 5.371920351148152)))) if norm > 0 else 0
    a = a / (2.0 ** s)
    b = _PADE13
    eye = _eye_like(xp, a)
    a2 = a @ a
    a4 = a2 @ a2
    a6 = a4 @ a2
    u = a @ (a6 @ (b[13] * a6 + b[11] * a4 + b[9] * a2) + b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * eye)
    v = a6 @ (b[12] * a6 + b[10] * a4 + b[8] * a2) + b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * eye
    r = xp.linalg.solve(v - u, v + u)
    for _ in range(s):
        r = r @ r
    return r


@op("LinalgMatrixExpBackward0", outputs=1, saved="self:tensor", cost=cost.CostModel(lambda s: 8.0 * _cube_flops(s)))
def matrix_exp(node, grads, ctx):
    """matrix_exp(A): the upper-right block of exp([[A^H, g], [0, A^H]]) (the Frechet derivative's adjoint)."""
    a = ctx.saved(node)["self"]
    xp = ctx.xp(node)
    g = grads[0]
    n = a.shape[-1]
    ah = _mh(a)
    big = xp.zeros(a.shape[:-2] + (2 * n, 2 * n), dtype=xp.result_type(a, g))
    big[..., :n, :n] = ah
    big[..., n:, n:] = ah
    big[..., :n, n:] = g
    ga = expm(xp, big)[..., :n, n:]
    return each(node, lambda i: ga)


# --- the LU family: linalg.lu, lu_factor(_ex), lu_unpack, lu_solve -------------------------------------------------
# PyTorch's formulas (FunctionsManual: linalg_lu_backward, lu_factor_ex_backward, lu_unpack_backward,
# linalg_lu_solve_LU), re-derived on numpy with the triangular solves done on the masked factors.


def _l_u_grads(grads):
    """The gradients of L and U among a (P, L, U) node's inputs: P is not differentiable, and PyTorch gives the
    node no input slot for it (a file may still list three slots)."""
    grads = list(grads)
    return (grads[-2], grads[-1]) if len(grads) >= 2 else (grads[0] if grads else None, None)


def _lu_unpack(xp, lu, pivots, unpack_pivots=True):
    """P, L, U of a packed LU (LAPACK's 1-based row interchanges in ``pivots``): A = P L U, L unit lower m x k,
    U upper k x n; P the identity when ``unpack_pivots`` is false."""
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    eye = xp.eye(m, k, dtype=lu.dtype)
    low = xp.tril(lu[..., :, :k], -1) + eye
    up = xp.triu(lu[..., :k, :])
    batch = lu.shape[:-2]
    perm = np.broadcast_to(np.arange(m), batch + (m,)).copy()
    if unpack_pivots and k > 0 and int(np.prod(batch)) > 0:
        piv = np.asarray(pivots.get() if hasattr(pivots, "get") else pivots).astype(np.int64).reshape(-1, k) - 1
        flat = perm.reshape(-1, m)
        for b in range(flat.shape[0]):
            for i in range(k):
                j = int(piv[b, i])
                flat[b, i], flat[b, j] = flat[b, j], flat[b, i]
        perm = flat.reshape(batch + (m,))
    p = np.zeros(batch + (m, m), dtype=lu.dtype if lu.dtype.kind != "c" else lu.real.dtype)
    np.put_along_axis(p, perm[..., None, :], 1, axis=-2)  # P[perm[j], j] = 1
    return xp.asarray(p).astype(lu.dtype), low, up


def _lu_backward(xp, gl, gu, p, low, up, pivot=True):
    """The gradient of A = P L U from those of L and U (square, wide and tall A)."""
    if gl is None and gu is None:
        return None
    m, n = low.shape[-2], up.shape[-1]
    k = min(m, n)
    if m == n:
        a = xp.tril(_mh(low) @ gl, -1) if gl is not None else None
        if gu is not None:
            t = xp.triu(gu @ _mh(up))
            a = t if a is None else a + t
        a = _solve_tri(xp, _mh(up), a, upper=False, left=False)
        a = _solve_tri(xp, _mh(low), a, upper=True, unit=True)
    elif m < n:
        a = _mh(low) @ gl if gl is not None else None
        if gu is not None:
            t = xp.triu(gu) @ _mh(up)
            a = -t if a is None else a - t
        a = _solve_tri(xp, _mh(up[..., :k]), xp.tril(a, -1), upper=False, left=False)
        if gu is not None:
            a = xp.concatenate([a + xp.triu(gu[..., :k]), gu[..., k:]], axis=-1)
        a = _solve_tri(xp, _mh(low), a, upper=True, unit=True)
        if gu is None:
            a = xp.concatenate([a, xp.zeros_like(up[..., k:])], axis=-1)
    else:
        a = gu @ _mh(up) if gu is not None else None
        if gl is not None:
            t = _mh(low) @ xp.tril(gl, -1)
            a = -t if a is None else a - t
        a = _solve_tri(xp, _mh(low[..., :k, :]), xp.triu(a), upper=True, unit=True)
        if gl is not None:
            a = xp.concatenate([a + xp.tril(gl[..., :k, :], -1), gl[..., k:, :]], axis=-2)
        a = _solve_tri(xp, _mh(up), a, upper=False, left=False)
        if gl is None:
            a = xp.concatenate([a, xp.zeros_like(low[..., k:, :])], axis=-2)
    return p @ a if pivot else a


@op("LinalgLuBackward0", outputs=1, saved="L:tensor P:tensor U:tensor pivot:bool?", cost=_CUBE)
def linalg_lu(node, grads, ctx):
    """linalg.lu(A) = (P, L, U): P L^-H [L^H gL o 1_L + gU U^H o 1_U] U^-H for a square A, with the extra block
    of U (wide) or L (tall) passed through (PyTorch's linalg_lu_backward)."""
    sv = ctx.saved(node)
    gl, gu = _l_u_grads(grads)
    ga = _lu_backward(ctx.xp(node), gl, gu, sv["P"], sv["L"], sv["U"], bool(sv.get("pivot", True)))
    return each(node, lambda i: ga)


@op("LinalgLuFactorExBackward0", outputs=1, saved="LU:tensor pivots:tensor pivot:bool?", cost=_CUBE)
def lu_factor_ex(node, grads, ctx):
    """linalg.lu_factor(_ex)(A) = (LU, pivots): linalg.lu's gradient with gL and gU the packed gradient's
    lower k columns and upper k rows."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    g, lu = grads[0], sv["LU"]
    pivot = bool(sv.get("pivot", True))
    p, low, up = _lu_unpack(xp, lu, sv["pivots"], pivot)
    k = min(lu.shape[-2], lu.shape[-1])
    ga = _lu_backward(xp, g[..., :, :k], g[..., :k, :], p, low, up, pivot)
    return each(node, lambda i: ga)


@op("LuUnpackBackward0", outputs=1, saved="LU_data_sym_argsize_minus_1:int LU_data_sym_argsize_minus_2:int",
    cost=cost.COPY)
def lu_unpack(node, grads, ctx):
    """lu_unpack(LU, pivots) = (P, L, U): gL below the diagonal plus gU on and above it, each factor's extra
    block (tall L, wide U) where it is."""
    xp = ctx.xp(node)
    n, m = int(node.saved["LU_data_sym_argsize_minus_1"]), int(node.saved["LU_data_sym_argsize_minus_2"])
    k = min(m, n)
    gl, gu = _l_u_grads(grads)
    if gl is None and gu is None:
        return each(node, lambda i: None)
    if gl is not None and gu is not None:
        if m == n:
            r = xp.tril(gl, -1) + xp.triu(gu)
        else:
            a1 = xp.tril(gl[..., :k, :], -1) + xp.triu(gu[..., :, :k])
            r = xp.concatenate([a1, gl[..., k:, :]], axis=-2) if m > n else \
                xp.concatenate([a1, gu[..., :, k:]], axis=-1)
    elif gl is not None:
        r = xp.tril(gl, -1)
        if m < n:
            r = xp.concatenate([r, xp.zeros(gl.shape[:-1] + (n - m,), dtype=gl.dtype)], axis=-1)
    else:
        r = xp.triu(gu)
        if n < m:
            r = xp.concatenate([r, xp.zeros(gu.shape[:-2] + (m - n, gu.shape[-1]), dtype=gu.dtype)], axis=-2)
    return each(node, lambda i: r)


def _lu_solve(xp, p, low, up, b, left, adjoint):
    """X with op(A) X = B (left) or X op(A) = B, A = P L U, op(A) = A^H when ``adjoint``."""
    if not left:  # X op(A) = B  <=>  op(A)^H X^H = B^H
        return _mh(_lu_solve(xp, p, low, up, _mh(b), True, not adjoint))
    if adjoint:  # A^H X = B: U^H L^H P^T X = B
        y = _solve_tri(xp, _mh(up), b, upper=False)
        y = _solve_tri(xp, _mh(low), y, upper=True, unit=True)
        return p @ y
    y = _solve_tri(xp, low, p.swapaxes(-1, -2) @ b, upper=False, unit=True)
    return _solve_tri(xp, up, y, upper=True)


@op("LinalgLuSolveBackward0", outputs=2,
    saved="LU:tensor pivots:tensor result:tensor left:bool? adjoint:bool?", cost=_CUBE)
def lu_solve(node, grads, ctx):
    """linalg.lu_solve(LU, pivots, B, left, adjoint) = X: B gets the solve with the other adjoint; LU gets
    PyTorch's linalg_lu_solve_LU (through U^-H and L^-H, or P^T .. P and L^-H when left == adjoint)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    gx, lu, x = grads[0], sv["LU"], sv["result"]
    left, adjoint = bool(sv.get("left", True)), bool(sv.get("adjoint", False))
    p, low, up = _lu_unpack(xp, lu, sv["pivots"])

    def out(i):
        if i == 1:
            return _lu_solve(xp, p, low, up, gx, left, not adjoint)
        if left != adjoint:
            rhs = -((gx if left else _mh(gx)) @ (_mh(x) if left else x))
            gr = _solve_tri(xp, _mh(up), rhs, upper=False)
            gl = xp.tril(_solve_tri(xp, _mh(low), gr @ _mh(up), upper=True, unit=True), -1)
            return gl + xp.triu(gr)
        gr = -(p.swapaxes(-1, -2) @ (x if left else _mh(x)) @ (_mh(gx) if left else gx) @ p)
        gr = _solve_tri(xp, _mh(low), gr, upper=True, left=False, unit=True)
        gu = xp.triu(_solve_tri(xp, _mh(up), _mh(low) @ gr, upper=False, left=False))
        return xp.tril(gr, -1) + gu
    return each(node, out)


@op("LinalgLstsqBackward0", outputs=2, saved="self:tensor b:tensor solution:tensor", cost=_CUBE)
def lstsq(node, grads, ctx):
    """linalg.lstsq(A, B).solution = pinv(A) B: A gets pinv's gradient for gX B^H, B gets pinv(A)^H gX (as
    PyTorch's linalg_lstsq_backward; B may be a vector or a batch of them)."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, b, gx = sv["self"], sv["b"], grads[0]
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    b_m = b[..., None] if vector else b
    gx_m = None if gx is None else (gx[..., None] if vector else gx)
    p = xp.linalg.pinv(a)
    gr = grads[1] if len(grads) > 1 else None
    if gr is not None and gr.size == 0:
        gr = None  # residuals are empty unless A is tall and of full rank (and the driver is not gelsy)
    if gx is None and gr is None:
        return each(node, lambda i: None)
    if gx_m is None:
        gx_m = xp.zeros(p.shape[:-1] + b_m.shape[-1:], dtype=b.dtype)
    # Residuals r_j = ||B_j - A X_j||^2 at the least-squares optimum (A^H E = 0): dr_j = 2 Re<E_j, dB_j - dA X_j>
    e_gr = None
    if gr is not None:
        x_m = sv["solution"][..., None] if vector else sv["solution"]
        e_gr = 2 * (b_m - a @ x_m) * gr[..., None, :]

    def out(i):
        if i == 0:
            ga = _pinv_grad(a, p, gx_m @ _mh(b_m))
            if e_gr is not None:
                ga = ga - e_gr @ _mh(x_m)
            return sum_to(xp, ga, a.shape)
        gb = _mh(p) @ gx_m
        if e_gr is not None:
            gb = gb + e_gr
        return sum_to(xp, gb[..., 0] if vector else gb, b.shape)
    return each(node, out)


#: PyTorch's text (torch 2.13) when a loss depends on the phase of complex eigenvectors.
ERR_EIG_PHASE = ("linalg_eig_backward: The eigenvectors in the complex case are specified up to multiplication by "
                 "e^{i phi}. The specified loss function depends on this quantity, so it is ill-defined.")


@op("LinalgEigBackward0", outputs=1, saved="eigenvalues:tensor eigenvectors:tensor", cost=_CUBE)
def eig(node, grads, ctx):
    """linalg.eig(A) = (L, V), V's columns of norm 1: V^-H (diag(gL) + P(V^H gV) / conj(L_j - L_i)) V^H, P the
    projection V^H gV - V^H V Re(diag(V^H gV)) (PyTorch's linalg_eig_backward; only gL: V^-H diag(gL) V^H, for
    eigvals). A real A gets the real part. A loss that depends on the eigenvectors' phase raises PyTorch's
    error."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    lam, v = sv["eigenvalues"], sv["eigenvectors"]
    gl, gv = (list(grads) + [None, None])[:2]
    if gl is None and gv is None:
        return each(node, lambda i: None)
    vh = _mh(v)
    if gv is None:
        ga = xp.linalg.solve(vh, gl[..., :, None] * vh)
    else:
        m = vh @ gv
        d = xp.diagonal(m, 0, -2, -1)
        if not np.allclose(np.asarray(d.imag), 0, rtol=1e-2, atol=1e-2):
            raise RuntimeError(ERR_EIG_PHASE)
        m = m - vh @ (v * d.real[..., None, :])
        lc = conj(lam)
        e = lc[..., None, :] - lc[..., :, None]
        eye = _eye_like(xp, e).astype(bool)
        m = m / xp.where(eye, 1, e)
        if gl is not None:
            m = xp.where(eye, gl[..., None, :] * xp.ones_like(m), m)
        ga = xp.linalg.solve(vh, m @ vh)
    return each(node, lambda i: real_for(node, i, ga))


# --- Householder products: linalg.householder_product, ormqr -------------------------------------------------------
# Q = H_1 ... H_k with H_i = I - tau_i v_i v_i^H, v_i = (0, ..., 0, 1, A[i+1:, i]) (LAPACK's reflectors). The
# gradients follow the product step by step: for Y = H X, gH = gY X^H and gX = H^H gY (X H likewise), and
# from gH = g(I - t v v^H): g_t = -v^H gH v, g_v = -(conj(t) gH + t gH^H) v (t = conj(tau) for H^H).


def _reflector(xp, a, i):
    v = xp.zeros(a.shape[:-1], dtype=a.dtype)
    v[..., i] = 1
    v[..., i + 1:] = a[..., i + 1:, i]
    return v


def _householder_steps(xp, a, tau, x, left, adjoint):
    """Apply op(Q) to x (from the left or the right) one reflector at a time; returns (result, steps) with each
    step's (reflector index, input) for the backward."""
    k = tau.shape[-1]
    # Q = H_1 .. H_k: Q X applies H_k first; Q^H X applies H_1^H first; X Q applies H_1 first; X Q^H H_k^H first.
    order = list(range(k - 1, -1, -1)) if left != adjoint else list(range(k))
    steps = []
    for i in order:
        v = _reflector(xp, a, i)
        t = conj(tau[..., i]) if adjoint else tau[..., i]
        steps.append((i, x))
        if left:
            x = x - t[..., None, None] * (v[..., :, None] * (conj(v)[..., None, :] @ x))
        else:
            x = x - t[..., None, None] * ((x @ v[..., :, None]) * conj(v)[..., None, :])
    return x, steps


def _householder_backward(xp, a, tau, steps, gy, left, adjoint, want_x=True):
    """(gA, gtau, gX) through the steps of ``_householder_steps`` (gX None unless ``want_x``)."""
    ga = xp.zeros_like(a, dtype=xp.result_type(a, gy))
    gtau = xp.zeros_like(tau, dtype=xp.result_type(tau, gy))
    g = gy
    for i, x in reversed(steps):
        v = _reflector(xp, a, i)
        t = conj(tau[..., i]) if adjoint else tau[..., i]
        tb = t[..., None, None]
        vc, vr = v[..., :, None], conj(v)[..., None, :]
        if left:  # Y = H X
            gh = g @ _mh(x)
            g = g - conj(tb) * (vc * (vr @ g))  # H^H g
        else:  # Y = X H
            gh = _mh(x) @ g
            g = g - conj(tb) * ((g @ vc) * vr)  # g H^H
        g_t = -(vr @ gh @ vc)[..., 0, 0]
        g_v = -((conj(tb) * gh + tb * _mh(gh)) @ vc)[..., 0]
        gtau[..., i] += conj(g_t) if adjoint else g_t
        ga[..., i + 1:, i] += g_v[..., i + 1:]
    return ga, gtau, (g if want_x else None)


@op("LinalgHouseholderProductBackward0", outputs=2, saved="input:tensor tau:tensor result:tensor", cost=_CUBE)
def householder_product(node, grads, ctx):
    """linalg.householder_product(A, tau) = the first n columns of H_1 ... H_k: gradients to A's reflector
    entries (below the diagonal) and to tau, back through the product."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, tau, g = sv["input"], sv["tau"], grads[0]
    m, n = a.shape[-2], a.shape[-1]
    eye = xp.broadcast_to(xp.eye(m, n, dtype=a.dtype), a.shape).copy()
    _, steps = _householder_steps(xp, a, tau, eye, True, False)
    ga, gtau, _ = _householder_backward(xp, a, tau, steps, g, True, False, want_x=False)
    return each(node, lambda i: real_for(node, i, ga if i == 0 else gtau))


@op("OrmqrBackward0", outputs=3,
    saved="self:tensor input2:tensor input3:tensor left:bool? transpose:bool? result:tensor", cost=_CUBE)
def ormqr(node, grads, ctx):
    """ormqr(A, tau, C, left, transpose) = op(Q) C or C op(Q), Q = H_1 ... H_k (op: the conjugate transpose
    when ``transpose``): gradients to A's reflectors, tau and C, back through the product."""
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    a, tau, c, g = sv["self"], sv["input2"], sv["input3"], grads[0]
    left, adjoint = bool(sv.get("left", True)), bool(sv.get("transpose", False))
    _, steps = _householder_steps(xp, a, tau, c, left, adjoint)
    ga, gtau, gc = _householder_backward(xp, a, tau, steps, g, left, adjoint)
    return each(node, lambda i: real_for(node, i, (ga, gtau, gc)[i]))
