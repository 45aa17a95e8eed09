"""What-if placements: a graph's nodes remapped onto K devices, copies inserted where edges cross.

``place(graph, k, how, cost_of)`` returns a new graph (the input is never
changed) in which every node runs on one of ``cuda:0`` .. ``cuda:{k-1}``:

``keep``         the file's devices (k must cover its highest index);
``round-robin``  the i-th node in topological order on device i mod k;
``layer``        the topological order cut into k consecutive stages of equal
                 cost (pipeline stages);
``greedy``       nodes in topological order, each on the device where it can
                 start earliest given the devices' load so far and the copies
                 its inputs would need (list scheduling).

An edge whose producer and consumer land on different devices gets a
``ToCopyBackward0`` node on the producer's device, as ``h.to(device)`` in the
forward pass leaves behind; AccumulateGrad nodes follow their (first) producer,
as a parameter lives where it is used.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from autograd_run.errors import RequestError
from autograd_run.graphs.model import Edge, Graph, InputMeta, Root, derive, device, ensure_consumers
from autograd_run.graphs.tensors import SideFiles
from autograd_run.ops import ACCUMULATE_GRAD, lookup

PLACEMENTS = ("keep", "round-robin", "layer", "greedy")


def _topological(graph) -> list:
    """Roots first: decreasing topological number, ties by file order (a stable sort keeps the list order
    of equal keys, reversed or not)."""
    return sorted(graph.nodes, key=attrgetter("topo_nr"), reverse=True)


def _layers(index, cpu: list, gpu: list, k: int, size: int) -> list[int]:
    """The ``layer`` cut: the node of graph index ``index[i]`` (``i`` counting from the roots) goes to device
    ``min(k - 1, before * k // total)``, ``before`` the work of the nodes ahead of it and ``total`` all of it, each
    node's work its cost, at least 1 ns; -1 for the nodes ``index`` does not hold. In numpy where every product
    fits 64 bits (a million nodes: 0.5 s of Python loop), else with Python's integers."""
    n = len(index)
    if n >= 64:
        c, g = np.asarray(cpu), np.asarray(gpu)  # int64 unless a value is not a machine integer
        bound = None if c.dtype != np.int64 or g.dtype != np.int64 else (
            max(-int(c.min()), int(c.max())) + max(-int(g.min()), int(g.max())) + 1)
        if bound is not None and bound * n * k < 1 << 62:
            w = np.maximum(c + g, 1)
            total = int(w.sum())
            before = np.cumsum(w) - w
            out = np.full(size, -1, dtype=np.int64)
            out[np.asarray(index, dtype=np.int64)] = np.minimum(k - 1, before * k // total)
            return out.tolist()
    codes = [-1] * size
    cpu, gpu = np.asarray(cpu).tolist(), np.asarray(gpu).tolist()  # Python's integers: no product overflows
    total, before = sum(max(1, a + b) for a, b in zip(cpu, gpu)), 0
    for i, a, b in zip(np.asarray(index).tolist(), cpu, gpu):
        codes[i] = min(k - 1, before * k // total)
        before += max(1, a + b)
    return codes


def _ahead(graph) -> tuple[list, np.ndarray, np.ndarray]:
    """The nodes a placement places (all but AccumulateGrad) in the file's order, the permutation that takes them
    from the roots as ``_topological`` orders them (decreasing topological number, ties in the file's order: a
    stable argsort), and their graph indexes in that order. Read in the file's order, where the nodes lie in
    memory one after another, and ordered as numbers: a random DAG's topological order jumps about the heap (at a
    million nodes its costs took 1.07 s read in that order, 0.67 s in the file's)."""
    mine = [n for n in graph.nodes if n.op is not ACCUMULATE_GRAD]
    topo = np.fromiter(map(attrgetter("topo_nr"), mine), dtype=np.int64, count=len(mine))
    ahead = np.argsort(-topo, kind="stable")
    return mine, ahead, np.fromiter(map(attrgetter("index"), mine), dtype=np.int64, count=len(mine))[ahead]


def _layer_codes(graph, k: int, cost_of) -> list[int]:
    """``assign``'s ``layer`` cut (``_layers``) over the nodes ``_ahead`` gives, their costs read in the file's
    order."""
    many = getattr(cost_of, "many", None) or (lambda ns: list(map(cost_of, ns)))  # (a CostResolver's: compiled)
    mine, ahead, index = _ahead(graph)
    found = many(mine)
    cpu = np.array(list(map(attrgetter("cpu_ns"), found)))[ahead]  # (int64, or objects: Python's integers)
    gpu = np.array(list(map(attrgetter("gpu_ns"), found)))[ahead]
    return _layers(index, cpu, gpu, k, len(graph.nodes))


def assign(graph, k: int, how: str, cost_of) -> list[int]:
    """The device index of each node (by its index in the graph), -1 for the AccumulateGrad nodes (they
    follow their producer: ``graphs.remap``)."""
    if how == "layer":
        return _layer_codes(graph, k, cost_of)
    if how == "round-robin":  # the i-th node from the roots on device i % k
        index = _ahead(graph)[2]
        out = np.full(len(graph.nodes), -1, dtype=np.int64)
        out[index] = np.arange(len(index), dtype=np.int64) % k
        return out.tolist()
    order = [n for n in _topological(graph) if n.op is not ACCUMULATE_GRAD]
    codes = [-1] * len(graph.nodes)
    if how == "greedy":
        load = [0] * k
        finish: dict = {}
        out: dict = {}
        ensure_consumers(graph)
        producers = {n: [p for p, _ in n.consumers] for n in graph.nodes}
        for n in order:
            c = cost_of(n)
            work = max(1, c.cpu_ns + c.gpu_ns)
            best, best_t = 0, None
            for d in range(k):
                ready = 0
                for p in producers[n]:
                    if p in out:
                        t = finish[p] + (0 if out[p] == d else max(1, work // 4))
                        ready = max(ready, t)
                start = max(ready, load[d])
                if best_t is None or start < best_t:
                    best, best_t = d, start
            out[n] = codes[n.index] = best
            finish[n] = best_t + work
            load[best] = finish[n]
        return codes
    raise RequestError(f"unknown placement {how!r}; choose from {', '.join(PLACEMENTS)}", "placement")


def place(graph, k: int, how: str, cost_of):
    if k < 1:
        raise RequestError(f"devices must be at least 1, got {k}", "devices")
    if how == "keep":
        if graph.max_device_index >= k:
            raise RequestError(f"the graph uses cuda:{graph.max_device_index}; --devices {k} is too few "
                               "to keep its placement", "devices")
        return graph
    return _remapped(graph, assign(graph, k, how, cost_of), f"{graph.source} (placed: {how}, {k} devices)")


def _remapped(graph: Graph, codes: list[int], source: str) -> Graph:
    """A new graph: ``graph`` with node i on ``cuda:codes[i]``, a copy node on every edge that crosses devices.

    Built on the loaded graph (no re-serialisation) by ``graphs.remap.remap_nodes`` (compiled where built):
    the nodes' saved values and attrs are shared (a loaded graph is never changed), the input metas, edges,
    variables and derived fields are new. The result is what loading the remapped file would give
    (``tests/test_placement.py`` reloads it to prove so): the same node order (each copy listed just before
    its producer), ids, sequence numbers and metadata.
    """
    from autograd_run.graphs.remap import TOPO_IN, remap_nodes, remap_variables  # (the loader's compiled loops)
    devices = [device("cuda", i) for i in range(max(max(codes, default=0), 0) + 1)]
    nodes, fresh, by_id, order, max_index = remap_nodes(
        graph.nodes, codes, devices, [{} for _ in devices], [{} for _ in devices],
        lambda m, d: InputMeta(m.shape, m.dtype, devices[d], m.stream),
        lambda m, d: InputMeta(m.shape, m.dtype, devices[d]),
        lookup("ToCopyBackward0"), graph.by_id)
    variables = remap_variables(graph.variables, fresh)  # (a parameter lives where its gradient is)
    out = Graph(nodes, [Root(Edge(fresh[r.edge.node.index], r.edge.input_nr), r.grad) for r in graph.roots],
                variables, list(graph.inputs), graph.mode, dict(graph.meta), source, graph.base_dir, by_id)
    out.max_device_index = max_index
    derive(out, prepared=True, order=order, topo_in=TOPO_IN)
    out.slot_dtypes = graph.slot_dtypes
    out.hooked_nodes = [fresh[n.index] for n in graph.hooked_nodes]
    out.parameters = list(graph.parameters)
    out.ddp, out.fsdp, out.storage = graph.ddp, graph.fsdp, graph.storage
    if graph.side_files is not None:
        side = graph.side_files
        out.side_files = SideFiles(side.base_dir, side.default_name, source)
        out.side_files.seed_offset = side.seed_offset
    return out
