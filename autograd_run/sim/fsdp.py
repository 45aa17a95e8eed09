"""A simulated backward under FSDP2 (``fully_shard``): each unit's all-gather and reduce-scatter against the compute.

Ranks are symmetric (every rank runs the same units on its shard), so one
rank's simulated backward and the collectives' costs are the simulation.
The units come from the graph file's ``fsdp`` section (``capture`` records
it: ``capture.fsdp``), in forward (post-forward) order, each with the node
its pre-backward ran in and the node its post-backward ran in (none: the
root's final callback). What FSDP2 does (torch 2.13, ``_fsdp_param_group.py``),
and so the model, walking the one rank's nodes in the order they started:

* **pre-backward of unit u** (before its trigger node computes): the
  all-gather of u's parameters, unless they are unsharded already (the
  root's, a unit with ``reshard_after_forward`` false, or one prefetched),
  then the compute waits for it and copies the gathered buffer out
  (``all_gather_copy_out``: read and write at the memory bandwidth); then the
  prefetch: the all-gather of the unit before u in forward order (the
  default; ``prefetch=N``: the N before it; a captured
  ``set_modules_to_backward_prefetch`` list: those units), each one that
  is sharded: one whose backward already ran (resharded by its
  post-backward) is gathered again (``unshard`` does not look), the
  unit's ``regathers``;
* **recompute** (activation checkpointing without reentry; the capture's
  ``recompute`` pairs): the first node to unpack a tensor of a checkpointed
  block runs the block's forward again, after that node's pre-backward
  hooks; each unit whose pre-forward ran there is all-gathered if it is
  sharded, in the order captured, and the compute waits for it and its
  copy-out (``pre_forward``: ``unshard``, ``wait_for_unshard``); no
  reshard follows (``post_forward`` skips it inside a backward), so the
  units' own pre-backwards and the prefetches of them find them unsharded;
  then the unit's ``set_modules_to_forward_prefetch`` targets (the capture's
  ``forward_prefetch``), each sharded one all-gathered (again, if its
  backward ran: ``FSDPState._pre_forward``);
* **the group's switches** (captured where not FSDP's default, true):
  ``reduce_grads`` false (``set_requires_gradient_sync(False)``): the
  post-backward reshards and returns, before the reduce-scatter's wait;
  ``all_reduce_grads`` false: no HSDP all-reduce; ``reshard_after_backward``
  false: the post-backward leaves it unsharded; ``unshard_in_backward``
  false: neither its pre-backward nor a backward prefetch gathers it
  (``unshard`` returns in ``PRE_BACKWARD``); a unit whose module ran more
  than once in the forward (``forward_calls``) is refused: FSDP runs its
  pre- and post-backward once a call, this model once a unit;
* **post-backward of unit u** (as its ``RegisterPostBackwardFunction`` node
  ends, or in the final callback for a unit whose inputs needed no gradient,
  the root's first, then the others in the order FSDP keeps its states: the
  modules' ``named_modules`` order, the capture's ``final_order``; without it,
  forward order): the compute waits for
  the previous unit's reduce-scatter (FSDP keeps one reduce-scatter input
  in flight: ``post_backward_rs_wait``), copies u's gradients into the
  reduce-scatter input (``chunk_cat``), launches the reduce-scatter and,
  under HSDP (``replicate=R``), an all-reduce of the shard across the R
  replicas after it;
* **the end**: the backward returns when the compute is done and the final
  callback has waited for the last reduce-scatter and all-reduce. The
  callback's own work (FSDP's Python around the post-backwards it runs, less
  their collectives) is in no node's span; with costs from a profile that
  holds it (``FSDP::root_post_backward_callback``), it is added after the
  compute (``ProfileUse.fsdp_final_ns``).

Collectives run on streams of their own (one for all-gathers, one for
reduce-scatters, one for HSDP's all-reduces), each in issue order, when the
parameters live on an accelerator. On the CPU (gloo) a collective blocks
the thread that issued it: FSDP2 calls them with ``async_op=False`` and the
CPU has no streams, so every all-gather and reduce-scatter is a wait of
the compute (seen in torch 2.13's profiles: ``FSDP::all_gather`` spans the
whole ``gloo:all_gather``).

Sizes: each parameter padded along dim 0 to a multiple of the shard group's
size (FSDP's ``_get_dim0_padded_size``), in ``param_dtype`` for the
all-gather and ``reduce_dtype`` for the reduce-scatter (else the
parameter's). Costs: ``parallel.collectives.cost_ns`` over the shard group
(``world / replicate`` ranks).

The compute waits become ``stalls`` (node id -> ns). The trace re-simulates
the graph with them as the nodes' waiting time (``SimOptions.extra_ns``) so
its nodes show where the compute stood still; with one worker that
re-simulation ends exactly where this model says.

``exposed_ns``: from the end of the last compute node to the end of the
backward; ``idle_ns``: the compute's waits on communication before that;
``overlap``: the share of the communication time that ran while the compute
ran (0 on the CPU, where each collective blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from autograd_run.errors import RequestError
from autograd_run.ops.cost import ITEMSIZE
from autograd_run.parallel.collectives import Link, cost_ns, end_ns


@dataclass
class Span:
    start_ns: int
    end_ns: int


@dataclass
class UnitRun:
    name: str
    #: Its place in forward (post-forward) order.
    index: int
    params: int
    #: Bytes all-gathered and reduce-scattered (padded; in their dtypes).
    gather_bytes: int
    reduce_bytes: int
    all_gather: Span | None = None
    #: "pre-backward" (its own), "prefetch by UNIT", "recompute" (activation checkpointing ran its forward
    #: again in the backward, in node ``recompute_in``), or None (no all-gather: unsharded already).
    gathered_by: str | None = None
    reduce_scatter: Span | None = None
    all_reduce: Span | None = None
    #: When its pre- and post-backward ran (None: never), and the node each ran in ("final callback").
    pre_ns: int | None = None
    post_ns: int | None = None
    post_in: str | None = None
    pre_in: str | None = None
    #: The node in which a recompute all-gathered it (``gathered_by`` "recompute"), else None.
    recompute_in: str | None = None
    #: The compute's wait for its all-gather (and copy-out), and for the previous reduce-scatter at its post-backward.
    wait_ns: int = 0
    rs_wait_ns: int = 0
    #: All-gathers of this unit issued after its post-backward had resharded it (a prefetch by a unit whose
    #: backward comes later: ``unshard`` gathers any sharded unit, whether its backward ran or not; or a
    #: recompute), each as (span, the prefetching unit's name or "(recompute)").
    regathers: list = field(default_factory=list)

    def issuer(self) -> str | None:
        """The unit whose pre-backward issued this unit's all-gather (its own, or the prefetching one's;
        "" for the root), or None when it gathered nothing or a recompute did."""
        if self.all_gather is None or not self.gathered_by or self.gathered_by == "recompute":
            return None
        by = self.name if self.gathered_by == "pre-backward" else self.gathered_by.removeprefix("prefetch by ")
        return "" if by == "(root)" else by

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("all_gather", "reduce_scatter", "all_reduce"):
            d[k] = None if d[k] is None else dict(d[k].__dict__)
        d["regathers"] = [{**span.__dict__, "by": by} for span, by in self.regathers]
        return d


@dataclass
class FsdpResult:
    world: int
    replicate: int
    prefetch: int | None
    #: Collectives block the issuing thread (parameters on the CPU) rather than run on streams of their own.
    blocking: bool
    units: list[UnitRun]
    compute_ns: int
    wall_ns: int
    exposed_ns: int
    idle_ns: int
    comm_ns: int
    overlap: float
    link: Link | None = None
    #: node id -> ns the compute waited at it (for the trace's re-simulation).
    stalls: dict[str, int] = field(default_factory=dict)
    #: What-ifs on the collectives (``fsdp_slack``): {"what", "wall_ns", "saved_ns"} each.
    slack: list = field(default_factory=list)

    def memory_extras(self, graph) -> tuple:
        """FSDP's memory on one rank, as ``analysis.memory.memory_of``'s ``(extras, grads_in, grads_out,
        leaves_out)``: per unit its sharded parameters (held throughout), its unsharded parameters (from the
        node whose pre-backward issued their all-gather, or before the pass when already unsharded, to its
        post-backward's reshard), the all-gather's padded flat buffer (to the copy-out at the unit's own
        pre-backward), then at its post-backward the reduce-scatter input (its gradients copied in, the
        unsharded gradients dropped; held until the next post-backward waits for it, or the end) and the
        sharded gradient. The unsharded parameters are the graph's leaves: not alive throughout. One rank of
        one shard (``world`` 1): nothing is sharded, nothing added."""
        from autograd_run.analysis.memory import Extra
        shard = self.world // self.replicate
        if shard <= 1:
            return (), {}, {}, ()
        specs = graph.fsdp["units"]
        pre_of = {s["name"]: s.get("pre_backward") for s in specs}

        def post_moment(u: UnitRun) -> tuple:
            return ("end", u.post_in) if u.post_in not in (None, "final callback") else ("final",)
        posts = sorted((u for u in self.units), key=lambda u: (u.post_ns is None, u.post_ns or 0, u.index))
        place = {id(u): k for k, u in enumerate(posts)}

        def next_post(u: UnitRun):
            """The first post-backward after ``u``'s (in ``posts``) that is not earlier: the one that waits for
            its reduce-scatter. A scan from ``u``'s place, not ``posts.index`` per pair (cubic in the units:
            100,000 of them, as a graph file may give, took hours)."""
            at = u.post_ns or 0
            for k in range(place[id(u)] + 1, len(posts)):
                if (posts[k].post_ns or 0) >= at:
                    return posts[k]
            return None
        extras, grads_out, leaves_out = [], {}, []
        for u, s in zip(self.units, specs):
            names = s["parameters"]
            if not names:
                continue
            variables = [graph.variables[p] for p in names]
            device = variables[0].device
            label = u.name or "(root)"
            leaves_out += names
            sharded = sum(padded_bytes(v.shape, v.dtype, shard) for v in variables) // shard
            extras.append(Extra(f"FSDP {label}: sharded parameters", sharded, device))
            unsharded = sum(math.prod(v.shape) * ITEMSIZE[s.get("param_dtype") or v.dtype] for v in variables)
            issued = own = None
            if u.all_gather is not None and u.gathered_by == "recompute":  # gathered and copied out at once
                issued = own = ("start", u.recompute_in)
            elif u.all_gather is not None:
                issuer = pre_of.get(u.issuer())
                issued = ("start", issuer) if issuer else None
                own = ("start", pre_of[u.name]) if pre_of.get(u.name) else issued
            post = post_moment(u)
            kept = s.get("reshard_after_backward", True) is False  # set_reshard_after_backward(False): to the end
            # set_unshard_in_backward(False) on a unit resharded after forward: sharded throughout the backward
            sharded_only = (s.get("unshard_in_backward", True) is False and s.get("reshard_after_forward", True)
                            and u.all_gather is None and not u.regathers)
            if not sharded_only:
                # the unsharded parameters' storage is allocated when the all-gather's output is copied out into
                # it, at the unit's own pre-backward (wait_for_unshard); the flat output lives from the issue to then
                extras.append(Extra(f"FSDP {label}: unsharded parameters", unsharded, device, own,
                                    None if kept else post))
            if issued is not None and own != issued:  # (issued by its own pre-backward: gone at once, not counted)
                extras.append(Extra(f"FSDP {label}: all-gather buffer", u.gather_bytes, device, issued, own))
            if u.reduce_scatter is not None:
                later = next_post(u)
                extras.append(Extra(f"FSDP {label}: reduce-scatter input", u.reduce_bytes, device, post,
                                    post_moment(later) if later is not None else ("final",)))
                extras.append(Extra(f"FSDP {label}: sharded gradients", sharded, device, post))
                for p in names:
                    grads_out[p] = post
        return tuple(extras), {}, grads_out, tuple(leaves_out)

    def to_dict(self) -> dict:
        link = None if self.link is None else {"name": self.link.name, "alpha_us": self.link.alpha_us,
                                               "gbps": self.link.bandwidth / 1e9, "source": self.link.source,
                                               "reduce_scatter": self.link.reduce_scatter}
        return {"world": self.world, "replicate": self.replicate, "shard": self.world // self.replicate,
                "prefetch": self.prefetch, "blocking": self.blocking, "compute_ns": self.compute_ns,
                "wall_ns": self.wall_ns, "exposed_ns": self.exposed_ns, "idle_ns": self.idle_ns,
                "comm_ns": self.comm_ns, "overlap": self.overlap, "link": link, "stalls": self.stalls,
                "slack": self.slack, "units": [u.to_dict() for u in self.units]}


def fsdp_slack(report, world: int, link: Link, result: "FsdpResult", options: dict,
               speedup: float = 0.2) -> list[dict]:
    """Slack over FSDP's collectives (``sim.ddp.what_ifs``): ``result`` (``simulate_fsdp(report, world, link,
    **options)``) again with one more unit's all-gather prefetched, with none, and with every collective
    ``speedup`` faster. The compute's waits follow from the model; the backward is not simulated again."""
    from autograd_run.sim.ddp import faster_link, what_ifs
    prefetch = result.prefetch if result.prefetch is not None else 1

    def run(kw, lk):
        return lambda: simulate_fsdp(report, world, lk, **kw).wall_ns
    cases = [(f"prefetch={prefetch + 1} (one more unit ahead)", run({**options, "prefetch": prefetch + 1}, link))]
    if prefetch > 0:
        cases.append(("prefetch=0 (none)", run({**options, "prefetch": 0}, link)))
    cases.append((f"every collective {speedup:.0%} faster", run(options, faster_link(link, speedup))))
    return what_ifs(result.wall_ns, cases)


def padded_bytes(shape: tuple, dtype: str, shard: int) -> int:
    """A parameter's bytes in FSDP's flat buffers: dim 0 padded up to a multiple of ``shard``."""
    size = ITEMSIZE.get(dtype)
    if size is None:
        raise RequestError(f"FSDP sizes here do not know dtype {dtype!r}", "fsdp")
    dims = tuple(shape) or (1,)
    rows = -(-dims[0] // shard) * shard
    return rows * math.prod(dims[1:]) * size


def _recomputes(graph, by_name: dict) -> dict:
    """Where activation checkpointing's recomputes run the units' pre-forwards (the ``fsdp`` section's
    ``recompute``: [node, unit] pairs in the order the capture saw them): node id -> its units in order. The node
    is the one the capture saw: the first that unpacked a tensor of the checkpointed block in the captured order
    (a schedule that runs another node of the block first would recompute there; the file does not say which
    nodes those are when captured without values, as FSDP2 with resharded units must be)."""
    at: dict = {}
    for nid, name in graph.fsdp.get("recompute") or ():
        at.setdefault(nid, []).append(by_name[name])
    return at


def _units(graph, shard: int) -> list[UnitRun]:
    out = []
    for k, u in enumerate(graph.fsdp["units"]):
        g = r = 0
        for name in u["parameters"]:
            v = graph.variables[name]
            g += padded_bytes(v.shape, u.get("param_dtype") or v.dtype, shard)
            r += padded_bytes(v.shape, u.get("reduce_dtype") or u.get("param_dtype") or v.dtype, shard)
        out.append(UnitRun(u["name"], k, len(u["parameters"]), g, r))
    return out


class _Streams:
    """One rank's collective streams and its compute's waits (see the module docstring)."""

    def __init__(self, world, replicate, link, blocking, mem_bw, compute_end):
        self.shard, self.replicate, self.link, self.blocking = world // replicate, replicate, link, blocking
        self.mem_bw = mem_bw
        self.compute_end = compute_end  # unshifted: the shift at the time of an issue is added
        self.free = {"ag": 0, "rs": 0, "ar": 0}
        self.spans: list[Span] = []

    def run(self, stream: str, kind: str, nbytes: int, world: int, t: int, shift: int) -> Span:
        work = cost_ns(kind, nbytes, world, self.link)
        start = max(t, self.free[stream])
        end = start + work if self.blocking else end_ns(start, work, self.compute_end + shift, self.link)
        self.free[stream] = end
        span = Span(start, end)
        self.spans.append(span)
        return span

    def copy_ns(self, nbytes: int) -> int:
        return int(round(2 * nbytes / self.mem_bw * 1e9)) if self.shard > 1 else 0


def _idle_before(spans: list) -> "Callable[[int], int]":
    """``F(x)``: the idle spans' time before ``x``, summed (each span's ``[start, end]`` cut at ``x``; spans may
    overlap, each counts). ``F(b) - F(a)`` is their summed overlap with ``[a, b]``: with sorted starts and ends
    and their prefix sums, a log-time look-up, not a pass over every span for each collective (quadratic in the
    units)."""
    import bisect
    starts = sorted(sp.start_ns for sp in spans)
    ends = sorted(sp.end_ns for sp in spans)
    s_sum, e_sum = [0], [0]
    for v in starts:
        s_sum.append(s_sum[-1] + v)
    for v in ends:
        e_sum.append(e_sum[-1] + v)

    def before(x: int) -> int:
        k = bisect.bisect_left(starts, x)   # spans begun before x: x - start each ...
        j = bisect.bisect_left(ends, x)     # ... less x - end for those ended before x
        return (k * x - s_sum[k]) - (j * x - e_sum[j])
    return before


def simulate_fsdp(report, world: int, link: Link, *, prefetch: int | None = None, replicate: int = 1,
                  reshard_after_forward: bool | None = None, blocking: bool | None = None) -> FsdpResult:
    """The FSDP2 view of ``report`` (a ``sim.session.SimReport`` of a graph with an ``fsdp`` section) on
    ``world`` ranks joined by ``link``.

    ``prefetch``: all-gathers issued ahead at each pre-backward (None: as captured, FSDP's default of one);
    ``replicate``: HSDP's replicas (``world`` must be a multiple); ``reshard_after_forward``: for every unit
    but the root (None: as captured); ``blocking``: None for the parameters' device (CPU: blocking).
    """
    graph = report.graph
    if graph.fsdp is None:
        raise RequestError(f"{graph.source}: no fsdp section: capture the model under fully_shard "
                           "(from_torch(..., parameters=model)) to simulate FSDP", "fsdp")
    if not (isinstance(replicate, int) and 1 <= replicate <= world and world % replicate == 0):
        raise RequestError(f"replicate={replicate}: HSDP's replicas must divide the world size {world}", "fsdp")
    if prefetch is not None and not (isinstance(prefetch, int) and 0 <= prefetch <= 64):
        raise RequestError(f"prefetch must be a whole number from 0 to 64, got {prefetch}", "fsdp")
    spec_units = graph.fsdp["units"]
    twice = [s for s in spec_units if s.get("forward_calls", 1) > 1]
    if twice:  # FSDP2 runs a pre- and a post-backward per call: all-gathered again between them, the reduce-scatter
        # at the post-backward that finds the gradients (after the parameters' AccumulateGrad), not the first
        s = twice[0]
        raise RequestError(f"{graph.source}: FSDP unit {s['name'] or '(root)'!r} ran {s['forward_calls']} times in the "
                           "forward (a module applied more than once): FSDP2 runs its pre- and post-backward once a "
                           "call, which the FSDP simulation does not model (one of each per unit); shard the "
                           "repeated module's parent instead, or leave it unsharded", "fsdp")
    shard = world // replicate
    units = _units(graph, shard)
    by_name = {u.name: u for u in units}
    root = graph.fsdp.get("root")
    resharded = {}
    for u, s in zip(units, spec_units):
        r = s.get("reshard_after_forward", True)
        if reshard_after_forward is not None and u.name != root:
            r = reshard_after_forward
        resharded[u.name] = r and shard > 1
    params = [graph.variables[p] for s in spec_units for p in s["parameters"]]
    if blocking is None:
        devs = {str(v.node.device) if v.node is not None else str(v.device) for v in params}
        blocking = all(d.startswith("cpu") for d in devs) if devs else True
    mem_bw = report.spec.host.mem_bw if blocking else report.spec.accelerator.mem_bw

    sim = report.sim
    t0 = min((g.start for g in sim.graph_tasks), default=0)
    ends: dict = {}
    for stream, node, _, end in sim.kernels:
        ends[node] = max(ends.get(node, 0), end)
    slices = sorted(sim.slices, key=lambda s: (s[4], s[5]))
    compute = report.engine_done_ns
    st = _Streams(world, replicate, link, blocking, mem_bw, compute)
    pre_at: dict[str, list[UnitRun]] = {}
    post_at: dict[str, list[UnitRun]] = {}
    for u, s in zip(units, spec_units):
        if s.get("pre_backward"):
            pre_at.setdefault(s["pre_backward"], []).append(u)
        if s.get("post_backward"):
            post_at.setdefault(s["post_backward"], []).append(u)
    ran = set()  # variables whose AccumulateGrad ran: a unit without any reduce-scatters nothing
    for s in slices:
        if getattr(s[2], "variable", None) is not None:
            ran.add(s[2].variable)
    has_grad = {u.name: any(p in ran for p in sp["parameters"]) for u, sp in zip(units, spec_units)}
    explicit = {s["name"]: s["backward_prefetch"] for s in spec_units if "backward_prefetch" in s}
    ahead = {s["name"]: [by_name[n] for n in s["forward_prefetch"]] for s in spec_units if s.get("forward_prefetch")}
    # the group's backward switches (FSDP's defaults: true): set_requires_gradient_sync, set_requires_all_reduce,
    # set_reshard_after_backward, set_unshard_in_backward
    switch = {key: {s["name"] for s in spec_units if s.get(key) is False}
              for key in ("reduce_grads", "all_reduce_grads", "reshard_after_backward", "unshard_in_backward")}
    no_unshard = switch["unshard_in_backward"]

    gathered: dict[str, bool] = {u.name: not resharded[u.name] for u in units}
    waited: dict[str, bool] = {u.name: True for u in units}  # its all-gather's result waited for and copied out
    recompute_at = _recomputes(graph, by_name)  # (each taken out as it runs: a node that runs again does not)
    pending: list[int] = []     # reduce-scatter ends not yet waited for (FSDP keeps one in flight)
    finals: list[int] = []      # every reduce-scatter's and all-reduce's end: the final callback waits
    stalls: dict[str, int] = {}
    idle_spans: list[Span] = []
    shift = 0

    def gather(u: UnitRun, t: int, by: str) -> int:
        """Issue u's all-gather at t; the time the issuing thread goes on."""
        gathered[u.name] = True
        waited[u.name] = False
        u.all_gather = st.run("ag", "all-gather", u.gather_bytes, shard, t, shift)
        u.gathered_by = by
        return u.all_gather.end_ns if blocking else t

    def targets(u: UnitRun) -> list[UnitRun]:
        if prefetch is None and u.name in explicit:
            return [by_name[n] for n in explicit[u.name]]
        n = 1 if prefetch is None else prefetch
        return [units[k] for k in range(u.index - 1, max(-1, u.index - 1 - n), -1)]

    def pre(u: UnitRun, t: int, where: str) -> int:
        u.pre_ns, u.pre_in = t, where
        issue = t
        if not gathered[u.name] and u.name not in no_unshard:  # (unshard is a no-op in PRE_BACKWARD then)
            issue = gather(u, t, "pre-backward")
        ready = t
        if u.all_gather is not None and not waited[u.name]:
            ready = max(t, u.all_gather.end_ns) + st.copy_ns(u.gather_bytes)
        waited[u.name] = True
        if blocking:
            issue = ready
        for v in targets(u):
            if gathered[v.name] or v.name in no_unshard:  # (a backward prefetch unshards in PRE_BACKWARD)
                continue
            issue = prefetch_one(v, issue, u.name)
        go = max(ready, issue) if blocking else ready
        u.wait_ns += go - t
        return go

    def prefetch_one(v: UnitRun, issue: int, by: str) -> int:
        """A prefetch of v by unit ``by`` at ``issue`` (v sharded): the time the issuing thread goes on."""
        if v.post_ns is None:
            return gather(v, issue, f"prefetch by {by or '(root)'}")
        # its backward is over and it was resharded: FSDP's unshard gathers it all the same
        gathered[v.name] = True
        waited[v.name] = False
        span = st.run("ag", "all-gather", v.gather_bytes, shard, issue, shift)
        v.regathers.append((span, by))
        return span.end_ns if blocking else issue

    def recompute(u: UnitRun, t: int, where: str) -> int:
        """The unit's pre-forward in a recompute at ``t`` (``FSDPParamGroup.pre_forward``: ``unshard``, then
        ``wait_for_unshard``), then its state's forward prefetch (``_states_to_forward_prefetch``: each target
        that is sharded all-gathered, one whose backward already ran again): the time the compute goes on."""
        ready = _recompute(u, t, where)
        issue = ready
        for v in ahead.get(u.name, ()):
            if not gathered[v.name]:
                issue = prefetch_one(v, issue, u.name)
        return max(ready, issue) if blocking else ready

    def _recompute(u: UnitRun, t: int, where: str) -> int:
        if not gathered[u.name]:
            if u.post_ns is None:
                gather(u, t, "recompute")
                u.recompute_in = where
            else:  # resharded by its post-backward already: gathered again, waited for and copied out here
                gathered[u.name] = waited[u.name] = True
                span = st.run("ag", "all-gather", u.gather_bytes, shard, t, shift)
                u.regathers.append((span, "(recompute)"))
                ready = max(t, span.end_ns) + st.copy_ns(u.gather_bytes)
                u.wait_ns += ready - t
                return ready
        ready = t
        if u.all_gather is not None and not waited[u.name]:
            ready = max(t, u.all_gather.end_ns) + st.copy_ns(u.gather_bytes)
        waited[u.name] = True
        u.wait_ns += ready - t
        return ready

    def post(u: UnitRun, t: int, where: str) -> int:
        u.post_ns, u.post_in = t, where
        if u.name not in switch["reshard_after_backward"]:
            gathered[u.name] = False  # resharded after its backward (FSDP2's reshard_after_backward default)
        if u.name in switch["reduce_grads"]:  # no gradient sync: it returns before the reduce-scatter's wait
            return t
        start = t
        if pending:  # post_backward_rs_wait: the previous unit's reduce-scatter
            t = max(t, pending.pop(0))
        u.rs_wait_ns = t - start
        if not has_grad[u.name]:
            return t
        t += st.copy_ns(u.reduce_bytes)  # chunk_cat into the reduce-scatter input
        u.reduce_scatter = st.run("rs", "reduce-scatter", u.reduce_bytes, shard, t, shift)
        last = u.reduce_scatter.end_ns
        if replicate > 1 and u.name not in switch["all_reduce_grads"]:
            u.all_reduce = st.run("ar", "allreduce", u.reduce_bytes // shard, replicate, last, shift)
            last = u.all_reduce.end_ns
        pending.append(u.reduce_scatter.end_ns)
        finals.append(last)
        return last if blocking else t

    def stall(node_id: str, at: int, until: int) -> None:
        nonlocal shift
        if until > at:
            stalls[node_id] = stalls.get(node_id, 0) + until - at
            idle_spans.append(Span(at, until))
            shift += until - at

    for s in slices:
        node = s[2]
        start = s[4] - t0 + shift
        for u in pre_at.get(node.id, ()):
            if u.pre_ns is None:
                stall(node.id, start, pre(u, start, node.id))
                start = s[4] - t0 + shift
        for u in recompute_at.pop(node.id, ()):  # (after the pre-backward hooks: the node unpacks as it computes)
            stall(node.id, start, recompute(u, start, node.id))
            start = s[4] - t0 + shift
        end = max(s[5], ends.get(node, 0)) - t0 + shift
        for u in post_at.get(node.id, ()):
            if u.post_ns is None:
                stall(node.id, end, post(u, end, node.id))
                end = max(s[5], ends.get(node, 0)) - t0 + shift
    compute_end = compute + shift
    # The root's final callback runs after the last node: its own time, from the profile the costs came from
    # (FSDP's work in it, its collectives left out), before the post-backwards it does itself
    use = report.measured.use if report.measured is not None else None
    t = compute_end + (round(use.fsdp_final_ns) if use is not None else 0)
    if graph.fsdp.get("final_order"):  # as captured: FSDP's states in named_modules order (the root's first)
        final_order = [by_name[n] for n in graph.fsdp["final_order"]]
    else:
        final_order = [by_name[root]] if root in by_name else []
        final_order += [u for u in units if u.name != root]
    for u in final_order:  # the root's final callback: post-backward of every unit it did not see yet
        if u.post_ns is None:  # (a unit with no gradient reduce-scatters nothing but still waits)
            t = post(u, t, "final callback")
    wall = max([t] + finals)
    comm = sum(sp.end_ns - sp.start_ns for sp in st.spans)
    hidden = 0
    idle_before = _idle_before(idle_spans)
    for sp in st.spans:
        b = min(sp.end_ns, compute_end)
        if b > sp.start_ns:  # under the compute, less the times the compute itself waited
            hidden += b - sp.start_ns - (idle_before(b) - idle_before(sp.start_ns))
    idle = sum(i.end_ns - i.start_ns for i in idle_spans)
    if max(wall, comm, idle) >= 1 << 62:  # (as the backward's own simulation: sim.session)
        from autograd_run.sim.result import too_big
        raise too_big()
    return FsdpResult(world, replicate, prefetch, blocking, units, compute, wall, wall - compute_end, idle, comm,
                      max(0.0, hidden / comm) if comm else 1.0, link, stalls)


#: The trace tracks of one rank's collective streams (ranks are symmetric: rank 0 stands for all).
TRACKS = {"all_gather": "FSDP all-gather, rank 0", "reduce_scatter": "FSDP reduce-scatter, rank 0",
          "all_reduce": "FSDP all-reduce (HSDP), rank 0"}


def add_to_recording(result: FsdpResult, recording, graph=None) -> None:
    """Put ``result``'s collectives into ``recording`` (the re-simulation's, with the stalls) as slices on
    ``TRACKS``; the run's span grows to the backward's end. With ``graph``, each collective's ``trigger`` is the
    node whose hook issued it (a trace draws a flow from it): an all-gather, the node its unit's pre-backward ran
    in (or the prefetching unit's); a reduce-scatter and HSDP's all-reduce, the node its post-backward ran in
    (none from the final callback)."""
    from autograd_run.record.recording import KernelSlice
    from autograd_run.sim.ddp import Collective, size_text
    t0 = recording.start
    by_id = graph.by_id if graph is not None else {}
    by_name = {u.name: u for u in result.units}

    def node(where):
        return by_id.get(where) if where is not None else None
    for u in result.units:
        label = u.name or "(root)"
        issuer = by_name.get(u.issuer())
        gather_in = issuer.pre_in if issuer is not None else u.recompute_in
        for key, what, nbytes, where in (
                ("all_gather", "all-gather", u.gather_bytes, gather_in),
                ("reduce_scatter", "reduce-scatter", u.reduce_bytes, u.post_in),
                ("all_reduce", "all-reduce across replicas", u.reduce_bytes // max(1, result.world // result.replicate),
                 u.post_in)):
            span = getattr(u, key)
            if span is None:
                continue
            by = f", {u.gathered_by}" if key == "all_gather" and u.gathered_by else ""
            title = f"{what} of unit {label} ({size_text(nbytes)}{by})"
            shard = max(1, result.world // result.replicate)  # HSDP: shards within a replica, then replicas
            group = result.replicate if key == "all_reduce" else shard
            recording.kernels.append(KernelSlice(TRACKS[key], Collective(title, title, key, nbytes, "float32", group,
                                                                         trigger=node(where)),
                                                 t0 + span.start_ns,
                                                 t0 + span.end_ns))
        for span, by in u.regathers:  # gathered again after its backward, by a later unit's prefetch
            issuer = by_name.get(by)
            how = "a recompute" if by == "(recompute)" else f"prefetch by {by or '(root)'}"
            title = f"all-gather of unit {label} ({size_text(u.gather_bytes)}, again: {how})"
            recording.kernels.append(KernelSlice(TRACKS["all_gather"], Collective(
                title, title, "all_gather", u.gather_bytes, "float32", max(1, result.world // result.replicate),
                trigger=node(issuer.pre_in if issuer is not None else None)), t0 + span.start_ns, t0 + span.end_ns))
    recording.end = max(recording.end, t0 + result.wall_ns)


def sim_events(result: FsdpResult) -> list[tuple[str, str]]:
    """The simulated rank's FSDP events in the order they start: (``pre``, unit) for a pre-backward,
    (``all-gather``, unit), (``reduce-scatter``, unit), and under HSDP (``all-reduce``, unit) across the
    replicas; the order a rank's profile shows FSDP's own spans (and HSDP's all-reduce) in."""
    out = []
    for u in result.units:
        if u.pre_ns is not None:
            out.append((u.pre_ns, 0, "pre", u.name))
        if u.all_gather is not None:
            out.append((u.all_gather.start_ns, 1, "all-gather", u.name))
        for span, _ in u.regathers:
            out.append((span.start_ns, 1, "all-gather", u.name))
        if u.reduce_scatter is not None:
            out.append((u.reduce_scatter.start_ns, 2, "reduce-scatter", u.name))
        if u.all_reduce is not None:
            out.append((u.all_reduce.start_ns, 3, "all-reduce", u.name))
    return [(kind, name) for _, _, kind, name in sorted(out, key=lambda e: (e[0], e[1]))]
