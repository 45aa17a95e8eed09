"""Accelerator streams of a recording: busy and idle time per stream, communication hidden under compute, and
the critical path through the CPU threads and the streams. A pure function of a Recording (its kernels are a
simulation's; a real run records none).

``streams_of(rec)`` returns a ``StreamReport`` (``None`` without kernels). Definitions, chosen to be those of
the Holistic Trace Analysis figures a team reads from a profile, so the two can be held to each other
(``traces.kineto`` writes the trace HTA reads):

  busy        per stream, the time inside at least one of its kernels (intervals merged);
  span        per stream, its first kernel's start to its last kernel's end;
  idle        per stream, span minus busy (HTA's idle time of a stream); ``total``: every stream
              together (HTA's temporal breakdown of the rank);
  overlap     per device, the share of its collectives' time (communication streams: DDP's all-reduces,
              FSDP's all-gathers and reduce-scatters) during which a compute stream of that device runs a
              kernel (HTA's communication/computation overlap); None without collectives;
  path        the critical path through threads and streams, walked back from the run's last end: a
              kernel waited for whichever of these ended last: the kernel before it on its stream, the
              kernel that recorded the event its stream waited for (a cross-stream wait), its launch (the
              end of its node's CPU part); a node for whichever ended last of the node before it on its
              thread and the node whose output made it ready. Its length is the last end less the start
              of the first node on it; each step is the CPU's (a node's slice, up to its launch), a
              kernel's, or a wait no event explains (``path_cpu_ns``, ``path_gpu_ns``, ``path_wait_ns``).

Ties are broken the one way, so the report is a function of the recording: items on a stream or a thread in
(start, end) order, then in the recording's order (kernels as listed, node slices in end order); among the
things a step waited for, the first of (the item before it, the recorded streams' kernels in the order of
their waits, its launch) that ended last; among a node's producers, the earliest slice in the recording's
order of those that ended last.

The work over every kernel and slice (grouping, sorting, unions, the launch of each kernel) is done on numpy
columns (``Recording.columns``: no record object per node); only the walk is a Python loop, one step per item
on the path, over plain lists.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field, fields
from itertools import repeat
from operator import itemgetter

import numpy as np

from autograd_run.engine import core
from autograd_run.record.kernels import node_edges, node_rows
from autograd_run.record.recording import Collective, Recording


@dataclass
class StreamStat:
    stream: str
    kernels: int
    busy_ns: int
    span_ns: int
    #: True for a collective's stream (its kernels are communication)
    comm: bool = False

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns

    @property
    def utilization(self) -> float:
        return self.busy_ns / self.span_ns if self.span_ns else 0.0


@dataclass
class StreamReport:
    streams: list[StreamStat] = field(default_factory=list)
    #: every stream together (HTA's temporal breakdown of a rank): busy is the union of all kernels
    total: StreamStat | None = None
    #: the share of communication time under compute kernels (None: no collectives)
    overlap: float | None = None
    comm_ns: int = 0
    hidden_ns: int = 0
    path_ns: int = 0
    path_cpu_ns: int = 0
    path_gpu_ns: int = 0
    path_wait_ns: int = 0
    #: the path's steps root to end as the walk gives them: (kind "cpu"|"kernel"|"wait", what, ns), what a node
    #: (labelled "{id} {name}"), a collective's name, or "" (a wait); labelled when read (``path``): a
    #: million-step path is only counted by the summary, and written out by ``--json`` alone
    steps: list = field(default_factory=list, repr=False)

    @property
    def path(self) -> list[tuple[str, str, int]]:
        """The path's steps root to end: (kind "cpu"|"kernel"|"wait", label, ns)."""
        return [(kind, what if isinstance(what, str) else f"{what.id} {what.name}", ns) for kind, what, ns in self.steps]

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}
        d["streams"] = [asdict(s) for s in self.streams]
        d["total"] = asdict(self.total) if self.total is not None else None
        for s, row in zip(self.streams + [self.total], d["streams"] + [d["total"]]):
            if s is not None:
                row["idle_ns"], row["utilization"] = s.idle_ns, s.utilization
        d["path"] = [list(p) for p in self.path]
        return d


def _device_of(stream: str) -> str:
    dev, slash, _ = stream.partition("/s")
    return dev if slash else ""


def _groups(keys: np.ndarray, order: np.ndarray, count: int) -> list[np.ndarray]:
    """``order`` (indices sorted by ``keys`` first) cut into one array per key value 0..count-1."""
    bounds = np.searchsorted(keys[order], np.arange(count + 1))
    return [order[bounds[c]:bounds[c + 1]] for c in range(count)]


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The merged intervals (sorted, disjoint; touching ones joined) of the intervals given in start order."""
    if not len(starts):
        return starts, ends
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(starts) - 1)
    return starts[firsts], reach[lasts]


def _intersection(xs: tuple[np.ndarray, np.ndarray], ys: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two merged (sorted, disjoint) interval lists: for each interval of
    ``xs``, how much of ``ys`` lies below its end less how much lies below its start."""
    ya, yb = ys
    if not len(xs[0]) or not len(ya):
        return 0
    below = np.concatenate(([0], np.cumsum(yb - ya)))  # ys' length before each of its intervals

    def covered(t: np.ndarray) -> np.ndarray:
        """How much of ``ys`` lies below each time of ``t``."""
        j = np.searchsorted(ya, t, side="right") - 1
        jj = np.maximum(j, 0)
        return np.where(j >= 0, below[jj] + np.clip(t - ya[jj], 0, yb[jj] - ya[jj]), 0)

    return int((covered(xs[1]) - covered(xs[0])).sum())


def streams_of(rec: Recording, extra: list | None = None) -> StreamReport | None:
    """The streams of ``rec``, with ``extra`` kernels beside its own (a data-parallel simulation's
    collectives, ``sim.ddp.collective_kernels``); None when there are none."""
    kernels = list(rec.kernels) + list(extra or ())
    if not kernels:
        return None
    # (the columns read by C-level maps: KernelSlice is a NamedTuple (stream, node, start, end))
    n = len(kernels)
    names = {name: c for c, name in enumerate(dict.fromkeys(map(itemgetter(0), kernels)))}  # in order of first use
    code = np.fromiter(map(names.__getitem__, map(itemgetter(0), kernels)), np.int64, n)
    start = np.fromiter(map(itemgetter(2), kernels), np.int64, n)
    end = np.fromiter(map(itemgetter(3), kernels), np.int64, n)
    comm = np.fromiter(map(isinstance, map(itemgetter(1), kernels), repeat(Collective)), bool, n)
    # each stream's kernels in (start, end) order, then as listed
    order = np.lexsort((np.arange(len(kernels)), end, start, code))
    by = _groups(code, order, len(names))
    report = StreamReport()
    merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in sorted(names, key=lambda n: (_device_of(n) == "", n)):
        ks = by[names[name]]
        merged[name] = spans = _union(start[ks], end[ks])
        report.streams.append(StreamStat(name, len(ks), int((spans[1] - spans[0]).sum()),
                                         int(end[ks].max() - start[ks].min()), comm=bool(comm[ks].all())))
    every = np.lexsort((end, start))
    a, b = _union(start[every], end[every])
    report.total = StreamStat("all streams", len(kernels), int((b - a).sum()), int(end.max() - start.min()))
    comms = [s for s in report.streams if s.comm]
    if comms:
        compute = [s.stream for s in report.streams if not s.comm]
        devices = {_device_of(s) for s in compute}
        # a rank's collectives run on its first device (what the Kineto trace shows too)
        home = sorted(devices)[0] if devices else ""
        mine = [ks for s in compute if _device_of(s) == home for ks in (by[names[s]],)]
        if mine:
            ks = np.concatenate(mine)
            ks = ks[np.lexsort((end[ks], start[ks]))]
            under = _union(start[ks], end[ks])
        else:
            under = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        report.comm_ns = sum(s.busy_ns for s in comms)
        report.hidden_ns = sum(_intersection(merged[s.stream], under) for s in comms)
        report.overlap = report.hidden_ns / report.comm_ns if report.comm_ns else 1.0
    _path(rec, kernels, code, start, end, comm, names, by, report)
    return report


def _path(rec: Recording, kernels: list, code: np.ndarray, start: np.ndarray, end: np.ndarray, comm: np.ndarray,
          names: dict, by: list, report: StreamReport) -> None:
    """The critical path through threads and streams (see the module docstring). Items are numbered:
    kernels 0..K-1 as listed, node slices K..K+S-1 in the recording's order."""
    c = rec.columns()
    sl = c.slices
    n_s, n_k = len(sl), len(kernels)
    if not n_s:
        return
    s_start, s_end, s_tid, s_gt, s_node = sl.start, sl.end, sl.tid, sl.gt, sl.node
    nodes = c.nodes
    # each thread's slices in (start, end) order, then the recording's
    tids, s_tcode = np.unique(s_tid, return_inverse=True)
    t_order = np.lexsort((np.arange(n_s), s_end, s_start, s_tcode))
    threads = _groups(s_tcode, t_order, len(tids))
    # the launch of a kernel: the last run of its node (slices by (start, end)) that started by the kernel's start
    k_nodes = [k.node for k in kernels]
    k_node = np.where(comm, -1, node_rows(nodes, k_nodes))
    times, rank = np.unique(np.concatenate((s_start, start)), return_inverse=True)
    r_s, r_k = rank[:n_s], rank[n_s:]
    span = len(times) + 1
    r_order = np.lexsort((np.arange(n_s), s_end, s_start, s_node))
    r_key = s_node[r_order] * span + r_s[r_order]
    at_or_before = np.searchsorted(r_key, k_node * span + r_k, side="right") - 1
    found = (k_node >= 0) & (at_or_before >= 0)
    found &= s_node[r_order[np.maximum(at_or_before, 0)]] == k_node
    k_launch = np.where(found, r_order[np.maximum(at_or_before, 0)], -1)
    # when a kernel was put on its stream: its launch (its node's CPU part's end), else its start
    k_enq = np.where(found, np.minimum(s_end[np.maximum(k_launch, 0)], start), start)
    # each item's place in its stream's or its thread's order
    k_pos = np.zeros(n_k, np.int64)
    for ks in by:
        k_pos[ks] = np.arange(len(ks))
    s_pos = np.zeros(n_s, np.int64)
    for ts in threads:
        s_pos[ts] = np.arange(len(ts))
    # a node's producers: the nodes whose edges lead to it, and each node's slices in the recording's order
    src_a, dst_a = node_edges(nodes)
    e_order = np.argsort(dst_a, kind="stable")
    e_bounds = np.searchsorted(dst_a[e_order], np.arange(len(nodes) + 1))
    e_src = src_a[e_order]
    n_order = np.argsort(s_node, kind="stable")
    n_bounds = np.searchsorted(s_node[n_order], np.arange(len(nodes) + 1))
    n_slices = n_order
    # a stream's waits: (time, the recording stream), sorted
    waits: dict[int, list] = {}
    recorded: dict[int, str] = {}
    for ev in rec.stream_events:
        if ev.action == "record":
            recorded[ev.event] = ev.stream
        elif ev.action == "wait" and ev.event in recorded and ev.stream in names:
            waits.setdefault(names[ev.stream], []).append((ev.ts, recorded[ev.event]))
    for w in waits.values():
        w.sort()
    prefix_best = []  # per stream, the index of the latest-ending kernel among its first j + 1
    for ks in by:
        e = end[ks]
        if not len(e):
            prefix_best.append(np.zeros(0, np.int64))
            continue
        new = np.ones(len(e), dtype=bool)
        new[1:] = e[1:] >= np.maximum.accumulate(e)[:-1]
        prefix_best.append(np.maximum.accumulate(np.where(new, np.arange(len(e)), 0)))
    # the walk's columns, flat: each stream's kernels (and their ends, and prefix_best) after one another, each
    # thread's slices likewise, each stream's waits (their times and the recording stream's code, -1 where no
    # kernel ran on it) likewise
    n_streams = len(by)
    s_off = np.zeros(n_streams + 1, np.int64)
    s_off[1:] = np.cumsum([len(ks) for ks in by])
    t_off = np.zeros(len(threads) + 1, np.int64)
    t_off[1:] = np.cumsum([len(ts) for ts in threads])
    w_off = np.zeros(n_streams + 1, np.int64)
    w_off[1:] = np.cumsum([len(waits.get(c, ())) for c in range(n_streams)])
    flat_waits = [w for c in range(n_streams) for w in waits.get(c, ())]
    cat = (lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64))
    arrays = (start, end, code, k_pos, k_launch, k_enq, comm.astype(np.int64),
              s_start, s_end, s_tcode, s_pos, s_gt, s_node,
              s_off, cat(by), cat([end[ks] for ks in by]), cat(prefix_best),
              t_off, cat(threads),
              w_off, np.array([ts for ts, _ in flat_waits], np.int64),
              np.array([names.get(name, -1) for _, name in flat_waits], np.int64),
              e_bounds, e_src, n_bounds, n_slices)
    arrays = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in arrays)
    last_s = int(np.argmax(s_end))  # the first of those that ended last
    last_k = int(np.argmax(end))
    at = last_k if end[last_k] > s_end[last_s] else n_k + last_s
    t_end = int(end[at]) if at < n_k else int(s_end[at - n_k])
    walk = core.stream_walk if core.stream_walk is not None else stream_walk_py
    report.steps, report.path_cpu_ns, report.path_gpu_ns, report.path_wait_ns = walk(
        arrays, k_nodes, nodes, at, t_end, 4 * (n_s + n_k) + 8)
    report.path_ns = report.path_cpu_ns + report.path_gpu_ns + report.path_wait_ns


def stream_walk_py(arrays: tuple, k_nodes: list, nodes: list, at: int, t_end: int, limit: int) -> tuple:
    """The walk back from item ``at`` (ending at ``t_end``), at most ``limit`` steps: (the steps root to end,
    CPU ns, kernel ns, wait ns), each step (kind, what, ns) as ``StreamReport.steps`` holds them. The compiled
    twin is ``engine/csrc/stream_walk.c``; ``arrays`` are the int64 columns ``_path`` makes, in its order."""
    (ks_, ke_, kc_, kp_, kl_, kq_, comm_l, ss_, se_, st_, sp_, sg_, sn_, s_off, s_items, s_ends, s_best,
     t_off, t_items, w_off, w_ts, w_src, e_bounds, e_src, n_bounds, n_slices) = [a.tolist() for a in arrays]
    n_k = len(ks_)
    steps: list[tuple[str, str, int]] = []
    seen = 0
    bisect_right = bisect.bisect_right
    while seen < limit:
        seen += 1
        # what ``at`` waited for: of the things it could not start before, the one that ended last
        if at < n_k:
            k = at
            node = k_nodes[k]
            a_start = ks_[k]
            steps.append(("kernel", node.name if comm_l[k] else node, t_end - a_start))
            best_t, nxt = None, None  # the first option that ended last
            sc, j = kc_[k], kp_[k]
            base = s_off[sc]
            if j:
                prev = s_items[base + j - 1]
                if ke_[prev] <= a_start:
                    best_t, nxt = ke_[prev], prev
            wl, wh = w_off[sc], w_off[sc + 1]
            if wh > wl:
                # a wait applies to the first kernel enqueued after it: those between the previous kernel's
                # enqueueing and this one's
                ts = w_ts[wl:wh]
                lo = bisect_right(ts, kq_[s_items[base + j - 1]] if j else -1)
                hi = bisect_right(ts, kq_[k])
                for o in dict.fromkeys(w_src[wl + lo:wl + hi]):
                    if o < 0 or s_off[o + 1] == s_off[o]:
                        continue
                    es = s_ends[s_off[o]:s_off[o + 1]]
                    i = bisect_right(es, a_start) - 1  # kernels by start: ends nearly sorted
                    while i >= 0 and es[i] > a_start:
                        i -= 1
                    if i >= 0:
                        i = s_best[s_off[o] + i]
                        if es[i] <= a_start and (best_t is None or es[i] > best_t):
                            best_t, nxt = es[i], s_items[s_off[o] + i]
            launch = kl_[k]
            if launch >= 0:
                t = min(se_[launch], a_start)
                if best_t is None or t > best_t:
                    best_t, nxt = t, n_k + launch
        else:  # a node slice
            i = at - n_k
            node = nodes[sn_[i]]
            a_start = ss_[i]
            steps.append(("cpu", node, t_end - a_start))
            best_t, nxt = None, None
            j = sp_[i]
            if j:
                prev = t_items[t_off[st_[i]] + j - 1]
                if se_[prev] <= a_start:
                    best_t, nxt = se_[prev], n_k + prev
            gt, p, p_end = sg_[i], -1, None
            d = sn_[i]
            for e in range(e_bounds[d], e_bounds[d + 1]):
                s_code = e_src[e]
                for q in n_slices[n_bounds[s_code]:n_bounds[s_code + 1]]:
                    qe = se_[q]
                    if sg_[q] == gt and qe <= a_start and (p_end is None or qe > p_end or (qe == p_end and q < p)):
                        p, p_end = q, qe
            if p_end is not None and (best_t is None or p_end > best_t):
                best_t, nxt = p_end, n_k + p
        if nxt is None:
            break
        if a_start > best_t:
            steps.append(("wait", "", a_start - best_t))
        t_end = best_t
        at = nxt
    steps.reverse()
    return (steps, sum(s[2] for s in steps if s[0] == "cpu"), sum(s[2] for s in steps if s[0] == "kernel"),
            sum(s[2] for s in steps if s[0] == "wait"))
