"""What every command shares: error lines, escaping of untrusted text, graph output formats."""

from __future__ import annotations

import click

from autograd_run.cli.terminal import escape, escape_lines
from autograd_run.errors import UsageError

__all__ = ["escape", "echo", "write", "stdout_closed", "error_line", "note_lines", "graph_format"]


def echo(msg: str, err: bool = False) -> None:
    """One line of output whose text may come from files or users: escaped, so it stays one line."""
    write(escape(msg), err=err)


def write(text: str, err: bool = False) -> None:
    """``text`` and a newline on stdout (or stderr), as it is; a reader that went away is not an error."""
    try:
        click.echo(text, err=err)
    except BrokenPipeError:
        stdout_closed()


def stdout_closed() -> None:
    """The reader of stdout went away (``autograd-run ... | head -1``): further output is dropped
    quietly, and the command ends with the exit status it would have had. Standard output is pointed
    at the null device, so nothing written later (or flushed at exit) fails again."""
    import os
    import sys
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def note_lines(text: str, err: bool = True, indent: str = "  ") -> None:
    """A multi-line text from a file (a forward trace) on stderr: each line escaped and indented."""
    for line in escape_lines(text, indent):
        click.echo(line, err=err)


def error_line(msg: str) -> None:
    """``Error: MSG`` on stderr, as one line: nothing in ``msg`` can start another line or drive the terminal."""
    click.echo(f"Error: {escape(msg)}", err=True)


GRAPH_EXTENSIONS = (".json", ".yaml", ".yml")


def graph_format(path: str, flag: str = "-o") -> str:
    """``json`` or ``yaml`` by ``path``'s extension; a usage error for any other extension."""
    lower = path.lower()
    if not lower.endswith(GRAPH_EXTENSIONS):
        raise UsageError(f"{flag} must end in .json, .yaml or .yml")
    return "yaml" if lower.endswith((".yaml", ".yml")) else "json"


class Whole(click.IntRange):
    """An integer option whose range --help and errors say in words (``at least 1``, ``0 to 2**62``),
    not as ``0<=x<=4611686018427387904``."""

    def __init__(self, min: int | None = None, max: int | None = None, words: str | None = None):
        super().__init__(min, max)
        self.words = words or (f"at least {min}" if max is None else f"{min} to {max}")

    def _describe_range(self) -> str:
        return self.words

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: must be a whole number, {self.words}", param, ctx)


class Seconds(click.FloatRange):
    """A positive number of seconds."""

    name = "seconds"

    def __init__(self):
        super().__init__(0, min_open=True)

    def _describe_range(self) -> str:
        return "more than 0"

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r}: must be a number of seconds, more than 0", param, ctx)
