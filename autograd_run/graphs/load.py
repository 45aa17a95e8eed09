"""Read a graph file (JSON or YAML, by extension) into a validated ``Graph``.

JSON is the fast path: msgspec decodes straight into the typed schema,
checking types while decoding. YAML goes through libyaml's CSafeLoader when
present (SafeLoader otherwise): only plain data is ever constructed, alias
expansion and nesting depth are bounded before anything is built, and
errors carry line:column. Graph files are untrusted: every failure is a
``GraphFileError``, never another exception.
"""

from __future__ import annotations

import gc
import os
import re
from contextlib import contextmanager
from importlib import resources

import msgspec
import yaml

from autograd_run.errors import GraphFileError
from autograd_run.graphs.locate import JsonLocator, YamlLocator, byte_to_line_col
from autograd_run.graphs.model import Graph
from autograd_run.graphs.schema import GraphSpec
from autograd_run.graphs.validate import build_graph

MAX_FILE_BYTES = 1 << 30
#: YAML: most values the document may expand to once aliases are followed.
MAX_YAML_VALUES = 50_000_000
MAX_YAML_DEPTH = 64

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_JSON_DECODER = msgspec.json.Decoder(GraphSpec)
_AT = re.compile(r" - at `(\$[^`]*)`$")
_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z_0-9]*)|\[(\d+)\]|\[(['\"])(.*?)\3\]")


@contextmanager
def _gc_paused():
    """Loading allocates millions of small objects; the cyclic GC only slows that down."""
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
    fm = re.match(r"Object (missing required|contains unknown) field '(.*)'", what)
    if fm:
        what = ("missing required field" if fm.group(1).startswith("missing") else "unknown field") + f" '{fm.group(2)}'"
        if fm.group(1).startswith("contains"):
            path = path + (fm.group(2),)
    return GraphFileError(source, locator.where(path), what[0].lower() + what[1:])


def is_yaml_name(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml"))


def loads_graph(data: bytes | str, source: str = "<memory>", fmt: str | None = None,
                base_dir: str | None = None, side_name: str | None = None) -> Graph:
    """Load a graph from bytes. ``fmt`` is ``json`` or ``yaml`` (default: by ``source``'s extension).

    ``base_dir`` is the folder side files must lie in; ``side_name`` the
    default side file (``<stem>.npz`` of ``source`` when not given).
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    if fmt is None:
        fmt = "yaml" if is_yaml_name(source) else "json"
    if len(data) > MAX_FILE_BYTES:
        raise GraphFileError(source, None, f"file is larger than {MAX_FILE_BYTES >> 20} MiB")
    with _gc_paused():
        if fmt == "json":
            return _load_json(data, source, base_dir, side_name)
        return _load_yaml(data, source, base_dir, side_name)


def _load_json(data: bytes, source: str, base_dir: str | None, side_name: str | None) -> Graph:
    try:
        spec = _JSON_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        # Error path only: decode untyped to name the node the problem is in.
        try:
            raw = msgspec.json.decode(data)
            nodes = raw.get("nodes") if isinstance(raw, dict) else None
        except (msgspec.DecodeError, RecursionError):
            nodes = None
        raise _schema_error(exc, source, JsonLocator(nodes if isinstance(nodes, list) else None)) from None
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
    return build_graph(spec, source, base_dir, JsonLocator(spec.nodes), side_name)


def _check_yaml_tree(root: yaml.Node, source: str) -> None:
    """Refuse alias bombs and deep nesting before anything is constructed.

    Counts the values the document expands to, following aliases, with one
    memoised count per distinct node, so a "billion laughs" document is
    refused in time linear in its size.
    """
    sizes: dict[int, int] = {}
    order = []
    stack = [(root, 0)]
    seen = set()
    while stack:
        node, depth = stack.pop()
        if depth > MAX_YAML_DEPTH:
            m = node.start_mark
            raise GraphFileError(source, f"line {m.line + 1}, column {m.column + 1}",
                                 f"nesting deeper than {MAX_YAML_DEPTH} levels")
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        if isinstance(node, yaml.SequenceNode):
            stack.extend((c, depth + 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
    for node in reversed(order):  # children are visited after parents, so reverse is bottom-up
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(sizes.get(id(c), 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(sizes.get(id(k), 1) + sizes.get(id(v), 1) for k, v in node.value)
        else:
            total = 1
        if total > MAX_YAML_VALUES:
            m = node.start_mark
            raise GraphFileError(source, f"line {m.line + 1}, column {m.column + 1}",
                                 f"YAML aliases expand to more than {MAX_YAML_VALUES} values")
        sizes[id(node)] = total


def _load_yaml(data: bytes, source: str, base_dir: str | None, side_name: str | None) -> Graph:
    try:
        loader = _SafeLoader(data)
        try:
            root = loader.get_single_node()
            if root is None:
                raise GraphFileError(source, None, "the file is empty")
            _check_yaml_tree(root, source)
            doc = loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise GraphFileError(source, where, f"invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise GraphFileError(source, None, f"invalid YAML: {exc}") from None
    except (RecursionError, ValueError, TypeError, OverflowError) as exc:
        raise GraphFileError(source, None, f"invalid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise GraphFileError(source, "line 1, column 1", "the document must be a mapping with 'format', 'nodes' and 'roots'")
    locator = YamlLocator(root)
    try:
        spec = msgspec.convert(doc, GraphSpec, strict=True)
    except msgspec.ValidationError as exc:
        raise _schema_error(exc, source, YamlLocator(root, doc.get("nodes") if isinstance(doc.get("nodes"), list) else None)) from None
    except RecursionError:
        raise GraphFileError(source, None, "nesting is too deep") from None
    locator.nodes = spec.nodes
    return build_graph(spec, source, base_dir, locator, side_name)


EXAMPLE_PREFIX = "example:"


def example_names() -> list[str]:
    files = resources.files("autograd_run.graphs").joinpath("examples")
    return sorted(os.path.splitext(f.name)[0] for f in files.iterdir()
                  if f.name.endswith((".yaml", ".json")))


def read_source(ref: str) -> tuple[bytes, str, str | None]:
    """The bytes of a graph reference (a path or ``example:NAME``), its display name and folder."""
    if ref.startswith(EXAMPLE_PREFIX):
        name = ref[len(EXAMPLE_PREFIX):]
        folder = resources.files("autograd_run.graphs").joinpath("examples")
        for ext in (".yaml", ".json"):
            f = folder.joinpath(name + ext)
            if f.is_file():
                return f.read_bytes(), ref, str(folder)
        raise GraphFileError(ref, None, f"no example named {name!r}; examples: {', '.join(example_names())}")
    try:
        size = os.path.getsize(ref)
        if size > MAX_FILE_BYTES:
            raise GraphFileError(ref, None, f"file is larger than {MAX_FILE_BYTES >> 20} MiB")
        with open(ref, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise GraphFileError(ref, None, "no such file") from None
    except IsADirectoryError:
        raise GraphFileError(ref, None, "is a directory, not a graph file") from None
    except OSError as exc:
        raise GraphFileError(ref, None, f"cannot read: {exc.strerror or exc}") from None
    return data, ref, os.path.dirname(os.path.abspath(ref))


def load_graph(ref: str | os.PathLike) -> Graph:
    """Load and validate a graph file, or a shipped example (``example:NAME``)."""
    ref = os.fspath(ref)
    data, source, base_dir = read_source(ref)
    fmt = None
    if ref.startswith(EXAMPLE_PREFIX):
        folder = resources.files("autograd_run.graphs").joinpath("examples")
        name = ref[len(EXAMPLE_PREFIX):]
        fmt = "yaml" if folder.joinpath(name + ".yaml").is_file() else "json"
        return loads_graph(data, source, fmt, base_dir, name + ".npz")
    if not (ref.lower().endswith(".json") or is_yaml_name(ref)):
        raise GraphFileError(ref, None, "unknown extension: graph files end in .json, .yaml or .yml")
    return loads_graph(data, source, fmt, base_dir)
