"""Writing a Recording to a trace file, the format chosen by the path's ending.

* ``.pftrace`` / ``.perfetto-trace``: Perfetto's protobuf format (``traces.pftrace``);
* ``.json.gz`` (or any ``.gz``): the Chrome JSON trace, gzip-compressed;
* anything else (``.json``): the Chrome JSON trace (``traces.chrome``).

All three open in the Perfetto UI and its trace processor with the same
tracks, slices, flows and counters.
"""

from __future__ import annotations

from autograd_run.traces.recording import Recording

PROTO_SUFFIXES = (".pftrace", ".perfetto-trace")


def trace_format(path: str) -> str:
    """``pftrace``, ``json.gz`` or ``json``."""
    lower = path.lower()
    if lower.endswith(PROTO_SUFFIXES):
        return "pftrace"
    if lower.endswith(".gz"):
        return "json.gz"
    return "json"


def write_trace(path: str, rec: Recording) -> None:
    """Write ``rec`` to ``path`` atomically, in the format its ending names."""
    fmt = trace_format(path)
    if fmt == "pftrace":
        from autograd_run.traces.pftrace import write_pftrace
        write_pftrace(path, rec)
    else:
        from autograd_run.traces.chrome import write_chrome_trace
        write_chrome_trace(path, rec, compress=fmt == "json.gz")
