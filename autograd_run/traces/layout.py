"""What a trace shows of a Recording, whatever its encoding: shared by the Chrome JSON and Perfetto protobuf
writers (``traces.chrome``, ``traces.pftrace``) and read back by the readers.

* slice titles: ``node_title`` (``<id> <op>``) and its inverse ``slice_node``; ``title_says_id``;
* tracks: one process (``PID``, named by ``process_name``), thread tids as display ranks from ``FIRST_TID`` (``thread_tids``,
  ``trace_ranks``);
* what each node slice carries: its marks (``slice_marks``: pass, critical path, GraphRoot), its
  arguments' tables (``node_tables``), the defaults left out (``DEFAULT_ZERO``, ``DEFAULT_DEVICE``,
  ``absent_if_zero``); a kernel slice's arguments (``kernel_args``);
* the engine's outstanding-tasks counter (``outstanding_changes``).

See ``traces.chrome``'s docstring for the layout itself (tracks, slices, flows, counters).
"""

from __future__ import annotations

import msgspec
import numpy as np

from autograd_run.ops import GRAPH_ROOT
from autograd_run.record import kernels
from autograd_run.record.recording import Recording

PID = 1

#: The process track's name: a simulation's says so (``costs.measured`` reads it back: simulated times).
PROCESS_NAME = "autograd-run"
SIMULATED_PROCESS_NAME = "autograd-run (simulated)"


def process_name(rec: Recording) -> str:
    return SIMULATED_PROCESS_NAME if rec.simulated else PROCESS_NAME


#: The first thread's tid: above the pid, so no worker is taken for the process's main thread.
FIRST_TID = PID + 1


#: Node slice arguments left out where they are 0 (the protobuf trace leaves out the same; a queue wait's
#: ``graph_task`` too).
DEFAULT_ZERO = ("depth", "graph_task", "stream", "pass")


#: A node slice's ``device`` argument is left out where it is this one (readers take an absent one as it).
DEFAULT_DEVICE = "cpu"


def node_title(node) -> str:
    """A node slice's title: ``<id> <op name>`` (just the name when they are the same, as for GraphRoot)."""
    return node.name if node.id == node.name else f"{node.id} {node.name}"


def title_says_id(name: str) -> bool:
    """Whether a slice titled by ``node_title`` tells its node's id without an ``id`` argument: where the op
    name has no space, the title split at its last space is ``<id> <op name>`` (node ids may have spaces),
    and a title without a space is a node whose id is its name. A node given an op name with a space (a
    graph file's ``name`` beside an explicit ``op``) keeps its ``id`` argument."""
    return " " not in name


def slice_node(title, args: dict) -> tuple[str, str] | None:
    """The node id and op name of a node (or kernel) slice from its title and arguments, the inverse of
    ``node_title``: the ``id`` argument where there is one (traces written before left none out; an op name
    with a space keeps it), else the title split at its last space; the op name is the ``name`` argument of
    older traces, else the title less its id. None when neither the arguments nor the title say."""
    nid = args.get("id")
    if isinstance(nid, str):
        name = args.get("name")
        if isinstance(name, str):
            return nid, name
        if not isinstance(title, str):
            return nid, "?"
        prefix = nid + " "
        return nid, title[len(prefix):] if title.startswith(prefix) else title
    if not isinstance(title, str) or not title or "id" in args:
        return None
    nid, space, name = title.rpartition(" ")
    return (nid, name) if space else (title, title)


def thread_tids(rec: Recording) -> dict[int, int]:
    """Trace tid of each recorded thread: its display rank (the Recording's order) from ``FIRST_TID``."""
    return {tid: FIRST_TID + rank for rank, tid in enumerate(rec.threads)}


def slice_marks(rec: Recording) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node slice (a row of the Recording's slice columns), what a comparison of runs reads from a trace
    (``traces.read_profile``) beside the slice's own arguments: its ``pass`` (which top-level backward call),
    whether it is on its pass's ``critical_path``, and whether it is the engine's own ``graph_root``."""
    from autograd_run.analysis.samples import slice_passes
    passes, critical = slice_passes(rec)
    c = rec.columns()
    root = np.zeros(len(c.slices), dtype=bool)
    if len(c.nodes) and len(c.slices):
        op_code, ops = c.node_codes("op", True)
        root = np.array([op is GRAPH_ROOT for op in ops])[op_code][c.slices.node]
    return passes, critical, root


def kernel_args(k) -> dict:
    """A kernel slice's arguments: its node's id where its title does not say it (``title_says_id``); the
    stream is its track's (``stream <name>``)."""
    return {} if title_says_id(k.node.name) else {"id": k.node.id}


def launchers(rec: Recording) -> set:
    """The nodes whose run launched one of the recording's collectives (``Collective.trigger``): each trace
    format draws a flow from such a node's slice to the collective's."""
    return {k.node.trigger for k in rec.kernels if getattr(k.node, "trigger", None) is not None}


def node_tables(c) -> dict:
    """What slices and waits show of each node of a Recording's node table, as columns and tables: ``device``
    the code of its device among ``devices``, -1 where it is ``DEFAULT_DEVICE`` (the argument is left out);
    ``id_arg`` -1 where its slice's title says its id (``title_says_id``: the argument is left out), else 0."""
    nodes = c.nodes
    ids, names, seq, stream, same = kernels.node_columns(nodes)
    dev_code, devs = c.node_codes("device", True)
    devices = [str(d) for d in devs]
    shown = np.array([-1 if d == DEFAULT_DEVICE else k for k, d in enumerate(devices)] or [0], dtype=np.int64)
    name_code, distinct = c.node_codes("name")  # the summary's, when it made them
    id_arg = np.array([-1 if title_says_id(nm) else 0 for nm in distinct] or [0], dtype=np.int64)
    shape_code, shapes = kernels.input_shape_codes(nodes)
    return {"ids": ids, "names": names, "seq": seq, "stream": stream, "same": same, "device": shown[dev_code],
            "devices": devices, "id_arg": id_arg[name_code], "shape": shape_code, "shape_tuples": shapes,
            "shapes": [msgspec.json.encode([list(s) for s in shape]) for shape in shapes]}


def absent_if_zero(col: np.ndarray) -> np.ndarray:
    """A column of a ``DEFAULT_ZERO`` argument (never negative) for the templates: -1 where it is 0 (left out)."""
    return np.where(col == 0, -1, col)


def trace_ranks(rec: Recording):
    """The trace tid of an OS tid (``thread_tids``, unknown threads ranked as they first appear), and a
    function mapping a column of OS tids to trace tids."""
    tids = thread_tids(rec)

    def tid_of(os_tid: int) -> int:
        t = tids.get(os_tid)
        if t is None:
            t = tids[os_tid] = FIRST_TID + len(tids)
        return t

    def column(col: np.ndarray) -> np.ndarray:
        out = np.empty(len(col), dtype=np.int64)
        if len(col):
            changes = col[np.r_[True, col[1:] != col[:-1]]]
            for t in dict.fromkeys(changes.tolist()):
                out[col == t] = tid_of(t)
        return out
    return tid_of, column


def outstanding_changes(rec: Recording, origins: bool = False) -> tuple:
    """(time, tasks outstanding after it) at each change of the engine's outstanding tasks, as ``_counters``;
    with ``origins`` also what made each change: 0 a push (the queue sample's row), 1 a node slice's end
    (the slice's row), 2 a skip (its index)."""
    c = rec.columns()
    q, S = c.samples, c.slices
    up = np.nonzero(q.pushed & (q.node >= 0))[0]
    n_up, n_s = len(up), len(S)
    ts = np.concatenate([q.ts[up], S.end, np.array([sk.ts for sk in rec.skips], dtype=np.int64)])
    n = len(ts)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return (empty, empty, empty, empty) if origins else (empty, empty)
    # by time, increases before decreases at one instant, else as concatenated: one stable sort of one key
    key = (ts - ts.min()) * 2
    key[n_up:] += 1
    order = np.argsort(key, kind="stable")
    del key
    ts = ts[order]
    delta = np.where(order < n_up, 1, -1)
    values = np.cumsum(delta)
    gts = [q.gt[up], S.gt, np.array([sk.gt for sk in rec.skips], dtype=np.int64)]
    one_task = min(g.min() for g in gts if len(g)) == max(g.max() for g in gts if len(g))
    gt = None
    if not one_task:
        gt = np.concatenate(gts)[order]
    elif values.min() < 0:  # one GraphTask: a decrease to drop only where its count goes below zero
        gt = np.zeros(n, dtype=np.int64)
    del gts
    if gt is not None:
        # a decrease of a GraphTask with none outstanding is dropped (its push was not recorded): when no
        # GraphTask's own running count goes below zero there is none to drop
        og = np.argsort(gt, kind="stable")
        cs = np.cumsum(delta[og])
        first = np.r_[True, gt[og][1:] != gt[og][:-1]]
        at = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        if not (cs - np.where(at > 0, cs[np.maximum(at - 1, 0)], 0) >= 0).all():
            keep, kept, per_task, total = [], [], {}, 0  # some decreases to drop: one by one
            for k, (d, g) in enumerate(zip(delta.tolist(), gt.tolist())):
                m = per_task.get(g, 0)
                if d < 0 and m == 0:
                    continue
                per_task[g] = m + d
                total += d
                keep.append(k)
                kept.append(total)
            values = np.array(kept, dtype=np.int64)
            ts, order = ts[keep], order[keep]
    if not origins:
        return ts, values
    kind = np.where(order < n_up, 0, np.where(order < n_up + n_s, 1, 2))
    index = np.where(kind == 0, up[np.minimum(order, max(n_up - 1, 0))] if n_up else 0,
                     np.where(kind == 1, order - n_up, order - n_up - n_s))
    return ts, values, kind, index
