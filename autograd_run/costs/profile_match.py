"""Which backward node run in a PyTorch profiler trace is which node of a graph.

A trace usually comes from another run of the same program than the
graph's capture, and holds several backward calls (steps). PyTorch's
sequence counter is per forward thread and keeps growing through a
program, so the same node has sequence number ``seq + offset`` in the
trace, the offset differing per run and per step. Matching, per trace:

1. **Steps and sequence numbers.** The graph's highest-numbered node (its
   root: the first node a backward call runs) is the anchor. Each trace
   run with the anchor's name, in time order and not yet taken by an
   earlier step, proposes a step at offset ``run seq - anchor seq`` on its
   forward thread; it is a step when at least half of a spread sample of
   the graph's other nodes exist in the trace at that offset, after it.
   Each node of the anchor's forward thread then takes the first free run
   named like it at ``seq + offset`` on the same forward thread, after the
   anchor. A step's window runs from its anchor to the next step's.
2. **Other forward threads.** Nodes the graph records on other forward
   threads (``fwd_thread``) are aligned the same way, with their own
   anchor and offset inside the window.
3. **Relative order.** Nodes still unmatched (a run of the program that
   built a few nodes more or less, so offsets drift) are aligned with the
   window's unmatched runs by name, both in sequence order (a longest
   common subsequence, ``difflib``).
4. **AccumulateGrad** runs carry no sequence number. A leaf runs right
   after the node that made it ready, in an order the engine fixes: the
   graph's order, predicted by simulating it with PyTorch's policy
   (``sim.order.predicted_order``, handed in by the caller), and
   each leaf is matched by (the node run before it on its thread, its
   position among the leaves run after that node), checked against the
   gradient's shape when the trace recorded shapes; leftovers by shape
   (or by order, when counts agree).

``match_profile(graph, trace)`` returns the steps (node id -> run) and a
``Coverage`` report: nodes matched, unmatched on each side and why, the
alignment found. It raises ``RequestError`` when almost nothing matches
(the profile of another program).
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.graphs.model import Graph
from autograd_run.ops import ACCUMULATE_GRAD
from autograd_run.traces.torch_profile import BackwardEvent, TorchTrace

#: A step must match at least this share of the graph's nodes (else it is not a run of this graph).
MIN_SHARE = 0.5
_SAMPLE = 64
#: The order alignment is quadratic: skipped above this many pairs.
_MAX_ALIGN = 25_000_000


@dataclass
class StepMatch:
    label: str
    start_ns: int
    #: Where the call's window ends: the next call's anchor, the end of its ProfilerStep, or shortly after
    #: its last matched run (None while not known).
    end_ns: int | None = None
    #: Graph forward thread -> (trace forward thread, sequence offset) found for it.
    offsets: dict = field(default_factory=dict)
    #: Node id -> the run matched to it.
    nodes: dict[str, BackwardEvent] = field(default_factory=dict)
    #: How each node was matched: ``sequence``, ``order``, ``leaf order``, ``leaf shape``.
    methods: Counter = field(default_factory=Counter)
    #: Runs inside the step that match no node, by name.
    unmatched: Counter = field(default_factory=Counter)
    #: The forward of this call was the first to build autograd nodes on its thread (its sequence numbers start
    #: near 0): the backward is most likely its process's first, whose times hold one-time set-up.
    first_forward: bool = False


@dataclass
class Coverage:
    path: str
    graph: str
    nodes: int
    #: Node id -> in how many steps it was matched.
    matched: dict[str, int]
    #: (node id, name, reason) for nodes matched in no step.
    unmatched: list[tuple[str, str, str]]
    #: Runs inside the steps matching no node: name -> (count, reason).
    trace_unmatched: dict[str, tuple[int, str]]
    #: Backward node runs outside every step (other backward calls, another model).
    outside: int
    steps: list[StepMatch]
    methods: Counter
    gpu_activities: int = 0
    gpu_attributed: int = 0

    @property
    def matched_count(self) -> int:
        return sum(1 for v in self.matched.values() if v)

    def alignment(self) -> list[str]:
        """One line per (graph forward thread, trace forward thread): the sequence offsets of its steps."""
        out: dict[tuple, list] = {}
        for s in self.steps:
            for g, (t, off) in s.offsets.items():
                out.setdefault((g, t), []).append(off)
        lines = []
        for (g, t), offs in out.items():
            gname = "graph nodes" if g is None else f"graph forward thread {g}"
            distinct = sorted(set(offs))
            shown = [f"{o:+d}" for o in distinct]
            if len(shown) > 6:
                shown = shown[:3] + ["..."] + shown[-2:]
            calls = f"{len(offs)} call{'s' if len(offs) > 1 else ''}"
            lines.append(f"{gname} -> trace forward thread {t}: sequence offset{'s' if len(distinct) > 1 else ''} "
                         f"{', '.join(shown)} ({calls})")
        return lines

    def to_dict(self) -> dict:
        return {"trace": self.path, "nodes": self.nodes, "matched": self.matched_count,
                "steps": [{"label": s.label, "matched": len(s.nodes),
                           "offsets": [[g, t, o] for g, (t, o) in s.offsets.items()]} for s in self.steps],
                "methods": dict(self.methods),
                "unmatched": [{"id": i, "name": n, "reason": r} for i, n, r in self.unmatched],
                "trace_unmatched": {k: {"count": c, "reason": r} for k, (c, r) in self.trace_unmatched.items()},
                "outside_steps": self.outside, "gpu_activities": self.gpu_activities,
                "gpu_attributed": self.gpu_attributed}


@dataclass
class ProfileMatch:
    steps: list[StepMatch]
    coverage: Coverage


def _leaf(node) -> bool:
    return node.op is ACCUMULATE_GRAD


def match_profile(graph: Graph, trace: TorchTrace, order=None) -> ProfileMatch:
    """Match ``trace``'s backward node runs to ``graph``'s nodes (see the module docstring).

    ``order``: the graph's nodes per worker thread in the order PyTorch's engine runs them (a list of lists, or
    a callable that returns one, called only when there are AccumulateGrad runs to match):
    ``sim.order.predicted_order``. The simulator is above this layer, so the caller hands it in.
    """
    inner = [n for n in graph.nodes if not _leaf(n)]
    leaves = [n for n in graph.nodes if _leaf(n)]
    runs = [e for e in trace.events if e.seq is not None]  # by start time, as trace.events
    run_starts = [e.start_ns for e in runs]
    index: dict[tuple, list[BackwardEvent]] = {}
    for e in runs:
        index.setdefault((e.fwd_tid, e.name, e.seq), []).append(e)
    starts_of = {k: [e.start_ns for e in v] for k, v in index.items()}
    steps: list[StepMatch] = []
    if inner:
        groups: dict = {}
        for n in inner:
            groups.setdefault(n.fwd_thread, []).append(n)
        anchor = max(inner, key=lambda n: n.seq)
        main = groups[anchor.fwd_thread]
        claimed: set[int] = set()
        steps = _find_steps(trace, anchor, main, index, starts_of, claimed)
        _bound(steps, trace)
        lo, hi = min(n.seq for n in main), max(n.seq for n in main)
        for s in steps:
            # Sequence numbers count the autograd nodes a thread has built: fewer before this call's lowest
            # than the call itself builds means no earlier forward of this model ran on that thread.
            s.first_forward = lo + s.offsets[anchor.fwd_thread][1] < len(main)
        margin = max(16, len(main) // 10)
        for s in steps:
            end = s.end_ns
            for g, members in groups.items():
                if g != anchor.fwd_thread:
                    _other_group(s, g, members, _between(runs, run_starts, s.start_ns, end), index, starts_of,
                                 end, claimed)
            t, off = s.offsets[anchor.fwd_thread]
            window = [e for e in _between(runs, run_starts, s.start_ns, end) if id(e) not in claimed
                      and (e.fwd_tid != t or lo + off - margin <= e.seq <= hi + off + margin)]
            _align(s, [n for n in inner if n.id not in s.nodes], window, claimed)
    if leaves and steps:
        if order is None:
            raise ValueError("match_profile: the graph's AccumulateGrad nodes are matched by the order the "
                             "engine runs them in; pass order= (sim.order.predicted_order)")
        order = order() if callable(order) else order
        starts = [e.start_ns for e in trace.events]
        for k, s in enumerate(steps):
            _match_leaves(s, leaves, order, trace, _leaf_end(s, trace, starts, k == len(steps) - 1), starts)
    coverage = _coverage(graph, trace, steps)
    best = max((len(s.nodes) for s in steps), default=0)
    if best < MIN_SHARE * len(graph.nodes):
        raise RequestError(_mismatch(graph, trace, best, coverage), "costs")
    return ProfileMatch(steps, coverage)


def _bound(steps: list[StepMatch], trace: TorchTrace) -> None:
    """Each call's window ends at the next call's anchor; the last at the end of its ProfilerStep, or a little
    after its last matched run (its last leaves run right after their producers)."""
    for s, nxt in zip(steps, steps[1:]):
        s.end_ns = nxt.start_ns
    if steps:
        last = steps[-1]
        step = next((p for p in trace.steps if p.start_ns <= last.start_ns <= p.end_ns), None)
        if step is not None:
            last.end_ns = step.end_ns + 1
        elif last.nodes:
            end = max(e.end_ns for e in last.nodes.values())
            last.end_ns = end + max(1_000_000, (end - last.start_ns) // 10)


def _leaf_end(s: StepMatch, trace: TorchTrace, starts: list, last: bool):
    """Where a call's AccumulateGrad runs may end: its window's end; for the last call without a ProfilerStep
    (its window a guess past its last matched run) up to the next run of a node that is not a leaf (its
    leaves run right after their producers, however long a loaded machine kept the thread waiting)."""
    if not last or not s.nodes or any(p.start_ns <= s.start_ns <= p.end_ns for p in trace.steps):
        return s.end_ns
    end = max(e.end_ns for e in s.nodes.values())
    i = bisect.bisect_right(starts, end)
    nxt = next((e.start_ns for e in trace.events[i:] if not e.is_leaf), None)
    return None if nxt is None else max(nxt, s.end_ns or 0)


def _between(events: list, starts: list, lo: int, hi: int | None) -> list:
    """The events (sorted by start, ``starts`` their start times) starting in [lo, hi) (hi None: no end)."""
    i = bisect.bisect_left(starts, lo)
    j = len(starts) if hi is None else bisect.bisect_left(starts, hi)
    return events[i:j]


def _sample(nodes: list) -> list:
    if len(nodes) <= _SAMPLE:
        return nodes
    ordered = sorted(nodes, key=lambda n: n.seq)
    step = len(ordered) / _SAMPLE
    return [ordered[int(i * step)] for i in range(_SAMPLE)]


def _has_after(key, t: int, index, starts_of, end: int | None = None) -> BackwardEvent | None:
    evs = index.get(key)
    if not evs:
        return None
    i = bisect.bisect_left(starts_of[key], t)
    if i < len(evs) and (end is None or evs[i].start_ns < end):
        return evs[i]
    return None


def _find_steps(trace: TorchTrace, anchor, group: list, index, starts_of, claimed: set) -> list[StepMatch]:
    """Steps in time order, each with the anchor group's nodes claimed (see the module docstring)."""
    sample = [n for n in _sample(group) if n is not anchor]
    need = MIN_SHARE * len(sample)
    steps = []
    for c in (e for e in trace.events if e.seq is not None and e.name == anchor.name):
        if id(c) in claimed:  # a run of an earlier step (a graph whose root's name recurs in it)
            continue
        off = c.seq - anchor.seq
        hits = sum(1 for n in sample if _has_after((c.fwd_tid, n.name, n.seq + off), c.start_ns, index, starts_of))
        if hits >= need:
            label = next((p.label for p in trace.steps if p.start_ns <= c.start_ns <= p.end_ns), None)
            s = StepMatch(label or f"backward {len(steps) + 1}", c.start_ns)
            s.offsets[anchor.fwd_thread] = (c.fwd_tid, off)
            # The same graph run again (retained, same numbers): its next run of the anchor starts the next call.
            again = _has_after((c.fwd_tid, anchor.name, c.seq), c.start_ns + 1, index, starts_of)
            _claim(s, group, (c.fwd_tid, off), index, starts_of, c.start_ns, again.start_ns if again else None, claimed)
            steps.append(s)
    # Several backward calls inside one ProfilerStep: number them.
    seen = Counter(s.label for s in steps)
    k: Counter = Counter()
    for s in steps:
        if seen[s.label] > 1:
            k[s.label] += 1
            s.label = f"{s.label}.{k[s.label]}"
    return steps


def _claim(s: StepMatch, members, thread_off, index, starts_of, start, end, claimed: set) -> int:
    t, off = thread_off
    got = 0
    for n in members:
        if n.id in s.nodes:
            continue
        key = (t, n.name, n.seq + off)
        evs = index.get(key)
        if not evs:
            continue
        i = bisect.bisect_left(starts_of[key], start)
        while i < len(evs) and (end is None or evs[i].start_ns < end):
            if id(evs[i]) not in claimed:
                claimed.add(id(evs[i]))
                s.nodes[n.id] = evs[i]
                s.methods["sequence"] += 1
                got += 1
                break
            i += 1
    return got


def _other_group(s: StepMatch, g, members, runs, index, starts_of, end, claimed) -> None:
    anchor = max(members, key=lambda n: n.seq)
    best = None
    for c in runs:  # the step's window only
        if c.name != anchor.name or id(c) in claimed:
            continue
        off = c.seq - anchor.seq
        hits = sum(1 for n in members if _has_after((c.fwd_tid, n.name, n.seq + off), s.start_ns, index, starts_of,
                                                    end))
        if best is None or hits > best[0]:
            best = (hits, (c.fwd_tid, off))
    if best is not None and best[0] >= MIN_SHARE * len(members):
        s.offsets[g] = best[1]
        _claim(s, members, best[1], index, starts_of, s.start_ns, end, claimed)


def _align(s: StepMatch, nodes: list, window: list, claimed: set) -> None:
    """Nodes left over, aligned with the window's unclaimed runs by name in sequence order."""
    if not nodes or not window or len(nodes) * len(window) > _MAX_ALIGN:
        return
    nodes = sorted(nodes, key=lambda n: (n.fwd_thread or 0, n.seq))
    window = sorted(window, key=lambda e: (e.fwd_tid or 0, e.seq))
    sm = difflib.SequenceMatcher(None, [n.name for n in nodes], [e.name for e in window], autojunk=False)
    for a, b, size in sm.get_matching_blocks():
        for k in range(size):
            n, e = nodes[a + k], window[b + k]
            s.nodes[n.id] = e
            claimed.add(id(e))
            s.methods["order"] += 1


def _shape_ok(e: BackwardEvent, node, graph_shape) -> bool | None:
    """Whether the run's recorded gradient shape is the leaf's (None: not recorded)."""
    if not e.shapes or not isinstance(e.shapes[0], list):
        return None
    return list(e.shapes[0]) == list(graph_shape)


def _match_leaves(s: StepMatch, leaves: list, order: list[list], trace: TorchTrace, end, starts=None) -> None:
    # The graph: each leaf keyed by (the non-leaf node run before it on its worker, its place after that node).
    want: dict[tuple, list] = {}
    for seq in order:
        prev, k = None, 0
        for n in seq:
            if _leaf(n):
                want.setdefault((prev, k), []).append(n)
                k += 1
            else:
                prev, k = n.id, 0
    by_event = {id(e): nid for nid, e in s.nodes.items()}
    shape_of = {n.id: n.inputs[0].shape if n.inputs else () for n in leaves}
    # The trace: the step's runs per thread, in time order.
    per_thread: dict[tuple, list] = {}
    for e in _between(trace.events, [e.start_ns for e in trace.events] if starts is None else starts, s.start_ns,
                      end):
        per_thread.setdefault(e.thread, []).append(e)
    found: list[BackwardEvent] = []
    taken: set[str] = set()
    for evs in per_thread.values():
        prev, k = None, 0
        for e in evs:
            if not e.is_leaf:
                prev, k = by_event.get(id(e), f"?{id(e)}"), 0
                continue
            found.append(e)
            run = want.get((prev, k), [])
            k += 1
            pick = None
            for n in run:
                if n.id not in taken and _shape_ok(e, n, shape_of[n.id]) is not False:
                    pick = n
                    break
            if pick is None and prev is not None:  # the shape disagrees: another leaf after the same node?
                later = [n for (p, _), ns in want.items() if p == prev for n in ns]
                pick = next((n for n in later if n.id not in taken and _shape_ok(e, n, shape_of[n.id])), None)
            if pick is not None:
                taken.add(pick.id)
                s.nodes[pick.id] = e
                s.methods["leaf order" if _shape_ok(e, pick, shape_of[pick.id]) is None else "leaf shape"] += 1
    # Leftovers: by shape in order of appearance, else by order when the counts agree.
    left_nodes = [n for seq in order for n in seq if _leaf(n) and n.id not in taken]
    used = {id(v) for v in s.nodes.values()}
    left_events = [e for e in sorted(found, key=lambda e: e.start_ns) if id(e) not in used]
    if not left_nodes or not left_events:
        return
    if all(e.shapes for e in left_events):
        for e in left_events:
            n = next((n for n in left_nodes if n.id not in taken and _shape_ok(e, n, shape_of[n.id])), None)
            if n is not None:
                taken.add(n.id)
                s.nodes[n.id] = e
                s.methods["leaf shape"] += 1
    elif len(left_nodes) == len(left_events):
        for n, e in zip(left_nodes, left_events):
            taken.add(n.id)
            s.nodes[n.id] = e
            s.methods["leaf order"] += 1


def _coverage(graph: Graph, trace: TorchTrace, steps: list[StepMatch]) -> Coverage:
    matched = {n.id: 0 for n in graph.nodes}
    methods: Counter = Counter()
    for s in steps:
        methods.update(s.methods)
        for nid in s.nodes:
            matched[nid] += 1
    trace_names = Counter(e.name for e in trace.events)
    any_leaf = any(e.is_leaf for e in trace.events)
    unmatched = []
    for n in graph.nodes:
        if matched[n.id]:
            continue
        if _leaf(n):
            why = "no AccumulateGrad run left for this leaf" if any_leaf else "the trace has no AccumulateGrad runs"
        elif not trace_names.get(n.name):
            why = f"no {n.name} run in the trace"
        elif steps:
            offs = sorted({o for s in steps for g, (_, o) in s.offsets.items() if g == n.fwd_thread})
            at = ", ".join(f"{n.seq + o}" for o in offs[:3]) + (", ..." if len(offs) > 3 else "")
            why = f"no {n.name} run at sequence number {at} (seq {n.seq} + the step's offset)"
        else:
            why = "no step of this graph found"
        unmatched.append((n.id, n.name, why))
    inside: set[int] = set()
    trace_unmatched: Counter = Counter()
    used = {id(e) for s in steps for e in s.nodes.values()}
    starts = [e.start_ns for e in trace.events]
    for s in steps:
        evs = list(s.nodes.values())
        if not evs:
            continue
        lo = min(e.start_ns for e in evs)
        hi = max(e.end_ns for e in evs)
        for e in _between(trace.events, starts, lo, hi + 1):
            inside.add(id(e))
            if id(e) not in used:
                trace_unmatched[e.name] += 1
                s.unmatched[e.name] += 1
    reasons = {name: (c, "the engine's own root of a call with several roots" if name == "GraphRoot"
                      else "not in the graph") for name, c in trace_unmatched.items()}
    outside = sum(1 for e in trace.events if id(e) not in inside)
    return Coverage(trace.path, graph.source, len(graph.nodes), matched, unmatched, reasons, outside, steps, methods,
                    trace.gpu_activities, trace.gpu_attributed)


def _top(counter: Counter, k: int = 6) -> str:
    items = counter.most_common(k)
    more = len(counter) - len(items)
    from autograd_run.text import clip
    return ", ".join(f"{clip(name, 80)} x{c}" for name, c in items) + (f", and {more} more" if more > 0 else "")


def _mismatch(graph: Graph, trace: TorchTrace, best: int, cov: Coverage) -> str:
    theirs = Counter(e.name for e in trace.events)
    ours = Counter(n.name for n in graph.nodes)
    found = f"at best {best} of {len(graph.nodes)} nodes in one backward call" if cov.steps else \
        f"no backward call of it (0 of {len(graph.nodes)} nodes)"
    return (f"{trace.path}: this profile does not match {graph.source}: {found} "
            f"(a profile of another model?). The trace's backward nodes: {_top(theirs) or 'none'}; "
            f"the graph's: {_top(ours)}")
