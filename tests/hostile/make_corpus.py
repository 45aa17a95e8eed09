"""Write the hostile corpus: small malformed or hostile graph files, each with the message it must give.

Run from the repository root: ``python tests/hostile/make_corpus.py``. It
rewrites every case file and ``expected.json`` (case file -> a fragment of
the one ``Error:`` line both ``validate`` and ``run`` must print, exit 2).
Cases that need the file system (FIFOs, links to devices, sparse or big
files, the compressed npz bomb) are made at test time in
``tests/test_hostile.py`` instead.
"""

from __future__ import annotations

import copy
import io
import json
import os
import struct
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

SEED = {
    "format": "autograd-graph/1",
    "roots": [{"node": "sum", "grad": "ones"}],
    "variables": [{"name": "a", "shape": [2]}],
    "nodes": [
        {"id": "sum", "name": "SumBackward0", "seq": 3, "next": [["add", 0]], "inputs": [{"shape": []}],
         "saved": {"self_sym_sizes": [2]}},
        {"id": "add", "name": "AddBackward0", "seq": 2, "next": [["mb", 0], ["mc", 0]], "inputs": [{"shape": [2]}],
         "saved": {"alpha": 1}},
        {"id": "mb", "name": "MulBackward0", "seq": 0, "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
         "saved": {"other": 2.0}},
        {"id": "mc", "name": "MulBackward0", "seq": 1, "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
         "saved": {"other": 3.0}},
        {"id": "acc", "name": "AccumulateGrad", "variable": "a"},
    ],
}

CASES: dict[str, str] = {}


def seed():
    return copy.deepcopy(SEED)


def write(name: str, data, expect: str) -> None:
    if isinstance(data, dict) or isinstance(data, list):
        data = json.dumps(data).encode()
    elif isinstance(data, str):
        data = data.encode()
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    CASES[name] = expect


def graph(expect: str, name: str, **changes) -> None:
    """The seed graph with node/root/variable changes applied by path strings ``nodes.2.saved``."""
    doc = seed()
    for path, value in changes.items():
        *head, last = path.split("__")
        d = doc
        for p in head:
            d = d[int(p)] if isinstance(d, list) else d[p]
        key = int(last) if isinstance(d, list) else last
        if value is _DEL:
            del d[key]
        else:
            d[key] = value
    write(name, doc, expect)


_DEL = object()


def savez(name: str, members: dict[str, bytes], compress=zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(os.path.join(HERE, name), "w", compress) as z:
        for k, v in members.items():
            z.writestr(zipfile.ZipInfo(k, date_time=(1980, 1, 1, 0, 0, 0)), v)  # the same bytes every time


def npy(arr: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, allow_pickle=True)
    return b.getvalue()


def npy_header(shape, descr="<f8") -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return b.getvalue()


def main() -> None:
    for f in os.listdir(HERE):
        if f.endswith((".json", ".yaml", ".yml", ".npz", ".txt")):
            os.remove(os.path.join(HERE, f))

    # -- reading and what the file is --
    write("empty.json", b"", "the file is empty")
    write("empty.yaml", b"", "the file is empty")
    write("whitespace.json", b"  \n\t \r\n", "the file is empty")
    write("comments_only.yaml", "# a graph will go here\n", "the file is empty")
    write("utf16.json", json.dumps(SEED).encode("utf-16"), "UTF-16")
    write("chrome_trace.json", {"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1}],
                                "displayTimeUnit": "ms"}, "not an autograd-graph/1 file")
    write("trace_array.json", [{"name": "x", "ph": "B", "ts": 0}], "not an autograd-graph/1 file: the document is a list")
    write("k8s_pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "not an autograd-graph/1 file")
    write("scalar.yaml", "just a sentence\n", "not an autograd-graph/1 file: the document is a string")
    write("format_number.json", {**SEED, "format": 1}, "not an autograd-graph/1 file: 'format' is 1")
    write("format_v9.json", {**SEED, "format": "autograd-graph/9"}, "unsupported format 'autograd-graph/9'")
    write("invalid_utf8.json", json.dumps(SEED).replace('"sum"', '"s\\u00ffm"', 1).encode().replace(b"\\u00ff", b"\xff"),
          "invalid JSON")
    write("truncated.json", json.dumps(SEED)[:150], "invalid JSON")
    write("nan_literal.json", json.dumps(SEED).replace('2.0', 'NaN'), "invalid JSON")
    write("number_out_of_range.json", json.dumps(SEED).replace('"seq": 3', '"seq": 1e400'),
          "at $.nodes[0].seq: number out of range")
    write("deep.json", "[" * 100_000 + "]" * 100_000, "not an autograd-graph/1 file")
    write("deep_object.json", '{"format": "autograd-graph/1", "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}",
          "expected 'object', got 'array'")
    write("deep.yaml", "a: " + "[" * 200 + "]" * 200 + "\n", "nesting deeper than 64 levels")
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    lines.append("format: autograd-graph/1\nroots: []\nnodes: *a9\n")
    write("alias_bomb.yaml", "\n".join(lines), "aliases expand")
    write("python_tag.yaml", "format: !!python/object/apply:os.system ['echo pwned']\n", "invalid YAML")
    write("graph.txt", json.dumps(SEED), "unknown extension")
    graph("edge to missing node 'ghost\\nTraceback (most recent call last):'", "newline_in_message.json",
          nodes__0__next=[["ghost\nTraceback (most recent call last):", 0]])

    write("newline_key.json", json.dumps({**SEED, "x\nTraceback (most recent call last):": 1}),
          "unknown field 'x\\nTraceback (most recent call last):'")
    graph("duplicate node id 'mb\\u202e\\r'", "control_chars_in_ids.json",
          nodes__2__id="mb\u202e\r", nodes__3__id="mb\u202e\r")

    # -- duplicate keys --
    text = json.dumps(SEED)
    write("dup_node_id.json", text.replace('{"id": "mb",', '{"id": "mb", "id": "sum",', 1), "duplicate key 'id'")
    write("dup_nodes.json", text[:-1] + ', "nodes": []}', "duplicate key 'nodes'")
    write("dup_escaped_key.json", text.replace('"saved": {"other": 2.0}', '"saved": {"other": 2.0, "\\u006fther": 5.0}'),
          "duplicate key 'other'")
    write("dup_saved.yaml", "format: autograd-graph/1\nroots: [{node: m}]\nvariables: [{name: a, shape: [2]}]\n"
          "nodes:\n- {id: m, name: MulBackward0, next: [[acc, 0], null], inputs: [{shape: [2]}],\n"
          "   saved: {other: 2.0, other: 3.0}}\n- {id: acc, name: AccumulateGrad, variable: a}\n",
          "duplicate key 'other' in a mapping (first at line 6)")
    write("dup_top.yaml", "format: autograd-graph/1\nformat: autograd-graph/1\nroots: []\nnodes: []\n",
          "duplicate key 'format'")

    # -- saved values against the op's declared kinds --
    graph("saved 'self_sym_sizes' of SumBackward0 must be a list of non-negative integers (sizes); entry 0 is 'x'",
          "sizes_string.json", nodes__0__saved={"self_sym_sizes": ["x"]})
    graph("entry 0 (-1) is out of range", "sizes_negative.json", nodes__0__saved={"self_sym_sizes": [-1]})
    graph("out of range", "sizes_huge.json", nodes__0__saved={"self_sym_sizes": [10**30]})
    graph("more than the limit of 2147483648", "sizes_too_many_elements.json",
          nodes__0__saved={"self_sym_sizes": [2**20, 2**20, 2**20]})
    graph("saved 'alpha' of AddBackward0 must be a number, got 'two'", "alpha_string.json", nodes__1__saved={"alpha": "two"})
    graph("saved 'alpha' of AddBackward0 must be a number, got '1e-3 volts' (a string is accepted only", "alpha_numeric_string.json",
          nodes__1__saved={"alpha": "1e-3 volts"})
    graph("needs saved field 'self_sym_sizes'", "missing_required.json", nodes__0__saved=_DEL)
    graph("saved 'other' of MulBackward0 must be a tensor", "other_string.json", nodes__2__saved={"other": "x"})
    graph("saved 'other' of MulBackward0 must be a tensor", "other_mapping.json", nodes__2__saved={"other": {"values": [1]}})
    graph("ragged", "other_ragged.json", nodes__2__saved={"other": [[1, 2], [3]]})
    deep: list = [1.0]
    for _ in range(40):
        deep = [deep]
    graph("too deep", "other_deep.json", nodes__2__saved={"other": deep})
    graph("does not broadcast", "other_no_broadcast.json", nodes__2__saved={"other": {"random": 1, "shape": [3]}})
    # -- next edges against the op's number of outputs (found by fuzzing: the run failed mid-way) --
    graph("AddBackward0 node 'add' has 0 next edges; AddBackward0 has 2 outputs", "next_missing.json",
          nodes__1__next=_DEL)
    graph("AddBackward0 node 'add' has 3 next edges; AddBackward0 has 2 outputs", "next_duplicated.json",
          nodes__1__next=[["mb", 0], ["mc", 0], ["mc", 0]])
    write("exponent_null.yaml",
          "format: autograd-graph/1\nroots: [{node: p}]\nvariables: [{name: a, shape: [2]}]\nnodes:\n"
          "- {id: p, name: PowBackward0, next: [[acc, 0]], inputs: [{shape: [2]}],\n"
          "   saved: {self: {data: [1.0, 2.0]}, exponent: null}}\n- {id: acc, name: AccumulateGrad, variable: a}\n",
          "saved 'exponent' of PowBackward0 must be a number, got null (it is not optional)")
    write("select_index_huge.json", {
        "format": "autograd-graph/1", "roots": [{"node": "sel"}], "variables": [{"name": "a", "shape": [2, 3]}],
        "nodes": [{"id": "sel", "name": "SelectBackward0", "next": [["acc", 0]], "inputs": [{"shape": [3]}],
                   "saved": {"self_sym_sizes": [2, 3], "dim": 0, "index": 10**30}},
                  {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]},
        "saved 'index' of SelectBackward0 must be an integer, got 1000000000000000000000000000000 (out of range")
    write("keepdim_string.json", {
        "format": "autograd-graph/1", "roots": [{"node": "s"}], "variables": [{"name": "a", "shape": [2, 3]}],
        "nodes": [{"id": "s", "name": "SumBackward1", "next": [["acc", 0]], "inputs": [{"shape": [3]}],
                   "saved": {"self_sym_sizes": [2, 3], "dim": [0], "keepdim": "no"}},
                  {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]},
        "saved 'keepdim' of SumBackward1 must be true or false, got 'no'")
    graph("a tensor spec needs exactly one of", "root_spec_two_kinds.json", roots__0__grad={"data": [1], "random": 1})

    # -- devices --
    graph("device 'cuda:1000': index out of range", "device_cuda_1000.json", nodes__2__inputs=[{"shape": [2], "device": "cuda:1000"}])
    graph("meta tensors carry no data", "device_meta.json", nodes__2__inputs=[{"shape": [2], "device": "meta"}])
    graph("'cpu' has no index", "device_cpu_index.json", nodes__2__inputs=[{"shape": [2], "device": "cpu:0"}])
    graph("device types are lowercase", "device_upper.json", variables=[{"name": "a", "shape": [2], "device": "CUDA:0"}])
    graph("expected 'str', got 'int'", "device_int.json", nodes__2__inputs=[{"shape": [2], "device": 0}])

    # -- python nodes --
    write("python_node.yaml",
          "format: autograd-graph/1\nroots: [{node: py}]\nvariables: [{name: a, shape: [2]}]\nnodes:\n"
          "- {id: py, name: EvilBackward, op: python, next: [[acc, 0]], inputs: [{shape: [2]}],\n"
          "   attrs: {callable: 'os:system'}}\n- {id: acc, name: AccumulateGrad, variable: a}\n",
          "--allow-python")

    # -- the memory budget --
    big = {"format": "autograd-graph/1", "roots": [{"node": "m0"}], "variables": [{"name": "a", "shape": [1]}],
           "nodes": []}
    for i in range(10):
        big["nodes"].append({"id": f"m{i}", "name": "MulBackward0", "next": [[f"m{i + 1}" if i < 9 else "acc", 0], None],
                             "inputs": [{"shape": [1]}],
                             "saved": {"other": {"random": i, "shape": [1 << 30], "dtype": "float64"}}})
    big["nodes"].append({"id": "acc", "name": "AccumulateGrad", "variable": "a"})
    write("budget_80gib.json", big, "(saved tensors 80.0 GiB,")
    huge = [{"shape": [1 << 31], "dtype": "float64"}]  # every gradient (the leaf's a sum of it: sum_to)
    graph("more than the memory budget", "budget_root_grad.json",
          nodes__0__inputs=huge, nodes__0__saved={"self_sym_sizes": [1 << 31]}, nodes__1__inputs=huge,
          nodes__2__inputs=huge, nodes__3__inputs=huge, variables=[{"name": "a", "shape": [1], "dtype": "float64"}])
    graph("more than the memory budget", "budget_variable.json",
          variables=[{"name": "a", "shape": [2], "dtype": "float32"},
                     {"name": "huge", "shape": [1 << 31], "dtype": "complex128", "grad": "zeros"}])
    graph("reference gradients", "budget_reference.json",
          meta={"reference": {"order": [], "grads": {"b": {"random": 1, "shape": [1 << 31], "dtype": "float64"}}}})
    graph("meta.reference.grads: must be a mapping of leaf names to tensors, got list", "reference_grads_list.json",
          meta={"reference": {"order": [], "grads": [1, 2]}})

    # -- npz side files --
    def npz_graph(name: str, expect: str, where: str = "root", spec=None, **extra) -> None:
        spec = spec if spec is not None else {"npz": "x"}
        doc = seed()
        if where == "root":
            doc["roots"][0]["grad"] = spec
        else:
            doc["nodes"][2]["saved"] = {"other": spec}
        doc.update(extra)
        write(name, doc, expect)

    obj = np.array([{"evil": 1}, None], dtype=object)
    savez("npz_object.npz", {"x.npy": npy(obj)})
    npz_graph("npz_object.json", "holds Python objects (pickled data), which autograd-run never loads")
    savez("npz_string.npz", {"x.npy": npy(np.array("abc"))})
    npz_graph("npz_string.json", "holds strings or raw bytes")
    savez("npz_wrong_shape.npz", {"x.npy": npy(np.ones(3))})
    npz_graph("npz_wrong_shape.json", "has shape [3], expected []")
    savez("npz_8tib.npz", {"x.npy": npy_header([1 << 40]) + b"\0" * 64})
    npz_graph("npz_8tib.json", "more than the limit of 2147483648")
    savez("npz_8gib_tiny.npz", {"x.npy": npy_header([1 << 30]) + b"\0" * 64})
    npz_graph("npz_8gib_tiny.json", "the member is corrupt")
    savez("npz_nul_key.npz", {"x.npy": npy(np.float32(1.0))})
    npz_graph("npz_nul_key.json", "is not in side file", spec={"npz": "x\u0000y"})
    npz_graph("npz_file_nul.json", "contains a NUL or control character", spec={"npz": "x", "file": "npz_nul_key\u0000.npz"})
    npz_graph("npz_file_absolute.json", "must be a path relative to the graph's folder", spec={"npz": "x", "file": "/etc/x.npz"})
    npz_graph("npz_file_dotdot.json", "lies outside the graph's folder", spec={"npz": "x", "file": "../../x.npz"})
    npz_graph("npz_file_empty.json", "'file' is empty", spec={"npz": "x", "file": ""})
    npz_graph("npz_file_number.json", "'file' must be the name of an .npz file", spec={"npz": "x", "file": 0})
    npz_graph("npz_file_missing.json", "side file 'nope.npz' is missing", spec={"npz": "x", "file": "nope.npz"})
    write("npz_not_zip.npz", b"PK\x03\x04 not really a zip", "")
    del CASES["npz_not_zip.npz"]
    npz_graph("npz_not_zip.json", "not an .npz (zip) archive")
    with open(os.path.join(HERE, "npz_object.npz"), "rb") as f:
        whole = f.read()
    with open(os.path.join(HERE, "npz_truncated.npz"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    npz_graph("npz_truncated.json", "not an .npz (zip) archive")
    savez("npz_not_npy.npz", {"x.npy": b"this is not an array"})
    npz_graph("npz_not_npy.json", "not a .npy array")
    savez("npz_structured.npz", {"x.npy": npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))})
    npz_graph("npz_structured.json", "structured dtype", where="saved")
    savez("npz_datetime.npz", {"x.npy": npy(np.array(["2020-01-01"], dtype="datetime64[D]"))})
    npz_graph("npz_datetime.json", "unsupported dtype 'datetime64[D]'", where="saved")
    savez("npz_no_broadcast.npz", {"x.npy": npy(np.ones(3, dtype=np.float32))})
    npz_graph("npz_no_broadcast.json", "does not broadcast", where="saved")
    savez("npz_complex_root.npz", {"x.npy": npy(np.complex64(1 + 2j))})
    npz_graph("npz_complex_root.json", "casting would drop the imaginary part")
    data = npy(np.arange(4, dtype=np.float64).reshape(2, 2)[0])
    savez("npz_bad_crc.npz", {"x.npy": data})
    with open(os.path.join(HERE, "npz_bad_crc.npz"), "r+b") as f:
        raw = f.read()
        at = raw.index(data) + len(data) - 3  # a byte of the array data, not of its header
        f.seek(at)
        f.write(bytes([raw[at] ^ 0xFF]))
    npz_graph("npz_bad_crc.json", "npz_bad_crc.npz' member 'x'", where="saved")
    # An end-of-directory record that claims a 2 GiB central directory: refused before reading it.
    eocd = b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 1, 1, 0x7FFFFFF0, 0, 0)
    with open(os.path.join(HERE, "npz_huge_directory.npz"), "wb") as f:
        f.write(eocd)
    npz_graph("npz_huge_directory.json", "more than the limit of 100000 members or 64 MiB")

    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump(dict(sorted(CASES.items())), f, indent=1, ensure_ascii=True)
        f.write("\n")
    print(f"{len(CASES)} cases")


if __name__ == "__main__":
    main()
