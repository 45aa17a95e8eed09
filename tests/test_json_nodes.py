"""The compiled node reader (``graphs/_json_nodes.c``, ``load._decode_json``) against its twin, msgspec's own decode
of the whole file (``load._JSON_DECODER``): the same specs, value by value and type by type, on every example,
generated graphs of every kind, hand-made texts at every rule of the reader and fuzzed files; the same graph or
the same error, word for word, when a file is loaded either way; and the reader really reads the plain files
(it hands the rest back, and msgspec decodes them whole)."""

import math
import re
import random
import struct

import msgspec
import pytest

from autograd_run.errors import GraphFileError
from autograd_run.graphs import load
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import example_names, load_graph, loads_graph

pytestmark = pytest.mark.skipif(load._READ_GRAPH is None, reason="the compiled node reader is not in use "
                                                                  "(not built, or AUTOGRAD_RUN_PURE_PYTHON is set)")


def plain(v):
    """A decoded value as nested plain tuples that tell types apart (True from 1, 1 from 1.0, -0.0 from 0.0,
    a list from a tuple), structs by their fields."""
    if isinstance(v, msgspec.Struct):
        return (type(v).__name__,) + tuple((f, plain(getattr(v, f))) for f in v.__struct_fields__)
    if isinstance(v, float):
        return ("float", struct.pack("<d", v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(plain(x) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple((k, plain(x)) for k, x in v.items())
    return (type(v).__name__, v)


def decoded_alike(data: bytes, read: bool | None = None) -> None:
    """``_decode_json`` gives msgspec's result, or its very error; ``read``: whether the reader must have read
    the file itself (True) or handed it back (False)."""
    got = load._READ_GRAPH(data)
    if read is not None:
        assert (got is not None) == read, got
    try:
        want = ("ok", plain(load._JSON_DECODER.decode(data)))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        want = (type(exc).__name__, str(exc))
    try:
        mine = ("ok", plain(load._decode_json(data)[0]))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        mine = (type(exc).__name__, str(exc))
    assert mine == want


def generated():
    return [("chain", dict(n=50)), ("chain", dict(n=30, op="add")), ("fanout", dict(width=5)),
            ("mlp", dict(layers=3, width=4, batch=2)), ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8)),
            ("transformer", dict(layers=2, heads=2, seq_len=4, dim=8, devices=2)),
            ("random", dict(nodes=60, leaves=8, width=3, seed=4))]


def as_json(doc: dict) -> bytes:
    text = dumps(doc, "json")
    return text.encode() if isinstance(text, str) else text


def example_json(name: str) -> bytes:
    """A shipped example (YAML) as JSON text."""
    import yaml
    from autograd_run.graphs.load import read_source
    data, _, _ = read_source(f"example:{name}")
    return as_json(yaml.safe_load(data))


@pytest.mark.parametrize("name", example_names())
def test_examples_decode_alike(name):
    decoded_alike(example_json(name), read=True)


@pytest.mark.parametrize("kind,kw", generated(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("packed", [False, True])
def test_generated_graphs_decode_alike(kind, kw, packed):
    decoded_alike(as_json(generate(kind, **kw, packed=packed)), read=True)


NODE = '{"id":"a","name":"MulBackward0","seq":1,"next":[["b",0],null],"inputs":[{"shape":[2]}],"saved":%s}'


def doc_with(saved: str = '{"other":1.5}', node: str | None = None, head: str = "") -> bytes:
    n = node if node is not None else NODE % saved
    return ('{"format":"autograd-graph/1",%s"roots":[{"node":"a"}],"nodes":[%s,'
            '{"id":"b","name":"AccumulateGrad","variable":"x"}],"variables":[{"name":"x","shape":[2]}]}'
            % (head, n)).encode("utf-8", "surrogateescape")


# (saved values, whether the reader reads them itself)
VALUES = [("1.5", True), ("-0.0", True), ("0", True), ("-0", True), ("1e5", True), ("1E-5", True),
          ("2.5e+3", True), ("0.1", True), ("123456789012345.6", True), ("1234567890123456.7", True),
          ("1.7976931348623157e308", False), ("1.7976931348623157e300", True), ("5e-324", False), ("1e-300", True), ("1e301", False),
          ("123456789012345678", True), ("1234567890123456789", False), ("-123456789012345678", True),
          ("9007199254740993.0", True), ("true", True), ("false", True), ("null", True), ('"text"', True),
          ('"caf\\u00e9"', True), ('"café"', True), ('"a\\"b"', True), ('"tab\\t\\n\\/\\\\"', True),
          ('"\\ud83d\\ude00"', False), ('"\\x41"', False), ('"\\u00"', False), ('"\\u0000"', True),
          ("[1,2.0,[true,null],{}]", True), ('{"k":{"k":{"k":1}}}', True), ("01", False), ("1.", False),
          (".5", False), ("+1", False), ("1e", False), ("[1,]", False), ("nul", False), ("[" * 70 + "]" * 70, False),
          ("[" * 60 + "]" * 60, True), ("1e1000", False), ("0.000000000000000000000000001", True), ("1" + "0" * 45, False)]


@pytest.mark.parametrize("value,read", VALUES, ids=[v[:20] for v, _ in VALUES])
def test_saved_values_decode_alike(value, read):
    decoded_alike(doc_with('{"other":%s}' % value), read=read)


@pytest.mark.parametrize("node,read", [
    (NODE % '{"other":1}', True),
    ('{"id":"a","name":"MulBackward0","op":null,"seq":null,"fwd_thread":7,"variable":null}', True),
    ('{"id":"a","name":"MulBackward0","op":"MulBackward0","attrs":{"cost":{"us":5}}}', True),
    ('{"name":"MulBackward0"}', False),                          # no id: msgspec's error
    ('{"id":"a"}', False),                                        # no name
    ('{"id":"a","name":"M","id":"b"}', False),                    # a repeated member
    ('{"id":"a","name":"M","colour":1}', False),                  # an unknown member
    ('{"id":"a","name":"M","seq":"1"}', False),                   # a string for an int
    ('{"id":"a","name":"M","seq":1.0}', False),                   # a float for an int
    ('{"id":"a","name":"M","seq":true}', False),                  # a bool for an int
    ('{"id":"a","name":"M","next":[["b"]]}', False),              # a pair of one
    ('{"id":"a","name":"M","next":[["b",0,1]]}', False),          # a pair of three
    ('{"id":"a","name":"M","next":[["b",0.0]]}', False),
    ('{"id":"a","name":"M","next":{}}', False),
    ('{"id":"a","name":"M","inputs":[{"shape":[2],"colour":1}]}', False),  # msgspec refuses the input
    ('{"id":"a","name":"M","inputs":[{"shape":[2],"dtype":"float64","device":"cuda:0","stream":2}]}', True),
    ('{"id":"a","name":"M","saved":{"x":1,"x":2}}', False),       # a repeated key
    ('{"id":"a","name":"M","saved":[]}', False),
    ('{"id":"a","name":"M","attrs":null}', False),
    ('{"id":"\\u0061","name":"M"}', True),                        # an escaped id
    ('{"id":"a","name":"Mé"}', True),                             # a non-ASCII name
    ('{"\\u0069d":"a","name":"M"}', False),                       # an escaped member name: msgspec's
    ('{"id":"a","name":"M","saved":{"\\u006b":1,"k":2}}', False), # the same key, once escaped
])
def test_node_members_decode_alike(node, read):
    decoded_alike(doc_with(node=node), read=read)


@pytest.mark.parametrize("text,read", [
    (b'{"format":"autograd-graph/1","nodes":[],"roots":[]}', True),
    (b'  {"nodes":[] , "format":"autograd-graph/1","roots":[]}  \n', True),
    (b'{"format":"autograd-graph/1","nodes":[],"nodes":[],"roots":[]}', False),   # "nodes" twice
    (b'{"format":"autograd-graph/1","roots":[]}', False),                         # no "nodes"
    (b'{"format":"autograd-graph/1","nodes":[],"roots":[]} x', False),            # text after it
    (b'[{"nodes":[]}]', False),                                                   # not an object
    (b'{"format":"autograd-graph/1","nodes":[],"roots":[],}', False),
    (b'{"format":"autograd-graph/1","nodes":[,],"roots":[]}', False),
    (b'{"format":"autograd-graph/1","nodes":[{"id":"a","name":"M"}],"roots":[],"colour":1}', True),
    (b'{"format":"autograd-graph/1","nodes":[],"roots":[],"meta":{"\\u00e9":1}}', True),
    (b'{"format":"autograd-graph/1","\\u006eodes":[],"nodes":[],"roots":[]}', False),  # an escaped key
    (b'{}', False),
    (b'', False),
])
def test_top_level_decodes_alike(text, read):
    decoded_alike(text, read=read)


def test_random_strings_decode_as_msgspec_decodes_them():
    """Random strings (seed printed): printable and control characters, escapes of every kind, non-ASCII text
    and broken UTF-8: the same string, or handed back."""
    seed = random.SystemRandom().randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    pieces = ["a", "Z", " ", "~", "\x7f", "é", "中", "😀", "\\n", "\\t", '\\"', "\\\\", "\\/", "\\b", "\\f", "\\r",
              "\\u0041", "\\u00e9", "\\u4e2d", "\\uFFFF", "\\ud83d", "\\ude00", "\\x", "\\", "\x01"]
    read = 0
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        raw = text.encode("utf-8")
        if rng.random() < 0.05:
            raw += b"\xff"
        data = doc_with('{"s":"%s"}' % raw.decode("utf-8", "surrogateescape"))
        read += load._READ_GRAPH(data) is not None
        decoded_alike(data)
    assert read > 500


def test_random_numbers_decode_as_msgspec_decodes_them():
    """Random decimal texts (seed printed), every shape JSON allows: the same float, bit for bit, or the same
    int, or handed back."""
    seed = random.SystemRandom().randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    texts = []
    for _ in range(3000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 22)))
        whole = digits.lstrip("0") or "0"
        t = ("-" if rng.random() < 0.3 else "") + whole
        if rng.random() < 0.7:
            t += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
        if rng.random() < 0.5:
            t += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 330))
        texts.append(t)
    read = 0
    for t in texts:
        data = doc_with('{"v":%s}' % t)
        read += load._READ_GRAPH(data) is not None
        decoded_alike(data)
    assert read > 2000  # most are read by the reader itself (not all handed back)


def test_nodes_alike_share_what_never_changes():
    """Nodes that write the same text share their input list, name and saved dict; other text, its own."""
    doc = generate("chain", n=20)
    doc["nodes"][3]["saved"] = {"other": 2.5}
    spec = load._decode_json(as_json(doc))[0]
    muls = [n for n in spec.nodes if n.name == "MulBackward0"]
    assert len(muls) == 20
    assert len({id(n.inputs) for n in muls}) == 1 and len({id(n.name) for n in muls}) == 1
    assert len({id(n.saved) for n in muls}) == 2 and muls[3].saved == {"other": 2.5}
    assert all(n.saved == {"other": 1.0001} for i, n in enumerate(muls) if i != 3)


def test_a_shape_inside_saved_values_is_shared_where_its_text_is():
    """Saved tensors with their own seeds are dicts of their own, but their shape lists (a short list of integers,
    the same text) are one object; a list with another number or a float is its own; the values are msgspec's."""
    doc = generate("mlp", layers=3, width=4, batch=2)
    data = as_json(doc)
    spec = load._decode_json(data)[0]
    mms = [n for n in spec.nodes if n.name == "MmBackward0"]
    assert len(mms) >= 3 and len({id(n.saved) for n in mms}) == len(mms)  # seeds differ: dicts of their own
    for field in ("self", "mat2"):  # one list per distinct shape text
        shapes = [n.saved[field]["shape"] for n in mms]
        assert len({id(x) for x in shapes}) == len({tuple(x) for x in shapes}) < len(shapes)
    whole = msgspec.json.decode(data)
    by_id = {n["id"]: n for n in whole["nodes"]}
    assert all(n.saved == by_id[n.id]["saved"] for n in spec.nodes if "saved" in by_id[n.id])
    doc["nodes"].append({"id": "f", "name": "MulBackward0", "inputs": [{"shape": [2]}],
                         "saved": {"other": {"shape": [4, 4], "random": 1}, "x": [0.5, 1]}})
    doc["nodes"].append({"id": "g", "name": "MulBackward0", "inputs": [{"shape": [2]}],
                         "saved": {"other": {"shape": [4, 5], "random": 2}, "x": [0.5, 1]}})
    spec = load._decode_json(as_json(doc))[0]
    f, g = spec.nodes[-2], spec.nodes[-1]
    assert f.saved["other"]["shape"] == [4, 4]
    assert f.saved["other"]["shape"] is not g.saved["other"]["shape"] and g.saved["other"]["shape"] == [4, 5]
    assert f.saved["x"] is not g.saved["x"] and f.saved["x"] == g.saved["x"] == [0.5, 1]  # floats: not shared


def test_a_node_id_is_the_string_its_consumers_edge_made():
    """A node's id and the edge targets that name it are one string where the reader met the text lately (a
    table of recent ids: a million nodes keep a string less per edge that finds one, and the id table's
    look-ups compare one object); an id written with an escape is its own string; the values are msgspec's."""
    doc = generate("random", nodes=3000, leaves=40, seed=3)  # ~9,000 ids and targets: slots of the table reused
    old = doc["nodes"][1]["id"]
    for n in doc["nodes"]:
        n["next"] = [None if e is None else ["xA" if e[0] == old else e[0], e[1]] for e in n.get("next") or []]
    doc["nodes"][1]["id"] = "xA"
    data = re.sub(rb'("id": *)"xA"', rb'\1"x\\u0041"', as_json(doc))  # the node's id with an escape
    assert b'\\u0041' in data
    spec = load._decode_json(data)[0]
    whole = msgspec.json.decode(data)
    assert [n.id for n in spec.nodes] == [n["id"] for n in whole["nodes"]]
    assert [n.next for n in spec.nodes] == [[None if e is None else tuple(e) for e in n.get("next", [])]
                                          for n in whole["nodes"]]
    by_text = {n.id: n.id for n in spec.nodes}
    targets = [e[0] for n in spec.nodes for e in n.next or () if e is not None]
    shared = sum(t is by_text[t] for t in targets)
    assert shared > len(targets) // 3, (shared, len(targets))  # without the table: 0
    made_by_edges = {id(t) for t in targets}
    ids_shared = sum(id(n.id) in made_by_edges for n in spec.nodes)
    assert ids_shared > len(spec.nodes) * 0.8, ids_shared
    assert spec.nodes[1].id == "xA" and id(spec.nodes[1].id) not in made_by_edges  # other text: its own string


@pytest.mark.parametrize("kind, kw, most", [("chain", dict(n=20000), 545),
                                             ("random", dict(nodes=20000, leaves=40, seed=3), 900)])
def test_the_load_peaks_low(kind, kw, most):
    """The bytes a load from JSON text holds at its peak (tracemalloc), per node: the ids shared with the edges
    into them and the file's next lists made the nodes' (before, 97d72f6's parent: a chain peaked at 594 bytes
    a node and a random DAG at 973; now 494 and 822)."""
    import tracemalloc
    loads_graph(as_json(generate(kind, **dict(kw, **{"n" if kind == "chain" else "nodes": 50}))), "w.json",
                "json")  # the modules and tables a first load makes, not counted
    doc = generate(kind, **kw)
    data = as_json(doc)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        graph = loads_graph(data, "g.json", "json")
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(graph.nodes) == len(doc["nodes"])
    assert peak / len(doc["nodes"]) < most, peak / len(doc["nodes"])


@pytest.mark.parametrize("name", example_names())
def test_examples_load_alike_either_way(name, monkeypatch):
    """Through the whole load: the same graph (its nodes' fields) with the reader and without."""
    text = example_json(name)
    outcomes = []
    for reader in (load._READ_GRAPH, None):
        monkeypatch.setattr(load, "_READ_GRAPH", reader)
        g = loads_graph(text, "g.json")
        outcomes.append([(n.id, n.name, n.op.name, n.seq, repr(n.saved), repr(n.attrs), n.variable,
                          tuple((m.shape, m.dtype, str(m.device), m.stream) for m in n.inputs),
                          tuple(None if e is None else (e.node.id, e.input_nr) for e in n.next)) for n in g.nodes])
    assert outcomes[0] == outcomes[1]


def test_fuzzed_files_load_alike(tmp_path, monkeypatch):
    """Hostile variants of real graphs (``bench/fuzz.py``'s mutations), JSON ones: the same graph or the same
    error, word for word, with the reader and without."""
    from bench.fuzz import make_case, seed_graphs
    rng = random.Random(777)
    seeds = seed_graphs()
    kinds = {"ok": 0, "error": 0}
    compared = 0
    for k in range(300):
        folder = tmp_path / str(k)
        folder.mkdir()
        case = make_case(rng, seeds, str(folder))
        path = str(folder / case["file"])
        if not path.endswith(".json"):
            continue
        outcomes = []
        for reader in (load._READ_GRAPH, None):
            monkeypatch.setattr(load, "_READ_GRAPH", reader)
            try:
                g = load_graph(path)
                outcomes.append(("ok", [(n.id, n.name, repr(n.saved), repr(n.attrs), n.seq) for n in g.nodes]))
            except GraphFileError as exc:
                outcomes.append(("error", str(exc)))
        monkeypatch.undo()
        assert outcomes[0] == outcomes[1], (k, case["steps"])
        kinds[outcomes[0][0]] += 1
        compared += 1
    assert compared >= 60 and kinds["ok"] >= 10 and kinds["error"] >= 10, (compared, kinds)


def test_a_float_of_the_fast_path_is_exact():
    """Clinger's path (at most 15 digits, a power of ten up to 22) against Python's own correctly rounded
    conversion, on its edges."""
    for t in ["999999999999999e22", "999999999999999e-22", "1e22", "1e-22", "0.000000000000001",
              "123456789012345e-7", "9.99999999999999e22", "4.4501477170144e-308"]:
        data = doc_with('{"v":%s}' % t)
        spec = load._decode_json(data)[0]
        assert struct.pack("<d", spec.nodes[0].saved["v"]) == struct.pack("<d", float(t)), t
        assert not math.isnan(spec.nodes[0].saved["v"])


@pytest.mark.parametrize("where,text", [
    ("a node member", doc_with(node='{"id":"a","name":"MulBackward0","seq":1,"seq":1,"next":[["b",0],null],'
                                    '"inputs":[{"shape":[2]}],"saved":{"other":1.5}}')),
    ("a saved key", doc_with('{"other":1.5,"other":1.5}')),
    ("a nested saved key", doc_with('{"other":1.5,"x":{"y":[{"z":1,"z":1}]}}')),
    ("an input's member", doc_with(node='{"id":"a","name":"MulBackward0","seq":1,"next":[["b",0],null],'
                                        '"inputs":[{"shape":[2],"shape":[2]}],"saved":{"other":1.5}}')),
    ("a top-level member", doc_with(head='"mode":"backward","mode":"backward",')),
    ("a root's member", doc_with().replace(b'{"node":"a"}', b'{"node":"a","node":"a"}')),
    ("a variable's member", doc_with().replace(b'"shape":[2]}]}', b'"shape":[2],"shape":[2]}]}')),
    ("the meta", doc_with(head='"meta":{"k":1,"k":1},')),
])
def test_a_repeated_key_is_found_either_way(where, text, monkeypatch):
    """The loader counts only the other members' keys when the reader read the nodes (they have none
    repeated): a repeated key anywhere gives the same error, word for word, with the reader and without."""
    errors = []
    for reader in (load._READ_GRAPH, None):
        monkeypatch.setattr(load, "_READ_GRAPH", reader)
        with pytest.raises(GraphFileError) as err:
            loads_graph(text, "g.json")
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "duplicate key" in errors[0], errors[0]
