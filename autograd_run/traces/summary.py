"""Summary: a pure function from recorded events to run statistics.

``summarize(events, threads)`` returns a ``Summary`` (dataclasses with
documented fields, JSON-ready through ``to_dict``). It never looks at the
clock or the engine, so tests feed it synthetic events.

Definitions:
  wall          first to last event of the run, in ns;
  busy          per worker, time inside at least one node slice (nested
                reentrant slices are not counted twice);
  idle          per worker, time blocked on an empty ready queue;
  queue wait    per task, push to pop;
  critical path the chain of executed nodes (root to a leaf, following
                next edges within one GraphTask) with the largest sum of
                queue wait + run time; its share is that sum over wall.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autograd_run.ops import OPAQUE, is_graph_root
from autograd_run.traces import recorder as R


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


def summarize(events: list[tuple], threads: dict[int, str], slowest: int = 10) -> Summary:
    s = Summary()
    if not events:
        return s
    t_first = min(e[1] for e in events)
    t_last = max(e[4] if e[0] == R.IDLE else e[1] for e in events)
    s.wall_ns = t_last - t_first
    tname = lambda tid: threads.get(tid, str(tid))  # noqa: E731

    workers: dict[int, Worker] = {}
    open_slices: dict[tuple, int] = {}
    depth: dict[int, int] = {}
    busy_start: dict[int, int] = {}
    pushed: dict[tuple, int] = {}
    waits_by_task: dict[tuple, int] = {}
    queue_waits: dict[str, list[int]] = {}
    lock_waits: dict[str, list[int]] = {}
    ops: dict[str, list[int]] = {}
    runs: dict[tuple, NodeRun] = {}
    sync_pairs: list[tuple] = []
    gts = set()
    top_start: dict[int, int] = {}
    pass_walls: list[int] = []

    def worker(tid) -> Worker:
        w = workers.get(tid)
        if w is None:
            w = workers[tid] = Worker(tname(tid))
        return w

    for ev in events:
        kind = ev[0]
        if kind == R.NODE_START:
            _, ts, tid, gt, _, node = ev
            open_slices[(tid, gt, node)] = ts
            if depth.get(tid, 0) == 0:
                busy_start[tid] = ts
            depth[tid] = depth.get(tid, 0) + 1
        elif kind == R.NODE_END:
            _, ts, tid, gt, _, node = ev
            start = open_slices.pop((tid, gt, node), ts)
            depth[tid] = depth.get(tid, 1) - 1
            w = worker(tid)
            if depth[tid] == 0:
                w.busy_ns += ts - busy_start.pop(tid, start)
            if is_graph_root(node):
                continue
            w.nodes += 1
            dur = ts - start
            ops.setdefault(node.name, []).append(dur)
            runs[(gt, node)] = NodeRun(node.id, node.name, tname(tid), start - t_first, dur,
                                       waits_by_task.get((gt, node), 0), gt)
            if node.op is OPAQUE and node.id not in s.opaque_nodes:
                s.opaque_nodes.append(node.id)
        elif kind == R.PUSH:
            _, ts, tid, qname, gt, node, _ = ev
            if node is not None:
                pushed[(gt, node)] = ts
        elif kind == R.POP:
            _, ts, tid, qname, gt, node, _ = ev
            if node is not None and (gt, node) in pushed:
                w_ns = ts - pushed.pop((gt, node))
                waits_by_task[(gt, node)] = w_ns
                queue_waits.setdefault(qname, []).append(w_ns)
        elif kind == R.SKIP:
            s.nodes_skipped += 1
        elif kind == R.LOCK_WAIT:
            lock_waits.setdefault(ev[3], []).append(ev[5])
        elif kind == R.IDLE:
            worker(ev[2]).idle_ns += ev[4] - ev[1]
        elif kind == R.SYNC:
            _, ts, tid, gt, prod, cons, src, dst = ev
            key = f"{src} -> {dst}"
            s.syncs[key] = s.syncs.get(key, 0) + 1
            sync_pairs.append((gt, prod, cons))
        elif kind == R.ERROR:
            node = ev[4]
            s.errors.append(f"{node.id if node is not None else '-'}: {ev[5]}")
        elif kind == R.GT_START:
            gts.add(ev[3])
            if ev[4] == 0:
                top_start[ev[3]] = ev[1]
        elif kind == R.GT_END:
            if ev[3] in top_start:
                pass_walls.append(ev[1] - top_start.pop(ev[3]))

    s.graph_tasks = len(gts)
    s.passes = Dist.of(pass_walls)
    s.nodes_executed = len(runs)
    for w in workers.values():
        w.utilization = w.busy_ns / s.wall_ns if s.wall_ns else 0.0
    s.workers = sorted(workers.values(), key=lambda w: (("cuda:" in w.name) + 2 * ("reentrant" in w.name), w.name))
    s.ops = {k: Dist.of(v) for k, v in sorted(ops.items(), key=lambda kv: -sum(kv[1]))}
    s.queue_waits = {k: Dist.of(v) for k, v in sorted(queue_waits.items())}
    s.lock_waits = {k: Dist.of(v) for k, v in sorted(lock_waits.items())}
    for gt, prod, cons in sync_pairs:
        p, c = runs.get((gt, prod)), runs.get((gt, cons))
        if p is not None and c is not None:
            s.sync_latency_ns += max(0, c.start_ns - (p.start_ns + p.duration_ns))
    s.slowest = sorted(runs.values(), key=lambda r: (-r.duration_ns, r.start_ns))[:slowest]
    s.critical_path, s.critical_path_ns = _critical_path(runs)
    s.critical_path_share = s.critical_path_ns / s.wall_ns if s.wall_ns else 0.0
    return s


def _critical_path(runs: dict[tuple, NodeRun]) -> tuple[list[NodeRun], int]:
    """Longest chain by (queue wait + duration), following next edges within a GraphTask."""
    if not runs:
        return [], 0
    best: dict[tuple, int] = {}
    succ: dict[tuple, tuple | None] = {}
    # A consumer always starts after its producers ran, so reverse start order is a valid order.
    keyed = sorted(runs.items(), key=lambda kv: kv[1].start_ns, reverse=True)
    nodes_by_key = {k: k[1] for k, _ in keyed}
    for key, run in keyed:
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
    del nodes_by_key
    return path, best[start]
