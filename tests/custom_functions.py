"""Custom autograd.Functions importable by name, for the tests that capture them as python nodes."""

import torch


class GradReverse(torch.autograd.Function):
    """The gradient-reversal layer of domain-adversarial training: identity forward, -alpha * g backward."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class ScaledSquare(torch.autograd.Function):
    """x**2 * scale with the input saved, a tensor on ctx and a tuple attribute: d = 2 x scale g."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        ctx.shape = tuple(x.shape)
        ctx.mask = (x > 0).to(x.dtype)
        return x * x * scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert ctx.shape == tuple(x.shape)
        return 2 * x * ctx.scale * g * (1 + 0 * ctx.mask), None


class TwoOut(torch.autograd.Function):
    """Two outputs, one of them unused downstream (its gradient arrives undefined: materialised as zeros)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b, a + b

    @staticmethod
    def backward(ctx, g1, g2):
        a, b = ctx.saved_tensors
        return g1 * b + g2, g1 * a + g2


def signed_sqrt(g):
    """A gradient hook no data kind describes (importable by name: held as a python hook)."""
    return g.sign() * g.abs().sqrt()


@torch.library.custom_op("autograd_run_tests::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, s: float) -> torch.Tensor:
    """A torch.library custom op with a registered backward (its autograd class is generated, not importable)."""
    return torch.tanh(x) * s


def _scaled_tanh_setup(ctx, inputs, output):
    _, s = inputs
    ctx.save_for_backward(output)
    ctx.s = s


def _scaled_tanh_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * (ctx.s - y * y / ctx.s), None


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_scaled_tanh_setup)


class SortKeepIndices(torch.autograd.Function):
    """Sorted values and their indices, the indices marked non-differentiable (an int64 output: PyTorch keeps its
    gradient slot as an undefined input)."""

    @staticmethod
    def forward(ctx, x):
        v, i = torch.sort(x, dim=-1)
        ctx.save_for_backward(i)
        ctx.mark_non_differentiable(i)
        return v, i

    @staticmethod
    def backward(ctx, gv, gi):
        (i,) = ctx.saved_tensors
        return torch.zeros_like(gv).scatter(-1, i, gv)


class ScaleByConfig(torch.autograd.Function):
    """As transformers' YosoCumulation: a plain dict kept on ctx (``ctx.config``), read by the backward."""

    @staticmethod
    def forward(ctx, x, config):
        ctx.config = config
        return x * config["k"] + (1.0 if config["shift"] else 0.0)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.config["k"] * len(ctx.config["name"]) * len(ctx.config["dims"]), None
