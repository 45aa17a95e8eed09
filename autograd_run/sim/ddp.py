"""A simulated backward under DistributedDataParallel: its buckets' all-reduces against its compute.

Ranks of data parallelism are symmetric, so one rank's simulated backward and
the collectives' costs are the simulation. From a ``SimReport``:

1. **Parameters**: the graph's ``parameters`` section (the model's
   parameters in registration order, as DDP indexes them: ``capture``
   records it when given the model), else the variables that require grad
   in the file's order; each ``prod(shape) * itemsize`` bytes.
2. **Ready times.** DDP's hook runs after each parameter's AccumulateGrad
   node: a parameter is ready when that node's (first) run ends, on an
   accelerator when its kernel ends (the all-reduce's stream waits for the
   compute stream; the compute ends with the last kernel). Parameters
   no node reaches (``find_unused_parameters``: found before the backward)
   are marked ready by the *first* hook of the backward, before its own
   parameter (``Reducer::autograd_hook``: ``has_marked_unused_parameters_``);
   with no hook at all, at the end.
3. **Buckets** (``parallel.buckets``): the initial ones for the first
   iteration, the rebuilt ones (in this ready order) after it.
4. **Launch.** A bucket is ready when its last parameter is; the Reducer
   launches buckets in index order only (a ready bucket waits for the ones
   before it): the parameter whose hook launches bucket ``k`` is the latest
   ready of buckets ``0..k`` (``trigger``). When the last bucket is launched
   and unused parameters are looked for every iteration
   (``find_unused_parameters`` without ``static_graph``), the Reducer also
   all-reduces its map of used parameters (one int32 per parameter,
   ``all_reduce_local_used_map``). Under ``static_graph`` the first
   iteration launches nothing from the hooks: the final callback launches
   the map, then every bucket (``delay_all_reduce``). Collectives run on ``link.channels``
   communication streams (NCCL: 1, each after the previous one; gloo: its
   process group's worker threads, 2 by default), costs from
   ``parallel.collectives.cost_ns``; while the compute runs a collective
   goes at ``link.during_compute`` of its speed (gloo sharing the cores with
   the compute), at full speed after (``collectives.end_ns``).
5. **The end.** The backward call returns when its compute is done and the
   final callback has waited for every bucket and, without
   ``gradient_as_bucket_view``, copied each reduced bucket back into its
   parameters' ``.grad`` (``copy_back_ns``: read and write at the memory
   bandwidth of the parameters' device; with the view, the bucket is the
   ``.grad``).

``exposed_ns``: the time from the end of the compute to the end of the last
all-reduce and the copy back (0 when all communication hid behind the compute);
``overlap``: the share of the communication time that ran under compute.
The compute itself is the simulation's (communication on CPU cores or SMs is
not charged to it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from autograd_run.errors import RequestError
from autograd_run.record.recording import Collective as _Collective
from autograd_run.ops.cost import ITEMSIZE
from autograd_run.parallel import buckets as B
from autograd_run.parallel.collectives import Link, cost_ns, end_ns


@dataclass
class BucketRun:
    index: int
    params: list[int]
    nbytes: int
    #: ns from the start of the backward: its last gradient ready, the all-reduce's start and end.
    ready_ns: int
    start_ns: int
    end_ns: int
    #: The parameter whose gradient's hook launched it (None: launched at the end of the backward).
    trigger: str | None = None
    dtype: str = "float32"
    #: "bucket", or "used-map" (find_unused_parameters' map of used parameters, int32 each).
    kind: str = "bucket"


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
    #: Parameters no AccumulateGrad node reached (marked ready by the first hook), by name.
    unused: list[str] = field(default_factory=list)
    #: The link the collectives were costed on.
    link: Link | None = None
    #: With a straggler: its rank, slowdown, its own compute and wall, and how much later the others end.
    straggler: dict | None = None
    #: ``finalize_backward``'s copy of the reduced buckets into ``.grad`` (0 with gradient_as_bucket_view).
    copy_back_ns: int = 0
    #: The parameters' gradients are views of their buckets (DDP's ``gradient_as_bucket_view``).
    gradient_as_bucket_view: bool = False
    #: What-ifs on the communication (``collective_slack``): {"what", "wall_ns", "saved_ns"} each.
    slack: list = field(default_factory=list)

    def memory_extras(self, graph) -> tuple[tuple, dict]:
        """The buckets as the memory model's blocks (``analysis.memory.Extra``: DDP allocates them when it is
        made, before any backward), and the parameters whose ``.grad`` is a view of one (with
        ``gradient_as_bucket_view``)."""
        from autograd_run.analysis.memory import Extra
        params = params_of(graph)
        extras, grads_in = [], {}
        for b in self.buckets:
            if b.kind != "bucket" or not b.params:
                continue
            device = graph.variables[params[b.params[0]].name].device
            if self.gradient_as_bucket_view:
                for i in b.params:
                    grads_in[params[i].name] = len(extras)
            extras.append(Extra(f"DDP bucket {b.index} ({len(b.params)} parameters)", b.nbytes, device))
        return tuple(extras), grads_in

    def to_dict(self) -> dict:
        link = None if self.link is None else {"name": self.link.name, "alpha_us": self.link.alpha_us,
                                               "gbps": self.link.bandwidth / 1e9, "channels": self.link.channels,
                                               "during_compute": self.link.during_compute, "source": self.link.source}
        return {"world": self.world, "iteration": self.iteration, "compute_ns": self.compute_ns,
                "wall_ns": self.wall_ns, "exposed_ns": self.exposed_ns, "comm_ns": self.comm_ns,
                "overlap": self.overlap, "unused": self.unused, "link": link, "straggler": self.straggler,
                "copy_back_ns": self.copy_back_ns, "slack": self.slack,
                "buckets": [b.__dict__ for b in self.buckets]}


def faster_link(link: Link, speedup: float) -> Link:
    """``link`` with every collective ``speedup`` faster: its latency and its time per byte."""
    factor = 1.0 - speedup
    return dataclasses.replace(link, alpha_us=link.alpha_us * factor, bandwidth=link.bandwidth / factor)


def what_ifs(base_wall: int, cases) -> list[dict]:
    """``cases``: (what changed, a function giving the backward's end then); each as {"what", "wall_ns",
    "saved_ns"} (how much sooner it ends than ``base_wall``; negative: later)."""
    out = []
    for what, run in cases:
        wall = run()
        out.append({"what": what, "wall_ns": wall, "saved_ns": base_wall - wall})
    return out


def collective_slack(report, world: int, link: Link, result: DdpResult, options: dict, speedup: float = 0.2,
                     straggler=None) -> list[dict]:
    """Slack over the collectives: ``result`` (``simulate_ddp(report, world, link, **options)``) again with the
    bucket cap halved and doubled (``bucket_cap_mb`` set so: DDP's first bucket then has that cap too), and
    with every collective ``speedup`` faster (``faster_link``), as ``what_ifs``. The backward itself is not
    simulated again: only the buckets and their collectives change."""
    cap = options.get("bucket_cap_mb") or B.DEFAULT_CAP_MB
    uniform = {k: v for k, v in options.items() if k != "bucket_cap_mb_list"}  # one cap replaces per-bucket limits

    def run(kw, lk):
        return lambda: simulate_ddp(report, world, lk, straggler=straggler, **kw).wall_ns
    return what_ifs(result.wall_ns, [
        (f"bucket_cap_mb={cap / 2:g} (half)", run({**uniform, "bucket_cap_mb": cap / 2}, link)),
        (f"bucket_cap_mb={cap * 2:g} (double)", run({**uniform, "bucket_cap_mb": cap * 2}, link)),
        (f"every collective {speedup:.0%} faster", run(options, faster_link(link, speedup)))])


def size_text(nbytes: int) -> str:
    """A collective's size as the summary and the trace show it."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B"


# A collective as a trace slice (``record.recording.Collective``; here too for the callers that import it here).
Collective = _Collective


#: The trace track of one rank's communication stream (ranks are symmetric: rank 0 stands for all).
COMM_TRACK = "DDP communication, rank 0"


def collective_kernels(result, recording, add=None, graph=None) -> tuple[list, int]:
    """``result``'s collectives as the kernel slices ``add`` (``add_to_recording``, or FSDP's) puts into
    ``recording``, and the run's end with them, without changing ``recording`` (``graph``: the simulated
    graph, whose nodes launched them)."""
    from types import SimpleNamespace
    box = SimpleNamespace(start=recording.start, end=recording.end, kernels=[])
    (add or add_to_recording)(result, box, graph)
    return box.kernels, box.end


def add_to_recording(result: DdpResult, recording, graph=None) -> None:
    """Put ``result``'s collectives into ``recording`` (the simulation's) as slices on ``COMM_TRACK``,
    titled with the bucket, its size and the parameter whose hook launched it (with ``graph``: that
    parameter's AccumulateGrad node is the collective's ``trigger``); the run's span grows to the last
    collective's end (the backward returns after the final wait)."""
    from autograd_run.record.recording import KernelSlice
    t0 = recording.start
    variables = graph.variables if graph is not None else {}
    for b in result.buckets:
        what = f"all-reduce bucket {b.index}" if b.kind == "bucket" else "all-reduce of the used-parameter map"
        size = size_text(b.nbytes)
        by = f"launched by {b.trigger}" if b.trigger is not None else "launched by the final callback"
        title = f"{what} ({size}, {by})"
        v = variables.get(b.trigger) if b.trigger is not None else None
        recording.kernels.append(KernelSlice(COMM_TRACK, Collective(title, title, "all_reduce", b.nbytes,
                                                                    getattr(b, "dtype", None) or "float32",
                                                                    trigger=v.node if v is not None else None),
                                             t0 + b.start_ns,
                                             t0 + b.end_ns))
    recording.end = max(recording.end, t0 + result.wall_ns)


def params_of(graph) -> list[B.Param]:
    """DDP's parameters: the graph's ``parameters`` (registration order, as capture records them with
    ``parameters=``), else its variables that require grad in the file's order."""
    names = graph.parameters or [v.name for v in graph.variables.values() if v.requires_grad]
    out = []
    for name in names:
        v = graph.variables[name]
        size = ITEMSIZE.get(v.dtype)
        if size is None:
            raise RequestError(f"{graph.source}: variable {v.name!r} has dtype {v.dtype!r}, which DDP's bucket "
                               "sizes here do not know", "ddp")
        out.append(B.Param(len(out), math.prod(v.shape) * size, v.dtype, str(v.device), v.name))
    if not out:
        raise RequestError(f"{graph.source}: no variable requires grad: DDP has no parameter to reduce", "ddp")
    return out


def _marked_twice(report, params, find_unused_parameters: bool) -> str | None:
    """What DDP's Reducer says when it would mark a parameter ready twice in one iteration (``Reducer::mark_variable_ready``
    refuses; ``static_graph`` allows it, so the caller asks only without it), else None. The Reducer marks a
    parameter as its AccumulateGrad's hook fires, each time it runs (a reentrant checkpoint's nested backward
    runs the accumulators of the parameters inside it), and with ``find_unused_parameters`` marks at the first
    hook every parameter that the search from the outputs does not reach: the graph's own, the outermost
    (depth 0) nodes; a reentrant checkpoint hides what it recomputes from that search."""
    index = {p.name: p for p in params}
    hooks = sorted((s[5], s[4], s[1], s[2].variable) for s in report.sim.slices
                   if getattr(s[2], "variable", None) in index)
    marked: set = set()
    if find_unused_parameters and hooks:
        marked = set(index) - {name for _, _, depth, name in hooks if depth == 0}
    unused = set(marked)
    for _, _, depth, name in hooks:
        if name in marked:
            p = index[name]
            why = ("find_unused_parameters marked it ready as unused (no node outside a reentrant checkpoint "
                   "reaches it), and the checkpoint's nested backward runs its AccumulateGrad"
                   if name in unused else "its AccumulateGrad runs twice in one backward (a reentrant checkpoint's "
                   "nested backward and another)")
            return (f"real DDP stops this backward at parameter {name}: {why}. PyTorch says \"Expected to mark a variable ready only "
                    f"once. ... Parameter at index {p.index} with name {name} has been marked as ready twice. This "
                    f"means that multiple autograd engine  hooks have fired for this particular parameter during "
                    f"this iteration.\" Use use_reentrant=False, or static_graph=true"
                    + (", or find_unused_parameters=false" if name in unused else ""))
        marked.add(name)
    return None


def _marks(report, params):
    """One rank's ready times: (ready ns by parameter, the Reducer's marking order key, the ready order,
    unused parameter names, the compute's end)."""
    sim = report.sim
    t0 = min((g.start for g in sim.graph_tasks), default=0)
    # On an accelerator a gradient is ready when its AccumulateGrad's kernel ends (the all-reduce waits for
    # the compute stream), and the compute ends with the last kernel (the backward call returns before it).
    kernel_end: dict[int, int] = {}
    for _, node, _, end in sim.kernels:
        kernel_end[id(node)] = max(kernel_end.get(id(node), 0), end)
    compute = max(report.engine_done_ns, max(kernel_end.values(), default=t0) - t0)
    index = {p.name: p.index for p in params}
    ready: dict[int, int] = {}
    for s in sim.slices:  # (gt, depth, node, tid, start, end, queue, pushed)
        name = getattr(s[2], "variable", None)
        if name in index and index[name] not in ready:
            ready[index[name]] = max(s[5], kernel_end.get(id(s[2]), 0)) - t0
    order = sorted(ready, key=lambda i: (ready[i], i))
    unused = [p.name for p in params if p.index not in ready]
    first_hook = ready[order[0]] if order else compute
    # (time, rank in the order the Reducer marks them): unused ones at the first hook, before its own parameter
    mark = {i: (ready[i], 1 + k) for k, i in enumerate(order)}
    for p in params:
        if p.index not in mark:
            mark[p.index] = (first_hook, 0) if order else (compute, 0)
            ready[p.index] = mark[p.index][0]
    return ready, mark, order, unused, compute


def _launches(groups, nbytes, params, marks, find_unused_parameters, static_graph, iteration) -> list[tuple]:
    """One rank's collectives in launch order: (kind, index, parameters, bytes, ready ns, launch ns,
    the parameter index whose hook launched it or None, dtype)."""
    ready, mark, order, _, compute = marks
    out = []
    if static_graph and iteration == "first":
        # static_graph's first iteration only counts the hooks; the final callback launches everything
        # (``Reducer::delay_all_reduce``): the map of used parameters first, then every bucket.
        out.append(("used-map", 0, [], 4 * len(params), compute, compute, None, "int32"))
        for k, (g, n) in enumerate(zip(groups, nbytes)):
            out.append(("bucket", k, list(g), n, max(ready[i] for i in g), compute, None, params[g[0]].dtype))
        return out
    launch, trigger = (-1, -1), None
    for k, (g, n) in enumerate(zip(groups, nbytes)):
        last = max(g, key=lambda i: mark[i])
        if mark[last] > launch:  # launched in index order only: by the latest ready of buckets 0..k
            # an unused parameter is marked by the first hook: its parameter launched the bucket
            launch, trigger = mark[last], (last if mark[last][1] else order[0] if order else None)
        out.append(("bucket", k, list(g), n, ready[last], launch[0], trigger, params[g[0]].dtype))
    if find_unused_parameters and not static_graph:
        out.append(("used-map", len(groups), [], 4 * len(params), launch[0], launch[0], trigger, "int32"))
    return out


def _timed(plans: list[list[tuple]], world: int, link: Link, compute: int, params) -> list[BucketRun]:
    """The collectives' times: each starts when every rank has launched it and a channel is free."""
    free = [0] * max(1, link.channels)  # when each communication stream is next free
    runs = []
    for items in zip(*plans):
        kind, k, g, n, r, _, trig, dtype = items[0]
        launch = max(it[5] for it in items)
        c = min(range(len(free)), key=lambda j: (free[j], j))
        start = max(launch, free[c])
        free[c] = end_ns(start, cost_ns("allreduce", n, world, link), compute, link)
        runs.append(BucketRun(k, g, n, r, start, free[c], None if trig is None else params[trig].name, dtype, kind))
    return runs


def _copy_back_ns(report, runs: list[BucketRun], params) -> int:
    """``finalize_backward`` copies each reduced bucket back into its parameters' ``.grad`` (without
    ``gradient_as_bucket_view``): bytes read and written at the memory bandwidth of the parameters' device."""
    spec = report.spec
    total = 0.0
    for b in runs:
        if b.kind != "bucket" or not b.params:
            continue
        device = params[b.params[0]].device
        bw = spec.host.mem_bw if device.startswith("cpu") else spec.accelerator.mem_bw
        total += 2 * b.nbytes / bw * 1e9
    return int(round(total))


def simulate_ddp(report, world: int, link: Link, bucket_cap_mb: float | None = None, *,
                 find_unused_parameters: bool = False, static_graph: bool = False,
                 gradient_as_bucket_view: bool = False, iteration: str = "steady", straggler=None,
                 first_bucket_mb: float | None = None, bucket_cap_mb_list=None) -> DdpResult:
    """The DDP view of ``report`` (a ``sim.session.SimReport``) on ``world`` ranks joined by ``link``.

    ``first_bucket_mb``: the first bucket's cap (DDP's ``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB, with the
    default ``bucket_cap_mb``; else the cap itself), as a what-if: the limits become ``[first, cap]``.

    ``bucket_cap_mb_list``: DDP's per-bucket limits (``DistributedDataParallel(bucket_cap_mb_list=...)``, MiB):
    DDP takes them for the constructor's buckets whatever ``find_unused_parameters`` and ``static_graph`` are,
    and for the rebuild (``_BucketCapacityConfig.compute_bucket_size_limits``); ``first_bucket_mb`` replaces
    them.

    ``straggler``: ``(rank, slowdown, report)``, one rank whose backward is ``report`` (the same graph with
    its costs scaled by ``slowdown``): every collective starts only when that rank has launched it too.
    """
    if iteration not in ("first", "steady"):
        raise RequestError(f"iteration must be first or steady, got {iteration!r}", "ddp")
    params = params_of(report.graph)
    if not static_graph:
        twice = _marked_twice(report, params, find_unused_parameters)
        if twice is not None:
            raise RequestError(twice, "ddp")
    marks = _marks(report, params)
    _, _, order, unused, compute = marks
    limits = list(bucket_cap_mb_list) if bucket_cap_mb_list else None
    first_limits = limits  # DDP's per-bucket limits apply to the constructor's buckets too
    if first_bucket_mb is not None:
        limits = [first_bucket_mb, B.DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb]
        first_limits = limits if find_unused_parameters and not static_graph else None
    if iteration == "first":  # (the constructor's one bucket, without unused parameters looked for, has no limits)
        groups = B.initial(params, bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                           static_graph=static_graph, bucket_cap_mb_list=first_limits)
    else:
        groups = B.steady(params, order, bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                          static_graph=static_graph, bucket_cap_mb_list=limits)
    nbytes = B.sizes(groups, params)
    plan = _launches(groups, nbytes, params, marks, find_unused_parameters, static_graph, iteration)
    runs = _timed([plan], world, link, compute, params)
    lag = None
    if straggler is not None:
        rank, slowdown, slow_report = straggler
        if not (isinstance(rank, int) and 0 <= rank < world):
            raise RequestError(f"straggler rank must be from 0 to {world - 1}, got {rank}", "straggler")
        slow = _marks(slow_report, params)
        slow_plan = _launches(groups, nbytes, params, slow, find_unused_parameters, static_graph, iteration)
        alone = max([compute] + [b.end_ns for b in runs])
        runs = _timed([plan, slow_plan], world, link, compute, params)
        end = max([compute] + [b.end_ns for b in runs])
        lag = {"rank": rank, "slowdown": slowdown, "compute_ns": slow[4], "wall_ns": max(slow[4], end),
               "delay_ns": end - alone}
    comm = sum(b.end_ns - b.start_ns for b in runs)
    copy_back = 0 if gradient_as_bucket_view or world == 1 else _copy_back_ns(report, runs, params)
    wall = max([compute] + [b.end_ns for b in runs]) + copy_back
    hidden = sum(max(0, min(b.end_ns, compute) - b.start_ns) for b in runs)
    if max(wall, comm, lag["wall_ns"] if lag else 0) >= 1 << 62:  # (as the backward's own simulation: sim.session)
        from autograd_run.sim.result import too_big
        raise too_big()
    return DdpResult(world, iteration, runs, compute, wall, wall - compute, comm,
                     hidden / comm if comm else 1.0, unused, link, lag, copy_back, gradient_as_bucket_view)
