"""Cost models: FLOPs and bytes moved by one backward node, from its shapes and dtypes.

A ``CostModel`` is two functions of a ``Shapes`` (the node's incoming
gradients, the gradients it produces, its saved tensors' shapes and its
other saved values). The simulation turns them into time with a device
spec (peak FLOP/s per dtype, memory bandwidth, launch overhead). The
figures are first-order (what a roofline model needs), not exact kernel
counts; measured costs take precedence where a user has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
            "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8}

Meta = tuple  # (shape, dtype)


@dataclass
class Shapes:
    """What a cost model sees of one node (plain tuples; no arrays are materialised)."""

    #: (shape, dtype) per input slot: the gradients flowing into the node.
    inputs: list[Meta]
    #: (shape, dtype) per next edge, None where the edge is None: the gradients it produces.
    outputs: list[Meta | None]
    #: (shape, dtype) of saved tensors whose shape is known without loading them.
    saved: Mapping[str, Meta] = field(default_factory=dict)
    #: The node's other saved values (sizes, dims, flags) as the file holds them.
    values: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def numel(meta: Meta | None) -> int:
        return 0 if meta is None else math.prod(meta[0])

    @staticmethod
    def nbytes(meta: Meta | None) -> int:
        return 0 if meta is None else math.prod(meta[0]) * ITEMSIZE.get(meta[1], 4)

    @property
    def in_numel(self) -> int:
        return sum(self.numel(m) for m in self.inputs)

    @property
    def out_numel(self) -> int:
        return sum(self.numel(m) for m in self.outputs)


def moved(s: Shapes) -> float:
    """Default bytes: read the incoming gradients and saved tensors, write the produced gradients."""
    return float(sum(s.nbytes(m) for m in s.inputs) + sum(s.nbytes(m) for m in s.outputs)
                 + sum(s.nbytes(m) for m in s.saved.values()))


@dataclass(frozen=True)
class CostModel:
    flops: Callable[[Shapes], float]
    bytes: Callable[[Shapes], float] = moved


def pointwise(per_element: float) -> CostModel:
    """``per_element`` FLOPs for each element of each produced gradient."""
    return CostModel(lambda s: per_element * s.out_numel)


#: Views and reshapes: no arithmetic and, in PyTorch, no copy.
VIEW = CostModel(lambda s: 0.0, lambda s: 0.0)
#: Copies and scatters into a fresh tensor: memory traffic only.
COPY = CostModel(lambda s: 0.0)


def _mm_flops(s: Shapes) -> float:
    """2*m*n*k per produced gradient of a (batched) matmul: grad (…, m, n), operand (…, m, k) or (…, k, n)."""
    g = s.inputs[0][0] if s.inputs else ()
    total = 0.0
    for m in s.outputs:
        if m is None or not m[0]:
            continue
        shape = m[0]
        # The contracted size is the operand's dimension not shared with the gradient.
        inner = shape[-1] if len(g) and shape[-2:-1] == g[-2:-1] else shape[-2] if len(shape) > 1 else 1
        total += 2.0 * math.prod(g) * inner
    return total


MATMUL = CostModel(_mm_flops)


def reduction(per_element: float = 1.0) -> CostModel:
    """A broadcast or reduction: ``per_element`` FLOPs per element of the larger side."""
    return CostModel(lambda s: per_element * max(s.in_numel, s.out_numel))
