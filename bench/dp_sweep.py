"""A sweep of DDP / FSDP2 facts on models nobody here wrote (bench/dp_sweep_models.py), real (gloo, CPU, child
processes with deadlines) against simulated.

  python bench/dp_sweep.py buckets OUT.json [models...]   # 1 rank: initial + rebuilt buckets, ready order
  python bench/dp_sweep.py ranks OUT.json [models...]     # 2 ranks: all-reduce launch order, first + steady
  python bench/dp_sweep.py fsdp OUT.json [models...]      # 2 ranks: FSDP2 pre/all-gather/reduce-scatter order

Child modes (internal): --ddp-one, --ddp-rank, --fsdp.
Seed: dp_sweep_models.SEED (torch.manual_seed before each model is built; inputs from external.py's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, os.path.join(ROOT, "tests"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

CAPS = [None, 1.0, 0.25, 0.05, 0.01]


def env():
    return dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), HERE]))


def ddp_kwargs(case):
    kw = dict(find_unused_parameters=bool(case.get("fu")), static_graph=bool(case.get("sg")),
              gradient_as_bucket_view=bool(case.get("gv")))
    if case.get("cap") is not None:
        kw["bucket_cap_mb"] = case["cap"]
    if case.get("cl"):
        kw["bucket_cap_mb_list"] = case["cl"]
    return kw


def case_id(case):
    return f"{case['name']}-{case.get('cap')}-fu{int(bool(case.get('fu')))}sg{int(bool(case.get('sg')))}" \
           f"gv{int(bool(case.get('gv')))}" + (f"-cl{case['cl']}" if case.get("cl") else "")


# ---------------------------------------------------------------- children

def _ddp_params(ddp):
    params, _ = ddp._build_params_for_reducer()
    names = {}
    for n, p in ddp.module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)
    return params, [names[id(p)] for p in params]


def _ints(text):
    return [int(v) for v in str(text).replace(",", " ").split()] if text not in (None, "") else []


def child_ddp_one(cases):
    """One rank (HashStore): per case, DDP's initial bucket sizes, the per-bucket parameter indices the comm hook
    sees in iteration 1 (initial) and 3 (rebuilt), logging data's ready order and rebuilt buckets."""
    import datetime
    import gc
    import torch
    import torch.distributed as dist
    import dp_sweep_models as M
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for case in cases:
            try:
                model, run = M.parts(case["name"])
                ddp = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs(case))
                params, names = _ddp_params(ddp)
                index = {id(p): i for i, p in enumerate(params)}
                initial = _ints(ddp._get_ddp_logging_data()["bucket_sizes"])
                seen = []

                def hook(state, bucket):
                    seen[-1].append([index[id(p)] for p in bucket.parameters()])
                    return allreduce_hook(state, bucket)
                ddp.register_comm_hook(None, hook)
                for _ in range(3):
                    seen.append([])
                    run(ddp).backward()
                d = ddp._get_ddp_logging_data()
                out = {"id": case_id(case), "case": case, "names": names, "initial": initial,
                       "hook": seen, "ready": _ints(d.get("prev_iteration_grad_ready_order_indices")),
                       "rebuilt": [_ints(b) for b in str(d.get("rebuilt_per_bucket_param_indices", "")).split(",")
                                   if b.strip()],
                       "rebuilt_sizes": _ints(d.get("rebuilt_bucket_sizes")),
                       "has_rebuilt": bool(d.get("has_rebuilt_buckets"))}
                del ddp, d
            except Exception:  # noqa: BLE001
                out = {"id": case_id(case), "case": case, "error": traceback.format_exc()[-3000:]}
            gc.collect()
            print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


def _ddp_rank_case(rank, out, case):
    import torch
    import dp_sweep_models as M
    from torch.profiler import ProfilerActivity, profile
    from tests.support.ddp_oracle import launches
    model, run = M.parts(case["name"])
    ddp = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs(case))
    got = {}
    for it in range(3):
        loss = run(ddp)
        if it == 1 and not case.get("sg"):
            loss.backward()
            continue
        kind = ("first", "second", "steady")[it]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss.backward()
        path = os.path.join(out, f"rank{rank}-{case_id(case)}-{kind}.json")
        prof.export_chrome_trace(path)
        got[kind] = launches(path)
        os.remove(path)
    del ddp
    return {"rank": rank, "launches": got}


def child_ddp_rank(rank, world, store, out, cases):
    from tests.support import ddp_oracle
    ddp_oracle._one_case = _ddp_rank_case
    ddp_oracle.build = None  # not used
    return ddp_oracle._rank_main(rank, world, store, out, cases)


def _fsdp_build(name):
    """``MODEL[+keep][+pf2]``: shard_by_size's units; +keep: every other unit keeps its parameters after forward
    (reshard_after_forward=False); +pf2: each unit's backward prefetches the two units before it."""
    import dp_sweep_models as M
    from torch.distributed.fsdp import fully_shard
    base, *opts = name.split("+")
    model, run = M.parts(base)
    for m in model.modules():  # FSDP2 forbids an in-place op on a unit's output (RegisterPostBackwardFunction's view)
        if isinstance(getattr(m, "inplace", None), bool):
            m.inplace = False
    total = sum(p.numel() for p in model.parameters())
    units = []
    done = set()
    if "tied" in opts:  # modules sharing a parameter (tied embeddings) in one unit: fully_shard([a, b])
        owners = {}
        for m in model.modules():
            for p in m.parameters(recurse=False):
                owners.setdefault(id(p), []).append(m)
        for ms in owners.values():
            if len(ms) > 1 and not any(id(m) in done for m in ms):
                fully_shard(ms)
                units.append(ms[0])
                done.update(id(m) for m in ms)

    def walk(m):  # tests/support/fsdp_oracle.shard_by_size, with the options
        for child in m.children():
            n = sum(p.numel() for p in child.parameters())
            if not n or id(child) in done:
                continue
            if any(id(d) in done for d in child.modules()):
                walk(child)
                continue
            if n > total / 8 and any(True for _ in child.children()):
                walk(child)
            else:
                fully_shard(child, reshard_after_forward=not ("keep" in opts and len(units) % 2 == 1))
                units.append(child)
    walk(model)
    fully_shard(model)
    if "pf2" in opts:
        for k in range(2, len(units)):
            units[k].set_modules_to_backward_prefetch([units[k - 1], units[k - 2]])
    return model, run


def child_fsdp(argv):
    from tests.support import fsdp_oracle
    fsdp_oracle.build = _fsdp_build
    if os.environ.get("DP_SWEEP_NO_VALUES"):  # the structure only (FSDP2 + activation checkpointing)
        fsdp_oracle.wants_values = lambda name: False
    return fsdp_oracle.main(argv)


# ---------------------------------------------------------------- ours

def capture(name):
    """Our graph of one model's loss (parameters= the model): (graph, model)."""
    import torch  # noqa: F401
    import dp_sweep_models as M
    from autograd_run.capture import from_torch
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.load import loads_graph
    model, run = M.parts(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = from_torch(run(model), parameters=model, reference=False)
    return loads_graph(dumps(doc, "json"), f"{name}.json"), model


def ours_buckets(g, case):
    from autograd_run.parallel import buckets as B
    from autograd_run.session import RunOptions, run_session
    from autograd_run.sim.ddp import params_of
    params = params_of(g)
    rep = run_session(g, RunOptions(record_order=True, multithreading=True, allow_python=True))
    assert rep.error is None, rep.error
    index = {p.name: p.index for p in params}
    ready = []
    for r in rep.order:
        n = g.by_id.get(r["id"])
        if n is not None and getattr(n, "variable", None) in index and index[n.variable] not in ready:
            ready.append(index[n.variable])
    kw = dict(find_unused_parameters=bool(case.get("fu")), static_graph=bool(case.get("sg")))
    rebuilds = B.rebuilds(**kw)
    kw["bucket_cap_mb_list"] = case.get("cl")
    initial = B.initial(params, case.get("cap"), **kw)
    steady = B.steady(params, ready, case.get("cap"), **kw)
    return {"names": [p.name for p in params], "initial": initial, "initial_sizes": B.sizes(initial, params),
            "ready": ready, "steady": steady, "steady_sizes": B.sizes(steady, params),
            "rebuilds": rebuilds}


def ours_launches(g, case, iteration):
    from autograd_run.ops.cost import ITEMSIZE
    from autograd_run.parallel.collectives import Link
    from autograd_run.sim.ddp import simulate_ddp
    from autograd_run.sim.session import SimOptions, simulate_session
    rep = simulate_session(g, SimOptions(spec="h100", slack_top=0))
    acc = [s[2].variable for s in sorted(rep.sim.slices, key=lambda s: s[4]) if getattr(s[2], "variable", None)]
    r = simulate_ddp(rep, 2, Link(10.0, 1e9, channels=2), case.get("cap"), find_unused_parameters=bool(case.get("fu")),
                     static_graph=bool(case.get("sg")), gradient_as_bucket_view=bool(case.get("gv")),
                     iteration=iteration)
    return [(b.nbytes // ITEMSIZE[b.dtype], acc.index(b.trigger) + 1 if b.trigger else len(acc)) for b in r.buckets]


def unused_of(g):
    from autograd_run.sim.ddp import params_of
    reached = {n.variable for n in g.by_id.values() if getattr(n, "variable", None)}
    return [p.name for p in params_of(g) if p.name not in reached]


# ---------------------------------------------------------------- drivers

def run_child(args, timeout):
    p = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env(), capture_output=True, text=True,
                       timeout=timeout)
    return p


def _captured(models, results: list) -> dict:
    """name -> the captured graph of each model; a model whose capture fails is an error row in ``results``."""
    graphs = {}
    for name in models:
        try:
            graphs[name], _ = capture(name)
        except Exception:  # noqa: BLE001
            results.append({"name": name, "error": "capture: " + traceback.format_exc()[-1500:]})
    return graphs


def sweep_buckets(models, out, extra=None):
    import torch  # noqa: F401
    results, cases = [], []
    graphs = _captured(models, results)
    for name, g in graphs.items():
        fu = bool(unused_of(g))
        for cap in CAPS:
            cases.append({"name": name, "cap": cap, "fu": fu})
        # settings variants at one cap
        cases.append({"name": name, "cap": 0.05, "fu": True})
        cases.append({"name": name, "cap": 0.05, "fu": fu, "sg": True})
        cases.append({"name": name, "cap": None, "fu": True, "sg": True})
        cases.append({"name": name, "cap": 0.05, "fu": fu, "gv": True})
    if extra is not None:
        cases = [dict(c, name=n) for n in graphs for c in extra]
    uniq = []
    for c in cases:
        if case_id(c) not in {case_id(u) for u in uniq}:
            uniq.append(c)
    facts = {}
    for k in range(0, len(uniq), 12):
        chunk = uniq[k:k + 12]
        try:
            p = run_child(["--ddp-one", json.dumps(chunk)], 600)
            for line in p.stdout.splitlines():
                if line.startswith("{"):
                    d = json.loads(line)
                    facts[d["id"]] = d
            if p.returncode:
                print("child rc", p.returncode, p.stderr[-2000:], flush=True)
        except subprocess.TimeoutExpired:
            print("child timed out on", [case_id(c) for c in chunk], flush=True)
    for case in uniq:
        cid = case_id(case)
        d = facts.get(cid)
        if d is None or "error" in d:
            results.append({"id": cid, "error": (d or {}).get("error", "no result")})
            continue
        o = ours_buckets(graphs[case["name"]], case)
        r = {"id": cid, "case": case}
        r["names_eq"] = o["names"] == d["names"]
        r["initial_sizes_eq"] = o["initial_sizes"] == d["initial"]
        r["initial_idx_eq"] = o["initial"] == d["hook"][0]
        nready = len(o["ready"])
        r["ready_eq"] = o["ready"] == d["ready"][:nready]
        sg = bool(case.get("sg"))
        if not sg:  # (static_graph: the logging data lags its rebuild, at the third forward; the hook is read)
            r["rebuilds_eq"] = o["rebuilds"] == d["has_rebuilt"]
        if d["has_rebuilt"]:
            r["rebuilt_eq"] = o["steady"] == d["rebuilt"] and o["steady_sizes"] == d["rebuilt_sizes"]
        # the buckets of iteration 2 and 3 as the comm hook saw them, in launch order
        r["second_hook_eq"] = (o["initial"] if sg else o["steady"]) == d["hook"][1]
        r["steady_hook_eq"] = o["steady"] == d["hook"][2]
        r["exact"] = all(v for k2, v in r.items() if k2.endswith("_eq"))
        if not r["exact"]:
            r["ours"], r["real"] = o, {k2: d[k2] for k2 in ("names", "initial", "hook", "ready", "rebuilt",
                                                             "rebuilt_sizes", "has_rebuilt")}
        results.append(r)
        print(cid, "EXACT" if r["exact"] else "MISMATCH " + str([k2 for k2, v in r.items() if k2.endswith("_eq") and not v]),
              flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)


def sweep_ranks(models, out, world=2, caps=(None, 0.05, 0.01)):
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    cases, results = [], []
    graphs = _captured(models, results)
    for name, g in graphs.items():
        fu = bool(unused_of(g))
        for cap in caps:
            cases.append({"name": name, "cap": cap, "fu": fu})
        cases.append({"name": name, "cap": 0.05, "fu": True})
        cases.append({"name": name, "cap": 0.05, "fu": fu, "sg": True})
    folder = tempfile.mkdtemp(prefix="ranks-", dir="/tmp/dpsweep")
    got_all = []
    for k in range(0, len(cases), 10):
        chunk = cases[k:k + 10]
        store = os.path.join(folder, f"store{k}")
        spec = json.dumps({"cases": chunk})
        argvs = [[sys.executable, __file__, "--ddp-rank", str(r), str(world), store, folder, spec]
                 for r in range(world)]
        try:
            res = run_local_ranks(argvs, env(), 600, cwd=ROOT)
        except RanksTimedOut as exc:
            print("ranks timed out", exc.stderr[0][-2000:], flush=True)
            got_all.extend([None] * len(chunk))
            continue
        bad = [(r, c, e) for r, (c, _, e) in enumerate(res) if c != 0]
        if bad:
            print("rank failed", bad[0][2][-2000:], flush=True)
            got_all.extend([None] * len(chunk))
            continue
        reps = [json.loads([ln for ln in o.splitlines() if ln.startswith("{")][-1])["cases"] for _, o, _ in res]
        for j in range(len(chunk)):
            got_all.append([rep[j] for rep in reps])
    for case, ranks in zip(cases, got_all):
        cid = case_id(case)
        if ranks is None or any("error" in r for r in ranks):
            err = "no result" if ranks is None else next(r["error"] for r in ranks if "error" in r)
            results.append({"id": cid, "error": err[-2000:]})
            print(cid, "ERROR", err[-300:], flush=True)
            continue
        r = {"id": cid, "case": case}
        for it in ("first", "steady"):
            ours = ours_launches(graphs[case["name"]], case, it)
            real = [[tuple(x) for x in rk["launches"][it]] for rk in ranks]
            r[f"{it}_eq"] = all(rr == ours for rr in real)
            if not r[f"{it}_eq"]:
                r[f"{it}_ours"], r[f"{it}_real"] = ours, real
        if case.get("sg"):  # static_graph: the second iteration, its initial buckets launched by the hooks
            ours = ours_launches(graphs[case["name"]], dict(case, sg=False, fu=False), "first")
            real = [[tuple(x) for x in rk["launches"]["second"]] for rk in ranks]
            r["second_eq"] = all(rr == ours for rr in real)
            if not r["second_eq"]:
                r["second_ours"], r["second_real"] = ours, real
        r["exact"] = all(v for k2, v in r.items() if k2.endswith("_eq"))
        results.append(r)
        print(cid, "EXACT" if r["exact"] else "MISMATCH", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)


def sweep_fsdp(models, out, world=2):
    from autograd_run.graphs.load import load_graph
    from autograd_run.parallel.collectives import Link
    from autograd_run.parallel.local_ranks import RanksTimedOut, run_local_ranks
    from autograd_run.sim.fsdp import sim_events, simulate_fsdp
    from autograd_run.sim.session import SimOptions, simulate_session
    from tests.support.fsdp_oracle import events
    folder = tempfile.mkdtemp(prefix="fsdp-", dir="/tmp/dpsweep")
    paths = {n: os.path.join(folder, f"{n}.json") for n in models}
    p = run_child(["--fsdp", "--capture", json.dumps(paths)], 600)
    done = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    ok = [n for n in models if "error" not in done.get(n, {"error": 1})]
    results = [{"name": n, "error": "capture: " + str(done.get(n, {}).get("error", p.stderr[-1000:]))[-2000:]}
               for n in models if n not in ok]
    store = os.path.join(folder, "store")
    argvs = [[sys.executable, __file__, "--fsdp", "--rank", str(r), str(world), store, folder, json.dumps(ok), "590"]
             for r in range(world)]
    try:
        res = run_local_ranks(argvs, env(), 600, cwd=ROOT)
    except RanksTimedOut as exc:
        print("fsdp ranks timed out", exc.stderr[0][-3000:])
        return
    reps = [json.loads([ln for ln in o.splitlines() if ln.startswith("{")][-1]) for _, o, _ in res]
    for n in ok:
        per = [rep["models"][n] for rep in reps]
        if any("error" in r for r in per):
            results.append({"name": n, "error": next(r["error"] for r in per if "error" in r)[-2000:]})
            print(n, "ERROR", flush=True)
            continue
        g = load_graph(paths[n])
        rep = simulate_session(g, SimOptions(spec="cpu", slack_top=0))
        sim = sim_events(simulate_fsdp(rep, world, Link(300.0, 1e9, "gloo-like", reduce_scatter="allreduce")))
        real = [events(r["trace"]) for r in per]
        r = {"name": n, "units": done[n]["units"], "exact": all(sim == x for x in real)}
        if not r["exact"]:
            r["sim"], r["real"] = sim, real
        results.append(r)
        print(n, "units", done[n]["units"], "EXACT" if r["exact"] else "MISMATCH", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)


def main(argv):
    warnings.simplefilter("ignore")
    import faulthandler
    if argv[0] == "--ddp-one":
        faulthandler.dump_traceback_later(590, exit=True)
        child_ddp_one(json.loads(argv[1]))
        return 0
    if argv[0] == "--ddp-rank":
        faulthandler.dump_traceback_later(590, exit=True)
        rank, world, store, out, spec = int(argv[1]), int(argv[2]), argv[3], argv[4], json.loads(argv[5])
        print(json.dumps(child_ddp_rank(rank, world, store, out, spec["cases"])), flush=True)
        return 0
    if argv[0] == "--fsdp":
        return child_fsdp(argv[1:])
    import dp_sweep_models as M
    mode, out, models = argv[0], argv[1], argv[2:] or list(M.MODELS)
    if mode.startswith("fsdp") and mode[4:].isdigit():
        print("seed", M.SEED, "world", mode[4:], models, flush=True)
        return sweep_fsdp(models, out, world=int(mode[4:]))
    print("seed", M.SEED, "models", models, flush=True)
    if mode == "lists":  # bucket_cap_mb_list (torch 2.13), with and without unused parameters looked for
        L = [{"cl": [0.01, 0.05, 0.02]}, {"cl": [0.03], "fu": True}, {"cl": [0.005, 0.1], "sg": True},
             {"cl": [0.02, 0.01]}]
        return sweep_buckets(models, out, L)
    {"buckets": sweep_buckets, "ranks": sweep_ranks, "fsdp": sweep_fsdp}[mode](models, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
