"""A nested (reentrant) backward call runs with its run's settings: anomaly mode and injected faults
reach the nodes of the inner call, as PyTorch's thread-local anomaly mode reaches a checkpoint's
recomputed backward (``torch.utils.checkpoint`` with ``use_reentrant=True``)."""

import warnings

import pytest

from autograd_run.engine.run import run_graph
from autograd_run.errors import BackwardError
from autograd_run.graphs.load import load_graph
from builders import doc, graph, leaf, node, run_cli


def checkpointed_nan():
    """out = checkpoint(lambda x: NanB.apply(x.exp()), x); (out * 2).sum().backward(): the inner
    NanBBackward returns NaN (as a custom Function whose backward multiplies by NaN)."""
    return graph(checkpointed_nan_doc())


def checkpointed_nan_doc() -> dict:
    return (doc(
        node("sum", "SumBackward0", seq=10, next=["mul"], inputs=[[]], saved={"self_sym_sizes": [3]}),
        node("mul", "MulBackward0", seq=9, next=["ckpt", None], inputs=[[3]], saved={"other": 2.0}),
        node("ckpt", "CheckpointFunctionBackward", op="python", seq=8, next=["acc_x"], inputs=[[3]],
             attrs={"callable": "autograd_run.engine.callables:checkpoint", "segment_root": "nanb",
                    "segment_input": "acc_x_inner"}),
        node("nanb", "NanBBackward", op="identity", seq=6, next=["exp"], inputs=[[3]], attrs={"nan": True}),
        node("exp", "ExpBackward0", seq=5, next=["acc_x_inner"], inputs=[[3]],
             saved={"result": {"data": [2.718281828, 7.389056099, 20.08553692]}}),
        leaf("x_inner", [3]),
        leaf("x", [3]),
    ))


def torch_checkpoint_nan_message() -> str:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    class NanB(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError) as err, torch.autograd.detect_anomaly():
            out = checkpoint(lambda t: NanB.apply(torch.exp(t)), x, use_reentrant=True)
            (out * 2).sum().backward()
    return str(err.value)


def test_anomaly_names_the_inner_node_as_pytorch(engine_factory):
    want = torch_checkpoint_nan_message()
    assert want == "Function 'NanBBackward' returned nan values in its 0th output."
    with pytest.raises(BackwardError) as ours:
        run_graph(engine_factory(allow_python=True), checkpointed_nan(), anomaly=True)
    assert str(ours.value) == want
    assert (ours.value.node_id, ours.value.node_name) == ("nanb", "NanBBackward")


def test_inject_error_reaches_a_node_of_the_nested_call(engine_factory):
    with pytest.raises(BackwardError) as err:
        run_graph(engine_factory(allow_python=True), load_graph("example:reentrant"), faults={"inner_exp": "error"})
    assert err.value.node_id == "inner_exp"


def test_cli_inject_error_and_nan_inside_a_reentrant_call(capsys):
    code, out, err = run_cli(["example:reentrant", "--allow-python", "--inject-error", "inner_exp",
                              "--no-summary"], capsys)
    assert code == 1 and err == "Error: node 'inner_exp' (ExpBackward0): injected error in node 'inner_exp'\n"
    code, out, err = run_cli(["example:reentrant", "--allow-python", "--inject-nan", "inner_exp", "--anomaly",
                              "--no-summary"], capsys)
    assert code == 1
    assert err.splitlines()[0] == "Error detected in ExpBackward0. Traceback of forward call that caused the error:"
    assert err.splitlines()[-1] == ("Error: node 'inner_exp' (ExpBackward0): Function 'ExpBackward0' returned nan "
                                    "values in its 0th output.")


def test_an_explicit_setting_of_the_nested_call_wins(engine_factory):
    """A python node may pass its own anomaly flag to the nested call: that one is used."""
    g = checkpointed_nan()
    g.by_id["ckpt"].attrs["callable"] = "test_reentrant_settings:checkpoint_without_anomaly"
    with pytest.raises(BackwardError) as err:
        run_graph(engine_factory(allow_python=True), g, anomaly=True)
    assert err.value.node_name == "CheckpointFunctionBackward"  # caught by the outer call only


def checkpoint_without_anomaly(ctx, grads):
    node = ctx.node
    (captured,) = ctx.grad([ctx.edge(node.attrs["segment_root"])], [grads[0]],
                           inputs=[ctx.edge(node.attrs["segment_input"])], anomaly=False)
    return [captured]



@pytest.mark.parametrize("key, value", [("segment_root", "zz"), ("segment_input", 5), ("segment_input", None)])
def test_a_checkpoint_segment_that_is_not_in_the_graph_is_named(key, value):
    """A shipped checkpoint node whose segment names no node of the graph was a KeyError in the run
    (found by the fuzzer); validate names the place."""
    from autograd_run.errors import GraphFileError
    d = checkpointed_nan_doc()
    ckpt = d["nodes"][2]
    assert ckpt["id"] == "ckpt"
    if value is None:
        del ckpt["attrs"][key]
    else:
        ckpt["attrs"][key] = value
    with pytest.raises(GraphFileError) as exc:
        graph(d)
    assert f"$.nodes[2].attrs.{key}" in str(exc.value) and "the checkpoint's segment" in str(exc.value)
