"""DDP's gradient buckets, assigned as PyTorch's DistributedDataParallel and its C++ Reducer assign them.

Facts (torch 2.13: ``torch/nn/parallel/distributed.py``, ``BucketCapacityConfig`` and
``_ddp_init_helper``; ``torch/csrc/distributed/c10d/reducer.cpp``,
``compute_bucket_assignment_by_size`` and ``Reducer::rebuild_buckets``):

* **One assignment rule** (``assign``): walk the parameters in the given
  order, one accumulator per (dtype, device); add each parameter's bytes to
  its accumulator; when the accumulator reaches the current size limit
  (``>=``), it becomes a bucket and that (dtype, device) moves on to the next
  limit of the list (the last one repeats). What is left in each accumulator
  becomes a bucket at the end. Without an explicit order (the initial
  assignment) buckets are sorted by their smallest parameter index; with
  one (the rebuild, in gradient-ready order) they stay in the order they
  closed.
* **Limits.** ``bucket_cap_mb`` (default 25 MiB; bytes are ``int(mb *
  2**20)``). The first bucket's cap is ``dist._DEFAULT_FIRST_BUCKET_BYTES``
  (1 MiB) when ``bucket_cap_mb`` is left at its default, else the cap itself.
  ``bucket_cap_mb_list`` gives the limits outright.
* **The initial assignment** (DDP's constructor), over the parameters in
  registration order: unless ``find_unused_parameters`` is on (and
  ``static_graph`` off), every parameter goes into one bucket (limit
  ``sys.maxsize``: the registration order need not be the order gradients
  are ready in); else limits ``[first cap, cap]`` (or ``[cap]`` when they are
  equal). The bucket list is then reversed (gradients are expected in the
  reverse of registration order).
* **The rebuild** (``rebuilt``; once, at the first forward after the first
  backward, when ``static_graph`` is on or ``find_unused_parameters`` off:
  ``Reducer::should_rebuild_buckets``; with unused parameters looked for
  every iteration the initial buckets stay, ``steady``. Under ``static_graph``
  it is one iteration later, at the third forward: the first backward's
  hooks only count (``delay_all_reduce``), so the second backward runs the
  constructor's buckets, launched by its hooks, and records the order; seen
  on 20 external models on 2 gloo ranks): the same rule over the
  parameters in the order their gradients became ready in the previous
  iteration (DDP's hook after each AccumulateGrad; ``find_unused_parameters``
  marks the unused ones ready at the end), with limits ``[first cap, cap]``.

Measured here (torch 2.13.0, gloo): 8 ``Linear(256, 256)`` with
``bucket_cap_mb=0.5`` start in one 2,105,344-byte bucket and rebuild into 4
buckets of 526,336 bytes holding parameters 15-12, 11-8, 7-4, 3-0
(``tests/test_ddp_buckets.py`` checks this and more against DDP itself).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

from autograd_run.errors import RequestError
#: The largest bucket cap a simulation takes, MiB (a graph file's ``ddp`` section is checked against it there).
from autograd_run.graphs.validate import MAX_CAP_MB  # noqa: F401

MIB = 1 << 20
#: ``bucket_cap_mb``'s default, and ``dist._DEFAULT_FIRST_BUCKET_BYTES``.
DEFAULT_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB


@dataclass(frozen=True)
class Param:
    """One parameter as DDP sees it: its index in registration order, its size in bytes, dtype and device."""

    index: int
    nbytes: int
    dtype: str = "float32"
    device: str = "cpu"
    name: str = ""


def caps(bucket_cap_mb: float | None = None, bucket_cap_mb_list: Sequence[float] | None = None) -> list[int]:
    """The size limits of the rebuild, [first bucket's cap, cap] (one entry when they are equal)."""
    if bucket_cap_mb_list:
        if any(not (c > 0) for c in bucket_cap_mb_list):
            raise RequestError(f"bucket_cap_mb_list: every size must be positive, got {list(bucket_cap_mb_list)}",
                               "ddp")
        return [int(c * MIB) for c in bucket_cap_mb_list]
    if bucket_cap_mb is not None and not (bucket_cap_mb > 0):
        raise RequestError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}", "ddp")
    cap = int((DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    return [first, cap] if first < cap else [cap]


def assign(params: Sequence[Param], limits: Sequence[int], ordered: bool) -> list[list[int]]:
    """``compute_bucket_assignment_by_size``: the buckets (parameter indices) of ``params`` walked in the order
    given; ``ordered`` (the rebuild): keep the buckets in the order they closed, else sort them by their
    smallest index."""
    if not limits:
        raise ValueError("at least one size limit")
    out: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], int]] = {}  # (dtype, device) -> (indices, bytes)
    level: dict[tuple, int] = {}
    for p in params:
        key = (p.dtype, p.device)
        indices, size = open_.get(key, ([], 0))
        indices.append(p.index)
        size += p.nbytes
        k = level.setdefault(key, 0)
        if size >= limits[k]:
            out.append(indices)
            open_[key] = ([], 0)
            level[key] = min(k + 1, len(limits) - 1)
        else:
            open_[key] = (indices, size)
    # What is left, one bucket per (dtype, device). PyTorch walks its std::unordered_map of accumulators here;
    # libstdc++ links each new key in ahead of the older ones (at the list's head when its hash bucket is
    # empty, else at the head of that bucket's run), so with two keys the newest comes first: the reverse of
    # the order the keys were first seen (measured: two dtypes, tests/test_ddp_ranks.py). With three or more
    # keys sharing hash buckets the real order can differ; that case is not modelled.
    out.extend(indices for indices, _ in reversed(list(open_.values())) if indices)
    if not ordered:
        out.sort(key=min)
    return out


def initial(params: Sequence[Param], bucket_cap_mb: float | None = None, *, find_unused_parameters: bool = False,
            static_graph: bool = False, bucket_cap_mb_list: Sequence[float] | None = None) -> list[list[int]]:
    """The buckets DDP's constructor makes, in the order it hands them to the Reducer (reversed)."""
    params = sorted(params, key=lambda p: p.index)
    if bucket_cap_mb_list:
        limits = caps(None, bucket_cap_mb_list)
    elif static_graph or not find_unused_parameters:
        caps(bucket_cap_mb)  # validated all the same
        limits = [sys.maxsize]
    else:
        limits = caps(bucket_cap_mb)
    return list(reversed(assign(params, limits, ordered=False)))


def rebuilt(params: Sequence[Param], ready: Sequence[int], bucket_cap_mb: float | None = None, *,
            bucket_cap_mb_list: Sequence[float] | None = None) -> list[list[int]]:
    """The buckets of the rebuild: ``ready`` is the order the parameters' gradients became ready in (indices;
    parameters missing from it, unused ones, follow in index order, as ``find_unused_parameters`` marks them)."""
    by_index = {p.index: p for p in params}
    unknown = [i for i in ready if i not in by_index]
    if unknown:
        raise RequestError(f"the ready order names parameter index {unknown[0]}, which is not a parameter", "ddp")
    seen = set(ready)
    order = [by_index[i] for i in ready] + [p for p in sorted(params, key=lambda p: p.index) if p.index not in seen]
    return assign(order, caps(bucket_cap_mb, bucket_cap_mb_list), ordered=True)


def rebuilds(find_unused_parameters: bool = False, static_graph: bool = False) -> bool:
    """Whether the Reducer rebuilds its buckets after the first iteration (``should_rebuild_buckets``)."""
    return static_graph or not find_unused_parameters


def steady(params: Sequence[Param], ready: Sequence[int], bucket_cap_mb: float | None = None, *,
           find_unused_parameters: bool = False, static_graph: bool = False,
           bucket_cap_mb_list: Sequence[float] | None = None) -> list[list[int]]:
    """The buckets from the second iteration on: rebuilt in ``ready`` order, or the initial ones kept."""
    if rebuilds(find_unused_parameters, static_graph):
        return rebuilt(params, ready, bucket_cap_mb, bucket_cap_mb_list=bucket_cap_mb_list)
    return initial(params, bucket_cap_mb, find_unused_parameters=find_unused_parameters, static_graph=static_graph,
                   bucket_cap_mb_list=bucket_cap_mb_list)


def sizes(buckets: Sequence[Sequence[int]], params: Sequence[Param]) -> list[int]:
    """Each bucket's bytes."""
    nbytes = {p.index: p.nbytes for p in params}
    return [sum(nbytes[i] for i in b) for b in buckets]
