"""The PyTorch side: real backward graphs captured, PyTorch's own orders and costs recorded, replays checked.

``graph``    ``from_torch``: a live autograd graph (from a loss or outputs) to a graph document, with its
             saved tensors in a side file and PyTorch's reference order and gradients;
``inner``    what a custom Function's backward builds (checkpoint-like nodes get their inner graphs);
``hooks``    tensor and node hooks seen during capture, reported;
``profile``  ``capture --profile``: each node's cost measured by torch.profiler, stored in the graph;
``golden``   golden orders from real PyTorch (node identities across processes; the pytest plugin's);
``check``    a captured graph replayed and compared with PyTorch's order and gradients;
``distributed`` ``one_process_group``: the one-rank gloo group a DistributedDataParallel model needs to be
             built and captured (``from_torch(loss, parameters=ddp_model)`` records its settings).

``from autograd_run.capture import from_torch`` is the public entry point.
"""

from autograd_run.capture.distributed import one_process_group
from autograd_run.capture.graph import from_torch

__all__ = ["from_torch", "one_process_group"]
