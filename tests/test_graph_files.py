"""Graph files: round trips, every validation error (message and location), hostile input."""

import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from autograd_run.errors import GraphFileError
from autograd_run.graphs.dump import dumps, graph_to_dict
from autograd_run.graphs.generators import GENERATORS, generate
from autograd_run.graphs.load import example_names, load_graph, loads_graph
from autograd_run.graphs.model import ensure_consumers
from builders import add, doc, graph, leaf, mul, run_traced, total


def seed_doc():
    """The engine chapter's graph (``example:seed``), a fresh copy each call:

        sum -> add -> mb (a * 2, seq 0) -> acc (a)
                  \\-> mc (a * 3, seq 1) -/
    """
    return doc(
        total("sum", "add", seq=3, shape=[2]),
        add("add", "mb", "mc", seq=2, shape=[2]),
        mul("mb", "acc", 2.0, seq=0, shape=[2]),
        mul("mc", "acc", 3.0, seq=1, shape=[2]),
        leaf("a", [2], id="acc"),
    )


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("kind", GENERATORS)
def test_round_trip_generated(kind, fmt):
    d = generate(kind)
    g = graph(d, fmt)
    again = graph(graph_to_dict(g), fmt)
    assert graph_to_dict(again) == graph_to_dict(g)
    assert [n.id for n in again.nodes] == [n.id for n in g.nodes]
    assert [(n.seq, n.topo_nr, str(n.device)) for n in again.nodes] == [(n.seq, n.topo_nr, str(n.device)) for n in g.nodes]


@pytest.mark.parametrize("name", example_names())
def test_examples_load_and_round_trip(name):
    g = load_graph(f"example:{name}")
    for fmt in ("json", "yaml"):
        assert graph_to_dict(graph(graph_to_dict(g), fmt)) == graph_to_dict(g)


def test_derived_fields():
    g = graph(seed_doc(), "json")
    assert {n.id: n.topo_nr for n in g.nodes} == {"sum": 3, "add": 2, "mb": 1, "mc": 1, "acc": 0}
    assert g.by_id["acc"].seq == 2**64 - 1
    assert all(n.consumers is None for n in g.nodes)  # made when first needed, in list order
    ensure_consumers(g)
    assert [(c.id, nr) for c, nr in g.by_id["acc"].consumers] == [("mb", 0), ("mc", 0)]
    assert [(c.id, nr) for c, nr in g.by_id["add"].consumers] == [("sum", 0)]
    assert g.by_id["sum"].consumers == []
    before = [list(n.consumers) for n in g.nodes]
    ensure_consumers(g)  # once made, kept
    assert [n.consumers for n in g.nodes] == before
    pipe = load_graph("example:pipeline")
    assert str(pipe.by_id["copy"].device) == "cuda:1" and str(pipe.by_id["relu"].device) == "cuda:0"


def test_generators_are_deterministic():
    for kind in GENERATORS:
        assert dumps(generate(kind, seed=5), "json") == dumps(generate(kind, seed=5), "json")
    assert dumps(generate("random", seed=1), "json") != dumps(generate("random", seed=2), "json")


def mutate(d, path, value):
    at = d
    for p in path[:-1]:
        at = at[p]
    if value is DELETE:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return d


DELETE = object()

# (path to change, new value, expected message fragment, expected JSON path fragment)
CASES = [
    (("format",), "autograd-graph/9", "unsupported format", "$.format"),
    (("mode",), "sideways", "mode must be", "$.mode"),
    (("nodes", 0, "seq"), "three", "expected 'int | null', got 'str'", "$.nodes[0].seq"),
    (("nodes", 1, "colour"), "red", "unknown field 'colour'", "$.nodes[1].colour"),
    (("nodes", 1, "name"), DELETE, "missing required field 'name'", "$.nodes[1]"),
    (("nodes", 1, "id"), "sum", "duplicate node id 'sum'", "$.nodes[1].id"),
    (("nodes", 1, "next", 0, 0), "nowhere", "edge to missing node 'nowhere'", "$.nodes[1].next[0][0]"),
    (("nodes", 1, "next", 0, 1), 3, "input_nr 3 out of range", "$.nodes[1].next[0][1]"),
    (("nodes", 2, "name"), "FrobnicateBackward0", "unknown op 'FrobnicateBackward0'", "$.nodes[2].name"),
    (("nodes", 2, "inputs", 0, "device"), "cuda:1000", "index out of range", "$.nodes[2].inputs[0].device"),
    (("nodes", 2, "inputs", 0, "device"), "gpu 0", "unknown device 'gpu 0'", "$.nodes[2].inputs[0].device"),
    (("nodes", 2, "inputs", 0, "dtype"), "int32", "unsupported dtype 'int32'", "$.nodes[2].inputs[0].dtype"),
    (("nodes", 2, "inputs", 0, "shape"), [3], "not compatible", "$.nodes[1].next[0]"),
    (("nodes", 2, "inputs", 0, "shape"), [-1], "negative sizes", "$.nodes[2].inputs[0].shape"),
    (("nodes", 2, "inputs", 0, "shape"), [1 << 20, 1 << 20], "more than the limit", "$.nodes[2].inputs[0].shape"),
    (("nodes", 4, "variable"), "zz", "unknown variable 'zz'", "$.nodes[4].variable"),
    (("roots", 0, "node"), "ghost", "root edge to missing node 'ghost'", "$.roots[0].node"),
    (("roots", 0, "grad"), [1.0, 2.0], "values have shape [2], expected []", "$.roots[0].grad"),
    (("roots", 0, "grad"), "twos", "unknown tensor value 'twos'", "$.roots[0].grad"),
    (("variables", 0, "shape"), [3], "whose shape [3] is not compatible", "$.nodes[2].next[0]"),
    (("nodes", 4, "inputs"), [{"shape": [5]}], "does not match variable 'a' shape [2]", "$.nodes[4].inputs[0].shape"),
    (("inputs",), ["nope"], "unknown input 'nope'", "$.inputs[0]"),
    (("nodes", 2, "saved", "other"), {"random": -1, "shape": [2]}, "random seed", "$.nodes[2].saved.other.random"),
    (("nodes", 2, "saved", "other"), {"data": [[1, 2], [3]]}, "ragged", "$.nodes[2].saved.other.data"),
    (("nodes", 2, "attrs"), {"fail": 3}, "attrs.fail must be a message string", "$.nodes[2].attrs.fail"),
    (("nodes", 2, "saved", "other"), {"random": 3, "shape": [1, 2, 3]}, "does not broadcast with the node's gradient shape [2]",
     "$.nodes[2].saved.other"),
    (("nodes", 2, "attrs"), {"nan": "yes"}, "attrs.nan must be true or false", "$.nodes[2].attrs.nan"),
]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("path,value,message,where", CASES, ids=[c[2][:30] for c in CASES])
def test_validation_errors_name_file_place_and_problem(fmt, path, value, message, where):
    d = mutate(seed_doc(), path, value)
    with pytest.raises(GraphFileError) as info:
        graph(d, fmt)
    err = info.value
    assert err.file == f"g.{fmt}"
    assert message in err.what
    assert where in err.where
    if fmt == "yaml":
        assert err.where.startswith("line ")


def test_yaml_location_is_the_offending_line():
    text = dumps(seed_doc(), "yaml").decode().replace("seq: 0", "seq: zero")
    with pytest.raises(GraphFileError) as info:
        loads_graph(text, "g.yaml")
    line = int(info.value.where.split(",")[0].split()[1])
    assert "seq: zero" in text.splitlines()[line - 1]


def test_cycle_is_printed_as_a_path():
    d = seed_doc()
    d["nodes"][2]["next"] = [["sum", 0], None]
    with pytest.raises(GraphFileError) as info:
        graph(d, "json")
    assert "cycle: " in info.value.what
    ids = info.value.what.split("cycle: ")[1].split(" -> ")
    assert ids[0] == ids[-1] and set(ids) == {"sum", "add", "mb"}


def test_json_syntax_error_has_line_and_column():
    text = json.dumps(seed_doc(), indent=1).replace('"seq": 2,', '"seq": 2,,')
    with pytest.raises(GraphFileError) as info:
        loads_graph(text, "g.json")
    line = int(info.value.where.split(",")[0].split()[1])
    assert ",," in text.splitlines()[line - 1]
    assert "invalid JSON" in info.value.what


def test_yaml_syntax_error_has_line_and_column():
    with pytest.raises(GraphFileError) as info:
        loads_graph("format: x\nnodes: [\n  {id: a,\n", "g.yaml")
    assert info.value.where.startswith("line ")
    assert "invalid YAML" in info.value.what


def test_yaml_never_constructs_objects():
    with pytest.raises(GraphFileError) as info:
        loads_graph("format: !!python/object/apply:os.system ['echo hi']\n", "g.yaml")
    assert "invalid YAML" in info.value.what


def test_yaml_alias_bomb_is_refused_quickly():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    lines.append("format: autograd-graph/1\nroots: []\nnodes: *a9")
    t = time.perf_counter()
    with pytest.raises(GraphFileError) as info:
        loads_graph("\n".join(lines), "bomb.yaml")
    assert time.perf_counter() - t < 2
    assert "aliases expand" in info.value.what


def _shared_then_many() -> str:
    """``x`` (100 values) met first through ``one``, then through ``many``'s 999 aliases: the old count
    sized ``many`` before ``x`` and took each alias as one value."""
    return ("{x: &x [" + ",".join(["1"] * 99) + "], many: [" + ",".join(["*x"] * 999) + "], one: [*x]}")


def _chained_aliases() -> str:
    """Twenty chains of 29 lists, each around the previous chain's alias, all met first at depth 2 (from
    ``s``): 580 levels, which the depth check passed."""
    parts = ["c0: &c0 " + "[" * 29 + "1" + "]" * 29]
    parts += [f"c{i}: &c{i} " + "[" * 29 + f"*c{i - 1}" + "]" * 29 for i in range(1, 20)]
    parts.append("s: [" + ", ".join(f"*c{i}" for i in reversed(range(20))) + "]")
    return "{" + ", ".join(parts) + "}"


@pytest.mark.parametrize("text, what", [(_shared_then_many(), "aliases expand to more than"),
                                        (_chained_aliases(), "nesting deeper than"),
                                        ("a: &a [1, *a]", "a recursive alias")])
def test_yaml_aliases_cannot_hide_size_or_depth(text, what, monkeypatch):
    """Found by a hostile review: both shapes passed the checks before the document was built."""
    from autograd_run.graphs import load
    monkeypatch.setattr(load, "MAX_YAML_VALUES", 10_000)
    with pytest.raises(GraphFileError) as info:
        loads_graph(text, "aliases.yaml")
    assert what in info.value.what, info.value.what


@pytest.mark.parametrize("fmt,text", [("yaml", "[" * 5000 + "]" * 5000), ("json", "[" * 100000 + "]" * 100000),
                                      ("yaml", "a: " + "[" * 100 + "]" * 100)])
def test_absurd_nesting_is_refused(fmt, text):
    with pytest.raises(GraphFileError):
        loads_graph(text, f"deep.{fmt}")


def test_side_files(tmp_path):
    np.savez(tmp_path / "g.npz", other=np.array([2.0, 2.0], dtype=np.float32))
    d = seed_doc()
    d["nodes"][2]["saved"] = {"other": {"npz": "other"}}
    res = run_traced(graph(d, "json", tmp_path), None)
    np.testing.assert_allclose(res.grads["a"], [5.0, 5.0])
    d["nodes"][2]["saved"] = {"other": {"npz": "missing_key"}}
    with pytest.raises(GraphFileError, match="key 'missing_key' is not in side file"):
        graph(d, "json", tmp_path)
    d["nodes"][2]["saved"] = {"other": {"npz": "other", "file": "../outside.npz"}}
    with pytest.raises(GraphFileError, match="outside the graph's folder"):
        graph(d, "json", tmp_path)
    d["nodes"][2]["saved"] = {"other": {"npz": "other", "file": "nope.npz"}}
    with pytest.raises(GraphFileError, match="side file 'nope.npz' is missing"):
        graph(d, "json", tmp_path)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    d["nodes"][2]["saved"] = {"other": {"npz": "other", "file": "bad.npz"}}
    with pytest.raises(GraphFileError, match="cannot read side file"):
        graph(d, "json", tmp_path)


def test_missing_file_and_bad_extension(tmp_path):
    with pytest.raises(GraphFileError, match="no such file"):
        load_graph(str(tmp_path / "none.json"))
    (tmp_path / "g.txt").write_text("{}")
    with pytest.raises(GraphFileError, match="unknown extension"):
        load_graph(str(tmp_path / "g.txt"))


# -- property-based: valid graphs load; corrupted graphs give the clear error, never another exception --

@st.composite
def generated_docs(draw):
    kind = draw(st.sampled_from(["chain", "fanout", "mlp", "random"]))
    seed = draw(st.integers(0, 1000))
    kw = {"chain": dict(n=draw(st.integers(1, 30)), seed=seed), "fanout": dict(width=draw(st.integers(1, 10))),
          "mlp": dict(layers=draw(st.integers(1, 3)), width=draw(st.integers(1, 6)), seed=seed),
          "random": dict(nodes=draw(st.integers(1, 40)), leaves=draw(st.integers(1, 10)), seed=seed)}[kind]
    return generate(kind, **kw)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_docs(), st.sampled_from(["json", "yaml"]))
def test_random_valid_graphs_load(d, fmt):
    g = graph(d, fmt)
    assert len(g.nodes) == len(d["nodes"])


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                 st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=4),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_docs(), st.sampled_from(["json", "yaml"]), st.data())
def test_corrupted_graphs_give_the_clear_error(d, fmt, data):
    paths = [p for p in _paths(d) if p]
    how = data.draw(st.sampled_from(["replace", "delete", "truncate", "flip"]))
    if how in ("replace", "delete"):
        path = data.draw(st.sampled_from(paths))
        mutate(d, path, DELETE if how == "delete" and not isinstance(path[-1], int) else data.draw(JUNK))
        raw = dumps(d, fmt)
    else:
        raw = bytearray(dumps(d, fmt))
        if how == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        else:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        raw = bytes(raw)
    try:
        loads_graph(raw, f"g.{fmt}")
    except GraphFileError as exc:
        assert str(exc).startswith(f"g.{fmt}")


@pytest.mark.parametrize("cost,message", [({"us": 1e12}, "cost us must be a number"),
                                          ({"flops": 1e15, "mode": "matmul"}, "cost flops must be a number"),
                                          ({"us": 5, "mode": "warp"}, "cost mode must be"),
                                          # found by the fuzzer: a null the run read as a number (float(None))
                                          ({"flops": None, "mode": "spin"}, "cost flops must be a number"),
                                          ({"us": None}, "cost us must be a number"),
                                          ([1, 2], "attrs.cost must be a mapping")])
def test_cost_nodes_are_bounded(cost, message):
    """A graph file cannot make a node spin for days or allocate a giant matrix."""
    d = seed_doc()
    d["nodes"][2].update({"op": "cost", "attrs": {"cost": cost}})
    with pytest.raises(GraphFileError) as info:
        graph(d, "json")
    assert message in info.value.what and "$.nodes[2].attrs.cost" in info.value.where
