"""PyTorch's OpInfo database as the test of every rule (see tests/opinfo_cases.py): every CPU sample of every
differentiable op in float64 (to float64's rounding) and in float32 where the op supports it, captured, replayed
and compared with PyTorch's own backward. An op not exact fails unless opinfo_cases.KNOWN gives the reason; a
listed op that has become exact fails too, so that the list (and docs/opinfo.md) stays true."""

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is the oracle for these tests")
pytest.importorskip("expecttest", reason="torch's op database imports expecttest (make test installs it)")

import opinfo_cases as oc  # noqa: E402

pytestmark = pytest.mark.torch

CASES = [(oc.op_id(op), "float64") for op in oc.differentiable_ops("float64")] + \
        [(oc.op_id(op), "float32") for op in oc.differentiable_ops("float32")]
BY_ID = {}
for _dt in ("float64", "float32"):
    for _op in oc.differentiable_ops(_dt):
        BY_ID.setdefault(oc.op_id(_op), _op)


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_op(name, dtype):
    vs = oc.run_op(BY_ID[name], dtype)
    verdict = oc.op_verdict(vs)
    reason = oc.known(name, dtype)
    bad = [f"#{v.sample} {v.status}: {v.detail}" for v in vs if v.status not in ("exact", "skip")]
    if reason is None:
        assert verdict in ("exact", "skip"), f"{name} ({dtype}): {len(bad)} of {len(vs)} samples:\n" + "\n".join(bad[:8])
    else:
        assert verdict not in ("exact", "skip"), f"{name} ({dtype}) is exact now: take it out of opinfo_cases.KNOWN"


def test_every_known_op_exists():
    ids = {n for n, _ in CASES}
    assert not (set(oc.KNOWN) | set(oc.KNOWN_FLOAT64) | set(oc.KNOWN_FLOAT32)) - ids


def test_the_doc_lists_the_known_ops():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "opinfo.md")
    with open(path, encoding="utf-8") as f:
        assert f.read() == oc.document(), "docs/opinfo.md is stale: run python tests/opinfo_cases.py --write-doc"
