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
