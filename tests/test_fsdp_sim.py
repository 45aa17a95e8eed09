"""FSDP2 on a simulated backward (``sim.fsdp``), hand-computed; the ``fsdp`` section checked as untrusted data."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autograd_run.errors import GraphFileError, RequestError
from autograd_run.parallel.collectives import Link, cost_ns
from autograd_run.sim.fsdp import padded_bytes, sim_events, simulate_fsdp
from autograd_run.sim.session import SimOptions, simulate_session
from builders import parts_graph

MIB = 1 << 20
N = 1 << 18  # float32: 1 MiB
LINK = Link(10.0, 1e9, "test")  # 10 us a message, 1 GB/s
GLOO = Link(10.0, 1e9, "gloo-like", reduce_scatter="allreduce")


def _parts(**unit_changes):
    """Three units in forward order u1, u2, root (w1, w2, w3: 1 MiB each). Backward: c3 (root's, 100 us) ->
    c2 (u2's) -> p2 (u2's post-backward node) -> c1 (u1's) -> p1 (u1's post-backward node); the root's inputs
    need no gradient: its post-backward is the final callback's."""
    def cost(nid, nxt, us):
        return {"id": nid, "name": nid.upper(), "op": "cost", "next": nxt, "inputs": [{"shape": [N]}],
                "attrs": {"cost": {"us": us}}}

    def acc(nid, var):
        return {"id": nid, "name": "torch::autograd::AccumulateGrad", "variable": var, "inputs": [{"shape": [N]}]}
    nodes = [cost("c3", [["a3", 0], ["c2", 0]], 100), cost("c2", [["a2", 0], ["p2", 0]], 100),
             cost("p2", [["c1", 0]], 10), cost("c1", [["a1", 0], ["p1", 0]], 100), cost("p1", [], 10),
             acc("a1", "w1"), acc("a2", "w2"), acc("a3", "w3")]
    variables = [{"name": f"w{k}", "shape": [N]} for k in (1, 2, 3)]
    units = [{"name": "u1", "parameters": ["w1"], "reshard_after_forward": True, "pre_backward": "c1",
              "post_backward": "p1"},
             {"name": "u2", "parameters": ["w2"], "reshard_after_forward": True, "pre_backward": "c2",
              "post_backward": "p2"},
             {"name": "", "parameters": ["w3"], "reshard_after_forward": False, "pre_backward": "c3",
              "post_backward": None}]
    for name, change in unit_changes.items():
        next(u for u in units if u["name"] == name).update(change)
    return nodes, variables, {"units": units, "root": "", "world_size": 1}


def three_units(**unit_changes):
    nodes, variables, fsdp = _parts(**unit_changes)
    return parts_graph(nodes, [{"node": "c3"}], variables, source="fsdp.json", fsdp=fsdp)


def _report(g=None):
    return simulate_session(g or three_units(), SimOptions(spec="h100", slack_top=0))


def _copy(rep, device=None) -> int:
    """A 1 MiB buffer read and written at the memory bandwidth (the host's, or ``device``'s)."""
    return round(2 * MIB / (device or rep.spec.host).mem_bw * 1e9)


def test_on_the_cpu_every_collective_is_a_wait_of_the_compute():
    """Blocking (gloo on the CPU): the root's pre-backward prefetches u2 (1 all-gather); u2's prefetches u1;
    each post-backward copies its gradients in and reduce-scatters (gloo: an all-reduce of the whole buffer);
    each pre-backward of a gathered unit copies the buffer out. All of it adds to the compute."""
    rep = _report()
    r = simulate_fsdp(rep, 2, GLOO)
    ag, rs, copy = cost_ns("all-gather", MIB, 2, GLOO), cost_ns("allreduce", MIB, 2, GLOO), _copy(rep)
    assert ag == 10_000 + 524_288 and rs == 20_000 + 1_048_576
    assert r.blocking and r.comm_ns == 2 * ag + 3 * rs
    assert r.stalls == {"c3": ag, "c2": copy + ag, "p2": copy + rs, "c1": copy, "p1": copy + rs}
    assert r.exposed_ns == copy + rs  # the root's reduce-scatter, in the final callback
    assert r.idle_ns == 2 * ag + 4 * copy + 2 * rs
    assert r.wall_ns == rep.engine_done_ns + 2 * ag + 5 * copy + 3 * rs and r.overlap == 0
    u = {x.name: x for x in r.units}
    assert u[""].all_gather is None and u["u2"].gathered_by == "prefetch by (root)"
    assert u["u1"].gathered_by == "prefetch by u2" and u[""].post_in == "final callback"
    assert sim_events(r) == [("pre", ""), ("all-gather", "u2"), ("pre", "u2"), ("all-gather", "u1"),
                             ("reduce-scatter", "u2"), ("pre", "u1"), ("reduce-scatter", "u1"),
                             ("reduce-scatter", "")]
    # The trace's re-simulation with the waits in it ends its compute where the model says (one worker).
    again = simulate_session(three_units(), SimOptions(spec="h100", slack_top=0, extra_ns=r.stalls))
    assert again.engine_done_ns == r.wall_ns - r.exposed_ns


def _with_recompute(pairs):
    nodes, variables, fsdp = _parts()
    return parts_graph(nodes, [{"node": "c3"}], variables, source="fsdp.json", fsdp={**fsdp, "recompute": pairs})


def test_a_recompute_gathers_the_units_it_runs_and_their_own_pre_backward_finds_them_gathered():
    """Activation checkpointing (the capture's ``recompute`` pairs): u1's forward is recomputed while c2 runs
    (after u2's pre-backward hook: the node unpacks as it computes). FSDP's pre-forward there all-gathers u1
    if it is sharded and waits for it (copy-out included); no reshard follows in a backward, so u1's own
    pre-backward at c1 waits for nothing. Blocking (gloo on the CPU), hand-computed."""
    ag, rs = cost_ns("all-gather", MIB, 2, GLOO), cost_ns("allreduce", MIB, 2, GLOO)
    rep = _report(_with_recompute([["c2", "u1"]]))
    copy = _copy(rep)
    # no prefetch: u1 is sharded when c2 recomputes it, gathered there, not at c1
    r = simulate_fsdp(rep, 2, GLOO, prefetch=0)
    u = {x.name: x for x in r.units}
    assert (u["u1"].gathered_by, u["u1"].recompute_in, u["u1"].issuer()) == ("recompute", "c2", None)
    assert r.stalls == {"c2": 2 * (ag + copy), "p2": copy + rs, "p1": copy + rs}
    assert u["u1"].wait_ns == ag + copy and u["u1"].all_gather.start_ns == u["u2"].all_gather.end_ns + copy
    assert sim_events(r) == [("pre", ""), ("pre", "u2"), ("all-gather", "u2"), ("all-gather", "u1"),
                             ("reduce-scatter", "u2"), ("pre", "u1"), ("reduce-scatter", "u1"),
                             ("reduce-scatter", "")]
    plain = simulate_fsdp(_report(), 2, GLOO, prefetch=0)  # without it: gathered by its own pre-backward at c1
    assert {x.name: x for x in plain.units}["u1"].gathered_by == "pre-backward" and plain.stalls["c1"] == ag + copy
    assert plain.wall_ns == r.wall_ns  # (blocking: the same waits, moved)
    # prefetched by u2 first: the recompute waits for that all-gather and copies it out; c1 then waits for nothing
    r = simulate_fsdp(rep, 2, GLOO)
    u = {x.name: x for x in r.units}
    assert u["u1"].gathered_by == "prefetch by u2" and u["u1"].wait_ns == copy
    assert r.stalls == {"c3": ag, "c2": copy + ag + copy, "p2": copy + rs, "p1": copy + rs}
    # the recompute's all-gather in the trace: a flow from the node that recomputed
    from autograd_run.record.recording import Recording
    rec = Recording(start=0, end=0)
    from autograd_run.sim.fsdp import add_to_recording
    g = _with_recompute([["c2", "u1"]])
    add_to_recording(simulate_fsdp(_report(g), 2, GLOO, prefetch=0), rec, g)
    k = next(k for k in rec.kernels if "unit u1" in k.node.name and "all-gather" in k.node.name)
    assert "recompute" in k.node.name and k.node.trigger is g.by_id["c2"]


def _events(g, **kw):
    return sim_events(simulate_fsdp(_report(g), 2, GLOO, **kw))


PLAIN = [("pre", ""), ("all-gather", "u2"), ("pre", "u2"), ("all-gather", "u1"), ("reduce-scatter", "u2"),
         ("pre", "u1"), ("reduce-scatter", "u1"), ("reduce-scatter", "")]


def test_the_captured_backward_switches_of_a_unit():
    """FSDP2's per-group switches, as captured (each checked against real fully_shard on 2 gloo ranks in
    tests/test_fsdp_ranks.py): set_requires_gradient_sync(False) (``reduce_grads``: its post-backward reshards and
    returns before the reduce-scatter and its wait), set_unshard_in_backward(False) (``unshard`` is a no-op in
    PRE_BACKWARD: neither its pre-backward nor a backward prefetch all-gathers it), set_reshard_after_backward(False)
    (not resharded by its post-backward: a later prefetch of it gathers nothing)."""
    assert _events(three_units()) == PLAIN
    assert _events(three_units(u2={"reduce_grads": False})) == [e for e in PLAIN if e != ("reduce-scatter", "u2")]
    r = simulate_fsdp(_report(three_units(u2={"reduce_grads": False})), 2, GLOO)
    u = {x.name: x for x in r.units}
    assert u["u2"].reduce_scatter is None and u["u2"].rs_wait_ns == 0 and u["u1"].rs_wait_ns == 0
    assert _events(three_units(u1={"unshard_in_backward": False})) == [e for e in PLAIN
                                                                       if e != ("all-gather", "u1")]
    assert _events(three_units(u1={"unshard_in_backward": False}), prefetch=0) == [
        ("pre", ""), ("pre", "u2"), ("all-gather", "u2"), ("reduce-scatter", "u2"), ("pre", "u1"),
        ("reduce-scatter", "u1"), ("reduce-scatter", "")]
    # u1 prefetches u2, whose backward already ran: gathered again, unless u2 kept its parameters
    again = PLAIN[:6] + [("all-gather", "u2")] + PLAIN[6:]
    assert _events(three_units(u1={"backward_prefetch": ["u2"]})) == again
    assert _events(three_units(u1={"backward_prefetch": ["u2"]}, u2={"reshard_after_backward": False})) == PLAIN
    # the memory: u1 never unsharded in the backward; u2's unsharded parameters kept to the end
    g = three_units(u1={"unshard_in_backward": False}, u2={"reshard_after_backward": False})
    extras = simulate_fsdp(_report(g), 2, GLOO).memory_extras(g)[0]
    by = {e.what: e for e in extras}
    assert "FSDP u1: unsharded parameters" not in by and "FSDP u1: reduce-scatter input" in by
    assert by["FSDP u2: unsharded parameters"].gone is None


def test_a_recompute_runs_the_forward_prefetch_of_the_units_it_runs():
    """``set_modules_to_forward_prefetch`` (``forward_prefetch``): a recompute's pre-forward of a unit (its state
    not in PRE_BACKWARD) all-gathers the targets that are sharded after its own, as the forward does; one whose
    backward already ran is gathered again (found against real fully_shard: each checkpointed block's first unit
    prefetching the next block's)."""
    nodes, variables, fsdp = _parts(u1={"forward_prefetch": ["u2"]})
    g = parts_graph(nodes, [{"node": "c3"}], variables, source="fsdp.json", fsdp={**fsdp, "recompute": [["c1", "u1"]]})
    r = simulate_fsdp(_report(g), 2, GLOO)
    assert sim_events(r) == PLAIN[:6] + [("all-gather", "u2")] + PLAIN[6:]
    u = {x.name: x for x in r.units}
    assert [by for _, by in u["u2"].regathers] == ["u1"]
    assert sim_events(simulate_fsdp(_report(_with_recompute([["c1", "u1"]])), 2, GLOO)) == PLAIN


def test_the_collectives_slack_hand_computed():
    """Blocking (the test above: wall = compute + 2 all-gathers + 3 reduce-scatters + 5 copies): every collective
    20% faster saves 2 x (ag - ag') + 3 x (rs - rs'); with no prefetch each unit's all-gather is issued by its
    own pre-backward, still blocking: the same collectives, the same wall; one more unit prefetched (2) also
    gathers the same two units. Each row as simulate_fsdp gives it."""
    from autograd_run.sim.ddp import faster_link
    from autograd_run.sim.fsdp import fsdp_slack
    rep = _report()
    r = simulate_fsdp(rep, 2, GLOO)
    fast = faster_link(GLOO, 0.2)
    ag, rs = cost_ns("all-gather", MIB, 2, GLOO), cost_ns("allreduce", MIB, 2, GLOO)
    ag2, rs2 = cost_ns("all-gather", MIB, 2, fast), cost_ns("allreduce", MIB, 2, fast)
    rows = {row["what"]: row for row in fsdp_slack(rep, 2, GLOO, r, {})}
    assert list(rows) == ["prefetch=2 (one more unit ahead)", "prefetch=0 (none)", "every collective 20% faster"]
    assert rows["every collective 20% faster"]["saved_ns"] == 2 * (ag - ag2) + 3 * (rs - rs2) > 0
    assert rows["prefetch=0 (none)"]["saved_ns"] == 0 == rows["prefetch=2 (one more unit ahead)"]["saved_ns"]
    for what, kw in (("prefetch=2 (one more unit ahead)", {"prefetch": 2}), ("prefetch=0 (none)", {"prefetch": 0})):
        assert rows[what]["wall_ns"] == simulate_fsdp(rep, 2, GLOO, **kw).wall_ns
    assert fsdp_slack(rep, 2, GLOO, simulate_fsdp(rep, 2, GLOO, prefetch=0), {"prefetch": 0})[0]["what"] == \
        "prefetch=1 (one more unit ahead)"


def test_on_streams_the_all_gathers_queue_and_the_compute_waits_only_for_what_it_needs():
    """Not blocking (an accelerator): the prefetched all-gathers run one after the other on their stream
    while the compute goes on; the compute waits at a unit's pre-backward until its own all-gather is done;
    a post-backward waits for the previous unit's reduce-scatter (FSDP keeps one in flight)."""
    rep = _report()
    r = simulate_fsdp(rep, 2, LINK, blocking=False)
    ag, copy = cost_ns("all-gather", MIB, 2, LINK), _copy(rep, rep.spec.accelerator)
    u = {x.name: x for x in r.units}
    t3 = u[""].pre_ns
    assert u[""].wait_ns == 0 and (u["u2"].all_gather.start_ns, u["u2"].all_gather.end_ns) == (t3, t3 + ag)
    # u2's pre-backward waits for its all-gather (started at the root's) and copies it out; u1's all-gather
    # was issued then but queues behind u2's on the all-gather stream
    t2 = u["u2"].pre_ns
    assert u["u2"].wait_ns == max(0, t3 + ag - t2) + copy
    assert u["u1"].all_gather.start_ns == max(t2, u["u2"].all_gather.end_ns)
    # reduce-scatters on their own stream: u1's waits for u2's (stream order), and u1's post-backward waited
    # for u2's reduce-scatter if it was still running
    assert u["u1"].reduce_scatter.start_ns >= u["u2"].reduce_scatter.end_ns
    assert u["u1"].rs_wait_ns == max(0, u["u2"].reduce_scatter.end_ns - u["u1"].post_ns)
    assert r.wall_ns == u[""].reduce_scatter.end_ns and 0 < r.overlap < 1
    blocking = simulate_fsdp(rep, 2, LINK, blocking=True)
    assert r.wall_ns < blocking.wall_ns
    # Without prefetching, each unit's all-gather starts at its own pre-backward: the compute waits longer.
    none = simulate_fsdp(rep, 2, LINK, blocking=False, prefetch=0)
    assert {x.name: x.gathered_by for x in none.units} == {"u1": "pre-backward", "u2": "pre-backward", "": None}
    assert none.idle_ns > r.idle_ns and none.wall_ns > r.wall_ns
    # prefetch=2 at the root gathers u2 and u1 at once (one stream: one after the other)
    two = simulate_fsdp(rep, 2, LINK, blocking=False, prefetch=2)
    assert {x.name: x.gathered_by for x in two.units}["u1"] == "prefetch by (root)"


def test_units_that_keep_their_parameters_gather_nothing_and_hsdp_all_reduces_each_shard():
    rep = _report()
    keep = simulate_fsdp(rep, 4, LINK, reshard_after_forward=False)
    assert all(u.all_gather is None for u in keep.units)
    hsdp = simulate_fsdp(rep, 4, LINK, replicate=2)  # 2 replicas of 2-way shards
    u = {x.name: x for x in hsdp.units}["u1"]
    assert u.all_reduce.start_ns == u.reduce_scatter.end_ns  # the all-reduce stream was free
    assert u.all_reduce.end_ns - u.all_reduce.start_ns == cost_ns("allreduce", MIB // 2, 2, LINK)
    assert u.reduce_scatter.end_ns - u.reduce_scatter.start_ns == cost_ns("reduce-scatter", MIB, 2, LINK)
    assert simulate_fsdp(rep, 1, LINK).comm_ns == 0  # one rank: no collectives, nothing gathered
    with pytest.raises(RequestError, match="replicas must divide the world size 4"):
        simulate_fsdp(rep, 4, LINK, replicate=3)


def test_padding_to_the_shard_count_along_dim_0():
    assert padded_bytes((10, 3), "float32", 4) == 12 * 3 * 4
    assert padded_bytes((8,), "bfloat16", 4) == 16
    assert padded_bytes((), "float32", 8) == 8 * 4  # a scalar: one row
    g = three_units(u1={"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    u = {x.name: x for x in simulate_fsdp(_report(g), 2, LINK).units}["u1"]
    assert (u.gather_bytes, u.reduce_bytes) == (MIB // 2, MIB)


@pytest.mark.parametrize("change,where,what", [
    ({"extra": 1}, "$.fsdp.extra", "unknown field"),
    ({"units": []}, "$.fsdp.units", "non-empty list"),
    ({"units": [{"name": "a", "parameters": ["nope"]}]}, "$.fsdp.units[0].parameters[0]", "unknown parameter 'nope'"),
    ({"units": [{"name": "a", "parameters": ["w1"]}, {"name": "b", "parameters": ["w1"]}]},
     "$.fsdp.units[1].parameters[0]", "in unit 'a' already"),
    ({"units": [{"name": "a", "parameters": []}, {"name": "a", "parameters": []}]}, "$.fsdp.units[1].name",
     "listed twice"),
    ({"units": [{"name": "a", "parameters": [], "pre_backward": "zz"}]}, "$.fsdp.units[0].pre_backward",
     "node id of this graph"),
    ({"units": [{"name": "a", "parameters": [], "backward_prefetch": ["b"]}]},
     "$.fsdp.units[0].backward_prefetch[0]", "unknown unit 'b'"),
    ({"units": [{"name": "a", "parameters": [], "reshard_after_forward": "yes"}]},
     "$.fsdp.units[0].reshard_after_forward", "true or false"),
    ({"units": [{"name": "a", "parameters": [], "param_dtype": "float7"}]}, "$.fsdp.units[0].param_dtype",
     "unsupported dtype"),
    ({"units": [{"name": "a", "parameters": [], "forward_prefetch": ["b"]}]},
     "$.fsdp.units[0].forward_prefetch[0]", "unknown unit 'b'"),
    ({"units": [{"name": "a", "parameters": [], "forward_prefetch": "a"}]},
     "$.fsdp.units[0].forward_prefetch", "list of unit names"),
    ({"units": [{"name": "a", "parameters": [], "reduce_grads": 0}]}, "$.fsdp.units[0].reduce_grads",
     "true or false"),
    ({"units": [{"name": "a", "parameters": [], "unshard_in_backward": "no"}]},
     "$.fsdp.units[0].unshard_in_backward", "true or false"),
    ({"units": [{"name": "a", "parameters": [], "reshard_after_backward": None}]},
     "$.fsdp.units[0].reshard_after_backward", "true or false"),
    ({"root": "zz"}, "$.fsdp.root", "one of the units"),
    # not strings: a TypeError (unhashable) in validate before (found by the fuzzer)
    ({"units": [{"name": "a", "parameters": [], "backward_prefetch": [["a"]]}]},
     "$.fsdp.units[0].backward_prefetch[0]", "unknown unit ['a']"),
    ({"root": {"a": 1}}, "$.fsdp.root", "one of the units"),
    ({"world_size": 0}, "$.fsdp.world_size", "from 1 to"),
    ({"recompute": "c1"}, "$.fsdp.recompute", "[node id, unit name] pairs"),
    ({"recompute": [["c1"]]}, "$.fsdp.recompute[0]", "must be [node id, unit name]"),
    ({"recompute": [["zz", "u1"]]}, "$.fsdp.recompute[0][0]", "node id of this graph"),
    ({"recompute": [["c1", "nope"]]}, "$.fsdp.recompute[0][1]", "unknown unit 'nope'"),
    ({"recompute": [[["c1"], "u1"]]}, "$.fsdp.recompute[0][0]", "node id of this graph"),
])
def test_a_broken_fsdp_section_is_named_with_its_place(change, where, what):
    nodes, variables, fsdp = _parts()
    if "units" in change:
        fsdp = {k: v for k, v in fsdp.items() if k != "root"}
    with pytest.raises(GraphFileError) as exc:
        parts_graph(nodes, [{"node": "c3"}], variables, source="fsdp.json", fsdp={**fsdp, **change})
    assert where in str(exc.value) and what in str(exc.value), str(exc.value)


def _write(tmp_path):
    nodes, variables, fsdp = _parts()
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"format": "autograd-graph/1", "roots": [{"node": "c3"}], "variables": variables,
                                "nodes": nodes, "fsdp": fsdp}))
    return path


def test_simulate_fsdp_on_the_command_line(tmp_path):
    from cli_proc import cli
    path = _write(tmp_path)
    trace = tmp_path / "t.json"
    p = cli(["simulate", path, "--spec", "h100", "--fsdp", "captured", "--world", "2", "--network",
             "alpha_us=10,gbps=1", "--trace", trace])
    assert p.code == 0, p.err
    assert "FSDP2 on 2 ranks: collectives per unit, blocking the compute (CPU)" in p.out
    assert "exposed communication (after the last node)" in p.out and "prefetch by" not in p.out
    assert "What if (the collectives)" in p.out and "every collective 20% faster" in p.out
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "all-gather of unit u2 (1.00 MiB, prefetch by (root))" in names
    assert "reduce-scatter of unit (root) (1.00 MiB)" in names
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {"stream FSDP all-gather, rank 0", "stream FSDP reduce-scatter, rank 0"} <= tracks
    # a flow from the node whose hook issued each collective (each end on its slice's start); the root's
    # reduce-scatter, issued by the final callback, has none
    xs = {(e["pid"], e["tid"], e["ts"]): e["name"] for e in events if e.get("ph") == "X"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("name", "").startswith("launch ")}
    flows = sorted((xs[(e["pid"], e["tid"], e["ts"])].split()[0], xs[(ends[e["id"]]["pid"], ends[e["id"]]["tid"],
                                                                    ends[e["id"]]["ts"])].split(" (")[0])
                   for e in events if e.get("ph") == "s" and e.get("name", "").startswith("launch "))
    assert flows == [("c2", "all-gather of unit u1"), ("c3", "all-gather of unit u2"),
                     ("p1", "reduce-scatter of unit u1"), ("p2", "reduce-scatter of unit u2")]
    p = cli(["simulate", path, "--fsdp", "blocking=false", "--world", "2", "--network", "alpha_us=10,gbps=1",
             "--compare", "prefetch=0,1", "--json"])
    assert p.code == 0, p.err
    rows = json.loads(p.out)["fsdp_compare"]
    assert [r["prefetch"] for r in rows] == [0, 1] and rows[0]["wall_ns"] > rows[1]["wall_ns"]


@pytest.mark.parametrize("argv,what", [
    (["--fsdp", "prefetch=-1", "--world", "2", "--network", "alpha_us=1,gbps=1"], "prefetch must be"),
    (["--fsdp", "bogus=1", "--world", "2", "--network", "alpha_us=1,gbps=1"], "unknown key 'bogus'"),
    (["--fsdp", "captured", "--world", "2"], "--fsdp needs --network"),
    (["--fsdp", "captured", "--network", "alpha_us=1,gbps=1"], "--fsdp needs --world"),
    (["--fsdp", "replicate=3", "--world", "4", "--network", "alpha_us=1,gbps=1"], "does not divide"),
    (["--fsdp", "captured", "--ddp", "defaults", "--world", "2", "--network", "alpha_us=1,gbps=1"], "give one"),
    (["--fsdp", "captured", "--world", "2", "--network", "alpha_us=1,gbps=1", "--straggler",
      "rank=1,slowdown=2"], "--straggler goes with --ddp"),
    (["--fsdp", "captured", "--world", "2", "--network", "alpha_us=1,gbps=1", "--compare", "bucket_cap_mb=1,2"],
     "--compare prefetch=... or world=..."),
])
def test_bad_fsdp_options_are_usage_errors(tmp_path, argv, what):
    from cli_proc import cli
    p = cli(["simulate", _write(tmp_path), *argv])
    assert p.code == 2 and what in p.err and "Traceback" not in p.err, p.err


def test_a_graph_without_the_section_is_told_so(tmp_path):
    nodes, variables, _ = _parts()
    g = parts_graph(nodes, [{"node": "c3"}], variables, source="plain.json")
    with pytest.raises(RequestError, match="no fsdp section"):
        simulate_fsdp(_report(g), 2, LINK)
    assert dataclasses.is_dataclass(simulate_fsdp(_report(), 2, LINK))
