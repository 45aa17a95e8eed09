"""The whole command as a user meets it: ``autograd-run run`` minus ``validate`` against PyTorch.

Each measurement runs the real command in a subprocess (``python -m
autograd_run.cli.main``) on a generated graph file, as a user does, and
subtracts ``validate`` on the same file (start-up, imports and loading are
the same in both, so the difference is what ``run`` adds: preparing the
state, the backward, recording, the summary, a trace, exit). PyTorch's
backward of the same shape is timed in this process in the same rounds.

Rounds interleave the commands (validate, run, ..., PyTorch) so that load
on the shared machine hits every side alike; each figure is a median over
the rounds. Wall time is what a user waits for; CPU time (user + system of
the child, or of PyTorch's thread) is reported beside it because it is far
less disturbed by other processes on a busy machine.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.engine_bench import in_thread
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = ("chain_mul", "chain_add", "fanout", "mlp")


def graph_doc(shape: str, n: int) -> dict:
    """The generated graph of about ``n`` nodes of ``shape`` (as ``engine_bench.our_graph``)."""
    if shape == "chain_mul":
        return generate("chain", n=n, op="mul")
    if shape == "chain_add":
        return generate("chain", n=n, op="add")
    if shape == "fanout":
        return generate("fanout", width=n // 2)
    return generate("mlp", layers=max(1, n // 5), width=1, batch=1, in_features=1)


def write_graph(shape: str, n: int, folder: str) -> tuple[str, int]:
    doc = graph_doc(shape, n)
    path = os.path.join(folder, f"{shape}_{n}.json")
    with open(path, "wb") as f:
        f.write(dumps(doc, "json"))
    return path, len(doc["nodes"])


@functools.cache
def compiled() -> None:
    """The package's bytecode written once (``__pycache__``), as an installed package has it: where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on our CI machines), every command would otherwise compile
    each module changed since its last cache, ~0.3 s more for ``run`` than for ``validate``."""
    import compileall
    compileall.compile_dir(os.path.join(ROOT, "autograd_run"), quiet=1)


def command(args: list[str]) -> dict:
    """Run ``autograd-run ARGS`` in a subprocess: wall s, CPU s (user + sys), peak RSS bytes. The command is
    started by ``bench.spawn`` (a fresh, small process), so that its peak RSS is its own and not this
    process's (see there)."""
    compiled()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        p = subprocess.run([sys.executable, "-m", "bench.spawn", out.name, sys.executable, "-m",
                            "autograd_run.cli.main", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env, cwd=ROOT)
        figures = json.load(out)
    code = figures.pop("returncode")
    if p.returncode != 0 or code != 0:
        err = p.stderr.decode(errors="replace")
        raise RuntimeError(f"autograd-run {' '.join(args)} failed ({code}): {err[-2000:]}")
    return figures


def torch_backward(shape: str, n: int) -> dict:
    """PyTorch's backward of the same shape (built before the clock): wall s, CPU s of its thread, nodes."""
    from bench.engine_bench import torch_build, torch_count

    def one():
        y = torch_build(shape, n)
        nodes = torch_count(shape, n, y)
        t, c = time.perf_counter(), time.thread_time()
        y.backward()
        return {"wall": time.perf_counter() - t, "cpu": time.thread_time() - c, "nodes": nodes}
    return in_thread(one)


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def bench_e2e(n: int = 200_000, rounds: int = 3, shapes=SHAPES) -> list[dict]:
    """Goal 1: ``run`` (default options, summary printed) minus ``validate`` against PyTorch, per node."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        for shape in shapes:
            path, nodes = write_graph(shape, n, d)
            val, run, quiet, pt = [], [], [], []
            for r in range(rounds):
                steps = [lambda: val.append(command(["validate", path])),
                         lambda: run.append(command(["run", path])),
                         lambda: quiet.append(command(["run", path, "--no-summary"])),
                         lambda: pt.append(torch_backward(shape, n))]
                for k in range(len(steps)):  # rotate the order each round
                    steps[(k + r) % len(steps)]()
            row = {"shape": shape, "nodes": nodes, "torch_nodes": pt[0]["nodes"], "rounds": rounds}
            for metric in ("wall", "cpu"):
                base = med(val, metric)
                t_us = med(pt, metric) / row["torch_nodes"] * 1e6
                ours = (med(run, metric) - base) / nodes * 1e6
                ours_q = (med(quiet, metric) - base) / nodes * 1e6
                row[metric] = {"validate_s": base, "run_s": med(run, metric), "run_no_summary_s": med(quiet, metric),
                               "ours_us_per_node": ours, "ours_no_summary_us_per_node": ours_q,
                               "torch_us_per_node": t_us, "ratio": ours / t_us, "ratio_no_summary": ours_q / t_us,
                               "spread": _spread(run, metric)}
            out.append(row)
            w, c = row["wall"], row["cpu"]
            print(f"(1) {shape:>9} {nodes} nodes: run-validate {w['ours_us_per_node']:6.2f} us/node "
                  f"(--no-summary {w['ours_no_summary_us_per_node']:.2f}), torch {w['torch_us_per_node']:.2f}: "
                  f"{w['ratio']:.2f}x wall, {c['ratio']:.2f}x cpu ({c['ours_us_per_node']:.2f} vs "
                  f"{c['torch_us_per_node']:.2f} us/node cpu)", flush=True)
    return out


def _spread(rows: list[dict], metric: str) -> float:
    """(max - min) / median of a measurement over the rounds: how noisy it was."""
    xs = [r[metric] for r in rows]
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m else 0.0


def bench_trace(n: int = 200_000, rounds: int = 3, formats=(".json", ".pftrace", ".json.gz")) -> dict:
    """Goals 3 and 4: the same run with and without a trace (minus validate), and trace bytes per node."""
    with tempfile.TemporaryDirectory() as d:
        path, nodes = write_graph("chain_mul", n, d)
        runs: dict[str, list] = {"validate": [], "plain": [], "summary": []}
        for f in formats:
            runs[f] = []
        sizes = {}

        def traced(fmt):
            t = os.path.join(d, "trace" + fmt)
            runs[fmt].append(command(["run", path, "--no-summary", "--trace", t]))
            sizes[fmt] = os.path.getsize(t)
            os.remove(t)
        for r in range(rounds):
            steps = [lambda: runs["validate"].append(command(["validate", path])),
                     lambda: runs["plain"].append(command(["run", path, "--no-summary"])),
                     lambda: runs["summary"].append(command(["run", path]))]
            steps += [lambda f=f: traced(f) for f in formats]
            for k in range(len(steps)):
                steps[(k + r) % len(steps)]()
    res = {"nodes": nodes, "rounds": rounds, "formats": {}}
    for metric in ("wall", "cpu"):
        base = med(runs["validate"], metric)
        plain = med(runs["plain"], metric) - base
        res[f"plain_{metric}_s"] = plain
        res[f"summary_{metric}_ratio"] = (med(runs["summary"], metric) - base) / plain
        for f in formats:
            r = res["formats"].setdefault(f, {})
            r[f"{metric}_ratio"] = (med(runs[f], metric) - base) / plain
            r[f"command_{metric}_ratio"] = med(runs[f], metric) / med(runs["plain"], metric)
    for f in formats:
        res["formats"][f]["bytes_per_node"] = sizes[f] / nodes
        r = res["formats"][f]
        print(f"(3/4) {nodes}-node chain, --trace x{f}: {r['wall_ratio']:.2f}x wall, {r['cpu_ratio']:.2f}x cpu "
              f"of the run without a trace (--no-summary; the whole command {r['command_wall_ratio']:.2f}x wall, "
              f"{r['command_cpu_ratio']:.2f}x cpu); {r['bytes_per_node']:.0f} B/node", flush=True)
    print(f"(3) the summary alone: {res['summary_wall_ratio']:.2f}x wall, {res['summary_cpu_ratio']:.2f}x cpu",
          flush=True)
    return res


def bench_million_trace(n: int = 1_000_000, fmt: str = ".pftrace") -> dict:
    """Goal 5: a 1e6-node run with a trace: peak memory per node and time against the same run without."""
    with tempfile.TemporaryDirectory() as d:
        path, nodes = write_graph("chain_mul", n, d)
        t = os.path.join(d, "trace" + fmt)
        val = command(["validate", path])
        bare = command(["run", path, "--no-summary"])  # no recorder at all
        plain = command(["run", path])  # the recorder runs for the summary: the trace is the difference
        traced = command(["run", path, "--trace", t])
        size = os.path.getsize(t)
        traced_mem = traced_memory(path, t)
    r = {"nodes": nodes, "format": fmt, "validate": val, "bare": bare, "plain": plain, "traced": traced,
         "peak_bytes_per_node": traced["rss"] / nodes, "plain_peak_bytes_per_node": plain["rss"] / nodes,
         "bare_peak_bytes_per_node": bare["rss"] / nodes, "bare_wall_ratio": traced["wall"] / bare["wall"],
         "wall_ratio": traced["wall"] / plain["wall"], "cpu_ratio": traced["cpu"] / plain["cpu"],
         "trace_bytes_per_node": size / nodes, **traced_mem}
    print(f"(5) {nodes} nodes, run --trace x{fmt}: {traced['wall']:.1f} s vs {plain['wall']:.1f} s without "
          f"({r['wall_ratio']:.2f}x wall, {r['cpu_ratio']:.2f}x cpu; {bare['wall']:.1f} s with --no-summary); "
          f"peak RSS {r['peak_bytes_per_node']:.0f} B/node (without a trace {r['plain_peak_bytes_per_node']:.0f}, "
          f"--no-summary {r['bare_peak_bytes_per_node']:.0f}); tracemalloc: graph "
          f"{r['tracemalloc_graph_bytes_per_node']:.0f} B/node, peak after loading "
          f"{r['tracemalloc_peak_bytes_per_node']:.0f} B/node (loading {r['tracemalloc_load_peak_bytes_per_node']:.0f}); "
          f"trace {r['trace_bytes_per_node']:.0f} B/node", flush=True)
    return r


def traced_memory(graph: str, trace: str) -> dict:
    """Python's own count of the memory of ``run GRAPH --trace TRACE`` (tracemalloc, in a subprocess: the
    way (e) measures a run), per node: the loaded graph, the peak while loading, the peak after it."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "bench.e2e_bench", "tracemalloc", graph, trace], env=env, cwd=ROOT,
                         capture_output=True, check=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def _tracemalloc_run(graph: str, trace: str) -> dict:
    import tracemalloc

    import numpy as np

    from autograd_run.graphs.load import load_graph
    from autograd_run.session import RunOptions, run_session
    tracemalloc.start()
    g = load_graph(graph)
    graph_bytes, load_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    with np.errstate(over="ignore"):  # 1.0001 ** 1e6 overflows float32; the work is the same
        run_session(g, RunOptions(trace_path=trace))
    _, peak = tracemalloc.get_traced_memory()
    n = len(g.nodes)
    return {"tracemalloc_graph_bytes_per_node": graph_bytes / n, "tracemalloc_load_peak_bytes_per_node": load_peak / n,
            "tracemalloc_peak_bytes_per_node": peak / n}


if __name__ == "__main__":
    if sys.argv[1:2] == ["tracemalloc"]:
        print(json.dumps(_tracemalloc_run(sys.argv[2], sys.argv[3])))
