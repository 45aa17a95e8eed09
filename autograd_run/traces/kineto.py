"""Kineto trace: a Recording as the JSON that ``torch.profiler`` writes, for Holistic Trace Analysis and the
other tools that read PyTorch's own traces.

``write_kineto_trace(path, rec, ...)`` writes it (streamed, atomically; gzipped for ``.gz``);
``kineto_chunks`` is the same text as a sequence of bytes chunks. Where ``traces.chrome`` shows the
engine (queues, waits, counters), this shows what PyTorch's profiler would have seen of the same run:

* **Header.** ``distributedInfo`` first, written ``"rank": N`` with a space (HTA finds a trace's rank
  by scanning the raw text for that pattern, and takes the first match), with ``world_size`` and the
  ``backend``; ``schemaVersion`` 1, ``deviceProperties`` (one per accelerator index), ``displayTimeUnit``,
  ``baseTimeNanoseconds`` (event times are microseconds after it, as in Kineto's own files; a simulation
  starts at 0), ``traceName``; and ``autogradRun`` (``{"version": 1, "simulated": bool}``, and for a
  simulation the engine's per-node time it charged, ``engine_ns``: ``{"node": ns, "device_node": ns}``),
  the mark that tells our readers (``diff``, ``simulate --costs``) the file is ours.
* **CPU** (one process, ``CPU_PID`` plus the rank; one thread per worker, named as in the Chrome trace,
  with its stable ``worker`` label in the ``thread_name`` metadata). Per node execution one ``cpu_op``
  named ``autograd::engine::evaluate_function: <op>`` (PyTorch's name for a backward node's span), with
  ``External id``, ``Record function id``, ``Ev Idx``, ``Sequence number`` (the node's seq) and ``Input
  Dims``; and ours, under names HTA does not take for its own columns (an event's ``stream``,
  ``device`` and ``name`` arguments would become HTA's columns): ``node`` (the id), ``op``,
  ``node device``, ``graph task``, ``depth``, ``pass``, ``queue wait ns``, ``critical path`` and
  ``graph root`` (left out where 0 or false, as in the Chrome trace). Each pass (a top-level backward
  call; ``--repeat``) is a ``user_annotation`` ``ProfilerStep#N`` on its caller's thread.
* **Accelerators** (a simulation's kernels; a real run records none). One process per device index
  (pid = the index, as Kineto does), one thread per stream (tid = its Kineto stream number, unique in
  the process because HTA tells streams apart by number alone: from ``STREAM_BASE``, 7 as CUDA's default
  stream, in (device, stream) order, then the collective streams). A node's work on its stream is a ``kernel`` named as its op (so that HTA's
  kernel breakdown groups by op; the node id is its ``node`` argument), or a ``gpu_memcpy``
  ``Memcpy DtoD (Device -> Device)`` (``DtoH``/``HtoD`` to or from the host) for a copy op, launched
  by a ``cuda_runtime`` ``cudaLaunchKernel`` (``cudaMemcpyAsync``) inside its node's ``cpu_op``, the
  two joined by ``correlation`` and by an ``ac2g`` flow, the kernel carrying ``device``, ``stream``,
  ``context`` and ``queued``. The launch ends when the kernel was enqueued (the node's CPU part ended,
  or the kernel started, whichever is first) and lasts ``LAUNCH_NS`` at most (the simulation does not
  split a node's CPU time into the launch and the rest: the length is nominal).
* **Stream order.** Each event recorded on a stream is a ``cudaEventRecord``; each wait a
  ``cudaStreamWaitEvent`` and, on the waiting stream, a ``cuda_sync`` ``Stream Wait Event`` with
  ``wait_on_stream`` and ``wait_on_cuda_event_record_corr_id`` (the record's correlation): what HTA's
  critical path follows across streams.
* **Collectives** (``simulate --ddp`` / ``--fsdp``): ``ncclDevKernel_<Kind>_...`` kernels on the rank's
  communication streams with the arguments HTA reads (``Collective name``, ``In msg nelems``,
  ``Out msg nelems``, ``Group size``, ``dtype``, the process group's), each launched by a
  ``record_param_comms`` ``cpu_op`` (with a ``nccl:<kind>`` ``user_annotation`` and a
  ``cudaLaunchKernel`` inside) on a thread of its own (``COMM_THREAD``, the process group's launches),
  just before the collective starts.

A stopped run's trace ends with an instant event saying so and has ``"otherData": {"incomplete": R}``,
as the Chrome trace.
"""

from __future__ import annotations

import gzip
import json

import msgspec
import numpy as np

from autograd_run.engine.threads import ThreadKind
from autograd_run.outputs import atomic_writer
from autograd_run.record.recording import Collective, Recording
from autograd_run.traces import encode as E
from autograd_run.traces.layout import (absent_if_zero, launchers, node_tables, process_name, slice_marks,
                                        thread_tids, trace_ranks)

#: The CPU process's pid (plus the rank): above any device index, which Kineto uses as the pid of a device.
CPU_PID = 1 << 20
#: A stream's Kineto number: this plus the engine's stream id (CUDA's default stream shows as 7).
STREAM_BASE = 7
#: The longest a ``cudaLaunchKernel`` event lasts (nominal: see the module docstring).
LAUNCH_NS = 1000
#: The tid of the thread that launches the collectives (a simulation's data-parallel part).
COMM_THREAD = 1 << 16
#: The name PyTorch's profiler gives the span of a backward node.
EVALUATE = "autograd::engine::evaluate_function: "
#: The format version of the ``autogradRun`` header entry.
VERSION = 1
CHUNK = 1 << 14

# Collectives: the model's kind -> (HTA's "Collective name", the NCCL kernel's name part, the annotation).
_COLLECTIVES = {"all_reduce": ("allreduce", "AllReduce_Sum", "nccl:all_reduce"),
                "all_gather": ("allgather", "AllGather", "nccl:_all_gather_base"),
                "reduce_scatter": ("reduce_scatter", "ReduceScatter_Sum", "nccl:_reduce_scatter_base")}
_NCCL_DTYPES = {"float32": ("Float", "f32", 4), "float16": ("Half", "f16", 2), "bfloat16": ("BFloat16", "bf16", 2),
                "float64": ("Double", "f64", 8), "int32": ("Int", "i32", 4)}


# -- the layout of the accelerator side ------------------------------------------------------------

def _device_index(dev: str) -> int:
    _, _, idx = dev.partition(":")
    return int(idx) if idx.isdigit() else 0


class _Streams:
    """Kineto numbers of the recording's streams, unique in the process (HTA tells streams apart by number
    alone): the engine's streams ``cuda:D/sS`` in (device, stream) order from ``STREAM_BASE`` (device 0's
    default stream is 7, as on CUDA), then the collective tracks (by name) on the rank's first device."""

    def __init__(self, rec: Recording):
        found: dict[str, tuple[int, int]] = {}
        comm: set[str] = set()
        for name in [k.stream for k in rec.kernels] + [ev.stream for ev in rec.stream_events]:
            if name in found or name in comm:
                continue
            dev, slash, s = name.partition("/s")
            if slash and s.isdigit():
                found[name] = (_device_index(dev), int(s))
            else:
                comm.add(name)
        self.by_name: dict[str, tuple[int, int]] = {}
        for j, name in enumerate(sorted(found, key=found.get)):
            self.by_name[name] = (found[name][0], STREAM_BASE + j)
        devices = sorted({d for d, _ in self.by_name.values()})
        #: the device the rank's collectives run on: its first accelerator (0 when there is none)
        self.comm_device = devices[0] if devices else 0
        for j, name in enumerate(sorted(comm)):
            self.by_name[name] = (self.comm_device, STREAM_BASE + len(found) + j)
        self.devices = sorted({d for d, _ in self.by_name.values()})

    def __getitem__(self, name: str) -> tuple[int, int]:
        return self.by_name[name]


def _copy_kind(node) -> str | None:
    """A copy op's memcpy name (``Memcpy DtoD (Device -> Device)`` and the host's), else None."""
    from autograd_run.ops import cost
    op = getattr(node, "op", None)
    if getattr(op, "cost", None) is not cost.COPY:
        return None
    src = "D" if not node.device.type == "cpu" else "H"
    dsts = {e[0].device.type for e in node.next if e is not None}
    dst = "H" if dsts == {"cpu"} else "D"
    if src == "H" and dst == "H":
        return None
    names = {"D": "Device", "H": "Pageable"}
    return f"Memcpy {src}to{dst} ({names[src]} -> {names[dst]})"


# -- the text -------------------------------------------------------------------------------------------

def _header(rec: Recording, rank: int, world: int, backend: str, device_name: str | None, streams: _Streams,
            trace_name: str, meta: dict | None = None) -> bytes:
    # json.dumps writes '"rank": 0' (a space after the colon): the form HTA's rank detection looks for
    info = json.dumps({"rank": rank, "world_size": world, "backend": backend})
    props = [{"id": d, "name": device_name or "accelerator"} for d in streams.devices]
    rest = json.dumps({"schemaVersion": 1, "deviceProperties": props, "displayTimeUnit": "ms",
                       "baseTimeNanoseconds": 0, "traceName": trace_name,
                       "autogradRun": {"version": VERSION, "simulated": bool(rec.simulated), **(meta or {})}})
    return b'{"distributedInfo": ' + info.encode() + b", " + rest[1:-1].encode() + b', "traceEvents": ['


# cpu_op of a node. Columns: 0 tid, 1 start, 2 duration, 3 node, 4 seq, 5 external id, 6 graph task (-1: 0),
# 7 depth (-1: 0), 8 pass (-1: 0), 9 device code (-1: cpu), 10 shape code, 11 queue wait (ns), 12 critical
# path (-1: no), 13 GraphRoot (-1: no), 14 pid
_OP = E.template((E.LIT, 0), (E.JESC, 1, 3), (E.LIT, 1), (E.I64, 14), (E.LIT, 2), (E.I64, 0), (E.LIT, 3),
                 (E.US, 1), (E.LIT, 4), (E.DUR, 2), (E.LIT, 5), (E.I64, 5), (E.LIT, 6), (E.I64, 5), (E.LIT, 7),
                 (E.I64, 5), (E.LIT, 8), (E.I64, 4), (E.LIT, 9), (E.RAW, 3, 10), (E.LIT, 10), (E.JSTR, 0, 3),
                 (E.LIT, 11), (E.JSTR, 1, 3), (E.LIT, 12), (E.I64, 11),
                 (E.SKIPNEG, 6, 2), (E.LIT, 13), (E.I64, 6), (E.SKIPNEG, 7, 2), (E.LIT, 14), (E.I64, 7),
                 (E.SKIPNEG, 8, 2), (E.LIT, 15), (E.I64, 8), (E.SKIPNEG, 9, 2), (E.LIT, 16), (E.JSTR, 2, 9),
                 (E.SKIPNEG, 12, 1), (E.LIT, 17), (E.SKIPNEG, 13, 1), (E.LIT, 18), (E.LIT, 19))
_OP_LITS = [b',{"ph":"X","cat":"cpu_op","name":"' + EVALUATE.encode(), b'","pid":', b',"tid":', b',"ts":',
            b',"dur":', b',"args":{"External id":', b',"Record function id":', b',"Ev Idx":',
            b',"Sequence number":', b',"Input Dims":', b',"node":', b',"op":', b',"queue wait ns":',
            b',"graph task":', b',"depth":', b',"pass":', b',"node device":', b',"critical path":true',
            b',"graph root":true', b'}}']

# A kernel (or memcpy), its launch and their flow. Columns: 0 cpu pid, 1 cpu tid, 2 launch start, 3 launch
# duration, 4 correlation, 5 external id, 6 device, 7 stream, 8 kernel start, 9 kernel duration, 10 node,
# 11 memcpy name code; template 0 a kernel, 1 a memcpy (its launch cudaMemcpyAsync).
def _kernel_template(memcpy: bool) -> np.ndarray:
    launch, cat_name = (1, (E.JESC, 2, 11)) if memcpy else (0, (E.JESC, 1, 10))
    return E.template(
        (E.LIT, launch), (E.I64, 0), (E.LIT, 2), (E.I64, 1), (E.LIT, 3), (E.US, 2), (E.LIT, 4), (E.DUR, 3),
        (E.LIT, 5), (E.I64, 5), (E.LIT, 7 if memcpy else 6), (E.I64, 4), (E.LIT, 8),
        (E.LIT, 9), (E.I64, 4), (E.LIT, 19), (E.I64, 0), (E.LIT, 2), (E.I64, 1), (E.LIT, 3), (E.US, 2), (E.LIT, 10),
        (E.LIT, 12 if memcpy else 11), cat_name, (E.LIT, 13), (E.I64, 6), (E.LIT, 2), (E.I64, 7), (E.LIT, 3),
        (E.US, 8), (E.LIT, 4), (E.DUR, 9), (E.LIT, 5), (E.I64, 5), (E.LIT, 14), (E.I64, 6), (E.LIT, 15),
        (E.I64, 7), (E.LIT, 16), (E.I64, 4), (E.LIT, 17), (E.JSTR, 0, 10), (E.LIT, 8),
        (E.LIT, 18), (E.I64, 4), (E.LIT, 19), (E.I64, 6), (E.LIT, 2), (E.I64, 7), (E.LIT, 3), (E.US, 8), (E.LIT, 10))


_KERNELS = [_kernel_template(False), _kernel_template(True)]
_K_LITS = [b',{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":',
           b',{"ph":"X","cat":"cuda_runtime","name":"cudaMemcpyAsync","pid":', b',"tid":', b',"ts":', b',"dur":',
           b',"args":{"External id":', b',"cbid":211,"correlation":', b',"cbid":41,"correlation":', b'}}',
           # 9: the flows (start at the launch, end at the kernel)
           b',{"ph":"s","cat":"ac2g","name":"ac2g","id":', b'}',
           b',{"ph":"X","cat":"kernel","name":"', b',{"ph":"X","cat":"gpu_memcpy","name":"', b'","pid":',
           b',"device":', b',"stream":', b',"context":1,"queued":0,"correlation":', b',"node":',
           b',{"ph":"f","bp":"e","cat":"ac2g","name":"ac2g","id":', b',"pid":']


def kineto_chunks(rec: Recording, incomplete: str | None = None, rank: int = 0, world: int = 1,
                  backend: str = "nccl", device_name: str | None = None, trace_name: str = "",
                  meta: dict | None = None):
    """The Kineto JSON trace of ``rec`` as bytes chunks (see the module docstring); ``meta`` goes into the
    header's ``autogradRun`` (a simulation's engine figures: ``engine_ns``)."""
    streams = _Streams(rec)
    yield _header(rec, rank, world, backend, device_name, streams, trace_name, meta)
    pid = CPU_PID + rank
    # µs from the run's start (+1 µs, as the Chrome trace): a run's clock is a monotonic one, its start no date
    base = (rec.start if not rec.empty else 0) - 1000

    def us(ns: int) -> float:
        return (ns - base) / 1000

    meta = _metadata(rec, pid, streams)
    yield b",".join(msgspec.json.encode(e) for e in meta)
    if rec.empty:
        yield _tail(rec, incomplete, pid, us)
        return
    tid_of, tid_column = trace_ranks(rec)  # the Chrome trace's thread numbering
    c = rec.columns()
    S = c.slices
    info = node_tables(c)
    passes, critical, root = slice_marks(rec)
    tid_col = tid_column(S.tid)
    wait_ns = np.zeros(len(S), dtype=np.int64)
    has_wait = S.wait >= 0
    if has_wait.any():
        W = c.waits
        w = S.wait[has_wait]
        wait_ns[has_wait] = W.popped[w] - W.pushed[w]
    ext = np.arange(1, len(S) + 1, dtype=np.int64)
    tables = [info["ids"], info["names"], info["devices"], info["shapes"]]
    pid_col = np.full(len(S), pid, dtype=np.int64)
    for a in range(0, len(S), CHUNK):
        b = min(a + CHUNK, len(S))
        node = S.node[a:b]
        cols = [tid_col[a:b], S.start[a:b], S.end[a:b] - S.start[a:b], node, _seq(info["seq"][node]),
                ext[a:b], absent_if_zero(S.gt[a:b]), absent_if_zero(S.depth[a:b]), absent_if_zero(passes[a:b]),
                info["device"][node], info["shape"][node], wait_ns[a:b], np.where(critical[a:b], 0, -1),
                np.where(root[a:b], 0, -1), pid_col[a:b]]
        yield E.fill([_OP], None, cols, tables, _OP_LITS, base, 0, b - a)
    corr = [len(S)]  # correlation ids follow the external ids

    def next_corr(count: int = 1) -> int:
        """The first of ``count`` new correlation ids."""
        corr[0] += count
        return corr[0] - count + 1
    rest: list[dict] = _steps(rec, pid, tid_of, us)
    yield from _kernels(rec, c, S, tid_col, ext, streams, pid, base, next_corr)
    rest.extend(_stream_events(rec, c, S, tid_col, streams, pid, us, next_corr, tid_of))
    wanted = launchers(rec)
    at: dict = {}  # a node that launched a collective -> its first slice's (trace tid, start µs)
    if wanted:
        for n, t, st in zip(S.node.tolist(), S.tid.tolist(), S.start.tolist()):
            if c.nodes[n] in wanted and c.nodes[n] not in at:
                at[c.nodes[n]] = (tid_of(t), us(st))
    rest.extend(_collectives(rec, streams, pid, us, next_corr, world, at))
    for a in range(0, len(rest), CHUNK):
        yield b"".join(b"," + msgspec.json.encode(e) for e in rest[a:a + CHUNK])
    yield _tail(rec, incomplete, pid, us)


def _seq(seq: np.ndarray) -> np.ndarray:
    """Sequence numbers as Kineto writes them: -1 for a node without one (PyTorch's UINT64_MAX)."""
    out = seq.astype(np.int64)
    out[seq > np.iinfo(np.int64).max] = -1
    return out


def _tail(rec: Recording, incomplete: str | None, pid: int, us) -> bytes:
    if not incomplete:
        return b"]}"
    ts = us(rec.end) if not rec.empty else 1.0
    ev = {"ph": "i", "s": "g", "pid": pid, "tid": 0, "ts": ts, "cat": "incomplete",
          "name": f"run {incomplete}: the trace is incomplete"}
    return b"," + msgspec.json.encode(ev) + b'], "otherData": ' + msgspec.json.encode({"incomplete": incomplete}) + b"}"


def _metadata(rec: Recording, pid: int, streams: _Streams) -> list[dict]:
    from autograd_run.analysis.samples import stable_worker
    process = process_name(rec)
    out: list[dict] = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": process}},
                       {"ph": "M", "pid": pid, "tid": 0, "name": "process_labels", "args": {"labels": "CPU"}},
                       {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 0}}]
    tids = thread_tids(rec)
    for k, t in enumerate(rec.threads.values()):
        name = f"caller ({t.name})" if t.kind is ThreadKind.CALLER else t.name
        out.append({"ph": "M", "pid": pid, "tid": tids[t.tid], "name": "thread_name",
                    "args": {"name": name, "worker": stable_worker(t.name)}})
        out.append({"ph": "M", "pid": pid, "tid": tids[t.tid], "name": "thread_sort_index",
                    "args": {"sort_index": k}})
    comm_names = [n for n in streams.by_name if "/s" not in n]
    if comm_names:
        out.append({"ph": "M", "pid": pid, "tid": COMM_THREAD, "name": "thread_name",
                    "args": {"name": "collective launches"}})
    for d in streams.devices:
        out.append({"ph": "M", "pid": d, "tid": 0, "name": "process_name", "args": {"name": f"GPU {d}"}})
        out.append({"ph": "M", "pid": d, "tid": 0, "name": "process_labels", "args": {"labels": f"GPU {d}"}})
        out.append({"ph": "M", "pid": d, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 1 + d}})
    for name, (d, s) in sorted(streams.by_name.items(), key=lambda kv: kv[1]):
        out.append({"ph": "M", "pid": d, "tid": s, "name": "thread_name", "args": {"name": f"stream {s} {name}"}})
        out.append({"ph": "M", "pid": d, "tid": s, "name": "thread_sort_index", "args": {"sort_index": s}})
    return out


def _steps(rec: Recording, pid: int, tid_of, us) -> list[dict]:
    """A ``ProfilerStep#N`` annotation per top-level backward call (a pass), on its caller's thread."""
    out = []
    calls = sorted((g for g in rec.graph_tasks if g.depth == 0), key=lambda g: g.start)
    for n, g in enumerate(calls):
        end = g.end if g.end is not None else rec.end
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid,
                    "tid": tid_of(g.tid), "ts": us(g.start), "dur": max(end - g.start, 1) / 1000,
                    "args": {"External id": 0, "graph task": g.gt}})
    return out


def _launchers(S, node_col: np.ndarray, start: np.ndarray) -> np.ndarray:
    """For each kernel (its node's code in the node table and its start), the slice row that launched it: the
    latest run of its node that started by then (its first run if none did); -1 for a node that never ran."""
    out = np.full(len(node_col), -1, dtype=np.int64)
    if not len(S) or not len(node_col):
        return out
    order = np.lexsort((S.start, S.node))
    sn, ss = S.node[order], S.start[order]
    lo = int(min(ss.min(), start.min()))
    span = int(max(ss.max(), start.max())) - lo + 1
    if (int(max(sn.max(), node_col.max())) + 1) * span < (1 << 62):
        idx = np.searchsorted(sn * span + (ss - lo), node_col * span + (start - lo), side="right") - 1
    else:  # times too far apart for one key: by node, then by time
        idx = np.empty(len(node_col), dtype=np.int64)
        for k, (j, t) in enumerate(zip(node_col.tolist(), start.tolist())):
            a, b = np.searchsorted(sn, j, "left"), np.searchsorted(sn, j, "right")
            idx[k] = a + np.searchsorted(ss[a:b], t, "right") - 1 if b > a else -1
    ok = (idx >= 0) & (sn[np.maximum(idx, 0)] == node_col)
    first = np.searchsorted(sn, node_col, side="left")  # no run started by then: the node's first run
    ok_first = ~ok & (first < len(sn)) & (sn[np.minimum(first, len(sn) - 1)] == node_col)
    out[ok] = order[idx[ok]]
    out[ok_first] = order[first[ok_first]]
    return out


def _kernels(rec: Recording, c, S, tid_col, ext, streams: _Streams, pid: int, base: int, next_corr):
    """The nodes' kernels with their launches and flows (``_KERNELS``), formatted from columns."""
    code = {id(n): j for j, n in enumerate(c.nodes)}
    mine = [k for k in rec.kernels if not isinstance(k.node, Collective) and id(k.node) in code]
    if not mine:
        return
    mine.sort(key=lambda k: k.start)
    node_col = np.fromiter((code[id(k.node)] for k in mine), dtype=np.int64, count=len(mine))
    kstart = np.fromiter((k.start for k in mine), dtype=np.int64, count=len(mine))
    kend = np.fromiter((k.end for k in mine), dtype=np.int64, count=len(mine))
    stream_names = list(dict.fromkeys(k.stream for k in mine))
    scode = {name: j for j, name in enumerate(stream_names)}
    s_col = np.fromiter((scode[k.stream] for k in mine), dtype=np.int64, count=len(mine))
    dev_of = np.array([streams[name][0] for name in stream_names], dtype=np.int64)
    num_of = np.array([streams[name][1] for name in stream_names], dtype=np.int64)
    row = _launchers(S, node_col, kstart)
    keep = row >= 0
    if not keep.all():
        node_col, kstart, kend, s_col, row = node_col[keep], kstart[keep], kend[keep], s_col[keep], row[keep]
    if not len(row):
        return
    # a copy op's memcpy name: per distinct node that is a copy (the op's cost model says so)
    memcpy_names: list[str] = []
    memcpy_code: dict[str, int] = {}
    copy = np.full(len(c.nodes), -1, dtype=np.int64)
    for j in np.unique(node_col).tolist():
        name = _copy_kind(c.nodes[j])
        if name is not None:
            copy[j] = memcpy_code.setdefault(name, len(memcpy_names))
            if copy[j] == len(memcpy_names):
                memcpy_names.append(name)
    kind = copy[node_col]
    s_start, s_end = S.start[row], S.end[row]
    launch_end = np.maximum(s_start, np.minimum(s_end, kstart))
    launch_start = np.maximum(s_start, launch_end - LAUNCH_NS)
    first = next_corr(len(row))
    corr = np.arange(first, first + len(row), dtype=np.int64)
    cols = [np.full(len(row), pid, dtype=np.int64), tid_col[row], launch_start,
            np.maximum(launch_end - launch_start, 1), corr, ext[row], dev_of[s_col], num_of[s_col], kstart,
            kend - kstart, node_col, np.maximum(kind, 0)]
    kinds = (kind >= 0).astype(np.int64)
    tables = [[n.id for n in c.nodes], [n.name for n in c.nodes], memcpy_names or [""]]
    for a in range(0, len(row), CHUNK):
        yield E.fill(_KERNELS, kinds, cols, tables, _K_LITS, base, a, min(a + CHUNK, len(row)))


def _stream_events(rec: Recording, c, S, tid_col, streams: _Streams, pid: int, us, next_corr, tid_of) -> list[dict]:
    """Events recorded on streams and waits for them: ``cudaEventRecord``, ``cudaStreamWaitEvent`` and the
    waiting stream's ``Stream Wait Event`` (what HTA's critical path follows across streams)."""
    if not rec.stream_events:
        return []
    out: list[dict] = []
    # the CPU thread of a node's event: the thread of its latest run started by then
    code = {id(n): j for j, n in enumerate(c.nodes)}
    runs: dict[int, list[tuple[int, int]]] = {}
    for r in np.argsort(S.start, kind="stable").tolist():
        runs.setdefault(int(S.node[r]), []).append((int(S.start[r]), int(tid_col[r])))
    callers = {g.gt: g.tid for g in rec.graph_tasks}
    # when each stream's work before an instant ends (its kernels that started by then)
    ends: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    by_stream: dict[str, list] = {}
    for k in rec.kernels:
        by_stream.setdefault(k.stream, []).append((k.start, k.end))
    for name, ks in by_stream.items():
        ks.sort()
        ends[name] = (np.array([s for s, _ in ks], dtype=np.int64),
                      np.maximum.accumulate(np.array([e for _, e in ks], dtype=np.int64)))
    records: dict[int, tuple[int, str]] = {}  # event id -> (correlation, stream)

    def thread(ev) -> int:
        j = code.get(id(ev.node)) if ev.node is not None else None
        if j is not None:
            best = None
            for start, t in runs.get(j, []):
                if start <= ev.ts:
                    best = t
            if best is not None:
                return best
        return tid_of(callers.get(ev.gt, next(iter(rec.threads), 0)))
    for ev in sorted(rec.stream_events, key=lambda e: e.ts):
        if ev.stream not in streams.by_name:
            continue
        dev, s = streams[ev.stream]
        tid = thread(ev)
        corr = next_corr()
        if ev.action == "record":
            records[ev.event] = (corr, ev.stream)
            out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": pid, "tid": tid,
                        "ts": us(ev.ts), "dur": 0.001, "args": {"External id": 0, "cbid": 135, "correlation": corr}})
        elif ev.action == "wait":
            rec_corr, rec_stream = records.get(ev.event, (-1, None))
            out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": pid, "tid": tid,
                        "ts": us(ev.ts), "dur": 0.001, "args": {"External id": 0, "cbid": 147, "correlation": corr}})
            at = ev.ts
            e = ends.get(ev.stream)
            if e is not None:
                i = int(np.searchsorted(e[0], ev.ts, side="right"))
                if i:
                    at = max(at, int(e[1][i - 1]))
            out.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": dev, "tid": s,
                        "ts": us(at), "dur": 0,
                        "args": {"External id": 0, "cuda_sync_kind": "Stream Wait Event",
                                 "wait_on_stream": streams[rec_stream][1] if rec_stream in streams.by_name else -1,
                                 "wait_on_cuda_event_record_corr_id": rec_corr, "wait_on_cuda_event_id": ev.event,
                                 "stream": s, "correlation": corr, "device": dev, "context": 1}})
    return out


#: How many of a group's ranks a collective's "Process Group Ranks" lists (PyTorch's profiler writes the first
#: 30 and ", ..." after them: ``kTruncatLength`` in its NCCL metadata), so a rank's trace does not grow with the
#: world.
RANKS_SHOWN = 30


def rank_list(group: int) -> str:
    """Ranks 0..group-1 as PyTorch's profiler writes a process group's: ``[0, 1, 2]``, or the first
    ``RANKS_SHOWN`` and ``, ...``."""
    shown = ", ".join(map(str, range(min(group, RANKS_SHOWN))))
    return f"[{shown}, ...]" if group > RANKS_SHOWN else f"[{shown}]"


def _collectives(rec: Recording, streams: _Streams, pid: int, us, next_corr, world: int,
                 at: dict | None = None) -> list[dict]:
    """Each collective as PyTorch's profiler writes one (its ``record_param_comms`` op, annotation, launch and
    NCCL kernel, joined by an ``ac2g`` flow), and a flow from the slice of the node whose run launched it
    (``Collective.trigger``; ``at``: node -> (trace tid, start µs)) to its ``record_param_comms``, as the JSON
    and protobuf traces draw one."""
    out: list[dict] = []
    for k in sorted((k for k in rec.kernels if isinstance(k.node, Collective)), key=lambda k: k.start):
        col = k.node
        name, part, annotation = _COLLECTIVES.get(col.kind, _COLLECTIVES["all_reduce"])
        dname, short, size = _NCCL_DTYPES.get(col.dtype, _NCCL_DTYPES["float32"])
        group = col.group or world
        whole = col.nbytes // size  # the whole buffer: each rank's shard is a group's part of it
        n_in = whole // group if col.kind == "all_gather" else whole
        n_out = whole // group if col.kind == "reduce_scatter" else whole
        dev, s = streams[k.stream]
        corr = next_corr()
        ext = corr
        launch = max(k.start - LAUNCH_NS, rec.start)
        comm = {"Collective name": name, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": group,
                "dtype": dname, "In split size": "[]", "Out split size": "[]", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": rank_list(group)}
        common = {"pid": pid, "tid": COMM_THREAD}
        out.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", **common, "ts": us(launch),
                    "dur": max(k.start - launch, 1) / 1000, "args": {"External id": ext, **comm}})
        out.append({"ph": "X", "cat": "user_annotation", "name": annotation, **common, "ts": us(launch),
                    "dur": max(k.start - launch, 1) / 1000, "args": {"External id": ext}})
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **common, "ts": us(launch),
                    "dur": max(k.start - launch, 1) / 1000, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        out.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, **common, "ts": us(launch)})
        out.append({"ph": "X", "cat": "kernel",
                    "name": f"ncclDevKernel_{part}_{short}_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                    "pid": dev, "tid": s, "ts": us(k.start), "dur": max(k.end - k.start, 1) / 1000,
                    "args": {"External id": ext, "device": dev, "stream": s, "context": 1, "queued": 0,
                             "correlation": corr, **comm, "collective": col.name}})
        out.append({"ph": "f", "bp": "e", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": dev, "tid": s,
                    "ts": us(k.start)})
        src = at.get(getattr(col, "trigger", None)) if at else None
        if src is not None:  # (a flow id of its own, after the correlation ids)
            flow, label = next_corr(), f"launch {col.name.split(' (')[0]}"
            out.append({"ph": "s", "cat": "node", "name": label, "id": flow, "pid": pid, "tid": src[0],
                        "ts": src[1]})
            out.append({"ph": "f", "bp": "e", "cat": "node", "name": label, "id": flow, **common,
                        "ts": us(launch)})
    return out


def write_kineto_trace(path: str, rec: Recording, incomplete: str | None = None, *, rank: int = 0, world: int = 1,
                       backend: str = "nccl", device_name: str | None = None, compress: bool | None = None,
                       meta: dict | None = None) -> None:
    """Write the Kineto trace atomically, gzip-compressed when ``compress`` (by default: a ``.gz`` path)."""
    if compress is None:
        compress = path.lower().endswith(".gz")
    import os
    chunks = kineto_chunks(rec, incomplete, rank, world, backend, device_name, os.path.basename(path), meta)
    with atomic_writer(path, "trace_path") as f:
        if compress:
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=3, mtime=0) as z:
                for chunk in chunks:
                    z.write(chunk)
        else:
            for chunk in chunks:
                f.write(chunk)
