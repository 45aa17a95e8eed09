"""``autograd-run diff``: order, structure and time of two runs, with a test against the noise.

The scenarios of the issue: two runs of the same graph show no significant change; an inflated cost
node shows up on that node and on the critical path; a changed priority policy shows the first
divergence. Plus thresholds, outputs and refused requests."""

import json

import pytest

from autograd_run.errors import RequestError
from autograd_run.analysis.diff import Threshold, check, compare, parse_fail_on
from autograd_run.traces.read_profile import read_profile
from builders import cost, doc, leaf, node, run_cli


def branches(b2_us=300.0, b1_us=600.0):
    """r (200 µs, CPU) hands its gradient to b1 (``b1_us`` on cuda:0) and b2 (``b2_us`` on cuda:1),
    which run side by side on their devices' workers (virtual without a GPU); both feed leaf x.

        r
       / \\
      b1  b2
       \\ /
       acc_x
    """
    return doc(cost("r", ["b1", "b2"], 200, seq=3),
               cost("b1", ["acc_x"], b1_us, seq=2, device="cuda:0"),
               cost("b2", ["acc_x"], b2_us, seq=1, device="cuda:1"),
               leaf("x", [2]))


def write(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def summary_of(tmp_path, capsys, graph, name, *args):
    code, out, err = run_cli([graph, "--json", *args], capsys)
    assert code == 0, err
    p = tmp_path / name
    p.write_text(out)
    return str(p)


def diff_json(capsys, *args):
    code, out, err = run_cli(["diff", *args, "--json"], capsys)
    return code, json.loads(out) if out else None, err


# -- the scenarios -------------------------------------------------------------------------------

def test_two_runs_of_the_same_graph_show_no_significant_change(tmp_path, capsys):
    g = write(tmp_path, "g.json", branches())
    code, d, err = diff_json(capsys, g, "--a", "--repeat 12", "--b", "--repeat 12",
                             "--fail-on", "wall>10%,critical-path>10%,node>50%,order,structure")
    assert code == 0, err
    assert d["a"]["passes"] == d["b"]["passes"] == 12
    assert d["diff"]["wall"]["p"] is not None          # tested against the noise
    # b1 and b2 start on their own workers in either order; each worker's sequence is the same
    assert d["diff"]["order"]["divergence"] is None and d["diff"]["order"]["per_worker"]
    assert not any(v["crossed"] for v in d["thresholds"]) and d["crossed"] is False


def test_an_inflated_cost_node_shows_on_that_node_and_the_critical_path(tmp_path, capsys):
    # b2 goes from 0.3 ms to 60 ms and overtakes b1 (15 ms): far beyond what a loaded machine's
    # jitter (a few ms on a sleep) can hide, with 8 passes a side.
    a = summary_of(tmp_path, capsys, write(tmp_path, "a.json", branches(300, 15_000)), "sa.json", "--repeat", "8")
    b = summary_of(tmp_path, capsys, write(tmp_path, "b.json", branches(60_000, 15_000)), "sb.json", "--repeat", "8")
    code, d, err = diff_json(capsys, a, b, "--fail-on", "critical-path>20%,node>100%,critical-path-nodes")
    assert code == 3
    nodes = {c["name"]: c for c in d["diff"]["nodes"]}
    assert d["diff"]["nodes"][0]["name"] == "b2"       # the largest change comes first
    assert nodes["b2"]["significant"] and nodes["b2"]["relative"] > 3
    cp = d["diff"]["critical_path"]
    assert cp["significant"] and cp["delta"] > 30_000_000
    assert d["diff"]["critical_path_joined"] == ["b2"] and d["diff"]["critical_path_left"] == ["b1"]
    crossed = {v["threshold"]: v["crossed"] for v in d["thresholds"]}
    assert crossed == {"critical-path>20%": True, "node>100%": True, "critical-path-nodes": True}
    assert "Error: crossed: critical-path>20%" in err


def test_a_changed_priority_policy_shows_the_first_divergence(capsys):
    # PyTorch's policy pops the larger seq: mul_c (seq 1) before mul_b (seq 0); FIFO pops them in
    # the order add routed them: mul_b first.
    code, d, err = diff_json(capsys, "example:seed", "--a", "simulate", "--b", "simulate --policy fifo",
                             "--fail-on", "order")
    assert code == 3, err
    dv = d["diff"]["order"]["divergence"]
    assert (dv["pass_index"], dv["position"], dv["worker"]) == (0, 2, None)
    assert (dv["a"]["id"], dv["b"]["id"]) == ("mul_c", "mul_b")
    assert dv["a_context"] == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert dv["b_context"] == ["sum", "add", "mul_b", "mul_c", "acc_a"]
    assert (dv["a_position_of_b"], dv["b_position_of_a"]) == (3, 3)
    # one swapped pair among 5 nodes: tau = 1 - 4 * 1 / (5 * 4)
    assert d["diff"]["order"]["kendall_tau"] == pytest.approx(0.8)


def test_the_divergence_shows_the_ready_set_of_a_real_run(capsys):
    code, d, err = diff_json(capsys, "example:pipeline", "--a", "--repeat 2", "--b", "--repeat 2 --no-multithreading",
                             "--fail-on", "workers")
    assert code == 3
    o = d["diff"]["order"]
    assert o["per_worker"] and {m[0] for m in o["moved"]} == {"sum", "mm1", "copy", "relu", "mm0", "acc_w1", "acc_w0"}
    assert all(m[2] == "caller" for m in o["moved"])
    dv = o["divergence"]
    ready = dv["b_ready"] or dv["a_ready"]
    assert ready and ready[0][0] == (dv["b"] or dv["a"])["id"]   # the chosen node first, with depth and seq
    assert all(len(r) == 3 for r in ready)


def test_order_files_of_two_orders(tmp_path, capsys):
    seed = json.loads(json.dumps(doc(
        node("sum", "SumBackward0", seq=3, next=["add"], inputs=[[]], saved={"self_sym_sizes": [2]}),
        node("add", "AddBackward0", seq=2, next=["mul_b", "mul_c"], inputs=[[2]], saved={"alpha": 1}),
        node("mul_b", "MulBackward0", seq=0, next=["acc_a", None], inputs=[[2]], saved={"other": 2.0}),
        node("mul_c", "MulBackward0", seq=1, next=["acc_a", None], inputs=[[2]], saved={"other": 3.0}),
        leaf("a", [2]))))
    swapped = json.loads(json.dumps(seed))
    swapped["nodes"][2]["seq"], swapped["nodes"][3]["seq"] = 1, 0
    files = []
    for name, d in (("a", seed), ("b", swapped)):
        out = tmp_path / f"{name}.jsonl"
        code, _, err = run_cli([write(tmp_path, f"{name}.json", d), "--no-summary", "--order-out", str(out)], capsys)
        assert code == 0, err
        files.append(str(out))
    code, d, err = diff_json(capsys, *files)
    assert code == 0  # no --fail-on: a report only
    assert d["a"]["kind"] == "order file" and d["diff"]["wall"] is None
    dv = d["diff"]["order"]["divergence"]
    assert (dv["position"], dv["a"]["id"], dv["b"]["id"]) == (2, "mul_c", "mul_b")
    assert any("no times" in n for n in d["diff"]["notes"])
    # a stopped run's order (it ends with {"incomplete": ...}) was refused at that line as a row without an
    # 'id' (a hostile review): it is compared, and said to be cut short
    stopped = tmp_path / "stopped.jsonl"
    stopped.write_text(open(files[0]).read() + '{"incomplete": "timeout"}\n')
    code, d, err = diff_json(capsys, files[0], str(stopped))
    assert code == 0 and d["diff"]["order"]["divergence"] is None, err
    assert f"{stopped}: the run that wrote this order was stopped (timeout): its order ends early" in d["diff"]["notes"]


def test_a_simulated_regression_is_exact(tmp_path, capsys):
    # Simulations are deterministic: one pass, untested, taken as measured. The three cost nodes
    # (1100 µs in all) take 3x their time, plus the engine's fixed overhead per node, unchanged:
    # a change of 2200 µs over a little more than 1100 µs.
    g = write(tmp_path, "g.json", branches())
    code, d, err = diff_json(capsys, g, "--a", "simulate", "--b", "simulate --scale CostBackward=3",
                             "--fail-on", "op>100%")
    assert code == 3
    ops = {c["name"]: c for c in d["diff"]["ops"]}
    cost = ops["CostBackward"]
    assert cost["p"] is None and cost["significant"] is None and cost["counts"]
    assert cost["delta"] == pytest.approx(2_200_000, rel=0.01) and 1.8 < cost["relative"] < 2.0
    assert ops["AccumulateGrad"]["delta"] == 0


# -- the library ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("wall>10%", [Threshold("wall", 0.1, True)]),
    ("critical-path>2ms, order", [Threshold("critical-path", 2e6), Threshold("order")]),
    ("node>500us,op>1.5s", [Threshold("node", 5e5), Threshold("op", 1.5e9)]),
    ("utilization>5%,workers,structure,critical-path-nodes",
     [Threshold("utilization", 0.05, True), Threshold("workers"), Threshold("structure"),
      Threshold("critical-path-nodes")]),
])
def test_parse_fail_on(text, expected):
    assert parse_fail_on(text) == expected


@pytest.mark.parametrize("text, problem", [
    ("wall", "wall needs a value"), ("order>1%", "order takes no value"), ("speed>1%", "keys: wall"),
    ("wall>10", "give the value a unit"), ("utilization>2ms", "percentage points"), ("", "no thresholds"),
    ("wall<10%", "expected KEY>VALUE"),
])
def test_bad_fail_on_is_refused(text, problem):
    with pytest.raises(RequestError, match=problem) as info:
        parse_fail_on(text)
    assert info.value.option == "fail_on"


def test_within_the_noise_never_crosses(tmp_path, capsys):
    # Same inputs: nothing changed at all.
    a = summary_of(tmp_path, capsys, "example:seed", "s.json", "--repeat", "6")
    d = compare(read_profile(a), read_profile(a))
    assert d.wall.delta == 0 and not d.wall.counts
    assert not any(v.crossed for v in check(d, parse_fail_on("wall>0%,node>0%,op>0%,order,workers,structure")))


# -- the command line ----------------------------------------------------------------------------

def test_tables_and_markdown(tmp_path, capsys):
    a = summary_of(tmp_path, capsys, write(tmp_path, "a.json", branches(300)), "sa.json", "--repeat", "3")
    b = summary_of(tmp_path, capsys, write(tmp_path, "b.json", branches(3000)), "sb.json", "--repeat", "3")
    code, out, err = run_cli(["diff", a, b], capsys)
    assert code == 0 and "Error" not in err
    assert "within noise" in out or "beyond noise" in out
    assert "with 3 and 3 passes no difference can reach p < 0.01" in out.replace("\n", " ").replace("│", "")
    code, md, _ = run_cli(["diff", a, b, "--markdown", "--fail-on", "critical-path>10%"], capsys)
    assert md.startswith("## autograd-run diff: no threshold crossed")  # 3 passes a side: never beyond noise
    assert "| b2 |" in md and "### thresholds (--fail-on)" in md
    assert "| critical-path&gt;10% | ok | critical path " in md   # > as an entity: never a quote block


def test_markdown_and_tables_escape_hostile_ids(tmp_path, capsys, monkeypatch):
    evil = "b2|`x`*[l](http://e.x)@team #1 <b>\n"
    d = branches(300)
    d["nodes"][2]["id"] = evil
    d["nodes"][0]["next"][1] = [evil, 0]
    g = write(tmp_path, "g.json", d)
    code, md, err = run_cli(["diff", g, "--a", "--repeat 2", "--b", "--repeat 2", "--markdown"], capsys)
    assert code == 0, err
    row = next(line for line in md.splitlines() if line.startswith("| b2"))
    assert row.startswith("| b2\\|\\`x\\`\\*\\[l\\](http&#58;//e.x)&#64;team &#35;1 &lt;b&gt;\\\\n |")
    assert "<b>" not in md and "@team" not in md
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that no cell wraps
    code, out, err = run_cli(["diff", g, "--a", "--repeat 2", "--b", "--repeat 2"], capsys)
    # rich shows the id as text (no markup: "[l]" stays), the newline as a visible \n
    assert code == 0 and "b2|`x`*[l]" in out and "<b>\\n" in out


@pytest.mark.parametrize("args, message", [
    (["example:seed"], "one input: give --a and/or --b"),
    (["a.json", "b.json", "--a", "--repeat 2"], "--a/--b go with one GRAPH"),
    (["example:seed", "--a", "--trace t.json"], "--a: --trace is not available here"),
    (["example:seed", "--a", "--bogus"], "--a: No such option '--bogus'"),
    (["example:seed", "--b", "--repeat 0"], "--b: Invalid value for '--repeat'"),
    (["example:seed", "--a", "'unclosed"], "--a: No closing quotation"),
    (["example:seed", "--a", "--inputs nope"], "--a: --inputs: 'nope' is neither a variable"),
    (["example:seed", "--a", "simulate --policy nope"], "--a: Invalid value for '--policy'"),
    (["example:seed", "--a", "x", "--fail-on", "wall"], "--fail-on: 'wall': wall needs a value"),
    (["example:seed", "--a", "x", "--json", "--markdown"], "--json and --markdown: choose one"),
])
def test_refused_requests_exit_2(tmp_path, capsys, args, message):
    code, out, err = run_cli(["diff", *args], capsys)
    assert code == 2 and err.startswith(f"Error: {message}"), err
    assert "Traceback" not in err


def test_a_failing_side_exits_1_naming_the_side_and_node(capsys):
    code, out, err = run_cli(["diff", "example:seed", "--a", "", "--b", "--inject-error mul_c"], capsys)
    assert code == 1
    assert err.startswith("Error: --b: node 'mul_c' (MulBackward0): ")


def test_unreadable_inputs_exit_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [1]}')
    code, out, err = run_cli(["diff", str(bad), str(bad)], capsys)
    assert code == 2 and err.strip() == f"Error: {bad}: $.traceEvents[0]: each event must be an object"


def test_a_repeated_run_keeps_every_pass_in_its_json_samples(tmp_path, capsys):
    # --repeat without a trace folds each pass into the summary and drops its events; the samples
    # that a diff compares must still hold every pass, and a node's lists one entry per pass.
    g = write(tmp_path, "g.json", branches())
    code, out, err = run_cli([g, "--json", "--repeat", "4"], capsys)
    assert code == 0, err
    s = json.loads(out)["samples"]
    assert s["passes"] == 4 and len(s["wall_ns"]) == len(s["critical_path"]) == 4
    assert all(len(v) == 4 for v in s["worker_busy_ns"].values())
    assert all(len(n["duration_ns"]) == 4 and None not in n["duration_ns"] for n in s["nodes"].values())
    assert set(s["nodes"]) == {"r", "b1", "b2", "acc_x"}


def _order_lines(rows):
    return "\n".join(json.dumps({"position": k, "pass": 0, "thread": "MainThread", **r}) for k, r in enumerate(rows))


def test_a_node_that_runs_another_op_under_the_same_id_is_a_change(tmp_path, capsys):
    """A ReLU made a sigmoid keeps its position and id: the diff must still see it (order and structure)."""
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(_order_lines([{"id": "n0", "name": "SumBackward0"}, {"id": "n1", "name": "ReluBackward0"},
                               {"id": "x", "name": "AccumulateGrad"}]))
    b.write_text(_order_lines([{"id": "n0", "name": "SumBackward0"}, {"id": "n1", "name": "SigmoidBackward0"},
                               {"id": "x", "name": "AccumulateGrad"}]))
    code, d, err = diff_json(capsys, str(a), str(b), "--fail-on", "order,structure")
    assert code == 3, err
    assert d["diff"]["order"]["changed"] == [["n1", "ReluBackward0", "SigmoidBackward0"]]
    assert d["diff"]["order"]["divergence"]["position"] == 1
    assert {v["threshold"]: v["crossed"] for v in d["thresholds"]} == {"order": True, "structure": True}


def test_golden_orders_of_pytorch_are_compared_by_op_and_rank_not_by_capture_id(tmp_path, capsys):
    """Capture ids are positions in one walk: a node added upstream renumbers the rest. Goldens carry
    each node's rank among its op's nodes; two goldens that differ only in capture ids are the same."""
    rows = [{"name": "SumBackward0", "nth": 0, "leaf": None}, {"name": "MulBackward0", "nth": 0, "leaf": None},
            {"name": "MulBackward0", "nth": 1, "leaf": None},
            {"name": "torch::autograd::AccumulateGrad", "nth": None, "leaf": "w"}]
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(_order_lines([{"id": f"n{k}", **r} for k, r in enumerate(rows)]))
    b.write_text(_order_lines([{"id": f"n{k + 5}", **r} for k, r in enumerate(rows)]))
    code, d, err = diff_json(capsys, str(a), str(b), "--fail-on", "order,structure")
    assert code == 0, err
    assert d["diff"]["order"]["divergence"] is None
    b.write_text(_order_lines([{"id": f"n{k}", **r} for k, r in enumerate([rows[0], rows[2], rows[1], rows[3]])]))
    code, d, err = diff_json(capsys, str(a), str(b), "--fail-on", "order")
    assert code == 3
    dv = d["diff"]["order"]["divergence"]
    assert dv["position"] == 1 and dv["a"]["id"] == "MulBackward0 #0" and dv["b"]["id"] == "MulBackward0 #1"


def test_queue_waits_pair_by_their_scoped_ids_in_a_trace_sorted_by_time(tmp_path, capsys):
    """Queue-wait begins and ends pair by ``id2.local`` (and name), not by their place in the file: the
    same trace with its events sorted by timestamp, where several waits are open at once, reads back
    with the same waits per node. (r fans out to b1 and b2: both wait in their queues together.)"""
    g = write(tmp_path, "g.json", branches())
    t = tmp_path / "t.json"
    code, _, err = run_cli([g, "--no-summary", "--trace", str(t)], capsys)
    assert code == 0, err
    trace = json.loads(t.read_text())
    events = trace["traceEvents"]
    waits = [e for e in events if e.get("cat") == "queue_wait"]
    assert waits and all("id2" in e and "id" not in e for e in waits)
    resorted = tmp_path / "sorted.json"
    resorted.write_text(json.dumps(dict(trace, traceEvents=sorted(events, key=lambda e: e.get("ts", 0)))))
    before, after = read_profile(str(t)), read_profile(str(resorted))
    got = {k: v.queue_wait_ns for k, v in after.nodes.items()}
    assert got == {k: v.queue_wait_ns for k, v in before.nodes.items()}
    assert sum(w[0] for w in got.values()) > 0
