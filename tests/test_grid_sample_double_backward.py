"""grid_sample's double backward (GridSampler2DBackwardBackward0, GridSampler3DBackwardBackward0) against PyTorch:
gradient penalties through a spatial transformer, on the input's gradient, the grid's, or both (so that either
incoming gradient of the node may be undefined), for every interpolation mode (bicubic is 2-d only), padding
mode and alignment, with grid points inside and outside the input, on and off the sampling lattice."""

import itertools

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
F = torch.nn.functional

from rules_torch_cases import D, check, grad_penalty, leaf  # noqa: E402

pytestmark = pytest.mark.torch

#: grid coordinates where the kernels have kinks: the lattice, the edges, and far outside
_SPECIAL = (-1.0, 1.0, 0.0, 0.5, -0.5, 0.25, -0.25, 1.5, -1.5, 3.7, -5.2)


def _grid(*shape, seed, special=False):
    """Grid points partly outside [-1, 1] (so every padding mode matters); with ``special``, most of them at
    ``_SPECIAL`` values (lattice points, borders, reflection folds)."""
    g = torch.Generator().manual_seed(seed)
    grid = (torch.rand(*shape, dtype=D, generator=g) * 2 - 1) * 1.3
    if special:
        vals = torch.tensor(_SPECIAL, dtype=D)
        pick = torch.randint(0, len(vals), shape, generator=g)
        grid = torch.where(torch.rand(*shape, generator=g) < 0.6, vals[pick], grid)
    return grid.requires_grad_(True)


def _weights(shape, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=D, generator=g)


def _case(dims, mode, padding, align, wrt, special=False):
    """A penalty on the gradients ``wrt`` ("both", "input", "grid") of sum(w * grid_sample(x, grid)**2): the
    sampled values' gradient (grad_output) depends on x and grid, so all three of the node's edges carry one."""
    if dims == 2:
        x, grid = leaf(2, 3, 5, 4, seed=1), _grid(2, 3, 4, 2, seed=2, special=special)
    else:
        x, grid = leaf(1, 2, 3, 4, 5, seed=3), _grid(1, 2, 3, 2, 3, seed=4, special=special)

    def f(x, grid):
        y = F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
        return y.pow(2) * _weights(y.shape)

    if wrt == "both":
        out = grad_penalty(f, x, grid)
    elif wrt == "input":              # grad_grid not computed: the node's ggGrid is undefined
        out = grad_penalty(lambda x: f(x, grid), x)
    else:                             # the input's gradient not computed: ggI undefined
        out = grad_penalty(lambda grid: f(x, grid), grid)
    name = f"GridSampler{dims}DBackwardBackward0"
    check(out, {"x": x, "grid": grid}, expect_names=[name])


_COMBOS = [(2, m, p, a) for m, p, a in itertools.product(
    ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [False, True])] + \
    [(3, m, p, a) for m, p, a in itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                                    [False, True])]


@pytest.mark.parametrize("wrt", ["both", "input", "grid"])
@pytest.mark.parametrize("dims, mode, padding, align", _COMBOS)
def test_grid_sample_double_backward(dims, mode, padding, align, wrt):
    _case(dims, mode, padding, align, wrt)


@pytest.mark.parametrize("dims, mode, padding, align", [c for c in _COMBOS if c[1] != "nearest"])
def test_grid_sample_double_backward_kinks(dims, mode, padding, align):
    """Grid points on the lattice, at the borders and the reflection folds: the kernels' one-sided derivatives
    and the padding factors (zero where border clamps) as PyTorch takes them."""
    _case(dims, mode, padding, align, "both", special=True)
