"""DDP's bucket assignment (``parallel.buckets``) against real DistributedDataParallel on gloo, on this machine.

For each model and ``bucket_cap_mb``: DDP is built in a one-process gloo group (a free loopback port), run for
three iterations, and its own logging data read back: the initial bucket sizes, the order its gradients became
ready in, and the rebuilt buckets (sizes and parameter indices). Ours: the initial assignment from the
parameters alone, and the rebuild from the order **our engine** runs the captured graph's AccumulateGrad nodes
in (so the engine's order is checked against DDP's gradient-ready order too). Plus hand-computed cases of the
rule itself.
"""

from __future__ import annotations

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
pytest.importorskip("torch.distributed")
try:
    from tests.support import ddp_oracle
except ImportError:  # tests/ itself is on sys.path, the repository root is not
    from support import ddp_oracle
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

CASES = [(name, cap) for name in ddp_oracle.MODELS for cap in (None, 0.5, 0.05)]


@pytest.fixture(scope="module")
def ddp_facts():
    """DDP's own figures for every case, from one child process with a deadline (see ddp_oracle: in-process
    process groups can hang pytest in C++ teardown)."""
    try:
        return ddp_oracle.ddp_facts(CASES, timeout=240)
    except ddp_oracle.OracleFailed as exc:
        pytest.fail(str(exc))


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
def test_buckets_are_ddps_own(name, cap, ddp_facts):
    model, shape, find_unused = ddp_oracle.build_model(name)
    params = _params(model)
    ours_ready = _our_ready_order(model, shape, params)
    d = ddp_facts[(name, cap)]
    initial, ready, rebuilt, rebuilt_sizes, has_rebuilt = (d["initial"], d["ready"], d["rebuilt"],
                                                            d["rebuilt_sizes"], d["has_rebuilt"])

    ours_initial = B.initial(params, cap, find_unused_parameters=find_unused)
    assert B.sizes(ours_initial, params) == initial
    # Our engine runs the AccumulateGrad nodes in the order DDP saw the gradients become ready (the unused
    # parameters, which no node reaches, DDP marks ready after the rest).
    assert ours_ready == ready[:len(ours_ready)]
    assert B.rebuilds(find_unused) == has_rebuilt
    ours_rebuilt = B.steady(params, ours_ready, cap, find_unused_parameters=find_unused)
    if not has_rebuilt:  # looking for unused parameters every iteration: the initial buckets stay
        assert rebuilt == [] and ours_rebuilt == ours_initial
    else:  # with two dtypes, the last two buckets in libstdc++'s unordered_map order too
        assert ours_rebuilt == rebuilt
        assert B.sizes(ours_rebuilt, params) == rebuilt_sizes
