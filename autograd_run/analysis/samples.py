"""Per-pass samples of a recording: what a statistical comparison of two runs needs.

A ``Summary`` aggregates a run; comparing two runs beyond their noise
needs the samples themselves. ``pass_samples(recording)`` returns, per pass
(one top-level backward call; ``--repeat N`` makes N), its wall time, its
critical path, each worker's busy time, and each node's start, duration,
queue wait and worker. ``Samples.to_dict()`` is the ``samples`` object of
the ``--json`` documents of ``run`` and ``simulate``; ``traces.read_profile``
reads it back.

Definitions:
  pass          a top-level backward call (reentrant depth 0), in start order;
                a nested call belongs to the pass whose span contains its start;
  wall          the pass's GraphTask span, creation to completion (the whole
                recording when no GraphTask was recorded);
  worker        a label that does not change between runs: ``caller`` for the
                thread that called backward, else ``cuda:N`` or ``reentrant-K``;
  node times    per pass: its first start (from the pass's start), its run time
                and queue wait summed over its executions in the pass; None in
                the passes where it did not run;
  critical path per pass, the summary's definition (``summary``) over that
                pass's nodes: the chain with the largest queue wait + run time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from autograd_run.engine.threads import ThreadKind, thread_kind, worker_label
from autograd_run.ops import is_graph_root
from autograd_run.record import kernels
from autograd_run.record.recording import Recording
from autograd_run.analysis.summary import NodeRun, column_runs, critical_path_of, groups, union_length

CALLER = "caller"


def stable_worker(thread_name: str) -> str:
    """``caller`` for a calling thread, else the device or pool worker's label (``cuda:0``, ``reentrant-1``)."""
    return CALLER if thread_kind(thread_name) is ThreadKind.CALLER else worker_label(thread_name)


@dataclass
class NodeSamples:
    """One node's times in each pass (None where it did not run)."""

    name: str
    worker: list = field(default_factory=list)
    start_ns: list = field(default_factory=list)
    duration_ns: list = field(default_factory=list)
    queue_wait_ns: list = field(default_factory=list)


@dataclass
class Samples:
    passes: int = 0
    wall_ns: list[int] = field(default_factory=list)
    critical_path_ns: list[int] = field(default_factory=list)
    #: The node ids of each pass's critical path, root first.
    critical_path: list[list[str]] = field(default_factory=list)
    worker_busy_ns: dict[str, list[int]] = field(default_factory=dict)
    nodes: dict[str, NodeSamples] = field(default_factory=dict)
    #: Not serialised: (GraphTask id, node id) of every critical-path execution, and each GraphTask's pass.
    critical_keys: set = field(default_factory=set, repr=False)
    pass_of_task: dict[int, int] = field(default_factory=dict, repr=False)

    def extend(self, other: "Samples") -> None:
        """Append ``other``'s passes after this one's (the passes of a run folded one recording at a time)."""
        n = self.passes
        append_passes(self, other, n)
        self.critical_keys |= other.critical_keys
        self.pass_of_task.update({gt: n + k for gt, k in other.pass_of_task.items()})
        self.passes = n + other.passes

    def to_dict(self) -> dict:
        return {"passes": self.passes, "wall_ns": self.wall_ns, "critical_path_ns": self.critical_path_ns,
                "critical_path": self.critical_path, "worker_busy_ns": self.worker_busy_ns,
                "nodes": {k: {"name": n.name, "worker": n.worker, "start_ns": n.start_ns,
                              "duration_ns": n.duration_ns, "queue_wait_ns": n.queue_wait_ns}
                          for k, n in self.nodes.items()}}


def append_passes(into, other, before: int) -> None:
    """Append the per-pass lists of ``other`` (``Samples`` or a ``analysis.profile.Profile``: the same
    fields) to ``into``, which holds ``before`` passes; a worker or node missing on one side gets 0 busy
    time and None times for those passes. ``into.passes`` is left to the caller."""
    total = before + other.passes
    into.wall_ns += other.wall_ns
    into.critical_path_ns += other.critical_path_ns
    into.critical_path += other.critical_path
    for w, v in other.worker_busy_ns.items():
        into.worker_busy_ns.setdefault(w, [0] * before).extend(v)
    for v in into.worker_busy_ns.values():
        v.extend([0] * (total - len(v)))
    for k, o in other.nodes.items():
        ns = into.nodes.get(k)
        if ns is None:
            ns = into.nodes[k] = NodeSamples(o.name, [None] * before, [None] * before, [None] * before,
                                             [None] * before)
        ns.worker += o.worker
        ns.start_ns += o.start_ns
        ns.duration_ns += o.duration_ns
        ns.queue_wait_ns += o.queue_wait_ns
    for ns in into.nodes.values():
        for lst in (ns.worker, ns.start_ns, ns.duration_ns, ns.queue_wait_ns):
            lst.extend([None] * (total - len(lst)))


def task_passes(rec: Recording) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Each GraphTask's pass, and each pass's (start, end)."""
    tops = sorted((g for g in rec.graph_tasks if g.depth == 0), key=lambda g: g.start)
    if not tops:
        return {}, [(rec.start, rec.end)]
    spans = [(g.start, g.end if g.end is not None else rec.end) for g in tops]
    starts = [s for s, _ in spans]
    out = {g.gt: k for k, g in enumerate(tops)}
    for g in rec.graph_tasks:
        if g.gt not in out:
            out[g.gt] = max(0, bisect.bisect_right(starts, g.start) - 1)
    return out, spans


def pass_samples(rec: Recording) -> Samples:
    """The per-pass samples of a recorded (or simulated) run; see the module docstring."""
    s = Samples()
    if rec.empty:
        return s
    pass_of, spans = task_passes(rec)
    n = len(spans)
    s.passes, s.pass_of_task = n, pass_of
    s.wall_ns = [b - a for a, b in spans]
    labels = {tid: stable_worker(t.name) for tid, t in rec.threads.items()}
    runs: list[dict] = [{} for _ in range(n)]
    busy: dict[str, list[list[tuple[int, int]]]] = {}
    nodes = s.nodes
    for sl in rec.slices:
        k = pass_of.get(sl.gt, 0)
        worker = labels.get(sl.tid) or str(sl.tid)
        busy.setdefault(worker, [[] for _ in range(n)])[k].append((sl.start, sl.end))
        node = sl.node
        if is_graph_root(node):
            continue
        wait = sl.wait.waited if sl.wait is not None else 0
        dur = sl.end - sl.start
        runs[k][(sl.gt, node)] = NodeRun(node.id, node.name, worker, sl.start, dur, wait, sl.gt)
        ns = nodes.get(node.id)
        if ns is None:
            ns = nodes[node.id] = NodeSamples(node.name, [None] * n, [None] * n, [None] * n, [None] * n)
        if ns.duration_ns[k] is None:
            ns.worker[k], ns.start_ns[k] = worker, sl.start - spans[k][0]
            ns.duration_ns[k], ns.queue_wait_ns[k] = dur, wait
        else:
            ns.start_ns[k] = min(ns.start_ns[k], sl.start - spans[k][0])
            ns.duration_ns[k] += dur
            ns.queue_wait_ns[k] += wait
    s.worker_busy_ns = {w: [union_length(p) for p in per_pass] for w, per_pass in busy.items()}
    for k in range(n):
        path, total = critical_path_of(runs[k])
        s.critical_path.append([r.id for r in path])
        s.critical_path_ns.append(total)
        s.critical_keys.update((r.graph_task, r.id) for r in path)
    return s


def slice_passes(rec: Recording) -> tuple[np.ndarray, np.ndarray]:
    """Per node slice (a row of the Recording's slice columns): its pass, and whether it is on its pass's
    critical path (its (GraphTask, node id) among ``pass_samples(rec).critical_keys``), from the columns
    with the critical path compiled: what a trace marks on each node slice, without a per-node object."""
    S = rec.columns().slices
    n = len(S)
    passes = np.zeros(n, dtype=np.int64)
    critical = np.zeros(n, dtype=bool)
    if rec.empty or not n:
        return passes, critical
    pass_of, _ = task_passes(rec)
    if pass_of:
        distinct, inverse = np.unique(S.gt, return_inverse=True)
        passes = np.array([pass_of.get(g, 0) for g in distinct.tolist()], dtype=np.int64)[inverse.reshape(-1)]
    r = column_runs(rec)
    if r is None:  # a node run twice within one GraphTask: as pass_samples does it
        keys = pass_samples(rec).critical_keys
        critical[:] = [(g, node.id) in keys for g, node in
                       zip(S.gt.tolist(), (rec.columns().nodes[k] for k in S.node.tolist()))]
        return passes, critical
    nodes = rec.columns().nodes
    weight = r.waited + r.dur
    for _, rows in groups(passes[r.rows]):
        visit = np.argsort(-r.start[rows], kind="stable")
        path, _ = kernels.critical_path(nodes, r.gt[rows], r.node[rows], weight[rows], r.start[rows], visit)
        critical[r.rows[rows[path]]] = True
    return passes, critical
