"""The on-disk schema of ``autograd-graph/1``, as msgspec structs.

JSON files are decoded straight into these structs (types checked while
decoding); YAML files are parsed safely and then converted into them, so
both formats share one schema and one set of type errors. Semantic checks
(ids, edges, cycles, shapes, side files) live in ``validate``.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec


class MetaSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, frozen=True):
    """Frozen (hashable): the loader checks each distinct metadata once."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    device: str = "cpu"
    stream: int = 0


class NodeSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    id: str
    name: str
    op: Optional[str] = None
    seq: Optional[int] = None
    #: The forward thread that created the node (RecordFunction's thread id, PyTorch's "Fwd thread id").
    fwd_thread: Optional[int] = None
    next: list[Optional[tuple[str, int]]] = []
    inputs: list[MetaSpec] = []
    saved: dict[str, Any] = {}
    attrs: dict[str, Any] = {}
    variable: Optional[str] = None


class RootSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    node: str
    input_nr: int = 0
    grad: Any = "ones"


class VariableSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    shape: list[int]
    dtype: str = "float32"
    device: str = "cpu"
    grad: Any = None
    requires_grad: bool = True


class GraphSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    format: str
    nodes: list[NodeSpec]
    roots: list[RootSpec]
    variables: list[VariableSpec] = []
    inputs: list[str] = []
    mode: str = "backward"
    meta: dict[str, Any] = {}
