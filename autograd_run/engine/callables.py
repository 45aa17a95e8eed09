"""Python callables shipped for ``python`` nodes (still run only with ``--allow-python``).

``checkpoint``: the reentrant pattern of ``torch.utils.checkpoint`` (the
reentrant variant). The node's ``attrs.segment_root`` names the root of a
separate segment graph and ``attrs.segment_input`` the node whose input
gradient is the segment's result; the callable runs a nested ``grad`` call
over the segment with the incoming gradient and returns what it captured.
"""

from __future__ import annotations


def checkpoint(ctx, grads):
    node = ctx.node
    root = ctx.edge(node.attrs["segment_root"], 0)
    target = ctx.edge(node.attrs["segment_input"], 0)
    (captured,) = ctx.grad([root], [grads[0]], inputs=[target])
    return [captured if e is not None else None for e in node.next]
