"""What a ``python`` node's callable sees: its node, the run state, and a way back into the engine.

Calling ``ctx.backward``/``ctx.grad`` from inside a node is a *reentrant*
backward: the engine runs the nested GraphTask on this thread (one level
deeper) until this thread's nesting reaches the engine's limit (60, as
PyTorch), then hands it to a pool thread.
"""

from __future__ import annotations


class PythonNodeContext:
    def __init__(self, gt, node):
        self.graph_task = gt
        self.node = node
        self.engine = gt.engine
        self.state = gt.state
        self.graph = gt.state.graph

    @property
    def saved(self):
        return self.graph_task.saved(self.node)

    def edge(self, node_id: str, input_nr: int = 0):
        from autograd_run.graphs.model import Edge
        return Edge(self.graph.by_id[node_id], input_nr)

    def backward(self, roots, grads, **kw):
        return self.engine.execute(self.state, roots, grads, accumulate_grad=True, **kw)

    def grad(self, roots, grads, inputs, **kw):
        return self.engine.execute(self.state, roots, grads, accumulate_grad=False, inputs=inputs, **kw)

    def queue_callback(self, fn) -> None:
        self.graph_task.queue_callback(fn)
