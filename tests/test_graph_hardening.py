"""Hostile graph files (issue 16): reading limits, side files, the memory budget, saved kinds,
duplicate keys, python nodes, messages, devices, and loading from bytes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
import zlib

import numpy as np
import pytest

from autograd_run.errors import GraphFileError
from autograd_run.graphs import load as load_mod
from autograd_run.graphs.dump import dumps, graph_to_dict
from autograd_run.graphs.load import load_graph, load_graph_bytes, loads_graph, read_stream
from autograd_run.graphs.model import Device
from autograd_run.graphs.tensors import materialize
from autograd_run.graphs.validate import check_python_nodes, default_max_bytes, parse_byte_size
from builders import graph as load_doc  # load_doc(doc, fmt, folder): as the file g.<fmt> would load


#: A small valid graph (sum <- add <- two muls -> one leaf) that tests mutate.
SEED = {
    "format": "autograd-graph/1",
    "roots": [{"node": "sum", "grad": "ones"}],
    "variables": [{"name": "a", "shape": [2]}],
    "nodes": [
        {"id": "sum", "name": "SumBackward0", "seq": 3, "next": [["add", 0]], "inputs": [{"shape": []}],
         "saved": {"self_sym_sizes": [2]}},
        {"id": "add", "name": "AddBackward0", "seq": 2, "next": [["mb", 0], ["mc", 0]], "inputs": [{"shape": [2]}]},
        {"id": "mb", "name": "MulBackward0", "seq": 0, "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
         "saved": {"other": 2.0}},
        {"id": "mc", "name": "MulBackward0", "seq": 1, "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
         "saved": {"other": 3.0}},
        {"id": "acc", "name": "AccumulateGrad", "variable": "a"},
    ],
}


def copy_seed():
    return json.loads(json.dumps(SEED))


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(tmp_path, doc, name="g.json"):
    p = tmp_path / name
    p.write_bytes(dumps(doc, "yaml" if name.endswith((".yaml", ".yml")) else "json") if isinstance(doc, dict)
                  else doc)
    return str(p)


# -- 1. reading limits ------------------------------------------------------------------------

def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "g.json"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(_error(lambda: load_graph(str(fifo)))), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert "FIFO" in result[0].what and "regular file" in result[0].what


def test_link_to_dev_zero_is_refused(tmp_path):
    link = tmp_path / "g.json"
    os.symlink("/dev/zero", link)
    err = _error(lambda: load_graph(str(link)))
    assert "character device" in err.what and err.file == str(link)


def test_directory_and_missing_and_nul(tmp_path):
    (tmp_path / "d.json").mkdir()
    assert "is a directory" in _error(lambda: load_graph(str(tmp_path / "d.json"))).what
    assert "no such file" in _error(lambda: load_graph(str(tmp_path / "none.json"))).what
    assert "NUL" in _error(lambda: load_graph(str(tmp_path / "a\0b.json"))).what


def test_sparse_file_over_the_cap_is_refused_without_reading(tmp_path):
    p = tmp_path / "big.json"
    with open(p, "wb") as f:
        f.truncate(load_mod.MAX_FILE_BYTES + 1)
    t = time.perf_counter()
    assert "larger than" in _error(lambda: load_graph(str(p))).what
    assert time.perf_counter() - t < 1


def test_reads_at_most_the_cap_plus_one(tmp_path, monkeypatch):
    """A file is read in one request of its size; one that grows or reports no size (/proc) is read
    in chunks, never past the cap plus one byte."""
    p = write(tmp_path, copy_seed())
    size = os.path.getsize(p)
    assert load_mod.read_file(p) == open(p, "rb").read()
    assert load_mod.read_file("/proc/self/status", "status.json").startswith(b"Name:")
    from autograd_run.untrusted import read_capped
    assert read_capped(io.BytesIO(b"x" * 10), 10, 1 << 30) == b"x" * 10
    assert read_capped(io.BytesIO(b"x" * 1000), 0, 100) == b"x" * 101  # no size reported: stops at cap+1
    assert read_capped(io.BytesIO(b"x" * 50), 10, 100) == b"x" * 50  # grew since stat
    monkeypatch.setattr(load_mod, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(GraphFileError, match="larger than"):
        load_mod.read_file(p)


def test_stream_reads_are_capped(monkeypatch):
    monkeypatch.setattr(load_mod, "MAX_FILE_BYTES", 10)
    with pytest.raises(GraphFileError, match="larger than"):
        read_stream(io.BytesIO(b"x" * 100))
    assert read_stream(io.BytesIO(b"x" * 10)) == b"x" * 10


# -- 2. npz side files ----------------------------------------------------------------------------

def npz_doc(spec, where="root"):
    doc = copy_seed()
    if where == "root":
        doc["roots"][0]["grad"] = spec
    else:
        doc["nodes"][2]["saved"] = {"other": spec}
    return doc


def _error(fn) -> GraphFileError:
    with pytest.raises(GraphFileError) as info:
        fn()
    return info.value


def test_npz_round_trip_values_dtypes_and_layouts(tmp_path):
    """Members are read without np.load, with the same values (Fortran order, big-endian, 0-d)."""
    f = np.asfortranarray(np.arange(6, dtype=">f8").reshape(2, 3))
    np.savez(tmp_path / "g.npz", f=f, s=np.float32(2.5), i=np.array([1, 0], dtype=np.int64), other=np.full(2, 2.0))
    doc = copy_seed()
    doc["nodes"][2]["saved"] = {"other": {"npz": "other"}}
    g = load_graph(write(tmp_path, doc), check_data=True)
    side = g.side_files
    np.testing.assert_array_equal(materialize({"npz": "f"}, side), f)
    assert materialize({"npz": "s"}, side).shape == () and materialize({"npz": "s"}, side) == 2.5
    np.testing.assert_array_equal(materialize({"npz": "i"}, side), [1, 0])
    # A numel-1 array where a scalar gradient is expected is reshaped.
    assert materialize({"npz": "s"}, side, (1,), "float64").shape == (1,)
    from autograd_run.engine import Engine, GraphState
    from autograd_run.engine.run import run_graph
    state = GraphState(g)
    run_graph(Engine(), g, state)
    np.testing.assert_allclose(state.grads["a"], [5.0, 5.0])


class _RepeatingDeflate:
    """A raw-deflate compressor that full-flushes after every write, so identical chunks compress
    to identical bytes: each 16 MiB chunk of zeros is compressed once and its output repeated."""

    def __init__(self):
        self.z = zlib.compressobj(9, zlib.DEFLATED, -15)
        self.cache: dict[int, bytes] = {}

    def compress(self, data):
        zero = len(data) >= 1 << 20 and not any(memoryview(data)[:64]) and data.count(0) == len(data)
        if zero and len(data) in self.cache:
            return self.cache[len(data)]
        out = self.z.compress(data) + self.z.flush(zlib.Z_FULL_FLUSH)
        if zero:
            self.cache[len(data)] = out
        return out

    def flush(self):
        return self.z.flush(zlib.Z_FINISH)


def _deflated_zero_member(path, name, shape, dtype="<f8"):
    """A compressed .npy member of zeros (a 2 GB bomb in a ~2 MB file), with a correct CRC."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as z:
        with z.open(name, "w", force_zip64=True) as w:
            w._compressor = _RepeatingDeflate()
            w.write(header.getvalue())
            chunk = bytes(16 << 20)
            for _ in range(nbytes // len(chunk)):
                w.write(chunk)
            w.write(bytes(nbytes % len(chunk)))


@pytest.fixture(scope="module")
def npz_bomb(tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb")
    _deflated_zero_member(d / "g.npz", "x.npy", (1 << 28,))  # 2 GiB of float64 zeros
    return d


def test_compressed_npz_bomb_is_refused_by_the_budget(npz_bomb):
    assert os.path.getsize(npz_bomb / "g.npz") < 4 << 20
    with zipfile.ZipFile(npz_bomb / "g.npz") as z:
        assert z.getinfo("x.npy").file_size > 2 << 30
    doc = copy_seed()
    doc["nodes"][0]["saved"]["captured_extra"] = {"npz": "x"}  # an undeclared field: still checked and counted
    p = write(npz_bomb, doc)
    t = time.perf_counter()
    err = _error(lambda: load_graph(p, max_bytes=1 << 30))
    assert time.perf_counter() - t < 5
    assert "the graph needs 2.0 GiB of memory" in err.what and "saved tensors 2.0 GiB" in err.what
    assert "node 'sum' at $.nodes[0].saved.captured_extra" in err.what


def test_npz_header_lies_are_refused(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)})
    with zipfile.ZipFile(tmp_path / "g.npz", "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 100)
    assert os.path.getsize(tmp_path / "g.npz") < 400
    err = _error(lambda: load_graph(write(tmp_path, npz_doc({"npz": "x"}))))
    assert "more than the limit" in err.what and "1.1e+12 elements" in err.what


def _npy(header_text: str) -> bytes:
    h = header_text.encode("latin1")
    h += b" " * (63 - (10 + len(h)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (1, 2, 3, 4)])
@pytest.mark.parametrize("dtype", ["<f8", "<f4", "<f2", "|b1", "<i8", "<i4", "|u1", "|i1", "<c8", "<c16", ">f8"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_headers_read_as_numpy_reads_them(shape, dtype, order):
    """The header numpy writes takes a fast path (a strict pattern, not numpy's literal_eval); shape, order,
    dtype and data offset are numpy's own reading of it."""
    from autograd_run.graphs.tensors import _NUMPY_HEADER, _read_npy_header
    buf = io.BytesIO()
    np.save(buf, np.zeros(shape, dtype=dtype, order=order))
    f = io.BytesIO(buf.getvalue())
    major, _ = np.lib.format.read_magic(f)
    want = (np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0)(f)
    assert _read_npy_header(io.BytesIO(buf.getvalue())) == (*want[:1], bool(want[1]), want[2], f.tell())
    size = int.from_bytes(buf.getvalue()[8:10], "little")
    assert _NUMPY_HEADER.fullmatch(buf.getvalue()[10:10 + size])  # the fast path was taken


@pytest.mark.parametrize("text,expected", [
    ("{'shape': (2,), 'descr': '<f8', 'fortran_order': False}", ((2,), False, np.dtype("<f8"))),  # numpy's parser
    ("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3) }", ((2, 3), True, np.dtype("<f8"))),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (,), }", "Cannot parse header"),
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (2, -1), }", "invalid shape"),
    ("{'descr': '<zz', 'fortran_order': False, 'shape': (2,), }", "not a valid dtype"),
    ("{'descr': 'O', 'fortran_order': False, 'shape': (2,), }", "Python objects"),
    ("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2,), }", "structured dtype"),
])
def test_other_npy_headers_take_numpys_parser_and_the_same_checks(text, expected):
    from autograd_run.graphs.tensors import _read_npy_header
    if isinstance(expected, str):
        with pytest.raises(Exception, match=expected.replace("(", r"\(")):
            _read_npy_header(io.BytesIO(_npy(text)))
    else:
        assert _read_npy_header(io.BytesIO(_npy(text)))[:3] == expected


def test_npz_messages_never_suggest_pickles(tmp_path):
    np.savez(tmp_path / "g.npz", x=np.array([{"a": 1}], dtype=object))
    err = _error(lambda: load_graph(write(tmp_path, npz_doc({"npz": "x"}, "saved"))))
    assert "Python objects" in err.what and "allow_pickle" not in str(err) and "pickle=" not in str(err)


@pytest.mark.parametrize("spec,member,message", [
    ({"npz": "x"}, np.array(["abc"]), "holds strings"),
    ({"npz": "x"}, np.ones(3, dtype=np.float32), "has shape [3], expected []"),
    ({"npz": "x"}, np.complex128(1j), "drop the imaginary part"),
    ({"npz": "x\0y"}, np.float32(1), "is not in side file"),
    ({"npz": "x", "file": ""}, np.float32(1), "'file' is empty"),
    ({"npz": "x", "file": "a/../../g.npz"}, np.float32(1), "outside the graph's folder"),
    ({"npz": "x", "file": "g\0.npz"}, np.float32(1), "NUL or control character"),
    ({"npz": "x", "file": "/tmp/g.npz"}, np.float32(1), "relative"),
    ({"npz": 3}, np.float32(1), "npz key must be a string"),
])
def test_npz_problems_at_validate(tmp_path, spec, member, message):
    np.savez(tmp_path / "g.npz", x=member)
    err = _error(lambda: load_graph(write(tmp_path, npz_doc(spec))))
    assert message in err.what and "$.roots[0].grad" in err.where


def test_npz_saved_shape_must_broadcast(tmp_path):
    np.savez(tmp_path / "g.npz", x=np.ones(3))
    err = _error(lambda: load_graph(write(tmp_path, npz_doc({"npz": "x"}, "saved"))))
    assert "does not broadcast with the node's gradient shape [2]" in err.what


def test_corrupt_npz_data_is_found_by_validate_and_by_run(tmp_path):
    data = io.BytesIO()
    np.lib.format.write_array(data, np.arange(2, dtype=np.float64))
    data = data.getvalue()
    with zipfile.ZipFile(tmp_path / "g.npz", "w") as z:
        z.writestr("x.npy", data)
    raw = bytearray((tmp_path / "g.npz").read_bytes())
    raw[raw.index(data) + len(data) - 2] ^= 0xFF
    (tmp_path / "g.npz").write_bytes(bytes(raw))
    p = write(tmp_path, npz_doc({"npz": "x"}, "saved"))
    # Small members are read whole with their header, so validation finds the bad CRC already.
    assert "Bad CRC-32" in _error(lambda: load_graph(p)).what
    # A bigger member: its header reads fine; validate (check_data) reads the data, run finds it too.
    data = io.BytesIO()
    np.lib.format.write_array(data, np.arange(1 << 16, dtype=np.float64).reshape(2, 32768))
    data = data.getvalue()
    with zipfile.ZipFile(tmp_path / "g.npz", "w") as z:
        z.writestr("x.npy", data)
    raw = bytearray((tmp_path / "g.npz").read_bytes())
    raw[raw.index(data) + len(data) - 2] ^= 0xFF
    (tmp_path / "g.npz").write_bytes(bytes(raw))
    doc = npz_doc({"npz": "x"}, "saved")
    doc["nodes"][2]["name"] = "MmBackward0"  # not elementwise: a self of [2, k] fits its [2, 2] gradient
    doc["nodes"][2]["saved"] = {"self": {"npz": "x"}}
    doc["nodes"][2]["next"] = [None, ["acc", 0]]  # (output 1 reads self)
    for k in (1, 2, 3):  # mm's gradient is a matrix
        doc["nodes"][k]["inputs"] = [{"shape": [2, 2]}]
    doc["nodes"][0]["saved"]["self_sym_sizes"] = [2, 2]  # the sum's gradient is expanded to add's input
    p = write(tmp_path, doc)
    err = _error(lambda: load_graph(p, check_data=True))
    assert "member 'x' is corrupt: Bad CRC-32" in err.what and "$.nodes[2].saved.self" in err.where
    g = load_graph(p)  # the header is fine: only reading the data finds it
    from autograd_run.engine import GraphState
    err = _error(lambda: GraphState(g).prepare())
    assert err.file == p and "Bad CRC-32" in err.what


def test_side_file_fifo_and_device_link(tmp_path):
    os.mkfifo(tmp_path / "f.npz")
    err = _error(lambda: load_graph(write(tmp_path, npz_doc({"npz": "x", "file": "f.npz"}))))
    assert "not a regular file" in err.what
    os.symlink("/dev/zero", tmp_path / "z.npz")
    err = _error(lambda: load_graph(write(tmp_path, npz_doc({"npz": "x", "file": "z.npz"}))))
    assert "outside the graph's folder" in err.what


# -- 3. the memory budget ---------------------------------------------------------------------------

def big_saved_doc(n=10, numel=1 << 30, dtype="float64"):
    doc = {"format": "autograd-graph/1", "roots": [{"node": "m0"}], "variables": [{"name": "a", "shape": [1]}],
           "nodes": []}
    for i in range(n):
        doc["nodes"].append({"id": f"m{i}", "name": "MulBackward0",
                             "next": [[f"m{i + 1}" if i < n - 1 else "acc", 0], None], "inputs": [{"shape": [1]}],
                             "saved": {"other": {"random": i, "shape": [numel], "dtype": dtype}}})
    doc["nodes"].append({"id": "acc", "name": "AccumulateGrad", "variable": "a"})
    return doc


def test_budget_refuses_80_gib_with_total_and_contributors():
    err = _error(lambda: load_doc(big_saved_doc(), "json"))
    assert "the graph needs 96.0 GiB of memory" in err.what
    assert "saved tensors 80.0 GiB" in err.what and "memory budget" in err.what
    assert ("largest: 16.0 GiB at node 'm0' at $.nodes[0].saved.other (working gradients); "
            "8.0 GiB at node 'm0' at $.nodes[0].saved.other (saved tensors)") in err.what
    assert "--max-memory" in err.what


def test_budget_can_be_raised_and_counts_every_category(tmp_path):
    doc = big_saved_doc(n=2, numel=1 << 20)  # 16 MiB of saved tensors
    doc["roots"][0]["grad"] = {"random": 1, "shape": [1], "dtype": "float64"}
    doc["variables"][0]["grad"] = "zeros"
    doc["meta"] = {"reference": {"order": [], "grads": {"a": {"data": [1.0]}}}}
    g = loads_graph(dumps(doc, "json"), "g.json", max_bytes=33 << 20)
    assert len(g.nodes) == 3
    err = _error(lambda: loads_graph(dumps(doc, "json"), "g.json", max_bytes=1 << 20))
    for part in ("saved tensors 16.0 MiB", "root gradients 8 B", "variable gradients 4 B", "reference gradients 4 B"):
        assert part in err.what


def test_largest_gradient_counts():
    doc = copy_seed()  # (every gradient [2**31] complex128, the sum's input a scalar that it expands)
    doc["nodes"][0]["saved"]["self_sym_sizes"] = [1 << 31]
    for k in (1, 2, 3):
        doc["nodes"][k]["inputs"] = [{"shape": [1 << 31], "dtype": "complex128"}]
    doc["nodes"][0]["inputs"] = [{"shape": [], "dtype": "complex128"}]
    doc["variables"][0].update(shape=[1 << 31], dtype="complex128")
    err = _error(lambda: load_doc(doc, "json"))
    assert "working gradients 64.0 GiB" in err.what


def outer_product_doc(rows):
    """A MulBackward0 whose saved [rows, 1] times its [1, 4096] gradient broadcasts to [rows, 4096]."""
    return {"format": "autograd-graph/1", "roots": [{"node": "m"}], "variables": [{"name": "a", "shape": [1, 4096]}],
            "nodes": [{"id": "m", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [{"shape": [1, 4096]}],
                       "saved": {"other": {"random": 1, "shape": [rows, 1]}}},
                      {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]}


def test_broadcast_products_are_capped_and_counted():
    err = _error(lambda: load_doc(outer_product_doc(1 << 20), "json"))
    assert "makes 4.29e+09 elements, more than the limit" in err.what and "$.nodes[0].saved.other" in err.where
    err = _error(lambda: loads_graph(dumps(outer_product_doc(1 << 16), "json"), "g.json", max_bytes=1 << 30))
    assert "working gradients 2.0 GiB" in err.what
    assert len(load_doc(outer_product_doc(4), "json").nodes) == 2


def test_default_budget_follows_the_address_space_limit():
    """Half of what RLIMIT_AS leaves above the address space the process already maps (not half the limit:
    thread stacks and allocator arenas live there too, and a budget of half the limit ran out of memory)."""
    code = ("import resource; from autograd_run.graphs import validate as v;"
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30));"
            "used = v._address_space_used(); print(used, v.default_max_bytes(), v.default_max_bytes())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    used, budget, again = map(int, out.stdout.split())
    assert used > 10 << 20  # the interpreter and numpy are mapped already
    assert budget == again and abs(budget - min((3 << 30) - used, 2 * default_max_bytes()) // 2) <= 4 << 20


@pytest.mark.parametrize("text,value", [("8GiB", 8 << 30), ("512 MiB", 512 << 20), ("2G", 2 << 30),
                                        ("1e9", 10**9), ("1000", 1000), ("1.5kb", 1500)])
def test_parse_byte_size(text, value):
    assert parse_byte_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "nan", "1e40"])
def test_parse_byte_size_refuses(text):
    with pytest.raises(ValueError):
        parse_byte_size(text)


# -- 4. saved values against the declared kinds, YAML numbers, duplicate keys, python nodes ---------

SAVED_CASES = [
    (0, {"self_sym_sizes": ["x"]}, "entry 0 is 'x'", "$.nodes[0].saved.self_sym_sizes[0]"),
    (0, {"self_sym_sizes": [-1]}, "entry 0 (-1) is out of range", "$.nodes[0].saved.self_sym_sizes[0]"),
    (0, {"self_sym_sizes": [10**30]}, "out of range", "$.nodes[0].saved.self_sym_sizes[0]"),
    (0, {"self_sym_sizes": 2}, "must be a list of non-negative integers", "$.nodes[0].saved.self_sym_sizes"),
    (0, {"self_sym_sizes": [1] * 17}, "more than 16 dimensions", "$.nodes[0].saved.self_sym_sizes"),
    (0, {}, "SumBackward0 node 'sum' needs saved field 'self_sym_sizes'", "$.nodes[0]"),
    (0, {"other_field": 1}, "needs saved field 'self_sym_sizes'", "$.nodes[0].saved"),
    (1, {"alpha": "two"}, "saved 'alpha' of AddBackward0 must be a number, got 'two'", "$.nodes[1].saved.alpha"),
    (1, {"alpha": [1]}, "must be a number", "$.nodes[1].saved.alpha"),
    (2, {"other": "x"}, "saved 'other' of MulBackward0 must be a tensor", "$.nodes[2].saved.other"),
    (2, {"other": {"value": 2}}, "must be a tensor", "$.nodes[2].saved.other"),
    (2, {"other": [[1, 2], [3]]}, "ragged", "$.nodes[2].saved.other"),
    (2, {"other": [1.0, 2.0, 3.0]}, "does not broadcast", "$.nodes[2].saved.other"),
    (2, {"self": 2.0}, "MulBackward0 node 'mb' needs saved field 'other'", "$.nodes[2].saved"),
]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
@pytest.mark.parametrize("i,saved,message,where", SAVED_CASES, ids=[c[2][:30] for c in SAVED_CASES])
def test_saved_values_must_fit_their_declared_kind(fmt, i, saved, message, where):
    doc = copy_seed()
    doc["nodes"][i]["saved"] = saved
    err = _error(lambda: load_doc(doc, fmt))
    assert message in err.what and where in err.where


@pytest.mark.parametrize("node,message", [
    ({"name": "PowBackward0", "saved": {"self": {"data": [1.0, 2.0]}, "exponent": None}}, "got null (it is not optional)"),
    ({"name": "SelectBackward0", "inputs": [{"shape": []}],
      "saved": {"self_sym_sizes": [2], "dim": 0, "index": 2**64}}, "out of range"),
    ({"name": "SelectBackward0", "inputs": [{"shape": []}],
      "saved": {"self_sym_sizes": [2], "dim": True, "index": 0}}, "must be an integer, got True"),
    ({"name": "SumBackward1", "inputs": [{"shape": []}],
      "saved": {"self_sym_sizes": [2], "dim": [0.5]}}, "entry 0 is 0.5"),
    ({"name": "SumBackward1", "inputs": [{"shape": []}],
      "saved": {"self_sym_sizes": [2], "dim": [0], "keepdim": 1}}, "must be true or false, got 1"),
    ({"name": "GeluBackward0", "saved": {"self": {"random": 1, "shape": [2]}, "approximate": 0}}, "must be a string"),
])
def test_saved_kinds_of_other_ops(node, message):
    doc = copy_seed()
    doc["nodes"][2] = {"id": "mb", "next": [["acc", 0]], "inputs": [{"shape": [2]}], **node}
    doc["nodes"][3]["next"] = [["acc", 0], None]
    err = _error(lambda: load_doc(doc, "json"))
    assert message in err.what and "$.nodes[2].saved" in err.where


@pytest.mark.parametrize("value,message", [
    (2, "(a 2-dim array for MmBackward0, not a number)"), (True, "not a number"),
    ({"random": 1, "shape": [3]}, "not one of shape [3]"), ({"data": [[[1.0]]]}, "not one of shape [1, 1, 1]"),
])
def test_matrix_ops_take_matrices(value, message):
    doc = copy_seed()
    doc["nodes"][2] = {"id": "mb", "name": "MmBackward0", "next": [["acc", 0], None], "inputs": [{"shape": [2, 2]}],
                       "saved": {"mat2": value}}
    err = _error(lambda: load_doc(doc, "json"))
    assert message in err.what and "$.nodes[2].saved.mat2" in err.where


@pytest.mark.parametrize("op,field,value,where", [
    ("MmBackward0", "mat2", [[1.0], [2.0]], "its dim 1 must be 2"),
    ("MmBackward0", "self", {"random": 1, "shape": [3, 2]}, "its dim 0 must be 2"),
    ("AddmmBackward0", "mat1", {"data": [[1.0, 2.0, 3.0]]}, "its dim 0 must be 2"),
    ("BmmBackward0", "mat2", {"random": 1, "shape": [2, 5, 3]}, "its dim 2 must be 2"),
])
def test_matrix_products_saved_matrices_fit_the_gradient(op, field, value, where):
    """A product's saved matrices share the result's outer sizes (mm: self [n, k], mat2 [k, m] for a result
    [n, m]): another size is refused at load with the place (before, numpy's matmul error when it ran; found by
    the fuzzer). The inner size k is the file's to choose (the slots' shapes are checked when the node runs)."""
    doc = copy_seed()
    shape = [2, 2, 2] if op == "BmmBackward0" else [2, 2]
    nxt = [["acc", 0], ["acc", 0], ["acc", 0]] if op == "AddmmBackward0" else [["acc", 0], ["acc", 0]]
    doc["nodes"][2] = {"id": "mb", "name": op, "next": nxt, "inputs": [{"shape": shape}],
                       "saved": {"self": {"random": 1, "shape": shape}, "mat1": {"random": 2, "shape": [2, 4]},
                                 "mat2": {"random": 3, "shape": shape}, field: value}}
    err = _error(lambda: load_doc(doc, "json"))
    assert f"$.nodes[2].saved.{field}" in err.where
    assert f"saved '{field}' of {op} has shape" in err.what and where in err.what, err.what


@pytest.mark.parametrize("op,shape,rank", [("MmBackward0", [2], 2), ("AddmmBackward0", [], 2),
                                           ("AddmmBackward0", [2, 2, 2], 2), ("BmmBackward0", [2, 2], 3)])
def test_matrix_ops_receive_matrices(op, shape, rank):
    """A matrix product's result, the gradient its backward node receives, has the product's rank: another
    rank is refused at load with its place (before, numpy's matmul error when the node ran; found by the fuzzer)."""
    doc = copy_seed()
    nxt = [["acc", 0], None, None] if op == "AddmmBackward0" else [["acc", 0], None]
    doc["nodes"][2] = {"id": "mb", "name": op, "next": nxt, "inputs": [{"shape": shape}]}
    err = _error(lambda: load_doc(doc, "json"))
    assert "$.nodes[2].inputs[0].shape" in err.where
    assert f"input 0 of {op} node 'mb' has shape {shape}, but the gradient it receives" in err.what
    assert f"has {rank} dimensions" in err.what


@pytest.mark.parametrize("op,field", [("ExpBackward0", "result"), ("TanhBackward0", "result"),
                                      ("SigmoidBackward0", "result")])
@pytest.mark.parametrize("value", [2.5, -0.0, 1, True])
def test_a_result_is_never_a_plain_number(op, field, value):
    """An input may be a wrapped Python number (MulBackward0's other); an op's result never is in PyTorch, and
    the rules read its dtype: refused at load, not an AttributeError when the node runs (found by the fuzzer)."""
    doc = copy_seed()
    doc["nodes"][2] = {"id": "mb", "name": op, "next": [["acc", 0]], "inputs": [{"shape": [2]}],
                       "saved": {field: value}}
    doc["nodes"][3]["next"] = [["acc", 0], None]
    err = _error(lambda: load_doc(doc, "json"))
    assert "an op's result is never a wrapped number" in err.what and f"$.nodes[2].saved.{field}" in err.where


def test_an_input_may_still_be_a_plain_number():
    doc = copy_seed()
    doc["nodes"][2]["saved"] = {"other": 2.0, "self": 3}  # MulBackward0: wrapped numbers
    g = load_doc(doc, "json")
    assert g.by_id["mb"].saved["other"] == 2.0


def test_needed_fields_may_not_be_null():
    doc = copy_seed()
    doc["nodes"][2]["saved"] = {"other": None}
    assert "needs saved field 'other'" in _error(lambda: load_doc(doc, "json")).what


def test_saved_values_that_fit_are_accepted():
    doc = copy_seed()
    doc["nodes"][1]["saved"] = {"alpha": True}  # a bool Scalar
    doc["nodes"][2]["saved"] = {"other": [2.0, 2.0], "self": None, "captured_extra": {"x": "anything"}}
    doc["nodes"][3]["saved"] = {"other": {"data": [3.0]}, "_saved_undeclared": "kept"}
    g = load_doc(doc, "json")
    assert g.by_id["mc"].saved["_saved_undeclared"] == "kept"
    # PyTorch writes -1 dims as 2**64-1; that stays accepted.
    doc = copy_seed()
    doc["nodes"][0] = {"id": "sum", "name": "SumBackward1", "seq": 3, "next": [["add", 0]], "inputs": [{"shape": []}],
                       "saved": {"self_sym_sizes": [2], "dim": [2**64 - 1], "keepdim": False}}
    load_doc(doc, "json")


def test_yaml_exponent_floats_are_numbers():
    doc = copy_seed()
    doc["nodes"][1]["saved"] = {"alpha": 7}
    text = dumps(doc, "yaml").decode()
    assert "alpha: 7" in text and "other: 2.0" in text
    text = text.replace("alpha: 7", "alpha: 1e-3").replace("other: 2.0", "other: 2E0")
    g = loads_graph(text, "g.yaml")
    assert g.by_id["add"].saved["alpha"] == 0.001 and g.by_id["mb"].saved["other"] == 2.0
    # Quoted, it stays a string that spells a number (as capture writes complex Scalars, "(1-2j)"): the
    # run reads it as the number. A string that spells none is refused, and the message says what is.
    g = loads_graph(text.replace("alpha: 1e-3", "alpha: '1e-3'"), "g.yaml")
    from autograd_run.engine.state import GraphState
    assert GraphState(g).saved(g.by_id["add"])["alpha"] == 0.001
    err = _error(lambda: loads_graph(text.replace("alpha: 1e-3", "alpha: 'lots'"), "g.yaml"))
    assert "must be a number, got 'lots' (a string is accepted only when it spells a number" in err.what


@pytest.mark.parametrize("old,new,key,where", [
    ('{"id": "mb",', '{"id": "mb", "id": "sum",', "id", "node 'mb' at $.nodes[2].id"),
    ('"format": "autograd-graph/1",', '"format": "autograd-graph/1", "format": "autograd-graph/1",', "format", "$.format"),
    ('"saved": {"other": 2.0}', '"saved": {"other": 2.0, "other": 4.0}', "other", "$.nodes[2].saved.other"),
    ('"saved": {"other": 2.0}', '"saved": {"other": 2.0, "\\u006fther": 4.0}', "other", "$.nodes[2].saved.other"),
    ('{"shape": [2]}]', '{"shape": [2], "shape": [2]}]', "shape", "$.nodes[1].inputs[0].shape"),
])
@pytest.mark.parametrize("step", [65536, 1, 2, "compiled"])
def test_json_duplicate_keys_are_refused(old, new, key, where, step, monkeypatch):
    """(``step``: the proof re-encodes the nodes that many at a time; every slicing proves the same; or it
    counts them compiled, ``validate.KEPT_COLONS``, where built.)"""
    if step == "compiled":
        if load_mod.KEPT_COLONS is None:
            pytest.skip("the compiled loader loops are not in use")
    else:
        monkeypatch.setattr(load_mod, "KEPT_COLONS", None)
        monkeypatch.setattr(load_mod, "_ENCODE_NODES", step)
    text = json.dumps(SEED)
    assert old in text
    assert len(loads_graph(text, "g.json").nodes) == len(SEED["nodes"])
    err = _error(lambda: loads_graph(text.replace(old, new, 1), "g.json"))
    assert f"duplicate key {key!r}" in err.what and where in err.where
    # the proof alone: no exact pass where the counts prove there is no duplicate, a failed proof where
    # a key was dropped
    spec = load_mod._JSON_DECODER.decode(text)
    assert load_mod._json_has_no_duplicates(text.encode(), spec)
    dup = text.replace(old, new, 1).encode()
    assert not load_mod._json_has_no_duplicates(dup, load_mod._JSON_DECODER.decode(dup))


def test_big_json_duplicates_are_refused_without_the_exact_pass(monkeypatch):
    monkeypatch.setattr(load_mod, "MAX_EXACT_DUPLICATE_CHECK", 100)
    text = json.dumps(SEED).replace('{"id": "mb",', '{"id": "mb", "id": "sum",', 1)
    err = _error(lambda: loads_graph(text, "g.json"))
    assert "duplicate keys" in err.what and "too big to say where" in err.what


def test_json_escaped_colons_without_duplicates_load():
    doc = copy_seed()
    doc["nodes"][2]["attrs"] = {"trace": "a:b"}
    text = json.dumps(doc).replace("a:b", "a\\u003ab\\u003Ac\\\\u003a")
    g = loads_graph(text, "g.json")
    assert g.by_id["mb"].attrs["trace"] == "a:b:c\\u003a"


def test_yaml_duplicate_keys_are_refused_and_merges_allowed():
    text = dumps(copy_seed(), "yaml").decode()
    err = _error(lambda: loads_graph(text.replace("name: AddBackward0", "name: AddBackward0\n  name: MulBackward0"),
                                     "g.yaml"))
    assert "duplicate key 'name'" in err.what and err.where.startswith("line ")
    merged = "base: &b {shape: [2]}\n" + text.replace("inputs:\n  - shape: [2]", "inputs:\n  - {<<: *b, dtype: float32}")
    assert "<<" in merged
    with pytest.raises(GraphFileError, match="unknown field 'base'"):
        loads_graph(merged, "g.yaml")  # the merge itself is fine; 'base' is just not a graph field


def test_python_nodes_need_allowing(tmp_path):
    g = load_graph("example:reentrant")
    err = _error(lambda: check_python_nodes(g))
    assert "node 'ckpt'" in err.where and "--allow-python" in err.what
    check_python_nodes(g, allow_python=True)
    with pytest.raises(GraphFileError, match="--allow-python"):
        load_graph("example:reentrant", allow_python=False)
    check_python_nodes(load_graph("example:seed"))


def test_validate_command_options(capsys):
    from autograd_run.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["validate", "example:reentrant"])
    assert e.value.code == 2 and "--allow-python" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["validate", "example:reentrant", "--allow-python"])
    assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        main(["validate", "example:mlp", "--max-memory", "1KiB"])
    assert e.value.code == 2 and "memory budget of 1.0 KiB" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["validate", "example:mlp", "--max-memory", "lots"])
    assert e.value.code == 2


# -- 5. messages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("data,fmt,message", [
    (b'{"traceEvents": [], "displayTimeUnit": "ms"}', "json", "not an autograd-graph/1 file: no 'format"),
    (b'[{"ph": "X"}]', "json", "not an autograd-graph/1 file: the document is a list"),
    (b"apiVersion: v1\nkind: Pod\n", "yaml", "not an autograd-graph/1 file"),
    (b"", "json", "the file is empty"),
    (b" \n ", "yaml", "the file is empty"),
    (b"# only a comment\n", "yaml", "empty"),
])
def test_not_a_graph_and_empty(data, fmt, message):
    assert message in _error(lambda: loads_graph(data, f"g.{fmt}")).what


def test_messages_stay_on_one_line(tmp_path, capsys):
    """Ids, keys and file names from untrusted input cannot break "Error: FILE: PLACE: WHAT" over lines."""
    doc = copy_seed()
    doc["nodes"][0]["next"] = [["ghost\nTraceback (most recent call last):\u2028\x00", 0]]
    doc["x\ry"] = 1
    for fmt in ("json", "yaml"):
        err = _error(lambda: load_doc(doc, fmt))
        assert "\n" not in str(err) and "\r" not in str(err) and "\u2028" not in str(err)
        assert "x\\ry" in str(err)
    del doc["x\ry"]
    err = _error(lambda: load_doc(doc, "json"))
    assert "edge to missing node 'ghost\\nTraceback (most recent call last):\\u2028\\x00'" in err.what
    from autograd_run.cli.main import main
    bad = tmp_path / "a\nb.json"
    bad.write_text("{")
    with pytest.raises(SystemExit) as e:
        main(["validate", str(bad)])
    lines = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and "a\\nb.json" in lines[0]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_utf8_bom_is_accepted(fmt):
    g = loads_graph(b"\xef\xbb\xbf" + dumps(copy_seed(), fmt), f"g.{fmt}")
    assert len(g.nodes) == 5


# -- 6. devices ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,dev", [("cpu", ("cpu", -1)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3)),
                                      ("xpu:0", ("xpu", 0)), ("mps", ("mps", 0)), ("accel:1", ("accel", 1)),
                                      ("openreg:1", ("openreg", 1)), ("privateuseone:255", ("privateuseone", 255))])
def test_device_types(text, dev):
    d = Device.parse(text)
    assert (d.type, d.index) == dev


@pytest.mark.parametrize("text,message", [("cuda:1000", "index out of range"), ("cuda:256", "index out of range"),
                                          ("cuda:01", "leading zeros"), ("cuda:-1", "non-negative"),
                                          ("meta", "meta tensors"), ("cpu:0", "no index"), ("CUDA:0", "lowercase"),
                                          ("", "unknown device"), ("cuda:0:1", "non-negative integer"),
                                          ("a" * 40 + ":0", "unknown device")])
def test_bad_devices_say_why(text, message):
    assert Device.parse(text) is None and message in Device.explain(text)


@pytest.mark.parametrize("text,meant", [("cdua:0", "'cuda:0'"), ("cud:1", "'cuda:1'"), ("cudaa", "'cuda'"),
                                        ("gpu:0", "'cuda:0'"), ("smp:0", "'mps:0'"), ("vulkn:0", "'vulkan:0'")])
def test_near_miss_device_types_are_typos(text, meant):
    """A misspelt PyTorch device type is refused with the type meant, not taken as a renamed backend."""
    assert Device.parse(text) is None
    assert Device.explain(text).endswith(f"did you mean {meant}?")


@pytest.mark.parametrize("text", ["npu:0", "openreg:1", "accel:3", "hpu:0", "ipu", "xpu:2", "privateuseone:0"])
def test_renamed_backends_and_torch_types_are_devices(text):
    assert Device.parse(text) is not None


def test_one_renamed_backend_per_graph(tmp_path):
    """PyTorch renames PrivateUse1 once a process: two device types it does not know in one graph is a typo."""
    doc = copy_seed()
    doc["nodes"][1]["inputs"] = [{"shape": [2], "device": "npu:0"}]
    doc["nodes"][2]["inputs"] = [{"shape": [2], "device": "xpu:0"}]
    load_doc(json.loads(json.dumps(doc)), "json")  # one renamed backend beside a PyTorch type: fine
    doc["nodes"][3]["inputs"] = [{"shape": [2], "device": "npx:0"}]
    msg = str(_error(lambda: load_graph(write(tmp_path, doc))))
    assert "device type 'npx' is unknown to PyTorch, and so is 'npu' (node 'add' at $.nodes[1].inputs[0].device)" in msg
    assert "$.nodes[3].inputs[0].device" in msg


def test_accelerator_types_validate_run_and_round_trip():
    doc = copy_seed()
    doc["variables"][0]["device"] = "xpu:1"
    for n in doc["nodes"][1:4]:
        n["inputs"] = [{"shape": [2], "device": "accel:1"}]
    doc["nodes"][4]["inputs"] = [{"shape": [2], "device": "xpu:1"}]
    g = load_doc(doc, "json")
    assert [str(d) for d in g.devices] == ["cpu", "accel:1", "xpu:1"]
    assert graph_to_dict(load_doc(graph_to_dict(g), "yaml")) == graph_to_dict(g)
    from autograd_run.engine import Engine, GraphState
    from autograd_run.engine.run import run_graph
    state = GraphState(g)
    eng = Engine()
    try:
        run_graph(eng, g, state)
    finally:
        eng.shutdown(timeout=5)
    np.testing.assert_allclose(state.grads["a"], [5.0, 5.0])


# -- 7. loading from bytes (stdin) ------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_load_graph_bytes_detects_the_format(fmt, tmp_path):
    data = dumps(copy_seed(), fmt)
    assert (load_mod.detect_format(data) == "json") == (fmt == "json")
    g = load_graph_bytes(b"\n\n" + data)
    assert g.source == "<stdin>" and len(g.nodes) == 5
    doc = copy_seed()
    doc["nodes"][2]["saved"] = {"other": {"npz": "w", "file": "side.npz"}}
    np.savez(tmp_path / "side.npz", w=np.full(2, 2.0))
    with pytest.raises(GraphFileError, match="need a graph loaded from a file"):
        load_graph_bytes(dumps(doc, fmt))
    assert load_graph_bytes(dumps(doc, fmt), base_dir=str(tmp_path)).by_id["mb"].saved["other"]["npz"] == "w"


def test_load_graph_bytes_errors_name_the_source():
    err = _error(lambda: load_graph_bytes(b"{]", source="<stdin>"))
    assert err.file == "<stdin>" and "invalid JSON" in err.what
    err = _error(lambda: load_graph_bytes(b"format: [", source="<stdin>"))
    assert "invalid YAML" in err.what


def test_a_null_optional_scalar_is_the_rules_default():
    """AddBackward0's alpha written null (found by fuzzing: the rule multiplied by None) runs as alpha 1."""
    doc = copy_seed()
    doc["nodes"][1]["saved"] = {"alpha": None}
    g = loads_graph(dumps(doc, "json"), "g.json")
    assert "alpha" not in g.by_id["add"].saved
    from autograd_run.engine import DeviceSet, Engine
    from autograd_run.engine.run import run_graph
    eng = Engine(DeviceSet("virtual"), multithreading=False)
    try:
        assert run_graph(eng, g).grads["a"].tolist() == [5.0, 5.0]  # d/da (2a + 3a)
    finally:
        eng.shutdown()


# -- the number of next edges ------------------------------------------------------------------

@pytest.mark.parametrize("i,nxt,message", [
    (1, [], "AddBackward0 node 'add' has 0 next edges; AddBackward0 has 2 outputs "
            "(one per differentiable input of the forward add;"),
    (1, [["mb", 0], ["mc", 0], ["mc", 0]], "AddBackward0 node 'add' has 3 next edges; AddBackward0 has 2 outputs"),
    (2, [["acc", 0]], "MulBackward0 node 'mb' has 1 next edge; MulBackward0 has 2 outputs"),
    (0, [["add", 0], None], "SumBackward0 node 'sum' has 2 next edges; SumBackward0 has 1 output "
                            "(one per differentiable input of the forward sum;"),
])
@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_next_edges_must_match_the_ops_outputs(fmt, i, nxt, message):
    """Found by fuzzing: a wrong count passed validate and failed mid-run (IndexError, or PyTorch's
    "invalid number of gradients" after other nodes ran)."""
    doc = copy_seed()
    doc["nodes"][i]["next"] = nxt
    err = _error(lambda: load_doc(doc, fmt))
    assert message in err.what and "an input that needs no gradient keeps its place as a null edge" in err.what
    assert err.file.endswith(f"g.{fmt}")
    if fmt == "json":
        assert err.where.endswith(f"$.nodes[{i}].next")
    else:
        assert "line" in err.where


def test_null_edges_count_and_synthetic_ops_take_any_number():
    doc = copy_seed()
    doc["nodes"][1]["next"] = [None, ["mc", 0]]  # a constant first input: the place stays
    doc["nodes"][2] = {"id": "mb", "name": "Split", "op": "identity", "next": [], "inputs": [{"shape": [2]}]}
    doc["nodes"][3]["op"] = "opaque"  # a MulBackward0 replayed without its rule: no count
    doc["nodes"][3]["next"] = [["acc", 0]]
    load_doc(doc, "json")


def test_counts_read_from_the_node():
    """cat: one output per entry of saved 'sizes' where the file gives them; unknown (not checked) otherwise."""
    doc = copy_seed()
    doc["nodes"][1] = {"id": "add", "name": "CatBackward0", "seq": 2, "next": [["mb", 0], ["mc", 0]],
                       "inputs": [{"shape": [2]}], "saved": {"dim": 0, "sizes": [1, 1, 0]}}
    for n in (2, 3):
        doc["nodes"][n].update(op="opaque", inputs=[{"shape": [1]}])
    err = _error(lambda: load_doc(doc, "json"))
    assert "CatBackward0 node 'add' has 2 next edges; CatBackward0 has 3 outputs (one per entry of saved 'sizes';" \
        in err.what and err.where.endswith("$.nodes[1].next")
    doc["nodes"][1]["saved"]["sizes"] = [1, 1]
    load_doc(doc, "json")
    del doc["nodes"][1]["saved"]["sizes"]
    load_doc(doc, "json")


def test_default_budget_is_half_of_the_memory_available():
    """Not a fixed 4 GiB: half of what /proc/meminfo reports available (bounded by a cgroup and RLIMIT_AS,
    neither set here), so a big model fits on a big machine without --max-memory."""
    import resource
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        pytest.skip("no MemAvailable here")
    limited = resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limited = limited or f.read().strip().isdigit()
    except OSError:
        pass
    if limited:
        pytest.skip("a memory limit bounds the budget here")
    assert abs(default_max_bytes() - available // 2) <= max(available // 10, 64 << 20)


# -- memory bounded before a load starts --------------------------------------------------------------------


def test_a_load_the_machine_cannot_hold_is_refused_before_parsing(tmp_path, monkeypatch):
    """The estimate is checked against what the machine has left before anything is decoded: the error
    names the file, its size, the estimate and what is available (and for YAML, that JSON takes less)."""
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.dump import dumps
    doc = generate("chain", n=2000)
    decoded = []
    real = load_mod._JSON_DECODER
    monkeypatch.setattr(load_mod, "MEMORY_CHECK_FROM", 0)
    monkeypatch.setattr(load_mod, "memory_available", lambda: 1 << 20)
    monkeypatch.setattr(load_mod, "_JSON_DECODER", type("D", (), {"decode": lambda self, d: decoded.append(d)})())
    read = []
    real_read = load_mod.read_file
    monkeypatch.setattr(load_mod, "read_file", lambda *a: (read.append(a), real_read(*a))[1])
    for fmt in ("json", "yaml"):
        p = tmp_path / f"c.{fmt}"
        p.write_bytes(dumps(doc, fmt))
        # a file: from its size, before it is read (9 or 95 bytes a byte at least)
        exc = _error(lambda: load_graph(str(p)))
        assert exc.file == str(p) and exc.where is None
        assert "file takes at least" in exc.what and "1.0 MiB is available" in exc.what
        assert ("the same graph as JSON" in exc.what) == (fmt == "yaml")
        assert read == []
        # bytes (stdin, a library call): from its content, before it is parsed
        exc = _error(lambda: loads_graph(p.read_bytes(), str(p)))
        assert exc.file == str(p) and "file takes about" in exc.what and "1.0 MiB is available" in exc.what
    assert decoded == []
    monkeypatch.setattr(load_mod, "_JSON_DECODER", real)
    monkeypatch.setattr(load_mod, "memory_available", lambda: 64 << 30)
    assert len(load_graph(str(tmp_path / "c.json")).nodes) == 2001
    monkeypatch.setattr(load_mod, "memory_available", lambda: None)  # nothing known: no refusal
    assert len(load_graph(str(tmp_path / "c.json")).nodes) == 2001


def test_an_accumulate_grad_input_is_on_its_variables_device():
    """PyTorch makes an AccumulateGrad's input metadata from its variable: a file that puts them on different
    devices is refused (a gradient would otherwise accumulate on a device the variable is not on)."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    doc = generate("chain", n=3)
    doc["variables"][0]["device"] = "cuda:0"
    acc = next(i for i, n in enumerate(doc["nodes"]) if n["name"] == "AccumulateGrad")
    exc = _error(lambda: loads_graph(dumps(doc, "json"), "d.json"))
    assert exc.file == "d.json" and f"$.nodes[{acc}].inputs[0].device" in exc.where
    assert exc.what == "input device cpu does not match variable 'x' device cuda:0"


def test_a_json_file_that_fits_as_the_shortest_nodes_is_not_counted(monkeypatch):
    """Where even a file of nothing but the shortest nodes fits, the load does not count its nodes; a byte of
    memory less and it does (and loads, its real estimate being far smaller)."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    data = dumps(generate("chain", n=300), "json")
    ceiling = load_mod.JSON_BYTES_PER_BYTE * len(data) + load_mod.JSON_BYTES_PER_NODE * (
        len(data) // load_mod.MIN_JSON_NODE_BYTES)
    counted = []
    real = load_mod.load_memory_estimate
    monkeypatch.setattr(load_mod, "load_memory_estimate", lambda *a: (counted.append(1), real(*a))[1])
    monkeypatch.setattr(load_mod, "MEMORY_CHECK_FROM", 0)
    monkeypatch.setattr(load_mod, "memory_available", lambda: ceiling)
    assert len(loads_graph(data, "c.json").nodes) == 301 and counted == []
    monkeypatch.setattr(load_mod, "memory_available", lambda: ceiling - 1)
    assert len(loads_graph(data, "c.json").nodes) == 301 and counted == [1]


@pytest.mark.parametrize("kind,kw", [("chain", dict(n=3000)), ("chain", dict(n=3000, op="add")),
                                     ("fanout", dict(width=1500)), ("mlp", dict(layers=600, width=1)),
                                     ("transformer", dict(layers=40)), ("random", dict(nodes=1500, leaves=60))])
def test_the_load_estimate_covers_what_a_load_takes(kind, kw):
    """What tracemalloc sees a JSON load allocate at its peak (the file's bytes included) is under the
    estimate, and the estimate is not wildly above it (under 3x), on every generator's graphs."""
    import tracemalloc
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    data = dumps(generate(kind, **kw), "json")
    est = load_mod.load_memory_estimate(data, "json")
    loads_graph(dumps(generate(kind), "json"), "warm.json")  # (caches a first load fills: not this load's)
    tracemalloc.start()
    try:
        g = loads_graph(data, "g.json")
        peak = tracemalloc.get_traced_memory()[1] + len(data)
    finally:
        tracemalloc.stop()
    assert len(g.nodes) > 1000
    assert peak <= est <= 3 * peak, (peak, est)


def test_the_load_estimate_counts_objects_where_a_key_may_be_escaped():
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    data = dumps(generate("chain", n=500), "json")
    plain = load_mod.load_memory_estimate(data, "json")
    per_byte, per_node = load_mod.JSON_BYTES_PER_BYTE, load_mod.JSON_BYTES_PER_NODE
    assert plain == per_byte * len(data) + per_node * data.count(b'"id"')
    hidden = data.replace(b'"id"', b'"\\u0069d"')  # the same document: msgspec reads these keys as "id"
    assert len(loads_graph(hidden, "h.json").nodes) == 501
    assert load_mod.load_memory_estimate(hidden, "json") == per_byte * len(hidden) + per_node * hidden.count(b"{") > plain
    assert load_mod.load_memory_estimate(data, "yaml") == 95 * len(data)


def test_yaml_that_is_not_utf8_or_holds_a_huge_integer_is_refused_at_its_place():
    """libyaml's message gave a byte offset in "<byte string>", and Python's int() one that tells the user to
    call sys.set_int_max_str_digits(): both now name the line and column, in the file's terms."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    text = dumps(generate("chain", n=3), "yaml")
    lines = text.split(b"\n")
    k = next(i for i, line in enumerate(lines) if line.lstrip().startswith(b"seq:"))
    bad = b"\n".join(lines[:k] + [lines[k] + b" \xff"] + lines[k + 1:])
    exc = _error(lambda: loads_graph(bad, "b.yaml"))
    assert exc.file == "b.yaml" and exc.where == f"line {k + 1}, column {len(lines[k]) + 2}"
    assert exc.what == "the file is not UTF-8 text (byte 0xff)"
    indent = len(lines[k]) - len(lines[k].lstrip())
    huge = b"\n".join(lines[:k] + [b" " * indent + b"seq: " + b"9" * 5000] + lines[k + 1:])
    exc = _error(lambda: loads_graph(huge, "h.yaml"))
    assert exc.where == f"line {k + 1}, column {indent + 6}"
    assert exc.what == "an integer of 5000 characters: more than the 4300 digits a number may have"


@pytest.mark.parametrize("where", ["root", "variable"])
def test_a_gradient_of_true_is_refused(where):
    """Bools are refused in every number field; a root's or a variable's grad of ``true`` was taken as 1."""
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    doc = generate("chain", n=2)
    (doc["roots"][0] if where == "root" else doc["variables"][0])["grad"] = True
    exc = _error(lambda: loads_graph(dumps(doc, "json"), "g.json"))
    assert exc.what == "a gradient's values are numbers, not true or false"
    assert exc.where.endswith(".grad")
