"""`make bench`: run the benchmarks (one run, ratios within it)."""

from bench import load_bench

if __name__ == "__main__":
    load_bench.main()
