"""A PyTorch profile of a process's first backward call: what its node spans hold beyond a later call's.

A user who profiles the first backward their process runs (build the model,
one forward, ``with profile(): loss.backward()``) gets spans 1.3-2.5x a later
call's on this machine (``python -m bench profiles``). Set against the same
nodes profiled in a later call of the same process (torchvision, timm and
transformers models, 2026-12-07), the excess has two parts:

* **New memory touched for the first time.** Each gradient a node makes in
  new memory is written into pages the process never touched: a minor page
  fault and a zeroed page each 4 KiB. Later calls reuse what the allocator
  kept. A resnet18's excess was 20.2 ms with 50 MB of new gradients; the
  excess per byte, fitted over its nodes, was 0.40 ns (correlation 0.92),
  and touching a fresh buffer here costs 0.35-0.42 ns a byte.
* **A kind of node met for the first time.** The first node of each kind (its
  op, its inputs' and outputs' shapes and its saved values:
  ``sim.signature``) sets up what later nodes of that kind find ready: a
  convolution's oneDNN primitives (40-270 µs a convolution here, its repeats
  in the same call about nothing), the dispatcher's and the kernels' first
  calls (a few µs for the small ops).

The model, measured by ``calibrate --torch`` in fresh processes
(``capture.first_call_probe``) and kept in the spec's engine figures:

  ``first_call_ns_per_byte``  the time to touch a fresh byte: buffers of
                       ``PROBE_BYTES``, larger than glibc's largest dynamic
                       mmap threshold (32 MiB on 64-bit), so each is mapped
                       afresh, filled once and again, the difference per byte
                       (with the process's intra-op threads, as its ops run).
  ``first_call_setup_us``   what a node met first takes beyond its later
                       span and its new memory, measured on
                       ``calibrate_torch._blocks``' networks (a transformer
                       encoder, a convolution block, an MLP), each in fresh
                       processes, first call against a later one, medians:
                       ``call`` the call's first node (the engine's and the
                       profiler's first steps land in it); ``op`` per op name,
                       the first node of that op in the call (a library's own
                       set-up: oneDNN's, 1.6 ms at the first convolution
                       here); ``kind`` per op name, a later first node of its
                       kind (a convolution's primitives for new shapes, 0.35
                       ms here). ``*`` in each: the median over the ops
                       measured, for ops the blocks do not have.

``corrections(graph, spec)`` gives each node what to take out of its span:
the bytes of its new gradients times the first figure (a gradient above 32
MiB excepted: it is mapped afresh in every call, so a later call pays it
too), plus its set-up where it is the first of its kind in the call's order.
A node keeps at least ``FLOOR`` of its span. Only a graph whose nodes all run
on the CPU is corrected (a GPU's first call sets up other things: not
measured here).
"""

from __future__ import annotations

from autograd_run.analysis.memory import nbytes
from autograd_run.sim.signature import signature

#: A corrected span keeps at least this share of what was measured.
FLOOR = 0.1
#: glibc's largest dynamic mmap threshold on 64-bit Linux (``DEFAULT_MMAP_THRESHOLD_MAX``): a block above it is
#: mapped on its own in every call, so its pages are new in later calls too.
MMAP_MAX = 32 << 20
#: The view kinds whose output is new memory (``ops.spec.VIEW_KINDS``: the rest are views of the gradient).
NEW_MEMORY = ("", "t-new")


def new_bytes(node) -> int:
    """Bytes of the gradients ``node`` makes in new memory, each at most ``MMAP_MAX`` (see the module
    docstring): one per next edge, its consumer's input slot's size, unless the op declares that output a view
    of its incoming gradient (``OpSpec.views``) and it is one: ``analysis.memory``'s rule without the layouts
    (an expanded view or a part never allocates; the gradient itself or a view of all of it does when its size
    is not the incoming gradient's: a ``sum_to``, a cast)."""
    kinds = node.op.views
    if kinds and not isinstance(kinds, str):
        kinds = kinds(node)
    src = nbytes(node.inputs[0].shape, node.inputs[0].dtype) if node.inputs else -1
    total = 0
    for i, e in enumerate(node.next):
        if e is None or e.input_nr >= len(e.node.inputs):
            continue
        kind = kinds if isinstance(kinds, str) else (kinds[i] if i < len(kinds) else "")
        meta = e.node.inputs[e.input_nr]
        size = nbytes(meta.shape, meta.dtype)
        new = kind in NEW_MEMORY or (kind not in ("expand", "part") and size != src)
        if new and size <= MMAP_MAX:
            total += size
    return total


def _kind(node) -> tuple:
    sig = signature(node)
    return (node.name, id(node)) if sig is None else sig


def run_order(graph) -> list:
    """The graph's nodes in the order PyTorch's engine runs them on one worker (``sim.order``)."""
    from autograd_run.sim.order import predicted_order
    return [n for per in predicted_order(graph) for n in per]


def applies(graph, spec) -> bool:
    """Whether ``spec`` has first-call figures and ``graph`` runs on the CPU alone."""
    e = spec.engine
    return bool(e.first_call_ns_per_byte or e.first_call_setup_us) and graph.max_device_index < 0


def corrections(graph, spec) -> dict[str, float]:
    """Node id -> ns to take out of a first call's span (see the module docstring)."""
    e = spec.engine
    per_byte = e.first_call_ns_per_byte
    setup = e.first_call_setup_us or {}
    ops, kinds = setup.get("op", {}), setup.get("kind", {})
    seen_ops: set = set()
    seen: set = set()
    out = {}
    for k, node in enumerate(run_order(graph)):
        ns = per_byte * new_bytes(node)
        kind = _kind(node)
        if k == 0:
            ns += setup.get("call", 0.0) * 1e3
        elif node.name not in seen_ops:
            ns += ops.get(node.name, ops.get("*", 0.0)) * 1e3
        elif kind not in seen:
            ns += kinds.get(node.name, kinds.get("*", 0.0)) * 1e3
        seen_ops.add(node.name)
        seen.add(kind)
        if ns > 0:
            out[node.id] = ns
    return out


def corrected(cpu_ns: float, take: float) -> float:
    """A first call's span with ``take`` ns taken out, keeping ``FLOOR`` of it."""
    return max(cpu_ns * FLOOR, cpu_ns - take)


class FirstCall:
    """What ``CostResolver`` takes out of a first call's measured spans: ``take`` (``corrections``), applied
    with ``corrected``, and what it took so far (each node's cost is resolved once)."""

    def __init__(self, take: dict[str, float]):
        self.take = take
        self.taken_ns = 0.0

    def apply(self, node_id: str, cpu_ns: float) -> float:
        t = self.take.get(node_id)
        if not t:
            return cpu_ns
        left = corrected(cpu_ns, t)
        self.taken_ns += cpu_ns - left
        return left
