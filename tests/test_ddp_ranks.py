"""The simulated DDP launch order against real DistributedDataParallel on 2 and 4 local gloo processes.

Each rank profiles its first iteration (the initial buckets) and its third (the rebuilt ones). From each
rank's trace, in launch order: every all-reduce's element count and how many AccumulateGrad nodes had started
when the rank launched it (DDP's hook runs inside the AccumulateGrad node whose gradient completes a bucket;
the final callback runs after all of them). Ours: ``sim.ddp.simulate_ddp`` over the simulated backward of the
captured graph, the position of each collective's ``trigger`` parameter among the simulated AccumulateGrad
nodes. Equal on every rank, for both iterations, with the map of used parameters that DDP all-reduces under
``find_unused_parameters``.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="real DDP is the oracle here")
pytest.importorskip("torch.distributed")
try:
    from tests.support import ddp_oracle
except ImportError:  # tests/ itself is on sys.path, the repository root is not
    from support import ddp_oracle

from autograd_run.ops.cost import ITEMSIZE  # noqa: E402
from autograd_run.parallel.collectives import Link  # noqa: E402
from autograd_run.sim.ddp import simulate_ddp  # noqa: E402
from autograd_run.sim.session import SimOptions, simulate_session  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

CASES = [("mlp", 0.5, 2), ("resnet", 0.05, 2), ("unused", 0.05, 2), ("mixed", 0.05, 2), ("shared", 0.01, 2),
         ("transformer", 0.05, 4)]


def _simulated(name: str, cap: float, iteration: str) -> list[tuple[int, int]]:
    from autograd_run.capture import from_torch
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    model, shape, find_unused = ddp_oracle.build_model(name)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = from_torch(model(x).square().mean(), parameters=model, reference=False)
    g = loads_graph(dumps(doc, "json"), f"{name}.json")
    rep = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    acc = [s[2].variable for s in sorted(rep.sim.slices, key=lambda s: s[4]) if getattr(s[2], "variable", None)]
    r = simulate_ddp(rep, 2, Link(10.0, 1e9, channels=2), cap, find_unused_parameters=find_unused,
                     iteration=iteration)
    return [(b.nbytes // ITEMSIZE[b.dtype], acc.index(b.trigger) + 1 if b.trigger else len(acc))
            for b in r.buckets]


@pytest.mark.parametrize("name,cap,world", CASES, ids=[f"{n}-{c}-{w}ranks" for n, c, w in CASES])
def test_each_rank_launches_the_simulated_all_reduces_in_order(name, cap, world, tmp_path):
    try:
        ranks = ddp_oracle.run_ranks(name, cap, world, str(tmp_path), timeout=240)
    except ddp_oracle.OracleFailed as exc:
        pytest.fail(str(exc))
    assert [r["rank"] for r in ranks] == list(range(world))
    for iteration in ("first", "steady"):
        ours = _simulated(name, cap, iteration)
        for r in ranks:
            measured = [(numel, k) for numel, k in ddp_oracle.launches(r["traces"][iteration])]
            assert measured == ours, (iteration, r["rank"])
