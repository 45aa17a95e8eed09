"""PyTorch profiler traces (``torch.profiler``'s ``export_chrome_trace``, Kineto's Chrome JSON) as typed records.

What the fields mean (PyTorch 2.x: ``torch/csrc/autograd/engine.cpp``,
``function.h``, ``torch/csrc/profiler/collection.cpp``,
``profiler_kineto.cpp``; Kineto's ``output_json.cpp``):

* Each backward node the engine runs is two nested complete events
  (``"ph": "X"``, ``"cat": "cpu_op"``) on the thread that ran it: the
  engine's ``autograd::engine::evaluate_function: NAME`` span (the node's
  function, ``validate_outputs`` and routing its gradients) and, inside it,
  the node's own ``NAME`` (``Node::operator()``, a ``BACKWARD_FUNCTION``
  RecordFunction). The node's RecordFunction carries its sequence number
  and ``Node::thread_id_`` (RecordFunction's id of the thread that created
  the node, not an OS id); the collector copies both onto the enclosing
  evaluate_function event, and the exporter writes them as ``args``
  ``"Sequence number"`` and ``"Fwd thread id"`` when the number is not
  negative. AccumulateGrad's number is 2**64-1, -1 as a signed integer, so
  its events have neither. With ``record_shapes`` the node's own event has
  ``"Input Dims"`` (the incoming gradients' shapes).
* Timestamps (``ts``) and durations (``dur``) are microseconds with
  nanosecond decimals; ``pid``/``tid`` are the OS ids for CPU events.
* Every CPU op has ``"External id"`` (its correlation id). A GPU activity
  (``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``; ``pid`` the device,
  ``tid`` the stream, also ``args`` ``"device"`` and ``"stream"``) has
  ``"External id"``: the id of the CPU op that was running when it was
  launched, and ``"correlation"``: the id of its runtime call
  (``cat`` ``cuda_runtime``/``cuda_driver``, e.g. ``cudaLaunchKernel``, on
  the launching thread, with the same ``"correlation"``; ``ac2g`` flow
  events join the two with the same id). A kernel is attributed to the
  backward node whose evaluate_function span, on the launching thread,
  encloses its launching op (found by External id, else by correlation).
* ``torch.profiler.profile(schedule=...)`` with ``prof.step()`` adds
  ``ProfilerStep#N`` spans (``cat`` ``user_annotation``).

``read_torch_profile(path)`` reads and decodes a trace (bounded: see
``jsonfile``) into a ``TorchTrace``; ``decode_chrome`` is the shared
decoder of Chrome traces, also used for autograd-run's own traces.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional, Union

import msgspec

from autograd_run.errors import RequestError

EVALUATE = "autograd::engine::evaluate_function: "
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
#: Categories of events the profiler records through RecordFunction (they cost profiler time when nested).
RECORDED = ("cpu_op", "user_annotation", "python_function")
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME = ("cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver")
#: The profiler's own work (Kineto's "Activity Buffer Request"), drawn on a thread of its own (pid -1).
OVERHEAD = "overhead"
_STEP = re.compile(r"ProfilerStep#(\d+)$")
#: The collectives FSDP2's hooks call inside a backward node's span (its pre-backward's all-gathers, its own and
#: prefetched ones, and the post-backward's reduce-scatter; HSDP's all-reduce): c10d's ops, seen inside one of
#: FSDP's own ``FSDP::...`` spans (torch 2.13, ``_fsdp_collectives.py``). The FSDP model of the simulation
#: (``sim.fsdp``) stands for them, so their time is not the node's; FSDP's own work around them (copy-in,
#: copy-out, the chunk copy, its Python) stays in the node's cost, which is what the model does not simulate
#: on a CPU at that size (measured: 1-1.5 ms a unit here against the bandwidth model's microseconds).
FSDP_SPAN = "FSDP::"
#: FSDP2's root final callback (torch 2.13, ``_fsdp_state.py``): queued by the root's pre-backward, run by the
#: engine after the backward's last node, outside every node's span. Its own time (its recorded ops, less the
#: collectives, which ``sim.fsdp`` models) is ``TorchTrace.final_callbacks``'.
FSDP_FINAL_CALLBACK = "FSDP::root_post_backward_callback"
FSDP_COLLECTIVES = ("c10d::_allgather_base_", "c10d::allgather_", "c10d::all_gather_into_tensor",
                    "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_", "c10d::reduce_scatter_tensor",
                    "c10d::allreduce_")


#: The bounds of an event's ``dur`` and ``ts`` (microseconds, either way from 0): a day, and about 127 years (a
#: Kineto trace's timestamps count from 1970: 1.7e15 us in 2024). Past them a node's cost in nanoseconds, or
#: the sum of a few, does not fit the simulation's 64-bit integers (a 1e15 us span was an OverflowError
#: traceback); ``read_profile`` holds ``draw``'s and ``diff``'s node slices to the same bounds.
MAX_EVENT_DUR_US = 86_400e6
MAX_EVENT_TS_US = 4e15
_EVENT_LIMITS = {"dur": (MAX_EVENT_DUR_US, "a day"), "ts": (MAX_EVENT_TS_US, "about 127 years")}


class ChromeEvent(msgspec.Struct):
    """One event of a Chrome trace (only the fields read here; others are ignored)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    #: NaN where the event has none (``decode_chrome`` refuses a complete event without either).
    ts: Annotated[float, msgspec.Meta(ge=-MAX_EVENT_TS_US, le=MAX_EVENT_TS_US)] = math.nan
    dur: Annotated[float, msgspec.Meta(ge=-MAX_EVENT_DUR_US, le=MAX_EVENT_DUR_US)] = math.nan
    args: dict[str, Any] = {}


class ChromeDoc(msgspec.Struct):
    """A trace document's top level, or (``format`` set) an autograd-run graph file given in its place."""

    format: Optional[str] = None
    traceEvents: Optional[list[ChromeEvent]] = None
    deviceProperties: Optional[list[Any]] = None
    #: Set in autograd-run's own Kineto traces (``traces.kineto``): what tells them from PyTorch's.
    autogradRun: Optional[dict[str, Any]] = None


_DECODER = msgspec.json.Decoder(Union[ChromeDoc, list[ChromeEvent]])


def is_protobuf_trace(data: bytes, path: str = "") -> bool:
    """Whether ``data`` (not JSON) is a Perfetto protobuf trace (``run --trace FILE.pftrace``): its name says
    so, or it starts as a ``Trace`` does (field 1, ``packet``, length-delimited: byte 0x0a)."""
    from autograd_run.traces.trace_file import PROTO_SUFFIXES
    return path.lower().endswith(PROTO_SUFFIXES) or data[:1] == b"\x0a"


def decode_chrome(data: bytes, path: str, option: str) -> ChromeDoc:
    """A Chrome trace's top level (a bare event list becomes ``ChromeDoc(traceEvents=...)``)."""
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise RequestError(f"{path}: {_out_of_bounds(data, str(exc)) or f'not a trace this can read: {exc}'}",
                           option) from None
    except msgspec.DecodeError as exc:
        if not data.strip():  # (a lone newline starts as a protobuf Trace does)
            raise RequestError(f"{path}: the file is empty", option) from None
        if is_protobuf_trace(data, path):
            raise RequestError(f"{path}: a Perfetto protobuf trace; this reads JSON traces (`run --trace FILE.json`, "
                               "or .json.gz)", option) from None
        raise RequestError(f"{path}: not valid JSON: {exc}", option) from None
    except RecursionError:
        raise RequestError(f"{path}: JSON nested too deeply", option) from None
    if isinstance(doc, list):
        doc = ChromeDoc(traceEvents=doc)
    for i, e in enumerate(doc.traceEvents or ()):
        if e.ph == "X" and not (e.ts == e.ts and e.dur >= 0):  # (NaN: not given)
            where = f"$.traceEvents[{i}]" if data.lstrip()[:1] == b"{" else f"$[{i}]"
            got = "none" if e.dur != e.dur else f"{e.dur:g}"
            what = (f"a complete event ('ph': 'X') needs its start ('ts'), got none" if e.ts != e.ts else
                    f"a complete event ('ph': 'X') needs a duration ('dur') of at least 0 microseconds, got {got}")
            raise RequestError(f"{path}: at {where} ({e.name[:80]!r}): {what}", option)
    return doc


_BOUND_ERROR = re.compile(r"(?:Expected `float` [<>]= \S+|Number out of range) - at `(\$(?:\.traceEvents)?\[(\d+)\])"
                          r"\.(ts|dur)`$")


def _out_of_bounds(data: bytes, problem: str) -> str | None:
    """``decode_chrome``'s problem as a sentence when it is an event's ``ts`` or ``dur`` past its bound
    (``MAX_EVENT_TS_US``, ``MAX_EVENT_DUR_US``): the event's place, name and value; else None."""
    m = _BOUND_ERROR.match(problem)
    if m is None:
        return None
    where, index, key = m.group(1), int(m.group(2)), m.group(3)
    limit, what = _EVENT_LIMITS[key]
    name = value = None
    try:  # the event as it is, for its name and value (the error path only)
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError:  # a number past a double (1e400) stops msgspec: Python's reads it as inf
            import json
            doc = json.loads(data)
        event = (doc["traceEvents"] if isinstance(doc, dict) else doc)[index]
        name, value = event.get("name"), event.get(key)
    except (ValueError, RecursionError, LookupError, TypeError, AttributeError):  # (DecodeError is a ValueError)
        pass
    title = f" ({name[:80]!r})" if isinstance(name, str) else ""
    got = (f"{value:g}" if isinstance(value, float) and math.isfinite(value) else repr(value)
           if isinstance(value, int) and abs(value) < 10**24 else "a number out of range")
    return (f"{where}{title}: an event's '{key}' must be a number of microseconds from {-limit:g} to {limit:g} "
            f"({what} either way), got {got}")


@dataclass(slots=True, eq=False)
class BackwardEvent:
    """One backward node run, as the profiler saw it (its evaluate_function span)."""

    #: The node's name (``MulBackward0``, ``torch::autograd::AccumulateGrad``).
    name: str
    seq: int | None
    fwd_tid: int | None
    #: (pid, tid) of the thread that ran it, as the trace spells them.
    thread: tuple
    start_ns: int
    dur_ns: int
    #: Profiler events recorded inside the span (the node's own and each op's): each costs profiler time.
    nested: int = 0
    #: ``"Input Dims"`` of the node's own event (``record_shapes=True``), else None.
    shapes: list | None = None
    #: Kernel (and copy) time launched inside the span, by stream (``cuda:D/sS``), ns.
    gpu_ns: dict[str, int] = field(default_factory=dict)
    #: The profiler's own work inside the span (``overhead`` events: its activity buffers), ns.
    overhead_ns: int = 0
    #: The span's time outside its direct children (the engine's work around the node's ops, and the
    #: profiler's own per recorded event), ns.
    own_ns: int = 0
    #: FSDP2's collectives run inside the span by its hooks (``FSDP_COLLECTIVES`` inside an ``FSDP::`` span),
    #: ns, and the recorded events inside them: what ``simulate --fsdp`` models itself, so not the node's cost.
    fsdp_ns: int = 0
    fsdp_events: int = 0

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns

    @property
    def is_leaf(self) -> bool:
        return self.seq is None and self.name.endswith(ACCUMULATE_GRAD)


@dataclass(slots=True)
class ProfilerStep:
    label: str
    start_ns: int
    end_ns: int


@dataclass
class TorchTrace:
    path: str
    #: Backward node runs, by start time.
    events: list[BackwardEvent]
    #: ``ProfilerStep#N`` spans, by start time (empty without a profiler schedule).
    steps: list[ProfilerStep]
    #: GPU activities seen, and how many were launched inside a backward node.
    gpu_activities: int = 0
    gpu_attributed: int = 0
    #: GPU names from ``deviceProperties``.
    gpus: list[str] = field(default_factory=list)
    #: Top-level CPU ops and annotations outside every backward node (the forward, the optimizer, data loading):
    #: not used for costs.
    outside_ops: int = 0
    #: FSDP2's root final callbacks (``FSDP_FINAL_CALLBACK``), by start: (start ns, its own ns: the time its
    #: recorded ops cover, its collectives left out: ``_final_callbacks``).
    final_callbacks: list[tuple[int, int]] = field(default_factory=list)


def _ns(us: float) -> int:
    return int(us * 1000.0 + 0.5)  # µs (ns decimals) -> ns; times are never negative


def _int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit() and len(v) < 24:
        return int(v)
    return None


def is_torch_profile(doc: ChromeDoc) -> bool:
    return any(e.name.startswith(EVALUATE) for e in doc.traceEvents or ())


def parse_torch_profile(doc: ChromeDoc, path: str, option: str = "costs") -> TorchTrace:
    """The backward node runs of a decoded PyTorch profiler trace, with their GPU time joined in."""
    per_thread: dict[tuple, list] = {}   # thread -> recorded CPU events (start, end, name, args)
    ext_at: dict[int, tuple] = {}        # External id of a CPU op -> (thread, ts)
    runtime_at: dict[int, tuple] = {}    # correlation of a runtime call -> (thread, ts)
    gpu: list[ChromeEvent] = []
    overheads: list[tuple[int, int]] = []  # (start, end) of the profiler's own work
    runtime_starts: dict[tuple, list] = {}  # thread -> starts of its runtime calls
    steps: list[ProfilerStep] = []
    for e in doc.traceEvents or ():
        if e.ph != "X":  # complete events (decode_chrome has checked their times)
            continue
        cat = e.cat
        if cat in RECORDED:
            thread = (e.pid, e.tid)
            start = _ns(e.ts)
            per_thread.setdefault(thread, []).append((start, start + _ns(e.dur), e.name, e.args))
            ext = _int(e.args.get("External id"))
            if ext is not None and cat == "cpu_op":
                ext_at[ext] = (thread, start)
            if cat == "user_annotation":
                m = _STEP.match(e.name)
                if m:
                    steps.append(ProfilerStep(e.name, start, start + _ns(e.dur)))
        elif cat in GPU:
            if e.ts == 0:
                raise RequestError(f"{path}: GPU activity {e.name[:80]!r} has no time (ts 0): PyTorch writes a "
                                   "session's GPU activities so when its trace is exported after a later profiler "
                                   "session has started; export each session's trace as it ends", option)
            gpu.append(e)
        elif cat in RUNTIME:
            corr = _int(e.args.get("correlation"))
            if corr is not None:
                runtime_at[corr] = ((e.pid, e.tid), _ns(e.ts))
            runtime_starts.setdefault((e.pid, e.tid), []).append(_ns(e.ts))
        elif cat == OVERHEAD:
            start = _ns(e.ts)
            overheads.append((start, start + _ns(e.dur)))
    events: list[BackwardEvent] = []
    by_thread: dict[tuple, list[BackwardEvent]] = {}
    outside = 0
    finals: list[tuple[int, int]] = []
    for thread, evs in per_thread.items():
        evs.sort(key=lambda r: (r[0], -r[1]))
        outside += _outside_ops(evs)
        finals += _final_callbacks(evs)
        mine = []
        for i, (start, end, name, args) in enumerate(evs):
            if not name.startswith(EVALUATE):
                continue
            node = name[len(EVALUATE):]
            nested, shapes = 0, None
            child_ns, child_end = 0, -1  # time covered by the span's direct children
            fsdp_ns, fsdp_end, fsdp_events = 0, -1, 0  # FSDP's collectives (FSDP_COLLECTIVES), their union
            in_fsdp = -1  # the end of the FSDP:: spans seen so far
            j = i + 1
            while j < len(evs) and evs[j][0] <= end:
                if evs[j][1] <= end:
                    nested += 1
                    if evs[j][0] >= child_end:
                        child_ns += evs[j][1] - evs[j][0]
                        child_end = evs[j][1]
                    if evs[j][0] < fsdp_end:
                        fsdp_events += 1
                    elif evs[j][2].startswith(FSDP_SPAN):
                        in_fsdp = max(in_fsdp, evs[j][1])
                    elif evs[j][0] < in_fsdp and evs[j][2].startswith(FSDP_COLLECTIVES):
                        fsdp_ns += evs[j][1] - evs[j][0]
                        fsdp_end = evs[j][1]
                        fsdp_events += 1
                    if shapes is None and evs[j][2] == node:
                        own = evs[j][3]
                        shapes = own.get("Input Dims")
                        if "Sequence number" not in args:  # the collector did not copy them: take the node's own
                            args = {**args, **{k: own[k] for k in ("Sequence number", "Fwd thread id") if k in own}}
                j += 1
            seq = _int(args.get("Sequence number"))
            for key in ("Sequence number", "Fwd thread id"):  # present but not a number: not PyTorch's writing
                if args.get(key) is not None and _int(args[key]) is None:
                    raise RequestError(f"{path}: the event {name[:80]!r} at {start / 1e3:g} us: {key!r} must be an "
                                       f"integer, got {str(args[key])[:40]!r}", option)
            ev = BackwardEvent(node, seq if seq is not None and seq >= 0 else None,
                               _int(args.get("Fwd thread id")), thread, start, end - start, nested,
                               shapes if isinstance(shapes, list) else None)
            ev.own_ns = end - start - child_ns
            ev.fsdp_ns, ev.fsdp_events = fsdp_ns, fsdp_events
            mine.append(ev)
            events.append(ev)
        if mine:
            by_thread[thread] = mine
    attributed = 0
    starts = {t: [ev.start_ns for ev in evs] for t, evs in by_thread.items()}
    for k in gpu:
        loc = None
        ext = _int(k.args.get("External id"))
        if ext is not None:
            loc = ext_at.get(ext)
        if loc is None:
            corr = _int(k.args.get("correlation"))
            if corr is not None:
                loc = runtime_at.get(corr)
        owner = _enclosing(by_thread, starts, loc) if loc is not None else None
        if owner is None:
            continue
        device = _int(k.args.get("device"))
        stream = _int(k.args.get("stream"))
        key = f"cuda:{device if device is not None else k.pid}/s{stream if stream is not None else k.tid}"
        owner.gpu_ns[key] = owner.gpu_ns.get(key, 0) + _ns(k.dur)
        attributed += 1
    _charge_overheads(by_thread, starts, overheads, runtime_starts)
    events.sort(key=lambda ev: ev.start_ns)
    steps.sort(key=lambda s: s.start_ns)
    gpus = [str(d.get("name")) for d in doc.deviceProperties or () if isinstance(d, dict) and d.get("name")]
    return TorchTrace(path, events, steps, len(gpu), attributed, gpus, outside, sorted(finals))


def _final_callbacks(evs: list) -> list[tuple[int, int]]:
    """(start, own ns) of each FSDP root final callback among one thread's events (sorted by start, longer
    first): the time its recorded ops cover (their union), FSDP's collectives and what runs inside them left
    out. Not its span less the collectives: on gloo a reduce-scatter is launched in a short c10d op and waited
    for after it, in a gap where nothing is recorded (4.9 ms of a 6.2 ms callback, seen on the oracle's
    transformer), which the FSDP model simulates as the collective; FSDP's own ``FSDP::`` annotations span
    both and are not counted either. (Python's time between the ops is not recorded, so not counted.)"""
    out = []
    for i, (start, end, name, _) in enumerate(evs):
        if name != FSDP_FINAL_CALLBACK:
            continue
        busy, covered, skip_to = 0, start, -1
        j = i + 1
        while j < len(evs) and evs[j][0] <= end:
            s, e, n, _ = evs[j]
            j += 1
            if e > end or s < skip_to or n.startswith(FSDP_SPAN):
                continue
            if n.startswith(FSDP_COLLECTIVES):
                skip_to = e  # (and what it calls)
                covered = max(covered, e)
                continue
            if e > covered:
                busy += e - max(s, covered)
                covered = e
        out.append((start, busy))
    return out


def _outside_ops(evs: list) -> int:
    """How many of one thread's events (sorted by start, longer first) are top-level work outside the backward.

    Python frames (``with_stack``) and ``ProfilerStep#N`` spans enclose everything and are passed over; an
    event inside another top-level event is part of it."""
    top_end = -1
    count = 0
    for start, end, name, args in evs:
        if start < top_end or _STEP.match(name) or args.get("Python id") is not None:
            continue
        top_end = end
        if not name.startswith(EVALUATE):
            count += 1
    return count


def _enclosing(by_thread: dict, starts: dict, loc: tuple) -> BackwardEvent | None:
    """The innermost backward event on ``loc``'s thread whose span holds ``loc``'s time."""
    thread, ts = loc
    evs = by_thread.get(thread)
    if not evs:
        return None
    i = bisect.bisect_right(starts[thread], ts) - 1
    for j in range(i, max(-1, i - 64), -1):  # nested spans (reentrant backward) start before: look back a little
        if evs[j].start_ns <= ts <= evs[j].end_ns:
            return evs[j]
    return None


def _charge_overheads(by_thread: dict, starts: dict, overheads: list, runtime_starts: dict) -> None:
    """Note each stretch of the profiler's own work in the innermost node span that holds it.

    The trace draws it apart (pid -1), but it ran inline on the thread that needed a buffer: the one of
    the spans holding it whose next runtime call comes soonest after it (the call that was held up)."""
    for calls in runtime_starts.values():
        calls.sort()
    for lo, hi in overheads:
        best = None
        for thread in by_thread:
            ev = _enclosing(by_thread, starts, (thread, lo))
            if ev is None or ev.end_ns < hi:
                continue
            calls = runtime_starts.get(thread, [])
            i = bisect.bisect_left(calls, hi)
            after = calls[i] - hi if i < len(calls) else 1 << 62
            if best is None or after < best[0]:
                best = (after, ev)
        if best is not None:
            best[1].overhead_ns += hi - lo


def event_cost_in(events: list[BackwardEvent]) -> float | None:
    """The profiler's own time per recorded event that these spans show, in us (None when they cannot tell).

    A span's time outside its direct children is the engine's fixed work around the node plus the profiler's
    cost for each event recorded inside it, so it grows with the number of nested events: the slope of the
    median per count (Theil-Sen: the median of the pairwise slopes; at least 3 counts with 3 spans each)."""
    import statistics
    by: dict[int, list[int]] = {}
    for e in events:
        if e.nested and not e.fsdp_ns:  # FSDP's collectives inside would be read as the profiler's time
            by.setdefault(e.nested, []).append(e.own_ns)
    med = {n: statistics.median(v) for n, v in by.items() if len(v) >= 3}
    xs = sorted(med)
    if len(xs) < 3:
        return None
    slopes = [(med[b] - med[a]) / (b - a) for i, a in enumerate(xs) for b in xs[i + 1:]]
    return max(0.0, statistics.median(slopes)) / 1e3


def merge_traces(traces: list[TorchTrace]) -> TorchTrace:
    """Several profiler sessions of one process as one trace (their clocks are the same)."""
    events = sorted((e for t in traces for e in t.events), key=lambda e: e.start_ns)
    steps = sorted((s for t in traces for s in t.steps), key=lambda s: s.start_ns)
    path = traces[0].path if len(traces) == 1 else f"{len(traces)} profiler sessions"
    gpus = list(dict.fromkeys(g for t in traces for g in t.gpus))
    return TorchTrace(path, events, steps, sum(t.gpu_activities for t in traces),
                      sum(t.gpu_attributed for t in traces), gpus, sum(t.outside_ops for t in traces))


def read_torch_profile(path: str, option: str = "costs", max_bytes: int | None = None) -> TorchTrace:
    """Read ``path`` (plain or gzipped JSON) as a PyTorch profiler trace."""
    from autograd_run.traces.jsonfile import MAX_TRACE_BYTES, read_bounded
    doc = decode_chrome(read_bounded(path, option, max_bytes or MAX_TRACE_BYTES), path, option)
    if not is_torch_profile(doc):
        raise RequestError(f"{path}: not a PyTorch profiler trace (no autograd::engine::evaluate_function events)",
                           option)
    return parse_torch_profile(doc, path, option)
