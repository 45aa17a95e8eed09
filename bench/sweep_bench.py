"""Sweep benchmark: 200 simulated grid points over 5 generated graphs, Dask against one process, warm cache.

``python -m bench.sweep_bench [--repeat N] [--workers K] [--out FILE]``

Per repeat, in this order (the order alternates between repeats so that a
change in the machine's load does not always favour the same side):

* ``sequential``: the grid in this process, one point after another
  (``run_sweep(workers=0)``, no cache: the same per-point code, no Dask);
* ``cold``: the grid on an embedded LocalCluster of K worker processes with an
  empty cache, timed from the library call to its return, so it includes
  starting and closing the cluster (``cold_work`` is the same run from the
  moment the workers were up);
* ``warm``: the same sweep again with the cache the cold run filled (the
  cluster is not started: every point is a hit).

Before each repeat, a control: a pure-Python loop run K times in this process
against once in each of K processes, the speed-up an ideal parallel job gets
from the machine at that moment (about 2x on an idle 2-core machine; much
less when other work shares it). Each timing includes building the grid (finding and hashing the graphs). The
results of ``sequential`` and ``cold`` must be identical (the simulation is
deterministic); the script stops if they are not. It also sums the CPU time
of the points themselves (each point's thread) in one process and on the
workers: a figure the machine's load hardly moves, which shows what running
on Dask adds to the work itself. Prints the medians, the
minimum and maximum of each ratio, and writes every figure as JSON.

Graphs (about 500 to 4000 nodes): two random DAGs, a
transformer, an MLP and a chain; grid per graph: devices 1, 2, 4, 8 x
placement greedy, round-robin x policy pytorch, fifo, critical-path,
predicted-order, single-thread = 40 points.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

GRAPHS = {"random-a.json": ("random", dict(nodes=800, leaves=80, seed=1)),
          "random-b.json": ("random", dict(nodes=700, leaves=70, seed=2)),
          "transformer.json": ("transformer", dict(layers=24, seed=3)),
          "mlp.json": ("mlp", dict(layers=96, width=64, seed=4)),
          "chain.json": ("chain", dict(n=4000, seed=5))}
GRID = {"devices": [1, 2, 4, 8], "placement": ["greedy", "round-robin"],
        "policy": ["pytorch", "fifo", "critical-path", "predicted-order", "single-thread"], "spec": ["h100"]}


def write_inputs(folder: str) -> str:
    import yaml
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    for name, (kind, kw) in GRAPHS.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(dumps(generate(kind, **kw), "json"))
    path = os.path.join(folder, "sweep.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"graphs": list(GRAPHS), **GRID}, f)
    return path


def one(spec_path: str, cache: str, **kw) -> tuple[float, float, object]:
    """(seconds from the call, seconds from when the workers were up, report)."""
    from autograd_run.sweep.evaluate import LOADED
    from autograd_run.sweep.grid import build_grid
    from autograd_run.sweep.runner import SweepOptions, run_sweep
    from autograd_run.sweep.spec import read_spec_file
    LOADED.clear()  # no graph kept from an earlier run in this process
    started = {}
    t = time.perf_counter()
    report = run_sweep(build_grid(read_spec_file(spec_path)),
                       SweepOptions(cache_dir=cache, on_start=lambda *a: started.setdefault("t", time.perf_counter()),
                                    **kw))
    end = time.perf_counter()
    if report.failed or report.cancelled:
        sys.exit(f"the sweep had {report.failed} failed and {report.cancelled} cancelled points")
    return end - t, end - started.get("t", t), report


def _spin(n: int) -> float:
    t = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t


def control(workers: int, n: int = 4_000_000) -> float:
    """What the machine gives right now: ``workers`` copies of a pure-Python loop, one after another in this
    process against at once in ``workers`` processes (an ideal parallel job; about 2x on an idle 2-core machine)."""
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_spin, [1000] * workers)  # the processes are up before timing
        t = time.perf_counter()
        pool.map(_spin, [n] * workers)
        par = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(workers):
        _spin(n)
    return (time.perf_counter() - t) / par


def stable(rows):
    return [{k: v for k, v in r.items() if k not in ("compute_s", "cpu_s", "cached")} for r in rows]


def main(argv: list[str]) -> dict:
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 3
    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 2
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    import distributed  # noqa: F401  (imported once, before any timing: about a second, paid by the CLI too)
    runs = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        spec_path = write_inputs(tmp)
        for r in range(repeat):
            cache = os.path.join(tmp, f"cache{r}")
            res = {"control": control(workers), "load_average": os.getloadavg()[0]}
            order = ("sequential", "dask") if r % 2 == 0 else ("dask", "sequential")
            for what in order:
                if what == "sequential":
                    res["sequential"], _, seq = one(spec_path, os.path.join(tmp, f"seq{r}"), workers=0,
                                                    use_cache=False)
                else:
                    res["cold"], res["cold_work"], cold = one(spec_path, cache, workers=workers)
                    res["warm"], _, warm = one(spec_path, cache, workers=workers)
                    assert warm.cached == len(warm.rows) and warm.ran_on == "cache"
            assert len(seq.rows) == 200
            if stable(seq.rows) != stable(cold.rows) or stable(warm.rows) != stable(cold.rows):
                sys.exit("the Dask results differ from the sequential ones")
            # CPU seconds of the points themselves (their threads), summed: what the work costs wherever it runs.
            res["cpu_sequential"] = sum(r["cpu_s"] for r in seq.rows)
            res["cpu_workers"] = sum(r["cpu_s"] for r in cold.rows)
            res.update(speedup=res["sequential"] / res["cold"], speedup_work=res["sequential"] / res["cold_work"],
                       warm_ratio=res["cold"] / res["warm"], ran_on=cold.ran_on)
            runs.append(res)
            print(f"run {r + 1}/{repeat}: sequential {res['sequential']:.1f} s, dask cold {res['cold']:.1f} s "
                  f"({res['cold_work']:.1f} s once the workers were up), warm {res['warm'] * 1e3:.0f} ms: "
                  f"speed-up {res['speedup']:.2f}x ({res['speedup_work']:.2f}x), warm {res['warm_ratio']:.0f}x faster; "
                  f"an ideal parallel job got {res['control']:.2f}x (load average {res['load_average']:.1f}); "
                  f"CPU of the points {res['cpu_sequential']:.1f} s in one process, {res['cpu_workers']:.1f} s on the "
                  "workers", flush=True)
    summary = {"points": 200, "graphs": len(GRAPHS), "workers": workers, "cpus": os.cpu_count(),
               "load_average": os.getloadavg(), "runs": runs}
    for k in ("sequential", "cold", "cold_work", "warm", "speedup", "speedup_work", "warm_ratio", "control", "cpu_sequential",
              "cpu_workers"):
        vals = [r[k] for r in runs]
        summary[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    s = summary
    print(f"median of {repeat}: speed-up {s['speedup']['median']:.2f}x (min {s['speedup']['min']:.2f}, max "
          f"{s['speedup']['max']:.2f}; goal >= 1.8x), without cluster start {s['speedup_work']['median']:.2f}x; "
          f"warm cache {s['warm_ratio']['median']:.0f}x faster than cold (min {s['warm_ratio']['min']:.0f}; goal >= 20x); "
          f"an ideal parallel job: {s['control']['median']:.2f}x")
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
