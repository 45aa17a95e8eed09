"""The policy table (``sim.policies.TABLE``): one row per policy, read by the simulator, the sweep and the CLI."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autograd_run.cli.main import cli
from autograd_run.engine.priority import FifoPriority, PyTorchPriority
from autograd_run.errors import RequestError
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.sim import policies
from autograd_run.sweep.grid import RUN_POLICIES


def two_device_graph():
    return loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json")


def test_every_row_names_a_priority_and_a_threading_choice():
    g = load_graph("example:mlp")
    assert policies.POLICIES == ("pytorch", "fifo", "critical-path", "single-thread", "caller-thread",
                                 "predicted-order", "memory")
    for p in policies.TABLE:
        priority, threading = policies.make_policy(p.name, g, _one)
        assert hasattr(priority, "key") and isinstance(threading, bool), p.name
    assert isinstance(policies.make_policy("fifo", g, _one)[0], FifoPriority)


def _one(node):
    from autograd_run.sim.costs import NodeCost
    return NodeCost(1000)


def test_threading_by_graph():
    one, two = load_graph("example:mlp"), two_device_graph()
    on = {p.name: (p.threading(one), p.threading(two)) for p in policies.TABLE}
    assert on["single-thread"] == (False, False)
    assert on["caller-thread"] == (False, True)  # the caller runs everything unless 2+ devices are used
    assert on["pytorch"] == on["fifo"] == (True, True)


def test_a_real_run_takes_only_the_policies_that_change_threading():
    """A real engine run can change its threading, not its priority: the run-mode policies are the rows with
    PyTorch's priority, and the sweep's run mode reads them from the table."""
    g = load_graph("example:mlp")
    run = tuple(p.name for p in policies.TABLE
                if isinstance(policies.make_policy(p.name, g, _one)[0], PyTorchPriority) and p.in_run)
    assert RUN_POLICIES == policies.RUN_POLICIES == run == ("pytorch", "single-thread", "caller-thread")


def test_an_unknown_policy_names_the_choices():
    with pytest.raises(RequestError, match="unknown policy 'fastest'; choose from pytorch, fifo, critical-path"):
        policies.policy("fastest")
    res = CliRunner().invoke(cli, ["simulate", "example:mlp", "--policy", "fastest"])
    assert res.exit_code == 2 and "fastest" in res.output and "predicted-order" in res.output
