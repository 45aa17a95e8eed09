"""The sweep's glob: the shell's patterns, over a bounded walk that never follows a link to a folder.

``find(pattern)`` returns the regular-file paths ``pattern`` matches,
sorted. ``*``, ``?`` and ``[...]`` match within one path component and
never a leading dot (as ``glob`` does); ``**`` as a whole component matches
any number of folders, itself included. A pattern without ``**`` goes to
``glob.glob``, whose walk has a fixed depth. One with ``**`` is walked
here: ``glob``'s recursive walk follows links to folders, so one link back
to a parent made ``**/*.json`` walk for ever (found by a hostile review).
Here links to folders are listed but not entered, hidden folders are not
entered, and the walk stops with ``GlobTooLarge`` after ``MAX_ENTRIES``
entries, before it has taken unbounded time.
"""

from __future__ import annotations

import glob
import os
import re

#: The most folder entries one ``**`` walk reads before it gives up.
MAX_ENTRIES = 200_000


class GlobTooLarge(Exception):
    """A ``**`` walk read more than ``MAX_ENTRIES`` entries."""


def _component(part: str) -> str:
    """A regular expression for one path component of a shell pattern."""
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = part.find("]", i + 2 if part[i + 1:i + 2] in ("!", "]") else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = part[i + 1:j]
                neg = body.startswith("!")
                body = body[1:] if neg else body
                out.append("[" + ("^" if neg else "") + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    rx = "".join(out)
    return rx if part.startswith(".") else f"(?!\\.){rx}"


def _regex(parts: list[str]) -> re.Pattern:
    rx = ""
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if part == "**":
            rx += r"(?:(?!\.)[^/]+/)*" + (r"(?!\.)[^/]+" if last else "")
        else:
            rx += _component(part) + ("" if last else "/")
    return re.compile(rx)


def find(pattern: str) -> list[str]:
    """The regular files ``pattern`` (an absolute or working-directory-relative path pattern) matches."""
    if "**" not in pattern.split(os.sep):
        return sorted(m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m))
    parts = pattern.split(os.sep)
    first = next(k for k, p in enumerate(parts) if glob.has_magic(p))
    top = os.sep.join(parts[:first]) or (os.sep if pattern.startswith(os.sep) else os.curdir)
    rx = _regex(parts[first:])
    out, seen = [], 0
    for folder, subfolders, files in os.walk(top, followlinks=False):
        seen += len(subfolders) + len(files)
        if seen > MAX_ENTRIES:
            raise GlobTooLarge(f"walks more than {MAX_ENTRIES:,} folder entries under {top}; narrow it")
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        rel = os.path.relpath(folder, top)
        for name in files:
            r = name if rel == os.curdir else os.path.join(rel, name)
            if rx.fullmatch(r.replace(os.sep, "/")):
                full = os.path.join(top, r) if top != os.curdir else r
                if os.path.isfile(full):
                    out.append(full)
    return sorted(out)
