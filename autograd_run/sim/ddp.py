"""A simulated backward under DistributedDataParallel: its buckets' all-reduces against its compute.

Ranks of data parallelism are symmetric, so one rank's simulated backward and
the collectives' costs are the simulation. From a ``SimReport``:

1. **Parameters** are the graph's variables that require grad, in the
   file's order (capture writes them in registration order, as DDP indexes
   them), each ``prod(shape) * itemsize`` bytes.
2. **Ready times.** DDP's hook runs after each parameter's AccumulateGrad
   node: a parameter is ready when that node's (first) run ends. Parameters
   no node reaches are marked ready when the compute ends (DDP's
   ``find_unused_parameters``).
3. **Buckets** (``parallel.buckets``): the initial ones for the first
   iteration, the rebuilt ones (in this ready order) after it.
4. **Launch.** A bucket is ready when its last parameter is; the Reducer
   launches buckets in index order only (a ready bucket waits for the ones
   before it), each all-reduce on the rank's one communication stream,
   after the previous one ends (``parallel.collectives.cost_ns``).
5. **The end.** The backward call returns when its compute is done and the
   final callback has waited for every bucket (``finalize_backward``).

``exposed_ns``: the time from the end of the compute to the end of the last
all-reduce (0 when all communication hid behind the compute);
``overlap``: the share of the communication time that ran under compute.
The compute itself is the simulation's (communication on CPU cores or SMs is
not charged to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.ops.cost import ITEMSIZE
from autograd_run.parallel import buckets as B
from autograd_run.parallel.collectives import Link, cost_ns


@dataclass
class BucketRun:
    index: int
    params: list[int]
    nbytes: int
    #: ns from the start of the backward: its last gradient ready, the all-reduce's start and end.
    ready_ns: int
    start_ns: int
    end_ns: int


@dataclass
class DdpResult:
    world: int
    iteration: str
    buckets: list[BucketRun]
    compute_ns: int
    wall_ns: int
    exposed_ns: int
    comm_ns: int
    #: Share of the communication that ran before the compute ended (1.0: all of it hidden).
    overlap: float
    #: Parameters no AccumulateGrad node reached (marked ready at the end), by name.
    unused: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"world": self.world, "iteration": self.iteration, "compute_ns": self.compute_ns,
                "wall_ns": self.wall_ns, "exposed_ns": self.exposed_ns, "comm_ns": self.comm_ns,
                "overlap": self.overlap, "unused": self.unused,
                "buckets": [b.__dict__ for b in self.buckets]}


def params_of(graph) -> list[B.Param]:
    out = []
    for v in graph.variables.values():
        if not v.requires_grad:
            continue
        size = ITEMSIZE.get(v.dtype)
        if size is None:
            raise RequestError(f"{graph.source}: variable {v.name!r} has dtype {v.dtype!r}, which DDP's bucket "
                               "sizes here do not know", "ddp")
        out.append(B.Param(len(out), math.prod(v.shape) * size, v.dtype, str(v.device), v.name))
    if not out:
        raise RequestError(f"{graph.source}: no variable requires grad: DDP has no parameter to reduce", "ddp")
    return out


def simulate_ddp(report, world: int, link: Link, bucket_cap_mb: float | None = None, *,
                 find_unused_parameters: bool = False, static_graph: bool = False,
                 iteration: str = "steady") -> DdpResult:
    """The DDP view of ``report`` (a ``sim.session.SimReport``) on ``world`` ranks joined by ``link``."""
    if iteration not in ("first", "steady"):
        raise RequestError(f"iteration must be first or steady, got {iteration!r}", "ddp")
    sim = report.sim
    t0 = min((g.start for g in sim.graph_tasks), default=0)
    compute = report.engine_done_ns
    params = params_of(report.graph)
    index = {p.name: p.index for p in params}
    ready: dict[int, int] = {}
    for s in sim.slices:  # (gt, depth, node, tid, start, end, queue, pushed)
        name = getattr(s[2], "variable", None)
        if name in index and index[name] not in ready:
            ready[index[name]] = s[5] - t0
    order = sorted(ready, key=lambda i: (ready[i], i))
    unused = [p.name for p in params if p.index not in ready]
    for p in params:
        ready.setdefault(p.index, compute)
    if iteration == "first":
        groups = B.initial(params, bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                           static_graph=static_graph)
    else:
        groups = B.steady(params, order, bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                          static_graph=static_graph)
    nbytes = B.sizes(groups, params)
    runs, launch, free = [], 0, 0
    for k, (g, n) in enumerate(zip(groups, nbytes)):
        r = max(ready[i] for i in g)
        launch = max(launch, r)  # launched in index order only
        start = max(launch, free)
        free = start + cost_ns("allreduce", n, world, link)
        runs.append(BucketRun(k, list(g), n, r, start, free))
    comm = sum(b.end_ns - b.start_ns for b in runs)
    wall = max(compute, free)
    hidden = sum(max(0, min(b.end_ns, compute) - b.start_ns) for b in runs)
    return DdpResult(world, iteration, runs, compute, wall, wall - compute, comm,
                     hidden / comm if comm else 1.0, unused)
