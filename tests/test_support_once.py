"""tests/support/once.py: work done once per test run, its result or its failure shared by every caller."""

import pytest

try:
    from tests.support.once import OnceFailed, once
except ImportError:  # tests/ itself is on sys.path, the repository root is not
    from support.once import OnceFailed, once


def test_the_first_caller_makes_it_and_the_others_read_it(tmp_path_factory):
    calls = []

    def make(folder):
        calls.append(folder)
        with open(f"{folder}/out.txt", "w") as f:
            f.write("x")
        return {"folder": folder, "n": [1, 2]}

    first = once(tmp_path_factory, "once-test-a", make)
    again = once(tmp_path_factory, "once-test-a", make)
    assert first == again == {"folder": calls[0], "n": [1, 2]} and len(calls) == 1
    assert once(tmp_path_factory, "once-test-b", lambda folder: 7) == 7


def test_a_failure_is_kept_and_given_to_every_caller_without_running_again(tmp_path_factory):
    calls = []

    def make(folder):
        calls.append(1)
        raise RuntimeError("the ranks missed their deadline")

    for _ in range(2):
        with pytest.raises(OnceFailed, match="RuntimeError: the ranks missed their deadline"):
            once(tmp_path_factory, "once-test-failed", make)
    assert calls == [1]
