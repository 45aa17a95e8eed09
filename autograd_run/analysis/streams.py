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
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

from autograd_run.record.recording import Collective, KernelSlice, Recording


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
    #: the path's steps root to end: (kind "cpu"|"kernel"|"wait", label, ns)
    path: list[tuple[str, str, int]] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for s, row in zip(self.streams + [self.total], d["streams"] + [d["total"]]):
            row["idle_ns"], row["utilization"] = s.idle_ns, s.utilization
        d["path"] = [list(p) for p in self.path]
        return d


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersection(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> int:
    """Length of the intersection of two merged (sorted, disjoint) interval lists."""
    i = j = total = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            total += b - a
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _is_comm(k) -> bool:
    return isinstance(k.node, Collective)


def _device_of(stream: str) -> str:
    dev, slash, _ = stream.partition("/s")
    return dev if slash else ""


def streams_of(rec: Recording, extra: list | None = None) -> StreamReport | None:
    """The streams of ``rec``, with ``extra`` kernels beside its own (a data-parallel simulation's
    collectives, ``sim.ddp.collective_kernels``); None when there are none."""
    kernels = list(rec.kernels) + list(extra or ())
    if not kernels:
        return None
    by: dict[str, list] = {}
    for k in kernels:
        by.setdefault(k.stream, []).append(k)
    report = StreamReport()
    merged: dict[str, list[tuple[int, int]]] = {}
    for name in sorted(by, key=lambda n: (_device_of(n) == "", n)):
        ks = by[name]
        spans = _merge([(k.start, k.end) for k in ks])
        merged[name] = spans
        report.streams.append(StreamStat(name, len(ks), sum(b - a for a, b in spans),
                                         max(k.end for k in ks) - min(k.start for k in ks),
                                         comm=all(_is_comm(k) for k in ks)))
    every = _merge([iv for spans in merged.values() for iv in spans])
    report.total = StreamStat("all streams", len(kernels), sum(b - a for a, b in every),
                              max(k.end for k in kernels) - min(k.start for k in kernels))
    comm = [s for s in report.streams if s.comm]
    if comm:
        compute = [s.stream for s in report.streams if not s.comm]
        devices = {_device_of(s) for s in compute}
        # a rank's collectives run on its first device (what the Kineto trace shows too)
        home = sorted(devices)[0] if devices else ""
        under = _merge([iv for s in compute if _device_of(s) == home for iv in merged[s]])
        report.comm_ns = sum(s.busy_ns for s in comm)
        report.hidden_ns = sum(_intersection(merged[s.stream], under) for s in comm)
        report.overlap = report.hidden_ns / report.comm_ns if report.comm_ns else 1.0
    _path(rec, kernels, by, report)
    return report


def _path(rec: Recording, kernels: list, by: dict, report: StreamReport) -> None:
    """The critical path through threads and streams (see the module docstring)."""
    slices = rec.slices
    if not slices:
        return
    # kernels per stream in start order; node slices per thread in start order; a node's runs by node
    streams = {name: sorted(ks, key=lambda k: (k.start, k.end)) for name, ks in by.items()}
    threads: dict[int, list] = {}
    runs: dict[int, list] = {}
    for sl in sorted(slices, key=lambda s: (s.start, s.end)):
        threads.setdefault(sl.tid, []).append(sl)
        runs.setdefault(id(sl.node), []).append(sl)
    producers: dict[int, list] = {}  # id(consumer node) -> its producers' slices
    for sl in slices:
        for e in sl.node.next:
            if e is not None:
                producers.setdefault(id(e[0]), []).append(sl)
    waits: dict[str, list] = {}  # stream -> [(time, the recording stream)] of its waits
    recorded: dict[int, str] = {}
    for ev in rec.stream_events:
        if ev.action == "record":
            recorded[ev.event] = ev.stream
        elif ev.action == "wait" and ev.event in recorded:
            waits.setdefault(ev.stream, []).append((ev.ts, recorded[ev.event]))
    for w in waits.values():
        w.sort()
    wait_ts = {name: [ts for ts, _ in w] for name, w in waits.items()}
    # each stream's kernels by end (serial on a stream: the start order), for the latest end by a time
    ends = {name: [k.end for k in ks] for name, ks in streams.items()}
    prefix_best: dict[str, list[int]] = {}
    for name, ks in streams.items():  # the index of the latest-ending kernel among the first j + 1
        best, out = 0, []
        for j, k in enumerate(ks):
            if k.end >= ks[best].end:
                best = j
            out.append(best)
        prefix_best[name] = out
    launcher: dict[int, object] = {}
    for name, ks in streams.items():
        for k in ks:
            if _is_comm(k):
                continue
            best = None
            for sl in runs.get(id(k.node), ()):
                if sl.start <= k.start:
                    best = sl
            if best is not None:
                launcher[id(k)] = best

    def enqueued(k) -> int:
        """When a kernel was put on its stream: its launch (its node's CPU part's end), else its start."""
        sl = launcher.get(id(k))
        return min(sl.end, k.start) if sl is not None else k.start

    pos = {id(x): j for items in (*streams.values(), *threads.values()) for j, x in enumerate(items)}

    def before(items: list, item):
        """The item before ``item`` in its list (start order), if it ended by ``item``'s start."""
        j = pos[id(item)]
        return items[j - 1] if j and items[j - 1].end <= item.start else None

    last_slice = max(slices, key=lambda s: s.end)
    last_kernel = max(kernels, key=lambda k: k.end)
    at = last_kernel if last_kernel.end > last_slice.end else last_slice
    steps: list[tuple[str, str, int]] = []
    end = at.end
    seen = 0
    limit = 4 * (len(slices) + len(kernels)) + 8
    while at is not None and seen < limit:
        seen += 1
        # what ``at`` waited for: of the things it could not start before, the one that ended last
        if isinstance(at, KernelSlice):
            label = at.node.name if _is_comm(at) else f"{at.node.id} {at.node.name}"
            steps.append(("kernel", label, end - at.start))
            options = []  # (the time it let ``at`` start, the step before)
            prev = before(streams[at.stream], at)
            if prev is not None:
                options.append((prev.end, prev, prev.end))
            w = waits.get(at.stream)
            if w:
                # a wait applies to the first kernel enqueued after it: those between the previous kernel's
                # enqueueing and this one's
                j = pos[id(at)]
                since = enqueued(streams[at.stream][j - 1]) if j else -1
                lo = bisect.bisect_right(wait_ts[at.stream], since)
                hi = bisect.bisect_right(wait_ts[at.stream], enqueued(at))
                for src in dict.fromkeys(src for _, src in w[lo:hi]):
                    ks = streams.get(src)
                    if not ks:
                        continue
                    j = bisect.bisect_right(ends[src], at.start) - 1  # kernels by start: ends nearly sorted
                    while j >= 0 and ks[j].end > at.start:
                        j -= 1
                    if j >= 0:
                        k = ks[prefix_best[src][j]]
                        if k.end <= at.start:
                            options.append((k.end, k, k.end))
            sl = launcher.get(id(at))
            if sl is not None:
                launch = min(sl.end, at.start)
                options.append((launch, sl, launch))
        else:  # a node slice
            steps.append(("cpu", f"{at.node.id} {at.node.name}", end - at.start))
            options = []
            prev = before(threads[at.tid], at)
            if prev is not None:
                options.append((prev.end, prev, prev.end))
            ready = [p for p in producers.get(id(at.node), ()) if p.gt == at.gt and p.end <= at.start]
            if ready:
                p = max(ready, key=lambda s: s.end)
                options.append((p.end, p, p.end))
        if not options:
            break
        t, nxt, nxt_end = max(options, key=lambda o: o[0])
        if at.start > t:
            steps.append(("wait", "", at.start - t))
        end = nxt_end
        at = nxt
    steps.reverse()
    report.path = steps
    report.path_ns = sum(s[2] for s in steps)
    report.path_cpu_ns = sum(s[2] for s in steps if s[0] == "cpu")
    report.path_gpu_ns = sum(s[2] for s in steps if s[0] == "kernel")
    report.path_wait_ns = sum(s[2] for s in steps if s[0] == "wait")
