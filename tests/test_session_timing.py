"""The run's clock covers the backward calls only: the tool's own set-up (device threads, BLAS limits,
each pass's fresh state) is done before the clock starts, and the recording's timeline starts at the
first call. Slow set-up is simulated with sleeps, so the checks hold on a loaded machine."""

import json
import time

import pytest

from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session

SLOW = 0.3  # seconds of simulated set-up; a pass of example:pipeline takes well under that


def test_device_thread_set_up_is_not_timed(monkeypatch):
    from autograd_run.engine.devices import DeviceSet
    real = DeviceSet.limit_blas
    monkeypatch.setattr(DeviceSet, "limit_blas", lambda self: (time.sleep(SLOW), real(self)))
    r = run_session(load_graph("example:pipeline"), RunOptions(devices="virtual"))
    assert r.error is None
    assert r.timings["backward"] < SLOW
    assert r.summary.wall_ns < SLOW * 1e9


def test_the_timeline_starts_at_the_backward_call(monkeypatch, tmp_path):
    """Device threads wait for work from their start; that wait, before the call, is not the run's."""
    import autograd_run.engine.engine as E
    real = E.compute_dependencies
    started = []

    def slow_deps(*a, **kw):  # the device threads are up and waiting while the call is being set up
        if not started:
            started.append(True)
            time.sleep(SLOW)
        return real(*a, **kw)
    monkeypatch.setattr(E, "compute_dependencies", slow_deps)
    trace = tmp_path / "t.json"
    r = run_session(load_graph("example:pipeline"), RunOptions(devices="virtual", trace_path=str(trace)))
    rec = r.recording
    call = min(g.start for g in rec.graph_tasks if g.depth == 0)
    assert rec.start == call
    assert all(i.start >= call for i in rec.idles)
    assert r.summary.wall_ns < SLOW * 1e9
    assert all(w.idle_ns < SLOW * 1e9 for w in r.summary.workers)
    events = json.loads(trace.read_text())["traceEvents"]
    assert min(e["ts"] for e in events if "ts" in e) >= 1.0  # microseconds from the call, offset by 1


@pytest.mark.parametrize("devices", ["virtual", None])
def test_set_up_between_repeated_passes_is_not_wall_time(monkeypatch, devices):
    from autograd_run.engine.state import GraphState
    real = GraphState.prepare
    monkeypatch.setattr(GraphState, "prepare", lambda self: (time.sleep(SLOW / 2), real(self)))
    g = load_graph("example:pipeline" if devices else "example:mlp")
    r = run_session(g, RunOptions(repeat=4, **({"devices": devices} if devices else {})))
    s = r.summary
    assert s.passes.count == 4
    assert s.wall_ns < SLOW * 1e9  # four passes, not the 1.5 s of set-up between them
    assert s.wall_ns >= s.passes.total_ns * 0.99
    busy = max(w.busy_ns for w in s.workers)
    assert max(w.utilization for w in s.workers) == pytest.approx(busy / s.wall_ns)
    assert all(w.idle_ns <= s.wall_ns for w in s.workers)
