"""Write a ``Graph`` back out: ``graph_to_dict`` then JSON (msgspec) or YAML.

``load(dump(g))`` is equivalent to ``g``: same nodes, edges, metadata,
roots, variables, inputs, mode and meta. Defaults are omitted.
"""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from autograd_run.graphs.model import ACCUMULATE_GRAD_SEQ, CPU, FORMAT, Graph, InputMeta
from autograd_run.ops import ACCUMULATE_GRAD


def _meta(m: InputMeta) -> dict[str, Any]:
    d: dict[str, Any] = {"shape": list(m.shape)}
    if m.dtype != "float32":
        d["dtype"] = m.dtype
    if m.device != CPU:
        d["device"] = str(m.device)
    if m.stream:
        d["stream"] = m.stream
    return d


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    nodes = []
    for n in graph.nodes:
        d: dict[str, Any] = {"id": n.id, "name": n.name}
        if n.op.name != n.name and n.name not in n.op.aliases:
            d["op"] = n.op.name
        if not (n.op is ACCUMULATE_GRAD and n.seq == ACCUMULATE_GRAD_SEQ):
            d["seq"] = n.seq
        if n.fwd_thread is not None:
            d["fwd_thread"] = n.fwd_thread
        if n.variable is not None:
            d["variable"] = n.variable
        if n.next:
            d["next"] = [None if e is None else [e.node.id, e.input_nr] for e in n.next]
        d["inputs"] = [_meta(m) for m in n.inputs]
        if n.saved:
            d["saved"] = n.saved
        if n.attrs:
            d["attrs"] = n.attrs
        nodes.append(d)
    out: dict[str, Any] = {"format": FORMAT}
    if graph.mode != "backward":
        out["mode"] = graph.mode
    out["roots"] = [{"node": r.edge.node.id, "input_nr": r.edge.input_nr, "grad": r.grad} for r in graph.roots]
    if graph.variables:
        out["variables"] = []
        for v in graph.variables.values():
            vd: dict[str, Any] = {"name": v.name, "shape": list(v.shape)}
            if v.dtype != "float32":
                vd["dtype"] = v.dtype
            if v.device != CPU:
                vd["device"] = str(v.device)
            if v.grad is not None:
                vd["grad"] = v.grad
            if not v.requires_grad:
                vd["requires_grad"] = False
            if v.hooks:
                vd["hooks"] = [dict(h) for h in v.hooks]
            out["variables"].append(vd)
    if graph.inputs:
        out["inputs"] = list(graph.inputs)
    if graph.parameters:
        out["parameters"] = list(graph.parameters)
    if graph.ddp is not None:
        out["ddp"] = dict(graph.ddp)
    if graph.fsdp is not None:
        out["fsdp"] = graph.fsdp
    if graph.storage is not None:
        out["storage"] = {"blocks": [[b, v] if v is not None else [b, None, g] if g is not None else [b]
                                     for b, v, g in graph.storage["blocks"]],
                          "saved": graph.storage["saved"]}
    if graph.meta:
        out["meta"] = graph.meta
    out["nodes"] = nodes
    return out


def dumps(doc: dict[str, Any], fmt: str) -> bytes:
    """``doc`` as JSON or YAML text; a document whose ``nodes`` are packed (``generators.PackedNodes``) as
    JSON only, the nodes' text spliced in as it is (the same bytes as encoding their dicts)."""
    nodes = doc.get("nodes")
    if hasattr(nodes, "pieces"):
        if fmt != "json":
            raise ValueError("packed nodes are written as JSON only")
        head = msgspec.json.encode({k: v for k, v in doc.items() if k != "nodes"})
        return b"".join([head[:-1], b"," if len(head) > 2 else b"", b'"nodes":[', b",".join(nodes.pieces), b"]}\n"])
    if fmt == "json":
        return msgspec.json.encode(doc) + b"\n"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100).encode()


def dump_graph(graph: Graph, path: str, fmt: str | None = None) -> None:
    if fmt is None:
        fmt = "yaml" if path.lower().endswith((".yaml", ".yml")) else "json"
    with open(path, "wb") as f:
        f.write(dumps(graph_to_dict(graph), fmt))
