"""Held-out graphs for the accuracy benchmark: drawn at run time from a seed, never fixed in a file.

Every family is a graph of ``cost`` nodes (each node's work is stated, so the
engine's and the simulation's time differ only by what the simulation models
of the engine), with the things real multi-device backward passes have:

* ``layered``: a random layered DAG over 0-4 virtual devices (0: all on the
  CPU), next edges mostly to the next layer, some far; a few wide fan-ins (a
  node whose InputBuffer sums 6-16 gradients); ``ToCopyBackward0`` wherever
  a gradient crosses devices; AccumulateGrad leaves on every device;
* ``fan``: one node fanning out to W branches (short chains, each branch on
  a device drawn at random) that meet again in one fan-in node;
* ``transformer``: the transformer generator over 0-4 devices (its own
  ToCopy nodes where the layers change device), every other node a cost node;
* ``chain``: a chain in blocks, each block on a device drawn at random.

Costs are log-uniform over ``LO_US``-``HI_US``; a share ``GIL_SHARE`` of the
nodes ``spin`` (hold the GIL while they work), the rest ``wait`` without it.
``draw(seed, count)`` returns ``count`` (family, devices, doc) cases, the
families in turn, everything else drawn from ``random.Random(seed)``.
"""

from __future__ import annotations

import math
import random

from autograd_run.graphs.generators import generate

LO_US, HI_US = 5, 500
GIL_SHARE = 0.15
FAMILIES = ("layered", "fan", "transformer", "chain")


def _cost(rnd: random.Random) -> dict:
    """A node's stated cost, from its own generator (so a what-if on other devices keeps every cost)."""
    us = round(math.exp(rnd.uniform(math.log(LO_US), math.log(HI_US))), 1)
    return {"cost": {"us": us, "mode": "spin" if rnd.random() < GIL_SHARE else "wait"}}


#: Devices are drawn as one of this many slots, the slot mapped to ``cuda:(slot % k)``: the same seed draws the
#: same graph and costs for every device count (the devices what-if measures one graph on 1, 2 and 4).
SLOTS = 12


def _dev(k: int, slot: int) -> str:
    return "cpu" if k == 0 else f"cuda:{slot % k}"


class _Builder:
    """Cost nodes and the edges between them; ``edge(src, dst)`` puts a ToCopy node where devices differ."""

    def __init__(self, rnd: random.Random):
        self.rnd = rnd
        self.base = rnd.randrange(1 << 62)
        self.nodes: dict[str, dict] = {}
        self.variables: list[dict] = []
        self.seq = 1_000_000

    def op(self, nid: str, device: str, seq: int | None = None) -> str:
        self.seq -= 1
        self.nodes[nid] = {"id": nid, "name": "CostBackward", "op": "cost", "seq": seq if seq is not None else self.seq,
                           "next": [], "inputs": [{"shape": [1], "device": device}], "attrs": _cost(random.Random(f"{self.base}/{nid}"))}
        return nid

    def edge(self, src: str, dst: str) -> None:
        a, b = self.nodes[src], self.nodes[dst]
        da, db = a["inputs"][0]["device"], b["inputs"][0]["device"]
        if da != db:
            cid = f"copy_{src}_{dst}"
            # The forward's x.to(da) for x on db: its backward node gets the gradient on da and sends it to db.
            self.nodes[cid] = {"id": cid, "name": "ToCopyBackward0", "seq": a["seq"] - 1, "next": [[dst, 0]],
                               "inputs": [{"shape": [1], "device": da}]}
            a["next"].append([cid, 0])
        else:
            a["next"].append([dst, 0])

    def leaf(self, src: str) -> None:
        dev = self.nodes[src]["inputs"][0]["device"]
        name = f"w{len(self.variables)}"
        self.variables.append({"name": name, "shape": [1], "device": dev})
        self.nodes[f"acc_{name}"] = {"id": f"acc_{name}", "name": "AccumulateGrad", "variable": name,
                                     "inputs": [{"shape": [1], "device": dev}]}
        self.nodes[src]["next"].append([f"acc_{name}", 0])

    def doc(self, root: str) -> dict:
        for n in list(self.nodes.values()):
            if n.get("op") == "cost" and not n["next"]:
                self.leaf(n["id"])
        return {"format": "autograd-graph/1", "roots": [{"node": root, "grad": "ones"}],
                "variables": self.variables, "nodes": list(self.nodes.values())}


def layered(rnd: random.Random, k: int) -> dict:
    b = _Builder(rnd)
    layers = rnd.randint(5, 10)
    widths = [1] + [rnd.randint(1, 6) for _ in range(layers - 1)]
    grid = []
    for li, w in enumerate(widths):
        grid.append([b.op(f"n{li}_{j}", _dev(k, rnd.randrange(SLOTS))) for j in range(w)])
    for li in range(1, layers):
        for dst in grid[li]:  # every node gets at least one producer from the layer above
            b.edge(rnd.choice(grid[li - 1]), dst)
    for li in range(layers - 1):
        for src in grid[li]:
            for _ in range(rnd.randint(0, 2)):  # more edges, some skipping layers
                lj = min(layers - 1, li + 1 + (rnd.random() < 0.25) * rnd.randint(1, 3))
                dst = rnd.choice(grid[lj])
                if not any(e[0] == dst for e in b.nodes[src]["next"]):
                    b.edge(src, dst)
            if rnd.random() < 0.4:
                b.leaf(src)
    for h in range(rnd.randint(1, 2)):  # a wide fan-in: many producers into one node further down
        li = rnd.randrange(1, layers - 1) if layers > 2 else 1
        hub = b.op(f"hub{h}_{li}", _dev(k, rnd.randrange(SLOTS)), seq=0)  # (its id: the same on any k)
        producers = [n for layer in grid[:li + 1] for n in layer]
        for src in rnd.sample(producers, min(len(producers), rnd.randint(6, 16))):
            b.edge(src, hub)
    return b.doc(grid[0][0])


def fan(rnd: random.Random, k: int) -> dict:
    b = _Builder(rnd)
    root = b.op("root", _dev(k, 0))
    join = b.op("join", _dev(k, rnd.randrange(SLOTS)), seq=0)
    for i in range(rnd.randint(4, 16)):
        dev = _dev(k, rnd.randrange(SLOTS))
        prev = root
        for j in range(rnd.randint(1, 4)):
            cur = b.op(f"b{i}_{j}", dev)
            b.edge(prev, cur)
            if rnd.random() < 0.3:
                b.leaf(cur)
            prev = cur
        b.edge(prev, join)
    b.leaf(join)
    return b.doc("root")


def chain(rnd: random.Random, k: int) -> dict:
    b = _Builder(rnd)
    n = rnd.randint(20, 80)
    dev = _dev(k, 0)
    prev = None
    for i in range(n):
        if rnd.random() < 0.15:
            dev = _dev(k, rnd.randrange(SLOTS))
        cur = b.op(f"c{i}", dev)
        if prev:
            b.edge(prev, cur)
        if rnd.random() < 0.2:
            b.leaf(cur)
        prev = cur
    return b.doc("c0")


def transformer(rnd: random.Random, k: int) -> dict:
    base = rnd.randrange(1 << 62)
    doc = generate("transformer", layers=rnd.randint(1, 3), heads=rnd.choice((1, 2)), seq_len=4, dim=4,
                   devices=k, seed=rnd.randrange(1 << 30))
    for n in doc["nodes"]:
        if n["name"] in ("AccumulateGrad", "ToCopyBackward0"):
            continue
        n["op"] = "cost"
        n["attrs"] = _cost(random.Random(f"{base}/{n['id']}"))
        n.pop("saved", None)
    return doc


BUILDERS = {"layered": layered, "fan": fan, "transformer": transformer, "chain": chain}


def draw(seed: int, count: int, families=FAMILIES) -> list[tuple[str, int, int, dict]]:
    """``count`` held-out cases (family, device count, the case's own seed, graph document), the families
    in turn; ``build(family, case_seed, k)`` makes the same case on ``k`` devices."""
    rnd = random.Random(seed)
    out = []
    for i in range(count):
        family = families[i % len(families)]
        k, case = rnd.randint(0, 4), rnd.randrange(1 << 62)
        out.append((family, k, case, build(family, case, k)))
    return out


def build(family: str, case_seed: int, k: int) -> dict:
    return BUILDERS[family](random.Random(case_seed), k)
