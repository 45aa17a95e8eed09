"""PyTorch's own autograd Engine, run on two accelerator devices, as a test oracle.

Without a GPU, PyTorch runs every backward node on the calling thread. The
C++ extension in ``accel/accel.cpp`` registers a CPU-backed accelerator on
the PrivateUse1 key (renamed ``accel`` here) with 2 devices (set
``AUTOGRAD_RUN_ACCEL_DEVICES`` to change that before loading), so the
unmodified Engine starts its worker threads ``pt_autograd_0`` and
``pt_autograd_1`` and schedules exactly as it would with CUDA devices. The
same kernels also serve a second device type, ``ve`` (not an accelerator
for the Engine), whose index i shares the worker of ``accel:i``.

What is recorded, per run and per worker thread (the caller, each device
thread, each reentrant pool thread):

* each node the Engine evaluates (a RecordFunction observer in the
  extension sees every ``autograd::engine::evaluate_function`` scope): name,
  sequence number, graph task, nesting depth on that thread;
* each call of the backend's event hooks (``record``, ``block``,
  ``recordDataPtrOnStream``, stream/event synchronize) with device, stream
  id and event, in order with the nodes;
* independently, node pre-hooks on the graph's nodes (Python), with the OS
  thread of each call, as a cross-check of the observer.

The backend must be registered before the first backward of a process (the
Engine counts devices once). So run it in its own process::

    python -m tests.support.pt_oracle --list
    python -m tests.support.pt_oracle mlp_2dev --repeats 10
    python -m tests.support.pt_oracle all --repeats 10 --capture --out oracle.json

or from a test with :func:`run_oracle` (which starts that process).
In-process use: :func:`load_backend` first, then :func:`record_run`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BACKEND = "accel"
EXT_NAME = "autograd_run_accel"
SOURCE = Path(__file__).resolve().parent / "accel" / "accel.cpp"
REPO_ROOT = Path(__file__).resolve().parents[2]
ACC = "torch::autograd::AccumulateGrad"
GRAPH_ROOT = "torch::autograd::GraphRoot"
EXIT_UNAVAILABLE = 3


class OracleUnavailable(RuntimeError):
    """The oracle cannot run here (no C++ toolchain, no torch, or a backward ran too early)."""


# ---------------------------------------------------------------------------
# Building and loading the backend
# ---------------------------------------------------------------------------

def toolchain_problem() -> str | None:
    """Why the extension cannot be compiled here, or None when it can."""
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError:
        return "torch is not installed"
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r}) on PATH"
    if not cpp_extension.is_ninja_available():
        return "ninja is not available (torch.utils.cpp_extension needs it)"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers (Python.h) in {include}"
    return None


def build_dir() -> Path:
    """Where the compiled extension is cached (``AUTOGRAD_RUN_ORACLE_BUILD`` overrides)."""
    import torch
    root = os.environ.get("AUTOGRAD_RUN_ORACLE_BUILD") or \
        os.path.join(os.path.expanduser("~"), ".cache", "autograd-run-tests")
    # One folder per checkout too: ninja rebuilds when the source path changes.
    where = hashlib.sha1(str(SOURCE).encode()).hexdigest()[:8]
    tag = f"accel-torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{where}"
    return Path(root) / tag.replace("+", "_")


_ext = None
_device_tids: dict[int, str] = {}


def load_backend(verbose: bool = False):
    """Compile (cached) and load the extension, name the backend ``accel``, start the Engine's threads.

    Returns the extension module. Raises :class:`OracleUnavailable` when it
    cannot be built, or when a backward already ran in this process before
    the backend was registered (the Engine then has no device queues).
    """
    global _ext
    if _ext is not None:
        return _ext
    problem = toolchain_problem()
    if problem:
        raise OracleUnavailable(problem)
    import torch
    from torch.utils import cpp_extension

    where = build_dir()
    where.mkdir(parents=True, exist_ok=True)
    ext = cpp_extension.load(name=EXT_NAME, sources=[str(SOURCE)], build_directory=str(where),
                             extra_cflags=["-O1"], verbose=verbose)
    if torch._C._get_privateuse1_backend_name() != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    if not hasattr(torch, BACKEND):
        torch._register_device_module(BACKEND, _device_module(torch, ext))
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=False, for_storage=False)
    _ext = ext
    _start_engine_threads(torch, ext)
    return ext


def _device_module(torch, ext) -> types.ModuleType:
    """The ``torch.accel`` module PyTorch's Python code asks for (checkpoint, fork_rng, amp)."""
    mod = types.ModuleType(f"torch.{BACKEND}")
    # False: torch.utils.checkpoint then stashes no per-device RNG state; the
    # backend has no RNG of its own (its kernels use the CPU generator).
    mod._initialized = False
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod.device_count = ext.device_count
    mod.current_device = ext.current_device
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed = mod.manual_seed_all = lambda seed: None
    mod.get_rng_state = lambda device=BACKEND: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=BACKEND: None
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    mod.synchronize = lambda device=None: None

    def index(d) -> int:
        if isinstance(d, int):
            return d
        d = torch.device(d)
        return ext.current_device() if d.index is None else d.index

    mod.set_device = lambda d: ext.set_device(index(d))

    class device:
        def __init__(self, d):
            self.idx = index(d)

        def __enter__(self):
            self.prev = ext.current_device()
            ext.set_device(self.idx)

        def __exit__(self, *exc):
            ext.set_device(self.prev)

    mod.device = device
    return mod


def _os_threads() -> dict[int, str]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:
            pass
    return out


def _start_engine_threads(torch, ext) -> None:
    """Run one tiny backward so the Engine starts its device threads; note their OS thread ids."""
    x = torch.ones(2, device=f"{BACKEND}:0", requires_grad=True)
    try:
        (x * 2).sum().backward()
    except RuntimeError as exc:
        raise OracleUnavailable(
            "the Engine has no device queues: a backward ran in this process before the backend "
            f"was loaded; run the oracle in a fresh process (python -m tests.support.pt_oracle). ({exc})"
        ) from exc
    _device_tids.clear()
    for tid, name in _os_threads().items():
        if name.startswith("pt_autograd_"):
            _device_tids[tid] = name
    found = sorted(_device_tids.values())
    expected = [f"pt_autograd_{i}" for i in range(ext.device_count())]
    if found != expected:
        raise OracleUnavailable(f"expected Engine device threads {expected}, found {found}")


def device_threads() -> dict[int, str]:
    """OS thread id -> name of the Engine's device threads (after :func:`load_backend`)."""
    return dict(_device_tids)


@contextlib.contextmanager
def on_stream(device: int, stream_id: int):
    """Make ``stream_id`` the calling thread's current stream on ``accel:device`` for the block."""
    ext = load_backend()
    prev = ext.set_stream(device, stream_id)
    try:
        yield
    finally:
        ext.set_stream(device, prev)


# ---------------------------------------------------------------------------
# Recording runs
# ---------------------------------------------------------------------------

@dataclass
class Run:
    """One forward of a model, ready for one backward.

    ``outputs``: the tensors to differentiate; ``grad_outputs``: their
    gradients (ones when None); ``leaves``: names of leaf tensors (parameters
    and inputs), used to name AccumulateGrad nodes; ``backward``: a custom
    call (default ``torch.autograd.backward(outputs, grad_outputs)``).
    """
    outputs: list
    grad_outputs: list | None = None
    leaves: dict[str, Any] = field(default_factory=dict)
    backward: Callable[[], Any] | None = None


def _walk(roots) -> list:
    seen, out, stack = set(), [], list(reversed(roots))
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        out.append(fn)
        for nf, _ in reversed(fn.next_functions):
            stack.append(nf)
    return out


def _static_graph(run: Run):
    """The graph reachable from the outputs before backward: ids n<i> in the same walk order
    as ``autograd_run.capture.from_torch`` (so they match a captured document)."""
    fns = _walk([o.grad_fn for o in run.outputs])
    leaf_names = {t._cdata: name for name, t in run.leaves.items()}
    ids, table, lookup = {}, {}, {}
    leaf_counter = 0
    for i, fn in enumerate(fns):
        nid = f"n{i}"
        ids[fn] = nid
        name = fn.name()
        if name == ACC:
            ptr = fn.variable._cdata
            leaf = leaf_names.get(ptr)
            if leaf is None:
                leaf = f"leaf{leaf_counter}"
            leaf_counter += 1
            table[nid] = [name, fn._sequence_nr(), leaf]
            lookup[("leaf", ptr)] = nid
        else:
            table[nid] = [name, fn._sequence_nr(), None]
            lookup[(name, fn._sequence_nr())] = nid
    return fns, ids, table, lookup, leaf_names


def _label_threads(tids_in_order: list[int], caller: int) -> dict[int, str]:
    labels, pools = {}, 0
    for tid in tids_in_order:
        if tid in labels:
            continue
        if tid == caller:
            labels[tid] = "caller"
        elif tid in _device_tids:
            labels[tid] = _device_tids[tid]
        else:
            labels[tid] = f"pool{pools}"
            pools += 1
    return labels


def _digest(entries, hook_log, lookup, leaf_names, caller: int) -> dict:
    """Per-worker results of one run: raw orders (name, seq) and a canonical trace that must
    not change between runs (sequence numbers and graph task ids made relative)."""
    entries = sorted(entries, key=lambda e: e[0])
    labels = _label_threads([e[1] for e in entries] + [t for t, _ in hook_log], caller)
    nodes = [e for e in entries if e[2] == "node"]
    gt_base = min((e[5] for e in nodes), default=0)
    # Nodes not in the graph as it was before backward (built during backward, e.g. by a
    # reentrant checkpoint's recomputation) are keyed by their sequence number relative to
    # the lowest one in their graph task: one thread creates them all, in a fixed order. The graph
    # as it was runs in the outermost call's graph task only (the first): a node of a nested call is
    # never one of its nodes, even when its thread's sequence counter gives it the same (name, seq).
    dyn_base: dict[int, int] = {}

    def static_id(name, seq, gt):
        return lookup.get((name, seq)) if gt == gt_base else None

    for e in nodes:
        _, _, _, name, seq, gt, _, leaf, _ = e
        if name not in (ACC, GRAPH_ROOT) and static_id(name, seq, gt) is None:
            dyn_base[gt] = min(dyn_base.get(gt, seq), seq)

    def key_of(name, seq, gt, leaf):
        if name == ACC:
            nid = lookup.get(("leaf", leaf))
            return nid if nid is not None else f"AccumulateGrad[{leaf_names.get(leaf, '?')}]"
        if name == GRAPH_ROOT:
            return "GraphRoot"
        nid = static_id(name, seq, gt)
        return nid if nid is not None else f"{name}@+{seq - dyn_base[gt]}"

    workers: dict[str, dict] = {}
    events: dict[int, str] = {}   # event id -> "<worker>:e<k>" (k-th record on that worker)
    for e in entries:
        _, tid, kind, name, seq, a, b, c, d = e
        label = labels[tid]
        w = workers.get(label)
        if w is None:
            w = workers[label] = {"order": [], "nodes": [], "trace": [], "graph_tasks": [],
                                  "max_depth": 0, "records": 0, "tid": tid}
        if kind == "node":
            gt, depth, leaf = a - gt_base, b, c
            key = key_of(name, seq, a, leaf)
            w["order"].append([name, seq])
            w["nodes"].append(key)
            w["trace"].append(["node", key, gt, depth])
            if gt not in w["graph_tasks"]:
                w["graph_tasks"].append(gt)
            w["max_depth"] = max(w["max_depth"], depth)
        elif kind == "end":
            continue
        elif kind == "record":
            if c not in events:
                events[c] = f"{label}:e{w['records']}"
                w["records"] += 1
            w["trace"].append(["record", a, b, events[c]])
        elif kind == "block":
            w["trace"].append(["block", a, b, events.get(c, "?")])
        elif kind == "record_stream":
            w["trace"].append(["record_stream", a, b])
        else:  # sync_stream, sync_event
            w["trace"].append([kind, a, b])
    for w in workers.values():
        del w["records"]
    hooks: dict[str, list] = {}
    for tid, nid in hook_log:
        hooks.setdefault(labels[tid], []).append(nid)
    return {"workers": workers, "prehooks": hooks}


def _canonical(digest: dict, nodes_only: bool = False) -> str:
    return json.dumps({k: [e for e in v["trace"] if not nodes_only or e[0] == "node"]
                       for k, v in sorted(digest["workers"].items())}, sort_keys=True)


def _backward(run: Run) -> None:
    import torch
    if run.backward is not None:
        run.backward()
    else:
        torch.autograd.backward(run.outputs, run.grad_outputs)


def _leaf_grads(run: Run) -> dict:
    return {n: (None if t.grad is None else t.grad.detach().cpu()) for n, t in run.leaves.items()}


def _compare_grads(got: dict, want: dict) -> list[str]:
    import torch
    bad = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        if (g is None) != (w is None) or (g is not None and not torch.allclose(g, w, rtol=1e-5, atol=1e-6)):
            bad.append(name)
    return bad


def record_run(model_fn: Callable[[], Run], repeats: int = 10, *, capture: bool = False,
               prehooks: bool = True, reference_fn: Callable[[], Run] | None = None,
               delay: dict[str, float] | None = None) -> dict:
    """Run ``model_fn`` (a forward, returning a :class:`Run`) and its backward ``repeats`` times.

    Returns a JSON-able dict:

    * ``workers``: per worker label (``caller``, ``pt_autograd_<i>``,
      ``pool<k>``) from the first run: ``order`` ([name, seq] in executed
      order), ``nodes`` (graph ids ``n<i>`` of the nodes; ``GraphRoot``; or
      ``Name@+k`` / ``AccumulateGrad[leaf]`` for nodes built during
      backward), ``trace`` (nodes and event calls in order: ``["node", key,
      graph_task, depth]``, ``["record", device, stream, event]``,
      ``["block", device, stream, event]``, ``["record_stream", device,
      stream]``), ``graph_tasks`` (relative ids, in first-seen order),
      ``max_depth`` (nesting of evaluate_function on that thread),
      ``os_name`` (the thread's OS name);
    * ``static``: ``n<i>`` -> [name, seq, leaf] for the graph as it was
      before the first backward (same ids as ``from_torch``'s document);
      ``static_order``: per worker, the ``n<i>`` it ran, in order;
    * ``prehooks``: per worker, the ``n<i>`` seen by node pre-hooks;
      ``prehooks_agree``: they matched the observer in every run;
    * ``stable``: every run gave the same per-worker traces (nodes and event
      calls); ``stable_order``: the same per-worker node sequences;
      ``distinct``: how many different traces were seen (``variants`` keeps
      them when more than one);
    * ``events``: counts of the backend's hooks over all runs;
    * ``grads_match``: leaf gradients of the first run equal those of
      ``reference_fn`` (same model on the CPU), when given;
    * ``capture``: ``autograd_run.capture.from_torch`` document of the first
      run's graph (``capture=True``);
    * ``delay``: the ``n<i>`` whose worker slept that many seconds in a node
      pre-hook (registered after the capture) before running it, every run.
    """
    import time
    ext = load_backend()
    caller = threading.get_native_id()
    before = ext.counters()
    first, static = None, None
    doc, grads = None, {}
    canon: dict[str, int] = {}
    orders: set[str] = set()
    variants: list[dict] = []
    agree = True
    for r in range(repeats):
        run = model_fn()
        fns, ids, table, lookup, leaf_names = _static_graph(run)
        if r == 0:
            static = table
            if capture:
                from autograd_run.capture import from_torch
                doc = from_torch(run.outputs, grad_outputs=run.grad_outputs, names=run.leaves,
                                 reference=False)
        hook_log, handles = [], []
        unknown = set(delay or {}) - set(ids.values())
        if unknown:
            raise ValueError(f"delay names nodes the graph lacks: {sorted(unknown)}")
        for fn in fns:
            if ids[fn] in (delay or {}):
                handles.append(fn.register_prehook(lambda grads, s=delay[ids[fn]]: time.sleep(s)))
        if prehooks:
            for fn in fns:
                handles.append(fn.register_prehook(
                    lambda grads, nid=ids[fn]: hook_log.append((threading.get_native_id(), nid))))
        ext.take_log()
        ext.set_recording(True)
        try:
            _backward(run)
        finally:
            ext.set_recording(False)
        entries = ext.take_log()
        for h in handles:
            h.remove()
        digest = _digest(entries, hook_log, lookup, leaf_names, caller)
        if prehooks:
            seen = {w: [n for n in v["nodes"] if n in table] for w, v in digest["workers"].items()}
            agree = agree and {w: v for w, v in seen.items() if v} == digest["prehooks"]
        key = _canonical(digest)
        orders.add(_canonical(digest, nodes_only=True))
        if key not in canon:
            canon[key] = r
            variants.append({"first_run": r,
                             "workers": {w: v["trace"] for w, v in digest["workers"].items()}})
        if r == 0:
            first = digest
            grads = _leaf_grads(run)
        del run, fns, ids, handles
    after = ext.counters()
    names = ext.thread_names()
    os_now = _os_threads()
    workers = first["workers"]
    for w in workers.values():
        tid = w.pop("tid")
        w["os_name"] = names.get(tid) or os_now.get(tid)
    out = {
        "repeats": repeats,
        "stable": len(canon) == 1,
        "stable_order": len(orders) == 1,
        "distinct": len(canon),
        "workers": workers,
        "static": static,
        "static_order": {w: [n for n in v["nodes"] if n in static] for w, v in workers.items()},
        "prehooks": first["prehooks"] if prehooks else None,
        "prehooks_agree": agree if prehooks else None,
        "events": {k: after[k] - before[k] for k in after},
        "variants": variants if len(variants) > 1 else [],
        "delay": dict(delay or {}),
    }
    if reference_fn is not None:
        ref = reference_fn()
        _backward(ref)
        bad = _compare_grads(grads, _leaf_grads(ref))
        out["grads_match"] = not bad
        out["grad_mismatches"] = bad
    if capture:
        out["capture"] = doc
    return out


# ---------------------------------------------------------------------------
# Running scenarios, in this process or in a fresh one
# ---------------------------------------------------------------------------

def run_scenarios(names: list[str], repeats: int = 10, capture: bool = False) -> dict:
    """Record the named scenarios (``all`` for every one) in this process."""
    import torch
    torch.set_num_threads(1)
    load_backend()
    from tests.support import oracle_scenarios as sc
    if names == ["all"] or not names:
        names = list(sc.SCENARIOS)
    out = {}
    for name in names:
        if name not in sc.SCENARIOS:
            raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(sc.SCENARIOS)}")
        spec = sc.SCENARIOS[name]
        res = record_run(spec.oracle, repeats=min(repeats, spec.repeats or repeats), capture=capture,
                         reference_fn=spec.reference,
                         delay=spec.delay)
        res["description"] = spec.description
        res["events_race"] = spec.events_race
        res["order_race"] = spec.order_race
        out[name] = res
    return out


def scenario_orders(names: list[str] | None = None, repeats: int = 10) -> dict:
    """For each scenario (recorded in a fresh process): PyTorch's per-worker order and its graph.

    See :func:`orders_of` for the form.
    """
    return orders_of(run_oracle(names, repeats=repeats, capture=True))


def orders_of(results: dict) -> dict:
    """``{scenario: {"workers": {worker: [[name, seq], ...]}, "static_order": {worker: [n<i>, ...]},
    "nodes": {n<i>: [name, seq, leaf]}, "graph": <from_torch document>, "stable": bool}}``
    from :func:`run_oracle` results (recorded with ``capture=True``). The ``n<i>`` are the node
    ids of the captured document; its devices read ``accel:<i>``.
    """
    return {name: {"workers": {w: v["order"] for w, v in r["workers"].items()},
                   "static_order": r["static_order"], "nodes": r["static"],
                   "graph": r.get("capture"), "stable": r["stable_order"]}
            for name, r in results.items()}


def run_oracle(names: list[str] | None = None, repeats: int = 10, capture: bool = False,
               timeout: float = 900, extra_env: dict | None = None) -> dict:
    """Run scenarios in a fresh Python process (the backend must load before any backward).

    Returns ``{scenario: result}`` (see :func:`record_run`). Raises
    :class:`OracleUnavailable` when the oracle cannot be built there.
    """
    import tempfile
    problem = toolchain_problem()
    if problem:
        raise OracleUnavailable(problem)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "oracle.json")
        cmd = [sys.executable, "-m", "tests.support.pt_oracle", *(names or ["all"]),
               "--repeats", str(repeats), "--out", out]
        if capture:
            cmd.append("--capture")
        proc = subprocess.run(cmd, cwd=str(REPO_ROOT), env=env, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode == EXIT_UNAVAILABLE:
            raise OracleUnavailable(proc.stdout.strip() or proc.stderr.strip())
        if proc.returncode != 0:
            raise RuntimeError(f"oracle process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.pt_oracle",
                                description="Record PyTorch's autograd Engine on two accel devices.")
    p.add_argument("scenarios", nargs="*", default=["all"], help="scenario names, or 'all'")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--capture", action="store_true", help="include from_torch's document of each graph")
    p.add_argument("--out", help="write the JSON here instead of stdout")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.add_argument("--verbose-build", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        from tests.support import oracle_scenarios as sc
        for name, spec in sc.SCENARIOS.items():
            print(f"{name:14s} {spec.description}")
        return 0
    try:
        if args.verbose_build:
            load_backend(verbose=True)
        result = run_scenarios(args.scenarios, repeats=args.repeats, capture=args.capture)
    except OracleUnavailable as exc:
        print(json.dumps({"unavailable": str(exc)}))
        return EXIT_UNAVAILABLE
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    # Run through the importable module, so the scenarios (which import
    # tests.support.pt_oracle) share its loaded backend.
    from tests.support import pt_oracle
    code = pt_oracle.main()
    # Leave without the interpreter's and libtorch's static destructors: with the Engine's device threads
    # still alive, they can abort the process after its results are written ("terminate called without an
    # active exception", SIGABRT, seen once in CI). The output file is written and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
