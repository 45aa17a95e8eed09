"""Read a graph file (JSON or YAML, by extension) into a validated ``Graph``.

JSON is the fast path: msgspec decodes straight into the typed schema,
checking types while decoding (the nodes of a plain file are read by a
compiled reader into the same structs: ``_decode_json``), and a byte count
proves the object keys unique (a slower exact pass runs only when it
cannot). YAML goes through
libyaml's CSafeLoader when present (SafeLoader otherwise): only plain data
is ever constructed, alias expansion and nesting depth are bounded and
duplicate keys refused before anything is built, exponent floats such as
``1e-3`` are numbers (as in YAML 1.2 and JSON), and errors carry
line:column. Graph files are untrusted: every failure is a
``GraphFileError``, never another exception. Files are read only when they
are regular files, and never past the size cap.

Entry points: ``load_graph(path or example:NAME)``; ``loads_graph(bytes)``
(format by extension, or ``fmt="auto"``: by content); ``load_graph_bytes``
and ``read_stream`` for a graph given on standard input.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import stat
from contextlib import contextmanager
from importlib import resources

import msgspec
import numpy as np

from autograd_run import untrusted
from autograd_run.errors import GraphFileError
from autograd_run.graphs.locate import JsonLocator, YamlLocator, byte_to_line_col
from autograd_run.graphs.model import FORMAT, Graph
from autograd_run.graphs.schema import UNSET, GraphSpec, MetaSpec, NodeSpec
from autograd_run.graphs.validate import KEPT_COLONS, build_graph, check_python_nodes, format_bytes, memory_available

#: The largest graph file read (a ten-million-node chain in JSON is 1.4 GB); what a load may take in memory
#: is checked against what the machine has before parsing (``load_memory_estimate``).
MAX_FILE_BYTES = 4 << 30
#: Peak memory of a load (``load_memory_estimate``), measured on generated graphs of every kind at 1e5
#: nodes (peak RSS over the file's size): JSON 8.8-9.8x its size, 1.13-1.65 KB a node, which this fits
#: from above within 9-28%: 9 bytes per byte of the file plus 300 per node; YAML 82-92x (libyaml's node
#: tree, with the marks that place an error).
JSON_BYTES_PER_BYTE, JSON_BYTES_PER_NODE, YAML_BYTES_PER_BYTE = 9, 300, 95
#: The fewest bytes a node takes in a JSON file (its two required members, empty, and a comma): a file has at
#: most its size over this many nodes.
MIN_JSON_NODE_BYTES = len('{"id":"","name":""},')
#: Files smaller than this are loaded without a look at the machine's memory (at most ~1 GB as JSON).
MEMORY_CHECK_FROM = 64 << 20
#: YAML: most values the document may expand to once aliases are followed.
MAX_YAML_VALUES = 50_000_000
MAX_YAML_DEPTH = 64
#: JSON: largest file whose duplicate key is located exactly (a slower pass, only when one is proven).
MAX_EXACT_DUPLICATE_CHECK = 64 << 20



_JSON_DECODER = msgspec.json.Decoder(GraphSpec)
_JSON_ENCODER = msgspec.json.Encoder()
#: Nodes re-encoded at a time by the duplicate-key proof.
_ENCODE_NODES = 65536
_BOM = b"\xef\xbb\xbf"
_FIRST_NON_SPACE = re.compile(rb"[^ \t\r\n]")
_UNDECODABLE = object()
_AT = re.compile(r" - at `(\$[^`]*)`$")
_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z_0-9]*)|\[(\d+)\]|\[(['\"])(.*?)\3\]")


@contextmanager
def gc_paused():
    """The cyclic GC off meanwhile: loading (or a simulation) allocates millions of small objects, none
    freed in cycles; the GC would only scan them again and again. Restores the state it found.

    (What is made meanwhile then ages through the generations as usual, scanned on its way; the command
    line, whose one graph lives until exit, loads with the collector off and freezes the graph:
    ``cli.common.load_graph_arg``. Moving it to the oldest generation unscanned instead would hide it
    from the count that starts full collections, so a process loading graph after graph would keep
    their cycles.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _parse_path(text: str) -> tuple:
    out = []
    for m in _PATH_PART.finditer(text[1:]):
        if m.group(1):
            out.append(m.group(1))
        elif m.group(2):
            out.append(int(m.group(2)))
        else:
            out.append(m.group(4))
    return tuple(out)


def _schema_error(exc: msgspec.ValidationError, source: str, locator) -> GraphFileError:
    msg = str(exc)
    m = _AT.search(msg)
    path = _parse_path(m.group(1)) if m else ()
    what = msg[: m.start()] if m else msg
    what = what.replace("`", "'")
    fm = re.match(r"Object (missing required|contains unknown) field '(.*)'", what, re.S)
    if fm:
        what = ("missing required field" if fm.group(1).startswith("missing") else "unknown field") + f" '{fm.group(2)}'"
        if fm.group(1).startswith("contains"):
            path = path + (fm.group(2),)
    return GraphFileError(source, locator.where(path), what[0].lower() + what[1:])


def is_yaml_name(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml"))


def detect_format(data: bytes) -> str:
    """``json`` when the first non-space byte (after a UTF-8 BOM) opens an object or a list, else
    ``yaml`` (YAML is a superset of JSON, so a mistake shows as YAML's own error)."""
    m = _FIRST_NON_SPACE.search(data, 3 if data.startswith(_BOM) else 0)
    return "json" if m is not None and data[m.start()] in (0x7B, 0x5B) else "yaml"


def loads_graph(data: bytes | str, source: str = "<memory>", fmt: str | None = None,
                base_dir: str | None = None, side_name: str | None = None,
                max_bytes: int | None = None, check_data: bool = False) -> Graph:
    """Load a graph from bytes. ``fmt`` is ``json``, ``yaml``, ``auto`` (by content: see
    ``detect_format``) or None (by ``source``'s extension).

    ``base_dir`` is the folder side files must lie in; ``side_name`` the
    default side file (``<stem>.npz`` of ``source`` when not given);
    ``max_bytes`` the memory budget (default: ``validate.default_max_bytes()``);
    ``check_data``: read side-file members through now (finds corrupt data before a run).
    """
    return _loads([data], source, fmt, base_dir, side_name, max_bytes, check_data)


def _loads(box: list, source: str, fmt: str | None, base_dir: str | None, side_name: str | None,
           max_bytes: int | None, check_data: bool) -> Graph:
    """``loads_graph`` of the bytes in ``box`` (a one-item list, which it empties): a JSON file's bytes are
    let go once decoded, before the graph is built, where no caller holds them (``load_graph`` does not: at
    ten million nodes that is 1.4 GB)."""
    data = box.pop()
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_FILE_BYTES:
        raise GraphFileError(source, None, f"file is larger than {MAX_FILE_BYTES >> 20} MiB")
    if data.startswith(_BOM):
        data = data[3:]
    elif data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise GraphFileError(source, None, "the file is UTF-16 encoded; graph files are UTF-8")
    if _FIRST_NON_SPACE.search(data) is None:
        raise GraphFileError(source, None, "the file is empty")
    if fmt == "auto":
        fmt = detect_format(data)
    elif fmt is None:
        fmt = "yaml" if is_yaml_name(source) else "json"
    _check_memory(data, fmt, source)
    if fmt != "json" and b"bfloat16" in data:  # (JSON: _load_json, once decoded)
        _may_hold_bfloat16()
    with gc_paused():
        if fmt == "json":
            box.append(data)
            del data
            return _load_json(box, source, base_dir, side_name, max_bytes, check_data)
        return _load_yaml(data, source, base_dir, side_name, max_bytes, check_data)


def load_memory_estimate(data: bytes, fmt: str) -> int:
    """About the most memory loading ``data`` takes (decoded file, checked model and the file's bytes at
    once), from its size and, for JSON, its node count (its ``"id"`` keys; its objects where a key may be
    escaped), with the factors measured above. A file denser than a generated one (a short node per line)
    can take more; the node limit still applies once it is decoded."""
    if fmt == "yaml":
        return YAML_BYTES_PER_BYTE * len(data)
    nodes = data.count(b'"id"')
    if b"\\" in data and b"\\u" in data:  # a key written with escapes ("\u0069d") is still "id": count every object instead
        nodes = max(nodes, data.count(b"{"))
    return JSON_BYTES_PER_BYTE * len(data) + JSON_BYTES_PER_NODE * nodes


def _check_memory(data: bytes, fmt: str, source: str) -> None:
    """A file whose load would take more memory than the machine has left is refused before parsing. A JSON file
    that would fit even were it all the shortest nodes (``MIN_JSON_NODE_BYTES`` each) is not searched for its
    node count (0.09 s at a million nodes)."""
    if len(data) < MEMORY_CHECK_FROM:
        return
    if fmt == "json":
        available = memory_available()
        most_nodes = len(data) // MIN_JSON_NODE_BYTES
        if available is not None and JSON_BYTES_PER_BYTE * len(data) + JSON_BYTES_PER_NODE * most_nodes <= available:
            return
    _refuse_past_memory(len(data), load_memory_estimate(data, fmt), fmt, source, "about")


def _check_memory_before_reading(path: str, fmt: str) -> None:
    """The same, from a file's size alone, before it is read (what its bytes take per byte, without the
    per-node part): a big file on a small machine is refused without reading it."""
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):
        return  # (reading it says what is wrong)
    if MEMORY_CHECK_FROM <= size <= MAX_FILE_BYTES:  # (past the cap, reading it says so)
        per_byte = YAML_BYTES_PER_BYTE if fmt == "yaml" else JSON_BYTES_PER_BYTE
        _refuse_past_memory(size, per_byte * size, fmt, path, "at least")


def _refuse_past_memory(size: int, need: int, fmt: str, source: str, how: str) -> None:
    available = memory_available()
    if available is None or need <= available:
        return
    hint = (" (YAML takes about 90 bytes of memory per byte of file; the same graph as JSON about 10)"
            if fmt == "yaml" else "")
    raise GraphFileError(source, None, f"loading this {format_bytes(size)} file takes {how} "
                                       f"{format_bytes(need)} of memory, and {format_bytes(available)} is "
                                       f"available{hint}")


def _not_a_graph(doc, source: str, locator) -> GraphFileError | None:
    """The error for a document that is not a graph at all (a trace, another tool's JSON), or None."""
    if not isinstance(doc, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
                type(None): "null"}.get(type(doc), type(doc).__name__)
        return GraphFileError(source, None, f"not an {FORMAT} file: the document is {kind}, not a mapping "
                                            "with 'format', 'nodes' and 'roots'")
    if "format" not in doc:
        keys = [k for k in doc if isinstance(k, str)][:4]
        found = f" (it has {', '.join(repr(k[:40]) for k in keys)}{', ...' if len(doc) > 4 else ''})" if keys else ""
        return GraphFileError(source, None, f"not an {FORMAT} file: no 'format: {FORMAT}' field{found}")
    fmt = doc["format"]
    if fmt != FORMAT:
        return GraphFileError(source, locator.where(("format",)),
                              f"unsupported format {fmt!r:.60}; expected {FORMAT!r}" if isinstance(fmt, str)
                              else f"not an {FORMAT} file: 'format' is {fmt!r:.60}")
    return None


def _may_hold_bfloat16() -> None:
    """A file that may hold bfloat16 tensors: numpy's bfloat16 registered before its graph is built."""
    from autograd_run.ops.dtypes import ensure_bfloat16
    ensure_bfloat16()


def _load_json(box: list, source: str, base_dir: str | None, side_name: str | None,
               max_bytes: int | None, check_data: bool = False) -> Graph:
    data = box.pop()  # (see _loads: let go below once decoded)
    try:
        spec, head, bfloat16 = _decode_json(data)
    except msgspec.ValidationError as exc:
        # Error path only: decode untyped to say what the file is and name the node.
        try:
            raw = msgspec.json.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            raw = _UNDECODABLE  # e.g. a number out of range: the typed error says where
        nodes = raw.get("nodes") if isinstance(raw, dict) else None
        locator = JsonLocator(nodes if isinstance(nodes, list) else None)
        if raw is _UNDECODABLE:
            if data[_FIRST_NON_SPACE.search(data).start()] != 0x7B:  # not an object at the top level
                raise GraphFileError(source, None, f"not an {FORMAT} file: the document is not a mapping "
                                                   "with 'format', 'nodes' and 'roots'") from None
        else:
            problem = _not_a_graph(raw, source, locator)
            if problem is not None:
                raise problem from None
            _json_duplicates(data, source)
        raise _schema_error(exc, source, locator) from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(byte (\d+)\)", msg)
        where = None
        if m:
            line, col = byte_to_line_col(data, int(m.group(1)))
            where = f"line {line}, column {col}"
            msg = msg[: m.start()].rstrip()
        raise GraphFileError(source, where, f"invalid JSON: {msg.replace('JSON is malformed: ', '')}") from None
    except RecursionError:
        raise GraphFileError(source, None, "invalid JSON: nesting is too deep") from None
    if bfloat16 if head is not None else b"bfloat16" in data:  # (the compiled reader saw every string pass)
        _may_hold_bfloat16()
    # The compiled reader's nodes have no repeated key (it reads none that has): only the rest is counted
    proven = (_json_has_no_duplicates(head, msgspec.structs.replace(spec, nodes=[])) if head is not None
              else _json_has_no_duplicates(data, spec))
    if not proven:
        if len(data) > MAX_EXACT_DUPLICATE_CHECK and b"\\u003" not in data:
            # The counts prove a duplicate; finding where would take several times the
            # file's size in memory (Python's json): say so without the place.
            raise GraphFileError(source, None, "duplicate keys in an object (JSON keys must be unique); "
                                               "the file is too big to say where: check it with a JSON linter")
        _json_duplicates(data, source)
    del data
    return build_graph(spec, source, base_dir, JsonLocator(spec.nodes), side_name, max_bytes, check_data)


def _compiled_node_reader():
    """``_json_nodes.read_graph`` once configured for this schema, or None (not built,
    ``AUTOGRAD_RUN_PURE_PYTHON`` set, or a schema it does not know): msgspec then decodes every file whole."""
    if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from autograd_run.graphs import _json_nodes
    except ImportError:
        return None
    ok = _json_nodes.configure(NodeSpec, NodeSpec.__struct_fields__, UNSET, msgspec.json.Decoder(list[MetaSpec]))
    return _json_nodes.read_graph if ok else None


_READ_GRAPH = _compiled_node_reader()


def _decode_json(data: bytes) -> tuple[GraphSpec, bytes | None, bool]:
    """The file's ``GraphSpec``, as ``_JSON_DECODER.decode(data)`` gives it (the same values, types and errors),
    the text of its members but the nodes where the compiled reader read the nodes (which then have no
    repeated key: see ``_json_nodes.c``), else None, and whether the reader passed a string that is (or may undo
    to) "bfloat16" (False where it did not read the file).

    With the compiled reader (``_json_nodes.c``), the nodes are made straight from the text, sharing what
    is never changed between the nodes that write the same text (names, ops, saved keys, input lists, saved
    values and attrs), and msgspec decodes the other members, given as a small document of their own. Where
    either cannot plainly read the file (an error, a repeated key, a string that is not UTF-8, a long integer,
    ...), msgspec decodes it whole, as before, and says what is wrong."""
    if _READ_GRAPH is not None:
        read = _READ_GRAPH(data)
        if read is not None:
            nodes, head, bfloat16 = read
            try:
                spec = _JSON_DECODER.decode(head)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                spec = None
            if spec is not None:
                spec.nodes = nodes
                return spec, head, bfloat16
    return _JSON_DECODER.decode(data), None, False


def _json_has_no_duplicates(data: bytes, spec: GraphSpec) -> bool:
    """True when the decoded spec provably kept every key of the file (no duplicate was dropped).

    Every object member in JSON text has exactly one ``:`` outside strings;
    colons inside strings are written as ``:`` or ``\\u003a``. Re-encoding the
    decoded spec (optional fields are UNSET when absent, so only the fields
    the file wrote come out) gives one ``:`` per kept member plus the colons
    of the kept strings. Dropping a duplicate member loses at least its
    colon, so equal counts prove there was none. False means "not proven";
    the exact check then decides.
    """
    raw = _count_colons(data)
    if b"\\" in data and b"\\u003" in data:  # an escaped colon (\u003a or \u003A) is a colon too
        raw += data.count(b"\\u003a") + data.count(b"\\u003A")
    try:
        # The nodes a slice at a time (a list's text has no colon of its own), so that no second copy of a
        # big file's text is made (at 1e6 nodes it was the load's peak): the same count.
        nodes = spec.nodes
        kept = _count_colons(_JSON_ENCODER.encode(msgspec.structs.replace(spec, nodes=[])))
        counted = KEPT_COLONS(nodes) if KEPT_COLONS is not None else None  # the same count, compiled
        if counted is not None:
            return kept + counted == raw
        step = _ENCODE_NODES
        for i in range(0, len(nodes), step):
            kept += _count_colons(_JSON_ENCODER.encode(nodes[i: i + step]))
        return kept == raw
    except (TypeError, ValueError, OverflowError):
        return False


def _count_colons(data: bytes) -> int:
    """``data.count(b":")``, vectorised (several times faster on big files)."""
    if len(data) < 65536:
        return data.count(b":")
    arr = np.frombuffer(data, np.uint8)
    step = 256 << 10  # bounded temporary memory, in cache
    return sum(int(np.count_nonzero(arr[i: i + step] == 58)) for i in range(0, len(arr), step))


def _json_duplicates(data: bytes, source: str) -> None:
    """Raise a ``GraphFileError`` naming the first duplicate key in the JSON text, if there is one (slow, exact)."""
    marks: list = []

    def pairs(items):
        d = {}
        for k, v in items:
            if k in d:
                d = _Marked(items)
                d.dup = k
                marks.append(d)
                return d
            d[k] = v
        return d
    try:
        doc = json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return
    if not marks:
        return
    # Find the first marked object's path (iteratively: nesting may be deep).
    stack = [(doc, ())]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, _Marked):
            raise GraphFileError(source, JsonLocator(_nodes_of(doc)).where(path + (obj.dup,)),
                                 f"duplicate key {obj.dup!r:.60} in an object (JSON keys must be unique; "
                                 "the file would otherwise mean whichever came last)")
        if isinstance(obj, dict):
            stack.extend((v, path + (k,)) for k, v in reversed(list(obj.items())))
        elif isinstance(obj, list):
            stack.extend((v, path + (j,)) for j, v in reversed(list(enumerate(obj))))


class _Marked(dict):
    """An object with a duplicate key (``dup``), kept with its first values."""

    dup = ""

    def __init__(self, items):
        super().__init__()
        for k, v in items:
            self.setdefault(k, v)


def _nodes_of(doc):
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return nodes if isinstance(nodes, list) else None


def _load_yaml(data: bytes, source: str, base_dir: str | None, side_name: str | None,
               max_bytes: int | None, check_data: bool = False) -> Graph:
    try:
        root, doc = untrusted.load_yaml(data, MAX_YAML_VALUES, MAX_YAML_DEPTH)
    except untrusted.Problem as p:
        raise GraphFileError(source, p.where, p.what) from None
    if root is None:
        raise GraphFileError(source, None, "the file is empty (no YAML document, only comments)")
    locator = YamlLocator(root)
    problem = _not_a_graph(doc, source, locator)
    if problem is not None:
        raise problem
    try:
        spec = msgspec.convert(doc, GraphSpec, strict=True)
    except msgspec.ValidationError as exc:
        raise _schema_error(exc, source, YamlLocator(root, doc.get("nodes") if isinstance(doc.get("nodes"), list) else None)) from None
    except RecursionError:
        raise GraphFileError(source, None, "nesting is too deep") from None
    locator.nodes = spec.nodes
    return build_graph(spec, source, base_dir, locator, side_name, max_bytes, check_data)


EXAMPLE_PREFIX = "example:"


def example_names() -> list[str]:
    files = resources.files("autograd_run.graphs").joinpath("examples")
    return sorted(os.path.splitext(f.name)[0] for f in files.iterdir()
                  if f.name.endswith((".yaml", ".json")))


def read_file(path: str, source: str | None = None) -> bytes:
    """The bytes of a regular file, read only up to the size cap (see ``untrusted.read_regular_file``)."""
    try:
        return untrusted.read_regular_file(path, MAX_FILE_BYTES)
    except untrusted.Problem as p:
        raise GraphFileError(path if source is None else source, p.where, p.what) from None


def read_stream(stream, source: str = "<stdin>") -> bytes:
    """Read a graph from a binary stream (standard input), at most the size cap, and at most what loading it
    could take in the memory the machine has left (as JSON, the smaller: ``_check_memory`` then checks it
    again once its format and node count are known); a regular file's size is checked before it is read."""
    available = memory_available()
    cap = MAX_FILE_BYTES if available is None else min(MAX_FILE_BYTES, max(MEMORY_CHECK_FROM,
                                                                            available // JSON_BYTES_PER_BYTE))
    try:
        st = os.fstat(stream.fileno())
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        size = 0
    if size > cap:
        _refuse_past_memory(size, JSON_BYTES_PER_BYTE * size, "json", source, "at least")
    try:
        data = untrusted.read_capped(stream, size, cap)
    except OSError as exc:
        raise GraphFileError(source, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > cap:
        _refuse_past_memory(len(data), JSON_BYTES_PER_BYTE * len(data), "json", source, "at least")
        raise GraphFileError(source, None, f"input is larger than {MAX_FILE_BYTES >> 20} MiB")
    return data


def read_source(ref: str) -> tuple[bytes, str, str | None]:
    """The bytes of a graph reference (a path or ``example:NAME``), its display name and folder."""
    if ref.startswith(EXAMPLE_PREFIX):
        name = ref[len(EXAMPLE_PREFIX):]
        folder = resources.files("autograd_run.graphs").joinpath("examples")
        if name in example_names():
            for ext in (".yaml", ".json"):
                f = folder.joinpath(name + ext)
                if f.is_file():
                    return f.read_bytes(), ref, str(folder)
        raise GraphFileError(ref, None, f"no example named {name!r:.60}; examples: {', '.join(example_names())}")
    return read_file(ref), ref, os.path.dirname(os.path.abspath(ref))


def load_graph(ref: str | os.PathLike, *, max_bytes: int | None = None, allow_python: bool = True,
               check_data: bool = False) -> Graph:
    """Load and validate a graph file, or a shipped example (``example:NAME``).

    ``max_bytes``: the memory budget (default ``validate.default_max_bytes()``);
    ``allow_python=False`` refuses graphs with ``python`` nodes (see ``check_python_nodes``);
    ``check_data`` reads side-file data through (``validate`` does; ``run`` finds
    corrupt data when it materialises it).
    """
    ref = os.fspath(ref)
    if not ref.startswith(EXAMPLE_PREFIX) and not (ref.lower().endswith(".json") or is_yaml_name(ref)):
        # Before reading: a FIFO or device named without an extension is refused here too.
        read_file(ref)
        raise GraphFileError(ref, None, "unknown extension: graph files end in .json, .yaml or .yml")
    if not ref.startswith(EXAMPLE_PREFIX):
        _check_memory_before_reading(ref, "yaml" if is_yaml_name(ref) else "json")
    data, source, base_dir = read_source(ref)
    box = [data]
    del data  # (the loader lets the bytes go once decoded: see _loads)
    if ref.startswith(EXAMPLE_PREFIX):
        name = ref[len(EXAMPLE_PREFIX):]
        folder = resources.files("autograd_run.graphs").joinpath("examples")
        fmt = "yaml" if folder.joinpath(name + ".yaml").is_file() else "json"
        graph = _loads(box, source, fmt, base_dir, name + ".npz", max_bytes, check_data)
    else:
        graph = _loads(box, source, None, base_dir, None, max_bytes, check_data)
    check_python_nodes(graph, allow_python)
    return graph


def load_graph_bytes(data: bytes, source: str = "<stdin>", base_dir: str | None = None, *,
                     fmt: str = "auto", max_bytes: int | None = None, allow_python: bool = True,
                     check_data: bool = False) -> Graph:
    """Load a graph from bytes (``autograd-run -`` reads stdin); ``fmt`` ``auto``: by content.

    JSON when the first non-space byte opens an object or a list, else YAML.
    ``base_dir`` (e.g. the current folder) lets ``npz`` specs name side
    files; without it they are refused.
    """
    if len(data) > MAX_FILE_BYTES:
        raise GraphFileError(source, None, f"input is larger than {MAX_FILE_BYTES >> 20} MiB")
    graph = loads_graph(data, source, fmt, base_dir, None, max_bytes, check_data)
    check_python_nodes(graph, allow_python)
    return graph
