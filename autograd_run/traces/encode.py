"""The trace writers' inner loop: rows of int64 columns formatted by small templates into bytes.

A trace has a few kinds of events, each millions of times (node slices,
queue waits, counter samples). A writer describes each kind once as a
template, a sequence of ops, and hands over the events as int64 columns
(one value per row) and tables of strings; ``fill`` formats the rows,
choosing each row's template by ``kinds[row]`` (or template 0). The
compiled ``fill`` (``engine/_core.c``) is used where the core is built;
``fill_py`` below is its twin and the definition of the ops.

An op is four integers ``(op, x, y, z)``:

=============  ===========================================================
``LIT k``      the literal ``lits[k]`` (bytes)
``I64 c``      column ``c`` as a signed decimal
``U64 c``      column ``c`` (read as unsigned 64-bit) as a decimal
``US c``       column ``c`` minus ``base``, ns, as decimal microseconds
               (``12345678`` -> ``12345.678``; trailing zeros dropped)
``DUR c``      column ``c`` (at least 1), ns, as decimal microseconds
``MICRO c``    column ``c``, ns, as decimal microseconds
``JSTR t c``   ``tables[t][column c]`` as a JSON string (quoted, escaped)
``JESC t c``   the same, without the quotes
``RAW t c``    ``tables[t][column c]`` as it is
``SKIPNEG c n``  skip the next ``n`` ops when column ``c`` is negative
``PB_VARINT f c``  protobuf field ``f``, varint of column ``c`` (unsigned)
``PB_FIXED64 f c`` protobuf field ``f``, fixed64 of column ``c``
``PB_STR f t c``   protobuf field ``f``, bytes of ``tables[t][column c]``
``PB_DELTA f c``   protobuf field ``f``, varint of column ``c`` minus its
               previous value in this call (``base`` at first): the
               timestamps of a clock whose packets carry deltas
``PB_BEGIN f`` / ``PB_END``  a nested message in field ``f`` (length-prefixed)
=============  ===========================================================

Table entries are ``str`` (written as UTF-8, unencodable code points
replaced) or ``bytes``.
"""

from __future__ import annotations

import numpy as np

from autograd_run.engine import core

(LIT, I64, U64, US, DUR, JSTR, RAW, SKIPNEG, PB_VARINT, PB_STR, PB_BEGIN, PB_END, PB_DELTA, PB_FIXED64, MICRO,
 JESC) = range(16)


def template(*ops: tuple) -> np.ndarray:
    """A template from ops given as tuples ``(op, x=0, y=0, z=0)``."""
    return np.array([tuple(op) + (0,) * (4 - len(op)) for op in ops], dtype=np.int64).reshape(-1, 4)


def varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _bytes(entry) -> bytes:
    return entry if isinstance(entry, bytes) else entry.encode("utf-8", "replace")


_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\b"): "\\b", ord("\f"): "\\f", ord("\n"): "\\n",
            ord("\r"): "\\r", ord("\t"): "\\t"}
_ESCAPES.update({c: f"\\u{c:04x}" for c in range(0x20) if c not in _ESCAPES})


def json_string(entry) -> bytes:
    """A JSON string literal of ``entry``, escaped as ``fill`` does."""
    if isinstance(entry, bytes):
        entry = entry.decode("utf-8", "replace")
    return b'"' + entry.translate(_ESCAPES).encode("utf-8", "replace") + b'"'


def micro(ns: int) -> bytes:
    """ns as decimal microseconds, as ``US``/``DUR``/``MICRO`` write them."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    q, r = divmod(ns, 1000)
    return f"{sign}{q}{('.' + f'{r:03d}'.rstrip('0')) if r else ''}".encode()


def fill_py(templates: list, kinds, columns: list, tables: list, lits: list[bytes], base: int, start: int,
            stop: int, index=None) -> bytes:
    out = bytearray()
    prev = base
    stack: list[int] = []
    cols = [np.asarray(c).view(np.int64).tolist() for c in columns]
    kinds_l = np.asarray(kinds).tolist() if kinds is not None else None
    index_l = np.asarray(index).tolist() if index is not None else None
    for r0 in range(start, stop):
        row = index_l[r0] if index_l is not None else r0
        ops = np.asarray(templates[kinds_l[row] if kinds_l is not None else 0]).reshape(-1, 4).tolist()
        p = 0
        while p < len(ops):
            op, x, y, z = ops[p]
            p += 1
            if op == LIT:
                out += lits[x]
            elif op == I64:
                out += str(cols[x][row]).encode()
            elif op == U64:
                out += str(cols[x][row] & ((1 << 64) - 1)).encode()
            elif op == US:
                out += micro(cols[x][row] - base)
            elif op == DUR:
                out += micro(max(cols[x][row], 1))
            elif op == MICRO:
                out += micro(cols[x][row])
            elif op == JSTR:
                out += json_string(tables[x][cols[y][row]])
            elif op == JESC:
                out += json_string(tables[x][cols[y][row]])[1:-1]
            elif op == RAW:
                out += _bytes(tables[x][cols[y][row]])
            elif op == SKIPNEG:
                if cols[x][row] < 0:
                    p += y
            elif op == PB_VARINT:
                out += varint(x << 3) + varint(cols[y][row])
            elif op == PB_FIXED64:
                out += varint(x << 3 | 1) + (cols[y][row] & ((1 << 64) - 1)).to_bytes(8, "little")
            elif op == PB_STR:
                data = _bytes(tables[y][cols[z][row]])
                out += varint(x << 3 | 2) + varint(len(data)) + data
            elif op == PB_DELTA:
                v = cols[y][row]
                out += varint(x << 3) + varint(v - prev)
                prev = v
            elif op == PB_BEGIN:
                out += varint(x << 3 | 2)
                stack.append(len(out))
            elif op == PB_END:
                at = stack.pop()
                out[at:at] = varint(len(out) - at)
            else:
                raise ValueError(f"fill: unknown op {op}")
    return bytes(out)


def fill(templates: list, kinds, columns: list, tables: list, lits: list[bytes], base: int = 0, start: int = 0,
         stop: int | None = None, index=None) -> bytes:
    """Rows ``start:stop`` formatted (see the module docstring); compiled where the core is built. With
    ``index``, row ``r`` is the ``index[r]``-th of ``kinds`` and the columns (a sorted view, unmade)."""
    columns = [np.ascontiguousarray(c, dtype=np.int64) if np.asarray(c).dtype != np.uint64
               else np.ascontiguousarray(c).view(np.int64) for c in columns]
    if index is not None:
        index = np.ascontiguousarray(index, dtype=np.int64)
    if stop is None:
        stop = len(index) if index is not None else (
            len(kinds) if kinds is not None else (len(columns[0]) if columns else 0))
    if kinds is not None:
        kinds = np.ascontiguousarray(kinds, dtype=np.int64)
    templates = [np.ascontiguousarray(t, dtype=np.int64) for t in templates]
    if core.fill is None:
        return fill_py(templates, kinds, columns, tables, lits, base, start, stop, index)
    return core.fill(templates, kinds, columns, tables, lits, base, start, stop, index)
