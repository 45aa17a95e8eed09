"""Writing a Recording to a trace file, the format chosen by the path's ending.

* ``.pftrace`` / ``.perfetto-trace``: Perfetto's protobuf format (``traces.pftrace``);
* ``.json.gz`` (or any ``.gz``): the Chrome JSON trace, gzip-compressed;
* anything else (``.json``): the Chrome JSON trace (``traces.chrome``).

All three open in the Perfetto UI and its trace processor with the same
tracks, slices, flows and counters, and node slices with the same
arguments (including ``pass``, ``worker``, ``critical_path`` and
``graph_root``, what ``diff`` reads from a JSON trace).
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


def write_trace(path: str, rec: Recording, incomplete: str | None = None) -> None:
    """Write ``rec`` to ``path`` atomically, in the format its ending names. A stopped run's trace
    (``incomplete``: ``interrupted`` or ``timeout``) is marked so: in JSON ``"otherData": {"incomplete":
    REASON}`` and an instant event at its end; in protobuf that instant event (category ``incomplete``, on
    a global track named ``incomplete``)."""
    fmt = trace_format(path)
    if fmt == "pftrace":
        from autograd_run.traces.pftrace import write_pftrace
        write_pftrace(path, rec, incomplete)
    else:
        from autograd_run.traces.chrome import write_chrome_trace
        write_chrome_trace(path, rec, compress=fmt == "json.gz", incomplete=incomplete)
