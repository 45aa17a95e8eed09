"""The command line in a child process, as a user runs it: ``cli(args)`` -> ``Proc`` (exit code, stdout,
stderr), with a fixed terminal width, no colour and this checkout on ``PYTHONPATH``; ``cli_tty(args)`` runs
it on a pseudo-terminal (stdout and stderr a terminal, as in an interactive shell)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.environ.get("AUTOGRAD_RUN_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_env(columns: int = 200, **extra) -> dict:
    env = dict(os.environ)
    env.update({"PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""), "COLUMNS": str(columns),
                "NO_COLOR": "1", "LINES": "50", "TERM": "xterm"})
    env.pop("FORCE_COLOR", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def cli_argv(args) -> list[str]:
    return [sys.executable, "-m", "autograd_run.cli.main", *map(str, args)]


@dataclass
class Proc:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        """Every line of both streams, split at newlines and carriage returns alike."""
        return (self.out + "\n" + self.err).replace("\r", "\n").split("\n")


def cli(args, *, columns: int = 200, input: bytes | None = None, timeout: float = 60, cwd=None, **env) -> Proc:
    p = subprocess.run(cli_argv(args), input=input, capture_output=True, timeout=timeout, cwd=cwd,
                       env=cli_env(columns, **env))
    return Proc(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def cli_tty(args, *, columns: int = 80, timeout: float = 60, **env) -> Proc:
    """Run on a pseudo-terminal: stdout and stderr both go to it (merged into ``out``)."""
    import pty
    import select
    import struct
    import fcntl
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    p = subprocess.Popen(cli_argv(args), stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                         env=cli_env(columns, **env))
    os.close(slave)
    chunks = []
    try:
        while True:
            r, _, _ = select.select([master], [], [], timeout)
            if not r:
                p.kill()
                raise TimeoutError(f"no output for {timeout} s: {args}")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        code = p.wait(timeout)
    return Proc(code, b"".join(chunks).decode("utf-8", "replace"), "")
