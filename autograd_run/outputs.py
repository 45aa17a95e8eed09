"""Writing output files safely: never over an input of the run, checked before the run, atomically."""

from __future__ import annotations

import contextlib
import os

from autograd_run.errors import RequestError


def cache_dir(*parts: str) -> str:
    """``$XDG_CACHE_HOME/autograd-run/...`` (``~/.cache/autograd-run/...``): what calibrate and the sweep keep."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autograd-run", *parts)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


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
    import stat
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
            with open(path, "wb") as f:
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


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
