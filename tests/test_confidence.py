"""How sure a simulation is: the spec it used and why, its expected error, costs that do not fit the spec."""

import json

import pytest

from builders import run_cli
from autograd_run.sim import confidence
from autograd_run.sim.calibrate import write_local
from autograd_run.sim.specs import load_spec

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache folder (no calibration yet); ``calibrated()`` writes a local spec into it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def calibrated(spread=0.2, torch=False):
        spec = load_spec("cpu")
        spec.name = "local-torch" if torch else "local"
        spec.engine.overhead_holds_gil = not torch
        spec.engine.spread = {"node_overhead_us": spread, "handoff_us": spread}
        from autograd_run.sim.specs import local_spec_path
        write_local(spec, local_spec_path("local-torch" if torch else "local"))
    return calibrated


def _trace(tmp_path, capsys) -> str:
    path = str(tmp_path / "run-trace.json")
    assert run_cli(["example:pipeline", "--backend", "virtual", "--trace", path, "--no-summary"], capsys)[0] == 0
    return path


def test_without_a_calibration_the_default_says_how_to_make_one(cache, capsys):
    code, out, err = run_cli(["simulate", "example:pipeline", "--json", "--slack", "0"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["spec"].startswith("NVIDIA H100")
    assert doc["spec_reason"] == ("the default without a calibration here: h100 (run `autograd-run calibrate` to "
                                  "simulate this machine)")
    assert doc["expected_error"]["relative"] is None and "not checked against that machine" in \
        doc["expected_error"]["basis"]


def test_local_costs_on_a_gpu_spec_warn_once_on_stderr_with_the_fix(cache, tmp_path, capsys):
    trace = _trace(tmp_path, capsys)
    code, out, err = run_cli(["simulate", "example:pipeline", "--costs", trace, "--no-summary"], capsys)
    assert code == 0 and out == ""
    assert err == (f"warning: the costs in {trace} were measured by autograd-run's engine on this CPU, but NVIDIA "
                   "H100 SXM5 80GB's engine figures are PyTorch's C++ engine: the engine's own time is simulated "
                   "as that machine's, not this one's; for this machine use `autograd-run calibrate`, then "
                   "--spec local\n")
    cache()  # once calibrated, the default is local and nothing is wrong
    code, out, err = run_cli(["simulate", "example:pipeline", "--costs", trace, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and err == "" and doc["warnings"] == [] and doc["spec"] == "local"
    assert doc["spec_reason"].startswith("the default: local")
    # (example:pipeline runs on two devices: the held-out figure for graphs on several devices)
    assert doc["expected_error"]["relative"] == confidence.HELD_OUT["local several devices"][0]
    code, out, err = run_cli(["simulate", "example:pipeline", "--costs", trace, "--spec", "a100",
                              "--compare", "policy=pytorch,fifo", "--json"], capsys)
    assert err.count("warning:") == 1 and err.rstrip().endswith("for this machine use --spec local")


def test_the_summary_states_the_spec_and_the_expected_error(cache, tmp_path, capsys):
    trace = _trace(tmp_path, capsys)
    cache(spread=2.0)  # rounds far apart: the held-out figure widens
    code, out, err = run_cli(["simulate", "example:pipeline", "--costs", trace, "--slack", "0"], capsys)
    flat = " ".join(out.split())
    widened = confidence.HELD_OUT["local several devices"][0] + (2.0 - confidence.SPREAD_AT_HELD_OUT) * \
        confidence.WIDEN
    assert code == 0 and "spec local: the default: local" in flat
    assert f"expected error +-{widened:.0%}" in flat and "widened: this calibration's rounds lay 200% apart" in flat


def test_analytic_costs_on_the_local_spec_claim_no_figure(cache, capsys):
    cache()
    code, out, err = run_cli(["simulate", "example:mlp", "--json", "--slack", "0"], capsys)
    e = json.loads(out)["expected_error"]
    assert e["relative"] is None and e["basis"].startswith("most node costs analytic")


def test_the_stated_error_of_autograd_runs_engine_grows_with_the_devices(cache, capsys):
    """On the calibrated local spec, a graph on the CPU or one device states the held-out figure for those, one
    on two or more devices the wider one (the held-out error grows with the device threads); a data-sheet spec
    states none either way."""
    from autograd_run.sim.specs import load_spec
    cache()
    spec = load_spec("local")
    costs = {"attrs": 10}
    assert confidence.expected_error(spec, None, costs, 0)["relative"] == confidence.HELD_OUT["local"][0]
    assert confidence.expected_error(spec, None, costs, 1)["relative"] == confidence.HELD_OUT["local"][0]
    wide = confidence.expected_error(spec, None, costs, 3)
    assert wide["relative"] == confidence.HELD_OUT["local several devices"][0] > confidence.HELD_OUT["local"][0]
    assert "2-4 devices" in wide["basis"]
    assert confidence.expected_error(load_spec("h100"), None, costs, 3)["relative"] is None
    # through simulate: a chain of cost nodes on the CPU, and the same chain over three devices
    from bench import heldout
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.session import SimOptions, simulate_session
    for k, key in ((0, "local"), (3, "local several devices")):
        g = loads_graph(json.dumps(heldout.build("chain", 7, k)), "chain.json")
        rep = simulate_session(g, SimOptions(spec="local", slack_top=0))
        assert rep.expected_error["relative"] == confidence.HELD_OUT[key][0], k
