"""``autograd-run calibrate``: measure this machine for the simulation's ``local`` spec.

What it measures (medians of repeated runs, each a few hundred ms):

* the engine's fixed cost per node: a chain of ``identity`` nodes on one
  thread, its wall time per node minus what the identity function itself
  costs (timed on its own);
* the hand-off latency: chains of short cost nodes alternating between two
  workers, so every node is a hand-off to the other thread: the caller and a
  virtual device (``handoff_us``), and two virtual devices
  (``device_handoff_us``); per node, minus what the same nodes cost on one
  worker. Measured with cost nodes, not the compiled ``identity`` fast
  path: a woken worker whose nodes run the engine's Python path also waits
  for the GIL the waker still holds, and between two device threads more so
  (here: identity hops 19-20 µs caller-device and 24-28 device-device;
  cost-node hops 26-27 and 31-36, which the held-out graphs' hand-offs are);
* what a node that waits without the GIL (a cost node, ``wait``) costs
  beyond its stated time on a device worker: a chain of such nodes, per
  node, minus the stated time and the fixed cost (the thread's wake-up
  after its sleep, and what running cold costs after it);
* the GIL's hand-over (``gil_handoff_us``): a probe of four device threads
  running short wait nodes at once (each node's engine work takes the GIL),
  measured; the figure is the one with which the simulation of the probe
  lasts as long (bisection over the finished spec);
* a backward call's own cost (``call_overhead_us``): what its recorded span
  holds beyond its one node (the caller's set-up before the node and its
  completion after it), on a one-node chain on the CPU;
* a fresh process's first pass beyond a later one, on the CPU and with
  devices (``sim.first_pass``: child processes running ``autograd-run run``);
* the host: float32 and float64 matmul FLOP/s, memory bandwidth (a large
  copy), the smallest numpy call, and the cores this process may run on
  (``os.sched_getaffinity``): the engine's threads share them, and a
  ``wait`` node busy-waits its last ``waits.SPIN_TAIL`` on one
  (``wait_spin_us``), so with more busy threads than cores the simulation
  queues them for a core as the machine does.

The engine's per-node work is Python, so it holds the GIL
(``overhead_holds_gil``). Virtual devices are this CPU: the accelerator part
of the spec repeats the host's figures with no launch cost.

The engine figures are measured in rounds (each round: every chain above,
each the median of ``repeat`` passes) until they settle: from the
third round on, the median over all rounds so far must have moved by less
than ``SETTLE`` (relative, or ``SETTLE_US`` absolute) when the last round
came in; at most ``MAX_ROUNDS``. The spec keeps the medians, and
``EngineSpec.spread`` says how far the rounds' values lay apart (the range
over the median, per figure): on a shared or virtual machine the wake-up
and hand-off latencies drift by tens of percent within minutes, and a
simulation of a graph that waits a lot inherits that spread.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np

from autograd_run.engine.threads import usable_cpus
from autograd_run.engine.waits import SPIN_TAIL
from autograd_run.errors import RequestError
from autograd_run.sim import first_pass
from autograd_run.sim.specs import DeviceSpec, EngineSpec, MachineSpec, local_spec_path


#: The stated time of each node of the wait chain, µs (it sleeps, then spins its last ``SPIN_TAIL``).
WAIT_US = 300
#: The stated time of each node of the short wait chains, µs: shorter than ``SPIN_TAIL``, they only spin.
SHORT_WAIT_US = 20
#: Rounds end when the medians move by less than this (relative) or ``SETTLE_US`` (absolute), or after
#: ``MAX_ROUNDS``; at least ``MIN_ROUNDS``.
SETTLE = 0.03
SETTLE_US = 0.5
MIN_ROUNDS = 3
MAX_ROUNDS = 8


def _chain_doc(n: int, devices: list[str], wait_us: float | None = None, leaves: bool = False) -> dict:
    """A chain of ``identity`` nodes, or of cost nodes that wait ``wait_us``, round-robin over ``devices``;
    with ``leaves``, each node also feeds an AccumulateGrad node of its own."""
    nodes, variables = [], []
    for i in range(n):
        dev = devices[i % len(devices)]
        nxt = [[f"n{i + 1}", 0]] if i + 1 < n else [["acc", 0]]
        if leaves:
            nxt.append([f"acc{i}", 0])
            variables.append({"name": f"x{i}", "shape": [1], "device": dev})
            nodes.append({"id": f"acc{i}", "name": "AccumulateGrad", "variable": f"x{i}",
                          "inputs": [{"shape": [1], "device": dev}]})
        node = {"id": f"n{i}", "name": "Identity", "op": "identity", "seq": n - i, "next": nxt,
                "inputs": [{"shape": [1], "device": dev}]}
        if wait_us is not None:
            node.update(name="Wait", op="cost", attrs={"cost": {"us": wait_us, "mode": "wait"}})
        nodes.append(node)
    nodes.append({"id": "acc", "name": "AccumulateGrad", "variable": "x",
                  "inputs": [{"shape": [1], "device": devices[(n) % len(devices)]}]})
    return {"format": "autograd-graph/1", "roots": [{"node": "n0", "grad": "ones"}],
            "variables": [{"name": "x", "shape": [1], "device": devices[n % len(devices)]}, *variables],
            "nodes": nodes}


#: The GIL probe: this many branches, one per virtual device, each a chain of ``GIL_PROBE_NODES`` short wait nodes.
GIL_PROBE_BRANCHES = 4
GIL_PROBE_NODES = 40


def _gil_probe_doc() -> dict:
    """A root on the CPU fanning out to ``GIL_PROBE_BRANCHES`` chains of short ``wait`` nodes, one chain per
    virtual device, each ending in a leaf: the device threads run at once and take turns on the GIL for each
    node's engine work (what the held-out graphs on several devices do)."""
    # the root's one input is on the CPU: a copy takes each branch's gradient to its device
    nodes = [{"id": "root", "name": "Identity", "op": "identity", "seq": 10 ** 6,
              "next": [[f"copy{b}", 0] for b in range(GIL_PROBE_BRANCHES)], "inputs": [{"shape": [1]}]}]
    variables = []
    for b in range(GIL_PROBE_BRANCHES):
        dev = f"cuda:{b}"
        nodes.append({"id": f"copy{b}", "name": "ToCopyBackward0", "seq": 10 ** 6 - 1 - b, "next": [[f"b{b}_0", 0]],
                      "inputs": [{"shape": [1]}]})
        for i in range(GIL_PROBE_NODES):
            nxt = f"b{b}_{i + 1}" if i + 1 < GIL_PROBE_NODES else f"acc{b}"
            nodes.append({"id": f"b{b}_{i}", "name": "Wait", "op": "cost", "seq": 10 ** 5 * (b + 1) - i,
                          "next": [[nxt, 0]], "inputs": [{"shape": [1], "device": dev}],
                          "attrs": {"cost": {"us": SHORT_WAIT_US, "mode": "wait"}}})
        nodes.append({"id": f"acc{b}", "name": "AccumulateGrad", "variable": f"x{b}",
                      "inputs": [{"shape": [1], "device": dev}]})
        variables.append({"name": f"x{b}", "shape": [1], "device": dev})
    return {"format": "autograd-graph/1", "roots": [{"node": "root", "grad": "ones"}], "variables": variables,
            "nodes": nodes}


def _fit_gil_handoff(spec: MachineSpec, wall_us: float) -> float:
    """The GIL hand-over (µs) with which the simulation of the GIL probe lasts ``wall_us`` (bisection: the
    simulated wall grows with it), within 0 and four times the queue hand-off."""
    import dataclasses
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.sim.session import SimOptions, simulate_session
    g = loads_graph(dumps(_gil_probe_doc(), "json"), "calibrate.json")

    def wall(h: float) -> float:
        s = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, gil_handoff_us=max(h, 1e-3)))
        return simulate_session(g, SimOptions(spec=s, slack_top=0)).wall_ns / 1e3
    lo, hi = 0.0, 4 * max(spec.engine.handoff_us, 1.0)
    if wall(lo) >= wall_us:
        return lo
    if wall(hi) <= wall_us:
        return hi
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if wall(mid) < wall_us else (lo, mid)
    return (lo + hi) / 2


def _per_node_us(doc: dict, repeat: int) -> float:
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import root_gradients
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    g = loads_graph(dumps(doc, "json"), "calibrate.json")
    eng = Engine(DeviceSet("virtual"))
    roots = [r.edge for r in g.roots]
    times = []
    try:
        eng.execute(GraphState(g), roots, root_gradients(g))  # warm: threads started
        for _ in range(repeat):
            state, grads = GraphState(g), root_gradients(g)
            t = time.perf_counter()
            eng.execute(state, roots, grads)
            times.append(time.perf_counter() - t)
    finally:
        eng.shutdown()
    return statistics.median(times) / len(g.nodes) * 1e6


def _call_us(repeat: int) -> float:
    """What a backward call's recorded span holds beyond its nodes, µs: from its start to its first node and from
    its last node to its end, on the caller (a one-node chain of a short cost node on the CPU), the median of
    ``repeat`` calls (at least 9). A ``run``'s wall is that span, and the simulation charges this once per call
    (``call_overhead_us``, on the caller before its root is pushed)."""
    from autograd_run.engine import DeviceSet, Engine, GraphState
    from autograd_run.engine.run import root_gradients
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    from autograd_run.record.recorder import Recorder
    g = loads_graph(dumps(_chain_doc(1, ["cpu"], SHORT_WAIT_US), "json"), "calibrate.json")
    roots = [r.edge for r in g.roots]
    gaps = []
    recorder = Recorder()
    eng = Engine(DeviceSet("virtual"), tracer=recorder)
    try:
        for k in range(max(9, repeat) + 1):
            eng.execute(GraphState(g), roots, root_gradients(g))
            rec = recorder.drain()  # this call's records only
            if k == 0 or not rec.graph_tasks or not rec.slices:  # (the first: warm-up)
                continue
            span = rec.graph_tasks[-1]
            first = min(sl.start for sl in rec.slices if sl.gt == span.gt)
            last = max(sl.end for sl in rec.slices if sl.gt == span.gt)
            gaps.append((first - span.start) + (span.end - last))
    finally:
        eng.shutdown()
    return statistics.median(gaps) / 1e3 if gaps else 0.0


def _identity_us() -> float:
    from autograd_run.engine.builtin_nodes import identity

    class N:
        next = [None]
    n, g = N(), [np.ones(1, dtype=np.float32)]
    reps = 20000
    t = time.perf_counter()
    for _ in range(reps):
        identity(n, g, None)
    return (time.perf_counter() - t) / reps * 1e6


def _matmul_flops(dtype) -> float:
    n = 512
    a = np.ones((n, n), dtype=dtype)
    a @ a
    times = []
    for _ in range(5):
        t = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times)


def _bandwidth() -> float:
    a = np.ones(16 << 20, dtype=np.float32)  # 64 MiB
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return 2 * a.nbytes / statistics.median(times)  # read + write


def _min_call_us() -> float:
    a = np.ones(1, dtype=np.float32)
    reps = 20000
    t = time.perf_counter()
    for _ in range(reps):
        a * a
    return (time.perf_counter() - t) / reps * 1e6


def _engine_round(nodes: int, repeat: int) -> dict[str, float]:
    """One round of the engine figures (µs): per-node overhead on the caller and on a device's thread, a
    cost node's extra, hand-off latency, a sleeping wait's lateness."""
    ident = _identity_us()
    single = _per_node_us(_chain_doc(nodes, ["cpu"]), repeat)
    overhead = max(0.1, single - ident)
    device = max(0.1, _per_node_us(_chain_doc(nodes // 2, ["cuda:0"]), repeat) - ident)
    # cost nodes that only spin (no sleep): what a cost node costs beyond its stated time and the fixed cost
    one = {dev: _per_node_us(_chain_doc(nodes // 4, [dev], SHORT_WAIT_US), repeat) for dev in ("cpu", "cuda:0")}
    cost_node = max(0.0, statistics.mean([one["cpu"] - SHORT_WAIT_US - overhead,
                                          one["cuda:0"] - SHORT_WAIT_US - device]))
    # an AccumulateGrad leaf per node of a device's chain: per leaf, what it adds (its routing and its run)
    dev_chain = (device + ident) * (nodes // 4)
    with_leaves = _per_node_us(_chain_doc(nodes // 4, ["cuda:0"], leaves=True), repeat) * (nodes // 2 + 1)
    accumulate = max(0.0, with_leaves - dev_chain) / (nodes // 4) - device
    # the same short cost nodes alternating between two workers: every node a hand-off (module docstring)
    hops = [_per_node_us(_chain_doc(max(200, nodes // 10), pair, SHORT_WAIT_US), repeat) - alone
            for pair, alone in ((["cpu", "cuda:0"], (one["cpu"] + one["cuda:0"]) / 2),
                                (["cuda:0", "cuda:1"], one["cuda:0"]))]
    waited = _per_node_us(_chain_doc(max(50, nodes // 40), ["cuda:0"], WAIT_US), repeat)
    probe = _gil_probe_doc()
    gil_probe = _per_node_us(probe, repeat) * len(probe["nodes"])  # the probe's wall, µs
    return {"call_overhead_us": _call_us(repeat), "gil_probe_us": gil_probe, "node_overhead_us": overhead,
            "device_overhead_us": device, "cost_node_us": cost_node, "accumulate_us": max(0.0, accumulate),
            "handoff_us": max(0.0, hops[0]), "device_handoff_us": max(0.0, hops[1]),
            "wait_overhead_us": max(0.0, waited - WAIT_US - device - cost_node)}


def settled(rounds: list[dict[str, float]]) -> bool:
    """Whether the per-figure medians over ``rounds`` moved by less than the tolerance with the last one."""
    if len(rounds) < MIN_ROUNDS:
        return False
    for key in rounds[0]:
        now = statistics.median(r[key] for r in rounds)
        before = statistics.median(r[key] for r in rounds[:-1])
        if abs(now - before) > max(SETTLE * abs(before), SETTLE_US):
            return False
    return True


def engine_figures(nodes: int = 4000, repeat: int = 5, log=None) -> tuple[dict, dict, int]:
    """The engine figures measured in rounds until they settle (module docstring): their medians, their
    spread (range over median, per figure) and the number of rounds."""
    rounds: list[dict[str, float]] = []
    while len(rounds) < MAX_ROUNDS:
        rounds.append(_engine_round(nodes, repeat))
        if log is not None:
            log(f"round {len(rounds)}: " + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1].items()))
        if settled(rounds):
            break
    else:
        if log is not None:
            log(f"warning: the figures did not settle in {MAX_ROUNDS} rounds (this machine's latencies are "
                "drifting, e.g. other work is running): the spec keeps their medians, and simulated times "
                "carry that uncertainty; calibrate again when the machine is quieter")
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    spread = {k: (max(r[k] for r in rounds) - min(r[k] for r in rounds)) / med[k] if med[k] else 0.0
              for k in rounds[0]}
    return med, spread, len(rounds)


def calibrate(nodes: int = 4000, repeat: int = 5, log=None) -> MachineSpec:
    """Measure this machine (module docstring); ``log(line)`` gets each round's figures."""
    med, spread, rounds = engine_figures(nodes, repeat, log)
    host = DeviceSpec("this machine's CPU (numpy)",
                      peak_flops={"float32": _matmul_flops(np.float32), "float64": _matmul_flops(np.float64)},
                      mem_bw=_bandwidth(), flops_efficiency=0.9, bw_efficiency=0.9, min_kernel_us=_min_call_us(),
                      cores=usable_cpus())
    acc = DeviceSpec("virtual device (this machine's CPU)", dict(host.peak_flops), host.mem_bw, 0.9, 0.9,
                     host.min_kernel_us)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    engine = EngineSpec(round(med["node_overhead_us"], 3), round(med["handoff_us"], 3), True,
                        device_overhead_us=round(med["device_overhead_us"], 3),
                        cost_node_us=round(med["cost_node_us"], 3), accumulate_us=round(med["accumulate_us"], 3),
                        wait_overhead_us=round(med["wait_overhead_us"], 3), wait_spin_us=SPIN_TAIL * 1e6,
                        device_handoff_us=round(med["device_handoff_us"], 3),
                        call_overhead_us=round(med["call_overhead_us"], 3),
                        spread={("gil_handoff_us" if k == "gil_probe_us" else k): round(v, 3)
                                for k, v in spread.items()})
    spec = MachineSpec("local", host, acc, engine,
                       f"measured by autograd-run calibrate on {platform.node()} ({os.cpu_count()} CPUs) at {when}, "
                       f"{rounds} rounds")
    # the GIL hand-over: fitted so that the simulation of the probe lasts what it was measured to (its own
    # figure: a GIL taken over is one wake-up where a queue's hand-off is a wake-up and then the GIL)
    engine.gil_handoff_us = round(max(_fit_gil_handoff(spec, med["gil_probe_us"]), 1e-3), 3)
    # a fresh process's first pass (sim.first_pass): measured in child processes, as a user's run starts
    try:
        for key, value in first_pass.measure().items():
            setattr(engine, key, round(value, 3))
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        if log is not None:
            log(f"warning: a fresh process's first pass was not measured ({exc}): simulations will not predict it")
    return spec


def cache_folder_ready(path: str) -> None:
    """Make the user cache folder that ``path`` goes in, and refuse it (``RequestError``) when it cannot be
    made or written: calibrate calls this before it measures, not after."""
    from autograd_run.outputs import check_output_path
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise RequestError(f"{folder}: cannot create the folder: {exc.strerror or exc}") from None
    check_output_path(path, None, [])


def write_local(spec: MachineSpec, path: str | None = None) -> str:
    """Write ``spec`` to ``path`` (the user cache folder's ``local`` spec by default). The cache folder is
    made when missing; any other path's folder must exist (``calibrate -o`` checks it first)."""
    from autograd_run.outputs import atomic_write
    from autograd_run.sim.specs import LOCAL
    path = path or local_spec_path()
    cache = path in (local_spec_path(name) for name in LOCAL)
    if cache:
        cache_folder_ready(path)
    atomic_write(path, json.dumps(spec.to_dict(), indent=2).encode(), None if cache else "output")
    return path
