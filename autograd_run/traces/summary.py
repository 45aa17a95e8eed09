"""Summary: a pure function from a ``Recording`` to run statistics.

``summarize(recording)`` returns a ``Summary`` (dataclasses with
documented fields, JSON-ready through ``to_dict``). It never looks at the
clock or the engine, so tests feed it synthetic recordings.

It reads the Recording's columns with numpy, and the two loops over node
objects (their names and ops; the critical path over their next edges) are
compiled (``traces.kernels``), so a million-node run makes no per-node
Python objects: the critical path is a ``RunList`` that makes each
``NodeRun`` when it is read. ``summarize_reference`` is the same summary
computed record by record over the typed lists (the definition the tests
hold the fast one to, and what runs in the one case the columns do not
cover: a node run twice within one GraphTask).

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

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from autograd_run.ops import GRAPH_ROOT, OPAQUE, is_graph_root
from autograd_run.traces import kernels
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
        d = asdict(replace(self, critical_path=[]))
        d["critical_path"] = [asdict(r) for r in self.critical_path]
        return d


class RunList(Sequence):
    """A read-only list of ``NodeRun`` made one at a time as they are read (``make(i)``)."""

    def __init__(self, n: int, make):
        self._n, self._make = n, make

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._make(k) for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("run index out of range")
        return self._make(i)

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, Sequence)) and len(other) == self._n and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RunList({self._n} runs)"


def _dists(group: np.ndarray, values: np.ndarray, groups: int) -> list[Dist]:
    """``Dist.of`` the ``values`` of each group id 0 .. groups-1 (an empty group: ``Dist()``)."""
    if groups == 0:
        return []
    count = np.bincount(group, minlength=groups)
    total = np.bincount(group, weights=values, minlength=groups)  # exact: integer sums below 2**53 ns
    order = np.lexsort((values, group))
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    rank = first + np.maximum(0, -(-95 * count // 100) - 1)  # nearest rank, as p95()
    out = []
    for g in range(groups):
        n = int(count[g])
        if n == 0:
            out.append(Dist())
            continue
        t = int(total[g])
        out.append(Dist(n, t, t / n, int(values[order[rank[g]]])))
    return out


def _union_lengths(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, int]:
    """Per tid, the total length covered by possibly nested or overlapping [start, end] intervals."""
    out = {}
    if len(tid) and tid.min() == tid.max() and (np.diff(start) >= 0).all():
        t, s, e = tid, start, end  # one thread, already in start order (ties need no order: the union is the same)
    else:
        order = np.lexsort((end, start, tid))
        t, s, e = tid[order], start[order], end[order]
    bounds = np.nonzero(np.r_[True, t[1:] != t[:-1], True])[0]
    for a, b in zip(bounds[:-1], bounds[1:]):
        ss, ee = s[a:b], e[a:b]
        reach = np.maximum.accumulate(ee)
        new = np.r_[True, ss[1:] > reach[:-1]]
        first = np.nonzero(new)[0]
        last = np.r_[first[1:] - 1, len(ss) - 1]
        out[int(t[a])] = int((reach[last] - ss[first]).sum())
    return out


def summarize(rec: Recording, slowest: int = 10) -> Summary:
    """The statistics of a recorded run (see the module docstring for the definitions)."""
    s = Summary()
    if rec.empty:
        return s
    c = rec.columns()
    S, W, nodes = c.slices, c.waits, c.nodes
    op_code, ops = kernels.attr_codes(nodes, "op", True)
    root_ops = np.array([op is GRAPH_ROOT for op in ops] or [False])
    opaque_ops = np.array([op is OPAQUE for op in ops] or [False])
    is_root = root_ops[op_code][S.node] if len(nodes) else np.zeros(len(S), dtype=bool)
    runs = np.nonzero(~is_root)[0]
    r_gt, r_node = S.gt[runs], S.node[runs]
    if len(runs) > 1 and _repeats(r_gt, r_node):
        return summarize_reference(rec, slowest)
    t_first = rec.start
    s.wall_ns = rec.end - rec.start
    name = rec.thread_name
    r_start, r_end, r_tid = S.start[runs], S.end[runs], S.tid[runs]
    r_dur = r_end - r_start
    r_wait_idx = S.wait[runs]
    r_waited = np.where(r_wait_idx >= 0, (W.popped - W.pushed)[np.maximum(r_wait_idx, 0)] if len(W) else 0, 0)

    # workers: every thread with a slice or an idle span
    I = c.idles
    workers = {t: Worker(name(t)) for t in _distinct(S.tid) + _distinct(I.tid)}
    for t, w in workers.items():
        w.nodes = int(np.count_nonzero(r_tid == t))
        w.idle_ns = int((I.end - I.start)[I.tid == t].sum()) if len(I) else 0
    for t, busy in _union_lengths(S.tid, S.start, S.end).items():
        workers[t].busy_ns = busy
    for w in workers.values():
        w.utilization = w.busy_ns / s.wall_ns if s.wall_ns else 0.0
    order = {tid: k for k, tid in enumerate(rec.threads)}
    s.workers = [workers[t] for t in sorted(workers, key=lambda t: (order.get(t, len(order)), workers[t].name))]

    # ops: by node name, the largest total first (ties: first seen first)
    name_code, names = kernels.attr_codes(nodes, "name", False)
    r_name = name_code[r_node] if len(runs) else np.zeros(0, dtype=np.int64)
    dists = _dists(r_name, r_dur, len(names))
    first_seen = np.full(len(names), len(runs), dtype=np.int64)
    if len(runs):
        at = np.nonzero(np.r_[True, r_name[1:] != r_name[:-1]])[0]  # where the name changes: the first of each
        np.minimum.at(first_seen, r_name[at], at)
    ranked = sorted((g for g in range(len(names)) if dists[g].count),
                    key=lambda g: (-dists[g].total_ns, first_seen[g]))
    s.ops = {names[g]: dists[g] for g in ranked}
    qd = _dists(W.queue, W.popped - W.pushed, len(c.queues))
    s.queue_waits = {c.queues[q]: qd[q] for q in sorted(set(W.queue.tolist()), key=lambda q: c.queues[q])}
    lock_waits: dict[str, list[int]] = {}
    for lw in rec.lock_waits:
        lock_waits.setdefault(lw.lock, []).append(lw.waited)
    s.lock_waits = {k: Dist.of(v) for k, v in sorted(lock_waits.items())}
    s.nodes_skipped = len(rec.skips)

    def run(k: int) -> NodeRun:
        node = nodes[r_node[k]]
        return NodeRun(node.id, node.name, name(int(r_tid[k])), int(r_start[k]) - t_first, int(r_dur[k]),
                       int(r_waited[k]), int(r_gt[k]))

    opaque = np.nonzero(opaque_ops[op_code][r_node])[0] if len(runs) else []
    s.opaque_nodes = list(dict.fromkeys(nodes[r_node[k]].id for k in opaque))
    if rec.syncs:
        by_key = {(g, nodes[n]): k for k, (g, n) in enumerate(zip(r_gt.tolist(), r_node.tolist()))}
        for sync in rec.syncs:
            key = f"{sync.src} -> {sync.dst}"
            s.syncs[key] = s.syncs.get(key, 0) + 1
            p, q = by_key.get((sync.gt, sync.producer)), by_key.get((sync.gt, sync.consumer))
            if p is not None and q is not None:
                s.sync_latency_ns += max(0, int(r_start[q]) - int(r_end[p]))
    s.errors = [f"{e.node.id if e.node is not None else '-'}: {e.message}" for e in rec.errors]
    s.graph_tasks = len(rec.graph_tasks)
    s.passes = Dist.of([g.end - g.start for g in rec.graph_tasks if g.depth == 0 and g.end is not None])
    s.nodes_executed = len(runs)
    s.slowest = [run(int(k)) for k in _slowest(r_dur, r_start, slowest)]
    if len(runs):
        if r_gt.min() < 0:
            return summarize_reference(rec, slowest)
        visit = np.argsort(-r_start, kind="stable")
        path, total = kernels.critical_path(nodes, r_gt, r_node, r_waited + r_dur, r_start, visit)
        s.critical_path, s.critical_path_ns = RunList(len(path), lambda i: run(path[i])), int(total)
    s.critical_path_share = s.critical_path_ns / s.wall_ns if s.wall_ns else 0.0
    return s


def _distinct(values: np.ndarray) -> list[int]:
    """The distinct values in order of first appearance (few distinct values, in long runs)."""
    if not len(values):
        return []
    changes = values[np.r_[True, values[1:] != values[:-1]]]
    return list(dict.fromkeys(changes.tolist()))


def _slowest(dur: np.ndarray, start: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k longest runs, by (-duration, start, index)."""
    n = len(dur)
    if n > 4 * k > 0:
        cut = np.partition(dur, n - k)[n - k]  # the k-th longest duration
        cand = np.nonzero(dur >= cut)[0]
        if len(cand) <= 64 * k:
            return cand[np.lexsort((cand, start[cand], -dur[cand]))][:k]
    return np.lexsort((np.arange(n), start, -dur))[:k]


def _repeats(gt: np.ndarray, node: np.ndarray) -> bool:
    """Whether some (GraphTask, node) pair occurs twice."""
    if gt.min() == gt.max():
        return bool(np.bincount(node).max() > 1)
    o = np.lexsort((node, gt))
    return bool(np.any((gt[o][1:] == gt[o][:-1]) & (node[o][1:] == node[o][:-1])))


def summarize_reference(rec: Recording, slowest: int = 10) -> Summary:
    """``summarize`` record by record over the typed lists (see the module docstring)."""
    s = Summary()
    if rec.empty:
        return s
    t_first = rec.start
    s.wall_ns = rec.end - rec.start
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
        worker(idle.tid).idle_ns += idle.end - idle.start

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
