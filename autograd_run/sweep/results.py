"""A sweep's rows as results: ranking per graph, CSV, Parquet (when pyarrow is installed) and JSON.

Every file goes to the output folder through ``outputs``: checked before the
sweep starts (never an input of the sweep, writable) and written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import os

from autograd_run.outputs import atomic_write, atomic_write_with, check_output_path

#: The columns of the CSV and Parquet files, in order.
COLUMNS = ("graph", "graph_sha", "mode", "spec", "devices", "placement", "policy", "scale", "scale_unused", "repeat",
           "status",
           "wall_ns", "engine_done_ns", "critical_path_ns", "p95_ns", "passes", "nodes", "nodes_executed", "copies",
           "workers", "devices_used", "compute_s", "cpu_s", "cached", "error", "key")
INT_COLUMNS = ("devices", "repeat", "wall_ns", "engine_done_ns", "critical_path_ns", "p95_ns", "passes", "nodes",
               "nodes_executed", "copies", "workers", "devices_used")
#: What may differ between two sweeps of the same grid: how long a point took, and whether it was cached.
VOLATILE = ("compute_s", "cpu_s", "cached")


def ranked(rows: list[dict]) -> dict[str, list[dict]]:
    """graph -> its successful rows, fastest first (ties in grid order); graphs in grid order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["graph"], [])
        if r["status"] == "ok":
            out[r["graph"]].append(r)
    for name in out:
        out[name].sort(key=lambda r: r["wall_ns"])
    return out


def best_rows(rows: list[dict]) -> list[dict]:
    """The fastest configuration of each graph (graphs without a successful point are left out)."""
    return [rs[0] for rs in ranked(rows).values() if rs]


def has_pyarrow() -> bool:
    """Whether pyarrow is installed, found without importing it (a table from the cache never imports it)."""
    import importlib.util
    return importlib.util.find_spec("pyarrow") is not None


def output_files(out: str, parquet: bool) -> dict[str, str]:
    files = {"csv": os.path.join(out, "results.csv"), "json": os.path.join(out, "results.json")}
    if parquet:
        files["parquet"] = os.path.join(out, "results.parquet")
    return files


def prepare_out(out: str, paths: list[str], inputs: list[str]) -> None:
    """Create the output folder and refuse, before any work, a path that is an input or cannot be written."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise_request(f"{out}: cannot create the output folder: {exc.strerror or exc}")
    for p in paths:
        folder = os.path.dirname(p)
        if folder != out:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise_request(f"{folder}: cannot create it: {exc.strerror or exc}")
        check_output_path(p, "out", inputs)


def raise_request(msg: str):
    from autograd_run.errors import RequestError
    raise RequestError(msg, "out")


def csv_bytes(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(["" if r.get(c) is None else r.get(c) for c in COLUMNS])
    return buf.getvalue().encode()


def table_key(rows: list[dict], tool: str) -> str:
    """Every cell of the table, the tool and pyarrow's version, hashed: one key, one Parquet file."""
    import hashlib
    from importlib.metadata import version
    cells = [[r.get(c) for c in COLUMNS] for r in rows]
    what = {"cells": cells, "tool": tool, "pyarrow": version("pyarrow")}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def write_parquet(path: str, rows: list[dict], cache: str | None = None, tool: str = "") -> None:
    """The Parquet table; with ``cache`` (a folder), copied from there when the same table was written before
    (a fully cached rerun: pyarrow is then not even imported), and kept there when written."""
    from autograd_run.sweep.cache import copy_derived, derived, keep_derived
    cached = derived(cache, table_key(rows, tool), ".parquet") if cache is not None else None
    if cached is not None and copy_derived(cached, path):
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    types = {c: pa.int64() for c in INT_COLUMNS}
    types.update(compute_s=pa.float64(), cpu_s=pa.float64(), cached=pa.bool_())
    schema = pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])
    table = pa.table({c: [r.get(c) for r in rows] for c in COLUMNS}, schema=schema)
    atomic_write_with(path, lambda tmp: pq.write_table(table, tmp), "out")
    if cached is not None:
        keep_derived(path, cached)


def report_json(report, outputs: list[str]) -> dict:
    return {"tool": report.tool, "ran_on": report.ran_on, "points": len(report.rows), "computed": report.computed,
            "cached": report.cached, "failed": report.failed, "cancelled": report.cancelled,
            "interrupted": report.interrupted, "seconds": round(report.seconds, 3), "cache": report.cache_dir,
            "best": best_rows(report.rows), "rows": report.rows, "outputs": outputs,
            "scale_never_applied": report.scale_never_applied()}


def write_results(files: dict[str, str], report, outputs: list[str], cache: str | None = None) -> None:
    """The CSV, the JSON and (when asked) the Parquet file of a sweep (``cache``: ``write_parquet``'s)."""
    atomic_write(files["csv"], csv_bytes(report.rows), "out")
    if "parquet" in files:
        write_parquet(files["parquet"], report.rows, cache, report.tool)
    atomic_write(files["json"], json.dumps(report_json(report, outputs), indent=1).encode(), "out")
