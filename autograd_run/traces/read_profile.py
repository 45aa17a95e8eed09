"""Reading a run's profile (``analysis.profile.Profile``) from whatever file describes it.

  order file    ``--order-out`` (JSON Lines rows)        the order only (with the ready
                                                          sets when the rows carry them)
  Chrome trace  ``--trace`` of ``run`` or ``simulate``    order and times, from the node
                                                          slices' args, their threads'
                                                          worker labels and, where the
                                                          args leave them out, the node
                                                          id and op name from the title
                                                          ``<id> <op>`` (``chrome.slice_node``)
  JSON summary  ``run --json`` / ``simulate --json``      order and times from its
                                                          ``samples``; an older summary
                                                          without them gives aggregates

``read_profile(path)`` detects the kind from the content, not the name (a
gzipped file is decompressed first: ``--trace FILE.json.gz``; a Perfetto
protobuf trace, ``.pftrace``, is refused with a message saying so). An
input is untrusted: its size is bounded (``MAX_BYTES``, ``MAX_ROWS``,
``MAX_PASSES``), every field is type-checked, and a problem is a
``RequestError`` naming the file, the place (line, event index or JSON
path) and what is wrong.
"""

from __future__ import annotations


import msgspec

from autograd_run.analysis.profile import Profile, finish, from_samples, order_passes
from autograd_run.analysis.samples import NodeSamples, Samples, stable_worker
from autograd_run.analysis.summary import union_length
from autograd_run.errors import RequestError
from autograd_run.graphs.tensors import short
from autograd_run.traces.layout import SIMULATED_PROCESS_NAME, slice_node
from autograd_run.traces.torch_profile import MAX_EVENT_DUR_US, MAX_EVENT_TS_US

#: Inputs larger than this are refused before they are read.
MAX_BYTES = 256 * 1024 * 1024
#: At most this many order rows, trace events or nodes, and passes.
MAX_ROWS = 20_000_000
MAX_PASSES = 100_000


class _Bad(Exception):
    """A problem at a place in the input (turned into a RequestError naming the file)."""

    def __init__(self, where: str, what: str):
        self.where, self.what = where, what
        super().__init__(f"{where}: {what}")


def read_profile(path: str, option: str | None = None) -> Profile:
    """The profile in ``path`` (an order file, a Chrome trace or a JSON summary; detected from the content)."""
    data = _read(path, option)
    try:
        return parse_profile(data, path)
    except _Bad as exc:
        raise RequestError(f"{path}: {exc.where}: {exc.what}", option) from None


def _read(path: str, option: str | None) -> bytes:
    from autograd_run import untrusted
    try:  # a FIFO, a device or a directory is refused before it is opened
        data = untrusted.read_regular_file(path, MAX_BYTES)
    except untrusted.Problem as p:
        raise RequestError(f"{path}: {p.what}", option) from None
    if data[:2] == b"\x1f\x8b":  # a gzipped trace (run --trace FILE.json.gz): decompressed, bounded
        from autograd_run.traces.jsonfile import read_bounded
        return read_bounded(path, option, MAX_BYTES)
    return data


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    col = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {col}"


def _decode(data: bytes, where_base: int = 0, full: bytes | None = None):
    """JSON ``data``; a ``_Bad`` with the line and column of a syntax error."""
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise _Bad("JSON", "nested too deeply") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        at = msg.rfind("(byte ")
        if at >= 0 and msg.endswith(")"):
            try:
                off = int(msg[at + 6:-1])
            except ValueError:
                off = None
            if off is not None:
                raise _Bad(_position(full or data, where_base + off), f"not JSON: {msg[:at].strip()}") from None
        raise _Bad("JSON", f"not valid JSON: {msg}") from None


_PROTOBUF = ("a Perfetto protobuf trace (.pftrace): diff reads the JSON trace of `run --trace FILE.json` "
             "(or .json.gz), order files and JSON summaries")


def parse_profile(data: bytes, source: str) -> Profile:
    """Detect the kind of ``data`` and read it (``_Bad`` on a problem)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    from autograd_run.traces.torch_profile import is_protobuf_trace
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if is_protobuf_trace(data, source):
            raise _Bad("line 1", _PROTOBUF) from None
        raise _Bad(_position(data, exc.start), "not UTF-8 text (an order file, trace or JSON summary is)") from None
    head = data.lstrip()[:1]
    if not head:
        raise _Bad("line 1", "the file is empty")
    if head not in (b"[", b"{") and is_protobuf_trace(data, source):
        raise _Bad("line 1", _PROTOBUF)
    if head == b"[":
        doc = _decode(data)
        return _from_list(doc, source)
    if head != b"{":
        raise _Bad("line 1", "not an order file, trace or JSON summary (none starts with this)")
    first_line_end = data.find(b"\n", data.find(b"{"))
    try:
        doc = _decode(data)
    except _Bad as whole:
        if first_line_end < 0 or not data[first_line_end:].strip():
            raise
        try:
            first = _decode(data[:first_line_end])
        except _Bad:
            raise whole from None
        if isinstance(first, dict):  # an object per line: an order file (each line's fields checked there)
            return _order_file(data, source)
        raise whole from None
    if not isinstance(doc, dict):
        raise _Bad("$", "expected a JSON object")
    if "traceEvents" in doc:
        return _trace(doc.get("traceEvents"), source, "$.traceEvents")
    if "summary" in doc:
        return _summary(doc, source)
    if "id" in doc:
        return _order_file(data, source)
    raise _Bad("$", "a JSON object that is neither a Chrome trace (traceEvents), a JSON summary (summary) "
                    "nor an order row (id)")


def _from_list(doc, source: str) -> Profile:
    if isinstance(doc, list) and doc and all(isinstance(x, dict) and "summary" in x for x in doc[:1]):
        raise _Bad("$", f"a list of {len(doc)} simulation results (simulate --compare --json); "
                        "diff compares one result with another")
    return _trace(doc, source, "$")


# -- order files -------------------------------------------------------------------------------

#: The largest magnitude a number in these files may have (2**64: a sequence number is an unsigned
#: 64-bit integer). JSON integers have no limit and a float may be 1e308: beyond it a median, a
#: difference or a conversion to nanoseconds would overflow (an OverflowError, or an infinity in --json).
MAX_MAGNITUDE = 2 ** 64


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_MAGNITUDE <= v <= MAX_MAGNITUDE


def _order_file(data: bytes, source: str) -> Profile:
    rows = []
    stopped = None  # a stopped run's order ends with {"incomplete": REASON}
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        if len(rows) >= MAX_ROWS:
            raise _Bad(f"line {n}", f"more than {MAX_ROWS} rows")
        try:
            row = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _Bad(f"line {n}", f"not JSON: {exc}") from None
        if isinstance(row, dict) and "incomplete" in row and "id" not in row:
            stopped = str(row["incomplete"])[:40]
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise _Bad(f"line {n}", "each line needs an object with a string 'id'")
        p = row.get("pass", 0)
        if not _is_int(p) or not 0 <= p < MAX_PASSES:
            raise _Bad(f"line {n}", f"'pass' must be an integer in [0, {MAX_PASSES})")
        for k in ("name", "thread"):
            if k in row and not isinstance(row[k], str):
                raise _Bad(f"line {n}", f"'{k}' must be a string")
        if "ready" in row:
            _check_ready(row["ready"], f"line {n}")
        rows.append(row)
    if not rows:
        raise _Bad("line 1", "no order rows")
    golden = all("nth" in r for r in rows)
    if golden:
        # A golden order of PyTorch (capture --order-out): its ids are positions in one capture's
        # walk and shift when the model changes; a node is known by its op and rank (``golden``).
        from autograd_run.traces.order import node_label
        for r in rows:
            r["capture_id"], r["id"] = r["id"], node_label(r)
    p = Profile(source, "order file", order=order_passes(rows))
    p.notes.append(f"{source}: " + ("a golden order of PyTorch: nodes are compared by op and rank, "
                                    "leaves by name; " if golden else "") + "an order file has no times")
    if stopped is not None:
        p.notes.append(f"{source}: the run that wrote this order was stopped ({stopped}): its order ends early")
    return p


def _check_ready(ready, where: str) -> None:
    ok = isinstance(ready, list) and len(ready) <= MAX_ROWS and all(
        isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and _is_int(r[1]) and _is_int(r[2])
        for r in ready)
    if not ok:
        raise _Bad(where, "'ready' must be a list of [node id, depth, seq]")


# -- Chrome traces -----------------------------------------------------------------------------

def _short(v) -> str:
    """A value as an error message quotes it: a number as %g, anything else shortened."""
    if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1e16):
        return f"{v:g}"
    return short(v, 40)


def _num(v) -> bool:
    """A JSON number of at most ``MAX_MAGNITUDE`` (so never NaN or infinite)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and -MAX_MAGNITUDE <= v <= MAX_MAGNITUDE


#: A node slice's arguments that are read, each with its test and what it must be (said when it is not).
_ARG_CHECKS = (("pass", lambda v: _is_int(v) and 0 <= v < MAX_PASSES, f"an integer from 0 to {MAX_PASSES - 1}"),
               ("worker", lambda v: isinstance(v, str), "a string"),
               ("depth", lambda v: _is_int(v), "an integer"), ("seq", lambda v: _is_int(v), "an integer"))


def _trace(events, source: str, where: str) -> Profile:
    if not isinstance(events, list):
        raise _Bad(where, "traceEvents must be a list")
    if len(events) > MAX_ROWS:
        raise _Bad(where, f"more than {MAX_ROWS} events")
    slices = []     # (ts_ns, end_ns, tid, gt, id, name, args, index)
    begins: dict = {}
    waits: dict = {}
    sort_index: dict = {}
    thread_workers: dict = {}  # tid -> the worker label of its thread_name metadata
    simulated = False
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise _Bad(f"{where}[{i}]", "each event must be an object")
        ph, cat = e.get("ph"), e.get("cat")
        if ph == "X" and cat == "cpu_op" and isinstance(e.get("args"), dict) and "node" in e["args"]:
            e = _from_kineto(e, f"{where}[{i}]")  # our Kineto trace's node span (``traces.kineto``)
            if "queue wait" in e["args"]:
                waits[(e["args"].get("graph_task", 0), e["args"]["id"])] = e["args"]["queue wait"]
            cat = "node"
        if ph == "X" and cat == "node":
            args, ts, dur = e.get("args"), e.get("ts"), e.get("dur")
            if not isinstance(args, dict):
                raise _Bad(f"{where}[{i}].args", "a node slice needs args (an object)")
            node = slice_node(e.get("name"), args)
            if node is None:
                raise _Bad(f"{where}[{i}]", "a node slice needs a title '<id> <op>' (a string 'name') "
                                            "or a string 'id' in its args")
            nid, op = node
            gt = args.get("graph_task", 0)  # left out where 0
            if not _is_int(gt):
                raise _Bad(f"{where}[{i}].args.graph_task", "must be an integer")
            if not _num(ts) or not _num(dur) or not -MAX_EVENT_TS_US <= ts <= MAX_EVENT_TS_US \
                    or not 0 <= dur <= MAX_EVENT_DUR_US:
                raise _Bad(f"{where}[{i}]", f"a node slice needs a 'ts' from {-MAX_EVENT_TS_US:g} to "
                                            f"{MAX_EVENT_TS_US:g} us and a 'dur' from 0 to {MAX_EVENT_DUR_US:g} us "
                                            f"(a day), got ts {_short(ts)} and dur {_short(dur)}")
            if not _tid_ok(e.get("tid")):
                raise _Bad(f"{where}[{i}].tid", "must be an integer or a string")
            # the engine's GraphRoot: marked, or in an older trace (its slices carried the op name) unmarked
            if args.get("graph_root") is True or (nid == "GraphRoot" and e.get("name") == "GraphRoot"
                                                  and args.get("name") == "GraphRoot"
                                                  and "graph_root" not in args and "pass" not in args):
                continue
            for k, check, what in _ARG_CHECKS:
                if k in args and not check(args[k]):
                    raise _Bad(f"{where}[{i}].args.{k}", f"must be {what}, got {_short(args[k])}")
            start = round(ts * 1000)
            slices.append((start, start + round(dur * 1000), e.get("tid"), gt, nid, op, args, i))
        elif cat == "queue_wait" and ph in ("b", "e") and _num(e.get("ts")):
            key = _async_key(e)
            if key is None:
                continue
            if ph == "b" and isinstance(e.get("args"), dict):
                begins[key] = e
            elif ph == "e":
                b = begins.pop(key, None)
                if b is not None:
                    a = b["args"]
                    gt = a.get("graph_task", 0)
                    if isinstance(a.get("id"), str) and _is_int(gt) and _num(b.get("ts")):
                        waits[(gt, a["id"])] = max(0, round((e["ts"] - b["ts"]) * 1000))
        elif ph == "M" and e.get("name") == "thread_sort_index" and isinstance(e.get("args"), dict):
            if _tid_ok(e.get("tid")):
                sort_index[e.get("tid")] = e["args"].get("sort_index")
        elif ph == "M" and e.get("name") == "thread_name" and isinstance(e.get("args"), dict):
            if _tid_ok(e.get("tid")) and isinstance(e["args"].get("worker"), str):
                thread_workers[e.get("tid")] = e["args"]["worker"]
        elif ph == "M" and e.get("name") == "process_name" and isinstance(e.get("args"), dict):
            simulated = simulated or e["args"].get("name") == SIMULATED_PROCESS_NAME
        elif ph == "X" and cat == "kernel":
            simulated = True
    if not slices:
        raise _Bad(where, "the trace has no node slices (cat 'node'): not a trace of autograd-run")
    p = Profile(source, "trace", simulated)
    # Worker labels: on each thread's metadata (a slice on a thread without one: its tid, as text), or in an
    # older trace on each slice; the oldest traces have none.
    labelled = bool(thread_workers) or all("worker" in s[6] for s in slices)
    if not labelled:
        p.notes.append(f"{source}: the trace's slices carry no worker labels (an older trace): "
                       "workers are told apart by track position")

    def worker(sl) -> str:
        w = sl[6].get("worker")
        if isinstance(w, str):
            return w
        if thread_workers:
            w = thread_workers.get(sl[2])
            return w if w is not None else str(sl[2])
        rank = sort_index.get(sl[2])
        return f"track {rank}" if _is_int(rank) else f"track tid {sl[2]}"

    # A slice's pass: its ``pass`` argument; absent, 0 in a trace with worker labels (the writer leaves out a
    # pass of 0), else (an older trace, without the argument) found from the graph tasks' spans.
    pass_of = _trace_passes(slices) if not labelled else {}
    passes = [sl[6]["pass"] if "pass" in sl[6] else pass_of.get(sl[3], 0) for sl in slices]
    n = max(passes) + 1
    if n > MAX_PASSES:
        raise _Bad(where, f"more than {MAX_PASSES} passes")
    spans = [[None, None] for _ in range(n)]
    for sl, k in zip(slices, passes):
        sp = spans[k]
        sp[0] = sl[0] if sp[0] is None else min(sp[0], sl[0])
        sp[1] = sl[1] if sp[1] is None else max(sp[1], sl[1])
    present = [k for k in range(n) if spans[k][0] is not None]
    index = {k: j for j, k in enumerate(present)}
    n = len(present)
    p.passes = n
    p.wall_ns = [spans[k][1] - spans[k][0] for k in present]
    busy: dict[str, list[list]] = {}
    crit: list[list] = [[] for _ in range(n)]
    order: list[list] = [[] for _ in range(n)]
    for sl, k in sorted(zip(slices, passes), key=lambda s: (s[0][0], s[0][7])):
        k = index[k]
        w = worker(sl)
        busy.setdefault(w, [[] for _ in range(n)])[k].append((sl[0], sl[1]))
        wait = waits.get((sl[3], sl[4]), 0)
        dur = sl[1] - sl[0]
        ns = p.nodes.get(sl[4])
        if ns is None:
            ns = p.nodes[sl[4]] = NodeSamples(sl[5], [None] * n, [None] * n, [None] * n, [None] * n)
        if ns.duration_ns[k] is None:
            ns.worker[k], ns.start_ns[k] = w, sl[0] - spans[present[k]][0]
            ns.duration_ns[k], ns.queue_wait_ns[k] = dur, wait
            row = {"id": sl[4], "name": sl[5], "worker": w}
            if "seq" in sl[6]:
                row["seq"] = sl[6]["seq"]
            order[k].append(row)
        else:
            ns.duration_ns[k] += dur
            ns.queue_wait_ns[k] += wait
        if sl[6].get("critical_path") is True:
            crit[k].append((sl[4], wait + dur))
    p.worker_busy_ns = {w: [union_length(x) for x in per] for w, per in busy.items()}
    p.order = order
    if any(crit):
        p.critical_path = [[c[0] for c in cp] for cp in crit]
        p.critical_path_ns = [sum(c[1] for c in cp) for cp in crit]
    else:
        p.notes.append(f"{source}: the trace marks no critical path (an older trace)")
    p.notes.append(f"{source}: a trace's pass wall time is its first node's start to its last node's end")
    return finish(p)


#: Our Kineto trace's node arguments -> the Chrome trace's (``traces.kineto`` names them apart from the
#: arguments Holistic Trace Analysis takes for its own columns).
_KINETO_ARGS = {"node": "id", "op": "name", "graph task": "graph_task", "depth": "depth", "pass": "pass",
                "Sequence number": "seq", "node device": "device", "critical path": "critical_path",
                "graph root": "graph_root"}


def _from_kineto(e: dict, where: str) -> dict:
    """A node's ``cpu_op`` of our Kineto trace as the node slice of a Chrome trace (its title the node's)."""
    a = e["args"]
    if not isinstance(a.get("node"), str) or not isinstance(a.get("op", ""), str):
        raise _Bad(f"{where}.args.node", "a node's cpu_op needs a string node id and op")
    args = {ours: a[k] for k, ours in _KINETO_ARGS.items() if k in a}
    args.setdefault("name", "?")
    if args.get("seq") == -1:  # Kineto's "none"; the Chrome trace writes the node's UINT64_MAX as it is
        args["seq"] = (1 << 64) - 1
    wait = a.get("queue wait ns")
    if wait is not None:
        if not _is_int(wait) or wait < 0:
            raise _Bad(f"{where}.args.queue wait ns", "must be a non-negative integer")
        args["queue wait"] = wait
    return {**e, "cat": "node", "name": f"{args['id']} {args['name']}", "args": args}


def _tid_ok(tid) -> bool:
    """A thread id a trace may give (absent, an integer or a string): one to look threads up by."""
    return tid is None or type(tid) in (int, str)


def _async_key(e: dict):
    """What pairs an async begin with its end, as the trace viewers do: the id (``id2.local`` or
    ``id2.global``, or a bare ``id``) with the event's name and, for a local id, its process. None when
    the id is missing or not a string or integer (a hostile trace: that wait is ignored)."""
    id2 = e.get("id2")
    if isinstance(id2, dict):
        if "local" in id2:
            ident, scope = id2["local"], e.get("pid")
        else:
            ident, scope = id2.get("global"), None
    else:
        ident, scope = e.get("id"), None
    if type(ident) not in (str, int) or (scope is not None and type(scope) not in (str, int)):
        return None
    name = e.get("name")
    return scope, ident, name if isinstance(name, str) else None


def _trace_passes(slices) -> dict[int, int]:
    """GraphTask -> pass: top-level tasks (depth 0) in start order; nested ones by the span holding them."""
    first: dict[int, tuple] = {}
    for sl in slices:
        gt, depth = sl[3], sl[6].get("depth", 0)
        if gt not in first or sl[0] < first[gt][0]:
            first[gt] = (sl[0], depth if _is_int(depth) else 0)
    tops = sorted((t, gt) for gt, (t, d) in first.items() if d == 0)
    if not tops:
        return {gt: 0 for gt in first}
    out = {gt: k for k, (_, gt) in enumerate(tops)}
    starts = [t for t, _ in tops]
    import bisect
    for gt, (t, _) in first.items():
        if gt not in out:
            out[gt] = max(0, bisect.bisect_right(starts, t) - 1)
    return out


# -- JSON summaries ----------------------------------------------------------------------------

def _summary(doc: dict, source: str) -> Profile:
    summary = doc.get("summary")
    if not isinstance(summary, dict):
        raise _Bad("$.summary", "must be an object")
    simulated = "spec" in doc and "policy" in doc
    if isinstance(doc.get("error"), dict):
        raise _Bad("$.error", "the run failed (" + str(doc["error"].get("message", "?"))[:200] + "): nothing to compare")
    samples = doc.get("samples")
    if samples is None:
        return _old_summary(summary, source, simulated)
    s = _samples(samples, "$.samples")
    return from_samples(s, source, "summary", simulated)


def _int_list(v, n: int, where: str, none_ok: bool = False, low: int = 0) -> list:
    """A list of ``n`` integers from ``low`` (times, durations and waits: 0) to 2**64 (or nulls)."""
    if not isinstance(v, list) or len(v) != n:
        raise _Bad(where, f"must be a list of {n} values (one per pass)")
    for j, x in enumerate(v):
        if not ((_is_int(x) and x >= low) or (none_ok and x is None)):
            bound = "of at most 2**64" if low < 0 else f"from {low} to 2**64"
            raise _Bad(f"{where}[{j}]", f"must be an integer {bound}" + (" or null" if none_ok else ""))
    return v


def _samples(d, where: str) -> Samples:
    if not isinstance(d, dict):
        raise _Bad(where, "must be an object")
    n = d.get("passes")
    if not _is_int(n) or not 0 <= n <= MAX_PASSES:
        raise _Bad(f"{where}.passes", f"must be an integer in [0, {MAX_PASSES}]")
    s = Samples(n)
    s.wall_ns = _int_list(d.get("wall_ns"), n, f"{where}.wall_ns")
    s.critical_path_ns = _int_list(d.get("critical_path_ns"), n, f"{where}.critical_path_ns")
    cp = d.get("critical_path")
    if not isinstance(cp, list) or len(cp) != n or not all(
            isinstance(c, list) and all(isinstance(x, str) for x in c) for c in cp):
        raise _Bad(f"{where}.critical_path", f"must be {n} lists of node ids")
    s.critical_path = cp
    busy = d.get("worker_busy_ns")
    if not isinstance(busy, dict):
        raise _Bad(f"{where}.worker_busy_ns", "must be an object")
    s.worker_busy_ns = {str(w): _int_list(v, n, f"{where}.worker_busy_ns[{w!r}]") for w, v in busy.items()}
    nodes = d.get("nodes")
    if not isinstance(nodes, dict) or len(nodes) > MAX_ROWS:
        raise _Bad(f"{where}.nodes", "must be an object (at most {MAX_ROWS} nodes)")
    for nid, v in nodes.items():
        at = f"{where}.nodes[{nid!r}]"
        if not isinstance(v, dict) or not isinstance(v.get("name"), str):
            raise _Bad(at, "must be an object with a string 'name'")
        workers = v.get("worker")
        if not isinstance(workers, list) or len(workers) != n or not all(
                w is None or isinstance(w, str) for w in workers):
            raise _Bad(f"{at}.worker", f"must be a list of {n} worker labels or nulls")
        s.nodes[nid] = NodeSamples(v["name"], workers,
                                   _int_list(v.get("start_ns"), n, f"{at}.start_ns", True, -MAX_MAGNITUDE),
                                   _int_list(v.get("duration_ns"), n, f"{at}.duration_ns", True),
                                   _int_list(v.get("queue_wait_ns"), n, f"{at}.queue_wait_ns", True))
    return s


def _old_summary(summary: dict, source: str, simulated: bool) -> Profile:
    """A summary without samples (an older ``--json``): its aggregates as one sample each."""
    p = Profile(source, "summary", simulated)
    wall = summary.get("wall_ns")
    if not _is_int(wall) or wall < 0:
        raise _Bad("$.summary.wall_ns", "must be an integer from 0 to 2**64")
    p.passes = 1
    p.wall_ns = [wall]
    cp = summary.get("critical_path")
    cpn = summary.get("critical_path_ns")
    if isinstance(cp, list) and _is_int(cpn):
        p.critical_path = [[r["id"] for r in cp if isinstance(r, dict) and isinstance(r.get("id"), str)]]
        p.critical_path_ns = [cpn]
    for w in summary.get("workers") or []:
        if isinstance(w, dict) and isinstance(w.get("name"), str) and _is_int(w.get("busy_ns")):
            p.worker_busy_ns[stable_worker(w["name"])] = [w["busy_ns"]]
    ops = summary.get("ops")
    if isinstance(ops, dict):
        p.ops = {k: [int(v["total_ns"])] for k, v in ops.items() if isinstance(v, dict) and _num(v.get("total_ns"))}
    p.notes.append(f"{source}: a summary without samples (older --json): aggregates only, one sample each, "
                   "no per-node times or order")
    return p
