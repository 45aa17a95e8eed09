"""The typed, validated graph model the engine runs.

A ``Graph`` is immutable once loaded: the engine keeps per-run state
(gradients, released saved tensors) elsewhere. Edges point at ``Node``
objects directly so the engine's hot path never looks anything up by id.

Derived at load (see ``derive``): each node's ``topo_nr`` (0 without next
edges, else 1 + max over next nodes), its ``device`` (first non-CPU input
device, else CPU), its ``stream`` (that input's stream); the graph's
highest device index. Each node's ``consumers`` (reverse edges: which
nodes feed gradient into it) are made when first needed
(``ensure_consumers``: placement and draw): the loader leaves them None,
a tenth of a loaded graph's memory that a run and a simulation never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, countOf
from types import MappingProxyType
import re
from typing import Any, Mapping, NamedTuple

from autograd_run.ops import OpSpec

#: Shared, read-only stand-in for a node's empty ``saved``/``attrs`` (saves ~100 B a node).
EMPTY: Mapping[str, Any] = MappingProxyType({})

#: PyTorch gives AccumulateGrad nodes this sequence number so that a ready
#: leaf outranks every other node.
ACCUMULATE_GRAD_SEQ = 2**64 - 1

FORMAT = "autograd-graph/1"

#: Dtypes a gradient (and so an input slot or a variable) may have.
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
#: Dtypes a saved tensor may have (indices, masks and wrapped integers too).
SAVED_DTYPES = DTYPES + ("bool", "int8", "int16", "int32", "int64", "uint8")


#: Device indices are bounded (one worker thread per index): ``TYPE:0`` .. ``TYPE:255``.
MAX_DEVICE_INDEX = 255
#: Device types are lowercase identifiers (PyTorch's ``cuda``, ``xpu``, ``mps``, ``hpu``,
#: ``xla``, a renamed PrivateUse1 backend such as ``openreg``), at most 32 characters.
_DEVICE_TYPE = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: Types that do not describe a place gradients can live on.
_NOT_A_DEVICE = {"meta": "meta tensors carry no data, so a backward pass cannot run on them"}
#: The device types PyTorch 2.13 names itself (c10/core/DeviceType.h; ``torch.device`` refuses any other unless a
#: PrivateUse1 backend was renamed to it). Any other lowercase name is taken as such a renamed backend (Ascend's
#: ``npu``, ``openreg``), except a near miss of one of these (``cdua``, ``cud``): a typo, not a backend.
TORCH_DEVICE_TYPES = frozenset(("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
                                "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia",
                                "privateuseone"))
#: Names people write for a GPU that PyTorch does not know.
_MEANT = {"gpu": "cuda", "nvidia": "cuda", "rocm": "cuda", "amd": "cuda", "tpu": "xla", "metal": "mps"}


def _near_miss(typ: str) -> str | None:
    """The known device type ``typ`` misspells (same letters in another order, or one letter more or less than a
    known type of four letters or more), or None. Three-letter types are left alone: ``npu`` is a real renamed
    backend one letter from ``hpu``, ``ipu`` and ``xpu``."""
    if typ in TORCH_DEVICE_TYPES:
        return None
    if typ in _MEANT:
        return _MEANT[typ]
    for known in sorted(TORCH_DEVICE_TYPES):
        if len(known) < 3:
            continue
        if len(typ) == len(known) and sorted(typ) == sorted(known):
            return known
        if len(known) >= 4 and abs(len(typ) - len(known)) == 1:
            short, long_ = (typ, known) if len(typ) < len(known) else (known, typ)
            if any(long_[:i] + long_[i + 1:] == short for i in range(len(long_))):
                return known
    return None


@dataclass(frozen=True, slots=True)
class Device:
    """``cpu`` (index -1) or an accelerator ``TYPE:N`` (``cuda:0``, ``xpu:1``, ``mps:0``, ...).

    As in PyTorch, nodes on the same index of different accelerator types
    share one worker thread (the engine routes by index).
    """

    type: str
    index: int = -1

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.index}"

    @staticmethod
    def parse(text: str) -> "Device | None":
        """``cpu``, ``TYPE`` (= ``TYPE:0``) or ``TYPE:N``; None when malformed (``explain`` says why)."""
        if text == "cpu":
            return CPU
        if Device.explain(text) is not None:
            return None
        typ, _, idx = text.partition(":")
        return device(typ, int(idx) if idx else 0)

    @staticmethod
    def explain(text: Any) -> str | None:
        """Why ``text`` is not a device string, or None when it is one."""
        expected = "expected 'cpu', or 'TYPE:N' for an accelerator such as 'cuda:0'"
        if not isinstance(text, str):
            return f"a device must be a string, got {_short(text)}; {expected}"
        if text == "cpu":
            return None
        typ, colon, idx = text.partition(":")
        if not _DEVICE_TYPE.fullmatch(typ):
            if typ.lower() != typ and _DEVICE_TYPE.fullmatch(typ.lower()):
                return f"unknown device {_short(text)}: device types are lowercase ({typ.lower()!r})"
            return f"unknown device {_short(text)}; {expected}"
        if typ in _NOT_A_DEVICE:
            return f"device {_short(text)} is not supported: {_NOT_A_DEVICE[typ]}"
        if typ == "cpu":
            return f"device {_short(text)}: 'cpu' has no index; write 'cpu'"
        meant = _near_miss(typ)
        if meant is not None:
            return (f"unknown device {_short(text)}: PyTorch has no device type {typ!r}; did you mean "
                    f"{meant + colon + idx!r}?")
        if not colon:
            return None
        if not idx.isascii() or not idx.isdigit() or (len(idx) > 1 and idx[0] == "0"):
            return f"unknown device {_short(text)}: the index must be a non-negative integer without leading zeros"
        if len(idx) > 3 or int(idx) > MAX_DEVICE_INDEX:
            return f"device {_short(text)}: index out of range (at most {MAX_DEVICE_INDEX})"
        return None


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters, for messages about untrusted values."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


CPU = Device("cpu", -1)
#: Each device made by ``device``, by (type, index).
_DEVICES: dict[tuple[str, int], Device] = {("cpu", -1): CPU}


def device(type: str, index: int) -> Device:
    """The one ``Device`` object of (type, index) that loaded graphs and placements share. Equal devices are then
    the same object, so the engine's compiled code compares them by identity instead of calling the
    dataclass's ``__eq__`` (775,000 calls in a 1e6-node simulation over two devices)."""
    key = (type, index)
    d = _DEVICES.get(key)
    if d is None:
        d = _DEVICES[key] = Device(type, index)
    return d


@dataclass(frozen=True, slots=True)
class InputMeta:
    """What a node expects in one input slot: the gradient's shape, dtype, device, stream."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    device: Device = CPU
    stream: int = 0


@dataclass(eq=False, slots=True)
class Node:
    """One backward function. Identity-hashed: the engine keys state by node object."""

    id: str
    name: str
    #: The op's spec (``autograd_run.ops``): how to run it, what it saves, its cost model.
    op: OpSpec
    seq: int
    #: One entry per output: the edge receiving that gradient, or None (dropped).
    next: list["Edge | None"]
    inputs: list[InputMeta]
    #: Saved values by name: plain JSON values, or tensor specs (mappings with
    #: ``data``, ``npz`` or ``random``); see ``autograd_run.graphs.tensors``.
    saved: dict[str, Any] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    #: For AccumulateGrad: the name of the variable it accumulates into.
    variable: str | None = None
    #: The forward thread that created the node (PyTorch's RecordFunction thread id); None when unknown.
    #: With ``seq`` it identifies the node in a PyTorch profiler trace ("Fwd thread id", "Sequence number").
    fwd_thread: int | None = None
    # --- derived at load ---
    index: int = -1
    topo_nr: int = 0
    device: Device = CPU
    stream: int = 0
    #: (producer node, its output number) of each edge into this node, in the graph's list order; None until
    #: made (``ensure_consumers``; ``derive`` makes them for a graph built in code, the loader does not).
    consumers: list[tuple["Node", int]] | None = None
    #: ``device`` is the CPU (a plain attribute: the engine's hot path reads it per node).
    cpu: bool = True
    #: Whether the node saves tensors (freed by a backward without retain_graph).
    saves_tensors: bool = False
    #: Whether a Scalar saved value is written as a string the run reads as a number ("(1-2j)", "inf").
    saved_strings: bool = False

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return f"<Node {self.id} {self.name} seq={self.seq}>"


_next_of = attrgetter("next")
_device_of = attrgetter("device")


try:  # the loader's compiled loops; their edges_and_devices answers None until validate has configured them
    from autograd_run.graphs._build import edges_and_devices as _compiled_edges_and_devices
except ImportError:
    _compiled_edges_and_devices = None


def _edges_and_devices(nodes: list) -> tuple[int, list] | None:
    """(edges, distinct device objects) from the compiled pass (``_build.edges_and_devices``, at 1e6 nodes
    0.38 -> 0.03 s for both), or None: the properties below then take their own Python passes (so they do
    where it is not built, not configured, or ``AUTOGRAD_RUN_PURE_PYTHON`` is set)."""
    return _compiled_edges_and_devices(nodes) if _compiled_edges_and_devices is not None else None


class Edge(NamedTuple):
    """(node, input_nr): which input slot of which node receives a gradient."""

    node: "Node"
    input_nr: int


@dataclass(slots=True)
class Root:
    """An edge into the graph with the gradient it is seeded with.

    ``grad`` is ``"ones"``, ``"zeros"``, an explicit value (number or nested
    list), or a tensor spec mapping (``{"random": {...}}``, ``{"npz": key}``).
    """

    edge: Edge
    grad: Any = "ones"


#: The kinds of a variable's held tensor hooks, with their fields (``engine.tensor_hooks`` runs them).
HOOK_KINDS = {"scale": ("by",), "clamp": ("min", "max"), "clip_norm": ("max_norm", "norm_type", "eps"),
              "python": ("callable",)}


@dataclass(slots=True)
class Variable:
    """A leaf tensor: gradients accumulate into it through its AccumulateGrad node."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    device: Device = CPU
    #: Initial ``.grad``: None, or a value/spec as for ``Root.grad``.
    grad: Any = None
    node: Node | None = None
    #: False: a tensor that does not require grad (no AccumulateGrad node; asking for its gradient is
    #: PyTorch's error). A variable that requires grad without a node is a leaf the graph does not reach.
    requires_grad: bool = True
    #: Tensor hooks held as data (``engine.tensor_hooks``): run in order on each gradient before it accumulates.
    hooks: tuple = ()


@dataclass(slots=True)
class Graph:
    nodes: list[Node]
    roots: list[Root]
    variables: dict[str, Variable]
    #: Requested inputs (variable names or node ids), as for grad(inputs=)/backward(inputs=).
    inputs: list[str] = field(default_factory=list)
    mode: str = "backward"
    #: Free-form top-level metadata (e.g. a captured PyTorch reference).
    meta: dict[str, Any] = field(default_factory=dict)
    #: Where the graph came from (a path or ``example:NAME``) and its folder,
    #: which side files must stay inside.
    source: str = "<memory>"
    base_dir: str | None = None
    by_id: dict[str, Node] = field(default_factory=dict)
    #: Opens the graph's ``.npz`` side files (``autograd_run.graphs.tensors.SideFiles``).
    side_files: Any = None
    #: The highest accelerator device index any node uses (-1: CPU only); derived at load.
    max_device_index: int = -1
    #: Every dtype a node's input slot has (a superset is allowed), when the loader collected them from its
    #: interned metas; None (graphs built in code): unknown, so a run looks at each node.
    slot_dtypes: frozenset | None = None
    #: Every op (``OpSpec``) a node uses (a superset is allowed), when the loader collected them; None (graphs
    #: built in code): unknown, so a search for nodes of one op looks at each node (``nodes_of``).
    op_set: frozenset | None = None
    #: The model's parameters in registration order (variable names; the file's ``parameters``): the indices
    #: DDP's Reducer uses. Empty: not recorded (a data-parallel view then takes the variables in file order).
    parameters: list[str] = field(default_factory=list)
    #: DistributedDataParallel's settings recorded by capture (the file's ``ddp``; see ``graphs.validate``):
    #: ``bucket_cap_mb``, ``bucket_cap_mb_list``, ``find_unused_parameters``, ``static_graph``,
    #: ``gradient_as_bucket_view``, ``world_size``. None: not captured under DDP.
    ddp: dict | None = None
    #: FSDP2's units recorded by capture (the file's ``fsdp``; see ``graphs.validate`` and ``sim.fsdp``):
    #: ``units`` in forward order (``name``, ``parameters``, ``reshard_after_forward``, ``pre_backward`` and
    #: ``post_backward`` node ids or None, optional ``backward_prefetch``, ``forward_prefetch``, ``param_dtype``,
    #: ``reduce_dtype``, ``reduce_grads``, ``all_reduce_grads``, ``reshard_after_backward``, ``unshard_in_backward``,
    #: ``forward_calls``),
    #: ``root``, ``world_size``. None: not captured under FSDP2.
    fsdp: dict | None = None
    #: Nodes with tensor hooks on their input slots (``attrs.hooks``; ``engine.tensor_hooks``), found at load.
    hooked_nodes: list = field(default_factory=list)
    #: Where the saved tensors live, recorded by capture (the file's ``storage``; see ``graphs.validate`` and
    #: ``analysis.memory``): ``blocks``, a list of ``(bytes, variable name or None, recompute group or
    #: None)``, one per storage (a variable's: a leaf owns it, the backward never frees it; a recompute
    #: group's: a non-reentrant checkpoint region's, made again in the backward), and ``saved``, node id -> {field: block
    #: index}. None: not recorded (each saved tensor is then its own allocation of its own size).
    storage: dict | None = None

    def nodes_of(self, op) -> list[Node]:
        """The nodes whose op is ``op``, in list order (none, without a look at each node, when the loader's
        ``op_set`` says the op is not in the graph)."""
        if self.op_set is not None and op not in self.op_set:
            return []
        return [n for n in self.nodes if n.op is op]

    @property
    def num_edges(self) -> int:
        """The next edges that lead somewhere (a ``None`` slot is not an edge)."""
        counted = _edges_and_devices(self.nodes)
        if counted is not None:
            return counted[0]
        # map over the node list (builtins only, no frame per node): 0.34 -> 0.1 s at 1e6 nodes
        nexts = list(map(_next_of, self.nodes))
        return sum(map(len, nexts)) - sum(map(countOf, nexts, repeat(None)))

    @property
    def devices(self) -> list[Device]:
        """The distinct devices of the nodes, the CPU first."""
        counted = _edges_and_devices(self.nodes)
        if counted is not None:
            seen = counted[1]
        else:
            # Nodes share a few device objects: distinct by identity first (no Python-level __hash__ per node)
            found = list(map(_device_of, self.nodes))
            seen = dict(zip(map(id, found), found)).values()
        return sorted(set(seen), key=lambda d: (d.type != "cpu", d.type, d.index))

    def files(self) -> list[str]:
        """The files this graph was read from: the graph file and every ``.npz`` side file beside it (an
        output of any command must never overwrite one of them)."""
        import glob
        import os
        side = getattr(self.side_files, "base_dir", None)
        extra = glob.glob(os.path.join(glob.escape(side), "*.npz")) if side else []
        return [self.source, *extra] if self.source else extra

    def input_edges(self) -> list[Edge]:
        """The requested inputs as edges: a variable's AccumulateGrad slot 0, or a node's slot 0."""
        out = []
        for name in self.inputs:
            var = self.variables.get(name)
            node = var.node if var is not None else self.by_id[name]
            out.append(Edge(node, 0))
        return out


def saves_tensors(op: OpSpec, saved: dict) -> bool:
    """Whether saved values ``saved`` of an ``op`` node hold a tensor (a field of kind tensor, or a tensor spec)."""
    fields = op.tensor_fields
    if fields and not fields.isdisjoint(saved):
        return True
    for v in saved.values():
        if type(v) is dict and ("random" in v or "data" in v or "npz" in v):
            return True
    return False


def has_scalar_strings(op: OpSpec, saved: dict) -> bool:
    """Whether a saved value of one of ``op``'s Scalar fields is a string (read as a number at run time)."""
    for k in op.scalar_fields:  # a loop, not any(): called once per loaded node
        if type(saved.get(k)) is str:
            return True
    return False


def derive_node(node: Node, index: int) -> None:
    """A node's own derived fields: index, an empty consumer list, saves_tensors, device/stream/cpu."""
    node.index = index
    node.consumers = []
    if node.saved:
        if saves_tensors(node.op, node.saved):
            node.saves_tensors = True
        if has_scalar_strings(node.op, node.saved):
            node.saved_strings = True
    for meta in node.inputs:
        if meta.device.type != "cpu":
            node.device, node.stream, node.cpu = meta.device, meta.stream, False
            break
    else:
        node.device, node.stream, node.cpu = CPU, 0, True


def link(node: Node, out_nr: int, target: Node) -> None:
    """Record the edge ``node.next[out_nr] -> target`` on the target's consumers."""
    target.consumers.append((node, out_nr))


def ensure_consumers(graph: Graph) -> None:
    """Every node's ``consumers``, made in one pass over the nodes in list order (each node's edges in
    order) where any node lacks them; the order ``derive`` and a loader that linked edges as it went give."""
    nodes = graph.nodes
    if all(n.consumers is not None for n in nodes):
        return
    for n in nodes:
        n.consumers = []
    for n in nodes:
        for k, e in enumerate(n.next):
            if e is not None:
                e[0].consumers.append((n, k))


def derive(graph: Graph, prepared: bool = False, forward: bool | None = None, order=None,
           topo_in=None) -> None:
    """Fill the derived fields: index, device, stream, consumers and topo_nr.

    ``prepared``: the loader already did what ``derive_node`` does on each node while building them (all
    but the consumers, left None: ``ensure_consumers``), and set the graph's
    ``max_device_index`` (one pass fewer over a big graph each); ``forward``: it also found whether every edge points
    forward in the list; ``order``: the nodes in an order in which each comes after every node its edges
    point to, which the caller proves (a graph built from one already derived: then it is acyclic, and
    the topological numbers take one pass in that order). Otherwise raises ``ValueError(cycle)`` with the cycle as a
    list of nodes if the graph is not acyclic. Iterative, so a chain of a
    million nodes does not hit Python's recursion limit.

    ``topo_in``: the compiled twin of ``_topo_in`` over a node list (the loader's ``_build.topo_in``), for
    ``order`` or for the pass in list order when the edges all point forward; None: the Python loop.
    """
    nodes = graph.nodes
    if not prepared:
        _derive_nodes(graph)
    if order is not None:
        if topo_in is None or not topo_in(order, False):
            _topo_in(order)
        return
    if forward is None:
        forward = _edges_point_forward(nodes)
    if forward and topo_in is not None and topo_in(nodes, True):
        return
    _topo(nodes, forward)


def _derive_nodes(graph: Graph) -> None:
    nodes = graph.nodes
    for i, node in enumerate(nodes):
        derive_node(node, i)
        if not node.cpu and node.device.index > graph.max_device_index:
            graph.max_device_index = node.device.index
    for node in nodes:
        for out_nr, e in enumerate(node.next):
            if e is not None:
                link(node, out_nr, e[0])


def _edges_point_forward(nodes: list[Node]) -> bool:
    for node in nodes:
        i = node.index
        for e in node.next:
            if e is not None and e[0].index <= i:
                return False
    return True


def _topo_in(order) -> None:
    for node in order:
        topo = 0
        for e in node.next:
            if e is not None and e[0].topo_nr >= topo:
                topo = e[0].topo_nr + 1
        node.topo_nr = topo


def _topo(nodes: list[Node], forward: bool) -> None:
    # Fast path: files usually list consumers before producers (edges point forward
    # in the list); then one reverse pass gives the topological numbers and proves
    # the graph acyclic.
    if forward:
        _topo_in(reversed(nodes))
        return
    # General case: an iterative post-order DFS; state 1 = on the stack, 2 = done.
    state = [0] * len(nodes)
    for start in nodes:
        if state[start.index]:
            continue
        state[start.index] = 1
        stack = [(start, iter(start.next))]
        while stack:
            node, it = stack[-1]
            for e in it:
                if e is None:
                    continue
                child = e[0]
                st = state[child.index]
                if st == 0:
                    state[child.index] = 1
                    stack.append((child, iter(child.next)))
                    break
                if st == 1:
                    path = [n for n, _ in stack]
                    raise ValueError(path[path.index(child):] + [child])
            else:
                stack.pop()
                topo = 0
                for e in node.next:
                    if e is not None and e[0].topo_nr >= topo:
                        topo = e[0].topo_nr + 1
                node.topo_nr = topo
                state[node.index] = 2
