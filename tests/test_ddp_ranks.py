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


def test_calibrate_gloo_measures_a_link_that_simulate_takes(tmp_path, capsys):
    """`calibrate --gloo 2 -o FILE` on 2 real local gloo processes: a link whose fit is the ring all-reduce's
    (alpha from the intercept, bandwidth from the slope), taken by `simulate --network FILE`."""
    import json
    from builders import run_cli
    from autograd_run.parallel.networks import load_network
    out = tmp_path / "gloo.json"
    code, text, err = run_cli(["calibrate", "--gloo", "2", "-o", str(out)], capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    link = doc["links"]["2"]
    assert link["alpha_us"] >= 0 and link["gbps"] > 0 and link["channels"] in (1, 2)
    assert link["during_compute"] == (0.5 if (len(__import__("os").sched_getaffinity(0)) / 2) < 2 else 1.0)
    # the fit reproduces the ring all-reduce of its own points: t = 2 (p - 1) alpha + 2 (p - 1) / p n / B
    for pt in link["points"]:
        model = 2 * link["alpha_us"] + pt["bytes"] / (link["gbps"] * 1e3)
        assert model == pytest.approx(pt["us"], rel=max(0.05, link["fit_worst"] * 1.01))
    assert "gloo, 2 processes:" in text
    net = load_network(str(out))
    assert net.link_for(2)[0].bandwidth == pytest.approx(link["gbps"] * 1e9)
    code, text, err = run_cli(["simulate", "example:mlp", "--ddp", "defaults", "--world", "3", "--network",
                               str(out), "--json"], capsys)
    assert code == 0, err
    assert "no link measured at 3 ranks; using the one measured at 2" in err
    assert json.loads(text)["ddp"]["link"]["gbps"] == pytest.approx(link["gbps"])
    code, text, err = run_cli(["calibrate", "--gloo", "1"], capsys)
    assert code == 2 and "--gloo: give world sizes from 2 to 16" in err
