"""Summary statistics (hand-computed on synthetic events) and the rendered tables (golden text)."""

import io

import pytest
from rich.console import Console

from autograd_run.cli.render import summary_tables
from autograd_run.graphs.load import load_graph
from autograd_run.record import recording as R
from autograd_run.record.recorder import Recorder
from autograd_run.record.recording import Recording
from autograd_run.analysis.summary import p95, summarize
from autograd_run.engine import core
from builders import run_traced


def fake_clock(step=1000):
    t = [0]

    def clock():
        t[0] += step
        return t[0]
    return clock


def seed_summary():
    """The summary of example:seed run on the calling thread (named ``caller``) under a fake clock."""
    rec = Recorder(clock=fake_clock())
    run_traced(load_graph("example:seed"), rec, multithreading=False)
    return summarize(Recording.from_events(rec.events, {k: "caller" for k in rec.threads}))


def test_p95_nearest_rank():
    assert p95([]) == 0
    assert p95([5]) == 5
    assert p95(list(range(1, 101))) == 95
    assert p95(list(range(1, 21))) == 19


def test_summary_of_a_deterministic_run():
    s = seed_summary()
    assert s.nodes_executed == 5 and s.nodes_skipped == 0 and s.graph_tasks == 1
    # Fake clock: every stamp is 1 µs after the previous one, so each node's slice
    # (start, end) spans exactly the events recorded inside it.
    assert {k: d.count for k, d in s.ops.items()} == {"MulBackward0": 2, "SumBackward0": 1,
                                                      "AddBackward0": 1, "AccumulateGrad": 1}
    assert all(d.total_ns == 1000 * d.count for d in s.ops.values())
    # mul_b waited longest in the queue (pushed before mul_c, popped after it).
    assert [r.id for r in s.critical_path] == ["sum", "add", "mul_b", "acc_a"]
    assert s.critical_path_ns == 12000 and s.wall_ns == 21000
    assert s.workers[0].nodes == 5 and s.workers[0].busy_ns == 5000


def test_busy_time_does_not_double_count_nested_slices():
    class N:
        def __init__(self, i):
            from autograd_run.ops import IDENTITY
            self.id, self.name, self.op, self.next = f"n{i}", "X", IDENTITY, []
    a, b = N(1), N(2)
    ev = [(R.NODE_START, 100, 1, 0, 0, a), (R.NODE_START, 200, 1, 1, 1, b), (R.NODE_END, 300, 1, 1, 1, b),
          (R.NODE_END, 500, 1, 0, 0, a), (R.IDLE, 500, 1, "q", 900, None)]
    s = summarize(Recording.from_events(ev, {1: "w"}))
    assert s.workers[0].busy_ns == 400 and s.workers[0].idle_ns == 400
    assert s.wall_ns == 800
    assert s.workers[0].utilization == 0.5


# Hand-checked: the fake clock stamps 1 µs per event; wall = 22 - 1 = 21 µs; the
# critical path is sum (wait 1 + run 1), add (1 + 1), mul_b (waited 10 -> 15: 5 + 1),
# acc_a (1 + 1) = 12 µs = 57% of wall; busy 5 µs = 24%.
GOLDEN = """\
example:seed: 5 nodes
wall time                              21.0 µs
nodes executed                               5
nodes skipped                                0
graph tasks                                  1
critical path   12.0 µs (57% of wall), 4 nodes
                 workers
┏━━━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━┳━━━━━━┓
┃ worker ┃ nodes ┃   busy ┃ idle ┃ util ┃
┡━━━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━┩
│ caller │     5 │ 5.0 µs │ 0 ns │  24% │
└────────┴───────┴────────┴──────┴──────┘
"""


def render(s, width=100):
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, color_system=None, force_terminal=False)
    for r in summary_tables(s, "example:seed: 5 nodes")[:2]:
        console.print(r)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def test_summary_tables_golden_text():
    assert render(seed_summary()) == GOLDEN


def _runs():
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.session import RunOptions, run_session
    graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint")]
    graphs += [loads_graph(dumps(generate("random", nodes=200, leaves=40, seed=s), "json"), "r.json") for s in (0, 1)]
    graphs.append(loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json"))
    for g in graphs:
        for mt in (False, True):
            # every pass's events: the gaps between passes are left out of wall and idle times
            yield g, run_session(g, RunOptions(multithreading=mt, repeat=2, keep_recording=True)).recording


def test_the_columnar_summary_is_the_reference_summary():
    """summarize (numpy over columns, compiled loops) equals the record-by-record reference on real runs."""
    from autograd_run.analysis.summary import summarize_reference
    for g, rec in _runs():
        fast, ref = summarize(rec), summarize_reference(rec)
        assert fast == ref, g.source
        assert fast.to_dict() == ref.to_dict()


def test_a_folded_summary_is_the_reference_folded_summary():
    """A --repeat run without a trace folds each pass (a drained Recording) into a SummaryBuilder: read as
    columns, it is the same as folded record by record."""
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import run_graph
    from autograd_run.analysis.summary import SummaryBuilder
    for name in ("mlp", "pipeline", "checkpoint"):
        g = load_graph("example:" + name)
        rec = Recorder()
        eng = Engine(DeviceSet("virtual"), tracer=rec)
        drained = []
        try:
            for _ in range(3):
                run_graph(eng, g, GraphState(g))
                drained.append(rec.drain())
        finally:
            eng.shutdown()
        drained.append(rec.drain())
        fast, ref = SummaryBuilder(), SummaryBuilder(reference=True)
        for d in drained:
            fast.add(d)
            ref.add(d)
        assert fast.summary() == ref.summary(), name
        assert fast.summary().to_dict() == ref.summary().to_dict(), name
        assert fast.summary().passes.count == 3 and fast.summary().graph_tasks >= 3


def test_the_summary_of_a_simulation_is_the_reference_summary():
    from autograd_run.sim.session import SimOptions, simulate_session
    from autograd_run.analysis.summary import summarize_reference
    for name in ("seed", "mlp", "pipeline", "checkpoint"):
        rec = simulate_session(load_graph("example:" + name), SimOptions()).recording
        assert summarize(rec) == summarize_reference(rec), name


def test_a_node_run_twice_in_one_graph_task_falls_back_to_the_reference():
    class N:
        def __init__(self, i):
            from autograd_run.ops import IDENTITY
            self.id, self.name, self.op, self.next = f"n{i}", "X", IDENTITY, []
    a = N(1)
    ev = [(R.NODE_START, 100, 1, 0, 0, a), (R.NODE_END, 200, 1, 0, 0, a),
          (R.NODE_START, 300, 1, 0, 0, a), (R.NODE_END, 450, 1, 0, 0, a)]
    s = summarize(Recording.from_events(ev, {1: "w"}))
    assert s.nodes_executed == 1 and s.ops["X"].count == 2 and s.critical_path[0].duration_ns == 150


@pytest.mark.skipif(not core.COMPILED,
                    reason="the bound is the compiled core's (the pure-Python twins build the columns from lists)")
def test_a_simulated_recording_and_its_summary_stay_within_their_memory():
    """A simulation's Recording and summary at a million nodes: their columns, not copies of them, and the
    critical path as int64 rows (a list of ints was 40 MB more). Measured by tracemalloc on a 50,000-node chain:
    the Recording's columns and the summary's peak together under 250 bytes a node (308 with copies and a list)."""
    import tracemalloc
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.session import SimOptions, simulate_session
    n = 50000
    report = simulate_session(loads_graph(dumps(generate("chain", n=n), "json"), "chain.json"),
                              SimOptions(spec="h100", slack_top=0))
    tracemalloc.start()
    try:
        report.summary  # the Recording's columns, then the summary over them
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.summary.nodes_executed == n + 1 and len(report.summary.critical_path) == n + 1
    assert peak < 250 * n, peak / n
