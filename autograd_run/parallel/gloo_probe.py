"""``autograd-run calibrate --gloo``: the local gloo backend's all-reduce, measured, as an alpha-beta link.

For each world size asked for, ``world`` processes of this module (``python -m
autograd_run.parallel.gloo_probe --rank R ...``) join one gloo group (a
``FileStore`` in a temporary folder; gloo on the loopback interface, so no
host name is looked up) and time ``all_reduce`` of float32 buffers from 4 KiB
to 8 MiB: five rounds of a barrier and then ``k`` calls back to back (as
nccl-tests times them; ``k`` from a first call, so a round takes about a
fifth of the budget), the median round's time per call on every rank; the
slowest rank's is the figure (a collective ends for everyone when it ends
for the last). All of it ``repeats`` times (3), the world sizes in turns;
per size the median over the repeats; ``repeat_spread`` says how far the
repeats' own fits are apart at 1 MiB (seen here: the host moves a link by up
to 2x between runs minutes apart). Per world, weighted least
squares (relative error) of ``t(n) = a + b n`` over the sizes gives

    alpha = a / (2 (p - 1))            (us per message)
    bandwidth = 2 (p - 1) / p / b      (bytes/s, NCCL's "bus bandwidth")

the ring all-reduce's terms (``parallel.collectives``). ``channels``: gloo
runs collectives on its process group's worker threads (2), so two may be in
flight at once; two concurrent 1 MiB all-reduces are timed against one, and
unless the pair takes under 1.5x one they share the host and that world's
link says one at a time (``channels: 1``). ``during_compute``: a 1 MiB
all-reduce is also timed while a thread of each rank computes (float32
matmuls, torch kernels without the GIL, as the backward's compute is), in
turns with the same all-reduce alone; the ratio is the collective's speed
while the compute runs (0.42-0.44 on this 2-core VM, where a rule of cores
per rank said 0.5; a profiled DDP step showed its all-reduces 4-10x slower
during the backward than after it, which neither figure explains: see
docs/parallel.md). Processes on one host
share its cores, so the link is per world size: the simulation takes the
measured world's link, or the nearest measured one (said in its output).
Every child has a deadline; a hang or a failure is an error that names it.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

from autograd_run.errors import UsageError

SIZES = [4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20]
#: The size of the two concurrent all-reduces that tell whether a second collective in flight runs alongside.
PAIR_BYTES = 1 << 20
#: gloo's process group runs collectives on this many worker threads by default (ProcessGroupGloo's options).
GLOO_THREADS = 2
#: ``during_compute``'s measurement: rounds of all-reduces of ``PAIR_BYTES`` alone and while a thread computes
#: (matmuls of this side), in turns.
COMPUTE_ROUNDS = 3
COMPUTE_N = 256
#: The smallest ``during_compute`` kept (a measurement that came out slower is noise or a stalled host).
MIN_DURING_COMPUTE = 0.02


def _while_computing(torch, dist, nbytes: int, k: int, rounds: int = COMPUTE_ROUNDS) -> tuple[float, float]:
    """(alone, computing): ns per all-reduce of ``nbytes``, the median of ``rounds`` rounds of ``k`` calls each,
    alone and while a thread of this process computes (float32 matmuls in a loop: torch kernels, which run
    without the GIL as the backward's do), in turns so that both see the host at the same moments."""
    import threading
    x = torch.ones(nbytes // 4)
    a = torch.ones(COMPUTE_N, COMPUTE_N)
    alone: list[float] = []
    computing: list[float] = []
    for _ in range(rounds):
        for busy, into in ((False, alone), (True, computing)):
            stop = threading.Event()

            def compute():
                while not stop.is_set():
                    torch.mm(a, a)
            worker = threading.Thread(target=compute, daemon=True) if busy else None
            if worker is not None:
                worker.start()
            try:
                dist.barrier()
                t = time.perf_counter_ns()
                for _ in range(k):
                    dist.all_reduce(x)
                into.append((time.perf_counter_ns() - t) / k)
            finally:
                stop.set()
                if worker is not None:
                    worker.join()
    return statistics.median(alone), statistics.median(computing)


def _rank(rank: int, world: int, store: str, sizes: list[int], budget_s: float, k_pair: int = 20,
          k_compute: int = 10) -> dict:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        out = {}
        for n in sizes:
            x = torch.ones(n // 4, dtype=torch.float32)
            for _ in range(3):
                dist.all_reduce(x)
            # the number of back-to-back calls a round: agreed from rank 0's first timing
            dist.barrier()
            t = time.perf_counter_ns()
            dist.all_reduce(x)
            first = time.perf_counter_ns() - t
            calls = torch.tensor([max(3, min(200, int(budget_s / 5 * 1e9 / max(first, 1))))])
            dist.broadcast(calls, 0)
            k = int(calls.item())
            times: list[float] = []
            for _ in range(5):  # rounds: a barrier, then k calls back to back (as nccl-tests times them)
                dist.barrier()
                t = time.perf_counter_ns()
                for _ in range(k):
                    dist.all_reduce(x)
                times.append((time.perf_counter_ns() - t) / k)
            out[str(n)] = statistics.median(times)
        # Two collectives in flight at once (gloo runs them on its worker threads): per pair, against one.
        x, y = torch.ones(PAIR_BYTES // 4), torch.ones(PAIR_BYTES // 4)
        pairs: list[float] = []
        for _ in range(5):
            dist.barrier()
            t = time.perf_counter_ns()
            for _ in range(k_pair):
                a, b = dist.all_reduce(x, async_op=True), dist.all_reduce(y, async_op=True)
                a.wait()
                b.wait()
            pairs.append((time.perf_counter_ns() - t) / k_pair)
        out["pair"] = statistics.median(pairs)
        out["alone"], out["computing"] = _while_computing(torch, dist, PAIR_BYTES, k_compute)
        return out
    finally:
        dist.destroy_process_group()


def during_compute(alone_ns: float, computing_ns: float) -> float:
    """A collective's speed while its rank computes, against alone: the two times of one all-reduce measured
    in turns (``_while_computing``), as a ratio within ``MIN_DURING_COMPUTE`` and 1."""
    if computing_ns <= 0 or alone_ns <= 0:
        return 1.0
    return max(MIN_DURING_COMPUTE, min(1.0, alone_ns / computing_ns))


def _fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(a ns, b ns/byte, worst relative residual) of t = a + b n, weighted by 1/t (relative errors)."""
    sw = swx = swy = swxx = swxy = 0.0
    for n, t in points:
        w = 1.0 / (t * t)
        sw += w
        swx += w * n
        swy += w * t
        swxx += w * n * n
        swxy += w * n * t
    det = sw * swxx - swx * swx
    b = (sw * swxy - swx * swy) / det
    a = (swy - b * swx) / sw
    if b <= 0:  # flat in size (all latency): the slope is not measurable here
        a, b = statistics.median(t for _, t in points), 1e-6
    a = max(a, 0.0)
    worst = max(abs(a + b * n - t) / t for n, t in points)
    return a, b, worst


def measure(worlds=(2, 4), sizes=None, budget_s: float = 0.25, timeout: float = 300, log=None,
            repeats: int = 3) -> dict:
    """The ``network`` document: one link per world size (see the module docstring)."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        raise UsageError("calibrate --gloo needs PyTorch: pip install 'autograd-run[torch]'") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise UsageError("calibrate --gloo: this PyTorch has no gloo backend (torch.distributed)")
    sizes = list(sizes or SIZES)
    links: dict = {}
    rounds: dict[int, list[list[dict]]] = {w: [] for w in worlds}
    for r in range(repeats):  # the worlds in turns, so each one's repeats see the host at different moments
        for world in worlds:
            if log:
                log(f"gloo all-reduce on {world} local processes ({r + 1} of {repeats}) ...")
            with tempfile.TemporaryDirectory(prefix="autograd-run-gloo-") as tmp:
                rounds[world].append(_run(world, os.path.join(tmp, "store"), sizes, budget_s, timeout))
    for world in worlds:
        # per repeat, the slowest rank's median per size; then the median over the repeats
        per_repeat = [[(n, max(m[str(n)] for m in medians)) for n in sizes] for medians in rounds[world]]
        slowest = [(n, statistics.median(rep[k][1] for rep in per_repeat)) for k, n in enumerate(sizes)]
        a, b, worst = _fit(slowest)
        at_pair = [(lambda ab: ab[0] + ab[1] * PAIR_BYTES)(_fit(rep)) for rep in per_repeat]
        p = world
        one = a + b * PAIR_BYTES
        pair = statistics.median(max(m["pair"] for m in medians) for medians in rounds[world])
        # the slowest rank's, per repeat; then the median over the repeats
        alone = statistics.median(max(m["alone"] for m in medians) for medians in rounds[world])
        computing = statistics.median(max(m["computing"] for m in medians) for medians in rounds[world])
        # Two in flight that take less than 1.5x one ran alongside each other: gloo's threads are channels;
        # else they share the host (seen on a 2-core VM at 4 processes: 1.8x), one at a time the better model.
        links[str(world)] = {"alpha_us": a / 1e3 / (2 * (p - 1)), "gbps": 2 * (p - 1) / p / b,
                             "channels": GLOO_THREADS if pair / one < 1.5 else 1,
                             "during_compute": during_compute(alone, computing),
                             "fit_worst": worst, "pair_over_one": pair / one,
                             "repeat_spread": max(at_pair) / min(at_pair) - 1 if min(at_pair) > 0 else 0.0,
                             "points": [{"bytes": n, "us": t / 1e3} for n, t in slowest]}
    import platform
    import torch
    return {"name": "local-gloo", "backend": "gloo", "links": links,
            "source": f"calibrate --gloo on {platform.node() or 'this host'} ({os.cpu_count()} CPUs, "
                      f"torch {torch.__version__}), {datetime.date.today().isoformat()}",
            "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _run(world: int, store: str, sizes: list[int], budget_s: float, timeout: float) -> list[dict]:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    arg = json.dumps({"sizes": sizes, "budget_s": budget_s})
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    argvs = [[sys.executable, "-m", "autograd_run.parallel.gloo_probe", "--rank", str(r), str(world), store, arg]
             for r in range(world)]
    try:
        results = run_local_ranks(argvs, env, timeout)
    except RanksTimedOut:
        raise UsageError(f"calibrate --gloo: {world} processes did not finish within {timeout:.0f} s "
                         "(a gloo group that cannot connect on the loopback interface?)") from None
    for r, (code, _, err) in enumerate(results):
        if code != 0:
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            raise UsageError(f"calibrate --gloo: rank {r} of {world} failed: {last}")
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--rank":
    import faulthandler
    faulthandler.dump_traceback_later(280, exit=True)
    _spec = json.loads(sys.argv[5])
    print(json.dumps(_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], _spec["sizes"], _spec["budget_s"])))
