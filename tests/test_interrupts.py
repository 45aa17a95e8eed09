"""Stopping a run: Ctrl-C (a real SIGINT to the command) and --timeout stop it, write what was
recorded (the trace and the order marked incomplete) and exit 130 / 124 with one line on stderr,
whichever thread the running node is on."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from autograd_run.errors import RunInterrupted
from autograd_run.session import RunOptions, run_session
from autograd_run.stopping import RunStop
from autograd_run.traces.layout import slice_node
from autograd_run.traces.order import read_order
from autograd_run.errors import RequestError
from builders import doc, graph, leaf, node
from cli_proc import ROOT, cli, cli_argv, cli_env

TESTS = os.path.dirname(os.path.abspath(__file__))


def mark_started(ctx, grads):
    """A python node that says the run has started (a file named in its attrs), then passes its gradient on."""
    open(ctx.node.attrs["marker"], "w").close()
    return [grads[0]]


def sleep_in_python(ctx, grads):
    """A node that does not look at stop requests (a long call in user code)."""
    time.sleep(float(ctx.node.attrs["seconds"]))
    return [grads[0]]


def raise_keyboard_interrupt(ctx, grads):
    raise KeyboardInterrupt


def cost_chain(n, us, devices=(), marker=None, mode=None, first=None):
    """A chain of ``n`` cost nodes of ``us`` µs each (round-robin over ``devices``, else the CPU), below an
    optional ``first`` node; the leaf ``x``."""
    nodes = []
    if first is not None:
        nodes.append(first)
    for i in range(n):
        dev = devices[i % len(devices)] if devices else "cpu"
        cost = {"us": us, **({"mode": mode} if mode else {})}
        nodes.append(node(f"c{i}", "Cost", op="cost", seq=n - i, next=[f"c{i + 1}" if i + 1 < n else "acc_x"],
                          inputs=[{"shape": [2], "device": dev}], attrs={"cost": cost}))
    nodes.append(leaf("x", [2], device=devices[-1] if devices else None))
    return doc(*nodes)


def started_first(marker):
    return node("start", "MarkStarted", op="python", seq=10_000, next=["c0"], inputs=[[2]],
                attrs={"callable": "test_interrupts:mark_started", "marker": str(marker)})


def wait_for(path, proc, timeout=60):
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the run did not start"
        time.sleep(0.05)


def interrupt_cli(tmp_path, d, *args, presses=1, gap=1.0):
    g = tmp_path / "g.json"
    g.write_text(json.dumps(d))
    env = cli_env(PYTHONPATH=ROOT + os.pathsep + TESTS)
    p = subprocess.Popen(cli_argv([g, "--allow-python", *args]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    wait_for(tmp_path / "started", p)
    time.sleep(0.3)
    t0 = time.monotonic()
    for k in range(presses):
        if k:
            time.sleep(gap)
        p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return p.returncode, out.decode(), err.decode(), time.monotonic() - t0


@pytest.mark.parametrize("where", ["caller", "device threads"])
def test_ctrl_c_stops_the_run_and_writes_what_was_recorded(tmp_path, where):
    devices = ("cuda:0", "cuda:1") if where == "device threads" else ()
    d = cost_chain(100, 200_000, devices, first=started_first(tmp_path / "started"))  # 20 s of cost nodes
    trace, order = tmp_path / "t.json", tmp_path / "o.jsonl"
    code, out, err, took = interrupt_cli(tmp_path, d, "--devices", "virtual", "--trace", trace,
                                         "--order-out", order)
    assert code == 130
    assert err == f"Error: interrupted before the backward pass finished; wrote {trace} and {order} (incomplete)\n"
    assert out == "" and took < 10
    t = json.loads(trace.read_text())
    assert t["otherData"]["incomplete"] == "interrupted"
    ran = [slice_node(e["name"], e["args"])[0] for e in t["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "node"]
    assert ran[0] == "start" and 1 < len(ran) < 101
    lines = order.read_text().splitlines()
    assert json.loads(lines[-1]) == {"incomplete": "interrupted"} and len(lines) == len(ran) + 1
    with pytest.raises(RequestError, match="incomplete order cannot be a golden one"):
        read_order(str(order))


def test_ctrl_c_between_repeated_passes(tmp_path):
    d = cost_chain(10, 100_000, first=started_first(tmp_path / "started"))  # 1 s per pass
    trace = tmp_path / "t.json"
    code, out, err, took = interrupt_cli(tmp_path, d, "--repeat", "50", "--trace", trace)
    assert code == 130 and took < 10
    assert err.startswith("Error: interrupted in pass 1 of 50; wrote") and err.count("\n") == 1


def test_a_second_ctrl_c_stops_a_node_that_does_not_return(tmp_path):
    """The first press asks the run to stop; a node in user code does not look; the second press stops it."""
    slow = node("slow", "Slow", op="python", seq=5_000, next=["c0"], inputs=[[2]],
                attrs={"callable": "test_interrupts:sleep_in_python", "seconds": 60})
    d = cost_chain(2, 1000, first=slow)
    d["nodes"].insert(0, started_first(tmp_path / "started"))
    d["nodes"][0]["next"] = [["slow", 0]]
    d["roots"] = [{"node": "start", "grad": "ones"}]
    trace = tmp_path / "t.json"
    code, out, err, took = interrupt_cli(tmp_path, d, "--trace", trace, presses=2)
    assert code == 130 and took < 20
    assert err.count("\n") == 1 and err.startswith("Error: interrupted")
    assert json.loads(trace.read_text())["otherData"]["incomplete"] == "interrupted"


def test_timeout_stops_the_run_with_exit_124(tmp_path):
    g = tmp_path / "g.json"
    g.write_text(json.dumps(cost_chain(40, 250_000, ("cuda:0", "cuda:1"))))  # 10 s
    order = tmp_path / "o.jsonl"
    t0 = time.monotonic()
    p = cli([g, "--devices", "virtual", "--timeout", "1.5", "--order-out", order])
    assert p.code == 124 and time.monotonic() - t0 < 9
    assert p.err == (f"Error: --timeout: stopped after 1.5 s before the backward pass finished; wrote {order} "
                     f"(incomplete)\n")
    assert json.loads(order.read_text().splitlines()[-1]) == {"incomplete": "timeout"}


def test_timeout_must_be_positive():
    p = cli(["example:seed", "--timeout", "0"])
    assert p.code == 2 and "--timeout" in p.err


# -- the library -----------------------------------------------------------------------------------

def test_run_stop_from_another_thread():
    g = graph(cost_chain(50, 100_000, mode="sleep"))
    stop = RunStop()
    threading.Timer(0.5, stop.request).start()
    t0 = time.monotonic()
    r = run_session(g, RunOptions(stop=stop, multithreading=False))
    assert time.monotonic() - t0 < 3
    assert r.interrupted == "interrupted" and isinstance(r.error, RunInterrupted) and r.result is None
    assert 0 < r.summary.nodes_executed < 51
    stop.close()


def test_a_keyboard_interrupt_inside_a_node_is_an_interruption_not_a_node_failure():
    g = graph(doc(node("k", "K", op="python", seq=1, next=["acc_x"], inputs=[[2]],
                       attrs={"callable": "test_interrupts:raise_keyboard_interrupt"}), leaf("x", [2])))
    r = run_session(g, RunOptions(allow_python=True, multithreading=False))
    assert r.interrupted == "interrupted" and r.error.exit_code == 130 and r.error.node_id is None


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_timeout_must_be_finite(value, capsys):
    from builders import run_cli
    code, out, err = run_cli(["example:seed", "--timeout", value], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (f"Error: Invalid value for '--timeout': '{value}': must be a finite number of "
                                    "seconds, more than 0")


def test_a_far_timeout_is_no_traceback_and_still_a_limit():
    """select() cannot wait 1e300 s (time_t overflows): the watchdog waits for it by the day."""
    p = cli(["example:seed", "--timeout", "1e300", "--no-summary"])
    assert (p.code, p.err) == (0, "")
    from autograd_run.stopping import MAX_WAIT_S, RunStop, Watchdog
    stopped = []
    stop = RunStop()
    with Watchdog(stop, 1e300, stopped.append):
        pass
    assert stopped == [] and MAX_WAIT_S <= 86400


def test_the_session_refuses_a_nan_timeout():
    from autograd_run.errors import RequestError
    from autograd_run.graphs.load import load_graph
    from autograd_run.session import RunOptions, run_session
    with pytest.raises(RequestError, match="time limit") as info:
        run_session(load_graph("example:seed"), RunOptions(timeout=float("nan"), profile=False))
    assert info.value.option == "timeout"
