"""Run CLI invocations in forked children under memory and time limits; print the results as JSON.

Used by ``tests/test_hostile.py``: ``python driver.py < cases.json`` where
cases.json is a list of ``[name, cwd, argv]``. The driver imports the CLI
once, sets ``RLIMIT_AS`` (``--mem`` bytes) for itself and so for every
child, and forks one child per invocation (a fresh process with its own
stdout/stderr files, much faster than a new interpreter each time). A child
that runs past ``--timeout`` seconds is killed and reported as a hang.
Results: ``{name: {"rc": int|None, "out": str, "err": str, "seconds": float, "hang": bool}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mem", type=int, default=2 << 30)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    cases = json.load(sys.stdin)
    resource.setrlimit(resource.RLIMIT_AS, (args.mem, args.mem))
    from autograd_run.cli.main import main as cli_main  # imported once, before forking
    # What the commands import lazily, imported here once so that each child starts warm.
    import autograd_run.cli.render  # noqa: F401
    import autograd_run.engine.run  # noqa: F401
    import autograd_run.graphs.load  # noqa: F401
    import autograd_run.traces.chrome  # noqa: F401
    import autograd_run.traces.order  # noqa: F401
    import autograd_run.record.recorder  # noqa: F401
    import autograd_run.analysis.summary  # noqa: F401
    import rich.console  # noqa: F401
    import rich.table  # noqa: F401

    results = {}
    running: dict[int, tuple] = {}
    tmp = tempfile.mkdtemp(prefix="hostile-driver-")
    queue = list(cases)

    def start(name, cwd, argv):
        out_path, err_path = os.path.join(tmp, f"{len(results) + len(running)}.out"), \
            os.path.join(tmp, f"{len(results) + len(running)}.err")
        pid = os.fork()
        if pid == 0:  # the child: run the CLI as `autograd-run ARGV` would
            code = 70
            try:
                os.chdir(cwd)
                fd_out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                fd_err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd_out, 1)
                os.dup2(fd_err, 2)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                try:
                    cli_main(argv)
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 99
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        running[pid] = (name, time.monotonic(), out_path, err_path)

    def finish(pid, status, hang=False):
        name, t0, out_path, err_path = running.pop(pid)
        rc = None if hang else (os.waitstatus_to_exitcode(status))
        with open(out_path, errors="replace") as f:
            out = f.read()
        with open(err_path, errors="replace") as f:
            err = f.read()
        results[name] = {"rc": rc, "out": out[-4000:], "err": err[-8000:],
                         "seconds": round(time.monotonic() - t0, 3), "hang": hang}

    while queue or running:
        while queue and len(running) < args.jobs:
            start(*queue.pop(0))
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            finish(pid, status)
            continue
        now = time.monotonic()
        for pid, (name, t0, _, _) in list(running.items()):
            if now - t0 > args.timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                finish(pid, 0, hang=True)
        time.sleep(0.005)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
