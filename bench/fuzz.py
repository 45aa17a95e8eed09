"""Structure-aware fuzzer for graph files: hostile variants of real graphs through ``validate`` and ``run``.

Not run in CI (``tests/test_fuzz.py`` runs a small batch)::

    python -m bench.fuzz                      # 10,000 cases, seed 0, 2 workers
    python -m bench.fuzz --cases 500 --seed 7 --workers 2 --out fuzz-out

Seeds are the shipped examples (``autograd_run/graphs/examples``), small
generated graphs (``generators.generate``) and generated graphs whose saved
tensors live in an ``.npz`` side file. Each case applies one to three
mutations: a field replaced with a hostile value (huge, negative, NaN,
strings, unicode and control characters, deeply nested lists, null), keys
deleted or added (control characters, escapes of existing keys), nodes or edges dropped or duplicated, edges retargeted, devices
and saved values swapped for wrong kinds, side-file names and npz members
corrupted (flipped bytes, truncation, pickled/string/structured members,
headers that lie), and text-level damage (duplicate keys, truncation,
flipped bytes, a BOM). The case is written as JSON or YAML with its side
file into a case folder.

Cases run in a few long-lived worker processes (spawned once, the CLI
imported once), each under ``RLIMIT_AS`` (``--mem``); the parent kills a
worker that runs past ``--timeout`` CPU seconds on a case, or four times
that in wall time (a hang), and starts a fresh one. Each case runs
``validate FILE`` and ``FILE --no-summary`` (run) through the CLI's
``main`` with stdout/stderr captured. Reported, with the
reproducing case copied under ``--out``:

* traceback: an exception escaped the CLI (or a ``Traceback`` was printed);
* hang: the case ran past the time limit;
* breach: ``MemoryError`` (the address-space limit was hit), or the worker died;
* message: exit 2 without exactly one ``Error: FILE: ...`` line;
* miss (counted, a few saved): ``validate`` accepted what ``run`` then failed on
  (graphs with ``attrs.fail`` excepted: they fail on purpose);
* split (a few saved): ``validate`` refused what ``run`` did not refuse with exit 2.

Prints the counts of exit codes (validate, run) and every problem.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from multiprocessing.connection import wait

import numpy as np
import yaml

# -- seeds -------------------------------------------------------------------------------------------


def seed_graphs() -> list[tuple[dict, dict | None]]:
    """(document, npz members or None) to mutate."""
    from importlib import resources

    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import example_names
    out: list[tuple[dict, dict | None]] = []
    folder = resources.files("autograd_run.graphs").joinpath("examples")
    for name in example_names():
        f = folder.joinpath(name + ".yaml")
        if f.is_file():
            out.append((yaml.safe_load(f.read_bytes()), None))
    for kind, kw in [("chain", dict(n=6)), ("chain", dict(n=4, op="add")), ("fanout", dict(width=3)),
                     ("mlp", dict(layers=1, width=3, batch=2)), ("mlp", dict(layers=2, width=4, batch=2, seed=3)),
                     ("transformer", dict(layers=1, heads=2, seq_len=4, dim=8)),
                     ("transformer", dict(layers=1, heads=2, seq_len=4, dim=8, devices=2)),
                     ("random", dict(nodes=12, leaves=4, width=3, seed=1)),
                     ("random", dict(nodes=20, leaves=5, width=2, seed=2))]:
        out.append((generate(kind, **kw), None))
    for kind, kw in [("mlp", dict(layers=1, width=3, batch=2, seed=5)), ("chain", dict(n=5, seed=2))]:
        out.append(_to_npz(generate(kind, **kw)))
    out += [(captured_seed(), None)] * 4  # drawn as often as four seeds: it has the most sections
    return out


def captured_seed() -> dict:
    """A small model captured from PyTorch, with every section a capture can write: ``meta.reference``,
    ``storage``, ``parameters``, ``ddp``, ``fsdp`` and held hooks on a leaf and on a node's slot (the
    sections ``check``, ``simulate --ddp/--fsdp captured`` and the memory model read)."""
    import torch

    from autograd_run.capture import from_torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    doc = from_torch(m(torch.randn(2, 3, dtype=torch.float64)).sum(), names=dict(m.named_parameters()))
    names = [n for n, _ in m.named_parameters()]
    doc["parameters"] = names
    doc["ddp"] = {"bucket_cap_mb": 0.0001, "find_unused_parameters": False, "world_size": 2}
    doc["fsdp"] = {"units": [{"name": "0", "parameters": names[:2], "backward_prefetch": ["2"]},
                             {"name": "2", "parameters": names[2:]}], "root": "2", "world_size": 2}
    doc["variables"][0]["hooks"] = [{"kind": "scale", "by": 0.5}]
    relu = next(n for n in doc["nodes"] if n["name"] == "ReluBackward0")
    relu.setdefault("attrs", {})["hooks"] = [{"kind": "clamp", "min": -1.0, "slot": 0}]
    return doc


def _to_npz(doc: dict) -> tuple[dict, dict]:
    """Move a generated graph's saved tensors (random specs) and root gradients into npz members."""
    from autograd_run.graphs.tensors import SideFiles, materialize
    members = {}
    side = SideFiles(None, None)
    for node in doc["nodes"]:
        for key, value in list(node.get("saved", {}).items()):
            if isinstance(value, dict) and "random" in value:
                name = f"{node['id']}.{key}"
                members[name] = materialize(value, side)
                node["saved"][key] = {"npz": name}
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and key == "other":
                members[f"{node['id']}.{key}"] = np.array(value, dtype=np.float32)
                node["saved"][key] = {"npz": f"{node['id']}.{key}"}
    return doc, members


# -- hostile values ------------------------------------------------------------------------------------

def _deep(depth: int):
    v: object = 1.0
    for _ in range(depth):
        v = [v]
    return v


HOSTILE = [
    None, True, False, 0, -1, 1, 3, 2**31, 2**31 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63 - 1,
    10**30, -10**30, 1e308, -0.0, 0.5, float("nan"), float("inf"), float("-inf"), 1e-3,
    "", "x", "1e-3", "ones", "zeros", "cpu", "cuda", "cuda:0", "cuda:1000", "xpu:1", "meta", "CUDA:0",
    "\x00", "a\x00b", "\u202e\u0000\n\r\t", "é🙂", "A" * 300, "../../etc/passwd", "/dev/zero", "x.npz",
    "AccumulateGrad", "GraphRoot", "python", "opaque", "cost", "MulBackward0", "torch::autograd::AccumulateGrad",
    [], {}, [[]], [[[]]], [1, "a"], [None], [-1], [2**31, 2**31], [10**30], list(range(17)), [1.5],
    [[1, 2], [3]], [True, False], ["x", 0],
    {"random": 1, "shape": [2**31]}, {"random": 1, "shape": [2**20, 2**11]}, {"random": -1, "shape": [2]},
    {"random": 2**63, "shape": [1]}, {"random": 1}, {"random": 1, "shape": [2], "dist": "cauchy"},
    {"random": 1, "shape": [1 << 25], "dtype": "float64"}, {"random": 1, "shape": [1 << 20, 1]},
    {"data": "x"}, {"data": [1, 2], "shape": [3]}, {"data": [[1], [2, 3]]}, {"data": [1], "dtype": "object"},
    {"npz": "../x"}, {"npz": "x", "file": ""}, {"npz": "x", "file": "/etc/passwd.npz"}, {"npz": 3},
    {"npz": "x", "file": "a\x00.npz"}, {"npz": "nope"}, {"data": [1], "npz": "x"},
    {"us": 1e12}, {"flops": 1e30, "mode": "matmul"}, {"us": 10, "mode": "warp"},
    {"format": "autograd-graph/1"}, {"traceEvents": []},
]


def hostile(rng: random.Random):
    r = rng.random()
    if r < 0.05:
        return _deep(rng.choice([20, 70, 300, 2000]))
    if r < 0.08:
        return [rng.randint(-5, 5) for _ in range(rng.choice([100, 5000]))]
    if r < 0.12:
        return "".join(chr(rng.choice([0, 7, 10, 13, 0x202E, 0xFEFF, 0xD7FF, 0x10FFFF, 65, 58, 34, 92]))
                       for _ in range(rng.randint(1, 12)))
    if r < 0.2:
        return rng.choice([rng.randint(-2**70, 2**70), rng.uniform(-1e9, 1e9), rng.randint(-3, 3)])
    return copy.deepcopy(rng.choice(HOSTILE))


# -- mutations ------------------------------------------------------------------------------------------

def _paths(obj, max_depth: int = 24):
    """Every path into ``obj`` (iteratively; not below ``max_depth``: hostile values nest deep)."""
    stack = [(obj, ())]
    while stack:
        o, prefix = stack.pop()
        yield prefix
        if len(prefix) >= max_depth:
            continue
        if isinstance(o, dict):
            stack.extend((v, prefix + (k,)) for k, v in o.items())
        elif isinstance(o, list):
            stack.extend((v, prefix + (i,)) for i, v in enumerate(o))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def m_replace(rng, doc, npz):
    paths = [p for p in _paths(doc) if p]
    path = rng.choice(paths)
    _get(doc, path[:-1])[path[-1]] = hostile(rng)
    return f"replace {path}"


def m_delete(rng, doc, npz):
    paths = [p for p in _paths(doc) if p and isinstance(_get(doc, p[:-1]), dict)]
    path = rng.choice(paths)
    del _get(doc, path[:-1])[path[-1]]
    return f"delete {path}"


def _nodes(doc):
    nodes = doc.get("nodes")
    return nodes if isinstance(nodes, list) and nodes else None


def m_key(rng, doc, npz):
    """A hostile key in some mapping: control characters, unicode, an escaped duplicate, a long one."""
    dicts = [p for p in _paths(doc) if isinstance(_get(doc, p), dict)]
    d = _get(doc, rng.choice(dicts))
    key = rng.choice(["a\nTraceback (most recent call last):", "\x00", "\u202e", "", " ", "k" * 500,
                      "id\r", "é🙂", "$.nodes[0]", "__proto__"] + list(d)[:3])
    d[key] = hostile(rng)
    return f"key {key[:20]!r}"


def m_nodes(rng, doc, npz):
    nodes = _nodes(doc)
    if nodes is None:
        return m_replace(rng, doc, npz)
    i = rng.randrange(len(nodes))
    how = rng.choice(["drop", "dup", "dup_id", "swap"])
    if how == "drop":
        del nodes[i]
    elif how == "dup":
        nodes.insert(rng.randrange(len(nodes) + 1), copy.deepcopy(nodes[i]))
    elif how == "dup_id" and isinstance(nodes[i], dict):
        other = nodes[rng.randrange(len(nodes))]
        nodes[i]["id"] = other.get("id") if isinstance(other, dict) else "x"
    else:
        j = rng.randrange(len(nodes))
        nodes[i], nodes[j] = nodes[j], nodes[i]
    return f"nodes {how} {i}"


def m_edges(rng, doc, npz):
    nodes = _nodes(doc)
    if nodes is None:
        return m_replace(rng, doc, npz)
    with_next = [n for n in nodes if isinstance(n, dict) and isinstance(n.get("next"), list) and n["next"]]
    if not with_next:
        return m_nodes(rng, doc, npz)
    n = rng.choice(with_next)
    k = rng.randrange(len(n["next"]))
    how = rng.choice(["drop", "dup", "retarget", "nr", "null", "self"])
    if how == "drop":
        del n["next"][k]
    elif how == "dup":
        n["next"].append(copy.deepcopy(n["next"][k]))
    elif how == "retarget":
        t = rng.choice(nodes)
        n["next"][k] = [t.get("id") if isinstance(t, dict) else "x", rng.choice([0, 0, 1, 5, -1])]
    elif how == "nr":
        n["next"][k] = [n["next"][k][0] if isinstance(n["next"][k], list) and n["next"][k] else "x",
                        rng.choice([1, 2, -1, 2**64, 0.0, "0", None])]
    elif how == "null":
        n["next"][k] = None
    else:
        n["next"][k] = [n.get("id"), 0]
    return f"edges {how}"


def m_saved(rng, doc, npz):
    """A saved value of the wrong kind (or a missing one) on a node that has saved values."""
    nodes = [n for n in (_nodes(doc) or []) if isinstance(n, dict) and isinstance(n.get("saved"), dict) and n["saved"]]
    if not nodes:
        return m_replace(rng, doc, npz)
    n = rng.choice(nodes)
    key = rng.choice(list(n["saved"]))
    if rng.random() < 0.2:
        del n["saved"][key]
        return f"saved delete {key}"
    n["saved"][key] = hostile(rng)
    return f"saved {n.get('id')}.{key}"


def m_device(rng, doc, npz):
    metas = [m for n in (_nodes(doc) or []) if isinstance(n, dict) and isinstance(n.get("inputs"), list)
             for m in n["inputs"] if isinstance(m, dict)]
    metas += [v for v in doc.get("variables") or [] if isinstance(v, dict)]
    if not metas:
        return m_replace(rng, doc, npz)
    m = rng.choice(metas)
    m["device"] = rng.choice(["cuda:1000", "cuda:255", "xpu:0", "mps", "accel:1", "meta", "cpu:0", "CUDA:0",
                              "cuda:01", "cuda:-1", "", "tpu:0", "cuda:0:0", 0, None, "privateuseone:3"])
    if rng.random() < 0.3:
        m["stream"] = rng.choice([-1, 1, 2**16, 2**64, "1"])
    return "device"


def m_shape(rng, doc, npz):
    metas = [m for n in (_nodes(doc) or []) if isinstance(n, dict) and isinstance(n.get("inputs"), list)
             for m in n["inputs"] if isinstance(m, dict)]
    if not metas:
        return m_replace(rng, doc, npz)
    rng.choice(metas)["shape"] = rng.choice([[], [0], [1 << 28], [1 << 31], [1 << 16, 1 << 16], [-1], [3], [2, 2],
                                             [1] * 17, ["2"], [2.0], None])
    return "shape"


def m_npz_ref(rng, doc, npz):
    """Point a tensor value at the side file, with a hostile key or file name."""
    spec = {"npz": rng.choice(list(npz) if npz else ["x"]) if rng.random() < 0.6 else hostile(rng)}
    if rng.random() < 0.4:
        spec["file"] = rng.choice(["", "g.npz", "../g.npz", "/tmp/g.npz", "g\x00.npz", "sub/../g.npz", "g.txt",
                                   "G.NPZ", 0, None, "./g.npz", "g.npz/"])
    nodes = [n for n in (_nodes(doc) or []) if isinstance(n, dict)]
    if nodes and rng.random() < 0.6:
        n = rng.choice(nodes)
        if not isinstance(n.get("saved"), dict):
            n["saved"] = {}
        n["saved"][rng.choice(["other", "self", "result", "extra"])] = spec
    elif isinstance(doc.get("roots"), list) and doc["roots"] and isinstance(doc["roots"][0], dict):
        doc["roots"][0]["grad"] = spec
    return "npz ref"


MUTATORS = [(m_replace, 6), (m_delete, 2), (m_nodes, 2), (m_edges, 2), (m_saved, 4), (m_device, 1),
            (m_shape, 1), (m_npz_ref, 1), (m_key, 1)]


def npy_bytes(arr: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, arr, allow_pickle=True)
    return b.getvalue()


def npz_corrupt(rng, members: dict) -> tuple[dict, str]:
    """Members as raw ``.npy`` bytes (name -> bytes), some corrupted."""
    raw = {f"{k}.npy": npy_bytes(v) for k, v in members.items()}
    if not raw:
        return raw, ""
    name = rng.choice(list(raw))
    how = rng.choice(["flip", "truncate", "object", "string", "structured", "lie", "drop", "extra", "huge", "notnpy"])
    b = bytearray(raw[name])
    if how == "flip":
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        raw[name] = bytes(b)
    elif how == "truncate":
        raw[name] = bytes(b[: rng.randrange(len(b))])
    elif how == "object":
        raw[name] = npy_bytes(np.array([{"a": 1}, None], dtype=object))
    elif how == "string":
        raw[name] = npy_bytes(np.array(["abc", "de"]))
    elif how == "structured":
        raw[name] = npy_bytes(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i8")]))
    elif how == "lie":
        h = io.BytesIO()
        np.lib.format.write_array_header_1_0(h, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (rng.choice([1 << 20, 1 << 31, 1 << 40, 7]),)})
        raw[name] = h.getvalue() + bytes(32)
    elif how == "drop":
        del raw[name]
    elif how == "extra":
        raw[name] = bytes(b) + b"trailing"
    elif how == "huge":
        h = io.BytesIO()
        np.lib.format.write_array_header_2_0(h, {"descr": "<f8", "fortran_order": False, "shape": (1 << 22,)})
        raw[name] = h.getvalue() + bytes(1 << 22 << 3)  # a real 32 MiB member (of the wrong shape, mostly)
    else:
        raw[name] = b"\x93NUMPY\x01\x00" + b"garbage" * 3
    return raw, f"npz {how} {name}"


def make_case(rng: random.Random, seeds, folder: str) -> dict:
    """Write one mutated case into ``folder``; return its description."""
    doc, members = copy.deepcopy(rng.choice(seeds))
    steps = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        fn = rng.choices([m for m, _ in MUTATORS], [w for _, w in MUTATORS])[0]
        try:
            steps.append(fn(rng, doc, members))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError, RecursionError):
            steps.append(f"{fn.__name__} (skipped)")
    fmt = rng.choice(["json", "json", "yaml"])
    try:
        if fmt == "json":
            data = json.dumps(doc, allow_nan=True).encode()
        else:
            data = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100).encode()
    except (ValueError, RecursionError, yaml.YAMLError):
        data = json.dumps({"format": "autograd-graph/1", "nodes": [], "roots": []}).encode()
        steps.append("unserialisable: empty graph")
    r = rng.random()
    if r < 0.03:
        data = data[: rng.randrange(len(data) + 1)]
        steps.append("truncate")
    elif r < 0.06:
        data = bytearray(data)
        data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data)
        steps.append("flip byte")
    elif r < 0.09 and fmt == "json":
        at = data.find(b'"id":')
        if at > 0:
            data = data[:at] + b'"id": "dup", ' + data[at:]
            steps.append("duplicate key")
    elif r < 0.1:
        data = b"\xef\xbb\xbf" + data
        steps.append("bom")
    name = "g." + fmt
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    if members is not None:
        raw = {f"{k}.npy": npy_bytes(v) for k, v in members.items()}
        if rng.random() < 0.5:
            raw, how = npz_corrupt(rng, members)
            steps.append(how)
        kind = zipfile.ZIP_DEFLATED if rng.random() < 0.5 else zipfile.ZIP_STORED
        with zipfile.ZipFile(os.path.join(folder, "g.npz"), "w", kind) as z:
            for k, v in raw.items():
                z.writestr(k, v)
        if rng.random() < 0.05:
            with open(os.path.join(folder, "g.npz"), "r+b") as f:
                size = os.path.getsize(f.name)
                f.truncate(rng.randrange(size))
            steps.append("npz truncated")
    # Graphs that fail on purpose (attrs.fail, the shipped example:failing) are not validate misses.
    injected = any(isinstance(n, dict) and isinstance(n.get("attrs"), dict) and "fail" in n["attrs"]
                   for n in (_nodes(doc) or []))
    parallel = isinstance(doc, dict) and "fsdp" in doc
    return {"file": name, "steps": steps, "injected": injected, "parallel": parallel}


# -- workers ---------------------------------------------------------------------------------------------

#: run's Error line when the process cannot start a device's worker thread (its stack would pass RLIMIT_AS)
_AT_LIMIT = re.compile(r"^Error: cannot start the worker thread of device .*limit of threads or memory", re.M)
_MEMORY = re.compile(r"(^|: )(_Array)?MemoryError\b|Unable to allocate", re.M)


def _invoke(cli_main, argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    rc, tb, memory = None, None, False
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main(argv)
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except MemoryError:
            memory = True
            tb = traceback.format_exc()
        except BaseException:  # noqa: BLE001 - exactly what the fuzzer looks for
            tb = traceback.format_exc()
    e = err.getvalue()
    lines = e.splitlines()
    if tb is None and any(line.startswith("Traceback (most recent call last)") for line in lines):
        tb = e
    if any(_MEMORY.search(line) for line in lines) or (tb and _MEMORY.search(tb)):
        memory = True  # raised, or caught by the engine and reported as a node's error
    return {"rc": rc, "err": e[-3000:], "tb": tb, "memory": memory}


def worker_main(conn, mem: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mem:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    from autograd_run.cli.main import main as cli_main
    import autograd_run.engine.run  # noqa: F401 - warm imports
    import autograd_run.graphs.load  # noqa: F401
    while True:
        msg = conn.recv()
        if msg is None:
            return
        folder, name, parallel = msg
        os.chdir(folder)
        res = {"validate": _invoke(cli_main, ["validate", name]),
               "run": _invoke(cli_main, [name, "--no-summary"]),
               "simulate": _invoke(cli_main, ["simulate", name, "--no-summary"])}
        if parallel:  # the sections only a captured graph has: what reads them
            net = ["--world", "2", "--network", "alpha_us=5,gbps=10", "--no-summary"]
            res["simulate --ddp"] = _invoke(cli_main, ["simulate", name, "--ddp", "captured", *net])
            res["simulate --fsdp"] = _invoke(cli_main, ["simulate", name, "--fsdp", "captured", *net])
            res["check"] = _invoke(cli_main, ["check", name])
        os.chdir("/")
        conn.send(res)


class Worker:
    def __init__(self, ctx, mem: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, mem), daemon=True)
        self.proc.start()
        child.close()
        self.case = None
        self.started = 0.0
        self.cpu_start = 0.0

    def cpu(self) -> float:
        """CPU seconds the worker has used (all its threads), from /proc; 0 where unavailable."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


# -- the run -----------------------------------------------------------------------------------------------

def run_fuzz(cases: int = 10_000, seed: int = 0, workers: int = 2, timeout: float = 20.0, mem: int = 3 << 30,
             out: str | None = "fuzz-out", quiet: bool = False, keep_misses: int = 20,
             wall_factor: float = 4.0) -> dict:
    """Run ``cases`` cases; a case is a hang past ``timeout`` CPU seconds (its worker's), or past
    ``wall_factor * timeout`` wall seconds (a blocked worker uses no CPU; a busy machine slows all)."""
    rng = random.Random(seed)
    seeds = seed_graphs()
    ctx = mp.get_context("spawn")  # clean workers: a parent that loaded torch has gigabytes mapped
    tmp = tempfile.mkdtemp(prefix="autograd-fuzz-")
    pool = [Worker(ctx, mem) for _ in range(workers)]
    codes: Counter = Counter()
    problems: dict[str, list] = {"traceback": [], "hang": [], "breach": [], "message": []}
    misses: list = []
    splits: list = []  # validate refused (2), run did not: python nodes (run refuses those with exit 1)
    miss_count = 0
    limit_count = 0  # run stopped, with its Error line, at the worker's RLIMIT_AS (--mem): the harness's limit
    t0 = time.monotonic()
    next_case = 0
    done = 0

    def keep(kind: str, case: dict, detail: str) -> None:
        entry = {"case": case["id"], "steps": case["steps"], "detail": detail[-3000:]}
        if out:
            dst = os.path.join(out, kind, f"case-{case['id']}")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(case["folder"], dst)
            with open(os.path.join(dst, "case.json"), "w") as f:
                json.dump(entry, f, indent=1)
            entry["saved"] = dst
        if kind == "miss":
            misses.append(entry)
        elif kind == "split":
            splits.append(entry)
        else:
            problems[kind].append(entry)
        if not quiet and kind not in ("miss", "split"):
            print(f"  {kind}: case {case['id']} {case['steps']}: {detail.strip().splitlines()[-1][:200]}", flush=True)

    def check(case: dict, res: dict) -> None:
        nonlocal miss_count, limit_count
        v, r = res["validate"], res["run"]
        codes[(v["rc"], r["rc"])] += 1
        for cmd, x in res.items():
            if x["memory"]:
                keep("breach", case, f"{cmd}: MemoryError\n{x['tb'] or x['err']}")
            elif x["tb"]:
                keep("traceback", case, f"{cmd}:\n{x['tb']}")
            elif x["rc"] == 2:
                errors = [line for line in x["err"].splitlines() if line.startswith("Error:")]
                if len(errors) != 1 or not errors[0].startswith(f"Error: {case['file']}: "):
                    keep("message", case, f"{cmd}: {x['err']}")
        if v["rc"] == 0 and r["rc"] == 1 and _AT_LIMIT.search(r["err"]):
            limit_count += 1  # (a device's worker thread under --mem: 256 devices' stacks; not validate's to know)
        elif v["rc"] == 0 and r["rc"] not in (0, None) and not case["injected"]:
            miss_count += 1
            if len(misses) < keep_misses:
                keep("miss", case, f"run rc={r['rc']}: {r['err']}")
        if v["rc"] == 2 and r["rc"] != 2 and len(splits) < keep_misses:
            keep("split", case, f"validate: {v['err']}\nrun rc={r['rc']}: {r['err']}")

    def assign(w: Worker) -> None:
        nonlocal next_case
        folder = os.path.join(tmp, f"case-{next_case}")
        os.makedirs(folder)
        desc = make_case(rng, seeds, folder)
        w.case = {"id": next_case, "folder": folder, **desc}
        w.started = time.monotonic()
        w.cpu_start = w.cpu()
        w.conn.send((folder, desc["file"], desc["parallel"]))
        next_case += 1

    try:
        for w in pool:
            if next_case < cases:
                assign(w)
        while done < cases:
            busy = [w for w in pool if w.case is not None]
            ready = wait([w.conn for w in busy], timeout=0.2)
            for i, w in enumerate(pool):
                if w.case is None:
                    continue
                replace = False
                if w.conn in ready:
                    try:
                        res = w.conn.recv()
                    except (EOFError, OSError):
                        code = w.proc.exitcode
                        keep("breach", w.case, f"the worker died (exit {code}, e.g. killed for memory)")
                        codes[("died", "died")] += 1
                        replace = True
                    else:
                        check(w.case, res)
                        replace = any(x["memory"] for x in res.values())
                elif (w.cpu() - w.cpu_start > timeout or
                      time.monotonic() - w.started > wall_factor * timeout):
                    keep("hang", w.case, f"no result after {w.cpu() - w.cpu_start:.1f} s of CPU, "
                                         f"{time.monotonic() - w.started:.1f} s of wall time")
                    codes[("hang", "hang")] += 1
                    replace = True
                else:
                    continue
                shutil.rmtree(w.case["folder"], ignore_errors=True)
                w.case = None
                done += 1
                if replace:
                    w.kill()
                    pool[i] = w = Worker(ctx, mem)
                if next_case < cases:
                    assign(w)
            if not quiet and done and done % 1000 == 0 and ready:
                print(f"{done} cases, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        for w in pool:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.proc.join(2)
            if w.proc.is_alive():
                w.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {"cases": cases, "seed": seed, "seconds": round(time.monotonic() - t0, 1),
               "exit_codes": {f"validate {a} / run {b}": n for (a, b), n in sorted(codes.items(), key=str)},
               **{k: v for k, v in problems.items()}, "misses": miss_count, "miss_examples": misses,
               "at_limit": limit_count,
               "split_examples": splits}
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0,
                    help="CPU seconds per case (validate + run); 4x that in wall time")
    ap.add_argument("--mem", type=int, default=3 << 30, help="address-space limit per worker, bytes")
    ap.add_argument("--out", default="fuzz-out", help="folder for reproducing cases")
    args = ap.parse_args(argv)
    s = run_fuzz(args.cases, args.seed, args.workers, args.timeout, args.mem, args.out)
    print(f"\n{s['cases']} cases in {s['seconds']} s (seed {s['seed']})")
    print("exit codes (validate / run):")
    for k, n in s["exit_codes"].items():
        print(f"  {k}: {n}")
    for kind in ("traceback", "hang", "breach", "message"):
        print(f"{kind}s: {len(s[kind])}")
        for e in s[kind]:
            print(f"  case {e['case']} {e['steps']} -> {e.get('saved', '')}\n    {e['detail'].strip().splitlines()[-1][:300]}")
    print(f"validate accepted, run failed: {s['misses']} (examples under {args.out}/miss)")
    print(f"run stopped at the workers' address-space limit (--mem), with its Error line: {s['at_limit']}")
    return 1 if any(s[k] for k in ("traceback", "hang", "breach", "message")) else 0


if __name__ == "__main__":
    sys.exit(main())
