"""Writing a Recording to a trace file, the format chosen by the path's ending.

* ``.json.gz`` (or any ``.gz``): the Chrome JSON trace, gzip-compressed;
* anything else (``.json``): the Chrome JSON trace (``traces.chrome``).
"""

from __future__ import annotations

from autograd_run.traces.recording import Recording


def trace_format(path: str) -> str:
    """``json.gz`` or ``json``."""
    return "json.gz" if path.lower().endswith(".gz") else "json"


def write_trace(path: str, rec: Recording) -> None:
    """Write ``rec`` to ``path`` atomically, in the format its ending names."""
    from autograd_run.traces.chrome import write_chrome_trace
    write_chrome_trace(path, rec, compress=trace_format(path) == "json.gz")
