"""``session.run_session``: one run of a graph as a library call, reported in a ``RunReport``."""

import pytest

from autograd_run.engine.tracer import Tracer
from autograd_run.errors import BackwardError, RequestError
from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.traces.order import read_order

SEED_ORDER = ["sum", "add", "mul_c", "mul_b", "acc_a"]


def seed():
    """example:seed (a = [1, 2]; d = (a * 2 + a * 3).sum(); a.grad = [5, 5])."""
    return load_graph("example:seed")


class Ends(Tracer):
    enabled = True

    def __init__(self):
        self.ids = []

    def node_end(self, gt, node):
        self.ids.append(node.id)


def test_a_run_reports_its_gradients_and_profile():
    r = run_session(seed(), RunOptions(multithreading=False))
    assert r.error is None and r.result.mode == "backward"
    assert r.result.grads["a"].tolist() == [5.0, 5.0]
    assert [s.node.id for s in r.recording.slices] == SEED_ORDER
    assert r.summary.nodes_executed == 5
    assert r.order is None and r.divergence is None
    assert r.timings["backward"] > 0


def test_without_the_profile_there_is_no_recording():
    r = run_session(seed(), RunOptions(profile=False))
    assert r.recording is None and r.summary.nodes_executed == 0
    assert r.result.grads["a"].tolist() == [5.0, 5.0]


def test_a_trace_path_records_the_profile_anyway(tmp_path):
    trace = tmp_path / "t.json"
    r = run_session(seed(), RunOptions(profile=False, trace_path=str(trace)))
    assert r.recording is not None and trace.exists() and "trace" in r.timings


def test_a_failing_pass_is_reported_not_raised():
    r = run_session(seed(), RunOptions(inject_error=["add"], multithreading=False))
    assert isinstance(r.error, BackwardError) and r.error.node_id == "add"
    assert r.result is None
    assert [e.node.id for e in r.recording.errors] == ["add"]


def test_an_injected_nan_fails_in_anomaly_mode():
    r = run_session(seed(), RunOptions(inject_nan=["mul_b"], anomaly=True))
    assert r.error.node_id == "mul_b" and "returned nan values" in str(r.error)


def test_order_rows_say_which_pass_they_belong_to():
    r = run_session(seed(), RunOptions(record_order=True, repeat=3, multithreading=False))
    assert [row["pass"] for row in r.order] == [0] * 5 + [1] * 5 + [2] * 5
    assert [row["id"] for row in r.order] == SEED_ORDER * 3
    assert r.summary.passes.count == 3


def test_the_order_file_is_the_reported_order(tmp_path):
    path = tmp_path / "o.jsonl"
    r = run_session(seed(), RunOptions(order_out=str(path), repeat=2, multithreading=False))
    assert read_order(str(path)) == r.order


def test_the_same_golden_order_gives_no_divergence():
    golden = run_session(seed(), RunOptions(record_order=True, multithreading=False)).order
    r = run_session(seed(), RunOptions(expected_order=golden, repeat=2, multithreading=False))
    assert r.divergence is None and r.per_worker is False


def test_a_changed_golden_order_sets_the_divergence():
    golden = run_session(seed(), RunOptions(record_order=True, multithreading=False)).order
    golden[2], golden[3] = golden[3], golden[2]
    r = run_session(seed(), RunOptions(expected_order=golden, multithreading=False))
    assert r.error is None
    d = r.divergence
    assert (d.position, d.expected["id"], d.got["id"]) == (2, "mul_b", "mul_c")
    assert d.detail and "<- popped" in d.detail[1]  # the ready set, recorded because a golden was given


def test_device_threads_are_compared_per_worker():
    g = load_graph("example:pipeline")
    golden = run_session(g, RunOptions(record_order=True)).order
    r = run_session(load_graph("example:pipeline"), RunOptions(expected_order=golden))
    assert r.per_worker is True and r.divergence is None


def test_a_failed_pass_is_not_compared_with_the_golden():
    golden = run_session(seed(), RunOptions(record_order=True, multithreading=False)).order
    r = run_session(seed(), RunOptions(expected_order=golden, inject_error=["add"]))
    assert r.error is not None and r.divergence is None


def test_the_callers_tracers_see_the_run():
    mine = Ends()
    run_session(seed(), RunOptions(tracers=(mine,), multithreading=False, profile=False))
    assert mine.ids == SEED_ORDER


REFUSED = [
    ("repeat", lambda tmp: RunOptions(repeat=0)),
    ("inputs", lambda tmp: RunOptions(inputs=[])),
    ("inputs", lambda tmp: RunOptions(inputs=["zz"])),
    ("inputs", lambda tmp: RunOptions(mode="grad")),
    ("inject_error", lambda tmp: RunOptions(inject_error=["ghost"])),
    ("inject_nan", lambda tmp: RunOptions(inject_nan=["ghost"])),
    ("inject_nan", lambda tmp: RunOptions(inject_nan=["acc_a"])),
    ("inject_nan", lambda tmp: RunOptions(inject_error=["add"], inject_nan=["add"])),
    ("trace_path", lambda tmp: RunOptions(trace_path=str(tmp / "nodir" / "t.json"))),
    ("order_out", lambda tmp: RunOptions(order_out=str(tmp))),
    ("order_out", lambda tmp: RunOptions(trace_path=str(tmp / "x"), order_out=str(tmp / "x"))),
    ("order_out", lambda tmp: RunOptions(order_out=str(tmp / "golden.jsonl"), expected_order=[],
                                         expected_order_path=str(tmp / "golden.jsonl"))),
]


@pytest.mark.parametrize("option,make", REFUSED, ids=[f"{o}-{k}" for k, (o, _) in enumerate(REFUSED)])
def test_a_bad_request_is_refused_before_anything_runs(tmp_path, option, make):
    (tmp_path / "golden.jsonl").write_text("")
    options = make(tmp_path)
    mine = Ends()
    options.tracers = (mine,)
    with pytest.raises(RequestError) as info:
        run_session(seed(), options)
    assert info.value.option == option
    assert mine.ids == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.jsonl"]


def test_the_run_state_and_raw_records_are_gone_before_the_trace_is_written(tmp_path, monkeypatch):
    """At a million nodes the last pass's state (held in a cycle by its GraphTask) and the recorder's raw
    records would sit beside the trace writer's work: they go first."""
    import gc

    from autograd_run.engine import GraphState
    from autograd_run.record import recorder as recorder_mod
    from autograd_run.traces import trace_file
    g = load_graph("example:mlp")
    seen = {}
    recorders = []
    make = recorder_mod.Recorder.__init__

    def init(self, *a, **kw):
        make(self, *a, **kw)
        recorders.append(self)

    def write(path, rec, incomplete=None, fmt=None):
        seen["states"] = sum(1 for o in gc.get_objects() if type(o) is GraphState and o.graph is g)
        seen["raw"] = [len(r._taken) + len(r.rare) for r in recorders]
        seen["slices"] = len(rec.slices)
    monkeypatch.setattr(recorder_mod.Recorder, "__init__", init)
    monkeypatch.setattr(trace_file, "write_trace", write)
    run_session(g, RunOptions(trace_path=str(tmp_path / "t.json"), repeat=2))
    assert seen == {"states": 0, "raw": [0], "slices": 2 * len(g.nodes)}


def test_a_pass_state_is_never_scanned_by_the_collector():
    """The saved values a pass makes live until its end and are freed by reference counting: no collection
    scans them (before, the first allocation after the backward call scanned the thousands of objects the
    pass had made for its 2,000 nodes)."""
    import gc

    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    g = loads_graph(dumps(generate("mlp", layers=2000, width=2, batch=2), "json"), "m.json")
    scanned = []

    def cb(phase, info):
        if phase == "start":
            scanned.append(sum(len(gc.get_objects(k)) for k in range(info["generation"] + 1)))
    gc.collect()
    gc.freeze()  # the graph and everything before: not what is measured
    gc.callbacks.append(cb)
    try:
        run_session(g, RunOptions(profile=False))
    finally:
        gc.callbacks.remove(cb)
        gc.unfreeze()
    assert all(n < 1500 for n in scanned), scanned  # (other threads' young objects: a few hundred)
