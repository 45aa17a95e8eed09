"""``python -m bench fsdp [--seed N] [--cases N] [--timed N]``: simulated FSDP2 backward time against real gloo runs.

Cases are drawn at run time from a seed the run prints (``--seed`` repeats
one): a model (the FSDP oracle's, ``tests/support/fsdp_oracle.py``, or an
external one nobody here wrote: torchvision, timm, Hugging Face transformers
from ``tests/zoo/external.py``, sharded by size the way users often do it:
``fsdp_oracle.shard_by_size``) and 2 or 4 local gloo processes. Every figure
is what a user's commands give, each in a fresh process:

1. ``autograd-run calibrate --torch`` and ``autograd-run calibrate --gloo``
   into a cache folder of this run's own;
2. per case, the model under real ``fully_shard`` on ``world`` processes
   (``fsdp_oracle.run_ranks_many``: one intra-op thread per process; two
   warm-up iterations, the third backward profiled on every rank, then
   ``--timed`` backward calls after a barrier each); measured: the median
   over ranks of each rank's median backward call, and of its exposed
   communication (from the end of the compute, a final callback queued
   ahead of FSDP's, to the call's return: ``tests/support/compute_end.py``);
3. ``autograd-run capture model.py:main -o g.json`` of the model under
   ``fully_shard`` in a one-process group (``one_process_group()``), then
   ``autograd-run simulate g.json --costs rank0.json --spec local-torch
   --fsdp captured --world W --network local-gloo --json``: the prediction,
   with the costs from the FSDP job's own profile, as a user would make it
   (the oracle's ``hsdp`` model: on 4 processes, 2 replicas of 2 shards, and
   ``--fsdp captured,replicate=2``).

It reports the signed error ``(predicted - measured) / measured`` of the
backward call's wall time, its distribution (MAPE, median, p90, worst, bias),
by world size; and the exposed communication's error, as a share of the wall
and its own.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.accuracy import distribution  # noqa: E402
from bench.ddp_time import EXTERNAL, _cli, exposed_summary, measured_tails, setup, summary  # noqa: E402

OURS = ["blocks", "transformer", "prefetch2", "keep", "nested", "conv", "hsdp"]

CAPTURE_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from autograd_run.capture import one_process_group
from tests.support import fsdp_oracle


def main():
    one_process_group()
    model, run = fsdp_oracle.build({name!r})
    return {{"outputs": run(model), "parameters": model}}
"""


def _capture(name: str, folder: str, env: dict) -> str:
    """``autograd-run capture`` of the model under fully_shard (a one-process group), as a user captures it."""
    script, graph = os.path.join(folder, "model.py"), os.path.join(folder, "g.json")
    with open(script, "w") as f:
        f.write(CAPTURE_SCRIPT.format(root=ROOT, name=name))
    p = _cli(["capture", f"{script}:main", "-o", graph], dict(env, GLOO_SOCKET_IFNAME="lo"))
    if p.returncode != 0:
        raise RuntimeError(f"capture failed: {p.stderr.strip()[-300:]}")
    return graph


def _predict(name: str, world: int, ranks: list[dict], folder: str, env: dict) -> dict:
    measured = statistics.median(statistics.median(r["backward_ns"]) for r in ranks)
    graph = _capture(name, folder, env)
    from tests.support import fsdp_oracle
    fsdp = f"captured,replicate={fsdp_oracle.HSDP_REPLICAS}" if name == "hsdp" else "captured"  # (HSDP: 4 ranks)
    p = _cli(["simulate", graph, "--costs", ranks[0]["trace"], "--spec", "local-torch", "--fsdp", fsdp,
              "--world", str(world), "--network", "local-gloo", "--json", "--slack", "0"], env)
    if p.returncode != 0:
        return {"name": name, "world": world, "error": p.stderr.strip()[-300:]}
    d = json.loads(p.stdout)
    wall = d["fsdp"]["wall_ns"]
    return {"name": name, "world": world, "measured_ms": measured / 1e6, "predicted_ms": wall / 1e6,
            "error": (wall - measured) / measured, "units": len(d["fsdp"]["units"]),
            **measured_tails(ranks), "predicted_exposed_ms": d["fsdp"]["exposed_ns"] / 1e6}


def main(argv: list[str] | None = None, quick: bool = False) -> dict:
    run = setup("fsdp", list(argv or []), quick)
    if "error" in run:
        return run
    seed, n, timed, rng, tmp, env, t = (run[k] for k in ("seed", "cases", "timed", "rng", "tmp", "env", "start"))
    from tests.support import fsdp_oracle
    cases = [(rng.choice(OURS if rng.random() < 0.4 else EXTERNAL), rng.choice([2, 4])) for _ in range(n)]
    cases = [(name, 4 if name == "hsdp" else world) for name, world in cases]  # HSDP: 2 replicas of 2 shards
    rows = []
    for world in (2, 4):  # one group of processes per world size runs its models in turn (see fsdp_oracle)
        names = list(dict.fromkeys(name for name, w in cases if w == world))
        if not names:
            continue
        folder = tempfile.mkdtemp(dir=tmp)
        try:
            got = fsdp_oracle.run_ranks_many(names, world, folder, timeout=900, timed=timed)
        except Exception as exc:  # noqa: BLE001  (reported, not fatal)
            got = {name: f"{type(exc).__name__}: {str(exc)[-300:]}" for name in names}
        for name in names:
            ranks = got[name]
            if isinstance(ranks, str):
                rows.append({"name": name, "world": world, "error": ranks.strip()[-300:]})
                continue
            try:
                r = _predict(name, world, ranks, tempfile.mkdtemp(dir=folder), env)
            except Exception as exc:  # noqa: BLE001
                r = {"name": name, "world": world, "error": str(exc)[-300:]}
            rows.append(r)
            if "measured_ms" in r:
                print(f"  {name:28} world={world}: measured {r['measured_ms']:7.2f} ms, predicted "
                      f"{r['predicted_ms']:7.2f} ms ({r['error']:+.0%}), {r['units']} units; exposed "
                      f"{r['exposed_ms']:6.2f} vs {r['predicted_exposed_ms']:6.2f} ms (a rank's tail {r['rank_tail_ms']:6.2f}, "
                      f"ranks' skew {r['skew_ms']:5.2f})")
            else:
                print(f"  {name:28} world={world}: skipped: {r['error']}")
    out, ok = summary("fsdp", seed, rows, t)
    exposed_summary("fsdp", out, ok)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2)[-2000:])
