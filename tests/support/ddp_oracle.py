"""Real DistributedDataParallel on gloo as an oracle, always in a child process with a deadline.

Why a child: torch.distributed keeps C++ threads and objects (the store, gloo's device and work threads, the
Reducer) whose teardown can block in C++ where no Python signal reaches it. Seen here: a pytest process that
built and destroyed process groups in-process hung, now and then, in a garbage collection that ran a
Reducer's destructor (pytest-timeout's signal could not interrupt it; CI stalled past its limit). A child that
is killed at a deadline turns any such hang into one failed test with the child's stack on stderr.

The child needs no network: the group's store is an in-memory ``HashStore`` (one rank) and gloo is told to use
the loopback interface (``GLOO_SOCKET_IFNAME=lo``), so no host name is looked up.

As a module: ``python -m tests.support.ddp_oracle CASES_JSON`` prints one JSON object per case (one line).
From Python: ``ddp_facts(cases, timeout=...)``.

Several ranks: ``run_ranks_many(cases, world, out_dir)`` starts ``world`` processes (``python -m
tests.support.ddp_oracle --rank R ...``) joined by a ``FileStore`` in ``out_dir``; gloo's own connections are
on the loopback interface, on ports the kernel picks. For each (model, bucket cap) case in turn, each rank
profiles its first iteration (the initial buckets) and its third (the rebuilt ones) with ``record_shapes``
(``rank{R}-{model}-{cap}-first.json``, ``...-steady.json``), then times ``timed`` backward calls after a
barrier each (``backward_ns``; ``tail_ns``: from the end of the compute, a final callback queued ahead of
DDP's, to the call's return: the exposed communication; ``compute_ns``: the same backward under
``no_sync()``); with ``timed``, also a ``schedule`` profile (one warm-up step, ``SCHEDULE_ACTIVE`` recorded:
``...-schedule.json``) before the timed calls. ``run_ranks(name, cap, world, out_dir)``: one case. ``launches(trace)`` reads
a trace back: the all-reduces in the order the rank launched them, each with its element count and how many
AccumulateGrad nodes had started when it was launched (DDP's hook runs inside the AccumulateGrad node whose
gradient completes a bucket, so the k-th AccumulateGrad launched it; after all of them: the final callback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class OracleFailed(RuntimeError):
    """The child failed or missed its deadline; the message holds its output."""


def _nn():
    import torch
    return torch, torch.nn


def build_model(name: str):
    """(model, input shape, find_unused_parameters) for one of MODELS, with seeded weights."""
    torch, nn = _nn()
    torch.manual_seed(0)

    class Shared(nn.Module):
        """Two layers sharing one weight (DDP sees it once)."""

        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)
            self.b.weight = self.a.weight
            self.out = nn.Linear(64, 8)

        def forward(self, x):
            return self.out(torch.tanh(self.b(torch.relu(self.a(x)))))

    class Unused(nn.Module):
        """A head that the loss never reaches (find_unused_parameters=True)."""

        def __init__(self):
            super().__init__()
            self.body, self.unused, self.head = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 4)

        def forward(self, x):
            return self.head(torch.relu(self.body(x)))

    class Mixed(nn.Module):
        """A float64 block between float32 layers."""

        def __init__(self):
            super().__init__()
            self.a, self.mid, self.b = nn.Linear(32, 64), nn.Linear(64, 64).double(), nn.Linear(64, 8)

        def forward(self, x):
            return self.b(self.mid(torch.relu(self.a(x)).double()).float())

    if name == "mlp":
        return nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]), (4, 256), False
    if name == "resnet":
        return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                             nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)), (2, 3, 16, 16), False
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested tensors off without a mask
            return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (2, 6, 64), False
    if name == "unused":
        return Unused(), (4, 64), True
    if name == "shared":
        return Shared(), (4, 64), False
    if name == "mixed":
        return Mixed(), (4, 32), False
    raise KeyError(name)


MODELS = ("mlp", "resnet", "transformer", "unused", "shared", "mixed")


def build(name: str):
    """(model, run, find_unused_parameters): ``run(module)`` is one forward to the loss on a fixed input (the
    module may be the DDP wrapper). ``name``: one of MODELS, or ``zoo:NAME`` for an external model of
    ``tests/zoo/external.py`` (torchvision, timm, transformers; random weights)."""
    if name.startswith("zoo:"):
        tests = str(ROOT / "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        from zoo import external
        model, run = external.parts(name[4:])
        return model, run, False
    torch, _ = _nn()
    model, shape, find_unused = build_model(name)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    return model, (lambda m: m(x).square().mean()), find_unused


def _ints(text) -> list[int]:
    return [int(v) for v in str(text).replace(",", " ").split()] if text not in (None, "") else []


def _one(name: str, cap) -> dict:
    """DDP's own figures for one model and bucket cap: initial bucket sizes, the gradient-ready order and the
    rebuilt buckets after three iterations (the rebuild happens at the second forward; the third logs it)."""
    import datetime
    import gc
    torch, nn = _nn()
    dist = torch.distributed
    model, shape, find_unused = build_model(name)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        kw = {} if cap is None else {"bucket_cap_mb": cap}
        ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused, **kw)
        initial = _ints(ddp._get_ddp_logging_data()["bucket_sizes"])
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            ddp(x).square().mean().backward()
        d = ddp._get_ddp_logging_data()
        out = {"name": name, "cap": cap, "initial": initial,
               "ready": _ints(d.get("prev_iteration_grad_ready_order_indices")),
               "rebuilt": [_ints(b) for b in str(d.get("rebuilt_per_bucket_param_indices", "")).split(",")
                           if b.strip()],
               "rebuilt_sizes": _ints(d.get("rebuilt_bucket_sizes")),
               "has_rebuilt": bool(d.get("has_rebuilt_buckets"))}
        del ddp, d
        gc.collect()  # the Reducer goes while its process group still exists
        return out
    finally:
        dist.destroy_process_group()


def ddp_facts(cases: list[tuple[str, float | None]], timeout: float = 240) -> dict:
    """{(name, cap): facts} from one child process; OracleFailed (with the child's output) on failure or at
    the deadline (the child dumps its threads' stacks shortly before it)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    arg = json.dumps({"cases": [[n, c] for n, c in cases], "dump_after": max(1.0, timeout - 10)})
    try:
        p = subprocess.run([sys.executable, "-m", "tests.support.ddp_oracle", arg], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or ""
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        raise OracleFailed(f"DDP oracle missed its {timeout:.0f} s deadline; its stderr:\n{err[-6000:]}") from None
    if p.returncode != 0:
        raise OracleFailed(f"DDP oracle exited {p.returncode}; its stderr:\n{p.stderr[-6000:]}")
    facts = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            facts[(d["name"], d["cap"])] = d
    return facts


#: The steps a time benchmark's schedule profile records (after one warm-up step).
SCHEDULE_ACTIVE = 3


def _one_case(rank: int, out: str, case: dict) -> dict:
    import time
    from tests.support.compute_end import mark_compute_end
    torch, nn = _nn()
    dist = torch.distributed
    from torch.profiler import ProfilerActivity, profile
    model, run, find_unused = build(case["name"])
    cap = case.get("cap")
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=find_unused,
                                              **({} if cap is None else {"bucket_cap_mb": cap}))
    paths = {}
    for it in range(3):
        loss = run(ddp)
        if it == 1:
            loss.backward()
            continue
        kind = "first" if it == 0 else "steady"
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss.backward()
        paths[kind] = os.path.join(out, f"rank{rank}-{case['name']}-{cap}-{kind}.json")
        prof.export_chrome_trace(paths[kind])
    if case.get("timed", 0):  # a time benchmark: also a profile over several steps, as users often make one
        paths["schedule"] = os.path.join(out, f"rank{rank}-{case['name']}-{cap}-schedule.json")
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=torch.profiler.schedule(wait=0, warmup=1, active=SCHEDULE_ACTIVE),
                     on_trace_ready=lambda p: p.export_chrome_trace(paths["schedule"])) as prof:
            for _ in range(1 + SCHEDULE_ACTIVE):
                run(ddp).backward()
                prof.step()
    times, compute, tails = [], [], []
    marks = []
    for _ in range(case.get("timed", 0)):  # in turns: with DDP's communication, and without (no_sync)
        loss = run(ddp)
        hook = mark_compute_end(loss, marks)
        dist.barrier()
        marks.clear()
        t = time.perf_counter_ns()
        loss.backward()
        end = time.perf_counter_ns()
        hook.remove()
        times.append(end - t)
        if len(marks) == 1:
            tails.append(end - marks[0])
        with ddp.no_sync():
            loss = run(ddp)
            dist.barrier()
            t = time.perf_counter_ns()
            loss.backward()
            compute.append(time.perf_counter_ns() - t)
    sizes = _ints(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes"))
    del ddp
    return {"rank": rank, "traces": paths, "backward_ns": times, "compute_ns": compute, "tail_ns": tails,
            "rebuilt_sizes": sizes}


def _rank_main(rank: int, world: int, store: str, out: str, cases: list[dict],
               collective_timeout: float = 60) -> dict:
    """One rank of one group that runs each case in turn (a case that raises is reported and the rest go on;
    one that hangs a collective fails them all at the group's timeout or the deadline)."""
    import datetime
    import gc
    import traceback
    torch, _ = _nn()
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=collective_timeout))
    done = []
    try:
        for case in cases:
            try:
                done.append(_one_case(rank, out, case))
            except Exception:  # noqa: BLE001
                done.append({"rank": rank, "error": traceback.format_exc()})
            gc.collect()  # the last case's Reducer goes before the next model is wrapped
            dist.barrier()
        return {"rank": rank, "cases": done}
    finally:
        dist.destroy_process_group()


def run_ranks_many(cases: list[tuple[str, float | None]], world: int, out_dir: str, *, timed: int = 0,
                   timeout: float = 240) -> list[list[dict] | str]:
    """Each (model, bucket_cap_mb) case under DDP in turn, on one group of ``world`` local gloo processes (see
    the module docstring: each process spends seconds importing torch, more than a small case): per case, every
    rank's report by rank, or the first failing rank's traceback as a string. OracleFailed (with the ranks'
    stderr) if a process fails or the deadline passes (all killed)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    store = os.path.join(out_dir, "store")
    spec = json.dumps({"cases": [{"name": n, "cap": c, "timed": timed} for n, c in cases],
                       "dump_after": max(1.0, timeout - 10)})
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    argvs = [[sys.executable, "-m", "tests.support.ddp_oracle", "--rank", str(r), str(world), store, out_dir, spec]
             for r in range(world)]
    try:
        results = run_local_ranks(argvs, env, timeout, cwd=ROOT)
    except RanksTimedOut as exc:
        raise OracleFailed(f"{world} DDP ranks missed their {timeout:.0f} s deadline; rank 0's stderr:\n"
                           f"{exc.stderr[0][-4000:]}") from None
    bad = [(r, code, err) for r, (code, _, err) in enumerate(results) if code != 0]
    if bad:
        r, rc, err = bad[0]
        raise OracleFailed(f"DDP rank {r} of {world} exited {rc}; its stderr:\n{err[-4000:]}")
    reports = [json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["cases"]
               for _, out, _ in results]
    per_case = []
    for k in range(len(cases)):
        ranks = [rep[k] for rep in reports]
        failed = next((r for r in ranks if "error" in r), None)
        per_case.append(failed["error"] if failed else ranks)
    return per_case


def run_ranks(name: str, cap, world: int, out_dir: str, *, timed: int = 0, timeout: float = 240) -> list[dict]:
    """Run one model under DDP on ``world`` local gloo processes (see the module docstring); every rank's
    report, by rank. OracleFailed (with the ranks' stderr) if any fails or the deadline passes (all killed)."""
    got = run_ranks_many([(name, cap)], world, out_dir, timed=timed, timeout=timeout)[0]
    if isinstance(got, str):
        raise OracleFailed(f"DDP ranks of {name} raised:\n{got[-4000:]}")
    return got


def launches(trace_path: str) -> list[tuple[int, int]]:
    """[(elements all-reduced, AccumulateGrad nodes started before the launch)] in launch order, from one rank's trace
    (the thread that ran the backward: the one with the AccumulateGrad nodes)."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    acc = [e for e in events if e.get("name") == "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"]
    if not acc:
        return []
    tid = acc[0]["tid"]
    starts = sorted(e["ts"] for e in acc if e["tid"] == tid)
    out = []
    for e in sorted((e for e in events if e.get("name") == "c10d::allreduce_" and e["tid"] == tid),
                    key=lambda e: e["ts"]):
        numel = e.get("args", {})["Input Dims"][0][0][0]  # a list of one flat tensor: the bucket
        out.append((numel, sum(1 for t in starts if t <= e["ts"])))
    return out


def main(argv: list[str]) -> int:
    import faulthandler
    if argv and argv[0] == "--rank":
        rank, world, store, out, spec = int(argv[1]), int(argv[2]), argv[3], argv[4], json.loads(argv[5])
        faulthandler.dump_traceback_later(spec.get("dump_after", 230), exit=True)
        warnings.simplefilter("ignore")
        result = _rank_main(rank, world, store, out, spec["cases"], spec.get("collective_timeout", 60))
        sys.stdout.flush()
        print(json.dumps(result), flush=True)
        return 0
    spec = json.loads(argv[0])
    faulthandler.dump_traceback_later(spec.get("dump_after", 230), exit=True)
    warnings.simplefilter("ignore")
    for name, cap in spec["cases"]:
        print(json.dumps(_one(name, cap)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
