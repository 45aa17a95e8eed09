"""``simulate`` as the process's own command line ends the process at once when it is done (``cli.common.exit_now``:
its output flushed, then ``os._exit``), not through the interpreter's teardown, which freed a big simulation object
by object. After an error it ends as before. The truth: an ``atexit`` handler (run by a normal end, never by
``os._exit``) and the command's complete output, in a child process."""

from __future__ import annotations

import json
import subprocess
import sys

from cli_proc import cli_env

SCRIPT = """
import atexit, sys
atexit.register(lambda: print("TEARDOWN", file=sys.stderr, flush=True))
sys.argv = ["autograd-run", *sys.argv[1:]]
from autograd_run.cli.main import main
main()
"""


def _run(*args, tmp_path):
    return subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=cli_env(), cwd=tmp_path)


def test_a_simulation_that_ends_well_ends_the_process_at_once_with_its_output_whole(tmp_path):
    trace = tmp_path / "t.json"
    p = _run("simulate", "example:mlp", "--json", "--trace", trace, tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "TEARDOWN" not in p.stderr  # (os._exit: no teardown)
    assert json.loads(p.stdout)["wall_ns"] > 0  # stdout flushed whole
    assert json.loads(trace.read_text())["traceEvents"]  # the trace file closed whole


def test_after_an_error_or_for_other_commands_the_process_ends_as_usual(tmp_path):
    p = _run("simulate", tmp_path / "nowhere.json", tmp_path=tmp_path)  # (an error inside the command)
    assert p.returncode != 0 and p.stderr.startswith("Error:") and "TEARDOWN" in p.stderr, p.stderr
    p = _run("validate", "example:mlp", tmp_path=tmp_path)
    assert p.returncode == 0 and "TEARDOWN" in p.stderr
