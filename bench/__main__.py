"""`make bench` / `python -m bench [--quick] [a b c d e]`: benchmarks, ratios within one run.

Prints a line per measurement and writes bench/results.json. See docs/performance.md.
"""

import json
import os
import sys
import time

from bench import engine_bench, load_bench


def main(argv):
    quick = "--quick" in argv
    parts = [a for a in argv if not a.startswith("-")] or ["a", "b", "c", "d", "e"]
    out = os.path.join(os.path.dirname(__file__), "results.json")
    results = {}
    t = time.time()
    if "a" in parts:
        results["a_vs_torch"] = engine_bench.bench_vs_torch(sizes=(10_000,) if quick else (10_000, 100_000))
    if "b" in parts:
        results["b_tracing"] = engine_bench.bench_tracing(n=20_000 if quick else 100_000)
    if "c" in parts:
        results["c_load"] = load_bench.main(sizes=(10_000, 100_000) if quick else (10_000, 100_000, 1_000_000),
                                            write=False)
    if "d" in parts:
        results["d_devices"] = engine_bench.bench_devices(per_device=4 if quick else 8)
    if "e" in parts:
        results["e_million"] = engine_bench.bench_million(n=200_000 if quick else 1_000_000)
    results["seconds"] = time.time() - t
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
