"""Sampling grids: grid_sample (bilinear, nearest, bicubic; zeros, border, reflection padding; 2-d and 3-d),
affine_grid; and the reparameterised gradient of Gamma samples (Dirichlet's is in ``functions``).

``grid_sample`` reads the input at the points a grid gives (``[-1, 1]``
coordinates, the last grid dim ordered x, y[, z]). Its backward scatters
each output's gradient into the input with the interpolation weights
(``np.add.at``, repeated points accumulate) and gives the grid the
derivative of those weights times the values read, times the
``d source / d grid`` factor of the unnormalisation and of the padding
(border clamping and reflection flip or stop it), as PyTorch's kernels.
Bicubic weights are the cubic convolution kernel with A = -0.75; each of its
16 taps is padded on its own. The backward's own backward (a gradient penalty
through grid_sample) reuses the same taps, with the weights' second
derivatives for the grid.

The Gamma node multiplies the gradient by the derivative of the sample with
respect to its parameter, a special function that PyTorch evaluates with
its own approximations (``_standard_gamma_grad``): capture records its value
at the saved sample as ``grad_factor`` (it depends on nothing else), so the
replay gives PyTorch's gradient exactly.
"""

from __future__ import annotations

import itertools
import math

from autograd_run.ops import cost
from autograd_run.ops.arrays import add_at, each, keep_where
from autograd_run.ops.spec import op

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


def _unnormalize(xp, coord, size, align_corners):
    """Grid coordinate -> input index, and its derivative."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1), (size - 1) / 2
    return ((coord + 1) * size - 1) / 2, size / 2


def _clip(xp, x, size):
    """Clamp into [0, size - 1]; the derivative is 0 where clamped (at the bounds too, as PyTorch)."""
    inside = (x > 0) & (x < size - 1)
    return xp.clip(x, 0, size - 1), inside.astype(x.dtype)


def _reflect(xp, x, twice_low, twice_high):
    """Reflect into [low, high] (by halves); the derivative is +1 or -1."""
    if twice_low == twice_high:
        return xp.zeros_like(x), xp.zeros_like(x)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    d = x - low
    sign = xp.where(d < 0, -1.0, 1.0).astype(x.dtype)
    d = xp.abs(d)
    extra = xp.fmod(d, span)
    flips = xp.floor(d / span).astype(xp.int64)
    even = flips % 2 == 0
    return xp.where(even, extra + low, span - extra + low), xp.where(even, sign, -sign)


def _pad_coordinate(xp, x, size, padding, align_corners):
    """Apply the padding mode to source indices; returns them and d(out)/d(in)."""
    one = xp.ones_like(x)
    if padding == BORDER:
        return _clip(xp, x, size)
    if padding == REFLECTION:
        if align_corners:
            x, d1 = _reflect(xp, x, 0, 2 * (size - 1))
        else:
            x, d1 = _reflect(xp, x, -1, 2 * size - 1)
        x, d2 = _clip(xp, x, size)
        return x, d1 * d2
    return x, one


def _cubic_weights(t, second=False):
    """Weights of the taps at floor - 1, floor, floor + 1, floor + 2 for fraction t, and their t-derivatives
    (and, with ``second``, their second t-derivatives)."""
    a = _CUBIC_A
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a          # noqa: E731  1 < s < 2
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1                 # noqa: E731  s <= 1
    dfar = lambda s: (3 * a * s - 10 * a) * s + 8 * a                    # noqa: E731
    dnear = lambda s: (3 * (a + 2) * s - 2 * (a + 3)) * s                # noqa: E731
    w = [far(1 + t), near(t), near(1 - t), far(2 - t)]
    dw = [dfar(1 + t), dnear(t), -dnear(1 - t), -dfar(2 - t)]
    if not second:
        return w, dw
    d2far = lambda s: 6 * a * s - 10 * a                                 # noqa: E731
    d2near = lambda s: 6 * (a + 2) * s - 2 * (a + 3)                     # noqa: E731
    return w, dw, [d2far(1 + t), d2near(t), d2near(1 - t), d2far(2 - t)]


def _taps(xp, node, x, grid, mode, padding, align_corners, second=False):
    """The taps of every output point: a list of (integer index per spatial dim, in-bounds mask, weight,
    d weight / d grid coordinate per grid component); with ``second``, a fifth entry: the weight's second
    derivatives, ``{(d, e): array}`` for d <= e over spatial dims (missing pairs are zero; None for nearest)."""
    k = grid.shape[-1]
    sizes = x.shape[2:]                   # input spatial sizes, outermost first (D, H, W)
    coords, mults = [], []                # per spatial dim, outermost first
    for d in range(k):
        comp = grid[..., k - 1 - d]       # grid component k-1-d indexes spatial dim d
        c, m = _unnormalize(xp, comp, sizes[d], align_corners)
        if mode != BICUBIC:
            c, m2 = _pad_coordinate(xp, c, sizes[d], padding, align_corners)
            m = m * m2
        else:
            m = m * xp.ones_like(c)
        coords.append(c)
        mults.append(m)
    taps = []
    if mode == NEAREST:
        idx = [xp.rint(c).astype(xp.int64) for c in coords]
        ok = _in_bounds(idx, sizes)
        taps.append((idx, ok, xp.ones_like(coords[0]), None) + ((None,) if second else ()))
        return taps, mults
    if mode == BILINEAR:
        base = [xp.floor(c) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        for corner in itertools.product((0, 1), repeat=k):
            idx = [(b + o).astype(xp.int64) for b, o in zip(base, corner)]
            ws = [f if o else 1 - f for f, o in zip(frac, corner)]
            dws = [xp.ones_like(f) if o else -xp.ones_like(f) for f, o in zip(frac, corner)]
            tap = (idx, _in_bounds(idx, sizes), _prod(ws), _partials(ws, dws))
            # linear in each coordinate: only the mixed second derivatives are non-zero
            taps.append(tap + (_second_partials(ws, dws, None),) if second else tap)
        return taps, mults
    # bicubic: 4 taps per dim, each padded on its own
    base = [xp.floor(c) for c in coords]
    frac = [c - b for c, b in zip(coords, base)]
    cubic = [_cubic_weights(f, second) for f in frac]
    for offs in itertools.product(range(4), repeat=k):
        idx, ok = [], None
        for d, o in enumerate(offs):
            p, _ = _pad_coordinate(xp, base[d] - 1 + o, sizes[d], padding, align_corners)
            idx.append(p.astype(xp.int64))    # truncation, as PyTorch's cast (the padded value is >= 0 or masked)
        ok = _in_bounds(idx, sizes)
        ws = [cubic[d][0][o] for d, o in enumerate(offs)]
        dws = [cubic[d][1][o] for d, o in enumerate(offs)]
        tap = (idx, ok, _prod(ws), _partials(ws, dws))
        if second:
            tap = tap + (_second_partials(ws, dws, [cubic[d][2][o] for d, o in enumerate(offs)]),)
        taps.append(tap)
    return taps, mults


def _prod(ws):
    out = ws[0]
    for w in ws[1:]:
        out = out * w
    return out


def _partials(ws, dws):
    """d(prod ws)/d(coordinate d) for each d."""
    out = []
    for d in range(len(ws)):
        p = dws[d]
        for e, w in enumerate(ws):
            if e != d:
                p = p * w
        out.append(p)
    return out


def _second_partials(ws, dws, d2ws):
    """d2(prod ws)/d(coordinate d) d(coordinate e) for d <= e, as {(d, e): array}; the diagonal only where
    ``d2ws`` (each factor's second derivative) is given."""
    out = {}
    k = len(ws)
    for d in range(k):
        for e in range(d, k):
            if d == e:
                if d2ws is None:
                    continue
                p = d2ws[d]
            else:
                p = dws[d] * dws[e]
            for f, w in enumerate(ws):
                if f != d and f != e:
                    p = p * w
            out[(d, e)] = p
    return out


def _in_bounds(idx, sizes):
    ok = None
    for i, n in zip(idx, sizes):
        m = (i >= 0) & (i < n)
        ok = m if ok is None else ok & m
    return ok


@op("GridSampler2DBackward0", "GridSampler3DBackward0", outputs=2,
    saved="input:tensor grid:tensor interpolation_mode:int padding_mode:int align_corners:bool",
    cost=cost.pointwise(40))
def grid_sampler(node, grads, ctx):
    """grid_sample(x, grid): each output's gradient to the input points it interpolated (weights); the grid gets
    the weights' derivative times the values read, times the unnormalisation and padding factors."""
    sv = ctx.saved(node)
    x, grid = sv["input"], sv["grid"]
    mode, padding, align = int(sv["interpolation_mode"]), int(sv["padding_mode"]), bool(sv["align_corners"])
    xp = ctx.xp(node)
    g = grads[0]                                          # (N, C, *out)
    n, c = x.shape[:2]
    k = grid.shape[-1]
    sizes = x.shape[2:]
    taps, mults = _taps(xp, node, x, grid, mode, padding, align)
    flat_in = int(math.prod(sizes))
    dx = xp.zeros((n, c, flat_in), dtype=g.dtype)
    dgrid = [xp.zeros(grid.shape[:-1], dtype=g.dtype) for _ in range(k)]
    xflat = x.reshape(n, c, flat_in)
    batch = xp.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    # The grid's gradient sums, per output point, g times each tap's value times its weight's derivative. PyTorch's
    # 2-d bilinear kernel adds the taps' value terms first and multiplies by g once (a NaN or infinite g gives
    # inf * c, not inf - inf); its 2-d bicubic one multiplies tap by tap, its 3-d one too, skipping out-of-bounds
    # taps (not g times 0): the order matters only for a non-finite g.
    combine = mode == BILINEAR and k == 2
    coef = [0.0] * k
    for idx, ok, w, dws in taps:
        lin = xp.zeros(idx[0].shape, dtype=xp.int64)
        for i, size in zip(idx, sizes):
            lin = lin * size + xp.clip(i, 0, size - 1)
        # values read at the tap: (N, C, *out), zero out of bounds
        vals = xflat[batch, :, lin]                       # (N, *out, C)
        vals = xp.moveaxis(vals, -1, 1) * ok[:, None]
        # out-of-bounds taps add nothing (PyTorch skips them), not g times 0: a NaN or infinite g would stay
        contrib = keep_where(xp, ok[:, None], g * w[:, None])
        chans = xp.arange(c).reshape((1, c) + (1,) * (lin.ndim - 1))
        add_at(xp, dx, (batch[:, None], chans, lin[:, None]), contrib)
        if dws is None:
            continue
        if combine:
            for d in range(k):
                coef[d] = coef[d] + vals * dws[d][:, None]
            continue
        gv = (g * vals).sum(axis=1)                       # (N, *out)
        for d in range(k):
            part = gv * dws[d]
            dgrid[d] = dgrid[d] + (keep_where(xp, ok, part) if k == 3 else part)
    if combine:
        dgrid = [(g * c).sum(axis=1) for c in coef]
    gg = xp.stack([dgrid[k - 1 - j] * mults[k - 1 - j] for j in range(k)], axis=-1)
    dx = dx.reshape(x.shape)
    return each(node, lambda i: dx if i == 0 else gg)


@op("GridSampler2DBackwardBackward0", "GridSampler3DBackwardBackward0", outputs=3,
    saved="grad_output:tensor input:tensor grid:tensor interpolation_mode:int padding_mode:int "
          "align_corners:bool",
    cost=cost.pointwise(80))
def grid_sampler_backward_backward(node, grads, ctx):
    """grid_sample's backward, differentiated (gradient penalties through spatial transformers).

    The incoming gradients ggI (of grad_input) and ggGrid (of grad_grid), either possibly undefined, give those
    of grad_output, input and grid. grad_input is the weights times grad_output scattered into the taps,
    grad_grid the weights' grid derivative times the values read times grad_output. So ggI gives grad_output
    the sample of ggI at the grid, and the grid the grid part of the backward with ggI in place of the input;
    ggGrid (through the unnormalisation and padding factors) gives grad_output the weights' derivative times the
    values read, the input that derivative times grad_output scattered into the taps, and the grid the weights'
    second derivatives (the mixed ones only for bilinear, the cubic kernel's for bicubic; padding's factors
    apply twice, their own derivatives are zero almost everywhere). A nearest kernel is flat in the grid: ggGrid
    adds nothing, and the input gets no gradient."""
    sv = ctx.saved(node)
    go, x, grid = sv["grad_output"], sv["input"], sv["grid"]
    mode, padding, align = int(sv["interpolation_mode"]), int(sv["padding_mode"]), bool(sv["align_corners"])
    xp = ctx.xp(node)
    ggi = grads[0]
    ggg = grads[1] if len(grads) > 1 else None
    if mode == NEAREST:
        ggg = None
    if ggi is None and ggg is None:
        return [None] * len(node.next)
    n, c = x.shape[:2]
    k = grid.shape[-1]
    sizes = x.shape[2:]
    dtype = go.dtype
    taps, mults = _taps(xp, node, x, grid, mode, padding, align, second=ggg is not None)
    flat_in = int(math.prod(sizes))
    batch = xp.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    xflat = x.reshape(n, c, flat_in)
    iflat = None if ggi is None else ggi.reshape(n, c, flat_in)
    # ggGrid per spatial dim (outermost first), times d source / d grid: the weight for d weight / d source
    a = None if ggg is None else [ggg[..., k - 1 - d] * mults[d] for d in range(k)]
    d_go = xp.zeros(go.shape, dtype=dtype) if ggi is not None or a is not None else None
    d_in = xp.zeros((n, c, flat_in), dtype=dtype) if a is not None else None
    d_src = [xp.zeros(grid.shape[:-1], dtype=dtype) for _ in range(k)]   # d grid per spatial dim, before mults
    chans = xp.arange(c).reshape((1, c) + (1,) * (grid.ndim - 2))

    def read(flat, lin, ok):
        vals = xp.moveaxis(flat[batch, :, lin], -1, 1)    # (N, C, *out)
        return keep_where(xp, ok[:, None], vals)

    for tap in taps:
        idx, ok, w, dws = tap[:4]
        lin = xp.zeros(idx[0].shape, dtype=xp.int64)
        for i, size in zip(idx, sizes):
            lin = lin * size + xp.clip(i, 0, size - 1)
        if ggi is not None:
            vi = read(iflat, lin, ok)
            d_go += w[:, None] * vi
            if dws is not None:
                gvi = (go * vi).sum(axis=1)
                for d in range(k):
                    d_src[d] += gvi * dws[d]
        if a is None:
            continue
        vx = read(xflat, lin, ok)
        slope = a[0] * dws[0]                             # sum_d ggGrid_d m_d d w / d source_d
        for d in range(1, k):
            slope = slope + a[d] * dws[d]
        d_go += slope[:, None] * vx
        add_at(xp, d_in, (batch[:, None], chans, lin[:, None]), keep_where(xp, ok[:, None], go * slope[:, None]))
        gvx = (go * vx).sum(axis=1)
        for (d, e), h in tap[4].items():
            d_src[e] += gvx * h * a[d]
            if d != e:
                d_src[d] += gvx * h * a[e]
    d_grid = xp.stack([d_src[k - 1 - j] * mults[k - 1 - j] for j in range(k)], axis=-1)
    outs = [d_go, None if d_in is None else d_in.reshape(x.shape), d_grid]
    return each(node, lambda i: outs[i])


def _base_grid(xp, sizes, align_corners, dtype):
    """affine_grid's base points (x, y[, z], 1) over the output sizes (outermost first), shape (*sizes, k + 1)."""
    lines = []
    for s in sizes:
        if s <= 1:
            lines.append(xp.zeros(max(s, 0), dtype=dtype))
            continue
        r = xp.linspace(-1, 1, s, dtype=dtype)
        lines.append(r if align_corners else r * (s - 1) / s)
    mesh = xp.meshgrid(*lines, indexing="ij")              # outermost first
    comps = [mesh[len(sizes) - 1 - j] for j in range(len(sizes))]   # x (innermost) first
    return xp.stack(comps + [xp.ones(tuple(sizes), dtype=dtype)], axis=-1)


@op("AffineGridGeneratorBackward0", outputs=1, saved="size:sizes align_corners:bool", cost=cost.reduction(2))
def affine_grid(node, grads, ctx):
    """affine_grid(theta, size): grid = base @ theta^T, so d theta = g^T base (summed over the grid points)."""
    sv = ctx.saved(node)
    size = [int(s) for s in sv["size"]]
    xp = ctx.xp(node)
    g = grads[0]                                           # (N, *sizes, k)
    base = _base_grid(xp, size[2:], bool(sv["align_corners"]), g.dtype)
    k = len(size) - 2
    n = size[0]
    dtheta = xp.einsum("npk,pj->nkj", g.reshape(n, -1, k), base.reshape(-1, k + 1))
    return each(node, lambda i: dtheta)


@op("StandardGammaBackward0", outputs=1, saved="self:tensor? result:tensor? grad_factor:tensor", elementwise=True,
    cost=cost.pointwise(1))
def standard_gamma(node, grads, ctx):
    """_standard_gamma(alpha) (Gamma.rsample): g * d sample / d alpha (PyTorch's _standard_gamma_grad, recorded)."""
    f = ctx.saved(node)["grad_factor"]
    return each(node, lambda i: grads[0] * f)

