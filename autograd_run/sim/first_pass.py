"""A fresh process's first backward pass: what it costs beyond a later one, measured and predicted.

A user's first ``autograd-run run G`` pass in a new process is slower than its
later passes by a few hundred µs on this machine (``python -m bench
accuracy``'s cold figures): the interpreter runs each Python code path of the
engine unspecialised the first times it meets it, and each worker thread's
stack and caches are touched for the first time. The device threads are
started before the clock (``session._run_passes``), so their start is not
part of it. The extra does not grow with the graph: it is the code paths
met, not the nodes run (over the held-out graphs, 27 to 70 nodes, it lay at
100-350 µs, more when accelerator devices took part).

The model is one figure per case, measured by ``calibrate``:

* ``first_pass_us``: a graph whose nodes all run on the CPU;
* ``first_pass_device_us``: a graph with nodes on accelerator devices.

Each is the median, over ``PROCESSES`` fresh processes running the user's
own command (``autograd-run run PROBE --repeat 1+WARM``), of the first
pass's wall minus the median of the later ones, on a probe graph shaped like
the held-out ones (``probe_doc``): 40 cost nodes with the held-out range of
costs, sleeping and spinning, a leaf each, in blocks over the devices with
``ToCopyBackward0`` where a gradient changes device, and a second edge from
each node to the one two after it, so that most nodes sum two gradients (the
held-out graphs' fan-ins: a path a chain never takes, which runs cold too). The machine adds
single first passes far slower than that (a 2-core VM: up to 4 ms), which the
median leaves out and no model predicts.

A simulation's first-pass wall is its wall plus the figure for its case
(``extra_ns``); a spec with both figures 0 does not model it, and the
result says so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

#: Fresh processes per probe (each about 0.2 s here) and later passes in each.
PROCESSES = 7
WARM = 5
#: The probe's nodes, the block length, and the stated costs (µs) its nodes take in turn.
PROBE_NODES = 40
PROBE_BLOCK = 10
PROBE_COSTS_US = (20, 300, 60, 150)


def probe_doc(devices: list[str], skips: bool = True) -> dict:
    """A chain of ``PROBE_NODES`` cost nodes in blocks of ``PROBE_BLOCK`` over ``devices`` in turn (a copy node
    where the device changes), each node with a leaf of its own; every seventh spins (holds the GIL). With
    ``skips``, each node's gradient also goes to the node two after it on the same device, so that most nodes sum
    two gradients in their InputBuffer, as the held-out graphs' fan-ins do (that path runs cold in a first pass
    too: without it the probe's figures were 0.5-0.6 of the held-out graphs' medians)."""
    where = [devices[(i // PROBE_BLOCK) % len(devices)] for i in range(PROBE_NODES)]
    nodes, variables = [], []
    for i, dev in enumerate(where):
        if i + 1 == PROBE_NODES:
            nxt = ["acc", 0]
        elif where[i + 1] != dev:
            nxt = [f"copy{i}", 0]
            nodes.append({"id": f"copy{i}", "name": "ToCopyBackward0", "seq": 2 * (PROBE_NODES - i) - 1,
                          "next": [[f"n{i + 1}", 0]], "inputs": [{"shape": [1], "device": dev}]})
        else:
            nxt = [f"n{i + 1}", 0]
        mode = "spin" if i % 7 == 3 else "wait"
        skip = ([[f"n{i + 2}", 0]] if skips and i + 2 < PROBE_NODES and where[i + 2] == dev and where[i + 1] == dev
                else [])
        nodes.append({"id": f"n{i}", "name": "Wait", "op": "cost", "seq": 2 * (PROBE_NODES - i),
                      "next": [nxt, [f"acc{i}", 0], *skip], "inputs": [{"shape": [1], "device": dev}],
                      "attrs": {"cost": {"us": PROBE_COSTS_US[i % len(PROBE_COSTS_US)], "mode": mode}}})
        nodes.append({"id": f"acc{i}", "name": "AccumulateGrad", "variable": f"x{i}",
                      "inputs": [{"shape": [1], "device": dev}]})
        variables.append({"name": f"x{i}", "shape": [1], "device": dev})
    nodes.append({"id": "acc", "name": "AccumulateGrad", "variable": "x", "inputs": [{"shape": [1], "device": where[-1]}]})
    variables.append({"name": "x", "shape": [1], "device": where[-1]})
    return {"format": "autograd-graph/1", "roots": [{"node": "n0", "grad": "ones"}], "variables": variables,
            "nodes": nodes}


def _child_env() -> dict:
    """This process's environment, with the folder this package was imported from first on the path (the
    child runs this very autograd-run, installed or not)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def first_pass_extras(doc: dict, processes: int = PROCESSES, warm: int = WARM) -> list[float]:
    """Each fresh process's first pass over ``doc`` minus the median of its ``warm`` later passes, µs, sorted.
    Raises ``RuntimeError`` (with the child's last words) when a child fails."""
    out = []
    with tempfile.TemporaryDirectory(prefix="agr-first-pass-") as d:
        path = os.path.join(d, "probe.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        for _ in range(processes):
            p = subprocess.run([sys.executable, "-m", "autograd_run", "run", path, "--json", "--no-summary",
                                "--repeat", str(1 + warm)], capture_output=True, text=True, timeout=120,
                               env=_child_env(), cwd=d)
            if p.returncode != 0:
                raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
            walls = json.loads(p.stdout)["samples"]["wall_ns"]
            out.append((walls[0] - statistics.median(walls[1:])) / 1e3)
    return sorted(out)


def measure(processes: int = PROCESSES) -> dict[str, float]:
    """``{"first_pass_us": ..., "first_pass_device_us": ...}``: the medians (never below 0) of the probes' extras on
    the CPU alone and over the CPU and two devices."""
    cpu = first_pass_extras(probe_doc(["cpu"]), processes)
    dev = first_pass_extras(probe_doc(["cpu", "cuda:0", "cuda:1"]), processes)
    return {"first_pass_us": max(0.0, statistics.median(cpu)), "first_pass_device_us": max(0.0, statistics.median(dev))}


def extra_ns(engine, on_devices: bool) -> int | None:
    """What a fresh process's first pass adds on ``engine`` (an ``EngineSpec``), ns, for a graph with nodes on
    accelerator devices or not; None where the spec does not model it (both figures 0)."""
    if not engine.first_pass_us and not engine.first_pass_device_us:
        return None
    return int(round((engine.first_pass_device_us if on_devices else engine.first_pass_us) * 1e3))
