"""Mistakes and accidents end in a clear ``Error: ...`` line and the documented exit code, never a
traceback: unwritable outputs, empty requests, malformed references, failing capture scripts, and a
reader of stdout that goes away (``autograd-run example:mlp | head -1``)."""

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
                                  ["validate", "example:seed", "example:mlp"], ["simulate", "example:mlp"]])
def test_a_closed_pipe_ends_quietly(args):
    code, err = closed_stdout(args)
    assert (code, err) == (0, "")


def test_a_closed_pipe_keeps_the_exit_status_of_a_failed_run():
    code, err = closed_stdout(["example:failing"])
    assert code == 1 and err == "Error: node 'mul_c' (MulBackward0): simulated failure in c = a * 3\n"
