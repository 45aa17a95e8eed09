"""Graph files: the typed model, loading and validation, dumping, generators, examples."""

from autograd_run.graphs.model import Device, Edge, Graph, InputMeta, Node, Root, Variable
from autograd_run.graphs.load import load_graph, loads_graph
from autograd_run.graphs.dump import dump_graph, graph_to_dict

__all__ = [
    "Device", "Edge", "Graph", "InputMeta", "Node", "Root", "Variable",
    "load_graph", "loads_graph", "dump_graph", "graph_to_dict",
]
