"""Comparing two runs (``Profile`` A, the baseline, and B): order, structure and time.

``compare(a, b, alpha)`` returns a ``Diff``:

* order: per pass, the first position where B's executed order differs
  from A's (each worker's own sequence when either side ran nodes on more
  than one worker), with its context: the neighbouring nodes on both sides,
  where each side ran the other's node, and the ready set with priority
  keys when the rows carry one. When A's own passes disagree (a
  nondeterministic order), a B pass counts as different only if its order
  matches none of A's passes. Also Kendall's tau between the two start
  orders (first pass of each), the nodes only one side ran, the nodes
  whose op changed (same id, another name: a row counts as the same node
  only when both match), and the nodes that ran on another worker (each
  node's most frequent worker).
* time: wall and critical-path time, each op's total and each node's run
  time per pass, each worker's utilisation. A ``Change`` holds both sides'
  medians, the difference, and, when both sides have at least two passes,
  the two-sided Mann–Whitney U test's p-value (Holm-adjusted within nodes,
  ops and workers). A change is *beyond the noise* when that p-value is
  below ``alpha``; with fewer passes it is *untested* and taken as
  measured (right for simulations, which are deterministic).
* critical path: the nodes on it in at least half of a side's passes;
  which joined it in B and which left it.

``parse_fail_on(text)`` reads ``--fail-on`` (``wall>10%,critical-path>5%,order``)
and ``check(diff, thresholds)`` says which are crossed; see ``KEYS``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from autograd_run.errors import RequestError
from autograd_run.analysis.profile import Profile
from autograd_run.analysis.stats import holm, kendall_tau, mann_whitney, median, min_p

DEFAULT_ALPHA = 0.01


@dataclass
class Change:
    """One quantity compared: A's and B's medians over their passes, in ns (utilisation: a share)."""

    name: str
    a: float
    b: float
    n_a: int
    n_b: int
    #: Two-sided Mann–Whitney U p-value (Holm-adjusted in a family); None: untested (fewer than 2 passes a side).
    p: float | None = None
    #: p < alpha; None when untested.
    significant: bool | None = None

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        return self.delta / self.a if self.a else (None if self.delta else 0.0)

    @property
    def counts(self) -> bool:
        """Whether the change is real: beyond the noise, or untested (taken as measured)."""
        return self.significant is not False and self.delta != 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(delta=self.delta, relative=self.relative, counts=self.counts)
        return d


@dataclass
class OrderDivergence:
    pass_index: int
    position: int
    #: The worker whose sequence differs (None: the global order was compared).
    worker: str | None
    a: dict | None
    b: dict | None
    #: Ids around the position on each side (the divergent one in the middle).
    a_context: list[str] = field(default_factory=list)
    b_context: list[str] = field(default_factory=list)
    #: Where A ran B's node and where B ran A's node (None: never).
    a_position_of_b: int | None = None
    b_position_of_a: int | None = None
    #: The ready set at that pop, [id, depth, seq] with the chosen node first, when the rows carry it.
    a_ready: list | None = None
    b_ready: list | None = None


@dataclass
class OrderDiff:
    compared: bool = False
    per_worker: bool = False
    #: A's own passes disagree with one another (its order is not deterministic).
    a_varies: bool = False
    divergence: OrderDivergence | None = None
    kendall_tau: float | None = None
    tau_nodes: int = 0
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    #: (node id, A's op name, B's op name): the same id ran a different op.
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    #: (node id, A's worker, B's worker)
    moved: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class Diff:
    a: str
    b: str
    alpha: float
    order: OrderDiff
    wall: Change | None = None
    critical_path: Change | None = None
    critical_joined: list[str] = field(default_factory=list)
    critical_left: list[str] = field(default_factory=list)
    ops: list[Change] = field(default_factory=list)
    nodes: list[Change] = field(default_factory=list)
    workers: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {"a": self.a, "b": self.b, "alpha": self.alpha,
             "order": {**asdict(self.order), "moved": [list(m) for m in self.order.moved],
                       "changed": [list(c) for c in self.order.changed]},
             "wall": self.wall.to_dict() if self.wall else None,
             "critical_path": self.critical_path.to_dict() if self.critical_path else None,
             "critical_path_joined": self.critical_joined, "critical_path_left": self.critical_left,
             "ops": [c.to_dict() for c in self.ops], "nodes": [c.to_dict() for c in self.nodes],
             "workers": [c.to_dict() for c in self.workers], "notes": self.notes}
        return d


# -- time ----------------------------------------------------------------------------------------

def _change(name: str, a: list, b: list) -> Change | None:
    a = [x for x in a if x is not None]
    b = [x for x in b if x is not None]
    if not a or not b:
        return None
    c = Change(name, median(a), median(b), len(a), len(b))
    if len(a) >= 2 and len(b) >= 2:
        c.p = mann_whitney(a, b).p
    return c


def _family(changes: list[Change], alpha: float) -> list[Change]:
    """Holm-adjust the tested p-values of a family; mark significance; largest changes first."""
    tested = [c for c in changes if c.p is not None]
    for c, p in zip(tested, holm([c.p for c in tested])):
        c.p = p
    for c in changes:
        c.significant = None if c.p is None else c.p < alpha
    return sorted(changes, key=lambda c: (not c.counts, -abs(c.delta), c.name))


def typical_path(p: Profile) -> list[str]:
    """Nodes on the critical path in at least half of the passes, in path order."""
    if not p.critical_path:
        return []
    count = Counter(nid for path in p.critical_path for nid in set(path))
    need = len(p.critical_path) / 2
    seen, out = set(), []
    for path in p.critical_path:
        for nid in path:
            if count[nid] >= need and nid not in seen:
                seen.add(nid)
                out.append(nid)
    return out


# -- order ---------------------------------------------------------------------------------------

def _workers(rows: list[dict]) -> set:
    return {r.get("worker") for r in rows}


def _same(x: dict, y: dict) -> bool:
    """The same node: the same id and (where both name one) the same op."""
    return x["id"] == y["id"] and (x.get("name") is None or y.get("name") is None or x["name"] == y["name"])


def _ident(r: dict):
    return (r["id"], r.get("name"))


def _key(rows: list[dict], per_worker: bool):
    if not per_worker:
        return tuple(_ident(r) for r in rows)
    out: dict = {}
    for r in rows:
        out.setdefault(r.get("worker"), []).append(_ident(r))
    return tuple(sorted((str(w), tuple(ids)) for w, ids in out.items()))


def _first_divergence(a: list[dict], b: list[dict], per_worker: bool, k: int) -> OrderDivergence | None:
    groups = [(None, a, b)]
    if per_worker:
        ga: dict = {}
        gb: dict = {}
        for r in a:
            ga.setdefault(r.get("worker"), []).append(r)
        for r in b:
            gb.setdefault(r.get("worker"), []).append(r)
        groups = [(w, ga.get(w, []), gb.get(w, [])) for w in sorted(set(ga) | set(gb), key=str)]
    for worker, ra, rb in groups:
        for i in range(max(len(ra), len(rb))):
            x = ra[i] if i < len(ra) else None
            y = rb[i] if i < len(rb) else None
            if x is not None and y is not None and _same(x, y):
                continue
            ids_a, ids_b = [r["id"] for r in ra], [r["id"] for r in rb]
            d = OrderDivergence(k, i, worker, x, y, ids_a[max(0, i - 3):i + 4], ids_b[max(0, i - 3):i + 4])
            if y is not None and y["id"] in ids_a:
                d.a_position_of_b = ids_a.index(y["id"])
            if x is not None and x["id"] in ids_b:
                d.b_position_of_a = ids_b.index(x["id"])
            d.a_ready = x.get("ready") if x is not None else None
            d.b_ready = y.get("ready") if y is not None else None
            return d
    return None


def _majority_workers(p: Profile) -> dict[str, str]:
    votes: dict[str, Counter] = {}
    for rows in p.order:
        for r in rows:
            if r.get("worker") is not None:
                votes.setdefault(r["id"], Counter())[r["worker"]] += 1
    return {nid: c.most_common(1)[0][0] for nid, c in votes.items()}


def compare_order(a: Profile, b: Profile) -> OrderDiff:
    out = OrderDiff()
    if not a.order or not b.order:
        return out
    out.compared = True
    out.per_worker = any(len(_workers(rows)) > 1 for rows in a.order + b.order)
    keys_a = [_key(rows, out.per_worker) for rows in a.order]
    out.a_varies = len(set(keys_a)) > 1
    known = set(keys_a)
    for k, rows in enumerate(b.order):
        if _key(rows, out.per_worker) in known:
            continue
        ref = a.order[k] if k < len(a.order) else a.order[0]
        out.divergence = _first_divergence(ref, rows, out.per_worker, k)
        break
    ids_a = [r["id"] for r in a.order[0]]
    ids_b = [r["id"] for r in b.order[0]]
    out.kendall_tau, out.tau_nodes = kendall_tau(ids_a, ids_b)
    all_a = {r["id"] for rows in a.order for r in rows}
    all_b = {r["id"] for rows in b.order for r in rows}
    out.only_a = sorted(all_a - all_b)
    out.only_b = sorted(all_b - all_a)
    names_a = {r["id"]: r.get("name") for rows in a.order for r in rows}
    names_b = {r["id"]: r.get("name") for rows in b.order for r in rows}
    out.changed = sorted((nid, names_a[nid], names_b[nid]) for nid in names_a.keys() & names_b.keys()
                         if names_a[nid] is not None and names_b[nid] is not None and names_a[nid] != names_b[nid])
    wa, wb = _majority_workers(a), _majority_workers(b)
    out.moved = sorted((nid, wa[nid], wb[nid]) for nid in set(wa) & set(wb) if wa[nid] != wb[nid])
    return out


# -- the comparison ------------------------------------------------------------------------------

def compare(a: Profile, b: Profile, alpha: float = DEFAULT_ALPHA) -> Diff:
    """Compare B with the baseline A (see the module docstring)."""
    d = Diff(a.source, b.source, alpha, compare_order(a, b))
    d.notes = list(a.notes) + list(b.notes)
    if a.has_times and b.has_times:
        d.wall = _family([_change("wall", a.wall_ns, b.wall_ns)], alpha)[0]
        if a.critical_path_ns and b.critical_path_ns:
            d.critical_path = _family([_change("critical path", a.critical_path_ns, b.critical_path_ns)], alpha)[0]
        ta, tb = typical_path(a), typical_path(b)
        sa, sb = set(ta), set(tb)
        d.critical_joined = [n for n in tb if n not in sa]
        d.critical_left = [n for n in ta if n not in sb]
        d.ops = _family([c for name in a.ops.keys() & b.ops.keys()
                         if (c := _change(name, a.ops[name], b.ops[name])) is not None], alpha)
        d.nodes = _family([c for nid in a.nodes.keys() & b.nodes.keys()
                           if (c := _change(nid, a.nodes[nid].duration_ns, b.nodes[nid].duration_ns)) is not None],
                          alpha)
        ua, ub = a.utilization(), b.utilization()
        d.workers = _family([c for w in sorted(ua.keys() | ub.keys())
                             if (c := _change(w, ua.get(w, [0.0] * a.passes), ub.get(w, [0.0] * b.passes)))
                             is not None], alpha)
        if a.passes >= 2 and b.passes >= 2 and min_p(a.passes, b.passes) >= alpha:
            d.notes.append(f"with {a.passes} and {b.passes} passes no difference can reach p < {alpha} "
                           f"(the smallest p is {min_p(a.passes, b.passes):.3g}): use more passes (--repeat)")
        elif a.passes < 2 or b.passes < 2:
            d.notes.append("a side has one pass: time differences are taken as measured, untested "
                           "(use --repeat on both sides for a test against the noise)")
    elif a.has_times or b.has_times:
        d.notes.append("only one side has times: only the order is compared")
    return d


# -- thresholds ----------------------------------------------------------------------------------

#: ``--fail-on`` keys: (takes a value, what crosses it).
KEYS = {
    "wall": (True, "the median wall time grew by more than the value"),
    "critical-path": (True, "the median critical-path time grew by more than the value"),
    "node": (True, "a node's median run time grew by more than the value"),
    "op": (True, "an op's median total time per pass grew by more than the value"),
    "utilization": (True, "a worker's median utilisation moved by more than the value (percentage points)"),
    "order": (False, "the executed order differs (first divergence)"),
    "workers": (False, "a node ran on another worker"),
    "critical-path-nodes": (False, "a node joined or left the critical path"),
    "structure": (False, "a node ran on one side only, or its op changed"),
}

_UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_ITEM = re.compile(r"^\s*([a-z-]+)\s*(?:>\s*([0-9]*\.?[0-9]+)\s*(%|ns|us|µs|ms|s)?)?\s*$")


@dataclass
class Threshold:
    key: str
    #: A share (0.1 for 10%) when ``relative``, else ns; None for keys without a value.
    value: float | None = None
    relative: bool = False

    def __str__(self) -> str:
        if self.value is None:
            return self.key
        if self.relative:
            return f"{self.key}>{self.value * 100:g}%"
        return f"{self.key}>{self.value:g}ns"


def parse_fail_on(text: str) -> list[Threshold]:
    """``wall>10%,critical-path>2ms,order`` -> thresholds; ``RequestError`` (option ``fail_on``) when malformed."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        m = _ITEM.match(item)
        if not m or m.group(1) not in KEYS:
            raise RequestError(f"{item.strip()!r}: expected KEY>VALUE (VALUE with % or ns/us/ms/s) or a bare key; "
                               f"keys: {', '.join(KEYS)}", "fail_on")
        key, num, unit = m.groups()
        takes = KEYS[key][0]
        if takes and num is None:
            raise RequestError(f"{item.strip()!r}: {key} needs a value, e.g. {key}>10%", "fail_on")
        if not takes and num is not None:
            raise RequestError(f"{item.strip()!r}: {key} takes no value", "fail_on")
        if num is None:
            out.append(Threshold(key))
            continue
        value = float(num)
        if unit == "%" or (key == "utilization" and unit is None):
            out.append(Threshold(key, value / 100, True))
        elif key == "utilization":
            raise RequestError(f"{item.strip()!r}: utilization takes percentage points, e.g. utilization>10%",
                               "fail_on")
        elif unit is None:
            raise RequestError(f"{item.strip()!r}: give the value a unit (% or ns, us, ms, s)", "fail_on")
        else:
            out.append(Threshold(key, value * _UNITS[unit]))
    if not out:
        raise RequestError("no thresholds given", "fail_on")
    return out


@dataclass
class Verdict:
    threshold: str
    crossed: bool
    #: What crossed it, or why not.
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)


def _grew(c: Change, t: Threshold) -> bool:
    if not c.counts or c.delta <= 0:
        return False
    if t.relative:
        rel = c.relative
        return rel is None or rel > t.value
    return c.delta > t.value


def _fmt_change(c: Change) -> str:
    rel = c.relative
    pct = "new" if rel is None else f"{rel:+.1%}"
    test = "untested" if c.p is None else f"p={c.p:.3g}"
    return f"{c.name} {pct} ({test})"


def check(d: Diff, thresholds: list[Threshold]) -> list[Verdict]:
    """Each threshold with whether ``d`` crosses it."""
    out = []
    for t in thresholds:
        crossed, detail = False, ""
        if t.key in ("wall", "critical-path"):
            c = d.wall if t.key == "wall" else d.critical_path
            if c is None:
                detail = "not compared (no times on a side)"
            else:
                crossed = _grew(c, t)
                detail = _fmt_change(c)
        elif t.key in ("node", "op"):
            family = d.nodes if t.key == "node" else d.ops
            hits = [c for c in family if _grew(c, t)]
            crossed = bool(hits)
            detail = ", ".join(_fmt_change(c) for c in hits[:5]) + (f" and {len(hits) - 5} more" if len(hits) > 5
                                                                   else "") if hits else \
                (f"{len(family)} compared" if family else "not compared (no times on a side)")
        elif t.key == "utilization":
            hits = [c for c in d.workers if c.counts and abs(c.delta) > t.value]
            crossed = bool(hits)
            detail = ", ".join(f"{c.name} {c.a:.0%} -> {c.b:.0%}" for c in hits) or f"{len(d.workers)} workers compared"
        elif t.key == "order":
            dv = d.order.divergence
            crossed = dv is not None
            if not d.order.compared:
                detail = "not compared (no order on a side)"
            elif dv is not None:
                detail = f"pass {dv.pass_index}, position {dv.position}" + (f" of {dv.worker}" if dv.worker else "")
            else:
                detail = "same order"
        elif t.key == "workers":
            crossed = bool(d.order.moved)
            detail = f"{len(d.order.moved)} nodes moved" if crossed else "no node moved"
        elif t.key == "critical-path-nodes":
            crossed = bool(d.critical_joined or d.critical_left)
            detail = f"{len(d.critical_joined)} joined, {len(d.critical_left)} left"
        elif t.key == "structure":
            crossed = bool(d.order.only_a or d.order.only_b or d.order.changed)
            detail = (f"{len(d.order.only_a)} only in A, {len(d.order.only_b)} only in B, "
                      f"{len(d.order.changed)} with another op")
        out.append(Verdict(str(t), crossed, detail))
    return out
