"""GPU part of (h): capture --profile on CUDA, kernels joined to their nodes, simulated against PyTorch's backward.

Run on a machine with an NVIDIA GPU and a CUDA build of PyTorch
(``bench/gpu_check.sh`` calls it): each model of ``profcosts_bench`` on
``cuda:0`` is captured and profiled (CPU and CUDA activity: each node's
evaluate_function span on its device thread and its kernels per stream),
simulated with those costs (CPU part on the device thread, kernels on the
stream) on the ``local-torch`` spec measured here, and compared with the
measured backward wall time (synchronized). Prints one line per model, the
mean absolute percentage error, and PASS when every kernel launched inside
a backward node was attributed and the error is at most 10%; exit 0 on
PASS, 1 on FAIL, 2 when there is no CUDA PyTorch (SKIP).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_profcosts")
    ap.add_argument("--keep", metavar="DIR", help="keep each captured graph file (with its measured costs) and its last profiled step's PyTorch trace here")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 2
    if not torch.cuda.is_available():
        print(f"SKIP: torch {torch.__version__} sees no CUDA device")
        return 2
    from autograd_run.capture import from_torch
    from autograd_run.capture.profile import profile_capture
    from autograd_run.graphs.load import load_graph
    from autograd_run.sim.calibrate_torch import calibrate_torch
    from autograd_run.sim.session import SimOptions, simulate_session
    from bench.profcosts_bench import models

    spec = calibrate_torch()
    if args.keep:
        import json
        os.makedirs(args.keep, exist_ok=True)
        with open(os.path.join(args.keep, "spec.json"), "w") as f:
            json.dump(spec.to_dict(), f, indent=1)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, fwd in models(torch, "cuda").items():
            path = os.path.join(tmp, name.replace(" ", "_") + ".json")
            loss, names = fwd()
            doc = from_torch(loss, names=names, path=path, reference=False)
            keep = os.path.join(args.keep, os.path.basename(path)[:-5] + ".torch.json") if args.keep else None
            if keep:
                os.makedirs(args.keep, exist_ok=True)
            m = profile_capture(path, doc, lambda: (fwd()[0], None, None), steps=15, warmup=3, keep_trace=keep)
            g = load_graph(path)
            r = simulate_session(g, SimOptions(spec=spec, slack_top=0))
            wall = m["backward_wall_ns"]["median"]
            err = (r.wall_ns - wall) / wall
            cov = m["coverage"]
            gpu_nodes = sum(1 for v in m["nodes"].values() if v.get("gpu_ns"))
            rows.append(abs(err))
            if args.keep:
                shutil.copy(path, args.keep)
            print(f"{name:<16} {len(g.nodes):5d} nodes, {cov['matched']} matched, {gpu_nodes} with kernels "
                  f"({cov['gpu_attributed']}/{cov['gpu_activities']} GPU activities attributed); PyTorch "
                  f"{wall / 1e3:.1f} us, simulated {r.wall_ns / 1e3:.1f} us ({len(r.recording.kernels)} kernels on "
                  f"streams): {err:+.1%}", flush=True)
            cuda_nodes = sum(1 for n in g.nodes if not n.cpu)
            cpu_meas = sum(c.cpu_ns for c in r.measured.nodes.values()) if r.measured else 0
            gpu_meas = sum(c.gpu_total for c in r.measured.nodes.values()) if r.measured else 0
            print(f"  {cuda_nodes} nodes on a GPU; cost sources {r.cost_sources}; measured CPU {cpu_meas / 1e3:.1f} us, "
                  f"kernels {gpu_meas / 1e3:.1f} us; engine done at {r.engine_done_ns / 1e3:.1f} us", flush=True)
            ok = ok and cov["matched"] == len(g.nodes) and gpu_nodes > 0 and len(r.recording.kernels) > 0
    mape = statistics.mean(rows)
    print(f"MAPE {mape:.1%} on {torch.cuda.get_device_name(0)}")
    ok = ok and mape <= 0.10
    print("PASS: GPU profiled costs" if ok else "FAIL: GPU profiled costs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
