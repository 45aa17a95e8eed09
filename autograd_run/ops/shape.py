"""Shapes, views and copies: t, transpose, permute, view/reshape, expand, squeeze/unsqueeze,
cat, stack, split, unbind, and ToCopy (dtype or device conversion)."""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import each, filled, out_meta, signed, sum_to
from autograd_run.ops.spec import op


@op("TBackward0", cost=cost.VIEW)
def t(node, grads, ctx):
    """a.t()."""
    return each(node, lambda i: grads[0].T)


@op("TransposeBackward0", saved="dim0:int dim1:int", cost=cost.VIEW)
def transpose(node, grads, ctx):
    """a.transpose(d0, d1)."""
    d0, d1 = signed(node.saved["dim0"]), signed(node.saved["dim1"])
    return each(node, lambda i: grads[0].swapaxes(d0, d1))


@op("PermuteBackward0", saved="dims:ints", cost=cost.VIEW)
def permute(node, grads, ctx):
    """a.permute(dims): the inverse permutation."""
    dims = [signed(d) % grads[0].ndim for d in node.saved["dims"]]
    inverse = [0] * len(dims)
    for k, d in enumerate(dims):
        inverse[d] = k
    return each(node, lambda i: grads[0].transpose(inverse))


@op("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "SqueezeBackward0",
    saved="self_sym_sizes:sizes", cost=cost.VIEW)
def view(node, grads, ctx):
    """view / reshape / squeeze(): the gradient reshaped to the input's sizes."""
    sizes = tuple(node.saved["self_sym_sizes"])
    return each(node, lambda i: grads[0].reshape(sizes))


@op("SqueezeBackward1", saved="self_sym_sizes:sizes dim:int?", cost=cost.VIEW)
def squeeze_dim(node, grads, ctx):
    """squeeze(dim)."""
    return view(node, grads, ctx)


@op("SqueezeBackward2", saved="self_sym_sizes:sizes dim:ints?", cost=cost.VIEW)
def squeeze_dims(node, grads, ctx):
    """squeeze(dims)."""
    return view(node, grads, ctx)


@op("UnsqueezeBackward0", saved="dim:int", cost=cost.VIEW)
def unsqueeze(node, grads, ctx):
    """unsqueeze(dim): squeeze that dim back out."""
    g = grads[0]
    dim = signed(node.saved["dim"]) % g.ndim
    return each(node, lambda i: g.squeeze(dim))


@op("ExpandBackward0", saved="self_sym_sizes:sizes", cost=cost.reduction())
def expand(node, grads, ctx):
    """expand(sizes): sum the broadcast dimensions back."""
    sizes = tuple(node.saved["self_sym_sizes"])
    return each(node, lambda i: sum_to(ctx.xp(node), grads[0], sizes))


def _split_sizes(node, dim):
    """Sizes along ``dim`` of each input of a cat: saved ``sizes``, else the consumers' shapes."""
    sizes = node.saved.get("sizes")
    if sizes is not None:
        return list(sizes)
    out = []
    for e in node.next:
        if e is None:
            raise RuntimeError(f"{node.name} {node.id!r}: an input without a gradient edge needs saved 'sizes'")
        shape = e.node.inputs[e.input_nr].shape
        out.append(shape[dim] if shape else 1)
    return out


@op("CatBackward0", saved="dim:int? sizes:sizes?", cost=cost.COPY)
def cat(node, grads, ctx):
    """cat(tensors, dim): each input gets its slice of the gradient."""
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % max(g.ndim, 1)
    sizes = _split_sizes(node, dim)
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)

    def piece(i):
        idx = [slice(None)] * g.ndim
        idx[dim] = slice(starts[i], starts[i + 1])
        return g[tuple(idx)]
    return each(node, piece)


@op("StackBackward0", saved="dim:int?", cost=cost.COPY)
def stack(node, grads, ctx):
    """stack(tensors, dim): each input gets its index along dim."""
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % g.ndim
    return each(node, lambda i: g.take(i, axis=dim))


@op("SplitBackward0", saved="dim:int? self_sym_sizes:sizes? split_size:int?", cost=cost.COPY)
def split(node, grads, ctx):
    """split / chunk: concatenate the pieces' gradients (zeros for unused pieces)."""
    xp = ctx.xp(node)
    sizes = node.saved.get("self_sym_sizes")
    dim = signed(node.saved.get("dim", 0))
    dim = dim % len(sizes) if sizes else dim
    return each(node, lambda i: xp.concatenate(filled(node, grads, xp), axis=dim))


@op("SplitWithSizesBackward0", saved="dim:int? self_sym_sizes:sizes? split_sizes:ints?", cost=cost.COPY)
def split_with_sizes(node, grads, ctx):
    """split(sizes)."""
    return split(node, grads, ctx)


@op("UnbindBackward0", saved="dim:int?", cost=cost.COPY)
def unbind(node, grads, ctx):
    """unbind(dim): stack the slices' gradients (zeros for unused slices)."""
    xp = ctx.xp(node)
    pieces = filled(node, grads, xp)
    dim = signed(node.saved.get("dim", 0)) % (pieces[0].ndim + 1)
    return each(node, lambda i: xp.stack(pieces, axis=dim))


@op("ToCopyBackward0", cost=cost.COPY)
def to_copy(node, grads, ctx):
    """a.to(dtype or device): the gradient goes back to the input's dtype and device."""
    def convert(i):
        meta = out_meta(node, i)
        return ctx.transfer(grads[0], node.device, meta.device).astype(meta.dtype, copy=False)
    return each(node, convert)
