"""Semantic validation: a decoded ``GraphSpec`` becomes a checked ``Graph``.

Every problem raises ``GraphFileError`` naming the file, the place (through
the locator) and what is wrong. Checks, in order: format and mode; node ids,
ops, sequence numbers, input metadata; variables; edges (targets exist,
input_nr in range); AccumulateGrad wiring; cycles (reported as a path of
ids); gradient shapes between producers and consumers; roots and their
gradients; requested inputs; saved tensor specs and side files.
"""

from __future__ import annotations

import os
from typing import Any

from autograd_run.errors import GraphFileError
from autograd_run.graphs import tensors
from autograd_run.graphs.checkpoints import check_checkpoints
from autograd_run.graphs.model import (
    ACCUMULATE_GRAD_SEQ, EMPTY, FORMAT, Device, Edge, Graph, InputMeta, Node, Root, Variable, derive,
)
from autograd_run.ops import ACCUMULATE_GRAD, COST, GRAPH_ROOT, PYTHON, OpSpec, lookup
from autograd_run.graphs.schema import GraphSpec

MAX_NODES = 5_000_000  # about 5 GB of model objects: past this a file is a resource bomb here
MAX_STREAM = 1 << 16
#: A cost node may spin or sleep at most a minute, or multiply at most 8192x8192 matrices.
MAX_COST_US = 60e6
MAX_COST_FLOPS = 2 * 8192 ** 3


def is_expandable_to(shape: tuple[int, ...], desired: tuple[int, ...]) -> bool:
    """PyTorch's ``is_expandable_to``: can ``shape`` broadcast up to ``desired``?"""
    if len(shape) > len(desired):
        return False
    for i in range(1, len(shape) + 1):
        s, d = shape[-i], desired[-i]
        if s != d and s != 1:
            return False
    return True


class _Checker:
    def __init__(self, spec: GraphSpec, source: str, base_dir: str | None, locator,
                 side_name: str | None = None):
        self.spec = spec
        self.source = source
        self.locator = locator
        if side_name is None and base_dir:
            side_name = os.path.splitext(os.path.basename(source))[0] + ".npz"
        self.side = tensors.SideFiles(base_dir, side_name)
        self._metas: dict = {}
        self.base_dir = base_dir

    def err(self, path: tuple, what: str) -> GraphFileError:
        return GraphFileError(self.source, self.locator.where(path), what)

    # -- pieces -------------------------------------------------------------
    def device(self, text: Any, path: tuple) -> Device:
        dev = Device.parse(text) if isinstance(text, str) else None
        if dev is None:
            raise self.err(path, f"unknown device {text!r}; expected 'cpu' or 'cuda:N'")
        return dev

    def _meta(self, m, path: tuple) -> InputMeta:
        shape = tensors.check_shape(m.shape, path + ("shape",), self.err)
        tensors.check_dtype(m.dtype, path + ("dtype",), self.err)
        dev = self.device(m.device, path + ("device",))
        if not 0 <= m.stream < MAX_STREAM:
            raise self.err(path + ("stream",), f"stream must be in [0, {MAX_STREAM}), got {m.stream}")
        return InputMeta(shape, m.dtype, dev, m.stream)

    def resolve_op(self, ns, i: int) -> OpSpec:
        p = ("nodes", i)
        if not ns.name:
            raise self.err(p + ("name",), "node name must not be empty")
        op_text = ns.op if ns.op is not None else ns.name
        op = lookup(op_text)
        if op is GRAPH_ROOT:
            raise self.err(p + ("name",) if ns.op is None else p + ("op",),
                           "GraphRoot nodes are created by the engine, not declared in a file")
        if op is None:
            where = p + ("op",) if ns.op is not None else p + ("name",)
            hint = "" if ns.op is not None else " (give 'op: opaque' to replay it without a rule)"
            raise self.err(where, f"unknown op {op_text!r}{hint}")
        return op

    def check_accumulate(self, ns, i: int, inputs: list, variables: dict) -> list:
        p = ("nodes", i)
        if ns.variable is None:
            raise self.err(p, "an AccumulateGrad node needs 'variable'")
        var = variables.get(ns.variable)
        if var is None:
            raise self.err(p + ("variable",), f"unknown variable {ns.variable!r}")
        if var.node is not None:
            raise self.err(p + ("variable",), f"variable {ns.variable!r} already has AccumulateGrad node {var.node.id!r}")
        if not var.requires_grad:
            raise self.err(p + ("variable",), f"variable {ns.variable!r} does not require grad: it has no AccumulateGrad node")
        if ns.next:
            raise self.err(p + ("next",), "an AccumulateGrad node has no next edges")
        if not inputs:
            inputs = [InputMeta(var.shape, var.dtype, var.device, 0)]
        if len(inputs) != 1:
            raise self.err(p + ("inputs",), "an AccumulateGrad node has exactly one input")
        if inputs[0].shape != var.shape:
            raise self.err(p + ("inputs", 0, "shape"),
                           f"input shape {list(inputs[0].shape)} does not match variable {var.name!r} shape {list(var.shape)}")
        return inputs

    # -- the whole graph ----------------------------------------------------
    def run(self) -> Graph:
        spec = self.spec
        if spec.format != FORMAT:
            raise self.err(("format",), f"unsupported format {spec.format!r}; expected {FORMAT!r}")
        if spec.mode not in ("backward", "grad"):
            raise self.err(("mode",), f"mode must be 'backward' or 'grad', got {spec.mode!r}")
        if len(spec.nodes) > MAX_NODES:
            raise self.err(("nodes",), f"{len(spec.nodes)} nodes is more than the limit of {MAX_NODES}")
        if not spec.nodes:
            raise self.err(("nodes",), "a graph needs at least one node")

        variables: dict[str, Variable] = {}
        for i, v in enumerate(spec.variables):
            p = ("variables", i)
            if not v.name:
                raise self.err(p + ("name",), "variable name must not be empty")
            if v.name in variables:
                raise self.err(p + ("name",), f"duplicate variable name {v.name!r}")
            shape = tensors.check_shape(v.shape, p + ("shape",), self.err)
            tensors.check_dtype(v.dtype, p + ("dtype",), self.err)
            dev = self.device(v.device, p + ("device",))
            if v.grad is not None:
                tensors.check_tensor(v.grad, p + ("grad",), self.err, self.side, shape, v.dtype, allow_fill=True)
            variables[v.name] = Variable(v.name, shape, v.dtype, dev, v.grad, requires_grad=v.requires_grad)

        nodes: list[Node] = []
        by_id: dict[str, Node] = {}
        ops: dict[str, OpSpec] = {}
        metas = self._metas
        new_node = Node
        acc = ACCUMULATE_GRAD
        max_seq = ACCUMULATE_GRAD_SEQ
        for i, ns in enumerate(spec.nodes):
            nid = ns.id
            if not nid or nid in by_id:
                p = ("nodes", i, "id")
                raise self.err(p, "node id must not be empty" if not nid else f"duplicate node id {nid!r}")
            op_text = ns.op if ns.op is not None else ns.name
            op = ops.get(op_text)
            if op is None:
                op = ops[op_text] = self.resolve_op(ns, i)
            seq = ns.seq
            if seq is not None and not 0 <= seq <= max_seq:
                raise self.err(("nodes", i, "seq"), f"seq must be in [0, 2**64-1], got {seq}")
            if ns.fwd_thread is not None and not 0 <= ns.fwd_thread < 2**63:
                raise self.err(("nodes", i, "fwd_thread"), f"fwd_thread must be in [0, 2**63), got {ns.fwd_thread}")
            ins = ns.inputs
            if len(ins) == 1:  # the common case, without a comprehension's frame
                meta = metas.get(ins[0])
                if meta is None:
                    meta = metas[ins[0]] = self._meta(ins[0], ("nodes", i, "inputs", 0))
                inputs = [meta]
            else:
                inputs = [metas.get(m) for m in ins]
                if None in inputs:
                    for j, m in enumerate(ins):
                        if inputs[j] is None:
                            inputs[j] = metas[m] = self._meta(m, ("nodes", i, "inputs", j))
            if op is acc:
                inputs = self.check_accumulate(ns, i, inputs, variables)
                if seq is None:
                    seq = max_seq
            elif ns.variable is not None:
                raise self.err(("nodes", i, "variable"), "only AccumulateGrad nodes name a variable")
            node = new_node(nid, ns.name, op, -1 if seq is None else seq, [], inputs, ns.saved or EMPTY,
                            ns.attrs or EMPTY, ns.variable)
            if ns.fwd_thread is not None:
                node.fwd_thread = ns.fwd_thread
            if op is acc:
                variables[ns.variable].node = node
            nodes.append(node)
            by_id[nid] = node

        # Edges.
        make_edge = tuple.__new__
        for i, ns in enumerate(spec.nodes):
            out = nodes[i].next
            for k, e in enumerate(ns.next):
                if e is None:
                    out.append(None)
                    continue
                tid, nr = e
                target = by_id.get(tid)
                if target is None:
                    raise self.err(("nodes", i, "next", k, 0), f"edge to missing node {tid!r}")
                if not 0 <= nr < len(target.inputs):
                    raise self.err(("nodes", i, "next", k, 1),
                                   f"input_nr {nr} out of range: node {tid!r} has {len(target.inputs)} input(s)")
                out.append(make_edge(Edge, (target, nr)))

        graph = Graph(nodes, [], variables, list(spec.inputs), spec.mode, dict(spec.meta),
                      self.source, self.base_dir, by_id)
        try:
            derive(graph)
        except ValueError as exc:
            cycle = exc.args[0]
            src = cycle[-2]
            k = next(k for k, e in enumerate(src.next) if e is not None and e.node is cycle[-1])
            raise self.err(("nodes", src.index, "next", k), "cycle: " + " -> ".join(n.id for n in cycle)) from None
        # Default sequence numbers: the topological number (nodes nearer the root run first).
        for node in nodes:
            if node.seq < 0:
                node.seq = node.topo_nr
        self.check_shapes(nodes)
        self.check_saved(spec, nodes)
        self.check_attrs(nodes)
        check_checkpoints(graph, self.err)

        for i, r in enumerate(spec.roots):
            p = ("roots", i)
            target = by_id.get(r.node)
            if target is None:
                raise self.err(p + ("node",), f"root edge to missing node {r.node!r}")
            if not 0 <= r.input_nr < len(target.inputs):
                raise self.err(p + ("input_nr",),
                               f"input_nr {r.input_nr} out of range: node {r.node!r} has {len(target.inputs)} input(s)")
            meta = target.inputs[r.input_nr]
            tensors.check_tensor(r.grad, p + ("grad",), self.err, self.side, meta.shape, meta.dtype, allow_fill=True)
            graph.roots.append(Root(Edge(target, r.input_nr), r.grad))
        if not graph.roots:
            raise self.err(("roots",), "a graph needs at least one root")

        for i, name in enumerate(spec.inputs):
            var = variables.get(name)
            if var is None and name not in by_id:
                raise self.err(("inputs", i), f"unknown input {name!r}: not a variable or node id")
        if spec.mode == "grad" and not spec.inputs:
            raise self.err(("inputs",), "mode 'grad' needs 'inputs' (grad requires non-empty inputs)")
        return graph

    def check_shapes(self, nodes: list[Node]) -> None:
        for i, node in enumerate(nodes):
            if node.op.elementwise and node.inputs:
                out_shape = node.inputs[0].shape
                for k, e in enumerate(node.next):
                    if e is None:
                        continue
                    want = e.node.inputs[e.input_nr].shape
                    if want != out_shape and not is_expandable_to(want, out_shape):
                        raise self.err(("nodes", i, "next", k),
                                       f"{node.name} produces a gradient of shape {list(out_shape)} for "
                                       f"{e.node.id!r} input {e.input_nr}, whose shape {list(want)} is not compatible")

    def check_attrs(self, nodes: list[Node]) -> None:
        """The attrs the engine acts on must be well-formed and bounded (files are untrusted)."""
        for i, node in enumerate(nodes):
            attrs = node.attrs
            if not attrs:
                continue
            p = ("nodes", i, "attrs")
            if "fail" in attrs and not isinstance(attrs["fail"], str):
                raise self.err(p + ("fail",), "attrs.fail must be a message string")
            if "nan" in attrs and not isinstance(attrs["nan"], bool):
                raise self.err(p + ("nan",), "attrs.nan must be true or false")
            if "trace" in attrs and not isinstance(attrs["trace"], str):
                raise self.err(p + ("trace",), "attrs.trace must be a string")
            if node.op is PYTHON and "callable" in attrs and not (
                    isinstance(attrs["callable"], str) and ":" in attrs["callable"]):
                raise self.err(p + ("callable",), "attrs.callable must be 'module:function'")
            if node.op is COST:
                self.check_cost(attrs.get("cost"), p + ("cost",))

    def check_cost(self, cost, p: tuple) -> None:
        if cost is None:
            return
        if not isinstance(cost, dict) or not set(cost) <= {"us", "flops", "mode"}:
            raise self.err(p, "attrs.cost must be a mapping with 'us' or 'flops' and an optional 'mode'")
        mode = cost.get("mode", "spin")
        if mode not in ("spin", "wait", "sleep", "matmul"):
            raise self.err(p + ("mode",), f"cost mode must be spin, wait, sleep or matmul, got {mode!r}")
        for key, limit in (("us", MAX_COST_US), ("flops", MAX_COST_FLOPS)):
            v = cost.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= limit:
                raise self.err(p + (key,), f"cost {key} must be a number in [0, {limit:g}], got {v!r}")

    def check_saved(self, spec: GraphSpec, nodes: list[Node]) -> None:
        check = tensors.check_tensor
        quick_random = tensors.quick_random_ok
        for i, node in enumerate(nodes):
            saved = node.saved
            if not saved:
                continue
            elementwise = node.op.elementwise and node.inputs
            for key, value in saved.items():
                if type(value) is dict and (quick_random(value) or tensors.is_tensor_spec(value)):
                    if not quick_random(value):
                        check(value, ("nodes", i, "saved", key), self.err, self.side)
                    if elementwise:
                        self.check_broadcast(value, node, ("nodes", i, "saved", key), key)

    def check_broadcast(self, value: dict, node: Node, path: tuple, key: str) -> None:
        """An elementwise op's saved tensor must broadcast with the gradient it multiplies."""
        if "shape" in value:
            shape = tuple(value["shape"])
        elif "data" in value:
            shape = tensors._nested_shape(value["data"], path, self.err)
        else:
            return  # npz: the shape is only known by reading the array
        grad = node.inputs[0].shape
        for a, b in zip(reversed(shape), reversed(grad)):
            if a != b and a != 1 and b != 1:
                raise self.err(path, f"saved {key!r} has shape {list(shape)}, which does not broadcast "
                                     f"with the node's gradient shape {list(grad)}")


def build_graph(spec: GraphSpec, source: str, base_dir: str | None, locator,
                side_name: str | None = None) -> Graph:
    checker = _Checker(spec, source, base_dir, locator, side_name)
    graph = checker.run()
    graph.side_files = checker.side
    return graph
