"""The order file: one JSON object per executed node (JSON Lines), and comparing orders.

Row fields: ``position``, ``id``, ``name``, ``seq``, ``device``, ``thread``,
``depth`` (reentrant depth), ``graph_task``, ``pass`` (which top-level
backward call of a ``--repeat`` run; absent means 0), and optionally
``ready`` (the ready set at the pop that chose the node, used to explain a
mismatch; never written to files). The order of a run that was stopped
(Ctrl-C, ``--timeout``) ends with one more line, ``{"incomplete": REASON}``;
such a file is refused as a golden order.

``compare_orders(expected, got, per_worker)`` finds the first difference by
node id. Passes are compared one by one: a golden file of one pass is
compared with every pass of the run, a golden file of N passes with a run
of N passes. With ``per_worker`` (several device threads ran nodes, which
interleave freely) each worker thread's own sequence is compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.outputs import atomic_write
from autograd_run.text import clip


#: The largest order file read: a row is ~60 bytes, so this is some ten million nodes' order.
MAX_ORDER_BYTES = 1 << 30


def read_order(path: str, allow_incomplete: bool = False) -> list[dict]:
    """The rows of an order file; ``RequestError`` naming the line when it is malformed, or when the
    file is the order of a stopped run (unless ``allow_incomplete``: its rows are returned)."""
    from autograd_run import untrusted
    rows = []
    try:  # a FIFO or a device (/dev/zero) is refused before it is opened; the size is bounded
        text = untrusted.read_regular_file(path, MAX_ORDER_BYTES).decode("utf-8")
    except untrusted.Problem as p:
        raise RequestError(f"{path}: {p.what}", "expected_order") from None
    except UnicodeDecodeError as exc:
        raise RequestError(f"{path}: not UTF-8 text: {exc.reason}", "expected_order") from None
    if not text.strip():  # (as no node run: every order would differ from it, at position 0)
        raise RequestError(f"{path}: the file is empty (an order file has a line per node run)", "expected_order")
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise RequestError(f"{path}: line {n}: not an order row: nested too deeply", "expected_order") from None
        except ValueError as exc:
            why = ("a number of more than 4300 digits" if "integer string conversion" in str(exc)
                   else f"not JSON: {exc}")
            raise RequestError(f"{path}: line {n}: {why}", "expected_order") from None
        if isinstance(row, dict) and "incomplete" in row and not allow_incomplete:
            raise RequestError(f"{path}: line {n}: the run that wrote this order was stopped "
                               f"({clip(row['incomplete'], 60)}): an incomplete order cannot be a golden one",
                               "expected_order")
        if isinstance(row, dict) and "incomplete" in row:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise RequestError(f"{path}: line {n}: each line needs an object with a string 'id'",
                               "expected_order")
        for key, (ok, what) in _ROW_FIELDS.items():
            if key in row and not ok(row[key]):
                raise RequestError(f"{path}: line {n}: {key!r} must be {what}, got {_kind(row[key])}",
                                   "expected_order")
        rows.append(row)
    return rows


def _count(v) -> bool:
    return type(v) is int and v >= 0


#: The optional fields of a row, each with its test and what it must be (the comparison groups rows by
#: thread and pass and sorts them: a list or a number there was a TypeError).
_ROW_FIELDS = {
    "pass": (_count, "a non-negative integer"),
    "position": (_count, "a non-negative integer"),
    "depth": (_count, "a non-negative integer"),
    "graph_task": (_count, "a non-negative integer"),
    "seq": (lambda v: v is None or _count(v), "a non-negative integer or null"),
    "thread": (lambda v: isinstance(v, str), "a string"),
    "device": (lambda v: isinstance(v, str), "a string"),
    "name": (lambda v: isinstance(v, str), "a string"),
}


def _kind(v) -> str:
    """A wrong value as a message says it: a number as itself (-3), anything else by its type."""
    if v is None:
        return "null"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(v) if len(repr(v)) <= 24 else f"a number of {len(repr(v))} characters"
    return type(v).__name__


def dumps_order(rows: list[dict], incomplete: str | None = None) -> bytes:
    """Rows as JSON Lines, without ready sets; a stopped run's end with ``{"incomplete": REASON}``."""
    text = "".join(json.dumps({k: v for k, v in row.items() if k != "ready"}) + "\n" for row in rows)
    if incomplete:
        text += json.dumps({"incomplete": incomplete}) + "\n"
    return text.encode()


def write_order(path: str, rows: list[dict], incomplete: str | None = None) -> None:
    """Write an order file atomically (a temporary file renamed into place)."""
    atomic_write(path, dumps_order(rows, incomplete), "order_out")


@dataclass
class Divergence:
    position: int
    thread: str | None
    expected: dict | None
    got: dict | None
    pass_index: int = 0
    detail: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The explanation, one string per line (a node id with a newline in it stays in its line)."""
        where = f"position {self.position}" + (f" of worker {clip(repr(self.thread), 60)}" if self.thread else "")
        if self.pass_index:
            where += f" in pass {self.pass_index}"
        return [f"order differs at {where}: expected {_short(self.expected)}, got {_short(self.got)}", *self.detail]

    def describe(self) -> str:
        return "\n".join(self.lines())


def _short(row: dict | None) -> str:
    if row is None:
        return "(end of order)"
    if not isinstance(row, dict):
        return clip(repr(row))
    return f"{clip(row.get('id'))} ({clip(row.get('name'), 80)}, seq {row.get('seq')})"


def passes(rows: list[dict]) -> list[list[dict]]:
    """Rows split by their ``pass`` field, in pass order."""
    out: dict[int, list] = {}
    for r in rows:
        out.setdefault(r.get("pass", 0), []).append(r)
    return [out[k] for k in sorted(out)]


def compare_orders(expected: list[dict], got: list[dict], per_worker: bool) -> Divergence | None:
    """The first difference between two orders (by node id), pass by pass; None when they agree."""
    exp_passes, got_passes = passes(expected) or [[]], passes(got) or [[]]
    if len(exp_passes) != 1 and len(exp_passes) != len(got_passes):
        d = Divergence(0, None, None, None)
        d.detail.append(f"the golden order has {len(exp_passes)} passes, the run {len(got_passes)}")
        return d
    for k, run in enumerate(got_passes):
        want = exp_passes[0] if len(exp_passes) == 1 else exp_passes[k]
        d = _compare_pass(want, run, per_worker)
        if d is not None:
            d.pass_index = k
            return d
    return None


def _compare_pass(expected, got, per_worker) -> Divergence | None:
    if not per_worker:
        return first_divergence(expected, got, None, key=lambda r: r.get("id"))
    groups_e, groups_g = _by_thread(expected), _by_thread(got)
    for th in sorted(set(groups_e) | set(groups_g)):
        d = first_divergence(groups_e.get(th, []), groups_g.get(th, []), th, key=lambda r: r.get("id"))
        if d is not None:
            return d
    return None


def _by_thread(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r.get("thread", "?"), []).append(r)
    return out


def first_divergence(expected: list, got: list, thread: str | None = None, key=lambda r: r) -> Divergence | None:
    """The first position where ``key`` of two sequences differs (one may be shorter), or None."""
    for i in range(max(len(expected), len(got))):
        e = expected[i] if i < len(expected) else None
        g = got[i] if i < len(got) else None
        if e is None or g is None or key(e) != key(g):
            d = Divergence(i, thread, e, g)
            ready = g.get("ready") if isinstance(g, dict) else None
            if ready:
                d.detail.append("ready set at that pop (node, reentrant depth, seq; the queue pops the "
                                "largest (depth, seq), ties as libstdc++'s heap):")
                for k, (nid, depth, seq) in enumerate(ready):
                    mark = "  <- popped" if k == 0 else ""
                    d.detail.append(f"  {nid:<24} depth {depth:<3} seq {seq}{mark}")
            return d
    return None


def node_label(row) -> str:
    """A golden order row's node as one visible label: ``AddmmBackward0 #12`` (its op and its rank
    among that op's nodes, from the loss) or ``AccumulateGrad(fc.weight)`` (a leaf by name)."""
    if row is None:
        return "(end of order)"
    name = str(row.get("name"))
    if row.get("leaf") is not None:
        return f"{clip(name.rpartition('::')[2], 80)}({clip(row['leaf'], 120)})"
    return f"{clip(name, 120)} #{clip(row.get('nth'), 24)}"
