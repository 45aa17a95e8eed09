"""Python callables shipped for ``python`` nodes (still run only with ``--allow-python``).

``checkpoint``: the reentrant pattern of ``torch.utils.checkpoint`` (the
reentrant variant). The node's ``attrs.segment_root`` names the root of a
separate segment graph and ``attrs.segment_input`` the node whose input
gradient is the segment's result; the callable runs a nested ``grad`` call
over the segment with the incoming gradient and returns what it captured.
As PyTorch's, it refuses to run inside a call with requested inputs
(``grad()`` or ``backward(inputs=)``), where checkpoints are not valid.
"""

from __future__ import annotations


#: PyTorch's text (torch.utils.checkpoint, reentrant variant) when checkpointing is not valid.
ERR_CHECKPOINT_INVALID = (
    "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing an `inputs` "
    "parameter to .backward(). To resolve this error, you can either set use_reentrant=False, or call "
    ".backward() without passing the `inputs` argument."
)


def checkpoint(ctx, grads):
    if not ctx.engine.is_checkpoint_valid():
        raise RuntimeError(ERR_CHECKPOINT_INVALID)
    node = ctx.node
    root = ctx.edge(node.attrs["segment_root"], 0)
    target = ctx.edge(node.attrs["segment_input"], 0)
    (captured,) = ctx.grad([root], [grads[0]], inputs=[target])
    return [captured if e is not None else None for e in node.next]
