"""Work that a test run does once, whichever pytest-xdist worker asks for it first.

``once(tmp_path_factory, key, make)``: the first caller runs ``make(folder)`` (``folder``: a new folder for its
files) and stores what it returns (JSON) beside the workers' temporary folders, under a file lock; every later
caller, in any worker, waits for the lock and reads it back. pytest-xdist's ``--dist loadgroup`` would keep such
tests on one worker, but it stopped grouping under pytest 9.2 (pytest-dev/pytest-xdist#1386); a session fixture
alone would run ``make`` once per worker. An exception from ``make`` is stored as its text: every caller gets
``OnceFailed`` with it, without running ``make`` again.
"""

from __future__ import annotations

import fcntl
import json
import os


class OnceFailed(RuntimeError):
    """``make`` raised, in this worker or another: the message is its text."""


def once(tmp_path_factory, key: str, make):
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    done = root / f"{key}.json"
    with open(root / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # guards done: held while make runs, released when the file closes
        if not done.exists():
            folder = root / key
            folder.mkdir(exist_ok=True)
            try:
                result = {"value": make(str(folder))}
            except Exception as exc:  # noqa: BLE001 - kept for the other callers
                result = {"error": f"{type(exc).__name__}: {exc}"}
            tmp = done.with_suffix(".part")
            tmp.write_text(json.dumps(result))
            os.replace(tmp, done)
        result = json.loads(done.read_text())
    if "error" in result:
        raise OnceFailed(result["error"])
    return result["value"]
