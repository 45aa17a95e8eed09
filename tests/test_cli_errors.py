"""Mistakes and accidents end in a clear ``Error: ...`` line and the documented exit code, never a
traceback: unwritable outputs, empty requests, malformed references, failing capture scripts, and a
reader of stdout that goes away (``autograd-run example:mlp | head -1``)."""

import os
import subprocess

import pytest

from cli_proc import cli_argv, cli_env


def closed_stdout(args):
    """Run with stdout a pipe whose reader has gone away before anything is written (as ``| head -1``)."""
    p = subprocess.Popen(cli_argv(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=60), err


@pytest.mark.parametrize("args", [["example:mlp"], ["example:mlp", "--json"], ["examples"],
                                  ["validate", "example:seed", "example:mlp"], ["simulate", "example:mlp"],
                                  ["--help"], ["--version"], ["run", "--help"], ["diff", "--help"]])
def test_a_closed_pipe_ends_quietly(args):
    code, err = closed_stdout(args)
    assert (code, err) == (0, "")


@pytest.fixture
def two_orders(tmp_path):
    from cli_proc import cli
    paths = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    for path, extra in zip(paths, ([], ["--no-multithreading"])):
        assert cli(["example:pipeline", "--devices", "virtual", "--no-summary", "--order-out", path, *extra]).code == 0
    return paths


@pytest.mark.parametrize("extra", [[], ["--json"], ["--markdown"]])
def test_a_closed_pipe_ends_diff_and_draw_quietly(tmp_path, two_orders, extra):
    """click turns a BrokenPipeError into exit status 1, and so did rich's plain Console in diff."""
    assert closed_stdout(["diff", *two_orders, *extra]) == (0, "")
    assert closed_stdout(["draw", "example:seed", "-o", str(tmp_path / "s.dot")]) == (0, "")


def test_a_closed_pipe_keeps_diffs_exit_status(two_orders):
    code, err = closed_stdout(["diff", *two_orders, "--fail-on", "workers"])
    assert code == 3 and err.startswith("Error: crossed: workers")


def test_a_closed_pipe_keeps_the_exit_status_of_a_failed_run():
    code, err = closed_stdout(["example:failing"])
    assert code == 1 and err == "Error: node 'mul_c' (MulBackward0): simulated failure in c = a * 3\n"


def test_gen_into_a_missing_folder(capsys):
    from builders import run_cli
    code, out, err = run_cli(["gen", "chain", "-o", "/nonexistent/c.json"], capsys)
    assert code == 2 and err == "Error: -o: /nonexistent/c.json: no such directory: /nonexistent\n"


@pytest.mark.parametrize("args, message", [
    (["--grad"], "Error: --inputs: `inputs` argument to `grad()` cannot be empty.\n"),
    (["--inputs", ","], "Error: --inputs: no inputs given\n"),
    (["--grad", "--inputs", " , "], "Error: --inputs: no inputs given\n"),
])
def test_empty_input_requests(capsys, args, message):
    from builders import run_cli
    code, out, err = run_cli(["example:seed", *args], capsys)
    assert (code, out, err) == (2, "", message)


CAPTURE_SCRIPT = '''
import torch

def raises():
    return 1 / 0

def not_a_tensor():
    return 3.5

def a_leaf():
    return torch.ones(2, requires_grad=True)

def no_grad():
    return torch.ones(2) * 2

def bad_names():
    x = torch.ones(2, requires_grad=True)
    return (x * 2).sum(), {"x": 5}

def bad_inputs():
    x = torch.ones(2, requires_grad=True)
    return {"outputs": (x * 2).sum(), "inputs": [3]}

def exits():
    raise SystemExit(3)

def hard_exit():
    import os
    os._exit(0)

def thread_exit():
    import os, threading
    t = threading.Thread(target=lambda: os._exit(4))
    t.start()
    t.join()
    x = torch.ones(2, requires_grad=True)
    return (x * 2).sum()

not_callable = 5
'''


@pytest.mark.parametrize("func, message", [
    ("raises", "raises() raised ZeroDivisionError: division by zero (line 5)"),
    ("not_a_tensor", "not_a_tensor() returned what cannot be captured: outputs must be a tensor or a list of "
                     "tensors, got float"),
    ("no_grad", "no_grad() returned what cannot be captured: element 0 of tensors does not require grad and "
                "does not have a grad_fn"),
    ("bad_names", "bad_names() returned what cannot be captured: names['x'] must be a tensor, got int"),
    ("bad_inputs", "bad_inputs() returned what cannot be captured: inputs[0] must be a tensor, got int"),
    ("exits", "exits() exited (SystemExit: 3)"),
    ("hard_exit", "hard_exit() called os._exit(0): nothing was captured"),
    # on another thread: that thread's traceback, then the capture written as if nothing happened (a hostile review)
    ("thread_exit", "thread_exit() called os._exit(4) on a thread of its own: nothing was captured"),
    ("not_callable", "'not_callable' is not a function (it is of type int)"),
    ("missing", "no function 'missing'"),
])
def test_capture_shows_the_users_error(tmp_path, capsys, func, message):
    pytest.importorskip("torch")
    from builders import run_cli
    script = tmp_path / "model.py"
    script.write_text(CAPTURE_SCRIPT)
    code, out, err = run_cli(["capture", f"{script}:{func}", "-o", str(tmp_path / "m.json")], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"Error: {script}: {message}") and err.count("\n") == 1
    assert not (tmp_path / "m.json").exists()


MOVING_SCRIPT = '''
import os, threading, time
import torch

def main():
    os.chdir(os.path.dirname(os.path.abspath(__file__)) + "/elsewhere")
    x = torch.ones(2, requires_grad=True)
    return (x * 2).sum()

def forks():
    x = torch.ones(2, requires_grad=True)
    if os.fork() == 0:
        return 3.5  # the child: what cannot be captured (it told so on the parent's terminal)
    os.wait()
    return (x * 2).sum()

def lingers():
    threading.Thread(target=time.sleep, args=(1.5,), name="sleeper").start()
    x = torch.ones(2, requires_grad=True)
    return (x * 2).sum()
'''


def test_capture_writes_where_the_command_was_typed_whatever_the_script_does(tmp_path, capsys, monkeypatch):
    """Found by a hostile review: a script that moved to another folder had -o written there (even to /); a
    forked child went on running the command and told its own error after the parent's success; a thread left
    running kept the command from ending, with no word."""
    pytest.importorskip("torch")
    from builders import run_cli
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "model.py").write_text(MOVING_SCRIPT)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["capture", "model.py:main", "-o", "m.json"], capsys)
    assert code == 0, err
    assert (tmp_path / "m.json").is_file() and not (tmp_path / "elsewhere" / "m.json").exists()
    assert os.getcwd() == str(tmp_path)
    code, out, err = run_cli(["capture", "model.py:forks", "-o", "f.json"], capsys)
    assert code == 0 and err == "" and out.startswith("f.json: "), (code, out, err)
    code, out, err = run_cli(["capture", "model.py:lingers", "-o", "l.json"], capsys)
    assert code == 0 and err == ("Note: model.py: lingers() left 1 thread running (sleeper): this command ends "
                                 "when they do (Ctrl-C stops it)\n"), err


@pytest.mark.parametrize("compare, message", [
    ("policy=", "Error: --compare policy=: give the values to compare, e.g. policy=pytorch,fifo\n"),
    ("devices=,", "Error: --compare devices=: give the values to compare, e.g. devices=1,2,4\n"),
    (",", "Error: --compare policy=: give the values to compare, e.g. policy=pytorch,fifo\n"),
])
def test_simulate_compare_with_nothing_to_compare(capsys, compare, message):
    from builders import run_cli
    code, out, err = run_cli(["simulate", "example:seed", "--compare", compare], capsys)
    assert (code, out, err) == (2, "", message)


@pytest.fixture
def quick_calibrate(monkeypatch):
    """``calibrate`` without the minute of measuring: the measurement returns the shipped cpu spec."""
    import autograd_run.sim.calibrate as cal
    from autograd_run.sim.specs import load_spec
    calls = []
    monkeypatch.setattr(cal, "calibrate", lambda nodes=4000, log=None: calls.append(nodes) or load_spec("cpu"))
    return calls


def test_calibrate_writes_a_file_named_without_a_folder(tmp_path, monkeypatch, capsys, quick_calibrate):
    from builders import run_cli
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["calibrate", "-o", "spec.json"], capsys)
    assert (code, err) == (0, "") and out.endswith("wrote spec.json\n")
    from autograd_run.sim.specs import load_spec
    assert load_spec(str(tmp_path / "spec.json")).name


@pytest.mark.parametrize("where, message", [
    ("missing/spec.json", "Error: -o: {p}: no such directory: {d}\n"),
    (".", "Error: -o: {p}: is a directory\n"),
])
def test_calibrate_refuses_a_bad_output_before_measuring(tmp_path, capsys, quick_calibrate, where, message):
    from builders import run_cli
    path = str(tmp_path / where)
    code, out, err = run_cli(["calibrate", "-o", path], capsys)
    assert (code, out, err) == (2, "", message.format(p=path, d=str(tmp_path / "missing")))
    assert quick_calibrate == [] and not (tmp_path / "missing").exists()  # nothing measured, no folder made


def test_calibrate_refuses_a_cache_folder_it_cannot_make_before_measuring(tmp_path, monkeypatch, capsys,
                                                                          quick_calibrate):
    """The cache folder was made after the minute of measuring, and the measurement was lost when it
    could not be (found by a hostile review)."""
    from builders import run_cli
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    code, out, err = run_cli(["calibrate"], capsys)
    assert (code, out) == (2, "") and err == f"Error: {blocker}/autograd-run: cannot create the folder: Not a directory\n"
    assert quick_calibrate == []


def test_diff_of_summaries_with_huge_times_is_a_file_error(tmp_path, capsys):
    """JSON integers have no limit: a sample of 10**400 ns was an OverflowError traceback in the median."""
    import json
    from builders import run_cli
    code, out, err = run_cli(["example:seed", "--json"], capsys)
    assert code == 0
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(out)
    doc = json.loads(out)
    doc["samples"]["wall_ns"] = [10 ** 400]
    b.write_text(json.dumps(doc))
    code, out, err = run_cli(["diff", str(a), str(b)], capsys)
    assert (code, out) == (2, "") and err == f"Error: {b}: $.samples.wall_ns[0]: must be an integer from 0 to 2**64\n"


def test_an_output_fifo_is_written_through_not_replaced(tmp_path, capsys):
    """--trace /dev/null or a FIFO: the old rename put a regular file in its place (as root: in /dev)."""
    import json
    import os
    import stat
    import threading
    from builders import run_cli
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    code, out, err = run_cli(["example:seed", "--trace", str(fifo), "--no-summary"], capsys)
    reader.join(10)
    assert (code, err) == (0, "") and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert "traceEvents" in json.loads(got[0])
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]  # no temporary file left beside it


def test_an_output_symlink_stays_a_link_and_its_target_is_written(tmp_path, capsys):
    from builders import run_cli
    target, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    target.write_text("old\n")
    link.symlink_to(target)
    code, out, err = run_cli(["example:seed", "--order-out", str(link), "--no-summary"], capsys)
    assert (code, err) == (0, "") and link.is_symlink()
    assert target.read_text().startswith('{"position": 0, "id": "sum"')


def test_calibrate_torch_shows_its_output_path_escaped(tmp_path, monkeypatch, capsys):
    import autograd_run.sim.calibrate_torch as cal
    from builders import run_cli
    from autograd_run.sim.specs import load_spec
    monkeypatch.setattr(cal, "calibrate_torch", lambda log=None, first_call=None: load_spec("cpu"))
    path = tmp_path / "x\x1b]0;t\x07.json"
    code, out, err = run_cli(["calibrate", "--torch", "-o", str(path)], capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and out.endswith(f"wrote {tmp_path}/x\\x1b]0;t\\x07.json\n")


def test_capture_profile_shows_its_output_path_escaped(tmp_path, capsys):
    pytest.importorskip("torch")
    from builders import run_cli
    script = tmp_path / "m.py"
    script.write_text("import torch\ndef main():\n    w = torch.ones(3, requires_grad=True)\n"
                      "    return (w * 2).sum(), {'w': w}\n")
    out_file = tmp_path / "g\x1b[2K.json"
    code, out, err = run_cli(["capture", str(script), "-o", str(out_file), "--profile", "--steps", "1", "--warmup", "0"],
                             capsys)
    assert code == 0, err
    assert "\x1b" not in out and f"{tmp_path}/g\\x1b[2K.json: measured " in out


def test_capture_of_a_folder_or_fifo_says_what_it_is(tmp_path, capsys):
    import os
    from builders import run_cli
    (tmp_path / "d.py").mkdir()
    os.mkfifo(tmp_path / "f.py")
    for name in ("d.py", "f.py"):
        code, out, err = run_cli(["capture", str(tmp_path / name), "-o", str(tmp_path / "o.json")], capsys)
        assert (code, out, err) == (2, "", f"Error: {tmp_path / name}: not a regular file (a folder, a device or a "
                                           "FIFO)\n")
    code, out, err = run_cli(["capture", str(tmp_path / "none.py"), "-o", str(tmp_path / "o.json")], capsys)
    assert (code, err) == (2, f"Error: {tmp_path / 'none.py'}: no such file\n")
