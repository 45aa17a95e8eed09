"""float16 and bfloat16 end to end: the format (dtypes, inline and npz tensors), capture (CPU autocast), and
rules that compute as PyTorch's half kernels do (in float32, rounded once)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the oracle")
nn = torch.nn
F = torch.nn.functional

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.capture.check import check_graph  # noqa: E402
from autograd_run.engine import Engine  # noqa: E402
from autograd_run.engine.run import run_graph  # noqa: E402
from autograd_run.errors import GraphFileError  # noqa: E402
from autograd_run.graphs.load import load_graph, loads_graph  # noqa: E402

pytestmark = pytest.mark.torch

from autograd_run.ops.dtypes import ensure_bfloat16  # noqa: E402

ensure_bfloat16()  # the package registers numpy's bfloat16 when a graph needs it; these tests make arrays first
BF16 = np.dtype("bfloat16")


def test_a_bfloat16_graph_file_with_inline_and_npz_tensors(tmp_path):
    np.savez(tmp_path / "h.npz", w=np.array([0.5, -1.25, 3.0], dtype=np.float32))
    (tmp_path / "h.yaml").write_text(
        "format: autograd-graph/1\n"
        "roots: [{node: mul, grad: {data: [1.0, 2.0, 3.0], dtype: bfloat16}}]\n"
        "variables: [{name: x, shape: [3], dtype: bfloat16}]\n"
        "nodes:\n"
        "  - {id: mul, name: MulBackward0, next: [[acc, 0], null], inputs: [{shape: [3], dtype: bfloat16}],\n"
        "     saved: {other: {npz: w, dtype: bfloat16}}}\n"
        "  - {id: acc, name: AccumulateGrad, variable: x}\n")
    g = load_graph(str(tmp_path / "h.yaml"))
    res = run_graph(Engine(multithreading=False), g)
    assert res.grads["x"].dtype == BF16
    np.testing.assert_array_equal(res.grads["x"].astype(np.float32), [0.5, -2.5, 9.0])


def test_npz_dtype_must_be_a_known_one(tmp_path):
    np.savez(tmp_path / "h.npz", w=np.ones(3, dtype=np.float32))
    text = ('{"format": "autograd-graph/1", "roots": [{"node": "n", "grad": "ones"}], "nodes": [{"id": "n", '
            '"name": "MulBackward0", "next": [null, null], "inputs": [{"shape": [3]}], '
            '"saved": {"other": {"npz": "w", "dtype": "bfloat17"}}}]}')
    (tmp_path / "h.json").write_text(text)
    with pytest.raises(GraphFileError, match="unsupported dtype 'bfloat17'"):
        load_graph(str(tmp_path / "h.json"))


def ulps(ours, theirs, dtype):
    """Largest difference in units of the half type's spacing at the reference's magnitude."""
    eps = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    t = theirs.float().numpy().astype(np.float64)
    o = np.asarray(ours, dtype=np.float64)
    spacing = np.maximum(np.abs(t), 2.0 ** -14) * eps
    return float((np.abs(o - t) / spacing).max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["mm", "softmax", "gelu", "mul", "conv"])
def test_single_half_ops_round_once_like_pytorch(op, dtype):
    """One node, half in and out: the replay differs from PyTorch's kernel by at most one rounding step."""
    torch.manual_seed(0)
    a = torch.randn(4, 6).to(dtype).requires_grad_(True)
    b = torch.randn(6, 5).to(dtype).requires_grad_(True)
    g = torch.randn(4, 5).to(dtype)
    fwd = {"mm": lambda: a @ b, "softmax": lambda: torch.softmax(a, -1) * 1.0,
           "gelu": lambda: F.gelu(a), "mul": lambda: a * a.detach().flip(0),
           "conv": lambda: F.conv1d(a.unsqueeze(0), b[:4, :3].unsqueeze(1).expand(4, 4, 3).contiguous())}[op]
    y = fwd()
    go = torch.randn(y.shape).to(dtype)
    doc = from_torch(y, grad_outputs=[go], names={"a": a, "b": b})
    g = loads_graph(__import__("json").dumps(doc), "h.json")
    res = run_graph(Engine(multithreading=False), g)
    y.backward(go)
    for name, t in (("a", a), ("b", b)):
        if t.grad is None:
            continue
        assert res.grads[name].dtype == (BF16 if dtype == torch.bfloat16 else np.float16)
        assert ulps(res.grads[name], t.grad, dtype) <= 1.0, (name, op)


def test_cpu_autocast_captures_and_replays(tmp_path):
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(m(torch.randn(5, 6)), torch.tensor([0, 1, 2, 0, 1]))
    path = str(tmp_path / "ac.json")
    doc = from_torch(loss, names=dict(m.named_parameters()), path=path)
    dtypes = {(n["name"], n["inputs"][0]["dtype"]) for n in doc["nodes"] if n["inputs"]}
    assert ("AddmmBackward0", "bfloat16") in dtypes and ("ToCopyBackward0", "bfloat16") in dtypes
    assert {v["dtype"] for v in doc["variables"]} == {"float32"}
    saved_bf16 = [v for n in doc["nodes"] for v in (n.get("saved") or {}).values()
                  if isinstance(v, dict) and v.get("dtype") == "bfloat16"]
    assert saved_bf16 and all("npz" in v for v in saved_bf16)
    arrs = np.load(tmp_path / "ac.npz")
    assert all(arrs[v["npz"]].dtype == np.float32 for v in saved_bf16)
    report = check_graph(load_graph(path))
    assert report.ok, report.grads


BF16_PROBE = '''
import json, sys
from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session
g = load_graph(sys.argv[1])
rep = run_session(g, RunOptions())
print(json.dumps({"ml_dtypes": "ml_dtypes" in sys.modules, "error": None if rep.error is None else str(rep.error)}))
'''


@pytest.mark.parametrize("pure", [False, True], ids=["compiled-reader", "msgspec"])
@pytest.mark.parametrize("escaped", [False, True])
def test_numpy_bfloat16_is_registered_for_a_bfloat16_json_file_only(tmp_path, pure, escaped):
    """In a fresh process (nothing registered yet): a JSON graph of bfloat16 slots, a bfloat16 saved tensor from
    its side file and a bfloat16 gradient written inline runs, and the same graph in float32 does not import
    ml_dtypes (0.6 s). The loader registers numpy's bfloat16 when the file may hold one: the compiled reader notes
    the strings it passes (a dtype written with escapes counts too; the whole file's bytes were searched for it
    before, 84 ms at 1e6 nodes), msgspec's path searches the bytes."""
    import json
    import subprocess
    import sys
    from autograd_run.graphs.generators import generate
    from cli_proc import cli_env
    script = tmp_path / "probe.py"
    script.write_text(BF16_PROBE)
    out = {}
    np.savez(tmp_path / "float32.npz", w=np.array([0.5, -1.25, 3.0], dtype=np.float32))
    np.savez(tmp_path / "bfloat16.npz", w=np.array([0.5, -1.25, 3.0], dtype=np.float32))
    for dtype in ("float32", "bfloat16"):
        doc = generate("chain", n=3)
        for v in doc["variables"]:
            v["dtype"], v["shape"] = dtype, [3]
        for n in doc["nodes"]:
            for m in n["inputs"]:
                m["dtype"], m["shape"] = dtype, [3]
            if "saved" in n:  # a saved tensor from the side file and a gradient written inline, in that dtype
                n["saved"] = {"other": {"npz": "w", "dtype": dtype}}
        doc["roots"][0]["grad"] = {"data": [1.0, 2.0, 3.0], "dtype": dtype}
        text = json.dumps(doc)
        if escaped:
            text = text.replace('"bfloat16"', '"bfloat\\u0031\\u0036"')
        path = tmp_path / f"{dtype}.json"
        path.write_text(text)
        env = cli_env(AUTOGRAD_RUN_PURE_PYTHON="1") if pure else cli_env()
        p = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=120,
                           env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        out[dtype] = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["float32"] == {"ml_dtypes": False, "error": None}
    assert out["bfloat16"] == {"ml_dtypes": True, "error": None}, out
