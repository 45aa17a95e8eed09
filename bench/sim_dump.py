"""Dump what simulations produce, to check that a change to the simulator keeps every result bit-identical.

``python -m bench.sim_dump OUT.json [--quick]`` simulates a fixed set of graphs (the shipped examples,
generator outputs, a deep reentrant chain that needs pool threads, a graph with measured costs) under
several policies, device counts, placements, specs and scales, and writes per case: the executed order,
the wall and engine times, every node slice (thread, start, end, queue, push time), kernels, stream
events, syncs, idles, skips, graph-task spans, queue samples (with ``detail``), cost sources, the slack
figures and the summary as ``--json`` prints it. ``SIM_DUMP_EXTRA=FOLDER`` adds the graph files of a folder (the zoo's models, captured once).
``python -m bench.sim_dump --compare A.json B.json``
lists the cases that differ. GraphTask ids are renumbered per case (they come from a process-wide
counter, so they depend on what ran before in the same process).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

#: The fixed inputs (a measured-costs trace made once by a real run) live here between runs.
WORK = os.environ.get("SIM_DUMP_DIR", "/tmp/sim_dump")
#: A folder of more graph files (e.g. the zoo's models captured from PyTorch), each simulated a few ways.
EXTRA = os.environ.get("SIM_DUMP_EXTRA")


def _deep_checkpoints(depth: int) -> dict:
    """A chain of ``depth`` nested reentrant checkpoints (past the engine's depth limit: pool threads)."""
    nodes = [{"id": "sum", "name": "SumBackward0", "seq": 1000, "next": [["ck0", 0]], "inputs": [{"shape": []}],
              "saved": {"self_sym_sizes": [3]}}]
    variables = [{"name": "x", "shape": [3]}]
    for k in range(depth):
        inner = f"ck{k + 1}" if k + 1 < depth else "exp"
        nodes.append({"id": f"ck{k}", "name": "CheckpointFunctionBackward", "op": "checkpoint", "seq": 900 - k,
                      "next": [[f"acc{k}", 0]], "inputs": [{"shape": [3]}],
                      "attrs": {"inner": {"roots": [[inner, 0]], "inputs": [f"v{k + 1}"]}}})
        nodes.append({"id": f"acc{k}", "name": "AccumulateGrad", "variable": "x" if k == 0 else f"v{k}",
                      "inputs": [{"shape": [3]}]})
        variables.append({"name": f"v{k + 1}", "shape": [3]})
    nodes.append({"id": "exp", "name": "ExpBackward0", "seq": 10, "next": [[f"acc{depth}", 0]],
                  "inputs": [{"shape": [3]}], "saved": {"result": {"data": [1.0, 2.0, 3.0]}}})
    nodes.append({"id": f"acc{depth}", "name": "AccumulateGrad", "variable": f"v{depth}", "inputs": [{"shape": [3]}]})
    return {"format": "autograd-graph/1", "roots": [{"node": "sum"}], "variables": variables, "nodes": nodes}


def _cost_modes() -> dict:
    """Cost nodes of every mode on the CPU and three devices: a spin on the CPU fanning out to four branches (the
    CPU, cuda:0..2), each a chain of waits, sleeps, spins and matmuls of different lengths (with the host's cores
    modelled: sleeps off the cores, busy tails to their deadline, spins to theirs)."""
    modes = [("wait", 40), ("sleep", 25), ("spin", 15), ("wait", 3), ("matmul", None), ("sleep", 60), ("spin", 2)]
    devices = ["cpu", "cuda:0", "cuda:1", "cuda:2"]
    nodes = [{"id": "root", "name": "Spin", "op": "cost", "seq": 1000, "inputs": [{"shape": [1]}],
              "next": [[f"b{d}_0", 0] for d in range(len(devices))], "attrs": {"cost": {"us": 5, "mode": "spin"}}}]
    variables = []
    for d, dev in enumerate(devices):
        for i in range(len(modes)):
            mode, us = modes[(i + d) % len(modes)]
            cost = {"mode": mode, "flops": 2e9} if us is None else {"mode": mode, "us": us * (1 + d)}
            last = i + 1 == len(modes)
            nodes.append({"id": f"b{d}_{i}", "name": mode.title(), "op": "cost", "seq": 900 - 10 * d - i,
                          "inputs": [{"shape": [1], "device": dev}], "attrs": {"cost": cost},
                          "next": [[f"acc{d}", 0] if last else [f"b{d}_{i + 1}", 0]]})
        nodes.append({"id": f"acc{d}", "name": "AccumulateGrad", "variable": f"x{d}",
                      "inputs": [{"shape": [1], "device": dev}]})
        variables.append({"name": f"x{d}", "shape": [1], "device": dev})
    return {"format": "autograd-graph/1", "roots": [{"node": "root", "grad": "ones"}], "variables": variables,
            "nodes": nodes}


def _with_cores(name: str, cores: int):
    """A shipped spec whose host has ``cores`` cores (the engine's threads then compete for them)."""
    import dataclasses
    from autograd_run.sim.specs import load_spec
    spec = load_spec(name)
    return dataclasses.replace(spec, host=dataclasses.replace(spec.host, cores=cores))


def graphs(quick: bool = False) -> dict:
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import load_graph, loads_graph
    out = {f"example:{n}": load_graph(f"example:{n}")
           for n in ("checkpoint", "failing", "mlp", "pipeline", "reentrant", "seed")}
    gens = {
        "chain": ("chain", {"n": 300}), "chain-add": ("chain", {"n": 200, "op": "add"}),
        "fanout": ("fanout", {"width": 24}), "mlp": ("mlp", {"layers": 3}),
        "transformer": ("transformer", {"layers": 2}), "transformer-d2": ("transformer", {"layers": 2, "devices": 2}),
        "transformer-d3": ("transformer", {"layers": 3, "devices": 3}),
        "random1": ("random", {"nodes": 300, "leaves": 50, "seed": 1}),
        "random2": ("random", {"nodes": 150, "leaves": 20, "seed": 2}),
    }
    for name, (kind, kw) in gens.items():
        out[name] = loads_graph(dumps(generate(kind, **kw), "json"), f"{name}.json")
    out["deep-checkpoints"] = loads_graph(dumps(_deep_checkpoints(64), "json"), "deep.json")
    out["cost-modes"] = loads_graph(dumps(_cost_modes(), "json"), "cost-modes.json")
    return out


def _measured_trace(g) -> str:
    """A trace of a real run of ``g`` (made once, then reused: its timings are the fixed input)."""
    path = os.path.join(WORK, "mlp_trace.json")
    if not os.path.exists(path):
        from autograd_run.session import RunOptions, run_session
        os.makedirs(WORK, exist_ok=True)
        run_session(g, RunOptions(trace_path=path, multithreading=False))
    return path


def cases(quick: bool = False):
    """(name, graph, SimOptions kwargs) of every case."""
    from autograd_run.sim.policies import POLICIES
    from autograd_run.sim.placement import PLACEMENTS
    gs = graphs(quick)
    for name, g in gs.items():
        for policy in POLICIES:
            yield f"{name}|{policy}", g, {"policy": policy, "spec": "h100"}
        yield f"{name}|cpu-spec", g, {"spec": "cpu", "detail": True}
        yield f"{name}|detail", g, {"spec": "h100", "detail": True, "slack_top": 8}
        yield f"{name}|scale", g, {"spec": "a100", "scale": "cuda:0=1.5,cpu=0.5", "scale_must_apply": False}
        for k in (1, 2, 3):
            for placement in PLACEMENTS:
                if placement == "keep" and k > 1:
                    continue
                yield f"{name}|d{k}-{placement}", g, {"spec": "h100", "devices": k, "placement": placement}
        yield f"{name}|d2-fifo-detail", g, {"spec": "h100", "devices": 2, "placement": "round-robin",
                                            "policy": "fifo", "detail": True}
        yield f"{name}|d2-cp", g, {"spec": "l4", "devices": 2, "placement": "layer", "policy": "critical-path"}
    if EXTRA:
        from autograd_run.graphs.load import load_graph
        for fname in sorted(os.listdir(EXTRA)):
            if not fname.endswith((".json", ".yaml")):
                continue
            g = load_graph(os.path.join(EXTRA, fname))
            yield f"{fname}|pytorch", g, {"spec": "h100", "detail": True}
            yield f"{fname}|cpu-single-thread", g, {"spec": "cpu", "policy": "single-thread"}
            yield f"{fname}|critical-path", g, {"spec": "a100", "policy": "critical-path"}
            yield f"{fname}|d2-greedy", g, {"spec": "h100", "devices": 2, "placement": "greedy"}
            yield f"{fname}|d3-layer-fifo", g, {"spec": "l4", "devices": 3, "placement": "layer", "policy": "fifo"}
    for name in ("cost-modes", "transformer-d3", "random1", "example:pipeline", "deep-checkpoints"):
        for cores in (1, 2, 3):  # the host's cores modelled: threads wait for a free one
            yield f"{name}|cores{cores}", gs[name], {"spec": _with_cores("h100", cores)}
            yield f"{name}|cores{cores}-d3", gs[name], {"spec": _with_cores("l4", cores), "devices": 3,
                                                        "placement": "round-robin", "detail": cores == 2}
    mlp = gs["example:mlp"]
    trace = _measured_trace(mlp)
    yield "example:mlp|measured", mlp, {"spec": "cpu", "costs": trace}
    yield "example:mlp|measured-d2", mlp, {"spec": "h100", "costs": trace, "devices": 2, "placement": "greedy"}


def _renumber(rec) -> dict:
    ids = sorted({g.gt for g in rec.graph_tasks})
    return {gid: k for k, gid in enumerate(ids)}


def dump_case(g, kw: dict) -> dict:
    from autograd_run.cli.render import samples_json
    from autograd_run.sim.session import SimOptions, simulate_session
    kw = dict(kw)
    kw.setdefault("slack_top", 5)
    r = simulate_session(g, SimOptions(**kw))
    rec = r.recording
    gid = _renumber(rec)

    def nid(node):
        return None if node is None else node.id
    return {
        "wall_ns": r.wall_ns, "engine_done_ns": r.engine_done_ns, "cost_sources": r.cost_sources,
        "order": [{**row, "graph_task": gid[row["graph_task"]]} for row in r.order],
        "slack": [s.__dict__ for s in r.slack],
        "start_end": [rec.start, rec.end],
        "threads": [(t.tid, t.name, t.kind, t.label) for t in rec.threads.values()],
        "slices": [(gid[s.gt], s.depth, nid(s.node), s.tid, s.start, s.end,
                    None if s.wait is None else (s.wait.queue, s.wait.pushed, s.wait.popped, s.wait.tid))
                   for s in rec.slices],
        "kernels": [(k.stream, nid(k.node), k.start, k.end) for k in rec.kernels],
        "syncs": [(s.ts, s.tid, gid.get(s.gt), nid(s.producer), nid(s.consumer), s.src, s.dst)
                  for s in rec.syncs],
        "stream_events": [(e.ts, e.tid, gid.get(e.gt), e.action, nid(e.node), e.stream, e.event)
                          for e in rec.stream_events],
        "idles": [(i.start, i.end, i.tid, i.queue, gid.get(i.waiting_for)) for i in rec.idles],
        "skips": [(s.ts, s.tid, gid.get(s.gt), nid(s.node)) for s in rec.skips],
        "graph_tasks": [(gid[t.gt], t.depth, t.start, t.end, t.tid, t.error) for t in rec.graph_tasks],
        "queue_samples": [(q.ts, q.tid, q.queue, gid.get(q.gt), nid(q.node), q.depth, q.pushed)
                          for q in rec.queue_samples],
        "summary": _renumber_runs(r.summary.to_dict(), gid),
        "samples": samples_json(rec),
    }


def outcome(g, kw: dict) -> dict:
    """``dump_case`` as JSON data, or the error it raised (an error is a result too: it must stay the same)."""
    try:
        d = dump_case(g, kw)
    except Exception as exc:
        d = {"error": f"{type(exc).__name__}: {exc}"}
    return json.loads(json.dumps(d, default=_default))


def _renumber_runs(summary: dict, gid: dict) -> dict:
    """The summary with its runs' GraphTask ids renumbered as the case's records are."""
    for key in ("critical_path", "slowest"):
        for run in summary.get(key) or []:
            if isinstance(run, dict) and "graph_task" in run:
                run["graph_task"] = gid.get(run["graph_task"], run["graph_task"])
    return summary


def _default(o):
    if hasattr(o, "id") and hasattr(o, "name"):
        return o.id
    return str(o)


def main(argv) -> None:
    if argv and argv[0] == "--compare":
        a, b = (json.load(open(p)) for p in argv[1:3])
        bad = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
        for k in bad:
            fields = [f for f in (a.get(k) or {}) if (a.get(k) or {}).get(f) != (b.get(k) or {}).get(f)]
            print(f"DIFFERENT {k}: {', '.join(fields)}")
        print(f"{len(a)} cases vs {len(b)}: {len(bad)} differ")
        sys.exit(1 if bad else 0)
    out_path = argv[0]
    quick = "--quick" in argv
    out = {name: outcome(g, kw) for name, g, kw in cases(quick)}
    with open(out_path, "w") as f:
        json.dump(out, f, sort_keys=True)
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    errors = sum(1 for v in out.values() if "error" in v)
    print(f"{len(out)} cases ({errors} errors) -> {out_path} sha256 {digest}")


if __name__ == "__main__":
    main(sys.argv[1:])
