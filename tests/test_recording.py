"""``Recording.from_events``: the Recorder's raw tuples paired into typed records.

Events are written by hand, as the Recorder appends them (layouts in ``record.recording``);
nodes are plain strings, thread 7 is the caller and thread 8 a device worker.
"""

import numpy as np
import pytest

from autograd_run.graphs.load import load_graph
from autograd_run.record.recording import (
    ERROR, GT_END, GT_START, IDLE, NODE_END, NODE_START, POP, PUSH, SKIP,
    GraphTaskSpan, Idle, NodeSlice, QueueSample, QueueWait, Recording, Skip,
)
from builders import recording

CALLER, WORKER = 7, 8
THREADS = {CALLER: "MainThread", WORKER: "autograd-run cuda:0"}


def test_a_node_slice_carries_its_queue_wait():
    """a is pushed at 20, popped at 30 and runs 40..50 on the worker."""
    ev = [(PUSH, 20, CALLER, "cuda:0", 0, "a", 1),
          (POP, 30, WORKER, "cuda:0", 0, "a", 0),
          (NODE_START, 40, WORKER, 0, 0, "a"),
          (NODE_END, 50, WORKER, 0, 0, "a")]
    rec = Recording.from_events(ev, THREADS)
    wait = QueueWait(gt=0, node="a", queue="cuda:0", pushed=20, popped=30, tid=WORKER)
    assert rec.waits == [wait] and wait.waited == 10
    assert rec.slices == [NodeSlice(gt=0, depth=0, node="a", tid=WORKER, start=40, end=50, wait=wait)]
    assert rec.slices[0].duration == 10
    assert rec.queue_samples == [QueueSample(20, CALLER, "cuda:0", 0, "a", 1, True),
                                 QueueSample(30, WORKER, "cuda:0", 0, "a", 0, False)]
    assert (rec.start, rec.end) == (20, 50)


def test_a_node_without_a_recorded_push_has_no_wait():
    ev = [(NODE_START, 1, CALLER, 0, 0, "root"), (NODE_END, 2, CALLER, 0, 0, "root")]
    assert Recording.from_events(ev, THREADS).slices[0].wait is None


def test_a_wake_up_task_is_a_queue_sample_but_no_wait():
    ev = [(PUSH, 1, CALLER, "cuda:0", -1, None, 1), (POP, 2, WORKER, "cuda:0", -1, None, 0)]
    rec = Recording.from_events(ev, THREADS)
    assert rec.waits == [] and [s.pushed for s in rec.queue_samples] == [True, False]


def test_nested_slices_pair_by_thread_graph_task_and_node():
    """A reentrant backward inside node p: p (task 0) runs 10..60, q (task 1, depth 1) 20..30."""
    ev = [(NODE_START, 10, CALLER, 0, 0, "p"),
          (GT_START, 15, CALLER, 1, 1),
          (NODE_START, 20, CALLER, 1, 1, "q"),
          (NODE_END, 30, CALLER, 1, 1, "q"),
          (GT_END, 40, CALLER, 1, None),
          (NODE_END, 60, CALLER, 0, 0, "p")]
    rec = Recording.from_events(ev, THREADS)
    assert [(s.node, s.gt, s.depth, s.start, s.end) for s in rec.slices] == [("q", 1, 1, 20, 30), ("p", 0, 0, 10, 60)]
    assert rec.graph_tasks == [GraphTaskSpan(gt=1, depth=1, start=15, end=40, tid=CALLER, error=None)]


def test_graph_task_spans_keep_their_error_and_stay_open_when_unfinished():
    ev = [(GT_START, 1, CALLER, 0, 0), (GT_START, 2, CALLER, 1, 0),
          (ERROR, 3, WORKER, 0, "a", "boom"), (GT_END, 4, CALLER, 0, "boom")]
    rec = Recording.from_events(ev, THREADS)
    assert rec.graph_tasks == [GraphTaskSpan(0, 0, 1, 4, CALLER, "boom"), GraphTaskSpan(1, 0, 2, None, CALLER, None)]
    assert [(e.node, e.message) for e in rec.errors] == [("a", "boom")]


def test_idle_time_is_a_span_that_can_end_the_recording():
    ev = [(NODE_START, 10, WORKER, 0, 0, "a"), (NODE_END, 20, WORKER, 0, 0, "a"),
          (IDLE, 20, WORKER, "cuda:0", 90, None), (IDLE, 0, CALLER, "cpu:MainThread", 95, 0)]
    rec = Recording.from_events(ev, THREADS)
    assert rec.idles == [Idle(start=20, end=90, tid=WORKER, queue="cuda:0", waiting_for=None),
                         Idle(start=0, end=95, tid=CALLER, queue="cpu:MainThread", waiting_for=0)]
    assert (rec.start, rec.end) == (0, 95)


def test_skips_are_recorded():
    rec = Recording.from_events([(SKIP, 5, WORKER, 0, "b")], THREADS)
    assert rec.skips == [Skip(ts=5, tid=WORKER, gt=0, node="b")]


def test_threads_get_os_ids_labels_and_display_order():
    ev = [(NODE_START, 1, WORKER, 0, 0, "a"), (NODE_END, 2, WORKER, 0, 0, "a")]
    rec = Recording.from_events(ev, {WORKER: "autograd-run cuda:0", CALLER: "MainThread"}, {CALLER: 700, WORKER: 800})
    assert list(rec.threads) == [700, 800]  # callers first, then device workers
    assert [t.label for t in rec.threads.values()] == ["MainThread", "cuda:0"]
    assert rec.slices[0].tid == 800 and rec.thread_name(800) == "autograd-run cuda:0"
    assert rec.thread_name(9) == "9"


def test_no_events_is_an_empty_recording():
    rec = Recording.from_events([], THREADS)
    assert rec.empty and rec.slices == [] and len(rec.threads) == 2


def test_a_real_run_pairs_every_node_with_its_wait():
    rec = recording(load_graph("example:pipeline"))
    ids = sorted(n.id for n in load_graph("example:pipeline").nodes)
    assert sorted(s.node.id for s in rec.slices) == ids
    assert all(s.wait is not None and s.wait.node is s.node and s.wait.popped <= s.start for s in rec.slices)
    assert [(g.depth, g.error) for g in rec.graph_tasks] == [(0, None)]
    assert all(g.start <= s.start and s.end <= g.end for g in rec.graph_tasks for s in rec.slices)


def test_a_logged_recording_reads_as_its_events_paired_one_by_one():
    """Recording.from_log (vectorised pairing of the EventLog's records) gives the same typed records
    as from_events over the Recorder's events as tuples, on real runs with several threads."""
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.record.recorder import Recorder
    graphs = [load_graph("example:" + n) for n in ("seed", "pipeline", "checkpoint")]
    graphs.append(loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json"))
    for g in graphs:
        rec = Recorder()
        eng = Engine(DeviceSet("virtual"), tracer=rec)
        for _ in range(2):
            run_graph(eng, g, GraphState(g))
        eng.shutdown()
        logged = rec.recording()
        paired = Recording.from_events(rec.events, rec.threads, rec.os_tids)
        assert logged == paired, g.source
        assert len(logged.slices) == len(g.nodes) * 2 - (0 if len(g.roots) == 1 else -2)


def test_drain_hands_over_the_events_so_far_and_forgets_them():
    """A run of many passes drains the recorder after each one (flat memory): each drain is a Recording of
    the events since the last one, paired as recording() pairs them; the thread names stay."""
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.record.recorder import Recorder
    g = load_graph("example:pipeline")
    rec = Recorder()
    eng = Engine(DeviceSet("virtual"), tracer=rec)
    drained = []
    try:
        for _ in range(3):
            run_graph(eng, g, GraphState(g))
            whole = rec.recording()  # the same events, not forgotten
            drained.append(rec.drain())
            assert drained[-1] == whole
    finally:
        eng.shutdown()
    for d in drained:
        assert len(d.graph_tasks) == 1 and d.graph_tasks[0].depth == 0
        assert len(d.slices) == len(drained[0].slices) > len(g.nodes) - 1
        assert d.start == d.graph_tasks[0].start and d.threads == drained[0].threads
    assert drained[0].end <= drained[1].start and drained[1].end <= drained[2].start
    last = rec.drain()  # what the workers recorded after the last pass (their idle ends), then nothing
    assert rec.drain().empty and last.graph_tasks == [] and last.slices == []
    assert rec.events == [] and rec.recording().empty


def _pair_inputs(graph, **kw):
    """The arguments ``recording._pair`` gets for the runs of ``graph`` (one call per drained recording)."""
    from autograd_run.session import RunOptions, run_session
    from autograd_run.record import recording as rec
    calls, real = [], rec._pair

    def spy(*args):
        calls.append(args)
        return real(*args)
    rec._pair = spy
    try:
        run_session(graph, RunOptions(profile=True, **kw))
    finally:
        rec._pair = real
    return calls


def _tables(cols):
    return {name: {k: v for k, v in vars(getattr(cols, name)).items() if k != "_n"}
            for name in ("samples", "waits", "slices", "idles")}


@pytest.mark.parametrize("source,kw", [
    ("chain", {}), ("fanout", {}), ("mlp", {}), ("transformer2", {}), ("transformer2", {"repeat": 2}),
    ("example:reentrant", {}), ("example:checkpoint", {}), ("example:pipeline", {}), ("example:failing", {}),
    ("random", {}),
])
def test_the_compiled_pairing_is_the_numpy_pairing(source, kw, monkeypatch):
    """``_core.pair_common`` (one pass over the event log, the common case) gives the columns the numpy
    pairing gives, where it answers; where it does not (several GraphTasks, a node run twice), the numpy path
    runs as before."""
    from autograd_run.engine import core
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.record import recording as rec
    if core.pair_common is None:
        pytest.skip("the compiled core is not in use")
    docs = {"chain": ("chain", dict(n=300, op="add")), "fanout": ("fanout", dict(width=40)),
            "mlp": ("mlp", dict(layers=20, width=3, batch=2)),
            "transformer2": ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8, devices=2)),
            "random": ("random", dict(nodes=150, leaves=20, width=2, seed=5))}
    if source in docs:
        kind, args = docs[source]
        g = loads_graph(dumps(generate(kind, **args), "json"), "g.json")
    else:
        g = load_graph(source)
    calls = _pair_inputs(g, **kw)
    assert calls
    answered = 0
    for args in calls:
        got = core.pair_common(args[0], args[1], len(args[2]))
        compiled = rec._pair(*args)
        monkeypatch.setattr(core, "pair_common", None)
        plain = rec._pair(*args)
        monkeypatch.undo()
        a, b = _tables(compiled), _tables(plain)
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].keys() == b[name].keys(), name
            for col in a[name]:
                x, y = a[name][col], b[name][col]
                assert x.dtype == y.dtype and np.array_equal(x, y), (source, name, col)
        answered += got is not None
    if source in ("chain", "fanout", "mlp", "random"):
        assert answered == len(calls)  # one GraphTask, each node once: the compiled pass answers
