"""What every command shares: error lines, escaping of untrusted text, graph output formats."""

from __future__ import annotations

import click

from autograd_run.errors import UsageError

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})


def escape(text: str) -> str:
    """``text`` with every control character (terminal escapes, newlines, carriage returns) made visible."""
    return str(text).translate(_CONTROL)


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
