"""A one-process process group for capturing a model wrapped in DistributedDataParallel.

DDP needs a process group even to build; a capture needs only one rank.
``one_process_group()`` starts a gloo group of one process (an in-memory
store; gloo on the loopback interface, so no host name is looked up) unless
one is initialised already, and returns whether it started one;
``end_process_group()`` ends the one it started. ``autograd-run capture``
ends it after the script's function returns. A DDP model captured with
``from_torch(loss, parameters=ddp_model)`` records its parameters and its
settings (the graph file's ``parameters`` and ``ddp``; ``simulate --ddp
captured``).
"""

from __future__ import annotations

import datetime
import os

#: Whether the group of this process was started here (and so is ours to end).
_started = False


def one_process_group() -> bool:
    """Start a one-process gloo group unless one exists; True when this call started it."""
    global _started
    import torch.distributed as dist
    if dist.is_initialized():
        return False
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    _started = True
    return True


def end_process_group() -> None:
    """End the group ``one_process_group`` started (nothing when it started none)."""
    global _started
    if _started:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
        _started = False
