"""Results cached on disk, one small JSON file per grid point, keyed by ``fingerprint.point_key``.

Layout: ``DIR/ab/abcdef....json`` holding ``{"key", "tool", "row"}``; files derived from the results (the
plots, the Parquet table) under ``DIR/plots/`` and ``DIR/tables/``, each named by the hash of what it holds
(``derived``, ``copy_derived``, ``keep_derived``). Only
the client reads and writes it (workers never see the cache), writes are
atomic (a temporary file renamed into place), and an entry that cannot be
read or does not match its key is a miss, not an error. Failed points are
never cached: a rerun tries them again.
"""

from __future__ import annotations

import json
import os

from autograd_run.errors import RequestError

MAX_ENTRY_BYTES = 1 << 20


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/autograd-run/sweep`` (``~/.cache/autograd-run/sweep``)."""
    from autograd_run.outputs import cache_dir
    return cache_dir("sweep")


class ResultCache:
    def __init__(self, folder: str):
        self.folder = folder
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise RequestError(f"{folder}: cannot create the cache folder: {exc.strerror or exc}", "cache") from None
        if not os.access(folder, os.W_OK):
            raise RequestError(f"{folder}: the cache folder is not writable", "cache")

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, key[:2], key + ".json")

    def get(self, key: str) -> dict | None:
        try:
            with open(self._path(key), "rb") as f:
                data = f.read(MAX_ENTRY_BYTES + 1)
            doc = json.loads(data)
        except (OSError, ValueError):
            return None
        if len(data) > MAX_ENTRY_BYTES or not isinstance(doc, dict) or doc.get("key") != key \
                or not isinstance(doc.get("row"), dict):
            return None
        return doc["row"]

    def put(self, key: str, tool: str, row: dict) -> bool:
        """Store ``row``; False when it could not be written (a full disk: the sweep goes on, uncached)."""
        path = self._path(key)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"key": key, "tool": tool, "row": row}, f)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        return True


def derived(folder: str, key: str, suffix: str) -> str:
    """Where a file derived from results (a plot, a table) is kept: named by the hash ``key`` of what it holds."""
    return os.path.join(folder, key[:2], key + suffix)


def _copy(src: str, dest: str) -> bool:
    """``src`` copied to ``dest`` through a temporary file renamed into place; False when it failed."""
    import shutil
    from autograd_run.outputs import atomic_write_with
    try:
        atomic_write_with(dest, lambda tmp: shutil.copyfile(src, tmp), "cache")
    except RequestError:
        return False
    return True


def copy_derived(cached: str, path: str) -> bool:
    """Write the kept file ``cached`` to ``path``; False when there is none or it cannot be copied (a miss: the
    caller makes the file itself, and a problem with ``path`` is then reported by that)."""
    return os.path.isfile(cached) and _copy(cached, path)


def keep_derived(path: str, cached: str) -> None:
    """Keep the file just written at ``path`` as ``cached``; a cache that cannot be written is passed over."""
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
    except OSError:
        return
    _copy(path, cached)
