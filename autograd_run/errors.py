"""The project's exception hierarchy, each class mapped to a CLI exit code.

``GraphFileError``  exit 2: the graph file (or an option naming it) is wrong.
``RequestError``    exit 2: a request to the library is wrong (an unknown input, an
                    unwritable output path); ``option`` names the request field, so
                    the command line can name its own flag.
``UsageError``      exit 2: the command line itself is wrong.
``BackwardError``   exit 1: the backward pass raised (a node failed).
``OrderMismatch``   exit 3: the executed order or gradients differ from a golden one.
``MemoryLimitExceeded`` exit 4: the pass would not fit in the memory limit asked for
                    (``--memory-limit``): the run or simulation finished, its results are shown.
``RunInterrupted``  exit 130 (Ctrl-C) or 124 (the run's time limit): the run was stopped
                    before it finished; what was recorded is written, marked incomplete.

User mistakes are reported as ``Error: <message>`` without a traceback.
"""

from __future__ import annotations

import re

#: Characters that would break an error message over lines or hide text (C0/C1 controls,
#: DEL, Unicode line and paragraph separators, bidirectional overrides).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x00``, ``\\u202e``): one printable line."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class AutogradRunError(Exception):
    """Base of every error the command line reports without a traceback."""

    exit_code = 1


class GraphFileError(AutogradRunError):
    """A graph file is malformed, inconsistent or unsafe.

    ``file`` names the file, ``where`` the place in it (``line 3, column 5``
    for YAML, a JSON path or node id for JSON) and ``what`` the problem.
    """

    exit_code = 2

    def __init__(self, file: str, where: str | None, what: str):
        # Graph files are untrusted: what they put in a message (ids, keys, file names) must
        # not break it over lines; "Error: FILE: PLACE: WHAT" stays one line.
        self.file = one_line(str(file))
        self.where = None if where is None else one_line(where)
        self.what = one_line(what)
        file, where, what = self.file, self.where, self.what
        loc = f"{file}: {where}" if where else file
        super().__init__(f"{loc}: {what}")


class RequestError(AutogradRunError):
    """A run was asked for something that cannot be done; ``option`` is the request field at fault."""

    exit_code = 2

    def __init__(self, message: str, option: str | None = None):
        self.option = option
        super().__init__(message)


class UsageError(AutogradRunError):
    exit_code = 2


class BackwardError(AutogradRunError):
    """Raised by the engine in the calling thread when a node failed.

    ``node_id``/``node_name`` say which node; ``__cause__`` is the original
    exception (its traceback is shown only with ``--verbose``).
    """

    exit_code = 1

    def __init__(self, message: str, node_id: str | None = None, node_name: str | None = None):
        self.node_id = node_id
        self.node_name = node_name
        super().__init__(message)


class OrderMismatch(AutogradRunError):
    exit_code = 3


class MemoryLimitExceeded(AutogradRunError):
    exit_code = 4


class RunInterrupted(BackwardError):
    """A run stopped from outside: ``reason`` is ``interrupted`` (Ctrl-C, exit 130) or ``timeout``
    (``--timeout``, exit 124). The engine raises it from every backward call it stopped."""

    EXIT_CODES = {"interrupted": 130, "timeout": 124}

    def __init__(self, reason: str, message: str | None = None):
        self.reason = reason
        self.exit_code = self.EXIT_CODES.get(reason, 130)
        super().__init__(message or reason)
