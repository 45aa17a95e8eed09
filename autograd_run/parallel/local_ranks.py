"""Local processes run as the ranks of one job, with one deadline for all of them.

``run_local_ranks(argvs, env, timeout)`` starts one process per argv, waits
for every one until the deadline and returns each one's (exit code, stdout,
stderr) in rank order; past the deadline every process still running is
killed and ``RanksTimedOut`` carries what each printed on stderr. Used by
``calibrate --gloo`` and by the tests' DDP oracle (``tests/support``).
"""

from __future__ import annotations

import subprocess
import time


class RanksTimedOut(Exception):
    """The ranks missed their deadline; ``stderr``: each rank's, in rank order."""

    def __init__(self, stderr: list[str]):
        super().__init__("the ranks missed their deadline")
        self.stderr = stderr


def run_local_ranks(argvs: list[list[str]], env: dict, timeout: float, cwd=None) -> list[tuple[int, str, str]]:
    procs = [subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    deadline = time.monotonic() + timeout
    outs: list[tuple[str, str]] = []
    try:
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RanksTimedOut([q.communicate()[1] or "" for q in procs]) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
