"""A sweep as a library call: ``run_sweep(grid, SweepOptions) -> SweepReport``.

Steps: key every point (``fingerprint.point_key``) and take what the cache
has; fail at once the points of graphs that do not load; cut the rest into
batches (points of one graph, several per task so Dask's per-task cost stays
small next to the work); run them on Dask (``cluster``) or, with
``workers=0``, one after another in this process; cache each success as it
arrives. Rows come back in grid order whatever the order of completion. The
cluster is not started at all when the cache holds every point.

Ctrl-C (``KeyboardInterrupt``) cancels the unfinished tasks; what finished is
kept (in the report and the cache) and the report says it was interrupted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from autograd_run.errors import RequestError
from autograd_run.sweep.cache import ResultCache, default_cache_dir
from autograd_run.sweep.evaluate import LOADED, error_text, make_payload, run_batch
from autograd_run.sweep.fingerprint import point_key, tool_fingerprint
from autograd_run.sweep.grid import Grid, Point

#: Points per task: at most this many, and fewer when that leaves each worker thread fewer than
#: ``TASKS_PER_THREAD`` tasks (the tail of the sweep then balances across workers).
MAX_BATCH = 16
TASKS_PER_THREAD = 16


@dataclass
class SweepOptions:
    #: ``tcp://HOST:PORT`` of a running Dask scheduler; None: an embedded LocalCluster.
    scheduler: str | None = None
    #: LocalCluster worker processes (None: one per CPU); 0: run in this process, without Dask.
    workers: int | None = None
    cache_dir: str | None = None
    #: False: recompute every point (results are still written to the cache).
    use_cache: bool = True
    #: ``send`` the graphs' bytes to the cluster once, or let workers read the ``path`` (a shared filesystem).
    transfer: str = "send"
    #: Points per task (None: automatic).
    batch: int | None = None
    verbose: bool = False
    #: How long to try reaching ``scheduler``.
    connect_timeout_s: float = 10.0
    #: Called once the work is known: (points, from the cache, to compute, where they run).
    on_start: Callable[[int, int, int, str], None] | None = None
    #: Called with each finished row (cached rows first).
    on_row: Callable[[dict], None] | None = None
    #: Whether the user asked to stop (Ctrl-C), polled after each batch: a Ctrl-C whose KeyboardInterrupt was
    #: swallowed (raised inside a destructor, such as a Dask future's, Python only prints it) still stops the sweep.
    stop_requested: Callable[[], bool] | None = None


@dataclass
class SweepReport:
    grid: Grid
    #: One row per point, in grid order (``results.COLUMNS``).
    rows: list[dict]
    #: Points evaluated by this sweep (successes and failures), taken from the cache, failed, never run.
    computed: int = 0
    cached: int = 0
    failed: int = 0
    cancelled: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    #: Where the points ran: "cache", "this process", "LocalCluster, 2 worker processes", "tcp://...".
    ran_on: str = "cache"
    cache_dir: str | None = None
    cache_write_errors: int = 0
    tool: str = field(default_factory=tool_fingerprint)

    def scale_never_applied(self) -> list[str]:
        """``scale`` keys that named no op and no device in any simulated point that has them (a typo,
        most likely): a point leaves a key that does not apply to it unscaled (``scale_unused``)."""
        given: dict[str, bool] = {}
        for r in self.rows:
            if r.get("mode") != "simulate" or r.get("status") != "ok" or not r.get("scale"):
                continue
            unused = set((r.get("scale_unused") or "").split(",")) - {""}
            for item in str(r["scale"]).split(","):
                key = item.partition("=")[0].strip()
                if key:
                    given[key] = given.get(key, False) or key not in unused
        return sorted(k for k, applied in given.items() if not applied)


BASE_FIELDS = ("graph", "graph_sha", "mode", "spec", "devices", "placement", "policy", "scale", "repeat", "key")


def base_row(grid: Grid, p: Point, key: str) -> dict:
    g = grid.graphs[p.graph]
    return {"graph": g.name, "graph_sha": g.sha[:16], "mode": p.mode,
            "spec": p.spec_name if p.mode == "simulate" else "", "devices": p.devices, "placement": p.placement,
            "policy": p.policy, "scale": p.scale_text, "repeat": p.repeat, "key": key}


def batches_of(grid: Grid, todo: list[int], threads: int, size: int | None) -> list[tuple[int, list[int]]]:
    """(graph index, point indices) per task: points of one graph, ``size`` or an automatic count per task."""
    if size is None:
        size = max(1, min(MAX_BATCH, math.ceil(len(todo) / (TASKS_PER_THREAD * max(1, threads)))))
    by_graph: dict[int, list[int]] = {}
    for i in todo:
        by_graph.setdefault(grid.points[i].graph, []).append(i)
    out = []
    for gi, idx in by_graph.items():
        for k in range(0, len(idx), size):
            out.append((gi, idx[k:k + size]))
    return out


def run_sweep(grid: Grid, options: SweepOptions | None = None) -> SweepReport:
    o = options or SweepOptions()
    if o.transfer not in ("send", "path"):
        raise RequestError(f"transfer is 'send' or 'path', got {o.transfer!r}", "transfer")
    if o.workers is not None and o.workers < 0:
        raise RequestError("workers must be at least 0", "workers")
    if o.batch is not None and o.batch < 1:
        raise RequestError("batch must be at least 1", "batch")
    if not (isinstance(o.connect_timeout_s, (int, float)) and 0 < o.connect_timeout_s < math.inf):
        raise RequestError(f"connect_timeout_s is a number of seconds above 0, got {o.connect_timeout_s!r}",
                           "connect_timeout_s")
    if o.scheduler is not None:
        # Before the cache is read: a malformed address is refused even when every point is cached (the
        # scheduler is then not contacted, so an address that parses but does not answer is not told).
        from autograd_run.sweep.cluster import check_scheduler_address
        check_scheduler_address(o.scheduler)
    t0 = time.perf_counter()
    tool = tool_fingerprint()
    cache_dir = o.cache_dir or default_cache_dir()
    cache = ResultCache(cache_dir)
    rows: list[dict | None] = [None] * len(grid.points)
    report = SweepReport(grid, [], cache_dir=cache_dir, tool=tool)
    keys = [point_key(grid.graphs[p.graph].sha, grid.graphs[p.graph].side, p.fields(), tool) for p in grid.points]
    todo = []
    for i, p in enumerate(grid.points):
        row = base_row(grid, p, keys[i])
        g = grid.graphs[p.graph]
        hit = cache.get(keys[i]) if o.use_cache and g.error is None else None
        if hit is not None:
            rows[i] = {**row, **hit, "cached": True}
            report.cached += 1
        elif g.error is not None:
            rows[i] = {**row, "status": "error", "error": g.error, "cached": False}
        else:
            rows[i] = row
            todo.append(i)

    def finish(i: int, result: dict | None, error: str | None) -> None:
        row = dict(rows[i])
        if error is not None:
            row.update(status="error", error=error)
        else:
            row.update(result)
        row["cached"] = False
        report.computed += 1
        if row.get("status") == "ok":
            # Only what the point computed: names and options come from the grid of the sweep that reads it.
            result = {k: v for k, v in row.items() if k not in BASE_FIELDS and k != "cached"}
            if not cache.put(keys[i], tool, result):
                report.cache_write_errors += 1
        rows[i] = row
        if o.on_row:
            o.on_row(row)

    def batch_done(indices: list[int], result: dict | None, error: str | None) -> None:
        if result is not None and result.get("tool") != tool:
            error = (f"computed by another autograd-run ({result.get('tool')}, at {result.get('where')}) "
                     f"than this client ({tool})")
        for k, i in enumerate(indices):
            finish(i, None if error else result["rows"][k], error)
        if o.stop_requested is not None and o.stop_requested():
            raise KeyboardInterrupt  # (the batch's rows are kept)

    if o.on_row:
        for r in rows:
            if r is not None and "status" in r:
                o.on_row(r)
    try:
        if not todo:
            report.ran_on = "cache" if grid.points else "nothing to run"
            _start(o, grid, report, 0, "cache")
        elif o.workers == 0:
            report.ran_on = "this process"
            _start(o, grid, report, len(todo), report.ran_on)
            payloads: dict[int, object] = {}
            batches = batches_of(grid, todo, 1, o.batch)
            last = {gi: k for k, (gi, _) in enumerate(batches)}
            for k, (gi, idx) in enumerate(batches):
                if gi not in payloads:
                    try:
                        payloads[gi] = make_payload(grid.graphs[gi])
                    except Exception as exc:
                        payloads[gi] = error_text(exc)
                if isinstance(payloads[gi], str):
                    batch_done(idx, None, payloads[gi])
                else:
                    batch_done(idx, run_batch(payloads[gi], [grid.points[i] for i in idx]), None)
                if k == last[gi]:  # the graph's last batch: neither its bytes nor the loaded graph are needed now
                    payload = payloads.pop(gi)
                    if not isinstance(payload, str):
                        LOADED.drop(payload)
        else:
            from autograd_run.sweep.cluster import connect, run_batches, worker_threads
            with connect(o.scheduler, o.workers, o.verbose, o.connect_timeout_s) as (client, desc):
                report.ran_on = desc
                _start(o, grid, report, len(todo), desc)
                batches = batches_of(grid, todo, worker_threads(client), o.batch)
                plan = [(gi, [grid.points[i] for i in idx]) for gi, idx in batches]
                run_batches(client, grid, plan, o.transfer == "send",
                            lambda b, result, error: batch_done(batches[b][1], result, error))
    except KeyboardInterrupt:
        report.interrupted = True
    if o.stop_requested is not None and o.stop_requested():
        report.interrupted = True  # (asked for after the last batch: nothing left to cancel)
    for i, r in enumerate(rows):
        if "status" not in r:
            rows[i] = {**r, "status": "cancelled", "error": "interrupted before it ran", "cached": False}
            report.cancelled += 1
    report.rows = rows
    report.failed = sum(1 for r in rows if r["status"] == "error")
    report.seconds = time.perf_counter() - t0
    return report


def _start(o: SweepOptions, grid: Grid, report: SweepReport, todo: int, where: str) -> None:
    if o.on_start:
        o.on_start(len(grid.points), report.cached, todo, where)
