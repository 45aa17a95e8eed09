"""Rules that mask a gradient (zero where the input is outside a range) give PyTorch's zeros there even when
the incoming gradient is NaN or infinite: PyTorch selects (``where``), it does not multiply by a 0/1 mask
(``nan * 0`` is NaN). A NaN that PyTorch drops must not flow on here, or anomaly mode and ``--check-nan``
would blame another node than PyTorch does. Where PyTorch does multiply (dropout, nan_to_num, amax, ...) the
NaN must flow on here too: each case is compared with PyTorch, whichever it does.

Each case's output is weighted by NaN, inf, -inf and 2.0 in turn, so every kind of incoming gradient meets
inputs inside and outside each op's pass-through range; the ``_nonfinite_input`` cases also give the op NaN and
infinite inputs (PyTorch's ``x <= t ? 0 : g`` passes the gradient at a NaN input).
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import check  # noqa: E402

pytestmark = pytest.mark.torch

D = torch.float64
NAN, INF = float("nan"), float("inf")
NONFINITE = [NAN, INF, -INF, 2.0]
VALS = [-5.0, -3.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0, 6.0, 7.0, 20.0]


def _x(*shape, vals=VALS):
    """Each value repeated once per kind of incoming gradient (48 values), as a leaf of ``shape``."""
    xs = [v for v in vals for _ in NONFINITE]
    return torch.tensor(xs, dtype=D).reshape(shape or (-1,)).requires_grad_(True)


def _x_nonfinite(*shape):
    """As ``_x`` with NaN, inf and -inf among the values (60 values)."""
    return _x(*shape, vals=[NAN, INF, -INF] + VALS)


def _zeros_rows():
    """8 rows of 6: some all zero (norms at zero), some with ties and zeros in them."""
    rows = [[0.0] * 6, [1.0, -2.0, 0.0, 2.0, -2.0, 0.5], [0.0] * 6, [3.0, 3.0, -1.0, 0.0, 0.0, 1.0],
            [-4.0, 0.25, 0.25, 4.0, -4.0, 0.0], [0.0] * 6, [5.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0] * 6]
    return torch.tensor(rows, dtype=D).requires_grad_(True)


def _leaf(values, shape=None):
    t = torch.tensor(values, dtype=D)
    return (t.reshape(shape) if shape else t).requires_grad_(True)


def _w(shape):
    n = 1
    for s in shape:
        n *= s
    return torch.tensor([NONFINITE[k % len(NONFINITE)] for k in range(n)], dtype=D).reshape(shape)


def _double(f):
    """The first derivative of ``f`` with a gradient that depends on x, built with create_graph: its backward
    runs ``f``'s double-backward node, whose gradient to grad_output is masked as the first backward was."""
    def g(x):
        (d,) = torch.autograd.grad(f(x), x, grad_outputs=x * 0.5 + 1.0, create_graph=True)
        return d
    return g


def _cycle(*vals):
    """A leaf of x's size that repeats ``vals``."""
    return lambda x: _leaf([vals[k % len(vals)] for k in range(x.numel())])


def _double_map(f, out_shape):
    """f's first derivative on x as a (1, 1, 6, 8) image, for a grad_output of ``out_shape`` read from x: the
    backward of f's backward node is f's own map (pool, upsample, pad) applied to the incoming gradient."""
    def g(x):
        img = x.reshape(1, 1, 6, 8)
        n = 1
        for d in out_shape:
            n *= d
        (d,) = torch.autograd.grad(f(img), img, grad_outputs=(x.repeat(2)[:n] * 0.5 + 1.0).reshape(out_shape),
                                   create_graph=True)
        return d
    return g


def _two(f, other):
    """f(x, o) with a second leaf ``o = other(x)`` (its gradient compared too)."""
    def g(x):
        o = other(x)
        return f(x, o), {"o": o}
    return g


def _glu(x):
    return F.glu(x.reshape(8, 6), dim=1)


def _prelu(x):
    w = _leaf([0.25])
    return F.prelu(x, w), {"w": w}


def _max_unpool(x):
    y, idx = F.max_pool2d(x.reshape(1, 1, 6, 8), 2, return_indices=True)
    return F.max_unpool2d(y * 1.0, idx, 2)


def _masked_scatter(x):
    src = _leaf([float(k) for k in range(48)])
    return (x * 1.0).masked_scatter(x > 0.5, src), {"src": src}


def _index_put(x):
    v = _leaf([1.0, 2.0, 3.0, 4.0])
    return (x * 1.0).index_put((torch.tensor([0, 5, 9, 47]),), v), {"v": v}


def _scatter(x):
    src = _leaf([float(k) for k in range(12)], (2, 6))
    return x.reshape(8, 6).scatter(0, torch.tensor([[0, 1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2]]), src), {"src": src}


def _scatter_add(x):
    src = _leaf([float(k) for k in range(12)], (2, 6))
    return x.reshape(8, 6).scatter_add(0, torch.tensor([[0, 1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2]]), src), {"src": src}


def _index_add(x):
    src = _leaf([float(k) for k in range(12)], (2, 6))
    return x.reshape(8, 6).index_add(0, torch.tensor([1, 6]), src), {"src": src}


def _index_copy(x):
    src = _leaf([float(k) for k in range(12)], (2, 6))
    return x.reshape(8, 6).index_copy(0, torch.tensor([1, 6]), src), {"src": src}


def _embedding_bag(x):
    idx = torch.tensor([0, 2, 4, 1, 3, 5, 7, 6])
    return F.embedding_bag(idx, x.reshape(8, 6), torch.tensor([0, 3, 5]), mode="sum", padding_idx=4)


def _embedding_bag_weighted(x):
    idx = torch.tensor([0, 2, 4, 1, 3, 5, 7, 6])
    psw = _leaf([0.5, -1.0, 2.0, 1.5, -0.25, 3.0, 1.0, -2.0])
    return F.embedding_bag(idx, x.reshape(8, 6), torch.tensor([0, 3, 5]), mode="sum", padding_idx=4,
                           per_sample_weights=psw), {"psw": psw}


def _grid_sample(mode, padding):
    def f(x):
        # points inside, on the border and outside the 6 x 8 input, so some taps fall out of bounds
        pts = [[-1.3, -1.0], [-1.0, -1.0], [-0.6, 0.2], [0.0, 0.0], [0.3, -0.9], [0.95, 1.1], [1.0, 1.0],
               [1.4, 0.5], [-0.2, 1.6], [0.7, 0.7], [-0.95, 0.45], [0.1, -1.2]]
        grid = _leaf(pts, (1, 3, 4, 2))
        return F.grid_sample(x.reshape(1, 1, 6, 8), grid, mode=mode, padding_mode=padding,
                             align_corners=False), {"grid": grid}
    return f


def _grid_sample_3d(mode):
    def f(x):
        pts = [[-1.3, -1.0, 0.0], [-1.0, -1.0, -1.0], [-0.6, 0.2, 0.9], [0.0, 0.0, 0.0], [0.3, -0.9, 1.2],
               [0.95, 1.1, -0.4], [1.0, 1.0, 1.0], [1.4, 0.5, 0.2]]
        grid = _leaf(pts, (1, 2, 2, 2, 3))
        return F.grid_sample(x.reshape(1, 1, 3, 4, 4), grid, mode=mode, align_corners=False), {"grid": grid}
    return f


def _loss(f, target, **kw):
    def g(x):
        return f(x.reshape(8, 6), target(), **kw)
    return g


def _nll_double(x):
    """nll_loss's backward built with create_graph, with a grad_output that depends on x: its double backward."""
    lp = x.reshape(8, 6)
    target = torch.tensor([0, 1, 2, 3, 4, 5, 2, 1])
    (d,) = torch.autograd.grad(F.nll_loss(lp, target, ignore_index=2, reduction="none"), lp,
                               grad_outputs=x[:8] * 0.5 + 1.0, create_graph=True)
    return d


def _scatter_reduce(reduce, include_self):
    def f(x):
        src = _leaf([1.0, 0.0, 3.0, 3.0, 0.25, -2.0, 5.0, 0.0, 1.0, 6.0, 3.0, 3.0], (2, 6))
        index = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 6, 2, 3, 4, 2]])
        return x.reshape(8, 6).scatter_reduce(0, index, src, reduce, include_self=include_self), {"src": src}
    return f


def _index_reduce(reduce, include_self):
    def f(x):
        src = _leaf([1.0, 0.0, 3.0, 3.0, 0.25, -2.0, 5.0, 0.0, 1.0, 6.0, 3.0, 3.0], (2, 6))
        return x.reshape(8, 6).index_reduce(0, torch.tensor([3, 5]), src, reduce, include_self=include_self), \
            {"src": src}
    return f


def _masked_fill_tensor(x):
    v = _leaf(1.5)
    return x.masked_fill(x > 0.5, v), {"v": v}


def _index_fill_tensor(x):
    v = _leaf(1.5)
    return x.reshape(8, 6).index_fill(0, torch.tensor([1, 6]), v), {"v": v}


def _scatter_like(kind):
    def f(x):
        m = x.reshape(8, 6)
        if kind == "slice":
            src = _leaf([float(k) for k in range(12)], (2, 6))
            return m.slice_scatter(src, 0, 2, 6, 2), {"src": src}
        if kind == "select":
            src = _leaf([float(k) for k in range(6)])
            return m.select_scatter(src, 0, 5), {"src": src}
        src = _leaf([float(k) for k in range(6)])
        return m.diagonal_scatter(src), {"src": src}
    return f


def _put(x):
    v = _leaf([1.0, 2.0, 3.0])
    return (x * 1.0).put(torch.tensor([0, 7, 30]), v, accumulate=True), {"v": v}


def _index_put_accumulate(x):
    v = _leaf([1.0, 2.0, 3.0, 4.0])
    return (x * 1.0).index_put((torch.tensor([0, 5, 5, 47]),), v, accumulate=True), {"v": v}


def _ctc(x):
    # 6 steps, 2 sequences, 4 classes; the second sequence cannot fit its targets in its 2 steps (infinite loss)
    lp = torch.log_softmax(x.reshape(6, 2, 4), dim=-1)
    return F.ctc_loss(lp, torch.tensor([[1, 2, 1], [1, 2, 3]]), torch.tensor([6, 2]), torch.tensor([3, 3]),
                      reduction="none", zero_infinity=True)


def _fake_quantize(x):
    return torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -20, 20)


def _clamp_tensor(x):
    n = x.numel()
    lo, hi = _leaf([-1.0] * (n - 24) + [2.0] * 24), _leaf([1.0] * (n - 24) + [0.5] * 24)  # min > max at the end
    return x.clamp(lo, hi), {"lo": lo, "hi": hi}


ELEMENTWISE = {
    # activations
    "relu": torch.relu,
    "relu_inplace": lambda x: torch.relu_(x * 1.0),
    "threshold": lambda x: F.threshold(x, 0.5, 2.0),
    "threshold_inplace": lambda x: F.threshold(x * 1.0, 0.5, 2.0, inplace=True),
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "hardtanh_inplace": lambda x: F.hardtanh(x * 1.0, -2.0, 3.0, inplace=True),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "leaky_relu_slope_0": lambda x: F.leaky_relu(x, 0.0),
    "leaky_relu_inplace": lambda x: F.leaky_relu(x * 1.0, 0.1, inplace=True),
    "elu": F.elu,
    "elu_inplace": lambda x: F.elu(x * 1.0, inplace=True),
    "celu": F.celu,
    "celu_inplace": lambda x: F.celu(x * 1.0, inplace=True),
    "selu": F.selu,
    "softplus": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "logsigmoid": F.logsigmoid,
    "rrelu_eval": lambda x: F.rrelu(x, training=False),
    "rrelu_train": lambda x: F.rrelu(x, training=True),
    "prelu": _prelu,
    # clamp
    "clamp": lambda x: x.clamp(-1.0, 1.0),
    "clamp_min": lambda x: x.clamp(min=0.0),
    "clamp_max": lambda x: x.clamp(max=0.0),
    "clamp_tensor": _clamp_tensor,
    "clamp_tensor_min": _two(lambda x, lo: x.clamp(min=lo), _cycle(0.5)),
    "clamp_tensor_max": _two(lambda x, hi: x.clamp(max=hi), _cycle(0.5)),
    "clamp_min_tensor": _two(torch.clamp_min, _cycle(0.5)),
    "clamp_max_tensor": _two(torch.clamp_max, _cycle(0.5)),
    # two-input selections
    "maximum": _two(torch.maximum, _cycle(0.5)),
    "minimum": _two(torch.minimum, _cycle(0.5)),
    "fmax": _two(torch.fmax, _cycle(0.5, NAN)),
    "fmin": _two(torch.fmin, _cycle(0.5, NAN)),
    "where": lambda x: torch.where(x > 0, x, x * 3.0),
    "masked_fill": lambda x: x.masked_fill(x > 0.5, 1.0),
    # signs and zeros
    "abs": torch.abs,
    "sign": lambda x: torch.sign(x) * x,
    "sgn": lambda x: torch.sgn(x) * x,
    "floor": lambda x: torch.floor(x) + x,
    "copysign": _two(torch.copysign, _cycle(-1.0, 1.0)),
    "sinc": torch.sinc,
    "xlogy": _two(torch.xlogy, _cycle(0.0, -1.0, 2.0)),
    "logit_eps": lambda x: torch.logit(x, eps=0.3),
    "pow_2": lambda x: x ** 2,
    "pow_tensor": _two(torch.pow, _cycle(0.0, 2.0, -1.0, 0.5)),
    "pow_base_0": lambda x: torch.pow(0.0, x),
    "pow_base_2": lambda x: torch.pow(2.0, x),
    "nan_to_num": torch.nan_to_num,
    "fake_quantize": _fake_quantize,
}

OTHERS = {
    # PyTorch multiplies by the mask: its NaN flows on
    "dropout": (lambda x: F.dropout(x, 0.5, training=True), _x),
    "nansum": (lambda x: x.nansum(), _x_nonfinite),
    "nansum_dim": (lambda x: x.nansum(dim=1), lambda: _x_nonfinite(10, 6)),
    "amax": (lambda x: x.amax(dim=1), _zeros_rows),
    "amin": (lambda x: x.amin(dim=1), _zeros_rows),
    "aminmax": (lambda x: torch.stack(torch.aminmax(x, dim=1)), _zeros_rows),
    "glu": (_glu, _x),
    "logit": (torch.logit, lambda: _x(vals=[-0.5, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5])),
    # double backward
    "relu_double": (_double(lambda x: torch.relu(x)), _x),
    "threshold_double": (_double(lambda x: F.threshold(x, 0.5, 2.0)), _x),
    "hardtanh_double": (_double(lambda x: F.hardtanh(x, -2.0, 3.0)), _x),
    "hardshrink_double": (_double(F.hardshrink), _x),
    "softshrink_double": (_double(F.softshrink), _x),
    "hardswish_double": (_double(F.hardswish), _x),
    "leaky_relu_double": (_double(lambda x: F.leaky_relu(x, 0.1)), _x),
    "elu_double": (_double(F.elu), _x),
    "softplus_double": (_double(lambda x: F.softplus(x, beta=2.0, threshold=5.0)), _x),
    "softplus_double_at_threshold": (_double(lambda x: F.softplus(x, beta=2.0, threshold=6.0)), _x),
    "elu_inplace_double": (_double(lambda x: F.elu(x * 1.0, inplace=True)), _x),
    "celu_double": (_double(lambda x: F.celu(x, 2.0)), _x),
    "selu_double": (_double(F.selu), _x),
    "logsigmoid_double": (_double(F.logsigmoid), _x),
    "rrelu_double": (_double(lambda x: F.rrelu(x, training=False)), _x),
    "prelu_double": (_double(lambda x: F.prelu(x, torch.tensor([0.25], dtype=D))), _x),
    # reductions
    "max": (lambda x: x.max(), _x),
    "min": (lambda x: x.min(), _x),
    "max_ties": (lambda x: x.max(), _zeros_rows),
    "max_dim": (lambda x: x.max(dim=1).values, _zeros_rows),
    "min_dim": (lambda x: x.min(dim=1).values, _zeros_rows),
    "median": (lambda x: x.median(), _x),
    "median_dim": (lambda x: x.median(dim=1).values, _zeros_rows),
    "nanmedian": (lambda x: x.nanmedian(), _x_nonfinite),
    "kthvalue": (lambda x: x.kthvalue(3, dim=1).values, _zeros_rows),
    "mode": (lambda x: x.mode(dim=1).values, _zeros_rows),
    "sort": (lambda x: x.sort(dim=1).values[:, :2], _zeros_rows),
    "topk": (lambda x: x.topk(2, dim=1).values, _zeros_rows),
    "cummax": (lambda x: x.cummax(dim=1).values, _zeros_rows),
    "cummin": (lambda x: x.cummin(dim=1).values, _zeros_rows),
    "std_zero": (lambda x: x.std(dim=1), _zeros_rows),
    "var": (lambda x: x.var(dim=1), _zeros_rows),
    # N - correction <= 0: PyTorch's inf / NaN factors (a crash here before)
    "var_no_dof": (lambda x: x.var(correction=48), _x),
    "std_no_dof": (lambda x: x.std(correction=50), _x),
    "var_dim_no_dof": (lambda x: x.var(dim=1, correction=6), _zeros_rows),
    "var_dim_negative_dof": (lambda x: x.var(dim=1, correction=7), _zeros_rows),
    "var_mean_no_dof": (lambda x: torch.stack(torch.var_mean(x, correction=48)), _x),
    "prod_zeros": (lambda x: x.prod(dim=1), _zeros_rows),
    "prod_all": (lambda x: x[1].prod(), _zeros_rows),
    "prod_all_one_zero": (lambda x: x[3, 1:4].prod(), _zeros_rows),
    "prod_all_zeros": (lambda x: x[3].prod(), _zeros_rows),
    "logcumsumexp": (lambda x: x.logcumsumexp(dim=1), _zeros_rows),
    "cumsum": (lambda x: x.cumsum(dim=1), _zeros_rows),
    "cumprod_zeros": (lambda x: x.cumprod(dim=1), _zeros_rows),
    "logsumexp": (lambda x: x.logsumexp(dim=1), _zeros_rows),
    "trace": (lambda x: x.trace(), _zeros_rows),
    # norms at zero
    "norm_2": (lambda x: torch.linalg.vector_norm(x, dim=1), _zeros_rows),
    "norm_1": (lambda x: torch.linalg.vector_norm(x, 1, dim=1), _zeros_rows),
    "norm_inf": (lambda x: torch.linalg.vector_norm(x, INF, dim=1), _zeros_rows),
    "norm_3": (lambda x: torch.linalg.vector_norm(x, 3, dim=1), _zeros_rows),
    "norm_half": (lambda x: torch.linalg.vector_norm(x, 0.5, dim=1), _zeros_rows),
    "norm_legacy": (lambda x: x.norm(dim=1), _zeros_rows),
    "norm_1_nonfinite_input": (lambda x: torch.linalg.vector_norm(x, 1, dim=0), lambda: _x_nonfinite(10, 6)),
    "norm_2_nonfinite_input": (lambda x: torch.linalg.vector_norm(x, dim=0), lambda: _x_nonfinite(10, 6)),
    "norm_inf_nonfinite_input": (lambda x: torch.linalg.vector_norm(x, INF, dim=0), lambda: _x_nonfinite(10, 6)),
    "norm_1_5_nonfinite_input": (lambda x: torch.linalg.vector_norm(x, 1.5, dim=0), lambda: _x_nonfinite(10, 6)),
    "dist": (lambda x: torch.dist(x[0], x[2]), _zeros_rows),
    "cdist": (lambda x: torch.cdist(x[:4], x[4:]), _zeros_rows),
    "pdist": (lambda x: F.pdist(x), _zeros_rows),
    # index family
    "index": (lambda x: x[torch.tensor([0, 5, 5, 40])], _x),
    "index_mask": (lambda x: x[x > 0.5], _x),
    "index_put": (_index_put, _x),
    "gather": (lambda x: x.reshape(8, 6).gather(1, torch.tensor([[0, 2]] * 8)), _x),
    "scatter": (_scatter, _x),
    "scatter_add": (_scatter_add, _x),
    "index_select": (lambda x: x.reshape(8, 6).index_select(0, torch.tensor([1, 1, 6])), _x),
    "index_add": (_index_add, _x),
    "index_copy": (_index_copy, _x),
    **{f"scatter_reduce_{r}_{inc}": (_scatter_reduce(r, inc), _x)
       for r in ("sum", "mean", "amax", "amin", "prod") for inc in (True, False)},
    **{f"index_reduce_{r}_{inc}": (_index_reduce(r, inc), _x)
       for r in ("mean", "amax", "amin", "prod") for inc in (True, False)},
    "masked_fill_tensor": (_masked_fill_tensor, _x),
    "index_fill_tensor": (_index_fill_tensor, _x),
    "slice_scatter": (_scatter_like("slice"), _x),
    "select_scatter": (_scatter_like("select"), _x),
    "diagonal_scatter": (_scatter_like("diagonal"), _x),
    "put_accumulate": (_put, _x),
    "index_put_accumulate": (_index_put_accumulate, _x),
    "fold": (lambda x: F.fold(x.reshape(1, 4, 12), (4, 5), 2), _x),
    "normalize": (lambda x: F.normalize(x, dim=1), _zeros_rows),
    "cosine_similarity": (lambda x: F.cosine_similarity(x[:4], x[4:], dim=1), _zeros_rows),
    "ctc_zero_infinity": (_ctc, _x),
    "index_fill": (lambda x: x.reshape(8, 6).index_fill(0, torch.tensor([1, 6]), 3.0), _x),
    "masked_scatter": (_masked_scatter, _x),
    "masked_select": (lambda x: x.masked_select(x > 0.5), _x),
    "take": (lambda x: x.take(torch.tensor([0, 7, 7, 30])), _x),
    "select": (lambda x: x.reshape(8, 6)[3], _x),
    "slice": (lambda x: x.reshape(8, 6)[1:5:2], _x),
    "diagonal": (lambda x: x.reshape(8, 6).diagonal(), _x),
    "tril": (lambda x: x.reshape(8, 6).tril(), _x),
    "embedding": (lambda x: F.embedding(torch.tensor([0, 3, 3, 7]), x.reshape(8, 6)), _x),
    "embedding_padding": (lambda x: F.embedding(torch.tensor([0, 3, 3, 7]), x.reshape(8, 6), padding_idx=3), _x),
    "embedding_bag_padding": (_embedding_bag, _x),
    "embedding_bag_weighted": (_embedding_bag_weighted, _x),
    "pad": (lambda x: F.pad(x.reshape(8, 6), (1, 1)), _x),
    # pools
    "max_pool1d": (lambda x: F.max_pool1d(x.reshape(1, 1, 48), 3), _x),
    "max_pool2d": (lambda x: F.max_pool2d(x.reshape(1, 1, 6, 8), 2), _x),
    "max_pool2d_overlap": (lambda x: F.max_pool2d(x.reshape(1, 1, 6, 8), 3, stride=1), _x),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x.reshape(1, 1, 6, 8), (2, 3)), _x),
    "avg_pool2d": (lambda x: F.avg_pool2d(x.reshape(1, 1, 6, 8), 2), _x),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x.reshape(1, 1, 6, 8), (2, 3)), _x),
    "max_unpool2d": (_max_unpool, _x),
    "upsample_nearest": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(3, 4), mode="nearest"), _x),
    "upsample_bilinear": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(4, 5), mode="bilinear"), _x),
    "upsample_bilinear_up": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(9, 8), mode="bilinear"), _x),
    "upsample_bilinear_corners": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(11, 15), mode="bilinear",
                                                          align_corners=True), _x),
    "upsample_bicubic": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(11, 5), mode="bicubic"), _x),
    "upsample_bicubic_same": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(6, 8), mode="bicubic"), _x),
    "upsample_bicubic_same_h": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(6, 5), mode="bicubic"), _x),
    "upsample_bilinear_aa": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(4, 3), mode="bilinear",
                                                     antialias=True), _x),
    "upsample_nearest_exact": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(4, 5), mode="nearest-exact"),
                               _x),
    "upsample_linear_1d": (lambda x: F.interpolate(x.reshape(1, 2, 24), size=17, mode="linear"), _x),
    "avg_pool2d_double": (_double_map(lambda x: F.avg_pool2d(x, 2), (1, 1, 3, 4)), _x),
    "avg_pool3d": (lambda x: F.avg_pool3d(x.reshape(1, 1, 3, 4, 4), 2, stride=1), _x),
    "adaptive_avg_pool2d_double": (_double_map(lambda x: F.adaptive_avg_pool2d(x, (4, 3)), (1, 1, 4, 3)), _x),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x.reshape(1, 1, 3, 4, 4), (2, 3, 3)), _x),
    "max_pool2d_double": (_double_map(lambda x: F.max_pool2d(x, 2), (1, 1, 3, 4)), _x),
    "upsample_nearest_double": (_double_map(lambda x: F.interpolate(x, size=(4, 5)), (1, 1, 4, 5)), _x),
    "upsample_bilinear_double": (_double_map(lambda x: F.interpolate(x, size=(4, 5), mode="bilinear"),
                                             (1, 1, 4, 5)), _x),
    "upsample_bicubic_double": (_double_map(lambda x: F.interpolate(x, size=(4, 9), mode="bicubic"),
                                            (1, 1, 4, 9)), _x),
    "reflection_pad_double": (_double_map(lambda x: F.pad(x, (1, 1, 1, 0), mode="reflect"), (1, 1, 7, 10)), _x),
    "upsample_trilinear": (lambda x: F.interpolate(x.reshape(1, 1, 3, 4, 4), size=(2, 5, 3), mode="trilinear"),
                           _x),
    "upsample_nearest_1d": (lambda x: F.interpolate(x.reshape(1, 2, 24), size=17), _x),
    "upsample_bicubic_aa": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(4, 3), mode="bicubic",
                                                    antialias=True), _x),
    "upsample_bilinear_aa_up": (lambda x: F.interpolate(x.reshape(1, 1, 6, 8), size=(9, 8), mode="bilinear",
                                                        antialias=True), _x),
    "reflection_pad": (lambda x: F.pad(x.reshape(1, 1, 6, 8), (2, 3, 1, 2), mode="reflect"), _x),
    "replication_pad": (lambda x: F.pad(x.reshape(1, 1, 6, 8), (2, 3, 1, 2), mode="replicate"), _x),
    "avg_pool2d_pad": (lambda x: F.avg_pool2d(x.reshape(1, 1, 6, 8), 3, stride=2, padding=1, ceil_mode=True,
                                              count_include_pad=False), _x),
    "avg_pool2d_divisor": (lambda x: F.avg_pool2d(x.reshape(1, 1, 6, 8), 2, divisor_override=3), _x),
    "conv2d": (lambda x: F.conv2d(x.reshape(1, 1, 6, 8), torch.ones(2, 1, 3, 3, dtype=D), stride=2, padding=1), _x),
    "conv1d_dilated": (lambda x: F.conv1d(x.reshape(1, 2, 24), torch.ones(1, 2, 3, dtype=D), dilation=3), _x),
    "conv_transpose2d": (lambda x: F.conv_transpose2d(x.reshape(1, 1, 6, 8), torch.ones(1, 1, 2, 2, dtype=D),
                                                      stride=2), _x),
    "unfold": (lambda x: F.unfold(x.reshape(1, 1, 6, 8), 3, padding=1, stride=2), _x),
    "grid_sample_bilinear_zeros": (_grid_sample("bilinear", "zeros"), _x),
    "grid_sample_nearest_zeros": (_grid_sample("nearest", "zeros"), _x),
    "grid_sample_bilinear_border": (_grid_sample("bilinear", "border"), _x),
    "grid_sample_bicubic_zeros": (_grid_sample("bicubic", "zeros"), _x),
    "grid_sample_bilinear_reflection": (_grid_sample("bilinear", "reflection"), _x),
    "grid_sample_3d_bilinear": (_grid_sample_3d("bilinear"), _x),
    "grid_sample_3d_nearest": (_grid_sample_3d("nearest"), _x),
    # distances at zero and at ties, for each kind of p (PyTorch selects for some, multiplies for others)
    "cdist_mm": (lambda x: torch.cdist(x.reshape(48, 1), x.reshape(48, 1)[:3]), _x),
    **{f"cdist_p{p}": (lambda x, p=p: torch.cdist(x[:4], x[4:], p=p), _zeros_rows)
       for p in (0.0, 0.5, 1.0, 1.5, 3.0, INF)},
    **{f"pdist_p{p}": (lambda x, p=p: F.pdist(x, p=p), _zeros_rows) for p in (0.5, 1.0, 1.5, 3.0, INF)},
    # losses
    "nll_ignore_none": (_loss(F.nll_loss, lambda: torch.tensor([0, 1, 2, 3, 4, 5, 2, 1]), ignore_index=2,
                              reduction="none"), _x),
    "nll_ignore_mean": (_loss(F.nll_loss, lambda: torch.tensor([0, 1, 2, 3, 4, 5, 2, 1]), ignore_index=2), _x),
    "nll_ignore_double": (_nll_double, _x),
    "embedding_bag_mean": (lambda x: F.embedding_bag(torch.tensor([0, 2, 4, 1, 3, 5, 7, 6]), x.reshape(8, 6),
                                                     torch.tensor([0, 3, 5]), mode="mean", padding_idx=4), _x),
    "embedding_bag_max": (lambda x: F.embedding_bag(torch.tensor([0, 2, 4, 1, 3, 5, 7, 6]), x.reshape(8, 6),
                                                    torch.tensor([0, 3, 5]), mode="max", padding_idx=4), _x),
    "cross_entropy_ignore": (_loss(F.cross_entropy, lambda: torch.tensor([0, 1, 2, 3, 4, 5, 2, 1]), ignore_index=2,
                                   reduction="none"), _x),
    "multi_margin_p1": (_loss(F.multi_margin_loss, lambda: torch.tensor([0, 1, 2, 3, 4, 5, 2, 1]),
                              reduction="none"), _x),
    "multi_margin_p2": (_loss(F.multi_margin_loss, lambda: torch.tensor([0, 1, 2, 3, 4, 5, 2, 1]), p=2,
                              reduction="none"), _x),
    "multilabel_margin": (_loss(F.multilabel_margin_loss, lambda: torch.tensor([[0, 3, -1, 0, 0, 0]] * 8),
                                reduction="none"), _x),
    "smooth_l1": (_loss(F.smooth_l1_loss, lambda: torch.full((8, 6), 0.5, dtype=D), reduction="none"), _x),
    "huber": (_loss(F.huber_loss, lambda: torch.full((8, 6), 0.5, dtype=D), reduction="none"), _x),
    "l1": (_loss(F.l1_loss, lambda: torch.full((8, 6), 0.5, dtype=D), reduction="none"), _x),
    "smooth_l1_double": (_double(lambda x: F.smooth_l1_loss(x, torch.full((48,), 0.5, dtype=D), reduction="none")),
                         _x),
    "huber_double": (_double(lambda x: F.huber_loss(x, torch.full((48,), 0.5, dtype=D), reduction="none")), _x),
    "bce": (lambda x: F.binary_cross_entropy(torch.sigmoid(x), torch.full((48,), 0.25, dtype=D), reduction="none"),
            _x),
    "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(x, torch.full((48,), 0.25, dtype=D),
                                                               reduction="none"), _x),
    "soft_margin": (lambda x: F.soft_margin_loss(x, torch.tensor([1.0, -1.0] * 24, dtype=D), reduction="none"), _x),
    # attention with a causal mask (hidden positions)
    "sdpa_causal": (lambda x: F.scaled_dot_product_attention(x.reshape(1, 8, 6), x.reshape(1, 8, 6) * 0.5,
                                                             x.reshape(1, 8, 6) * 0.25, is_causal=True), _x),
}

#: PyTorch's own gradient at a NaN input depends on the kernel's path for these: its vectorized loop and its
#: scalar one (tensors of a few elements, the tail of others) disagree (zero, NaN or the gradient), so NaN inputs
#: are left out for them. The rules follow the vectorized loop for hardtanh and the shrinks (as before).
NAN_INPUT_PATH_DEPENDENT = {"hardtanh", "relu6", "hardtanh_inplace", "hardswish", "hardshrink", "softshrink", "elu",
                            "elu_inplace", "celu", "celu_inplace", "selu", "logit_eps"}

CASES = {**{k: (f, _x) for k, f in ELEMENTWISE.items()},
         **{k + "_nonfinite_input": (f, _x_nonfinite) for k, f in ELEMENTWISE.items()
            if k not in NAN_INPUT_PATH_DEPENDENT},
         **OTHERS}


@pytest.mark.parametrize("name", sorted(CASES))
def test_masked_gradients_for_non_finite_incoming_gradients(name, tmp_path):
    f, make_x = CASES[name]
    x = make_x()
    torch.manual_seed(0)
    y = f(x)
    leaves = {"x": x}
    if isinstance(y, tuple):
        y, more = y
        leaves.update(more)
    out = (y * _w(y.shape)).sum()
    check(out, leaves, path=tmp_path / "graph.json")  # non-finite saved values go to an .npz beside it


EXACT = ["relu", "relu_inplace", "threshold", "hardtanh", "relu6", "hardshrink", "clamp", "clamp_min", "clamp_max",
         "where", "masked_fill"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", EXACT)
def test_selections_keep_the_gradients_dtype(name, dtype, tmp_path):
    """The selecting rules in half and single precision: the dtype kept, the kept gradient exact, zeros elsewhere."""
    x = _x().detach().to(dtype).requires_grad_(True)
    y = ELEMENTWISE[name](x)
    out = (y * _w(y.shape).to(dtype)).sum()
    check(out, {"x": x}, path=tmp_path / "graph.json", rtol=0, atol=0)
