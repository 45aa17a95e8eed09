"""Node kinds the engine implements itself (their behaviour is in ``engine.builtin_nodes``).

Declared here so that the graph format, validation and capture know every
name a file may use; the engine checks at import that each has exactly one
implementation.
"""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.spec import engine_op

ACCUMULATE_GRAD = engine_op(
    "AccumulateGrad", "accumulates its gradient into a leaf variable (one input, no outputs)",
    aliases=("torch::autograd::AccumulateGrad",), cost=cost.pointwise(1))
GRAPH_ROOT = engine_op(
    "GraphRoot", "created by the engine for a backward call with several roots; never in a file",
    cost=cost.VIEW, views="same")
IDENTITY = engine_op(
    "identity", "passes each gradient through unchanged", elementwise=True, cost=cost.VIEW, views="same",
    aliases=("torch::autograd::Identity",))  # PyTorch's own (forward-mode AD's make_dual/unpack_dual make it)
COST = engine_op(
    "cost", "does a stated amount of real work (attrs.cost), then emits zeros of the declared shapes")
OPAQUE = engine_op(
    "opaque", "an op without a rule: zeros of the shapes its consumers declare", cost=cost.COPY)
PYTHON = engine_op(
    "python", "a Python callable (attrs.callable); may call the engine again (reentrant); needs --allow-python")
CHECKPOINT = engine_op(
    "checkpoint", "a reentrant checkpoint (torch.utils.checkpoint, use_reentrant=True): a nested backward over the "
    "recomputed graph that attrs.inner names; its outputs are the gradients of the recomputation's inputs")


def is_graph_root(node) -> bool:
    """Whether ``node`` is the engine's synthetic GraphRoot (not a node of the graph file)."""
    return node.op is GRAPH_ROOT
