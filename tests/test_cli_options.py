"""Options say what they do and refuse what does not apply: ``gen``'s options per kind, one --size,
per-option messages, no file that validate rejects; run's --backend (old --devices kept); metavars,
defaults and ranges in --help; device names in flags that a graph does not have."""

import json
import os
import subprocess
import sys

import pytest

from builders import run_cli


@pytest.mark.parametrize("args, message", [
    (["chain", "--nodes", "200000"], "Error: --nodes does not apply to gen chain; its size is --size (ops)\n"),
    (["chain", "--heads", "3"], "Error: --heads does not apply to gen chain (it takes --size, --op, --seed)\n"),
    (["fanout", "--width", "3"], "Error: --width does not apply to gen fanout (it takes --size, --seed)\n"),
    (["mlp", "--leaves", "3"], "Error: --leaves does not apply to gen mlp (it takes --size, --width, --batch, "
                               "--in-features, --seed)\n"),
    (["random", "--op", "add"], "Error: --op does not apply to gen random (it takes --size, --leaves, --width, "
                                "--seed)\n"),
    (["transformer", "--dim", "30"], "Error: --dim 30 must be a multiple of --heads 4\n"),
    (["transformer", "--size", "2", "--devices", "3"],
     "Error: --devices 3 is more than the 2 layer(s) to spread over them\n"),
    (["fanout", "--size", "100000000"], "Error: --size: gen fanout would make about 200,000,002 nodes; at most "
                                        "20,000,000\n"),
    (["mlp", "--width", "100000", "--batch", "100000"],
     "Error: gen mlp with these options makes a graph that does not validate: shape [100000, 100000] has "
     "10000000000 elements, more than the limit of 2147483648\n"),
])
def test_gen_refuses_what_does_not_apply_or_would_not_validate(tmp_path, capsys, args, message):
    out_file = tmp_path / "g.json"
    code, out, err = run_cli(["gen", *args, "-o", str(out_file)], capsys)
    assert (code, out, err) == (2, "", message)
    assert not out_file.exists()


def test_gen_size_errors_name_the_option(tmp_path, capsys):
    code, out, err = run_cli(["gen", "chain", "--size", "0", "-o", str(tmp_path / "c.json")], capsys)
    assert code == 2 and "Error: Invalid value for '--size': '0': must be a whole number, at least 1" in err


@pytest.mark.parametrize("kind, args, nodes", [
    ("chain", ["--size", "10"], 11), ("chain", ["--n", "10"], 11), ("fanout", ["--size", "3"], 7),
    ("mlp", ["--size", "1", "--width", "4"], 8), ("random", ["--size", "20", "--leaves", "5"], None),
    ("transformer", ["--layers", "2", "--devices", "2", "--heads", "1"], None),
])
def test_gen_writes_files_that_validate(tmp_path, capsys, kind, args, nodes):
    out_file = tmp_path / "g.json"
    code, out, err = run_cli(["gen", kind, *args, "-o", str(out_file)], capsys)
    assert code == 0, err
    n = len(json.loads(out_file.read_text())["nodes"])
    assert out == f"{out_file}: {n} nodes\n" and (nodes is None or n == nodes)
    assert run_cli(["validate", str(out_file)], capsys)[0] == 0


@pytest.mark.parametrize("size, leaves", [(50, 5), (2000, 300), (3000, 2)])
def test_gen_random_estimates_its_node_count_from_above(size, leaves):
    """The count gen checks before making a random DAG covers what it makes (seeded draws); ten million op
    nodes (about 10.1 million nodes) are within the limit."""
    from autograd_run.cli import gen_cmd
    from autograd_run.graphs.generators import generate
    o = {"leaves": leaves, "width": 4}
    for seed in range(4):
        n = len(generate("random", nodes=size, leaves=leaves, seed=seed)["nodes"])
        assert size + leaves + 1 <= n <= gen_cmd._estimate_nodes("random", size, o)
    gen_cmd._check("random", 10_000_000, {"leaves": 40, "width": 4})


def test_gen_random_refuses_a_count_past_the_limit_before_writing(tmp_path, capsys, monkeypatch):
    from autograd_run.cli import gen_cmd
    monkeypatch.setattr(gen_cmd, "MAX_NODES", 100)
    monkeypatch.setattr(gen_cmd, "_estimate_nodes", lambda *a: 50)  # (an estimate the draw exceeds)
    out_file = tmp_path / "g.json"
    code, out, err = run_cli(["gen", "random", "--size", "200", "--leaves", "5", "-o", str(out_file)], capsys)
    assert code == 2 and out == "" and not out_file.exists()
    assert err.startswith("Error: --size: gen random with these options makes 2") and err.endswith(
        " nodes; at most 100\n"), err


@pytest.mark.parametrize("kind, args", [
    ("chain", ["--size", "40"]), ("fanout", ["--size", "20"]), ("mlp", ["--size", "4", "--width", "3"]),
    ("random", ["--size", "60", "--leaves", "5"]), ("transformer", ["--size", "3", "--devices", "2"]),
])
def test_gen_packs_big_graphs_into_the_same_bytes(tmp_path, capsys, monkeypatch, kind, args):
    """A big graph's nodes are encoded in batches as they are made (to fit ten million in memory): the
    file is byte for byte the one written from the whole document."""
    from autograd_run.cli import gen_cmd
    from autograd_run.graphs.generators import Builder
    plain, packed = tmp_path / "plain.json", tmp_path / "packed.json"
    assert run_cli(["gen", kind, *args, "-o", str(plain)], capsys)[0] == 0
    monkeypatch.setattr(gen_cmd, "PACK_FROM", 1)
    monkeypatch.setattr(Builder, "PACK", 7)
    made = []
    real_pack = Builder._pack
    monkeypatch.setattr(Builder, "_pack", lambda self: (made.append(len(self.nodes)), real_pack(self)))
    code, out, err = run_cli(["gen", kind, *args, "-o", str(packed)], capsys)
    assert code == 0, err
    assert len(made) > 3 and packed.read_bytes() == plain.read_bytes()
    assert out == f"{packed}: {len(json.loads(plain.read_bytes())['nodes'])} nodes\n"


def test_gen_refuses_a_graph_the_machine_cannot_hold_before_making_it(tmp_path, capsys, monkeypatch):
    from autograd_run.graphs import generators, validate
    monkeypatch.setattr(validate, "memory_available", lambda: 100 << 20)
    monkeypatch.setattr(generators, "chain", lambda **kw: pytest.fail("generated"))
    code, out, err = run_cli(["gen", "chain", "--size", "1000000", "-o", str(tmp_path / "c.json")], capsys)
    assert (code, out) == (2, "")
    assert err == ("Error: gen chain of about 1,000,001 nodes takes about 1.6 GiB of memory to write and check "
                   "the file, and 100.0 MiB is available\n")
    code, out, err = run_cli(["gen", "chain", "--size", "100000", "-o", str(tmp_path / "c.yaml")], capsys)
    assert code == 2 and "(YAML takes about 8x more than JSON)" in err
    assert not os.listdir(tmp_path)


def test_run_backend_and_its_old_spelling(capsys):
    code, out, err = run_cli(["example:pipeline", "--backend", "virtual", "--json"], capsys)
    assert code == 0 and json.loads(out)["devices"] == "virtual"
    code, out, err = run_cli(["example:pipeline", "--devices", "virtual", "--json"], capsys)
    assert code == 0 and json.loads(out)["devices"] == "virtual"
    code, out, err = run_cli(["example:pipeline", "--devices", "virtual", "--backend", "cuda"], capsys)
    assert code == 2 and err == "Error: --devices is the old spelling of --backend: give one of them\n"


@pytest.mark.parametrize("command, shown", [
    (["run"], ["--trace FILE", "--order-out FILE", "--expect-order FILE", "--inputs ID,...", "--repeat N",
               "[default: 1; 1 to 1000000]", "--seed N", "[0 to 2**62]", "--timeout SECONDS",
               "--backend [auto|virtual|cuda]", "[default: auto]"]),
    (["gen"], ["-o, --output FILE", "--size N", "[default: 0; 0 to 2**32-1]", "--devices K"]),
    (["check"], ["--allow-opaque"]),
])
def test_help_shows_metavars_defaults_and_ranges(capsys, command, shown):
    code, out, err = run_cli([*command, "--help"], capsys)
    assert code == 0
    out = " ".join(out.split())  # help text is wrapped at 80 columns
    for s in shown:
        assert s in out, s
    assert "4611686018427387904" not in out and "4294967295" not in out
    assert "--devices [auto" not in out  # run's old spelling is hidden


def test_a_seed_out_of_range_says_the_range(capsys):
    code, out, err = run_cli(["example:seed", "--seed", "-1"], capsys)
    assert code == 2 and "'-1': must be a whole number, 0 to 2**62" in err


@pytest.mark.parametrize("scale, message", [
    ("cuda:1000=2", "Error: --scale: 'cuda:1000': no such device in example:pipeline (it has cuda:0, cuda:1)\n"),
    ("MmBackwardX=2", "Error: --scale: 'MmBackwardX' is neither an op name nor a device of example:pipeline\n"),
])
def test_simulate_scale_names_what_the_graph_has(capsys, scale, message):
    code, out, err = run_cli(["simulate", "example:pipeline", "--scale", scale], capsys)
    assert (code, out, err) == (2, "", message)


def test_simulate_scale_accepts_devices_of_the_requested_count(capsys):
    code, out, err = run_cli(["simulate", "example:mlp", "--devices", "4", "--scale", "cuda:3=2", "--no-summary"],
                             capsys)
    assert code == 0, err


# -- a graph from stdin -----------------------------------------------------------------------------

SEED = __import__("importlib.resources", fromlist=["files"]).files("autograd_run.graphs") / "examples" / "seed.yaml"


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_a_graph_from_stdin_by_its_content(fmt):
    from cli_proc import cli
    import yaml
    text = SEED.read_text() if fmt == "yaml" else json.dumps(yaml.safe_load(SEED.read_text()))
    p = cli(["-", "--json"], input=text.encode())
    assert p.code == 0, p.err
    d = json.loads(p.out)
    assert d["graph"] == "<stdin>" and d["grads"]["a"] == [5.0, 5.0]
    p = cli(["validate", "-"], input=text.encode())
    assert p.code == 0 and p.out == "-: 5 nodes, 5 edges, devices: cpu, roots: 1\n"


def test_stdin_format_option():
    from cli_proc import cli
    p = cli(["-", "--format", "json", "--no-summary"], input=SEED.read_bytes())
    assert p.code == 2 and p.err.startswith("Error: <stdin>: line 1, column 1: invalid JSON")
    p = cli(["example:seed", "--format", "json"])
    assert p.code == 2 and p.err == ("Error: --format applies to a graph read from stdin (-) only; a file's "
                                     "extension gives its format\n")


def test_a_graph_from_stdin_cannot_use_side_files():
    from cli_proc import cli
    d = {"format": "autograd-graph/1", "roots": [{"node": "m", "grad": "ones"}], "variables": [{"name": "a", "shape": [2]}],
         "nodes": [{"id": "m", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
                    "saved": {"other": {"npz": "w"}}},
                   {"id": "acc", "name": "AccumulateGrad", "variable": "a", "inputs": [{"shape": [2]}]}]}
    p = cli(["-"], input=json.dumps(d).encode())
    assert p.code == 2 and "a graph read from stdin has no folder for side files" in p.err


def test_simulate_never_writes_over_its_measured_costs(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert run_cli(["example:pipeline", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    before = trace.read_bytes()
    code, out, err = run_cli(["simulate", "example:pipeline", "--costs", str(trace), "--trace", str(trace)], capsys)
    assert code == 2 and err == f"Error: --trace: {trace}: is an input of this run; refusing to overwrite it\n"
    assert trace.read_bytes() == before
    code, out, err = run_cli(["simulate", "example:pipeline", "--trace", str(tmp_path / "x"), "--order-out",
                              str(tmp_path / "x")], capsys)
    assert code == 2 and "the trace is written there already" in err


def test_request_errors_name_the_option_of_their_command(capsys):
    """run's device choice is --backend; simulate's device count is --devices: each error names its own."""
    code, _, err = run_cli(["example:pipeline", "--backend", "cuda", "--no-summary"], capsys)
    if code != 0:  # no GPU here
        assert code == 2 and err.startswith(("Error: --backend: no usable CUDA device",
                                             "Error: --backend: the graph uses cuda:1 and cupy sees 1 CUDA device"))
    code, _, err = run_cli(["simulate", "example:pipeline", "--devices", "1", "--placement", "keep"], capsys)
    assert code == 2 and err.startswith("Error: --devices: ")


@pytest.mark.parametrize("args", [
    ["check", "example:seed", "--rtol", "nan"], ["check", "example:seed", "--atol", "inf"],
    ["diff", "a.json", "b.json", "--alpha", "nan"], ["view", "t.json", "--timeout", "nan"],
])
def test_number_options_refuse_nan_and_infinity(capsys, args):
    """click's FloatRange lets NaN through (it compares false with both ends): a NaN tolerance failed
    every gradient, a NaN --alpha passed nothing, a NaN view --timeout never stopped the server."""
    code, out, err = run_cli(args, capsys)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"Error: Invalid value for '{args[-2]}': '{args[-1]}': must be a finite number"


@pytest.mark.parametrize("flag", ["--trace", "--order-out"])
def test_run_never_writes_over_its_measured_costs(tmp_path, capsys, flag):
    trace = tmp_path / "t.json"
    assert run_cli(["example:pipeline", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    before = trace.read_bytes()
    code, out, err = run_cli(["example:pipeline", "--costs", str(trace), flag, str(trace)], capsys)
    assert (code, out) == (2, "") and err == f"Error: {flag}: {trace}: is an input of this run; refusing to overwrite it\n"
    assert trace.read_bytes() == before


@pytest.mark.parametrize("args, message", [
    (["--grad", "--backward", "--inputs", "a"], "Error: --grad and --backward: choose one\n"),
    (["--backward", "--grad", "--inputs", "a"], "Error: --grad and --backward: choose one\n"),
    (["--allow-unused"], "Error: --allow-unused: applies to grad() only (--grad, or a graph file in grad mode); "
                         "example:seed runs backward(), where an input the graph does not reach is no error\n"),
    (["--backward", "--inputs", "a", "--allow-unused"], "Error: --allow-unused: applies to grad() only"),
])
def test_run_mode_options_that_contradict_or_do_not_apply(capsys, args, message):
    """The last of --grad/--backward used to win silently, and --allow-unused was ignored by backward()."""
    code, out, err = run_cli(["example:seed", "--no-summary", *args], capsys)
    assert (code, out) == (2, "") and err.startswith(message)


def test_diff_sides_refuse_both_modes(capsys):
    code, out, err = run_cli(["diff", "example:seed", "--a", "--grad --backward --inputs a"], capsys)
    assert (code, out, err) == (2, "", "Error: --a: --grad and --backward: choose one\n")


@pytest.mark.parametrize("args, message", [
    (["--compare", "policy=fifo", "--policy", "pytorch"],
     "Error: --policy and --compare policy=...: give the policy values in --compare only\n"),
    (["--compare", "fifo,pytorch", "--policy", "critical-path"],
     "Error: --policy and --compare policy=...: give the policy values in --compare only\n"),
    (["--compare", "devices=1,2", "--devices", "3"],
     "Error: --devices and --compare devices=...: give the devices values in --compare only\n"),
    (["--compare", "policy=fifo,pytorch", "--slack", "3"], "Error: --slack goes with one simulation, not with --compare\n"),
    (["--compare", "policy=fifo,pytorch", "--trace", "t.json"],
     "Error: --trace writes one simulation: with --compare, simulate the variant you want written on its own\n"),
    (["--compare", "devices=1,2", "--order-out", "o.jsonl"],
     "Error: --order-out writes one simulation: with --compare, simulate the variant you want written on its own\n"),
])
def test_simulate_compare_refuses_what_it_would_override_or_apply_to_one_variant(tmp_path, capsys, args, message):
    code, out, err = run_cli(["simulate", "example:pipeline", *[str(tmp_path / a) if a.endswith((".json", ".jsonl"))
                                                                 else a for a in args]], capsys)
    assert (code, out, err) == (2, "", message)
    assert list(tmp_path.iterdir()) == []


def test_simulate_compare_policies_on_given_devices(capsys):
    code, out, err = run_cli(["simulate", "example:pipeline", "--compare", "policy=fifo,pytorch", "--devices", "2",
                              "--json"], capsys)
    assert code == 0 and [(r["policy"], r["devices"]) for r in json.loads(out)] == [("fifo", 2), ("pytorch", 2)]


@pytest.mark.parametrize("side, message", [
    ("--timeout 5", "Error: --a: --timeout is not available here (a side only measures)\n"),
    ("--no-summary", "Error: --a: --summary/--no-summary is not available here (a side only measures)\n"),
    ("simulate --slack 3", "Error: --a: --slack is not available here (a side only measures)\n"),
])
def test_diff_sides_refuse_options_they_would_ignore(capsys, side, message):
    code, out, err = run_cli(["diff", "example:seed", "--a", side], capsys)
    assert (code, out, err) == (2, "", message)


def test_diff_run_sides_apply_measured_costs(tmp_path, capsys):
    """A run side's --costs and --step were parsed and then dropped (never read, never applied)."""
    missing = tmp_path / "missing.json"
    code, out, err = run_cli(["diff", "example:seed", "--a", f"--costs {missing}"], capsys)
    assert (code, out, err) == (2, "", f"Error: --a: --costs: {missing}: no such file\n")
    code, out, err = run_cli(["diff", "example:seed", "--b", "--step 2"], capsys)
    assert (code, out, err) == (2, "", "Error: --b: --step: a step is picked from measured costs: give them too\n")
    trace = tmp_path / "t.json"
    assert run_cli(["example:seed", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    code, out, err = run_cli(["diff", "example:seed", "--a", f"--costs {trace}", "--json"], capsys)
    assert code == 0, err


def test_diff_warmup_goes_with_a_graph(tmp_path, capsys):
    code, out, err = run_cli(["diff", "a.json", "b.json", "--warmup", "3"], capsys)
    assert (code, out, err) == (2, "", "Error: --warmup goes with one GRAPH run two ways, not with two files to compare\n")


@pytest.mark.parametrize("command", ["run", "simulate", "calibrate", "capture", "check", "view", "diff", "draw",
                                     "sweep", "gen"])
def test_every_help_says_ranges_in_words_with_a_metavar(capsys, command):
    """One style across commands: `--top N ... [default: 10; 1 to 10000]`, not `--top INTEGER RANGE
    [1<=x<=10000]` next to `--repeat N [1 to 1000000]`; every -o is a FILE."""
    code, out, err = run_cli([command, "--help"], capsys)
    assert code == 0
    for bad in ("INTEGER RANGE", "FLOAT RANGE", "<=x", "x>=", "<x", "-o, --output TEXT"):
        assert bad not in out, (command, bad)


@pytest.mark.parametrize("args, message", [
    (["simulate", "example:seed", "--devices", "0"], "Error: Invalid value for '--devices': '0': must be a whole "
                                                     "number, 1 to 1024"),
    (["diff", "a", "b", "--top", "0"], "Error: Invalid value for '--top': '0': must be a whole number, 1 to 10000"),
    (["diff", "a", "b", "--alpha", "1"], "Error: Invalid value for '--alpha': '1': must be a number, more than 0, "
                                         "less than 1"),
    (["check", "g.json", "--rtol", "-1"], "Error: Invalid value for '--rtol': '-1': must be a number, at least 0"),
])
def test_range_errors_in_words(capsys, args, message):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.splitlines()[-1] == message


@pytest.mark.parametrize("args, shown", [
    (["example:seed", "--trace", ""], "'--trace'"),
    (["example:seed", "--order-out", ""], "'--order-out'"),
    (["simulate", "example:seed", "--scale", ""], "'--scale'"),
    (["simulate", "example:seed", "--compare", ""], "'--compare'"),
    (["sweep", "-g", "example:seed", "--workers", "0", "--out", ""], "'--out'"),
    (["sweep", "-g", "example:seed", "--workers", "0", "--devices", ""], "'--devices'"),
    (["sweep", ""], "'[SPEC.yaml]'"),
    (["gen", "chain", "-o", ""], "'-o' / '--output'"),
    (["diff", "", ""], "'A B | GRAPH'"),
])
def test_an_empty_value_is_an_error(tmp_path, monkeypatch, capsys, args, shown):
    """`--trace "$OUT"` with OUT unset ran without a trace, exit 0; `--scale ''` scaled nothing; `sweep --out ''`
    wrote nothing: the CI step believed it had its file."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == f"Error: Invalid value for {shown}: an empty value (an unset shell variable?)"
    assert list(tmp_path.iterdir()) == []


def test_empty_values_that_mean_something_stay(capsys):
    code, out, err = run_cli(["diff", "example:seed", "--a", "", "--b", "--no-multithreading", "--json"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["example:seed", "--inputs", ""], capsys)
    assert (code, err) == (2, "Error: --inputs: no inputs given\n")


def test_simulate_never_writes_over_the_graphs_side_files_or_its_network(tmp_path, capsys):
    """A review found simulate's --trace and --order-out could replace the graph's .npz side file or the
    --network file (run refused the first already)."""
    d = {"format": "autograd-graph/1", "roots": [{"node": "m", "grad": "ones"}],
         "variables": [{"name": "a", "shape": [2]}],
         "nodes": [{"id": "m", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
                    "saved": {"other": {"npz": "w"}}},
                   {"id": "acc", "name": "AccumulateGrad", "variable": "a", "inputs": [{"shape": [2]}]}]}
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(d))
    import numpy as np
    np.savez(tmp_path / "g.npz", w=np.ones(2))
    net = tmp_path / "net.json"
    net.write_text(json.dumps({"link": {"alpha_us": 10, "gbps": 1}}))
    before = {p: p.read_bytes() for p in (tmp_path / "g.npz", net)}
    for flag in ("--trace", "--order-out"):
        for target in before:
            code, out, err = run_cli(["simulate", str(graph), "--ddp", "defaults", "--world", "2", "--network",
                                      str(net), flag, str(target)], capsys)
            assert (code, out) == (2, ""), err
            assert err == f"Error: {flag}: {target}: is an input of this run; refusing to overwrite it\n"
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("scale, message", [
    ("cuda:0=2,cuda:0=3", "'cuda:0' is given twice"),
    (",", "',': expected NAME=FACTOR[,NAME=FACTOR...]"),
    ("cuda:0=1_000", "'cuda:0=1_000': expected NAME=FACTOR with a factor from 0 to 1e+06"),
])
def test_simulate_scale_refuses_a_repeated_name_and_slips(scale, message, capsys):
    """The last of a repeated name won, a lone comma scaled nothing and 1_000 read as a thousand: each is refused."""
    code, out, err = run_cli(["simulate", "example:pipeline", "--scale", scale], capsys)
    assert (code, out, err) == (2, "", f"Error: --scale: {message}\n")


@pytest.mark.parametrize("args, message", [
    (["--world", "2", "--network", "nope"], "Error: --network: nope: not KEY=VALUE pairs (alpha_us=A,gbps=B)"),
    (["--world", "2", "--network", "alpha_us=1,gbps=1", "--compare", "prefetch=0,1"],
     "Error: --compare prefetch=... is not a setting of --ddp (--compare bucket_cap_mb=... or world=... compare "
     "DDP settings)"),
])
def test_ddp_option_errors_name_the_option(args, message, capsys):
    code, out, err = run_cli(["simulate", "example:mlp", "--ddp", "defaults", *args], capsys)
    assert (code, out) == (2, "") and err.startswith(message), err


@pytest.mark.parametrize("factor", ["1e18", "1e300", "inf", "-1"])
def test_simulate_scale_factors_are_bounded(factor, capsys):
    """A factor of 1e18 was an OverflowError traceback (a 64-bit count of ns)."""
    code, out, err = run_cli(["simulate", "example:pipeline", "--scale", f"cuda:0={factor}"], capsys)
    assert (code, out) == (2, "")
    assert err == f"Error: --scale: 'cuda:0={factor}': expected NAME=FACTOR with a factor from 0 to 1e+06\n"


@pytest.mark.parametrize("args", [
    ["run", "example:seed", "--expect-order", "{fifo}"], ["run", "example:seed", "--expect-order", "/dev/zero"],
    ["diff", "{fifo}", "{fifo}"], ["diff", "/dev/zero", "/dev/zero"],
    ["draw", "example:seed", "-o", "{out}", "--trace", "{fifo}"],
    ["draw", "example:seed", "-o", "{out}", "--costs", "{fifo}"],
    ["draw", "example:seed", "-o", "{out}", "--diff", "{fifo}", "{fifo}"],
    ["simulate", "example:seed", "--costs", "/dev/zero"],
])
def test_inputs_that_are_not_regular_files_are_refused_not_read(args, tmp_path):
    """A FIFO blocked these commands for ever, and /dev/zero as --expect-order read until memory ran out
    (found by a hostile review): every input file is now checked to be a regular file before it is opened."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    argv = [a.format(fifo=fifo, out=tmp_path / "o.svg") for a in args]
    r = subprocess.run([sys.executable, "-m", "autograd_run", *argv], capture_output=True, text=True, timeout=60)
    bad = "/dev/zero" if "/dev/zero" in argv else str(fifo)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith("Error: ") and f"{bad}: is a " in r.stderr and "not a regular file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def _chain_json() -> bytes:
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    return dumps(generate("chain", n=5), "json")


@pytest.mark.parametrize("cmd, option, target", [
    (["run", "-", "--no-summary"], "--trace", "same"), (["run", "-", "--no-summary"], "--trace", "/dev/stdin"),
    (["run", "-", "--no-summary"], "--order-out", "/proc/self/fd/0"),
    (["simulate", "-", "--no-summary"], "--trace", "/dev/fd/0"), (["simulate", "-"], "--order-out", "same"),
])
def test_a_graph_on_stdin_is_never_overwritten(tmp_path, cmd, option, target):
    """``< graph.json``: standard input is that file, so an output that names it (by its path, or as
    /dev/stdin and its kin) is an input of the run, as a graph named by its path is."""
    victim = tmp_path / "g.json"
    victim.write_bytes(_chain_json())
    before = victim.read_bytes()
    out = str(victim) if target == "same" else target
    from cli_proc import cli_argv, cli_env
    with open(victim, "rb") as f:
        p = subprocess.run(cli_argv([*cmd, option, out]), stdin=f, capture_output=True, env=cli_env(), timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.decode() == f"Error: {option}: {out}: is an input of this run; refusing to overwrite it\n"
    assert victim.read_bytes() == before


def test_a_graph_piped_in_may_be_traced_to_stdout():
    from cli_proc import cli
    p = cli(["-", "--no-summary", "--trace", "/dev/stdout"], input=_chain_json())
    assert p.code == 0, p.err
    assert json.loads(p.out)["traceEvents"]


def test_an_output_fifo_without_a_reader_is_refused_and_one_with_a_reader_is_written(tmp_path):
    """Opening a FIFO to write waits for a reader: with none, the command says so instead of waiting for ever;
    with one, the file goes through it, whole."""
    import threading
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    from cli_proc import cli
    p = cli(["gen", "chain", "--size", "5", "-o", str(fifo)], timeout=60)
    assert (p.code, p.err) == (2, f"Error: -o: {fifo}: a FIFO that no process is reading; start its reader first\n")
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    p = cli(["gen", "chain", "--size", "5", "-o", str(fifo)], timeout=60)
    reader.join(30)
    assert p.code == 0, p.err
    assert not reader.is_alive() and len(json.loads(got[0])["nodes"]) == 6


def test_stdin_is_read_no_further_than_memory_allows(monkeypatch):
    """A stream has no size to check before it is read: it is read until what it would take to load passes
    what the machine has left, then refused as a file of that size would be."""
    import io
    from autograd_run.errors import GraphFileError
    from autograd_run.graphs import load
    monkeypatch.setattr(load, "MEMORY_CHECK_FROM", 0)
    monkeypatch.setattr(load, "memory_available", lambda: 9 * 1000)
    assert load.read_stream(io.BytesIO(b"x" * 1000)) == b"x" * 1000
    stream = io.BytesIO(b"x" * 10**6)
    with pytest.raises(GraphFileError) as e:
        load.read_stream(stream)
    assert e.value.file == "<stdin>" and e.value.what.startswith("loading this 1001 B file takes at least")
    assert stream.tell() == 1001  # (read no further than the cap)


@pytest.mark.parametrize("args, message", [
    (["--costs", "{d}/blank.json"], "Error: --costs: {d}/blank.json: the file is empty"),
    (["--spec", "{d}"], "Error: --spec: {d}: not a regular file (a folder, a device or a FIFO)"),
    (["--spec", "/dev/zero"], "Error: --spec: /dev/zero: not a regular file (a folder, a device or a FIFO)"),
    (["--ddp", "defaults", "--world", "2", "--network", "{d}"],
     "Error: --network: {d}: not a regular file (a folder, a device or a FIFO)"),
])
def test_a_blank_or_irregular_side_file_is_named_so(tmp_path, capsys, args, message):
    """A file of one newline read as a Perfetto protobuf trace (its first byte is 0x0a, as a Trace's is), and a
    folder or device given as a spec or network was "not a shipped spec ... nor a file"."""
    (tmp_path / "blank.json").write_text("\n")
    code, out, err = run_cli(["simulate", "example:mlp", *[a.format(d=tmp_path) for a in args]], capsys)
    assert (code, out, err) == (2, "", message.format(d=tmp_path) + "\n")
