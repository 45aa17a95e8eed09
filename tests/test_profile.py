"""Per-pass samples of a recording, and profiles read back from every kind of file `diff` takes:
the same run read from its trace, its JSON summary and its order file tells the same story; bad
inputs are refused naming the file, the place and the problem."""

import json

import msgspec
import pytest

from autograd_run.cli.render import report_json
from autograd_run.errors import RequestError
from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.analysis import profile as AP
from autograd_run.traces import read_profile as P
from autograd_run.traces.chrome import to_chrome_trace
from autograd_run.traces.layout import slice_node
from autograd_run.traces.order import dumps_order
from autograd_run.record.recorder import Recorder
from autograd_run.record.recording import Recording
from autograd_run.analysis.samples import pass_samples, stable_worker
from autograd_run.analysis.summary import summarize
from builders import doc, graph, leaf, node, run_cli, run_traced


def fake_clock(step=1000):
    t = [0]

    def clock():
        t[0] += step
        return t[0]
    return clock


def seed_recording():
    """example:seed on the calling thread, every event 1 µs after the previous one."""
    rec = Recorder(clock=fake_clock())
    run_traced(load_graph("example:seed"), rec, multithreading=False)
    return Recording.from_events(rec.events, {k: "MainThread" for k in rec.threads})


def test_stable_worker_labels():
    assert stable_worker("MainThread") == "caller"
    assert stable_worker("autograd-run cuda:1") == "cuda:1"
    assert stable_worker("autograd-run reentrant-2") == "reentrant-2"


def test_samples_of_one_pass_agree_with_the_summary():
    rec = seed_recording()
    s, summ = pass_samples(rec), summarize(rec)
    assert s.passes == 1
    assert s.critical_path == [[r.id for r in summ.critical_path]] == [["sum", "add", "mul_b", "acc_a"]]
    assert s.critical_path_ns == [summ.critical_path_ns] == [12000]
    assert set(s.nodes) == {"sum", "add", "mul_b", "mul_c", "acc_a"}
    assert all(n.duration_ns == [1000] and n.worker == ["caller"] for n in s.nodes.values())
    # start order is the executed order
    starts = sorted(s.nodes, key=lambda k: s.nodes[k].start_ns[0])
    assert starts == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert s.worker_busy_ns == {"caller": [5000]}
    assert s.wall_ns == [rec.graph_tasks[0].end - rec.graph_tasks[0].start]


@pytest.mark.parametrize("keep", [True, False], ids=["whole recording", "folded pass by pass"])
def test_samples_of_repeated_passes(keep):
    r = run_session(load_graph("example:mlp"), RunOptions(repeat=4, multithreading=False, samples=True,
                                                          keep_recording=keep))
    s = pass_samples(r.recording) if keep else r.samples
    assert s.passes == 4 and len(s.wall_ns) == 4 and len(s.critical_path) == 4
    assert sum(s.wall_ns) == r.summary.passes.total_ns
    assert all(len(n.duration_ns) == 4 and None not in n.duration_ns for n in s.nodes.values())
    ops = {}
    for n in s.nodes.values():
        ops[n.name] = ops.get(n.name, 0) + sum(n.duration_ns)
    assert ops == {k: d.total_ns for k, d in r.summary.ops.items()}


def test_trace_slices_carry_pass_worker_and_critical_path():
    rec = seed_recording()
    tr = to_chrome_trace(rec)
    node_slices = [e for e in tr["traceEvents"] if e.get("cat") == "node" and e["ph"] == "X"]
    assert all("pass" not in e["args"] for e in node_slices)  # one pass: pass 0 is left out (read as 0)
    threads = [e for e in tr["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert [e["args"]["worker"] for e in threads] == ["caller"]  # the worker label: once, on its thread
    assert all("worker" not in e["args"] for e in node_slices)
    assert [slice_node(e["name"], e["args"])[0] for e in node_slices if e["args"].get("critical_path")] == \
        ["sum", "add", "mul_b", "acc_a"]


def run_files(tmp_path, graph="example:pipeline", repeat=3, **kw):
    """One run of ``graph``: its trace, JSON summary and order file, and the report."""
    trace = tmp_path / "t.json"
    r = run_session(load_graph(graph), RunOptions(repeat=repeat, trace_path=str(trace), record_order=True, **kw))
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps(report_json(r, graph)))
    order = tmp_path / "o.jsonl"
    order.write_bytes(dumps_order(r.order))
    return r, trace, summary, order


def test_one_run_read_from_its_trace_summary_and_order_file(tmp_path):
    r, trace, summary, order = run_files(tmp_path)
    live = AP.from_recording(r.recording, "live", "run", r.order)
    t, s, o = (P.read_profile(str(p)) for p in (trace, summary, order))
    assert (t.kind, s.kind, o.kind) == ("trace", "summary", "order file")
    assert t.passes == s.passes == live.passes == 3 and not o.has_times
    ids = [[row["id"] for row in p] for p in live.order]
    for p in (t, s, o):
        # per worker, each file gives the executed order of every pass
        for k in range(3):
            for w in ("cuda:0", "cuda:1"):
                assert [x["id"] for x in p.order[k] if x["worker"] == w] == \
                       [x["id"] for x in live.order[k] if x["worker"] == w]
    assert sorted(ids[0]) == sorted(["sum", "mm1", "copy", "relu", "mm0", "acc_w1", "acc_w0"])
    for nid, ns in live.nodes.items():
        assert s.nodes[nid].duration_ns == ns.duration_ns
        assert s.nodes[nid].worker == t.nodes[nid].worker == ns.worker
        # the trace stores microseconds as floats: within a nanosecond
        assert all(abs(a - b) <= 1 for a, b in zip(t.nodes[nid].duration_ns, ns.duration_ns))
    assert s.wall_ns == live.wall_ns and s.critical_path == live.critical_path == t.critical_path
    assert s.worker_busy_ns == live.worker_busy_ns


def test_what_a_trace_leaves_out_reads_back_as_it_was(tmp_path, monkeypatch):
    """A node slice's op name is only in its title, its worker only on its thread's metadata, and a GraphTask of
    0 is left out of slices and queue waits: the profile read from the trace has each op by its name, each
    node's worker and the queue waits of GraphTask 0, as the live run's; and a trace written before (every
    argument on every slice) reads the same."""
    import itertools
    from autograd_run.engine import graph_task
    monkeypatch.setattr(graph_task, "_ids", itertools.count())  # the first GraphTask is 0, as in a fresh process
    r, trace, summary, _ = run_files(tmp_path, "example:pipeline", repeat=2)
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    nodes = [e for e in events if e["ph"] == "X" and e.get("cat") == "node"]
    assert any("graph_task" not in e["args"] for e in nodes)
    assert any("graph_task" not in e["args"] for e in events if e["ph"] == "b")
    live = AP.from_recording(r.recording, "live", "run", r.order)
    t, s = P.read_profile(str(trace)), P.read_profile(str(summary))
    assert set(t.ops) == set(s.ops) == set(live.ops) == {n.name for n in load_graph("example:pipeline").nodes}
    for nid, ns in live.nodes.items():
        assert (t.nodes[nid].name, t.nodes[nid].worker) == (ns.name, ns.worker)
        assert all(abs(a - b) <= 1 for a, b in zip(t.nodes[nid].queue_wait_ns, ns.queue_wait_ns)), nid
    assert all(w > 0 for ns in t.nodes.values() for w in ns.queue_wait_ns)
    # the same run as the writer gave it before: the id, op name, device, worker and GraphTask on every slice,
    # the op name and GraphTask on every wait
    as_written_before(doc)
    workers = {e["tid"]: e["args"].pop("worker") for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in nodes:
        e["args"].update(worker=workers[e["tid"]], graph_task=e["args"].get("graph_task", 0))
    for e in events:
        if e["ph"] == "b":
            e["args"].setdefault("graph_task", 0)
    before = tmp_path / "before.json"
    before.write_text(json.dumps(doc))
    b = P.read_profile(str(before))
    assert (b.nodes, b.ops, b.order, b.wall_ns, b.critical_path) == (t.nodes, t.ops, t.order, t.wall_ns,
                                                                     t.critical_path)


def as_written_before(trace: dict) -> dict:
    """``trace`` (a JSON trace, changed in place) as the writer gave it before the node id, a device of cpu
    and a wait's op name were left out: each node slice with ``id``, ``name`` (its op) and ``device``
    arguments, each queue wait's begin with ``node`` (its op name)."""
    ops = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "node":
            nid, op = slice_node(e["name"], e["args"])
            e["args"] = {"id": nid, "name": op, "device": "cpu", **e["args"]}
            ops[nid] = op
    for e in trace["traceEvents"]:
        if e["ph"] == "b" and e.get("cat") == "queue_wait":
            e["args"] = {"id": e["args"]["id"], "node": ops[e["args"]["id"]], **e["args"]}
    return trace


def spaced_graph_file(tmp_path) -> str:
    """A graph of node ids with spaces, on the CPU and two devices; one op name with a space (an explicit op)."""
    d = doc(node("sum all", "SumBackward0", seq=4, next=["my scale"], inputs=[[]], saved={"self_sym_sizes": [2]}),
            node("my scale", "Scale Twice", op="identity", seq=3, next=["to dev 0", "to dev 1"], inputs=[[2]]),
            *(node(f"to dev {k}", "Fan", op="identity", seq=2 - k, next=["acc x y"],
                   inputs=[{"shape": [2], "device": f"cuda:{k}"}]) for k in (0, 1)),
            leaf("x y", [2], id="acc x y"), variables=[{"name": "x y", "shape": [2]}])
    path = tmp_path / "spaced.json"
    path.write_text(json.dumps(d))
    graph(d)  # a valid graph
    return str(path)


@pytest.mark.parametrize("which", ["example:pipeline", "spaced"])
def test_a_trace_written_before_reads_as_the_new_one(tmp_path, capsys, which):
    """Traces written before carried each node slice's id (its title has it), its device also where it was
    cpu, and each queue wait's op name (its node slice's title has it): such a trace gives the profile and
    the diff the new trace of the same run gives. Node ids with spaces are read from the title's split at
    its last space, or from the ``id`` argument a node whose op name has a space keeps."""
    g = spaced_graph_file(tmp_path) if which == "spaced" else which
    _, trace, _, _ = run_files(tmp_path, g, repeat=2)
    new = json.loads(trace.read_text())
    ids = {slice_node(e["name"], e["args"])[0] for e in new["traceEvents"]
           if e["ph"] == "X" and e.get("cat") == "node"}
    assert ids - {"GraphRoot"} == {n.id for n in load_graph(g).nodes}
    if which == "spaced":
        assert {"sum all", "my scale", "to dev 0", "acc x y"} <= ids
    old = tmp_path / "old.json"
    old.write_text(json.dumps(as_written_before(json.loads(trace.read_text()))))
    assert old.stat().st_size > trace.stat().st_size
    a, b = P.read_profile(str(trace)), P.read_profile(str(old))
    assert (b.nodes, b.ops, b.order, b.wall_ns, b.critical_path, b.worker_busy_ns) == \
        (a.nodes, a.ops, a.order, a.wall_ns, a.critical_path, a.worker_busy_ns)
    assert set(a.nodes) == ids - {"GraphRoot"}
    assert {k: v.name for k, v in a.nodes.items()} == {n.id: n.name for n in load_graph(g).nodes}
    other = tmp_path / "other"
    other.mkdir()
    _, other_trace, _, _ = run_files(other, g, repeat=2)
    diffs = []
    for first in (trace, old):
        code, out, err = run_cli(["diff", str(first), str(other_trace), "--json"], capsys)
        assert code == 0, err
        d = json.loads(out)
        assert d["diff"].pop("a") == str(first)
        d["diff"]["notes"] = [n.replace(str(first), "A") for n in d["diff"]["notes"]]  # they name the file
        diffs.append((d["diff"], d["a"]["passes"], d["b"]["passes"]))
    assert diffs[0] == diffs[1]


def test_an_older_trace_without_labels_still_reads(tmp_path):
    r, trace, _, _ = run_files(tmp_path, "example:seed", repeat=2, multithreading=False)
    doc = json.loads(trace.read_text())
    for e in doc["traceEvents"]:
        if e.get("cat") == "node" and e["ph"] == "X":
            for k in ("pass", "critical_path", "graph_root"):
                e["args"].pop(k, None)
            e["args"].setdefault("graph_task", 0)
            e["args"]["name"] = e["name"].split(" ", 1)[1]
        if e["ph"] == "M" and e["name"] == "thread_name":
            e["args"].pop("worker")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    p = P.read_profile(str(old))
    assert p.passes == 2 and not p.critical_path
    assert [x["id"] for x in p.order[1]] == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert any("no worker labels" in n for n in p.notes) and any("no critical path" in n for n in p.notes)


def test_an_older_summary_without_samples_gives_aggregates(tmp_path):
    _, _, summary, _ = run_files(tmp_path, "example:seed", repeat=1)
    doc = json.loads(summary.read_text())
    del doc["samples"]
    summary.write_text(json.dumps(doc))
    p = P.read_profile(str(summary))
    assert p.passes == 1 and p.wall_ns == [doc["summary"]["wall_ns"]] and not p.nodes
    assert set(p.ops) == set(doc["summary"]["ops"]) and any("without samples" in n for n in p.notes)


def test_concat_of_runs_keeps_every_pass(tmp_path):
    g = load_graph("example:seed")
    parts = [AP.from_recording(run_session(g, RunOptions(repeat=n, record_order=True, keep_recording=True)).recording,
                             "x", "run")
             for n in (1, 2)]
    c = AP.concat(parts, "both")
    assert c.passes == 3 and len(c.wall_ns) == 3 and len(c.order) == 3
    assert all(len(ns.duration_ns) == 3 for ns in c.nodes.values())
    assert c.ops["MulBackward0"] == [a + b for a, b in zip(c.nodes["mul_b"].duration_ns, c.nodes["mul_c"].duration_ns)]


# -- refused inputs ------------------------------------------------------------------------------

def refused(tmp_path, content: bytes | str, name="in.json") -> str:
    f = tmp_path / name
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(RequestError) as info:
        P.read_profile(str(f))
    msg = str(info.value)
    assert msg.startswith(f"{f}: ")
    return msg[len(str(f)) + 2:]


@pytest.mark.parametrize("content, expected", [
    ("", "line 1: the file is empty"),
    ("hello", "line 1: not an order file, trace or JSON summary"),
    (b"\xff\xfe{}", "line 1, column 1: not UTF-8 text"),
    ('{"a": 1}', "$: a JSON object that is neither a Chrome trace"),
    ('{"traceEvents": 3}', "$.traceEvents: traceEvents must be a list"),
    ('{"traceEvents": []}', "$.traceEvents: the trace has no node slices"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1, "dur": 1, "args": {"graph_task": 0}}]}',
     "$.traceEvents[0]: a node slice needs a title '<id> <op>' (a string 'name') or a string 'id' in its args"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "name": "a b", "ts": 1, "dur": 1, "args": {"id": 3}}]}',
     "$.traceEvents[0]: a node slice needs a title '<id> <op>' (a string 'name') or a string 'id' in its args"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "name": "a b", "ts": 1, "dur": 1, "args": []}]}',
     "$.traceEvents[0].args: a node slice needs args (an object)"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": "1", "dur": 1, "args": {"id": "a", "graph_task": 0}}]}',
     "$.traceEvents[0]: a node slice needs a 'ts' from -4e+15 to 4e+15 us and a 'dur' from 0 to 8.64e+10 us (a day), "
     "got ts '1' and dur 1"),
    ('[{"summary": {}, "spec": "h100"}]', "$: a list of 1 simulation results (simulate --compare --json)"),
    ('{"summary": {}, "samples": {"passes": 2, "wall_ns": [1]}}', "$.samples.wall_ns: must be a list of 2 values"),
    ('{"summary": {}, "samples": {"passes": 1, "wall_ns": [1], "critical_path_ns": [1], "critical_path": [[]],'
     ' "worker_busy_ns": {}, "nodes": {"x": {"name": "N", "worker": ["caller"], "start_ns": [0],'
     ' "duration_ns": ["1"], "queue_wait_ns": [0]}}}}', "$.samples.nodes['x'].duration_ns[0]: must be an integer"),
    ('{"summary": {}, "samples": {"passes": 1, "wall_ns": [1' + "0" * 400 + '], "critical_path_ns": [1]}}',
     "$.samples.wall_ns[0]: must be an integer from 0 to 2**64"),  # was an OverflowError in diff's median
    # a negative time was compared (a -9077500% change) and let --fail-on miss a regression (a hostile review)
    ('{"summary": {}, "samples": {"passes": 1, "wall_ns": [-1], "critical_path_ns": [1]}}',
     "$.samples.wall_ns[0]: must be an integer from 0 to 2**64"),
    ('{"summary": {}, "samples": {"passes": 1, "wall_ns": [1], "critical_path_ns": [1], "critical_path": [[]],'
     ' "worker_busy_ns": {}, "nodes": {"x": {"name": "N", "worker": ["caller"], "start_ns": [0],'
     ' "duration_ns": [-4], "queue_wait_ns": [0]}}}}',
     "$.samples.nodes['x'].duration_ns[0]: must be an integer from 0 to 2**64 or null"),
    ('{"summary": {"wall_ns": -5}}', "$.summary.wall_ns: must be an integer from 0 to 2**64"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1e308, "dur": 1, "args": {"id": "a", "graph_task": 0}}]}',
     "$.traceEvents[0]: a node slice needs a 'ts' from -4e+15"),  # 1e308 us in ns: an OverflowError in round()
    # a dur past a day: the message said "a non-negative 'dur'" of 1e300; the limit is what it says now
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1, "dur": 1e300, "args": {"id": "a", "graph_task": 0}}]}',
     "$.traceEvents[0]: a node slice needs a 'ts' from -4e+15 to 4e+15 us and a 'dur' from 0 to 8.64e+10 us (a day), "
     "got ts 1 and dur 1e+300"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1, "dur": 1e15, "args": {"id": "a", "graph_task": 0}}]}',
     "$.traceEvents[0]: a node slice needs a 'ts' from -4e+15 to 4e+15 us and a 'dur' from 0 to 8.64e+10 us (a day), "
     "got ts 1 and dur 1e+15"),
    ('{"traceEvents": [{"ph": "X", "cat": "node", "tid": [2], "ts": 1, "dur": 1, "args": {"id": "a"}}]}',
     "$.traceEvents[0].tid: must be an integer or a string"),  # was a TypeError (an unhashable tid)
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1, "dur": 1, "args": {"id": "a", "graph_task": "0"}}]}',
     "$.traceEvents[0].args.graph_task: must be an integer"),  # absent is 0; present, an integer
    # "has the wrong type" for a pass of 10**9, an int (a hostile review): the bound is said
    ('{"traceEvents": [{"ph": "X", "cat": "node", "ts": 1, "dur": 1, "args": {"id": "a", "pass": 1000000000}}]}',
     "$.traceEvents[0].args.pass: must be an integer from 0 to "),
    ('{"summary": {}, "error": {"message": "boom"}}', "$.error: the run failed (boom)"),
    ('{"id": "a"}\n{"id": 3}\n', "line 2: each line needs an object with a string 'id'"),
    # lines without an id were "line 1, column 13: not JSON: trailing characters" (a hostile review)
    ('{"node": "a"}\n{"node": "b"}\n', "line 1: each line needs an object with a string 'id'"),
    ('{"id": "a", "pass": -1}\n{"id": "b"}\n', "line 1: 'pass' must be an integer"),
    ('{"id": "a", "ready": [["a", 0]]}\n{"id": "b"}\n', "line 1: 'ready' must be a list of [node id, depth, seq]"),
    ('{"summary": {"wall_ns": 1,}}', "line 1, column 27: not JSON: JSON is malformed: trailing comma"),
    ("[" * 100000 + "]" * 100000, "JSON: nested too deeply"),
])
def test_bad_inputs_are_refused_with_the_place(tmp_path, content, expected):
    assert refused(tmp_path, content).startswith(expected)


def test_size_is_bounded_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "MAX_BYTES", 100)
    assert "file is larger than" in refused(tmp_path, "{" + " " * 200 + "}")


def test_a_directory_or_missing_file_is_refused(tmp_path):
    with pytest.raises(RequestError, match="is a directory"):
        P.read_profile(str(tmp_path))
    with pytest.raises(RequestError, match="no such file"):
        P.read_profile(str(tmp_path / "missing.json"))


def test_samples_json_round_trip_is_exact():
    r = run_session(load_graph("example:seed"), RunOptions(repeat=2))
    s = pass_samples(r.recording)
    back = P._samples(msgspec.json.decode(msgspec.json.encode(s.to_dict())), "$")
    assert back.to_dict() == s.to_dict()
