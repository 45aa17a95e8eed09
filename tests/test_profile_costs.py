"""Measured costs from PyTorch profiler traces: real traces recorded here, matched to captured graphs.

The traces come from ``torch.profiler`` in the test (``export_chrome_trace``),
always from other forward passes than the captured one, so sequence numbers
differ by an offset per step, as they do between two runs of a program.
"""

import gzip
import json
import statistics

import pytest

torch = pytest.importorskip("torch", reason="profiler traces need torch (pip install 'autograd-run[torch]')")
nn = torch.nn
F = torch.nn.functional

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.errors import GraphFileError, RequestError  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from autograd_run.sim import first_call  # noqa: E402
from autograd_run.sim.session import read_costs  # noqa: E402
from autograd_run.sim.specs import load_spec  # noqa: E402
from autograd_run.sim.session import SimOptions, simulate_session  # noqa: E402
from autograd_run.traces.torch_profile import read_torch_profile  # noqa: E402
from builders import run_cli  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]


def mlp_program():
    torch.manual_seed(0)
    # Leaves of four different shapes, so a trace with shapes can check every leaf's match.
    m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x, t = torch.randn(5, 6), torch.randint(0, 3, (5,))
    return m, lambda: F.cross_entropy(m(x), t)


def profile_steps(forward, model, path, steps=3, record_shapes=False):
    """Run ``steps`` training steps (fresh forward each) under torch.profiler with a step schedule."""
    from torch.profiler import ProfilerActivity, profile, schedule
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes,
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(steps + 1):
            model.zero_grad()
            forward().backward()
            prof.step()
    return path


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """An MLP captured to a file, then profiled for three more steps (shapes recorded, and not)."""
    folder = tmp_path_factory.mktemp("mlp")
    m, forward = mlp_program()
    path = str(folder / "mlp.json")
    from_torch(forward(), names=dict(m.named_parameters()), path=path)
    plain = profile_steps(forward, m, folder / "plain.json")
    shapes = profile_steps(forward, m, folder / "shapes.json", record_shapes=True)
    return load_graph(path), str(plain), str(shapes), folder


def raw_backward_events(path):
    return [e for e in json.load(open(path))["traceEvents"]
            if e.get("ph") == "X" and e.get("name", "").startswith("autograd::engine::evaluate_function: ")]


def test_a_real_profile_matches_every_node_in_every_step(captured):
    g, plain, _, _ = captured
    costs = read_costs(plain, g)
    cov = costs.coverage
    assert costs.from_pytorch and costs.steps == 3
    assert cov.matched == {n.id: 3 for n in g.nodes}
    assert cov.unmatched == [] and cov.trace_unmatched == {} and cov.outside == 0
    assert set(costs.nodes) == set(g.by_id)
    for s in cov.steps:
        (thread, off), = s.offsets.values()
        assert off > 0  # the profiled forwards ran after the captured one
        for nid, e in s.nodes.items():
            node = g.by_id[nid]
            assert e.name == node.name
            if e.seq is not None:
                assert e.seq == node.seq + off and e.fwd_tid == node.fwd_thread == thread
    offsets = [next(iter(s.offsets.values()))[1] for s in cov.steps]
    assert len(set(offsets)) == 3 and offsets == sorted(offsets)
    assert any("sequence offsets" in line for line in cov.alignment())


def test_leaves_matched_by_order_are_the_ones_their_shapes_say(captured):
    """AccumulateGrad runs carry no sequence number: matched by the node run before them and their place
    after it. The same trace recorded with shapes checks each leaf; the match without shapes agrees."""
    g, _, shapes, _ = captured
    with_shapes = read_costs(shapes, g).coverage
    assert with_shapes.methods["leaf shape"] == 3 * 4
    for s in with_shapes.steps:
        for nid, e in s.nodes.items():
            node = g.by_id[nid]
            if node.variable is not None:
                assert e.shapes[0] == list(g.variables[node.variable].shape)
    trace = read_torch_profile(shapes)
    for e in trace.events:
        e.shapes = None  # the same runs, as a trace without record_shapes would have them
    from autograd_run.costs.profile_match import match_profile
    from autograd_run.sim.order import predicted_order
    by_order = match_profile(g, trace, predicted_order(g)).coverage
    assert by_order.methods["leaf order"] == 3 * 4
    for a, b in zip(with_shapes.steps, by_order.steps):
        assert {k: (e.start_ns, e.thread) for k, e in a.nodes.items()} == \
               {k: (e.start_ns, e.thread) for k, e in b.nodes.items()}


def test_costs_are_the_median_over_steps_and_step_picks_one(captured):
    g, plain, _, _ = captured
    costs = read_costs(plain, g)
    raw = raw_backward_events(plain)
    for node in g.nodes:
        if node.variable is not None:
            continue
        offs = [next(iter(s.offsets.values()))[1] for s in costs.coverage.steps]
        durs = [e["dur"] * 1000 for e in raw for o in offs
                if e["args"].get("Sequence number") == node.seq + o and e["name"].endswith(node.name)]
        assert len(durs) == 3
        assert costs.nodes[node.id].cpu_ns == pytest.approx(statistics.median(durs), abs=1)
        second = read_costs(plain, g, step=2)
        assert second.nodes[node.id].cpu_ns == pytest.approx(
            next(e["dur"] * 1000 for e in raw if e["args"].get("Sequence number") == node.seq + offs[1]
                 and e["name"].endswith(node.name)), abs=1)
    with pytest.raises(RequestError, match="holds 3 backward call"):
        read_costs(plain, g, step=4)


def test_gzipped_trace_reads_the_same_and_a_gzip_bomb_is_refused(captured, tmp_path):
    g, plain, _, _ = captured
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(open(plain, "rb").read()))
    a, b = read_costs(plain, g), read_costs(str(gz), g)
    assert {k: v.cpu_ns for k, v in a.nodes.items()} == {k: v.cpu_ns for k, v in b.nodes.items()}
    bomb = tmp_path / "bomb.json"  # any name: gzip is told by its magic bytes
    bomb.write_bytes(gzip.compress(b" " * (8 << 20)))
    from autograd_run.traces.jsonfile import read_bounded
    with pytest.raises(RequestError, match="decompresses to more than the limit"):
        read_bounded(str(bomb), "costs", max_bytes=1 << 20)
    with pytest.raises(RequestError, match="file is larger than"):
        read_bounded(plain, "costs", max_bytes=100)


def test_a_profile_of_another_model_is_rejected_with_the_coverage(captured, tmp_path, capsys):
    g, _, _, folder = captured
    torch.manual_seed(1)
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten())
    x = torch.randn(2, 1, 5, 5)
    other = profile_steps(lambda: conv(x).sum(), conv, tmp_path / "conv.json", steps=2)
    with pytest.raises(RequestError) as err:
        read_costs(str(other), g)
    msg = str(err.value)
    assert "does not match" in msg and "ConvolutionBackward0" in msg and "AddmmBackward0" in msg
    code, out, errtext = run_cli(["simulate", str(folder / "mlp.json"), "--costs", str(other), "--spec", "cpu"],
                                 capsys)
    assert code == 2 and errtext.startswith("Error: --costs: ") and "does not match" in errtext
    assert "Traceback" not in errtext


def test_simulate_command_shows_the_coverage_and_uses_the_costs(captured, capsys, monkeypatch):
    g, plain, _, folder = captured
    monkeypatch.setenv("COLUMNS", "300")  # the lines hold a temporary path: at 80 columns they wrap where it ends
    code, out, err = run_cli(["simulate", str(folder / "mlp.json"), "--costs", plain, "--spec", "cpu", "--json"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cost_sources"]["measured"] == len(g.nodes)
    assert doc["measured"]["coverage"]["matched"] == len(g.nodes)
    code, out, err = run_cli(["simulate", str(folder / "mlp.json"), "--costs", plain, "--spec", "cpu",
                              "--no-summary"], capsys)
    assert code == 0 and out == ""
    code, out, err = run_cli(["simulate", str(folder / "mlp.json"), "--costs", plain, "--spec", "cpu"], capsys)
    assert "measured costs" in out and "sequence offsets" in out and "median of 3 steps" in out


def test_measured_cpu_time_is_corrected_by_the_profilers_own_time(captured):
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.specs import load_spec
    g, plain, _, _ = captured
    costs = read_costs(plain, g)
    spec = load_spec("cpu")
    spec.engine.profiler_event_us = 0.5
    model = CostResolver(spec, costs)
    for n in g.nodes:
        m = costs.nodes[n.id]
        c = model(n)
        assert c.source == "measured" and not c.holds_gil
        assert c.cpu_ns == int(max(0.0, m.cpu_ns - m.nested * 500))
    spec.engine.profiler_event_us = 0.0
    spec.engine.node_overhead_us = 1.0
    spec.engine.call_overhead_us = 7.0
    r = simulate_session(g, SimOptions(spec=spec, costs=costs, slack_top=0))
    # One CPU worker: the call, then each node's overhead and measured time, back to back.
    assert r.wall_ns == 7000 + sum(1000 + int(costs.nodes[n.id].cpu_ns) for n in g.nodes)


def test_a_trace_with_shapes_is_corrected_by_the_profilers_time_with_shapes(captured):
    """record_shapes makes every event dearer: a trace made with it has its spans corrected by the spec's figure
    with shapes, a trace made without by the plain one (both real traces of the same MLP)."""
    from autograd_run.sim.costs import CostResolver
    from autograd_run.sim.specs import load_spec
    g, plain, shapes, _ = captured
    spec = load_spec("cpu")
    spec.engine.profiler_event_us, spec.engine.profiler_event_shapes_us = 0.25, 0.75
    for path, per_event, told in ((plain, 250, False), (shapes, 750, True)):
        costs = read_costs(path, g)
        assert costs.use.shapes is told and costs.event_us(spec.engine) == per_event / 1e3
        assert costs.use.line(costs.event_us(spec.engine)).count("with record_shapes") == told
        model = CostResolver(spec, costs)
        for n in g.nodes:
            m = costs.nodes[n.id]
            assert model(n).cpu_ns == int(max(0.0, m.cpu_ns - m.nested * per_event))
    # the median of several calls, or one after the first in its trace: a session's later calls' figure (the
    # captured trace holds 3 calls in one session)
    spec.engine.profiler_event_shapes_later_us = 0.5
    several = read_costs(shapes, g)
    assert len(several.use.used) == 3 and several.use.later and several.event_us(spec.engine) == 0.5
    assert read_costs(shapes, g, step=2).event_us(spec.engine) == 0.5
    assert read_costs(shapes, g, step=1).event_us(spec.engine) == 0.75  # the trace's first call: a first call's
    assert read_costs(plain, g).event_us(spec.engine) == 0.25
    spec.engine.profiler_event_shapes_us = 0.0  # a spec without the figures: the plain one
    assert read_costs(shapes, g).event_us(spec.engine) == 0.25


def test_nodes_built_on_another_forward_thread_are_matched(tmp_path):
    """Part of the forward runs on a second thread: its nodes count on that thread's sequence numbers,
    and the trace tags them with its forward thread id."""
    import threading
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4, requires_grad=True)

    def forward():
        box = {}
        th = threading.Thread(target=lambda: box.update(h=torch.tanh(x @ w)))  # noqa: B023
        th.start()
        th.join()
        return (box["h"] * 2 + 1).sum()
    path = str(tmp_path / "threads.json")
    from_torch(forward(), names={"w": w, "x": x}, path=path)
    g = load_graph(path)
    trace = tmp_path / "trace.json"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            forward().backward()
    prof.export_chrome_trace(str(trace))
    costs = read_costs(str(trace), g)
    assert costs.coverage.matched_count == len(g.nodes) and costs.coverage.unmatched == []
    tanh = next(n for n in g.nodes if n.name == "TanhBackward0")
    threads = {s.nodes[tanh.id].fwd_tid for s in costs.coverage.steps}
    mains = {s.nodes[g.roots[0].edge.node.id].fwd_tid for s in costs.coverage.steps}
    assert threads.isdisjoint(mains)  # the tanh was built on other threads than the root


def test_capture_profile_stores_costs_that_simulate_uses_by_default(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
        "x = torch.randn(4, 8)\n"
        "def main():\n"
        "    return m(x).sum(), dict(m.named_parameters())\n")
    out_path = tmp_path / "model.json"
    kept = tmp_path / "profile.json"
    code, out, err = run_cli(["capture", f"{script}:main", "-o", str(out_path), "--profile", "--steps", "3",
                              "--warmup", "1", "--profile-trace", str(kept)], capsys)
    assert code == 0, err
    doc = json.loads(out_path.read_text())
    m = doc["meta"]["measured"]
    assert m["torch"] == torch.__version__ and m["device"].startswith("cpu") and m["date"].endswith("Z")
    assert m["steps"] == 3 and m["warmup"] == 1 and m["coverage"]["matched"] == len(doc["nodes"])
    assert set(m["nodes"]) == {n["id"] for n in doc["nodes"]}
    assert all(n["fwd_thread"] >= 1 for n in doc["nodes"] if "seq" in n)
    assert m["backward_wall_ns"]["runs"] == 3 and m["backward_wall_ns"]["median"] > 0
    # the page faults of the timed and the profiled calls (a count each: the allocator's share, docs/costs.md)
    assert m["backward_wall_ns"]["faults_median"] >= 0 and m["backward_wall_ns"]["profiled_faults_median"] >= 0
    assert "minor page faults a call" in out
    g = load_graph(str(out_path))
    r = simulate_session(g, SimOptions(spec="cpu", slack_top=0))
    assert r.cost_sources == {"measured": len(g.nodes)} and r.measured.info["torch"] == torch.__version__
    assert simulate_session(g, SimOptions(spec="cpu", costs="analytic", slack_top=0)).cost_sources.get("measured") \
        is None
    # The kept trace is a real profile of the same program: it matches too.
    assert read_costs(str(kept), g).coverage.matched_count == len(g.nodes)
    # The graph file holding costs can serve as --costs of the same graph.
    assert set(read_costs(str(out_path), g).nodes) == set(g.by_id)
    code, out, err = run_cli(["capture", f"{script}:main", "-o", str(tmp_path / "x.json"), "--steps", "3"], capsys)
    assert code == 2 and "go with --profile" in err


def test_run_costs_give_opaque_nodes_the_measured_time(tmp_path):
    """A custom autograd.Function has no rule here (captured opaque): with --costs, a replay spends the
    time PyTorch measured for it."""
    from autograd_run.capture.profile import profile_capture
    from autograd_run.session import RunOptions, run_session

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3)

        def forward(self, t):
            return torch.tanh(Scale.apply(self.conv(t)))
    torch.manual_seed(0)
    m = Net()
    x = torch.randn(1, 2, 6, 6)
    path = str(tmp_path / "deconv.json")
    doc = from_torch(m(x).sum(), names=dict(m.named_parameters()), path=path)
    profile_capture(path, doc, lambda: (m(x).sum(), None, None), steps=3, warmup=1)
    g = load_graph(path)
    opaque = [n for n in g.nodes if n.op.name == "opaque"]
    assert opaque
    measured = read_costs(path, g)
    for n in opaque:  # a known time, large against the machine's noise
        measured.nodes[n.id].cpu_ns = 30e6
    doc["meta"]["measured"]["nodes"][opaque[0].id]["cpu_ns"] = 30_000_000
    from autograd_run.graphs.dump import dumps
    open(path, "wb").write(dumps(doc, "json"))
    report = run_session(load_graph(path), RunOptions(costs=path, multithreading=False))
    assert report.error is None and report.measured_applied == [opaque[0].id]
    sl = next(s for s in report.recording.slices if s.node.id == opaque[0].id)
    assert sl.duration >= 30e6 * 0.95
    plain = run_session(load_graph(path), RunOptions(multithreading=False))
    assert next(s for s in plain.recording.slices if s.node.id == opaque[0].id).duration < 30e6 * 0.5
    # a time past the limit a file's attrs.cost has is refused before the run waits for it (a review's 300 s)
    doc["meta"]["measured"]["nodes"][opaque[0].id]["cpu_ns"] = 300_000_000_000
    open(path, "wb").write(dumps(doc, "json"))
    with pytest.raises(RequestError, match=rf"node {opaque[0].id!r} took 300 s there, more than the 60 s"):
        run_session(load_graph(path), RunOptions(costs=path, multithreading=False))


def test_bad_costs_files_are_clear_errors(tmp_path, captured, capsys):
    g, plain, _, folder = captured
    cases = {"x.json": b"{not json", "y.json": b'{"hello": 1}', "z.json": b'[{"ph": "X", "ts": "soon"}]',
             "deep.json": b'{"traceEvents": [{"args": {"a": ' + b"[" * 50000 + b"]" * 50000 + b"}}]}"}
    expect = {"x.json": "not valid JSON", "y.json": "no traceEvents",
              "z.json": r"Expected `float`, got `str` - at `\$\[0\]\.ts`",
              "deep.json": "nested too deeply"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(RequestError, match=expect[name]):
            read_costs(str(tmp_path / name), g)
    with pytest.raises(RequestError, match="no such file"):
        read_costs(str(tmp_path / "missing.json"), g)
    # a complete event without its duration was read as taking no time: the prediction 6x short, every node
    # "measured" (a hostile review); a negative one was dropped, and the profile said to be another model's
    doc = json.load(open(plain))
    first = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("name", "").startswith(
        "autograd::engine::evaluate_function: "))
    for value in (7.5, True, "seven", [3]):  # read as no number, then "a profile of another model?" (a review)
        bad = json.loads(json.dumps(doc))
        bad["traceEvents"][first]["args"]["Sequence number"] = value
        (tmp_path / "seq.json").write_text(json.dumps(bad))
        with pytest.raises(RequestError, match=r"seq.json: the event 'autograd::engine::evaluate_function: .* us: "
                                               r"'Sequence number' must be an integer, got"):
            read_costs(str(tmp_path / "seq.json"), g)
    for change, what in ((lambda e: e.pop("dur"), "needs a duration ('dur') of at least 0 microseconds, got none"),
                         (lambda e: e.update(dur=-3), "needs a duration ('dur') of at least 0 microseconds, got -3"),
                         (lambda e: e.pop("ts"), "needs its start ('ts'), got none")):
        bad = json.loads(json.dumps(doc))
        change(bad["traceEvents"][first])
        (tmp_path / "nodur.json").write_text(json.dumps(bad))
        with pytest.raises(RequestError) as info:
            read_costs(str(tmp_path / "nodur.json"), g)
        assert f"nodur.json: at $.traceEvents[{first}] ('autograd::engine::evaluate_function: " in str(info.value)
        assert f"a complete event ('ph': 'X') {what}" in str(info.value)
    code, out, err = run_cli(["simulate", str(folder / "mlp.json"), "--costs", str(tmp_path / "x.json")], capsys)
    assert code == 2 and err.startswith("Error: --costs: ") and "Traceback" not in err
    # Measured costs stored in a graph file are checked where they are used.
    from autograd_run.graphs.dump import graph_to_dict
    bad = graph_to_dict(load_graph("example:seed"))
    bad["meta"] = {"measured": {"nodes": {"mul_b": {"cpu_ns": -5}}}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(GraphFileError, match=r"meta.measured.nodes\['mul_b'\].cpu_ns: expected a non-negative"):
        simulate_session(load_graph(str(tmp_path / "bad.json")), SimOptions(spec="cpu"))
    bad["meta"] = {"measured": {"nodes": {"nope": {"cpu_ns": 5}}}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(GraphFileError, match="no node 'nope'"):
        simulate_session(load_graph(str(tmp_path / "bad.json")), SimOptions(spec="cpu"))


def _chain_profiled_again(tmp_path, muls: int, calls: int):
    """A chain of ``muls`` MulBackward0 captured, then its retained graph's backward run ``calls`` times under
    the profiler (no ProfilerStep): the graph and the trace's path."""
    x = torch.randn(4, requires_grad=True)
    y = x
    for _ in range(muls):
        y = y * 1.5
    path = str(tmp_path / "chain.json")
    from_torch([y], grad_outputs=[torch.ones(4)], names={"x": x}, path=path)
    trace = tmp_path / "t.json"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            y.backward(torch.ones(4), retain_graph=True)
    prof.export_chrome_trace(str(trace))
    return load_graph(path), trace


def test_the_same_graph_run_again_and_a_root_whose_name_recurs(tmp_path):
    """Backward of one retained graph three times: the same sequence numbers in every call (offset 0).
    The graph's root is a MulBackward0 like every node of the chain: later runs of the name in the
    same call are not taken for new calls."""
    g, trace = _chain_profiled_again(tmp_path, 6, 3)
    cov = read_costs(str(trace), g).coverage
    assert len(cov.steps) == 3 and cov.matched == {n.id: 3 for n in g.nodes}
    assert {off for s in cov.steps for _, off in s.offsets.values()} == {0}
    assert cov.outside == 0 and cov.trace_unmatched == {}


def test_a_node_more_in_the_profiled_run_is_aligned_by_order(tmp_path):
    """The profiled program builds one node more mid-graph (a run of a slightly different program): nodes
    built after it shift by one more, the ones before are matched by relative order, and the extra run
    is reported."""
    torch.manual_seed(0)
    x, w1, w2 = (torch.randn(*s, requires_grad=True) for s in ((3, 4), (4, 5), (5, 2)))
    path = str(tmp_path / "g.json")
    from_torch((torch.tanh(x @ w1) @ w2).relu().sum(), names={"x": x, "w1": w1, "w2": w2}, path=path)
    g = load_graph(path)
    trace = tmp_path / "t.json"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            ((torch.tanh(x @ w1) * 1.0) @ w2).relu().sum().backward()
    prof.export_chrome_trace(str(trace))
    cov = read_costs(str(trace), g).coverage
    assert cov.matched == {n.id: 2 for n in g.nodes}
    assert cov.methods["order"] == 2 * 2  # TanhBackward0 and the first MmBackward0, in each call
    assert cov.trace_unmatched == {"MulBackward0": (2, "not in the graph")}


def test_other_work_in_the_profile_is_counted_outside_the_calls(captured, tmp_path):
    g, _, _, _ = captured
    m, forward = mlp_program()
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh())
    x = torch.randn(1, 1, 5, 5)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward().backward()
        conv(x).sum().backward()  # another model's backward right after
    trace = tmp_path / "t.json"
    prof.export_chrome_trace(str(trace))
    cov = read_costs(str(trace), g).coverage
    assert cov.matched_count == len(g.nodes) and len(cov.steps) == 1 and cov.trace_unmatched == {}
    others = [e for e in read_torch_profile(str(trace)).events if e.name in ("ConvolutionBackward0", "TanhBackward0",
                                                                             "SumBackward0")]
    assert cov.outside == len(others) + 2  # and the conv's two leaves


def test_pytorch_costs_default_to_the_local_torch_spec(captured, tmp_path, monkeypatch):
    """With costs from a PyTorch profile, the engine around them is PyTorch's: `local-torch` when calibrated."""
    from autograd_run.sim.calibrate import write_local
    from autograd_run.sim.calibrate_torch import measure_engine
    from autograd_run.sim.specs import EngineSpec, load_spec, local_spec_path
    g, plain, _, _ = captured
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    eng = measure_engine(torch, nodes=40, reps=3, small_reps=3)
    assert eng["overhead_ns"] >= 0 and eng["call_ns"] >= 0 and eng["event_ns"] >= 0 and eng["event_shapes_ns"] >= 0
    # record_shapes' figure is measured on the three layer blocks, with shapes recorded
    assert [d["chain"] for d in eng["detail"] if d["chain"] in ("transformer", "conv", "mlp")] == \
        ["transformer", "transformer", "conv", "conv", "mlp", "mlp"]
    assert all(d["record_shapes"] and d["events"] > d["nodes"] for d in eng["detail"] if d["chain"] == "transformer")
    # each block in a session's first call and in its second
    assert sorted(d["later_call"] for d in eng["detail"] if d["chain"] == "conv") == [False, True]
    assert eng["event_shapes_later_ns"] >= 0
    spec = load_spec("cpu")
    spec.name = "local-torch"
    spec.engine = EngineSpec(node_overhead_us=eng["overhead_ns"] / 1e3, profiler_event_us=eng["event_ns"] / 1e3,
                             call_overhead_us=eng["call_ns"] / 1e3)
    with pytest.raises(RequestError, match="calibrate --torch"):
        load_spec("local-torch")
    write_local(spec, local_spec_path("local-torch"))
    assert simulate_session(g, SimOptions(costs=plain, slack_top=0)).spec.name == "local-torch"
    assert simulate_session(g, SimOptions(costs="analytic", slack_top=0)).spec.name != "local-torch"


def test_a_pytorch_profile_on_autograd_runs_engine_warns_once_with_the_fix(captured, tmp_path, monkeypatch, capsys):
    """A real torch.profiler trace simulated on `local` (autograd-run's Python engine): one line on stderr with
    the fix; on a GPU data sheet (PyTorch's engine) nothing; the held-out figure is not claimed for it."""
    from builders import run_cli
    from autograd_run.sim.calibrate import write_local
    from autograd_run.sim.specs import load_spec, local_spec_path
    g, plain, _, folder = captured
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    local = load_spec("cpu")
    local.name, local.engine.overhead_holds_gil = "local", True
    write_local(local, local_spec_path("local"))
    graph = str(folder / "mlp.json")
    code, out, err = run_cli(["simulate", graph, "--costs", plain, "--spec", "local", "--no-summary"], capsys)
    assert code == 0 and err == (f"warning: the costs in {plain} come from PyTorch's profiler, but local describes "
                                 "autograd-run's Python engine (it holds the GIL per node): for PyTorch's engine use "
                                 "`autograd-run calibrate --torch`, then --spec local-torch\n")
    code, out, err = run_cli(["simulate", graph, "--costs", plain, "--spec", "h100", "--json", "--slack", "0"],
                             capsys)
    doc = json.loads(out)
    assert code == 0 and err == "" and doc["warnings"] == []
    assert doc["expected_error"]["relative"] is None  # a CPU profile on a GPU data sheet: nothing here checked it


FRESH_PROCESS_PROFILE = r'''
import sys
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
x, t = torch.randn(5, 6), torch.randint(0, 3, (5,))
calls = int(sys.argv[2])
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(calls):  # the process's first backward, then `calls - 1` more; forward inside the profile
        m.zero_grad()
        F.cross_entropy(m(x), t).backward()
prof.export_chrome_trace(sys.argv[1])
'''


def test_a_process_first_backward_is_told_and_left_out_when_later_calls_exist(captured, tmp_path):
    """A profile made in a fresh process around its first backward: the forward's sequence numbers start at 0,
    so the call is its process's first (one-time set-up in its times). With later calls in the same trace it is
    left out of the medians; alone, the simulation says so on stderr and states a wider expected error. The one
    line on what was used names the calls and what was left out (the forward's ops)."""
    import subprocess
    import sys
    g = captured[0]
    paths = {}
    for calls in (1, 3):
        paths[calls] = str(tmp_path / f"fresh{calls}.json")
        subprocess.run([sys.executable, "-c", FRESH_PROCESS_PROFILE, paths[calls], str(calls)], check=True,
                       timeout=120)
    three = read_costs(paths[3], g)
    assert three.use.calls == 3 and three.use.used == ["backward 2", "backward 3"]
    assert three.use.left_out == ["backward 1 (the process's first backward: one-time set-up)"]
    assert not three.use.first_call and three.use.outside_ops >= 3 * 3  # 3 forwards of >= 3 top-level ops each
    line = three.use.line(0.25)
    assert line.startswith("2 of 3 backward calls (backward 2, backward 3; median per node); left out: backward 1")
    assert "top-level ops outside the backward" in line and "0.25 us x" in line
    assert "median of 2 of its 3 steps" in three.describe()
    rep = simulate_session(g, SimOptions(costs=paths[3], slack_top=0))
    assert not any("first backward" in w for w in rep.warnings)

    one = read_costs(paths[1], g)
    assert one.use.first_call and one.use.used == ["backward 1"] and one.use.left_out == []
    rep = simulate_session(g, SimOptions(costs=paths[1], spec="h100", slack_top=0))
    assert [w for w in rep.warnings if "first backward" in w] == [
        f"warning: {paths[1]} profiles its process's first backward (the forward's sequence numbers start at 0): "
        "its times hold one-time set-up (first allocations, kernel selection): 1.3-2.5x a later call's on this "
        "machine's benchmark, not taken out (`calibrate --torch` measures it); profile a later step (after one "
        "warm-up step, or with torch.profiler.schedule(wait=1, warmup=1, active=3))"]
    assert rep.first_call_taken_ns is None  # the h100 data sheet has no first-call figures
    # with them (as `calibrate --torch` measures them), the set-up is taken out, and the line says how much
    spec = load_spec("cpu")
    spec.name = "local-torch"
    spec.engine.first_call_setup_us = {"call": 1.0, "op": {"*": 0.5}, "kind": {"*": 0.25}}
    rep = simulate_session(g, SimOptions(costs=paths[1], spec=spec, slack_top=0))
    taken = rep.first_call_taken_ns
    total = sum(first_call.corrections(g, spec).values())  # (each node keeps a tenth of its span at least)
    assert 0.9 * total <= taken <= total and 1_000 < taken < 20_000
    line = [w for w in rep.warnings if "first backward" in w][0]
    assert f": {taken / 1e6:.2f} ms of it taken out as `calibrate --torch` measured it" in line
    assert rep.expected_error["basis"].startswith("held-out figure for local-torch first call, corrected")
    # The fixture's own profiles come from this long-running process (sequence numbers far from 0): not first.
    assert not read_costs(captured[1], g).use.first_call


def test_the_stated_error_depends_on_what_the_profile_holds(captured, tmp_path, monkeypatch):
    """On the calibrated local-torch spec, a profile's expected error is the held-out figure for what the trace
    holds: several calls, one call, or a process's first call (the widest)."""
    from autograd_run.sim import confidence
    from autograd_run.sim.calibrate import write_local
    from autograd_run.sim.specs import load_spec, local_spec_path
    g, plain, _, _ = captured
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = load_spec("cpu")
    spec.name = "local-torch"
    write_local(spec, local_spec_path("local-torch"))
    several = read_costs(plain, g)
    one = read_costs(plain, g, step=2)
    first = read_costs(plain, g)
    first.use.first_call = True
    got = [confidence.expected_error(spec, m) for m in (several, one, first)]
    want = [confidence.HELD_OUT[k] for k in ("local-torch", "local-torch one call", "local-torch first call")]
    assert [e["relative"] for e in got] == [w[0] for w in want]
    assert all(w[1] in e["basis"] for e, w in zip(got, want))


def test_a_folder_of_rank_profiles_pools_every_ranks_calls(captured, tmp_path, capsys):
    # a distributed profile: one PyTorch trace per rank in a folder (here two profiles of the same program)
    g, plain, shapes, _ = captured
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for k, src in enumerate((plain, shapes)):
        with open(src, "rb") as f, gzip.open(ranks / f"rank-{k}.pt.trace.json.gz", "wb") as out:
            out.write(f.read())
    (ranks / "notes.txt").write_text("not a trace")  # other files in the folder are left alone
    pooled = read_costs(str(ranks), g)
    assert pooled.steps == 6 and pooled.path == str(ranks)
    alone = [(raw_backward_events(p), read_costs(p, g)) for p in (plain, shapes)]
    for node in g.nodes:
        if node.variable is not None:
            continue
        durs = []
        for raw, one in alone:  # each rank's calls, at that profile's own sequence-number offsets
            offs = {node.seq + next(iter(s.offsets.values()))[1] for s in one.coverage.steps}
            durs += [e["dur"] * 1000 for e in raw if e["name"].endswith(node.name)
                     and e["args"].get("Sequence number") in offs]
        assert len(durs) == 6
        assert pooled.nodes[node.id].cpu_ns == pytest.approx(statistics.median(durs), abs=1)
    assert "2 ranks pooled" in pooled.use.left_out
    code, out, err = run_cli(["simulate", g.source, "--costs", str(ranks)], capsys)
    assert code == 0, err
    assert "2 ranks pooled" in " ".join(out.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RequestError, match="without trace files"):
        read_costs(str(empty), g)
    (empty / "x.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(RequestError, match="not a PyTorch profiler trace"):
        read_costs(str(empty), g)


def test_the_last_calls_leaf_is_matched_however_late_a_loaded_machine_ran_it(tmp_path):
    # A loaded machine can keep the thread from running a call's last AccumulateGrad for milliseconds after
    # its producer: the last call (no ProfilerStep to bound it) still owns the leaf run.
    g, trace = _chain_profiled_again(tmp_path, 3, 2)
    doc = json.load(open(trace))
    leaf = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    runs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == leaf]
    last = max(runs, key=lambda e: e["ts"])
    inner = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e is not last
             and last["ts"] <= e["ts"] <= last["ts"] + last["dur"]]
    for e in [last, *inner]:  # the run and what it holds, 20 ms later
        e["ts"] += 20_000
    late = tmp_path / "late.json"
    late.write_text(json.dumps(doc))
    cov = read_costs(str(late), g).coverage
    assert len(cov.steps) == 2 and cov.matched == {n.id: 2 for n in g.nodes}


@pytest.mark.parametrize("extra, where, what", [
    ({"backward_wall_ns": {"median": -5, "runs": 3}}, "backward_wall_ns.median", "non-negative number of ns"),
    ({"backward_wall_ns": {"median": 5, "runs": "[b]x"}}, "backward_wall_ns.runs", "number of runs from 1"),
    ({"backward_wall_ns": 7}, "backward_wall_ns", "expected a mapping"),
    ({"backward_wall_ns": {"median": 5, "faults_median": -1}}, "backward_wall_ns.faults_median",
     "non-negative number of page faults"),
    ({"coverage": {"matched": 1, "nodes": -2}}, "coverage.nodes", "number of nodes"),
    ({"coverage": []}, "coverage", "expected a mapping"),
])
def test_stored_measurement_figures_that_are_shown_are_checked(tmp_path, extra, where, what):
    """``meta.measured``'s wall time and coverage go into the summary: a negative wall (shown as
    "-5 ns median") was printed as it stood (found by a hostile review)."""
    from autograd_run.graphs.dump import graph_to_dict
    bad = graph_to_dict(load_graph("example:seed"))
    bad["meta"] = {"measured": {"nodes": {"mul_b": {"cpu_ns": 5}}, **extra}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(GraphFileError) as exc:
        simulate_session(load_graph(str(tmp_path / "bad.json")), SimOptions(spec="cpu"))
    assert f"meta.measured.{where}:" in str(exc.value) and what in str(exc.value), str(exc.value)


def test_the_page_faults_line_says_when_the_profiled_calls_faulted_differently():
    """capture --profile's counts in the summary's measured-costs table: a call's, and the profiled calls' only when
    they differ by more than 1,000 and half (the Mixer's 17,000 against 2,000 in docs/costs.md)."""
    from autograd_run.cli.render import _faults
    assert _faults({"median": 5}) == ""  # a file from before the counts
    assert _faults({"faults_median": 2000, "profiled_faults_median": 2400}) == ", 2,000 minor page faults a call"
    line = _faults({"faults_median": 2000, "profiled_faults_median": 17000})
    assert line.startswith(", 2,000 minor page faults a call (17,000 in the profiled calls: their node times hold")


def test_the_per_event_figure_a_trace_shows_is_checked_against_the_right_figure():
    """A node span's own time grows with its events by the profiler's plain per-event time; with record_shapes
    describing each op's inputs falls inside the op's own event, so a trace made with it is checked against the
    figure without shapes (else 7 of 10 zoo models' traces, 0.09-0.18 us against 0.53, were said to come from
    another machine)."""
    from autograd_run.costs.measured import ProfileUse
    shapes = ProfileUse(["backward 1"], 1, [], 0, 0, 100.0, False, event_us_seen=0.15, shapes=True)
    line = shapes.line(0.5, 0.2)
    assert line.endswith("; this trace's spans show 0.15 us per event outside the ops (the figure without "
                         "record_shapes)")
    assert "not the spec's figure" in shapes.line(0.5, 0.05)
    assert "spans show" not in shapes.line(0.5)  # nothing to check it against
    plain = ProfileUse(["backward 1"], 1, [], 0, 0, 100.0, False, event_us_seen=0.15)
    assert plain.line(0.2).endswith("; this trace's spans show 0.15 us per event")
    assert "not the spec's figure" in plain.line(0.5)
