"""DDP on a simulated backward (``sim.ddp``) and the collectives' alpha-beta costs, hand-computed."""

from __future__ import annotations

import os

import pytest

from autograd_run.errors import RequestError
from autograd_run.parallel.collectives import Link, cost_ns
from autograd_run.sim.ddp import collective_slack, simulate_ddp
from autograd_run.sim.session import SimOptions, simulate_session
from builders import parts_graph

MIB = 1 << 20
LINK = Link(10.0, 1e9)  # 10 us a message, 1 GB/s


def test_collective_costs_hand_computed():
    # ring all-reduce of 1 MiB over 2 ranks: 2 messages of latency, the whole buffer through the link once
    assert cost_ns("allreduce", MIB, 2, LINK) == 20_000 + 1_048_576
    # over 4 ranks: 6 latencies, 2 * 3/4 of the buffer
    assert cost_ns("allreduce", MIB, 4, LINK) == 60_000 + round(1.5 * 1_048_576)
    assert cost_ns("allreduce-tree", MIB, 8, LINK) == 6 * 10_000 + 2 * 1_048_576
    assert cost_ns("reduce-scatter", MIB, 4, LINK) == cost_ns("all-gather", MIB, 4, LINK) == 30_000 + 786_432
    assert cost_ns("allreduce", MIB, 1, LINK) == 0  # one rank sends nothing
    with pytest.raises(RequestError, match="world size must be a whole number from 1"):
        cost_ns("allreduce", MIB, 0, LINK)
    with pytest.raises(RequestError, match="unknown collective 'broadcast'"):
        cost_ns("broadcast", MIB, 2, LINK)
    with pytest.raises(RequestError, match="bandwidth must be a finite number > 0"):
        Link(1.0, 0.0)


def two_layers():
    """c2 (100 us) -> AccumulateGrad w2, and -> c1 (100 us) -> AccumulateGrad w1; w1, w2: 1 MiB each."""
    n = 1 << 18  # float32: 1 MiB
    nodes = [
        {"id": "c2", "name": "C2", "op": "cost", "seq": 2, "next": [["a2", 0], ["c1", 0]],
         "inputs": [{"shape": [n]}], "attrs": {"cost": {"us": 100}}},
        {"id": "c1", "name": "C1", "op": "cost", "seq": 1, "next": [["a1", 0]],
         "inputs": [{"shape": [n]}], "attrs": {"cost": {"us": 100}}},
        {"id": "a1", "name": "torch::autograd::AccumulateGrad", "variable": "w1", "inputs": [{"shape": [n]}]},
        {"id": "a2", "name": "torch::autograd::AccumulateGrad", "variable": "w2", "inputs": [{"shape": [n]}]},
    ]
    variables = [{"name": "w1", "shape": [n]}, {"name": "w2", "shape": [n]}]
    return parts_graph(nodes, [{"node": "c2"}], variables, source="ddp.json")


def test_buckets_all_reduce_in_order_on_one_stream_after_their_last_gradient():
    rep = simulate_session(two_layers(), SimOptions(spec="h100", slack_top=0))
    ends = {s[2].variable: s[5] - rep.sim.graph_tasks[0].start for s in rep.sim.slices
            if getattr(s[2], "variable", None)}
    one = cost_ns("allreduce", MIB, 2, LINK)
    # Rebuilt in ready order with a 1 MiB cap: w2's gradient is ready first and fills a bucket by itself.
    r = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1)
    assert [b.params for b in r.buckets] == [[1], [0]] and [b.nbytes for b in r.buckets] == [MIB, MIB]
    b0, b1 = r.buckets
    assert (b0.ready_ns, b0.start_ns, b0.end_ns) == (ends["w2"], ends["w2"], ends["w2"] + one)
    # w1 is ready long before w2's all-reduce ends: its bucket waits for the stream
    assert ends["w1"] < b0.end_ns and (b1.start_ns, b1.end_ns) == (b0.end_ns, b0.end_ns + one)
    # finalize_backward copies both reduced buckets back into .grad: 2 MiB read and written at the host's
    # memory bandwidth (the parameters are on the CPU); none with gradient_as_bucket_view
    copy = round(2 * 2 * MIB / rep.spec.host.mem_bw * 1e9)
    assert r.copy_back_ns == copy and r.compute_ns == rep.engine_done_ns and r.wall_ns == b1.end_ns + copy
    assert r.exposed_ns == b1.end_ns + copy - rep.engine_done_ns and r.comm_ns == 2 * one
    view = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1, gradient_as_bucket_view=True)
    assert view.copy_back_ns == 0 and view.wall_ns == b1.end_ns
    assert r.overlap == pytest.approx(max(0, rep.engine_done_ns - b0.start_ns) / (2 * one))
    # The first iteration: one bucket of everything, launched when the last gradient is ready.
    f = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1, iteration="first")
    assert [b.params for b in f.buckets] == [[0, 1]]
    assert f.buckets[0].start_ns == max(ends.values()) and f.buckets[0].nbytes == 2 * MIB
    # One rank: nothing to reduce, nothing exposed.
    assert simulate_ddp(rep, 1, LINK).exposed_ns == 0


def test_an_unreached_parameter_is_marked_by_the_first_hook_and_the_used_map_follows_the_last_bucket():
    """Reducer::autograd_hook marks the unused parameters ready at the backward's first hook (here w2's), before
    its own; with find_unused_parameters (dynamic), the map of used parameters (int32 each) is all-reduced once
    the last bucket is launched."""
    g = two_layers()
    g.variables["extra"] = __import__("autograd_run.graphs.model", fromlist=["Variable"]).Variable("extra", (8,))
    rep = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    ends = {s[2].variable: s[5] - rep.sim.graph_tasks[0].start for s in rep.sim.slices
            if getattr(s[2], "variable", None)}
    assert ends["w2"] < ends["w1"]
    r = simulate_ddp(rep, 2, LINK, bucket_cap_mb=0.5, find_unused_parameters=True)
    assert r.unused == ["extra"]
    # initial buckets (no rebuild while unused parameters are looked for): one per parameter, reversed
    assert [(b.kind, b.params, b.trigger) for b in r.buckets] == [
        ("bucket", [2], "w2"), ("bucket", [1], "w2"), ("bucket", [0], "w1"), ("used-map", [], "w1")]
    extra, b2, b1, used = r.buckets
    assert extra.ready_ns == extra.start_ns == ends["w2"] and extra.nbytes == 32
    assert b2.start_ns == extra.end_ns == ends["w2"] + cost_ns("allreduce", 32, 2, LINK)
    assert b1.start_ns == max(ends["w1"], b2.end_ns)
    assert used.nbytes == 3 * 4 and used.dtype == "int32" and used.start_ns == b1.end_ns
    # static_graph, first iteration: nothing from the hooks; the final callback launches the map, then all
    s = simulate_ddp(rep, 2, LINK, bucket_cap_mb=0.5, find_unused_parameters=True, static_graph=True,
                     iteration="first")
    assert [b.kind for b in s.buckets] == ["used-map", "bucket"] and all(b.trigger is None for b in s.buckets)
    assert s.buckets[0].start_ns == rep.engine_done_ns
    # two channels (gloo's two worker threads): the second bucket does not wait for the first
    two = simulate_ddp(rep, 2, Link(10.0, 1e9, channels=2), bucket_cap_mb=0.5, find_unused_parameters=True)
    assert two.buckets[1].start_ns == ends["w2"]


@pytest.mark.parametrize("args,message", [
    (["--ddp", "defaults", "--network", "alpha_us=1,gbps=1"], "--ddp needs --world N"),
    (["--ddp", "defaults", "--world", "4"], "--ddp needs --network alpha_us=A,gbps=B"),
    (["--world", "4"], "--world goes with --ddp"),
    (["--ddp", "bucket_cap=5", "--world", "2", "--network", "alpha_us=1,gbps=1"], "unknown key 'bucket_cap'"),
    (["--ddp", "bucket_cap_mb=0", "--world", "2", "--network", "alpha_us=1,gbps=1"], "bucket_cap_mb must be a size"),
    (["--ddp", "bucket_cap_mb=nan", "--world", "2", "--network", "alpha_us=1,gbps=1"], "bucket_cap_mb must be a size"),
    (["--ddp", "first_bucket_mb=0", "--world", "2", "--network", "alpha_us=1,gbps=1"], "first_bucket_mb must be a size"),
    (["--ddp", "first_bucket_mb=1e-9", "--world", "2", "--network", "alpha_us=1,gbps=1"],
     "first_bucket_mb must be at least one byte"),
    # a cap past 1e9 MiB: its bytes were int(inf), an OverflowError, in the bucket assignment
    (["--ddp", "bucket_cap_mb=1e308", "--world", "8", "--network", "alpha_us=10,gbps=12"],
     "--ddp: bucket_cap_mb must be a size in MiB > 0, at most 1e+09, got '1e308'"),
    (["--ddp", "first_bucket_mb=1e308", "--world", "8", "--network", "alpha_us=10,gbps=12"],
     "--ddp: first_bucket_mb must be a size in MiB > 0, at most 1e+09, got '1e308'"),
    (["--ddp", "defaults", "--world", "8", "--network", "alpha_us=10,gbps=12", "--compare", "bucket_cap_mb=1,1e308"],
     "--compare: bucket_cap_mb must be a size in MiB > 0, at most 1e+09, got '1e308'"),
    (["--ddp", "defaults", "--world", "0", "--network", "alpha_us=1,gbps=1"], "--world"),
    (["--ddp", "defaults", "--world", "2", "--network", "alpha_us=1"], "--network: give gbps"),
    (["--ddp", "defaults", "--world", "2", "--network", "alpha_us=-1,gbps=1"], "alpha_us must be"),
    (["--ddp", "iteration=third", "--world", "2", "--network", "alpha_us=1,gbps=1"], "iteration must be first or steady"),
])
def test_bad_ddp_options_are_usage_errors(args, message, capsys):
    from builders import run_cli
    code, out, err = run_cli(["simulate", "example:mlp", *args], capsys)
    assert code == 2 and "Error:" in err and message in err and "Traceback" not in err


def test_simulate_ddp_json(tmp_path, capsys):
    import json
    from autograd_run.graphs.dump import dump_graph
    from builders import run_cli
    path = str(tmp_path / "g.json")
    dump_graph(two_layers(), path)
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--json", "--slack", "0", "--ddp", "bucket_cap_mb=1",
                              "--world", "2", "--network", "alpha_us=10,gbps=1"], capsys)
    assert code == 0, err
    d = json.loads(out)["ddp"]
    one = cost_ns("allreduce", MIB, 2, LINK)
    assert [b["params"] for b in d["buckets"]] == [[1], [0]] and d["comm_ns"] == 2 * one
    assert d["wall_ns"] == d["compute_ns"] + d["exposed_ns"] and d["world"] == 2


def test_a_graph_files_ddp_cap_past_the_limit_is_refused(tmp_path, capsys):
    """The graph file's ddp section: a bucket_cap_mb past 1e9 MiB is refused where the file is read (it passed
    validate, then simulate --ddp captured failed with an OverflowError in the bucket assignment)."""
    import json
    from autograd_run.graphs.dump import dump_graph
    from builders import run_cli
    path = tmp_path / "g.json"
    dump_graph(two_layers(), str(path))
    doc = json.loads(path.read_text())
    doc["parameters"] = ["w1", "w2"]
    doc["ddp"] = {"bucket_cap_mb": 1e9}
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(["simulate", str(path), "--spec", "h100", "--slack", "0", "--ddp", "captured",
                              "--world", "8", "--network", "nvlink-h100"], capsys)
    assert code == 0, err
    doc["ddp"] = {"bucket_cap_mb": 1e308}
    path.write_text(json.dumps(doc))
    for args in (["validate", str(path)], ["simulate", str(path), "--spec", "h100", "--ddp", "captured",
                                           "--world", "8", "--network", "nvlink-h100"]):
        code, out, err = run_cli(args, capsys)
        assert code == 2 and "Traceback" not in err, err
        assert err.startswith(f"Error: {path}: at $.ddp.bucket_cap_mb: must be a size in MiB of at least one byte "
                              "and at most 1e+09, got 1e+308"), err


def test_network_forms_and_their_errors(tmp_path, monkeypatch):
    import json
    from autograd_run.cli.ddp_options import parse_network
    from autograd_run.errors import RequestError, UsageError
    from autograd_run.parallel.networks import LOCAL_GLOO_FILE
    net = parse_network("alpha_us=5,gbps=2,channels=2")
    link, note = net.link_for(64)
    assert (link.alpha_us, link.bandwidth, link.channels, note) == (5.0, 2e9, 2, None)
    with pytest.raises(UsageError, match="channels must be"):
        parse_network("alpha_us=5,gbps=2,channels=0")
    # a simulated time is a 64-bit count of ns: figures past any real link were an OverflowError or 1e290 s
    for text, key in (("alpha_us=1e16,gbps=1", "alpha_us"), ("alpha_us=1,gbps=1e-300", "gbps"),
                      ("alpha_us=nan,gbps=1", "alpha_us"), ("alpha_us=1,gbps=inf", "gbps")):
        with pytest.raises(UsageError, match=f"--network: {key} must be a number from"):
            parse_network(text)
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"name": "two", "channels": 1,
                                "links": {"2": {"alpha_us": 100, "gbps": 1}, "8": {"alpha_us": 300, "gbps": 0.5}}}))
    net = parse_network(str(path))
    assert net.link_for(2) == (net.links[2], None) and net.links[8].bandwidth == 0.5e9
    link, note = net.link_for(16)  # nearest on a log scale: 8
    assert link is net.links[8] and "no link measured at 16 ranks; using the one measured at 8" in note
    for doc, message in [
        ({"links": {"2": {"alpha_us": 1, "gbps": 0}}}, "at $.links['2'].gbps: must be a number from 1e-06 to 1e+06"),
        ({"links": {"2": {"alpha_us": 1e16, "gbps": 1}}}, "at $.links['2'].alpha_us: must be a number from 0 to"),
        ({"links": {"2": {"alpha_us": 1, "gbps": 1e-300}}}, "at $.links['2'].gbps: must be a number from"),
        ({"links": {"\u00b2": {"alpha_us": 1, "gbps": 1}}}, "a world size is a whole number"),  # isdigit, not int
        ({"links": {"two": {"alpha_us": 1, "gbps": 1}}}, "at $.links['two']: a world size is a whole number"),
        ({"links": {}}, "at $.links: must be an object"),
        ({"links": {"2": {"alpha_us": 1, "gbps": 1}}, "speed": 3}, "at $.speed: unknown field"),
        ({"channels": True, "links": {"2": {"alpha_us": 1, "gbps": 1}}}, "at $.channels: must be a whole number"),
        # a backend or a measured time of any type passed unread (a hostile review): a backend not gloo's costed
        # its reduce-scatters as NCCL's with no word
        ({"backend": 7, "link": {"alpha_us": 1, "gbps": 1}},
         "at $.backend: must be 'gloo' or 'nccl' (gloo runs a reduce-scatter as an all-reduce of the whole buffer), "
         "got 7"),
        ({"backend": "Gloo", "link": {"alpha_us": 1, "gbps": 1}}, "at $.backend: must be 'gloo' or 'nccl'"),
        ({"measured": "junk", "link": {"alpha_us": 1, "gbps": 1}},
         "at $.measured: must be the date and time the links were measured (ISO 8601, as calibrate --gloo writes "
         "it: 2025-01-31T12:00:00+00:00), got 'junk'"),
        ({"measured": 2025, "link": {"alpha_us": 1, "gbps": 1}}, "at $.measured: must be the date and time"),
        ({"name": ["two"], "link": {"alpha_us": 1, "gbps": 1}}, "at $.name: must be a string, got ['two']"),
        ({"source": {}, "link": {"alpha_us": 1, "gbps": 1}}, "at $.source: must be a string (where the figures"),
        ([1], "at $: a network file is a JSON object"),
        # found by a hostile review: a key past Python's int conversion limit was a traceback; "0004" and "4" both
        # world 4 (one silently replacing the other); a misspelt link field was read as nothing
        ({"links": {"9" * 4400: {"alpha_us": 1, "gbps": 1}}}, "a world size is a whole number from 1 to"),
        ({"links": {"0004": {"alpha_us": 1, "gbps": 1}}}, "at $.links['0004']: a world size is a whole number from 1 "
                                                          "to 1048576, without leading zeros"),
        ({"link": {"alpha_us": 1, "gbps": 1, "during_compte": 0.5}},
         "at $.link.during_compte: unknown field (fields: alpha_us, channels, during_compute,"),
    ]:
        path.write_text(json.dumps(doc))
        with pytest.raises(RequestError) as err:
            parse_network(str(path))
        assert str(path) in str(err.value) and message in str(err.value), (doc, str(err.value))
    path.write_text(json.dumps({"name": "gloo here", "backend": "gloo", "source": "s",
                                "measured": "2025-01-31T12:00:00+00:00", "link": {"alpha_us": 1, "gbps": 1}}))
    assert parse_network(str(path)).link_for(2)[0].reduce_scatter == "allreduce"
    path.write_text("{not json")
    with pytest.raises(RequestError, match="not a valid network file"):
        parse_network(str(path))
    path.write_text('{"link": {"alpha_us": 1, "gbps": 50, "gbps": 0.001}}')  # JSON keeps the last silently
    with pytest.raises(RequestError, match=r"net.json: duplicate key 'gbps' in an object \(JSON keys must be unique\)"):
        parse_network(str(path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(RequestError, match=r"no local-gloo network yet: run `autograd-run calibrate --gloo`"):
        parse_network("local-gloo")
    from autograd_run.parallel.networks import local_gloo_path
    os.makedirs(local_gloo_path())  # a folder where the file goes was "no local-gloo network yet" (a hostile review)
    with pytest.raises(RequestError, match=r"local-gloo-network.json: the local-gloo network's file is not a regular"):
        parse_network("local-gloo")
    with pytest.raises(RequestError, match="not KEY=VALUE pairs"):
        parse_network("nowhere")
    assert LOCAL_GLOO_FILE.endswith(".json")


def test_the_gloo_fit_hand_computed():
    from autograd_run.parallel.gloo_probe import _fit
    # t = 1000 ns + 2 ns/byte exactly: recovered, with no residual
    a, b, worst = _fit([(n, 1000 + 2 * n) for n in (4096, 65536, 1 << 20)])
    assert a == pytest.approx(1000, rel=1e-6) and b == pytest.approx(2, rel=1e-9) and worst < 1e-9
    # flat in size: all latency, the slope not measurable
    a, b, _ = _fit([(n, 500.0) for n in (4096, 65536, 1 << 20)])
    assert a == pytest.approx(500) and b == pytest.approx(0, abs=1e-5)


def test_compare_bucket_sizes_and_world_sizes(tmp_path, capsys):
    import json
    from autograd_run.graphs.dump import dump_graph
    from builders import run_cli
    path = str(tmp_path / "g.json")
    dump_graph(two_layers(), path)
    base = ["simulate", path, "--spec", "h100", "--slack", "0", "--network", "alpha_us=10,gbps=1"]
    code, out, err = run_cli(base + ["--ddp", "defaults", "--world", "2", "--compare", "bucket_cap_mb=1,2",
                                     "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["ddp_compare"]
    one = cost_ns("allreduce", MIB, 2, LINK)
    assert [r["bucket_cap_mb"] for r in rows] == [1, 2]
    assert [len(r["buckets"]) for r in rows] == [2, 1]  # 1 MiB each: two buckets, then one of both
    assert rows[0]["comm_ns"] == 2 * one and rows[1]["comm_ns"] == cost_ns("allreduce", 2 * MIB, 2, LINK)
    code, out, err = run_cli(base + ["--ddp", "bucket_cap_mb=1", "--compare", "world=1,2,8", "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["ddp_compare"]
    assert [r["world"] for r in rows] == [1, 2, 8] and rows[0]["comm_ns"] == 0
    assert rows[2]["comm_ns"] == 2 * cost_ns("allreduce", MIB, 8, LINK)
    code, out, err = run_cli(base + ["--ddp", "defaults", "--world", "2", "--compare", "bucket_cap_mb=1,2"], capsys)
    assert code == 0 and "DDP: bucket_cap_mb compared" in out
    for args, message in [
        (["--ddp", "defaults", "--world", "2", "--compare", "world=2,4"], "--world and --compare world"),
        (["--ddp", "bucket_cap_mb=1", "--world", "2", "--compare", "bucket_cap_mb=1,2"], "give the sizes in --compare"),
        (["--ddp", "defaults", "--world", "2", "--compare", "policy=pytorch,fifo"], "not with --compare"),
        (["--ddp", "defaults", "--compare", "world=0,2"], "world sizes are whole numbers"),
        (["--ddp", "defaults", "--world", "2", "--compare", "bucket_cap_mb=0"], "bucket_cap_mb must be a size"),
    ]:
        code, out, err = run_cli(base + args, capsys)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)


def test_a_straggler_delays_every_collective():
    """One rank 3x slower: each collective starts only when that rank has launched it too, so it starts at
    the slow rank's launch; the others' backward ends later by the difference."""
    g = two_layers()
    fast = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    slow = simulate_session(g, SimOptions(spec="h100", slack_top=0, scale={"cpu": 3.0}))
    alone = simulate_ddp(fast, 4, LINK, bucket_cap_mb=1)
    lag = simulate_ddp(fast, 4, LINK, bucket_cap_mb=1, straggler=(3, 3.0, slow))
    slow_alone = simulate_ddp(slow, 4, LINK, bucket_cap_mb=1)
    for b, s in zip(lag.buckets, slow_alone.buckets):
        assert b.start_ns == s.start_ns  # the slow rank launches later than the others: its launch rules
    assert lag.straggler["rank"] == 3 and lag.straggler["compute_ns"] == slow.engine_done_ns
    assert lag.straggler["delay_ns"] == lag.wall_ns - alone.wall_ns > 0
    with pytest.raises(RequestError, match="straggler rank must be from 0 to 3"):
        simulate_ddp(fast, 4, LINK, straggler=(4, 2.0, slow))


def test_the_collectives_slack_hand_computed(tmp_path, capsys):
    """Two 1 MiB buckets (cap 1 MiB) on one channel, the second ready before the first ends: the backward ends
    2 all-reduces after w2 is ready. Every collective 20% faster saves 2 x 20% of one (latency and bytes);
    half the cap (0.5 MiB) changes nothing (each 1 MiB parameter is still a bucket of its own); double the cap
    (2 MiB) makes one bucket of both, launched when w1 is ready: its end is w1's ready + one 2 MiB all-reduce.
    `simulate --ddp` shows them (JSON `ddp.slack`), and not with --compare."""
    import json
    from autograd_run.graphs.dump import dump_graph
    from builders import run_cli
    rep = simulate_session(two_layers(), SimOptions(spec="h100", slack_top=0))
    r = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1)
    one = cost_ns("allreduce", MIB, 2, LINK)
    w2, w1 = (b.ready_ns for b in r.buckets)
    assert w1 < w2 + one and r.wall_ns == w2 + 2 * one + r.copy_back_ns
    fast = cost_ns("allreduce", MIB, 2, Link(LINK.alpha_us * 0.8, LINK.bandwidth / 0.8))
    got = {row["what"]: row for row in collective_slack(rep, 2, LINK, r, {"bucket_cap_mb": 1})}
    assert got["every collective 20% faster"]["saved_ns"] == 2 * (one - fast)
    assert got["bucket_cap_mb=0.5 (half)"]["saved_ns"] == 0
    both = simulate_ddp(rep, 2, LINK, bucket_cap_mb=2)
    assert both.wall_ns == max(w1, w2) + cost_ns("allreduce", 2 * MIB, 2, LINK) + both.copy_back_ns
    assert got["bucket_cap_mb=2 (double)"]["wall_ns"] == both.wall_ns
    assert got["bucket_cap_mb=2 (double)"]["saved_ns"] == r.wall_ns - both.wall_ns
    path = str(tmp_path / "g.json")
    dump_graph(two_layers(), path)
    base = ["simulate", path, "--spec", "h100", "--slack", "0", "--world", "2", "--network", "alpha_us=10,gbps=1"]
    code, out, err = run_cli([*base, "--ddp", "bucket_cap_mb=1", "--json"], capsys)
    assert code == 0, err
    assert [(row["what"], row["saved_ns"]) for row in json.loads(out)["ddp"]["slack"]] == \
        [(w, got[w]["saved_ns"]) for w in got]
    code, out, err = run_cli([*base, "--ddp", "defaults", "--compare", "bucket_cap_mb=1,2", "--json"], capsys)
    assert code == 0, err
    assert all(row["slack"] == [] for row in json.loads(out)["ddp_compare"])
    code, out, err = run_cli([*base, "--ddp", "bucket_cap_mb=1"], capsys)
    assert code == 0 and "What if (the collectives)" in out and "every collective 20% faster" in out


def test_the_first_buckets_cap_as_a_what_if_hand_computed(tmp_path, capsys):
    """w2 ready first, then w1, 1 MiB each. With bucket_cap_mb=2 the rebuild closes one bucket of both (2 MiB
    reaches the cap); with first_bucket_mb=1 the first bucket closes at w2 alone (1 MiB reaches the first cap)
    and w1 is left for the next (limits [1, 2] MiB, as DDP's default [1, 25]). The constructor's buckets without
    unused parameters looked for are one bucket whatever the caps (iteration=first); with them, the first cap
    applies in registration order (w1 then w2)."""
    from builders import run_cli
    rep = simulate_session(two_layers(), SimOptions(spec="h100", slack_top=0))
    assert [b.params for b in simulate_ddp(rep, 2, LINK, bucket_cap_mb=2).buckets] == [[1, 0]]
    assert [b.params for b in simulate_ddp(rep, 2, LINK, bucket_cap_mb=2, first_bucket_mb=1).buckets] == [[1], [0]]
    assert [b.params for b in simulate_ddp(rep, 2, LINK, bucket_cap_mb=2, first_bucket_mb=1,
                                           iteration="first").buckets] == [[0, 1]]
    unused = simulate_ddp(rep, 2, LINK, bucket_cap_mb=2, first_bucket_mb=1, iteration="first",
                          find_unused_parameters=True)
    assert [b.params for b in unused.buckets if b.kind == "bucket"] == [[1], [0]]  # (reversed, as DDP hands them)
    import json
    from autograd_run.graphs.dump import dump_graph
    path = str(tmp_path / "g.json")
    dump_graph(two_layers(), path)
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--slack", "0", "--ddp",
                              "bucket_cap_mb=2,first_bucket_mb=1", "--world", "2", "--network",
                              "alpha_us=10,gbps=1", "--json"], capsys)
    assert code == 0, err
    assert [b["params"] for b in json.loads(out)["ddp"]["buckets"]] == [[1], [0]]


@pytest.mark.parametrize("args,message", [
    (["--straggler", "rank=1,slowdown=2"], "--straggler goes with --ddp"),
    (["--ddp", "defaults", "--world", "2", "--straggler", "rank=2,slowdown=2"], "rank must be a whole number below"),
    (["--ddp", "defaults", "--world", "2", "--straggler", "rank=1,slowdown=0.5"], "slowdown must be a factor from 1"),
    (["--ddp", "defaults", "--world", "2", "--straggler", "rank=1"], "--straggler: give slowdown"),
])
def test_bad_straggler_options(args, message, capsys):
    from builders import run_cli
    network = ["--network", "alpha_us=1,gbps=1"] if "--ddp" in args else []
    code, out, err = run_cli(["simulate", "example:mlp", *network, *args], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_the_trace_has_a_communication_track(tmp_path, capsys):
    """`simulate --ddp --trace`: each collective a slice on the communication track at its simulated time
    (microseconds from the run's start), titled with its bucket, size and the parameter that launched it."""
    import json
    from autograd_run.graphs.dump import dump_graph
    from autograd_run.sim.ddp import COMM_TRACK
    from builders import run_cli
    path, trace = str(tmp_path / "g.json"), str(tmp_path / "t.json")
    dump_graph(two_layers(), path)
    code, out, err = run_cli(["simulate", path, "--spec", "h100", "--slack", "0", "--ddp", "bucket_cap_mb=1",
                              "--world", "2", "--network", "alpha_us=10,gbps=1", "--trace", trace, "--json"], capsys)
    assert code == 0, err
    buckets = json.loads(out)["ddp"]["buckets"]
    events = json.load(open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    comm = [e for e in events if e.get("ph") == "X" and names.get((e["pid"], e["tid"])) == f"stream {COMM_TRACK}"]
    assert [e["name"] for e in comm] == ["all-reduce bucket 0 (1.00 MiB, launched by w2)",
                                         "all-reduce bucket 1 (1.00 MiB, launched by w1)"]
    starts = sorted(e["ts"] for e in comm)
    t0 = min(e["ts"] for e in events if e.get("ph") == "X")
    assert [round(s - t0, 3) for s in starts] == [round(b["start_ns"] / 1e3, 3) for b in buckets]


@pytest.mark.parametrize("writer", ["streaming", "in-memory"])
def test_a_flow_joins_each_collective_to_the_gradient_that_launched_it(tmp_path, capsys, writer):
    """`simulate --ddp --trace t.json` (the streaming writer; ``to_chrome_trace`` the in-memory one): a flow from
    the slice of the AccumulateGrad node whose hook made a bucket ready to that bucket's all-reduce on the
    communication track, each end on its slice's start; and Perfetto's trace processor joins them so (its flow
    table: the node's slice out, the collective's in)."""
    import json
    from autograd_run.graphs.dump import dump_graph
    from autograd_run.sim.ddp import add_to_recording
    from autograd_run.traces.chrome import to_chrome_trace
    from builders import run_cli
    g = two_layers()
    if writer == "streaming":
        path, trace = str(tmp_path / "g.json"), str(tmp_path / "t.json")
        dump_graph(g, path)
        code, out, err = run_cli(["simulate", path, "--spec", "h100", "--slack", "0", "--ddp", "bucket_cap_mb=1",
                                  "--world", "2", "--network", "alpha_us=10,gbps=1", "--trace", trace, "--json"],
                                 capsys)
        assert code == 0, err
        launchers = [b["trigger"] for b in json.loads(out)["ddp"]["buckets"]]
        data = open(trace, "rb").read()
    else:
        rep = simulate_session(g, SimOptions(spec="h100", slack_top=0))
        r = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1)
        rec = rep.recording
        add_to_recording(r, rec, g)
        launchers = [b.trigger for b in r.buckets]
        data = json.dumps(to_chrome_trace(rec)).encode()
    events = json.loads(data)["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    flows = {ph: {e["id"]: e for e in events if e.get("ph") == ph and e.get("name", "").startswith("launch ")}
             for ph in ("s", "f")}
    assert launchers == ["w2", "w1"] and len(flows["s"]) == 2 and flows["s"].keys() == flows["f"].keys()
    for k, (fid, s) in enumerate(sorted(flows["s"].items())):
        f = flows["f"][fid]
        src = [e["name"] for e in xs if (e["pid"], e["tid"], e["ts"], e["cat"]) == (s["pid"], s["tid"], s["ts"], "node")]
        dst = [e["name"] for e in xs if (e["pid"], e["tid"], e["ts"], e["cat"]) == (f["pid"], f["tid"], f["ts"], "kernel")]
        assert [name.split()[0] for name in src] == [g.variables[launchers[k]].node.id]
        assert len(dst) == 1 and dst[0].startswith(f"all-reduce bucket {k} ")
    from tp_wasm.tp import TraceProcessor, available
    if available() is not None:
        pytest.skip(f"Perfetto trace processor unavailable: {available()}")
    with TraceProcessor(data) as tp:
        got = tp.query("select a.name as a, b.name as b from flow f join slice a on a.id = f.slice_out "
                       "join slice b on b.id = f.slice_in where b.name glob 'all-reduce*' order by b.ts")
    assert [(x["a"].split()[0], x["b"].split(" (")[0]) for x in got] == [
        (g.variables[w].node.id, f"all-reduce bucket {k}") for k, w in enumerate(launchers)]


def test_perfettos_trace_processor_reads_the_communication_track(tmp_path):
    """The .pftrace of `simulate --ddp`: Perfetto's real trace processor imports it with no error and shows
    each collective on the communication stream's track, with a flow from the node that launched it."""
    from tp_wasm.tp import TraceProcessor, available
    if available() is not None:
        pytest.skip(f"Perfetto trace processor unavailable: {available()}")
    from autograd_run.sim.ddp import COMM_TRACK, add_to_recording
    from autograd_run.traces.pftrace import pftrace_chunks
    g = two_layers()
    rep = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    r = simulate_ddp(rep, 2, LINK, bucket_cap_mb=1)
    rec = rep.recording
    add_to_recording(r, rec, g)
    with TraceProcessor(b"".join(pftrace_chunks(rec))) as tp:
        assert tp.query("select name from stats where value > 0 and severity in ('error', 'data_loss')") == []
        rows = tp.query("select s.name, s.ts, s.dur, t.name as track from slice s join thread_track tt "
                        "on s.track_id = tt.id join thread t using (utid) where s.name glob 'all-reduce*' "
                        "order by s.ts")
        flows = tp.query("select a.name as a, b.name as b from flow f join slice a on a.id = f.slice_out "
                         "join slice b on b.id = f.slice_in where b.name glob 'all-reduce*' order by b.ts")
    # each all-reduce joined to the slice of the AccumulateGrad node whose hook launched it
    assert [(f["a"].split()[0], f["b"].split(" (")[0]) for f in flows] == [
        (g.variables[b.trigger].node.id, f"all-reduce bucket {b.index}") for b in r.buckets]
    # (compared as gaps from the first: the writer keeps its own time origin)
    assert [(x["track"], x["ts"] - rows[0]["ts"], x["dur"]) for x in rows] == [
        (f"stream {COMM_TRACK}", b.start_ns - r.buckets[0].start_ns, b.end_ns - b.start_ns) for b in r.buckets]


@pytest.mark.parametrize("name", ["nvlink-h100", "ib-ndr", "roce-200"])
def test_the_shipped_links_load_and_say_they_are_nominal(name):
    from autograd_run.cli.ddp_options import parse_network
    net = parse_network(name)
    link, note = net.link_for(512)
    assert note is None and link.bandwidth > 0 and "nominal, not measured" in net.source


def test_a_collective_slowed_while_the_compute_runs_hand_computed():
    """during_compute 0.5: a 100 us collective started 40 us before the compute ends does 20 us of its work
    by then and the other 80 us after (ends 120 us after its start); one started after the compute ends is
    not slowed; one that fits before the end takes twice as long."""
    from autograd_run.parallel.collectives import end_ns
    from autograd_run.parallel.gloo_probe import during_compute
    half = Link(10.0, 1e9, during_compute=0.5)
    assert end_ns(0, 100_000, 40_000, half) == 40_000 + 80_000
    assert end_ns(50_000, 100_000, 40_000, half) == 150_000
    assert end_ns(0, 10_000, 40_000, half) == 20_000
    assert end_ns(0, 100_000, 40_000, LINK) == 100_000  # no sharing: full speed
    # the measured pair (ns per all-reduce alone, while computing): their ratio, within the floor and 1
    assert (during_compute(1000, 4000), during_compute(1000, 900), during_compute(1000, 10 ** 6),
            during_compute(1000, 0)) == (0.25, 1.0, 0.02, 1.0)
    with pytest.raises(RequestError, match="during_compute must be in"):
        Link(1.0, 1.0, during_compute=0)
