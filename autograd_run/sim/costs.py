"""What each node costs in the simulation, and where that figure comes from.

Per node a ``NodeCost``: ``cpu_ns`` on the worker thread that runs it (the
node's function: a CPU node's computation, or an accelerator node's kernel
launches), ``gpu_ns`` on its stream (the kernel; 0 on the CPU), whether the
CPU part holds the GIL, and the source of the figure. Precedence, first
that applies:

1. ``attrs.cost`` of a ``cost`` node: ``us`` (or ``flops`` at the host's
   rate, or a matmul of that many FLOPs); ``spin`` holds the GIL, ``sleep``,
   ``wait`` and ``matmul`` do not; all occupy the worker thread, as they do
   in the engine.
2. Measured costs (``measured.load_costs``: ``--costs FILE`` or the graph's
   own ``meta.measured``): a PyTorch profile's evaluate_function span as
   CPU time on the node's worker (less the profiler's own time for the
   events recorded inside it, ``EngineSpec.profiler_event_us``, or
   ``profiler_event_shapes_us`` for a trace made with ``record_shapes``; a PyTorch
   node holds no GIL) and its kernel time on the node's stream; or the
   median slice of a node in autograd-run's own trace (its GIL as the
   spec's engine says).
3. The op's analytic model (``OpSpec.cost``: FLOPs and bytes from the
   node's shapes and dtypes) on the machine spec: roofline time
   ``max(flops / (peak * eff), bytes / (bw * eff))``, at least the device's
   smallest kernel time. On an accelerator that is kernel time on the stream
   and the node's CPU part is one kernel launch; copies between devices use
   the link (device to device) or host (PCIe) bandwidth plus latency.

``--scale`` multiplies the costs of the nodes of an op name or on a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autograd_run.engine import core
from autograd_run.errors import RequestError
from autograd_run.ops import COST, PYTHON
from autograd_run.ops.cost import Shapes
from autograd_run.costs.measured import MeasuredCost, MeasuredCosts
from autograd_run.sim.signature import ValuesRead, signature
from autograd_run.sim.specs import MachineSpec

#: The engine's throughput assumption for ``flops`` cost nodes (builtin_nodes.COST_FLOPS_PER_SECOND).
COST_FLOPS_PER_SECOND = 1e9


@dataclass(slots=True)
class NodeCost:
    cpu_ns: int
    gpu_ns: int = 0
    holds_gil: bool = False
    #: ``attrs``, ``measured``, ``analytic`` (or ``engine`` for the engine's own nodes).
    source: str = "analytic"
    #: Accelerator work that blocks the worker until its stream is done (a copy to the host).
    blocking: bool = False
    #: The first part of ``cpu_ns`` that the worker spends asleep, on no core (a ``wait``'s or ``sleep``'s
    #: sleep); the rest runs on a core (``DeviceSpec.cores``).
    sleep_ns: int = 0


def shapes_of(node) -> Shapes:
    """The node's cost-model view: incoming gradients, produced gradients, saved tensors of known shape."""
    inputs = [(m.shape, m.dtype) for m in node.inputs]
    outputs = []
    for e in node.next:
        if e is None:
            outputs.append(None)
        else:
            m = e.node.inputs[e.input_nr]
            outputs.append((m.shape, m.dtype))
    saved, values = {}, {}
    for k, v in (node.saved or {}).items():
        if type(v) is dict and "shape" in v:
            saved[k] = (tuple(v["shape"]), v.get("dtype", inputs[0][1] if inputs else "float32"))
        elif type(v) is not dict:
            values[k] = v
    return Shapes(inputs, outputs, saved, values)


#: The largest ``--scale`` factor: a million times slower is past any what-if, and keeps a simulated
#: time a 64-bit count of ns.
MAX_SCALE = 1e6


def parse_scale(text: str | None) -> dict[str, float]:
    """``MmBackward0=0.5,cuda:1=2.0`` -> {op name or device: factor}."""
    out: dict[str, float] = {}
    items = (text or "").split(",")
    if text and text.strip() and not any(item.strip() for item in items):  # (only commas: a slip)
        raise RequestError(f"{text!r}: expected NAME=FACTOR[,NAME=FACTOR...]", "scale")
    for item in items:
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        try:
            factor = float(val) if "_" not in val else -1.0  # (float() reads 1_000; a typo more likely)
        except ValueError:
            factor = -1.0
        if not sep or not key.strip() or not 0 <= factor <= MAX_SCALE:
            raise RequestError(f"{item!r}: expected NAME=FACTOR with a factor from 0 to {MAX_SCALE:g}", "scale")
        if key.strip() in out:
            raise RequestError(f"{key.strip()!r} is given twice", "scale")
        out[key.strip()] = factor
    return out


class CostResolver:
    """Resolves ``NodeCost`` per node (see the module docstring), memoised by node."""

    def __init__(self, spec: MachineSpec, measured: MeasuredCosts | None = None,
                 scale: dict[str, float] | None = None, first_call=None, nodes: int | None = None):
        self.spec = spec
        #: What a PyTorch profile of a process's first backward holds beyond a later call, taken out of the
        #: measured spans (a ``sim.first_call.FirstCall``: ``apply(node id, ns)``); None: nothing taken out.
        self.first_call = first_call if measured is not None and measured.from_pytorch else None
        self.measured = measured.nodes if measured is not None else {}
        self.from_pytorch = measured is not None and measured.from_pytorch
        #: The profiler's own time per event recorded inside a PyTorch node's span, ns (taken out of its cost).
        self.event_ns = measured.event_us(spec.engine) * 1e3 if self.from_pytorch else 0.0
        #: the engine's per-node time a simulated trace's spans hold (taken out of each: it is charged again)
        self.engine_ns = getattr(measured, "engine_ns", None) if measured is not None else None
        self.scale = scale or {}
        #: node -> NodeCost of each node asked for so far (``cost_sources`` counts these). For a graph of
        #: ``nodes`` nodes, every one of which a simulation asks for, a ``NodeMap`` of that size where the compiled
        #: core is built (slots by node index, not a dict's table: engine/csrc/node_map.c), else a dict.
        self.resolved = core.NodeMap(nodes) if nodes and core.NodeMap is not None else {}
        #: Costs by ``signature`` key: nodes alike cost alike (resolved once per kind of node), or
        #: ``_BY_VALUES`` where the op's cost model read the node's saved values: then by (key, values).
        self._by_signature: dict = {}
        self._by_values: dict = {}
        #: Cost nodes' costs by what they depend on (``_cost_node``).
        self._by_cost: dict = {}

    def with_cost(self, node, cost: NodeCost) -> "CostResolver":
        """This model with ``node`` costing ``cost``: the costs resolved so far are shared, not resolved again."""
        other = CostResolver.__new__(CostResolver)
        other.__dict__.update(self.__dict__)
        other.resolved = self.resolved.copy()
        other.resolved[node] = cost
        return other

    def __call__(self, node) -> NodeCost:
        c = self.resolved.get(node)
        if c is None:
            c = self.resolved[node] = self._resolve(node)
        return c

    def tables(self):
        """The tables the compiled loops read where a node's cost is known without a call (resolved
        already, ``_resolve``'s shared case, or a cost node alike to one costed before: ``_cost_node``'s memo,
        its missing-field mark and the cost op); None where they cannot (``measured`` not a plain dict)."""
        if type(self.measured) is dict:
            return (self.resolved, self._by_signature, self.measured, _BY_VALUES, self._by_cost, _ABSENT, COST)
        return None

    def many(self, nodes: list) -> list[NodeCost]:
        """``[self(n) for n in nodes]``, without a call per node where the compiled core is built."""
        if core.costs_of is not None:
            return core.costs_of(self, self.tables(), nodes)
        return [self(n) for n in nodes]

    def _resolve(self, node) -> NodeCost:
        """The node's cost: shared by the nodes of its ``signature`` (none for cost and measured nodes).

        The first node of a key is costed with its saved values watched (``ValuesRead``). A cost model is a
        pure function of what it reads: if it read no value, every node of the key costs the same whatever
        its values; if it did, nodes share a cost only with the nodes of the same key and values.
        """
        if node.op is COST:
            return self._cost_node(node)
        sig = None if node.attrs or node.id in self.measured else signature(node)
        if sig is None:
            return self._scaled(node)
        key, values = sig
        c = self._by_signature.get(key)
        if c is None:
            watch: list = []
            c = self._scaled(node, watch)
            if any(w.read for w in watch):
                self._by_signature[key] = _BY_VALUES
                self._by_values[(key, values)] = c
            else:
                self._by_signature[key] = c
        elif c is _BY_VALUES:
            c = self._by_values.get((key, values))
            if c is None:
                c = self._by_values[(key, values)] = self._scaled(node)
        return c

    def _cost_node(self, node) -> NodeCost:
        """A cost node's cost: a function of its ``attrs.cost`` fields, whether it runs on the CPU, and (for
        ``--scale``) its name and device, nothing else (``_base``, ``_scaled``); so nodes alike in those share
        it, computed once (a generated transformer's 800,000 cost nodes have a few dozen kinds). A value that
        cannot be a key (an unchecked graph's) is costed on its own."""
        spec = node.attrs.get("cost") or {}
        dev = node.device  # (its type and index: a Device's own hash is Python code, the compiled lookup's too)
        key = (spec.get("us", _ABSENT), spec.get("flops", _ABSENT), spec.get("mode"), node.cpu, node.name,
               dev.type, dev.index)
        try:
            c = self._by_cost.get(key)
        except TypeError:  # an unhashable value
            return self._scaled(node)
        if c is None:
            c = self._by_cost[key] = self._scaled(node)
        return c

    def _scaled(self, node, watch: list | None = None) -> NodeCost:
        """The node's cost, scaled by ``--scale``; ``watch``: gets the ``ValuesRead`` its cost model saw."""
        c = self._base(node, watch)
        factor = self.scale.get(node.name, 1.0) * self.scale.get(str(node.device), 1.0)
        if factor != 1.0:
            c = NodeCost(int(c.cpu_ns * factor), int(c.gpu_ns * factor), c.holds_gil, c.source, c.blocking,
                         int(c.sleep_ns * factor))
        return c

    def _base(self, node, watch: list | None = None) -> NodeCost:
        holds = self.spec.engine.overhead_holds_gil
        if node.op is COST:
            spec = node.attrs.get("cost") or {}
            mode = spec.get("mode") or ("wait" if not node.cpu else "spin")
            if "us" in spec:
                ns = float(spec["us"]) * 1e3
            elif mode == "matmul":
                ns = float(spec.get("flops", 0)) / (self.spec.host.flops_per_s("float32")
                                                  * self.spec.host.flops_efficiency) * 1e9
            else:
                ns = float(spec.get("flops", 0)) / COST_FLOPS_PER_SECOND * 1e9
            sleep = 0.0
            if mode in ("wait", "sleep") and ns > 0:
                busy = 0.0 if mode == "sleep" else min(ns, self.spec.engine.wait_spin_us * 1e3)
                if busy < ns:  # a worker that slept wakes late (calibrate measures it); a wait that only spins does not
                    ns += self.spec.engine.wait_overhead_us * 1e3
                sleep = ns - busy  # asleep first, then (a wait) busy on a core to its deadline
            return NodeCost(int(ns), 0, mode == "spin", "attrs", sleep_ns=int(sleep))
        m = self.measured.get(node.id)
        if m is not None:
            return self._measured(node, m, holds)
        if node.op.name == "AccumulateGrad" and self.spec.engine.accumulate_us:
            return NodeCost(int(self.spec.engine.accumulate_us * 1e3), 0, holds, "engine")
        if node.op is PYTHON:
            return NodeCost(int(self.spec.host.min_kernel_us * 1e3), 0, True, "analytic")
        model = node.op.cost
        if node.op.engine and model is None:
            return NodeCost(0, 0, False, "engine")
        s = shapes_of(node)
        if watch is not None:
            s.values = ValuesRead(s.values)
            watch.append(s.values)
        flops = model.flops(s) if model is not None else 0.0
        nbytes = model.bytes(s) if model is not None else 0.0
        dtype = node.inputs[0].dtype if node.inputs else "float32"
        if node.cpu:
            dev = self.spec.host
            return NodeCost(_roofline(dev, flops, nbytes, dtype), 0, False, "analytic")
        acc = self.spec.accelerator
        cpu = int(acc.launch_us * 1e3)
        gpu = _roofline(acc, flops, nbytes, dtype)
        if node.op.name == "ToCopyBackward0":
            return self._copy_cost(node, s, cpu, gpu)
        return NodeCost(cpu, gpu, False, "analytic")

    def _measured(self, node, m: MeasuredCost, holds: bool) -> NodeCost:
        cpu = m.cpu_ns
        if self.from_pytorch:  # PyTorch's C++ node: no GIL; the profiler's own time inside the span taken out
            holds = False
            cpu = max(0.0, cpu - m.nested * self.event_ns)
            if self.first_call is not None:
                cpu = self.first_call.apply(node.id, cpu)
        elif self.engine_ns is not None:  # a simulation's span: the engine's per-node time it charged taken out
            cpu = max(0.0, cpu - self.engine_ns["node" if node.cpu else "device_node"])
        if node.cpu:
            return NodeCost(int(cpu), 0, holds, "measured")
        return NodeCost(int(cpu), int(m.gpu_total), holds, "measured",
                        blocking=node.op.name == "ToCopyBackward0" and any(
                            e is not None and e.node.inputs[e.input_nr].device.type == "cpu" for e in node.next))

    def _copy_cost(self, node, s: Shapes, cpu: int, gpu: int) -> NodeCost:
        acc = self.spec.accelerator
        moved = max((Shapes.nbytes(m) for m in s.outputs if m is not None), default=0)
        targets = [e.node.inputs[e.input_nr].device for e in node.next if e is not None]
        to_host = any(d.type == "cpu" for d in targets)
        cross = any(d != node.device for d in targets)
        if not cross:
            return NodeCost(cpu, gpu, False, "analytic")
        bw, lat = (acc.host_bw, acc.host_latency_us) if to_host else (acc.link_bw or acc.host_bw, acc.link_latency_us)
        transfer = int((moved / bw * 1e9 if bw else 0) + lat * 1e3)
        return NodeCost(cpu, max(gpu, transfer), False, "analytic", blocking=to_host)


#: In ``CostResolver._by_signature``: this kind of node's cost depends on its saved values too.
_BY_VALUES = object()
#: A cost field the node does not give, in ``_cost_node``'s key.
_ABSENT = object()


def _roofline(dev, flops: float, nbytes: float, dtype: str) -> int:
    t = max(flops / (dev.flops_per_s(dtype) * dev.flops_efficiency),
            nbytes / (dev.mem_bw * dev.bw_efficiency) if dev.mem_bw else 0.0)
    return int(max(t * 1e9, dev.min_kernel_us * 1e3))
