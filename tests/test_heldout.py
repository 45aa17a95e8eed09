"""The accuracy benchmark's held-out graphs (bench/heldout.py): valid, seeded, the same case on any device count."""

import json

import pytest

from autograd_run.graphs.load import loads_graph
from bench import heldout

pytestmark = pytest.mark.timeout(120)


def test_every_family_draws_graphs_that_load_and_cross_devices_through_copies():
    cases = heldout.draw(11, 16)
    assert [c[0] for c in cases[:4]] == list(heldout.FAMILIES)
    for family, k, case, doc in cases:
        g = loads_graph(json.dumps(doc), f"{family}.json")
        for n in g.nodes:
            for e in n.next:
                if e is None or n.op.name == "ToCopyBackward0":
                    continue
                # a gradient changes device only through a ToCopyBackward0 node
                assert e.node.inputs[e.input_nr].device == n.inputs[0].device, (family, n.id)
        devices = {str(m.device) for n in g.nodes for m in n.inputs}
        assert devices == {"cpu"} if k == 0 else all(d.startswith("cuda:") for d in devices - {"cpu"})
        costs = [n.attrs["cost"]["us"] for n in g.nodes if n.op.name == "cost"]
        assert costs and all(heldout.LO_US <= c <= heldout.HI_US for c in costs)


def test_a_seed_repeats_its_graphs_and_a_case_keeps_its_costs_on_other_device_counts():
    assert heldout.draw(3, 8) == heldout.draw(3, 8)
    assert heldout.draw(3, 8) != heldout.draw(4, 8)
    for family in ("layered", "fan", "chain"):
        costs = {k: {n["id"]: n["attrs"]["cost"] for n in heldout.build(family, 99, k)["nodes"] if "attrs" in n}
                 for k in (1, 2, 4)}
        assert costs[1] == costs[2] == costs[4]
