"""Real FSDP2 (``fully_shard``) on gloo as an oracle, always in child processes with a deadline.

Why children: see ``tests/support/ddp_oracle.py`` (process groups in the pytest process can hang it in C++).

``capture(name, path)``: one process, a one-rank gloo group (in-memory store), the model built and wrapped,
one forward, ``from_torch(loss, parameters=model, path=path)``: the graph file with its ``fsdp`` section.

``run_ranks(name, world, out_dir)``: ``world`` processes joined by a ``FileStore``, each running two warm-up
iterations and profiling the third backward (``rank{R}.json``); ``events(trace)`` reads one back: FSDP's own
``record_function`` spans on the thread that ran the backward, in the order they started, as (kind, unit):
``pre`` (``FSDP::pre_backward``), ``all-gather`` (``FSDP::all_gather``), ``reduce-scatter``
(``FSDP::post_backward_reduce``). The root's unit is "" (FSDP labels it without a name).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class OracleFailed(RuntimeError):
    """A child failed or missed its deadline; the message holds its output."""


MODELS = ("blocks", "transformer", "prefetch2", "keep", "nested", "conv", "frozen_input")


def build(name: str):
    """(model wrapped in fully_shard, run): ``run(model)`` is one forward to the loss on a fixed input."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    if name in ("blocks", "prefetch2", "keep", "nested", "frozen_input"):
        model = nn.Sequential(nn.Linear(32, 64), Block(64), Block(64), Block(64), nn.Linear(64, 4))
        if name == "nested":
            fully_shard(model[2].a)
        if name == "frozen_input":  # the first block's input needs no gradient: its post-backward is the final callback's
            model = nn.Sequential(Block(32), Block(32), nn.Linear(32, 4))
            for m in model[:2]:
                fully_shard(m)
        else:
            for k, m in enumerate(model[1:4], 1):
                fully_shard(m, reshard_after_forward=not (name == "keep" and k == 2))
        fully_shard(model)
        if name == "prefetch2":
            model[3].set_modules_to_backward_prefetch([model[2], model[1]])
            model[2].set_modules_to_backward_prefetch([model[1]])
        return model, (lambda m: m(x).square().mean())
    if name == "transformer":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            model = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        for m in model.layers:
            fully_shard(m)
        fully_shard(model)
        seq = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
        return model, (lambda m: m(seq).square().mean())
    if name == "conv":
        model = nn.Sequential(nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()),
                              nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()),
                              nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        for m in model[:3]:
            fully_shard(m)
        fully_shard(model)
        img = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
        return model, (lambda m: m(img).square().mean())
    raise KeyError(name)


def _env() -> dict:
    return dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _capture_main(name: str, path: str) -> dict:
    from autograd_run.capture.distributed import end_process_group, one_process_group
    from autograd_run.capture.graph import from_torch
    one_process_group()
    try:
        model, run = build(name)
        loss = run(model)
        doc = from_torch(loss, parameters=model, path=path)
        return {"name": name, "units": len(doc["fsdp"]["units"])}
    finally:
        end_process_group()


def _rank_main(rank: int, world: int, store: str, out: str, name: str, memory: bool = False) -> dict:
    import datetime
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        model, run = build(name)
        if memory:  # two warm-up iterations, then the third forward and backward under profile_memory
            sys.path.insert(0, str(ROOT / "tests" / "support"))
            from memory_oracle import SPAN, read
            from torch.profiler import record_function
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                run(model).backward()
            model.zero_grad(set_to_none=True)  # the pass starts without gradients, as the graph's leaves do
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                loss = run(model)
                with record_function(SPAN):
                    loss.backward()
                del loss
            path = os.path.join(out, f"rank{rank}-memory.json")
            prof.export_chrome_trace(path)
            return {"rank": rank, "memory": read(path)}
        for it in range(3):
            loss = run(model)
            if it < 2:
                loss.backward()
                continue
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                loss.backward()
            path = os.path.join(out, f"rank{rank}.json")
            prof.export_chrome_trace(path)
        return {"rank": rank, "trace": path}
    finally:
        dist.destroy_process_group()


def capture(name: str, path: str, timeout: float = 180) -> None:
    import subprocess
    arg = ["--capture", name, path]
    try:
        p = subprocess.run([sys.executable, "-m", "tests.support.fsdp_oracle", *arg], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise OracleFailed(f"FSDP capture missed its {timeout:.0f} s deadline: {exc.stderr!r:.4000}") from None
    if p.returncode != 0:
        raise OracleFailed(f"FSDP capture exited {p.returncode}; its stderr:\n{p.stderr[-6000:]}")


def run_ranks(name: str, world: int, out_dir: str, timeout: float = 240, memory: bool = False) -> list[dict]:
    """``world`` ranks profiling their third backward (``memory``: its live bytes instead, forward too)."""
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    store = os.path.join(out_dir, "store")
    argvs = [[sys.executable, "-m", "tests.support.fsdp_oracle", "--rank", str(r), str(world), store, out_dir,
              name, str(max(1.0, timeout - 10)), *(["--memory"] if memory else [])] for r in range(world)]
    try:
        results = run_local_ranks(argvs, _env(), timeout, cwd=ROOT)
    except RanksTimedOut as exc:
        raise OracleFailed(f"{world} FSDP ranks missed their {timeout:.0f} s deadline; rank 0's stderr:\n"
                           f"{exc.stderr[0][-4000:]}") from None
    bad = [(r, code, err) for r, (code, _, err) in enumerate(results) if code != 0]
    if bad:
        r, rc, err = bad[0]
        raise OracleFailed(f"FSDP rank {r} of {world} exited {rc}; its stderr:\n{err[-4000:]}")
    return [json.loads([line for line in out.splitlines() if line.startswith("{")][-1]) for _, out, _ in results]


_KINDS = (("FSDP::pre_backward", "pre"), ("FSDP::all_gather", "all-gather"),
          ("FSDP::post_backward_reduce", "reduce-scatter"))


def events(trace_path: str) -> list[tuple[str, str]]:
    """[(kind, unit)] in start order (see the module docstring)."""
    with open(trace_path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = []
    for e in sorted(evs, key=lambda e: e["ts"]):
        name = e.get("name", "")
        for prefix, kind in _KINDS:
            if name == prefix or name.startswith(prefix + " ("):
                unit = name[len(prefix):].strip()
                out.append((kind, unit[1:-1] if unit.startswith("(") else unit))
    return out


def main(argv: list[str]) -> int:
    import faulthandler
    warnings.simplefilter("ignore")
    if argv[0] == "--capture":
        faulthandler.dump_traceback_later(170, exit=True)
        print(json.dumps(_capture_main(argv[1], argv[2])), flush=True)
        return 0
    rank, world, store, out, name = int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5]
    faulthandler.dump_traceback_later(float(argv[6]), exit=True)
    print(json.dumps(_rank_main(rank, world, store, out, name, memory="--memory" in argv[7:])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
