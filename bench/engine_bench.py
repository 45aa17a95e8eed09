"""Engine benchmarks, each a ratio measured within one run.

(a) per-node backward time against PyTorch on the same graph shapes
    (chain of multiplies, chain of adds, fan-out/fan-in, MLP), 1-element
    float tensors, N = 1e4 and 1e5, multithreading off and on (both sides);
(b) tracing on against off (a 1e5-node chain);
(d) two virtual devices against one, on large matmul cost nodes;
(e) a 1e6-node chain: run time and peak memory per node.
(c), loading, is ``load_bench``.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
import tracemalloc

import numpy as np

from autograd_run.engine import Engine, GraphState
from autograd_run.engine.run import root_gradients
from autograd_run.graphs.dump import dumps
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import loads_graph
from autograd_run.record.recorder import Recorder

threading.stack_size(256 * 1024 * 1024)  # deep torch graphs free recursively in C++


def in_thread(fn):
    """Run ``fn`` on a thread with a large stack (deep PyTorch graphs); return its result."""
    box = {}

    def run():
        try:
            box["v"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["e"] = exc
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def median(xs):
    return statistics.median(xs)


# -- graph shapes, ours and PyTorch's -------------------------------------------------

def our_graph(shape: str, n: int):
    if shape == "chain_mul":
        doc = generate("chain", n=n, op="mul")
    elif shape == "chain_add":
        doc = generate("chain", n=n, op="add")
    elif shape == "fanout":
        doc = generate("fanout", width=n // 2)
    else:  # mlp: 1-wide layers of mm + add + relu
        doc = generate("mlp", layers=max(1, n // 5), width=1, batch=1, in_features=1)
    return loads_graph(dumps(doc, "json"), f"{shape}.json")


def torch_build(shape: str, n: int):
    """PyTorch's forward of ``shape`` (1-element tensors): the output to call ``backward()`` on."""
    import torch
    x = torch.ones(1, requires_grad=True)
    if shape == "chain_mul":
        y = x
        for _ in range(n):
            y = y * 1.0001
    elif shape == "chain_add":
        y = x
        for _ in range(n):
            y = y + 1
    elif shape == "fanout":
        branches = [x * float(i + 1) for i in range(n // 2)]
        y = branches[0]
        for b in branches[1:]:
            y = y + b
        y = y.sum()
    else:
        h = torch.ones(1, 1)
        for _ in range(max(1, n // 5)):
            w = torch.ones(1, 1, requires_grad=True)
            b = torch.ones(1, requires_grad=True)
            h = torch.relu(h.mm(w) + b)
        w = torch.ones(1, 1, requires_grad=True)
        y = h.mm(w).sum()
    return y


def torch_count(shape: str, n: int, y) -> int:
    """Nodes of PyTorch's backward graph from ``y`` (walked before the clock starts)."""
    if shape == "chain_mul":
        return n + 1
    seen, stack = set(), [y.grad_fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        stack.extend(nf for nf, _ in f.next_functions)
    return len(seen)


def torch_backward_time(shape: str, n: int, multithreading: bool, repeat: int) -> tuple[float, int]:
    import torch

    def one():
        y = torch_build(shape, n)
        nodes = torch_count(shape, n, y)
        with torch.autograd.set_multithreading_enabled(multithreading):
            t = time.perf_counter()
            y.backward()
            dt = time.perf_counter() - t
        return dt, nodes
    times, nodes = [], 0
    for _ in range(repeat):
        dt, nodes = in_thread(one)
        times.append(dt)
    return median(times), nodes


def our_backward_time(graph, multithreading: bool, repeat: int, tracer=None) -> float:
    roots = [r.edge for r in graph.roots]
    times = []
    for _ in range(repeat):
        state = GraphState(graph)
        state.prepare()  # saved tensors exist before backward, as after PyTorch's forward
        grads = root_gradients(graph)
        eng = Engine(tracer=tracer() if tracer else None, multithreading=multithreading)
        gc.collect()
        t = time.perf_counter()
        eng.execute(state, roots, grads)
        times.append(time.perf_counter() - t)
        eng.shutdown()
    return median(times)


def bench_vs_torch(sizes=(10_000, 100_000), repeat=3):
    rows = []
    for shape in ("chain_mul", "chain_add", "fanout", "mlp"):
        for n in sizes:
            g = our_graph(shape, n)
            for mt in (False, True):
                ours = our_backward_time(g, mt, repeat)
                theirs, tnodes = torch_backward_time(shape, n, mt, repeat)
                r = {"shape": shape, "n": n, "multithreading": mt, "nodes": len(g.nodes), "torch_nodes": tnodes,
                     "ours_us_per_node": ours / len(g.nodes) * 1e6, "torch_us_per_node": theirs / tnodes * 1e6}
                r["ratio"] = r["ours_us_per_node"] / r["torch_us_per_node"]
                rows.append(r)
                print(f"(a) {shape:>9} n={n:>6} mt={'on ' if mt else 'off'}  ours {r['ours_us_per_node']:6.2f} us/node"
                      f"  torch {r['torch_us_per_node']:6.2f} us/node  ratio {r['ratio']:.2f}x", flush=True)
    return rows


def bench_tracing(n=100_000, repeat=7):
    """Off and on runs interleaved (the machine is shared: drift hits both alike); medians."""
    g = our_graph("chain_mul", n)
    offs, ons = [], []
    for _ in range(repeat):
        offs.append(our_backward_time(g, False, 1))
        ons.append(our_backward_time(g, False, 1, tracer=Recorder))
    off, on = median(offs), median(ons)
    r = {"n": n, "off_us_per_node": off / len(g.nodes) * 1e6, "on_us_per_node": on / len(g.nodes) * 1e6,
         "ratio": on / off}
    print(f"(b) tracing on/off, {n}-node chain: off {r['off_us_per_node']:.2f} us/node, "
          f"on {r['on_us_per_node']:.2f} us/node, ratio {r['ratio']:.2f}x", flush=True)
    return r


def matmul_graph(devices: list[str], per_device: int, size: int):
    """Independent chains of matmul cost nodes, one chain per device, joined at the root."""
    flops = 2 * size ** 3
    nodes, heads = [], []
    for d, dev in enumerate(devices):
        prev = ["acc", 0]
        for k in range(per_device):
            nid = f"d{d}_{k}"
            nodes.append({"id": nid, "name": "MmBackward0", "op": "cost", "seq": k + 1, "next": [prev],
                          "inputs": [{"shape": [1], "device": dev}],
                          "attrs": {"cost": {"flops": flops, "mode": "matmul"}}})
            prev = [nid, 0]
        heads.append(prev)
    nodes.append({"id": "root", "name": "Fan", "op": "identity", "seq": 10_000, "next": heads,
                  "inputs": [{"shape": [1]}]})
    nodes.append({"id": "acc", "name": "AccumulateGrad", "variable": "x"})
    return loads_graph(dumps({"format": "autograd-graph/1", "roots": [{"node": "root", "grad": "ones"}],
                              "variables": [{"name": "x", "shape": [1]}], "nodes": nodes}, "json"), "mm.json")


def warm_times(graph, repeat: int) -> float:
    """Median time of ``repeat`` runs on one engine whose device threads are already started."""
    eng = Engine()
    roots = [r.edge for r in graph.roots]
    try:
        eng.execute(GraphState(graph), roots, root_gradients(graph))  # start threads, limit BLAS
        times = []
        for _ in range(repeat):
            state, grads = GraphState(graph), root_gradients(graph)
            t = time.perf_counter()
            eng.execute(state, roots, grads)
            times.append(time.perf_counter() - t)
        return median(times)
    finally:
        eng.shutdown()


def bench_devices(size=768, per_device=8, repeat=5):
    one = matmul_graph(["cuda:0", "cuda:0"], per_device, size)
    two = matmul_graph(["cuda:0", "cuda:1"], per_device, size)
    t1 = warm_times(one, repeat)
    t2 = warm_times(two, repeat)
    r = {"size": size, "matmuls": 2 * per_device, "one_device_s": t1, "two_devices_s": t2, "speedup": t1 / t2}
    print(f"(d) {2 * per_device} float32 {size}x{size} matmuls: one virtual device {t1:.3f} s, "
          f"two {t2:.3f} s, speed-up {r['speedup']:.2f}x", flush=True)
    return r


def bench_million(n=1_000_000):
    """Run time (no tracing, no memory tracing), then peak memory of load + run per node."""
    doc = generate("chain", n=n, op="mul")
    data = dumps(doc, "json")
    del doc
    g = loads_graph(data, "m.json")
    eng = Engine(multithreading=False)
    state = GraphState(g)
    state.prepare()
    grads = root_gradients(g)
    t = time.perf_counter()
    with np.errstate(over="ignore"):  # 1.0001 ** 1e6 overflows float32; the work is the same
        eng.execute(state, [r.edge for r in g.roots], grads)
    dt = time.perf_counter() - t
    del state
    del g
    gc.collect()
    tracemalloc.start()
    g = loads_graph(data, "m.json")
    resident, load_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    state = GraphState(g)
    state.prepare()
    with np.errstate(over="ignore"):
        eng.execute(state, [r.edge for r in g.roots], root_gradients(g))
    _, run_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    nodes = len(g.nodes)
    r = {"nodes": nodes, "run_s": dt, "us_per_node": dt / nodes * 1e6,
         "graph_bytes_per_node": resident / nodes, "load_peak_bytes_per_node": load_peak / nodes,
         "run_peak_bytes_per_node": run_peak / nodes}
    print(f"(e) {nodes} nodes: run {dt:.2f} s ({r['us_per_node']:.2f} us/node); memory per node: loaded graph "
          f"{r['graph_bytes_per_node']:.0f} B, peak while running (graph + run state) "
          f"{r['run_peak_bytes_per_node']:.0f} B, transient peak while parsing {r['load_peak_bytes_per_node']:.0f} B",
          flush=True)
    return r
