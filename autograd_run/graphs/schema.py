"""The on-disk schema of ``autograd-graph/1``, as msgspec structs.

JSON files are decoded straight into these structs (types checked while
decoding); YAML files are parsed safely and then converted into them, so
both formats share one schema and one set of type errors. Semantic checks
(ids, edges, cycles, shapes, side files) live in ``validate``.

Optional fields default to ``UNSET`` (falsy), not to their documented
default: a decoded struct then says exactly which fields the file wrote,
which lets the loader prove cheaply that a JSON file has no duplicate keys
(see ``load._json_has_no_duplicates``). ``validate`` applies the defaults.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["UNSET", "MetaSpec", "NodeSpec", "RootSpec", "VariableSpec", "GraphSpec"]


# ``gc=False`` on the two structs made per node (a million of each at 1e6 nodes): not tracked by the cyclic
# collector, no collector header. They hold only decoded data (strings, numbers, lists and dicts of them), so
# they can never be part of a cycle. The load of a 1e6-node chain: 0.96x the time, 31 MB less at its peak.
class MetaSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    """Frozen (hashable): the loader checks each distinct metadata once.

    Defaults: dtype ``float32``, device ``cpu``, stream 0.
    """

    shape: tuple[int, ...]
    dtype: str | UnsetType = UNSET
    device: str | UnsetType = UNSET
    stream: int | UnsetType = UNSET


class NodeSpec(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Defaults: op = name, seq from the topology, no next edges, inputs, saved values or attrs."""

    id: str
    name: str
    op: Optional[str] | UnsetType = UNSET
    seq: Optional[int] | UnsetType = UNSET
    #: The forward thread that created the node (RecordFunction's thread id, PyTorch's "Fwd thread id").
    fwd_thread: Optional[int] | UnsetType = UNSET
    next: list[Optional[tuple[str, int]]] | UnsetType = UNSET
    inputs: list[MetaSpec] | UnsetType = UNSET
    saved: dict[str, Any] | UnsetType = UNSET
    attrs: dict[str, Any] | UnsetType = UNSET
    variable: Optional[str] | UnsetType = UNSET


class RootSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Defaults: input_nr 0, grad ``ones``."""

    node: str
    input_nr: int | UnsetType = UNSET
    grad: Any = UNSET


class VariableSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Defaults: dtype ``float32``, device ``cpu``, no initial grad."""

    name: str
    shape: list[int]
    dtype: str | UnsetType = UNSET
    device: str | UnsetType = UNSET
    grad: Any = UNSET
    #: False: a tensor that does not require grad (it has no AccumulateGrad node).
    requires_grad: bool | UnsetType = UNSET
    #: Tensor hooks held as data (``engine.tensor_hooks``), checked by ``graphs.validate``.
    hooks: Any = UNSET


class GraphSpec(msgspec.Struct, forbid_unknown_fields=True):
    """Defaults: no variables or requested inputs, mode ``backward``, empty meta."""

    format: str
    nodes: list[NodeSpec]
    roots: list[RootSpec]
    variables: list[VariableSpec] | UnsetType = UNSET
    inputs: list[str] | UnsetType = UNSET
    #: The model's parameters in registration order (variable names), as DDP indexes them.
    parameters: list[str] | UnsetType = UNSET
    #: DistributedDataParallel's settings when the model was captured wrapped in it (``graphs.validate``).
    ddp: dict[str, Any] | UnsetType = UNSET
    #: FSDP2's units when the model was captured under ``fully_shard`` (``graphs.validate``).
    fsdp: dict[str, Any] | UnsetType = UNSET
    #: The storage each saved tensor lives in, when capture recorded it (``graphs.validate``, ``analysis.memory``).
    storage: dict[str, Any] | UnsetType = UNSET
    mode: str | UnsetType = UNSET
    meta: dict[str, Any] | UnsetType = UNSET
