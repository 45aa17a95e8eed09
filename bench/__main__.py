"""`make bench` / `python -m bench [--quick | --full] [a b c d e h f g i j growth accuracy profiles ddp fsdp memory kineto replay]`: benchmarks, ratios within one run.

``accuracy`` (``bench.accuracy``, in ``make bench``'s default parts): the simulation against the engine on
graphs drawn at run time from a seed it prints (``python -m bench accuracy --seed N`` repeats one run;
``python -m bench accuracy --help`` for the rest).

(h) is the simulation with PyTorch-measured costs against PyTorch itself (``bench/profcosts_bench.py``).
``profiles`` (``bench.user_profiles``, in the default parts too): the same on external models (torchvision, timm,
Hugging Face transformers) with profiles made the ways people make them, drawn from a seed it prints.
``ddp`` (``bench.ddp_time``, in the default parts too): ``simulate --ddp --network local-gloo`` against real
DistributedDataParallel on 2 and 4 local gloo processes, cases drawn from a seed it prints.
``fsdp`` (``bench.fsdp_time``, in the default parts too): ``simulate --fsdp captured --network local-gloo`` against
real FSDP2 (``fully_shard``) on 2 and 4 local gloo processes, the same way.
``memory`` (``bench.memory_bench``, in the default parts too): the memory model against PyTorch's CPU allocator
(``profile_memory=True``) on zoo models drawn from a seed it prints.
``replay`` (``bench.replay_external``, in the default parts too): capture and ``check`` on models drawn from
everything timm, torchvision and a list of transformers architectures build here, from a seed it prints.
``kineto`` (``bench.kineto_bench``, in the default parts too): the Kineto trace writer against the Chrome one
at 1e5 nodes (a run and a simulated GPU backward), time and size, and the whole ``simulate --trace`` command.

``--full`` adds the 1e6-node YAML load (about 5 minutes by itself). Parts f, g and i
(``bench.e2e_bench``: the whole command against PyTorch, the trace formats, a traced
1e6-node run) and j (``bench.sim_bench``: the simulation's speed and memory on a 1e6-node
chain, a 2e5-node fan-out and MLP; about 5 minutes) run only when named, and so does ``growth``
(``bench.growth``: time and memory per node of ``validate``, ``run`` and ``simulate`` at 1e4, 1e5 and 1e6
nodes; about 10 minutes; ``--sizes 1e4,1e5`` for others).

Prints a line per measurement and writes bench/results.json. See docs/performance.md.
"""

import json
import os
import sys
import time

from bench import (accuracy, ddp_time, e2e_bench, engine_bench, fsdp_time, growth, kineto_bench, load_bench,
                   memory_bench, profcosts_bench, replay_external, sim_bench, user_profiles)


def main(argv):
    quick = "--quick" in argv
    parts = [a for a in argv if not a.startswith("-")] or ["a", "b", "c", "d", "e", "h", "accuracy", "profiles", "ddp",
                                                             "fsdp", "memory", "kineto", "replay"]
    out = os.path.join(os.path.dirname(__file__), "results.json")
    results = {}
    t = time.time()
    if "a" in parts:
        results["a_vs_torch"] = engine_bench.bench_vs_torch(sizes=(10_000,) if quick else (10_000, 100_000))
    if "b" in parts:
        results["b_tracing"] = engine_bench.bench_tracing(n=20_000 if quick else 100_000)
    if "c" in parts:
        results["c_load"] = load_bench.main(sizes=(10_000, 100_000) if quick else (10_000, 100_000, 1_000_000),
                                            yaml_max=1_000_000 if "--full" in argv else 100_000, write=False)
    if "d" in parts:
        results["d_devices"] = engine_bench.bench_devices(per_device=4 if quick else 8)
    if "e" in parts:
        results["e_million"] = engine_bench.bench_million(n=200_000 if quick else 1_000_000)
    if "h" in parts:
        results["h_profiled_costs"] = profcosts_bench.bench_accuracy(steps=11 if quick else 31)
    if "accuracy" in parts:
        results["accuracy"] = accuracy.main(argv, quick)
    if "profiles" in parts:
        results["profiles"] = user_profiles.main(argv, quick)
    if "ddp" in parts:
        results["ddp"] = ddp_time.main(argv, quick)
    if "fsdp" in parts:
        results["fsdp"] = fsdp_time.main(argv, quick)
    if "memory" in parts:
        results["memory"] = memory_bench.main(argv, quick)
    if "kineto" in parts:
        results["kineto"] = kineto_bench.main(argv, quick)
    if "replay" in parts:
        results["replay"] = replay_external.main(argv, quick)
    if "f" in parts:
        results["f_e2e"] = e2e_bench.bench_e2e(n=20_000 if quick else 200_000)
    if "g" in parts:
        results["g_trace"] = e2e_bench.bench_trace(n=20_000 if quick else 100_000)
    if "i" in parts:
        results["i_million_trace"] = e2e_bench.bench_million_trace(n=200_000 if quick else 1_000_000)
    if "j" in parts:
        results["j_sim_speed"] = sim_bench.bench_speed(
            shapes=(("chain_mul", 200_000),) if quick else sim_bench.SPEED_SHAPES, rounds=1 if quick else 3)
    if "growth" in parts:
        results["growth"] = growth.main(argv, quick)
    results["seconds"] = time.time() - t
    print_table(results)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out} ({results['seconds']:.0f} s)")


def print_table(results: dict) -> None:
    """One line per measurement: what, the value, the goal, and whether this run met it."""
    from rich.console import Console
    from rich.table import Table
    t = Table(title="autograd-run benchmarks (ratios measured within this run)")
    for c in ("measure", "value", "goal", "met"):
        t.add_column(c)

    def row(measure: str, value: str, goal: str = "", ok: bool | None = None) -> None:
        t.add_row(measure, value, goal, "" if ok is None else ("yes" if ok else "NO"))

    for r in results.get("a_vs_torch", []):
        row(f"(a) {r['shape']} n={r['n']} mt={'on' if r['multithreading'] else 'off'}",
            f"{r['ours_us_per_node']:.2f} vs {r['torch_us_per_node']:.2f} us/node = {r['ratio']:.2f}x", "<= 1.0x",
            r["ratio"] <= 1.0)
    if "kineto" in results:
        k = results["kineto"]
        for case in ("run", "simulated_gpu"):
            r = k[case]
            row(f"(kineto) {k['nodes']} nodes, {case}: Kineto writer vs Chrome", f"{r['time_ratio']:.2f}x time, "
                f"{r['size_ratio']:.2f}x size", "<= 1.3x both", max(r["time_ratio"], r["size_ratio"]) <= 1.3)
        row("(kineto) simulate --trace x.kineto.json vs x.json", f"{k['command']['ratio']:.2f}x")
    if "b_tracing" in results:
        b = results["b_tracing"]
        row(f"(b) tracing on/off, {b['n']} nodes", f"{b['ratio']:.2f}x", "<= 1.3x", b["ratio"] <= 1.3)
    for r in results.get("c_load", []):
        if r["nodes"] >= 100_000 and r["nodes"] < 1_000_000:
            json_ = r["format"].lower() == "json"
            cli = r.get("cli_load_s", r["load_s"])  # the command line's load (collector off, graph frozen)
            row(f"(c) load {r['format']} {r['nodes']} nodes", f"{cli:.3f} s as the command loads; library "
                f"{r['load_s']:.3f} s" + (f" ({r['ratio_to_json_loads']:.2f}x json.loads)"
                                          if r.get("ratio_to_json_loads") else ""),
                "<= 0.5 s" if json_ else "", cli <= 0.5 if json_ else None)
    if "d_devices" in results:
        d = results["d_devices"]
        row(f"(d) 2 virtual devices vs 1, {d['matmuls']} matmuls {d['size']}^2", f"{d['speedup']:.2f}x", ">= 1.8x",
            d["speedup"] >= 1.8)
    if "e_million" in results:
        e = results["e_million"]
        row(f"(e) {e['nodes']} nodes", f"{e['us_per_node']:.2f} us/node, {e['run_peak_bytes_per_node']:.0f} B/node",
            "<= 1.5 KB/node", e["run_peak_bytes_per_node"] <= 1536)
    if "h_profiled_costs" in results:
        h = results["h_profiled_costs"]
        for r in h["rows"]:
            row(f"(h) {r['model']} ({r['nodes']} nodes), simulated vs PyTorch",
                f"{r['predicted_us']:.0f} vs {r['torch_cpu_us']:.0f} us: {r['error_cpu']:+.1%}")
        row("(h) mean abs. error, measured costs", f"{h['mape_cpu']:.1%}", "<= 10% (goal 5%)", h["mape_cpu"] <= 0.10)
        row(f"(h) held out ({h['held_out']}), analytic costs", f"{h['held_out_error_cpu']:+.1%}")
    if "all" in results.get("profiles", {}):
        pr = results["profiles"]
        d = pr["all"]
        row(f"(profiles) external models, user-made profiles, seed {pr['seed']}",
            f"MAPE {d['mape']:.1%}, p90 {d['p90']:.1%}, worst {d['worst']:+.1%}, bias {d['bias']:+.1%}",
            "MAPE <= 10%", d["mape"] <= 0.10)
        for kind, k in pr.get("by_kind", {}).items():
            row(f"(profiles) trace holds {kind}", f"MAPE {k['mape']:.1%}, p80 {k['p80']:.0%}, n={k['n']}")
    mem = results.get("memory", {})
    for key, label in (("end", "left at the end"), ("growth", "growth at the peak"),
                       ("growth_1mib_plus", "growth at the peak, passes growing >= 1 MiB")):
        if key in mem:
            d = mem[key]
            row(f"(memory) {label} vs PyTorch's allocator, seed {mem['seed']}",
                f"n={d['n']} median {d['median']:.2%}, p90 {d['p90']:.1%}, worst {d['worst']:+.1%}, "
                f"bias {d['bias']:+.1%}")
    if "accuracy" in results:
        a = results["accuracy"]
        for kind in ("warm", "cold"):
            d = a["summary"][kind]["all"]
            row(f"(accuracy) held-out graphs, {kind}, seed {a['seed']}",
                f"MAPE {d['mape']:.1%}, p90 {d['p90']:.1%}, worst {d['worst']:+.1%}, bias {d['bias']:+.1%}",
                "MAPE <= 5%, p90 <= 10%", d["mape"] <= 0.05 and d["p90"] <= 0.10)
        if "coverage" in a["summary"]:
            row("(accuracy) stated error covers the measured", f"{a['summary']['coverage']:.0%}", ">= 80%",
                a["summary"]["coverage"] >= 0.8)
        if "rankings_same" in a["summary"]:
            row("(accuracy) what-if rankings the same", a["summary"]["rankings_same"])
    for r in results.get("f_e2e", []):
        w = r["wall"]
        row(f"(f) run - validate, {r['shape']} {r['nodes']} nodes",
            f"{w['ours_us_per_node']:.2f} vs {w['torch_us_per_node']:.2f} us/node = {w['ratio']:.2f}x", "<= 1.0x",
            w["ratio"] <= 1.0)
    if "g_trace" in results:
        g = results["g_trace"]
        size_goal = {".json": 500, ".pftrace": 200}
        for fmt, r in g["formats"].items():
            ext = fmt if fmt.startswith(".") else "." + fmt
            goal = size_goal.get(ext)
            row(f"(g) --trace x{fmt}, {g['nodes']} nodes, size", f"{r['bytes_per_node']:.0f} B/node",
                f"<= {goal} B/node" if goal else "", r["bytes_per_node"] <= goal if goal else None)
            row(f"(g) --trace x{fmt}, {g['nodes']} nodes, whole command with/without",
                f"{r['command_wall_ratio']:.2f}x (the run alone {r['wall_ratio']:.2f}x)", "<= 1.3x",
                r["command_wall_ratio"] <= 1.3)
    if "i_million_trace" in results:
        i = results["i_million_trace"]
        row(f"(i) {i['nodes']} nodes, --trace x{i['format']}, peak memory",
            f"{i['peak_bytes_per_node']:.0f} B/node RSS, {i['tracemalloc_peak_bytes_per_node']:.0f} B/node tracemalloc",
            "<= 2 KB/node", i["peak_bytes_per_node"] <= 2048)
        row(f"(i) {i['nodes']} nodes, --trace x{i['format']}, wall with/without", f"{i['wall_ratio']:.2f}x", "<= 2x",
            i["wall_ratio"] <= 2.0)
    for r in results.get("j_sim_speed", []):
        goal = r is results["j_sim_speed"][0] and r["nodes"] >= 1_000_000
        row(f"(j) simulate --no-summary - validate, {r['shape']} {r['nodes']} nodes",
            f"{r['no_summary_wall_s']:.2f} s ({r['no_summary_us_per_node']:.2f} us/node; with the summary "
            f"{r['summary_wall_s']:.2f} s)", f"<= {sim_bench.SPEED_GOAL_S:.0f} s" if goal else "",
            r["no_summary_wall_s"] <= sim_bench.SPEED_GOAL_S if goal else None)
        row(f"(j) simulate, {r['shape']} {r['nodes']} nodes, memory beyond the graph",
            f"{r['no_summary_peak_bytes_per_node']:.0f} B/node (with the summary "
            f"{r['summary_peak_bytes_per_node']:.0f}; peak RSS {r['summary_rss_bytes_per_node']:.0f} B/node)",
            f"<= {sim_bench.MEMORY_GOAL_BYTES} B/node", r["summary_peak_bytes_per_node"] <= sim_bench.MEMORY_GOAL_BYTES)
    if t.row_count:  # (replay and others report their own lines; no empty table after them)
        Console().print(t)

if __name__ == "__main__":
    main(sys.argv[1:])
