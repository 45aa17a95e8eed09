"""``--memory-snapshot FILE.pickle``: the memory model's allocations as ``torch.cuda.memory._snapshot()`` writes them,
read back by PyTorch's own ``torch.cuda._memory_viz`` (what MemoryViz and ``python -m torch.cuda._memory_viz`` run)."""

import pickle

import pytest

from builders import run_cli
from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph
from autograd_run.graphs.dump import dumps
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.traces.memory_snapshot import snapshot

torch = pytest.importorskip("torch", reason="PyTorch's own memory viewer reads the snapshots")
from torch.cuda import _memory_viz  # noqa: E402  (plain Python: no GPU needed)


def _graphs(tmp_path):
    tf = tmp_path / "tf.json"
    tf.write_bytes(dumps(generate("transformer", layers=2, devices=2), "json"))
    return ["example:mlp", "example:seed", "example:pipeline", "example:checkpoint", "example:reentrant", str(tf)]


def _replay(trace: list[dict]) -> tuple[int, int]:
    """(the largest bytes alive, bytes alive at the end) of a device trace."""
    live = peak = 0
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed" else 0
        peak = max(peak, live)
    return peak, live


def test_the_snapshot_holds_the_models_start_peak_and_end_on_every_device(tmp_path):
    """Replaying each device's allocations and frees in order gives the memory model's figures exactly: its peak
    (the blocks alive at the start are allocated first) and what is left (accelerators' blocks rounded as the
    model rounds them); cuda:N is device N, as PyTorch numbers them."""
    for src in _graphs(tmp_path):
        mem = simulate_session(load_graph(src), SimOptions(memory_events=True)).memory
        snap = snapshot(mem, src)
        for dm in mem.devices:
            n = int(dm.device.split(":")[1]) if dm.device.startswith("cuda") else len(snap["device_traces"]) - 1
            assert _replay(snap["device_traces"][n]) == (dm.peak, dm.end), (src, dm.device)
            live = sum(b["size"] for s in snap["segments"] if s["device"] == n for b in s["blocks"]
                       if b["state"] == "active_allocated")
            assert live == dm.end, (src, dm.device)


def test_pytorchs_memory_viz_reads_the_snapshot(tmp_path):
    """``_memory_viz``'s own readers: ``segsum`` checks that every segment's blocks add up to it, ``trace``
    names every allocation and free, ``trace_plot``/``segment_plot`` embed it in MemoryViz's page."""
    for src in _graphs(tmp_path):
        snap = pickle.loads(pickle.dumps(snapshot(simulate_session(load_graph(src), SimOptions(memory_events=True)).memory, src)))
        assert "total_allocated" in _memory_viz.segsum(snap)
        text = _memory_viz.trace(snap)
        allocs = sum(e["action"] == "alloc" for t in snap["device_traces"] for e in t)
        assert text.count(" = seg_") + text.count(" = MEM[") == allocs > 0
        assert "snapshot.pickle" in _memory_viz.trace_plot(snap) and _memory_viz.segment_plot(snap)


def test_a_frame_names_what_made_each_block():
    """As PyTorch's frames name where a block was allocated: the saved tensor, the node output, the leaf."""
    snap = snapshot(simulate_session(load_graph("example:mlp"), SimOptions(memory_events=True)).memory, "example:mlp")
    names = {(e["category"], e["frames"][0]["name"]) for e in snap["device_traces"][0] if e["action"] != "snapshot"}
    assert {("saved tensors", "saved by MmBackward0 mm_0 (mat2)"), ("outputs being made", "output 0 of MmBackward0 mm_3"),
            ("leaves (parameters, inputs)", "leaf w0"), ("root gradients", "root gradient 0")} <= names


def test_run_and_simulate_write_it(tmp_path, capsys):
    for cmd in (["example:pipeline"], ["simulate", "example:pipeline"]):
        out = tmp_path / f"{len(cmd)}.pickle"
        code, _, err = run_cli([*cmd, "--memory-snapshot", str(out), "--no-summary"], capsys)
        assert code == 0, err
        snap = pickle.loads(out.read_bytes())
        assert len(snap["device_traces"]) == 2 and all(snap["device_traces"])


@pytest.mark.parametrize("args, message", [
    (["--memory-snapshot", "m.json"], "m.json: a memory snapshot is a pickle (what MemoryViz opens): name it FILE.pickle"),
    (["--memory-snapshot", "m.pickle", "--no-memory"], "--memory-snapshot needs the memory model"),
    (["--memory-snapshot", "m.pickle", "--trace", "m.pickle"], "m.pickle: another output is written there already"),
])
def test_a_snapshot_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    for cmd in (["example:mlp"], ["simulate", "example:mlp"]):
        code, out, err = run_cli([*cmd, *args], capsys)
        assert code == 2 and message in err and not (tmp_path / "m.pickle").exists(), err


def test_a_snapshot_never_overwrites_an_input(tmp_path, capsys):
    graph = tmp_path / "g.pickle.json"
    graph.write_bytes(dumps(generate("chain", n=5), "json"))
    same = tmp_path / "same.pickle"
    same.symlink_to(graph)
    code, out, err = run_cli([str(graph), "--memory-snapshot", str(same)], capsys)
    assert code == 2 and "is an input of this run; refusing to overwrite it" in err
    code, out, err = run_cli(["simulate", "example:mlp", "--compare", "policy=fifo,pytorch", "--memory-snapshot",
                              str(tmp_path / "m.pickle")], capsys)
    assert code == 2 and "--memory-snapshot writes one simulation" in err


def test_a_memory_made_without_its_events_is_no_snapshot():
    """The events cost the replay about a tenth more: kept only when a snapshot is asked for."""
    mem = simulate_session(load_graph("example:mlp"), SimOptions()).memory
    assert len(mem.events) == 0
    with pytest.raises(ValueError, match="needs the memory's events"):
        snapshot(mem)


def test_the_fields_are_the_ones_pytorch_writes_for_a_real_backward():
    """PyTorch's own ``_profile_to_snapshot`` (what ``profile_plot`` hands MemoryViz) of a real CPU backward
    profiled with ``profile_memory``: every field it writes in a trace entry, a segment and a block is in ours,
    and our actions are among its; the CPU is its last device, as in ours."""
    from torch.profiler import ProfilerActivity, profile
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        (x @ w).relu().sum().backward()
    real = _memory_viz._profile_to_snapshot(prof)
    ours = snapshot(simulate_session(load_graph("example:mlp"), SimOptions(memory_events=True)).memory)
    assert len(real["device_traces"]) == len(ours["device_traces"]) == 1  # (no CUDA here: the CPU is device 0)

    def fields(snap):
        return ({k for t in snap["device_traces"] for e in t for k in e},
                {k for s in snap["segments"] for k in s}, {k for s in snap["segments"] for b in s["blocks"] for k in b},
                {e["action"] for t in snap["device_traces"] for e in t})
    real_f, ours_f = fields(real), fields(ours)
    assert all(r <= o for r, o in zip(real_f[:3], ours_f[:3])), (real_f, ours_f)
    assert real_f[3] == {"alloc", "free_requested", "free_completed"} and ours_f[3] == real_f[3] | {"snapshot"}


def test_what_memoryviz_js_needs_of_a_snapshot(tmp_path):
    """MemoryViz.js (torch/utils/viz/MemoryViz.js; not in the wheel, and its page loads d3 from a CDN, so it is not
    run here) reads a snapshot thus: ``annotate_snapshot`` gives each segment's blocks their addresses by adding
    their sizes from the segment's address, and, when the trace's categories lack 'unknown', pushes it onto a
    misspelt field and stops; the allocator view looks every block alive at an event up in its device's
    segments. Each of those holds for ours."""
    for src in _graphs(tmp_path):
        snap = snapshot(simulate_session(load_graph(src), SimOptions(memory_events=True)).memory, src)
        categories = {e["category"] for t in snap["device_traces"] for e in t if "category" in e}
        assert not categories or "unknown" in categories
        for seg in snap["segments"]:
            at = seg["address"]
            for b in seg["blocks"]:
                assert b["address"] == at
                at += b["size"]
            assert at == seg["address"] + seg["total_size"]
            for e in snap["device_traces"][seg["device"]]:
                if e["action"] == "alloc":
                    assert seg["address"] <= e["addr"] and e["addr"] + e["size"] <= at, (src, e)
        assert {s["device"] for s in snap["segments"]} == {d for d, t in enumerate(snap["device_traces"]) if t}


def test_the_file_is_the_snapshot_written_a_batch_at_a_time(tmp_path, monkeypatch):
    """``write`` streams the entries (protocol 3, no memo: what MemoryViz's own unpickler reads); the file loads as
    the dict ``snapshot`` makes, across batch boundaries and devices."""
    from autograd_run.traces import memory_snapshot
    monkeypatch.setattr(memory_snapshot, "BATCH", 3)
    for src in _graphs(tmp_path):
        mem = simulate_session(load_graph(src), SimOptions(memory_events=True)).memory
        path = tmp_path / "m.pickle"
        memory_snapshot.write(str(path), mem, src)
        data = path.read_bytes()
        assert data[:2] == b"\x80\x03" and pickle.loads(data) == snapshot(mem, src), src
