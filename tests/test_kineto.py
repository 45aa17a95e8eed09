"""The Kineto trace writer (``traces.kineto``), the streams analysis it is checked against (``analysis.streams``),
and reading the trace back (``diff``, ``simulate --costs``). The real Holistic Trace Analysis reads the same
traces in ``test_hta``; here the trace's structure is held to what Kineto writes and HTA relies on, and the
stream figures to hand-computed values."""

from __future__ import annotations

import gzip
import json
import os
import re

import pytest

from autograd_run.analysis.streams import streams_of
from autograd_run.record.recording import KernelSlice, NodeSlice, Recording, StreamEvent, ThreadInfo
from autograd_run.engine.threads import ThreadKind
from autograd_run.traces.kineto import CPU_PID, EVALUATE, STREAM_BASE, write_kineto_trace
from autograd_run.traces.read_profile import read_profile
from cli_proc import cli
from kineto_graphs import mlp_graph, simulated


def _load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def streams_report():
    return simulated(mlp_graph(streams=True))


@pytest.fixture(scope="module")
def two_gpus():
    return simulated(mlp_graph(), devices=2)


def test_rank_is_the_first_rank_pattern_in_the_text(tmp_path, streams_report):
    # HTA scans the raw text for '"rank":\s+(\d+)' and takes the first match
    for rank in (0, 3):
        p = str(tmp_path / f"r{rank}.kineto.json")
        write_kineto_trace(p, streams_report.recording, rank=rank, world=4)
        text = open(p).read()
        assert int(re.search(r'"rank":\s+(\d+)', text).group(1)) == rank
        doc = json.loads(text)
        assert doc["distributedInfo"] == {"rank": rank, "world_size": 4, "backend": "nccl"}
        assert doc["schemaVersion"] == 1 and doc["autogradRun"]["simulated"] is True
        assert doc["baseTimeNanoseconds"] == 0


def test_kernels_launches_and_flows_are_joined_as_kineto_joins_them(tmp_path, streams_report):
    p = str(tmp_path / "s.kineto.json")
    write_kineto_trace(p, streams_report.recording)
    ev = _load(p)["traceEvents"]
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"
                and e["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync")}
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")]
    rec = streams_report.recording
    assert len(ops) == len(rec.slices) and len(gpu) == len(rec.kernels) > 0
    assert all(e["name"].startswith(EVALUATE) and e["pid"] == CPU_PID for e in ops)
    # HTA reads an event's stream and device from its args: CPU events carry neither
    assert not any("stream" in e["args"] or "device" in e["args"] for e in ops)
    by_ext = {e["args"]["External id"]: e for e in ops}
    flows = {}
    for e in ev:
        if e.get("cat") == "ac2g":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    for k in gpu:
        a = k["args"]
        launch = launches[a["correlation"]]
        op = by_ext[a["External id"]]
        assert launch["args"]["External id"] == a["External id"]
        assert op["args"]["node"] == a["node"]
        # the launch is inside its node's span, on its thread, and before its kernel
        assert op["tid"] == launch["tid"] and op["ts"] <= launch["ts"]
        assert launch["ts"] + launch["dur"] <= op["ts"] + op["dur"] + 1e-6
        assert launch["ts"] + launch["dur"] <= k["ts"] + 1e-6
        assert k["pid"] == a["device"] and k["tid"] == a["stream"] >= STREAM_BASE
        f = flows[a["correlation"]]
        assert f["s"]["tid"] == launch["tid"] and f["s"]["ts"] == launch["ts"]
        assert (f["f"]["pid"], f["f"]["tid"], f["f"]["ts"], f["f"]["bp"]) == (k["pid"], k["tid"], k["ts"], "e")
    assert {k["tid"] for k in gpu} == {STREAM_BASE, STREAM_BASE + 1}  # s0 and s1 of cuda:0


def test_cross_stream_waits_name_the_record(tmp_path, streams_report):
    p = str(tmp_path / "s.kineto.json")
    write_kineto_trace(p, streams_report.recording)
    ev = _load(p)["traceEvents"]
    records = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaEventRecord"}
    waits = [e for e in ev if e.get("cat") == "cuda_sync"]
    assert waits and len(waits) == sum(1 for e in streams_report.recording.stream_events if e.action == "wait")
    runtime_waits = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaStreamWaitEvent"}
    for w in waits:
        a = w["args"]
        assert w["name"] == "Stream Wait Event" and a["wait_on_cuda_event_record_corr_id"] in records
        assert a["correlation"] in runtime_waits and a["stream"] == w["tid"] != a["wait_on_stream"]


def test_streams_are_numbered_apart_across_devices(tmp_path, two_gpus):
    p = str(tmp_path / "two.kineto.json")
    write_kineto_trace(p, two_gpus.recording)
    ev = _load(p)["traceEvents"]
    pairs = {(e["pid"], e["tid"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")}
    assert {pid for pid, _ in pairs} == {0, 1}
    assert len({tid for _, tid in pairs}) == len(pairs) == 2  # HTA tells streams apart by number alone
    copies = [e for e in ev if e.get("cat") == "gpu_memcpy"]
    assert copies and all(e["name"] == "Memcpy DtoD (Device -> Device)" for e in copies)
    names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"stream 7 cuda:0/s0", "stream 8 cuda:1/s0"} <= names


def test_a_run_trace_has_a_profiler_step_per_pass_and_reads_back(tmp_path):
    trace = tmp_path / "r.kineto.json"
    r = cli(["run", "example:mlp", "--repeat", "3", "--trace", trace, "--no-summary"])
    assert r.code == 0, r.err
    doc = _load(str(trace))
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    assert [e["name"] for e in steps] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    for e in ops:  # each pass's nodes inside its step
        s = steps[e["args"].get("pass", 0)]
        assert s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1e-6
    assert doc["autogradRun"]["simulated"] is False
    p = read_profile(str(trace))
    assert p.passes == 3 and not p.simulated
    assert sorted(p.nodes) == sorted({e["args"]["node"] for e in ops})


def test_diff_reads_the_kineto_trace_as_the_chrome_one(tmp_path, streams_report):
    from autograd_run.traces.chrome import write_chrome_trace
    k, c = str(tmp_path / "a.kineto.json"), str(tmp_path / "a.json")
    write_kineto_trace(k, streams_report.recording)
    write_chrome_trace(c, streams_report.recording)
    pk, pc = read_profile(k), read_profile(c)
    assert pk.simulated and pc.simulated
    assert pk.order == pc.order
    assert pk.wall_ns == pc.wall_ns and pk.critical_path == pc.critical_path
    assert pk.critical_path_ns == pc.critical_path_ns
    assert {n: s.duration_ns for n, s in pk.nodes.items()} == {n: s.duration_ns for n, s in pc.nodes.items()}
    assert {n: s.queue_wait_ns for n, s in pk.nodes.items()} == {n: s.queue_wait_ns for n, s in pc.nodes.items()}
    assert pk.worker_busy_ns == pc.worker_busy_ns


def test_simulate_costs_from_its_own_kineto_trace_gives_the_same_pass(tmp_path):
    graph = tmp_path / "mlp.json"
    from autograd_run.graphs import generators
    graph.write_text(json.dumps(generators.mlp(layers=4, width=1024, batch=512)))
    trace = tmp_path / "m.kineto.json"
    r = cli(["simulate", graph, "--devices", "1", "--spec", "h100", "--trace", trace, "--json"])
    assert r.code == 0, r.err
    first = json.loads(r.out)
    r2 = cli(["simulate", graph, "--devices", "1", "--spec", "h100", "--costs", trace, "--json"])
    assert r2.code == 0, r2.err
    again = json.loads(r2.out)
    assert "measured by autograd-run's engine" not in r2.err  # a simulation's costs: no engine mismatch
    assert again["measured"]["nodes"] == len(first["summary"]["ops"]) or again["measured"]["nodes"] > 0
    # the kernels come back on their streams and the CPU parts without the engine's per-node time the
    # simulation charged (the header says it): the same pass again
    assert again["streams"]["total"]["busy_ns"] == pytest.approx(first["streams"]["total"]["busy_ns"], rel=0.001)
    assert again["wall_ns"] == pytest.approx(first["wall_ns"], rel=0.001)


def test_streams_hand_computed():
    class N:  # a node: what the analysis reads
        def __init__(self, nid, nxt=()):
            self.id, self.name, self.next = nid, "Op", [(n, 0) for n in nxt]
    b = N("b")
    a = N("a", [b])
    rec = Recording(threads={1: ThreadInfo(1, "cuda:0", ThreadKind.DEVICE, "cuda:0")},
                    slices=[NodeSlice(0, 0, a, 1, 0, 10, None), NodeSlice(0, 0, b, 1, 10, 20, None)],
                    kernels=[KernelSlice("cuda:0/s0", a, 10, 110), KernelSlice("cuda:0/s1", b, 120, 150)],
                    stream_events=[StreamEvent(110, 0, 0, "record", a, "cuda:0/s0", 1),
                                   StreamEvent(20, 0, 0, "wait", b, "cuda:0/s1", 1)],
                    simulated=True, start=0, end=150)
    st = streams_of(rec)
    s0, s1 = st.streams
    assert (s0.busy_ns, s0.span_ns, s0.idle_ns) == (100, 100, 0)
    assert (s1.busy_ns, s1.span_ns, s1.idle_ns) == (30, 30, 0)
    assert (st.total.busy_ns, st.total.span_ns, st.total.idle_ns) == (130, 140, 10)
    # b's kernel waited 10 ns past a's kernel (no event covers the gap), a's kernel waited for its launch at
    # a's end (10), a ran from 0: the path is the 150 ns from a's start to b's kernel's end
    assert st.path_ns == 150 and st.path_gpu_ns == 130 and st.path_cpu_ns == 10
    assert st.overlap is None


def test_collective_overlap_hand_computed():
    from autograd_run.sim.ddp import Collective

    class N:
        def __init__(self, nid):
            self.id, self.name, self.next = nid, "Op", []
    a = N("a")
    rec = Recording(threads={1: ThreadInfo(1, "cuda:0", ThreadKind.DEVICE, "cuda:0")},
                    slices=[NodeSlice(0, 0, a, 1, 0, 10, None)],
                    kernels=[KernelSlice("cuda:0/s0", a, 10, 110)], simulated=True, start=0, end=110)
    comm = [KernelSlice("DDP communication, rank 0", Collective("x", "x", "all_reduce", 1024), 60, 160)]
    st = streams_of(rec, comm)
    assert st.comm_ns == 100 and st.hidden_ns == 50 and st.overlap == 0.5


def test_ddp_gradients_are_ready_when_their_kernels_end(tmp_path):
    # on a GPU the all-reduce waits for the compute stream: the DDP model's overlap is the streams' one
    graph = tmp_path / "mlp.json"
    from autograd_run.graphs import generators
    graph.write_text(json.dumps(generators.mlp(layers=4, width=1024, batch=512)))
    r = cli(["simulate", graph, "--devices", "1", "--spec", "h100", "--ddp", "bucket_cap_mb=4", "--world", "4",
             "--network", "alpha_us=10,gbps=50", "--json"])
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    ddp, st = doc["ddp"], doc["streams"]
    assert st["overlap"] is not None
    assert ddp["overlap"] == pytest.approx(st["overlap"], abs=0.01)
    kernels_end = doc["wall_ns"]
    assert ddp["compute_ns"] >= 0.99 * kernels_end  # the compute ends with the last kernel, not the CPU's end


def test_a_folder_gets_one_trace_per_rank(tmp_path):
    graph = tmp_path / "mlp.json"
    from autograd_run.graphs import generators
    graph.write_text(json.dumps(generators.mlp(layers=2, width=256, batch=64)))
    out = tmp_path / "ranks"
    args = ["simulate", graph, "--devices", "1", "--spec", "h100", "--ddp", "defaults", "--world", "16",
            "--network", "alpha_us=10,gbps=50", "--no-summary"]
    r = cli(args + ["--trace", str(out) + "/"])
    assert r.code == 0, r.err
    files = sorted(os.listdir(out))
    assert files == [f"rank-{k}.kineto.json" for k in range(8)]  # every rank up to 8 unless asked
    for k, f in enumerate(files):
        doc = _load(str(out / f))
        assert doc["distributedInfo"]["rank"] == k and doc["distributedInfo"]["world_size"] == 16
        nccl = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")]
        assert nccl and all(e["args"]["Collective name"] == "allreduce" and e["args"]["Group size"] == 16
                            and e["args"]["In msg nelems"] > 0 for e in nccl)
    r = cli(args + ["--trace", str(out), "--trace-ranks", "2"])  # an existing folder
    assert r.code == 0, r.err
    assert "2 ranks" in r.out


def test_rank_traces_are_not_written_into_the_costs_folder(tmp_path):
    """`--costs DIR --trace DIR/` overwrote the folder's profiles with the simulated rank traces (found by a
    hostile review): the folder is an input of the run, its files too."""
    import hashlib
    folder = tmp_path / "profs"
    folder.mkdir()
    args = ["simulate", "example:mlp", "--ddp", "defaults", "--world", "2", "--network", "alpha_us=10,gbps=50",
            "--no-summary"]
    r = cli(args + ["--trace", str(tmp_path / "made") + "/"])
    assert r.code == 0, r.err
    os.replace(tmp_path / "made" / "rank-0.kineto.json", folder / "rank-0.kineto.json")
    before = hashlib.sha1((folder / "rank-0.kineto.json").read_bytes()).hexdigest()
    for out in (str(folder) + "/", str(folder), str(tmp_path / "." / "profs") + "/"):
        r = cli(args + ["--costs", str(folder), "--trace", out])
        assert r.code == 2 and "is the --costs folder, an input of this run" in r.err, r.err
    assert hashlib.sha1((folder / "rank-0.kineto.json").read_bytes()).hexdigest() == before
    assert os.listdir(folder) == ["rank-0.kineto.json"]


def test_each_collective_has_a_flow_from_the_node_that_launched_it(tmp_path):
    """As the JSON and protobuf traces: a flow from the launching node's slice (the AccumulateGrad whose hook
    made the bucket ready) to the collective's record_param_comms."""
    graph = tmp_path / "mlp.json"
    from autograd_run.graphs import generators
    graph.write_text(json.dumps(generators.mlp(layers=4, width=256, batch=64)))
    out = tmp_path / "ranks"
    r = cli(["simulate", graph, "--ddp", "bucket_cap_mb=0.25", "--world", "2", "--network", "alpha_us=10,gbps=50",
             "--no-summary", "--trace", str(out) + "/"])
    assert r.code == 0, r.err
    events = _load(str(out / "rank-0.kineto.json"))["traceEvents"]
    comms = {(e["pid"], e["tid"], e["ts"]) for e in events if e.get("name") == "record_param_comms"}
    slices = {(e["pid"], e["tid"], e["ts"]): e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "node"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("cat") == "node"}
    assert len(comms) > 1 and len(starts) == len(ends) == len(comms)
    for k, s in starts.items():
        assert s["name"].startswith("launch all-reduce bucket ") and ends[k]["name"] == s["name"]
        assert (ends[k]["pid"], ends[k]["tid"], ends[k]["ts"]) in comms
        assert slices[(s["pid"], s["tid"], s["ts"])]["name"].endswith("AccumulateGrad")


def test_process_group_ranks_are_written_as_pytorch_writes_them():
    """PyTorch's profiler lists a group's ranks, the first 30 of them and ", ..." past that (its NCCL metadata's
    kTruncatLength), so a rank's trace does not grow with the world."""
    from autograd_run.traces.kineto import rank_list
    assert rank_list(1) == "[0]" and rank_list(3) == "[0, 1, 2]"
    assert rank_list(30) == "[" + ", ".join(map(str, range(30))) + "]"
    assert rank_list(31) == rank_list(2**20) == "[" + ", ".join(map(str, range(30))) + ", ...]"


def test_a_rank_trace_does_not_grow_with_the_world(tmp_path):
    args = ["simulate", "example:mlp", "--ddp", "defaults", "--network", "alpha_us=10,gbps=50", "--no-summary",
            "--trace-ranks", "1"]
    sizes = {}
    for world in (8, 2**20):
        out = tmp_path / f"w{world}"
        r = cli(args + ["--world", str(world), "--trace", str(out) + "/"])
        assert r.code == 0, r.err
        sizes[world] = os.path.getsize(out / "rank-0.kineto.json")
    assert sizes[2**20] < sizes[8] + 2000, sizes


def test_rank_traces_that_would_not_fit_on_the_disk_are_not_written(tmp_path, monkeypatch, capsys):
    """After the first rank's trace, the others (each about its size) must fit on the folder's disk."""
    import shutil
    from builders import run_cli
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 20_000, 20_000))
    out = tmp_path / "ranks"
    code, _, err = run_cli(["simulate", "example:mlp", "--ddp", "defaults", "--world", "16", "--network",
                            "alpha_us=10,gbps=50", "--no-summary", "--trace", str(out) + "/"], capsys)
    assert code == 2 and err.startswith(f"Error: --trace: {out}/: 7 more rank traces of about ") and \
        "and the disk has 19.5 KiB free (fewer with --trace-ranks N)" in err, err
    assert os.listdir(out) == ["rank-0.kineto.json"]


@pytest.mark.parametrize("extra, message", [
    (["--trace", "{d}/"], "goes with --ddp or --fsdp"),
    (["--trace", "{d}/x.json", "--trace-ranks", "2"], "--trace-ranks goes with a folder"),
    (["--ddp", "defaults", "--world", "2", "--network", "alpha_us=1,gbps=1", "--trace", "{d}/",
      "--trace-format", "json"], "is Kineto JSON"),
    (["--ddp", "defaults", "--world", "2", "--network", "alpha_us=1,gbps=1", "--trace", "{d}/none/deeper/"],
     "no such directory"),
    (["--ddp", "defaults", "--world", "2", "--network", "alpha_us=1,gbps=1", "--trace", "{d}/a_file/"],
     "not a folder"),
])
def test_folder_trace_mistakes(tmp_path, extra, message):
    (tmp_path / "a_file").write_text("")
    r = cli(["simulate", "example:mlp", *[a.format(d=tmp_path) for a in extra]])
    assert r.code != 0 and message in r.err and "Traceback" not in r.err


def test_trace_format_kineto_whatever_the_ending(tmp_path):
    out = tmp_path / "t.json"
    r = cli(["simulate", "example:pipeline", "--trace", out, "--trace-format", "kineto", "--no-summary"])
    assert r.code == 0, r.err
    assert "distributedInfo" in _load(str(out))
    gz = tmp_path / "t.kineto.json.gz"
    r = cli(["run", "example:mlp", "--trace", gz, "--no-summary"])
    assert r.code == 0, r.err
    assert _load(str(gz))["autogradRun"]["version"] == 1


def test_a_hostile_kineto_node_span_is_an_error(tmp_path):
    bad = tmp_path / "bad.kineto.json"
    bad.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1,
                                                 "args": {"node": 5}}]}))
    r = cli(["diff", bad, bad])
    assert r.code != 0 and "args.node" in r.err and "Traceback" not in r.err


def test_fsdp_collectives_are_nccl_kernels_with_their_kind_and_sizes(tmp_path):
    from autograd_run.sim.ddp import collective_kernels
    from autograd_run.sim.fsdp import add_to_recording, simulate_fsdp
    from test_fsdp_sim import LINK, N, _report, three_units
    rep = _report(three_units())
    result = simulate_fsdp(rep, 4, LINK)
    rec = rep.recording
    kernels, end = collective_kernels(result, rec, add_to_recording)
    rec.kernels.extend(kernels)
    rec.end = max(rec.end, end)
    p = str(tmp_path / "fsdp.kineto.json")
    write_kineto_trace(p, rec, world=4)
    ev = _load(p)["traceEvents"]
    nccl = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_")]
    kinds = {e["args"]["Collective name"] for e in nccl}
    assert kinds == {"allgather", "reduce_scatter"}
    for e in nccl:
        a = e["args"]
        assert a["Group size"] == 4 and a["dtype"] == "Float"
        # units of one 1 MiB parameter each (N float32): gathered from 4 shards, reduce-scattered into 4
        if a["Collective name"] == "allgather":  # each rank puts in its shard and gets the whole parameter
            assert (a["In msg nelems"], a["Out msg nelems"]) == (N // 4, N)
        else:  # each rank puts in the whole gradient and keeps its shard
            assert (a["In msg nelems"], a["Out msg nelems"]) == (N, N // 4)
    # each collective's launch (record_param_comms, its annotation and cudaLaunchKernel) on the launch thread
    by_corr = {e["args"]["correlation"]: e for e in ev if e.get("name") == "cudaLaunchKernel"}
    assert all(by_corr[e["args"]["correlation"]]["ts"] <= e["ts"] for e in nccl)
    st = streams_of(rec)
    assert st.overlap is not None and st.comm_ns == sum(k.end - k.start for k in kernels)


def test_simulate_costs_reads_a_folder_of_our_rank_traces(tmp_path):
    from autograd_run.graphs import generators
    graph = tmp_path / "mlp.json"
    graph.write_text(json.dumps(generators.mlp(layers=2, width=512, batch=256)))
    out = tmp_path / "ranks"
    base = ["simulate", graph, "--devices", "1", "--spec", "h100"]
    r = cli(base + ["--ddp", "defaults", "--world", "2", "--network", "alpha_us=10,gbps=50", "--trace",
                    str(out) + "/", "--json"])
    assert r.code == 0, r.err
    first = json.loads(r.out)
    r = cli(base + ["--costs", out, "--json"])
    assert r.code == 0, r.err
    again = json.loads(r.out)
    assert again["measured"]["path"] == str(out)
    assert again["wall_ns"] == pytest.approx(first["wall_ns"], rel=0.001)


def test_a_stopped_runs_kineto_trace_says_so(tmp_path, streams_report):
    p = str(tmp_path / "stopped.kineto.json")
    write_kineto_trace(p, streams_report.recording, incomplete="interrupted")
    doc = _load(p)
    assert doc["otherData"] == {"incomplete": "interrupted"}
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "incomplete"]
    assert len(marks) == 1 and "interrupted" in marks[0]["name"]
    empty = Recording(simulated=True)
    q = str(tmp_path / "empty.kineto.json")
    write_kineto_trace(q, empty)
    assert _load(q)["traceEvents"][0]["name"] == "process_name"
