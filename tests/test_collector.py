"""The cyclic collector around a loaded graph: frozen only by a one-shot command, left alone by a library.

A 2e5-node graph is millions of objects; each collection that examines them costs ~0.5 s. ``main()``
running the process's own command line loads its graph with the collector off and freezes it; a
command run with an argument list or through click's runner (a library, a test), and every library
load, must leave the collector as it found it, so that a process loading graph after graph frees
each one's cycles. (The tests compare the frozen count before and after: they share a process.)
"""

import gc
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from autograd_run.cli.main import cli
from autograd_run.graphs.load import load_graph
from autograd_run.graphs.model import ensure_consumers


def test_a_library_load_leaves_the_collector_as_it_was_and_the_graph_collectable():
    frozen = gc.get_freeze_count()
    g = load_graph("example:mlp")
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.collect()
    ref = id(g.nodes[-1])  # a leaf's AccumulateGrad node: the nodes before it hold edges to it
    del g
    # A loaded graph holds no cycle (its edges point one way; consumers are made when first needed):
    # reference counting frees it, without the collector.
    assert ref not in {id(o) for o in gc.get_objects()}
    g = load_graph("example:mlp")
    ensure_consumers(g)  # the reverse edges make cycles: the collector frees them
    gc.collect()
    ref = id(g.nodes[-1])
    del g
    assert ref in {id(o) for o in gc.get_objects()}
    assert gc.collect() > 0
    assert ref not in {id(o) for o in gc.get_objects()}


def test_a_library_load_keeps_the_collector_off_when_it_was_off():
    gc.disable()
    try:
        load_graph("example:seed")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_command_run_in_process_freezes_nothing():
    from autograd_run.cli.main import main
    frozen = gc.get_freeze_count()
    for args in (["run", "example:mlp", "--no-summary"], ["simulate", "example:mlp", "--no-summary"],
                 ["validate", "example:mlp"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        assert gc.get_freeze_count() == frozen and gc.isenabled(), args
        try:
            main(args)  # with its own argument list: a call among others, not the process's command line
        except SystemExit as exc:
            assert not exc.code, args
        assert gc.get_freeze_count() == frozen and gc.isenabled(), args


_SPY = textwrap.dedent("""
    import gc, sys
    from autograd_run.cli.main import main
    seen = []
    import autograd_run.session as s
    real = s.run_session
    def spy(graph, options=None):
        seen.append((gc.get_freeze_count(), gc.isenabled()))
        return real(graph, options)
    s.run_session = spy
    sys.argv = ["autograd-run", *sys.argv[1:]]
    try:
        main()  # the process's own command line, as the console script runs it
    except SystemExit as exc:
        assert not exc.code, exc.code
    print(*seen[0])
""")


def test_the_console_command_freezes_its_graph():
    out = subprocess.run([sys.executable, "-c", _SPY, "run", "example:mlp", "--no-summary"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    frozen, enabled = out.stdout.split()[-2:]
    assert int(frozen) > 1000 and enabled == "True"  # the graph (and what was loaded before it) frozen


def test_a_console_command_whose_graph_fails_to_load_turns_the_collector_back_on(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "autograd-graph/1", "nodes": [], "roots": []}')
    code = textwrap.dedent("""
        import gc, sys
        from autograd_run.cli.main import main
        sys.argv = ["autograd-run", "run", sys.argv[1]]
        try:
            main()
        except SystemExit as exc:
            print(exc.code, gc.isenabled(), gc.get_freeze_count())
    """)
    out = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "True", "0"], (out.stdout, out.stderr)


def test_graphs_loaded_one_after_another_are_freed_as_they_go():
    """A process that loads graph after graph (a sweep worker, a test run) frees each one's cycles in the
    collector's normal course. (Moving each loaded graph to the oldest generation unscanned kept all 200
    of them here: objects moved that way do not count towards starting a full collection.)"""
    from autograd_run.graphs.model import Node

    def nodes_alive():
        return sum(1 for o in gc.get_objects() if type(o) is Node)
    per_graph = len(load_graph("example:mlp").nodes)
    gc.collect()
    before = nodes_alive()  # other tests' graphs in this process
    for _ in range(200):
        g = load_graph("example:mlp")
        del g
    assert nodes_alive() - before < 50 * per_graph
