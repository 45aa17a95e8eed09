"""Simulated GPU backward passes for the Kineto trace tests (``test_kineto``, ``test_hta``): an MLP's graph with
kernels large enough that microsecond rounding does not matter, on one device, on two, or on one device with
every other layer on a second stream (cross-stream waits)."""

from __future__ import annotations

import json

from autograd_run.graphs import generators
from autograd_run.graphs.load import loads_graph
from autograd_run.sim.session import SimOptions, simulate_session


def mlp_graph(layers: int = 4, width: int = 1024, batch: int = 512, streams: bool = False):
    """The generator's MLP; with ``streams`` every node on cuda:0, layer by layer on streams 0 and 1."""
    doc = generators.mlp(layers=layers, width=width, batch=batch)
    if streams:
        for i, n in enumerate(doc["nodes"]):
            for m in n.get("inputs", []):
                m["device"], m["stream"] = "cuda:0", (i // 4) % 2
        variables = doc["variables"].values() if isinstance(doc["variables"], dict) else doc["variables"]
        for v in variables:
            v["device"] = "cuda:0"
    return loads_graph(json.dumps(doc), source="mlp.json")


def simulated(graph, devices: int | None = None, placement: str = "layer", policy: str = "pytorch", **kw):
    """A ``SimReport`` on the h100 spec: ``devices`` remaps the graph onto that many GPUs."""
    opts = SimOptions(spec="h100", devices=devices, placement=placement if devices else "keep", policy=policy,
                      detail=True, **kw)
    return simulate_session(graph, opts)
