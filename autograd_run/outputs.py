"""Writing output files safely: never over an input of the run, checked before the run, atomically."""

from __future__ import annotations

import contextlib
import os

from autograd_run.errors import RequestError


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
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RequestError(f"{path}: no such directory: {os.path.dirname(path) or '.'}", option)
    if not os.access(parent, os.W_OK):
        raise RequestError(f"{path}: the directory is not writable", option)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise RequestError(f"{path}: the file is not writable", option)


def atomic_write(path: str, data: bytes, option: str) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
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
    block ends without an error (and removed when it fails)."""
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
