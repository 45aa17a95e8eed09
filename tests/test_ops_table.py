"""The op table: one spec per name, every op runnable, the docs' catalogue current."""

import os

import pytest

from autograd_run.engine.builtin_nodes import RUNNERS
from autograd_run.ops import REGISTRY, lookup
from autograd_run.ops.catalog import MARKER, markdown
from autograd_run.ops.spec import OpSpec, Registry, parse_saved


def test_every_op_has_exactly_one_runner():
    assert set(RUNNERS) == set(REGISTRY)
    assert len({s.name for s in REGISTRY}) == len(REGISTRY)
    assert all(callable(RUNNERS[s]) for s in REGISTRY)


def test_aliases_resolve_to_the_same_spec():
    assert lookup("torch::autograd::AccumulateGrad") is lookup("AccumulateGrad")
    assert lookup("NoSuchBackward0") is None


def test_a_name_declared_twice_is_refused():
    reg = Registry()
    reg.add(OpSpec("XBackward0", lambda n, g, c: []))
    with pytest.raises(RuntimeError, match="declared twice"):
        reg.add(OpSpec("XBackward0", lambda n, g, c: []))


def test_saved_field_declarations():
    fields = parse_saved("self:tensor dim:ints? keepdim:bool?")
    assert fields["self"].kind == "tensor" and not fields["self"].optional
    assert fields["dim"].kind == "ints" and fields["dim"].optional
    with pytest.raises(ValueError):
        parse_saved("self:matrix")
    assert lookup("MulBackward0").tensor_fields == {"self", "other"}


def test_cost_models_give_numbers():
    from autograd_run.ops.cost import Shapes
    mm = lookup("MmBackward0").cost
    s = Shapes(inputs=[((4, 5), "float32")], outputs=[((4, 3), "float32"), ((3, 5), "float32")])
    assert mm.flops(s) == 2 * (2 * 4 * 5 * 3)  # two products of 2*m*n*k
    assert mm.bytes(s) == 4 * (20 + 12 + 15)


def test_docs_catalogue_is_current():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "ops.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert MARKER in text
    assert text.split(MARKER)[1].strip() == markdown().strip(), \
        "docs/ops.md is stale: run python -m autograd_run.ops.catalog --write"


#: Ops whose output count nothing on the node tells (one per stacked / block-diagonal tensor; PyTorch saves
#: neither count): their next edges are not checked.
UNKNOWN_OUTPUTS = {"StackBackward0", "BlockDiagBackward0"}


def test_every_op_declares_its_outputs():
    from autograd_run.ops import Outputs
    for spec in REGISTRY:
        if spec.engine:
            assert spec.outputs is None, spec.name  # the engine's kinds keep their own rules
        elif spec.name in UNKNOWN_OUTPUTS:
            assert spec.outputs is None, spec.name
        else:
            assert isinstance(spec.outputs, Outputs) or (type(spec.outputs) is int and spec.outputs >= 1), spec.name


def test_op_refuses_a_missing_or_bad_outputs():
    from autograd_run.ops.spec import op
    with pytest.raises(TypeError, match="outputs"):
        op("XBackward0")
    with pytest.raises(ValueError, match="outputs"):
        op("XBackward0", outputs="2")


def _derivatives_yaml() -> dict:
    """PyTorch's node name -> the (name, C++ type) of each input with a formula, from the torchgen copy of
    ``tools/autograd/derivatives.yaml`` that ships with torch (skipped without it)."""
    pytest.importorskip("torch")
    torchgen = pytest.importorskip("torchgen")
    try:
        from torchgen.packaged.autograd.load_derivatives import load_derivatives
        base = os.path.join(os.path.dirname(torchgen.__file__), "packaged")
        infos, _ = load_derivatives(os.path.join(base, "autograd", "derivatives.yaml"),
                                    os.path.join(base, "ATen", "native", "native_functions.yaml"),
                                    os.path.join(base, "ATen", "native", "tags.yaml"))
    except (ImportError, OSError, TypeError) as exc:  # another torchgen layout
        pytest.skip(f"torchgen cannot load derivatives.yaml here: {exc}")
    out = {}
    for by_key in infos.values():
        for info in by_key.values():
            if info.op is not None:
                out[info.op] = [(a.name, str(a.type)) for a in info.args_with_derivatives]
    return out


#: Declared ops that derivatives.yaml does not list, with why (their counts are checked against PyTorch's
#: nodes by the capture tests instead).
NOT_IN_DERIVATIVES_YAML = {
    "MaxPool1DWithIndicesBackward0": "an older PyTorch's; max_pool1d now goes through the 2-d op",
    "BackwardHookFunctionBackward": "a Python autograd.Function (nn.Module full backward hooks)",
    "_DDPSinkBackward": "a Python autograd.Function (DistributedDataParallel's _DDPSink)",
    "RegisterPostBackwardFunctionBackward": "a Python autograd.Function (FSDP2's post-backward hook)",
    "RegisterPreBackwardFunctionBackward": "a Python autograd.Function (FSDP2's pre-backward under functorch)",
    "_DirichletBackward": "a Python autograd.Function (torch.distributions)",
    "torch::autograd::CopySlices": "written by hand in PyTorch (in-place ops on views)",
    "torch::autograd::CopyBackwards": "written by hand in PyTorch (copy_)",
}


@pytest.mark.torch
def test_outputs_match_derivatives_yaml():
    """One output per input that derivatives.yaml gives a formula (a tensor list: a count read per node)."""
    from autograd_run.ops import Outputs
    derivs = _derivatives_yaml()
    for spec in REGISTRY:
        if spec.engine:
            continue
        args = derivs.get(spec.name)
        if args is None:
            assert spec.name in NOT_IN_DERIVATIVES_YAML, f"{spec.name} is not in derivatives.yaml"
            continue
        if any("List" in t or "[]" in t for _, t in args):  # cat, stack, block_diag: one per listed tensor
            assert len(args) == 1 and (spec.outputs is None or isinstance(spec.outputs, Outputs)), spec.name
        else:
            assert spec.outputs == len(args), f"{spec.name}: declared {spec.outputs}, derivatives.yaml {args}"
