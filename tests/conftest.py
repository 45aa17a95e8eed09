import os
import tempfile
import threading

import pytest

# The suite never reads the user's own cache (a calibration there would change the simulation's default
# spec): a cache folder of its own for the whole session, in every worker and the commands tests start.
# Tests that want a calibration make one in it, or in their own folder.
if not os.environ.get("AUTOGRAD_RUN_TEST_CACHE"):
    os.environ["AUTOGRAD_RUN_TEST_CACHE"] = tempfile.mkdtemp(prefix="autograd-run-test-cache-")
os.environ["XDG_CACHE_HOME"] = os.environ["AUTOGRAD_RUN_TEST_CACHE"]

# Deep torch graphs free recursively in C++; give threads a roomy stack.
threading.stack_size(64 * 1024 * 1024)

#: Modules of whole-program tests (model zoo, real torch.distributed ranks, the wheel in a fresh environment,
#: the CI recipes, a real browser, Dask clusters, Holistic Trace Analysis, fuzzing): marked ``slow``, which
#: ``make test-fast`` leaves out (``make test`` runs everything).
SLOW_MODULES = {"test_zoo", "test_ddp_ranks", "test_fsdp_ranks", "test_packaging", "test_ci_recipe",
                "test_perfetto_ui", "test_sweep_dask", "test_hta", "test_memory", "test_view", "test_fuzz",
                "test_hostile", "test_pytest_plugin", "test_interrupts", "test_profile_costs", "test_ddp_buckets",
                "test_engine_vs_oracle", "test_capture", "test_cli_errors", "test_diff", "test_opinfo"}


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
def pt_oracle_results():
    """PyTorch's real Engine on two CPU-backed accelerator devices: every oracle scenario, recorded once.

    Skips with the reason when the oracle cannot be built here (no torch, C++ compiler or ninja).
    """
    pytest.importorskip("torch")
    try:
        from tests.support import pt_oracle
    except ImportError:  # tests/ itself is on sys.path, the repository root is not
        from support import pt_oracle
    problem = pt_oracle.toolchain_problem()
    if problem:
        pytest.skip(f"PyTorch multi-device oracle unavailable: {problem}")
    try:
        return pt_oracle.run_oracle(["all"], repeats=10, capture=True, timeout=840)
    except pt_oracle.OracleUnavailable as exc:
        pytest.skip(f"PyTorch multi-device oracle unavailable: {exc}")
