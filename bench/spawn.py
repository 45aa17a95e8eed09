"""``python -m bench.spawn OUT CMD...``: run CMD as a child of this small process; write its figures to OUT.

OUT gets one JSON object: ``wall`` (s), ``cpu`` (user + system s), ``rss``
(peak resident bytes) and ``returncode``. CMD inherits stdin, stdout and
stderr.

Why a launcher: on Linux a child's ``ru_maxrss`` (from ``wait4``) is at
least the resident size of the process it was forked from, since ``exec``
records the high-water mark of the memory it replaces (a copy of the
parent's, even with ``vfork``). A benchmark process that has grown (the
in-process parts, numpy, torch) then reports its own size for every
command it runs: ``python -m bench`` once measured 4821 B/node for
``validate``, ``run`` and ``run --trace`` alike on a 1e6-node graph, all the
parent's 4.8 GB. Forked from this process, which has just started and
imports nothing heavy, a command's figure is its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    out, cmd = argv[0], argv[1:]
    t = time.perf_counter()
    p = subprocess.Popen(cmd)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    code = p.returncode = os.waitstatus_to_exitcode(status)
    with open(out, "w") as f:
        json.dump({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss": ru.ru_maxrss * 1024,
                   "returncode": code}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
