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

from autograd_run.errors import RequestError
from autograd_run.graphs.model import Device, Edge, Graph, InputMeta, Node, Root, Variable, derive, ensure_consumers
from autograd_run.graphs.tensors import SideFiles
from autograd_run.ops import ACCUMULATE_GRAD, lookup

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
        costs = []
        for n in order:
            c = cost_of(n)
            costs.append(max(1, c.cpu_ns + c.gpu_ns))
        total, acc, out = sum(costs), 0, {}
        for n, c in zip(order, costs):
            out[n] = min(k - 1, acc * k // total)
            acc += c
        return out
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
    ensure_consumers(graph)
    where = assign(graph, k, how, cost_of)
    for n in graph.nodes:
        if n.op is ACCUMULATE_GRAD:
            prods = n.consumers
            where[n] = where.get(prods[0][0], 0) if prods else 0
    return _remapped(graph, where, f"{graph.source} (placed: {how}, {k} devices)")


def _remapped(graph: Graph, where: dict, source: str) -> Graph:
    """A new graph: ``graph`` with node n on ``cuda:where[n]``, a copy node on every edge that crosses devices.

    Built on the loaded graph (no re-serialisation): the nodes' saved values and attrs are shared (a loaded
    graph is never changed), the input metas, edges, variables and derived fields are new. The result is
    what loading the remapped file would give (``tests/test_placement.py`` reloads it to prove so): the same
    node order (each copy listed just before its producer), ids, sequence numbers and metadata.
    """
    devices = [Device("cuda", i) for i in range(max(where.values(), default=0) + 1)]
    # Per device: id(meta) -> the meta on that device (the loader interns metas, so few are distinct; keyed
    # by identity, as hashing a frozen dataclass runs Python code; the input graph keeps each alive).
    metas: list[dict] = [{} for _ in devices]

    def on(m: InputMeta, d: int) -> InputMeta:
        got = metas[d].get(id(m))
        if got is None:
            got = metas[d][id(m)] = InputMeta(m.shape, m.dtype, devices[d], m.stream)
        return got

    copy_op = lookup("ToCopyBackward0")
    taken = set(graph.by_id)
    fresh: dict = {}  # old node -> new node
    # The derived fields as ``graphs.model.derive_node`` and ``link`` set them (every input slot of a node
    # is on its device, so the first one gives its device and stream), in the same order.
    max_index = -1
    for n in graph.nodes:
        d = where[n]
        ins = [on(m, d) for m in n.inputs]
        new = fresh[n] = Node(n.id, n.name, n.op, n.seq, [], ins, n.saved, n.attrs, n.variable, n.fwd_thread)
        new.consumers = []
        new.saves_tensors, new.saved_strings = n.saves_tensors, n.saved_strings
        if ins:
            new.device, new.stream, new.cpu = devices[d], ins[0].stream, False
            if d > max_index:
                max_index = d
    nodes = []
    copies = 0
    copies_of: dict = {}  # old node -> the copies on its edges
    for n in graph.nodes:
        new, d = fresh[n], where[n]
        nxt = new.next
        for out_nr, e in enumerate(n.next):
            if e is None:
                nxt.append(None)
                continue
            target, nr = e
            if where[target] == d:
                t = fresh[target]
                nxt.append(Edge(t, nr))
                t.consumers.append((new, out_nr))
                continue
            cid = f"copy{copies}_{n.id}"
            while cid in taken:
                cid += "_"
            taken.add(cid)
            copies += 1
            m = target.inputs[nr]
            meta = on(InputMeta(m.shape, m.dtype), d)
            t = fresh[target]
            copy = Node(cid, "ToCopyBackward0", copy_op, n.seq, [Edge(t, nr)], [meta])
            copy.consumers = [(new, out_nr)]
            copy.device, copy.cpu = devices[d], False
            t.consumers.append((copy, 0))
            copy.index = len(nodes)
            nodes.append(copy)
            copies_of.setdefault(n, []).append(copy)
            nxt.append(Edge(copy, 0))
        new.index = len(nodes)
        nodes.append(new)

    variables = {}
    for name, v in graph.variables.items():
        node = fresh.get(v.node)  # a parameter lives where its gradient is accumulated
        variables[name] = Variable(v.name, v.shape, v.dtype, v.device if node is None else node.device, v.grad,
                                   node, v.requires_grad, v.hooks)
    out = Graph(nodes, [Root(Edge(fresh[r.edge.node], r.edge.input_nr), r.grad) for r in graph.roots], variables,
                list(graph.inputs), graph.mode, dict(graph.meta), source, graph.base_dir,
                {n.id: n for n in nodes})
    # Topological numbers in one pass: the input graph's nodes by their own numbers (each after the nodes
    # it feeds), each node's copies just before it (a copy feeds a node of a lower number).
    order = []
    for n in sorted(graph.nodes, key=attrgetter("topo_nr")):
        order.extend(copies_of.get(n, ()))
        order.append(fresh[n])
    out.max_device_index = max_index
    derive(out, prepared=True, order=order)
    out.slot_dtypes = graph.slot_dtypes
    out.hooked_nodes = [fresh[n] for n in graph.hooked_nodes]
    out.parameters = list(graph.parameters)
    out.ddp, out.fsdp, out.storage = graph.ddp, graph.fsdp, graph.storage
    if graph.side_files is not None:
        side = graph.side_files
        out.side_files = SideFiles(side.base_dir, side.default_name, source)
        out.side_files.seed_offset = side.seed_offset
    return out
