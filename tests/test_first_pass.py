"""A fresh process's first pass (``sim.first_pass``): the probe, its measurement, and what simulate makes of it."""

from __future__ import annotations

import json

import pytest

from autograd_run.graphs.load import loads_graph
from autograd_run.sim import first_pass as fp
from autograd_run.sim.session import SimOptions, simulate_session as simulate
from autograd_run.sim.specs import load_spec


def _graph(doc):
    return loads_graph(json.dumps(doc), "probe.json")


def test_the_probe_is_a_valid_graph_with_a_copy_where_the_device_changes():
    cpu = _graph(fp.probe_doc(["cpu"]))
    assert cpu.max_device_index == -1 and not any(n.name == "ToCopyBackward0" for n in cpu.nodes)
    dev = _graph(fp.probe_doc(["cpu", "cuda:0", "cuda:1"]))
    copies = [n for n in dev.nodes if n.name == "ToCopyBackward0"]
    # blocks cpu, cuda:0, cuda:1, cpu: three changes of device, each through a copy node on its producer's device
    assert len(copies) == 3 and dev.max_device_index == 1
    for c in copies:
        (nxt, _), = [e for e in c.next if e is not None]
        assert nxt.device != c.device
    costs = sorted({n.attrs["cost"]["us"] for n in dev.nodes if n.name == "Wait"})
    assert costs == sorted(fp.PROBE_COSTS_US)


@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cuda:0", "cuda:1"]])
def test_most_probe_nodes_sum_two_gradients_as_held_out_fan_ins_do(devices):
    """Each node's gradient also skips to the node two after it on the same device: every Wait node but the first
    two (on the CPU alone), or but the first two of each device's block, sums two gradients; none without skips."""
    def fan_ins(g):
        counts = {}
        for n in g.nodes:
            for e in n.next:
                if e is not None and e.node.name == "Wait":
                    counts[e.node.id] = counts.get(e.node.id, 0) + 1
        return sum(c == 2 for c in counts.values())
    blocks = fp.PROBE_NODES // fp.PROBE_BLOCK if len(devices) > 1 else 1
    assert fan_ins(_graph(fp.probe_doc(devices))) == fp.PROBE_NODES - 2 * blocks
    assert fan_ins(_graph(fp.probe_doc(devices, skips=False))) == 0


def test_first_pass_extras_runs_the_users_command_in_fresh_processes(monkeypatch):
    """Each child is `autograd-run run PROBE --repeat 1+WARM --json`; the extra is its first wall minus the median of
    the rest (children replaced by a fake that prints fixed walls: the arithmetic, independent of the machine)."""
    import subprocess
    calls = []

    def fake(args, **kw):
        calls.append(args)
        walls = [1_500_000, 1_000_000, 1_200_000, 900_000]  # first 1.5 ms; median of the rest 1.0 ms
        return subprocess.CompletedProcess(args, 0, json.dumps({"samples": {"wall_ns": walls}}), "")
    monkeypatch.setattr(fp.subprocess, "run", fake)
    assert fp.first_pass_extras(fp.probe_doc(["cpu"]), processes=2, warm=3) == [500.0, 500.0]
    assert len(calls) == 2 and calls[0][1:5] == ["-m", "autograd_run", "run", calls[0][4]]
    assert calls[0][5:] == ["--json", "--no-summary", "--repeat", "4"]

    def failing(args, **kw):
        return subprocess.CompletedProcess(args, 2, "", "Error: something")
    monkeypatch.setattr(fp.subprocess, "run", failing)
    with pytest.raises(RuntimeError, match="exit 2: Error: something"):
        fp.first_pass_extras(fp.probe_doc(["cpu"]), processes=1)


def test_a_real_child_measures_a_first_pass():
    """The real thing, one child process: the probe runs there and the figure is a number of µs (a first pass can
    come out a little faster than the later ones' median on a busy machine, never by milliseconds)."""
    (extra,) = fp.first_pass_extras(fp.probe_doc(["cpu"]), processes=1, warm=3)
    assert -2000 < extra < 1e6


def test_calibrate_leaves_the_first_pass_unmodelled_when_a_child_fails(monkeypatch):
    import autograd_run.sim.calibrate as cal
    from tests.test_simulate import MORE_FIGURES
    monkeypatch.setattr(cal, "_engine_round", lambda nodes, repeat: {"node_overhead_us": 2.0, "handoff_us": 50.0,
                                                                     "wait_overhead_us": 40.0, **MORE_FIGURES})

    def broken():
        raise RuntimeError("exit 1: no module named autograd_run")
    monkeypatch.setattr(cal.first_pass, "measure", broken)
    lines = []
    spec = cal.calibrate(nodes=10, log=lines.append)
    assert lines[-1] == ("warning: a fresh process's first pass was not measured (exit 1: no module named autograd_run): "
                         "simulations will not predict it")
    assert spec.engine.first_pass_us == spec.engine.first_pass_device_us == 0


@pytest.mark.parametrize("devices, figure", [(["cpu"], 120.0), (["cpu", "cuda:0"], 250.0)])
def test_simulate_adds_the_figure_for_its_case(devices, figure):
    spec = load_spec("cpu")
    g = _graph(fp.probe_doc(devices))
    plain = simulate(g, SimOptions(spec=spec, slack_top=0))
    assert plain.first_pass_ns is None and plain.first_pass_error == {}  # not modelled: both figures 0
    spec.engine.first_pass_us, spec.engine.first_pass_device_us = 120.0, 250.0
    r = simulate(_graph(fp.probe_doc(devices)), SimOptions(spec=spec, slack_top=0))
    assert r.first_pass_ns == int(figure * 1e3) and r.wall_ns == plain.wall_ns  # the warm prediction unchanged


def test_simulate_states_the_first_pass_in_its_summary_and_json(tmp_path, capsys):
    from tests.builders import run_cli
    spec = load_spec("cpu").to_dict()
    spec["engine"].update(first_pass_us=120.0, first_pass_device_us=250.0, overhead_holds_gil=True)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # stated costs on most nodes (the held-out figures hold for those), two devices: the CPU and cuda:0
    cost = {"cost": {"us": 50, "mode": "wait"}}
    nodes = [{"id": "a", "name": "W", "op": "cost", "attrs": cost, "next": [["copy", 0]], "inputs": [{"shape": [1]}]},
             {"id": "copy", "name": "ToCopyBackward0", "next": [["b", 0]], "inputs": [{"shape": [1]}]},
             {"id": "b", "name": "W", "op": "cost", "attrs": cost, "next": [["c", 0]],
              "inputs": [{"shape": [1], "device": "cuda:0"}]},
             {"id": "c", "name": "W", "op": "cost", "attrs": cost, "next": [["acc", 0]],
              "inputs": [{"shape": [1], "device": "cuda:0"}]},
             {"id": "acc", "name": "AccumulateGrad", "variable": "x", "inputs": [{"shape": [1], "device": "cuda:0"}]}]
    (tmp_path / "g.json").write_text(json.dumps({"format": "autograd-graph/1", "roots": [{"node": "a"}], "nodes": nodes,
                                                 "variables": [{"name": "x", "shape": [1], "device": "cuda:0"}]}))
    code, out, err = run_cli(["simulate", str(tmp_path / "g.json"), "--spec", str(tmp_path / "spec.json"), "--json",
                              "--no-summary"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["first_pass_wall_ns"] == doc["wall_ns"] + 250_000
    assert doc["first_pass_expected_error"]["relative"] == 0.12  # the held-out figure for the CPU and one device
    code, out, err = run_cli(["simulate", str(tmp_path / "g.json"), "--spec", str(tmp_path / "spec.json")], capsys)
    assert code == 0 and "a fresh process's first pass:" in out and "(250.0 µs more" in out
    assert "expected error +-12%)" in " ".join(out.split())
    code, out, err = run_cli(["simulate", str(tmp_path / "g.json"), "--spec", "cpu", "--json", "--no-summary"], capsys)
    assert json.loads(out)["first_pass_wall_ns"] is None  # a shipped spec does not model it


def test_the_first_pass_figure_widens_with_devices_as_the_warm_one_does():
    from autograd_run.sim.confidence import HELD_OUT, expected_error
    spec = load_spec("cpu")
    spec.engine.overhead_holds_gil = True
    stated = {"attrs": 10}
    assert expected_error(spec, None, stated, 1, first_pass=True)["relative"] == HELD_OUT["local first pass"][0]
    assert (expected_error(spec, None, stated, 3, first_pass=True)["relative"]
            == HELD_OUT["local first pass several devices"][0])
    assert expected_error(spec, None, stated, 3)["relative"] == HELD_OUT["local several devices"][0]
