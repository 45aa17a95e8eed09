"""The op library: one ``OpSpec`` per backward op, declared beside its formula.

``REGISTRY`` maps names (PyTorch's spelling, e.g. ``MulBackward0``, and the
synthetic ``cost``/``opaque``/``python``/``identity``) to specs. Families:
``elementwise``, ``activations``, ``linalg``, ``shape``, ``reductions``,
``indexing``, ``conv`` (convolution, pooling, normalisation, resampling),
``losses``, ``attention`` (fused scaled-dot-product attention), ``products``
(baddbmm, addbmm, addmv, addr, _trilinear), ``recurrent`` (oneDNN's LSTM layer), ``spectral`` (FFTs), ``sparse``
(embedding bags), ``sampling`` (grid_sample, affine_grid, Gamma samples), ``functions``
(PyTorch's own Python autograd.Functions: module hooks, Dirichlet), and ``engine_ops`` (node kinds the engine implements
itself). Importing this package registers them all; a name declared twice
fails here.

This package depends on numpy only: the graph loader, the engine, the
simulation and capture all read the same table.
"""

from autograd_run.ops import dtypes  # noqa: F401  (bfloat16 is registered when first needed: dtypes.ensure_bfloat16)
from autograd_run.ops import (  # noqa: F401  (importing a family registers its ops)
    activations, attention, conv, elementwise, engine_ops, functions, indexing, linalg, losses, products, recurrent,
    reductions, sampling, shape, sparse, spectral,
)
from autograd_run.ops.engine_ops import (
    ACCUMULATE_GRAD, CHECKPOINT, COST, GRAPH_ROOT, IDENTITY, OPAQUE, PYTHON, is_graph_root,
)
from autograd_run.ops.spec import REGISTRY, Field, OpSpec, Outputs, RuleContext

FAMILIES = ("elementwise", "activations", "linalg", "shape", "reductions", "indexing", "conv", "losses",
            "attention", "products", "recurrent", "spectral", "sparse", "sampling", "functions", "engine_ops")


def _check() -> None:
    for spec in REGISTRY:
        if spec.family not in FAMILIES:
            raise RuntimeError(f"op {spec.name} is declared outside the op families ({spec.family})")
        if spec.engine != (spec.backward is None):
            raise RuntimeError(f"op {spec.name}: engine ops have no formula here, every other op has one")


_check()


def lookup(name: str) -> OpSpec | None:
    """The spec named ``name`` (a PyTorch node name, an alias or a synthetic op), or None."""
    return REGISTRY.get(name)


__all__ = ["REGISTRY", "OpSpec", "Outputs", "Field", "RuleContext", "lookup", "is_graph_root",
           "ACCUMULATE_GRAD", "CHECKPOINT", "COST", "GRAPH_ROOT", "IDENTITY", "OPAQUE", "PYTHON"]
