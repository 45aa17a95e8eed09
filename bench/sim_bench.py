"""Simulation benchmarks: accuracy against the engine on real threads, and speed.

(f) accuracy: graphs of cost nodes (GIL-free ``wait`` nodes, and some that
    hold the GIL) on 1, 2 and 4 virtual devices, measured on the engine
    (median wall of several warm passes) and simulated with the ``local``
    spec that ``calibrate`` measures first, in the same run: mean absolute
    percentage error, and whether the ranking of policies is the same
    (for every pair the measurement tells apart by more than 5%; closer
    pairs are ties, their order is noise);
(g) speed: a 1e6-node chain simulated (no trace), seconds and peak memory
    per node beyond the loaded graph.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import tracemalloc

from autograd_run.engine import DeviceSet, Engine, GraphState
from autograd_run.engine.priority import FifoPriority
from autograd_run.engine.run import root_gradients
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import loads_graph


def _costed(doc: dict, devices: int, rnd: random.Random, spin_share: float = 0.0, lo=200, hi=1500) -> dict:
    """Every op node a cost node (``wait``, or ``spin`` for a share), placed round-robin by topological layer."""
    nodes = doc["nodes"]
    by_id = {n["id"]: n for n in nodes}
    depth: dict = {}

    def level(nid):
        if nid in depth:
            return depth[nid]
        stack = [nid]
        while stack:
            cur = stack[-1]
            n = by_id[cur]
            todo = [e[0] for e in n.get("next", []) if e is not None and e[0] not in depth]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            depth[cur] = 1 + max((depth[e[0]] for e in n.get("next", []) if e is not None), default=-1)
        return depth[nid]
    for n in nodes:
        level(n["id"])
    dev_of = {}
    for n in nodes:
        if n["name"] == "AccumulateGrad":
            continue
        dev = f"cuda:{(n['seq'] * 7919) % devices}" if devices > 1 else "cuda:0"
        dev_of[n["id"]] = dev
        n["op"] = "cost"
        mode = "spin" if rnd.random() < spin_share else "wait"
        n["attrs"] = {"cost": {"us": rnd.randint(lo, hi), "mode": mode}}
        n.pop("saved", None)
        for m in n["inputs"]:
            m["device"] = dev
            m.pop("stream", None)
    for n in nodes:
        if n["name"] == "AccumulateGrad":
            prods = [p for p in nodes if any(e is not None and e[0] == n["id"] for e in p.get("next", []))]
            dev = dev_of.get(prods[0]["id"], "cuda:0") if prods else "cuda:0"
            for m in n["inputs"]:
                m["device"] = dev
            for v in doc.get("variables", []):
                if v["name"] == n["variable"]:
                    v["device"] = dev
    return doc


def families(rnd: random.Random) -> list[tuple[str, dict]]:
    out = []
    for k in (1, 2, 4):
        out.append((f"chain k={k}", _costed(generate("chain", n=24), k, rnd)))
        out.append((f"fanout k={k}", _costed(generate("fanout", width=12), k, rnd)))
        out.append((f"transformer k={k}", _costed(generate("transformer", layers=1, heads=2, seq_len=4, dim=8), k, rnd,
                                                   lo=100, hi=600)))
        out.append((f"random k={k}", _costed(generate("random", nodes=40, leaves=10, seed=k), k, rnd)))
        out.append((f"fanout+gil k={k}", _costed(generate("fanout", width=12), k, rnd, spin_share=0.3)))
    return out


def measure(g, repeat: int = 5, priority=None, multithreading: bool = True) -> float:
    eng = Engine(DeviceSet("virtual"), priority=priority, multithreading=multithreading)
    roots = [r.edge for r in g.roots]
    try:
        eng.execute(GraphState(g), roots, root_gradients(g))  # warm: threads started, BLAS limited
        times = []
        for _ in range(repeat):
            state, grads = GraphState(g), root_gradients(g)
            t = time.perf_counter()
            eng.execute(state, roots, grads)
            times.append(time.perf_counter() - t)
    finally:
        eng.shutdown()
    return statistics.median(times) * 1e9


#: Two policies whose measured times differ by less than this are a tie: their order is noise.
TIE = 0.05


def _same_ranking(real: dict, pred: dict) -> bool:
    """Whether the prediction orders every pair of policies the measurement tells apart (by more than TIE)."""
    for a in real:
        for b in real:
            if real[a] < real[b] * (1 - TIE) and not pred[a] < pred[b]:
                return False
    return True


def bench_accuracy(seed: int = 0, repeat: int = 5) -> dict:
    from autograd_run.sim.calibrate import calibrate
    from autograd_run.sim.session import SimOptions, simulate_session
    spec = calibrate()
    rnd = random.Random(seed)
    rows = []
    for name, doc in families(rnd):
        g = loads_graph(dumps(doc, "json"), f"{name}.json")
        real = measure(g, repeat)
        pred = simulate_session(g, SimOptions(spec=spec, slack_top=0)).wall_ns
        err = abs(pred - real) / real
        rows.append({"graph": name, "nodes": len(g.nodes), "measured_ms": real / 1e6, "predicted_ms": pred / 1e6,
                     "error": err})
        print(f"(f) {name:<22} measured {real / 1e6:8.2f} ms  predicted {pred / 1e6:8.2f} ms  error {err:6.1%}",
              flush=True)
    mape = statistics.mean(r["error"] for r in rows)
    print(f"(f) mean absolute percentage error {mape:.1%} over {len(rows)} graphs", flush=True)
    # Ranking of device counts (1, 2, 4) per family.
    by_family: dict = {}
    for r in rows:
        family, k = r["graph"].rsplit(" k=", 1)
        by_family.setdefault(family, ({}, {}))
        by_family[family][0][k], by_family[family][1][k] = r["measured_ms"], r["predicted_ms"]
    device_ranks = []
    for family, (real, pred) in by_family.items():
        same = _same_ranking(real, pred)
        device_ranks.append({"graph": family, "same_ranking": same})
        shown = ", ".join(f"k={k} {real[k]:.2f}/{pred[k]:.2f}" for k in sorted(real, key=real.get))
        print(f"(f) devices {family:<16} measured/predicted ms: {shown}  {'same' if same else 'DIFFERENT'}",
              flush=True)
    # Ranking of policies on one graph per family: pytorch, fifo, single-thread.
    ranks = []
    for name, doc in families(random.Random(seed + 1)):
        if not name.endswith("k=2"):
            continue
        g = loads_graph(dumps(doc, "json"), f"{name}.json")
        real = {"pytorch": measure(g, repeat), "fifo": measure(g, repeat, FifoPriority()),
                "single-thread": measure(g, repeat, multithreading=False)}
        pred = {p: simulate_session(g, SimOptions(spec=spec, policy=p, slack_top=0)).wall_ns for p in real}
        same = _same_ranking(real, pred)
        ranks.append({"graph": name, "measured": real, "predicted": pred, "same_ranking": same})
        shown = ", ".join(f"{p} {real[p] / 1e6:.2f}/{pred[p] / 1e6:.2f}" for p in sorted(real, key=real.get))
        print(f"(f) ranking {name:<16} measured/predicted ms: {shown}  {'same' if same else 'DIFFERENT'}", flush=True)
    return {"rows": rows, "mape": mape, "rankings": ranks, "device_rankings": device_ranks, "spec": spec.to_dict()}


def bench_speed(n: int = 1_000_000) -> dict:
    from autograd_run.sim.session import SimOptions, simulate_session
    data = dumps(generate("chain", n=n), "json")
    g = loads_graph(data, "chain.json")
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t = time.perf_counter()
    r = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    s = r.summary
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    out = {"nodes": len(g.nodes), "seconds": dt, "bytes_per_node": peak / len(g.nodes), "wall_ns": s.wall_ns}
    print(f"(g) simulated {len(g.nodes)} nodes in {dt:.2f} s (summary included), "
          f"{out['bytes_per_node']:.0f} B/node beyond the graph", flush=True)
    return out


if __name__ == "__main__":
    bench_accuracy()
    bench_speed(200_000)
