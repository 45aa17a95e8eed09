"""``Tracers``: several tracers behind one, each hook built once for the tracers that implement it."""

from autograd_run.engine.tracer import HOOKS, Tracer, Tracers
from autograd_run.graphs.load import load_graph
from autograd_run.record.order_recorder import OrderRecorder
from autograd_run.record.recorder import Recorder
from builders import run_traced


class Starts(Tracer):
    """Logs ``node_start`` (and nothing else) as (its name, node)."""

    enabled = True

    def __init__(self, name, log):
        self.name, self.log = name, log

    def node_start(self, gt, node):
        self.log.append((self.name, node))


class Ends(Tracer):
    enabled = True

    def __init__(self, log):
        self.log = log

    def node_end(self, gt, node):
        self.log.append(("end", node))


def test_a_hook_no_tracer_implements_stays_the_no_op():
    t = Tracers(Starts("a", []), Ends([]))
    for name in set(HOOKS) - {"node_start", "node_end"}:
        assert getattr(t, name).__func__ is getattr(Tracer, name), name


def test_a_hook_one_tracer_implements_is_that_tracers_own_method():
    log = []
    a, e = Starts("a", log), Ends(log)
    t = Tracers(a, e)
    assert t.node_start == a.node_start and t.node_start.__self__ is a  # no wrapper in between
    assert t.node_end == e.node_end
    t.node_start(None, "n1")
    t.node_end(None, "n1")
    assert log == [("a", "n1"), ("end", "n1")]


def test_a_hook_several_tracers_implement_calls_them_in_order():
    log = []
    t = Tracers(Starts("a", log), Ends(log), Starts("b", log), Starts("c", log))
    t.node_start(None, "n1")
    assert log == [("a", "n1"), ("b", "n1"), ("c", "n1")]


def test_disabled_tracers_are_left_out():
    log = []
    off, on = Starts("off", log), Starts("on", log)
    off.enabled = False
    t = Tracers(off, None, on)
    assert t.tracers == [on]
    t.node_start(None, "n1")
    assert log == [("on", "n1")]


def test_enabled_reflects_the_tracers():
    off = Starts("off", [])
    off.enabled = False
    assert Tracers().enabled is False
    assert Tracers(None, off, Tracer()).enabled is False
    assert Tracers(off, Starts("on", [])).enabled is True


def test_hooks_set_on_the_instance_count_as_implemented():
    """The Recorder's hot hooks are closures on the instance, not methods of its class."""
    rec = Recorder()
    t = Tracers(rec)
    assert t.node_start is rec.node_start and t.task_pushed is rec.task_pushed
    assert t.graph_task_start == rec.graph_task_start


def test_the_engine_reaches_every_tracer():
    log = []
    order, rec = OrderRecorder(), Recorder()
    run_traced(load_graph("example:seed"), Tracers(order, rec, Starts("mine", log)), multithreading=False)
    assert order.ids() == ["sum", "add", "mul_c", "mul_b", "acc_a"]
    assert [s.node.id for s in rec.recording().slices] == order.ids()
    assert [n.id for _, n in log if n.id in order.ids()] == order.ids()


class Pushes(Tracer):
    enabled = True

    def __init__(self, log):
        self.log = log

    def task_pushed(self, queue, gt, node, depth):
        self.log.append(("push", node))


def test_implemented_names_the_hooks_some_tracer_overrides():
    """The compiled engine calls, of the hot hooks, only these (the others are the base's no-ops)."""
    assert Tracers(Starts("a", []), Ends([])).implemented >= {"node_start", "node_end"}
    assert not Tracers(Starts("a", []), Ends([])).implemented & {"task_pushed", "task_popped", "worker_idle"}
    assert {"task_pushed", "node_start", "node_end", "worker_idle"} <= Tracers(Recorder()).implemented


def test_the_hooks_a_tracer_implements_are_called_beside_the_recorder_or_alone():
    """With and without a Recorder's compiled log in front (the engine then calls the rest through
    ``others``), each tracer gets every call of the hooks it implements, on a graph with a device."""
    g = load_graph("example:pipeline")
    runs = []
    for with_recorder in (False, True):
        log = []
        rec = Recorder() if with_recorder else None
        run_traced(g, Tracers(rec, Ends(log), Pushes(log)), devices="virtual")
        ends = [n.id for kind, n in log if kind == "end"]
        pushes = [n.id if n is not None else "(wake-up)" for kind, n in log if kind == "push"]
        runs.append((sorted(ends), sorted(pushes)))
        if rec is not None:
            assert len(rec.drain().slices) == len(ends)
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == len(g.nodes)  # every node (one root: no GraphRoot)
    assert len(runs[0][1]) >= len(g.nodes)  # every task pushed, the root's too
