"""Every table of the command line in an 80-column terminal: no line wider than the terminal, no word of
ours broken (a header, a policy, a placement, a worker; numbers never wrap), laid out boxed, compact or
stacked as the width allows. Goldens for the simulated tables (a virtual clock: the same text every run),
and for every command that prints a table, its words at 80 columns against the same command at 400.

Text from files (node ids, op names, paths) may still fold inside a word: the test graphs' ids are short
enough that nothing here has to.
"""

from __future__ import annotations

import json
import re

import pytest

from builders import run_cli

WIDTH = 80
BOX = re.compile(r"[\s\u2500-\u257f]+")  # whitespace and box drawing


UNITS = {"ns", "µs", "ms", "s", "B", "KiB", "MiB", "GiB"}


def words(text: str) -> set[str]:
    """The words of ``text`` but numbers, units and ids (they may differ between two runs of ``run``) and
    paths (text from files: they fold), with colons, commas and brackets at their ends taken off (a
    stacked row's ``header:``)."""
    out = set()
    for w in BOX.split(text):
        w = w.strip(":,()")
        if w and w not in UNITS and "/" not in w and not any(c.isdigit() for c in w):
            out.add(w)
    return out


def at(width: int, args: list[str], capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, err = run_cli(args, capsys)
    assert code in (0, 1), (code, err)
    return out


def fsdp_graph(tmp_path) -> str:
    """Two FSDP units and the root (parameters of 1 MiB), cost nodes of 100 us (tests/test_fsdp_sim.py's)."""
    from test_fsdp_sim import _write
    return str(_write(tmp_path))


def plain_graph(tmp_path, relative: bool = False) -> str:
    """A 12-node chain; ``relative``: named from ``tmp_path`` (the tests run there), as a sweep's graph
    column shows its path and a temporary folder's long path would fold."""
    from autograd_run.graphs.generators import chain
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(chain(12, seed=1)))
    return path.name if relative else str(path)


def checked_graph(tmp_path) -> str:
    """example:seed with PyTorch's order and gradients as its reference (tests/test_check_cmd.py's)."""
    from test_check_cmd import SEED_ORDER, seed_with
    return str(seed_with({"order": SEED_ORDER, "grads": {"a": [5.0, 5.0]}}, tmp_path))


COMMANDS = {
    "check": lambda tmp: ["check", checked_graph(tmp)],
    # run: one thread (the rows of its tables, a contended lock's among them, are the same in both runs)
    "run summary": lambda tmp: ["example:pipeline", "--devices", "virtual", "--no-multithreading"],
    "run with an error": lambda tmp: ["example:failing", "--no-multithreading"],
    "run gradients": lambda tmp: ["example:mlp", "--no-multithreading"],
    "simulate summary": lambda tmp: ["simulate", "example:mlp", "--devices", "2", "--placement", "layer"],
    "simulate --compare policy": lambda tmp: ["simulate", "example:mlp", "--compare",
                                              "policy=pytorch,fifo,critical-path"],
    "simulate --compare devices": lambda tmp: ["simulate", "example:pipeline", "--compare", "devices=1,2,4"],
    "simulate --ddp": lambda tmp: ["simulate", "example:mlp", "--ddp", "defaults", "--world", "4",
                                   "--network", "nvlink-h100"],
    "simulate --ddp --compare": lambda tmp: ["simulate", "example:mlp", "--ddp", "defaults", "--world", "4",
                                             "--network", "nvlink-h100", "--compare", "bucket_cap_mb=0.0001,1,25"],
    "simulate --fsdp": lambda tmp: ["simulate", fsdp_graph(tmp), "--spec", "h100", "--fsdp", "captured",
                                    "--world", "2", "--network", "alpha_us=10,gbps=1"],
    "simulate --fsdp --compare": lambda tmp: ["simulate", fsdp_graph(tmp), "--fsdp", "blocking=false", "--world",
                                              "2", "--network", "alpha_us=10,gbps=1", "--compare", "prefetch=0,1"],
    "diff": lambda tmp: ["diff", "example:mlp", "--a", "simulate", "--b", "simulate --policy fifo --devices 2"],
    "sweep": lambda tmp: ["sweep", "-g", plain_graph(tmp, relative=True), "--devices", "1,2", "--policy",
                          "pytorch,fifo,critical-path", "--workers", "0", "--no-cache"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_table_fits_80_columns_without_breaking_a_word(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = COMMANDS[name](tmp_path)
    narrow = at(WIDTH, args, capsys, monkeypatch)
    wide = at(400, args, capsys, monkeypatch)
    assert narrow.strip()
    too_wide = [line for line in narrow.splitlines() if len(line) > WIDTH]
    assert not too_wide, too_wide
    broken = words(narrow) - words(wide)
    assert not broken, f"{name}: words broken at {WIDTH} columns: {sorted(broken)}\n{narrow}"


def test_the_test_sees_a_broken_word():
    """The check above catches what rich's own squeezing did to --compare (issue #37: pytorc/h)."""
    wide = "policy  wall\ncritical-path 1 us\npytorch 1 us"
    narrow = "policy wall\ncritical 1 us\n-path\npytorc 1 us\nh"
    assert words(narrow) - words(wide) == {"critical", "-path", "pytorc", "h"}


def table(args, capsys, monkeypatch, width=WIDTH) -> str:
    """Stdout from the first line of the table up to the spec line that closes a simulation's output."""
    out = at(width, args, capsys, monkeypatch)
    return out.split("\nspec ")[0]


GOLDEN_COMPARES = {
    "simulate --compare policy": """\
                        example:mlp: simulated, 13 nodes                        
                                        engine   critical                       
policy        devices placed    wall      done       path vs first          peak
────────────────────────────────────────────────────────────────────────────────
pytorch             - keep   52.0 µs   52.0 µs    52.0 µs    1.00x 1.9 KiB (cpu)
fifo                - keep   52.0 µs   52.0 µs    52.0 µs    1.00x 1.9 KiB (cpu)
critical-path       - keep   52.0 µs   52.0 µs    52.0 µs    1.00x 1.9 KiB (cpu)""",
    "simulate --compare devices": """\
                      example:pipeline: simulated, 7 nodes                      
                                   engine    critical                           
policy  devices placed    wall       done        path vs first              peak
────────────────────────────────────────────────────────────────────────────────
pytorch       1 greedy 69.0 µs    69.0 µs     59.0 µs    1.00x 10.0 KiB (cuda:0)
pytorch       2 greedy 69.0 µs    69.0 µs     59.0 µs    1.00x 10.0 KiB (cuda:0)
pytorch       4 greedy 69.0 µs    69.0 µs     59.0 µs    1.00x 10.0 KiB (cuda:0)""",
}


@pytest.mark.parametrize("name", GOLDEN_COMPARES)
def test_golden_compare_at_80_columns(name, capsys, monkeypatch):
    assert table(COMMANDS[name](None), capsys, monkeypatch) == GOLDEN_COMPARES[name]


def test_golden_compare_at_60_columns_stacks_its_rows(capsys, monkeypatch):
    got = table(COMMANDS["simulate --compare policy"](None), capsys, monkeypatch, width=60)
    assert got.splitlines()[:10] == """\
example:mlp: simulated, 13 nodes
policy: pytorch
  devices: -
  placed: keep
  wall: 52.0 µs
  engine done: 52.0 µs
  critical path: 52.0 µs
  vs first: 1.00x
  peak: 1.9 KiB (cpu)
policy: fifo""".splitlines()


def test_golden_ddp_compare_at_80_columns(capsys, monkeypatch):
    out = table(COMMANDS["simulate --ddp --compare"](None), capsys, monkeypatch)
    got = out[out.index("DDP: bucket_cap_mb compared") - 26:]
    assert got == """\
                          DDP: bucket_cap_mb compared                           
┏━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┓
┃               ┃         ┃               ┃   backward with ┃         ┃        ┃
┃ bucket_cap_mb ┃ buckets ┃ communication ┃  the final wait ┃ exposed ┃ hidden ┃
┡━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━┩
│        0.0001 │       2 │       60.0 µs │         92.1 µs │ 40.1 µs │    33% │
│             1 │       1 │       30.0 µs │         82.1 µs │ 30.1 µs │     0% │
│            25 │       1 │       30.0 µs │         82.1 µs │ 30.1 µs │     0% │
└───────────────┴─────────┴───────────────┴─────────────────┴─────────┴────────┘"""


def test_a_long_id_still_folds_and_keeps_every_character(tmp_path, capsys, monkeypatch):
    """Text from files is the exception: an id longer than any column folds (whole, across lines)."""
    from builders import doc, leaf, node
    long_id = "a_rather_long_node_identifier_that_cannot_fit_in_a_narrow_column_0123456789"
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc(
        node(long_id, "SumBackward0", seq=2, next=["mul"], inputs=[{"shape": []}], saved={"self_sym_sizes": [2]}),
        node("mul", "MulBackward0", seq=1, next=["acc_a", None], inputs=[{"shape": [2]}], saved={"other": 2.0}),
        leaf("a", [2]))))
    from test_cli_terminal import table_rows
    out = table(["simulate", str(path)], capsys, monkeypatch)
    assert all(len(line) <= WIDTH for line in out.splitlines())
    ids = "".join(r[0] for r in table_rows(out, "slowest nodes"))
    assert ids.replace("mul", "").replace("acc_a", "") == long_id
