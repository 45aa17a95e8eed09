import atexit
import os
import shutil
import sys
import tempfile
import threading

import pytest

#: Below this much free space a RAM-backed folder is not used for the session's temporary files.
_RAM_TMP_MIN_FREE = 4 << 30


def _ram_tmp_root() -> str | None:
    """/dev/shm where it is a writable, executable RAM file system with room, else None. On this project's
    machine a file created on the disk's ext4 takes about 1 ms among the thousands a run leaves in a folder
    (0.05 ms on tmpfs): the OpInfo pass alone writes two files per sample, and its max_pool ops took twice as
    long on the disk."""
    root = "/dev/shm"
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    if not os.access(root, os.W_OK | os.X_OK) or st.f_flag & getattr(os, "ST_NOEXEC", 8) \
            or st.f_flag & getattr(os, "ST_RDONLY", 1) or st.f_bavail * st.f_frsize < _RAM_TMP_MIN_FREE:
        return None
    return root


# The session's temporary files (pytest's tmp_path, tempfile's folders, the commands the tests start) go to a
# folder of their own: on a RAM file system where there is one with room (see _ram_tmp_root), removed when
# the process that made it (pytest's main process) exits. AUTOGRAD_RUN_TEST_TMP=PATH puts them under PATH
# (kept); AUTOGRAD_RUN_TEST_TMP=system leaves the system's temporary folder. The xdist workers inherit the
# folder from the main process, which makes it before it starts them.
if "AUTOGRAD_RUN_TEST_TMP_SESSION" not in os.environ:
    _choice = os.environ.get("AUTOGRAD_RUN_TEST_TMP", "")
    _root = None if _choice == "system" else (_choice or _ram_tmp_root())
    if _root:
        os.makedirs(_root, exist_ok=True)
        _session_tmp = tempfile.mkdtemp(prefix="autograd-run-tests-", dir=_root)
        if not _choice:
            atexit.register(shutil.rmtree, _session_tmp, ignore_errors=True)
    else:
        _session_tmp = ""
    os.environ["AUTOGRAD_RUN_TEST_TMP_SESSION"] = _session_tmp
if os.environ["AUTOGRAD_RUN_TEST_TMP_SESSION"]:
    os.environ["TMPDIR"] = os.environ["AUTOGRAD_RUN_TEST_TMP_SESSION"]
    tempfile.tempdir = os.environ["TMPDIR"]

# The suite never reads the user's own cache (a calibration there would change the simulation's default
# spec): a cache folder of its own for the whole session, in every worker and the commands tests start.
# Tests that want a calibration make one in it, or in their own folder.
if not os.environ.get("AUTOGRAD_RUN_TEST_CACHE"):
    os.environ["AUTOGRAD_RUN_TEST_CACHE"] = tempfile.mkdtemp(prefix="autograd-run-test-cache-")
os.environ["XDG_CACHE_HOME"] = os.environ["AUTOGRAD_RUN_TEST_CACHE"]

# Each pytest-xdist worker gets its share of the cores for PyTorch's intra-op (OpenMP) threads, which the
# commands and rank processes the tests start inherit. Two workers, each with one spinning OpenMP thread per
# core, made small kernels (OpInfo's max_pool samples) four times slower than one worker alone. Set before torch
# is imported; an OMP_NUM_THREADS the user gave is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1 and not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Deep torch graphs free recursively in C++; give threads a roomy stack.
threading.stack_size(64 * 1024 * 1024)

#: Modules of whole-program tests (model zoo, real torch.distributed ranks, the wheel in a fresh environment,
#: the CI recipes, a real browser, Dask clusters, Holistic Trace Analysis, fuzzing): marked ``slow``, which
#: ``make test-fast`` leaves out (``make test`` runs everything).
SLOW_MODULES = {"test_zoo", "test_ddp_ranks", "test_fsdp_ranks", "test_packaging", "test_ci_recipe",
                "test_perfetto_ui", "test_sweep_dask", "test_hta", "test_memory", "test_view", "test_fuzz",
                "test_hostile", "test_pytest_plugin", "test_interrupts", "test_profile_costs", "test_ddp_buckets",
                "test_engine_vs_oracle", "test_pt_oracle", "test_capture", "test_cli_errors", "test_diff",
                "test_opinfo", "test_bench_replay"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def engine_factory():
    """Engines made through this fixture are shut down after the test."""
    from autograd_run.engine import Engine
    made = []

    def make(**kw):
        e = Engine(**kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.shutdown(timeout=5)


@pytest.fixture(params=["abcde", "edcba"])
def abcde(request):
    """Five node names, given in both orders: a test written with them checks that the
    order does not depend on the names (as dask's test_order does)."""
    return request.param


@pytest.fixture(scope="session")
def pt_oracle_results(tmp_path_factory):
    """PyTorch's real Engine on two CPU-backed accelerator devices: every oracle scenario, recorded once
    for the whole run (the first xdist worker to ask runs it, the others read its results).

    Skips with the reason when the oracle cannot be built here (no torch, C++ compiler or ninja).
    """
    pytest.importorskip("torch")
    try:
        from tests.support import pt_oracle
        from tests.support.once import once
    except ImportError:  # tests/ itself is on sys.path, the repository root is not
        from support import pt_oracle
        from support.once import once
    problem = pt_oracle.toolchain_problem()
    if problem:
        pytest.skip(f"PyTorch multi-device oracle unavailable: {problem}")

    def record(folder):
        try:
            return {"results": pt_oracle.run_oracle(["all"], repeats=10, capture=True, timeout=840)}
        except pt_oracle.OracleUnavailable as exc:
            return {"unavailable": str(exc)}
    got = once(tmp_path_factory, "pt-oracle", record)
    if "unavailable" in got:
        pytest.skip(f"PyTorch multi-device oracle unavailable: {got['unavailable']}")
    return got["results"]
