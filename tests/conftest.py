import threading

import pytest

# Deep torch graphs free recursively in C++; give threads a roomy stack.
threading.stack_size(64 * 1024 * 1024)


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
