"""The command line: exit codes, `Error: ...` on stderr, no tracebacks."""

import json

import pytest
from click.testing import CliRunner

from autograd_run.cli.main import cli, main


def invoke(args):
    runner = CliRunner()
    try:
        result = runner.invoke(cli, args, catch_exceptions=True, prog_name="autograd-run",
                               standalone_mode=False)
    except SystemExit:
        raise
    return result


def run_main(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


def test_default_command_runs_a_graph_and_writes_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    code, out, err = run_main(["example:seed", "--trace", str(trace)], capsys)
    assert code == 0, err
    doc = json.loads(trace.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert names.count("MulBackward0") == 2 and "SumBackward0" in names


def test_validate_ok_and_errors(tmp_path, capsys):
    code, out, err = run_main(["validate", "example:seed"], capsys)
    assert code == 0 and "5 nodes, 5 edges, devices: cpu, roots: 1" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: autograd-graph/1\nroots: [{node: x}]\nnodes:\n  - {id: x, name: Nope}\n")
    code, out, err = run_main(["validate", str(bad), "example:seed"], capsys)
    assert code == 2
    assert err.startswith(f"Error: {bad}: line 4, column")
    assert "unknown op 'Nope'" in err and "Traceback" not in err


def test_backward_error_exit_1(capsys):
    code, out, err = run_main(["run", "example:failing", "--no-summary"], capsys)
    assert code == 1
    assert err.strip() == "Error: node 'mul_c' (MulBackward0): simulated failure in c = a * 3"


def test_inject_error_and_nan(capsys):
    code, _, err = run_main(["example:seed", "--inject-error", "add", "--no-summary"], capsys)
    assert code == 1 and "node 'add'" in err
    code, _, err = run_main(["example:seed", "--inject-nan", "mul_b", "--anomaly", "--no-summary"], capsys)
    assert code == 1 and "Function 'MulBackward0' returned nan values in its 0th output." in err
    assert "Traceback of forward call" in err
    code, _, err = run_main(["example:seed", "--inject-error", "ghost"], capsys)
    assert code == 2 and "no node 'ghost'" in err


def test_python_nodes_need_allow_python(capsys):
    code, _, err = run_main(["example:reentrant", "--no-summary"], capsys)
    assert code == 1 and "--allow-python" in err
    code, out, err = run_main(["example:reentrant", "--allow-python"], capsys)
    assert code == 0, err


def test_order_out(tmp_path, capsys):
    p = tmp_path / "order.jsonl"
    code, _, err = run_main(["example:seed", "--no-summary", "--order-out", str(p)], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert rows[0]["position"] == 0 and rows[2]["seq"] == 1


def test_gen_then_run(tmp_path, capsys):
    out_file = tmp_path / "tf.json"
    code, out, err = run_main(["gen", "transformer", "--layers", "2", "--devices", "2", "-o", str(out_file)], capsys)
    assert code == 0, err
    code, out, err = run_main(["validate", str(out_file)], capsys)
    assert code == 0 and "cuda:0, cuda:1" in out
    code, out, err = run_main([str(out_file), "--no-summary"], capsys)
    assert code == 0, err
    code, out, err = run_main(["gen", "mlp", "-o", str(tmp_path / "x.txt")], capsys)
    assert code == 2 and err.startswith("Error: ")


def test_grad_mode_with_inputs(capsys):
    code, out, err = run_main(["example:seed", "--grad", "--inputs", "a"], capsys)
    assert code == 0, err
    assert "gradients (grad)" in out
    code, out, err = run_main(["example:seed", "--grad", "--inputs", "zz"], capsys)
    assert code == 2 and "'zz'" in err


def test_missing_file_is_a_clean_error(capsys):
    code, out, err = run_main(["/no/such/graph.yaml"], capsys)
    assert code == 2 and err.strip() == "Error: /no/such/graph.yaml: no such file"


def test_help_shows_examples(capsys):
    for cmd in (["--help"], ["run", "--help"], ["validate", "--help"], ["gen", "--help"], ["examples", "--help"],
                ["capture", "--help"], ["check", "--help"]):
        code, out, err = run_main(cmd, capsys)
        assert code == 0 and "autograd-run" in out and "Example" in out


def test_expect_order_matches_and_mismatches(tmp_path, capsys):
    golden = tmp_path / "golden.jsonl"
    code, _, err = run_main(["example:mlp", "--no-multithreading", "--order-out", str(golden), "--no-summary"], capsys)
    assert code == 0, err
    code, out, err = run_main(["example:mlp", "--no-multithreading", "--expect-order", str(golden), "--no-summary"], capsys)
    assert code == 0 and "order matches" in out
    rows = golden.read_text().splitlines()
    rows[1], rows[2] = rows[2], rows[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    code, out, err = run_main(["example:mlp", "--no-multithreading", "--expect-order", str(bad), "--no-summary"], capsys)
    assert code == 3
    assert "order differs at position 1" in err and "ready set at that pop" in err
    assert "<- popped" in err
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    code, out, err = run_main(["example:mlp", "--expect-order", str(tmp_path / "junk.jsonl")], capsys)
    assert code == 2 and "line 1" in err


def test_expect_order_per_worker_with_device_threads(tmp_path, capsys):
    golden = tmp_path / "g.jsonl"
    code, _, err = run_main(["example:pipeline", "--order-out", str(golden), "--no-summary"], capsys)
    assert code == 0, err
    code, out, err = run_main(["example:pipeline", "--expect-order", str(golden), "--no-summary"], capsys)
    assert code == 0 and "compared per worker" in out


def test_repeat_and_json(capsys):
    code, out, err = run_main(["example:seed", "--repeat", "4", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"]["passes"]["count"] == 4
    assert doc["summary"]["nodes_executed"] == 20
    assert doc["grads"]["a"] == [5.0, 5.0]


def test_seed_changes_random_draws_reproducibly(capsys):
    outs = []
    for seed in ("1", "1", "2"):
        code, out, err = run_main(["example:pipeline", "--seed", seed, "--json", "--no-multithreading"], capsys)
        assert code == 0, err
        outs.append(json.loads(out)["grads"]["w0"])
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_no_color_and_width_are_honoured(monkeypatch, capsys):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "60")
    code, out, err = run_main(["example:seed"], capsys)
    assert code == 0 and "\x1b[" not in out
    assert max(len(line) for line in out.splitlines()) <= 60


# -- every run option through click's CliRunner -------------------------------------

@pytest.fixture
def runner():
    return CliRunner()


def test_cli_runner_options(runner, tmp_path):
    r = runner.invoke(cli, ["run", "example:seed", "--retain-graph", "--no-summary"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["run", "example:seed", "--create-graph", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["grads"]["a"] == [5.0, 5.0]
    r = runner.invoke(cli, ["run", "example:pipeline", "--devices", "virtual", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["devices"] == "virtual"
    r = runner.invoke(cli, ["run", "example:seed", "--backward", "--inputs", "a", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["grads"]["a"] == [5.0, 5.0]
    r = runner.invoke(cli, ["run", "example:seed", "--summary"])
    assert r.exit_code == 0 and "critical path" in r.output and "gradients (backward)" in r.output
    r = runner.invoke(cli, ["run", "example:seed", "--repeat", "0"])
    assert r.exit_code == 2


def test_verbose_shows_the_node_traceback(capsys):
    code, out, err = run_main(["example:failing", "--no-summary", "--verbose"], capsys)
    assert code == 1 and "Traceback" in err and "simulated failure" in err
    code, out, err = run_main(["example:failing", "--no-summary"], capsys)
    assert "Traceback" not in err


def test_unknown_option_is_a_usage_error(capsys):
    code, out, err = run_main(["example:seed", "--frobnicate"], capsys)
    assert code == 2 and "No such option" in err


def test_a_missing_saved_value_names_the_node(tmp_path, capsys):
    doc = {"format": "autograd-graph/1", "roots": [{"node": "m", "grad": "ones"}],
           "variables": [{"name": "a", "shape": [2]}],
           "nodes": [{"id": "m", "name": "MulBackward0", "seq": 1, "next": [["acc", 0], None], "inputs": [{"shape": [2]}]},
                     {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]}
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    code, out, err = run_main([str(f), "--no-summary"], capsys)
    # Found while loading now (exit 2), before the backward runs.
    assert code == 2
    assert err.strip() == (f"Error: {f}: node 'm' at $.nodes[0]: MulBackward0 node 'm' needs saved field 'other' "
                           "(a tensor (a number, a nested list of numbers, or a spec with 'data', 'npz' or 'random')) "
                           "for the gradient of its output 0, which the file does not give")


def test_progress_bar_is_silent_when_stderr_is_not_a_terminal(capsys):
    code, out, err = run_main(["example:seed", "--repeat", "3", "--no-summary"], capsys)
    assert code == 0 and err == ""
