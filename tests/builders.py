"""Test graphs in a few words, written the way the graph reads.

    g = graph(doc(
        total("sum", "add", seq=3, shape=[2]),   # d = (b + c).sum()
        add("add", "mb", "mc", seq=2, shape=[2]),
        mul("mb", "acc", 2.0, seq=0, shape=[2]),  # b = a * 2
        mul("mc", "acc", 3.0, seq=1, shape=[2]),  # c = a * 3
        leaf("a", [2], id="acc"),
    ))

``node`` is any node (``mul``, ``add``, ``total``, ``fan``, ``cost`` and ``chain``
are common shapes of it); ``leaf`` is a variable with its AccumulateGrad node;
``doc`` assembles the graph document (the first node is the root unless
``roots`` says otherwise; each ``leaf`` declares its variable); ``graph``
loads a document with the product's own loader, as a file would be.

Then ``executed(g)`` is the order the engine ran the nodes in,
``recording(g)`` what a profiled run recorded, and ``run_cli(args, capsys)``
runs the command line and returns its exit code, stdout and stderr.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import pytest

from autograd_run.graphs.dump import dumps
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.graphs.model import FORMAT, Graph

#: A next edge: a node id (its input 0), (node id, input_nr), or None (no gradient flows).
Edge = Union[str, tuple[str, int], None]


# -- documents ---------------------------------------------------------------------------------

def meta(shape: Sequence[int], device: str | None = None, stream: int | None = None) -> dict:
    """A tensor's metadata: ``{"shape": [...]}`` plus whatever is given."""
    m: dict[str, Any] = {"shape": list(shape)}
    if device is not None:
        m["device"] = device
    if stream is not None:
        m["stream"] = stream
    return m


def _edge(e) -> list | None:
    if e is None:
        return None
    if isinstance(e, str):
        return [e, 0]
    return [e[0], e[1]]


def _meta(m) -> dict:
    return dict(m) if isinstance(m, dict) else meta(m)


def node(id: str, name: str, *, op: str | None = None, seq: int | None = None, next: Sequence | None = None,
         inputs: Sequence | None = None, saved: dict | None = None, attrs: dict | None = None) -> dict:
    """A node. ``next`` edges are node ids (input 0), ``(id, input_nr)`` or None (no gradient);
    ``inputs`` are shapes or ``meta(...)`` dicts. Fields left out are left out of the document."""
    d: dict[str, Any] = {"id": id, "name": name}
    if op is not None:
        d["op"] = op
    if seq is not None:
        d["seq"] = seq
    if next is not None:
        d["next"] = [_edge(e) for e in next]
    if inputs is not None:
        d["inputs"] = [_meta(m) for m in inputs]
    if saved is not None:
        d["saved"] = saved
    if attrs is not None:
        d["attrs"] = attrs
    return d


class _Leaf(dict):
    """An AccumulateGrad node that remembers the variable it accumulates into."""

    variable: dict


def leaf(name: str, shape: Sequence[int], *, id: str | None = None, device: str | None = None) -> dict:
    """Variable ``name`` of ``shape`` and its AccumulateGrad node (id ``acc_<name>`` unless given)."""
    n = _Leaf(id=id or f"acc_{name}", name="AccumulateGrad", variable=name)
    n.variable = {"name": name, **meta(shape, device=device)}
    return n


def mul(id: str, x: Edge, by: Any, *, seq: int, shape: Sequence[int]) -> dict:
    """``x * by`` (``by`` a constant: no gradient flows to it)."""
    return node(id, "MulBackward0", seq=seq, next=[x, None], inputs=[shape], saved={"other": by})


def add(id: str, a: Edge, b: Edge, *, seq: int, shape: Sequence[int]) -> dict:
    """``a + b``."""
    return node(id, "AddBackward0", seq=seq, next=[a, b], inputs=[shape])


def total(id: str, x: Edge, *, seq: int, shape: Sequence[int]) -> dict:
    """``x.sum()`` of an ``x`` of ``shape``."""
    return node(id, "SumBackward0", seq=seq, next=[x], inputs=[[]], saved={"self_sym_sizes": list(shape)})


def fan(id: str, branches: Sequence[Edge], *, seq: int | None = None, shape: Sequence[int] = (2,)) -> dict:
    """A node handing its gradient, unchanged, to every branch (in this order)."""
    return node(id, "Fan", op="identity", seq=seq, next=list(branches), inputs=[shape])


def cost(id: str, next: Sequence[Edge], us: float, *, seq: int, mode: str = "sleep",
         shape: Sequence[int] = (2,), device: str | None = None) -> dict:
    """A ``cost`` node (on ``device``): ``us`` microseconds of work (``sleep`` by default), then zeros
    to each of ``next``."""
    return node(id, "CostBackward", op="cost", seq=seq, next=list(next), inputs=[meta(shape, device)],
                attrs={"cost": {"us": us, "mode": mode}})


def chain(n: int, op: str = "mul", *, variable: str = "x", shape: Sequence[int] = (2,)) -> list[dict]:
    """``y = x``, then ``y = y * 2`` (or ``y = y + 1``) ``n`` times: nodes ``<op><n-1>`` (the root,
    seq n-1) down to ``<op>0`` (seq 0), then the leaf of ``x``."""
    nodes = []
    for i in reversed(range(n)):
        below = f"{op}{i - 1}" if i else f"acc_{variable}"
        if op == "mul":
            nodes.append(mul(f"mul{i}", below, 2.0, seq=i, shape=shape))
        elif op == "add":
            nodes.append(node(f"add{i}", "AddBackward0", seq=i, next=[below, None], inputs=[shape]))
        else:
            raise ValueError(f"chain op must be mul or add, not {op!r}")
    return nodes + [leaf(variable, shape)]


def doc(*nodes: dict, roots: str | Sequence | None = None, **fields) -> dict:
    """The graph document of ``nodes``. ``roots``: node ids (gradient ``ones``) or root dicts, the
    first node by default; the variables are the leaves'; ``fields``: more, e.g. ``mode``."""
    if roots is None:
        roots = [nodes[0]["id"]]
    elif isinstance(roots, str):
        roots = [roots]
    d: dict[str, Any] = {"format": FORMAT,
                         "roots": [{"node": r, "grad": "ones"} if isinstance(r, str) else dict(r) for r in roots]}
    declared = [n.variable for n in nodes if isinstance(n, _Leaf)]
    if declared:
        d["variables"] = [dict(v) for v in declared]
    d.update(fields)
    d["nodes"] = [dict(n) for n in nodes]  # plain dicts: YAML's safe dumper refuses subclasses
    return d


def parts_graph(nodes: Sequence[dict], roots: Sequence, variables: Sequence[dict] = (), *, source: str = "test.json",
                **fields) -> Graph:
    """A graph from its parts as a document lists them (nodes, roots, variables, other top-level fields),
    through the loader (so it is validated as a file would be); ``source`` names it in messages."""
    d = {"format": "autograd-graph/1", "roots": list(roots), "variables": list(variables), "nodes": list(nodes),
         **fields}
    return loads_graph(dumps(d, "json"), source)


def graph(d: dict, fmt: str = "json", folder=None) -> Graph:
    """Load document ``d`` as the file ``g.<fmt>`` would be loaded (from ``folder`` when given, so
    side files beside it are found; else from memory)."""
    data = dumps(d, fmt)
    if folder is not None:
        path = folder / f"g.{fmt}"
        path.write_bytes(data)
        return load_graph(str(path))
    return loads_graph(data, f"g.{fmt}")


# -- running -----------------------------------------------------------------------------------

def run_traced(g: Graph, tracer, *, devices: str | None = None, multithreading: bool = True,
               allow_python: bool = False, priority=None, **run_kw):
    """One ``run_graph`` of ``g`` on a fresh engine with ``tracer``; the engine is shut down after."""
    from autograd_run.engine import DeviceSet, Engine
    from autograd_run.engine.run import run_graph
    eng = Engine(DeviceSet(devices) if devices else None, tracer=tracer, priority=priority,
                 multithreading=multithreading, allow_python=allow_python)
    try:
        return run_graph(eng, g, **run_kw)
    finally:
        eng.shutdown(timeout=5)


def executed(g: Graph, *, multithreading: bool = False, **kw) -> list[str]:
    """The ids of the nodes the engine ran, in order (on the calling thread unless told)."""
    from autograd_run.record.order_recorder import OrderRecorder
    rec = OrderRecorder()
    run_traced(g, rec, multithreading=multithreading, **kw)
    return rec.ids()


def recording(g: Graph, *, fails: bool = False, **kw):
    """The ``Recording`` of one profiled run; with ``fails`` the run must raise a ``BackwardError``."""
    from autograd_run.errors import BackwardError
    from autograd_run.record.recorder import Recorder
    rec = Recorder()
    if fails:
        with pytest.raises(BackwardError):
            run_traced(g, rec, **kw)
    else:
        run_traced(g, rec, **kw)
    return rec.recording()


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """``autograd-run ARGS``: (exit code, stdout, stderr)."""
    from autograd_run.cli.main import main
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


# -- sweeps ------------------------------------------------------------------------------------

def write_sweep(folder, graphs: dict[str, dict], name: str = "sweep.yaml", **grid) -> str:
    """Write each graph document (file name -> document) into ``folder`` and a sweep spec over them.

    ``grid`` gives the spec's other keys (``devices=[1, 2]``, ``policy=[...]``, ``spec=["h100"]``);
    ``graphs_field`` replaces the spec's ``graphs`` list (the file names by default).
    """
    import yaml
    for fname, d in graphs.items():
        (folder / fname).write_bytes(dumps(d, "yaml" if fname.endswith((".yaml", ".yml")) else "json"))
    spec = {"graphs": grid.pop("graphs_field", list(graphs)), **grid}
    path = folder / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def stable_rows(rows: list[dict]) -> list[dict]:
    """A sweep's rows without what may differ between two sweeps of the same grid (time taken, cached)."""
    from autograd_run.sweep.results import VOLATILE
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]
