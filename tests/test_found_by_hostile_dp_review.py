"""Found by a hostile review of the data-parallel surfaces (``simulate --ddp/--fsdp/--network/--straggler/
--compare/--costs`` and the graph's ``ddp``/``fsdp`` sections): each case runs the real command line in a child
process and wants ``Error: ...`` naming the place, exit 2, and no traceback."""

from __future__ import annotations

import json

import pytest

from cli_proc import cli
from test_fsdp_sim import _parts

NET = ["--network", "alpha_us=10,gbps=1"]


def _graph(**extra) -> dict:
    """c3 -> c2 -> p2 -> c1 -> p1 (cost nodes) with AccumulateGrad a1..a3 of w1..w3 (1 MiB each): test_fsdp_sim's."""
    nodes, variables, _ = _parts()
    return {"format": "autograd-graph/1", "roots": [{"node": "c3"}], "variables": variables, "nodes": nodes,
            **extra}


UNITS = [{"name": "u1", "parameters": ["w1"], "pre_backward": "c1", "post_backward": "p1"},
         {"name": "u2", "parameters": ["w2"], "pre_backward": "c2", "post_backward": "p2"},
         {"name": "", "parameters": ["w3"], "reshard_after_forward": False, "pre_backward": "c3",
          "post_backward": None}]


@pytest.fixture
def ddp_graph(tmp_path):
    path = tmp_path / "ddp.json"
    path.write_text(json.dumps(_graph(parameters=["w1", "w2", "w3"], ddp={"bucket_cap_mb": 1})))
    return str(path)


@pytest.fixture
def fsdp_graph(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps(_graph(fsdp={"units": UNITS, "root": ""})))
    return str(path)


def _usage_error(p, *words):
    assert p.code == 2, (p.code, p.err[-2000:])
    assert "Traceback" not in p.err, p.err[-2000:]
    line = p.err.strip().splitlines()[-1]
    assert line.startswith("Error: "), p.err[-2000:]
    for w in words:
        assert w in line, line
    return line


BIG = "9" * 5000  # past int()'s 4300-digit limit


@pytest.mark.parametrize("args, words", [
    (["--ddp", "defaults", "--world", "4", *NET, "--straggler", "rank=\u00b2,slowdown=2"], ["--straggler", "rank"]),
    (["--ddp", "defaults", "--world", "4", *NET, "--straggler", f"rank={BIG},slowdown=2"], ["--straggler", "rank"]),
    (["--ddp", "defaults", "--world", "4", "--network", "alpha_us=10,gbps=1,channels=\u00b2"],
     ["--network", "channels"]),
    (["--ddp", "defaults", "--world", "4", "--network", f"alpha_us=10,gbps=1,channels={BIG}"],
     ["--network", "channels"]),
    (["--ddp", "defaults", *NET, "--compare", "world=\u00b2,4"], ["--compare world"]),
    (["--ddp", "defaults", *NET, "--compare", f"world=4,{BIG}"], ["--compare world"]),
])
def test_whole_numbers_of_ddp_options_are_ascii_and_bounded(ddp_graph, args, words):
    """``str.isdigit`` passes '²' and 5000-digit strings, which ``int`` then refuses with a ValueError."""
    line = _usage_error(cli(["simulate", ddp_graph, "--spec", "h100", "--no-summary", *args]), *words)
    assert len(line) < 400  # the value is quoted cut short, not 5000 digits


@pytest.mark.parametrize("args, words", [
    (["--fsdp", "prefetch=\u00b2", "--world", "4", *NET], ["--fsdp", "prefetch"]),
    (["--fsdp", f"replicate={BIG}", "--world", "4", *NET], ["--fsdp", "replicate"]),
    (["--fsdp", "captured", *NET, "--compare", "prefetch=1,\u00b2"], ["prefetch"]),
])
def test_whole_numbers_of_fsdp_options_are_ascii_and_bounded(fsdp_graph, args, words):
    line = _usage_error(cli(["simulate", fsdp_graph, "--spec", "h100", "--no-summary", *args]), *words)
    assert len(line) < 400


def test_a_network_files_name_in_the_nearest_link_note_is_escaped(ddp_graph, fsdp_graph, tmp_path):
    """A network file measured at 2 ranks, simulated at 4: the ``note:`` naming the link carried the file's
    ``name`` raw to stderr (an escape sequence drove the terminal, a bidi override reordered the line)."""
    from cli_proc import cli_tty
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"name": "\x1b]0;owned\x07\x1b[2Kfake\u202e", "links": {"2": {"alpha_us": 10,
                                                                                          "gbps": 1}}}))
    for graph, mode in ((ddp_graph, "--ddp"), (fsdp_graph, "--fsdp")):
        args = ["simulate", graph, "--spec", "h100", "--no-summary", mode, "defaults", "--world", "4",
                "--network", net]
        for p in (cli(args), cli_tty(args)):
            text = p.out + p.err
            assert p.code == 0, text[-2000:]
            assert "no link measured at 4 ranks" in text
            assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text[-2000:])
            assert "\\x1b]0;owned\\x07\\x1b[2Kfake\\u202e" in text


def _chain(k: int, **extra) -> dict:
    """c_k -> ... -> c1 (10 us each), each c_j also to AccumulateGrad a_j of w_j (4 KiB)."""
    nodes, variables = [], []
    for j in range(k, 0, -1):
        nxt = [[f"a{j}", 0]] + ([[f"c{j - 1}", 0]] if j > 1 else [])
        nodes.append({"id": f"c{j}", "name": f"C{j}", "op": "cost", "next": nxt, "inputs": [{"shape": [1024]}],
                      "attrs": {"cost": {"us": 10}}})
        nodes.append({"id": f"a{j}", "name": "torch::autograd::AccumulateGrad", "variable": f"w{j}",
                      "inputs": [{"shape": [1024]}]})
        variables.append({"name": f"w{j}", "shape": [1024]})
    return {"format": "autograd-graph/1", "roots": [{"node": f"c{k}"}], "variables": variables, "nodes": nodes,
            **extra}


SLOWEST = ["--network", "alpha_us=1e9,gbps=1e-6"]  # both at the end of their ranges


def test_ddp_collectives_past_64_bit_nanoseconds_are_an_error_not_a_traceback(tmp_path):
    """12 buckets, each an all-reduce of 2e18 ns on 2**20 ranks at the slowest link: their sum passed 2**63
    and the streams' summary raised OverflowError (numpy's int64) with a traceback."""
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(_chain(12, parameters=[f"w{j}" for j in range(1, 13)])))
    for extra in ([], ["--json"]):
        p = cli(["simulate", path, "--spec", "h100", "--ddp", "bucket_cap_mb=0.000001,first_bucket_mb=0.000001",
                 "--world", "1048576", *SLOWEST, *extra])
        _usage_error(p, "do not fit a 64-bit count of nanoseconds")


def test_fsdp_collectives_past_64_bit_nanoseconds_are_an_error_not_a_silent_figure(tmp_path):
    """--compare world=...: FSDP's times past 2**63 ns were printed (and written to --json) as they came."""
    units = [{"name": f"u{j}", "parameters": [f"w{j}"], "pre_backward": f"c{j}", "post_backward": None}
             for j in range(1, 13)]
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(_chain(12, fsdp={"units": units})))
    for extra in ([], ["--json"]):
        p = cli(["simulate", path, "--spec", "h100", "--fsdp", "prefetch=0", "--compare", "world=2,1048576",
                 *SLOWEST, *extra])
        _usage_error(p, "do not fit a 64-bit count of nanoseconds")


def test_an_fsdp_units_backward_prefetch_null_is_none_set(fsdp_graph, tmp_path):
    """``"backward_prefetch": null`` passed the graph's checks and was iterated: a TypeError traceback."""
    doc = json.loads(open(fsdp_graph).read())
    doc["fsdp"]["units"][1]["backward_prefetch"] = None
    path = tmp_path / "null.json"
    path.write_text(json.dumps(doc))
    p = cli(["simulate", path, "--spec", "h100", "--fsdp", "captured", "--world", "4", *NET, "--json"])
    assert p.code == 0 and "Traceback" not in p.err, p.err[-2000:]
    plain = cli(["simulate", fsdp_graph, "--spec", "h100", "--fsdp", "captured", "--world", "4", *NET, "--json"])
    assert json.loads(p.out)["fsdp"] == json.loads(plain.out)["fsdp"]  # as if not given


def test_many_fsdp_units_simulate_in_time(tmp_path):
    """The graph file may give up to 100,000 units: FSDP's overlap sum (every collective against every wait of
    the compute) and its memory (``posts.index`` for each pair of units) were quadratic to cubic in them:
    8,000 units took 34 s, 5,000 units with parameters over a minute. Both now take about a second."""
    k, empty = 5000, 20000
    units = [{"name": f"u{j}", "parameters": [f"w{j}"], "pre_backward": f"c{j}", "post_backward": None}
             for j in range(1, k + 1)]
    units += [{"name": f"e{j}", "parameters": []} for j in range(empty)]
    path = tmp_path / "units.json"
    path.write_text(json.dumps(_chain(k, fsdp={"units": units})))
    import time
    t = time.monotonic()
    p = cli(["simulate", path, "--spec", "h100", "--fsdp", "captured", "--world", "4", *NET, "--slack", "0"],
            timeout=120)
    assert p.code == 0, p.err[-2000:]
    assert "FSDP2 on 4 ranks" in p.out
    assert time.monotonic() - t < 60


def test_outputs_never_overwrite_the_calibrations_a_simulation_reads(ddp_graph, tmp_path):
    """``--spec local`` (or the default spec, local when calibrated) and ``--network local-gloo`` read files in
    the user cache folder; ``--trace``/``--order-out`` there were written over them (every later simulation
    then failed: "the calibration kept at ... cannot be used")."""
    import shutil
    from autograd_run.sim import specs
    cache = tmp_path / "cache"
    folder = cache / "autograd-run"
    folder.mkdir(parents=True)
    spec = folder / "local-spec.json"
    shutil.copy(specs.__file__.replace("specs.py", "specs/h100.json"), spec)
    gloo = folder / "local-gloo-network.json"
    gloo.write_text(json.dumps({"name": "g", "links": {"2": {"alpha_us": 1, "gbps": 1}}}))
    before = {p: p.read_bytes() for p in (spec, gloo)}
    cases = [
        (["--ddp", "defaults", "--world", "2", "--network", "local-gloo", "--spec", "h100", "--trace", gloo],
         "--trace"),
        (["--spec", "local", "--order-out", spec], "--order-out"),
        (["--order-out", spec], "--order-out"),  # the default spec: local, as calibrated here
        (["--spec", "local", "--trace", spec], "--trace"),
    ]
    for args, flag in cases:
        p = cli(["simulate", ddp_graph, "--no-summary", *args], XDG_CACHE_HOME=cache)
        _usage_error(p, flag, "is an input of this run")
    assert {p: p.read_bytes() for p in (spec, gloo)} == before


def test_outputs_never_overwrite_a_costs_folders_traces(ddp_graph, tmp_path):
    """``--costs DIR`` reads every trace in DIR, but only DIR itself was an input: ``--order-out DIR/rank-0...``
    or ``--trace`` there wrote over a rank's trace (through a link to a profile elsewhere, that profile)."""
    ranks = tmp_path / "ranks"
    p = cli(["simulate", ddp_graph, "--spec", "h100", "--no-summary", "--ddp", "defaults", "--world", "2", *NET,
             "--trace", f"{ranks}/"])
    assert p.code == 0, p.err[-2000:]
    rank0 = ranks / "rank-0.kineto.json"
    elsewhere = tmp_path / "profile.kineto.json"
    (ranks / "rank-1.kineto.json").rename(elsewhere)
    (ranks / "rank-1.kineto.json").symlink_to(elsewhere)
    before = rank0.read_bytes(), elsewhere.read_bytes()
    for flag, target in (("--order-out", rank0), ("--trace", rank0), ("--order-out", ranks / "rank-1.kineto.json")):
        p = cli(["simulate", ddp_graph, "--spec", "h100", "--no-summary", "--costs", ranks, flag, target])
        _usage_error(p, flag, "is an input of this run")
    assert (rank0.read_bytes(), elsewhere.read_bytes()) == before
    p = cli(["simulate", ddp_graph, "--spec", "h100", "--no-summary", "--costs", ranks])
    assert p.code == 0, p.err[-2000:]


@pytest.mark.parametrize("command, side", [
    (["diff", "{ddp}", "--b", "simulate", "--a"], "simulate --ddp defaults --world 4 --network alpha_us=1,gbps=1"),
    (["diff", "{fsdp}", "--b", "simulate", "--a"], "simulate --fsdp captured --world 4 --network alpha_us=1,gbps=1"),
    (["diff", "{ddp}", "--b", "simulate", "--a"], "simulate --memory-limit 1KiB"),
    (["diff", "{ddp}", "--b", "simulate", "--a"], "--max-memory 1KiB"),
    (["draw", "{fsdp}", "-o", "{out}", "--simulate"], "--fsdp captured --world 4 --network alpha_us=1,gbps=1"),
])
def test_a_side_refuses_the_options_it_would_not_apply(ddp_graph, fsdp_graph, tmp_path, command, side):
    """A ``diff``/``draw`` side parsed ``--ddp``/``--fsdp``/``--world``/``--network``/``--memory-limit``/
    ``--max-memory`` and dropped them: ``diff --a 'simulate --ddp ...' --b simulate`` compared two identical
    simulations and found no difference."""
    args = [a.format(ddp=ddp_graph, fsdp=fsdp_graph, out=tmp_path / "g.svg") for a in command]
    p = cli([*args, side])
    flag = "--simulate" if command[0] == "draw" else "--a"
    _usage_error(p, flag, side.split()[1 if side.startswith("simulate") else 0], "is not available here")


@pytest.mark.parametrize("key,value", [("devices", "1"), ("policy", "fifo")])
def test_a_compare_of_policies_or_device_counts_is_bounded_before_it_starts(key, value):
    """Each value of ``--compare`` is a simulation of its own: 2,000 values ran 2,000 of them. At most 64, as
    for the data-parallel keys, refused before any runs."""
    p = cli(["simulate", "example:mlp", "--compare", f"{key}=" + ",".join([value] * 65)])
    assert p.code == 2 and p.err == f"Error: --compare {key}: at most 64 values, got 65\n", p.err
    p = cli(["simulate", "example:mlp", "--compare", f"{key}=" + ",".join([value] * 64), "--json"])
    assert p.code == 0, p.err
