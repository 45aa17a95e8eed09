"""Summary: a pure function from a ``Recording`` to run statistics.

``summarize(recording)`` returns a ``Summary`` (dataclasses with
documented fields, JSON-ready through ``to_dict``). It never looks at the
clock or the engine, so tests feed it synthetic recordings. A
``SummaryBuilder`` folds many recordings (one per ``--repeat`` pass) into
one summary in memory that does not grow with the passes.

It reads the Recording's columns with numpy, and the two loops over node
objects (their names and ops; the critical path over their next edges) are
compiled (``record.kernels``), so a million-node run makes no per-node
Python objects: the critical path is a ``RunList`` that makes each
``NodeRun`` when it is read. ``summarize_reference`` is the same summary
computed record by record over the typed lists (the definition the tests
hold the fast one to, and what runs in the one case the columns do not
cover: a node run twice within one GraphTask).

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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from autograd_run.engine.threads import thread_sort_key
from autograd_run.ops import GRAPH_ROOT, OPAQUE, is_graph_root
from autograd_run.record import kernels
from autograd_run.record.recording import Recording


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

    def __init__(self, n: int, make, durations: np.ndarray | None = None):
        self._n, self._make = n, make
        #: Each run's ``duration_ns`` (int64), when known: ``longest_runs`` reads it instead of every run.
        self.durations = durations

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


class Values:
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
        """``add`` each of ``values`` (an int64 array, or any iterable of ints), at once."""
        arr = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=np.int64)
        n = len(arr)
        if not n:
            return
        arr = arr.astype(np.int64, copy=False)
        self.count += n
        self.total += int(arr.sum())
        if self.exact is not None:
            if len(self.exact) + n <= self.EXACT:
                self.exact.extend(arr.tolist())
                return
            if len(self.exact):
                arr = np.concatenate([np.frombuffer(self.exact, dtype=np.int64), arr])
            self.exact, self.buckets = None, {}
        self._bucket_many(arr)

    def _bucket(self, value: int) -> None:
        k = -1 if value <= 0 else int(math.log(value, self.RATIO))
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def _bucket_many(self, arr: np.ndarray) -> None:
        """``_bucket`` of each value, with numpy (the same buckets: a value whose logarithm is within
        rounding of a bucket's edge is placed by ``math.log`` as ``_bucket`` places it)."""
        k = np.full(len(arr), -1, dtype=np.int64)
        pos = np.nonzero(arr > 0)[0]
        if len(pos):
            v = arr[pos]
            q = np.log(v.astype(np.float64)) / math.log(self.RATIO)
            kk = np.floor(q).astype(np.int64)
            near = np.nonzero(np.abs(q - np.rint(q)) < 1e-9)[0]
            if len(near):
                kk[near] = [int(math.log(x, self.RATIO)) for x in v[near].tolist()]
            k[pos] = kk
        keys, counts = np.unique(k, return_counts=True)
        b = self.buckets
        for key, c in zip(keys.tolist(), counts.tolist()):
            b[key] = b.get(key, 0) + c

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


def summarize_reference(rec: Recording, slowest: int = 10) -> Summary:
    """``summarize`` record by record over the typed lists (see the module docstring)."""
    b = SummaryBuilder(slowest, reference=True)
    b.add(rec)
    return b.summary()


class SummaryBuilder:
    """A ``Summary`` built from one recording, or folded from many (one per ``--repeat`` pass, each
    dropped once folded), in memory that does not grow with the passes: sums and counts add up,
    distributions are ``Values``, the slowest nodes and the critical path keep the top ones.
    ``add`` recordings in time order; start times are from the first one's start. Each recording is
    read as columns (numpy), or record by record with ``reference`` (and where the columns do not
    serve: a node run twice within one GraphTask)."""

    def __init__(self, slowest: int = 10, reference: bool = False):
        self.slowest = slowest
        self.reference = reference
        self.s = Summary()
        self.t0: int | None = None
        self.workers: dict[int, Worker] = {}
        self.thread_rank: dict[int, tuple] = {}
        self.ops: dict[str, Values] = {}
        self.queue_waits: dict[str, Values] = {}
        self.lock_waits: dict[str, Values] = {}
        self.passes = Values()
        self.top: list[NodeRun] = []
        #: The critical path so far (a list of ``NodeRun`` or a ``RunList``); its total is the summary's.
        self.path: Sequence = []

    def _worker(self, rec: Recording, tid: int) -> Worker:
        w = self.workers.get(tid)
        if w is None:
            w = self.workers[tid] = Worker(rec.thread_name(tid))
        return w

    def add(self, rec: Recording) -> None:
        if rec.empty:
            return
        s = self.s
        if self.t0 is None:
            self.t0 = rec.start
        gaps = _gaps_between_calls(rec)
        s.wall_ns += rec.end - rec.start - union_length(gaps)
        for tid, info in rec.threads.items():
            self.thread_rank.setdefault(tid, thread_sort_key(info.name))
        runs = None if self.reference else column_runs(rec)
        if runs is None:
            self._add_records(rec, gaps)
        else:
            self._add_columns(rec, gaps, runs)
        for lw in rec.lock_waits:
            self.lock_waits.setdefault(lw.lock, Values()).add(lw.waited)
        s.nodes_skipped += len(rec.skips)
        s.errors += [f"{e.node.id if e.node is not None else '-'}: {e.message}" for e in rec.errors]
        s.graph_tasks += len(rec.graph_tasks)
        self.passes.extend(g.end - g.start for g in rec.graph_tasks if g.depth == 0 and g.end is not None)

    def _keep(self, runs: list[NodeRun], path: Sequence, path_ns: int) -> None:
        """Fold one recording's slowest runs and critical path into the top ones."""
        key = lambda r: (-r.duration_ns, r.start_ns)  # noqa: E731
        self.top = sorted(self.top + runs, key=key)[:self.slowest]
        if path_ns > self.s.critical_path_ns or not self.path:
            self.path, self.s.critical_path_ns = path, path_ns

    def _add_records(self, rec: Recording, gaps: list) -> None:
        """One recording, record by record over its typed lists (the definition)."""
        s, t_first, name = self.s, self.t0, rec.thread_name
        runs: dict[tuple, NodeRun] = {}
        intervals: dict[int, list[tuple[int, int]]] = {}
        for sl in rec.slices:
            intervals.setdefault(sl.tid, []).append((sl.start, sl.end))
            w = self._worker(rec, sl.tid)
            node = sl.node
            if is_graph_root(node):
                continue
            w.nodes += 1
            dur = sl.end - sl.start
            samples = self.ops.get(node.name)
            if samples is None:
                samples = self.ops[node.name] = Values()
            samples.add(dur)
            runs[(sl.gt, node)] = NodeRun(node.id, node.name, name(sl.tid), sl.start - t_first, dur,
                                          sl.wait.waited if sl.wait is not None else 0, sl.gt)
            if node.op is OPAQUE and node.id not in s.opaque_nodes:
                s.opaque_nodes.append(node.id)
        for tid, spans in intervals.items():
            self._worker(rec, tid).busy_ns += union_length(spans)
        for idle in rec.idles:
            self._worker(rec, idle.tid).idle_ns += idle.end - idle.start - _overlap((idle.start, idle.end), gaps)
        for w in rec.waits:
            self.queue_waits.setdefault(w.queue, Values()).add(w.waited)
        for sync in rec.syncs:
            key = f"{sync.src} -> {sync.dst}"
            s.syncs[key] = s.syncs.get(key, 0) + 1
            p, c = runs.get((sync.gt, sync.producer)), runs.get((sync.gt, sync.consumer))
            if p is not None and c is not None:
                s.sync_latency_ns += max(0, c.start_ns - (p.start_ns + p.duration_ns))
        s.nodes_executed += len(runs)
        slowest = sorted(runs.values(), key=lambda r: (-r.duration_ns, r.start_ns))[:self.slowest]
        path, path_ns = critical_path_of(runs)
        self._keep(slowest, path, path_ns)

    def _add_columns(self, rec: Recording, gaps: list, r: "_Runs") -> None:
        """One recording, from its columns (the same as ``_add_records``)."""
        s, c = self.s, rec.columns()
        S, W, I, nodes = c.slices, c.waits, c.idles, c.nodes
        for t in _distinct(S.tid) + _distinct(I.tid):
            self._worker(rec, t)
        if len(r):
            tids, counts = np.unique(r.tid, return_counts=True)
            for t, n in zip(tids.tolist(), counts.tolist()):
                self.workers[t].nodes += n
        for t, busy in union_lengths(S.tid, S.start, S.end).items():
            self.workers[t].busy_ns += busy
        if len(I):
            idle = (I.end - I.start) - _overlaps(I.start, I.end, gaps)
            for t, rows in groups(I.tid):
                self.workers[t].idle_ns += int(idle[rows].sum())
        # ops: by node name, in order of first appearance
        name_code, names = c.node_codes("name")
        for g, rows in groups(name_code[r.node] if len(r) else r.node):
            samples = self.ops.get(names[g])
            if samples is None:
                samples = self.ops[names[g]] = Values()
            samples.extend(r.dur[rows])
        for q, rows in groups(W.queue):
            self.queue_waits.setdefault(c.queues[q], Values()).extend((W.popped - W.pushed)[rows])
        if len(r):
            op_code, ops = c.node_codes("op", True)
            opaque_ops = np.array([op is OPAQUE for op in ops])
            for k in np.nonzero(opaque_ops[op_code][r.node])[0].tolist():
                nid = nodes[r.node[k]].id
                if nid not in s.opaque_nodes:
                    s.opaque_nodes.append(nid)
        thread_names = {tid: info.name for tid, info in rec.threads.items()}
        run = _run_maker(nodes, thread_names, self.t0, r.node, r.tid, r.start, r.dur, r.waited, r.gt)
        if rec.syncs:
            # the runs of the nodes at either end of a sync, by (task, node): the last run of each
            ends = kernels.node_rows(nodes, [x for sync in rec.syncs for x in (sync.producer, sync.consumer)])
            ks = np.nonzero(np.isin(r.node, ends[ends >= 0]))[0]
            by_key = {(g, nodes[n]): k for k, g, n in zip(ks.tolist(), r.gt[ks].tolist(), r.node[ks].tolist())}
            for sync in rec.syncs:
                key = f"{sync.src} -> {sync.dst}"
                s.syncs[key] = s.syncs.get(key, 0) + 1
                p, q = by_key.get((sync.gt, sync.producer)), by_key.get((sync.gt, sync.consumer))
                if p is not None and q is not None:
                    s.sync_latency_ns += max(0, int(r.start[q]) - int(r.start[p] + r.dur[p]))
        s.nodes_executed += len(r)
        slowest = [run(int(k)) for k in _slowest(r.dur, r.start, self.slowest)]
        path, total = [], 0
        if len(r):
            visit = np.argsort(-r.start, kind="stable")
            p, total = kernels.critical_path(nodes, r.gt, r.node, r.waited + r.dur, r.start, visit)
            if len(p):
                # only the path's rows are kept (not the recording's columns): a RunList of them
                path = RunList(len(p), _run_maker(nodes, thread_names, self.t0, r.node[p], r.tid[p], r.start[p],
                                                  r.dur[p], r.waited[p], r.gt[p]), durations=r.dur[p])
        self._keep(slowest, path, int(total))

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
        s.critical_path = self.path if isinstance(self.path, RunList) else copy.deepcopy(self.path)
        s.critical_path_share = s.critical_path_ns / s.wall_ns if s.wall_ns else 0.0
        return s


class _Runs:
    """The node runs of a recording (its slices but the GraphRoot's) as columns; ``rows``: their rows
    among the slices."""

    def __init__(self, rows, gt, node, tid, start, dur, waited):
        self.rows, self.gt, self.node, self.tid, self.start, self.dur, self.waited = \
            rows, gt, node, tid, start, dur, waited

    def __len__(self) -> int:
        return len(self.gt)


def column_runs(rec: Recording) -> _Runs | None:
    """The runs of ``rec`` from its columns, or None where the columns do not serve (a node run twice
    within one GraphTask; a run without a GraphTask): then the record-by-record summary applies."""
    c = rec.columns()
    S, W, nodes = c.slices, c.waits, c.nodes
    if len(nodes):
        op_code, ops = c.node_codes("op", True)
        root_ops = np.array([op is GRAPH_ROOT for op in ops] or [False])
        runs = np.nonzero(~root_ops[op_code][S.node])[0]
    else:
        runs = np.arange(len(S))
    # rows in one stretch (the call's GraphRoot first or last, as a simulation records it): views, not copies
    # of the columns (at a million runs, 40 MB less while the summary is made)
    at = slice(int(runs[0]), int(runs[-1]) + 1) if len(runs) and runs[-1] - runs[0] + 1 == len(runs) else runs
    r_gt, r_node = S.gt[at], S.node[at]
    if len(runs) and (r_gt.min() < 0 or (len(runs) > 1 and _repeats(r_gt, r_node))):
        return None
    r_start = S.start[at]
    r_wait_idx = S.wait[at]
    r_waited = np.where(r_wait_idx >= 0, (W.popped - W.pushed)[np.maximum(r_wait_idx, 0)] if len(W) else 0, 0)
    return _Runs(runs, r_gt, r_node, S.tid[at], r_start, S.end[at] - r_start, r_waited.astype(np.int64, copy=False))


def longest_runs(runs, n: int) -> list[NodeRun]:
    """The ``n`` longest of ``runs``, longest first, ties in their order (``sorted(runs, key=-duration)[:n]``),
    without making every run of a ``RunList`` that knows its durations."""
    durations = getattr(runs, "durations", None)
    if durations is None:
        return sorted(runs, key=lambda r: -r.duration_ns)[:n]
    return [runs[int(k)] for k in np.argsort(-durations, kind="stable")[:n]]


def _run_maker(nodes: list, thread_names: dict, t0: int, node, tid, start, dur, waited, gt):
    """``make(k)``: the ``NodeRun`` of row ``k`` of these columns."""
    def run(k: int) -> NodeRun:
        n = nodes[node[k]]
        t = int(tid[k])
        return NodeRun(n.id, n.name, thread_names.get(t, str(t)), int(start[k]) - t0, int(dur[k]), int(waited[k]),
                       int(gt[k]))
    return run


def groups(code: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, rows) of each distinct value of ``code``, in order of first appearance."""
    n = len(code)
    if not n:
        return []
    if code.min() == code.max():
        return [(int(code[0]), np.arange(n))]
    order = np.argsort(code, kind="stable")
    sc = code[order]
    bounds = np.nonzero(np.r_[True, sc[1:] != sc[:-1], True])[0]
    groups = [(int(sc[a]), order[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    groups.sort(key=lambda g: g[1][0])
    return groups


def union_lengths(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[int, int]:
    """Per tid, the total length covered by possibly nested or overlapping [start, end] intervals."""
    out = {}
    if not len(tid):
        return out
    if tid.min() == tid.max() and (np.diff(start) >= 0).all():
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


def _overlaps(start: np.ndarray, end: np.ndarray, gaps: list[tuple[int, int]]) -> np.ndarray:
    """``_overlap`` of each span [start, end] with ``gaps`` (sorted, disjoint), vectorised."""
    if not gaps:
        return np.zeros(len(start), dtype=np.int64)
    ga = np.array([g[0] for g in gaps], dtype=np.int64)
    gb = np.array([g[1] for g in gaps], dtype=np.int64)
    before = np.r_[0, np.cumsum(gb - ga)]  # gap length before gap j

    def covered(x: np.ndarray) -> np.ndarray:  # gap length before time x
        j = np.searchsorted(ga, x, side="right") - 1
        inside = np.clip(np.minimum(x, gb[np.maximum(j, 0)]) - ga[np.maximum(j, 0)], 0, None)
        return np.where(j >= 0, before[np.maximum(j, 0)] + inside, 0)
    return np.maximum(covered(end) - covered(start), 0)


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


def union_length(spans: list[tuple[int, int]]) -> int:
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


def critical_path_of(runs: dict[tuple, NodeRun]) -> tuple[list[NodeRun], int]:
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
