"""Load + validate time for generated graphs, JSON and YAML, against a plain ``json.loads``.

Prints a table and writes ``bench/results.json`` (key ``load``). Sizes are
node counts of a generated chain-plus-random graph; YAML stops at 1e5 by
default (it is ~60x slower: minutes at 1e6). Run: ``python -m bench``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time

from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph


def best_of(fn, repeat, collector=True):
    """(min, median) seconds of ``fn()`` over ``repeat`` calls. ``collector=False``: the cyclic collector off
    during the call, as the command line loads its graph (``cli.common.load_graph_arg``, which then freezes
    the graph so that no collection ever scans it); a library load leaves it on, and the collector scans the
    new graph's objects at its next collection of the youngest generation (which can fall inside the call)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        if not collector:
            gc.disable()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        if not collector:
            gc.enable()
        del out
    return min(times), statistics.median(times)


def main(sizes=(10_000, 100_000, 1_000_000), yaml_max=100_000, write=True):
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            doc = generate("chain", n=n, op="mul")
            for fmt in ("json", "yaml"):
                if fmt == "yaml" and n > yaml_max:
                    continue
                path = os.path.join(d, f"g{n}.{fmt}")
                with open(path, "wb") as f:
                    f.write(dumps(doc, fmt))
                size = os.path.getsize(path)
                repeat = 3 if n <= 100_000 else 1
                if fmt == "yaml":
                    repeat = 1
                load_min, load_med = best_of(lambda: load_graph(path), repeat)
                cli_min, _ = best_of(lambda: load_graph(path), repeat, collector=False)
                raw = open(path, "rb").read()
                jl_min, _ = best_of(lambda: json.loads(raw), repeat) if fmt == "json" else (None, None)
                nodes = len(doc["nodes"])
                rows.append({"graph": "chain", "nodes": nodes, "format": fmt, "bytes": size, "load_s": load_min,
                             "load_median_s": load_med, "us_per_node": load_min / nodes * 1e6,
                             "cli_load_s": cli_min,
                             "json_loads_s": jl_min,
                             "ratio_to_json_loads": (load_min / jl_min) if jl_min else None})
                r = rows[-1]
                print(f"{nodes:>9} {fmt:>4} {size / 1e6:8.1f} MB  load+validate {load_min:8.3f} s "
                      f"({r['us_per_node']:.2f} us/node; as the command line loads: {cli_min:.3f} s)" +
                      (f"  json.loads {jl_min:.3f} s  ratio {r['ratio_to_json_loads']:.2f}x" if jl_min else ""),
                      flush=True)
    if not write:
        return rows
    out = os.path.join(os.path.dirname(__file__), "results.json")
    results = {}
    if os.path.exists(out):
        try:
            results = json.load(open(out))
        except ValueError:
            results = {}
    results["load"] = rows
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
