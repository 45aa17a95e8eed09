"""Writing output files safely: never over an input of the run, checked before the run, atomically."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from autograd_run.errors import RequestError


def cache_dir(*parts: str) -> str:
    """``$XDG_CACHE_HOME/autograd-run/...`` (``~/.cache/autograd-run/...``): what calibrate and the sweep keep."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autograd-run", *parts)


#: The names an input read from standard input goes by (the argument, and the loaded graph's source).
STDIN_NAMES = ("-", "<stdin>")


def _same(a: str, b: str) -> bool:
    """Whether output ``a`` is input ``b``. An input read from standard input is the same as ``a`` where standard
    input is a regular file that ``a`` names (``< graph.json`` with ``--trace graph.json``, or ``/dev/stdin``)."""
    if b in STDIN_NAMES and _is_stdin_file(a):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _is_stdin_file(path: str) -> bool:
    try:
        st, fd0 = os.stat(path), os.fstat(0)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(fd0.st_mode) and (st.st_dev, st.st_ino) == (fd0.st_dev, fd0.st_ino)


def check_output_path(path: str, option: str, inputs: list[str]) -> None:
    """Refuse ``path`` when it names one of ``inputs`` or cannot be created; before any work is done."""
    for other in inputs:
        if other and _same(path, other):
            raise RequestError(f"{path}: is an input of this run; refusing to overwrite it", option)
    if os.path.isdir(path):
        raise RequestError(f"{path}: is a directory", option)
    if _in_place(path):  # /dev/null, a FIFO, a link: written through, its folder is not touched
        if not os.access(path, os.W_OK):
            raise RequestError(f"{path}: the file is not writable", option)
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RequestError(f"{path}: no such directory: {os.path.dirname(path) or '.'}", option)
    if not os.access(parent, os.W_OK):
        raise RequestError(f"{path}: the directory is not writable", option)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise RequestError(f"{path}: the file is not writable", option)


def _in_place(path: str) -> bool:
    """Whether ``path`` is written through rather than replaced: a symbolic link (replacing it would cut
    the link, e.g. /dev/stdout) or an existing file that is not a regular one (/dev/null, a FIFO: a
    rename would put a regular file in its place)."""
    try:
        return os.path.islink(path) or not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # missing (or a dangling link, caught above): a new file
        return False


def atomic_write(path: str, data: bytes, option: str) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place; a device, FIFO or
    symbolic link at ``path`` is written through instead (see ``_in_place``)."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write_with(path, write, option)


def atomic_write_with(path: str, write, option: str) -> None:
    """``write(tmp)`` makes a temporary file beside ``path`` (a library's own writer: Parquet, npz), which
    is then renamed into place; a failure removes it and is a ``RequestError`` naming ``path``. A device,
    FIFO or symbolic link at ``path`` is written through (``write(path)``): replacing it would put a
    regular file in its place or cut the link."""
    if _in_place(path):
        try:
            with _reader_held(path, option):
                write(path)
        except OSError as exc:
            raise RequestError(f"{path}: {exc.strerror or exc}", option) from None
        return
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RequestError(f"{path}: {exc.strerror or exc}", option) from None


@contextlib.contextmanager
def atomic_writer(path: str, option: str):
    """A binary file to write ``path`` through: a temporary file beside it, renamed into place when the
    block ends without an error (and removed when it fails). A device, FIFO or symbolic link at ``path``
    is written through instead (see ``_in_place``)."""
    if _in_place(path):
        try:
            with _reader_held(path, option), open(path, "wb") as f:
                yield f
        except OSError as exc:
            raise RequestError(f"{path}: {exc.strerror or exc}", option) from None
        return
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise RequestError(f"{path}: {exc.strerror or exc}", option) from None
    except BaseException:
        _unlink(tmp)
        raise


@contextlib.contextmanager
def _reader_held(path: str, option: str):
    """Where ``path`` is a FIFO: refuse it when no process has it open for reading (opening it to write would
    wait for one, for ever), else hold a write end open meanwhile, so that the writer's own open does not
    wait and the reader sees the end only when the writing is done. Anything else: nothing to do."""
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False
    if not fifo:
        yield
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise RequestError(f"{path}: a FIFO that no process is reading; start its reader first", option) from None
        raise
    try:
        yield
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
