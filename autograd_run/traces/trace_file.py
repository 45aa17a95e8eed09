"""Writing a Recording to a trace file: one table from the path's ending to the writer.

``FORMATS`` holds one row per format, tried in order (the last, Chrome JSON,
takes any other ending):

* ``pftrace``: ``.pftrace`` / ``.perfetto-trace``, Perfetto's protobuf format (``traces.pftrace``);
* ``kineto``: ``.kineto.json`` / ``.kineto.json.gz``, the JSON that ``torch.profiler`` writes, for
  Holistic Trace Analysis and PyTorch's own tools (``traces.kineto``; gzipped for ``.gz``);
* ``json.gz``: ``.gz`` (``.json.gz``), the Chrome JSON trace gzip-compressed (``traces.chrome``);
* ``json``: anything else (``.json``), the Chrome JSON trace.

``--trace-format NAME`` picks a row whatever the ending. The three Chrome and
protobuf forms open in the Perfetto UI and its trace processor with the same
tracks, slices, flows and counters, and node slices with the same arguments
(including ``pass``, ``worker``, ``critical_path`` and ``graph_root``, what
``diff`` reads from a JSON trace); the Kineto trace shows what PyTorch's
profiler would have recorded of the run (``diff`` and ``simulate --costs``
read it too).

A new format is one writer module (a ``TraceWriter``: ``write(path, rec,
incomplete)``, writing atomically, over ``traces.layout`` for what the trace
shows) and one row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autograd_run.record.recording import Recording


class TraceWriter(Protocol):
    def __call__(self, path: str, rec: Recording, incomplete: str | None) -> None:
        """Write ``rec`` to ``path`` atomically; a stopped run's trace (``incomplete``: ``interrupted`` or
        ``timeout``) says so in the file."""


def _pftrace(path: str, rec: Recording, incomplete: str | None) -> None:
    from autograd_run.traces.pftrace import write_pftrace
    write_pftrace(path, rec, incomplete)


def _kineto(path: str, rec: Recording, incomplete: str | None) -> None:
    from autograd_run.traces.kineto import write_kineto_trace
    write_kineto_trace(path, rec, incomplete)


def _json_gz(path: str, rec: Recording, incomplete: str | None) -> None:
    from autograd_run.traces.chrome import write_chrome_trace
    write_chrome_trace(path, rec, compress=True, incomplete=incomplete)


def _json(path: str, rec: Recording, incomplete: str | None) -> None:
    from autograd_run.traces.chrome import write_chrome_trace
    write_chrome_trace(path, rec, compress=False, incomplete=incomplete)


@dataclass(frozen=True)
class TraceFormat:
    name: str
    #: Path endings (lower case) that select it; empty: any path (the default, last in the table).
    suffixes: tuple[str, ...]
    write: TraceWriter


FORMATS = (
    TraceFormat("pftrace", (".pftrace", ".perfetto-trace"), _pftrace),
    TraceFormat("kineto", (".kineto.json", ".kineto.json.gz"), _kineto),
    TraceFormat("json.gz", (".gz",), _json_gz),
    TraceFormat("json", (), _json),
)
#: The endings of Perfetto's protobuf traces (readers refuse them by these, too).
PROTO_SUFFIXES = FORMATS[0].suffixes


#: The names ``--trace-format`` takes (``auto``: from the path's ending).
FORMAT_NAMES = tuple(f.name for f in FORMATS)


def format_of(path: str, name: str | None = None) -> TraceFormat:
    """The format named ``name`` (None or ``auto``: the one the path's ending selects)."""
    if name and name != "auto":
        return next(f for f in FORMATS if f.name == name)
    lower = path.lower()
    return next(f for f in FORMATS if not f.suffixes or lower.endswith(f.suffixes))


def trace_format(path: str, name: str | None = None) -> str:
    """``pftrace``, ``kineto``, ``json.gz`` or ``json``."""
    return format_of(path, name).name


#: A plain JSON trace larger than this is written, with a warning that suggests a compact format: the
#: Perfetto UI loads JSON traces into the browser's memory (a few hundred MB is its practical limit).
LARGE_JSON_BYTES = 100 * 1024 * 1024


def write_trace(path: str, rec: Recording, incomplete: str | None = None, fmt: str | None = None) -> str | None:
    """Write ``rec`` to ``path`` atomically, in the format its ending names. A stopped run's trace
    (``incomplete``: ``interrupted`` or ``timeout``) is marked so: in JSON ``"otherData": {"incomplete":
    REASON}`` and an instant event at its end; in protobuf that instant event (category ``incomplete``, on
    a global track named ``incomplete``). Returns a warning for the caller to show (``large_trace_warning``),
    or None."""
    f = format_of(path, fmt)
    f.write(path, rec, incomplete)
    return large_trace_warning(path, f.name)


def large_trace_warning(path: str, fmt_name: str, limit: int | None = None) -> str | None:
    """The warning for a plain JSON trace over ``limit`` bytes (its size, and the formats made for big
    graphs), else None. The path is shown escaped."""
    import os
    from autograd_run.text import visible
    if fmt_name != "json":
        return None
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size <= (LARGE_JSON_BYTES if limit is None else limit):
        return None
    return (f"warning: the trace {visible(path)} is {size / 1e6:.0f} MB of plain JSON; the Perfetto UI may not "
            f"open it: for big graphs write .pftrace (Perfetto's protobuf, about 5x smaller) or .json.gz (about 10x)")
