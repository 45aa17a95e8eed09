"""The picture in docs/hta.md: a simulated what-if (DDP's bucket size) taken through Holistic Trace Analysis.

    .venv/bin/python docs/hta_figure.py      # writes docs/hta-whatif.png

Simulates a 6-layer MLP's backward on an H100 with DDP over 8 ranks on NVLink for two bucket sizes, writes each
as a folder of rank traces, loads each folder with HTA's ``TraceAnalysis`` and draws HTA's own figures
(communication/computation overlap and temporal breakdown, rank 0) beside ours from the same run (the
streams table's overlap), with matplotlib (HTA draws with plotly, which needs a browser or kaleido to save).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from hta.trace_analysis import TraceAnalysis

    from autograd_run.graphs import generators
    cases = {}
    with tempfile.TemporaryDirectory() as d:
        graph = os.path.join(d, "mlp.json")
        with open(graph, "w") as f:
            json.dump(generators.mlp(layers=6, width=2048, batch=1024), f)
        for cap in ("1", "25"):
            out = os.path.join(d, f"cap{cap}") + "/"
            r = subprocess.run([sys.executable, "-m", "autograd_run.cli.main", "simulate", graph, "--devices", "1",
                                "--spec", "h100", "--ddp", f"bucket_cap_mb={cap}", "--world", "8", "--network",
                                "nvlink-h100", "--trace", out, "--trace-ranks", "2", "--json"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, check=True)
            ours = json.loads(r.stdout)
            t = TraceAnalysis(trace_dir=out)
            overlap = t.get_comm_comp_overlap(visualize=False)
            tb = t.get_temporal_breakdown(visualize=False)
            cases[cap] = {"hta_overlap": float(overlap["comp_comm_overlap_pctg"][0]),
                          "ours_overlap": 100 * ours["streams"]["overlap"],
                          "ddp_exposed_us": ours["ddp"]["exposed_ns"] / 1e3,
                          "compute": float(tb["compute_time(us)"][0]), "idle": float(tb["idle_time(us)"][0]),
                          "non_compute": float(tb["non_compute_time(us)"][0])}
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    labels = [f"bucket_cap_mb={c}" for c in cases]
    x = range(len(cases))
    a.bar([i - 0.2 for i in x], [c["hta_overlap"] for c in cases.values()], 0.4, label="HTA get_comm_comp_overlap")
    a.bar([i + 0.2 for i in x], [c["ours_overlap"] for c in cases.values()], 0.4, label="autograd-run (streams)")
    a.set_xticks(list(x), labels)
    a.set_ylabel("communication under compute (%)")
    a.set_ylim(0, 100)
    a.legend(fontsize=8, loc="lower right")
    a.set_title("rank 0: comm/comp overlap", fontsize=10)
    bottom = [0.0] * len(cases)
    for key, colour in (("compute", "#4c72b0"), ("non_compute", "#dd8452"), ("idle", "#c44e52")):
        vals = [c[key] / 1e3 for c in cases.values()]
        b.bar(list(x), vals, 0.5, bottom=bottom, label=key.replace("_", "-"), color=colour)
        bottom = [u + v for u, v in zip(bottom, vals)]
    b.set_xticks(list(x), labels)
    b.set_ylabel("ms (HTA get_temporal_breakdown)")
    b.legend(fontsize=8)
    b.set_title("rank 0: GPU time by kind", fontsize=10)
    fig.suptitle("A simulated what-if through Holistic Trace Analysis: DDP's bucket size, 8 ranks, H100 + NVLink",
                 fontsize=10)
    fig.tight_layout()
    path = os.path.join(HERE, "hta-whatif.png")
    fig.savefig(path, dpi=110)
    print(json.dumps(cases, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
