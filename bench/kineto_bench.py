"""`python -m bench kineto`: the Kineto trace writer against the Chrome JSON writer on the same recordings, at 1e5
nodes: a real run of a chain (CPU nodes only) and a simulated GPU backward (every node a kernel: launch, kernel
and flow events besides the node's span). Writer time (median of ``rounds`` in this process), file size, and
the whole command a user types (``simulate ... --trace x.json`` against ``--trace x.kineto.json``, fresh
processes). Goal (issue 35): the Kineto writer at most 1.3x the Chrome writer's time and size."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from bench.e2e_bench import command


def _writers(rec, d: str, rounds: int) -> dict:
    from autograd_run.traces.chrome import write_chrome_trace
    from autograd_run.traces.kineto import write_kineto_trace
    out = {}
    for name, write, path in (("chrome", write_chrome_trace, os.path.join(d, "t.json")),
                              ("kineto", write_kineto_trace, os.path.join(d, "t.kineto.json"))):
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            write(path, rec)
            times.append(time.perf_counter() - t)
        out[name] = {"s": statistics.median(times), "bytes": os.path.getsize(path)}
    out["time_ratio"] = out["kineto"]["s"] / out["chrome"]["s"]
    out["size_ratio"] = out["kineto"]["bytes"] / out["chrome"]["bytes"]
    return out


def main(argv=(), quick: bool = False) -> dict:
    from autograd_run.graphs import generators
    from autograd_run.graphs.load import load_graph
    from autograd_run.session import RunOptions, run_session
    from autograd_run.sim.session import SimOptions, simulate_session
    n = 20_000 if quick else 100_000
    rounds = 3 if quick else 5
    res = {"nodes": n}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "chain.json")
        with open(path, "w") as f:
            json.dump(generators.chain(n), f)
        g = load_graph(path)
        run = run_session(g, RunOptions(profile=True)).recording
        res["run"] = _writers(run, d, rounds)
        sim = simulate_session(load_graph(path), SimOptions(spec="h100", devices=1, placement="round-robin",
                                                            detail=True)).recording
        res["simulated_gpu"] = _writers(sim, d, rounds)
        res["kernels"] = len(sim.kernels)
        cmds = {}
        for fmt in ("json", "kineto.json"):
            walls = [command(["simulate", path, "--devices", "1", "--spec", "h100", "--no-summary", "--no-memory",
                              "--trace", os.path.join(d, "c." + fmt)])["wall"] for _ in range(3)]
            cmds[fmt] = statistics.median(walls)
        res["command"] = {"chrome_s": cmds["json"], "kineto_s": cmds["kineto.json"],
                          "ratio": cmds["kineto.json"] / cmds["json"]}
    for k in ("run", "simulated_gpu"):
        r = res[k]
        print(f"(kineto) {n} nodes, {k}: writer {r['kineto']['s']:.3f} s vs Chrome {r['chrome']['s']:.3f} s "
              f"({r['time_ratio']:.2f}x), {r['kineto']['bytes'] / n:.0f} vs {r['chrome']['bytes'] / n:.0f} B/node "
              f"({r['size_ratio']:.2f}x)", flush=True)
    c = res["command"]
    print(f"(kineto) simulate --trace, whole command: {c['kineto_s']:.2f} s vs {c['chrome_s']:.2f} s "
          f"({c['ratio']:.2f}x)", flush=True)
    return res


if __name__ == "__main__":
    import sys
    main(sys.argv[1:], "--quick" in sys.argv)
