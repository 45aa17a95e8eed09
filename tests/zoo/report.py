"""Regenerate ``docs/zoo.md``: every zoo model captured, checked and measured.

    python tests/zoo/report.py            # print the page
    python tests/zoo/report.py --write    # write docs/zoo.md

For each model: its family and dtype, the nodes captured, the distinct ops,
nested graphs (checkpoint nodes), opaque nodes, whether PyTorch's order was
reproduced, and the worst gradient error as a fraction of the tolerance
(``max |ours - theirs| / (atol + rtol |theirs|)``; at most 1 passes).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))]

import torch  # noqa: E402

from autograd_run.capture import from_torch  # noqa: E402
from autograd_run.capture.check import check_graph  # noqa: E402
from autograd_run.engine import Engine  # noqa: E402
from autograd_run.engine.run import run_graph  # noqa: E402
from autograd_run.graphs import tensors  # noqa: E402
from autograd_run.graphs.load import load_graph  # noqa: E402
from zoo import external, models  # noqa: E402,F401
from zoo.registry import ZOO, build, tolerance  # noqa: E402

DOC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "zoo.md")
ACC = "torch::autograd::AccumulateGrad"


def measure(name: str, folder: str) -> dict:
    entry = ZOO[name]
    case = build(entry)
    path = os.path.join(folder, f"{name}.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = from_torch(case.outputs, case.inputs, grad_outputs=case.grad_outputs, names=case.names, path=path,
                         mode=case.mode)
    g = load_graph(path)
    want = {k: None if v is None else tensors.materialize(v, g.side_files)
            for k, v in g.meta["reference"]["grads"].items()}
    largest = max((float(np.abs(w.astype(np.float64)).max()) for w in want.values() if w is not None and w.size),
                  default=0.0)
    rtol, atol = tolerance(entry, largest)
    report = check_graph(g, rtol, atol, allow_python=True)
    worst = None
    if report.grads_compared:
        res = run_graph(Engine(multithreading=False, allow_python=True), g, retain_graph=True, allow_unused=True)
        worst = 0.0
        for k, w in want.items():
            o = res.grads.get(k)
            if w is None or o is None or not w.size:
                continue
            w64, o64 = w.astype(np.float64), np.asarray(o).astype(np.float64)
            worst = max(worst, float((np.abs(o64 - w64) / (atol + rtol * np.abs(w64))).max()))
    names = [n["name"] for n in doc["nodes"]]
    return {
        "name": name, "family": entry.family, "dtype": str(entry.half or entry.dtype).replace("torch.", ""),
        "autocast": entry.half is not None and entry.half != entry.dtype,
        "nodes": len(doc["nodes"]), "ops": sorted({n for n in names if n != ACC}),
        "nested": sum(n.get("op") == "checkpoint" for n in doc["nodes"]),
        "opaque": [(n["name"], n["attrs"]["reason"]) for n in doc["nodes"] if n.get("op") == "opaque"],
        "order": report.order_ok, "ran": report.order_len[0], "worst": worst, "ok": report.ok,
        "tol": (rtol, atol), "doc": entry.note,
    }


HEADER = """# The model zoo

`tests/test_zoo.py` captures {count} small models ({families} families): {own} written here
with plain `torch.nn`, and an `external` family of {external} that nobody here wrote
(`tests/zoo/external.py`: torchvision's and timm's own model classes, Hugging
Face transformers built from small configs, random weights, nothing
downloaded; each skips, saying why, when its library is missing). For each one: the graph file and its `.npz` side
file are written, `check_graph` replays it single-threaded and compares the
executed order with PyTorch's (exactly, nested checkpoint graphs included,
each node at PyTorch's reentrant depth) and every leaf gradient with
PyTorch's; a session replays it again with the engine's threads on, and
once more with every slot moved to a virtual accelerator (`cuda:0`), where
the engine's device worker thread runs the nodes while the caller waits
(order and gradients compared each time). The
models live in `tests/zoo/models.py` and `tests/zoo/external.py`; this page is written by
`python tests/zoo/report.py --write` (a test checks that it lists every
model).

## Adding a model

```python
@model("resnet_block", "vision")                 # name, family; dtype=torch.float64 unless stated
def resnet_block():
    \"\"\"What it shows (the docstring is its description here).\"\"\"
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    return m(torch.randn(2, 3, 8, 8)).square().mean(), m   # outputs, then leaves: modules, dicts, tensors
```

The builder runs with the entry's dtype as torch's default dtype and seed 0.
It returns the outputs followed by the leaves to name (a module's named
parameters, a `{{name: tensor}}` mapping, or tensors), or a `Case` when it
needs `inputs` (a `grad()` capture), `grad_outputs` or a capture `mode`.
`opaque=N` declares nodes that must stay opaque (custom Functions that cannot
be kept as data); `half=torch.bfloat16` marks an autocast model.

## Tolerances

| dtype | rtol | atol |
|---|---|---|
| float64 | 1e-6 | 1e-9 |
| float32 | 1e-4 | 1e-6 |
| float16 | 4e-3 | 2e-3 x the model's largest reference gradient |
| bfloat16 (also under autocast) | 3e-2 | 1e-2 x the model's largest reference gradient |

Half precision: half-precision nodes compute in float32 and round once, as
PyTorch's CPU kernels do for one op, but some PyTorch kernels round partial
sums to the half type (batch and layer norm weight gradients accumulate per
thread buffers in bfloat16, so PyTorch's own result depends on its thread
count), and a gradient that is only rounding noise (a convolution bias before
a batch norm, zero in exact arithmetic) is compared against the model's
gradient scale, not its own.

## Results

"error/tol" is the worst `|ours - theirs| / (atol + rtol |theirs|)` over every
leaf gradient element (1 or less passes); "ran" is the number of node runs in
PyTorch's order (nested graphs included; a node may run more than once).

| model | family | dtype | nodes | ops | nested | opaque | order (ran) | error/tol | what it shows |
|---|---|---|---|---|---|---|---|---|---|
"""

STILL_OPAQUE = """
## Ops still opaque in real models, and why

Captured as `opaque` with `attrs.reason`; the order still replays, gradients
are not compared (`check` says so).

| node | where it appears | why |
|---|---|---|
| custom `autograd.Function` whose backward is Python arithmetic (`<Name>Backward`), defined where it cannot be imported by name or keeping a module or callable on ctx | hand-written activations, straight-through estimators defined in scripts | its backward builds no autograd graph, and a replay cannot call it again (`custom_function_opaque` in the zoo); an importable one becomes a python node that calls its backward (`custom_function_python`, replayed with `--allow-python`) |
| custom Function whose backward transforms a nested backward's gradients | reversible networks that recombine gradients | only a nested `backward()`/`grad()` whose results are returned as they are can be kept as data; its nested graph is then left out of the file and of the order |
| `CompiledFunctionBackward` | `torch.compile`d modules | an AOTAutograd custom Function running compiled code |
| `FakeQuantizeLearnablePerTensorAffineBackward0`, `...PerChannel...` | LSQ (learnable scale and zero point) | no rule yet: the scale and zero-point gradients follow the kernel's float32 arithmetic and its own zero-point rounding |
| any node saving a tensor with inf/nan values or complex values | CTC's log-alphas, complex models | not an opaque node, but such a tensor cannot be written inline: capture with a path (the `.npz` holds it) |
| `CudnnRnnBackward0`, `CudnnConvolutionBackward0`, `FlashAttentionBackward0`, `EfficientAttentionBackward0`, `ThnnFusedLstmCellBackward0`, `MkldnnConvolutionBackward0` | graphs captured on a GPU (or with MKLDNN tensors) | fused backend kernels with their own saved layouts; a CPU capture records the generic nodes instead |
| nested tensors (`...AutogradNestedTensor0`) | | the format holds dense tensors only; sparse gradients (`Embedding(sparse=True)`) are replayed and compared as dense tensors of the same values |

A reentrant checkpoint (`torch.utils.checkpoint(..., use_reentrant=True)`)
and a custom Function whose backward differentiates a graph it builds (with
`torch.autograd.grad` or `backward` on a recomputation) are not opaque: they
are captured as `checkpoint` nodes with their nested graphs (see
[graph-format.md](graph-format.md)). `use_reentrant=False` leaves a plain
graph whose saved tensors are recomputed when capture reads them.
`torch.distributions`' Dirichlet and Beta samples (`_DirichletBackward`, a
custom Function) and Gamma samples (`StandardGammaBackward0`) replay with the
special-function factor capture records.

## Beyond the zoo: models drawn at run time

`python -m bench replay [--seed N] [--models N]` (in `make bench`) draws its
models from everything the installed libraries build here: every name
`timm.list_models()` lists, torchvision's classification, segmentation and
video models, and 44 Hugging Face transformers architectures from small
configs, the libraries in turns, from a seed it prints. Each is built in
float64 with random weights (float32 where an op has no float64 kernel),
run once in training mode at a small input, captured, and checked with
`autograd-run check`, each step a fresh process as a user runs it. Models
over 25 million parameters are counted apart (`--max-params`).

Measured on 2026-12-04 (torch 2.13.0, timm 1.0.31, transformers 5.25.0,
torchvision 0.28.0): seed 403180994, 30 of 30 checked models exact (order
and every leaf gradient), 22 drawn models too big; seed 181472212 (drawn
uniformly over the 1,510 names, before the turns), 21 of 21 exact, 18 too big, one not run (a
segmentation model built with its default backbone weights, a download; the
bench now builds them without). Later runs: seeds 284601750 (28 of 30: one
not compared, Reformer below; one fixed since), 646043699 (40 of 40),
264504219 with a 50M budget (15 of 15), 153426646 on 2026-12-07 (20 of 20).
A hand-picked run over 110 more architectures (19 torchvision models:
classification, segmentation, video; 54 timm models from ConvNeXt to Hiera,
MambaOut and Sequencer's LSTMs; 37 transformers architectures) was exact
everywhere the model itself ran (two torchvision video and flow models did not
at the inputs tried) but for Reformer,
whose reversible layers' custom Function recombines the gradients of four
nested backward calls: captured opaque with that reason, its gradients not
compared (`check` says so, exit 3).

A second hand-picked run (2026-12-07, models chosen without looking at the
zoo: 49 more, 12 torchvision, 13 timm, 24 transformers, among
them Inception v3, MaxVit, R3D-18, LeViT, CoAtNet, NFNet, DeBERTa-v2,
Longformer, XLNet, GPT-J, Falcon, Gemma 2, mBART and BLOOM) captured 46 (the
other three do not build at a small input or in float64); the order was
PyTorch's in all 46, and no op lacked a rule (BLOOM's GeLU, a custom
Function, is a python node: `--allow-python`). Four of them (XCiT, GPT-NeoX,
Falcon, Gemma 2) have joined the external family above since. One model's gradients differ,
and PyTorch's are the wrong ones: timm's EfficientFormer at batch 1. Its
stem's batch norm is followed by `flatten(2).transpose(1, 2)`, so the
gradient reaching `NativeBatchNormBackward0` has channels-last strides, and
PyTorch 2.13's CPU `native_batch_norm_backward` returns, for a batch of one
with such strides, a bias gradient that is not the sum of its incoming
gradient (20-35 off on random data; with a batch of 2, or the same gradient
made contiguous, it agrees to 1e-15). The replay computes the sum; a graph
file holds no strides to follow that kernel with, so `check` reports those
leaves (exit 3). Reproducer: `BatchNorm2d(16)` in training mode on a
`1x16x7x7` input, then `.flatten(2).transpose(1, 2)` and any loss.
"""


def render(rows: list[dict]) -> str:
    fams = sorted({r["family"] for r in rows})
    outside = sum(1 for r in rows if r["family"] == "external")
    out = [HEADER.format(count=len(rows), families=len(fams), own=len(rows) - outside, external=outside)]
    for r in rows:
        dtype = r["dtype"] + (" (autocast)" if r["autocast"] else "")
        worst = "not compared" if r["worst"] is None else f"{r['worst']:.2g}"
        order = ("same" if r["order"] else "DIFFERENT") + f" ({r['ran']})"
        opaque = str(len(r["opaque"])) if r["opaque"] else ""
        nested = str(r["nested"]) if r["nested"] else ""
        out.append(f"| `{r['name']}` | {r['family']} | {dtype} | {r['nodes']} | {len(r['ops'])} | {nested} | "
                   f"{opaque} | {order} | {worst} | {r['doc']} |\n")
    ops: dict[str, int] = {}
    for r in rows:
        for o in r["ops"]:
            ops[o] = ops.get(o, 0) + 1
    total_nodes = sum(r["nodes"] for r in rows)
    out.append(f"\n{len(rows)} models, {total_nodes} nodes, {len(ops)} distinct node names; "
               f"{sum(r['ok'] or bool(r['opaque']) for r in rows)} replay exactly as PyTorch "
               f"(order, and gradients where no node is opaque); "
               f"{sum(len(r['opaque']) for r in rows)} opaque node(s) in all.\n")
    opaque = [(r["name"], n, why) for r in rows for n, why in r["opaque"]]
    if opaque:
        out.append("\nOpaque nodes in the zoo (declared):\n\n")
        for name, n, why in opaque:
            out.append(f"* `{name}`: `{n}`: {why}\n")
    out.append("\n## Node names the zoo replays\n\nEach with the number of models whose graph has it.\n\n")
    out.append(", ".join(f"`{o}` ({k})" for o, k in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))) + ".\n")
    out.append(STILL_OPAQUE)
    return "".join(out)


def main(argv: list[str]) -> int:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(name, folder) for name in ZOO]
    text = render(rows)
    if "--write" in argv:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {DOC}: {len(rows)} models")
    else:
        print(text)
    bad = [r["name"] for r in rows if not (r["order"] and (r["ok"] or r["opaque"]))]
    if bad:
        print(f"not replayed exactly: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
