"""``python -m bench memory [--seed N] [--models N] [--only a,b]``: the memory model against PyTorch's allocator.

Models are drawn at run time from a seed the run prints (``--seed`` repeats one draw) from the zoo: ours
(``tests/zoo/models.py``) and external ones nobody here wrote (torchvision, timm, Hugging Face transformers
built from configs, ``tests/zoo/external.py``), every one with a scalar loss and not in half precision. Each
case is a user's commands, each in a fresh process:

1. a script builds the model, captures its backward (``from_torch(loss, path=...)``, which records the saved
   tensors' storage), then builds it again under ``torch.profiler`` with ``profile_memory=True`` (the forward
   too, so that the activations' frees in the backward are seen) and runs ``loss.backward()``: from the
   allocator's running total ("Total Allocated") the live bytes at the backward's start, its peak and its end
   (``tests/support/memory_oracle.py``);
2. ``autograd-run simulate g.json --json``: the model's per-device start, peak and end.

It reports the signed error ``(model - measured) / measured`` of three figures, with their distribution
(median, p90, worst, bias): the bytes the backward adds at its peak over its start (the model counts the
root gradient at the start, PyTorch makes it in ``backward()``: added back), the bytes it leaves at its end
over its start, and the peak itself (all live bytes: the model counts the leaves and what the graph holds;
PyTorch also counts what it holds beyond the graph: running statistics, inputs nothing saved).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.accuracy import distribution  # noqa: E402

BENCH_WORDS = {"memory", "accuracy", "profiles", "ddp", "--quick", "--full", *"abcdefghij"}

#: The user's script: capture, then the profiled forward and backward (one process per case).
CASE = '''\
import json, sys
sys.path.insert(0, {tests!r}); sys.path.insert(0, {support!r})
import torch
from zoo import external, models
from zoo.registry import ZOO, build
from memory_oracle import measure
from autograd_run.capture import from_torch
entry = ZOO[{name!r}]
case = build(entry)
loss = case.outputs
if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
    print(json.dumps({{"skip": "not one scalar loss"}})); sys.exit(0)
from_torch(loss, names=case.names, path={graph!r}, reference=False)
del case, loss
got = measure(lambda: build(entry).outputs)
print(json.dumps(got))
'''


def candidates() -> tuple[list[str], list[str]]:
    """(external models, ours) that can be built here and are not in half precision."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from zoo import external, models  # noqa: F401
    from zoo.registry import ZOO
    ok = sorted(n for n, e in ZOO.items() if not e.half and not e.unavailable())
    return [n for n in ok if ZOO[n].external], [n for n in ok if not ZOO[n].external]


def one(name: str, folder: str, env: dict) -> dict:
    graph = os.path.join(folder, f"{name}.json")
    script = CASE.format(tests=os.path.join(ROOT, "tests"), support=os.path.join(ROOT, "tests", "support"),
                         name=name, graph=graph)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        return {"name": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    got = json.loads(p.stdout.strip().splitlines()[-1])
    if "skip" in got:
        return {"name": name, "skip": got["skip"]}
    q = subprocess.run([sys.executable, "-m", "autograd_run", "simulate", graph, "--json", "--memory"],
                       capture_output=True, text=True, env=env, timeout=900)
    if q.returncode != 0:
        return {"name": name, "error": (q.stderr.strip().splitlines() or ["?"])[-1][:200]}
    doc = json.loads(q.stdout)
    dev = doc["memory"]["devices"][0]
    with open(graph) as f:
        g = json.load(f)
    nodes = len(g["nodes"])
    roots = _root_bytes(g)
    m_peak, m_end = dev["peak_bytes"] - dev["start_bytes"] + roots, dev["end_bytes"] - dev["start_bytes"] + roots
    t_peak, t_end = got["peak"] - got["start"], got["end"] - got["start"]
    return {"name": name, "nodes": nodes, "torch": got, "model": {k: dev[k] for k in
            ("start_bytes", "peak_bytes", "end_bytes", "peak_name")},
            "growth": _rel(m_peak, t_peak), "end": _rel(m_end, t_end), "peak": _rel(dev["peak_bytes"], got["peak"]),
            "growth_bytes": (m_peak, t_peak), "end_bytes": (m_end, t_end)}


def _root_bytes(g: dict) -> int:
    from autograd_run.graphs.tensors import itemsize
    by_id = {n["id"]: n for n in g["nodes"]}
    total = 0
    for r in g["roots"]:
        meta = by_id[r["node"]]["inputs"][r.get("input_nr", 0)]
        n = 1
        for s in meta["shape"]:
            n *= s
        total += n * itemsize(meta.get("dtype", "float32"))
    return total


def _rel(model: int, measured: int) -> float:
    return (model - measured) / measured if measured else (0.0 if model == measured else 1.0)


def main(argv: list[str] | None = None, quick: bool = False) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--models", type=int, default=8 if quick else 16, help="models drawn (default 16)")
    p.add_argument("--only", default="", help="comma-separated zoo names instead of a draw")
    args, _ = p.parse_known_args([a for a in (argv or []) if a not in BENCH_WORDS])
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"memory: seed {seed} (python -m bench memory --seed {seed} repeats this draw)", flush=True)
    ext, ours = candidates()
    rng = random.Random(seed)
    half = args.models // 2  # half from models nobody here wrote, half from ours
    names = [n for n in args.only.split(",") if n] or (rng.sample(ext, min(half, len(ext)))
                                                        + rng.sample(ours, min(args.models - half, len(ours))))
    external = set(ext)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        for name in names:
            r = one(name, folder, env)
            r["family"] = "external" if name in external else "ours"
            rows.append(r)
            if "growth" in r:
                print(f"  {name:24s} {r['nodes']:5d} nodes  growth at peak {r['growth']:+7.2%} "
                      f"({r['growth_bytes'][0]:,} vs {r['growth_bytes'][1]:,} B)  end {r['end']:+7.2%}  "
                      f"peak {r['peak']:+7.2%}", flush=True)
            else:
                print(f"  {name:24s} {r.get('skip') or 'error: ' + r.get('error', '?')}", flush=True)
    done = [r for r in rows if "growth" in r]
    out = {"seed": seed, "cases": rows}
    for key in ("growth", "end", "peak"):
        if done:
            out[key] = distribution([r[key] for r in done])
    big = [r for r in done if r["torch"]["peak"] - r["torch"]["start"] >= 1 << 20]
    if big:
        out["growth_1mib_plus"] = distribution([r["growth"] for r in big])
    for fam in ("external", "ours"):
        rs = [r for r in done if r["family"] == fam]
        if rs:
            out[f"growth_{fam}"] = distribution([r["growth"] for r in rs])
    for key, label in (("growth", "growth at peak"), ("end", "left at the end"), ("peak", "peak (all live bytes)"),
                       ("growth_1mib_plus", "growth at peak, passes growing 1 MiB or more"),
                       ("growth_external", "growth at peak, external models"),
                       ("growth_ours", "growth at peak, ours (small)")):
        if key in out:
            d = out[key]
            print(f"memory {label}: n={d['n']} median {d['median']:.2%} p90 {d['p90']:.2%} worst {d['worst']:+.2%} "
                  f"bias {d['bias']:+.2%}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
