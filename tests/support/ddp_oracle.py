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
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONFAULTHANDLER="1",
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


def main(argv: list[str]) -> int:
    import faulthandler
    spec = json.loads(argv[0])
    faulthandler.dump_traceback_later(spec.get("dump_after", 230), exit=True)
    warnings.simplefilter("ignore")
    for name, cap in spec["cases"]:
        print(json.dumps(_one(name, cap)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
