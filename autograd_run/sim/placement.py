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

from autograd_run.errors import RequestError
from autograd_run.graphs.dump import dumps, graph_to_dict
from autograd_run.graphs.load import loads_graph
from autograd_run.ops import ACCUMULATE_GRAD

PLACEMENTS = ("keep", "round-robin", "layer", "greedy")


def _topological(graph) -> list:
    """Roots first: decreasing topological number, ties by file order."""
    return sorted(graph.nodes, key=lambda n: (-n.topo_nr, n.index))


def assign(graph, k: int, how: str, cost_of) -> dict:
    """node -> device index, for the non-AccumulateGrad nodes."""
    order = [n for n in _topological(graph) if n.op is not ACCUMULATE_GRAD]
    if how == "round-robin":
        return {n: i % k for i, n in enumerate(order)}
    if how == "layer":
        costs = [max(1, cost_of(n).cpu_ns + cost_of(n).gpu_ns) for n in order]
        total, acc, out = sum(costs), 0, {}
        for n, c in zip(order, costs):
            out[n] = min(k - 1, acc * k // total)
            acc += c
        return out
    if how == "greedy":
        load = [0] * k
        finish: dict = {}
        out: dict = {}
        producers = {n: [p for p, _ in (n.consumers or [])] for n in graph.nodes}
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
            out[n] = best
            finish[n] = best_t + work
            load[best] = finish[n]
        return out
    raise RequestError(f"unknown placement {how!r}; choose from {', '.join(PLACEMENTS)}", "placement")


def place(graph, k: int, how: str, cost_of):
    if k < 1:
        raise RequestError(f"devices must be at least 1, got {k}", "devices")
    if how == "keep":
        if graph.max_device_index >= k:
            raise RequestError(f"the graph uses cuda:{graph.max_device_index}; --devices {k} is too few "
                               "to keep its placement", "devices")
        return graph
    where = assign(graph, k, how, cost_of)
    for n in graph.nodes:
        if n.op is ACCUMULATE_GRAD:
            prods = [p for p, _ in (n.consumers or [])]
            where[n] = where.get(prods[0], 0) if prods else 0
    doc = graph_to_dict(graph)
    by_id = {n.id: n for n in graph.nodes}
    dev = {n.id: f"cuda:{where[n]}" for n in graph.nodes}
    nodes = []
    copies = 0
    taken = set(by_id)
    for d in doc["nodes"]:
        d = dict(d)
        d["inputs"] = [dict(m, device=dev[d["id"]]) for m in d["inputs"]]
        nxt = []
        for e in d.get("next", []):
            if e is None or dev[e[0]] == dev[d["id"]]:
                nxt.append(e)
                continue
            target = by_id[e[0]].inputs[e[1]]
            cid = f"copy{copies}_{d['id']}"
            while cid in taken:
                cid += "_"
            taken.add(cid)
            copies += 1
            meta = {"shape": list(target.shape), "dtype": target.dtype, "device": dev[d["id"]]}
            nodes.append({"id": cid, "name": "ToCopyBackward0", "seq": d.get("seq", 0), "next": [e],
                          "inputs": [meta]})
            nxt.append([cid, 0])
        if "next" in d:
            d["next"] = nxt
        nodes.append(d)
    doc["nodes"] = nodes
    for v in doc.get("variables", []):
        node = graph.variables[v["name"]].node
        if node is not None:
            v["device"] = dev[node.id]
    # Tensor values the file keeps in a side file stay there: load against the same folder and names.
    base = graph.base_dir
    side = graph.side_files.default_name if graph.side_files is not None else None
    return loads_graph(dumps(doc, "json"), f"{graph.source} (placed: {how}, {k} devices)", "json", base, side)
