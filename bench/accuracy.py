"""``python -m bench accuracy [--seed N] [--graphs N] [--warm N]``: simulation accuracy on held-out graphs.

Nothing here is fixed: the graphs are drawn at run time (``bench.heldout``)
from a seed the run prints (``--seed`` repeats one), and every figure is what
a user's commands give, each in a fresh process:

1. ``autograd-run calibrate`` (into a cache folder of this run's own, so the
   user's ``local`` spec is left alone);
2. per graph, ``autograd-run run G --repeat 1+W --json``: the first pass is
   the *cold* figure (a fresh process's single pass: its code and data
   cold; the device threads start before the clock), the median of the other W the *warm* one;
3. ``autograd-run simulate G --spec local --json``: the prediction of a
   warm pass (``wall_ns``) and of a fresh process's first pass
   (``first_pass_wall_ns``: the warm one plus what ``calibrate`` measured
   a first pass to add, ``sim.first_pass``), with the expected error it
   states. ``cold_unmodelled`` rows compare the warm prediction with the
   cold pass: the error without that model, in the same run.

Before each graph, a *control* is measured the same way: a chain of cost nodes on the CPU alone (drawn
from the run's seed too), which the simulation predicts within a few percent on a quiet machine. Its
error over the run shows how far this machine moved while it ran (on the 2-core VM here the same graph's
warm wall moved by 2x within minutes); each graph's error is also shown against the control measured
just before it (``(1 + error) / (1 + control's error) - 1``: what the machine's drift does to both
cancels), as a second figure beside the one that counts.

It reports the signed error ``(predicted - measured) / measured`` per graph,
its distribution (median of the absolute error, p90, worst, mean signed:
the bias) per family and per device count, cold and warm; whether the
stated expected error covered the measured one; and the ranking agreement of
what-ifs that were also measured: one case per family on 1, 2 and 4 devices,
and the ``pytorch`` against the ``single-thread`` policy (``run
--no-multithreading``). Two settings whose measured times are within
``TIE`` of each other are a tie (their order is noise), as in ``sim_bench``.
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

from bench import heldout

TIE = 0.05
#: Warm passes of the control measured before each graph.
CONTROL_WARM = 5


def _cli(args: list[str], env: dict) -> dict:
    p = subprocess.run([sys.executable, "-m", "autograd_run", *args], env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"autograd-run {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout) if "--json" in args else {"stdout": p.stdout, "stderr": p.stderr}


def measure(path: str, env: dict, warm: int, single_thread: bool = False) -> tuple[float, float]:
    """(cold, warm) wall ns of ``run``: a fresh process's first pass, the median of the next ``warm``."""
    args = ["run", path, "--json", "--no-summary", "--repeat", str(1 + warm)]
    if single_thread:
        args.append("--no-multithreading")
    walls = _cli(args, env)["samples"]["wall_ns"]
    return float(walls[0]), float(statistics.median(walls[1:]))


def predict(path: str, env: dict, policy: str | None = None, spec: str = "local") -> dict:
    args = ["simulate", path, "--spec", spec, "--json", "--no-summary", "--slack", "0"]
    if policy:
        args += ["--policy", policy]
    return _cli(args, env)


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def distribution(errors: list[float]) -> dict:
    a = [abs(e) for e in errors]
    return {"n": len(errors), "mape": statistics.mean(a), "median": statistics.median(a), "p90": _q(a, 0.9),
            "worst": max(errors, key=abs), "bias": statistics.mean(errors)}


def _fmt(d: dict) -> str:
    return (f"n={d['n']:<3} MAPE {d['mape']:6.1%}  median {d['median']:6.1%}  p90 {d['p90']:6.1%}  "
            f"worst {d['worst']:+7.1%}  bias {d['bias']:+6.1%}")


def _same_ranking(real: dict, pred: dict) -> bool:
    return all(pred[a] < pred[b] for a in real for b in real if real[a] < real[b] * (1 - TIE))


def variant_spec(d: str, env: dict, ab: str) -> str:
    """The calibrated ``local`` spec with ``ab``'s changes (``host.cores=0,engine.wait_spin_us=0``), as a file."""
    with open(os.path.join(env["XDG_CACHE_HOME"], "autograd-run", "local-spec.json")) as f:
        spec = json.load(f)
    for item in ab.split(","):
        key, value = item.split("=", 1)
        part, name = key.split(".", 1)
        spec[part][name] = json.loads(value)
    path = os.path.join(d, "variant-spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def bench_accuracy(seed: int | None = None, graphs: int = 32, warm: int = 9, whatifs: bool = True,
                   ab: str | None = None, log=print) -> dict:
    """The module docstring's run; ``ab``: also simulate every graph with the calibrated spec changed so
    (``host.cores=0``: without a mechanism), to show what the mechanism does to the error."""
    seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed
    log(f"(accuracy) seed {seed} (python -m bench accuracy --seed {seed} repeats this run), {graphs} graphs, "
        f"{warm} warm passes each")
    out: dict = {"seed": seed, "rows": [], "whatifs": []}
    with tempfile.TemporaryDirectory(prefix="agr-accuracy-") as d:
        env = dict(os.environ, XDG_CACHE_HOME=os.path.join(d, "cache"))
        env.pop("AUTOGRAD_RUN_PURE_PYTHON", None)
        t = time.perf_counter()
        cal = _cli(["calibrate"], env)
        lines = cal["stdout"].strip().splitlines()
        log(f"(accuracy) calibrate: {time.perf_counter() - t:.1f} s; " + lines[-1])
        log("(accuracy) " + next((line for line in lines if line.startswith("engine:")), "engine: ?"))
        log("(accuracy) " + next((line for line in lines if line.startswith("a fresh process's first pass")),
                                 "a fresh process's first pass: not measured"))
        variant = variant_spec(d, env, ab) if ab else None
        control = os.path.join(d, "control.json")
        with open(control, "w") as f:
            json.dump(heldout.build("chain", random.Random(seed).randrange(1 << 62) ^ 1, 0), f)
        control_pred = predict(control, env)["wall_ns"]
        for i, (family, k, case, doc) in enumerate(heldout.draw(seed, graphs)):
            path = os.path.join(d, f"g{i}.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            control_err = control_pred / measure(control, env, CONTROL_WARM)[1] - 1
            cold, warm_ns = measure(path, env, warm)
            sim_w = predict(path, env)
            # the cold prediction: the warm one plus a fresh process's first pass as calibrate measured it
            # (sim.first_pass); err_cold_unmodelled: the warm prediction against the cold pass, as before that model
            pred_cold = sim_w.get("first_pass_wall_ns") or sim_w["wall_ns"]
            row = {"family": family, "devices": k, "case": case, "nodes": len(doc["nodes"]),
                   "cold_ns": cold, "warm_ns": warm_ns, "pred_warm_ns": sim_w["wall_ns"],
                   "pred_cold_ns": pred_cold, "stated_error": sim_w.get("expected_error", {}).get("relative"),
                   "stated_error_cold": (sim_w.get("first_pass_expected_error") or {}).get("relative")}
            row["err_warm"] = row["pred_warm_ns"] / warm_ns - 1
            row["err_cold"] = row["pred_cold_ns"] / cold - 1
            row["err_cold_unmodelled"] = row["pred_warm_ns"] / cold - 1
            row["control_err"] = control_err
            row["err_warm_vs_control"] = (1 + row["err_warm"]) / (1 + control_err) - 1
            if variant:
                sim_v = predict(path, env, spec=variant)
                row["err_warm_ab"] = sim_v["wall_ns"] / warm_ns - 1
                row["err_cold_ab"] = (sim_v.get("first_pass_wall_ns") or sim_v["wall_ns"]) / cold - 1
            out["rows"].append(row)
            stated = row["stated_error"]
            log(f"(accuracy) {i:>2} {family:<11} k={k} {row['nodes']:>4} nodes  warm {warm_ns / 1e6:7.2f} ms "
                f"pred {row['pred_warm_ns'] / 1e6:7.2f} ({row['err_warm']:+6.1%})  cold {cold / 1e6:7.2f} ms pred "
                f"{row['pred_cold_ns'] / 1e6:7.2f} ({row['err_cold']:+6.1%})"
                + (f"  stated +-{stated:.0%}" if stated is not None else "") + f"  control {control_err:+6.1%}")
        if whatifs:
            out["whatifs"] = _whatifs(seed, d, env, warm, log)
    _report(out, log)
    return out


def _whatifs(seed: int, d: str, env: dict, warm: int, log) -> list[dict]:
    """One case per family measured and simulated on 1, 2 and 4 devices; and pytorch vs single-thread."""
    rnd = random.Random(seed + 1)
    rows = []
    for family in heldout.FAMILIES:
        case = rnd.randrange(1 << 62)
        real, pred = {}, {}
        for k in (1, 2, 4):
            path = os.path.join(d, f"w_{family}_{k}.json")
            with open(path, "w") as f:
                json.dump(heldout.build(family, case, k), f)
            real[f"k={k}"] = measure(path, env, warm)[1]
            pred[f"k={k}"] = predict(path, env)["wall_ns"]
        rows.append(_ranked(f"{family} devices 1/2/4", real, pred, log))
        real = {"pytorch": real["k=2"], "single-thread": measure(path.replace("_4.", "_2."), env, warm, True)[1]}
        pred = {"pytorch": pred["k=2"], "single-thread": predict(path.replace("_4.", "_2."), env,
                                                                 policy="single-thread")["wall_ns"]}
        rows.append(_ranked(f"{family} k=2 policy", real, pred, log))
    return rows


def _ranked(what: str, real: dict, pred: dict, log) -> dict:
    same = _same_ranking(real, pred)
    shown = ", ".join(f"{k} {real[k] / 1e6:.2f}/{pred[k] / 1e6:.2f}" for k in sorted(real, key=real.get))
    log(f"(accuracy) what-if {what:<26} measured/predicted ms: {shown}  {'same' if same else 'DIFFERENT'}")
    return {"what": what, "measured": real, "predicted": pred, "same_ranking": same}


def _report(out: dict, log) -> None:
    rows = out["rows"]
    summary: dict = {}
    for kind in ("warm", "cold", "cold_unmodelled", "warm_ab", "cold_ab", "warm_vs_control"):
        key = f"err_{kind}"
        if key not in rows[0]:
            continue
        summary[kind] = {"all": distribution([r[key] for r in rows])}
        log(f"(accuracy) {kind} all          {_fmt(summary[kind]['all'])}")
        for family in heldout.FAMILIES:
            errs = [r[key] for r in rows if r["family"] == family]
            if errs:
                summary[kind][family] = distribution(errs)
                log(f"(accuracy) {kind} {family:<12} {_fmt(summary[kind][family])}")
        for k in range(5):
            errs = [r[key] for r in rows if r["devices"] == k]
            if errs:
                summary[kind][f"k={k}"] = distribution(errs)
                log(f"(accuracy) {kind} devices={k}    {_fmt(summary[kind][f'k={k}'])}")
    if "control_err" in rows[0]:
        c = sorted(r["control_err"] for r in rows)
        summary["control"] = {"median": statistics.median(c), "min": c[0], "max": c[-1]}
        log(f"(accuracy) the control (a CPU-only chain, before each graph): error median {summary['control']['median']:+.1%}, "
            f"from {c[0]:+.1%} to {c[-1]:+.1%}: how far this machine moved during the run (the warm_vs_control rows "
            "take it out; the warm rows are the figure that counts)")
    stated = [r for r in rows if r["stated_error"] is not None]
    if stated:
        covered = sum(abs(r["err_warm"]) <= r["stated_error"] for r in stated)
        summary["coverage"] = covered / len(stated)
        log(f"(accuracy) the stated expected error covered the warm error in {covered} of {len(stated)} cases "
            f"({summary['coverage']:.0%})")
    stated = [r for r in rows if r.get("stated_error_cold") is not None]
    if stated:
        covered = sum(abs(r["err_cold"]) <= r["stated_error_cold"] for r in stated)
        summary["coverage_cold"] = covered / len(stated)
        log(f"(accuracy) the first pass's stated expected error covered the cold error in {covered} of {len(stated)} "
            f"cases ({summary['coverage_cold']:.0%})")
    if out["whatifs"]:
        same = sum(w["same_ranking"] for w in out["whatifs"])
        summary["rankings_same"] = f"{same}/{len(out['whatifs'])}"
        log(f"(accuracy) what-if rankings the measurements tell apart: {same} of {len(out['whatifs'])} the same")
    out["summary"] = summary


def main(argv: list[str], quick: bool = False) -> dict:
    """``python -m bench accuracy [options]`` (or ``python -m bench.accuracy``); ``quick``: fewer graphs."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m bench accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=None, help="repeat a run (default: drawn and printed)")
    p.add_argument("--graphs", type=int, default=12 if quick else 32, help="graphs drawn (default %(default)s)")
    p.add_argument("--warm", type=int, default=5 if quick else 9, help="warm passes per graph (default %(default)s)")
    p.add_argument("--no-whatifs", action="store_true", help="skip the measured what-ifs")
    p.add_argument("--ab", default=None, metavar="PART.FIELD=JSON,...",
                   help="also simulate with the calibrated spec changed so, e.g. host.cores=0")
    a, _ = p.parse_known_args([x for x in argv if x not in ("accuracy", "--quick", "--full")])
    if a.graphs < 1 or a.warm < 1:
        p.error("--graphs and --warm must be at least 1")
    return bench_accuracy(seed=a.seed, graphs=a.graphs, warm=a.warm, whatifs=not a.no_whatifs, ab=a.ab)


if __name__ == "__main__":
    main(sys.argv[1:])
