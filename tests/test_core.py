"""The compiled core and its pure-Python twin: built where a compiler is, and the same decisions."""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from autograd_run.engine import core
from autograd_run.engine import ready_queue as pure

pytestmark = pytest.mark.timeout(300)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_core_is_compiled_where_a_compiler_is():
    if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("the pure-Python twin is forced")
    assert core.COMPILED, core.WHY


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
@pytest.mark.parametrize("seed", range(5))
def test_the_heaps_pop_in_the_same_order(seed):
    """Many ties (as many AccumulateGrad nodes ready at once), keys beyond 64 bits, pushes and pops interleaved."""
    rnd = random.Random(seed)
    c, p = core.ReadyQueue("c"), pure.ReadyQueue("p")
    out_c, out_p = [], []
    for step in range(3000):
        if rnd.random() < 0.6 or not len(p):
            key = rnd.choice([(rnd.randint(0, 3) << 64) | rnd.randint(0, 5), (0 << 64) | (2**64 - 1), 1 << 100])
            item = ("gt", step, None)
            c.push(key, item)
            p.push(key, item)
        else:
            out_c.append(c.pop()[1])
            out_p.append(p.pop()[1])
    while len(p):
        out_c.append(c.pop()[1])
        out_p.append(p.pop()[1])
    assert out_c == out_p and len(c) == 0


ORDERS = r'''
import json, sys
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.session import RunOptions, run_session
graphs = [load_graph("example:" + n) for n in ("seed", "mlp", "pipeline", "checkpoint")]
graphs += [loads_graph(dumps(generate("random", nodes=300, leaves=50, seed=s), "json"), "r.json") for s in range(3)]
graphs.append(loads_graph(dumps(generate("transformer", layers=2, devices=2), "json"), "t.json"))
out = []
for g in graphs:
    rep = run_session(g, RunOptions(multithreading=False, record_order=True))
    out.append([[r["id"], r["depth"]] for r in rep.order])
    out.append({k: None if v is None else float(abs(v).sum()) for k, v in rep.result.grads.items()})
print(json.dumps(out))
'''


def orders(pure_python: bool):
    env = {**os.environ, "AUTOGRAD_RUN_PURE_PYTHON": "1" if pure_python else "0"}
    out = subprocess.run([sys.executable, "-c", ORDERS], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not core.COMPILED, reason="the compiled core is not built")
def test_compiled_and_pure_engines_agree():
    compiled, pure_python = orders(False), orders(True)
    assert compiled == pure_python


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_a_signal_reaches_the_main_thread_while_it_waits_on_an_empty_queue(impl):
    """The caller sleeping in ``pop`` (its graph's nodes all on device threads) must still see Ctrl-C:
    Python's own lock waits let a signal handler run, so the compiled wait must too."""
    import signal
    import time
    if impl == "compiled" and not core.COMPILED:
        pytest.skip("the compiled core is not built")
    q = core.ReadyQueue("c") if impl == "compiled" else pure.ReadyQueue("p")

    class Rang(Exception):
        pass

    def ring(signum, frame):
        raise Rang()

    old = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(Rang):
            q.pop()
        assert time.monotonic() - t0 < 2.0
        # the queue still works after the interrupted wait
        q.push(1, ("gt", "item", None))
        assert q.pop()[1] == "item" and len(q) == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
