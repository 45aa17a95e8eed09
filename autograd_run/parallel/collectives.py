"""What a collective costs: the alpha-beta model, per collective and algorithm.

A link is ``alpha`` (the latency of one message, us) and ``bandwidth`` (bytes/s
one rank sends at). For ``n`` bytes over ``p`` ranks (the standard analysis,
the one NCCL's performance notes base their "bus bandwidth" on: a ring
all-reduce moves ``2 (p - 1) / p`` of the buffer through every link):

  ring all-reduce      2 (p - 1) alpha + 2 (p - 1) / p * n / bandwidth
  tree all-reduce      2 ceil(log2 p) alpha + 2 n / bandwidth   (reduce up, broadcast down, pipelined)
  reduce-scatter       (p - 1) alpha + (p - 1) / p * n / bandwidth   (n: the whole unsharded buffer)
  all-gather           (p - 1) alpha + (p - 1) / p * n / bandwidth   (n: the gathered result)

One rank (``p == 1``) communicates nothing: 0. ``cost_ns(kind, n, p, link)``
is the table's entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autograd_run.errors import RequestError

#: The largest world a simulation takes (ranks are symmetric: this bounds the formulas, not the work).
MAX_WORLD = 1 << 20


@dataclass(frozen=True)
class Link:
    """A link between ranks: latency per message (us) and the bytes/s one rank sends at."""

    alpha_us: float
    bandwidth: float
    name: str = ""
    #: Collectives in flight at once per rank: NCCL's one communication stream (1); gloo's process group
    #: runs them on its worker threads (2 by default).
    channels: int = 1
    #: The speed of a collective while the rank's backward computes, against its speed alone: 1.0 when
    #: communication has hardware of its own; below 1 when it shares the cores with the compute (gloo on local
    #: processes: the compute thread and gloo's take turns; ``calibrate --gloo`` measures it, 0.42-0.44 here).
    during_compute: float = 1.0
    #: Where the figures come from (a network file's ``source``).
    source: str = ""
    #: How a reduce-scatter runs: ``reduce-scatter`` (the ring's (p - 1) / p of the buffer: NCCL), or
    #: ``allreduce`` (gloo: ProcessGroupGloo's ``_reduce_scatter_base`` all-reduces the whole buffer and keeps
    #: this rank's shard; seen in torch 2.13's profiles as ``gloo:all_reduce`` of the unsharded size).
    reduce_scatter: str = "reduce-scatter"

    def __post_init__(self):
        if not (0 < self.during_compute <= 1):
            raise RequestError(f"link during_compute must be in (0, 1], got {self.during_compute}", "network")
        if not (isinstance(self.channels, int) and 1 <= self.channels <= 64):
            raise RequestError(f"link channels must be a whole number from 1 to 64, got {self.channels}", "network")
        if self.reduce_scatter not in ("reduce-scatter", "allreduce"):
            raise RequestError(f"link reduce_scatter must be reduce-scatter or allreduce, got {self.reduce_scatter!r}",
                               "network")
        if not (self.alpha_us >= 0 and math.isfinite(self.alpha_us)):
            raise RequestError(f"link latency must be a finite number >= 0 us, got {self.alpha_us}", "network")
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise RequestError(f"link bandwidth must be a finite number > 0 bytes/s, got {self.bandwidth}",
                               "network")


def _ring(steps: int, fraction: float, nbytes: int, link: Link) -> float:
    return steps * link.alpha_us * 1e3 + fraction * nbytes / link.bandwidth * 1e9


def end_ns(start: int, work: int, compute_end: int, link: Link) -> int:
    """When a collective of ``work`` ns (at full speed) started at ``start`` ends, if it runs at
    ``link.during_compute`` of its speed until the compute ends at ``compute_end`` and at full speed after."""
    r = link.during_compute
    if start >= compute_end or r >= 1:
        return start + work
    done_by_end = (compute_end - start) * r
    if work <= done_by_end:
        return start + int(round(work / r))
    return compute_end + int(round(work - done_by_end))


def cost_ns(kind: str, nbytes: int, world: int, link: Link) -> int:
    """ns one collective of ``kind`` takes for ``nbytes`` over ``world`` ranks (see the module docstring)."""
    if not (isinstance(world, int) and 1 <= world <= MAX_WORLD):
        raise RequestError(f"world size must be a whole number from 1 to {MAX_WORLD}, got {world}", "world")
    if nbytes < 0:
        raise ValueError("a negative size")
    if world == 1:
        return 0
    p = world
    if kind == "reduce-scatter" and link.reduce_scatter == "allreduce":
        kind = "allreduce"
    if kind == "allreduce":
        t = _ring(2 * (p - 1), 2 * (p - 1) / p, nbytes, link)
    elif kind == "allreduce-tree":
        t = 2 * math.ceil(math.log2(p)) * link.alpha_us * 1e3 + 2 * nbytes / link.bandwidth * 1e9
    elif kind in ("reduce-scatter", "all-gather"):
        t = _ring(p - 1, (p - 1) / p, nbytes, link)
    else:
        raise RequestError(f"unknown collective {kind!r}; choose from allreduce, allreduce-tree, reduce-scatter, "
                           "all-gather", "collective")
    return int(round(t))
