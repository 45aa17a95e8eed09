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


IGNORED_SCRIPT = '''
import json, os
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from autograd_run.capture import one_process_group


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.body, self.norm, self.head = (nn.Linear(16, 64), nn.Linear(64, 64), nn.LayerNorm(64),
                                                       nn.Linear(64, 4))
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.body(torch.relu(self.embed(x)))))) * self.scale


def main():
    one_process_group()
    torch.manual_seed(0)
    model = Net()
    # "scale" is the root's own: DDP's reducer checks it as ".scale" and keeps it
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["body.weight", "norm.bias", "scale"])
    ddp = DDP(model, bucket_cap_mb=0.002)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        ddp(x).square().mean().backward()
    names = {id(p): n for n, p in model.named_parameters()}
    d = ddp._get_ddp_logging_data()
    with open(os.environ["DDP_FACTS"], "w") as f:
        json.dump({"names": [names[id(p)] for p in ddp._build_params_for_reducer()[0]],
                   "initial": d["bucket_sizes"], "ready": d["prev_iteration_grad_ready_order_indices"],
                   "rebuilt": d["rebuilt_per_bucket_param_indices"], "rebuilt_sizes": d["rebuilt_bucket_sizes"]}, f)
    return {"outputs": ddp(x).square().mean(), "parameters": ddp}
'''


def _ready_and_rebuilt_are_ddps(g, params, real: dict, cap: float) -> None:
    """Our engine's AccumulateGrad order (as DDP's parameter indices) and the buckets rebuilt from it at ``cap``
    MiB are DDP's own (``real``: its logging data, as the scripts write it)."""
    from autograd_run.session import RunOptions, run_session
    rep = run_session(g, RunOptions(record_order=True, allow_python=True))
    assert rep.error is None, rep.error
    index = {q.name: q.index for q in params}
    ready = [index[g.by_id[r["id"]].variable] for r in rep.order
             if getattr(g.by_id.get(r["id"]), "variable", None) in index]
    assert ready == ddp_oracle._ints(real["ready"])
    rebuilt = B.rebuilt(params, ready, cap)
    assert rebuilt == [ddp_oracle._ints(b) for b in real["rebuilt"].split(",") if b.strip()]
    assert B.sizes(rebuilt, params) == ddp_oracle._ints(real["rebuilt_sizes"])


def test_parameters_ddp_is_told_to_ignore_are_not_its_parameters(tmp_path):
    """A model with parameters DDP is told to ignore (``_set_params_and_buffers_to_ignore_for_model``; also how
    ``delay_all_reduce_named_params`` works): the Reducer's parameters leave them out (``_build_params_for_reducer``,
    which checks each under ``f"{module}.{name}"``, so a root parameter's plain name ignores nothing), and the
    indices of the rest shift. The captured graph's ``parameters`` are DDP's, and its buckets, initial and rebuilt,
    are DDP's own (read from the same run in the capture's child process). Found by the DDP sweep on an external
    model (GPT-2 with two ignored parameters: 28 parameters where DDP has 26)."""
    import json
    from cli_proc import cli
    from autograd_run.graphs.load import load_graph
    from autograd_run.sim.ddp import params_of
    script, graph, facts = tmp_path / "ddp_ignored.py", tmp_path / "g.json", tmp_path / "facts.json"
    script.write_text(IGNORED_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph], timeout=120, DDP_FACTS=str(facts))
    assert p.code == 0, p.err
    real = json.loads(facts.read_text())
    assert "body.weight" not in real["names"] and "scale" in real["names"]  # (the premise)
    g = load_graph(str(graph))
    params = params_of(g)
    assert [q.name for q in params] == real["names"]
    assert B.sizes(B.initial(params, 0.002), params) == ddp_oracle._ints(real["initial"])
    _ready_and_rebuilt_are_ddps(g, params, real, 0.002)


LIST_SCRIPT = IGNORED_SCRIPT.replace(
    '    DDP._set_params_and_buffers_to_ignore_for_model(model, ["body.weight", "norm.bias", "scale"])\n', '').replace(
    "DDP(model, bucket_cap_mb=0.002)", "DDP(model, bucket_cap_mb_list=[0.001, 0.02, 0.005])")


def test_bucket_cap_mb_list_is_captured_and_simulated_as_ddp_buckets(tmp_path):
    """DDP with per-bucket limits (``bucket_cap_mb_list``, torch 2.13): they set the constructor's buckets (even
    without ``find_unused_parameters``, where DDP otherwise makes one bucket) and the rebuild's. ``capture`` records
    them (``ddp.bucket_cap_mb_list``) and ``simulate --ddp captured`` buckets by them, first iteration and
    steady, as DDP's own logging data says (read in the capture's child process); a cap given on the command line
    replaces them. (Before: only ``bucket_cap_mb``, DDP's largest limit, was recorded: one initial bucket where
    DDP had two, the rebuilt ones by the wrong limits.)"""
    import json
    from cli_proc import cli
    script, graph, facts = tmp_path / "ddp_list.py", tmp_path / "g.json", tmp_path / "facts.json"
    script.write_text(LIST_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph], timeout=120, DDP_FACTS=str(facts))
    assert p.code == 0, p.err
    real = json.loads(facts.read_text())
    caps = [int(c * MB) / MB for c in (0.001, 0.02, 0.005)]  # DDP keeps bytes
    assert json.loads(graph.read_text())["ddp"]["bucket_cap_mb_list"] == caps
    got = {}
    for it in ("first", "steady"):
        p = cli(["simulate", graph, "--ddp", f"captured,iteration={it}", "--world", "2", "--network",
                 "alpha_us=10,gbps=1", "--json", "--slack", "0"], timeout=120)
        assert p.code == 0, p.err
        got[it] = [b for b in json.loads(p.out)["ddp"]["buckets"] if b["kind"] == "bucket"]
    initial = ddp_oracle._ints(real["initial"])
    assert len(initial) == 2  # (the premise: the list split the constructor's buckets)
    assert [b["nbytes"] for b in got["first"]] == initial
    rebuilt = [ddp_oracle._ints(b) for b in real["rebuilt"].split(",") if b.strip()]
    assert [b["params"] for b in got["steady"]] == rebuilt
    assert [b["nbytes"] for b in got["steady"]] == ddp_oracle._ints(real["rebuilt_sizes"])
    p = cli(["simulate", graph, "--ddp", "captured,iteration=first,bucket_cap_mb=1", "--world", "2", "--network",
             "alpha_us=10,gbps=1", "--json", "--slack", "0"], timeout=120)
    assert p.code == 0 and len(json.loads(p.out)["ddp"]["buckets"]) == 1, p.err  # one cap: DDP's one bucket
    doc = json.loads(graph.read_text())
    doc["ddp"]["bucket_cap_mb_list"] = [0.5, -1]
    graph.write_text(json.dumps(doc))
    p = cli(["simulate", graph], timeout=120)
    assert p.code != 0 and "bucket_cap_mb_list" in p.err and "a list of 1 to 65536 sizes in MiB" in p.err, p.err


CKPT_SCRIPT = '''
import json, os
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from autograd_run.capture import one_process_group


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(16, 64), nn.Linear(64, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Tanh()) for _ in range(2))

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:  # as Hugging Face's gradient_checkpointing_enable(use_reentrant=True) does
            h = checkpoint(b, h, use_reentrant=True)
        return self.head(h)


def main():
    one_process_group()
    torch.manual_seed(0)
    ddp = DDP(Net(), bucket_cap_mb=0.01)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        ddp(x).square().mean().backward()
    d = ddp._get_ddp_logging_data()
    with open(os.environ["DDP_FACTS"], "w") as f:
        json.dump({"ready": d["prev_iteration_grad_ready_order_indices"],
                   "rebuilt": d["rebuilt_per_bucket_param_indices"], "rebuilt_sizes": d["rebuilt_bucket_sizes"]}, f)
    return {"outputs": ddp(x).square().mean(), "parameters": ddp}
'''


def test_parameters_reached_only_in_a_reentrant_checkpoint_are_one_variable_each(tmp_path):
    """A model whose blocks run under a reentrant checkpoint (``use_reentrant=True``, as Hugging Face's
    ``gradient_checkpointing_enable`` may set it): their parameters' AccumulateGrad nodes exist only in the graph
    the checkpoint's backward builds, which capture resolves by the reference run. The parameters section was
    made before that run, adding each such parameter as an unreached variable, then the run added it again under
    the same name: a file the loader refused ("duplicate variable name"; found by the DDP sweep on BERT and
    Mistral from transformers with reentrant checkpointing). Now: one variable each, and the order our engine
    runs the AccumulateGrad nodes in and the rebuilt buckets are DDP's own."""
    import json
    from cli_proc import cli
    from autograd_run.graphs.load import load_graph
    from autograd_run.sim.ddp import params_of
    script, graph, facts = tmp_path / "ddp_ckpt.py", tmp_path / "g.json", tmp_path / "facts.json"
    script.write_text(CKPT_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph], timeout=120, DDP_FACTS=str(facts))
    assert p.code == 0, p.err
    real = json.loads(facts.read_text())
    g = load_graph(str(graph))
    params = params_of(g)
    assert len(params) == 12 and all(g.variables[q.name].node is not None for q in params)  # each reached
    _ready_and_rebuilt_are_ddps(g, params, real, 0.01)


TWICE_SCRIPT = CKPT_SCRIPT.replace('''def main():
    one_process_group()''', '''def twice(**kw):
    """What real DDP says of this model's first backward with ``kw`` ("ok", or its error's last line)."""
    torch.manual_seed(0)
    ddp = DDP(Net(), **kw)
    try:
        ddp(torch.randn(4, 16)).square().mean().backward()
        return "ok"
    except RuntimeError as exc:
        return str(exc).splitlines()[-1]


def main():
    one_process_group()
    real = {"find_unused": twice(find_unused_parameters=True),
            "static": twice(find_unused_parameters=True, static_graph=True), "plain": twice()}
    with open(os.environ["DDP_TWICE"], "w") as f:
        json.dump(real, f)''')


def test_find_unused_parameters_with_a_reentrant_checkpoint_fails_as_ddp_does(tmp_path):
    """DDP's search for unused parameters starts from the outputs and does not see inside a reentrant checkpoint:
    with ``find_unused_parameters`` it marks the parameters the checkpoint recomputes ready as unused, then the
    checkpoint's nested backward fires their hooks and the Reducer refuses a second mark ("marked as ready
    twice"); ``static_graph`` allows it. The simulation ran it without a word (found by the DDP sweep); now
    ``simulate --ddp`` fails with an ``Error:`` naming the parameter DDP names (its index and name), and runs
    as DDP does with ``static_graph`` or without ``find_unused_parameters``."""
    import json
    from cli_proc import cli
    script, graph, facts = tmp_path / "ddp_twice.py", tmp_path / "g.json", tmp_path / "twice.json"
    script.write_text(TWICE_SCRIPT)
    p = cli(["capture", f"{script}:main", "-o", graph], timeout=120, DDP_FACTS=str(tmp_path / "f.json"),
            DDP_TWICE=str(facts))
    assert p.code == 0, p.err
    real = json.loads(facts.read_text())
    assert real["static"] == "ok" == real["plain"], real
    assert "has been marked as ready twice" in real["find_unused"], real
    net = ["--world", "2", "--network", "alpha_us=10,gbps=1", "--no-summary"]
    p = cli(["simulate", graph, "--ddp", "find_unused_parameters=true", *net])
    assert p.code == 2 and p.err.startswith("Error:") and "Traceback" not in p.err, p.err
    said = real["find_unused"].split(". This means")[0]  # "Parameter at index I with name N has been marked ..."
    assert said in p.err and "Expected to mark a variable ready only once" in p.err, (said, p.err)
    for ok in ("find_unused_parameters=true,static_graph=true", "find_unused_parameters=false"):
        p = cli(["simulate", graph, "--ddp", ok, *net])
        assert p.code == 0, (ok, p.err)
