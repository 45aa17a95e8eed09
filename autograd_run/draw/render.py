"""Turning DOT text into the requested file: ``.dot`` as is, ``.svg``/``.png`` through Graphviz, ``.html`` a page.

SVG and PNG are laid out by Graphviz's ``dot`` program, called through the
``graphviz`` Python package (``pip install 'autograd-run[draw]'``); when
either is missing the error names what to install. The HTML page is
self-contained: a heading, the notes and the SVG inline (its tooltips work
in any browser); everything from the graph is HTML-escaped.
"""

from __future__ import annotations

import html
import re

from autograd_run.errors import RequestError

FORMATS = (".dot", ".gv", ".svg", ".png", ".html")

INSTALL_DOT = ("Graphviz's `dot` program is not installed: install the graphviz system package "
               "(apt-get install graphviz, dnf install graphviz, brew install graphviz), or write .dot")
INSTALL_PY = ("the graphviz Python package is not installed: pip install 'autograd-run[draw]' "
              "(it calls Graphviz's `dot` program), or write .dot")


def output_format(path: str) -> str:
    """``dot``, ``svg``, ``png`` or ``html`` by ``path``'s extension; a ``RequestError`` for others."""
    lower = path.lower()
    for ext in FORMATS:
        if lower.endswith(ext):
            return "dot" if ext == ".gv" else ext[1:]
    raise RequestError(f"{path}: the output must end in .dot, .svg, .png or .html", "output")


def layout(dot_text: str, fmt: str) -> bytes:
    """``dot_text`` laid out by Graphviz as ``svg`` or ``png``."""
    try:
        import graphviz
    except ImportError:
        raise RequestError(INSTALL_PY, "output") from None
    try:
        return graphviz.pipe("dot", fmt, dot_text.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound:
        raise RequestError(INSTALL_DOT, "output") from None
    except graphviz.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise RequestError(f"Graphviz's dot failed: {detail[-1] if detail else exc}", "output") from None


_PROLOG = re.compile(rb"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?(<!--.*?-->\s*)*", re.S)


def html_page(svg: bytes, title: str, notes: list[str]) -> bytes:
    """A self-contained HTML page showing ``svg`` under an escaped heading and notes."""
    body = _PROLOG.sub(b"", svg, count=1).decode("utf-8")
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:Helvetica,Arial,sans-serif;margin:1.5em}"
            "svg{max-width:100%;height:auto}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>" + (f"<ul>{items}</ul>" if items else "") +
            "<p>Hover over a node for its times.</p>\n" + body + "\n</body></html>\n")
    return page.encode("utf-8")


def render(dot_text: str, fmt: str, title: str, notes: list[str]) -> bytes:
    """The bytes of the output file in ``fmt``."""
    if fmt == "dot":
        return dot_text.encode("utf-8")
    if fmt == "html":
        return html_page(layout(dot_text, "svg"), title, notes)
    return layout(dot_text, fmt)
