"""DDP's bucket assignment (``parallel.buckets``) against real DistributedDataParallel on gloo, on this machine.

For each model and ``bucket_cap_mb``: DDP is built in a one-process gloo group (a free loopback port), run for
three iterations, and its own logging data read back: the initial bucket sizes, the order its gradients became
ready in, and the rebuilt buckets (sizes and parameter indices). Ours: the initial assignment from the
parameters alone, and the rebuild from the order **our engine** runs the captured graph's AccumulateGrad nodes
in (so the engine's order is checked against DDP's gradient-ready order too). Plus hand-computed cases of the
rule itself.
"""

from __future__ import annotations

import socket
import warnings

import pytest

from autograd_run.errors import RequestError
from autograd_run.parallel import buckets as B

MB = B.MIB


def test_the_rule_hand_computed():
    """Limits [100, 250]: 60+60 closes the first bucket (120 >= 100), then 100+100+100 the second (300 >= 250),
    the rest is left; a float64 parameter has its own accumulator."""
    ps = [B.Param(i, n) for i, n in enumerate([60, 60, 100, 100, 100, 10])] + [B.Param(6, 500, "float64")]
    assert B.assign(ps, [100, 250], ordered=True) == [[0, 1], [2, 3, 4], [6], [5]]
    assert B.assign(ps, [100, 250], ordered=False) == [[0, 1], [2, 3, 4], [5], [6]]  # by smallest index
    assert B.caps() == [1 * MB, 25 * MB] and B.caps(0.5) == [MB // 2] and B.caps(None, [1, 2]) == [MB, 2 * MB]
    # initial: one bucket unless unused parameters are looked for; reversed for the Reducer
    assert B.initial(ps[:6], 0.0001) == [[0, 1, 2, 3, 4, 5]]
    assert B.initial(ps[:6], 100 / MB, find_unused_parameters=True) == [[5], [4], [3], [2], [0, 1]]
    # the rebuild, in ready order, unready (unused) parameters last in index order
    assert B.rebuilt(ps[:6], [5, 4, 3], 150 / MB) == [[5, 4, 3], [0, 1, 2]]


@pytest.mark.parametrize("bad", [0, -1.0])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(RequestError, match="bucket_cap_mb must be positive"):
        B.initial([B.Param(0, 4)], bad)
    with pytest.raises(RequestError, match="every size must be positive"):
        B.caps(None, [1, bad])


torch = pytest.importorskip("torch", reason="real DDP is the oracle here")
dist = pytest.importorskip("torch.distributed")
nn = torch.nn
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Shared(nn.Module):
    """Two layers sharing one weight (DDP sees it once)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)
        self.b.weight = self.a.weight
        self.out = nn.Linear(64, 8)

    def forward(self, x):
        return self.out(torch.tanh(self.b(torch.relu(self.a(x)))))


class Unused(nn.Module):
    """A head that the loss never reaches (find_unused_parameters=True)."""

    def __init__(self):
        super().__init__()
        self.body, self.unused, self.head = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Mixed(nn.Module):
    """A float64 block between float32 layers."""

    def __init__(self):
        super().__init__()
        self.a, self.mid, self.b = nn.Linear(32, 64), nn.Linear(64, 64).double(), nn.Linear(64, 8)

    def forward(self, x):
        return self.b(self.mid(torch.relu(self.a(x)).double()).float())


def _models():
    torch.manual_seed(0)
    yield "mlp", nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]), (4, 256), False
    conv = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    yield "resnet", conv, (2, 3, 16, 16), False
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors off without a mask
        yield "transformer", nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (2, 6, 64), False
    yield "unused", Unused(), (4, 64), True
    yield "shared", Shared(), (4, 64), False
    yield "mixed", Mixed(), (4, 32), False


CASES = [(name, cap) for name in ("mlp", "resnet", "transformer", "unused", "shared", "mixed")
         for cap in (None, 0.5, 0.05)]


def _ints(text) -> list[int]:
    return [int(v) for v in str(text).replace(",", " ").split()] if text not in (None, "") else []


def _ddp_facts(model, shape, cap, find_unused):
    """DDP's own: initial bucket sizes, the ready order and the rebuilt buckets after three iterations."""
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=__import__("datetime").timedelta(seconds=60))
    try:
        kw = {} if cap is None else {"bucket_cap_mb": cap}
        ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused, **kw)
        initial = _ints(ddp._get_ddp_logging_data()["bucket_sizes"])
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        for _ in range(3):  # the rebuild happens at the second forward; the third logs it
            ddp(x).square().mean().backward()
        d = ddp._get_ddp_logging_data()
        ready = _ints(d.get("prev_iteration_grad_ready_order_indices"))
        rebuilt = [_ints(b) for b in str(d.get("rebuilt_per_bucket_param_indices", "")).split(",") if b.strip()]
        return initial, ready, rebuilt, _ints(d.get("rebuilt_bucket_sizes")), bool(d.get("has_rebuilt_buckets"))
    finally:
        dist.destroy_process_group()


def _params(model) -> list:
    return [B.Param(i, p.numel() * p.element_size(), str(p.dtype).replace("torch.", ""), str(p.device), n)
            for i, (n, p) in enumerate((n, p) for n, p in model.named_parameters() if p.requires_grad)]


def _our_ready_order(model, shape, params) -> list[int]:
    """The order our engine runs the captured graph's AccumulateGrad nodes in, as parameter indices."""
    from autograd_run.capture import from_torch
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.session import RunOptions, run_session
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    names = dict(model.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = from_torch(model(x).square().mean(), names=names, reference=False)
    g = loads_graph(dumps(doc, "json"), "ddp.json")
    rep = run_session(g, RunOptions(record_order=True, multithreading=True))
    index = {p.name: p.index for p in params}
    return [index[g.by_id[r["id"]].variable] for r in rep.order
            if g.by_id.get(r["id"]) is not None and g.by_id[r["id"]].variable in index]


@pytest.mark.parametrize("name,cap", CASES)
def test_buckets_are_ddps_own(name, cap):
    model, shape, find_unused = next((m, s, f) for n, m, s, f in _models() if n == name)
    params = _params(model)
    ours_ready = _our_ready_order(model, shape, params)
    initial, ready, rebuilt, rebuilt_sizes, has_rebuilt = _ddp_facts(model, shape, cap, find_unused)

    ours_initial = B.initial(params, cap, find_unused_parameters=find_unused)
    assert B.sizes(ours_initial, params) == initial
    # Our engine runs the AccumulateGrad nodes in the order DDP saw the gradients become ready (the unused
    # parameters, which no node reaches, DDP marks ready after the rest).
    assert ours_ready == ready[:len(ours_ready)]
    assert B.rebuilds(find_unused) == has_rebuilt
    ours_rebuilt = B.steady(params, ours_ready, cap, find_unused_parameters=find_unused)
    if not has_rebuilt:  # looking for unused parameters every iteration: the initial buckets stay
        assert rebuilt == [] and ours_rebuilt == ours_initial
    elif name == "mixed":  # the last buckets, one per dtype, come in the order of PyTorch's unordered_map
        assert sorted(ours_rebuilt) == sorted(rebuilt)
    else:
        assert ours_rebuilt == rebuilt
        assert B.sizes(ours_rebuilt, params) == rebuilt_sizes
