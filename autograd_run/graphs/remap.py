"""A graph's nodes made again on other devices, with a copy node on every edge that crosses devices.

``remap_nodes`` is the loop that ``sim.placement`` runs over every node of a placed graph, ``remap_variables``
the one over its variables; both are compiled (``graphs/_build.c``), and the Python functions here are their
twins: same arguments, same result, field by field (``tests/test_placement.py`` runs both).
``AUTOGRAD_RUN_PURE_PYTHON=1`` uses these.

Arguments:

``olds``        the input graph's nodes in list order (``olds[i].index == i``), never changed;
``codes``       a list of ints, the device index of each node, or -1: "where the first node with an edge to
                it and a device index of its own is" (in list order, each node's edges in order; device 0
                when there is none): an AccumulateGrad follows its producer, as a parameter lives where it
                is used. Each -1 is replaced in place by the index chosen;
``devices``     the ``Device`` of each index;
``metas``       per device index, a dict id(input meta) -> that meta on the device (the loader interns
                metas, so few are distinct; keyed by identity, as hashing a frozen dataclass runs Python
                code; the input graph keeps each key's meta alive);
``copy_metas``  per device index, a dict id(a target's input meta) -> the input meta of a copy feeding it;
``make``, ``make_copy``: ``(meta, d)`` -> the meta to store on a miss in ``metas`` / ``copy_metas``;
``copy_op``     ``ToCopyBackward0``'s op spec;
``old_ids``     the input graph's ``by_id`` (a copy's id is one no node has).

Returns ``(nodes, fresh, by_id, order, max_index)``:

``nodes``       the new nodes in list order: each input node's copies listed just before it, every
                ``index`` set to its place;
``fresh``       the new node of each input node, by input index;
``by_id``       id -> new node;
``order``       the new nodes in an order where each comes after every node its edges point to: the input's
                nodes by increasing ``topo_nr`` (ties in list order), each preceded by its copies;
``max_index``   the highest device index of a node with inputs (-1: none).

Each new node shares its input node's id, name, op, seq, saved values, attrs, variable and forward thread
(a loaded graph is never changed); its next edges, input metas and consumers are new (consumers in list
order, each node's edges in order, as ``graphs.model.ensure_consumers`` makes them); ``topo_nr`` is left 0
for the caller (``order``). A copy ``copy{k}_{producer id}`` (``_`` appended until no node has it; k counts
the copies made so far) has the producer's seq, is on the producer's device, and takes the gradient in the
target slot's shape and dtype on stream 0.
"""

from __future__ import annotations

from operator import attrgetter

from autograd_run.graphs.model import Edge, Node
from autograd_run.graphs.validate import _FAST, _FAST_VARS, _GENERAL_KEYS


def remap_nodes_py(olds, codes, devices, metas, copy_metas, make, make_copy, copy_op, old_ids):
    # A node without a device (-1) goes where its first producer with a device goes: noted as -2 - device
    # meanwhile, so that a node placed this way does not pass its device on.
    for i, n in enumerate(olds):
        c = codes[i]
        if c >= 0:
            for e in n.next:
                if e is not None and codes[e[0].index] == -1:
                    codes[e[0].index] = -2 - c
    for i, c in enumerate(codes):
        if c < 0:
            codes[i] = -2 - c if c < -1 else 0
    fresh = []
    max_index = -1
    for i, n in enumerate(olds):
        d = codes[i]
        cache = metas[d]
        ins = []
        for m in n.inputs:
            got = cache.get(id(m))
            if got is None:
                got = cache[id(m)] = make(m, d)
            ins.append(got)
        new = Node(n.id, n.name, n.op, n.seq, [], ins, n.saved, n.attrs, n.variable, n.fwd_thread)
        new.consumers = []
        new.saves_tensors, new.saved_strings = n.saves_tensors, n.saved_strings
        if ins:
            new.device, new.stream, new.cpu = devices[d], ins[0].stream, False
            if d > max_index:
                max_index = d
        fresh.append(new)
    nodes = []
    by_id: dict = {_GENERAL_KEYS: None}  # taken out below (validate._GENERAL_KEYS says why)
    copies = 0
    for i, n in enumerate(olds):
        new, d = fresh[i], codes[i]
        nxt = new.next
        for out_nr, e in enumerate(n.next):
            if e is None:
                nxt.append(None)
                continue
            target, nr = e
            t = fresh[target.index]
            if codes[target.index] == d:
                nxt.append(Edge(t, nr))
                t.consumers.append((new, out_nr))
                continue
            cid = f"copy{copies}_{n.id}"
            while cid in old_ids or cid in by_id:
                cid += "_"
            copies += 1
            m = target.inputs[nr]
            cache = copy_metas[d]
            meta = cache.get(id(m))
            if meta is None:
                meta = cache[id(m)] = make_copy(m, d)
            copy = Node(cid, "ToCopyBackward0", copy_op, n.seq, [Edge(t, nr)], [meta])
            copy.consumers = [(new, out_nr)]
            copy.device, copy.cpu = devices[d], False
            t.consumers.append((copy, 0))
            copy.index = len(nodes)
            nodes.append(copy)
            by_id[cid] = copy
            nxt.append(Edge(copy, 0))
        new.index = len(nodes)
        nodes.append(new)
        by_id[new.id] = new
    order = []
    for n in sorted(olds, key=attrgetter("topo_nr")):
        i = n.index
        order.extend(nodes[fresh[i - 1].index + 1 if i else 0:fresh[i].index + 1])
    del by_id[_GENERAL_KEYS]
    return nodes, fresh, by_id, order, max_index


#: The loop in use: the compiled one where the loader's compiled loops are in use (``graphs.validate``), else
#: the twin; and the compiled topological numbering of an order, or None.
def remap_variables_py(variables: dict, fresh: list) -> dict:
    """name -> the variable on the remapped graph: a new ``Variable`` with each field of the old one but its node
    (``fresh[old node's index]``) and its device (the new node's, as a parameter lives where its gradient is;
    the old device where it has no node). Compiled: ``graphs/_build.c`` ``remap_variables``."""
    from autograd_run.graphs.model import Variable
    out = {}
    for name, v in variables.items():
        node = fresh[v.node.index] if v.node is not None else None
        out[name] = Variable(v.name, v.shape, v.dtype, v.device if node is None else node.device, v.grad, node,
                             v.requires_grad, v.hooks)
    return out


remap_nodes = _FAST.remap_nodes if _FAST is not None else remap_nodes_py
remap_variables = _FAST.remap_variables if _FAST is not None and _FAST_VARS else remap_variables_py
TOPO_IN = _FAST.topo_in if _FAST is not None else None
