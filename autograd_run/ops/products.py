"""Products: baddbmm, addbmm, addmv, addr (a scaled input plus a scaled product) and _trilinear (nn.Bilinear's
three-way contraction)."""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, number, out_meta, sum_to
from autograd_run.ops.spec import op


def _scaled(t, s):
    """``t`` times the conjugate of the saved scalar ``s`` (PyTorch's conjugate Wirtinger convention)."""
    s = number(s)
    if s == 1:
        return t
    return t * (s.conjugate() if isinstance(s, complex) else s)


def _baddbmm_flops(s: cost.Shapes) -> float:
    bias = s.numel(s.outputs[0]) if s.outputs else 0
    return float(bias + cost.MATMUL.flops(cost.Shapes(s.inputs, [None, *s.outputs[1:]])))


@op("BaddbmmBackward0", outputs=3, saved="batch1:tensor? batch2:tensor? alpha:scalar? beta:scalar?",
    cost=cost.CostModel(_baddbmm_flops))
def baddbmm(node, grads, ctx):
    """beta * c + alpha * (a @ b), batched: c gets beta g, a gets alpha g b^H, b gets alpha a^H g."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return sum_to(xp, _scaled(g, beta), out_meta(node, i).shape)
        if i == 1:
            return _scaled(g @ sv["batch2"].swapaxes(-1, -2).conj(), alpha)
        return _scaled(sv["batch1"].swapaxes(-1, -2).conj() @ g, alpha)
    return each(node, out)


@op("AddbmmBackward0", outputs=3,
    saved="batch1:tensor? batch2:tensor? alpha:scalar? beta:scalar? batch1_sym_argsize_0:int? "
                            "batch1_sym_argsize_1:int? batch2_sym_argsize_2:int?",
    cost=cost.CostModel(_baddbmm_flops))
def addbmm(node, grads, ctx):
    """beta * c + alpha * sum_b a_b @ b_b: c gets beta g, each a_b gets alpha g b_b^H, each b_b gets alpha a_b^H g."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return sum_to(xp, _scaled(g, beta), out_meta(node, i).shape)
        if i == 1:
            return _scaled(g[None] @ sv["batch2"].swapaxes(-1, -2).conj(), alpha)
        return _scaled(sv["batch1"].swapaxes(-1, -2).conj() @ g[None], alpha)
    return each(node, out)


def _mv_flops(s: cost.Shapes) -> float:
    """2 flops per element of each produced matrix or vector gradient times the other operand's length."""
    g = s.numel(s.inputs[0]) if s.inputs else 0
    return float(sum(2 * max(s.numel(m), g) for m in s.outputs if m is not None))


@op("AddmvBackward0", outputs=3,
    saved="mat:tensor? vec:tensor? alpha:scalar? beta:scalar?", cost=cost.CostModel(_mv_flops))
def addmv(node, grads, ctx):
    """beta * c + alpha * (m @ v): c gets beta g, m gets alpha g v^H (an outer product), v gets alpha m^H g."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return sum_to(xp, _scaled(g, beta), out_meta(node, i).shape)
        if i == 1:
            return _scaled(xp.outer(g, sv["vec"].conj()), alpha)
        return _scaled(sv["mat"].conj().T @ g, alpha)
    return each(node, out)


@op("AddrBackward0", outputs=3,
    saved="vec1:tensor? vec2:tensor? alpha:scalar? beta:scalar?", cost=cost.CostModel(_mv_flops))
def addr(node, grads, ctx):
    """beta * c + alpha * outer(u, v): c gets beta g, u gets alpha g v^*, v gets alpha g^T u^*."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    alpha, beta = sv.get("alpha", 1), sv.get("beta", 1)

    def out(i):
        if i == 0:
            return sum_to(xp, _scaled(g, beta), out_meta(node, i).shape)
        if i == 1:
            return _scaled(g @ sv["vec2"].conj(), alpha)
        return _scaled(g.T @ sv["vec1"].conj(), alpha)
    return each(node, out)


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _contract(xp, terms, target_dims, target_shape, full):
    """sum over the dims outside ``target_dims`` of the product of ``terms`` ((array, its dims) pairs, each dim
    an index into the broadcast shape ``full``), as an array of ``target_shape`` laid out on ``target_dims``.

    A term's size-1 axis on a dim where ``full`` is larger broadcasts (it is squeezed out of the contraction);
    a target axis of size 1 on such a dim is summed over; a target dim that no term has is a broadcast.
    """
    ops, subs = [], []
    for arr, dims in terms:
        drop = tuple(a for a, d in enumerate(dims) if arr.shape[a] == 1 and full[d] != 1)
        if drop:
            arr = arr.reshape(tuple(n for a, n in enumerate(arr.shape) if a not in drop))
        ops.append(arr)
        subs.append("".join(_LETTERS[d] for a, d in enumerate(dims) if a not in drop))
    present = set("".join(subs))
    kept = [d for d, n in zip(target_dims, target_shape) if _LETTERS[d] in present and n == full[d]]
    res = xp.einsum(",".join(subs) + "->" + "".join(_LETTERS[d] for d in kept), *ops)
    for a, d in enumerate(target_dims):
        if d not in kept:
            res = xp.expand_dims(res, a)
    return xp.broadcast_to(res, tuple(target_shape))


def _trilinear_flops(s: cost.Shapes) -> float:
    """Per produced gradient, a three-way contraction: about 2 multiply-adds per element of the broadcast product."""
    shapes = [m[0] for m in s.saved.values() if m is not None]
    if not shapes:
        return float(2 * s.out_numel)
    rank = max(len(x) for x in shapes)
    full = 1
    for k in range(rank):
        full *= max((x[k - rank + len(x)] if k - rank + len(x) >= 0 else 1) for x in shapes)
    return float(4 * full * sum(1 for m in s.outputs if m is not None))


@op("TrilinearBackward0", outputs=3,
    saved="i1:tensor? i2:tensor? i3:tensor? expand1:ints expand2:ints expand3:ints sumdim:ints",
    cost=cost.CostModel(_trilinear_flops))
def trilinear(node, grads, ctx):
    """torch._trilinear (nn.Bilinear): each input gets the gradient contracted with the other two (conjugated)."""
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    expands = [[int(d) for d in sv[f"expand{k}"]] for k in (1, 2, 3)]
    sumdim = {int(d) for d in sv["sumdim"]}
    shapes = [out_meta(node, i).shape if e is not None else sv[f"i{i + 1}"].shape for i, e in enumerate(node.next)]
    rank = len(shapes[0]) + len(expands[0])
    dims = [[d for d in range(rank) if d not in ex] for ex in expands]
    full = [1] * rank
    for shape, ds in zip(shapes, dims):
        for n, d in zip(shape, ds):
            full[d] = max(full[d], n)
    out_dims = [d for d in range(rank) if d not in sumdim]
    operands = [sv.get(f"i{k}") for k in (1, 2, 3)]

    def out(i):
        terms = [(g, out_dims)] + [(operands[j].conj(), dims[j]) for j in range(3) if j != i]
        return _contract(xp, terms, dims[i], shapes[i], full)
    return each(node, out)


