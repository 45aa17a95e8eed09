"""The command line, one scenario per test: exit codes (0 ok, 1 a node failed, 2 a bad request,
3 an order mismatch), ``Error: ...`` on stderr naming the flag at fault, and no tracebacks."""

import json
import shutil
from importlib.resources import files

import pytest
from click.testing import CliRunner

from autograd_run.cli.main import cli
from builders import doc, leaf, node, run_cli


@pytest.fixture
def seed_file(tmp_path):
    """A copy of example:seed as a file of the user's."""
    path = tmp_path / "seed.yaml"
    shutil.copyfile(files("autograd_run.graphs") / "examples" / "seed.yaml", path)
    return path


def order_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- running a graph ---------------------------------------------------------------------------

def test_default_command_runs_a_graph_and_writes_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    code, out, err = run_cli(["example:seed", "--trace", str(trace)], capsys)
    assert code == 0, err
    d = json.loads(trace.read_text())
    names = [e["name"] for e in d["traceEvents"] if e.get("ph") == "X"]
    assert {"mul_b MulBackward0", "mul_c MulBackward0", "sum SumBackward0"} <= set(names)


def test_a_failing_node_exits_1_naming_it(capsys):
    code, out, err = run_cli(["run", "example:failing", "--no-summary"], capsys)
    assert code == 1
    assert err.strip() == "Error: node 'mul_c' (MulBackward0): simulated failure in c = a * 3"


def test_a_failing_node_shows_no_traceback_by_default(capsys):
    code, out, err = run_cli(["example:failing", "--no-summary"], capsys)
    assert code == 1 and "Traceback" not in err


def test_verbose_shows_the_node_traceback(capsys):
    code, out, err = run_cli(["example:failing", "--no-summary", "--verbose"], capsys)
    assert code == 1 and "Traceback" in err and "simulated failure" in err


def test_a_missing_saved_value_names_the_node(tmp_path, capsys):
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc(
        node("m", "MulBackward0", seq=1, next=["acc", None], inputs=[[2]]),  # no saved 'other'
        leaf("a", [2], id="acc"),
    )))
    code, out, err = run_cli([str(f), "--no-summary"], capsys)
    # Found while loading (exit 2), before the backward runs.
    assert code == 2
    assert err.strip() == (f"Error: {f}: node 'm' at $.nodes[0]: MulBackward0 node 'm' needs saved field 'other' "
                           "(a tensor (a number, a nested list of numbers, or a spec with 'data', 'npz' or 'random')) "
                           "for the gradient of its output 0, which the file does not give")


def test_python_nodes_need_allow_python(capsys):
    # Refused while loading (exit 2), before any node runs.
    code, _, err = run_cli(["example:reentrant", "--no-summary"], capsys)
    assert code == 2 and "--allow-python" in err and err.count("\n") == 1


def test_allow_python_runs_python_nodes(capsys):
    code, out, err = run_cli(["example:reentrant", "--allow-python"], capsys)
    assert code == 0, err


def test_repeat_and_json(capsys):
    code, out, err = run_cli(["example:seed", "--repeat", "4", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["summary"]["passes"]["count"] == 4
    assert d["summary"]["nodes_executed"] == 20
    assert d["grads"]["a"] == [5.0, 5.0]


def test_seed_changes_random_draws_reproducibly(capsys):
    outs = []
    for seed in ("1", "1", "2"):
        code, out, err = run_cli(["example:pipeline", "--seed", seed, "--json", "--no-multithreading"], capsys)
        assert code == 0, err
        outs.append(json.loads(out)["grads"]["w0"])
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_no_color_and_width_are_honoured(monkeypatch, capsys):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "60")
    code, out, err = run_cli(["example:seed"], capsys)
    assert code == 0 and "\x1b[" not in out
    assert max(len(line) for line in out.splitlines()) <= 60


def test_progress_bar_is_silent_when_stderr_is_not_a_terminal(capsys):
    code, out, err = run_cli(["example:seed", "--repeat", "3", "--no-summary"], capsys)
    assert code == 0 and err == ""


# -- run options through click's CliRunner ------------------------------------------------------

def test_retain_graph():
    r = CliRunner().invoke(cli, ["run", "example:seed", "--retain-graph", "--no-summary"])
    assert r.exit_code == 0, r.output


def test_create_graph_gives_the_same_gradients():
    r = CliRunner().invoke(cli, ["run", "example:seed", "--create-graph", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["grads"]["a"] == [5.0, 5.0]


def test_virtual_devices_are_reported():
    r = CliRunner().invoke(cli, ["run", "example:pipeline", "--devices", "virtual", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["devices"] == "virtual"


def test_backward_with_inputs_accumulates_them():
    r = CliRunner().invoke(cli, ["run", "example:seed", "--backward", "--inputs", "a", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["grads"]["a"] == [5.0, 5.0]


def test_summary_shows_the_critical_path_and_gradients():
    r = CliRunner().invoke(cli, ["run", "example:seed", "--summary"])
    assert r.exit_code == 0 and "critical path" in r.output and "gradients (backward)" in r.output


def test_repeat_must_be_at_least_one():
    r = CliRunner().invoke(cli, ["run", "example:seed", "--repeat", "0"])
    assert r.exit_code == 2


# -- faults --------------------------------------------------------------------------------------

def test_inject_error_makes_that_node_fail(capsys):
    code, _, err = run_cli(["example:seed", "--inject-error", "add", "--no-summary"], capsys)
    assert code == 1 and "node 'add'" in err


def test_inject_nan_with_anomaly_names_the_output(capsys):
    code, _, err = run_cli(["example:seed", "--inject-nan", "mul_b", "--anomaly", "--no-summary"], capsys)
    assert code == 1 and "Function 'MulBackward0' returned nan values in its 0th output." in err
    assert "Traceback of forward call" in err


def test_inject_error_into_an_unknown_node_is_refused(capsys):
    code, out, err = run_cli(["example:seed", "--inject-error", "ghost"], capsys)
    assert code == 2 and err == "Error: --inject-error: no node 'ghost' in example:seed\n"


def test_inject_error_and_nan_into_one_node_is_refused(capsys):
    code, out, err = run_cli(["example:seed", "--inject-error", "add", "--inject-nan", "add"], capsys)
    assert code == 2 and out == ""
    assert err == "Error: --inject-nan: node 'add' cannot both raise and return NaN\n"


def test_inject_nan_into_an_accumulate_grad_node_is_refused(capsys):
    code, out, err = run_cli(["example:seed", "--inject-nan", "acc_a"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("Error: --inject-nan: node 'acc_a' is an AccumulateGrad node")


# -- inputs and modes -----------------------------------------------------------------------------

def test_grad_mode_with_inputs(capsys):
    code, out, err = run_cli(["example:seed", "--grad", "--inputs", "a"], capsys)
    assert code == 0, err
    assert "gradients (grad)" in out


def test_an_unknown_input_is_refused(capsys):
    code, out, err = run_cli(["example:seed", "--grad", "--inputs", "zz"], capsys)
    assert code == 2 and err.startswith("Error: --inputs: 'zz' is neither a variable nor a node id")


def test_inputs_naming_nothing_are_refused(capsys):
    code, out, err = run_cli(["example:seed", "--inputs", ","], capsys)
    assert code == 2 and err == "Error: --inputs: no inputs given\n"


def test_grad_on_a_graph_without_inputs_is_refused(capsys):
    code, out, err = run_cli(["example:seed", "--grad"], capsys)
    assert code == 2 and err == "Error: --inputs: `inputs` argument to `grad()` cannot be empty.\n"


# -- output files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--trace", "--order-out"])
def test_an_output_over_the_graph_file_is_refused(seed_file, capsys, flag):
    before = seed_file.read_bytes()
    code, out, err = run_cli([str(seed_file), flag, str(seed_file)], capsys)
    assert code == 2 and out == ""
    assert err == f"Error: {flag}: {seed_file}: is an input of this run; refusing to overwrite it\n"
    assert seed_file.read_bytes() == before


def test_order_out_over_the_golden_order_is_refused(tmp_path, capsys):
    golden = tmp_path / "golden.jsonl"
    assert run_cli(["example:seed", "--no-summary", "--order-out", str(golden)], capsys)[0] == 0
    before = golden.read_bytes()
    code, out, err = run_cli(["example:seed", "--expect-order", str(golden), "--order-out", str(golden)], capsys)
    assert code == 2 and err.startswith(f"Error: --order-out: {golden}: is an input of this run")
    assert golden.read_bytes() == before


def test_trace_into_a_missing_folder_fails_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["example:seed", "--trace", "nodir/t.json", "--order-out", "order.jsonl"], capsys)
    assert code == 2
    assert err == "Error: --trace: nodir/t.json: no such directory: nodir\n"
    assert out == "" and not (tmp_path / "order.jsonl").exists()  # no summary, no order: nothing ran


# -- order files ----------------------------------------------------------------------------------

def test_order_out_writes_one_row_per_node(tmp_path, capsys):
    p = tmp_path / "order.jsonl"
    code, _, err = run_cli(["example:seed", "--no-summary", "--order-out", str(p)], capsys)
    assert code == 0, err
    rows = order_rows(p)
    assert [r["id"] for r in rows] == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert rows[0]["position"] == 0 and rows[2]["seq"] == 1


def test_expect_order_matches(tmp_path, capsys):
    golden = tmp_path / "golden.jsonl"
    code, _, err = run_cli(["example:mlp", "--no-multithreading", "--order-out", str(golden), "--no-summary"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["example:mlp", "--no-multithreading", "--expect-order", str(golden), "--no-summary"],
                             capsys)
    assert code == 0 and "order matches" in out


def test_expect_order_mismatch_shows_the_ready_set(tmp_path, capsys):
    golden = tmp_path / "golden.jsonl"
    assert run_cli(["example:mlp", "--no-multithreading", "--order-out", str(golden), "--no-summary"], capsys)[0] == 0
    rows = golden.read_text().splitlines()
    rows[1], rows[2] = rows[2], rows[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(rows) + "\n")
    code, out, err = run_cli(["example:mlp", "--no-multithreading", "--expect-order", str(bad), "--no-summary"], capsys)
    assert code == 3
    assert "order differs at position 1" in err and "ready set at that pop" in err
    assert "<- popped" in err


def test_a_malformed_golden_order_names_its_line(tmp_path, capsys):
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{not json\n")
    code, out, err = run_cli(["example:mlp", "--expect-order", str(junk)], capsys)
    assert code == 2 and err.startswith(f"Error: --expect-order: {junk}: line 1: not JSON")


def test_expect_order_per_worker_with_device_threads(tmp_path, capsys):
    golden = tmp_path / "g.jsonl"
    code, _, err = run_cli(["example:pipeline", "--order-out", str(golden), "--no-summary"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["example:pipeline", "--expect-order", str(golden), "--no-summary"], capsys)
    assert code == 0 and "compared per worker" in out


def test_order_of_repeated_passes_is_their_golden(tmp_path, capsys):
    golden = tmp_path / "golden.jsonl"
    code, _, err = run_cli(["example:seed", "--repeat", "3", "--no-summary", "--order-out", str(golden)], capsys)
    assert code == 0, err
    assert [r["pass"] for r in order_rows(golden)] == [0] * 5 + [1] * 5 + [2] * 5
    code, out, err = run_cli(["example:seed", "--repeat", "3", "--no-summary", "--expect-order", str(golden)], capsys)
    assert code == 0, err
    assert "order matches" in out and "(15 nodes)" in out


def test_expect_order_compares_every_pass(tmp_path, capsys):
    """A golden order of three passes whose last pass differs: the run's third pass is caught."""
    golden = tmp_path / "golden.jsonl"
    assert run_cli(["example:seed", "--repeat", "3", "--no-summary", "--order-out", str(golden)], capsys)[0] == 0
    rows = golden.read_text().splitlines()
    rows[12], rows[13] = rows[13], rows[12]  # pass 2: mul_c, mul_b -> mul_b, mul_c
    golden.write_text("\n".join(rows) + "\n")
    code, out, err = run_cli(["example:seed", "--repeat", "3", "--no-summary", "--expect-order", str(golden)], capsys)
    assert code == 3
    assert "order differs at position 2 in pass 2: expected mul_b" in err


# -- other commands -------------------------------------------------------------------------------

def test_validate_prints_a_line_per_graph(capsys):
    code, out, err = run_cli(["validate", "example:seed"], capsys)
    assert code == 0 and "5 nodes, 5 edges, devices: cpu, roots: 1" in out


def test_validate_names_the_file_line_and_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: autograd-graph/1\nroots: [{node: x}]\nnodes:\n  - {id: x, name: Nope}\n")
    code, out, err = run_cli(["validate", str(bad), "example:seed"], capsys)
    assert code == 2
    assert err.startswith(f"Error: {bad}: line 4, column")
    assert "unknown op 'Nope'" in err and "Traceback" not in err


def test_gen_then_validate_then_run(tmp_path, capsys):
    out_file = tmp_path / "tf.json"
    code, out, err = run_cli(["gen", "transformer", "--layers", "2", "--devices", "2", "-o", str(out_file)], capsys)
    assert code == 0, err
    code, out, err = run_cli(["validate", str(out_file)], capsys)
    assert code == 0 and "cuda:0, cuda:1" in out
    code, out, err = run_cli([str(out_file), "--no-summary"], capsys)
    assert code == 0, err


def test_gen_refuses_an_unknown_extension(tmp_path, capsys):
    code, out, err = run_cli(["gen", "mlp", "-o", str(tmp_path / "x.txt")], capsys)
    assert code == 2 and err.startswith("Error: ")


def test_missing_file_is_a_clean_error(capsys):
    code, out, err = run_cli(["/no/such/graph.yaml"], capsys)
    assert code == 2 and err.strip() == "Error: /no/such/graph.yaml: no such file"


def test_unknown_option_is_a_usage_error(capsys):
    code, out, err = run_cli(["example:seed", "--frobnicate"], capsys)
    assert code == 2 and "No such option" in err


@pytest.mark.parametrize("command", [[], ["run"], ["validate"], ["gen"], ["examples"], ["capture"], ["check"]])
def test_help_shows_examples(capsys, command):
    code, out, err = run_cli([*command, "--help"], capsys)
    assert code == 0 and "autograd-run" in out and "Example" in out


def test_python_dash_m_runs_the_command():
    """``python -m autograd_run`` (no console script on PATH) is the command, not "No module named
    autograd_run.__main__"."""
    import subprocess
    import sys
    from cli_proc import cli_env
    p = subprocess.run([sys.executable, "-m", "autograd_run", "validate", "example:seed"], capture_output=True,
                       text=True, env=cli_env(), timeout=60)
    assert (p.returncode, p.stderr) == (0, "") and p.stdout.startswith("example:seed: ")
    p = subprocess.run([sys.executable, "-m", "autograd_run", "nope.json"], capture_output=True, text=True,
                       env=cli_env(), timeout=60)
    assert (p.returncode, p.stderr) == (2, "Error: nope.json: no such file\n")


def test_no_arguments_show_the_help_readably(capsys):
    """click raises the help as an error when no argument is given; escaping it (as other errors are) made
    it one line of \\n escapes."""
    from builders import run_cli
    code, out, err = run_cli([], capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: autograd-run [OPTIONS] COMMAND [ARGS]...\n\n  Replay and profile")
    assert "\\n" not in err and "\n  run " in err


def test_a_command_loads_only_its_own_modules():
    """``validate`` in a fresh process imports neither the engine, the simulator nor another command's module
    (they load when their command is asked for); ``--help`` still lists every command, and each one found by
    name is the command of its module."""
    import subprocess
    import sys
    code = ("import sys\nfrom autograd_run.cli.main import main\n"
            "try:\n    main(['validate', 'example:seed'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('autograd_run.engine.engine', 'autograd_run.sim.',"
            " 'autograd_run.cli.')) and not m.endswith(('.common', '.terminal', '.flags', '.version', '.main', '.jsonout'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("example:seed: ")
    assert out.stdout.splitlines()[-1] == "[]"
    from autograd_run.cli.main import COMMANDS
    import importlib
    names = cli.list_commands(None)
    assert names == sorted([*COMMANDS, "validate", "examples"])
    for name, (module, attr) in COMMANDS.items():
        assert cli.get_command(None, name) is getattr(importlib.import_module(f"autograd_run.cli.{module}"), attr)
