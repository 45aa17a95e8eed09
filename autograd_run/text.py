"""Showing untrusted text outside the command line: control characters made visible, Markdown code blocks.

Names in order files and graph files come from files and users. Before they
reach a terminal (a pytest assertion message) or a Markdown page (a CI job
summary) every control character is shown as an escape (``\\x1b``, ``\\n``),
so nothing can start another line or drive the terminal, and Markdown gets
them inside a code fence longer than any run of backticks in the text, so
nothing is rendered as a link, HTML or a heading. The command line's
``cli.terminal.escape`` is ``visible``.
"""

from __future__ import annotations

import re

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})
# Invisible characters that reorder or break what is shown (bidi controls, line separators, BOM).
_CONTROL.update({c: f"\\u{c:04x}" for c in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A),
                                             0x2028, 0x2029, 0xFEFF)})


def visible(text: object) -> str:
    """``text`` as one line: every control character (escapes, newlines, carriage returns) made visible."""
    return str(text).translate(_CONTROL)


def clip(text: object, limit: int = 200) -> str:
    """``text`` as ``visible`` shows it, cut to about ``limit`` characters (a value from a file quoted in a message:
    a million-character id is no message), saying how long it was."""
    s = visible(text)
    return s if len(s) <= limit else f"{s[:limit]}... ({len(s):,} characters)"


def md_code(lines: list[str], info: str = "text") -> str:
    """``lines`` (each made visible) as a fenced Markdown code block that no backtick run in them can close."""
    body = [visible(line) for line in lines]
    longest = max((len(m) for line in body for m in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join([fence + info, *body, fence]) + "\n"


def md_section(title: str, lines: list[str]) -> str:
    """A Markdown section: a heading (``title``: fixed text of ours, never from files) and ``lines`` in a code block."""
    return f"### {visible(title)}\n\n" + md_code(lines)
