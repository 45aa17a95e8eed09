"""``python -m bench growth [--sizes 1e4,1e5,1e6] [--rounds N] [--shapes chain,mlp] [--commands validate,...]``:
how the whole commands' time and memory grow (ten million nodes: ``--sizes 1e7 --shapes chain``, ~10 minutes).

For each size and shape (``gen chain`` and ``gen mlp --width 1``, JSON), every command as a user types it,
each in a fresh process started from a small one (``bench.spawn``, so the peak RSS is the command's own):

``validate``                      load + every check;
``run --no-summary``              the backward pass on the engine (multithreading off: the CPU graph's worker);
``simulate --no-summary``         the simulation on the file's devices;
``simulate``                      with the summary and its slack what-ifs;
``simulate --devices 2 --placement layer --no-summary``  placed on two virtual GPUs (copies where edges
                                  cross): the simulation's event loop.

Prints, per command, µs/node and KB/node of peak RSS at each size beyond what the same command takes on a
100-node graph of the shape (the interpreter starting and importing, ~0.3-0.5 s and ~120 MB here), and the
growth of that time per node from one size to the next (1.00: linear). The median of three rounds below 1e6
nodes, one round at 1e6 and above (``--rounds N`` for every size).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

from bench.e2e_bench import command

COMMANDS = {
    "validate": ["validate"],
    "run": ["run", "--no-summary", "--no-multithreading"],
    "simulate": ["simulate", "--no-summary"],
    "simulate+summary": ["simulate"],
    "simulate 2 GPUs": ["simulate", "--no-summary", "--devices", "2", "--placement", "layer"],
}
SHAPES = {"chain": lambda n: ["chain", "--size", str(n)],
          "mlp": lambda n: ["mlp", "--size", str(n // 5), "--width", "1"]}


BASE = 100


def count_nodes(path: str) -> int:
    """The nodes of a generated JSON file (each node's object starts with its id), read a block at a time:
    no decoding of a ten-million-node file in this process."""
    n, tail = 0, b""
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            data = tail + block
            n += data.count(b'{"id":')
            tail = data[-5:]
    return n


def measure(sizes=(10_000, 100_000, 1_000_000), rounds: int | None = None, shapes=("chain", "mlp"),
            commands=tuple(COMMANDS)) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            base: dict = {}
            for n in (BASE, *sizes):
                path = os.path.join(tmp, f"{shape}-{n}.json")
                command(["gen", *SHAPES[shape](n), "-o", path])
                nodes = count_nodes(path)
                for name in commands:
                    args = COMMANDS[name]
                    k = rounds or (3 if n < 1_000_000 else 1)
                    rows = [command([*args, path]) for _ in range(k)]
                    wall = statistics.median(r["wall"] for r in rows)
                    rss = statistics.median(r["rss"] for r in rows)
                    if n == BASE:
                        base[name] = (nodes, wall, rss)
                        print(f"growth {shape:5} {name:17} {nodes:>9} nodes  {wall:7.2f} s  {rss / 2**20:6.0f} MB "
                              "(the fixed part)", flush=True)
                        continue
                    b_nodes, b_wall, b_rss = base[name]
                    extra = nodes - b_nodes
                    us, kb = (wall - b_wall) / extra * 1e6, (rss - b_rss) / extra / 1024
                    out.setdefault(shape, {}).setdefault(name, {})[n] = {
                        "nodes": nodes, "wall_s": wall, "rss_bytes": rss, "base_wall_s": b_wall,
                        "base_rss_bytes": b_rss, "us_per_node": us, "kb_per_node": kb}
                    print(f"growth {shape:5} {name:17} {nodes:>9} nodes  {wall:7.2f} s  {rss / 2**20:6.0f} MB  "
                          f"beyond the fixed part: {us:6.2f} us/node  {kb:6.2f} KB/node", flush=True)
                os.unlink(path)
    return out


def table(results: dict) -> str:
    lines = []
    for shape, cmds in results.items():
        sizes = sorted(next(iter(cmds.values())))
        head = " | ".join(f"{n:.0e}: µs, KB per node" for n in sizes)
        lines += [f"**{shape}**", "", f"| command | {head} | time/node growth per 10x |",
                  "|---|" + "---|" * (len(sizes) + 1)]
        for name, by_n in cmds.items():
            cells = " | ".join(f"{by_n[n]['us_per_node']:.2f}, {by_n[n]['kb_per_node']:.2f}" for n in sizes)
            growth = ", ".join(f"{by_n[b]['us_per_node'] / by_n[a]['us_per_node']:.2f}"
                               for a, b in zip(sizes, sizes[1:]))
            lines.append(f"| `{name}` | {cells} | {growth} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str], quick: bool = False) -> dict:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    rounds, shapes, commands = None, ("chain", "mlp"), tuple(COMMANDS)
    for i, a in enumerate(argv):
        if a == "--sizes":
            sizes = tuple(int(float(s)) for s in argv[i + 1].split(","))
        if a == "--rounds":
            rounds = int(argv[i + 1])
        if a == "--shapes":
            shapes = tuple(argv[i + 1].split(","))
        if a == "--commands":
            commands = tuple(argv[i + 1].split(","))
    results = measure(sizes, rounds, shapes, commands)
    print(table(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
