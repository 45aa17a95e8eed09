"""Which nodes cost the same: a node's ``signature``, and a watch on the saved values a cost model reads.

``CostResolver`` resolves one cost per kind of node: a large graph has few kinds
(a chain of a million multiplications, one). A node's signature is a key
``(key, values)``: ``key`` holds everything the analytic cost is computed
from apart from the saved values' contents, ``values`` those contents. Cost
models rarely read saved values (a convolution's ``transposed``); which ones
do is seen, not assumed: ``ValuesRead`` notes any read.

``signature`` is the compiled core's (``engine/csrc/signature.c``) where it is built, else ``signature_py``:
the same key, built without Python frames (a placed graph's every node is costed: ~1-2 us a node in Python).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from autograd_run.engine import core

#: Ends the input metas in a signature's key (a meta's fields start with its shape, a tuple).
_OUTPUTS = "->"


def signature_py(node) -> tuple[tuple, tuple] | None:
    """``(key, values)`` of a node: nodes with equal signatures cost the same, and with equal keys too when
    their op's cost model reads no saved value.

    ``key``: op, name and device; per input and per output gradient (the next node's input meta, or None)
    the meta's shape, dtype, device type and index and stream (what ``InputMeta`` equality compares); the
    saved items in their order, a tensor by name, shape and dtype, any other by name. ``values``: those (a
    list of ints as a tuple, a value as is). None when a saved item is a dict without a shape or a list of
    other values (such a node is costed on its own). Flat tuples of builtin values hash without calling
    back into Python (a frozen dataclass's ``__hash__`` is Python code), once per node of a large graph.
    """
    dev = node.device
    key = [node.op, node.name, dev.type, dev.index]
    for m in node.inputs:
        dev = m.device
        key += (m.shape, m.dtype, dev.type, dev.index, m.stream)
    key.append(_OUTPUTS)
    for e in node.next:
        if e is None:
            key.append(None)
        else:
            m = e.node.inputs[e.input_nr]
            dev = m.device
            key += (m.shape, m.dtype, dev.type, dev.index, m.stream)
    saved = node.saved
    if not saved:
        return tuple(key), ()
    items, values = [], []  # items in the saved order: (name, shape, dtype) of a tensor, (name,) of a value
    for k, v in saved.items():
        t = type(v)
        if t is dict:
            shape = v.get("shape")
            if shape is None:
                return None
            items.append((k, tuple(shape), v.get("dtype")))
        elif t is list:
            if not all(type(x) is int for x in v):
                return None
            items.append((k,))
            values.append(tuple(v))
        else:
            items.append((k,))
            values.append(v)
    key.append(tuple(items))
    return tuple(key), tuple(values)


signature = core.signature if core.COMPILED else signature_py


class ValuesRead(Mapping):
    """A node's saved values (``Shapes.values``) that notes whether anything read them: a key, a value, the
    keys, the length. Every other read of a ``Mapping`` (``get``, ``in``, ``items``...) goes through these."""

    __slots__ = ("_values", "read")

    def __init__(self, values: Mapping[str, Any]):
        self._values = values
        #: Whether the cost model read anything of the values.
        self.read = False

    def __getitem__(self, key: str) -> Any:
        self.read = True
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        self.read = True
        return iter(self._values)

    def __len__(self) -> int:
        self.read = True
        return len(self._values)
