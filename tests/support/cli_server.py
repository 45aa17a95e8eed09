"""Running an ``autograd-run`` command that serves a trace, as a real subprocess, for the viewer tests.

``ServingCommand(args)`` starts ``python -m autograd_run.cli.main ARGS``
with no display (so no browser is opened), reads the URL it prints (from
stdout or stderr) within a deadline, and on exit stops the process if it
still runs. Nothing here waits without a bound.
"""

from __future__ import annotations

import os
import pathlib
import re
import queue
import signal
import subprocess
import sys
import threading
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
URL = re.compile(r"^(http://127\.0\.0\.1:\d+/)$")


class ServingCommand:
    def __init__(self, args: list[str], url_timeout: float = 120):
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "autograd_run.cli.main", *args], cwd=str(REPO_ROOT),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self._readers = [threading.Thread(target=self._read, args=(f, lines), daemon=True)
                         for f, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()
        self.url = self._read_url(url_timeout)

    def _read(self, f, lines: list) -> None:  # ends when the process closes the pipe
        for line in f:
            lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _read_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        closed = 0
        while closed < 2:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                closed += 1
                continue
            m = URL.match(line.strip())
            if m:
                return m.group(1)
        self.stop()
        raise AssertionError(f"no URL printed; stdout: {''.join(self.out)!r} stderr: {''.join(self.err)!r}")

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """The exit code, stdout and stderr once the command ends (within ``timeout`` seconds, else it is killed)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the command did not stop within {timeout} s") from None
        for t in self._readers:
            t.join(10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def interrupt(self) -> None:
        """Ctrl-C."""
        self.proc.send_signal(signal.SIGINT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
