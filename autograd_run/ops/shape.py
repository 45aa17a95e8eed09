"""Shapes, views and copies: t, transpose, permute, view/reshape, expand, squeeze/unsqueeze (and their in-place
forms), cat, stack, split (and unsafe_split), unbind, ToCopy (dtype or device conversion), constant padding, repeat,
flip, roll, rot90, channel shuffle, diagonal/diag_embed, tril/triu, unfold, narrow_copy, slice/select/diagonal
scatter, alias, as_strided, and CopySlices (in-place ops on views)."""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import add_at, each, filled, out_meta, signed, sum_to, tensor_list, wrap_dim
from autograd_run.ops.spec import op, per_saved


@op("TBackward0", "TBackward1", "TBackward0_copy", outputs=1, cost=cost.VIEW, views="transpose",
    grad_shapes={0: "reversed"})
def t(node, grads, ctx):
    """a.t() (and in place, t_).

    The gradient leaves with its dims reversed (``grad_shapes``: a matrix's transposed; t() of a 0-d or 1-d
    tensor is the tensor itself), checked against the consumer's input."""
    return each(node, lambda i: grads[0].T)


@op("TransposeBackward0", "TransposeBackward1", "TransposeBackward0_copy", outputs=1,
    saved="dim0:int dim1:int", cost=cost.VIEW, views="transpose")
def transpose(node, grads, ctx):
    """a.transpose(d0, d1) (and in place, transpose_)."""
    d0, d1 = signed(node.saved["dim0"]), signed(node.saved["dim1"])
    g = grads[0]
    if g.ndim == 0:  # a 0-d tensor transposes its dims 0 / -1 with themselves: the gradient as it is
        return each(node, lambda i: g)
    return each(node, lambda i: g.swapaxes(d0, d1))


@op("PermuteBackward0", "PermuteBackward0_copy", outputs=1, saved="dims:ints", cost=cost.VIEW, views="permute")
def permute(node, grads, ctx):
    """a.permute(dims): the inverse permutation."""
    dims = [signed(d) % grads[0].ndim for d in node.saved["dims"]]
    inverse = [0] * len(dims)
    for k, d in enumerate(dims):
        inverse[d] = k
    return each(node, lambda i: grads[0].transpose(inverse))


@op("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "SqueezeBackward0", "SqueezeBackward3",
    "ViewBackward0_copy", "ReshapeAliasBackward0_copy", "SqueezeBackward0_copy", "ReshapeCopyBackward0", outputs=1,
    saved="self_sym_sizes:sizes", cost=cost.VIEW, views="reshape")
def view(node, grads, ctx):
    """view / reshape / squeeze() (and squeeze_()): the gradient reshaped to the input's sizes."""
    sizes = tuple(node.saved["self_sym_sizes"])
    return each(node, lambda i: grads[0].reshape(sizes))


@op("SqueezeBackward1", "SqueezeBackward4", "SqueezeBackward1_copy", outputs=1, saved="self_sym_sizes:sizes dim:int?",
    cost=cost.VIEW, views="view")
def squeeze_dim(node, grads, ctx):
    """squeeze(dim) (and squeeze_(dim))."""
    return view(node, grads, ctx)


@op("SqueezeBackward2", "SqueezeBackward5", "SqueezeBackward2_copy", outputs=1, saved="self_sym_sizes:sizes dim:ints?",
    cost=cost.VIEW, views="view")
def squeeze_dims(node, grads, ctx):
    """squeeze(dims) (and squeeze_(dims))."""
    return view(node, grads, ctx)


@op("UnsqueezeBackward0", "UnsqueezeBackward1", "UnsqueezeBackward0_copy", outputs=1, saved="dim:int", cost=cost.VIEW, views="view")
def unsqueeze(node, grads, ctx):
    """unsqueeze(dim) (and unsqueeze_): squeeze that dim back out."""
    g = grads[0]
    dim = signed(node.saved["dim"]) % g.ndim
    return each(node, lambda i: g.squeeze(dim))


@op("ExpandBackward0", "ExpandBackward0_copy", outputs=1, saved="self_sym_sizes:sizes", cost=cost.reduction())
def expand(node, grads, ctx):
    """expand(sizes): sum the broadcast dimensions back."""
    sizes = tuple(node.saved["self_sym_sizes"])
    return each(node, lambda i: sum_to(ctx.xp(node), grads[0], sizes))


def _split_sizes(node, dim, total):
    """Sizes along ``dim`` of each input of a cat: saved ``sizes``, else the consumers' shapes.

    An input without a gradient edge (a constant) has no consumer to ask: its
    size is what the others leave of ``total`` (the gradient's size along dim).
    That determines one such input, or several that all come after the last
    input with an edge (their sizes are then not needed).
    """
    sizes = node.saved.get("sizes")
    if sizes is not None:
        return list(sizes)
    out = []
    for e in node.next:
        if e is None:
            out.append(None)
            continue
        shape = e.node.inputs[e.input_nr].shape
        # A 1-d empty tensor is skipped by cat whatever its rank.
        out.append(shape[dim] if len(shape) > dim else 0)
    missing = [i for i, s in enumerate(out) if s is None]
    if len(missing) == 1:
        out[missing[0]] = total - sum(s for s in out if s is not None)
    elif missing:
        known = [i for i, s in enumerate(out) if s is not None]
        if known and missing[0] < known[-1]:
            raise RuntimeError(f"{node.name} {node.id!r}: {len(missing)} inputs without a gradient edge come before "
                               f"one with an edge; their sizes along dim {dim} need saved 'sizes'")
        out = [0 if s is None else s for s in out]
    return out


@op("CatBackward0", outputs=per_saved("sizes"), saved="dim:int? sizes:sizes?", cost=cost.COPY, views="part",
    grad_shapes="part")
def cat(node, grads, ctx):
    """cat(tensors, dim): each input gets its slice of the gradient."""
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % max(g.ndim, 1)
    sizes = _split_sizes(node, dim, g.shape[dim] if g.ndim else 1)
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)

    def piece(i):
        e = node.next[i]
        if g.ndim != 1 and e.node.inputs[e.input_nr].shape == (0,):
            # a legacy 1-d empty input, which cat skips whatever its rank: its gradient is empty too (PyTorch's
            # cat_tensors_backward), not a (0, ...) part of the gradient
            return g.reshape(-1)[:0]
        idx = [slice(None)] * g.ndim
        idx[dim] = slice(starts[i], starts[i + 1])
        return g[tuple(idx)]
    return each(node, piece)


@op("StackBackward0", outputs=None, saved="dim:int?", cost=cost.COPY)
def stack(node, grads, ctx):
    """stack(tensors, dim): each input gets its index along dim."""
    g = grads[0]
    dim = signed(node.saved.get("dim", 0)) % g.ndim
    return each(node, lambda i: g.take(i, axis=dim))


@op("SplitBackward0", "UnsafeSplitBackward0", "SplitBackward0_copy", outputs=1,
    saved="dim:int? self_sym_sizes:sizes? split_size:int?",
    cost=cost.COPY)
def split(node, grads, ctx):
    """split / chunk: concatenate the pieces' gradients (zeros for unused pieces)."""
    xp = ctx.xp(node)
    sizes = node.saved.get("self_sym_sizes")
    dim = signed(node.saved.get("dim", 0))
    dim = dim % len(sizes) if sizes else dim
    return each(node, lambda i: xp.concatenate(filled(node, grads, xp), axis=dim))


@op("SplitWithSizesBackward0", "UnsafeSplitWithSizesBackward0", "SplitWithSizesBackward0_copy", outputs=1,
    saved="dim:int? self_sym_sizes:sizes? split_sizes:ints?",
    cost=cost.COPY)
def split_with_sizes(node, grads, ctx):
    """split(sizes)."""
    return split(node, grads, ctx)


@op("UnbindBackward0", "UnbindBackward0_copy", outputs=1, saved="dim:int?", cost=cost.COPY)
def unbind(node, grads, ctx):
    """unbind(dim): stack the slices' gradients (zeros for unused slices)."""
    xp = ctx.xp(node)
    pieces = filled(node, grads, xp)
    dim = signed(node.saved.get("dim", 0)) % (pieces[0].ndim + 1)
    return each(node, lambda i: xp.stack(pieces, axis=dim))


@op("ToCopyBackward0", outputs=1, cost=cost.COPY, views="same", elementwise=True)
def to_copy(node, grads, ctx):
    """a.to(dtype or device): the gradient goes back to the input's dtype and device."""
    def convert(i):
        meta = out_meta(node, i)
        return ctx.transfer(grads[0], node.device, meta.device).astype(meta.dtype, copy=False)
    return each(node, convert)


# --- padding, tiling, reordering ----------------------------------------------------------------------------------


def _crop_or_pad(xp, g, pads):
    """The gradient of ``constant_pad_nd(x, pads)``: ``g`` cropped by the pads (zeros where a pad was negative).

    ``pads`` is PyTorch's list: (left, right) for the last dim, then the one before, ...
    """
    shape = list(g.shape)
    src, dst = [slice(None)] * g.ndim, [slice(None)] * g.ndim
    for k in range(len(pads) // 2):
        d = g.ndim - 1 - k
        left, right = signed(pads[2 * k]), signed(pads[2 * k + 1])
        n_out = g.shape[d]
        n_in = n_out - left - right
        lo, hi = max(0, -left), min(n_in, n_out - left)
        shape[d] = n_in
        src[d], dst[d] = slice(lo + left, max(lo, hi) + left), slice(lo, max(lo, hi))
    out = xp.zeros(shape, dtype=g.dtype)
    out[tuple(dst)] = g[tuple(src)]
    return out


@op("ConstantPadNdBackward0", outputs=1, saved="pad:ints", cost=cost.COPY)
def constant_pad_nd(node, grads, ctx):
    """F.pad(x, pad, value=c): the gradient with the padding cut off (zeros where the pad cropped)."""
    pads = list(node.saved["pad"])
    return each(node, lambda i: _crop_or_pad(ctx.xp(node), grads[0], pads))


@op("RepeatBackward0", outputs=1, saved="repeats:ints self_sym_sizes:sizes", cost=cost.reduction(1))
def repeat(node, grads, ctx):
    """a.repeat(repeats): sum the tiles back onto one."""
    g = grads[0]
    repeats = [int(r) for r in node.saved["repeats"]]
    sizes = tuple(node.saved["self_sym_sizes"])
    padded = (1,) * (len(repeats) - len(sizes)) + sizes
    split = []
    for r, s in zip(repeats, padded):
        split += [r, s]

    def out(i):
        t = g.reshape(split).sum(axis=tuple(range(0, 2 * len(repeats), 2)))
        return t.reshape(sizes)
    return each(node, out)


@op("FlipBackward0", outputs=1, saved="dims:ints", cost=cost.COPY)
def flip(node, grads, ctx):
    """a.flip(dims): flip the gradient back."""
    g = grads[0]
    dims = tuple(wrap_dim(d, g.ndim) for d in node.saved["dims"]) if g.ndim else ()  # a 0-dim flip: itself
    return each(node, lambda i: ctx.xp(node).flip(g, axis=dims) if dims else g)


@op("RollBackward0", outputs=1, saved="shifts:ints dims:ints", cost=cost.COPY)
def roll(node, grads, ctx):
    """a.roll(shifts, dims): roll the gradient the other way (flattened when no dims)."""
    g = grads[0]
    xp = ctx.xp(node)
    shifts = [-signed(s) for s in node.saved["shifts"]]
    dims = [wrap_dim(d, g.ndim) for d in node.saved.get("dims") or ()]

    def out(i):
        if not dims:
            return xp.roll(g.reshape(-1), shifts[0]).reshape(g.shape)
        return xp.roll(g, tuple(shifts), axis=tuple(dims))
    return each(node, out)


@op("Rot90Backward0", outputs=1, saved="k:int dims:ints", cost=cost.COPY)
def rot90(node, grads, ctx):
    """a.rot90(k, dims): rotate the gradient back by -k."""
    g = grads[0]
    k = signed(node.saved["k"])
    dims = tuple(wrap_dim(d, g.ndim) for d in node.saved["dims"])
    return each(node, lambda i: ctx.xp(node).rot90(g, -k, axes=dims))


@op("ChannelShuffleBackward0", outputs=1, saved="groups:int", cost=cost.COPY)
def channel_shuffle(node, grads, ctx):
    """F.channel_shuffle(x, groups): shuffle the gradient's channels back (C/groups groups)."""
    g = grads[0]
    groups = int(node.saved["groups"])
    n, c, *rest = g.shape

    def out(i):
        t = g.reshape(n, c // groups, groups, *rest).swapaxes(1, 2)
        return t.reshape(g.shape)
    return each(node, out)


# --- diagonals and triangles ---------------------------------------------------------------------------------------


def _diagonal_index(sizes, offset, d1, d2, xp):
    """Row and column indices of the ``offset`` diagonal of the (d1, d2) plane of an array of ``sizes``."""
    n1, n2 = sizes[d1], sizes[d2]
    if offset >= 0:
        n = max(0, min(n1, n2 - offset))
        rows = xp.arange(n)
        return rows, rows + offset
    n = max(0, min(n1 + offset, n2))
    cols = xp.arange(n)
    return cols - offset, cols


def _embed_diagonal(xp, g, sizes, offset, d1, d2):
    """Zeros of ``sizes`` with ``g`` (diagonal last) written on the ``offset`` diagonal of (d1, d2)."""
    out = xp.zeros(tuple(sizes), dtype=g.dtype)
    rows, cols = _diagonal_index(sizes, offset, d1, d2, xp)
    xp.moveaxis(out, (d1, d2), (-2, -1))[..., rows, cols] = g
    return out


@op("DiagonalBackward0", "DiagonalBackward0_copy", outputs=1, saved="self_sym_sizes:sizes offset:int dim1:int dim2:int",
    cost=cost.COPY)
def diagonal(node, grads, ctx):
    """a.diagonal(offset, d1, d2) (and torch.diag of a matrix): the gradient on that diagonal, zeros elsewhere."""
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    d1, d2 = wrap_dim(sv["dim1"], len(sizes)), wrap_dim(sv["dim2"], len(sizes))
    offset = signed(sv["offset"])
    return each(node, lambda i: _embed_diagonal(ctx.xp(node), grads[0], sizes, offset, d1, d2))


@op("DiagEmbedBackward0", outputs=1, saved="offset:int dim1:int dim2:int", cost=cost.COPY)
def diag_embed(node, grads, ctx):
    """torch.diag_embed(a, offset, d1, d2) (and torch.diag of a vector): the gradient's diagonal."""
    g = grads[0]
    sv = node.saved
    d1, d2 = wrap_dim(sv["dim1"], g.ndim), wrap_dim(sv["dim2"], g.ndim)
    return each(node, lambda i: ctx.xp(node).diagonal(g, signed(sv["offset"]), d1, d2))


@op("TrilBackward0", outputs=1, saved="diagonal:int", cost=cost.COPY)
def tril(node, grads, ctx):
    """a.tril(k): the gradient's lower triangle."""
    return each(node, lambda i: ctx.xp(node).tril(grads[0], signed(node.saved["diagonal"])))


@op("TriuBackward0", outputs=1, saved="diagonal:int", cost=cost.COPY)
def triu(node, grads, ctx):
    """a.triu(k): the gradient's upper triangle."""
    return each(node, lambda i: ctx.xp(node).triu(grads[0], signed(node.saved["diagonal"])))


# --- windows, narrowing, scatters into slices -----------------------------------------------------------------------


@op("UnfoldBackward0", "UnfoldBackward0_copy", outputs=1, saved="self_sym_sizes:sizes dimension:int size:int step:int",
    cost=cost.reduction(1))
def unfold(node, grads, ctx):
    """a.unfold(dim, size, step): each window's gradient added back where the window was read."""
    g = grads[0]
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    d = wrap_dim(sv["dimension"], len(sizes))
    size, step = int(sv["size"]), int(sv["step"])
    xp = ctx.xp(node)

    def out(i):
        z = xp.zeros(sizes, dtype=g.dtype)
        if not sizes:  # a 0-dim tensor unfolds into one window of one element
            return g.reshape(())
        n = g.shape[d]
        for k in range(size):
            idx = [slice(None)] * len(sizes)
            idx[d] = slice(k, k + step * (n - 1) + 1, step)
            z[tuple(idx)] += g[..., k]
        return z
    return each(node, out)


def _slice_index(ndim, dim, start, end, step):
    idx = [slice(None)] * ndim
    idx[dim] = slice(None if start is None else signed(start), None if end is None else signed(end),
                     1 if step is None else signed(step))
    return tuple(idx)


@op("NarrowCopyBackward0", outputs=1, saved="self_sym_sizes:sizes dim:int start:int length:int", cost=cost.COPY)
def narrow_copy(node, grads, ctx):
    """a.narrow_copy(dim, start, length): the gradient placed in that range, zeros elsewhere."""
    sv = node.saved
    sizes = tuple(sv["self_sym_sizes"])
    dim = wrap_dim(sv["dim"], len(sizes))
    start = signed(sv["start"]) % max(sizes[dim], 1) if signed(sv["start"]) < 0 else signed(sv["start"])

    def out(i):
        z = ctx.xp(node).zeros(sizes, dtype=grads[0].dtype)
        z[_slice_index(len(sizes), dim, start, start + int(sv["length"]), 1)] = grads[0]
        return z
    return each(node, out)


@op("SliceScatterBackward0", outputs=2, saved="dim:int start:int? end:int? step:int?", cost=cost.COPY)
def slice_scatter(node, grads, ctx):
    """torch.slice_scatter(a, src, dim, start, end, step): a gets the gradient outside the slice, src the slice."""
    g = grads[0]
    sv = node.saved
    idx = _slice_index(g.ndim, wrap_dim(sv["dim"], g.ndim), sv.get("start"), sv.get("end"), sv.get("step"))

    def out(i):
        if i == 1:
            return g[idx]
        r = g.copy()
        r[idx] = 0
        return r
    return each(node, out)


@op("SelectScatterBackward0", outputs=2, saved="dim:int index:int", cost=cost.COPY)
def select_scatter(node, grads, ctx):
    """torch.select_scatter(a, src, dim, index): a gets the gradient outside that index, src the index's slice."""
    g = grads[0]
    idx = [slice(None)] * g.ndim
    idx[wrap_dim(node.saved["dim"], g.ndim)] = signed(node.saved["index"])
    idx = tuple(idx)

    def out(i):
        if i == 1:
            return g[idx]
        r = g.copy()
        r[idx] = 0
        return r
    return each(node, out)


@op("DiagonalScatterBackward0", outputs=2, saved="offset:int dim1:int dim2:int", cost=cost.COPY)
def diagonal_scatter(node, grads, ctx):
    """torch.diagonal_scatter(a, src, offset, d1, d2): a gets the gradient off that diagonal, src the diagonal."""
    g = grads[0]
    sv = node.saved
    xp = ctx.xp(node)
    offset = signed(sv["offset"])
    d1, d2 = wrap_dim(sv["dim1"], g.ndim), wrap_dim(sv["dim2"], g.ndim)

    def out(i):
        if i == 1:
            return xp.diagonal(g, offset, d1, d2)
        r = g.copy()
        rows, cols = _diagonal_index(g.shape, offset, d1, d2, xp)
        xp.moveaxis(r, (d1, d2), (-2, -1))[..., rows, cols] = 0
        return r
    return each(node, out)


# --- aliases --------------------------------------------------------------------------------------


@op("AliasBackward0", "AliasBackward0_copy", "LiftBackward0", "LiftFreshBackward0", "LiftFreshBackward0_copy",
    "LazyCloneBackward0", "PinMemoryBackward0", outputs=1, cost=cost.VIEW, views="same")
def alias(node, grads, ctx):
    """An alias or a plain copy of a (alias, lift_fresh, _lazy_clone, pin_memory): the gradient as is."""
    return each(node, lambda i: grads[0])


# --- as_strided and in-place writes into views --------------------------------------------------------------------


def _storage_index(xp, sizes, strides, offset):
    """The storage position of every element of an (sizes, strides, offset) view, as an array of ``sizes``."""
    idx = xp.full(tuple(sizes), int(offset), dtype=xp.int64)
    for d, (n, st) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = n
        idx = idx + (xp.arange(n, dtype=xp.int64) * int(st)).reshape(shape)
    return idx


def _contiguous_strides(sizes):
    strides, acc = [], 1
    for n in reversed(sizes):
        strides.append(acc)
        acc *= max(int(n), 1)
    return strides[::-1]


def _extent(sizes, strides, offset):
    """One past the largest storage position an (sizes, strides, offset) view touches (0 when empty)."""
    if any(int(n) == 0 for n in sizes):
        return 0
    return int(offset) + 1 + sum((int(n) - 1) * int(st) for n, st in zip(sizes, strides))


@op("AsStridedBackward0", "AsStridedBackward1", "AsStridedBackward0_copy", outputs=1,
    saved="size:sizes stride:ints storage_offset:int? self_strides:ints? self_storage_offset:int?",
    cost=cost.reduction(1))
def as_strided(node, grads, ctx):
    """a.as_strided(size, stride, offset): each element's gradient added to the storage position it read.

    The input lies in the storage as ``self_strides`` and ``self_storage_offset`` say (capture records them
    for a leaf; PyTorch keeps them on the node without exposing them); without them it is taken as contiguous
    from the start of its storage: true of the fresh or contiguous tensors as_strided is used on, and of the
    bases that PyTorch re-views after an in-place write to a view (capture checks it on other inputs).
    """
    g = grads[0]
    sv = node.saved
    xp = ctx.xp(node)
    size = [int(n) for n in sv["size"]]
    stride = [signed(s) for s in sv["stride"]]
    in_offset = signed(sv.get("self_storage_offset")) or 0
    offset = sv.get("storage_offset")
    offset = in_offset if offset is None else signed(offset)  # none given: the input's own offset, as PyTorch

    def out(i):
        in_sizes = out_meta(node, i).shape
        in_strides = sv.get("self_strides")
        in_strides = _contiguous_strides(in_sizes) if in_strides is None else [signed(s) for s in in_strides]
        n = max(_extent(in_sizes, in_strides, in_offset), _extent(size, stride, offset))
        storage = xp.zeros(n, dtype=g.dtype)
        add_at(xp, storage, _storage_index(xp, size, stride, offset).reshape(-1), g.reshape(-1))
        return storage[_storage_index(xp, in_sizes, in_strides, in_offset)]
    return each(node, out)


@op("torch::autograd::CopySlices", aliases=("CopySlices",), outputs=per_saved("input_scales"),
    saved="base_sizes:sizes base_strides:ints view_sizes:sizes view_strides:ints view_offset:int "
          "result_scale:tensor input_scales:tensors written:ints?",
    cost=cost.pointwise(2))
def copy_slices(node, grads, ctx):
    """An in-place op on a view (x[:, 1] *= 2, x[1:] = y, relu_ on a slice, ...).

    The base gets the gradient with the written region replaced by the wrapped backward's result; the op's
    other inputs get theirs from the region.

    PyTorch saves nothing here: capture records the base's and the view's
    layouts and the wrapped (elementwise) backward as per-element factors,
    measured by calling the node (``autograd_run.capture``). ``written``: the outputs (0 the base, i next edge
    i) whose zero factors are places the wrapped backward does not read (a fill, masked_fill or index_put writes
    there): 0 there, as PyTorch, whatever the gradient holds (a factor of 0 times a NaN would be NaN).
    """
    g = grads[0]
    sv = ctx.saved(node)
    xp = ctx.xp(node)
    written = sv.get("written") or ()

    def scaled(scale, i):
        scale = xp.asarray(scale)
        r = scale * region
        return xp.where(scale == 0, xp.zeros((), dtype=r.dtype), r) if i in written else r
    base = _storage_index(xp, sv["base_sizes"], [signed(s) for s in sv["base_strides"]], 0)
    view = _storage_index(xp, sv["view_sizes"], [signed(s) for s in sv["view_strides"]], signed(sv["view_offset"]))
    size = max(int(base.max()) if base.size else -1, int(view.max()) if view.size else -1) + 1
    storage = xp.zeros(size, dtype=g.dtype)
    storage[base] = g
    region = storage[view]
    scales = tensor_list(sv, "input_scales")

    def out(i):
        if i == 0:
            result = storage.copy()
            result[view] = scaled(sv["result_scale"], 0)
            return result[base]
        return sum_to(xp, scaled(scales[i], i), out_meta(node, i).shape)
    return each(node, out)


# --- writes that do not depend on what was there -------------------------------------------------------------------


@op("FillBackward0", "FillBackward2", "ZeroBackward0", outputs=1, cost=cost.COPY)
@op("FillBackward1", "FillBackward3", outputs=2, cost=cost.COPY)
def fill(node, grads, ctx):
    """a.fill(value) / a.fill_(value) / a.zero_(): a gets zeros; a value tensor gets the gradient summed."""
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        shape = out_meta(node, i).shape
        return xp.zeros(shape, dtype=g.dtype) if i == 0 else g.sum().reshape(shape)
    return each(node, out)


@op("torch::autograd::CopyBackwards", aliases=("CopyBackwards",), outputs=2, cost=cost.COPY)
def copy(node, grads, ctx):
    """a.copy_(src) on a tensor that is not a view: a gets zeros, src the gradient.

    Summed where src was broadcast; its real part for a real src.
    """
    g = grads[0]
    xp = ctx.xp(node)

    def out(i):
        meta = out_meta(node, i)
        if i == 0:
            return xp.zeros(meta.shape, dtype=g.dtype)
        r = g.real if xp.iscomplexobj(g) and not meta.dtype.startswith("complex") else g
        return sum_to(xp, r, meta.shape)
    return each(node, out)


def _block_sizes(node, rows, cols):
    """Each input's (rows, cols) block in a block_diag: from the consumers' shapes; a constant input (no edge) gets
    what the others leave of the output (one such input, or several after the last one with an edge)."""
    blocks = []
    for e in node.next:
        if e is None:
            blocks.append(None)
            continue
        shape = e.node.inputs[e.input_nr].shape
        blocks.append((1, 1) if len(shape) == 0 else (1, shape[0]) if len(shape) == 1 else tuple(shape))
    missing = [i for i, b in enumerate(blocks) if b is None]
    if len(missing) == 1:
        blocks[missing[0]] = (rows - sum(b[0] for b in blocks if b), cols - sum(b[1] for b in blocks if b))
    elif missing:
        known = [i for i, b in enumerate(blocks) if b is not None]
        if known and missing[0] < known[-1]:
            raise RuntimeError(f"{node.name} {node.id!r}: {len(missing)} inputs without a gradient edge come "
                               f"before one with an edge; their block sizes are unknown")
        blocks = [(0, 0) if b is None else b for b in blocks]
    return blocks


@op("BlockDiagBackward0", outputs=None, cost=cost.COPY)
def block_diag(node, grads, ctx):
    """torch.block_diag(*tensors): each input gets its block of the gradient."""
    g = grads[0]
    blocks = _block_sizes(node, g.shape[0], g.shape[1])
    starts = [(0, 0)]
    for r, c in blocks:
        starts.append((starts[-1][0] + r, starts[-1][1] + c))

    def out(i):
        (r0, c0), (r, c) = starts[i], blocks[i]
        return g[r0:r0 + r, c0:c0 + c].reshape(out_meta(node, i).shape)
    return each(node, out)


@op("PackPaddedSequenceBackward0", outputs=1, saved="input_sym_sizes:sizes batch_first:bool result1:tensor",
    cost=cost.COPY)
def pack_padded_sequence(node, grads, ctx):
    """nn.utils.rnn.pack_padded_sequence: each packed row's gradient back at its (time, batch) place.

    Zeros in the padding.
    """
    sv = ctx.saved(node)
    g = grads[0]
    xp = ctx.xp(node)
    sizes = tuple(sv["input_sym_sizes"])
    first = bool(sv.get("batch_first", False))
    batch_sizes = [int(b) for b in xp.asarray(sv["result1"]).reshape(-1).tolist()]

    def out(i):
        z = xp.zeros((sizes[1], sizes[0]) + sizes[2:] if first else sizes, dtype=g.dtype)
        offset = 0
        for t, b in enumerate(batch_sizes):
            z[t, :b] = g[offset:offset + b]
            offset += b
        return z.swapaxes(0, 1) if first else z
    return each(node, out)


# --- double backward of views: the view applied to the gradient -----------------------------------------------------


@op("DiagonalBackwardBackward0", outputs=1, saved="offset:int dim1:int dim2:int", cost=cost.COPY)
def diagonal_backward_backward(node, grads, ctx):
    """The backward of diagonal's backward (create_graph): the gradient's diagonal."""
    return diag_embed(node, grads, ctx)


@op("UnfoldBackwardBackward0", outputs=1, saved="dim:int size:int step:int", cost=cost.COPY)
def unfold_backward_backward(node, grads, ctx):
    """The backward of unfold's backward (create_graph): the gradient unfolded into windows."""
    g = grads[0]
    xp = ctx.xp(node)
    sv = node.saved
    d = wrap_dim(sv["dim"], g.ndim)
    size, step = int(sv["size"]), int(sv["step"])
    n = (g.shape[d] - size) // step + 1 if g.ndim else 1

    def out(i):
        if g.ndim == 0:
            return g.reshape(1)
        windows = []
        for k in range(size):
            idx = [slice(None)] * g.ndim
            idx[d] = slice(k, k + step * (n - 1) + 1, step)
            windows.append(g[tuple(idx)])
        return xp.stack(windows, axis=-1)
    return each(node, out)


@op("AsStridedScatterBackward0", outputs=2, saved="size:sizes stride:ints storage_offset:int?", cost=cost.COPY)
def as_strided_scatter(node, grads, ctx):
    """torch.as_strided_scatter(a, src, size, stride, offset): src gets the gradient read through that view of
    the (contiguous) output's storage. a gets what PyTorch 2.13's as_strided_scatter_backward computes: the
    gradient at the storage positions the view covers and zero elsewhere (it copies the gradient's slice into
    zeros; the reverse of which entries the scatter overwrote, but it is PyTorch's gradient, which a replay
    reproduces)."""
    g = grads[0]
    sv = node.saved
    xp = ctx.xp(node)
    size = [int(n) for n in sv["size"]]
    stride = [signed(s) for s in sv["stride"]]
    offset = signed(sv.get("storage_offset")) or 0
    flat = xp.ascontiguousarray(g).reshape(-1)
    pos = _storage_index(xp, size, stride, offset)

    def out(i):
        if i == 1:
            return flat[pos]
        r = xp.zeros_like(flat)
        r[pos.reshape(-1)] = flat[pos.reshape(-1)]
        return r.reshape(g.shape)
    return each(node, out)
