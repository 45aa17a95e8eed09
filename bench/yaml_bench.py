"""YAML loading: our libyaml path against rapidyaml (``ryml``), on a generated chain.

Measures, best of ``--repeat`` in one process:

* ``libyaml``: ``untrusted.load_yaml`` (CSafeLoader compose, the alias /
  depth / duplicate-key checks, construct), what ``load_graph`` does before
  the schema;
* ``ryml``: ``ryml.parse_in_arena`` + ``emit_json`` + ``msgspec`` decode
  (the cheapest way from YAML bytes to the same Python document), when the
  ``rapidyaml`` package is installed (it is not a dependency);
* whether both give the same document, and on a list of probe scalars
  (``k: VALUE``) how many type or read differently (YAML 1.1 as PyYAML
  reads it, with our exponent floats, against ryml's YAML 1.2 JSON).

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
    diffs = probe_differences(ryml, msgspec, untrusted)
    print(f"  probe scalars read differently: {len(diffs)} of {len(PROBES)}: {', '.join(diffs)}")


#: Plain scalars whose reading a graph file may depend on (bools, nulls, numbers in their YAML 1.1 spellings).
PROBES = ["yes", "no", "on", "off", "y", "n", "true", "True", "TRUE", "false", "null", "Null", "NULL", "~", "",
          "0777", "0o17", "0x1F", "0b101", "1_000", "1:30", "1.5", "1e5", "1E5", "-1e-3", ".inf", "-.inf", ".nan",
          "inf", "nan", "2001-12-14", "+1", "+1.5", "1.", ".5", "-0", "007", "01.5", "3.0e+5", "'quoted'",
          '"dq"', "a b", "0x", "--1"]


def probe_differences(ryml, msgspec, untrusted) -> list[str]:
    out = []
    for v in PROBES:
        text = f"k: {v}\n".encode()
        try:
            ours = untrusted.load_yaml(text, 1000, 10)[1]["k"]
        except untrusted.Problem:
            ours = "<error>"
        tree = ryml.parse_in_arena(text)
        try:
            theirs = msgspec.json.decode(ryml.emit_json_malloc(tree, tree.root_id()))["k"]
        except msgspec.DecodeError:
            theirs = "<error>"
        same = type(ours) is type(theirs) and (ours == theirs or ours != ours and theirs != theirs)
        if not same:
            out.append(repr(v))
    return out


if __name__ == "__main__":
    main()
