"""The simulation: hand-computed schedules, the engine's order reproduced, policies, bounds."""

import functools
import os
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.sim.costs import CostResolver
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.sim.specs import DeviceSpec, EngineSpec, MachineSpec
from autograd_run.traces.order import compare_orders

pytestmark = pytest.mark.timeout(120)


def spec(overhead=1.0, handoff=10.0, gil=False, launch=2.0, min_kernel=3.0):
    host = DeviceSpec("host", {"float32": 1e12}, 1e12, 1.0, 1.0, min_kernel_us=2.0)
    acc = DeviceSpec("acc", {"float32": 1e15}, 1e15, 1.0, 1.0, min_kernel_us=min_kernel, launch_us=launch,
                     link_bw=1e9, link_latency_us=4.0, host_bw=1e9, host_latency_us=6.0)
    return MachineSpec("test", host, acc, EngineSpec(overhead, handoff, gil))


from builders import parts_graph  # noqa: E402  (tests/ is on sys.path)

graph = functools.partial(parts_graph, source="sim.json")


def cost(nid, us, device="cpu", nxt=(), seq=1, mode=None):
    c = {"us": us} | ({"mode": mode} if mode else {})
    return {"id": nid, "name": nid.upper(), "op": "cost", "seq": seq, "next": [list(e) for e in nxt],
            "inputs": [{"shape": [1], "device": device}], "attrs": {"cost": c}}


def acc(name, device="cpu"):
    return {"id": f"acc_{name}", "name": "AccumulateGrad", "variable": name, "inputs": [{"shape": [1], "device": device}]}


def sim(g, **kw):
    return simulate_session(g, SimOptions(spec=kw.pop("machine", spec()), slack_top=0, **kw))


def test_two_devices_joining_on_the_caller_hand_computed():
    """
        R (cpu, 5 µs spin) --> A (cuda:0, 20 µs) --+
                          \\-> B (cuda:1, 30 µs) --+--> acc x (cpu)
    Overhead 1 µs per node, hand-off 10 µs, AccumulateGrad 2 µs (the host's smallest call):
    R 0-6; A and B woken at 16: A 16-37, B 16-47 (B makes acc ready); the caller wakes at 57: acc 57-60.
    """
    g = graph([cost("r", 5, seq=3, nxt=[("a", 0), ("b", 0)]), cost("a", 20, "cuda:0", [("acc_x", 0)], 2),
               cost("b", 30, "cuda:1", [("acc_x", 0)], 1), acc("x")], [{"node": "r"}],
              [{"name": "x", "shape": [1]}])
    r = sim(g)
    spans = {s.node.id: (s.start // 1000, s.end // 1000) for s in r.recording.slices}
    assert spans == {"r": (0, 6), "a": (16, 37), "b": (16, 47), "acc_x": (57, 60)}
    assert r.wall_ns == 60_000
    waits = {w.node.id: w.waited // 1000 for w in r.recording.waits}
    assert waits == {"r": 0, "a": 10, "b": 10, "acc_x": 10}


def test_cross_device_sync_delays_the_consumers_kernel():
    """
        neg0 (cuda:0) --> neg1 (cuda:1) --> acc (cuda:1)
    Each NegBackward0: CPU part = overhead 1 + launch 2; kernel 3 µs on its stream.
    neg0 (caller pushed it: woken at 10): CPU 10-13, kernel 13-16, event at 16;
    neg1 woken at 23: CPU 23-26; its stream waits for the event (16 < 26): kernel 26-29.
    """
    g = graph([
        {"id": "neg0", "name": "NegBackward0", "seq": 2, "next": [["neg1", 0]], "inputs": [{"shape": [1], "device": "cuda:0"}]},
        {"id": "neg1", "name": "NegBackward0", "seq": 1, "next": [["acc_x", 0]], "inputs": [{"shape": [1], "device": "cuda:1"}]},
        acc("x", "cuda:1")], [{"node": "neg0"}], [{"name": "x", "shape": [1], "device": "cuda:1"}])
    r = sim(g)
    kernels = {k.node.id: (k.start // 1000, k.end // 1000, k.stream) for k in r.recording.kernels}
    assert kernels["neg0"] == (13, 16, "cuda:0/s0")
    assert kernels["neg1"] == (26, 29, "cuda:1/s0")
    assert [(s.producer.id, s.consumer.id) for s in r.recording.syncs] == [("neg0", "neg1")]


def test_gil_holding_nodes_take_turns():
    """Two 50 µs spin nodes on two devices hold the GIL, so they run one after the other, the second
    thread woken the hand-off latency (10 µs) after the first lets the GIL go; in the default mode
    (wait, no GIL) they overlap."""
    def g(mode):
        return graph([cost("r", 0, seq=3, nxt=[("a", 0), ("b", 0)]), cost("a", 50, "cuda:0", [("acc_x", 0)], 2, mode),
                      cost("b", 50, "cuda:1", [("acc_x", 0)], 1, mode), acc("x")], [{"node": "r"}],
                     [{"name": "x", "shape": [1]}])
    overlap, turns = sim(g(None)).wall_ns, sim(g("spin")).wall_ns
    assert turns - overlap == 50_000 + 10_000


def test_copies_use_the_link():
    """A ToCopyBackward0 to another device moves its bytes at the link bandwidth plus latency:
    4096 float32 (16 KiB) at 1 GB/s + 4 µs = 20.384 µs on the copy's stream."""
    g = graph([
        {"id": "copy", "name": "ToCopyBackward0", "seq": 1, "next": [["acc_x", 0]],
         "inputs": [{"shape": [4096], "device": "cuda:1"}]},
        {"id": "acc_x", "name": "AccumulateGrad", "variable": "x", "inputs": [{"shape": [4096], "device": "cuda:0"}]}],
        [{"node": "copy"}], [{"name": "x", "shape": [4096], "device": "cuda:0"}])
    r = sim(g)
    k = next(k for k in r.recording.kernels if k.node.id == "copy")
    assert k.end - k.start == 16384 + 4000


SHIPPED = ["seed", "mlp", "pipeline", "reentrant"]
GENERATED = [("chain", dict(n=60)), ("fanout", dict(width=9)), ("mlp", dict(layers=3)),
             ("transformer", dict(layers=2, devices=2)), ("random", dict(nodes=300, leaves=40, seed=3)),
             ("random", dict(nodes=200, leaves=60, seed=7))]


def all_graphs():
    out = [load_graph(f"example:{n}") for n in SHIPPED]
    out += [loads_graph(dumps(generate(k, **kw), "json"), f"{k}.json") for k, kw in GENERATED]
    return out


@pytest.mark.parametrize("multithreading", [False, True])
def test_simulated_order_is_the_engines(multithreading):
    for g in all_graphs():
        r = sim(g, policy="pytorch" if multithreading else "single-thread", machine=spec())
        real = run_session(g, RunOptions(multithreading=multithreading, record_order=True, profile=False,
                                         allow_python=True))
        assert compare_orders(r.order, real.order, per_worker=multithreading) is None, g.source


def test_captured_models_order_is_the_engines():
    torch = pytest.importorskip("torch")
    from torch_helpers import capture
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3)).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2, 1, 0]))
    g = loads_graph(dumps(capture([loss], leaves=dict(model.named_parameters())), "json"), "model.json")
    r = sim(g, policy="single-thread")
    real = run_session(g, RunOptions(multithreading=False, record_order=True, profile=False))
    assert compare_orders(r.order, real.order, per_worker=False) is None


def order_of(g, policy, **kw):
    return [row["id"] for row in sim(g, policy=policy, **kw).order]


def test_fifo_runs_tasks_in_the_order_they_became_ready():
    """
        r --> lo (seq 1) --+
          \\-> hi (seq 5) --+--> acc
    r pushes lo, then hi: PyTorch pops the higher sequence number first, FIFO the first pushed.
    """
    g = graph([cost("r", 1, seq=9, nxt=[("lo", 0), ("hi", 0)]), cost("lo", 1, nxt=[("acc_x", 0)], seq=1),
               cost("hi", 1, nxt=[("acc_x", 0)], seq=5), acc("x")], [{"node": "r"}], [{"name": "x", "shape": [1]}])
    assert order_of(g, "pytorch") == ["r", "hi", "lo", "acc_x"]
    assert order_of(g, "fifo") == ["r", "lo", "hi", "acc_x"]


def test_critical_path_runs_the_longest_remaining_path_first():
    """
        r --> short (seq 5, 1 µs) --------------------> acc x
          \\-> long (seq 1, 1 µs) --> tail (100 µs) --> acc y
    PyTorch takes short first (higher seq); critical-path takes long (100 µs still behind it).
    """
    g = graph([cost("r", 1, seq=9, nxt=[("short", 0), ("long", 0)]), cost("short", 1, nxt=[("acc_x", 0)], seq=5),
               cost("long", 1, nxt=[("tail", 0)], seq=2), cost("tail", 100, nxt=[("acc_y", 0)], seq=1),
               acc("x"), acc("y")], [{"node": "r"}], [{"name": "x", "shape": [1]}, {"name": "y", "shape": [1]}])
    assert order_of(g, "pytorch")[:2] == ["r", "short"]
    assert order_of(g, "critical-path")[:2] == ["r", "long"]


def test_single_thread_and_caller_thread_policies():
    """
        r (cuda:0) --> a (cuda:0) --> acc
    One device: caller-thread runs everything on the caller (no hand-off); pytorch hands off to cuda:0.
    """
    g = graph([cost("r", 5, "cuda:0", [("a", 0)], 2), cost("a", 5, "cuda:0", [("acc_x", 0)], 1), acc("x", "cuda:0")],
              [{"node": "r"}], [{"name": "x", "shape": [1], "device": "cuda:0"}])
    threads = {row["thread"] for row in sim(g, policy="caller-thread").order}
    assert threads == {"MainThread"}
    assert {row["thread"] for row in sim(g, policy="pytorch").order} == {"autograd-run cuda:0"}
    assert sim(g, policy="caller-thread").wall_ns < sim(g, policy="pytorch").wall_ns


def test_predicted_order_is_static():
    """The predicted (single-thread) order, kept by every worker even when devices could reorder."""
    g = loads_graph(dumps(generate("transformer", layers=1, devices=2), "json"), "t.json")
    single = order_of(g, "single-thread")
    predicted = sim(g, policy="predicted-order").order
    pos = {nid: i for i, nid in enumerate(single)}
    for th in {r["thread"] for r in predicted}:
        ids = [r["id"] for r in predicted if r["thread"] == th]
        assert ids == sorted(ids, key=pos.get), th


def test_placement_remaps_and_inserts_copies():
    g = load_graph("example:mlp")
    r = sim(g, devices=2, placement="round-robin")
    copies = [n for n in r.graph.nodes if n.name == "ToCopyBackward0"]
    assert copies and {str(d) for d in r.graph.devices} == {"cuda:0", "cuda:1"}
    assert r.order[0]["id"] == "sum_7"
    # the original graph is untouched
    assert {str(d) for d in g.devices} == {"cpu"}


def test_scale_and_slack():
    g = graph([cost("a", 100, seq=2, nxt=[("b", 0)]), cost("b", 50, nxt=[("acc_x", 0)]), acc("x")],
              [{"node": "a"}], [{"name": "x", "shape": [1]}])
    base = sim(g).wall_ns
    assert sim(g, scale="A=0.5").wall_ns == base - 50_000
    r = simulate_session(g, SimOptions(spec=spec(), slack_top=2))
    assert {s.node: s.saved_ns for s in r.slack} == {"a": 20_000, "b": 10_000}


def _resimulated_slack(r, policy):
    """Each of ``r``'s what-ifs by simulating the graph again (what the slack was before its shortcut)."""
    from autograd_run.sim.costs import NodeCost
    from autograd_run.sim.result import span
    from autograd_run.sim.session import _simulate
    model = CostResolver(r.spec)
    out = {}
    for s in r.slack:
        node = r.graph.by_id[s.node]
        base = model(node)
        faster = NodeCost(int(base.cpu_ns * 0.8), int(base.gpu_ns * 0.8), base.holds_gil, base.source, base.blocking)
        start, end = span(_simulate(r.graph, r.spec, model.with_cost(node, faster), policy)[0])
        out[s.node] = r.wall_ns - (end - start)
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(5, 60), st.sampled_from(["pytorch", "fifo", "critical-path",
                                                                   "single-thread", "predicted-order"]))
def test_slack_on_one_cpu_worker_is_what_simulating_again_gives(seed, nodes, policy):
    """One worker, every node on the CPU: the what-ifs are not simulated again, and come out the same."""
    doc = generate("random", nodes=nodes, leaves=max(2, nodes // 5), seed=seed)
    g = loads_graph(dumps(doc, "json"), "r.json")
    r = simulate_session(g, SimOptions(spec=spec(), policy=policy, slack_top=8))
    assert r.sim.cpu_only_one_worker and r.slack
    assert {s.node: s.saved_ns for s in r.slack} == _resimulated_slack(r, policy)


def test_slack_of_a_pass_that_shrinks_to_nothing():
    """A 1 ns pass made 20% faster takes 0 ns, which a recording shows as 1 ns: nothing saved."""
    g = graph([cost("a", 0.001, nxt=[("acc_x", 0)]), acc("x")], [{"node": "a"}], [{"name": "x", "shape": [1]}])
    host = DeviceSpec("host", {"float32": 1e12}, 1e12, 1.0, 1.0, min_kernel_us=0.0)
    machine = MachineSpec("zero", host, host, EngineSpec(0.0, 0.0, False))
    r = simulate_session(g, SimOptions(spec=machine, slack_top=2))
    assert r.sim.cpu_only_one_worker and r.wall_ns == 1
    assert {s.node: s.saved_ns for s in r.slack} == _resimulated_slack(r, "pytorch") == {"a": 0}


def test_nodes_share_a_cost_unless_their_cost_model_reads_their_saved_values():
    """One cost per kind of node: saved values set kinds apart only where the op's cost model reads them."""
    from autograd_run.graphs.model import CPU, InputMeta

    class NS:  # an op or a node: identity-hashed, as the real ones
        def __init__(self, **fields):
            self.__dict__.update(fields)
    from autograd_run.ops.cost import CostModel as OpCost
    reads = NS(name="Reads", engine=False, cost=OpCost(lambda s: 1e7 * s.values.get("k", 0), lambda s: 0.0))
    ignores = NS(name="Ignores", engine=False, cost=OpCost(lambda s: 1e7, lambda s: 0.0))

    def node(op, k):
        return NS(id=f"{op.name}{k}", name=op.name, op=op, device=CPU, cpu=True, inputs=[InputMeta((1,))], next=[],
                  saved={"k": k}, attrs={})
    model = CostResolver(spec())
    assert [model(node(reads, k)).cpu_ns for k in (1, 2, 3, 2)] == [10_000, 20_000, 30_000, 20_000]
    assert [model(node(ignores, k)).cpu_ns for k in (1, 2, 3)] == [10_000] * 3


def test_measured_costs_from_a_trace(tmp_path):
    g = load_graph("example:mlp")
    trace = tmp_path / "t.json"
    run_session(g, RunOptions(trace_path=str(trace), multithreading=False))
    r = simulate_session(g, SimOptions(spec=spec(), costs=str(trace), slack_top=0))
    assert r.cost_sources == {"measured": len(g.nodes)}
    other = load_graph("example:seed")
    from autograd_run.errors import RequestError
    with pytest.raises(RequestError, match="no node"):
        simulate_session(other, SimOptions(spec=spec(), costs=str(trace)))


def test_measured_costs_from_a_trace_written_before_are_the_same(tmp_path):
    """Traces written before carried each node slice's id as an argument (the title says it now): the costs
    read from either are the same, by node id."""
    import json
    from autograd_run.sim.session import read_costs
    from test_profile import as_written_before
    g = load_graph("example:mlp")
    trace, old = tmp_path / "t.json", tmp_path / "old.json"
    run_session(g, RunOptions(trace_path=str(trace), multithreading=False))
    old.write_text(json.dumps(as_written_before(json.loads(trace.read_text()))))
    new_costs, old_costs = read_costs(str(trace), g), read_costs(str(old), g)
    assert set(new_costs.nodes) >= {n.id for n in g.nodes} and new_costs.nodes == old_costs.nodes


@pytest.mark.parametrize("key, value, got", [("dur", 1e15, "1e+15"), ("dur", 1e300, "1e+300"),
                                              ("ts", 1e300, "1e+300"), ("ts", -1e16, "-1e+16")])
def test_measured_costs_refuse_a_time_past_its_bound(tmp_path, capsys, key, value, got):
    """A --costs trace whose spans last 1e15 us was an OverflowError traceback in the memory model, 1e300 us one
    in the simulation's loop: an event's dur is at most a day, its ts about 127 years, either way from 0."""
    from builders import run_cli
    g = load_graph("example:mlp")
    trace = tmp_path / "t.json"
    run_session(g, RunOptions(trace_path=str(trace), multithreading=False))
    doc = json.loads(trace.read_text())
    first = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e[key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    limit = "-8.64e+10 to 8.64e+10 (a day either way)" if key == "dur" else "-4e+15 to 4e+15 (about 127 years either way)"
    code, out, err = run_cli(["simulate", "example:mlp", "--costs", str(bad)], capsys)
    assert (code, out) == (2, ""), err
    assert err == (f"Error: --costs: {bad}: $.traceEvents[{first}] ({doc['traceEvents'][first]['name']!r}): an "
                   f"event's '{key}' must be a number of microseconds from {limit}, got {got}\n"), err


@pytest.mark.parametrize("text", ["1e400", "1" + "0" * 30])
def test_a_time_past_a_double_names_its_event_too(tmp_path, capsys, text):
    """A dur written 1e400 (past a double: the JSON reader stops there) named the place but not the event (a
    hostile review): read again, it names both."""
    from builders import run_cli
    g = load_graph("example:mlp")
    trace = tmp_path / "t.json"
    run_session(g, RunOptions(trace_path=str(trace), multithreading=False))
    doc = json.loads(trace.read_text())
    first = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    doc["traceEvents"][first]["dur"] = 12345.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc).replace("12345.5", text, 1))
    code, out, err = run_cli(["simulate", "example:mlp", "--costs", str(bad)], capsys)
    assert (code, out) == (2, ""), err
    assert err.startswith(f"Error: --costs: {bad}: $.traceEvents[{first}] ({doc['traceEvents'][first]['name']!r}): "
                          "an event's 'dur' must be a number of microseconds from"), err
    assert err.rstrip().endswith("got a number out of range"), err


def test_measured_costs_from_a_compressed_trace_and_not_from_a_protobuf_one(tmp_path):
    from autograd_run.errors import RequestError
    g = load_graph("example:mlp")
    for name in ("t.json.gz", "t.pftrace"):
        run_session(g, RunOptions(trace_path=str(tmp_path / name), multithreading=False))
    r = simulate_session(g, SimOptions(spec=spec(), costs=str(tmp_path / "t.json.gz"), slack_top=0))
    assert r.cost_sources == {"measured": len(g.nodes)}
    with pytest.raises(RequestError, match="protobuf"):
        simulate_session(g, SimOptions(spec=spec(), costs=str(tmp_path / "t.pftrace")))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(5, 60), st.sampled_from([0, 2]), st.booleans())
def test_wall_between_critical_path_and_total_work(seed, nodes, devices, gil):
    """With ``gil``, the engine's overhead and a third of the nodes (spinning) hold the GIL: a thread may
    then also wait for the GIL, and be woken a hand-off after it is let go (at most twice per node)."""
    import random
    rnd = random.Random(seed)
    doc = generate("random", nodes=nodes, leaves=max(2, nodes // 5), seed=seed)
    for n in doc["nodes"]:
        if n["name"] != "AccumulateGrad":
            n["op"] = "cost"
            n["attrs"] = {"cost": {"us": rnd.randint(1, 50)}}
            if gil and rnd.random() < 1 / 3:
                n["attrs"]["cost"]["mode"] = "spin"
            n.pop("saved", None)
    g = loads_graph(dumps(doc, "json"), "r.json")
    s = spec(gil=gil)
    r = simulate_session(g, SimOptions(spec=s, devices=devices or None, placement="round-robin" if devices else "keep",
                                       slack_top=0))
    model = CostResolver(s)
    work = sum(model(n).cpu_ns + model(n).gpu_ns for n in r.graph.nodes)
    # per node: overhead and at most one hand-off from a queue (and two from the GIL)
    overheads = len(r.graph.nodes) * (1000 + (3 if gil else 1) * 10_000) + 10_000
    longest = {}
    for n in sorted(r.graph.nodes, key=lambda n: n.topo_nr):
        c = model(n)
        longest[n] = c.cpu_ns + c.gpu_ns + max((longest[e.node] for e in n.next if e is not None), default=0)
    assert max(longest.values()) <= r.wall_ns <= work + overheads


def test_cli_simulate_writes_a_golden_order_that_run_accepts(tmp_path):
    import subprocess
    import sys
    golden = tmp_path / "golden.jsonl"
    cmd = [sys.executable, "-m", "autograd_run.cli.main"]
    out = subprocess.run(cmd + ["simulate", "example:mlp", "--no-summary", "--order-out", str(golden)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run(cmd + ["run", "example:mlp", "--no-summary", "--no-multithreading",
                                "--expect-order", str(golden)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "order matches" in out.stdout, out.stderr


def test_cli_simulate_compare_json():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "autograd_run.cli.main", "simulate", "example:pipeline", "--spec", "a100",
                          "--compare", "policy=pytorch,fifo,single-thread", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["policy"] for r in rows] == ["pytorch", "fifo", "single-thread"]
    assert all(r["wall_ns"] > 0 for r in rows)


def test_a_comparison_lets_each_variants_simulation_go_and_keeps_its_figures(monkeypatch, capsys):
    """--compare takes each variant's figures (and its JSON) as it ends, then lets its simulation go, and
    collects once the memory left would not hold two more like it: the same rows as each variant alone."""
    import gc
    import weakref
    from autograd_run.cli import sim_cmd
    from autograd_run.sim import session
    from tests.builders import run_cli
    sims, collected = [], []
    real_settle = session.SimReport.settle

    def settle(self, memory):
        sims.append(weakref.ref(self.sim))
        real_settle(self, memory)
        assert self.sim is None and self.graph is None and self._recording is None
    monkeypatch.setattr(session.SimReport, "settle", settle)
    left = iter([10**9, 6 * 10**8, 10**9, 9 * 10**8])  # (before and after each variant: short, then plenty)
    monkeypatch.setattr(sim_cmd, "_memory_left", lambda: next(left))
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or real_collect(*a))
    args = ["simulate", "example:mlp", "--spec", "h100", "--json"]
    code, out, err = run_cli(args + ["--compare", "devices=1,2"], capsys)
    assert code == 0, err
    assert collected == [1]  # after the first variant only
    real_collect()
    assert [r() for r in sims] == [None, None]
    monkeypatch.undo()
    rows = json.loads(out)
    for k, row in zip((1, 2), rows):
        code, alone, err = run_cli(args + ["--devices", str(k), "--slack", "0"], capsys)
        assert code == 0, err
        alone = json.loads(alone)
        for key in ("wall_ns", "engine_done_ns", "memory", "samples", "cost_sources"):
            assert row[key] == alone[key], key
        assert row["summary"]["critical_path_ns"] == alone["summary"]["critical_path_ns"]


@pytest.mark.parametrize("args, slack", [([], 5), (["--no-summary"], 0), (["--no-summary", "--json"], 5),
                                         (["--slack", "2"], 2), (["--no-summary", "--slack", "2"], 0)])
def test_cli_simulate_computes_slack_only_where_it_is_shown(monkeypatch, capsys, args, slack):
    """The what-ifs re-simulate the graph: with --no-summary alone nothing shows them, so none is run."""
    from autograd_run.sim import session
    from tests.builders import run_cli
    seen = []
    real = session._slack
    monkeypatch.setattr(session, "_slack", lambda *a, **kw: seen.append(a[-2].slack_top) or real(*a, **kw))
    code, out, err = run_cli(["simulate", "example:mlp", "--spec", "h100", *args], capsys)
    assert code == 0, err
    assert seen == ([slack] if slack else [])
    if slack and "--json" in args:
        assert len(json.loads(out)["slack"]) == slack


def test_a_machine_spec_file_is_read_as_untrusted_data(tmp_path):
    """Spec files go through the same reader as graph files: regular files only, bounded YAML, duplicate keys."""
    import os
    from autograd_run.errors import RequestError
    from autograd_run.sim.specs import load_spec
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
                              for p, c in zip("abcdefg", "bcdefgh")))
    with pytest.raises(RequestError, match="aliases expand to more than"):
        load_spec(str(bomb))
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: x\nname: y\n")
    with pytest.raises(RequestError, match=r"line 2, column 1\): duplicate key 'name'"):
        load_spec(str(dup))
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(RequestError):  # refused, not blocked on
        load_spec(str(tmp_path / "pipe.json"))
    dated = tmp_path / "dated.yaml"  # YAML reads 2001-01-01 as a date: quoted as written (was datetime.date(...))
    dated.write_text("name: x\nhost: {peak_flops: {float32: 1e12}, mem_bw: 2001-01-01}\n"
                     "accelerator: {peak_flops: {float32: 1e12}}\n")
    with pytest.raises(RequestError, match=r"host: mem_bw must be a number from 1e\+06 to 1e\+21, got 2001-01-01 "
                                           r"\(a date\)$"):
        load_spec(str(dated))
    jdup = tmp_path / "dup.json"  # JSON keeps the last value silently: refused as YAML's are
    jdup.write_text('{"name": "x", "engine": {"node_overhead_us": 999999, "node_overhead_us": 2.0}}')
    with pytest.raises(RequestError, match=r"dup.json: duplicate key 'node_overhead_us' in an object"):
        load_spec(str(jdup))


def test_a_broken_calibration_is_said_to_be_the_default_not_a_spec_given(tmp_path, monkeypatch, capsys):
    """An empty or corrupt local spec made every plain `simulate` fail with "Error: --spec: ..." though no --spec
    was given; a folder there was passed over for h100 silently (a hostile review)."""
    import os
    from builders import run_cli
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = tmp_path / "autograd-run" / "local-spec.json"
    os.makedirs(kept.parent)
    kept.write_text("")
    code, out, err = run_cli(["simulate", "example:seed", "--no-summary"], capsys)
    assert code == 2 and err.startswith(f"Error: the calibration kept at {kept} (the default spec) cannot be used: "
                                        "not a valid spec file") and err.rstrip().endswith(
        "run `autograd-run calibrate` again, or give --spec"), err
    kept.unlink()
    kept.mkdir()
    code, out, err = run_cli(["simulate", "example:seed", "--no-summary"], capsys)
    assert code == 2 and err == (f"Error: the calibration kept at {kept} (the default spec) cannot be used: not a "
                                 "regular file (a folder, a device or a FIFO); run `autograd-run calibrate` again, "
                                 "or give --spec\n"), err
    assert run_cli(["simulate", "example:seed", "--no-summary", "--spec", "h100"], capsys)[0] == 0


def test_costs_from_a_simulations_trace_are_said_to_be_simulated(tmp_path, capsys):
    """A simulation's Chrome trace given as --costs read as "13 nodes measured" and, on another spec, warned that the
    costs were "measured by autograd-run's engine on this CPU" (a hostile review): they are the spec's."""
    from builders import run_cli
    from autograd_run.costs.measured import load_costs
    from autograd_run.graphs.load import load_graph
    g = load_graph("example:mlp")
    sim, ran = tmp_path / "sim.json", tmp_path / "run.json"
    assert run_cli(["simulate", "example:mlp", "--trace", str(sim), "--no-summary"], capsys)[0] == 0
    assert run_cli(["example:mlp", "--trace", str(ran), "--no-summary"], capsys)[0] == 0
    from_sim, from_run = load_costs(str(sim), g), load_costs(str(ran), g)
    assert from_sim.simulated and not from_run.simulated
    assert from_sim.describe().startswith(f"13 nodes' simulated times (autograd-run trace of a simulation, {sim}")
    assert from_run.describe().startswith(f"13 nodes measured (autograd-run trace, {ran}")
    code, out, err = run_cli(["simulate", "example:mlp", "--costs", str(sim), "--spec", "h100", "--no-summary"], capsys)
    assert code == 0 and "measured by autograd-run" not in err, err


def _h100_with(change):
    from importlib import resources
    d = json.loads(resources.files("autograd_run.sim").joinpath("specs", "h100.json").read_text())
    change(d)
    return d


@pytest.mark.parametrize("change, message", [
    (lambda d: d["accelerator"].update(bw_efficiency=0), "accelerator: bw_efficiency must be a number from 0.001 to 1"),
    (lambda d: d["engine"].update(handoff_us=1e308), "engine: handoff_us must be a number from 0 to 1e+09"),
    (lambda d: d["host"].update(mem_bw=float("inf")), "host: mem_bw must be a number from 1e+06 to 1e+21"),
    (lambda d: d["accelerator"].update(mem_bw=1e-300), "accelerator: mem_bw must be a number from 1e+06 to 1e+21"),
    (lambda d: d["accelerator"].update(link_bw=1e-300), "accelerator: link_bw must be 0 (no such link) or at least"),
    (lambda d: d["accelerator"].update(peak_flops={"float32": 1e-300}), "accelerator: peak_flops maps dtypes to"),
    (lambda d: d["host"].update(flops_efficiency=2), "host: flops_efficiency must be a number from 0.001 to 1"),
    # a tiny efficiency made an infinite cost (an OverflowError in the roofline), a memory bandwidth of 0 an
    # infinite bandwidth, and a device without float32's FLOP/s ran every op at 1e9 FLOP/s (a hostile review)
    (lambda d: d["accelerator"].update(bw_efficiency=1e-320),
     "accelerator: bw_efficiency must be a number from 0.001 to 1, got 1e-320"),
    (lambda d: d["accelerator"].update(flops_efficiency=1e-320),
     "accelerator: flops_efficiency must be a number from 0.001 to 1, got 1e-320"),
    (lambda d: d["accelerator"].update(mem_bw=0), "accelerator: mem_bw must be a number from 1e+06 to 1e+21, got 0"),
    (lambda d: d["accelerator"].update(peak_flops={}), "accelerator: peak_flops must give float32's FLOP/s"),
    (lambda d: d["accelerator"].pop("peak_flops"), "accelerator: peak_flops must give float32's FLOP/s"),
    (lambda d: d["host"].update(peak_flops={"float64": 1e9}), "host: peak_flops must give float32's FLOP/s"),
    (lambda d: d["accelerator"].update(peak_flops={"float32": 1}), "accelerator: peak_flops maps dtypes to FLOP/s "
     "from 1e+06 to 1e+21"),
    (lambda d: d.pop("accelerator"), "a spec needs 'accelerator'"),
    (lambda d: d.update(nodes=[]), "unknown field 'nodes'"),
    (lambda d: d["engine"].update(spread={"handoff_us": -1}), "engine: spread maps the names of the figures"),
    (lambda d: d["engine"].update(spread={"nodes": 0.1}), "engine: spread maps the names of the figures"),
    (lambda d: d["engine"].update(spread=[0.1]), "engine: spread maps the names of the figures"),
    # a bool is an int to Python: false passed every range check and divided by zero (a hostile review)
    (lambda d: d["accelerator"].update(flops_efficiency=False), "accelerator: flops_efficiency must be a number"),
    (lambda d: d["engine"].update(overhead_holds_gil=3), "engine: overhead_holds_gil must be true or false"),
    # the value and the dtype named; a name or source that is not a string (was taken as str() of it)
    (lambda d: d["accelerator"]["peak_flops"].update(bfloat16="fast"), "accelerator: peak_flops maps dtypes to "
     "FLOP/s from 1e+06 to 1e+21, got 'fast' for 'bfloat16'"),
    (lambda d: d.update(name=7), "name must be a string of at most 200 characters, got 7"),
    (lambda d: d.update(source=["x"]), "source must be a string of at most 2000 characters, got ['x']"),
    # a name of 500,000 characters was 1.5 MB of summary; a dtype typo took float32's figure (a hostile review)
    (lambda d: d.update(name="n" * 500_000), "name must be a string of at most 200 characters, got 'nnnn"),
    (lambda d: d["accelerator"]["peak_flops"].update(flaot16=1e12), "accelerator: peak_flops: unknown dtype "
     "'flaot16' (dtypes: float16, bfloat16, float32"),
    # a device's name of another type was a traceback in the Kineto trace's writer (a hostile review)
    (lambda d: d["accelerator"].update(name={"a": [1]}),
     "accelerator: name must be a string of at most 200 characters, got {'a': [1]}"),
    (lambda d: d["host"].update(name=12), "host: name must be a string of at most 200 characters, got 12"),
])
def test_a_spec_file_that_would_break_the_simulation_is_refused(tmp_path, capsys, change, message):
    """A zero efficiency was a ZeroDivisionError traceback, a 1e308 us hand-off an OverflowError one, and a
    graph file or a run's JSON summary passed for a spec (every field defaulted)."""
    from builders import run_cli
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_h100_with(change)))
    code, out, err = run_cli(["simulate", "example:pipeline", "--spec", str(path)], capsys)
    assert (code, out) == (2, "") and err.startswith(f"Error: --spec: {path}: {message}"), err


def test_a_graph_file_is_not_a_spec(capsys):
    import os
    from builders import run_cli
    from cli_proc import ROOT
    seed = os.path.join(ROOT, "autograd_run", "graphs", "examples", "seed.yaml")
    code, out, err = run_cli(["simulate", "example:seed", "--spec", seed], capsys)
    assert code == 2 and "unknown field 'format'" in err


def test_waiting_cost_nodes_take_the_calibrated_wake_up_on_top_of_their_time():
    """``wait_overhead_us`` (measured by calibrate: a sleeping worker wakes late and runs cold) is added
    to each cost node that waits without the GIL, not to spinning ones; the shipped specs have none."""
    from autograd_run.sim.calibrate import _chain_doc
    from autograd_run.sim.specs import load_spec
    g = loads_graph(dumps(_chain_doc(10, ["cuda:0"], 100), "json"), "w.json")
    base = load_spec("h100")
    assert base.engine.wait_overhead_us == 0
    import dataclasses
    slow = dataclasses.replace(base, engine=dataclasses.replace(base.engine, wait_overhead_us=50.0))
    t0 = simulate_session(g, SimOptions(spec=base, slack_top=0)).wall_ns
    t1 = simulate_session(g, SimOptions(spec=slow, slack_top=0)).wall_ns
    assert t1 - t0 == 10 * 50_000
    spun = _chain_doc(10, ["cuda:0"], 100)
    for n in spun["nodes"]:
        if n.get("op") == "cost":
            n["attrs"]["cost"]["mode"] = "spin"
    g = loads_graph(dumps(spun, "json"), "s.json")
    assert simulate_session(g, SimOptions(spec=slow, slack_top=0)).wall_ns == \
        simulate_session(g, SimOptions(spec=base, slack_top=0)).wall_ns


def test_calibration_rounds_end_when_their_medians_settle():
    """At least three rounds; then the rounds go on while a new round moves a median by more than 3% (and
    more than 0.5 us); a spread-out machine gets its medians, not its last round."""
    from autograd_run.sim.calibrate import MAX_ROUNDS, settled

    def rounds(*handoffs):
        return [{"node_overhead_us": 2.0, "handoff_us": h, "wait_overhead_us": 40.0} for h in handoffs]
    assert not settled(rounds(50, 50))  # too few
    assert settled(rounds(50, 50, 50))
    assert settled(rounds(50, 52, 90))  # an outlier round does not move the median: median 52 before and after
    assert not settled(rounds(50, 60, 70))  # 55 -> 60
    assert settled(rounds(50, 60, 70, 60))  # 60 -> 60
    tiny = [{"node_overhead_us": x, "handoff_us": 50.0, "wait_overhead_us": 40.0} for x in (1.0, 1.4, 1.2)]
    assert settled(tiny)  # 1.2 -> 1.2: sub-microsecond changes are within the absolute tolerance
    assert MAX_ROUNDS >= 3


#: The engine figures a calibration round measures besides the three these tests vary.
MORE_FIGURES = {"device_overhead_us": 4.0, "cost_node_us": 5.0, "accumulate_us": 3.0, "device_handoff_us": 30.0,
                "call_overhead_us": 12.0, "gil_probe_us": 3000.0}


def test_calibrate_keeps_the_median_of_its_rounds_and_their_spread(monkeypatch):
    """The spec gets the medians over the rounds and how far the rounds lay apart; it is read back."""
    import autograd_run.sim.calibrate as cal
    from autograd_run.sim.specs import MachineSpec
    seq = iter([{"node_overhead_us": 2.0, "handoff_us": h, "wait_overhead_us": w, **MORE_FIGURES}
                for h, w in ((40, 30), (60, 50), (50, 40), (50, 40), (50, 40), (50, 40), (50, 40), (50, 40))])
    monkeypatch.setattr(cal, "_engine_round", lambda nodes, repeat: next(seq))
    monkeypatch.setattr(cal.first_pass, "measure", lambda: {"first_pass_us": 120.0, "first_pass_device_us": 250.0})
    lines = []
    spec = cal.calibrate(nodes=10, log=lines.append)
    assert (spec.engine.first_pass_us, spec.engine.first_pass_device_us) == (120.0, 250.0)
    assert (spec.engine.handoff_us, spec.engine.wait_overhead_us) == (50.0, 40.0)
    assert spec.engine.spread == {"node_overhead_us": 0.0, "handoff_us": 0.4, "wait_overhead_us": 0.5,
                                  **{("gil_handoff_us" if k == "gil_probe_us" else k): 0.0 for k in MORE_FIGURES}}
    assert (spec.engine.device_overhead_us, spec.engine.cost_node_us, spec.engine.accumulate_us,
            spec.engine.device_handoff_us, spec.engine.call_overhead_us) == (4.0, 5.0, 3.0, 30.0, 12.0)
    assert spec.engine.wait_spin_us == 150.0 and spec.host.cores >= 1
    assert len(lines) == 3 and lines[0].startswith("round 1: node_overhead_us 2.00, handoff_us 40.00")
    assert MachineSpec.from_dict(spec.to_dict()).engine == spec.engine


def test_calibrate_warns_when_its_rounds_never_settle(monkeypatch):
    import itertools
    import autograd_run.sim.calibrate as cal
    seq = itertools.cycle([{"node_overhead_us": 2.0, "handoff_us": h, "wait_overhead_us": 40.0, **MORE_FIGURES}
                           for h in (20, 90, 40, 160, 60, 200, 30, 300)])
    monkeypatch.setattr(cal, "_engine_round", lambda nodes, repeat: next(seq))
    monkeypatch.setattr(cal.first_pass, "measure", lambda: {"first_pass_us": 120.0, "first_pass_device_us": 250.0})
    lines = []
    spec = cal.calibrate(nodes=10, log=lines.append)
    assert len(lines) == cal.MAX_ROUNDS + 1 and lines[-1].startswith("warning: the figures did not settle in 8 rounds")
    assert spec.engine.handoff_us == 75.0 and spec.source.endswith(", 8 rounds")


def test_a_real_calibration_reports_its_rounds_and_spread():
    """The real measurement (small chains): between 3 and MAX_ROUNDS rounds, each figure's median among
    its rounds' values, the spread their range over the median."""
    import re
    from autograd_run.sim.calibrate import MAX_ROUNDS, MIN_ROUNDS, calibrate
    logged = []
    spec = calibrate(nodes=400, repeat=3, log=logged.append)
    lines = [m for m in logged if m.startswith("round ")]
    # a busy machine may not settle: then the rounds stop at the most, with a warning
    tail = logged[len(lines):]
    assert tail == [] or (len(lines) == MAX_ROUNDS and len(tail) == 1
                          and tail[0].startswith("warning: the figures did not settle"))
    assert MIN_ROUNDS <= len(lines) <= MAX_ROUNDS
    assert spec.source.endswith(f", {len(lines)} rounds")
    # a fresh process's first pass, measured in child processes (a child that failed is a warning in the tail,
    # which fails the test above); on a loaded machine a median can come out at 0 (never below)
    assert spec.engine.first_pass_us >= 0 and spec.engine.first_pass_device_us >= 0
    seen = {k: [float(v) for v in re.findall(rf"\b{k} ([0-9.]+)", " ".join(lines))]
            for k in ("node_overhead_us", "handoff_us", "device_handoff_us", "wait_overhead_us", "call_overhead_us")}
    for k, values in seen.items():
        assert len(values) == len(lines)
        assert min(values) - 0.01 <= getattr(spec.engine, k) <= max(values) + 0.01
        mid = getattr(spec.engine, k)  # the logged values are rounded to 0.01 us
        if mid == 0:  # range over a zero median: calibrate records no spread (the figure adds nothing)
            assert spec.engine.spread[k] == 0
            continue
        # the spread is stored to 0.001 (the 0.001 * mid) and the median to 0.001 us, off by up to 0.0005:
        # with a tiny median and a wide range (0.041 us, 0 to 17.4 us in one CI run) that rounding dominates
        bound = 0.011 + 0.001 * mid + 0.0005 * spec.engine.spread[k]
        assert abs(spec.engine.spread[k] * mid - (max(values) - min(values))) < bound


def cored(cores, wait_spin=0.0, cost_node=0.0, device_overhead=0.0, accumulate=0.0):
    """``spec()`` with the host's cores and the engine figures ``calibrate`` measures for autograd-run's engine."""
    m = spec()
    m.host.cores = cores
    m.engine.wait_spin_us, m.engine.cost_node_us = wait_spin, cost_node
    m.engine.device_overhead_us, m.engine.accumulate_us = device_overhead, accumulate
    return m


def _three_waits(us):
    """R (cpu, 5 µs spin) fans out to three 100 µs waits on cuda:0..2, which join on the caller's leaf."""
    nodes = [cost("r", 5, seq=4, nxt=[("a", 0), ("b", 0), ("c", 0)])]
    for i, n in enumerate("abc"):
        nodes.append(cost(n, us, f"cuda:{i}", [("acc_x", 0)], 3 - i, mode="wait"))
    return graph(nodes + [acc("x")], [{"node": "r"}], [{"name": "x", "shape": [1]}])


@pytest.fixture(params=["compiled", "python"])
def event_loop(request, monkeypatch):
    """Each cores test on both event loops: ``_core.sim_loop`` (which must then be the one that runs) and the
    scheduler's Python methods (``sim_loop`` taken away)."""
    from autograd_run.engine import core
    if request.param == "python":
        monkeypatch.setattr(core, "sim_loop", None)
        yield
        return
    if core.sim_loop is None:
        pytest.skip("the compiled core is not built")
    calls = []
    real = core.sim_loop
    monkeypatch.setattr(core, "sim_loop", lambda *a: (calls.append(a[-1]), real(*a))[1])
    yield
    assert any(isinstance(free, list) for free in calls)  # the modelled cores went to the compiled loop


def test_busy_waits_share_the_hosts_cores_hand_computed(event_loop):
    """Three 100 µs waits that only spin (wait_spin 150 µs) on three device threads, two cores.

    R 0-6 on the caller (1 µs overhead + 5); the three workers woken at 16 ask for a core in turn (cores
    granted in request order): A's and B's overheads 16-17 on the two cores, C's 17-18; A's function
    17-117; B's waits for C's core, 18-118; C's waits for A's, 117-217 (a thread without a core cannot start
    its function, so its deadline starts when it gets one). With cores unlimited all three end at 117.
    """
    g = _three_waits(100)
    spans = {s.node.id: (s.start // 1000, s.end // 1000)
             for s in sim(g, machine=cored(2, wait_spin=150)).recording.slices}
    assert (spans["a"], spans["b"], spans["c"]) == ((16, 117), (16, 118), (16, 217))
    free = {s.node.id: s.end // 1000 for s in sim(g, machine=cored(0, wait_spin=150)).recording.slices}
    assert free["a"] == free["b"] == free["c"] == 117


def test_a_sleeping_wait_needs_a_core_only_for_its_tail(event_loop):
    """400 µs waits that sleep 250 µs, then spin 150: on one core the three sleeps overlap and only the
    tails queue; a wait that got its core past its deadline ends when it gets it (nothing left to spin)."""
    g = _three_waits(400)
    ends = sorted(s.end // 1000 for s in sim(g, machine=cored(1, wait_spin=150)).recording.slices
                  if s.node.id in "abc")
    # overheads 16-17, 17-18, 18-19 (one core, in turn); sleeps to 267/268/269, tails to the deadlines
    # 417, 418, 419 if each had a core: the first tail holds the core 267-417, the second gets it at 417 and
    # spins to its deadline 418, the third at 418 to 419
    assert ends == [417, 418, 419]
    assert sorted(s.end // 1000 for s in sim(g, machine=cored(0, wait_spin=150)).recording.slices
                  if s.node.id in "abc") == [417, 417, 417]


def test_a_wait_that_only_spins_does_not_wake_late():
    """wait_overhead (a sleeping worker's late wake-up) applies to a wait that sleeps, not to one shorter
    than the spin tail; a cost node's own extra and a device's own fixed cost are added to its overhead."""
    m = cored(0, wait_spin=150)
    m.engine.wait_overhead_us = 20.0
    short = graph([cost("a", 100, "cuda:0", [("acc_x", 0)], 1, mode="wait"), acc("x", "cuda:0")],
                  [{"node": "a"}], [{"name": "x", "shape": [1], "device": "cuda:0"}])
    long = graph([cost("a", 300, "cuda:0", [("acc_x", 0)], 1, mode="wait"), acc("x", "cuda:0")],
                 [{"node": "a"}], [{"name": "x", "shape": [1], "device": "cuda:0"}])
    span = lambda g, m: {s.node.id: (s.end - s.start) // 1000 for s in sim(g, machine=m).recording.slices}["a"]  # noqa: E731
    assert span(short, m) == 101 and span(long, m) == 321
    m.engine.cost_node_us, m.engine.device_overhead_us = 4.0, 3.0
    assert span(short, m) == 107  # 3 µs fixed cost on a device's thread + 4 µs of a cost node's own + 100


def test_accumulate_grad_costs_what_calibrate_measured():
    m = cored(0, accumulate=7.0)
    g = graph([cost("a", 10, nxt=[("acc_x", 0)]), acc("x")], [{"node": "a"}], [{"name": "x", "shape": [1]}])
    spans = {s.node.id: (s.end - s.start) // 1000 for s in sim(g, machine=m).recording.slices}
    assert spans["acc_x"] == 8  # 1 µs fixed cost + 7


def test_a_spec_refuses_cores_that_are_not_a_whole_number():
    from autograd_run.errors import RequestError
    doc = spec().to_dict()
    for bad in (-1, 2.5, True, "2", 1 << 20):
        doc["host"]["cores"] = bad
        with pytest.raises(RequestError, match="cores must be a whole number"):
            MachineSpec.from_dict(doc)
    doc["host"]["cores"] = 2
    assert MachineSpec.from_dict(doc).host.cores == 2


_ZERO_TIME = r"""
import json, sys, threading
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import loads_graph
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.sim.specs import load_spec
import dataclasses
spec = load_spec("h100")
spec = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, node_overhead_us=0, device_overhead_us=0,
                                                            call_overhead_us=0, handoff_us=0))
g = loads_graph(dumps(generate("chain", n=int(sys.argv[1])), "json"), "c.json")
out = {}
def go():
    r = simulate_session(g, SimOptions(spec=spec, devices=2, placement="layer", slack_top=0,
                                       scale="MulBackward0=0,AccumulateGrad=0,ToCopyBackward0=0"))
    s = r.recording.slices
    out["r"] = [len(s), sum(x.end - x.start for x in s), r.wall_ns]
threading.stack_size(512 * 1024)  # a small stack: a call nested per node would overflow it
t = threading.Thread(target=go)
t.start(); t.join()
print(json.dumps(out.get("r")))
"""


@pytest.mark.parametrize("pure", [False, True])
def test_nodes_that_take_no_time_do_not_nest_a_call_per_node(pure):
    """A spec without engine overhead and costs scaled to zero: each worker goes on to its next task once the
    event's calls return, so a 20,000-node chain on two devices neither overflows a small thread stack (the
    compiled loop) nor reaches Python's recursion limit (the twin); with no hand-off latency either, every slice and
    the call take no time."""
    import json
    import subprocess
    import sys
    env = dict(os.environ, AUTOGRAD_RUN_PURE_PYTHON="1" if pure else "0")
    proc = subprocess.run([sys.executable, "-c", _ZERO_TIME, "20000"], capture_output=True, text=True, env=env,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n, busy, wall = json.loads(proc.stdout)
    assert n > 20000 and busy == 0 and wall <= 1  # a recording of zero length spans (0, 1): result.nonempty


def test_a_sum_on_a_stream_is_the_simulators_kernel_even_where_a_subclass_overrides_it():
    """A sum of two gradients on a stream is an accelerator's shortest kernel. The default simulator does it
    inline (``streams._Accumulate``); a subclass overriding ``kernel`` is called for it instead, and giving
    back the default's result, sees the same timeline."""
    from autograd_run.sim.placement import place
    from autograd_run.sim.scheduler import Simulator
    from autograd_run.sim.specs import load_spec
    from autograd_run.sim.streams import SimStreams

    spec = load_spec("h100")
    graph = place(loads_graph(dumps(generate("random", nodes=400, leaves=20, seed=3), "json"), "r.json"), 2,
                  "round-robin", CostResolver(spec))
    sums = []

    class Counting(Simulator):
        def kernel(self, stream, node, ns, not_before=None):
            if node is None:
                sums.append(ns)
            return super().kernel(stream, node, ns, not_before)

    entered = []

    class CountingStreams(SimStreams):
        def on_stream(self, stream):
            entered.append(stream)
            return super().on_stream(stream)

    class Unsaid:  # streams that do not say whether their sums are the default (no sums_inline): entered as ever
        def __init__(self, sim):
            self._inner = CountingStreams(sim)

        def __getattr__(self, name):
            if name == "sums_inline":
                raise AttributeError(name)
            return getattr(self._inner, name)

    runs = []
    for cls, streams in ((Simulator, None), (Counting, None), (Simulator, CountingStreams), (Simulator, Unsaid)):
        s = cls(graph, spec, CostResolver(spec), detail=False)
        if streams is not None:
            s.streams = streams(s)
        if streams is not Unsaid:
            assert s.streams.sums_inline() is (cls is Simulator and streams is None)
        s.run([r.edge for r in graph.roots], graph.input_edges() or None, True)
        runs.append(([row[1:] for row in s.slices], s.kernels, dict(s.stream_free)))  # row[0]: the call's id
    assert sums and set(sums) == {int(spec.accelerator.min_kernel_us * 1e3)}
    assert runs[0] == runs[1] == runs[2] == runs[3]
    # an on_stream of its own is entered for every sum (the compiled routing sums inline only for the default's)
    assert len(entered) == 2 * len(sums)


def _alternating_chain(n: int, devices: list[str]) -> dict:
    """calibrate's chain of identity nodes, round-robin over ``devices``: every node a hand-off."""
    from autograd_run.sim.calibrate import _chain_doc
    return _chain_doc(n, devices)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_hand_off_between_two_devices_costs_device_handoff_us(compiled, monkeypatch):
    """Each push from one device's worker onto the other's idle queue is woken ``device_handoff_us`` later; the
    caller's hand-offs (the root's push, the completion) keep ``handoff_us``. Hand-computed: n nodes alternating
    between cuda:0 and cuda:1, then the leaf's AccumulateGrad on the next device, make n device-to-device
    hand-offs; a chain between the caller and a device makes none."""
    import dataclasses
    from autograd_run.engine import core
    from autograd_run.sim.specs import load_spec
    if not compiled:
        monkeypatch.setattr(core, "sim_loop", None)
    elif core.sim_loop is None:
        pytest.skip("the compiled core is not built")
    base = load_spec("h100")

    def wall(doc, device_handoff_us):
        spec = dataclasses.replace(base, engine=dataclasses.replace(base.engine, handoff_us=20.0,
                                                                    device_handoff_us=device_handoff_us))
        g = loads_graph(dumps(doc, "json"), "c.json")
        return simulate_session(g, SimOptions(spec=spec, slack_top=0)).wall_ns
    n = 9
    devices = _alternating_chain(n, ["cuda:0", "cuda:1"])
    assert wall(devices, 0.0) == wall(devices, 20.0)  # 0: the same as handoff_us
    assert wall(devices, 35.0) - wall(devices, 20.0) == n * 15_000
    caller = _alternating_chain(n, ["cpu", "cuda:0"])
    assert wall(caller, 35.0) == wall(caller, 20.0)


def test_the_default_what_ifs_are_left_out_of_a_big_graph_that_would_simulate_each(monkeypatch, capsys):
    """``--slack`` not given: above ``SLACK_AUTO_NODES`` nodes the what-ifs that are a whole simulation each
    are left out (said in the summary and in --json, with one simulation's time); one CPU worker's are
    arithmetic and stay; ``--slack N`` asks for them at any size."""
    from builders import run_cli
    from autograd_run.sim import session
    g = loads_graph(dumps(generate("chain", n=30), "json"), "c.json")
    small = simulate_session(g, SimOptions(spec="h100", devices=2, placement="layer", slack_top=None))
    assert len(small.slack) == session.SLACK_TOP and small.slack_skipped is None
    monkeypatch.setattr(session, "SLACK_AUTO_NODES", 10)
    big = simulate_session(g, SimOptions(spec="h100", devices=2, placement="layer", slack_top=None))
    assert big.slack == [] and big.slack_skipped[0] == session.SLACK_TOP and big.slack_skipped[1] > 0
    cpu = simulate_session(g, SimOptions(spec="h100", slack_top=None))  # one CPU worker: no simulation again
    assert cpu.sim.cpu_only_one_worker and len(cpu.slack) == session.SLACK_TOP and cpu.slack_skipped is None
    asked = simulate_session(g, SimOptions(spec="h100", devices=2, placement="layer", slack_top=3))
    assert [s.saved_ns for s in asked.slack] == [s.saved_ns for s in small.slack[:3]]
    path = "example:mlp"
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--devices", "2"], capsys)
    assert code == 0 and "what-ifs: not simulated by default for a graph of" in out.replace("\n", " ")
    assert "--slack 5 runs them" in out.replace("\n", " ")
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--devices", "2", "--json"], capsys)
    doc = json.loads(out)
    assert doc["slack"] == [] and doc["slack_skipped"]["count"] == 5 and doc["slack_skipped"]["simulation_s"] >= 0
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--devices", "2", "--json", "--slack", "2"], capsys)
    doc = json.loads(out)
    assert len(doc["slack"]) == 2 and doc["slack_skipped"] is None


def test_calibrate_measures_what_a_calls_recorded_span_holds_beyond_its_node():
    """``call_overhead_us``: from a call's recorded start to its one node and from that node to the call's end,
    as ``run`` records it; a simulation charges it once per call, so a one-node graph on the CPU simulated
    with it lasts what the recording shows, and a ten-node one only that much longer than without it."""
    from autograd_run.sim.calibrate import SHORT_WAIT_US, _call_us, _chain_doc
    from autograd_run.sim.specs import default_spec
    call = _call_us(9)
    assert 0.5 < call < 5000  # the engine's set-up and completion: microseconds, not nothing, not a stall
    g = loads_graph(dumps(_chain_doc(10, ["cpu"], SHORT_WAIT_US), "json"), "c.json")
    import dataclasses
    base = default_spec()
    with_call = dataclasses.replace(base, engine=dataclasses.replace(base.engine, call_overhead_us=call))
    a = simulate_session(g, SimOptions(spec=base, slack_top=0)).wall_ns
    b = simulate_session(g, SimOptions(spec=with_call, slack_top=0)).wall_ns
    assert b - a == int(call * 1e3)


def test_calibrate_fits_the_gil_hand_over_to_its_probe():
    """``gil_handoff_us`` is fitted so that the simulation of the GIL probe (four device threads running short
    wait nodes at once) lasts what the probe was measured to: the simulated wall grows with it, the fit lands
    on a measured wall the simulation can reach, and stays within 0 and four hand-offs otherwise."""
    import dataclasses
    from autograd_run.sim.calibrate import _fit_gil_handoff, _gil_probe_doc
    from autograd_run.sim.specs import default_spec
    base = default_spec()
    base = dataclasses.replace(base, engine=dataclasses.replace(base.engine, handoff_us=40.0, overhead_holds_gil=True,
                                                                 device_overhead_us=3.0, cost_node_us=3.0))
    g = loads_graph(dumps(_gil_probe_doc(), "json"), "p.json")

    def wall(h):
        s = dataclasses.replace(base, engine=dataclasses.replace(base.engine, gil_handoff_us=h))
        return simulate_session(g, SimOptions(spec=s, slack_top=0)).wall_ns / 1e3
    w5, w20 = wall(5.0), wall(20.0)
    assert w20 > w5  # the GIL hand-over is on the probe's path
    assert abs(_fit_gil_handoff(base, w20) - 20.0) < 0.5
    assert _fit_gil_handoff(base, 0.0) == 0.0 and _fit_gil_handoff(base, 1e9) == 160.0


def test_cost_nodes_alike_share_one_cost_and_only_those():
    """``CostResolver`` costs a cost node once per kind (its ``attrs.cost`` fields, CPU or not, name and device
    for ``--scale``): every node of a random graph of cost nodes gets what a resolver of its own gives it, nodes
    alike get the same object, and nodes that differ in any one of those fields are costed apart (seed printed)."""
    import random
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    nodes = []
    for i in range(300):
        c = rnd.choice([{"us": rnd.choice([5, 5.0, 40, 400])}, {"flops": rnd.choice([1e6, 3e9])},
                        {"us": rnd.choice([100, 300]), "mode": rnd.choice(["wait", "sleep", "spin"])},
                        {"flops": 2e9, "mode": "matmul"}])
        n = cost(f"n{i}", 1, rnd.choice(["cpu", "cuda:0", "cuda:1"]), [("acc_x", 0)], i + 1)
        n["attrs"]["cost"] = c
        n["name"] = rnd.choice(["A", "B"])
        nodes.append(n)
    g = graph(nodes + [acc("x")], [{"node": n["id"]} for n in nodes], [{"name": "x", "shape": [1]}])
    m = cored(2, wait_spin=150)
    m.engine.wait_overhead_us = 20.0
    scale = {"A": 0.5, "cuda:1": 3.0}
    shared = CostResolver(m, scale=scale)
    seen: dict = {}
    for node in g.nodes[:-1]:
        alone = CostResolver(m, scale=scale)(node)
        got = shared(node)
        assert got == alone, node.id
        c = node.attrs["cost"]
        kind = (float(c.get("us", -1)), c.get("flops"), c.get("mode"), str(node.device), node.name)
        assert seen.setdefault(kind, got) is got  # alike: the one cost
    assert len({id(c) for c in shared.resolved.values()}) == len(seen)  # and only those
    # the compiled lookup (costs_of, and the event loops' lookup_cost) reads the same memo: the resolver is
    # called once per kind, and every node gets the kind's cost
    from autograd_run.engine import core
    calls = []
    real = CostResolver._resolve

    def counted(self, node):
        calls.append(node)
        return real(self, node)
    fresh = CostResolver(m, scale=scale)
    try:
        CostResolver._resolve = counted
        got = fresh.many(g.nodes[:-1])
    finally:
        CostResolver._resolve = real
    assert got == [CostResolver(m, scale=scale)(n) for n in g.nodes[:-1]]
    assert len(calls) == (len(seen) if core.costs_of is not None else len(g.nodes) - 1)


@pytest.mark.parametrize("loop", ["compiled", "python"])
def test_slices_are_recorded_in_the_order_they_end(loop, monkeypatch):
    """``result.last_times`` reads the run's last slice end from the last slice: on every example, on 1-3 devices
    and every policy, with nested calls (checkpoints past the depth limit, pool threads), both event loops."""
    from autograd_run.engine import core
    import itertools
    from autograd_run.graphs.load import example_names
    from autograd_run.sim.policies import POLICIES
    if loop == "python":
        monkeypatch.setattr(core, "sim_loop", None)
        monkeypatch.setattr(core, "sim_sequential", None)
    for name in example_names():
        g = load_graph(f"example:{name}")
        for k, policy in itertools.product((None, 2, 3), POLICIES):
            r = simulate_session(g, SimOptions(spec="h100", devices=k, placement="round-robin" if k else "keep",
                                               policy=policy, slack_top=0))
            ends = [s[5] for s in r.sim.slices]
            assert ends == sorted(ends) and ends, (name, k, policy)


@pytest.mark.parametrize("pure", [False, True])
def test_times_past_a_64_bit_count_are_refused_not_wrapped(tmp_path, pure):
    """Every cost is bounded, but 200 of the largest, scaled by the largest factor, add up past 2**63 ns: the
    compiled loop's sums wrapped round to a 1 ns pass; now both loops refuse it (exit 2, no traceback)."""
    from cli_proc import cli
    nodes = [{"id": "root", "name": "SumBackward0", "next": [["c0", 0]], "inputs": [{"shape": []}],
              "saved": {"self_sym_sizes": [1]}}]
    for i in range(200):
        nodes.append({"id": f"c{i}", "name": "Cost", "op": "cost", "next": [[f"c{i + 1}", 0]] if i < 199 else [],
                      "inputs": [{"shape": [1]}], "attrs": {"cost": {"us": 60e6}}})
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"format": "autograd-graph/1", "roots": [{"node": "root"}], "nodes": nodes}))
    env = {"AUTOGRAD_RUN_PURE_PYTHON": "1"} if pure else {}
    p = cli(["simulate", path, "--scale", "Cost=1000000", "--no-summary"], **env)
    assert (p.code, p.out) == (2, "")
    assert p.err == ("Error: the simulated times do not fit a 64-bit count of nanoseconds (292 years): the costs, "
                     "--scale or --network figures are out of any real range\n")
    p = cli(["simulate", path, "--scale", "Cost=1000", "--json"], **env)  # 12,000 s: fine
    assert p.code == 0, p.err
    assert json.loads(p.out)["wall_ns"] >= 200 * 60e6 * 1e3 * 1000


def test_a_finished_simulation_lets_go_of_its_dependency_tables():
    """Every count is gone when a call ends, but a dict keeps the table it grew to (10 MB for 2e5 nodes) until
    it is cleared, and the simulator keeps its tasks: each finished task's table is let go."""
    import sys
    chain = loads_graph(dumps(generate("chain", n=20000), "json"), "chain.json")
    for graph, options in ((chain, SimOptions(spec="h100", slack_top=0)),
                           (chain, SimOptions(spec="h100", devices=2, placement="layer", slack_top=0)),
                           (load_graph("example:reentrant"), SimOptions(spec="h100", slack_top=0))):
        sim = simulate_session(graph, options).sim
        assert sim.graph_tasks and all(not t.dependencies and not t.not_ready for t in sim.graph_tasks)
        assert max(sys.getsizeof(t.dependencies) for t in sim.graph_tasks) < 1000
        assert max(sys.getsizeof(t.not_ready) for t in sim.graph_tasks) < 1000


def test_a_trace_of_other_nodes_is_said_to_cover_only_the_graphs(tmp_path, capsys):
    """An autograd-run trace whose node slices mostly name nodes the graph lacks was "21 nodes measured" with no
    word that 20 of them took analytic costs (a hostile review): only the graph's nodes are counted, and the
    summary says how many of the graph's nodes the trace covers."""
    from builders import run_cli
    from autograd_run.costs.measured import load_costs
    from autograd_run.graphs.load import load_graph
    trace = tmp_path / "run.json"
    assert run_cli(["example:mlp", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    doc = json.loads(trace.read_text())
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "node" and renamed < 10:
            e["name"] = "other_" + e["name"]
            if isinstance(e.get("args"), dict) and "id" in e["args"]:
                e["args"]["id"] = "other_" + e["args"]["id"]
            renamed += 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    g = load_graph("example:mlp")
    costs = load_costs(str(other), g)
    assert costs.coverage == {"matched": 3, "nodes": 13, "other": 10, "trace": True}
    assert costs.describe().startswith("3 nodes measured")
    code, out, err = run_cli(["simulate", "example:mlp", "--costs", str(other)], capsys)
    assert code == 0
    assert "3 of 13 graph nodes (the rest analytic); the trace's other 10 nodes are not this graph's" in \
        " ".join(out.split()), out


@pytest.mark.parametrize("engine", [{"node": 10**30, "device_node": 0}, "x", {"node": -1, "device_node": 0},
                                    {"node": 1.5, "device_node": 0}])
def test_a_kineto_trace_engine_figure_out_of_range_is_refused(tmp_path, capsys, engine):
    """``autogradRun.engine_ns`` (what a simulation charged a node, taken out of its spans) of 1e30 made every
    node's cost 0, and a string was ignored without a word (a hostile review): refused, with the place."""
    from builders import run_cli
    trace = tmp_path / "k.kineto.json"
    assert run_cli(["simulate", "example:mlp", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    doc = json.loads(trace.read_text())
    doc["autogradRun"]["engine_ns"] = engine
    bad = tmp_path / "bad.kineto.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run_cli(["simulate", "example:mlp", "--costs", str(bad), "--no-summary"], capsys)
    assert code == 2 and err.startswith(f"Error: --costs: {bad}: at autogradRun.engine_ns: expected"), err
