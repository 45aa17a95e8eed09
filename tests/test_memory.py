"""The memory model (``analysis.memory``): hand-computed passes, and PyTorch's own allocations.

Hand-computed: small graphs whose every allocation is counted by hand below each test (float32 [4]: 16
bytes; float64 [256]: 2048). Against PyTorch: real models' backward passes profiled with
``profile_memory=True`` (``tests/support/memory_oracle.py``), captured with their storage, replayed in
PyTorch's order (a simulation of the pytorch policy, and a real ``run``): the live bytes the backward adds
at its peak and leaves at its end, against the allocator's own running total.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from autograd_run.analysis.memory import memory_of, static_frees
from autograd_run.graphs.load import loads_graph
from autograd_run.graphs.model import FORMAT
from autograd_run.session import RunOptions, run_session
from autograd_run.sim.session import SimOptions, simulate_session

from builders import run_cli

F4 = {"shape": [4]}


def g_of(nodes, roots, variables, **extra):
    doc = {"format": FORMAT, "nodes": nodes, "roots": roots, "variables": variables, **extra}
    return loads_graph(json.dumps(doc), "<test>", "json")


def rand(shape, seed=1, dtype=None):
    d = {"random": seed, "shape": list(shape)}
    if dtype:
        d["dtype"] = dtype
    return d


def sim_memory(g, **kw):
    return simulate_session(g, SimOptions(spec="h100", costs="analytic", slack_top=0, **kw)).memory


def run_memory(g, **kw):
    return run_session(g, RunOptions(**kw)).memory


def one(mem):
    assert len(mem.devices) == 1
    return mem.devices[0]


def test_a_product_into_a_leaf():
    # start: leaf a 16 + saved self 16 + root 16 = 48; mul makes its output (16): peak 64; then its input and
    # saved tensor go (32), AccumulateGrad steals the gradient as a.grad: the end is a + a.grad = 32
    g = g_of([{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [F4],
               "saved": {"other": rand([4])}},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "mul", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    for mem in (sim_memory(g), run_memory(g)):
        d = one(mem)
        assert (d.start, d.peak, d.end) == (48, 64, 32)
        assert (d.peak_node, d.peak_name) == ("mul", "MulBackward0")
        assert d.at_end == {"leaf gradients (.grad)": 16, "leaves (parameters, inputs)": 16}
        assert d.at_peak == {"saved tensors": 16, "root gradients": 16, "outputs being made": 16,
                             "leaves (parameters, inputs)": 16}
        assert mem.freed["mul"] == 16  # its input and its saved tensor (32), less its output (16)


def test_one_gradient_twice_into_one_slot_is_summed_out_of_place():
    # AddBackward0 passes its gradient itself to both outputs (alpha 1): the buffer of a's AccumulateGrad
    # receives one tensor twice; it holds a second reference, so the sum is a new tensor (16): peak
    # leaf 16 + root 16 + sum 16 = 48; the end is a + a.grad (the sum, stolen) = 32
    g = g_of([{"id": "add", "name": "AddBackward0", "next": [["acc", 0], ["acc", 0]], "inputs": [F4]},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "add", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    d = one(sim_memory(g))
    assert (d.start, d.peak, d.end) == (32, 48, 32)
    # alpha 2: the second output is a new tensor (g * 2), and the sum then adds into the first in place
    g2 = g_of([{"id": "add", "name": "AddBackward0", "next": [["acc", 0], ["acc", 0]], "inputs": [F4],
                "saved": {"alpha": 2}},
               {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
              [{"node": "add", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    d2 = one(sim_memory(g2))
    assert (d2.start, d2.peak, d2.end) == (32, 48, 32)


def test_an_expanded_gradient_is_copied_into_grad():
    # a.sum(): the root (a float32 scalar, 4 bytes) expanded to [4] is no new memory, but not dense:
    # AccumulateGrad copies it (16) while it is still held: peak leaf 16 + root 4 + copy 16 = 36
    g = g_of([{"id": "sum", "name": "SumBackward0", "next": [["acc", 0]], "inputs": [{"shape": []}],
               "saved": {"self_sym_sizes": [4]}},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "sum", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    d = one(sim_memory(g))
    assert (d.start, d.peak, d.end) == (20, 36, 32)
    assert d.peak_name == "AccumulateGrad"


def test_shared_storage_is_one_block_freed_after_its_last_user_and_leaf_storage_is_never_freed():
    # two nodes save one 64-byte storage (a relu's result that the next matmul saved too); a third saves a
    # view of the leaf w: start = leaves (a 16, w 16) + the shared block 64 + root 16 = 112
    # (opaque nodes: their outputs are new memory; ``kept`` is counted like any saved tensor)
    nodes = [{"id": "m1", "name": "Op1", "op": "opaque", "next": [["m2", 0]], "inputs": [F4],
              "saved": {"kept": rand([16])}},
             {"id": "m2", "name": "Op2", "op": "opaque", "next": [["m3", 0]], "inputs": [F4],
              "saved": {"kept": rand([4], 2)}},
             {"id": "m3", "name": "Op3", "op": "opaque", "next": [["acc", 0]], "inputs": [F4],
              "saved": {"kept": rand([4], 3)}},
             {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]
    storage = {"blocks": [[64], [16, "w"]], "saved": {"m1": {"kept": 0}, "m2": {"kept": 0}, "m3": {"kept": 1}}}
    g = g_of(nodes, [{"node": "m1", "grad": "ones"}], [{"name": "a", "shape": [4]}, {"name": "w", "shape": [4],
             "requires_grad": False}], storage=storage)
    mem = sim_memory(g)
    d = one(mem)
    assert mem.storage == "captured"
    assert d.start == 16 + 16 + 64 + 16
    # m1: +16 output (peak 128), then its input goes; the block stays (m2 saved it too); m2 frees it
    assert d.peak == 128 and d.peak_node == "m1"
    assert mem.freed["m1"] == 0 and mem.freed["m2"] == 64  # m2 lets the shared block go
    assert d.end == 16 + 16 + 16  # a, w and a.grad: w's storage is never freed
    # without the storage section each saved tensor is its own block of its own size (16 + 64 + 16 + 16)
    g2 = g_of(nodes, [{"node": "m1", "grad": "ones"}], [{"name": "a", "shape": [4]}, {"name": "w", "shape": [4],
              "requires_grad": False}])
    d2 = one(sim_memory(g2))
    assert d2.start == 16 + 16 + 64 + 16 + 16 + 16


def test_retain_graph_keeps_saved_tensors():
    g = g_of([{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [F4],
               "saved": {"other": rand([4])}},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "mul", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    d = one(run_memory(g, retain_graph=True))
    assert d.end == 48  # a, a.grad and the saved tensor
    assert d.at_end["saved tensors"] == 16


def test_a_column_major_matrix_gradient_is_transposed_back_and_stolen():
    # Linear's weight: AddmmBackward0 computes mat2's gradient transposed (mat2 = W.t() is column-major),
    # TBackward0 views it row-major again and AccumulateGrad steals it: no copy. W [3, 2] float32 = 24 B.
    def graph(strides):
        return g_of([{"id": "mm", "name": "AddmmBackward0", "next": [None, None, ["t", 0]],
                      "inputs": [{"shape": [5, 3]}],
                      "saved": {"mat1": rand([5, 2]), "mat1_sym_sizes": [5, 2], "mat1_sym_strides": [2, 1],
                                "mat2_sym_sizes": [2, 3], "mat2_sym_strides": strides}},
                     {"id": "t", "name": "TBackward0", "next": [["acc", 0]], "inputs": [{"shape": [2, 3]}]},
                     {"id": "acc", "name": "AccumulateGrad", "variable": "w"}],
                    [{"node": "mm", "grad": "ones"}], [{"name": "w", "shape": [3, 2]}])
    stolen = sim_memory(graph([1, 2]))
    # start: w 24 + mat1 40 + root 60 = 124; the product 24 -> 148; then the root and mat1 go: 48 = w + w.grad
    d = one(stolen)
    assert (d.start, d.peak, d.end) == (124, 148, 48)
    assert 72 not in stolen.live.tolist()
    # a row-major mat2: its gradient comes row-major, its .t() is not, so AccumulateGrad copies it: the copy
    # and the view it copies are alive at once (72), then the view's block goes
    copied = sim_memory(graph([3, 1]))
    d = one(copied)
    assert (d.start, d.peak, d.end) == (124, 148, 48)
    assert 72 in copied.live.tolist()


def test_cuda_blocks_round_to_512_bytes_and_devices_are_counted_apart():
    # float32 [4] on cuda:0: 16 bytes, counted as the caching allocator's 512-byte block
    g = g_of([{"id": "mul", "name": "MulBackward0", "next": [["copy", 0], None],
               "inputs": [{"shape": [4], "device": "cuda:0"}], "saved": {"other": rand([4])}},
              {"id": "copy", "name": "ToCopyBackward0", "next": [["acc", 0]],
               "inputs": [{"shape": [4], "device": "cuda:0"}]},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "mul", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    mem = sim_memory(g)
    by = {d.device: d for d in mem.devices}
    assert set(by) == {"cpu", "cuda:0"}
    assert by["cuda:0"].start == 512 + 512  # the saved tensor and the root
    assert by["cuda:0"].peak == 3 * 512 and by["cuda:0"].end == 0
    assert by["cpu"].end == 32  # a and a.grad (the copy to the CPU, stolen)


def test_a_memory_limit_names_the_first_node_past_it():
    g = g_of([{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [F4],
               "saved": {"other": rand([4])}},
              {"id": "acc", "name": "AccumulateGrad", "variable": "a"}],
             [{"node": "mul", "grad": "ones"}], [{"name": "a", "shape": [4]}])
    over = sim_memory(g, memory_limit=50).over_limit
    assert (over.node, over.bytes, over.limit, over.device) == ("mul", 64, 50, "cpu")
    assert sim_memory(g, memory_limit=64).over_limit is None


def _wide(n=6):
    """A root feeding n branches, each a product with a 4 KiB saved tensor into its own leaf: the order the
    branches run in decides how many saved tensors are alive at once."""
    nodes = [{"id": "root", "name": "identity", "op": "identity", "next": [[f"b{k}", 0] for k in range(n)],
              "inputs": [{"shape": [1024]}]}]
    variables = []
    for k in range(n):
        nodes.append({"id": f"b{k}", "name": "MulBackward0", "seq": k, "next": [[f"c{k}", 0], None],
                      "inputs": [{"shape": [1024]}], "saved": {"other": rand([1024], k + 1)}})
        nodes.append({"id": f"c{k}", "name": "MulBackward0", "seq": 100 + k, "next": [[f"a{k}", 0], None],
                      "inputs": [{"shape": [1024]}], "saved": {"other": rand([1024], 50 + k)}})
        nodes.append({"id": f"a{k}", "name": "AccumulateGrad", "variable": f"v{k}"})
        variables.append({"name": f"v{k}", "shape": [1024]})
    return g_of(nodes, [{"node": "root", "grad": "ones"}], variables)


def test_the_memory_policy_frees_first_and_the_compare_table_shows_peaks(capsys):
    g = _wide()
    frees = static_frees(g)
    assert frees[g.by_id["b0"]] == 4096 + 4096 - 4096  # its saved tensor and its input, less its output
    pytorch = one(sim_memory(g, policy="pytorch"))
    memory = one(sim_memory(g, policy="memory"))
    assert memory.peak <= pytorch.peak
    assert memory.end == pytorch.end


def test_cli_run_and_simulate_show_memory_and_json_carries_it(tmp_path, capsys):
    path = tmp_path / "g.json"
    g = _wide(3)
    from autograd_run.graphs.dump import dumps, graph_to_dict
    path.write_bytes(dumps(graph_to_dict(g), "json"))
    code, out, err = run_cli(["run", str(path), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    dev = doc["memory"]["devices"][0]
    assert dev["device"] == "cpu" and dev["peak_bytes"] >= dev["start_bytes"] > 0
    assert dev["largest_at_peak"] and dev["at_end"]["leaf gradients (.grad)"] == 3 * 4096
    code, out, err = run_cli(["simulate", str(path)], capsys)
    assert code == 0, err
    assert "memory (allocated bytes)" in out and "at the cpu peak" in out
    code, out, err = run_cli(["simulate", str(path), "--compare", "policy=pytorch,memory", "--memory-limit",
                              "1MiB"], capsys)
    assert code == 0, err
    assert "peak memory" in out.replace("\n", " ") or "peak" in out
    code, out, err = run_cli(["simulate", str(path), "--memory-limit", "1KiB"], capsys)
    assert code == 4
    assert err.startswith("Error: the pass would not fit in 1.0 KiB on cpu")
    code, out, err = run_cli(["run", str(path), "--memory-limit", "1KiB", "--no-summary"], capsys)
    assert code == 4
    code, out, err = run_cli(["simulate", str(path), "--no-memory"], capsys)
    assert code == 0 and "memory (allocated bytes)" not in out
    code, out, err = run_cli(["simulate", str(path), "--memory-limit", "-3"], capsys)
    assert code == 2 and "Error: Invalid value for '--memory-limit'" in err
    for cmd in (["simulate"], ["run"]):  # the limit went unchecked, exit 0 (a hostile review)
        code, out, err = run_cli([*cmd, str(path), "--no-memory", "--memory-limit", "1KiB"], capsys)
        assert (code, out) == (2, "") and err.startswith("Error: --memory-limit needs the memory model"), err


def test_the_trace_carries_a_counter_track_per_device(tmp_path, capsys):
    path = tmp_path / "g.json"
    from autograd_run.graphs.dump import dumps, graph_to_dict
    path.write_bytes(dumps(graph_to_dict(_wide(2)), "json"))
    trace = tmp_path / "t.json"
    code, out, err = run_cli(["run", str(path), "--trace", str(trace), "--no-summary"], capsys)
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C" and e.get("name") == "cpu memory"]
    assert counters and all(set(e["args"]) == {"allocated"} for e in counters)
    mem = run_memory(loads_graph(path.read_bytes(), str(path), "json"))
    assert max(e["args"]["allocated"] for e in counters) == mem.devices[0].peak


def test_the_storage_section_is_checked_as_untrusted_data():
    base = [{"id": "mul", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [F4],
             "saved": {"other": rand([4])}}, {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]
    roots, variables = [{"node": "mul", "grad": "ones"}], [{"name": "a", "shape": [4]}]
    bad = [({"blocks": [[-1]], "saved": {}}, "storage.blocks[0][0]"),
           ({"blocks": [[16, "nope"]], "saved": {}}, "unknown variable 'nope'"),
           ({"blocks": [[16]], "saved": {"ghost": {"other": 0}}}, "unknown node 'ghost'"),
           ({"blocks": [[16]], "saved": {"mul": {"self": 0}}}, "saves no field 'self'"),
           ({"blocks": [[16]], "saved": {"mul": {"other": 3}}}, "block index from 0 to 0"),
           ({"blocks": [[16]], "extra": 1}, "unknown field"),
           ([1, 2], "expected 'object'")]
    from autograd_run.errors import GraphFileError
    for storage, text in bad:
        with pytest.raises(GraphFileError) as e:
            g_of(base, roots, variables, storage=storage)
        assert text in str(e.value), (storage, str(e.value))


# -- against PyTorch ------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="the memory oracle is PyTorch's allocator")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))
sys.path.insert(0, os.path.dirname(__file__))
from memory_oracle import measure  # noqa: E402


def _compare(build, names, tmp_path, key):
    """(PyTorch's growth at the peak and at the end, the model's), both over the live bytes at the start
    (the model counts the root gradients there; PyTorch makes them inside backward())."""
    from autograd_run.capture import from_torch
    from autograd_run.graphs.load import load_graph
    path = str(tmp_path / f"{key}.json")
    loss = build()
    from_torch(loss, names=names, path=path, reference=False)
    del loss
    got = measure(build)
    for t in names.values():
        t.grad = None
    g = load_graph(path)
    d = one(sim_memory(g))
    roots = _root_bytes(g)
    return (got["peak"] - got["start"], got["end"] - got["start"]), (d.peak - d.start + roots, d.end - d.start + roots)


def _root_bytes(g):
    from autograd_run.analysis.memory import nbytes
    return sum(nbytes(r.edge.node.inputs[r.edge.input_nr].shape, r.edge.node.inputs[r.edge.input_nr].dtype)
               for r in g.roots)


def test_small_passes_match_pytorch_to_the_byte(tmp_path):
    """Views, sums, expands, steals and copies: each backward's growth equals PyTorch's allocator's, but for
    the 8-byte wrapped scalars a formula makes (``grad * 2``) and are gone before the next node."""
    torch.manual_seed(0)
    a = torch.randn(256, dtype=torch.float64, requires_grad=True)
    b = torch.randn(256, dtype=torch.float64, requires_grad=True)
    lin = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).double()
    names = {"a": a, "b": b, **dict(lin.named_parameters())}
    cases = {
        "add_twice": lambda: (a + a).sum(),
        "product": lambda: (a * b).sum(),
        "views": lambda: a.view(16, 16).t().reshape(256).mul(2).sum(),
        "expand": lambda: a.expand(8, 256).mul(3).sum(),
        "sum": lambda: a.sum(),
        "mlp": lambda: lin(torch.randn(16, 32, dtype=torch.float64)).pow(2).sum(),
        "two_uses": lambda: (a.exp() + a.exp() * b).sum(),
    }
    for key, build in cases.items():
        for t in names.values():
            t.grad = None
        (tp, te), (mp, me) = _compare(build, names, tmp_path, key)
        assert te == me, (key, te, me)
        assert 0 <= tp - mp <= 16, (key, tp, mp)


@pytest.mark.parametrize("name", ["mobilenet_v2", "gpt_block", "llama_block", "multihead_attention",
                                  "tv_resnet18", "hf_gpt2", "hf_mixtral", "timm_vit"])
def test_real_models_peak_and_end_against_pytorch(name, tmp_path):
    """Captured models replayed: the end exactly (to 16 bytes), the peak's growth within 2% (formulas'
    scratch space, which the model leaves out, makes the rest); never above PyTorch's."""
    from zoo import external, models  # noqa: F401  (registers the models)
    from zoo.registry import ZOO, build
    entry = ZOO[name]
    if entry.unavailable():
        pytest.skip(entry.unavailable())
    case = build(entry)
    names = dict(case.names)

    def make():
        return build(entry).outputs
    from autograd_run.capture import from_torch
    from autograd_run.graphs.load import load_graph
    path = str(tmp_path / "g.json")
    from_torch(case.outputs, names=names, path=path, reference=False)
    del case
    got = measure(make)
    g = load_graph(path)
    d = one(sim_memory(g))
    roots = _root_bytes(g)
    tp, te = got["peak"] - got["start"], got["end"] - got["start"]
    mp, me = d.peak - d.start + roots, d.end - d.start + roots
    assert abs(te - me) <= 16, (te, me)
    assert mp <= tp + 16, (tp, mp)
    assert tp - mp <= 0.02 * tp + 64, (tp, mp)


def test_the_op_tables_views_are_pytorchs():
    """Each op that declares an output a view of its gradient (``OpSpec.views``): PyTorch's own node returns
    memory of the gradient it was given there, and new memory where the table says new memory."""
    from autograd_run.capture import from_torch
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    exprs = {
        "AddBackward0": lambda: x + y, "AddBackward0 alpha": lambda: torch.add(x, y, alpha=2),
        "SubBackward0": lambda: x - y, "TBackward0": lambda: x.t(), "TransposeBackward0": lambda: x.transpose(0, 1),
        "PermuteBackward0": lambda: x.permute(1, 0), "ViewBackward0": lambda: x.view(24),
        "UnsqueezeBackward0": lambda: x.unsqueeze(1), "CatBackward0": lambda: torch.cat([x, y]),
        "SumBackward0": lambda: x.sum(), "CloneBackward0": lambda: x.clone(), "ExpandBackward0": lambda: x[:1].expand(4, 6),
        "MulBackward0": lambda: x * y, "ToCopyBackward0": lambda: x.float(),
        "AddmmBackward0": lambda: torch.nn.functional.linear(x, w, torch.zeros(5, dtype=torch.float64, requires_grad=True)),
    }
    for label, make in exprs.items():
        out = make()
        fn = out.grad_fn
        doc = from_torch(out.sum(), reference=False)
        nodes = {n["name"]: n for n in doc["nodes"]}
        g_doc = loads_graph(json.dumps(doc), "<views>", "json")
        node = next(n for n in g_doc.nodes if n.name == fn.name())
        kinds = node.op.view_kinds(node)
        grad = torch.randn_like(out)
        got = fn(grad)
        got = got if isinstance(got, tuple) else (got,)
        for i, t in enumerate(got):
            if t is None or node.next[i] is None:
                continue
            kind = kinds if isinstance(kinds, str) else kinds[i]
            shares = t.untyped_storage().data_ptr() == grad.untyped_storage().data_ptr()
            # (the formula's own result: the engine's sum_to of a broadcast gradient, or a cast of another dtype,
            # come after it: the model's size rule)
            expected = kind not in ("", "t-new") and t.dtype == grad.dtype
            assert shares == expected, (label, i, kind, shares)
            if kind == "t-new":
                assert t.t().is_contiguous() and not t.is_contiguous(), label
        assert nodes  # the capture saw the node


def test_draw_colours_nodes_by_the_bytes_they_free(tmp_path, capsys):
    from autograd_run.graphs.dump import dumps, graph_to_dict
    path = tmp_path / "g.json"
    path.write_bytes(dumps(graph_to_dict(_wide(2)), "json"))
    out_svg = tmp_path / "g.dot"
    code, out, err = run_cli(["draw", str(path), "-o", str(out_svg), "--simulate", "--color-by", "freed"], capsys)
    assert code == 0, err
    text = out_svg.read_text()
    assert "bytes freed by each node" in text and "frees 4.0 KiB" in text
    code, out, err = run_cli(["draw", str(path), "-o", str(out_svg), "--color-by", "freed"], capsys)
    assert code == 2 and "needs --simulate" in err


def test_a_recompute_group_is_made_when_its_first_node_starts():
    # a non-reentrant checkpoint's region: its saved tensor (64 B) does not exist at the start; it is made
    # when m1 starts and goes after m1 (its only user): start = a 16 + root 16 = 32, peak 32 + 64 + 16 = 112
    nodes = [{"id": "m1", "name": "Op1", "op": "opaque", "next": [["acc", 0]], "inputs": [F4],
              "saved": {"kept": rand([16])}},
             {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]
    g = g_of(nodes, [{"node": "m1", "grad": "ones"}], [{"name": "a", "shape": [4]}],
             storage={"blocks": [[64, None, 0]], "saved": {"m1": {"kept": 0}}})
    d = one(sim_memory(g))
    assert (d.start, d.peak, d.end) == (32, 112, 32)
    from autograd_run.errors import GraphFileError
    with pytest.raises(GraphFileError, match="recompute group"):
        g_of(nodes, [{"node": "m1", "grad": "ones"}], [{"name": "a", "shape": [4]}],
             storage={"blocks": [[64, None, -1]], "saved": {"m1": {"kept": 0}}})


DDP_CHILD = r'''
import json, sys
sys.path.insert(0, SUPPORT)
import torch, torch.distributed as dist
from memory_oracle import measure
from autograd_run.capture import from_torch
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.05, gradient_as_bucket_view=VIEW)
def build():
    return ddp(torch.randn(32, 64)).pow(2).sum()
for _ in range(3):  # the buckets rebuilt after the first iteration: the steady state
    for q in m.parameters():
        q.grad = None
    build().backward()
for q in m.parameters():
    q.grad = None
from_torch(build(), parameters=ddp, path=PATH, reference=False)
for q in m.parameters():
    q.grad = None
print(json.dumps(measure(build)))
dist.destroy_process_group()
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("view", [False, True])
def test_ddp_buckets_in_the_memory_against_real_ddp(view, tmp_path, capsys):
    """DDP's buckets (allocated when DDP is made) and, with gradient_as_bucket_view, the gradients that live
    in them: a model under real DistributedDataParallel (one gloo rank, in a child process with a deadline)
    against ``simulate --ddp captured``'s memory: the growth at the peak and at the end, to 8 bytes."""
    import subprocess
    path = str(tmp_path / "g.json")
    code = DDP_CHILD.replace("SUPPORT", repr(os.path.join(os.path.dirname(__file__), "support"))) \
        .replace("VIEW", repr(view)).replace("PATH", repr(path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    rc, out, err = run_cli(["simulate", path, "--ddp", "captured", "--world", "1", "--network",
                            "alpha_us=10,gbps=10", "--json"], capsys)
    assert rc == 0, err
    dev = json.loads(out)["memory"]["devices"][0]
    assert dev["at_peak"].get("data-parallel buffers") == sum(t * 4 for t in (64 * 128, 128, 128 * 10, 10))
    roots = 4
    growth, end = dev["peak_bytes"] - dev["start_bytes"] + roots, dev["end_bytes"] - dev["start_bytes"] + roots
    assert end == got["end"] - got["start"]
    assert 0 <= (got["peak"] - got["start"]) - growth <= 8
    assert ("leaf gradients (.grad)" in dev["at_end"]) == (not view)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["blocks", "transformer"])
def test_fsdp_shards_and_gathers_in_the_memory_against_real_fsdp2(name, tmp_path, capsys):
    """FSDP2's sharded parameters, unsharded parameters (from their all-gather's copy-out to the reshard),
    all-gather buffers, reduce-scatter inputs and sharded gradients: the model captured under fully_shard
    against two real gloo ranks profiling their memory (child processes with a deadline). PyTorch's ranks
    differ from run to run and from each other (by one or two units' buffers: gloo's collectives on the CPU
    keep theirs for a while), never below the least seen here; the model stands for that least case: never
    above the least rank's growth at the peak and end (to 2 KiB), and for blocks its growth at least 80% of it
    (measured: blocks 295,180 B against 295,188; transformer 129,980 against 138,052 at best, 172,228 in a
    run under load)."""
    try:
        from tests.support import fsdp_oracle
    except ImportError:  # tests/ itself is on sys.path, the repository root is not
        from support import fsdp_oracle
    path = str(tmp_path / "g.json")
    fsdp_oracle.capture(name, path)
    real = [r["memory"] for r in fsdp_oracle.run_ranks(name, 2, str(tmp_path), memory=True)]
    rc, out, err = run_cli(["simulate", path, "--fsdp", "captured", "--world", "2", "--network",
                            "alpha_us=10,gbps=10", "--json"], capsys)
    assert rc == 0, err
    dev = json.loads(out)["memory"]["devices"][0]
    growth, end = dev["peak_bytes"] - dev["start_bytes"], dev["end_bytes"] - dev["start_bytes"]
    least_growth = min(r["peak"] - r["start"] for r in real)
    least_end = min(r["end"] - r["start"] for r in real)
    assert growth <= least_growth + 64, (growth, real)
    if name == "blocks":  # (the transformer's real figures move by up to a third under load: an upper bound only)
        assert growth >= 0.8 * least_growth, (growth, real)
    assert end <= least_end + 2048, (end, real)
    assert any(h["what"].startswith("FSDP ") for h in dev["largest_at_peak"])
