"""The tool's fingerprint and each grid point's cache key.

A point's result is a pure function of the graph file's bytes, the side
files it reads, the point's options (with the machine spec's full content,
not its name) and the tool that computed it. The tool is identified by its
version and a hash of every source and data file of the installed
``autograd_run`` package, so a code change invalidates the cache even when
the version number does not move, and a worker that runs other code than the
client is noticed (``cluster`` compares fingerprints before a sweep).
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache

import autograd_run

#: Bump when the meaning of a cached row changes without the code hash changing.
CACHE_FORMAT = 1


@lru_cache(maxsize=1)
def tool_fingerprint() -> str:
    """``VERSION+SHA`` over the package's ``.py``/``.json``/``.yaml`` files (paths and bytes, sorted)."""
    root = os.path.dirname(os.path.abspath(autograd_run.__file__))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".json", ".yaml")):
                full = os.path.join(folder, f)
                h.update(os.path.relpath(full, root).replace(os.sep, "/").encode() + b"\0")
                with open(full, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    return f"{autograd_run.__version__}+{h.hexdigest()[:16]}"


def point_key(graph_sha: str, side: dict[str, str], point_fields: dict, tool: str | None = None) -> str:
    """The cache key of one point: sha256 of its canonical JSON description."""
    doc = {"format": CACHE_FORMAT, "tool": tool or tool_fingerprint(), "graph": graph_sha, "side": side,
           "point": point_fields}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
