"""Reading files that are untrusted data: graph files, sweep specs, machine specs.

One place for the two things every such reader needs, so that each keeps
only its own schema and its own error type:

* ``read_regular_file(path, cap)``: the bytes of a regular file, refusing
  FIFOs, devices, sockets and directories before opening them (a FIFO would
  block, ``/dev/zero`` would never end), opening non-blocking (a FIFO swapped
  in meanwhile cannot block either), and reading at most ``cap`` plus one
  byte, so a file that grows while read is still caught;
* ``load_yaml(data, max_values, max_depth)``: a YAML document through
  libyaml's safe loader (only plain data is ever constructed), with alias
  expansion, nesting depth and duplicate keys checked on the node tree
  before anything is built, and exponent floats (``1e-3``) read as numbers
  as YAML 1.2 and JSON do.

Both raise ``Problem(where, what)``: ``where`` is ``line L, column C`` or
None; the caller turns it into its own error, naming its file.
"""

from __future__ import annotations

import os
import re
import stat
import sys

import yaml

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

#: Read a file that grew past its size (or that reports none, as /proc files do) in chunks of this.
_CHUNK = 16 << 20


class Problem(Exception):
    """What is wrong with an untrusted file, and where (``line L, column C`` or None)."""

    def __init__(self, where: str | None, what: str):
        super().__init__(what)
        self.where, self.what = where, what


# -- files -------------------------------------------------------------------------------------

def _size_text(cap: int) -> str:
    return f"{cap >> 20} MiB" if cap >= 1 << 20 else f"{cap >> 10} KiB"


def check_regular(mode: int, size: int, cap: int) -> None:
    """Refuse what is not a regular file, or one larger than ``cap`` bytes."""
    if stat.S_ISDIR(mode):
        raise Problem(None, "is a directory, not a file")
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _FILE_KINDS if test(mode)), "not a regular file")
        raise Problem(None, f"is {kind}, not a regular file; only regular files are read")
    if size > cap:
        raise Problem(None, f"file is larger than {_size_text(cap)}")


def open_regular(path: str, cap: int):
    """Regular file ``path`` (symlinks followed) opened for binary reading, its size at most ``cap``:
    checked before opening and again on the open file, which is opened non-blocking (a FIFO swapped in
    meanwhile cannot block); ``Problem`` otherwise. The caller closes it."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise Problem(None, "no such file") from None
    except ValueError:
        raise Problem(None, "the file name contains a NUL byte") from None
    except OSError as exc:
        raise Problem(None, f"cannot read: {exc.strerror or exc}") from None
    check_regular(st.st_mode, st.st_size, cap)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Problem(None, f"cannot read: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        check_regular(st.st_mode, st.st_size, cap)  # the path may name another file since stat()
    except BaseException:
        f.close()
        raise
    return f


def read_regular_file(path: str, cap: int) -> bytes:
    """The bytes of regular file ``path`` (symlinks followed), at most ``cap``; ``Problem`` otherwise."""
    with open_regular(path, cap) as f:
        try:
            data = read_capped(f, os.fstat(f.fileno()).st_size, cap)
        except OSError as exc:
            raise Problem(None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > cap:
        raise Problem(None, f"file is larger than {_size_text(cap)}")
    return data


def read_capped(f, size: int, cap: int) -> bytes:
    """At most ``cap`` plus one byte of binary file ``f``: the ``size`` it reports in one read; more only
    if it grew (or reports no size), in chunks, so no request is larger than what may come."""
    want = min(size, cap) + 1
    data = f.read(want)
    if len(data) < want or len(data) > cap:
        return data
    parts, total = [data], len(data)
    while total <= cap:
        chunk = f.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


# -- JSON --------------------------------------------------------------------------------------

def load_json(data: bytes | str) -> object:
    """``json.loads`` of a small untrusted file (a machine spec, a network file), a key repeated in one object
    refused: JSON parsers keep the last value silently, so ``"gbps": 50, "gbps": 0.001`` would mean whichever
    came last. A ``Problem`` names the key; malformed JSON is ``json``'s ``ValueError`` as before."""
    import json

    def unique(pairs: list) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise Problem(None, f"duplicate key {key!r:.60} in an object (JSON keys must be unique)")
            out[key] = value
        return out
    return json.loads(data, object_pairs_hook=unique)


# -- YAML --------------------------------------------------------------------------------------

class SafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's safe loader (PyYAML's own without libyaml), reading exponent floats as numbers.

    YAML 1.1 (PyYAML's default) needs a dot and a signed exponent, so
    ``eps: 1e-5`` would be the string ``"1e-5"``; YAML 1.2 and JSON read a
    number, and so does this loader.
    """


SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def mark(node: yaml.Node) -> str:
    """``line L, column C`` (1-based) where ``node`` starts."""
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def load_yaml(data: bytes, max_values: int, max_depth: int) -> tuple[yaml.Node | None, object]:
    """The node tree and the document of YAML ``data``; ``(None, None)`` for a file with no document.

    The tree is checked before the document is built (see ``check_tree``);
    every YAML error is a ``Problem`` with its line and column.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:  # (libyaml's own message gives a byte offset in "<byte string>")
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[data.rfind(b"\n", 0, exc.start) + 1:exc.start].decode("utf-8", "replace")) + 1
        raise Problem(f"line {line}, column {column}",
                      f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    try:
        loader = SafeLoader(data)
        try:
            root = loader.get_single_node()
            if root is None:
                return None, None
            check_tree(root, max_values, max_depth)
            doc = loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        m = exc.problem_mark or exc.context_mark
        where = f"line {m.line + 1}, column {m.column + 1}" if m else None
        raise Problem(where, "invalid YAML: " + " ".join(str(x) for x in (exc.context, exc.problem) if x)) from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise Problem(None, f"invalid YAML: {str(exc)[:300]}") from None
    return root, doc


_INT_TAG = "tag:yaml.org,2002:int"
#: The most digits Python converts a decimal integer of (``sys.get_int_max_str_digits``; 0 there: no limit).
_INT_DIGITS = sys.get_int_max_str_digits() or 4300


def check_tree(root: yaml.Node, max_values: int, max_depth: int) -> None:
    """Refuse alias bombs, deep nesting, recursive aliases and duplicate keys on the node tree, before
    construction.

    A post-order walk (no recursion) sizes every distinct node once from its
    children's sizes: the values it expands to and how deep it nests, aliases
    followed, so a "billion laughs" document, or chains of aliases each
    nesting a little more, are refused in time linear in the file. (Counting
    a node where it was first met undercounted a node sized before a child
    it shares with an earlier sibling, and nesting under an alias met first
    at a shallow place went unseen: both found by a hostile review.)
    """
    sizes: dict[int, int] = {}    # node id -> values it expands to, for nodes done
    heights: dict[int, int] = {}  # node id -> levels of nesting below it (a scalar, an empty list: 0)
    open_ids: set[int] = set()    # nodes whose children are being walked: the ancestors of the current one
    mapping, scalar = yaml.MappingNode, yaml.ScalarNode
    stack: list = [root]  # nodes to visit, and (node, children) once a node's children are pushed
    while stack:
        item = stack.pop()
        if type(item) is tuple:  # its children are done
            node, kids = item
            nid = id(node)
            total = 1 + sum([sizes[id(c)] for c in kids])
            height = 1 + max([heights[id(c)] for c in kids]) if kids else 0
            open_ids.discard(nid)
            if total > max_values:
                raise Problem(mark(node), f"YAML aliases expand to more than {max_values} values")
            if height > max_depth:
                raise Problem(mark(node), f"nesting deeper than {max_depth} levels")
            sizes[nid], heights[nid] = total, height
            continue
        nid = id(item)
        if nid in sizes:
            continue
        if isinstance(item, scalar):
            if item.tag == _INT_TAG and len(item.value) > _INT_DIGITS:  # (Python refuses to convert it)
                raise Problem(mark(item), f"an integer of {len(item.value)} characters: more than the "
                                          f"{_INT_DIGITS} digits a number may have")
            sizes[nid], heights[nid] = 1, 0
            continue
        if nid in open_ids:
            raise Problem(mark(item), "a recursive alias (a value that contains itself)")
        if isinstance(item, mapping):
            keys = {}
            for k, _ in item.value:
                if isinstance(k, scalar) and k.tag != "tag:yaml.org,2002:merge":
                    ident = (k.tag, k.value)
                    first = keys.get(ident)
                    if first is not None:
                        raise Problem(mark(k), f"duplicate key {k.value!r:.60} in a mapping (first at line "
                                               f"{first.line + 1}); keys must be unique")
                    keys[ident] = k.start_mark
            kids = [x for kv in item.value for x in kv]
        else:
            kids = item.value
        open_ids.add(nid)
        stack.append((item, kids))
        stack.extend(reversed(kids))
