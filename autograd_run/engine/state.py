"""Per-graph run state: variable gradients, saved tensors, hooks, released flags.

A loaded ``Graph`` never changes; everything a backward call changes lives
in a ``GraphState`` (the analogue of the tensors and autograd nodes a
PyTorch program holds). Several backward calls may share one state, as
several ``backward()`` calls share one autograd graph.

Locks:
  ``_grad_lock``  guards ``grads`` (AccumulateGrad runs may come from
                  several GraphTasks on several threads at once); a
                  ``_core.Lock``, which the compiled AccumulateGrad takes
                  directly;
  saved values need no lock: each dict/set operation is atomic under the
                  GIL; two threads materialising the same node's values race
                  benignly (``setdefault`` keeps the first), and ``release``
                  marks a node released before dropping its values (the
                  compiled worker loop does the same, in the same order).
Hooks are registered before a backward call and only read during it.

``prepare()`` makes every node's saved values before a timed backward (as a
forward pass leaves them): one walk groups the random specs by shape, dtype
and distribution, each group is drawn at once (``graphs.seeding``), with the
cyclic collector paused (everything made lives as long as the state).
``accumulate`` and ``release`` may be overridden (a subclass, an instance
attribute): the compiled engine then calls them instead of doing their work
itself.
"""

from __future__ import annotations

import operator
import threading
from typing import Any, Callable

import numpy as np

from autograd_run.engine import core
from autograd_run.graphs import seeding, tensors
from autograd_run.graphs.load import gc_paused
from autograd_run.graphs.model import Graph, Node
from autograd_run.ops.arrays import number
from autograd_run.ops.dtypes import HALF, ensure_bfloat16, upcast

ERR_BACKWARD_TWICE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)


class SavedTensorReleased(RuntimeError):
    pass


_SAVED = operator.attrgetter("saved")


def split_saved_py(nodes, released: set, cached: dict) -> tuple[list, list]:
    """The nodes that save tensors, neither released nor cached, split into plain ones (no saved value is a
    dict, a list or a string: the node's own mapping serves as its saved values) and the rest, which
    ``saved()`` converts (a string may be a Scalar to convert; compiled twin: ``_core.split_saved``)."""
    plain, rest = [], []
    for n in nodes:
        if n.saves_tensors and n not in released and n not in cached:
            saved = n.saved
            convert = type(saved) is not dict or any(type(v) is dict or type(v) is list or type(v) is str
                                                     for v in saved.values())
            (rest if convert else plain).append(n)
    return plain, rest


def _scatter_py(sink: list, values) -> None:
    """``mapping[name] = value`` for each ``(mapping, name)`` of ``sink`` and value, in step (``_core.scatter``)."""
    for (mapping, name), value in zip(sink, values):
        mapping[name] = value


def group_saved_py(todo: list, half: frozenset, offset: int) -> tuple[dict, dict, list, list]:
    """One walk over the saved values of ``todo`` (nodes ``split_saved`` says to convert): ``groups``, each
    random spec's seed (plus ``offset``) under ``(shape, dtype, dist)``; ``sinks``, under the same key, where
    each drawn array goes (``(mapping, name)``); ``done``, ``(node, mapping)`` for the nodes whose other values
    are all kept as they are; ``slow``, the same for the rest (a Scalar string, a formula in float16, a
    literal or ``.npz`` tensor, a tensor field given as a list), which ``saved()`` converts. Each mapping is
    a copy of the node's ``saved``. Compiled twin: ``_core.group_saved``."""
    groups: dict = {}
    sinks: dict = {}
    done: list = []
    slow: list = []
    for node in todo:
        saved = node.saved
        mapping = dict(saved)
        easy = not node.saved_strings and node not in half
        fields = node.op.tensor_fields
        for name, v in saved.items():
            kind = type(v)
            if kind is dict:
                if "random" in v and "shape" in v:
                    key = (tuple(v["shape"]), v.get("dtype") or "float32", v.get("dist", "normal"))
                    seeds = groups.get(key)
                    if seeds is None:
                        groups[key] = seeds = []
                        sinks[key] = sink = []
                    else:
                        sink = sinks[key]
                    seeds.append(v["random"] + offset)
                    sink.append((mapping, name))
                else:
                    easy = False
            elif kind is list and name in fields:
                easy = False
        (done if easy else slow).append((node, mapping))
    return groups, sinks, done, slow


class GraphState:
    def __init__(self, graph: Graph, backend_for: Callable[[Any], Any] | None = None):
        self.graph = graph
        #: Variable name -> accumulated gradient (array) or None.
        self.grads: dict[str, Any] = {}
        self._grad_lock = core.Lock()  # guards grads (a _core.Lock: the compiled AccumulateGrad takes it directly)
        self._saved: dict[Node, dict[str, Any]] = {}
        self._released: set[Node] = set()
        #: Saved values moved to the node's GPU (real CUDA only).
        self._saved_device: dict[Node, dict[str, Any]] = {}
        #: Hooks, keyed by node: tensor pre-hooks per input slot, node pre/post hooks.
        self.tensor_pre_hooks: dict[Node, list[tuple[int, Callable]]] = {}
        self.retains_grad_hooks: dict[Node, list[tuple[int, Callable]]] = {}
        self.pre_hooks: dict[Node, list[Callable]] = {}
        self.post_hooks: dict[Node, list[Callable]] = {}
        #: Whether any hook was registered (the engine skips hook lookups otherwise).
        self.has_hooks = False
        #: Python callables for ``python`` nodes registered from code (node -> fn).
        self.python_fns: dict[Node, Callable] = {}
        #: Measured time (ns) an ``opaque`` node takes when it runs (``run --costs``): it occupies its
        #: worker that long, without the GIL, as the C++ node it stands for did.
        self.measured_ns: dict[Node, float] = {}
        #: Nodes with a float16/bfloat16 slot: their formulas compute in float32 (``ops.dtypes``),
        #: on saved tensors and incoming gradients upcast here and in the engine.
        known = graph.slot_dtypes
        if known is None or "bfloat16" in known:  # a graph that may hold bfloat16 (built in Python: unknown)
            ensure_bfloat16()
        self.half_nodes = frozenset() if known is not None and HALF.isdisjoint(known) else \
            frozenset(n for n in graph.nodes if _computes_in_half(n))
        nodes = graph.nodes
        self._next_seq = (core.max_seq(nodes, 2**63) if core.max_seq is not None and type(nodes) is list
                          else max((n.seq for n in nodes if n.seq < 2**63), default=0)) + 1
        self._seq_lock = threading.Lock()  # guards _next_seq
        held_hooks = False
        for v in graph.variables.values():
            if v.grad is not None:
                self.grads[v.name] = tensors.materialize(v.grad, graph.side_files, v.shape, v.dtype)
            else:
                self.grads[v.name] = None
            held_hooks = held_hooks or bool(v.hooks)
        if held_hooks or graph.hooked_nodes:  # tensor hooks held as data in the file
            from autograd_run.engine import tensor_hooks
            tensor_hooks.register(self, graph)

    def next_seq(self) -> int:
        """A fresh sequence number above every node's, as a new GraphRoot gets in PyTorch."""
        with self._seq_lock:
            s = self._next_seq
            self._next_seq += 1
            return s

    # -- saved tensors ---------------------------------------------------------
    def saved(self, node: Node, premade: dict | None = None) -> dict[str, Any]:
        """Node's saved values; its op's tensor fields (``OpSpec.tensor_fields``) and tensor specs as arrays.

        Raises PyTorch's backward-twice error once the node's saved tensors
        were released by a backward call without ``retain_graph``.
        """
        if not node.saves_tensors and not node.saved_strings:
            return node.saved  # plain numbers, sizes, flags: the node's own mapping, never released
        cached = self._saved.get(node)
        if cached is not None:
            return cached
        if node in self._released:
            raise SavedTensorReleased(ERR_BACKWARD_TWICE)
        cached = {}
        side = self.graph.side_files
        tensor_fields = node.op.tensor_fields
        saved = node.saved
        scalar_fields = node.op.scalar_fields
        if not node.saved_strings and not any(type(v) is dict or type(v) is list for v in saved.values()):
            # Nothing to convert (plain numbers, sizes, flags): use the node's own mapping.
            return self._saved.setdefault(node, saved)
        half = node in self.half_nodes
        for name, value in saved.items():
            if value is None:
                cached[name] = None
            elif type(value) is dict and ((made := premade.get(id(value)) if premade else None) is not None
                                          or tensors.is_tensor_spec(value)):
                arr = made if made is not None else tensors.materialize(value, side)
                cached[name] = upcast(arr) if half else arr
            elif type(value) is str and name in scalar_fields:
                cached[name] = number(value)  # a Scalar JSON cannot hold: "(1-2j)", "inf", "1e-3"
            elif name in tensor_fields and isinstance(value, list):
                dtype = node.inputs[0].dtype if node.inputs else "float32"
                cached[name] = np.asarray(value, dtype="float32" if dtype in HALF else dtype)
            else:
                # Plain numbers stay Python numbers: like PyTorch's wrapped
                # scalars they do not change the gradient's dtype.
                cached[name] = value
        # Two threads may build the same values at once; the first one stored wins.
        return self._saved.setdefault(node, cached)

    def on_device(self, node: Node, values: dict, move) -> dict:
        """The node's saved values with arrays moved by ``move`` (cached per node)."""
        cached = self._saved_device.get(node)
        if cached is None:
            cached = {k: move(v) if isinstance(v, np.ndarray) else v for k, v in values.items()}
            cached = self._saved_device.setdefault(node, cached)
        return cached

    def release(self, node: Node) -> None:
        """Free the node's saved tensors (backward without retain_graph). The compiled worker loop does the
        same itself where this method is not overridden (``_core.release_node``)."""
        if node.saves_tensors:
            # Mark first, then drop: a concurrent saved() sees the values or the mark.
            self._released.add(node)
            self._saved.pop(node, None)
            if self._saved_device:
                self._saved_device.pop(node, None)

    def prepare(self) -> None:
        """Materialise every node's saved values now (as a forward pass would have made them),
        so a timed backward call measures the backward alone. Random specs are seeded in bulk."""
        plain, todo = (core.split_saved or split_saved_py)(self.graph.nodes, self._released, self._saved)
        # no value to convert: the node's own mapping (what saved() would cache for it)
        self._saved.update(zip(plain, map(_SAVED, plain)))
        if todo:
            with gc_paused():  # a few objects per node, all living as long as the state: nothing to collect
                self._prepare_converted(todo)

    def _prepare_converted(self, todo: list) -> None:
        """``saved()`` of every node in ``todo`` at once: one walk over their values (``group_saved_py``)
        groups the random specs by shape, dtype and distribution, ``seeding.draw_groups`` draws each group
        in one go, and each array is put where the walk said; the nodes it could not finish go through
        ``saved()`` with their random specs drawn."""
        group = core.group_saved or group_saved_py
        groups, sinks, done, slow = group(todo, self.half_nodes, self.graph.side_files.seed_offset)
        scatter = core.scatter or _scatter_py
        for key, arrays in seeding.draw_groups(groups).items():
            scatter(sinks[key], arrays)
        self._saved.update(done)  # split_saved left out the nodes already cached
        for node, mapping in slow:
            saved = node.saved
            self.saved(node, {id(saved[name]): arr for name, arr in mapping.items() if arr is not saved[name]})

    # -- hooks -----------------------------------------------------------------

    def register_tensor_pre_hook(self, node: Node, slot: int, fn: Callable) -> None:
        """Like ``Tensor.register_hook``: ``fn(grad) -> grad or None`` on input ``slot`` of ``node``."""
        self.tensor_pre_hooks.setdefault(node, []).append((slot, fn))
        self.has_hooks = True

    def register_retains_grad_hook(self, node: Node, slot: int, fn: Callable) -> None:
        self.retains_grad_hooks.setdefault(node, []).append((slot, fn))
        self.has_hooks = True

    def register_prehook(self, node: Node, fn: Callable) -> None:
        """Like ``Node.register_prehook``: ``fn(grad_outputs) -> new grad_outputs or None``."""
        self.pre_hooks.setdefault(node, []).append(fn)
        self.has_hooks = True

    def register_hook(self, node: Node, fn: Callable) -> None:
        """Like ``Node.register_hook``: ``fn(grad_inputs, grad_outputs) -> new grad_inputs or None``."""
        self.post_hooks.setdefault(node, []).append(fn)
        self.has_hooks = True

    # -- accumulation ----------------------------------------------------------
    def accumulate(self, name: str, grad, create_graph: bool) -> None:
        """Add ``grad`` into variable ``name``'s gradient: a first one is copied in, ``create_graph`` adds out
        of place (a new array), else in place. The compiled AccumulateGrad (``_core.accumulate_grad``) does
        the same where this method is not overridden."""
        with self._grad_lock:
            old = self.grads.get(name)
            if old is None:
                self.grads[name] = grad.copy()
            elif create_graph:
                self.grads[name] = old + grad
            else:
                old += grad


if core.register_accumulate is not None:  # the compiled engine does these two itself where not overridden
    core.register_accumulate(GraphState.accumulate)
    core.register_release(GraphState.release)


def _computes_in_half(node: Node) -> bool:
    """A node with a formula (not one of the engine's own kinds) and a float16/bfloat16 input or output slot."""
    if node.op.engine:
        return False
    if any(m.dtype in HALF for m in node.inputs):
        return True
    return any(e is not None and e.node.inputs[e.input_nr].dtype in HALF for e in node.next)
