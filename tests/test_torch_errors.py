"""PyTorch's own errors, with PyTorch 2.13's texts: each case is raised by torch here and by the replay there,
and the two messages must be the same string.

* requested inputs: a differentiated tensor that does not require grad (``grad()``, and ``backward(inputs=)``
  whose text is retain_grad's), an input the graph does not reach (refused by ``grad()`` unless
  ``allow_unused``; ``backward(inputs=)`` leaves it alone);
* a reentrant checkpoint inside ``grad()`` or ``backward(inputs=)``;
* a process forked after the engine's threads started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the oracle of these texts")

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.engine import Engine  # noqa: E402
from autograd_run.engine.run import run_graph  # noqa: E402
from autograd_run.errors import BackwardError, RequestError  # noqa: E402
from autograd_run.graphs.dump import dumps  # noqa: E402
from autograd_run.graphs.load import load_graph, loads_graph  # noqa: E402
from autograd_run.session import RunOptions, run_session  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torch_error(fn) -> str:
    with pytest.raises(RuntimeError) as err:
        fn()
    return str(err.value)


def tensors():
    torch.manual_seed(0)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(3, dtype=torch.float64, requires_grad=True)
    no_grad = torch.randn(3, dtype=torch.float64)
    return x, unused, no_grad


def graph_with_leaves(x, unused, no_grad):
    """y = sum(2 x) captured; the other two leaves declared as PyTorch has them: one unreached, one without grad."""
    y = (x * 2).sum()
    doc = from_torch(y, [x, unused], names={"x": x, "unused": unused}, reference=False)
    doc["variables"].append({"name": "no_grad", "shape": [3], "dtype": "float64", "requires_grad": False})
    return y, loads_graph(dumps(doc, "json"), "leaves.json")


def ours(graph, **kw):
    with pytest.raises(RequestError) as err:
        run_graph(Engine(multithreading=False), graph, **kw)
    return str(err.value)


def test_grad_of_a_tensor_that_does_not_require_grad():
    x, unused, no_grad = tensors()
    y, g = graph_with_leaves(x, unused, no_grad)
    want = torch_error(lambda: torch.autograd.grad(y, [x, no_grad], retain_graph=True))
    assert want == "One of the differentiated Tensors does not require grad"
    assert ours(g, mode="grad", inputs=["x", "no_grad"]) == want


def test_backward_inputs_that_do_not_require_grad_is_retain_grads_error():
    x, unused, no_grad = tensors()
    y, g = graph_with_leaves(x, unused, no_grad)
    want = torch_error(lambda: torch.autograd.backward(y, inputs=[no_grad], retain_graph=True))
    assert want == torch_error(lambda: no_grad.retain_grad())
    assert ours(g, mode="backward", inputs=["no_grad"]) == want


@pytest.mark.parametrize("order", [["unused", "x"], ["x", "unused"]])
def test_an_input_the_graph_does_not_reach(order):
    x, unused, no_grad = tensors()
    y, g = graph_with_leaves(x, unused, no_grad)
    leaves = {"x": x, "unused": unused}
    want = torch_error(lambda: torch.autograd.grad(y, [leaves[n] for n in order], retain_graph=True))
    assert want.startswith(f"The differentiated Tensor at index {order.index('unused')} appears")
    assert ours(g, mode="grad", inputs=order) == want
    # allow_unused: PyTorch gives None there, and so does the replay.
    theirs = torch.autograd.grad(y, [leaves[n] for n in order], retain_graph=True, allow_unused=True)
    res = run_graph(Engine(multithreading=False), g, mode="grad", inputs=order, allow_unused=True)
    assert [res.grads[n] is None for n in order] == [t is None for t in theirs]
    # backward(inputs=) accepts an unreached leaf and leaves it without a gradient.
    torch.autograd.backward(y, inputs=[unused], retain_graph=True)
    assert unused.grad is None
    res = run_graph(Engine(multithreading=False), g, mode="backward", inputs=["unused"])
    assert res.grads["unused"] is None and res.grads["x"] is None


def test_the_command_line_reports_them(tmp_path, capsys):
    from builders import run_cli
    x, unused, no_grad = tensors()
    y, g = graph_with_leaves(x, unused, no_grad)
    path = tmp_path / "g.json"
    from autograd_run.graphs.dump import graph_to_dict
    path.write_bytes(dumps(graph_to_dict(g), "json"))
    code, _, err = run_cli(["run", str(path), "--grad", "--inputs", "x,unused", "--no-summary"], capsys)
    assert code == 2 and "appears to not have been used in the graph" in err
    code, _, err = run_cli(["run", str(path), "--grad", "--inputs", "x,unused", "--allow-unused", "--no-summary"],
                           capsys)
    assert code == 0, err


def checkpointed():
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(1)
    lin = torch.nn.Linear(3, 3).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=True).sum()
    return y, x, lin


def test_a_reentrant_checkpoint_refuses_grad_and_inputs(tmp_path):
    y, x, lin = checkpointed()
    want_grad = torch_error(lambda: torch.autograd.grad(y, [x], retain_graph=True))
    want_inputs = torch_error(lambda: torch.autograd.backward(y, inputs=[x], retain_graph=True))
    assert want_grad == want_inputs and want_grad.startswith("When use_reentrant=True")
    path = str(tmp_path / "ck.json")
    from_torch(y, names={"x": x, **dict(lin.named_parameters())}, path=path)
    g = load_graph(path)
    for mode in ("grad", "backward"):
        with pytest.raises(BackwardError) as err:
            run_graph(Engine(multithreading=False), g, mode=mode, inputs=["x"], allow_unused=True)
        assert str(err.value) == want_grad
    # Capturing it under grad() fails with PyTorch's own text too: the nested graph never exists.
    with pytest.raises(RuntimeError) as err:
        from_torch(y, [x], names={"x": x})
    assert str(err.value) == want_grad


FORK_CHILD = textwrap.dedent("""
    import json, os, sys
    def child(fn):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                fn()
                out = "ok"
            except Exception as exc:
                out = str(exc)
            os.write(w, out.encode())
            os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.waitpid(pid, 0)
        return data.decode()
""")


def run_script(body: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    proc = subprocess.run([sys.executable, "-c", FORK_CHILD + textwrap.dedent(body)], capture_output=True,
                          text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


OURS = """
    from autograd_run.engine import Engine
    from autograd_run.engine.run import run_graph
    from autograd_run.graphs.load import load_graph
    g = load_graph("example:pipeline")
    before = child(lambda: run_graph(Engine(), g))             # no engine threads yet: fine
    eng = Engine()
    run_graph(eng, g)                                         # starts the device threads
    after = child(lambda: run_graph(Engine(), load_graph("example:seed")))
    print(json.dumps({"before": before, "after": after}))
"""

THEIRS = """
    import torch
    from tests.support import pt_oracle
    x = torch.randn(3, requires_grad=True)
    before = child(lambda: (x * 2).sum().backward())
    pt_oracle.load_backend()                                  # PyTorch's engine starts its device threads
    after = child(lambda: (x * 2).sum().backward())
    print(json.dumps({"before": before, "after": after}))
"""


def test_a_fork_after_the_threads_started_refuses_backward():
    got = run_script(OURS)
    assert got["before"] == "ok"
    assert got["after"] == ("Unable to handle autograd's threading in combination with fork-based multiprocessing. "
                            "See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")


def test_the_fork_text_is_pytorchs(pt_oracle_toolchain):
    theirs = run_script(THEIRS)
    ours_ = run_script(OURS)
    assert theirs["before"] == "ok" and theirs["after"] == ours_["after"]


@pytest.fixture
def pt_oracle_toolchain():
    try:
        from tests.support import pt_oracle
    except ImportError:
        from support import pt_oracle
    problem = pt_oracle.toolchain_problem()
    if problem:
        pytest.skip(f"PyTorch's engine with device threads needs the oracle backend: {problem}")


def test_session_allow_unused_option():
    x, unused, no_grad = tensors()
    _, g = graph_with_leaves(x, unused, no_grad)
    with pytest.raises(RequestError):
        run_session(g, RunOptions(mode="grad", inputs=["unused"], profile=False))
    rep = run_session(g, RunOptions(mode="grad", inputs=["unused", "x"], allow_unused=True, profile=False))
    assert rep.result.grads["unused"] is None and rep.result.grads["x"] is not None
