"""Summary: a pure function from a ``Recording`` to run statistics.

``summarize(recording)`` returns a ``Summary`` (dataclasses with
documented fields, JSON-ready through ``to_dict``). It never looks at the
clock or the engine, so tests feed it synthetic recordings.

Definitions:
  wall          the time inside the run's top-level backward calls, in ns:
                from the first call's start to the run's last event, less
                the gaps between one call's end and the next one's start
                (a ``--repeat`` run's set-up of each pass is not counted);
                without graph-task spans (a synthetic recording), first to
                last event;
  busy          per worker, time inside at least one node slice (nested
                reentrant slices are not counted twice);
  idle          per worker, time blocked on an empty ready queue within the
                wall time;
  queue wait    per task, push to pop;
  critical path the chain of executed nodes (root to a leaf, following
                next edges within one GraphTask) with the largest sum of
                queue wait + run time; its share is that sum over wall.
"""

from __future__ import annotations

import bisect
import copy
import math
from array import array
from dataclasses import asdict, dataclass, field

from autograd_run.engine.threads import thread_sort_key
from autograd_run.ops import OPAQUE, is_graph_root
from autograd_run.traces.recording import Recording


def p95(values: list[int]) -> int:
    """Nearest-rank 95th percentile (0 for no values)."""
    if not values:
        return 0
    s = sorted(values)
    k = max(0, -(-95 * len(s) // 100) - 1)
    return s[k]


@dataclass
class Dist:
    """count, total, mean and p95 of a set of durations (ns)."""

    count: int = 0
    total_ns: int = 0
    mean_ns: float = 0.0
    p95_ns: int = 0

    @staticmethod
    def of(values: list[int]) -> "Dist":
        if not values:
            return Dist()
        return Dist(len(values), sum(values), sum(values) / len(values), p95(values))


@dataclass
class Worker:
    name: str
    nodes: int = 0
    busy_ns: int = 0
    idle_ns: int = 0
    utilization: float = 0.0


@dataclass
class NodeRun:
    id: str
    name: str
    thread: str
    start_ns: int
    duration_ns: int
    queue_wait_ns: int
    graph_task: int


@dataclass
class Summary:
    wall_ns: int = 0
    nodes_executed: int = 0
    nodes_skipped: int = 0
    opaque_nodes: list[str] = field(default_factory=list)
    graph_tasks: int = 0
    errors: list[str] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    ops: dict[str, Dist] = field(default_factory=dict)
    queue_waits: dict[str, Dist] = field(default_factory=dict)
    lock_waits: dict[str, Dist] = field(default_factory=dict)
    syncs: dict[str, int] = field(default_factory=dict)
    #: Producer end to consumer start, over all syncs (ns).
    sync_latency_ns: int = 0
    slowest: list[NodeRun] = field(default_factory=list)
    critical_path: list[NodeRun] = field(default_factory=list)
    critical_path_ns: int = 0
    critical_path_share: float = 0.0
    #: Wall time of each top-level backward call (one per pass with --repeat).
    passes: Dist = field(default_factory=Dist)

    def to_dict(self) -> dict:
        return asdict(self)


class Samples:
    """Durations (ns) for a ``Dist``, in bounded memory: kept exactly up to ``EXACT`` values (a compact
    int64 array), then as a histogram of buckets 1% wide, so the p95 of a million-pass run costs
    no more memory than that of a short one and is off by at most 1%. Count, total and mean stay exact."""

    EXACT = 4096
    RATIO = 1.01

    def __init__(self):
        self.count = 0
        self.total = 0
        self.exact: array | None = array("q")
        self.buckets: dict[int, int] | None = None

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value
        if self.exact is not None:
            self.exact.append(value)
            if len(self.exact) > self.EXACT:
                self.buckets = {}
                for v in self.exact:
                    self._bucket(v)
                self.exact = None
        else:
            self._bucket(value)

    def extend(self, values) -> None:
        for v in values:
            self.add(v)

    def _bucket(self, value: int) -> None:
        k = -1 if value <= 0 else int(math.log(value, self.RATIO))
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def p95(self) -> int:
        if self.exact is not None:
            return p95(list(self.exact))
        rank = max(0, -(-95 * self.count // 100) - 1)
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen > rank:
                return 0 if k < 0 else int(round(self.RATIO ** (k + 0.5)))
        return 0

    def dist(self) -> "Dist":
        if not self.count:
            return Dist()
        return Dist(self.count, self.total, self.total / self.count, self.p95())


def summarize(rec: Recording, slowest: int = 10) -> Summary:
    """The statistics of a recorded run (see the module docstring for the definitions)."""
    b = SummaryBuilder(slowest)
    b.add(rec)
    return b.summary()


class SummaryBuilder:
    """A ``Summary`` built from one recording, or folded from many (one per ``--repeat`` pass, each
    dropped once folded), in memory that does not grow with the passes: sums and counts add up,
    distributions are ``Samples``, the slowest nodes and the critical path keep the top ones.
    ``add`` recordings in time order; start times are from the first one's start."""

    def __init__(self, slowest: int = 10):
        self.slowest = slowest
        self.s = Summary()
        self.t0: int | None = None
        self.workers: dict[int, Worker] = {}
        self.thread_rank: dict[int, tuple] = {}
        self.ops: dict[str, Samples] = {}
        self.queue_waits: dict[str, Samples] = {}
        self.lock_waits: dict[str, Samples] = {}
        self.passes = Samples()
        self.top: list[NodeRun] = []

    def add(self, rec: Recording) -> None:
        if rec.empty:
            return
        s = self.s
        if self.t0 is None:
            self.t0 = rec.start
        t_first = self.t0
        gaps = _gaps_between_calls(rec)
        s.wall_ns += rec.end - rec.start - _union_length(gaps)
        name = rec.thread_name
        for k, (tid, info) in enumerate(rec.threads.items()):
            self.thread_rank.setdefault(tid, thread_sort_key(info.name))

        def worker(tid) -> Worker:
            w = self.workers.get(tid)
            if w is None:
                w = self.workers[tid] = Worker(name(tid))
            return w

        runs: dict[tuple, NodeRun] = {}
        intervals: dict[int, list[tuple[int, int]]] = {}
        for sl in rec.slices:
            intervals.setdefault(sl.tid, []).append((sl.start, sl.end))
            w = worker(sl.tid)
            node = sl.node
            if is_graph_root(node):
                continue
            w.nodes += 1
            dur = sl.end - sl.start
            samples = self.ops.get(node.name)
            if samples is None:
                samples = self.ops[node.name] = Samples()
            samples.add(dur)
            runs[(sl.gt, node)] = NodeRun(node.id, node.name, name(sl.tid), sl.start - t_first, dur,
                                          sl.wait.waited if sl.wait is not None else 0, sl.gt)
            if node.op is OPAQUE and node.id not in s.opaque_nodes:
                s.opaque_nodes.append(node.id)
        for tid, spans in intervals.items():
            worker(tid).busy_ns += _union_length(spans)
        for idle in rec.idles:
            worker(idle.tid).idle_ns += idle.end - idle.start - _overlap((idle.start, idle.end), gaps)
        for w in rec.waits:
            self.queue_waits.setdefault(w.queue, Samples()).add(w.waited)
        for lw in rec.lock_waits:
            self.lock_waits.setdefault(lw.lock, Samples()).add(lw.waited)
        s.nodes_skipped += len(rec.skips)
        for sync in rec.syncs:
            key = f"{sync.src} -> {sync.dst}"
            s.syncs[key] = s.syncs.get(key, 0) + 1
            p, c = runs.get((sync.gt, sync.producer)), runs.get((sync.gt, sync.consumer))
            if p is not None and c is not None:
                s.sync_latency_ns += max(0, c.start_ns - (p.start_ns + p.duration_ns))
        s.errors += [f"{e.node.id if e.node is not None else '-'}: {e.message}" for e in rec.errors]
        s.graph_tasks += len(rec.graph_tasks)
        self.passes.extend(g.end - g.start for g in rec.graph_tasks if g.depth == 0 and g.end is not None)
        s.nodes_executed += len(runs)
        key = lambda r: (-r.duration_ns, r.start_ns)  # noqa: E731
        self.top = sorted(self.top + sorted(runs.values(), key=key)[:self.slowest], key=key)[:self.slowest]
        path, path_ns = _critical_path(runs)
        if path_ns > s.critical_path_ns or not s.critical_path:
            s.critical_path, s.critical_path_ns = path, path_ns

    def summary(self) -> Summary:
        """The summary of everything added so far (a fresh object each time)."""
        s = copy.deepcopy(self.s)
        if self.t0 is None:
            return s
        workers = copy.deepcopy(self.workers)
        for w in workers.values():
            w.utilization = w.busy_ns / s.wall_ns if s.wall_ns else 0.0
        s.workers = [workers[t] for t in sorted(workers, key=lambda t: (self.thread_rank.get(t, (9,)),
                                                                         workers[t].name))]
        s.ops = {k: v.dist() for k, v in sorted(self.ops.items(), key=lambda kv: -kv[1].total)}
        s.queue_waits = {k: v.dist() for k, v in sorted(self.queue_waits.items())}
        s.lock_waits = {k: v.dist() for k, v in sorted(self.lock_waits.items())}
        s.passes = self.passes.dist()
        s.slowest = list(self.top)
        s.critical_path_share = s.critical_path_ns / s.wall_ns if s.wall_ns else 0.0
        return s


def _gaps_between_calls(rec: Recording) -> list[tuple[int, int]]:
    """The stretches between one top-level backward call's end and the next one's start."""
    spans = sorted((g.start, g.end) for g in rec.graph_tasks if g.depth == 0 and g.end is not None)
    gaps, reach = [], None
    for a, b in spans:
        if reach is not None and a > reach:
            gaps.append((reach, a))
        reach = b if reach is None else max(reach, b)
    return gaps


def _overlap(span: tuple[int, int], gaps: list[tuple[int, int]]) -> int:
    """How much of ``span`` lies in ``gaps`` (sorted, disjoint)."""
    a, b = span
    total = 0
    k = max(0, bisect.bisect_right(gaps, (a, a)) - 1)
    while k < len(gaps) and gaps[k][0] < b:
        x, y = gaps[k]
        total += max(0, min(b, y) - max(a, x))
        k += 1
    return total


def _union_length(spans: list[tuple[int, int]]) -> int:
    """Total length covered by possibly nested or overlapping intervals."""
    total, cur_start, cur_end = 0, None, None
    for a, b in sorted(spans):
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        elif b > cur_end:
            cur_end = b
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _critical_path(runs: dict[tuple, NodeRun]) -> tuple[list[NodeRun], int]:
    """Longest chain by (queue wait + duration), following next edges within a GraphTask."""
    if not runs:
        return [], 0
    best: dict[tuple, int] = {}
    succ: dict[tuple, tuple | None] = {}
    # A consumer always starts after its producers ran, so reverse start order is a valid order.
    for key, run in sorted(runs.items(), key=lambda kv: kv[1].start_ns, reverse=True):
        gt, node = key
        top, nxt = 0, None
        for e in node.next:
            if e is None:
                continue
            k2 = (gt, e.node)
            if k2 in best and best[k2] > top:
                top, nxt = best[k2], k2
        best[key] = run.queue_wait_ns + run.duration_ns + top
        succ[key] = nxt
    start = max(best, key=lambda k: (best[k], -runs[k].start_ns))
    path, k = [], start
    while k is not None:
        path.append(runs[k])
        k = succ[k]
    return path, best[start]
