"""What every command shares: error lines, escaping of untrusted text, graph output formats."""

from __future__ import annotations

import click

from autograd_run.cli.terminal import escape, escape_lines, stdout_closed
from autograd_run.errors import GraphFileError, UsageError

__all__ = ["escape", "echo", "write", "stdout_closed", "error_line", "note_lines", "graph_format", "Finite",
           "Seconds", "Whole"]


def echo(msg: str, err: bool = False) -> None:
    """One line of output whose text may come from files or users: escaped, so it stays one line."""
    write(escape(msg), err=err)


def write(text: str, err: bool = False) -> None:
    """``text`` and a newline on stdout (or stderr), as it is; a reader that went away is not an error."""
    try:
        click.echo(text, err=err)
    except BrokenPipeError:
        stdout_closed()


def note_lines(text: str, err: bool = True, indent: str = "  ") -> None:
    """A multi-line text from a file (a forward trace) on stderr: each line escaped and indented."""
    for line in escape_lines(text, indent):
        click.echo(line, err=err)


def error_line(msg: str) -> None:
    """``Error: MSG`` on stderr, as one line: nothing in ``msg`` can start another line or drive the terminal."""
    click.echo(f"Error: {escape(msg)}", err=True)


GRAPH_EXTENSIONS = (".json", ".yaml", ".yml")


def graph_format(path: str, flag: str = "-o") -> str:
    """``json`` or ``yaml`` by ``path``'s extension; a usage error for any other extension."""
    lower = path.lower()
    if not lower.endswith(GRAPH_EXTENSIONS):
        raise UsageError(f"{flag} must end in .json, .yaml or .yml")
    return "yaml" if lower.endswith((".yaml", ".yml")) else "json"


class Whole(click.IntRange):
    """An integer option whose range --help and errors say in words (``at least 1``, ``0 to 2**62``),
    not as ``0<=x<=4611686018427387904``."""

    def __init__(self, min: int | None = None, max: int | None = None, words: str | None = None):
        super().__init__(min, max)
        self.words = words or (f"at least {min}" if max is None else f"{min} to {max}")

    def _describe_range(self) -> str:
        return self.words

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: must be a whole number, {self.words}", param, ctx)


class Finite(click.FloatRange):
    """A number in a range, never NaN or infinite: click's own range lets ``nan`` through (it compares
    false with both ends) and ``inf`` past an open top, and neither is a tolerance, a level or a time.
    --help says the range in words, as ``Whole`` does."""

    def _describe_range(self) -> str:
        low = None if self.min is None else f"{'more than' if self.min_open else 'at least'} {self.min:g}"
        high = None if self.max is None else f"{'less than' if self.max_open else 'at most'} {self.max:g}"
        if low and high and not (self.min_open or self.max_open):
            return f"{self.min:g} to {self.max:g}"
        return ", ".join(w for w in (low, high) if w)

    def convert(self, value, param, ctx):
        import math
        try:
            rv = super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: must be a number, {self._describe_range()}", param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r}: must be a finite number", param, ctx)
        return rv


class Seconds(Finite):
    """A positive, finite number of seconds."""

    name = "seconds"

    def __init__(self):
        super().__init__(0, min_open=True)

    def _describe_range(self) -> str:
        return "more than 0"

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: must be a finite number of seconds, more than 0", param, ctx)


#: The name a graph read from standard input goes by in messages.
STDIN_NAME = "<stdin>"


def _byte_size(ctx, param, value):
    if value is None:
        return None
    from autograd_run.graphs.validate import parse_byte_size
    try:
        return parse_byte_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


#: ``--max-memory SIZE``: the memory budget a graph may need to run (``max_memory``: bytes or None).
max_memory_option = click.option(
    "--max-memory", default=None, metavar="SIZE", callback=_byte_size,
    help="Memory budget the graph may need to run (saved values, gradients, references), e.g. 8GiB  "
         "[default: half of the memory available, bounded by a container's limit and ulimit -v]")


#: ``--memory-limit SIZE``: bytes per device the pass must fit in (``memory_limit``: bytes or None).
memory_limit_option = click.option(
    "--memory-limit", default=None, metavar="SIZE", callback=_byte_size,
    help="Report the first node at which the pass's allocated bytes on a device would pass SIZE (e.g. 16GiB; "
         "exit 4 when it does)")


#: Graphs up to this many nodes get the memory model by default (it costs about 10 µs a node, in Python).
MEMORY_AUTO_NODES = 100_000

#: ``--memory/--no-memory``: model the pass's memory (``memory``: True, False or None for the default).
memory_option = click.option(
    "--memory/--no-memory", default=None,
    help="Model the pass's memory: the summary's memory table, --json's memory, the trace's counter tracks "
         f"[default: for graphs of up to {MEMORY_AUTO_NODES:,} nodes, or with --memory-limit]")


#: ``--memory-snapshot FILE.pickle``: the pass's allocations as ``torch.cuda.memory._snapshot()`` writes them.
memory_snapshot_option = click.option(
    "--memory-snapshot", default=None, metavar="FILE.pickle",
    help="Write the pass's allocations and frees as a memory snapshot that PyTorch's MemoryViz opens "
         "(pytorch.org/memory_viz; or python -m torch.cuda._memory_viz trace_plot FILE.pickle -o out.html)")


def want_memory(memory: bool | None, graph, memory_limit: int | None, snapshot: str | None = None) -> bool:
    """Whether a command models the pass's memory (``--memory``, ``--no-memory``, or the default; a memory
    snapshot or a limit needs it)."""
    from autograd_run.errors import UsageError
    if memory is False and memory_limit is not None:  # the limit would go unchecked, silently
        raise UsageError("--memory-limit needs the memory model, which --no-memory turns off: give one of them")
    if memory is False and snapshot is not None:
        raise UsageError("--memory-snapshot needs the memory model, which --no-memory turns off: give one of them")
    if memory is not None:
        return memory
    return memory_limit is not None or snapshot is not None or len(graph.nodes) <= MEMORY_AUTO_NODES


class OneShot:
    """``main()`` without arguments (the console script) runs the process's command line, and the process
    ends with it: it passes one of these as click's context object, so a command may treat what it loads as
    living until exit. ``done``: set by a ``one_shot_work`` command that ended without an error (``main``
    may then end the process at once: ``exit_now``)."""

    def __init__(self):
        #: inside a ``one_shot_work`` command (the collector off throughout; frozen after an error)
        self.working = False
        self.done = False


def _one_shot() -> OneShot | None:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return obj if isinstance(obj, OneShot) else None


def one_shot_work(command):
    """A command whose work allocates millions of objects that live until it ends (a simulation's records,
    its recording and summary): run as the process's own command line (``OneShot``), the cyclic
    collector stays off for the whole command. Each ``graphs.load.gc_paused`` block inside would otherwise
    end with a collection scanning everything it made (about 2 s at 1e6 nodes, after each of the
    simulation, the recording, the summary and the memory model); the process ends with the command, so the
    cycles it leaves are freed at exit either way. Where it ends without an error, ``main`` ends the process
    at once once its output is flushed (``exit_now``: the interpreter's teardown freed a million-node
    simulation object by object, 0.15 s, and the collector's final pass needed everything frozen first,
    0.16 s more); after an error, what is alive is frozen (``gc.freeze``) and the collector turned back on, and
    the process ends as usual. Called from a library or a test, the command runs as it would without this."""
    import functools

    @functools.wraps(command)
    def run(*args, **kwargs):
        shot = _one_shot()
        if shot is None:
            return command(*args, **kwargs)
        import gc
        was = gc.isenabled()
        gc.disable()
        shot.working = True
        try:
            out = command(*args, **kwargs)
        except BaseException:
            gc.freeze()
            if was:
                gc.enable()
            raise
        shot.done = True
        return out
    return run


def exit_now(shot: OneShot, code: int) -> None:
    """End the process with ``code`` at once, its standard streams flushed, where the command that ran was a
    ``one_shot_work`` one that ended without an error (``shot.done``) and no other thread is still running (a
    thread of its own would be cut off); else return (the caller exits as usual). Every file the command
    writes is closed by then (each written inside a ``with`` block, or atomically through a closed temporary
    file)."""
    import os
    import sys
    import threading
    if not shot.done:
        return
    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()):
        import gc
        gc.freeze()  # (the usual end: what is alive is not scanned by the collector's last pass)
        gc.enable()
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            from autograd_run.cli.terminal import stdout_closed
            stdout_closed()
        except (OSError, ValueError):
            pass
    os._exit(code)


def load_graph_arg(ref: str, fmt: str | None = None, *, max_bytes: int | None = None,
                   allow_python: bool = True, check_data: bool = False, keep: bool = False):
    """The graph a command-line argument names: a file, ``example:NAME``, or ``-`` for standard input
    (format ``fmt``, else from the content). A graph from stdin has no folder, so it cannot use
    ``.npz`` side files; the error says so. ``max_bytes``, ``allow_python`` and ``check_data`` as for
    ``graphs.load.load_graph``.

    ``keep``: the graph lives until the process exits (the command's one graph). When ``main()`` runs
    the process's own command line (``OneShot``), the graph is then loaded with the cyclic collector off
    and frozen (``gc.freeze``) before it is turned back on: a loaded graph is millions of objects,
    which the collector would otherwise scan as they age through its generations and each time the
    run allocates (at 2e5 nodes about 2 s, and 1.5 s more at exit). A command called from a library
    or a test loads as a library does: frozen objects in a cycle would never be freed there."""
    if not (keep and _one_shot()):
        return _load_graph_arg(ref, fmt, max_bytes, allow_python, check_data)
    import gc
    was = gc.isenabled()
    gc.disable()
    try:
        g = _load_graph_arg(ref, fmt, max_bytes, allow_python, check_data)
        # A loaded graph holds no cycle, so it would be freed node by node when the command lets it go (~4 s
        # at ten million nodes): a cycle holds it instead, frozen with it, which no collection looks at
        # again; the process ends without freeing it (the system takes the memory back at once).
        holder = [g]
        holder.append(holder)
        if not _one_shot().working:  # (a one_shot_work command keeps the collector off, and freezes after an error)
            gc.freeze()
        return g
    finally:
        if was:
            gc.enable()


def _load_graph_arg(ref: str, fmt: str | None, max_bytes: int | None, allow_python: bool, check_data: bool):
    from autograd_run.graphs.load import load_graph, load_graph_bytes, read_stream
    if ref != "-":
        if fmt is not None:
            raise UsageError("--format applies to a graph read from stdin (-) only; a file's extension gives its format")
        return load_graph(ref, max_bytes=max_bytes, allow_python=allow_python, check_data=check_data)
    import sys
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("-: no graph on stdin (it is a terminal); pipe one in, e.g. cat graph.json | autograd-run -")
    data = read_stream(sys.stdin.buffer, STDIN_NAME)
    try:
        return load_graph_bytes(data, STDIN_NAME, None, fmt=fmt or "auto", max_bytes=max_bytes,
                                allow_python=allow_python, check_data=check_data)
    except GraphFileError as exc:
        if "npz" in exc.what or "side file" in exc.what:
            raise GraphFileError(exc.file, exc.where, f"{exc.what} (a graph read from stdin has no folder for side "
                                 "files: give it as a file beside its .npz)") from None
        raise
