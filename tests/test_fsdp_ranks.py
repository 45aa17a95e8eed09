"""The simulated FSDP2 order against real ``fully_shard`` on 2 and 4 local gloo processes.

Each model is captured in a one-rank child process (the graph file's ``fsdp`` section: units, their
parameters, the node each pre- and post-backward ran in), then run on local gloo ranks that profile their
third backward. From each rank's trace, in start order: FSDP's own spans ``FSDP::pre_backward (unit)``,
``FSDP::all_gather (unit)`` (its own or a prefetch) and ``FSDP::post_backward_reduce (unit)`` (the
reduce-scatter). Ours: ``sim.fsdp.simulate_fsdp`` over the simulated backward of the captured graph
(``sim_events``). Equal on every rank, for models with nested units, explicit prefetch lists
(``set_modules_to_backward_prefetch``; one naming units whose backward already ran, which FSDP all-gathers
again: found by the FSDP sweep on transformers' Phi, Mixtral and ViT), a unit that keeps its parameters
(``reshard_after_forward=False``), a tied embedding and head in one unit whose post-backward runs in the final
callback (which runs them in FSDP's ``named_modules`` order of its states, not forward order: found by the
sweep on transformers' GPT-2, OPT, T5 and ELECTRA with tied units),
a unit whose inputs need no gradient (its post-backward runs in the final callback), a transformer, and HSDP
(2 replicas of 2 shards on 4 ranks: each unit's all-reduce across the replicas after its reduce-scatter).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="real FSDP2 is the oracle here")
pytest.importorskip("torch.distributed")
try:
    from tests.support import fsdp_oracle
    from tests.support.once import OnceFailed, once
except ImportError:  # tests/ itself is on sys.path, the repository root is not
    from support import fsdp_oracle
    from support.once import OnceFailed, once

from autograd_run.graphs.load import load_graph  # noqa: E402
from autograd_run.parallel.collectives import Link  # noqa: E402
from autograd_run.sim.fsdp import sim_events, simulate_fsdp  # noqa: E402
from autograd_run.sim.session import SimOptions, simulate_session  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]

CASES = [(name, 2) for name in fsdp_oracle.MODELS + fsdp_oracle.MORE if name != "hsdp"] + [
    ("nested", 4), ("transformer", 4), ("hsdp", 4)]
#: Run on real ranks too, but refused by the simulation (a module run twice in the forward).
REFUSED = [("twice", 2)]


def _simulated(path: str, world: int, replicate: int = 1) -> list[tuple[str, str]]:
    g = load_graph(path)
    rep = simulate_session(g, SimOptions(spec="cpu", slack_top=0))
    return sim_events(simulate_fsdp(rep, world, Link(300.0, 1e9, "gloo-like", reduce_scatter="allreduce"),
                                    replicate=replicate))


def _captured(folder: str) -> dict:
    graphs, errors = fsdp_oracle.capture_many(sorted({n for n, _ in CASES + REFUSED}), folder)
    return {"graphs": graphs, "errors": errors}


@pytest.fixture(scope="session")
def fsdp_runs(tmp_path_factory):
    """run(name, world) -> (graph path, every rank's report): every model captured in one child process and
    run on one group of ``world`` ranks, once per test run whichever worker asks first (support/once.py: each
    process spends seconds importing torch, more than a model's three iterations)."""
    def run(name: str, world: int):
        try:
            made = once(tmp_path_factory, "fsdp-graphs", _captured)
            ranks = once(tmp_path_factory, f"fsdp-world{world}", lambda folder: fsdp_oracle.run_ranks_many(
                [n for n, w in CASES + REFUSED if w == world], world, folder))
        except OnceFailed as exc:
            pytest.fail(str(exc))
        if name in made["errors"]:
            pytest.fail(made["errors"][name])
        if isinstance(ranks[name], str):
            pytest.fail(f"{world} FSDP ranks of {name} raised:\n{ranks[name][-4000:]}")
        return made["graphs"][name], ranks[name]
    return run


@pytest.mark.parametrize("name,world", CASES, ids=[f"{n}-{w}ranks" for n, w in CASES])
def test_each_rank_runs_the_simulated_all_gathers_and_reduce_scatters_in_order(name, world, fsdp_runs):
    graph, ranks = fsdp_runs(name, world)
    real = [fsdp_oracle.events(r["trace"]) for r in ranks]
    assert real[0] and any(k == "all-gather" for k, _ in real[0])
    # (set_requires_gradient_sync(False): no reduce-scatter at all)
    assert any(k == "reduce-scatter" for k, _ in real[0]) == (name != "no_gradient_sync")
    hsdp = name == "hsdp"
    assert any(k == "all-reduce" for k, _ in real[0]) == hsdp  # HSDP's all-reduce across replicas, only there
    sim = _simulated(graph, world, fsdp_oracle.HSDP_REPLICAS if hsdp else 1)
    for rank, seen in enumerate(real):
        assert sim == seen, f"rank {rank}:\n simulated {sim}\n measured  {seen}"


def test_a_unit_run_twice_in_the_forward_is_refused_where_fsdp_runs_its_backward_hooks_twice(fsdp_runs):
    """A module applied twice in the forward (``blk``, between them another unit): FSDP2 records a post-forward per
    call and runs a pre- and a post-backward per call: ``blk`` is all-gathered again after the first (the second
    call's) post-backward, which reduce-scatters nothing (its parameters' AccumulateGrad has not run yet); the
    reduce-scatter comes at the last. The simulation models one of each per unit: the capture writes
    ``forward_calls`` and ``simulate_fsdp`` refuses the file with a reason (it gave the wrong order silently before)."""
    from autograd_run.errors import RequestError
    graph, ranks = fsdp_runs("twice", 2)
    real = fsdp_oracle.events(ranks[0]["trace"])
    assert real.count(("pre", "blk")) == 2 and real.count(("all-gather", "blk")) == 2
    assert real.count(("reduce-scatter", "blk")) == 1
    units = {u["name"]: u for u in load_graph(graph).fsdp["units"]}
    assert units["blk"]["forward_calls"] == 2 and "forward_calls" not in units["other"]
    with pytest.raises(RequestError, match=r"FSDP unit 'blk' ran 2 times in the forward"):
        _simulated(graph, 2)


@pytest.mark.parametrize("name", ["blocks", "transformer"])
def test_costs_from_an_fsdp_profile_leave_out_the_collectives_the_fsdp_model_simulates(name, fsdp_runs):
    """FSDP2's hooks call its all-gathers and reduce-scatters inside backward nodes' spans (a pre-backward in the
    node it precedes, a post-backward in RegisterPostBackwardFunctionBackward): a node's cost is its span less
    those c10d calls inside FSDP's own spans, by hand from the raw trace, else `simulate --fsdp` would count
    them twice. FSDP's work around them (copy-in, copy-out) stays the node's."""
    from autograd_run.costs.measured import from_profile
    from autograd_run.sim.order import predicted_order
    from autograd_run.traces.torch_profile import FSDP_COLLECTIVES, read_torch_profile
    graph, ranks = fsdp_runs(name, 2)
    g = load_graph(graph)
    trace = read_torch_profile(ranks[0]["trace"])
    costs = from_profile(trace, g, order=predicted_order(g))
    with open(ranks[0]["trace"]) as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    spans = [e for e in raw if e["name"].startswith("autograd::engine::evaluate_function: ")]
    fsdp = [e for e in raw if e["name"].startswith("FSDP::")]
    calls = [e for e in raw if e["name"].startswith(FSDP_COLLECTIVES)
             and any(f["tid"] == e["tid"] and f["ts"] <= e["ts"] <= f["ts"] + f["dur"] for f in fsdp)]
    inside = sum(c["dur"] for c in calls for sp in spans if sp["tid"] == c["tid"] and sp["ts"] <= c["ts"]
                 and c["ts"] + c["dur"] <= sp["ts"] + sp["dur"])
    assert inside > 0, "FSDP ran no collective inside a backward node: the premise of this test is gone"
    assert costs.use.fsdp_ns == pytest.approx(inside * 1e3, rel=1e-6, abs=2e3)
    assert "--fsdp models them" in costs.use.line(0.0)
    total_spans = sum(e.dur_ns - e.overhead_ns for e in trace.events)
    assert sum(c.cpu_ns for c in costs.nodes.values()) == pytest.approx(total_spans - costs.use.fsdp_ns, rel=0.02)


@pytest.mark.parametrize("name", ["blocks", "transformer"])
def test_the_final_callbacks_own_time_comes_from_the_profile_and_ends_the_simulated_backward(name, fsdp_runs):
    """FSDP2's root final callback runs after the backward's last node, in no node's span: its own time (the time
    its recorded ops cover, FSDP's annotations and its c10d collectives with what they call left out: on gloo
    the wait for a reduce-scatter comes after the op, where nothing is recorded; by hand from the raw trace)
    is what the costs report and what ``simulate --fsdp`` adds after the compute (the backward ends that much
    later, or less where it waited on a collective anyway)."""
    import dataclasses
    from autograd_run.costs.measured import from_profile
    from autograd_run.sim.order import predicted_order
    from autograd_run.traces.torch_profile import FSDP_COLLECTIVES, FSDP_FINAL_CALLBACK, read_torch_profile
    graph, ranks = fsdp_runs(name, 2)
    g = load_graph(graph)
    with open(ranks[0]["trace"]) as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    finals = [e for e in raw if e["name"] == FSDP_FINAL_CALLBACK]
    assert len(finals) == 1, "one profiled backward, one final callback: the premise of this test is gone"
    cb = finals[0]
    inside = [e for e in raw if e is not cb and e["tid"] == cb["tid"] and cb["ts"] <= e["ts"]
              and e["ts"] + e["dur"] <= cb["ts"] + cb["dur"]]
    colls = [e for e in inside if e["name"].startswith(FSDP_COLLECTIVES)]
    assert colls, "no collective inside the final callback: the premise of this test is gone"
    ops = [e for e in inside if not e["name"].startswith(("FSDP::", *FSDP_COLLECTIVES))
           and not any(c["ts"] <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] for c in colls)]
    merged: list[list[float]] = []  # the ops' union, as disjoint intervals
    for a, b in sorted((e["ts"], e["ts"] + e["dur"]) for e in ops):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    own_ns = sum(b - a for a, b in merged) * 1e3
    assert 0 < own_ns < cb["dur"] * 1e3 / 2  # (the wait is most of the span on gloo)
    costs = from_profile(read_torch_profile(ranks[0]["trace"]), g, order=predicted_order(g))
    assert costs.use.fsdp_final_ns == pytest.approx(own_ns, rel=0.01, abs=2e3)
    assert "FSDP's final callback" in costs.use.line(0.0)
    link = Link(300.0, 1e9, "gloo-like", reduce_scatter="allreduce")
    rep = simulate_session(g, SimOptions(spec="cpu", costs=costs, slack_top=0))
    with_cb = simulate_fsdp(rep, 2, link)
    rep.measured = dataclasses.replace(costs, use=dataclasses.replace(costs.use, fsdp_final_ns=0.0))
    without = simulate_fsdp(rep, 2, link)
    assert with_cb.compute_ns == without.compute_ns
    assert 0 < with_cb.wall_ns - without.wall_ns <= round(costs.use.fsdp_final_ns) + 1  # (ns, rounded)


#: The block both capture scripts shard (a script's own text: each runs in a child process).
BLOCK = '''
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))
'''

FSDP_SCRIPT = '''
import torch, torch.nn as nn
from torch.distributed.fsdp import fully_shard
from autograd_run.capture import one_process_group
''' + BLOCK + '''

def main():
    one_process_group()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), Block(), Block(), nn.Linear(16, 2))
    for m in model[1:3]:
        fully_shard(m)
    fully_shard(model)
    return {"outputs": model(torch.randn(4, 8)).square().mean(), "parameters": model}
'''


def test_capture_of_an_fsdp_model_records_its_units_and_replays_as_pytorch(tmp_path):
    """`capture` of a script that shards its model with fully_shard (a one-process group): the graph file's
    fsdp section names the units in forward order with their parameters (the unsharded tensors the backward
    accumulates into, named as the model names them), where each pre- and post-backward ran; `--check`
    agrees with PyTorch (whose gradients FSDP moved to its shards); `simulate --fsdp captured` uses it; a
    broken section is an Error with its place."""
    from cli_proc import cli
    script, graph = tmp_path / "fsdp_model.py", tmp_path / "g.json"
    script.write_text(FSDP_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph, "--check"], timeout=180)
    assert p.code == 0, p.err
    doc = json.loads(graph.read_text())
    units = doc["fsdp"]["units"]
    assert [u["name"] for u in units] == ["1", "2", ""] and doc["fsdp"]["root"] == ""
    assert units[0]["parameters"] == ["1.a.weight", "1.a.bias", "1.b.weight", "1.b.bias"]
    assert units[2]["parameters"] == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert [u["reshard_after_forward"] for u in units] == [True, True, False]  # the root keeps its own
    by_id = {n["id"]: n for n in doc["nodes"]}
    assert by_id[units[0]["post_backward"]]["name"] == "RegisterPostBackwardFunctionBackward"
    assert units[2]["post_backward"] is None  # the root's inputs need no gradient: the final callback
    assert all(u["pre_backward"] in by_id for u in units)
    p = cli(["simulate", graph, "--fsdp", "captured", "--world", "4", "--network", "alpha_us=10,gbps=1", "--json",
             "--slack", "0"], timeout=120)
    assert p.code == 0, p.err
    d = json.loads(p.out)["fsdp"]
    got = {u["name"]: u for u in d["units"]}
    assert got[""]["all_gather"] is None and got["2"]["gathered_by"] == "prefetch by (root)"
    # (16*32 + 32 + 32*16 + 16) float32, dim 0 padded to a multiple of 4 ranks: nothing to pad here
    assert got["1"]["gather_bytes"] == (16 * 32 + 32 + 32 * 16 + 16) * 4
    assert d["blocking"] is True and d["wall_ns"] > d["compute_ns"]
    doc["fsdp"]["units"][0]["parameters"].append("nope")
    graph.write_text(json.dumps(doc))
    p = cli(["simulate", graph], timeout=120)
    assert p.code != 0 and "fsdp" in p.err and "unknown parameter 'nope'" in p.err, p.err
    del doc["fsdp"]
    graph.write_text(json.dumps(doc))
    p = cli(["simulate", graph, "--fsdp", "captured", "--world", "2", "--network", "alpha_us=10,gbps=1"],
            timeout=120)
    assert p.code == 2 and "no fsdp section" in p.err, p.err


FSDP_AC_SCRIPT = '''
import sys
import torch, torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint
from autograd_run.capture import from_torch, one_process_group
''' + BLOCK + '''

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.blocks, self.out = nn.Linear(8, 16), nn.ModuleList([Block(), Block()]), nn.Linear(16, 2)

    def forward(self, x):
        h = self.inp(x)
        for m in self.blocks:  # activation checkpointing around each unit (non-reentrant)
            h = checkpoint(m, h, use_reentrant=False)
        return self.out(h)


one_process_group()
torch.manual_seed(0)
model = Net()
for m in model.blocks:  # units inside each checkpointed block (as shard_by_size splits a large layer)
    fully_shard(m.a)
    fully_shard(m.b)
fully_shard(model)
x = torch.randn(4, 8)


def run():
    return model(x).square().mean()


try:
    from_torch(run(), parameters=model, reference=False)
    print("values: captured")
except ValueError as exc:
    print("values: ValueError:", exc)
doc = from_torch(run(), parameters=model, reference=False, values=False)
print("structure:", [u["name"] for u in doc["fsdp"]["units"]])
'''


def test_capture_of_fsdp_with_activation_checkpointing_refuses_freed_saved_values(tmp_path):
    """FSDP2 units inside (non-reentrant) activation-checkpointed blocks: reading a saved tensor to write its values
    recomputes the checkpointed forward, whose post-forward reshards the unit again, so the saved weight view
    (``mat2``) has a freed storage (``resize_(0)``). Reading it was a segfault of the capturing process (or
    torch's "data is not allocated yet"; found by the FSDP sweep on Mistral and a timm ViT with checkpointing):
    now a ValueError naming the tensor; the structure alone (``values=False``) captures."""
    import subprocess
    import sys
    script = tmp_path / "fsdp_ac.py"
    script.write_text(FSDP_AC_SCRIPT)
    from cli_proc import cli_env
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=cli_env(GLOO_SOCKET_IFNAME="lo"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "values: ValueError:" in p.stdout and "the saved tensor's storage has been freed" in p.stdout, p.stdout
    assert "structure: ['blocks.0.a', 'blocks.0.b', 'blocks.1.a', 'blocks.1.b', '']" in p.stdout, p.stdout
