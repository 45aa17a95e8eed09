"""Turn a path inside a graph document into a place a person can find.

A path is a tuple of keys and indices, e.g. ``("nodes", 3, "next", 0)``.
YAML places are ``line L, column C`` (from the composed node tree) followed
by the path; JSON places name the node id and the path, since the fast JSON
decoder keeps no positions.
"""

from __future__ import annotations

from typing import Any, Sequence

import yaml


def format_path(path: Sequence[Any]) -> str:
    """``$.nodes[3].saved.other``; keys that are not identifiers are quoted: ``$.meta['a b']``."""
    out = "$"
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and p.isidentifier() and p.isascii():
            out += f".{p}"
        else:
            r = repr(p)
            out += f"[{r if len(r) <= 60 else r[:57] + '...'}]"
    return out


def _node_hint(nodes: Any, path: Sequence[Any]) -> str:
    """``node 'ID'`` when the path points into the nodes list and the id is known."""
    if len(path) >= 2 and path[0] == "nodes" and isinstance(path[1], int):
        try:
            node = nodes[path[1]]
            nid = node.id if hasattr(node, "id") else node.get("id")
            if isinstance(nid, str):
                return f"node '{nid}' "
        except (IndexError, AttributeError, TypeError):
            pass
    return ""


class JsonLocator:
    def __init__(self, nodes: Any = None):
        self.nodes = nodes

    def where(self, path: Sequence[Any]) -> str:
        hint = _node_hint(self.nodes, path) if self.nodes is not None else ""
        return f"{hint}at {format_path(path)}"


class YamlLocator:
    def __init__(self, root: yaml.Node, nodes: Any = None):
        self.root = root
        self.nodes = nodes

    def mark(self, path: Sequence[Any]):
        node = self.root
        for p in path:
            if isinstance(node, yaml.MappingNode) and isinstance(p, str):
                for k, v in node.value:
                    if getattr(k, "value", None) == p:
                        node = v
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and 0 <= p < len(node.value):
                node = node.value[p]
            else:
                break
        return node.start_mark

    def where(self, path: Sequence[Any]) -> str:
        m = self.mark(path)
        hint = _node_hint(self.nodes, path) if self.nodes is not None else ""
        return f"line {m.line + 1}, column {m.column + 1} ({hint}at {format_path(path)})"


def byte_to_line_col(data: bytes, offset: int) -> tuple[int, int]:
    offset = max(0, min(offset, len(data)))
    line = data.count(b"\n", 0, offset) + 1
    last_nl = data.rfind(b"\n", 0, offset)
    return line, offset - last_nl
