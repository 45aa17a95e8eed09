"""The cyclic collector around a loaded graph: promoted unexamined at load, frozen only by a one-shot command.

A 2e5-node graph is millions of objects; each collection that examines them costs ~0.5 s. Loading
moves the graph to the oldest generation without a scan, and ``main()`` (the process's one command)
freezes it; a command run from a library or a test must leave the collector as it found it.
"""

import gc
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from autograd_run.cli.main import cli
from autograd_run.graphs.load import gc_paused, load_graph


def test_a_loaded_graph_is_in_the_oldest_generation_and_nothing_is_frozen():
    assert gc.get_freeze_count() == 0
    g = load_graph("example:mlp")
    old = {id(o) for o in gc.get_objects(generation=2)}
    assert id(g) in old and id(g.nodes) in old
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_promotion_leaves_a_callers_frozen_objects_frozen():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with gc_paused(promote=True):
            fresh = [[] for _ in range(10)]
        assert gc.get_freeze_count() == before  # not emptied by a freeze/unfreeze round trip
        assert fresh
    finally:
        gc.unfreeze()


def test_promotion_keeps_the_collector_off_when_it_was_off():
    gc.disable()
    try:
        with gc_paused(promote=True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_command_run_in_process_freezes_nothing():
    r = CliRunner().invoke(cli, ["run", "example:mlp", "--no-summary"])
    assert r.exit_code == 0, r.output
    assert gc.get_freeze_count() == 0


def test_the_console_command_freezes_its_graph():
    code = textwrap.dedent("""
        import gc, sys
        from autograd_run.cli.main import main
        seen = []
        import autograd_run.session as s
        real = s.run_session
        def spy(graph, options=None):
            seen.append(gc.get_freeze_count())
            return real(graph, options)
        s.run_session = spy
        import autograd_run.cli.run_cmd  # noqa: F401 - imports run_session at call time
        try:
            main(["run", "example:mlp", "--no-summary"])
        except SystemExit as exc:
            assert not exc.code, exc.code
        print(seen[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 1000  # the graph and everything loaded before the run
