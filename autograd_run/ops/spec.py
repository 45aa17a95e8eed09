"""OpSpec: everything autograd-run knows about one backward op, declared in one place.

An op is declared once, next to its backward formula, in the module of its
family (``elementwise``, ``linalg``, ``shape``, ``reductions``,
``activations``, ``conv``, ``losses``, ``indexing``; the engine's own node
kinds in ``engine_ops``)::

    @op("MulBackward0", saved="self:tensor? other:tensor?", elementwise=True,
        cost=cost.pointwise(1))
    def mul(node, grads, ctx): ...

``saved`` lists the fields PyTorch saves on the node (``_saved_NAME``), each
``name:kind`` with ``?`` when it may be absent or None. Kinds:

  ``tensor``    an array (a tensor spec in the file); freed by a backward
                call without ``retain_graph``; a plain number is a wrapped
                scalar (PyTorch saves those as 0-dim tensors);
  ``sizes``     a list of non-negative integers (a shape);
  ``ints``      a list of integers (dims; PyTorch writes -1 as 2**64-1);
  ``int``       one integer (same encoding);
  ``scalar``    a number;
  ``bool``      true or false;
  ``str``       a string (e.g. ``approximate``);
  ``tensors``   a list of tensors, entries may be None (``IndexBackward0``'s
                ``indices``): each entry is None, the name of another saved
                field holding the tensor (capture writes ``indices.0``, ...,
                so that tensors can live in the side file), or inline data.

The backward formula is ``fn(node, grads, ctx) -> list``: ``grads`` holds
the node's incoming gradients (one per input slot, None when undefined;
a node whose gradients are all undefined sends None everywhere without
calling its formula, as PyTorch's generated nodes do);
the result has one entry per next edge (None where the edge is None or no
gradient flows). ``ctx`` is a ``RuleContext``: the node's saved values,
its array module, device transfers and ``create_graph``; never the
engine's GraphTask. ``cost`` is a ``cost.CostModel`` (FLOPs and bytes moved
as functions of the node's shapes and dtypes) used by the simulation.
What graph validation checks of an op's saved values is declared here too:
``needed_for_output`` (optional fields a given output reads), and for
matrix products ``matrix_rank`` and ``matrix_dims``. What the memory
model (``analysis.memory``) reads is declared here too: ``views``, which
outputs are the incoming gradient itself or a view of it rather than new
memory (see ``VIEW_KINDS``).

The registry holds exactly one spec per name (PyTorch's spelling, plus
aliases such as ``torch::autograd::AccumulateGrad``); registering a name
twice fails at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

KINDS = ("tensor", "sizes", "ints", "int", "scalar", "bool", "str", "tensors")

#: How an output of a backward formula relates to its incoming gradient (``OpSpec.views``), as PyTorch's
#: formula in ``derivatives.yaml`` makes it (what ``analysis.memory`` counts):
#:   ``""``           new memory, contiguous (the default: a product, a sum, a copy);
#:   ``"t-new"``      new memory laid out transposed (``mm_mat2_backward`` of a column-major matrix returns
#:                    ``grad.t().mm(mat1).t()``): the ``TBackward0`` after it makes it contiguous again;
#:   ``"same"``       the gradient itself (``grad``): the same tensor, no new memory;
#:   ``"view"``       a view of all of it in the same layout (``squeeze``, ``unsqueeze``);
#:   ``"reshape"``    ``grad.reshape()``: a view of a contiguous gradient, else a contiguous copy;
#:   ``"transpose"``  ``grad.t()`` / ``grad.transpose()``: a view, transposed;
#:   ``"permute"``    ``grad.permute()``: a view, strided;
#:   ``"part"``       a view of a part of it (``CatBackward0``'s ``grad.narrow``);
#:   ``"expand"``     an expanded view of it (``SumBackward0``'s ``grad.expand``), not dense.
#: A view or the gradient itself is no new memory while the element count, dtype and device stay the
#: gradient's (else the engine's ``sum_to`` or cast allocates).
VIEW_KINDS = ("", "t-new", "same", "view", "reshape", "transpose", "permute", "part", "expand")


@dataclass(frozen=True)
class Field:
    """One saved field: its kind and whether it may be missing (or None)."""

    kind: str
    optional: bool = False


def parse_saved(text: str) -> dict[str, Field]:
    """``"self:tensor dim:ints?"`` -> {"self": Field("tensor"), "dim": Field("ints", True)}."""
    out: dict[str, Field] = {}
    for item in text.split():
        name, _, kind = item.partition(":")
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if not name or kind not in KINDS or name in out:
            raise ValueError(f"bad saved field declaration {item!r} (kinds: {', '.join(KINDS)})")
        out[name] = Field(kind, optional)
    return out


@dataclass(frozen=True, eq=False)
class OpSpec:
    """One backward op. Identity-hashed: nodes hold their spec and the engine keys tables by it."""

    #: The node name as PyTorch spells it (``MulBackward0``), or a synthetic op (``cost``).
    name: str
    #: ``fn(node, grads, ctx) -> list``; None for the engine's own node kinds (see ``engine_ops``).
    backward: Callable | None
    #: Saved fields by name (see the module docstring).
    saved: Mapping[str, Field] = field(default_factory=dict)
    #: Every gradient output has the shape of the (single) input gradient, up to broadcasting.
    elementwise: bool = False
    #: The family module that declares it (``elementwise``, ``conv``, ...).
    family: str = ""
    #: FLOPs and bytes moved (``cost.CostModel``); None: the simulation's default for its family.
    cost: Any = None
    #: Other spellings accepted in files and captures.
    aliases: tuple[str, ...] = ()
    #: ``fn(saved_values) -> reason or None``: instances of this op that have no rule here
    #: (e.g. a transposed convolution); capture records those as opaque, saying why.
    unsupported: Callable[[Mapping[str, Any]], str | None] | None = None
    #: Implemented by the engine itself (AccumulateGrad, GraphRoot, cost, opaque, python, identity).
    engine: bool = False
    #: Shown in docs and ``--help`` listings.
    doc: str = ""
    #: Gradients returned, one per next edge: an int, an ``Outputs`` (per node), or None (unknown).
    outputs: int | Outputs | None = None
    #: Saved fields declared optional (PyTorch saves them only when the other input requires grad) that the
    #: formula reads once a given output's edge exists: ((output index, field), ...) (checked by validate).
    needed_for_output: tuple = ()
    #: A matrix product: the rank each saved tensor must have (a plain number is no matrix here), else None.
    matrix_rank: int | None = None
    #: A matrix product's saved matrices and the dims each shares with the gradient its node receives (the
    #: product's result): field -> ((saved dim, gradient dim), ...). Another size there is no PyTorch graph.
    matrix_dims: Mapping[str, tuple] | None = None
    #: Per output, how it relates to the incoming gradient (``VIEW_KINDS``): one kind for every output, or
    #: ``fn(node) -> tuple`` of kinds, one per output (an op whose outputs depend on a saved value).
    views: str | Callable = ""
    #: The saved sizes the incoming gradient is expanded to (``grad.expand(self_sym_sizes)`` in PyTorch's
    #: formula), or "": validate checks that the gradient the node receives can be expanded to them.
    expands_to: str = ""
    #: A matrix product's gradients' shapes: output index -> one ``(source, dim)`` per dim, the source ``"grad"``
    #: (the gradient the node receives) or a saved matrix's field (``mm``'s first output is ``grad @ mat2.T``:
    #: ``(("grad", 0), ("mat2", 0))``). Validate checks each consumer's input against it (PyTorch's ``sum_to``
    #: rule), where the file writes the saved matrix as a spec with its shape. ``"reversed"`` in place of an output's
    #: pairs: the incoming gradient's dims in reverse order (``t()``). ``"part"`` for the whole op: each output is a
    #: part of the incoming gradient along the saved ``dim``, sized by the saved ``sizes`` or else by its consumer
    #: (``cat``). None: not declared.
    grad_shapes: Mapping[int, tuple] | str | None = None
    #: The saved fields of kind ``tensor`` (derived).
    tensor_fields: frozenset = field(init=False)
    #: The saved fields of kind ``scalar`` (derived): a file may write one as a string ("(1-2j)", "inf", "1e-3").
    scalar_fields: frozenset = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "tensor_fields", frozenset(k for k, f in self.saved.items() if f.kind == "tensor"))
        object.__setattr__(self, "scalar_fields", frozenset(k for k, f in self.saved.items() if f.kind == "scalar"))
        if not callable(self.views) and self.views not in VIEW_KINDS:
            raise ValueError(f"op {self.name}: views must be one of {VIEW_KINDS} or a function, got {self.views!r}")

    def view_kinds(self, node) -> tuple | str:
        """``views`` for this node: a kind for every output, or a tuple with one kind per output."""
        v = self.views
        return v(node) if callable(v) else v

    def __repr__(self) -> str:
        return f"<op {self.name}>"


@dataclass(frozen=True)
class Outputs:
    """An output count that varies by node: ``count(node)`` is it, or None where the node does not say.

    ``text`` says where it comes from (for the catalogue and error messages).
    """

    count: Callable[[Any], int | None]
    text: str

    def __str__(self) -> str:
        return self.text


def per_saved(key: str) -> Outputs:
    """One output per entry of the node's saved list ``key`` (unknown where the node does not save it)."""
    def count(node) -> int | None:
        value = node.saved.get(key)
        return len(value) if type(value) is list else None
    return Outputs(count, f"one per entry of saved {key!r}")


def _per_input(node) -> int | None:
    return len(node.inputs) or None


#: As many outputs as input slots (a pass-through Function); unknown where the file gives no inputs.
PER_INPUT = Outputs(_per_input, "one per input slot")


class Registry:
    """Name -> OpSpec, with aliases. ``add`` refuses a second spec for a name."""

    def __init__(self):
        self._by_name: dict[str, OpSpec] = {}
        self.specs: list[OpSpec] = []

    def add(self, spec: OpSpec) -> OpSpec:
        for name in (spec.name, *spec.aliases):
            if name in self._by_name:
                raise RuntimeError(f"op {name!r} is declared twice ({self._by_name[name].family} and {spec.family})")
            self._by_name[name] = spec
        self.specs.append(spec)
        return spec

    def get(self, name: str) -> OpSpec | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> OpSpec:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __iter__(self):
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)


REGISTRY = Registry()


def undefined_passthrough(fn: Callable) -> Callable:
    """``fn``, except that a call whose incoming gradients are all undefined (None) returns None for every edge.

    PyTorch's generated nodes do the same (``any_grad_defined``); undefined gradients are common in
    ``create_graph=True`` graphs, where a double-backward node has nothing to send along some edge.
    """
    def rule(node, grads, ctx):
        for g in grads:
            if g is not None:
                return fn(node, grads, ctx)
        return [None] * len(node.next)
    rule.__name__, rule.__qualname__, rule.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    rule.__module__, rule.__wrapped__ = fn.__module__, fn
    rule.undefined_passthrough = True  # the compiled worker loop runs ``fn`` after the same check
    return rule


def op(*names: str, outputs: int | Outputs | None, saved: str = "", elementwise: bool = False, cost=None,
       aliases: tuple[str, ...] = (), unsupported: Callable | None = None, needed_for_output: tuple = (),
       matrix_rank: int | None = None, matrix_dims: Mapping[str, tuple] | None = None,
       views: str | Callable = "", expands_to: str = "", grad_shapes: Mapping[int, tuple] | str | None = None):
    """Declare the decorated backward formula as the rule of ``names`` (one spec per name).

    ``outputs`` must be given (None only where nothing tells the count; see the module docstring).
    Names with different counts take one ``op`` each, stacked on the same formula.
    The spec runs the formula through ``undefined_passthrough``: formulas see at least one defined gradient.
    """
    if not (outputs is None or isinstance(outputs, Outputs) or (type(outputs) is int and outputs >= 0)):
        raise ValueError(f"outputs of {names} must be a non-negative int, an Outputs or None, got {outputs!r}")
    fields = parse_saved(saved)

    def register(fn: Callable) -> Callable:
        family = fn.__module__.rsplit(".", 1)[-1]
        doc = (fn.__doc__ or "").strip().split("\n")[0]
        rule = undefined_passthrough(fn)
        for i, name in enumerate(names):
            REGISTRY.add(OpSpec(name, rule, fields, elementwise, family, cost,
                                aliases if i == 0 else (), unsupported, False, doc, outputs, needed_for_output,
                                matrix_rank, matrix_dims, views, expands_to, grad_shapes))
        return fn
    return register


def engine_op(name: str, doc: str, *, saved: str = "", elementwise: bool = False, cost=None,
              aliases: tuple[str, ...] = (), views: str = "") -> OpSpec:
    """Declare a node kind that the engine implements itself (``autograd_run.engine.builtin_nodes``)."""
    return REGISTRY.add(OpSpec(name, None, parse_saved(saved), elementwise, "engine_ops", cost, aliases,
                               None, True, doc, views=views))


@dataclass(slots=True)
class RuleContext:
    """What a backward formula may use besides its node and gradients.

    ``saved(node)``: the node's saved values, tensor fields as arrays (raises
    PyTorch's backward-twice error once released); ``xp(node)``: the array
    module for the node's device (numpy, or cupy on a real GPU);
    ``transfer(array, src, dst)``: move an array between devices;
    ``create_graph``: the backward call's ``create_graph``.
    """

    saved: Callable[[Any], Mapping[str, Any]]
    xp: Callable[[Any], Any]
    transfer: Callable[[Any, Any, Any], Any]
    create_graph: bool = False
