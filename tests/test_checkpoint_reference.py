"""The reference order capture stores for reentrant checkpoints (torch.utils.checkpoint, use_reentrant=True) is
the order PyTorch executes, nested calls included. The truth is independent of capture's own hooks: the
profiler's ``autograd::engine::evaluate_function`` events of a second, unhooked backward, in start order."""

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
from torch.utils.checkpoint import checkpoint  # noqa: E402

pytestmark = pytest.mark.torch
D = torch.float64


def _executed(loss) -> list[str]:
    prefix = "autograd::engine::evaluate_function: "
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.autograd.set_multithreading_enabled(False):
            loss.backward()
    events = sorted((e for e in prof.events() if e.name.startswith(prefix)), key=lambda e: e.time_range.start)
    return [e.name[len(prefix):] for e in events]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(8, dtype=D), torch.nn.Linear(8, 8, dtype=D)

    def forward(self, x):
        return torch.tanh(self.fc(self.ln(x)))


class _Net(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.inp, self.ln_f = kind, torch.nn.Linear(8, 8, dtype=D), torch.nn.LayerNorm(8, dtype=D)
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(3)])

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            if self.kind == "chain":
                h = checkpoint(b, h, use_reentrant=True)
            elif self.kind == "residual":
                h = h + checkpoint(b, h, use_reentrant=True)
            elif self.kind == "prenorm":
                h = h + checkpoint(lambda y, b=b: b(y) * 0.5, self.ln_f(h), use_reentrant=True)
            elif self.kind == "nested":
                h = h + checkpoint(lambda y, b=b: checkpoint(b, y, use_reentrant=True) + y, h, use_reentrant=True)
            else:  # two inputs, one of them computed outside
                h = checkpoint(lambda y, z, b=b: b(y) * z, h, h.sin(), use_reentrant=True)
        return self.ln_f(h).pow(2).sum()


@pytest.mark.parametrize("kind", ["chain", "residual", "prenorm", "nested", "two_inputs"])
def test_reference_is_pytorchs_executed_order(kind):
    from autograd_run.capture.graph import from_torch
    torch.manual_seed(1)
    m = _Net(kind)
    x = torch.randn(4, 8, dtype=D, requires_grad=True)
    doc = from_torch([m(x)], names={**dict(m.named_parameters()), "x": x}, reference=True)
    stored = [row[0] for row in doc["meta"]["reference"]["order"]]
    assert "CheckpointFunctionBackward" in stored
    assert stored == _executed(m(x))
