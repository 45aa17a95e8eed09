"""``python -m bench profiles [--seed N] [--models N] [--styles a,b] [--repeats N]``: profile costs on external models.

The simulation with costs from a PyTorch profile, judged on models nobody
here wrote (the zoo's external family, ``tests/zoo/external.py``:
torchvision, timm, Hugging Face transformers from small configs) and on
profiles made the ways people make them. Models are drawn at run time from
a seed the run prints (``--seed`` repeats one). Every figure is what a
user's commands give, each in a fresh process:

1. ``autograd-run calibrate --torch`` into a cache folder of this run's own;
2. per model, ``autograd-run capture model.py:main -o g.json``;
3. per model and profile style, one fresh process (``PROFILER`` below, the
   script a user writes): it builds the model once, in float32, makes the profile
   in that style, exports it with ``export_chrome_trace``, then times
   ``--repeats`` unprofiled backward calls (a fresh forward before each,
   garbage collector paused from before the forward, one intra-op thread): the median wall time is
   the measured figure (the median of the calling thread's CPU time, which
   a shared machine's preemptions do not inflate, is reported beside it);
4. ``autograd-run simulate g.json --costs trace.json --json``: the
   prediction, with the expected error it states.

Styles (``STYLES``): ``first`` (``with profile(record_shapes=True):
loss.backward()`` on the process's first backward: cold caches, the
profiler's start-up in the same span), ``single`` (the same after warm-up
steps), ``plain`` (no ``record_shapes``), ``train_step`` (forward, backward
and ``optimizer.step()`` in one profile, with ``with_stack`` and
``profile_memory``), ``schedule`` (``schedule(wait=1, warmup=1, active=3)``
over training steps with ``prof.step()``: ``ProfilerStep#N`` spans, the
trace written by ``on_trace_ready``).

It reports the signed error ``(predicted - measured) / measured`` per case,
its distribution (MAPE, median, p90, worst, bias) per style and per library,
and whether the stated expected error covered it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from bench.accuracy import _fmt, distribution

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
STYLES = ("first", "single", "plain", "train_step", "schedule")
#: ``--malloc steady``: glibc's allocator keeps what PyTorch frees (no block mapped on its own, no trimming), so no
#: backward call takes its buffers from the system again: page faults no longer come and go between calls. Here a
#: resnet18 backward (batch 2, 64x64, one thread) took 47-52 ms with ~13,000 minor faults a call by default, 30 ms
#: with none this way, and 85 ms with 43,000 when only the trimming was turned off (every large buffer mapped); a
#: convnext_tiny took 108-135 ms with 9,000-28,000 faults with a 32 MiB mmap threshold, 91 ms with none this way.
STEADY_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
BENCH_WORDS = {"profiles", "accuracy", "--quick", "--full", *"abcdefghij"}

#: The model file a user would write: the zoo entry's builder, in float32 (what people train in).
MODEL = '''\
import sys
sys.path.insert(0, {tests!r})
import torch
from zoo import external

torch.set_default_dtype(torch.float32)
MODEL, RUN = external.parts({name!r})  # built once, as a training script does


def main():
    return RUN(MODEL), dict(MODEL.named_parameters())
'''

#: The profiling script a user would write (one style per process), then the timing of unprofiled calls.
PROFILER = '''\
import gc, json, resource, statistics, sys, time
sys.path.insert(0, {folder!r})
import torch
from torch.profiler import ProfilerActivity, profile, schedule
import model

# One intra-op thread: the backward then runs on the calling thread alone, so its CPU time is the wall time
# of a quiet machine (this one is shared: both are reported).
torch.set_num_threads(1)
STYLE, OUT, REPEATS = {style!r}, {out!r}, {repeats}
opt = torch.optim.SGD(model.MODEL.parameters(), lr=1e-3)


def forward():
    opt.zero_grad()  # every backward below starts without gradients, as in training
    return model.RUN(model.MODEL)


def step():
    forward().backward()
    opt.step()


def faults():
    """Minor page faults so far: memory the allocator took from the system and touched for the first time."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


profiled_faults = faults()
if STYLE == "first":
    loss = forward()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        f0 = faults()
        loss.backward()
        profiled_faults = faults() - f0
    prof.export_chrome_trace(OUT)
for _ in range(3):
    step()
if STYLE in ("single", "plain"):
    loss = forward()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=STYLE == "single") as prof:
        f0 = faults()
        loss.backward()
        profiled_faults = faults() - f0
    prof.export_chrome_trace(OUT)
elif STYLE == "train_step":
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                 profile_memory=True) as prof:
        f0 = faults()
        step()  # (forward and step too: their faults are counted with the backward's)
        profiled_faults = faults() - f0
    prof.export_chrome_trace(OUT)
elif STYLE == "schedule":
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(OUT)) as prof:
        for i in range(5):
            f0 = faults()
            step()
            if i == 2:  # the first active step's (forward and optimizer step included)
                profiled_faults = faults() - f0
            prof.step()
walls, cpus, flts = [], [], []
for _ in range(REPEATS):
    # The collector runs before the forward, never between it and the backward: a collection walks every
    # object and leaves the caches cold, and a training loop's backward follows its forward with the caches
    # warm (here a GPT-2's backward took 1.60 ms after a gc.collect() and 0.87 ms without one).
    gc.collect()
    gc.disable()
    loss = forward()
    f0, c, t = faults(), time.thread_time_ns(), time.perf_counter_ns()
    loss.backward()
    walls.append(time.perf_counter_ns() - t)
    cpus.append(time.thread_time_ns() - c)
    flts.append(faults() - f0)
    gc.enable()
print(json.dumps({{"walls": walls, "cpus": cpus, "faults": flts, "profiled_faults": profiled_faults}}))
'''


def _run(cmd: list[str], env: dict, timeout: int = 900) -> str:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}: exit {p.returncode}: {p.stderr.strip()[-600:]}")
    return p.stdout


def _cli(args: list[str], env: dict) -> str:
    return _run([sys.executable, "-m", "autograd_run", *args], env)


def _p80(errors: list[float]) -> float:
    a = sorted(abs(e) for e in errors)
    return a[min(len(a) - 1, int(0.8 * len(a)))]


def available_models() -> dict[str, str]:
    """External zoo models that can be built here: name -> library (checked in a child process)."""
    code = ("import json, sys; sys.path.insert(0, %r)\nfrom zoo import external\nfrom zoo.registry import ZOO\n"
            "print(json.dumps({n: e.external for n, e in ZOO.items() if e.external and not e.unavailable()}))" % TESTS)
    out = _run([sys.executable, "-c", code], dict(os.environ), timeout=300)
    return json.loads(out.strip().splitlines()[-1])


def uncorrected_spec(env: dict, folder: str) -> str:
    """A copy of the run's calibrated local-torch spec without its first-call figures (``sim.first_call``): what
    a first call's prediction was before they were measured, for the same traces and timings (its path)."""
    src = os.path.join(env["XDG_CACHE_HOME"], "autograd-run", "local-torch-spec.json")
    with open(src) as f:
        doc = json.load(f)
    for k in ("first_call_ns_per_byte", "first_call_setup_us"):
        doc["engine"].pop(k, None)
    path = os.path.join(folder, "local-torch-uncorrected.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def case(name: str, style: str, folder: str, env: dict, repeats: int, plain_spec: str | None = None) -> dict:
    trace = os.path.join(folder, f"{style}.trace.json")
    script = os.path.join(folder, f"profile_{style}.py")
    with open(script, "w") as f:
        f.write(PROFILER.format(folder=folder, style=style, out=trace, repeats=repeats))
    got = json.loads(_run([sys.executable, script], env).strip().splitlines()[-1])
    walls = got["walls"]
    measured = statistics.median(walls)
    cpu = statistics.median(got["cpus"])
    sim = json.loads(_cli(["simulate", os.path.join(folder, "g.json"), "--costs", trace, "--json", "--no-summary",
                           "--slack", "0"], env))
    pred = sim["wall_ns"]
    err = pred / measured - 1
    stated = (sim.get("expected_error") or {}).get("relative")
    use = (sim.get("measured") or {}).get("use") or {}
    kind = "first call" if use.get("first_call") else "one call" if len(use.get("used", [])) == 1 else "several calls"
    return {"model": name, "style": style, "kind": kind, "used": use.get("line"), "measured_ns": measured, "spread": (max(walls) - min(walls)) / measured,
            "faults": statistics.median(got["faults"]), "profiled_faults": got["profiled_faults"],
            "measured_cpu_ns": cpu, "error_cpu": pred / cpu - 1,
            "predicted_ns": pred, "error": err, "stated": stated,
            "covered": None if stated is None else abs(err) <= stated, "warnings": sim.get("warnings", []),
            "spec": sim.get("spec"), "measured_costs": sim.get("measured"),
            "first_call_taken_ns": sim.get("first_call_taken_ns"),
            "error_uncorrected": _uncorrected(folder, trace, env, plain_spec, measured) if kind == "first call" and
            plain_spec else None}


def _uncorrected(folder: str, trace: str, env: dict, plain_spec: str, measured: float) -> float:
    """The same first-call trace simulated without the first-call figures: its error."""
    sim = json.loads(_cli(["simulate", os.path.join(folder, "g.json"), "--costs", trace, "--json", "--no-summary",
                           "--slack", "0", "--spec", plain_spec], env))
    return sim["wall_ns"] / measured - 1


def main(argv: list[str] | None = None, quick: bool = False) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench profiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--models", type=int, default=4 if quick else 8, help="models drawn (default 8)")
    p.add_argument("--styles", default=",".join(STYLES))
    p.add_argument("--repeats", type=int, default=7, help="unprofiled backward calls timed per case")
    p.add_argument("--only", default="", help="comma-separated model names instead of a draw")
    p.add_argument("--malloc", choices=("default", "steady"), default="default",
                   help="the profiling processes' allocator: as the user's (default), or keeping what is freed "
                        "(steady: STEADY_MALLOC), to tell the allocator's page faults from the simulation's error")
    # `python -m bench` passes its whole command line: its part names and flags are not ours (accuracy's options,
    # e.g. --graphs, are ignored here).
    args, _ = p.parse_known_args([a for a in (argv or []) if a not in BENCH_WORDS])
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    styles = [s for s in args.styles.split(",") if s]
    bad = [s for s in styles if s not in STYLES]
    if bad:
        raise SystemExit(f"unknown style(s) {bad}; known: {', '.join(STYLES)}")
    print(f"profiles: seed {seed} (python -m bench profiles --seed {seed} repeats this draw)", flush=True)
    have = available_models()
    if not have:
        print("profiles: no external model can be built here (pip install -e '.[zoo]'); skipped")
        return {"seed": seed, "skipped": "no external models"}
    rng = random.Random(seed)
    names = args.only.split(",") if args.only else rng.sample(sorted(have), min(args.models, len(have)))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ar-profiles-") as tmp:
        # (one intra-op thread in every step, the calibration's too: the profiling script runs with one, and what
        # touching new memory costs a byte depends on the threads that touch it: 0.35 ns here on one, 0.2 on two)
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(tmp, "cache"), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if args.malloc == "steady":
            env.update(STEADY_MALLOC)
        print(f"profiles: allocator {args.malloc}", flush=True)
        _cli(["calibrate", "--torch"], env)
        plain_spec = uncorrected_spec(env, tmp)
        cases = []
        for name in names:
            folder = os.path.join(tmp, name)
            os.makedirs(folder)
            with open(os.path.join(folder, "model.py"), "w") as f:
                f.write(MODEL.format(tests=TESTS, name=name))
            _cli(["capture", os.path.join(folder, "model.py") + ":main", "-o", os.path.join(folder, "g.json")],
                 env)
            for style in styles:
                try:
                    c = case(name, style, folder, env, args.repeats, plain_spec)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"  {name:22s} {style:10s} FAILED: {str(exc)[:300]}", flush=True)
                    cases.append({"model": name, "style": style, "failed": str(exc)[:2000]})
                    continue
                c["library"] = have.get(name, "?")
                cases.append(c)
                stated = "-" if c["stated"] is None else f"{c['stated']:.0%}"
                print(f"  {name:22s} {style:10s} measured {c['measured_ns'] / 1e6:8.2f} ms (spread "
                      f"{c['spread']:4.0%})  predicted {c['predicted_ns'] / 1e6:8.2f} ms  error {c['error']:+7.1%}"
                      f" (vs CPU time {c['error_cpu']:+7.1%})  stated {stated}  faults: profiled "
                      f"{c['profiled_faults']}, a timed call {c['faults']:.0f}"
                      + ("" if c.get("error_uncorrected") is None else
                         f"  (first call not corrected: {c['error_uncorrected']:+.1%})"), flush=True)
    ok = [c for c in cases if "error" in c]
    out = {"seed": seed, "models": names, "styles": styles, "malloc": args.malloc, "cases": cases,
           "seconds": time.time() - t0}
    if ok:
        out["all"] = distribution([c["error"] for c in ok])
        out["all_cpu"] = distribution([c["error_cpu"] for c in ok])
        out["by_style"] = {s: distribution([c["error"] for c in ok if c["style"] == s])
                           for s in styles if any(c["style"] == s for c in ok)}
        kinds = sorted({c["kind"] for c in ok})
        out["by_kind"] = {k: dict(distribution([c["error"] for c in ok if c["kind"] == k]),
                                  p80=_p80([c["error"] for c in ok if c["kind"] == k])) for k in kinds}
        libs = sorted({c["library"] for c in ok})
        out["by_library"] = {lib: distribution([c["error"] for c in ok if c["library"] == lib]) for lib in libs}
        plain = [c for c in ok if c.get("error_uncorrected") is not None]
        if plain:  # the same first-call traces and timings, with and without sim.first_call's figures
            out["first_call_ab"] = {"corrected": distribution([c["error"] for c in plain]),
                                    "uncorrected": distribution([c["error_uncorrected"] for c in plain])}
        stated = [c for c in ok if c["covered"] is not None]
        out["coverage"] = [sum(c["covered"] for c in stated), len(stated)]
        print(f"profiles (seed {seed}): {len(ok)} cases, {len(cases) - len(ok)} failed, {out['seconds']:.0f} s")
        print(f"  all         {_fmt(out['all'])}")
        print(f"  (CPU time)  {_fmt(out['all_cpu'])}")
        for s, d in out["by_style"].items():
            print(f"  {s:11s} {_fmt(d)}")
        for lib, d in out["by_library"].items():
            print(f"  {lib:11s} {_fmt(d)}")
        for k, d in out["by_kind"].items():
            print(f"  {k:13s} {_fmt(d)}  p80 {d['p80']:.0%}  (the trace holds: {k})")
        if plain:
            ab = out["first_call_ab"]
            print(f"  first call, corrected    {_fmt(ab['corrected'])}")
            print(f"  first call, uncorrected  {_fmt(ab['uncorrected'])}  (the same traces, the spec without "
                  "sim.first_call's figures)")
        print(f"  stated expected error covered the measured one in {out['coverage'][0]}/{out['coverage'][1]}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
