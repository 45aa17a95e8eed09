"""``autograd-run sweep`` without a cluster: the spec as untrusted input, the grid, the per-point work
(checked against ``simulate_session`` called directly), the cache, failures, outputs, escaping.

The Dask side (a LocalCluster on 127.0.0.1) is in test_sweep_dask.py.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from autograd_run.graphs.generators import generate
from autograd_run.graphs.load import load_graph
from autograd_run.sim.session import SimOptions, simulate_session
from autograd_run.sweep.fingerprint import point_key
from autograd_run.sweep.grid import build_grid
from autograd_run.sweep.runner import SweepOptions, run_sweep
from autograd_run.sweep.spec import SweepSpecError, read_spec_file
from builders import run_cli, stable_rows, write_sweep

pytestmark = pytest.mark.timeout(120)


def small_graphs() -> dict[str, dict]:
    return {"tf.json": generate("transformer", layers=2, devices=2, seed=1),
            "mlp.yaml": generate("mlp", layers=3, width=16, seed=2)}


def sweep(spec_path: str, cache, **kw):
    return run_sweep(build_grid(read_spec_file(spec_path)), SweepOptions(workers=0, cache_dir=str(cache), **kw))


# -- the spec -----------------------------------------------------------------------------------

def test_a_spec_expands_to_the_product_of_its_lists(tmp_path):
    path = write_sweep(tmp_path, small_graphs(), devices=[None, 1, 2], placement=["greedy", "layer"],
                       policy="fifo", spec=["h100", "a100"])
    grid = build_grid(read_spec_file(path))
    assert [g.name for g in grid.graphs] == ["tf.json", "mlp.yaml"]
    # Per graph: devices null keeps the file's placement (1), each count takes each placement (2 x 2);
    # times one policy (a single value is a list of one) and two machine specs.
    assert len(grid.points) == 2 * (1 + 2 * 2) * 1 * 2
    assert {(p.devices, p.placement) for p in grid.points} == {
        (None, "keep"), (1, "greedy"), (1, "layer"), (2, "greedy"), (2, "layer")}
    assert {p.spec_name for p in grid.points} == {"h100", "a100"}
    assert os.path.join(str(tmp_path), "tf.json") in grid.inputs and path in grid.inputs


def test_globs_are_relative_to_the_spec_and_never_pick_the_spec_itself(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.yaml").write_text(json.dumps(generate("chain", n=3)))
    (tmp_path / "models" / "side.npz").write_bytes(b"not a graph")
    (tmp_path / "models" / ".hidden.json").write_text(json.dumps(generate("chain", n=3)))
    path = write_sweep(tmp_path, {"b.yaml": generate("chain", n=4)}, graphs_field=["**/*.yaml", "*.yaml"],
                       spec=["h100"])
    # ``**/`` matches no folder too; the second pattern adds nothing new (each graph once, first place kept).
    assert [g.name for g in build_grid(read_spec_file(path)).graphs] == ["b.yaml", os.path.join("models", "a.yaml")]


SPEC_ERRORS = [
    ("graphs: [g.json]\ndevices: [1, 0]\n", "line 2, column 14 (at devices[1]): devices: a device count in [1, 1024]"),
    ("graphs: [g.json]\npolicies: [fifo]\n", "line 2, column 11 (at policies): unknown key 'policies'"),
    ("graphs: [/nonexistent/g.json]\n", "line 1, column 10 (at graphs[0]): /nonexistent/g.json: no such file"),
    ("graphs: [/dev/null.json]\n", "(at graphs[0]): /dev/null.json: no such file"),
    ("graphs: ['nothing/*.json']\n", "(at graphs[0]): 'nothing/*.json' matches no graph file"),
    ("graphs: [g.json]\npolicy: [pytorch, fastest]\n", "line 2, column 19 (at policy[1]): unknown policy 'fastest'"),
    ("graphs: [g.json]\nmode: run\nspec: [h100]\n", "spec applies to simulated points only"),
    ("graphs: [g.json]\nrepeat: 3\n", "repeat applies to mode: run only"),
    ("graphs: [g.json]\nscale: ['MmBackward0=fast']\n", "(at scale[0]): 'MmBackward0=fast': expected NAME=FACTOR"),
    ("graphs: [g.json]\nspec: [nosuch]\n", "(at spec[0]): nosuch: not a shipped spec"),
    ("graphs: [g.json]\ndevices: {a: 1}\n", "devices: expected a list of plain values"),
    ("- g.json\n", "line 1, column 1: a sweep spec is a mapping"),
    ("graphs: [g.json\n", "invalid YAML"),
    ("devices: [1]\n", "missing 'graphs'"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\ngraphs: [g.json]\n", "aliases expand to more than 100000 values"),
]


@pytest.mark.parametrize("text,message", SPEC_ERRORS, ids=[m[:40] for _, m in SPEC_ERRORS])
def test_a_bad_spec_is_an_error_naming_the_file_and_place(tmp_path, capsys, text, message):
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=3)))
    path = tmp_path / "s.yaml"
    path.write_text(text)
    code, out, err = run_cli(["sweep", str(path), "--workers", "0", "--cache", str(tmp_path / "c")], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"Error: {path}: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "c").exists()  # nothing ran


def test_a_spec_may_name_graphs_anywhere_but_only_regular_files(tmp_path, capsys, monkeypatch):
    shared = tmp_path / "shared"
    mine = tmp_path / "mine"
    shared.mkdir()
    mine.mkdir()
    (shared / "g.json").write_text(json.dumps(generate("chain", n=3)))
    (shared / "h.json").write_text(json.dumps(generate("chain", n=4)))
    os.symlink(shared / "h.json", mine / "h.json")  # a symlink out of the spec's folder is read too
    monkeypatch.setenv("HOME", str(tmp_path))
    (mine / "s.yaml").write_text(f"graphs: ['{shared / 'g.json'}', '../shared/g.json', '~/shared/*.json', "
                                 "'*.json']\n")
    grid = build_grid(read_spec_file(str(mine / "s.yaml")))
    # each file once (the first place kept), shown as given: absolute, or relative to the spec's folder
    assert [g.name for g in grid.graphs] == [str(shared / "g.json"), str(shared / "h.json")]
    fifo = mine / "pipe.json"
    os.mkfifo(fifo)
    (mine / "p.yaml").write_text("graphs: [pipe.json]\n")
    with pytest.raises(SweepSpecError, match=r"pipe.json: not a regular file"):
        build_grid(read_spec_file(str(mine / "p.yaml")))
    (mine / "q.yaml").write_text("graphs: ['*.json']\n")  # a glob keeps regular files only: the symlink's target
    assert [g.name for g in build_grid(read_spec_file(str(mine / "q.yaml"))).graphs] == ["h.json"]
    code, _, err = run_cli(["sweep", "-g", str(mine / "h.json"), "--spec", "h100", "--workers", "0",
                            "--cache", str(tmp_path / "c"), "--json"], capsys)
    assert code == 0, err


def test_a_too_large_spec_is_refused_before_it_is_parsed(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text("graphs: [g.json]\n" + "#" * (1 << 20))
    code, _, err = run_cli(["sweep", str(path)], capsys)
    assert code == 2 and "file is larger than 1 MiB" in err


def test_a_fifo_or_device_spec_is_refused_without_blocking(tmp_path, capsys):
    import os
    os.mkfifo(tmp_path / "pipe.yaml")
    code, _, err = run_cli(["sweep", str(tmp_path / "pipe.yaml")], capsys)
    assert code == 2 and "is a FIFO (named pipe), not a regular file" in err
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    code, _, err = run_cli(["sweep", str(tmp_path / "zero.yaml")], capsys)
    assert code == 2 and "is a character device" in err


def test_duplicate_keys_in_a_spec_are_refused(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("graphs: [a.json]\ndevices: [1]\ngraphs: [b.json]\n")
    code, _, err = run_cli(["sweep", str(path)], capsys)
    assert code == 2 and "line 3, column 1" in err and "duplicate key 'graphs'" in err


# -- the work of a point ------------------------------------------------------------------------

def test_each_simulated_point_is_what_simulate_session_says(tmp_path):
    path = write_sweep(tmp_path, small_graphs(), devices=[None, 1, 2], placement=["greedy", "round-robin"],
                       policy=["pytorch", "fifo", "critical-path"], spec=["h100"], scale=[None, "cuda:1=2.0"])
    report = sweep(path, tmp_path / "cache")
    assert report.failed == 0 and report.computed == len(report.rows) == 2 * 5 * 3 * 2
    for r in report.rows:
        g = load_graph(str(tmp_path / r["graph"]))  # a fresh load per point: nothing shared with the sweep
        want = simulate_session(g, SimOptions(spec="h100", devices=r["devices"], placement=r["placement"],
                                              policy=r["policy"], scale=r["scale"] or None, slack_top=0,
                                              scale_must_apply=False))
        got = (r["wall_ns"], r["engine_done_ns"], r["critical_path_ns"], r["nodes_executed"])
        assert got == (want.wall_ns, want.engine_done_ns, want.summary.critical_path_ns,
                       want.summary.nodes_executed), r
    # The scaling reached the simulation: cuda:1 twice as slow changes the two-device transformer.
    walls = {(r["graph"], r["devices"], r["placement"], r["policy"], r["scale"]): r["wall_ns"] for r in report.rows}
    assert walls[("tf.json", None, "keep", "pytorch", "cuda:1=2.0")] > walls[("tf.json", None, "keep", "pytorch", "")]


def test_really_run_points_have_the_structure_of_a_measurement(tmp_path):
    path = write_sweep(tmp_path, {"m.json": generate("mlp", layers=2, width=8)}, devices=[None, 2],
                       policy=["pytorch", "single-thread"], mode="run", repeat=3)
    report = sweep(path, tmp_path / "cache")
    assert report.failed == 0 and len(report.rows) == 4
    nodes = len(load_graph(str(tmp_path / "m.json")).nodes)
    for r in report.rows:
        assert r["mode"] == "run" and r["passes"] == 3 and r["wall_ns"] > 0 and r["p95_ns"] >= r["wall_ns"] // 2
        assert r["spec"] == "" and r["nodes"] == nodes
        assert r["nodes_executed"] == nodes + r["copies"]  # every node ran once per pass
        # The MLP's file is CPU-only; greedy placement on two devices uses one or both.
        assert r["devices_used"] == 0 if r["devices"] is None else 1 <= r["devices_used"] <= 2


# -- the cache ----------------------------------------------------------------------------------

def test_a_rerun_takes_every_point_from_the_cache_and_a_change_recomputes_only_its_points(tmp_path):
    path = write_sweep(tmp_path, small_graphs(), devices=[1, 2], policy=["pytorch", "fifo"], spec=["h100"])
    first = sweep(path, tmp_path / "cache")
    assert (first.computed, first.cached) == (8, 0)
    again = sweep(path, tmp_path / "cache")
    assert (again.computed, again.cached, again.ran_on) == (0, 8, "cache")
    assert stable_rows(again.rows) == stable_rows(first.rows)
    assert all(r["cached"] for r in again.rows)

    (tmp_path / "mlp.yaml").write_text(json.dumps(generate("mlp", layers=3, width=16, seed=99)))  # new bytes
    changed = sweep(path, tmp_path / "cache")
    assert (changed.computed, changed.cached) == (4, 4)
    assert {r["graph"] for r in changed.rows if not r["cached"]} == {"mlp.yaml"}

    # A damaged entry is a miss, not an error; --no-cache recomputes everything.
    entry = tmp_path / "cache" / first.rows[0]["key"][:2] / (first.rows[0]["key"] + ".json")
    entry.write_text("{not json")
    assert sweep(path, tmp_path / "cache").computed == 1
    assert sweep(path, tmp_path / "cache", use_cache=False).computed == 8


def test_the_key_depends_on_graph_side_files_point_and_tool():
    base = dict(graph_sha="a" * 64, side={}, point_fields={"devices": 2}, tool="0.1.0+x")
    k = point_key(**base)
    assert k == point_key(**base)
    for change in ({"graph_sha": "b" * 64}, {"side": {"g.npz": "c" * 64}}, {"point_fields": {"devices": 4}},
                   {"tool": "0.1.0+y"}):
        assert point_key(**{**base, **change}) != k


def test_the_machine_spec_content_not_its_name_is_in_the_key(tmp_path):
    spec_file = tmp_path / "m.json"
    from autograd_run.sim.specs import load_spec
    doc = load_spec("h100").to_dict()
    spec_file.write_text(json.dumps(doc))
    path = write_sweep(tmp_path, {"g.json": generate("mlp", layers=2, width=8)}, devices=[2], spec=["m.json"])
    first = sweep(path, tmp_path / "cache")
    doc["accelerator"]["min_kernel_us"] *= 10
    spec_file.write_text(json.dumps(doc))
    second = sweep(path, tmp_path / "cache")
    assert (second.computed, second.cached) == (1, 0)
    assert second.rows[0]["wall_ns"] > first.rows[0]["wall_ns"]


# -- failures -----------------------------------------------------------------------------------

def test_a_failing_point_is_reported_and_the_rest_complete(tmp_path, capsys):
    graphs = small_graphs()
    path = write_sweep(tmp_path, graphs, devices=[1, 2], placement=["keep", "greedy"], spec=["h100"],
                       graphs_field=[*graphs, "broken.json"])
    (tmp_path / "broken.json").write_text('{"format": "autograd-graph/1", "nodes": [], "roots": [{"node": "x"}]}')
    report = sweep(path, tmp_path / "cache")
    bad = [(r["graph"], r["devices"], r["placement"]) for r in report.rows if r["status"] == "error"]
    # keep on one device cannot hold the transformer's cuda:1; the broken file fails every point of it.
    assert bad == [("tf.json", 1, "keep"), ("broken.json", 1, "keep"), ("broken.json", 1, "greedy"),
                   ("broken.json", 2, "keep"), ("broken.json", 2, "greedy")]
    errors = {r["graph"]: r["error"] for r in report.rows if r["status"] == "error"}
    assert "the graph uses cuda:1; --devices 1 is too few" in errors["tf.json"]
    assert errors["broken.json"].startswith("broken.json: ")
    assert sum(r["status"] == "ok" for r in report.rows) == 12 - 5
    # Failures are not cached: the rerun tries them again (and the rest comes from the cache).
    again = sweep(path, tmp_path / "cache")
    assert (again.cached, again.computed, again.failed) == (7, 5, 5)

    code, out, err = run_cli(["sweep", path, "--workers", "0", "--cache", str(tmp_path / "cache")], capsys)
    assert code == 1 and "5 failed points" in out and "is too few" in out
    assert err == "Error: 5 of 12 points failed (the table of failed points says why)\n"


# -- outputs ------------------------------------------------------------------------------------

def test_results_csv_parquet_json_and_plots(tmp_path, capsys):
    path = write_sweep(tmp_path, small_graphs(), devices=[1, 2, 4], policy=["pytorch", "fifo"], spec=["h100"])
    out = tmp_path / "res"
    code, stdout, err = run_cli(["sweep", path, "--workers", "0", "--cache", str(tmp_path / "c"), "--out", str(out)],
                                capsys)
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 12 and {r["status"] for r in rows} == {"ok"}
    doc = json.loads((out / "results.json").read_text())
    assert doc["points"] == 12 and len(doc["best"]) == 2
    for best in doc["best"]:
        assert best["wall_ns"] == min(r["wall_ns"] for r in doc["rows"] if r["graph"] == best["graph"])
    import pyarrow.parquet as pq
    table = pq.read_table(out / "results.parquet")
    assert table.num_rows == 12 and table.column("wall_ns").to_pylist() == [int(r["wall_ns"]) for r in rows]
    from PIL import Image
    plots = sorted(os.listdir(out / "plots"))
    assert len(plots) == 2 and all(p.endswith(".png") for p in plots)
    for p in plots:
        with Image.open(out / "plots" / p) as im:
            im.verify()
            assert im.format == "PNG" and im.size[0] > 300
    # The table lists the fastest configuration of each graph first.
    assert stdout.index("tf.json") < stdout.index("mlp.yaml")


def test_svg_plots(tmp_path, capsys):
    path = write_sweep(tmp_path, {"g.json": generate("transformer", layers=1)}, devices=[1, 2], spec=["h100"])
    code, _, err = run_cli(["sweep", path, "--workers", "0", "--cache", str(tmp_path / "c"), "--out",
                            str(tmp_path / "o"), "--plot", "svg"], capsys)
    assert code == 0, err
    (svg,) = os.listdir(tmp_path / "o" / "plots")
    import xml.etree.ElementTree as ET
    assert ET.parse(tmp_path / "o" / "plots" / svg).getroot().tag.endswith("svg")


def test_outputs_never_overwrite_an_input(tmp_path, capsys):
    write_sweep(tmp_path, {"results.json": generate("chain", n=3)}, spec=["h100"])
    code, _, err = run_cli(["sweep", str(tmp_path / "sweep.yaml"), "--workers", "0", "--cache",
                            str(tmp_path / "c"), "--out", str(tmp_path)], capsys)
    assert code == 2 and err.startswith("Error: --out: ") and "is an input of this run" in err
    assert not (tmp_path / "c").exists() and not (tmp_path / "results.csv").exists()


def test_names_from_files_are_shown_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per row: the name is not folded
    name = "[bold red]x[reset]\x1b[2J.json"  # rich markup (no slash: it is a file name), a terminal escape
    (tmp_path / name).write_text(json.dumps(generate("chain", n=3)))
    code, out, _ = run_cli(["sweep", "-g", str(tmp_path / "*.json"), "--spec", "h100", "--workers", "0",
                            "--cache", str(tmp_path / "c")], capsys)
    assert code == 0
    assert "\x1b" not in out
    assert "[bold red]x[reset]\\x1b[2J.json" in out  # markup shown as text, the escape made visible


def test_a_quick_grid_from_options_as_json(tmp_path, capsys):
    for i in range(2):
        (tmp_path / f"g{i}.json").write_text(json.dumps(generate("random", nodes=20, leaves=4, seed=i)))
    code, out, err = run_cli(["sweep", "-g", str(tmp_path / "g*.json"), "--devices", "file,2", "--policy",
                              "pytorch,fifo", "--spec", "h100", "--workers", "0", "--cache", str(tmp_path / "c"),
                              "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["points"] == 2 * 2 * 2 and doc["failed"] == 0 and doc["ran_on"] == "this process"
    assert {(r["devices"], r["policy"]) for r in doc["rows"]} == {(None, "pytorch"), (None, "fifo"),
                                                                  (2, "pytorch"), (2, "fifo")}


def test_options_name_their_flag_in_errors(tmp_path, capsys):
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=3)))
    code, _, err = run_cli(["sweep", "-g", str(tmp_path / "g.json"), "--devices", "1,x"], capsys)
    assert code == 2 and err.startswith("Error: --devices: device counts are integers or 'file'")
    code, _, err = run_cli(["sweep", "-g", str(tmp_path / "g.json"), "--policy", "fast"], capsys)
    assert code == 2 and err.startswith("Error: --policy: unknown policy 'fast'")
    code, _, err = run_cli(["sweep", "-g", str(tmp_path / "g.json"), "--scheduler", "tcp://127.0.0.1:1",
                            "--workers", "2"], capsys)
    assert code == 2 and "--workers sizes the embedded cluster" in err
    code, _, err = run_cli(["sweep"], capsys)
    assert code == 2 and "no graphs" in err


@pytest.mark.parametrize("args, message", [
    (["--plot", "svg"], "Error: --plot goes with --out DIR (the plots are written to DIR/plots)\n"),
    (["--json", "--top", "5"], "Error: --top sets the rows of the table; --json holds every point\n"),
    (["--transfer", "path"], "Error: --transfer says how graphs reach Dask's workers; --workers 0 runs in this "
                             "process\n"),
])
def test_options_that_would_be_ignored_are_refused(tmp_path, capsys, args, message):
    code, out, err = run_cli(["sweep", "-g", "example:seed", "--workers", "0", "--cache", str(tmp_path), *args], capsys)
    assert (code, out, err) == (2, "", message)
    assert list(tmp_path.iterdir()) == []


def test_a_clear_message_when_the_extra_is_missing(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=3)))
    # The real command in a fresh interpreter where `distributed` cannot be imported.
    code = ("import sys; sys.modules['distributed'] = None\n"
            "from autograd_run.cli.main import main\n"
            f"main(['sweep', '-g', {str(tmp_path / 'g.json')!r}, '--spec', 'h100', '--cache', {str(tmp_path / 'c')!r}])")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("Error: the sweep runs on Dask distributed, which is not installed: "
                               "pip install 'autograd-run[sweep]'")


@pytest.mark.parametrize("blocked,args,code,expect", [
    ("pyarrow", ["--plot", "none"], 0, None),
    ("matplotlib", [], 2, "Error: plots need matplotlib: pip install 'autograd-run[sweep]' (or --plot none)"),
])
def test_without_pyarrow_or_matplotlib(tmp_path, blocked, args, code, expect):
    """Parquet is left out without pyarrow; plots without matplotlib are a clear error before any work."""
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=3)))
    argv = ["sweep", "-g", str(tmp_path / "g.json"), "--spec", "h100", "--workers", "0", "--cache",
            str(tmp_path / "c"), "--out", str(tmp_path / "o"), *args]
    prog = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"from autograd_run.cli.main import main\nmain({argv!r})")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == code, p.stderr
    if expect:
        assert p.stderr.startswith(expect) and not (tmp_path / "c").exists()
    else:
        assert sorted(os.listdir(tmp_path / "o")) == ["results.csv", "results.json"]


def test_a_scale_that_fits_some_points_only_leaves_the_others_unscaled_and_a_typo_is_told(tmp_path, capsys):
    """A grid crosses one scale with every device count: ``cuda:1=2.0`` has nothing to scale with one
    device, which is not an error there (the point is unscaled, ``scale_unused`` says so); a key that
    applies to no point at all is a typo, told on stderr."""
    path = write_sweep(tmp_path, small_graphs(), devices=[1, 2], placement=["greedy"], policy=["pytorch"],
                       spec=["h100"], scale=["cuda:1=2.0"])
    report = sweep(path, tmp_path / "cache")
    assert report.failed == 0
    one = [r for r in report.rows if r["devices"] == 1]
    two = [r for r in report.rows if r["devices"] == 2]
    assert one and all(r["scale_unused"] == "cuda:1" for r in one)
    assert two and all(r["scale_unused"] is None for r in two)
    assert report.scale_never_applied() == []
    path = write_sweep(tmp_path, small_graphs(), devices=[1], placement=["greedy"], policy=["pytorch"],
                       spec=["h100"], scale=["MmBackwrd0=0.5"])
    code, out, err = run_cli(["sweep", str(path), "--workers", "0", "--cache", str(tmp_path / "c2"), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["scale_never_applied"] == ["MmBackwrd0"]
    assert "Warning: --scale MmBackwrd0 named no op and no device in any point" in err


def test_a_fully_cached_rerun_never_imports_dask(tmp_path):
    """Answered from the cache: no cluster, and not even Dask's import (0.5 s with the pandas it brings),
    while a missing Dask is still told before any work."""
    pytest.importorskip("distributed")
    path = write_sweep(tmp_path, small_graphs(), devices=[1, 2], policy=["pytorch", "fifo"], spec=["h100"])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    script = ("import sys\nfrom autograd_run.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
              "except SystemExit as e:\n    print('exit', e.code, 'distributed' in sys.modules, file=sys.stderr)\n")
    first = subprocess.run([sys.executable, "-c", script, "sweep", path, "--workers", "0"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.stderr.strip().endswith("exit 0 False"), first.stderr
    again = subprocess.run([sys.executable, "-c", script, "sweep", path], env=env,  # an embedded cluster, if needed
                           capture_output=True, text=True, timeout=120)
    assert again.stderr.strip().endswith("exit 0 False"), again.stderr
    assert "8 from the cache" in again.stdout and "(cache)" in again.stdout


def test_a_cached_rerun_copies_its_plots_and_table_without_matplotlib_or_pyarrow(tmp_path):
    """Each plot is kept in the cache under the hash of what it shows, the Parquet table under the hash of its
    cells: a rerun whose points are all cached writes the same plots without importing matplotlib, and once
    its table was written the same table without importing pyarrow; a point that changes draws its graph's
    plot anew; --no-cache draws every plot."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("pyarrow")
    path = write_sweep(tmp_path, small_graphs(), devices=[1, 2], policy=["pytorch", "fifo"], spec=["h100"])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    script = ("import sys\nfrom autograd_run.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
              "except SystemExit as e:\n    print('exit', e.code, 'matplotlib' in sys.modules, 'pyarrow' in sys.modules,"
              " file=sys.stderr)\n")

    def sweep_out(out, *more):
        p = subprocess.run([sys.executable, "-c", script, "sweep", path, "--workers", "0", "--out",
                            str(tmp_path / out), *more], env=env, capture_output=True, text=True, timeout=120)
        plots = sorted((tmp_path / out / "plots").iterdir())
        return (p.stderr.strip().splitlines()[-1], {f.name: f.read_bytes() for f in plots},
                (tmp_path / out / "results.parquet").read_bytes())
    status, first, _ = sweep_out("a")
    assert status == "exit 0 True True" and len(first) == 2
    status, again, table = sweep_out("b")  # every point from the cache: a new table (its rows say so)
    assert status == "exit 0 False True" and again == first
    status, again, same = sweep_out("b2")
    assert status == "exit 0 False False" and again == first and same == table
    import pyarrow.parquet as pq
    assert pq.read_table(tmp_path / "b2" / "results.parquet").to_pylist() == \
        pq.read_table(tmp_path / "b" / "results.parquet").to_pylist()
    (tmp_path / "mlp.yaml").write_text(json.dumps(generate("mlp", layers=5, width=16, seed=2)))  # more nodes
    status, changed, _ = sweep_out("c")
    assert status == "exit 0 True True"
    tf = [n for n in first if n.startswith("tf")]
    assert [changed[n] for n in tf] == [first[n] for n in tf]  # copied from the cache
    assert [n for n in changed if n.startswith("mlp")] and not set(changed) - set(first) - {
        n for n in changed if n.startswith("mlp")}
    status, _, _ = sweep_out("d", "--no-cache")
    assert status == "exit 0 True True"


def test_a_kept_file_that_cannot_be_copied_is_a_miss(tmp_path):
    """copy_derived: no kept file, or a copy that fails, is a miss (False), never an error of its own; the
    caller then makes the file and reports a problem with its path itself. keep_derived passes over a cache
    it cannot write."""
    from autograd_run.sweep.cache import copy_derived, derived, keep_derived
    made = tmp_path / "plot.png"
    made.write_bytes(b"picture")
    kept = derived(str(tmp_path / "cache"), "ab" * 32, ".png")
    assert not copy_derived(kept, str(tmp_path / "out.png"))
    keep_derived(str(made), kept)
    assert open(kept, "rb").read() == b"picture"
    assert copy_derived(kept, str(tmp_path / "out.png")) and (tmp_path / "out.png").read_bytes() == b"picture"
    assert not copy_derived(kept, str(tmp_path / "no-such-folder" / "out.png"))  # was a RequestError
    (tmp_path / "file").write_text("")
    keep_derived(str(made), derived(str(tmp_path / "file"), "cd" * 32, ".png"))  # a file where a folder goes


# -- memory: a point's simulation is freed once its row is taken -----------------------------------

@pytest.mark.parametrize("mode", ["simulate", "run"])
def test_no_point_keeps_its_simulation_or_placed_graph_alive_once_its_row_is_taken(tmp_path, mode):
    """A simulation leaves its simulator, workers, queues and tasks in reference cycles holding the placed
    graph; a sweep that left them to the collector kept every point's (hundreds of MB each at 3e5 nodes)
    until a full collection that point after point never came. Looked at as each row arrives: none of the
    finished points' reports, simulators or placed graphs is still in memory, alive or uncollected garbage
    (``gc.get_objects`` lists both); only the loaded graph is."""
    import gc
    from autograd_run.graphs.model import Graph
    from autograd_run.session import RunReport
    from autograd_run.sim.scheduler import Simulator
    from autograd_run.sim.session import SimReport
    kinds = (Simulator, SimReport, RunReport, Graph)
    devices = [1, 2, 3, 4, 5, 6]
    extra = {"spec": ["h100"]} if mode == "simulate" else {"mode": "run", "repeat": 1}
    path = write_sweep(tmp_path, {"g.json": generate("chain", n=300 if mode == "simulate" else 301)},
                       devices=devices, **extra)  # a graph of its own: not one loaded by another test
    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, kinds)}
    seen = []

    def on_row(row):
        new = [type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds) and id(o) not in before]
        seen.append((row["devices"], row["status"], sorted(new)))

    report = sweep(path, tmp_path / "c", use_cache=False, on_row=on_row, batch=3)  # several points per task too
    assert (report.computed, report.failed) == (len(devices), 0)
    assert seen == [(d, "ok", ["Graph"]) for d in devices]  # the loaded graph, used by the next points
    gc.collect()
    # After the sweep, its graph is not kept in this process either (the in-process path drops it).
    assert [o for o in gc.get_objects() if isinstance(o, kinds) and id(o) not in before] == []


# -- the scheduler address ----------------------------------------------------------------------

@pytest.mark.parametrize("address, why", [
    ("junk", "no port number"),
    ("tcp://junk", "no port number"),
    ("tcp://host:x", "the port x is not a number in [1, 65535]"),
    ("tcp://host:0", "the port 0 is not a number in [1, 65535]"),
    ("tcp://host:65536", "the port 65536 is not a number in [1, 65535]"),
    ("tcp://:8786", "no host"),
    ("::1:8786", "an IPv6 host needs brackets, as in [::1]:8786"),
    ("[::1", "an IPv6 host is written [ADDRESS]:PORT"),
    ("[::1]", "no port number"),
    ("tcp://host :8786", "it holds blanks or control characters"),
    ("tcp://host:8786\n", "it holds blanks or control characters"),
    ("", "it is empty"),
    ("inproc://", "no location after inproc://"),
])
def test_a_malformed_scheduler_address_is_told_by_its_text(address, why):
    from autograd_run.errors import RequestError
    from autograd_run.sweep.cluster import check_scheduler_address
    with pytest.raises(RequestError) as info:
        check_scheduler_address(address)
    assert str(info.value) == f"{address} is not a Dask scheduler address: {why} (expected tcp://HOST:PORT)"
    assert info.value.option == "scheduler"


@pytest.mark.parametrize("address", ["tcp://10.0.0.5:8786", "10.0.0.5:8786", "tls://sched.example:8786",
                                     "ws://h:1", "tcp://[::1]:8786", "[fe80::1]:65535", "inproc://10.0.0.1/1/1"])
def test_a_well_formed_scheduler_address_passes_the_check_without_a_connection(address):
    from autograd_run.sweep.cluster import check_scheduler_address
    check_scheduler_address(address)  # nothing listens there: the check reads the text only


def test_an_unknown_address_scheme_is_told(capsys):
    from autograd_run.errors import RequestError
    from autograd_run.sweep.cluster import check_scheduler_address
    with pytest.raises(RequestError, match=r"^foo://h:1 is not a Dask scheduler address: unknown scheme 'foo' "
                                           r"\(known: tcp, tls, ws, wss, ucx, inproc; as in tcp://HOST:PORT\)$"):
        check_scheduler_address("foo://h:1")


def test_a_malformed_scheduler_is_refused_even_when_every_point_is_cached(tmp_path, capsys):
    """The address is checked before the cache is read: a typo in --scheduler is told, not hidden by a
    rerun answered from the cache (an address that parses is still not contacted then)."""
    path = write_sweep(tmp_path, {"g.json": generate("chain", n=5)}, devices=[1, 2], spec=["h100"])
    code, _, err = run_cli(["sweep", path, "--workers", "0", "--cache", str(tmp_path / "c")], capsys)
    assert code == 0, err
    code, out, err = run_cli(["sweep", path, "--scheduler", "junk", "--cache", str(tmp_path / "c")], capsys)
    assert (code, out, err) == (2, "", "Error: --scheduler: junk is not a Dask scheduler address: no port "
                                       "number (expected tcp://HOST:PORT)\n")
    code, out, err = run_cli(["sweep", path, "--scheduler", "tcp://127.0.0.1:1", "--cache", str(tmp_path / "c"),
                              "--json"], capsys)  # well formed, nothing listens there: never contacted
    assert code == 0 and json.loads(out)["cached"] == 2, err


def test_a_malformed_scheduler_is_one_error_line_at_once_from_the_command_line(tmp_path):
    """The real command in its own process (a Client left half-made used to be closed by its finalizer at
    exit: 20 s later, with a traceback after the error)."""
    import time
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=5)))
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "autograd_run.cli.main", "sweep", "-g", str(tmp_path / "g.json"),
                        "--scheduler", "junk", "--no-cache", "--cache", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (
        2, "", "Error: --scheduler: junk is not a Dask scheduler address: no port number (expected tcp://HOST:PORT)\n")
    assert time.monotonic() - t < 15
