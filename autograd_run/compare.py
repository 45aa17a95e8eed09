"""Two configurations of one graph, measured side by side: ``measure_pair(graph, a, b) -> (Profile, Profile)``.

Each side is a ``RunOptions`` (a real run) or a ``SimOptions`` (a
simulation). Real runs alternate pass by pass, each pass a session of its
own after ``warmup`` discarded passes per side, so a machine that slows
down or speeds up during the comparison (other jobs, a frequency change)
weighs on both sides alike instead of passing for a difference. Within
each round the two sides go in a random order (a fixed seed: the same plan
every time), so nothing periodic (a collector every other pass, a cache
warmed by the previous pass) can line up with one side; the garbage
collector runs before each pass, as ``timeit`` keeps it out of the timing.
A simulation is deterministic and runs once. Each side loads
the graph afresh (a ``--seed`` on one side must not reach the other).

``diff GRAPH --a ... --b ...`` calls this; ``analysis.diff.compare`` compares
the two profiles.
"""

from __future__ import annotations

import gc
import random
from dataclasses import replace
from typing import Callable

from autograd_run.errors import BackwardError, RequestError
from autograd_run.graphs.load import load_graph
from autograd_run.session import RunOptions, run_session
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.analysis.profile import Profile, concat, from_recording


class SideFailed(BackwardError):
    """A side's backward pass raised; ``side`` says which (``a`` or ``b``)."""

    def __init__(self, side: str, exc: BackwardError):
        super().__init__(str(exc), exc.node_id, exc.node_name)
        self.side = side


def _label(options) -> str:
    return "simulation" if isinstance(options, SimOptions) else "run"


def measure_pair(graph: str, a: RunOptions | SimOptions, b: RunOptions | SimOptions, warmup: int = 1,
                 labels: tuple[str, str] = ("A", "B"),
                 progress: Callable[[str, int, int], None] | None = None) -> tuple[Profile, Profile]:
    """Profiles of configurations ``a`` and ``b`` of ``graph`` (a path or ``example:NAME``).

    A run side makes ``options.repeat`` measured passes; ``RequestError``s carry the side
    (``a``/``b``) in front of their message; a failing pass raises ``SideFailed``.
    """
    sides = {"a": a, "b": b}
    graphs = {k: load_graph(graph) for k in sides}
    parts: dict[str, list[Profile]] = {"a": [], "b": []}
    plan: list[tuple[str, bool]] = []
    for k, o in sides.items():
        if isinstance(o, SimOptions):
            plan.append((k, True))
    runs = {k: o for k, o in sides.items() if isinstance(o, RunOptions)}
    for _ in range(warmup):
        plan += [(k, False) for k in runs]
    coin = random.Random(0)
    for i in range(max((o.repeat for o in runs.values()), default=0)):
        round_ = [(k, True) for k, o in runs.items() if i < o.repeat]
        coin.shuffle(round_)
        plan += round_
    done = 0
    for k, measured in plan:
        o = sides[k]
        label = labels[0] if k == "a" else labels[1]
        try:
            if isinstance(o, SimOptions):
                r = simulate_session(graphs[k], o)
                parts[k].append(from_recording(r.recording, label, "simulation", r.order))
            else:
                gc.collect()
                first = measured and not parts[k]
                r = run_session(graphs[k], replace(o, repeat=1, profile=True, record_order=True, order_ready=first,
                                                   trace_path=None, order_out=None, expected_order=None))
                if r.error is not None:
                    raise SideFailed(k, r.error)
                if measured:
                    parts[k].append(from_recording(r.recording, label, "run", r.order))
        except RequestError as exc:
            raise RequestError(str(exc), f"{k}:{exc.option}") from None
        done += 1
        if progress is not None:
            progress(k, done, len(plan))
    return concat(parts["a"], labels[0]), concat(parts["b"], labels[1])
