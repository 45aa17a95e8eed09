"""Profiles: one run's comparable facts, whatever described it.

``autograd-run diff`` compares two of them (``analysis.diff``). A ``Profile``
holds, per pass (one top-level backward call), the executed order and, when
known, the wall time, critical path, worker busy time and each node's
start, run time, queue wait and worker (the definitions are
``analysis.samples``'s). Made here from a recording (``from_recording``) or
from samples (``from_samples``); read from files (order files, Chrome
traces, JSON summaries) by ``traces.read_profile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autograd_run.analysis.samples import NodeSamples, Samples, append_passes, pass_samples, stable_worker

@dataclass
class Profile:
    source: str
    #: ``order file``, ``trace``, ``summary``, ``run`` or ``simulation``.
    kind: str
    simulated: bool = False
    #: Passes with times (0 when the input has none, e.g. an order file).
    passes: int = 0
    wall_ns: list[int] = field(default_factory=list)
    critical_path_ns: list[int] = field(default_factory=list)
    #: Node ids of each pass's critical path (empty when the input does not say).
    critical_path: list[list[str]] = field(default_factory=list)
    worker_busy_ns: dict[str, list[int]] = field(default_factory=dict)
    nodes: dict[str, NodeSamples] = field(default_factory=dict)
    #: Per pass, the run time summed by op name.
    ops: dict[str, list[int]] = field(default_factory=dict)
    #: Per pass, the order rows: ``id``, ``name``, ``worker`` and maybe ``seq``, ``ready``.
    order: list[list[dict]] = field(default_factory=list)
    #: What this input cannot tell (shown with the comparison).
    notes: list[str] = field(default_factory=list)

    @property
    def has_times(self) -> bool:
        return self.passes > 0

    def describe(self) -> str:
        what = f"{self.kind}, {'simulated, ' if self.simulated and self.kind != 'simulation' else ''}"
        if self.has_times:
            what += f"{self.passes} pass{'es' if self.passes != 1 else ''}"
        else:
            what += f"order of {sum(len(p) for p in self.order)} nodes, no times"
        return what

    def utilization(self) -> dict[str, list[float]]:
        """Per worker, its busy share of each pass's wall time."""
        return {w: [b / t if t else 0.0 for b, t in zip(busy, self.wall_ns)]
                for w, busy in self.worker_busy_ns.items()}


# -- building ----------------------------------------------------------------------------------

def finish(p: Profile) -> Profile:
    """Derive the per-op totals and, when no order was given, the order from the start times."""
    n = p.passes
    ops: dict[str, list[int]] = {}
    for ns in p.nodes.values():
        tot = ops.setdefault(ns.name, [0] * n)
        for k, d in enumerate(ns.duration_ns):
            if d is not None:
                tot[k] += d
    p.ops = dict(sorted(ops.items(), key=lambda kv: -sum(kv[1])))
    if not p.order and n:
        for k in range(n):
            ran = [(ns.start_ns[k], nid, ns) for nid, ns in p.nodes.items() if ns.start_ns[k] is not None]
            ran.sort(key=lambda r: r[0])
            p.order.append([{"id": nid, "name": ns.name, "worker": ns.worker[k]} for _, nid, ns in ran])
    return p


def from_samples(s: Samples, source: str, kind: str, simulated: bool = False,
                 order: list[dict] | None = None) -> Profile:
    """A profile from ``Samples`` (and, when given, the order rows of the same run)."""
    p = Profile(source, kind, simulated, s.passes, list(s.wall_ns), list(s.critical_path_ns),
                [list(c) for c in s.critical_path], {k: list(v) for k, v in s.worker_busy_ns.items()},
                dict(s.nodes))
    if order:
        p.order = order_passes(order)
    return finish(p)


def from_recording(rec, source: str, kind: str, order: list[dict] | None = None) -> Profile:
    """A profile of a run or simulation made in this process (its ``Recording`` and order rows)."""
    return from_samples(pass_samples(rec), source, kind, rec.simulated, order)


def order_passes(rows: list[dict]) -> list[list[dict]]:
    """Order rows (the order file's fields) split by pass, with a stable ``worker`` label."""
    out: dict[int, list] = {}
    for r in rows:
        row = {"id": r["id"], "name": r.get("name"), "worker": stable_worker(str(r.get("thread", "?")))}
        for k in ("seq", "ready"):
            if k in r:
                row[k] = r[k]
        out.setdefault(r.get("pass", 0), []).append(row)
    return [out[k] for k in sorted(out)]


def concat(profiles: list[Profile], source: str) -> Profile:
    """One profile of several runs of the same configuration: their passes one after another."""
    first = profiles[0]
    total = sum(p.passes for p in profiles)
    out = Profile(source, first.kind, first.simulated, total)
    offset = 0
    for p in profiles:
        append_passes(out, p, offset)
        out.order += p.order
        offset += p.passes
    out.notes = sorted({n for p in profiles for n in p.notes})
    return finish(out)
