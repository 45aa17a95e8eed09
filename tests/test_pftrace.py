"""The Perfetto protobuf trace (.pftrace): imported by Perfetto's real trace processor with no errors, and
showing what the JSON trace of the same recording shows: the same threads, slices (times, names,
categories, nesting, threads), counters, flows and arguments."""

import collections

import pytest

from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.traces.chrome import chrome_chunks
from autograd_run.traces.pftrace import pftrace_chunks
from test_chrome_trace import _recordings
from tp_wasm.tp import TraceProcessor, available

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(available() is not None, reason=f"Perfetto trace processor unavailable: {available()}")]


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def content(data: bytes, arg_prefix: str) -> dict:
    """What the trace processor shows of a trace; arguments under ``arg_prefix`` (args for JSON, debug for
    protobuf), numbers compared as numbers."""
    with TraceProcessor(data) as tp:
        q = tp.query
        return {
            "errors": q("select name, value from stats where value > 0 and severity in ('error', 'data_loss')"),
            "processes": sorted(r["name"] for r in q("select name from process where name is not null")),
            "threads": [(r["tid"], r["name"]) for r in q(
                "select tid, t.name as name from thread t join process p using (upid) "
                "where p.name glob 'autograd-run*' and t.name is not null order by tid")],
            "slices": collections.Counter(tuple(r.values()) for r in q(
                "select s.ts, s.dur, s.name, s.category, s.depth, t.name as thread from slice s "
                "left join thread_track tt on s.track_id = tt.id left join thread t using (utid)")),
            "wait_tracks": sorted({r["name"] for r in q(
                "select distinct tr.name from slice s join track tr on s.track_id = tr.id "
                "where s.category = 'queue_wait'")}),
            "counters": collections.Counter(tuple(r.values()) for r in q(
                "select t.name, c.ts, c.value from counter c join track t on c.track_id = t.id")),
            "flows": collections.Counter(tuple(r.values()) for r in q(
                "select a.name as a, b.name as b from flow f join slice a on a.id = f.slice_out "
                "join slice b on b.id = f.slice_in")),
            "args": collections.Counter((r["name"], r["key"].split(".", 1)[1], _num(r["value"])) for r in q(
                f"select s.name, a.key, a.display_value as value from slice s join args a using (arg_set_id) "
                f"where a.key glob '{arg_prefix}.*'")),
        }


@pytest.mark.parametrize("which", range(8))  # _recordings(), each
def test_the_protobuf_trace_shows_what_the_json_trace_shows(which):
    name, rec = _recordings()[which]
    proto = content(b"".join(pftrace_chunks(rec)), "debug")
    assert proto["errors"] == [], name
    assert proto == content(b"".join(chrome_chunks(rec)), "args"), name


def test_overlapping_queue_waits_get_tracks_of_their_queue_name(tmp_path):
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    g = loads_graph(dumps(generate("fanout", width=40), "json"), "f.json")
    rec = run_session(g, RunOptions(multithreading=False)).recording
    with TraceProcessor(b"".join(pftrace_chunks(rec))) as tp:
        rows = tp.query("select tr.name, count(distinct s.track_id) as tracks, count(*) as n, max(s.depth) as depth "
                        "from slice s join track tr on s.track_id = tr.id where s.category = 'queue_wait' "
                        "group by tr.name")
    assert len(rows) == 1 and rows[0]["name"].startswith("queue wait cpu:") and rows[0]["n"] == len(g.nodes)
    assert rows[0]["tracks"] > 1 and rows[0]["depth"] == 0  # overlapping waits: side by side, never nested


def test_the_trace_file_format_follows_the_path(tmp_path):
    from autograd_run.traces.trace_file import write_trace
    rec = run_session(load_graph("example:seed"), RunOptions()).recording
    for name in ("t.pftrace", "t.perfetto-trace"):
        write_trace(str(tmp_path / name), rec)
        assert (tmp_path / name).read_bytes() == b"".join(pftrace_chunks(rec))


def test_memory_counter_tracks_read_the_same_in_both_formats():
    """The memory model's counter tracks (``Recording.counters``): one track per device, the same values and
    times from the protobuf trace as from the JSON trace, as the trace processor reads them."""
    from autograd_run.analysis.memory import memory_of
    g = load_graph("example:mlp")
    rec = run_session(g, RunOptions()).recording
    mem = memory_of(g, rec)
    rec.counters.extend(mem.counters())
    proto = content(b"".join(pftrace_chunks(rec)), "debug")
    assert proto["errors"] == []
    assert proto == content(b"".join(chrome_chunks(rec)), "args")
    memory = [(name, value) for (name, ts, value), n in proto["counters"].items() if name == "cpu memory allocated"]
    assert memory and max(v for _, v in memory) == mem.devices[0].peak
