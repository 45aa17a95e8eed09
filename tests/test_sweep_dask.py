"""Sweeps on a real Dask cluster, on 127.0.0.1 only: results identical to the in-process sweep, the cache,
failures, a worker process killed mid-sweep, Ctrl-C, the embedded LocalCluster and plots through the
command line, and the `dask scheduler` / `dask worker` set-up of the README (workers running other code
refused).

Every cluster a test starts is stopped by it, with timeouts; every wait is bounded in count and time.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

distributed = pytest.importorskip("distributed")

from autograd_run.graphs.generators import generate  # noqa: E402
from autograd_run.sweep.grid import build_grid  # noqa: E402
from autograd_run.sweep.runner import SweepOptions, run_sweep  # noqa: E402
from autograd_run.sweep.spec import read_spec_file  # noqa: E402
from builders import run_cli, stable_rows, write_sweep  # noqa: E402

pytestmark = pytest.mark.timeout(240)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_cluster(n: int = 2):
    return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address="127.0.0.1:0", silence_logs=50,
                                    preload=["autograd_run.sweep.worker_setup"])


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes on 127.0.0.1, shared by the tests that leave them as they are."""
    c = start_cluster()
    try:
        yield c.scheduler_address
    finally:
        c.close(timeout=30)


def graphs() -> dict[str, dict]:
    return {"tf.json": generate("transformer", layers=2, devices=2, seed=1),
            "mlp.yaml": generate("mlp", layers=3, width=16, seed=2),
            "dag.json": generate("random", nodes=60, leaves=8, seed=3)}


def sweep(path, cache, **kw):
    return run_sweep(build_grid(read_spec_file(str(path))), SweepOptions(cache_dir=str(cache), **kw))


@pytest.mark.parametrize("transfer", ["send", "path"])
def test_a_grid_on_the_cluster_is_exactly_the_sequential_result(tmp_path, cluster, transfer):
    path = write_sweep(tmp_path, graphs(), devices=[None, 1, 2, 4], placement=["greedy", "layer"],
                       policy=["pytorch", "fifo", "critical-path"], spec=["h100"])
    seq = sweep(path, tmp_path / "seq", workers=0)
    par = sweep(path, tmp_path / "par", scheduler=cluster, transfer=transfer, batch=2)
    assert par.ran_on.startswith(cluster) and par.failed == 0 and par.computed == len(par.rows) == 3 * 7 * 3
    assert stable_rows(par.rows) == stable_rows(seq.rows)


def test_really_run_points_on_the_cluster_have_the_sequential_structure(tmp_path, cluster):
    """Measurements differ run to run: the rows must agree in everything but the times."""
    path = write_sweep(tmp_path, {"m.json": generate("mlp", layers=2, width=8), "t.json": generate("transformer", layers=1)},
                       devices=[None, 2], policy=["pytorch", "single-thread"], mode="run", repeat=2)
    seq = sweep(path, tmp_path / "seq", workers=0)
    par = sweep(path, tmp_path / "par", scheduler=cluster)
    from autograd_run.sweep.results import VOLATILE
    timeless = ("wall_ns", "p95_ns", "critical_path_ns", "engine_done_ns", *VOLATILE)
    assert par.failed == 0 and len(par.rows) == 8
    assert [{k: v for k, v in r.items() if k not in timeless} for r in par.rows] == \
        [{k: v for k, v in r.items() if k not in timeless} for r in seq.rows]
    assert all(r["passes"] == 2 and r["wall_ns"] > 0 for r in par.rows)


@pytest.mark.parametrize("transfer", ["send", "path"])
def test_side_files_travel_with_their_graph_and_are_part_of_its_key(tmp_path, cluster, transfer):
    import numpy as np
    from builders import doc, leaf, mul, total
    d = doc(total("s", "m", seq=2, shape=[2]), mul("m", "acc_x", {"npz": "w"}, seq=1, shape=[2]), leaf("x", [2]))
    np.savez(tmp_path / "g.npz", w=np.array([2.0, 3.0], dtype=np.float32))
    path = write_sweep(tmp_path, {"g.json": d}, devices=[None, 2], policy=["pytorch", "single-thread"], mode="run")
    grid = build_grid(read_spec_file(path))
    assert grid.graphs[0].side.keys() == {"g.npz"} and str(tmp_path / "g.npz") in grid.inputs
    seq = sweep(path, tmp_path / "seq", workers=0)
    par = sweep(path, tmp_path / "par", scheduler=cluster, transfer=transfer)
    assert par.failed == seq.failed == 0 and [r["key"] for r in par.rows] == [r["key"] for r in seq.rows]
    np.savez(tmp_path / "g.npz", w=np.array([4.0, 5.0], dtype=np.float32))  # the same graph file, new values
    again = sweep(path, tmp_path / "par", scheduler=cluster, transfer=transfer)
    assert (again.cached, again.computed, again.failed) == (0, 4, 0)


def test_a_rerun_hits_the_cache_without_a_cluster(tmp_path, cluster):
    path = write_sweep(tmp_path, graphs(), devices=[1, 2], policy=["pytorch", "fifo"], spec=["h100"])
    first = sweep(path, tmp_path / "c", scheduler=cluster)
    assert (first.computed, first.cached) == (12, 0)
    again = sweep(path, tmp_path / "c", scheduler="tcp://127.0.0.1:1")  # nothing listens there: never contacted
    assert (again.computed, again.cached, again.ran_on) == (0, 12, "cache")
    assert stable_rows(again.rows) == stable_rows(first.rows)


def test_failing_points_are_reported_while_the_rest_complete(tmp_path, cluster):
    g = graphs()
    path = write_sweep(tmp_path, g, devices=[1, 2], placement=["keep", "greedy"], spec=["h100"],
                       graphs_field=[*g, "broken.yaml"])
    (tmp_path / "broken.yaml").write_text("format: autograd-graph/1\nnodes: [}\n")
    report = sweep(path, tmp_path / "c", scheduler=cluster)
    failed = {(r["graph"], r["devices"], r["placement"]): r["error"] for r in report.rows if r["status"] == "error"}
    assert "the graph uses cuda:1; --devices 1 is too few" in failed.pop(("tf.json", 1, "keep"))
    assert set(failed) == {("broken.yaml", d, p) for d in (1, 2) for p in ("keep", "greedy")}
    assert all(e.startswith("broken.yaml: line 2") for e in failed.values())
    assert report.failed == 5 and sum(r["status"] == "ok" for r in report.rows) == 16 - 5


def test_a_worker_killed_mid_sweep_is_survived_and_the_results_are_identical(tmp_path):
    # Points of a few tenths of a second each, one per task: work is in flight when the worker dies.
    path = write_sweep(tmp_path, {"r.json": generate("random", nodes=250, leaves=25, seed=5)},
                       devices=[2, 4, 6, 8], placement=["greedy", "round-robin"], policy=["pytorch", "fifo"],
                       spec=["h100"])
    seq = sweep(path, tmp_path / "seq", workers=0)
    cluster = start_cluster()
    killed: dict = {}
    try:
        with distributed.Client(cluster, set_as_default=False) as watcher:
            before = set(watcher.scheduler_info()["workers"])

            def kill_one_busy_worker(row):
                if killed:
                    return
                for _ in range(50):  # a bounded look for a worker with a task running
                    busy = [w for w, keys in watcher.processing().items() if keys]
                    if busy:
                        break
                    time.sleep(0.05)
                assert busy, "no task in flight to lose"
                pid = watcher.run(os.getpid, workers=[busy[0]])[busy[0]]
                killed.update(worker=busy[0], pid=pid, tasks=len(watcher.processing()[busy[0]]))
                os.kill(pid, signal.SIGKILL)

            par = sweep(path, tmp_path / "par", scheduler=cluster.scheduler_address, batch=1,
                        on_row=kill_one_busy_worker)
            after = set(watcher.scheduler_info()["workers"])
    finally:
        cluster.close(timeout=30)
    assert killed and killed["tasks"] >= 1
    with pytest.raises(ProcessLookupError):
        os.kill(killed["pid"], 0)
    assert killed["worker"] in before and killed["worker"] not in after  # the nanny started a new worker
    assert par.failed == 0 and par.computed == len(seq.rows) == 16
    assert stable_rows(par.rows) == stable_rows(seq.rows)


def test_a_result_lost_with_its_worker_before_it_was_fetched_is_computed_again(tmp_path):
    """A batch that finished on a worker killed before the sweep took its result is computed again and its rows
    are what the sequential sweep gives (not an error row, "the task was lost")."""
    path = write_sweep(tmp_path, {"r.json": generate("random", nodes=250, leaves=25, seed=5)},
                       devices=[2, 4, 6, 8], placement=["greedy", "round-robin"], policy=["pytorch", "fifo"],
                       spec=["h100"])
    seq = sweep(path, tmp_path / "seq", workers=0)
    cluster = start_cluster()
    killed: dict = {}
    try:
        with distributed.Client(cluster, set_as_default=False) as watcher:

            def kill_a_worker_holding_results(row):
                # while the first row is taken, wait for results finished on a worker and not taken yet
                if killed:
                    return
                held: dict = {}
                for _ in range(200):
                    held = {}
                    for key, where in watcher.who_has().items():
                        if str(key).startswith("autograd-run-sweep-") and where:
                            held.setdefault(where[0], []).append(key)
                    if sum(map(len, held.values())) >= 2:
                        break
                    time.sleep(0.01)
                worker = max(held, key=lambda w: len(held[w]))
                pid = watcher.run(os.getpid, workers=[worker])[worker]
                killed.update(worker=worker, results=len(held[worker]))
                os.kill(pid, signal.SIGKILL)

            par = sweep(path, tmp_path / "par", scheduler=cluster.scheduler_address, batch=1,
                        on_row=kill_a_worker_holding_results)
    finally:
        cluster.close(timeout=30)
    assert killed and killed["results"] >= 1
    assert par.failed == 0 and par.computed == len(seq.rows) == 16, [r.get("error") for r in par.rows
                                                                     if r["status"] == "error"]
    assert stable_rows(par.rows) == stable_rows(seq.rows)


def test_the_embedded_cluster_from_the_command_line_writes_results_and_a_plot(tmp_path, capsys):
    path = write_sweep(tmp_path, graphs(), devices=[1, 2, 4], policy=["pytorch", "fifo"], spec=["h100"])
    out = tmp_path / "res"
    code, stdout, err = run_cli(["sweep", path, "--workers", "2", "--cache", str(tmp_path / "c"), "--out", str(out),
                                 "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["ran_on"] == "LocalCluster, 2 worker processes" and doc["computed"] == 18 and doc["failed"] == 0
    seq = sweep(path, tmp_path / "seq", workers=0)
    assert stable_rows(doc["rows"]) == stable_rows(seq.rows)
    from PIL import Image
    pngs = sorted(glob.glob(str(out / "plots" / "*.png")))
    assert len(pngs) == 3
    for p in pngs:
        with Image.open(p) as im:
            im.verify()
            assert im.format == "PNG"


def _alive(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group."""
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split()[1:2] and not line.split()[1].startswith("Z")]


def test_ctrl_c_cancels_cleanly_and_keeps_finished_results(tmp_path):
    path = write_sweep(tmp_path, {"r.json": generate("random", nodes=250, leaves=25, seed=6)},
                       devices=[2, 3, 4, 5, 6, 7, 8], placement=["greedy", "round-robin", "layer"],
                       policy=["pytorch", "fifo"], spec=["h100"])
    cache = tmp_path / "c"
    env = dict(os.environ, PYTHONPATH=REPO)
    # A session of its own: SIGINT to its group is what Ctrl-C in a terminal sends (workers included).
    p = subprocess.Popen([sys.executable, "-m", "autograd_run.cli.main", "sweep", path, "--workers", "2", "--batch",
                          "1", "--cache", str(cache), "--out", str(tmp_path / "o")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(glob.glob(str(cache / "*" / "*.json"))) < 2 and p.poll() is None:
            time.sleep(0.1)
        assert p.poll() is None, "the sweep ended before it could be interrupted"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    err = err.decode()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.startswith("Error: interrupted: ") and err.count("\n") == 1
    rows = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    cancelled = [r for r in rows if r["status"] == "cancelled"]
    assert len(rows) == 42 and len(ok) >= 2 and cancelled and len(ok) + len(cancelled) == 42
    assert len(glob.glob(str(cache / "*" / "*.json"))) == len(ok)  # what finished is kept in the cache
    deadline = time.monotonic() + 30
    while _alive(p.pid) and time.monotonic() < deadline:  # worker processes go with the client
        time.sleep(0.2)
    assert _alive(p.pid) == []


def _dask(*args, env, log):
    return subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dask"), *args], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def _wait_workers(address: str, n: int) -> None:
    with distributed.Client(address, timeout="30s", set_as_default=False) as c:
        c.wait_for_workers(n, timeout=90)


@pytest.mark.timeout(300)
def test_dask_scheduler_and_worker_commands_and_a_worker_running_other_code(tmp_path, capsys):
    """The README's set-up: `dask scheduler`, `dask worker ADDRESS`, `autograd-run sweep --scheduler ADDRESS`."""
    path = write_sweep(tmp_path, graphs(), devices=[1, 2], spec=["h100"])
    env = dict(os.environ, PYTHONPATH=REPO)
    log = open(tmp_path / "dask.log", "wb")
    procs = []
    try:
        procs.append(_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                           "--scheduler-file", str(tmp_path / "sched.json"), env=env, log=log))
        deadline = time.monotonic() + 60
        while not (tmp_path / "sched.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads((tmp_path / "sched.json").read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        procs.append(_dask("worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                           "--dashboard-address", "127.0.0.1:0", env=env, log=log))
        _wait_workers(address, 1)
        code, out, err = run_cli(["sweep", path, "--scheduler", address, "--cache", str(tmp_path / "c"), "--json"],
                                 capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["ran_on"] == f"{address}, 1 workers" and doc["computed"] == 6 and doc["failed"] == 0

        # A worker importing another copy of the code (one file changed) is refused before any work.
        other = tmp_path / "other"
        shutil.copytree(os.path.join(REPO, "autograd_run"), other / "autograd_run",
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(other / "autograd_run" / "sim" / "policies.py", "a") as f:
            f.write("\n# a change\n")
        procs.append(_dask("worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                           "--dashboard-address", "127.0.0.1:0", env=dict(os.environ, PYTHONPATH=str(other)), log=log))
        _wait_workers(address, 2)
        code, out, err = run_cli(["sweep", path, "--scheduler", address, "--cache", str(tmp_path / "c2")], capsys)
        assert code == 2 and out == ""
        assert err.startswith("Error: the worker at tcp://127.0.0.1:") and "runs another autograd-run" in err
        assert not (tmp_path / "c2").exists() or not glob.glob(str(tmp_path / "c2" / "*" / "*.json"))
    finally:
        _stop(procs)
        log.close()


def test_an_unreachable_scheduler_is_a_clear_error(tmp_path):
    from autograd_run.errors import RequestError
    path = write_sweep(tmp_path, {"g.json": generate("chain", n=3)}, spec=["h100"])
    with pytest.raises(RequestError, match=r"^cannot reach the Dask scheduler at tcp://127.0.0.1:1: ") as info:
        sweep(path, tmp_path / "c", scheduler="tcp://127.0.0.1:1", connect_timeout_s=2)
    assert info.value.option == "scheduler"  # shown as `Error: --scheduler: ...` by the command line


def test_a_client_that_fails_to_start_is_closed_at_once_without_a_traceback(tmp_path):
    """An address that parses but whose connection fails inside Dask with other than an OSError (ucx: the
    backend is gone from Dask) left a half-made Client, closed by its finalizer at exit: 20 s later, with a
    traceback. The real command in its own process: one error line, at once."""
    (tmp_path / "g.json").write_text(json.dumps(generate("chain", n=5)))
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "autograd_run.cli.main", "sweep", "-g", str(tmp_path / "g.json"),
                        "--scheduler", "ucx://127.0.0.1:1", "--no-cache", "--cache", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=90, cwd=REPO)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.startswith("Error: --scheduler: cannot reach the Dask scheduler at ucx://127.0.0.1:1: ")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert time.monotonic() - t < 15


@pytest.mark.parametrize("address", ["junk", "foo://h:1", "tcp://h:x"])
def test_a_client_whose_start_fails_is_closed_with_its_event_loop(address):
    """Dask's own parsing errors (ValueError) leave the Client it was making open, its event loop thread
    running, until the collector frees it (the command line: at exit, its finalizer then waiting 20 s and
    printing a traceback). ``_open_client`` closes it before the error comes out: while the error (which
    refers to the half-made Client) is still held, no thread of it is left, and freeing it later does
    nothing more."""
    import gc
    import threading
    from autograd_run.sweep.cluster import _open_client
    threads = set(threading.enumerate())
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        t = time.monotonic()
        with pytest.raises(ValueError) as info:
            _open_client(distributed, address, timeout="5s", set_as_default=False)
        assert time.monotonic() - t < 5
        assert [th.name for th in set(threading.enumerate()) - threads if th.is_alive()] == []
        del info
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
