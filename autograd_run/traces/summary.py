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
from dataclasses import asdict, dataclass, field

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


def summarize(rec: Recording, slowest: int = 10) -> Summary:
    """The statistics of a recorded run (see the module docstring for the definitions)."""
    s = Summary()
    if rec.empty:
        return s
    t_first = rec.start
    gaps = _gaps_between_calls(rec)
    s.wall_ns = rec.end - rec.start - _union_length(gaps)
    name = rec.thread_name

    workers: dict[int, Worker] = {}

    def worker(tid) -> Worker:
        w = workers.get(tid)
        if w is None:
            w = workers[tid] = Worker(name(tid))
        return w

    ops: dict[str, list[int]] = {}
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
        ops.setdefault(node.name, []).append(dur)
        runs[(sl.gt, node)] = NodeRun(node.id, node.name, name(sl.tid), sl.start - t_first, dur,
                                      sl.wait.waited if sl.wait is not None else 0, sl.gt)
        if node.op is OPAQUE and node.id not in s.opaque_nodes:
            s.opaque_nodes.append(node.id)
    for tid, spans in intervals.items():
        worker(tid).busy_ns = _union_length(spans)
    for idle in rec.idles:
        worker(idle.tid).idle_ns += idle.end - idle.start - _overlap((idle.start, idle.end), gaps)

    queue_waits: dict[str, list[int]] = {}
    for w in rec.waits:
        queue_waits.setdefault(w.queue, []).append(w.waited)
    lock_waits: dict[str, list[int]] = {}
    for lw in rec.lock_waits:
        lock_waits.setdefault(lw.lock, []).append(lw.waited)
    s.nodes_skipped = len(rec.skips)
    for sync in rec.syncs:
        key = f"{sync.src} -> {sync.dst}"
        s.syncs[key] = s.syncs.get(key, 0) + 1
        p, c = runs.get((sync.gt, sync.producer)), runs.get((sync.gt, sync.consumer))
        if p is not None and c is not None:
            s.sync_latency_ns += max(0, c.start_ns - (p.start_ns + p.duration_ns))
    s.errors = [f"{e.node.id if e.node is not None else '-'}: {e.message}" for e in rec.errors]
    s.graph_tasks = len(rec.graph_tasks)
    s.passes = Dist.of([g.end - g.start for g in rec.graph_tasks if g.depth == 0 and g.end is not None])
    s.nodes_executed = len(runs)
    for w in workers.values():
        w.utilization = w.busy_ns / s.wall_ns if s.wall_ns else 0.0
    order = {tid: k for k, tid in enumerate(rec.threads)}
    s.workers = [workers[t] for t in sorted(workers, key=lambda t: (order.get(t, len(order)), workers[t].name))]
    s.ops = {k: Dist.of(v) for k, v in sorted(ops.items(), key=lambda kv: -sum(kv[1]))}
    s.queue_waits = {k: Dist.of(v) for k, v in sorted(queue_waits.items())}
    s.lock_waits = {k: Dist.of(v) for k, v in sorted(lock_waits.items())}
    s.slowest = sorted(runs.values(), key=lambda r: (-r.duration_ns, r.start_ns))[:slowest]
    s.critical_path, s.critical_path_ns = _critical_path(runs)
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
