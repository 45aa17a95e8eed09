"""Real FSDP2 (``fully_shard``) on gloo as an oracle, always in child processes with a deadline.

Why children: see ``tests/support/ddp_oracle.py`` (process groups in the pytest process can hang it in C++).

``capture_many(names, folder)``: one process, a one-rank gloo group (in-memory store), each model built and
wrapped, one forward, ``from_torch(loss, parameters=model, path=...)``: ``folder/<name>.json`` with its ``fsdp``
section. ``capture(name, path)``: one model.

``run_ranks_many(names, world, out_dir)``: ``world`` processes joined by a ``FileStore``, each running every
model in turn: two warm-up iterations, then the third backward profiled (``rank{R}-<name>.json``). One set of
processes for all the models: each process spends seconds importing torch, more than a small model's three
iterations. ``run_ranks(name, world, out_dir)``: one model. ``events(trace)`` reads a trace back: FSDP's own
``record_function`` spans on the thread that ran the backward, in the order they started, as (kind, unit):
``pre`` (``FSDP::pre_backward``), ``all-gather`` (``FSDP::all_gather``), ``reduce-scatter``
(``FSDP::post_backward_reduce``), and under HSDP ``all-reduce`` (a ``c10d::allreduce_`` inside the latter).
The root's unit is "" (FSDP labels it without a name). The ``hsdp`` model is sharded on a 2-D mesh:
``HSDP_REPLICAS`` replicas from 4 ranks on.
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


MODELS = ("blocks", "transformer", "prefetch2", "keep", "nested", "conv", "frozen_input", "hsdp")
#: Built by ``build`` too, checked by tests/test_fsdp_ranks.py only (the benchmarks draw from MODELS).
#: FSDP2's settings beyond the plain recipe (built by ``_more``): set_modules_to_forward_prefetch under activation
#: checkpointing (a recompute's pre-forward prefetches); set_requires_gradient_sync(False);
#: set_reshard_after_backward(False) with a prefetch of a unit whose backward ran; set_unshard_in_backward(False) on
#: an embedding; bf16 mixed precision; the common recipe of checkpoint_wrapper'ed blocks then fully_shard; a unit
#: inside a unit in a checkpointed block.
SETTINGS = ("ckpt_forward_prefetch", "no_gradient_sync", "keep_after_backward", "no_unshard_in_backward",
            "mixed_precision", "ac_wrapper", "ckpt_nested")
MORE = ("prefetch_done", "tied_group", "checkpointed") + SETTINGS
#: Built by ``build`` too, checked by hand (equal to real fully_shard on 2 ranks when last run, or, for ``twice*``
#: and ``reshard_world_int``, not representable: see their notes in ``_more``); not in the tests, for time.
EXPLORED = ("ckpt_forward_prefetch_chain", "ckpt_forward_prefetch_block", "forward_prefetch", "reshard_one_int",
            "reshard_world_int", "no_sync_keep", "keep_after_backward_plain", "ac_wrapper_outside", "twice",
            "twice_ckpt", "twice_one_ckpt")
#: Captured without saved values (``values=False``): FSDP2 units inside activation-checkpointed blocks, whose saved
#: weight views the recompute frees (``capture.graph``'s error says so); the order needs none.
NO_VALUES = ("checkpointed", "ckpt_forward_prefetch_chain", "ckpt_forward_prefetch_block", "ckpt_nested",
             "ckpt_forward_prefetch", "twice_ckpt", "twice_one_ckpt", "ac_wrapper", "ac_wrapper_outside")


def wants_values(name: str) -> bool:
    """Whether model ``name`` is captured with its saved values (a sweep may set this to capture none)."""
    return name not in NO_VALUES
#: HSDP's replicas for the ``hsdp`` model on a group of 4 or more ranks (a 2-D mesh: replicas x shards; on fewer
#: ranks, as in a one-rank capture, one replica).
HSDP_REPLICAS = 2


def _hsdp_mesh():
    """The ``hsdp`` model's device mesh on this process's group: ``HSDP_REPLICAS`` replicas of ``world /
    HSDP_REPLICAS`` shards from 4 ranks on, else one replica."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    replicas = HSDP_REPLICAS if world >= 4 and world % HSDP_REPLICAS == 0 else 1
    return init_device_mesh("cpu", (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))


def shard_by_size(model, share: float = 1 / 8) -> int:
    """``fully_shard`` a model nobody here wrote the way its users often do, by size: walking down from the
    root, a child holding more than ``share`` of the parameters (and with children of its own) is split
    further, any other child with parameters is one unit; then the root. Returns the number of units."""
    from torch.distributed.fsdp import fully_shard
    total = sum(p.numel() for p in model.parameters())
    units = 0

    def walk(m):
        nonlocal units
        for child in m.children():
            n = sum(p.numel() for p in child.parameters())
            if not n:
                continue
            if n > share * total and any(True for _ in child.children()):
                walk(child)
            else:
                fully_shard(child)
                units += 1
    walk(model)
    fully_shard(model)
    return units + 1


def build(name: str):
    """(model wrapped in fully_shard, run): ``run(model)`` is one forward to the loss on a fixed input. ``name``:
    one of MODELS, or ``zoo:NAME`` for an external model of ``tests/zoo/external.py`` (torchvision, timm,
    transformers; random weights) sharded by ``shard_by_size``."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    if name.startswith("zoo:"):
        tests = str(ROOT / "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        from zoo import external
        model, run = external.parts(name[4:])
        shard_by_size(model)
        return model, run
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    if name == "hsdp":  # the blocks model sharded within replicas, all-reduced across them
        model = nn.Sequential(nn.Linear(32, 64), Block(64), Block(64), Block(64), nn.Linear(64, 4))
        mesh = _hsdp_mesh()
        for m in model[1:4]:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, (lambda m: m(x).square().mean())
    if name in ("blocks", "prefetch2", "keep", "nested", "frozen_input", "prefetch_done"):
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
        if name == "prefetch_done":  # a prefetch list naming units whose backward already ran (as a list
            # made in registration order where it is not the forward's does): FSDP gathers them again
            model[2].set_modules_to_backward_prefetch([model[3], model[1]])
            model[1].set_modules_to_backward_prefetch([model[3]])
        return model, (lambda m: m(x).square().mean())
    if name in SETTINGS + EXPLORED or name == "checkpointed":
        return _more(name, Block, x)
    if name == "tied_group":  # a tied embedding and head in one unit (fully_shard([a, b])), registered first
        class Tied(nn.Module):  # and post-forwarded last; its inputs and pos's need no gradient: their
            def __init__(self):  # post-backwards run in the final callback, in named_modules order
                super().__init__()
                self.embed, self.pos = nn.Embedding(32, 32), nn.Embedding(8, 32)
                self.blocks = nn.Sequential(Block(32), Block(32))
                self.head = nn.Linear(32, 32, bias=False)
                self.head.weight = self.embed.weight

            def forward(self, ids):
                return self.head(self.blocks(self.embed(ids) + self.pos(torch.arange(ids.shape[1]))))
        model = Tied()
        fully_shard([model.embed, model.head])
        fully_shard(model.pos)
        for m in model.blocks:
            fully_shard(m)
        fully_shard(model)
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
        return model, (lambda m: m(ids).square().mean())
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


def _more(name: str, Block, x):
    """The models of ``SETTINGS`` and ``EXPLORED`` and ``checkpointed`` (from ``build``): FSDP2's settings beyond
    the plain recipe."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.checkpoint import checkpoint

    class Three(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

        def forward(self, x):
            return x + self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    class Checkpointed(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.inner = Three(d)

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    def loss(model):
        return lambda m: m(x).square().mean()

    if name == "checkpointed":  # units inside non-reentrant activation-checkpointed blocks (as a transformer layer
        # split into units and checkpointed whole): the first node of a block to unpack a saved tensor recomputes
        # the block's forward, whose pre-forwards all-gather its sharded units in forward order
        model = nn.Sequential(nn.Linear(32, 64), Checkpointed(64), Checkpointed(64), nn.Linear(64, 4))
        for blk in model[1:3]:
            for m in (blk.inner.a, blk.inner.b, blk.inner.c):
                fully_shard(m)
        fully_shard(model)
        return model, loss(model)
    if name in ("ckpt_forward_prefetch_chain", "ckpt_forward_prefetch_block", "ckpt_nested",
                "ckpt_forward_prefetch"):
        model = nn.Sequential(nn.Linear(32, 64), Checkpointed(64), Checkpointed(64), Checkpointed(64),
                              nn.Linear(64, 4))
        blocks = model[1:4]
        if name == "ckpt_nested":  # a unit (inner.a) inside a unit (inner), the whole checkpointed
            for blk in blocks:
                fully_shard(blk.inner.a)
                fully_shard(blk.inner)
        else:
            for blk in blocks:
                for m in (blk.inner.a, blk.inner.b, blk.inner.c):
                    fully_shard(m)
        fully_shard(model)
        if name == "ckpt_forward_prefetch_chain":  # each unit prefetches the next one in forward order, across blocks
            seq = [m for blk in blocks for m in (blk.inner.a, blk.inner.b, blk.inner.c)]
            for a, b in zip(seq, seq[1:]):
                a.set_modules_to_forward_prefetch([b])
        if name == "ckpt_forward_prefetch":  # each block's first unit prefetches the next block's first:
            # in the backward's recompute that one's backward already ran
            for blk, nxt in zip(blocks, blocks[1:]):
                blk.inner.a.set_modules_to_forward_prefetch([nxt.inner.a])
        if name == "ckpt_forward_prefetch_block":  # only within a block
            for blk in blocks:
                blk.inner.a.set_modules_to_forward_prefetch([blk.inner.b, blk.inner.c])
        return model, loss(model)
    if name in ("forward_prefetch", "reshard_world_int", "reshard_one_int", "mixed_precision", "no_gradient_sync",
                "keep_after_backward_plain", "keep_after_backward", "no_sync_keep"):
        model = nn.Sequential(nn.Linear(32, 64), Block(64), Block(64), Block(64), nn.Linear(64, 4))
        kw = {}
        if name == "reshard_world_int":  # an int: FSDP resolves it against the group it is built in, so the
            # one-rank capture records 1 (False: kept) and 2 ranks run 2 (True): not representable, see the report
            kw["reshard_after_forward"] = dist.get_world_size()
        if name == "reshard_one_int":
            kw["reshard_after_forward"] = 1
        if name == "mixed_precision":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        for m in model[1:4]:
            fully_shard(m, **kw)
        fully_shard(model, **({"mp_policy": kw["mp_policy"]} if "mp_policy" in kw else {}))
        if name == "forward_prefetch":
            model[1].set_modules_to_forward_prefetch([model[2], model[3]])
            model[2].set_modules_to_forward_prefetch([model[3]])
        if name in ("no_gradient_sync", "no_sync_keep"):
            model.set_requires_gradient_sync(False)
        if name in ("keep_after_backward_plain", "keep_after_backward", "no_sync_keep"):
            model.set_reshard_after_backward(False)
        if name == "keep_after_backward":  # a prefetch of a unit whose backward ran (not resharded)
            model[2].set_modules_to_backward_prefetch([model[3], model[1]])
            model[1].set_modules_to_backward_prefetch([model[3]])
        return model, loss(model)
    if name in ("twice", "twice_ckpt", "twice_one_ckpt"):  # a unit whose module runs twice in the forward: FSDP
        # runs a pre- and a post-backward per call (all-gathered again between, its reduce-scatter at the call
        # whose post-backward finds the gradients): simulate_fsdp refuses it (the capture's ``forward_calls``)
        class Twice(nn.Module):
            def __init__(self):
                super().__init__()
                self.first, self.blk, self.last = nn.Linear(32, 64), Block(64), nn.Linear(64, 4)
                self.other = Block(64)

            def forward(self, x):
                h = self.first(x)
                if name == "twice":
                    h = self.blk(self.other(self.blk(h)))
                elif name == "twice_ckpt":  # each use checkpointed on its own
                    h = checkpoint(self.blk, h, use_reentrant=False)
                    h = checkpoint(self.other, h, use_reentrant=False)
                    h = checkpoint(self.blk, h, use_reentrant=False)
                else:  # both uses in one checkpointed region
                    h = checkpoint(lambda t: self.blk(self.blk(t)), h, use_reentrant=False)
                return self.last(h)
        model = Twice()
        fully_shard(model.blk)
        fully_shard(model.other)
        fully_shard(model)
        return model, loss(model)
    if name == "no_unshard_in_backward":  # an embedding unit whose backward needs no parameters
        class Emb(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(32, 64)
                self.blocks = nn.Sequential(Block(64), Block(64))
                self.head = nn.Linear(64, 4)

            def forward(self, ids):
                return self.head(self.blocks(self.embed(ids)))
        model = Emb()
        fully_shard(model.embed)
        for m in model.blocks:
            fully_shard(m)
        fully_shard(model)
        model.embed.set_unshard_in_backward(False)
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
        return model, (lambda m: m(ids).square().mean())
    if name in ("ac_wrapper", "ac_wrapper_outside"):  # the common recipe: checkpoint_wrapper'ed blocks, sharded
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        model = nn.Sequential(nn.Linear(32, 64), Block(64), Block(64), Block(64), nn.Linear(64, 4))
        if name == "ac_wrapper":  # AC first, then fully_shard of the wrappers (torchtitan's order)
            apply_activation_checkpointing(model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
                m, checkpoint_impl=CheckpointImpl.NO_REENTRANT), check_fn=lambda m: isinstance(m, Block))
            for m in model[1:4]:
                fully_shard(m)
        else:  # fully_shard the blocks, then wrap them: the recompute runs FSDP's forward hooks
            for m in model[1:4]:
                fully_shard(m)
            apply_activation_checkpointing(model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
                m, checkpoint_impl=CheckpointImpl.NO_REENTRANT), check_fn=lambda m: isinstance(m, Block))
        fully_shard(model)
        return model, loss(model)
    raise KeyError(name)


def _env() -> dict:
    return dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _capture_main(paths: dict[str, str]) -> dict:
    """Each model ``name`` captured to ``paths[name]``, in one process and one one-rank group."""
    import traceback
    from autograd_run.capture.distributed import end_process_group, one_process_group
    from autograd_run.capture.graph import from_torch
    one_process_group()
    done = {}
    try:
        for name, path in paths.items():
            try:
                model, run = build(name)
                loss = run(model)
                doc = from_torch(loss, parameters=model, path=path, values=wants_values(name))
                done[name] = {"units": len(doc["fsdp"]["units"])}
            except Exception:  # noqa: BLE001 - reported for this model; the others go on
                done[name] = {"error": traceback.format_exc()}
        return done
    finally:
        end_process_group()


def _one_model(rank: int, out: str, name: str, memory: bool, timed: int = 0) -> dict:
    from torch.profiler import ProfilerActivity, profile
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
        path = os.path.join(out, f"rank{rank}-{name}-memory.json")
        prof.export_chrome_trace(path)
        return {"memory": read(path)}
    for it in range(3):
        loss = run(model)
        if it < 2:
            loss.backward()
            continue
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss.backward()
        path = os.path.join(out, f"rank{rank}-{name}.json")
        prof.export_chrome_trace(path)
    times, tails, marks = [], [], []
    for _ in range(timed):  # the backward call alone, after a barrier, as bench/fsdp_time.py measures it
        import time
        import torch.distributed as dist
        from tests.support.compute_end import mark_compute_end
        loss = run(model)  # gradients accumulate, as in the profiled pass
        hook = mark_compute_end(loss, marks)  # tail_ns: from the compute's end to the return (exposed)
        dist.barrier()
        marks.clear()
        t = time.perf_counter_ns()
        loss.backward()
        end = time.perf_counter_ns()
        hook.remove()
        times.append(end - t)
        if len(marks) == 1:
            tails.append(end - marks[0])
    return {"trace": path, "backward_ns": times, "tail_ns": tails}


def _rank_main(rank: int, world: int, store: str, out: str, names: list[str], memory: bool = False,
               timed: int = 0) -> dict:
    """One rank of one group that runs each model in turn (a model that raises is reported and the rest go on;
    one that hangs a collective fails them all at the group's timeout or the deadline)."""
    import datetime
    import gc
    import traceback
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    models = {}
    try:
        for name in names:
            try:
                models[name] = _one_model(rank, out, name, memory, timed)
            except Exception:  # noqa: BLE001
                models[name] = {"error": traceback.format_exc()}
            gc.collect()  # the last model's parameters and FSDP state go before the next is built
            dist.barrier()
        return {"rank": rank, "models": models}
    finally:
        dist.destroy_process_group()


def capture_many(names: list[str], folder: str, timeout: float = 240) -> tuple[dict[str, str], dict[str, str]]:
    """Each model captured in one child process to ``folder/<name>.json``: ({name: graph path} for those
    captured, {name: the traceback} for those whose capture raised). OracleFailed when the child fails or
    misses its deadline."""
    return _capture({n: os.path.join(folder, f"{n}.json") for n in names}, timeout)


def _capture(paths: dict[str, str], timeout: float) -> tuple[dict[str, str], dict[str, str]]:
    import subprocess
    arg = ["--capture", json.dumps(paths)]
    try:
        p = subprocess.run([sys.executable, "-m", "tests.support.fsdp_oracle", *arg], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise OracleFailed(f"FSDP capture missed its {timeout:.0f} s deadline: {exc.stderr!r:.4000}") from None
    if p.returncode != 0:
        raise OracleFailed(f"FSDP capture exited {p.returncode}; its stderr:\n{p.stderr[-6000:]}")
    done = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    errors = {n: f"FSDP capture of {n} raised:\n{d['error'][-4000:]}" for n, d in done.items() if "error" in d}
    return {n: path for n, path in paths.items() if n not in errors}, errors


def capture(name: str, path: str, timeout: float = 180) -> None:
    """One model captured to ``path`` (in a child process, see ``capture_many``)."""
    _, errors = _capture({name: path}, timeout)
    if errors:
        raise OracleFailed(errors[name])


def run_ranks_many(names: list[str], world: int, out_dir: str, timeout: float = 300,
                   memory: bool = False, timed: int = 0) -> dict[str, list[dict] | str]:
    """``world`` ranks of one group running each model in turn (see ``run_ranks``): {name: every rank's report
    for it, by rank, or the first rank's traceback as a string when the model raised}. ``timed``: after the
    profiled backward, that many more timed ones (``backward_ns``)."""
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    store = os.path.join(out_dir, "store")
    argvs = [[sys.executable, "-m", "tests.support.fsdp_oracle", "--rank", str(r), str(world), store, out_dir,
              json.dumps(list(names)), str(max(1.0, timeout - 10)), *(["--memory"] if memory else []),
              *(["--timed", str(timed)] if timed else [])]
             for r in range(world)]
    try:
        results = run_local_ranks(argvs, _env(), timeout, cwd=ROOT)
    except RanksTimedOut as exc:
        raise OracleFailed(f"{world} FSDP ranks missed their {timeout:.0f} s deadline; rank 0's stderr:\n"
                           f"{exc.stderr[0][-4000:]}") from None
    bad = [(r, code, err) for r, (code, _, err) in enumerate(results) if code != 0]
    if bad:
        r, rc, err = bad[0]
        raise OracleFailed(f"FSDP rank {r} of {world} exited {rc}; its stderr:\n{err[-4000:]}")
    reports = [json.loads([line for line in out.splitlines() if line.startswith("{")][-1]) for _, out, _ in results]
    by_name: dict[str, list[dict] | str] = {}
    for name in names:
        per_rank = [rep["models"][name] for rep in reports]
        failed = next((r for r in per_rank if "error" in r), None)
        by_name[name] = failed["error"] if failed else [{"rank": k, **r} for k, r in enumerate(per_rank)]
    return by_name


def run_ranks(name: str, world: int, out_dir: str, timeout: float = 240, memory: bool = False) -> list[dict]:
    """``world`` ranks profiling their third backward (``memory``: its live bytes instead, forward too)."""
    got = run_ranks_many([name], world, out_dir, timeout, memory)[name]
    if isinstance(got, str):
        raise OracleFailed(f"FSDP ranks of {name} raised:\n{got[-4000:]}")
    return got


_KINDS = (("FSDP::pre_backward", "pre"), ("FSDP::all_gather", "all-gather"),
          ("FSDP::post_backward_reduce", "reduce-scatter"))
#: HSDP's all-reduce across replicas: this c10d op inside a unit's ``FSDP::post_backward_reduce`` span.
_ALL_REDUCE = "c10d::allreduce_"


def events(trace_path: str) -> list[tuple[str, str]]:
    """[(kind, unit)] in start order (see the module docstring); and (``all-reduce``, unit) for HSDP's all-reduce
    across replicas, a ``c10d::allreduce_`` inside the unit's post-backward reduce on the same thread."""
    with open(trace_path) as f:
        evs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    out = []
    reduces = []  # (tid, start, end, unit) of each post-backward reduce
    for e in sorted(evs, key=lambda e: e["ts"]):
        name = e.get("name", "")
        if name == _ALL_REDUCE:
            inside = [r for r in reduces if r[0] == e.get("tid") and r[1] <= e["ts"] <= r[2]]
            if inside:
                out.append(("all-reduce", inside[-1][3]))
            continue
        for prefix, kind in _KINDS:
            if name == prefix or name.startswith(prefix + " ("):
                unit = name[len(prefix):].strip()
                unit = unit[1:-1] if unit.startswith("(") else unit
                out.append((kind, unit))
                if kind == "reduce-scatter":
                    reduces.append((e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0), unit))
    return out


def main(argv: list[str]) -> int:
    import faulthandler
    warnings.simplefilter("ignore")
    if argv[0] == "--capture":
        faulthandler.dump_traceback_later(230, exit=True)
        print(json.dumps(_capture_main(json.loads(argv[1]))), flush=True)
        return 0
    rank, world, store, out, names = int(argv[1]), int(argv[2]), argv[3], argv[4], json.loads(argv[5])
    faulthandler.dump_traceback_later(float(argv[6]), exit=True)
    rest = argv[7:]
    timed = int(rest[rest.index("--timed") + 1]) if "--timed" in rest else 0
    print(json.dumps(_rank_main(rank, world, store, out, names, memory="--memory" in rest, timed=timed)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
