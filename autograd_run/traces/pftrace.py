"""Perfetto's native protobuf trace (``.pftrace``): what ``traces.chrome`` shows, in ~5x fewer bytes.

The same process, threads (same names and order), node slices (titled
``<id> <name>``, category ``node``, the same arguments as debug annotations:
``debug.seq`` ... ``debug.input_shapes``, ``debug.pass``,
``debug.critical_path``, ``debug.graph_root``; ``depth``, ``graph_task``,
``stream`` and ``pass`` left out where 0, ``device`` where ``cpu``, ``id``
where the title says it, as there), queue waits (process-scoped tracks
named ``queue wait <queue>``, ``debug.id`` the node's; waits that overlap go
on separate tracks of that name), counters (``<queue> queued`` per queue,
``outstanding tasks``), idle and lock-wait slices, error, NaN and sync
instants and sync flows as the JSON trace, as ``TracePacket``s of
``TrackEvent``s on one packet sequence:

* every timestamp is a delta from the previous packet's (a sequence-scoped
  incremental clock, id 64, whose first event is at 1 µs as in the JSON
  trace), so most take three bytes;
* event names, categories, argument names and the repeated string values
  (devices) are interned once; the caller's thread is the default track;
* counter samples ride on the slice events at the same instant
  (``extra_counter_values``) where there is one: a wait's start carries its
  queue's size and the outstanding count after the push, its end the queue
  size after the pop, a node slice's end the outstanding count.

Packets are written in time order (ends before starts at one instant, inner
slices inside outer ones), formatted from the Recording's columns by
``traces.encode.fill`` and streamed to the file in chunks. A stopped run's
trace ends with an instant event ``run REASON: the trace is incomplete``
(category ``incomplete``) on a global track ``incomplete``: protobuf traces
have no ``otherData``.
"""

from __future__ import annotations

import heapq

import numpy as np

from autograd_run.engine.threads import ThreadKind
from autograd_run.outputs import atomic_writer
from autograd_run.traces import encode as E
from autograd_run.traces.layout import (
    FIRST_TID, PID, absent_if_zero, kernel_args, launchers, node_tables, node_title, outstanding_changes,
    process_name, slice_marks, trace_ranks,
)
from autograd_run.record.recording import Recording

CLOCK_ID = 64          # sequence-scoped, incremental
BOOTTIME = 6
SEQ = 1                # trusted_packet_sequence_id
PROCESS_UUID = 1
KERNEL_PROCESS_UUID = 2
OUTSTANDING_UUID = 3
INCOMPLETE_UUID = 1 << 35  # the global track of a stopped run's mark
COUNTER_UUID0 = 1 << 34  # + k: the recording's added counter tracks (Recording.counters)
TRACK_UUID0 = 4        # + k: queue counters (k = queue index), then wait lanes (_track_uuid)
THREAD_UUID0 = 100     # + trace tid
KERNEL_UUID0 = 1 << 36  # + stream number

# TrackEvent types
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
# debug annotation names (interned ids)
ARG_NAMES = ("id", "seq", "depth", "graph_task", "device", "stream", "input_shapes", "queue",
             "producer", "consumer", "detail", "pass", "critical_path", "graph_root")
ARG = {name: k + 1 for k, name in enumerate(ARG_NAMES)}
CATEGORIES = ("node", "queue_wait", "lock_wait", "idle", "wait", "error", "nan", "sync", "kernel", "incomplete")
CAT = {name: k + 1 for k, name in enumerate(CATEGORIES)}


# -- protobuf, by hand ----------------------------------------------------------------------

def _key(field: int, wire: int) -> bytes:
    return E.varint(field << 3 | wire)


def pb_varint(field: int, v: int) -> bytes:
    return _key(field, 0) + E.varint(v)


def pb_bytes(field: int, data: bytes | str) -> bytes:
    if isinstance(data, str):
        data = data.encode("utf-8", "replace")
    return _key(field, 2) + E.varint(len(data)) + data


def pb_fixed64(field: int, v: int) -> bytes:
    return _key(field, 1) + (v & ((1 << 64) - 1)).to_bytes(8, "little")


def packet(*fields: bytes) -> bytes:
    """A ``Trace.packet`` (field 1) of the given TracePacket fields, on the sequence."""
    return pb_bytes(1, pb_varint(10, SEQ) + b"".join(fields))


def annotation(name: str, value) -> bytes:
    """A DebugAnnotation (TrackEvent field 4) of a str, int, float or a (nested) list."""
    return pb_bytes(4, pb_varint(1, ARG[name]) + _value(value))


def _value(value) -> bytes:
    if isinstance(value, bool):
        return pb_varint(2, int(value))
    if isinstance(value, int):
        return pb_varint(4, value) if value < 2**63 else pb_varint(3, value)
    if isinstance(value, float):
        return _key(5, 1) + np.float64(value).tobytes()
    if isinstance(value, (list, tuple)):
        return b"".join(pb_bytes(12, _value(v)) for v in value)
    return pb_bytes(6, "" if value is None else str(value))


def track_event(kind: int, *, track: int | None = None, name: str | None = None, category: str | None = None,
                args: dict | None = None, extra: bytes = b"") -> bytes:
    """TracePacket field 11 (TrackEvent), for the rarer events written one by one."""
    body = pb_varint(9, kind)
    if track is not None:
        body += pb_varint(11, track)
    if category is not None:
        body += pb_varint(3, CAT[category])
    if name is not None:
        body += pb_bytes(23, name)
    for k, v in (args or {}).items():
        body += annotation(k, v)
    return pb_bytes(11, body + extra)


# -- the bulk events' templates (traces.encode) ---------------------------------------------------------

# columns of the sorted packet rows
(C_TS, C_TRACK, C_NODE, C_DEPTH, C_GT, C_SEQ, C_DEV, C_STREAM, C_SHAPE, C_SAME, C_FLOWS, C_UUID_A, C_VAL_A,
 C_UUID_B, C_VAL_B, C_BLOB, C_NAME, C_ID_ARG, C_PASS, C_CRIT, C_ROOT) = range(21)
# tables
T_IDS, T_NAMES, T_SHAPES, T_BLOBS, T_FLOWS = range(5)
NODE_B, NODE_E, WAIT_B, WAIT_E, COUNT, BLOB = range(6)

_LITS = [pb_varint(10, SEQ),                       # 0 the sequence
         pb_varint(9, BEGIN), pb_varint(9, END),   # 1, 2
         pb_varint(9, COUNTER),                    # 3
         pb_varint(3, CAT["node"]),                # 4
         pb_varint(3, CAT["queue_wait"]),          # 5
         b" ",                                     # 6
         pb_varint(1, ARG["id"]), pb_varint(1, ARG["seq"]),  # 7, 8
         pb_varint(1, ARG["depth"]), pb_varint(1, ARG["graph_task"]), pb_varint(1, ARG["device"]),  # 9-11
         pb_varint(1, ARG["stream"]), pb_varint(1, ARG["pass"]),  # 12, 13
         pb_varint(1, ARG["critical_path"]), pb_varint(1, ARG["graph_root"]), pb_varint(2, 1)]  # 14, 15, 16 (true)


def _templates() -> list[np.ndarray]:
    L, V, S, B, N, R, K = E.LIT, E.PB_VARINT, E.PB_STR, E.PB_BEGIN, E.PB_END, E.RAW, E.SKIPNEG

    def head(kind_lit):
        return [(B, 1), (E.PB_DELTA, 8, C_TS), (L, 0), (B, 11), (L, kind_lit)]

    def track():
        return [(K, C_TRACK, 1), (V, 11, C_TRACK)]

    def extra(uuid, val):
        return [(K, val, 2), (V, 31, uuid), (V, 12, val)]
    node_b = head(1) + track() + [
        (L, 4), (B, 23), (K, C_SAME, 2), (E.RAW, T_IDS, C_NODE), (L, 6), (E.RAW, T_NAMES, C_NODE), (N,),
        (K, C_ID_ARG, 4), (B, 4), (L, 7), (S, 6, T_IDS, C_NODE), (N,),
        (B, 4), (L, 8), (V, 3, C_SEQ), (N,),
        (K, C_DEPTH, 4), (B, 4), (L, 9), (V, 4, C_DEPTH), (N,),
        (K, C_GT, 4), (B, 4), (L, 10), (V, 4, C_GT), (N,),
        (K, C_DEV, 4), (B, 4), (L, 11), (V, 17, C_DEV), (N,),
        (K, C_STREAM, 4), (B, 4), (L, 12), (V, 4, C_STREAM), (N,),
        (K, C_PASS, 4), (B, 4), (L, 13), (V, 4, C_PASS), (N,),
        (K, C_CRIT, 4), (B, 4), (L, 14), (L, 16), (N,),
        (K, C_ROOT, 4), (B, 4), (L, 15), (L, 16), (N,),
        (R, T_SHAPES, C_SHAPE), (K, C_FLOWS, 1), (R, T_FLOWS, C_FLOWS), (N,), (N,)]
    node_e = head(2) + track() + extra(C_UUID_A, C_VAL_A) + [(N,), (N,)]
    wait_b = head(1) + [(V, 11, C_TRACK), (V, 10, C_NAME), (L, 5),
                        (B, 4), (L, 7), (S, 6, T_IDS, C_NODE), (N,),
                        (K, C_GT, 4), (B, 4), (L, 10), (V, 4, C_GT), (N,)] + \
        extra(C_UUID_A, C_VAL_A) + extra(C_UUID_B, C_VAL_B) + [(N,), (N,)]
    wait_e = head(2) + [(V, 11, C_TRACK)] + extra(C_UUID_A, C_VAL_A) + [(N,), (N,)]
    count = head(3) + [(V, 11, C_UUID_A), (V, 30, C_VAL_A), (N,), (N,)]
    blob = [(B, 1), (E.PB_DELTA, 8, C_TS), (L, 0), (R, T_BLOBS, C_BLOB), (N,)]
    return [E.template(*t) for t in (node_b, node_e, wait_b, wait_e, count, blob)]


TEMPLATES = _templates()

#: Packets formatted per ``fill`` call.
CHUNK = 1 << 16


def _lanes(pushed: np.ndarray, popped: np.ndarray, queue: np.ndarray) -> np.ndarray:
    """A lane per wait so that waits on one lane (of one queue) never overlap: the lowest free one. A wait
    that ends when another starts frees its lane for it, unless it also started then (an empty wait)."""
    lane = np.zeros(len(pushed), dtype=np.int64)
    for q in np.unique(queue).tolist():
        idx = np.nonzero(queue == q)[0]
        order = idx[np.lexsort((idx, pushed[idx]))]
        start = 2 * pushed[order]
        end = 2 * popped[order] + (popped[order] == pushed[order])  # an empty wait holds its instant
        if len(order) < 2 or (start[1:] >= np.maximum.accumulate(end)[:-1]).all():
            continue  # one at a time: all on lane 0
        free: list[int] = []
        busy: list[tuple[int, int]] = []  # (end, lane)
        lanes = 0
        for k, a, b in zip(order.tolist(), start.tolist(), end.tolist()):
            while busy and busy[0][0] <= a:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                n = heapq.heappop(free)
            else:
                n, lanes = lanes, lanes + 1
            lane[k] = n
            heapq.heappush(busy, (b, n))
    return lane


class _Rows:
    """Packet rows gathered per kind (a part), sorted by time, and gathered a chunk at a time.

    A part's columns are arrays (a value per row), ints (one for all), or functions of row positions
    (values made when a chunk needs them), so that the only arrays over all packets are the times and
    the order to write them in."""

    NAMES = ("ts", "track", "node", "depth", "gt", "seq", "dev", "stream", "shape", "same", "flows", "uuid_a",
             "val_a", "uuid_b", "val_b", "blob", "name", "id_arg", "pass_", "crit", "root")  # C_*, in order

    def __init__(self):
        self.parts: list[tuple[int, int, dict]] = []  # (kind, rows, columns)

    def add(self, kind: int, ts: np.ndarray, prio, tie=0, **cols) -> None:
        """Rows of ``kind`` at times ``ts``; at one instant they sort by ``prio`` (ends 0, counters 1, starts
        2, instants 3, ends of waits that began at that instant 4), then ``tie`` (an end: minus its start,
        inner first; a start: minus its end, outer first), then as added."""
        if len(ts):
            self.parts.append((kind, len(ts), {"ts": ts, "prio": prio, "tie": tie, **cols}))

    def _locate(self, rows: np.ndarray, offsets: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(part, positions in ``rows``, rows within the part) for each part ``rows`` holds."""
        pid = np.searchsorted(offsets, rows, side="right") - 1
        out = []
        for p in np.unique(pid).tolist():
            at = np.nonzero(pid == p)[0]
            out.append((p, at, rows[at] - offsets[p]))
        return out

    @staticmethod
    def _values(spec, local: np.ndarray):
        if spec is None:
            return -1
        if isinstance(spec, (int, np.integer)):
            return spec
        if callable(spec):
            return spec(local)
        return spec[local]

    def _gather(self, where: list, names, m: int) -> list[np.ndarray]:
        out = [np.full(m, -1, dtype=np.int64) for _ in names]
        for p, at, local in where:
            cols = self.parts[p][2]
            for o, name in zip(out, names):
                spec = cols.get(name)
                if spec is not None:
                    o[at] = self._values(spec, local)
        return out

    def chunks(self, size: int):
        """(kinds, columns) of ``size`` rows at a time, in writing order: by time, then as ``add`` says."""
        lengths = [n for _, n, _ in self.parts]
        offsets = np.cumsum([0] + lengths[:-1]).astype(np.int64)
        ts = np.concatenate([np.asarray(c["ts"], dtype=np.int64) for _, _, c in self.parts]) \
            if self.parts else np.zeros(0, dtype=np.int64)
        order = np.argsort(ts, kind="stable")  # the parts are runs already in time order, mostly
        ts = ts[order]
        same = ts[1:] == ts[:-1]
        if same.any():  # rows at one instant: by prio, then tie, then as added (lexsort is stable)
            tied = np.zeros(len(ts), dtype=bool)
            tied[1:] = same
            tied[:-1] |= same
            pos = np.nonzero(tied)[0]
            rows = order[pos]
            prio, tie = self._gather(self._locate(rows, offsets), ("prio", "tie"), len(rows))
            order[pos] = rows[np.lexsort((tie, prio, ts[pos]))]
        del ts, same
        kinds = np.array([k for k, _, _ in self.parts], dtype=np.int64)
        for a in range(0, len(order), size):
            rows = order[a:a + size]
            where = self._locate(rows, offsets)
            kind = np.empty(len(rows), dtype=np.int64)
            for p, at, _ in where:
                kind[at] = kinds[p]
            yield kind, self._gather(where, self.NAMES, len(rows))


def _track_uuid(k: int) -> int:
    """The uuid of the ``k``-th queue counter or wait track: one varint byte for the first 96."""
    return TRACK_UUID0 + k if k < 96 else (1 << 20) + k


def _rows_of(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]`` where a row is >= 0 (-1 elsewhere, and everywhere when there are no values: a
    recording with waits but no queue samples, such as a simulation made without ``detail``)."""
    if len(values) == 0:
        return np.full(len(rows), -1, dtype=np.int64)
    return values[np.maximum(rows, 0)]


def pftrace_chunks(rec: Recording, incomplete: str | None = None):
    """The protobuf trace of ``rec`` as a sequence of bytes chunks; a stopped run's (``incomplete``:
    ``interrupted``, ``timeout``) ends with an instant event saying so, on a global track ``incomplete``."""
    tid_of, tid_column = trace_ranks(rec)
    t0 = rec.start
    c = rec.columns()
    info = node_tables(c)
    names = info["names"]
    # interned strings: devices (string values, iid = code + 1), wait names (event names); a device of
    # -1 (the default, left out) stays -1
    dev_by_node = np.where(info["device"] >= 0, info["device"] + 1, -1)
    seq_by_node = info["seq"].view(np.int64)
    wait_names = [f"queue wait {q}" for q in c.queues]
    queue_uuid = np.array([_track_uuid(q) for q in range(len(c.queues))] or [0], dtype=np.int64)

    head = _header(rec, tid_of, c, info["devices"], wait_names)
    S, W, Q, I = c.slices, c.waits, c.samples, c.idles
    rows = _Rows()
    blobs: list[bytes] = []

    # node slices: begins and ends on their threads (the caller's is the default track)
    os_tids = np.unique(S.tid)
    tracks = np.array([-1 if tid_of(t) == FIRST_TID else THREAD_UUID0 + tid_of(t) for t in os_tids.tolist()],
                      dtype=np.int64)

    def track(i):
        return tracks[np.searchsorted(os_tids, S.tid[i])]
    passes, critical, root = slice_marks(rec)
    flows, flow_blobs, sync_at, kernel_flows = _flows(rec, c, S, tid_of)
    s_end = np.maximum(S.end, S.start + 1)  # at least 1 ns, as in the JSON trace
    node = S.node
    rows.add(NODE_B, S.start, 2, lambda i: -s_end[i], track=track, node=node,
             depth=lambda i: absent_if_zero(S.depth[i]), gt=lambda i: absent_if_zero(S.gt[i]),
             seq=lambda i: seq_by_node[node[i]],
             dev=lambda i: dev_by_node[node[i]], stream=lambda i: absent_if_zero(info["stream"][node[i]]),
             id_arg=lambda i: info["id_arg"][node[i]],
             shape=lambda i: info["shape"][node[i]], same=lambda i: info["same"][node[i]], flows=flows,
             pass_=lambda i: absent_if_zero(passes[i]),
             crit=lambda i: np.where(critical[i], 0, -1), root=lambda i: np.where(root[i], 0, -1))
    # outstanding tasks: each change rides on the event at its instant (a node's end, a wait's start)
    o_ts, o_val, o_kind, o_index = outstanding_changes(rec, origins=True)
    end_val = np.full(len(S), -1, dtype=np.int64)
    push_val = np.full(len(Q), -1, dtype=np.int64)
    on_end = o_kind == 1
    at_end = o_index * on_end
    on_end &= S.end[at_end] > S.start[at_end]  # not a slice widened to 1 ns: its end is not the change's time
    del at_end
    end_val[o_index[on_end]] = o_val[on_end]
    on_push = o_kind == 0
    push_val[o_index[on_push]] = o_val[on_push]
    alone = ~on_end
    del on_end
    rows.add(NODE_E, s_end, 0, lambda i: -S.start[i], track=track, uuid_a=OUTSTANDING_UUID, val_a=end_val)
    # queue waits on lanes; their queue samples ride on them
    carried = np.zeros(len(Q), dtype=bool)
    if len(W):
        lane = _lanes(W.pushed, W.popped, W.queue)
        keys = (W.queue << 32) + lane  # a track per (queue, lane)
        distinct_keys, lane_k = np.unique(keys, return_inverse=True)
        del keys, lane
        lane_uuid = np.array([_track_uuid(len(c.queues) + k) for k in range(len(distinct_keys))], dtype=np.int64)
        for k, key in enumerate(distinct_keys.tolist()):
            head += packet(pb_bytes(60, pb_varint(1, int(lane_uuid[k])) + pb_varint(5, PROCESS_UUID) +
                                    pb_bytes(2, wait_names[key >> 32])))
        wait_track = lane_uuid[lane_k.reshape(-1)]
        del lane_k
        push_row, pop_row = W.push_row, W.pop_row
        has_push, has_pop = push_row >= 0, pop_row >= 0
        qa = np.where(has_push, _rows_of(Q.depth, push_row), -1)
        ob = np.where(has_push, _rows_of(push_val, push_row), -1)
        carried[push_row[has_push]] = True
        carried[pop_row[has_pop]] = True
        # an outstanding change at a push that carries it need not stand alone
        pushed_rows = np.zeros(len(Q), dtype=bool)
        pushed_rows[push_row[has_push]] = True
        alone[on_push & pushed_rows[np.where(on_push, o_index, 0)]] = False
        del pushed_rows, has_push
        rows.add(WAIT_B, W.pushed, 2, lambda i: -W.popped[i], track=wait_track, node=W.node,
                 gt=lambda i: absent_if_zero(W.gt[i]),
                 name=lambda i: W.queue[i] + 1,
                 uuid_a=lambda i: queue_uuid[W.queue[i]], val_a=qa, uuid_b=OUTSTANDING_UUID, val_b=ob)
        rows.add(WAIT_E, W.popped, lambda i: np.where(W.popped[i] > W.pushed[i], 0, 4), lambda i: -W.pushed[i],
                 track=wait_track, uuid_a=lambda i: queue_uuid[W.queue[i]],
                 val_a=lambda i: np.where(has_pop[i], _rows_of(Q.depth, pop_row[i]), -1))
    del push_val, on_push
    # queue samples and outstanding changes with no event to ride on
    lone = np.nonzero(~carried)[0]
    del carried
    rows.add(COUNT, Q.ts[lone], 1, 0, uuid_a=queue_uuid[Q.queue[lone]], val_a=Q.depth[lone])
    lone = np.nonzero(alone)[0]
    rows.add(COUNT, o_ts[lone], 1, 0, uuid_a=OUTSTANDING_UUID, val_a=o_val[lone])
    del o_ts, o_val, o_kind, o_index, alone, lone
    for k, counter in enumerate(rec.counters):  # added counter tracks (a device's allocated bytes)
        rows.add(COUNT, np.asarray(counter.ts, dtype=np.int64), 1, 0,
                 uuid_a=np.full(len(counter.ts), COUNTER_UUID0 + k, dtype=np.int64),
                 val_a=np.asarray(counter.values, dtype=np.int64))
    # the rarer events, one by one
    rare_ts, rare_prio, rare_tie = [], [], []

    def rare(ts: int, prio: int, tie: int, body: bytes) -> None:
        rare_ts.append(ts)
        rare_prio.append(prio)
        rare_tie.append(tie)
        blobs.append(body)

    it = tid_column(I.tid)
    for t, a, b, qn, wf in zip(it.tolist(), I.start.tolist(), I.end.tolist(), I.queue.tolist(),
                               I.waiting_for.tolist()):
        waiting = wf >= 0
        tr = THREAD_UUID0 + t
        args = {"queue": c.queues[qn], **({"graph_task": wf} if waiting else {})}
        rare(a, 2, -max(b, a + 1), track_event(BEGIN, track=tr, category="wait" if waiting else "idle",
                                               name=f"waiting for graph task {wf}" if waiting else "idle",
                                               args=args))
        rare(max(b, a + 1), 0, -a, track_event(END, track=tr))
    for lw in rec.lock_waits:
        tr = THREAD_UUID0 + tid_of(lw.tid)
        a = lw.end - lw.waited
        rare(a, 2, -lw.end, track_event(BEGIN, track=tr, category="lock_wait", name=f"lock wait: {lw.lock}",
                                        args={"graph_task": lw.gt}))
        rare(lw.end, 0, -a, track_event(END, track=tr))
    for kind, items in (("error", rec.errors), ("nan", rec.nans)):
        for e in items:
            detail = e.message if kind == "error" else e.index
            rare(e.ts, 3, 0, track_event(INSTANT, track=THREAD_UUID0 + tid_of(e.tid), category=kind,
                                         name="error" if kind == "error" else "nan detected",
                                         args={"id": e.node.id if e.node is not None else None,
                                               "detail": str(detail)}))
    for sync, (start, consumer_tid) in zip(rec.syncs, sync_at):
        if start is None:
            continue
        rare(start, 3, 0, track_event(INSTANT, track=THREAD_UUID0 + consumer_tid, category="sync",
                                      name=f"sync {sync.src} -> {sync.dst}",
                                      args={"producer": sync.producer.id, "consumer": sync.consumer.id}))
    head += _kernels(rec, rare, kernel_flows)
    if incomplete:
        head += packet(pb_bytes(60, pb_varint(1, INCOMPLETE_UUID) + pb_bytes(2, "incomplete")))
        rare(rec.end, 5, 0, track_event(INSTANT, track=INCOMPLETE_UUID, category="incomplete",
                                        name=f"run {incomplete}: the trace is incomplete"))
    rows.add(BLOB, np.array(rare_ts, dtype=np.int64), np.array(rare_prio, dtype=np.int64),
             np.array(rare_tie, dtype=np.int64), blob=np.arange(len(rare_ts)))
    yield head
    tables = [info["ids"], names, [_shapes_blob(sh) for sh in info["shape_tuples"]], blobs, flow_blobs]
    prev = t0  # the clock's deltas run on from one chunk to the next
    for kinds, cols in rows.chunks(CHUNK):
        yield E.fill(TEMPLATES, kinds, cols, tables, _LITS, prev, 0, len(kinds))
        prev = int(cols[C_TS][-1])


def _flows(rec, c, S, tid_of) -> tuple[np.ndarray, list[bytes], list[tuple], dict]:
    """Syncs as flows from the producer's slice to the consumer's: per slice, the index of its flow fields
    among the returned blobs (-1: none), and per sync (consumer slice start, consumer trace tid), or
    (None, None) when a slice is missing; and collectives launched by a node (``Collective.trigger``) as
    flows from that node's slice: kernel index -> the flow id its slice ends."""
    flows = np.full(len(S), -1, dtype=np.int64)
    flow_blobs: list[bytes] = []
    out: list[tuple] = []
    launching = launchers(rec)
    if not rec.syncs and not launching:
        return flows, flow_blobs, out, {}
    wanted = {(sy.gt, n) for sy in rec.syncs for n in (sy.producer, sy.consumer)}
    where, first = {}, {}
    for k, (g, n) in enumerate(zip(S.gt.tolist(), S.node.tolist())):
        if (g, c.nodes[n]) in wanted:
            where[(g, c.nodes[n])] = k
        if c.nodes[n] in launching and c.nodes[n] not in first:
            first[c.nodes[n]] = k
    extra: dict[int, bytes] = {}
    kernel_flows: dict[int, int] = {}
    flow_id = len(rec.syncs)  # (the syncs' are 1..len(syncs), as in the JSON trace)
    for i, kern in enumerate(rec.kernels):
        p = first.get(getattr(kern.node, "trigger", None))
        if p is not None:
            flow_id += 1
            extra[p] = extra.get(p, b"") + pb_fixed64(47, flow_id)
            kernel_flows[i] = flow_id
    for flow_id, sync in enumerate(rec.syncs, 1):
        p, q = where.get((sync.gt, sync.producer)), where.get((sync.gt, sync.consumer))
        if p is None or q is None:
            out.append((None, None))
            continue
        extra[p] = extra.get(p, b"") + pb_fixed64(47, flow_id)
        extra[q] = extra.get(q, b"") + pb_fixed64(48, flow_id)
        out.append((int(S.start[q]), tid_of(int(S.tid[q]))))
    for k, data in extra.items():
        flows[k] = len(flow_blobs)
        flow_blobs.append(data)
    return flows, flow_blobs, out, kernel_flows


def _shapes_blob(shapes: tuple) -> bytes:
    return annotation("input_shapes", [list(s) for s in shapes])


def _header(rec: Recording, tid_of, c, devices: list[str], wait_names: list[str]) -> bytes:
    """The first packets: clock, defaults, interned strings (``devices``: the string values, iid = position +
    1); the process, its threads and counter tracks."""
    t0 = rec.start
    # the first event at 1 µs, as in the JSON trace
    clocks = pb_bytes(1, pb_varint(1, CLOCK_ID) + pb_varint(2, t0) + pb_varint(3, 1)) + \
        pb_bytes(1, pb_varint(1, BOOTTIME) + pb_varint(2, 1000))
    defaults = pb_varint(58, CLOCK_ID) + pb_bytes(11, pb_varint(11, THREAD_UUID0 + FIRST_TID))
    interned = b"".join(pb_bytes(1, pb_varint(1, CAT[n]) + pb_bytes(2, n)) for n in CATEGORIES)
    interned += b"".join(pb_bytes(2, pb_varint(1, k + 1) + pb_bytes(2, n)) for k, n in enumerate(wait_names))
    interned += b"".join(pb_bytes(3, pb_varint(1, ARG[n]) + pb_bytes(2, n)) for n in ARG_NAMES)
    interned += b"".join(pb_bytes(29, pb_varint(1, k + 1) + pb_bytes(2, d)) for k, d in enumerate(devices))
    out = packet(pb_varint(13, 1), pb_bytes(6, clocks), pb_bytes(59, defaults), pb_bytes(12, interned))
    process = process_name(rec)
    out += packet(pb_bytes(60, pb_varint(1, PROCESS_UUID) + pb_bytes(3, pb_varint(1, PID) + pb_bytes(6, process))))
    for rank, t in enumerate(rec.threads.values()):
        name = f"caller ({t.name})" if t.kind is ThreadKind.CALLER else t.name
        tid = tid_of(t.tid)
        out += packet(pb_bytes(60, pb_varint(1, THREAD_UUID0 + tid) + pb_varint(5, PROCESS_UUID) +
                               pb_bytes(4, pb_varint(1, PID) + pb_varint(2, tid) + pb_bytes(5, name))))
    # threads the recording did not name still get tracks (their tids ranked as they first appear)
    seen = {tid_of(t.tid) for t in rec.threads.values()}
    for os_tid in _unnamed_tids(rec, c):
        tid = tid_of(os_tid)
        if tid not in seen:
            seen.add(tid)
            out += packet(pb_bytes(60, pb_varint(1, THREAD_UUID0 + tid) + pb_varint(5, PROCESS_UUID) +
                                   pb_bytes(4, pb_varint(1, PID) + pb_varint(2, tid))))
    for q, name in enumerate(c.queues):
        out += packet(pb_bytes(60, pb_varint(1, _track_uuid(q)) + pb_varint(5, PROCESS_UUID) +
                               pb_bytes(2, f"{name} queued") + pb_bytes(8, b"")))
    out += packet(pb_bytes(60, pb_varint(1, OUTSTANDING_UUID) + pb_varint(5, PROCESS_UUID) +
                           pb_bytes(2, "outstanding tasks") + pb_bytes(8, b"")))
    for k, counter in enumerate(rec.counters):
        out += packet(pb_bytes(60, pb_varint(1, COUNTER_UUID0 + k) + pb_varint(5, PROCESS_UUID) +
                               pb_bytes(2, f"{counter.name} {counter.arg}") + pb_bytes(8, b"")))
    return out


def _unnamed_tids(rec: Recording, c) -> list[int]:
    tids = [c.slices.tid, c.waits.tid, c.idles.tid,
            np.array([x.tid for x in (*rec.lock_waits, *rec.errors, *rec.nans)], dtype=np.int64)]
    out = []
    for col in tids:
        if len(col):
            out += dict.fromkeys(col[np.r_[True, col[1:] != col[:-1]]].tolist())
    return list(dict.fromkeys(out))


def _kernels(rec: Recording, rare, kernel_flows: dict | None = None) -> bytes:
    """Simulated accelerator streams: a process of their own, a thread track per stream; a kernel in
    ``kernel_flows`` (its index -> a flow id) ends that flow (a collective's launch, ``_flows``)."""
    if not rec.kernels:
        return b""
    out = packet(pb_bytes(60, pb_varint(1, KERNEL_PROCESS_UUID) +
                          pb_bytes(3, pb_varint(1, PID + 1) + pb_bytes(6, "devices (simulated streams)"))))
    uuid = {}
    for k, name in enumerate(sorted({k.stream for k in rec.kernels}), 1):
        uuid[name] = KERNEL_UUID0 + k
        out += packet(pb_bytes(60, pb_varint(1, uuid[name]) + pb_varint(5, KERNEL_PROCESS_UUID) +
                               pb_bytes(4, pb_varint(1, PID + 1) + pb_varint(2, k) +
                                        pb_bytes(5, f"stream {name}"))))
    for i, k in enumerate(rec.kernels):
        end = max(k.end, k.start + 1)
        fid = kernel_flows.get(i) if kernel_flows else None
        rare(k.start, 2, -end, track_event(BEGIN, track=uuid[k.stream], category="kernel", name=node_title(k.node),
                                           args=kernel_args(k), extra=pb_fixed64(48, fid) if fid else b""))
        rare(end, 0, -k.start, track_event(END, track=uuid[k.stream]))
    return out


def write_pftrace(path: str, rec: Recording, incomplete: str | None = None) -> None:
    """Write the protobuf trace atomically (a temporary file renamed into place)."""
    with atomic_writer(path, "trace_path") as f:
        for chunk in pftrace_chunks(rec, incomplete):
            f.write(chunk)
