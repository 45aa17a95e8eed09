"""YAML loading: our libyaml path against rapidyaml (``ryml``), on a generated chain.

Measures, best of ``--repeat`` in one process:

* ``libyaml``: ``untrusted.load_yaml`` (CSafeLoader compose, the alias /
  depth / duplicate-key checks, construct), what ``load_graph`` does before
  the schema;
* ``ryml``: ``ryml.parse_in_arena`` + ``emit_json`` + ``msgspec`` decode
  (the cheapest way from YAML bytes to the same Python document), when the
  ``rapidyaml`` package is installed (it is not a dependency);
* whether both give the same document.

Run: ``python -m bench.yaml_bench --nodes 10000`` (``pip install rapidyaml``
first for the second line). See docs/performance.md, "YAML".
"""

from __future__ import annotations

import argparse
import time


def best(fn, repeat: int):
    out, t = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return t, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    from autograd_run import untrusted
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import MAX_YAML_DEPTH, MAX_YAML_VALUES

    data = dumps(generate("chain", n=args.nodes), "yaml")
    n = args.nodes
    t_lib, doc = best(lambda: untrusted.load_yaml(data, MAX_YAML_VALUES, MAX_YAML_DEPTH)[1], args.repeat)
    print(f"YAML chain, {n} nodes, {len(data) / 1e6:.1f} MB")
    print(f"  libyaml (CSafeLoader + checks): {t_lib:8.3f} s  {t_lib / n * 1e6:7.1f} us/node")
    try:
        import msgspec
        import ryml
    except ImportError:
        print("  ryml: not installed (pip install rapidyaml)")
        return

    def fast():
        tree = ryml.parse_in_arena(data)
        return msgspec.json.decode(ryml.emit_json_malloc(tree, tree.root_id()))
    t_ryml, other = best(fast, args.repeat)
    print(f"  ryml (parse + emit_json + msgspec): {t_ryml:8.3f} s  {t_ryml / n * 1e6:7.1f} us/node  "
          f"({t_lib / t_ryml:.0f}x faster)")
    print(f"  same document: {other == doc}")


if __name__ == "__main__":
    main()
