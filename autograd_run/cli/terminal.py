"""Showing untrusted text on a terminal: escaped, and never read as rich markup.

Node ids, names, variable names, ``attrs.fail``/``attrs.trace`` messages and
file paths come from files and users. Shown raw, an escape sequence in them
drives the terminal (sets its title, erases a line), a carriage return or a
newline forges a line of our own output (``Error: all good``), and a rich
markup tag (``[link=...]``, ``[/x]``) becomes a link, a colour or a
``MarkupError``. So:

* ``escape(text)`` makes every control character visible as a ``repr``-style
  escape (``\\x1b``, ``\\n``, ``\\r``, ``\\t``), and so the C1 controls, the
  bidirectional overrides and the Unicode line separators;
* ``plain(text)`` is a rich ``Text`` of the escaped text: rich never parses
  it as markup;
* ``PlainTable`` is a rich ``Table`` whose title, caption, headers and
  string cells are all ``plain``, folded rather than cut to an ellipsis. It
  lays its columns out itself: a number (a no-wrap column) is never broken,
  no word of a header or of a label (our own vocabulary: a policy, a
  placement) is broken, and only text from files (ids, names, paths,
  messages: columns added with ``fold_words=True``) folds inside a word. On
  a terminal too narrow for that it drops its box, then shows each row as
  ``header: value`` lines, so nothing is cut and none is squeezed away;
* ``make_console()`` is a ``Console`` with markup, emoji codes and
  highlighting off, a second line of defence for any string printed
  through it;
* ``stdout_closed()``: the reader of stdout went away (``| head -1``), and
  what is written later goes nowhere, quietly.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autograd_run.text import visible



def escape(text) -> str:
    """``text`` with every control character (terminal escapes, newlines, carriage returns) made visible."""
    return visible(text)


def plain(text, style: str | None = None) -> Text:
    """A rich ``Text`` of ``escape(text)``: shown as written, never parsed as markup."""
    if isinstance(text, Text):
        return text
    return Text(escape(text), style=style or "")


def escape_lines(text: str, indent: str = "") -> list[str]:
    """The lines of a multi-line text from a file (e.g. a forward trace), each escaped and indented,
    so a line in it can neither drive the terminal nor pass for a line of our own."""
    return [indent + escape(line) for line in str(text).split("\n")]


class PlainTable(Table):
    """A rich ``Table`` that shows its title, caption, headers and string cells as plain text."""

    def __init__(self, *headers, title=None, caption=None, **kw):
        super().__init__(title=None if title is None else plain(title),
                         caption=None if caption is None else plain(caption), **kw)
        #: indexes of the columns whose cells may fold inside a word (text from files)
        self.fold_words: set[int] = set()
        for h in headers:
            self.add_column(h)

    def add_column(self, header="", *args, fold_words: bool = False, **kw) -> None:
        kw.setdefault("overflow", "fold")  # text from files is broken across lines, never cut to an ellipsis
        if fold_words:
            self.fold_words.add(len(self.columns))
        super().add_column(plain(header), *args, **kw)

    def add_row(self, *cells, **kw) -> None:
        super().add_row(*(plain(c) if isinstance(c, str) else c for c in cells), **kw)

    # -- layout --------------------------------------------------------------------------------

    def _ranges(self) -> list[tuple[int, int]]:
        """Per column, the narrowest width that breaks nothing it must not break, and its natural width.

        Narrowest: the longest word of the header; for a no-wrap column (numbers) its longest cell; for
        a column of labels its longest word; for ``fold_words`` columns the column's ``min_width`` (1
        when it has none), as their text folds anyway."""
        from rich.cells import cell_len
        out = []
        for k, col in enumerate(self.columns):
            header = _text_of(col.header) if self.show_header else ""
            cells = [_text_of(c) for c in col._cells]
            lines = [line for t in (header, *cells) for line in t.split("\n")]
            wide = max((cell_len(line) for line in lines), default=1)
            narrow = max((cell_len(w) for w in header.split()), default=1)
            if col.no_wrap:
                narrow = max(narrow, max((cell_len(line) for c in cells for line in c.split("\n")), default=1))
            elif k in self.fold_words:
                narrow = max(narrow, col.min_width or 1)
            else:
                narrow = max(narrow, max((cell_len(w) for c in cells for w in c.split()), default=1))
            wide = max(wide, narrow, col.min_width or 0)
            out.append((narrow, wide))
        return out

    def _fixed(self, widths: list[int]):
        """A copy of this table whose columns have these widths (text wraps at spaces inside them)."""
        import copy
        t = copy.copy(self)
        t.columns = []
        for col, w in zip(self.columns, widths):
            c = copy.copy(col)
            c.width, c.min_width, c.max_width, c.no_wrap = w, None, None, False
            t.columns.append(c)
        return t

    @staticmethod
    def _shrink(ranges: list[tuple[int, int]], room: int) -> list[int]:
        """Natural widths, the widest shrinkable column narrowed first, one cell at a time, until they
        fit ``room`` (the narrowest widths must fit it)."""
        widths = [w for _, w in ranges]
        excess = sum(widths) - room
        while excess > 0:
            k = max((k for k, (n, _) in enumerate(ranges) if widths[k] > n), key=lambda k: widths[k])
            widths[k] -= 1
            excess -= 1
        return widths

    def __rich_console__(self, console, options):
        width = options.max_width
        n = len(self.columns)
        if self.box is None or not n:
            yield from super().__rich_console__(console, options)
            return
        ranges = self._ranges()
        narrow = sum(r[0] for r in ranges)
        _, right, _, left = self.padding
        boxed = n * (left + right) + (n + 1 if self.show_edge else n - 1)
        if sum(r[1] for r in ranges) + boxed <= width:  # as it is: rich squeezes nothing
            yield from super().__rich_console__(console, options)
            return
        if narrow + boxed <= width:
            yield from Table.__rich_console__(self._fixed(self._shrink(ranges, width - boxed)), console, options)
            return
        if narrow + n - 1 <= width:  # no box, no padding: one space between columns
            from rich import box
            compact = self._fixed(self._shrink(ranges, width - (n - 1)))
            compact.box, compact.show_edge, compact.padding, compact.pad_edge = box.SIMPLE_HEAD, False, (0, 0), False
            yield from Table.__rich_console__(compact, console, options)
            return
        yield from self._stacked()

    def _stacked(self):
        """Each row as lines: its first cell, then ``header: value`` for the others that are not empty
        (folded, never cut)."""
        if self.title is not None:
            yield Text(_text_of(self.title), overflow="fold")
        headers = [_text_of(c.header) for c in self.columns]
        rows = zip(*(c._cells for c in self.columns)) if self.columns else ()
        for row in rows:
            for k, (h, cell) in enumerate(zip(headers, row)):
                value = _text_of(cell)
                if k and not value:  # an empty cell (a "... 3 more" row): no line of its own
                    continue
                line = " ".join(p for p in (f"{h}:" if h else "", value) if p)
                yield Text(f"  {line}" if k else line, overflow="fold")
        if self.caption is not None:
            yield Text(_text_of(self.caption), overflow="fold")


def _text_of(renderable) -> str:
    """The plain text of a cell, header or title (``Text`` or ``str``; anything else by ``str``)."""
    if isinstance(renderable, Text):
        return renderable.plain
    return escape(renderable) if isinstance(renderable, str) else escape(str(renderable))


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


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (``| head -1``): stop writing, quietly (rich would exit with status 1)."""
        self.quiet = True
        if not self.stderr:
            stdout_closed()


def make_console(stderr: bool = False, file: IO[str] | None = None, **kw) -> Console:
    """A console for the command line: no markup, no emoji codes, no highlighting of our strings; a
    closed pipe ends its output quietly."""
    return _Console(stderr=stderr, file=file, markup=False, emoji=False, highlight=False, **kw)


def traceback_lines(exc: BaseException) -> list[str]:
    """``exc``'s traceback as Python prints it (causes first), every line escaped.

    The exception messages may come from a file (``attrs.fail``) and the
    source lines from a user's module; a newline in a message stays inside
    its line (``\\n``), so nothing in it can start a line of its own.
    """
    import traceback
    chain: list[tuple[BaseException, str | None]] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    link = None
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append((e, link))
        if e.__cause__ is not None:
            e, link = e.__cause__, ("The above exception was the direct cause of the following exception:")
        elif e.__context__ is not None and not e.__suppress_context__:
            e, link = e.__context__, ("During handling of the above exception, another exception occurred:")
        else:
            e = None
    lines: list[str] = []
    for e, link in reversed(chain):
        if e.__traceback__ is not None:
            lines.append("Traceback (most recent call last):")
            for frame in traceback.format_tb(e.__traceback__):
                lines.extend(escape(line) for line in frame.rstrip("\n").split("\n"))
        name = type(e).__qualname__
        module = type(e).__module__
        if module not in ("builtins", "__main__"):
            name = f"{module}.{name}"
        msg = str(e)
        lines.append(escape(f"{name}: {msg}" if msg else name))
        if link is not None:
            lines += ["", link, ""]
    return lines
