"""``python -m bench ddp [--seed N] [--cases N] [--timed N]``: simulated DDP backward time against real gloo runs.

Cases are drawn at run time from a seed the run prints (``--seed`` repeats
one): a model (the DDP oracle's six, ``tests/support/ddp_oracle.py``, and
external ones nobody here wrote: torchvision, timm, Hugging Face transformers
from ``tests/zoo/external.py``), a ``bucket_cap_mb`` and 2 or 4 local gloo
processes. Every figure is what a user's commands give, each in a fresh
process:

1. ``autograd-run calibrate --torch`` and ``autograd-run calibrate --gloo``
   into a cache folder of this run's own;
2. per case, the model under real ``DistributedDataParallel`` on ``world``
   processes (``ddp_oracle.run_ranks``: torchrun's one intra-op thread per
   process; every rank profiles its third iteration, then times ``--timed``
   backward calls after a barrier each, in turns with as many under
   ``no_sync()``, the same backward without communication); measured: the
   median over ranks of each rank's median backward; the **exposed
   communication** as ``simulate`` defines it (from the end of the compute
   to the end of the last all-reduce and the copy back), timed in each DDP
   call from a final callback queued ahead of DDP's (the engine runs them in
   order, after the last node) to the call's return, on the rank whose
   compute ended last (``measured_tails``: the simulated ranks are alike; a
   rank that finishes first also waits for the others, and that skew is
   reported beside it); and, beside those, DDP's
   cost over ``no_sync()`` (the backward minus the one without
   communication: it also holds the compute's own slowing while gloo runs,
   which the costs carry, as they come from the DDP job's profile);
3. ``autograd-run capture model.py:main -o g.json`` of the model wrapped in
   DDP with the case's settings (a one-process group,
   ``one_process_group()``), then ``autograd-run simulate g.json --costs
   rank0-steady.json --spec local-torch --ddp captured --world W --network
   local-gloo --json``: the prediction (the costs from the DDP job's own
   profile, as a user would profile it: one steady step; and, beside it,
   a ``schedule`` profile of three steps after one warm-up, whose per-node
   median ``--costs`` takes: ``error_schedule``).

It reports the signed error ``(predicted - measured) / measured`` of the
backward wall time, its distribution (MAPE, median, p90, worst, bias), by
world size; and the exposed communication's error, as a share of the wall
and its own (``exposed_summary``, shared with ``bench fsdp``).
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

OURS = ["mlp", "resnet", "transformer", "unused", "shared", "mixed"]
EXTERNAL = ["zoo:tv_resnet18", "zoo:tv_mobilenet_v3_small", "zoo:tv_shufflenet_v2_x0_5", "zoo:timm_convnext",
            "zoo:timm_vit", "zoo:hf_gpt2", "zoo:hf_bert", "zoo:hf_llama"]
CAPS = [None, 1.0, 0.25, 0.05]


def _cli(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograd_run", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


CAPTURE_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import torch
from autograd_run.capture import one_process_group
from tests.support import ddp_oracle


def main():
    one_process_group()
    model, run, find_unused = ddp_oracle.build({name!r})
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused{cap})
    return {{"outputs": run(ddp), "parameters": ddp}}
"""


def _capture(name: str, cap, folder: str, env: dict) -> str:
    """``autograd-run capture`` of the model wrapped in DDP (a one-process group), as a user captures it."""
    script, graph = os.path.join(folder, "model.py"), os.path.join(folder, "g.json")
    with open(script, "w") as f:
        f.write(CAPTURE_SCRIPT.format(root=ROOT, name=name, cap="" if cap is None else f", bucket_cap_mb={cap}"))
    p = _cli(["capture", f"{script}:main", "-o", graph], dict(env, GLOO_SOCKET_IFNAME="lo"))
    if p.returncode != 0:
        raise RuntimeError(f"capture failed: {p.stderr.strip()[-300:]}")
    return graph


def one_case(name: str, cap, world: int, timed: int, env: dict, tmp: str) -> dict:
    from tests.support import ddp_oracle
    folder = tempfile.mkdtemp(dir=tmp)
    ranks = ddp_oracle.run_ranks(name, cap, world, folder, timed=timed, timeout=540)
    measured = statistics.median(statistics.median(r["backward_ns"]) for r in ranks)
    compute = statistics.median(statistics.median(r["compute_ns"]) for r in ranks)
    graph = _capture(name, cap, folder, env)
    pred = {}
    plain = os.path.join(env["XDG_CACHE_HOME"], "plain-figure-spec.json")
    for kind, trace, spec in (("steady", "steady", "local-torch"), ("schedule", "schedule", "local-torch"),
                              ("plain_figure", "steady", plain)):
        p = _cli(["simulate", graph, "--costs", ranks[0]["traces"][trace], "--spec", spec, "--ddp",
                  "captured", "--world", str(world), "--network", "local-gloo", "--json", "--slack", "0"], env)
        if p.returncode != 0:
            return {"name": name, "cap": cap, "world": world, "error": p.stderr.strip()[-300:]}
        pred[kind] = json.loads(p.stdout)["ddp"]
    d, sched = pred["steady"], pred["schedule"]
    over_no_sync = max(0.0, measured - compute)
    tails = measured_tails(ranks)
    return {"name": name, "cap": cap, "world": world, "measured_ms": measured / 1e6, "compute_ms": compute / 1e6,
            "predicted_ms": d["wall_ns"] / 1e6, "predicted_compute_ms": d["compute_ns"] / 1e6,
            **tails, "predicted_exposed_ms": d["exposed_ns"] / 1e6, "over_no_sync_ms": over_no_sync / 1e6,
            "error": (d["wall_ns"] - measured) / measured, "buckets": len(d["buckets"]),
            "error_schedule": (sched["wall_ns"] - measured) / measured,
            # the steady profile corrected as before 2026-12-07 (the plain per-event figure for a trace with shapes)
            "error_plain_figure": (pred["plain_figure"]["wall_ns"] - measured) / measured}


def setup(label: str, argv: list[str], quick: bool) -> dict:
    """A time benchmark's start, shared with ``bench.fsdp_time``: ``--seed`` (else drawn and printed),
    ``--cases``, ``--timed``, a cache folder of the run's own and ``calibrate --torch`` and ``--gloo`` into it.
    ``{"seed", "error"}`` when a calibration fails."""
    def opt(flag: str, default: int) -> int:
        return int(argv[argv.index(flag) + 1]) if flag in argv else default
    seed = opt("--seed", random.SystemRandom().randrange(1 << 30))
    n = opt("--cases", 4 if quick else 10)
    print(f"{label}: seed {seed} ({n} cases; repeat with --seed {seed})")
    tmp = tempfile.mkdtemp(prefix=f"{label}-bench-")
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
    start = time.time()
    for args in (["calibrate", "--torch"], ["calibrate", "--gloo"]):
        p = _cli(args, env)
        if p.returncode != 0:
            print(f"{label}: `autograd-run {' '.join(args)}` failed: {p.stderr.strip()[-300:]}")
            return {"seed": seed, "error": p.stderr.strip()[-300:]}
        print("  " + p.stdout.strip().replace("\n", "\n  "))
    # the local-torch spec without its figures with shapes: a trace with shapes corrected by the plain figure, as
    # before 2026-12-07 (the rows' error_plain_figure, beside the one that counts)
    with open(os.path.join(tmp, "cache", "autograd-run", "local-torch-spec.json")) as f:
        plain = json.load(f)
    plain["engine"].update(profiler_event_shapes_us=0.0, profiler_event_shapes_later_us=0.0)
    with open(os.path.join(tmp, "cache", "plain-figure-spec.json"), "w") as f:
        json.dump(plain, f)
    return {"seed": seed, "cases": n, "timed": opt("--timed", 5 if quick else 9), "rng": random.Random(seed),
            "tmp": tmp, "env": env, "start": start}


def summary(label: str, seed: int, rows: list[dict], start: float) -> tuple[dict, list[dict]]:
    """The run's result: its rows, the wall-time error's distribution over the measured ones and per world
    size, printed; and those rows."""
    ok = [r for r in rows if "measured_ms" in r]
    out = {"seed": seed, "cases": rows, "seconds": time.time() - start}
    if ok:
        out["wall"] = distribution([r["error"] for r in ok])
        for w in (2, 4):
            sub = [r["error"] for r in ok if r["world"] == w]
            if sub:
                out[f"wall_world{w}"] = distribution(sub)
        d = out["wall"]
        print(f"{label}: backward wall, {d['n']} cases: MAPE {d['mape']:.1%}, median {d['median']:.1%}, p90 "
              f"{d['p90']:.1%}, worst {d['worst']:+.1%}, bias {d['bias']:+.1%}")
    return out, ok


def measured_tails(ranks: list[dict]) -> dict:
    """The exposed communication measured in the timed calls (each rank's ``backward_ns`` and ``tail_ns``, the
    calls in step across ranks: a barrier before each), in ms:

    - ``exposed_ms``: per call, the tail of the rank whose compute ended last (the communication left once
      every rank has launched its last bucket: what the simulation, whose ranks are alike, calls exposed);
      the median over the calls;
    - ``rank_tail_ms``: the median over ranks of each rank's median tail (what a rank waits: the exposed
      communication plus, on a rank that finished first, the wait for the others' compute);
    - ``skew_ms``: per call, the last rank's compute end minus the first's; the median over the calls.

    NaN where the tails were not timed (a rank whose callback did not run, or an older oracle)."""
    nan = float("nan")
    calls = min((len(r.get("tail_ns") or ()) for r in ranks), default=0)
    if not calls or any(len(r["backward_ns"]) != len(r["tail_ns"]) for r in ranks):
        return {"exposed_ms": nan, "rank_tail_ms": nan, "skew_ms": nan}
    last, skew = [], []
    for i in range(calls):
        ends = [(r["backward_ns"][i] - r["tail_ns"][i], r["tail_ns"][i]) for r in ranks]
        last.append(max(ends)[1])
        skew.append(max(ends)[0] - min(ends)[0])
    return {"exposed_ms": statistics.median(last) / 1e6,
            "rank_tail_ms": statistics.median(statistics.median(r["tail_ns"]) for r in ranks) / 1e6,
            "skew_ms": statistics.median(skew) / 1e6}


def exposed_summary(label: str, out: dict, ok: list[dict]) -> bool:
    """The exposed communication's error (rows with ``exposed_ms``, measured, and ``predicted_exposed_ms``),
    as a share of the measured wall and, where the tail is 0.5 ms or more, its own; printed and put in
    ``out``. False when no row has a measured tail."""
    timed_tail = [r for r in ok if r.get("exposed_ms", float("nan")) == r.get("exposed_ms")]  # NaN: none timed
    if not timed_tail:
        return False
    exp = [(r["predicted_exposed_ms"] - r["exposed_ms"]) / r["measured_ms"] for r in timed_tail]
    e = out["exposed_share_of_wall"] = distribution(exp)
    print(f"{label}: exposed communication (error as a share of the wall): MAPE {e['mape']:.1%}, worst "
          f"{e['worst']:+.1%}")
    # its own relative error where there is something to miss (a tail under 0.5 ms is a few wake-ups)
    big = [r for r in timed_tail if r["exposed_ms"] >= 0.5]
    if big:
        rel = out["exposed"] = distribution([(r["predicted_exposed_ms"] - r["exposed_ms"]) / r["exposed_ms"]
                                             for r in big])
        print(f"{label}: exposed communication, its own error ({rel['n']} cases exposing 0.5 ms or more): MAPE "
              f"{rel['mape']:.1%}, median {rel['median']:.1%}, p90 {rel['p90']:.1%}, worst {rel['worst']:+.1%}, "
              f"bias {rel['bias']:+.1%}")
    return True


def main(argv: list[str] | None = None, quick: bool = False) -> dict:
    run = setup("ddp", list(argv or []), quick)
    if "error" in run:
        return run
    seed, n, timed, rng, tmp, env, t = (run[k] for k in ("seed", "cases", "timed", "rng", "tmp", "env", "start"))
    cases = []
    for _ in range(n):
        pool = OURS if rng.random() < 0.4 else EXTERNAL
        cases.append((rng.choice(pool), rng.choice(CAPS), rng.choice([2, 4])))
    rows = []
    for name, cap, world in cases:
        try:
            r = one_case(name, cap, world, timed, env, tmp)
        except Exception as exc:  # noqa: BLE001  (a case that cannot run here is reported, not fatal)
            r = {"name": name, "cap": cap, "world": world, "error": str(exc)[-300:]}
        rows.append(r)
        if "measured_ms" in r:
            print(f"  {name:28} cap={str(cap):5} world={world}: measured {r['measured_ms']:7.2f} ms "
                  f"(compute {r['compute_ms']:6.2f}), predicted {r['predicted_ms']:7.2f} ms "
                  f"({r['error']:+.0%}; three steps' profile {r['error_schedule']:+.0%}); exposed {r['exposed_ms']:6.2f} vs "
                  f"{r['predicted_exposed_ms']:6.2f} ms (a rank's tail {r['rank_tail_ms']:6.2f}, ranks' skew "
                  f"{r['skew_ms']:5.2f}, over no_sync {r['over_no_sync_ms']:6.2f})")
        else:
            print(f"  {name:28} cap={str(cap):5} world={world}: skipped: {r['error']}")
    out, ok = summary("ddp", seed, rows, t)
    if exposed_summary("ddp", out, ok):
        over = [(r["predicted_exposed_ms"] - r["over_no_sync_ms"]) / r["measured_ms"] for r in ok]
        o = out["over_no_sync_share_of_wall"] = distribution(over)
        print(f"ddp: the same against DDP's cost over no_sync() (share of the wall): MAPE {o['mape']:.1%}, worst "
              f"{o['worst']:+.1%}")
    if ok:
        one = out["wall_schedule_profile"] = distribution([r["error_schedule"] for r in ok])
        print(f"ddp: the same with the costs of a schedule profile (three steps): MAPE {one['mape']:.1%}, median {one['median']:.1%}, "
              f"p90 {one['p90']:.1%}, worst {one['worst']:+.1%}, bias {one['bias']:+.1%}")
        was = out["wall_plain_figure"] = distribution([r["error_plain_figure"] for r in ok if "error_plain_figure" in r])
        print(f"ddp: the steady profile corrected as before 2026-12-07 (the plain figure per event): MAPE "
              f"{was['mape']:.1%}, median {was['median']:.1%}, worst {was['worst']:+.1%}, bias {was['bias']:+.1%}")
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2)[-2000:])
