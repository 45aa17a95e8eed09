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
    from tests.support.once import OnceFailed, once
except ImportError:  # tests/ itself is on sys.path, the repository root is not
    from support import ddp_oracle
    from support.once import OnceFailed, once

from autograd_run.ops.cost import ITEMSIZE  # noqa: E402
from autograd_run.parallel.collectives import Link  # noqa: E402
from autograd_run.sim.ddp import simulate_ddp  # noqa: E402
from autograd_run.sim.session import SimOptions, simulate_session  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

CASES = [("mlp", 0.5, 2), ("resnet", 0.05, 2), ("unused", 0.05, 2), ("mixed", 0.05, 2), ("shared", 0.01, 2),
         ("transformer", 0.05, 4)]


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory):
    """run(name, cap, world) -> every rank's report: the cases of one world size run in turn on one group of
    ``world`` ranks, once per test run whichever worker asks first (support/once.py: each process spends
    seconds importing torch, more than a case's three iterations)."""
    def run(name: str, cap, world: int):
        cases = [(n, c) for n, c, w in CASES if w == world]
        try:
            got = once(tmp_path_factory, f"ddp-world{world}",
                       lambda folder: ddp_oracle.run_ranks_many(cases, world, folder, timeout=240))
        except OnceFailed as exc:
            pytest.fail(str(exc))
        ranks = got[cases.index((name, cap))]
        if isinstance(ranks, str):
            pytest.fail(f"{world} DDP ranks of {name} raised:\n{ranks[-4000:]}")
        return ranks
    return run


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
def test_each_rank_launches_the_simulated_all_reduces_in_order(name, cap, world, ddp_runs):
    ranks = ddp_runs(name, cap, world)
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
    assert 0 < link["during_compute"] <= 1  # the ratio's rule is checked by hand in test_ddp_sim
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


DDP_SCRIPT = '''
import torch
from torch import nn
from autograd_run.capture import one_process_group


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.unused, self.head = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def main():
    one_process_group()
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.001, find_unused_parameters=True)
    return {"outputs": ddp(torch.randn(4, 16)).square().mean(), "parameters": ddp}
'''


def test_capture_of_a_ddp_model_records_its_settings_and_replays_as_pytorch(tmp_path):
    """`capture` of a script that wraps its model in DDP (a one-process group from one_process_group()):
    the graph has DDP's _DDPSinkBackward node (a pass-through rule), the parameters in registration order with
    the unused layer's, and DDP's settings; `check` agrees with PyTorch; `simulate --ddp captured` uses them.
    (In child processes: a process group is never made in the pytest process, see ddp_oracle.)"""
    import json
    from cli_proc import cli
    script, graph = tmp_path / "ddp_model.py", tmp_path / "g.json"
    script.write_text(DDP_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph, "--check"], timeout=120)
    assert p.code == 0, p.err
    doc = json.loads(graph.read_text())
    # DDP keeps the cap in bytes: int(0.001 MiB) = 1048 bytes, written back as MiB (the same cap again)
    assert doc["ddp"] == {"bucket_cap_mb": 1048 / (1 << 20), "find_unused_parameters": True, "static_graph": False,
                          "gradient_as_bucket_view": False, "world_size": 1}
    assert doc["parameters"] == ["body.weight", "body.bias", "unused.weight", "unused.bias", "head.weight",
                                 "head.bias"]
    assert "_DDPSinkBackward" in {n["name"] for n in doc["nodes"]}
    p = cli(["simulate", graph, "--ddp", "captured", "--world", "2", "--network", "alpha_us=10,gbps=1", "--json",
             "--slack", "0"], timeout=120)
    assert p.code == 0, p.err
    d = json.loads(p.out)["ddp"]
    assert d["unused"] == ["unused.weight", "unused.bias"]
    # find_unused_parameters kept the initial buckets (one per parameter at a 1 KiB cap... reversed) and the map
    assert d["buckets"][-1]["kind"] == "used-map" and d["buckets"][-1]["nbytes"] == 6 * 4
    p = cli(["simulate", graph, "--ddp", "captured,find_unused_parameters=false", "--world", "2", "--network",
             "alpha_us=10,gbps=1", "--json", "--slack", "0"], timeout=120)
    assert p.code == 0 and all(b["kind"] == "bucket" for b in json.loads(p.out)["ddp"]["buckets"])
    doc["ddp"]["bucket_cap_mb"] = -1
    graph.write_text(json.dumps(doc))
    p = cli(["simulate", graph], timeout=120)
    assert p.code != 0 and "ddp" in p.err and "bucket_cap_mb" in p.err and "must be a size in MiB" in p.err
    del doc["ddp"]
    graph.write_text(json.dumps(doc))
    p = cli(["simulate", graph, "--ddp", "captured", "--world", "2", "--network", "alpha_us=10,gbps=1"],
            timeout=120)
    assert p.code == 2 and p.err.startswith(f"Error: {graph}: no ddp section"), p.err
