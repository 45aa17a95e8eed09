"""Run a loaded graph as its file says: root gradients, mode, requested inputs.

``run_graph`` is what the command line calls: it materialises the roots'
gradients, chooses ``backward`` or ``grad`` and returns the gradients by
name (variables for backward, requested inputs for grad).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autograd_run.engine import core
from autograd_run.engine.state import GraphState
from autograd_run.graphs import tensors
from autograd_run.graphs.checkpoints import inner_variables
from autograd_run.graphs.model import Edge, Graph
from autograd_run.ops import CHECKPOINT


def root_gradients(graph: Graph) -> list:
    out = []
    for r in graph.roots:
        meta = r.edge.node.inputs[r.edge.input_nr]
        out.append(tensors.materialize(r.grad, graph.side_files, meta.shape, meta.dtype))
    return out


@dataclass
class RunResult:
    mode: str
    #: backward: variable name -> accumulated grad; grad: input name -> captured grad.
    grads: dict[str, Any] = field(default_factory=dict)


#: PyTorch's texts (torch/csrc/autograd/python_engine.cpp, torch 2.13) for requested inputs it cannot serve.
ERR_NOT_REQUIRES_GRAD = "One of the differentiated Tensors does not require grad"
ERR_RETAIN_GRAD = "can't retain_grad on Tensor that has requires_grad=False"
ERR_UNUSED = ("The differentiated Tensor at index {} appears to not have been used in the graph. "
              "Set allow_unused=True if this is the desired behavior.")


def run_graph(engine, graph: Graph, state: GraphState | None = None, *, mode: str | None = None,
              inputs: list[str] | None = None, retain_graph: bool | None = None, create_graph: bool = False,
              anomaly: bool = False, faults: dict[str, str] | None = None, grads: list | None = None,
              allow_unused: bool = False) -> RunResult:
    """Run ``graph``'s backward as ``torch.autograd.backward`` or ``grad`` would, with PyTorch's input checks.

    Requested inputs are variables or node ids. As PyTorch: a variable that
    does not require grad is refused (``grad()``: "One of the differentiated
    Tensors does not require grad"; ``backward(inputs=)``, which retains the
    inputs' gradients: "can't retain_grad on Tensor that has
    requires_grad=False"); a variable the graph does not reach gets no
    gradient, which ``grad()`` refuses unless ``allow_unused`` ("The
    differentiated Tensor at index i appears to not have been used in the
    graph. ...").

    ``grads``: the root gradients, when already materialised (else they are, from the file).
    """
    from autograd_run.errors import RequestError
    state = state or GraphState(graph)
    mode = mode or graph.mode
    names = list(inputs) if inputs is not None else list(graph.inputs)
    if inputs is not None:
        graph = _with_inputs(graph, names)
    reached = []   # (index among the inputs, edge) of the inputs the graph reaches
    for i, name in enumerate(names):
        var = graph.variables.get(name)
        if var is not None and not var.requires_grad:
            raise RequestError(ERR_NOT_REQUIRES_GRAD if mode == "grad" else ERR_RETAIN_GRAD, "inputs")
        if var is not None and var.node is None:
            continue  # unreachable: PyTorch's Identity edge, never reached
        reached.append((i, Edge(var.node if var is not None else graph.by_id[name], 0)))
    edges = [e for _, e in reached]
    roots = [r.edge for r in graph.roots]
    if grads is None:
        grads = root_gradients(graph)
    kw = dict(retain_graph=retain_graph, create_graph=create_graph, anomaly=anomaly, faults=faults)
    if mode == "grad":
        captured = [None] * len(names)
        if edges:
            got = engine.execute(state, roots, grads, accumulate_grad=False, inputs=edges, **kw)
            for (i, _), g in zip(reached, got):
                captured[i] = g
        if not allow_unused:
            for i, g in enumerate(captured):
                if g is None:
                    raise RequestError(ERR_UNUSED.format(i), "inputs")
        return RunResult("grad", dict(zip(names, captured)))
    if names and not edges:  # every requested input is out of reach: nothing runs, as in PyTorch
        return RunResult("backward", _user_grads(graph, state))
    retained = _retain_grads(state, graph, names)
    engine.execute(state, roots, grads, accumulate_grad=True, inputs=edges or None, **kw)
    return RunResult("backward", _user_grads(graph, state, retained))


def _user_grads(graph: Graph, state: GraphState, retained: dict | None = None) -> dict:
    nodes = graph.nodes
    hidden = inner_variables(graph, core.nodes_of_op(nodes, CHECKPOINT)
                             if core.nodes_of_op is not None and type(nodes) is list else None)
    out = {k: v for k, v in state.grads.items() if k not in hidden}
    out.update(retained or {})
    return out


def _retain_grads(state: GraphState, graph: Graph, names: list[str]) -> dict[str, Any]:
    """``backward(inputs=[t])`` with a non-leaf ``t`` accumulates into ``t.grad`` (PyTorch calls
    ``t.retain_grad()`` for it): a retains-grad hook on that node's input slot 0 does the same here.
    Returns the dict the hooks fill, by input name."""
    nodes = [n for n in names if n not in graph.variables]
    retained: dict[str, Any] = {n: None for n in nodes}

    def hook(name):
        def fn(grad):
            if grad is not None:
                old = retained[name]
                retained[name] = grad.copy() if old is None else old + grad
        return fn

    for n in nodes:
        state.register_retains_grad_hook(graph.by_id[n], 0, hook(n))
    return retained


def _with_inputs(graph: Graph, names: list[str]) -> Graph:
    from autograd_run.errors import RequestError
    if not names:
        raise RequestError("no inputs given", "inputs")
    for n in names:
        if n not in graph.variables and n not in graph.by_id:
            raise RequestError(f"{n!r} is neither a variable nor a node id of {graph.source}", "inputs")
    import copy
    g = copy.copy(graph)
    g.inputs = names
    return g
