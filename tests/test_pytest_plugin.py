"""The pytest plugin (autograd_run.pytest_plugin), run by pytester on real torch models.

Each test writes a small test file using the ``backward_order`` fixture and
runs pytest on it (in-process with ``-p autograd_run.pytest_plugin``; under
pytest-xdist and through the ``pytest11`` entry point in a subprocess).
"""

import json
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="the plugin checks PyTorch's orders (pip install 'autograd-run[torch]')")

import autograd_run  # noqa: E402

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.torch

PLUGIN = "autograd_run.pytest_plugin"
REPO = pathlib.Path(autograd_run.__file__).resolve().parents[1]

MODEL_TEST = """
import os, torch

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

def test_mlp(backward_order):
    m = model()
    h = m[1](m[0](torch.randn(3, 4)))
    if os.environ.get("AUTOGRAD_RUN_TEST_CHANGE"):
        h = h * 0.5
    loss = m[2](h).sum()
    rows = backward_order.check(loss, m, name="mlp")
    assert rows[0]["name"] == "SumBackward0"
    loss.backward()  # the graph is still there, the test goes on with it
    assert m[0].weight.grad is not None
"""


#: Plugins the inner runs go without: the cache, and hypothesis's (imported afresh by each in-process run: seconds).
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


def run(pytester, *args):
    return pytester.runpytest("-p", PLUGIN, *QUIET, *args)


@pytest.fixture(scope="module", autouse=True)
def imported_once():
    """What a check imports on first use (sympy, by PyTorch's first backward: seconds), imported here once.

    An in-process pytester run drops every module imported during it, so each run would import them again.
    """
    from autograd_run.capture import golden
    m = torch.nn.Linear(2, 2)
    golden.replay(golden.capture_order(m(torch.ones(1, 2)).sum(), dict(m.named_parameters())).doc)


def golden_rows(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


@pytest.fixture
def model_test(pytester, monkeypatch):
    monkeypatch.delenv("AUTOGRAD_RUN_TEST_CHANGE", raising=False)
    pytester.makepyfile(test_model=MODEL_TEST)
    return pytester.path / "__golden__" / "mlp.jsonl"


def test_update_writes_the_golden_then_it_passes(pytester, model_test):
    result = run(pytester, "--autograd-update-golden")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- autograd-run golden backward orders -*", "1 created",
                                 "  created __golden__/mlp.jsonl"])
    rows = golden_rows(model_test)
    assert [(r["name"], r["nth"], r["leaf"]) for r in rows[:3]] == [
        ("SumBackward0", 0, None), ("AddmmBackward0", 0, None), ("torch::autograd::AccumulateGrad", None, "2.bias")]
    assert {r["torch"] for r in rows} == {torch.__version__}
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["1 matched"])


def test_a_changed_model_fails_with_the_first_divergence(pytester, model_test, monkeypatch):
    run(pytester, "--autograd-update-golden").assert_outcomes(passed=1)
    monkeypatch.setenv("AUTOGRAD_RUN_TEST_CHANGE", "1")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ">       rows = backward_order.check(loss, m, name=\"mlp\")",
        "E       AssertionError: backward order of 'mlp' differs from __golden__/mlp.jsonl",
        "E       order differs at position 5 (after AccumulateGrad(2.weight)): "
        "expected TanhBackward0 #0, got MulBackward0 #0",
        "E       only now: MulBackward0 #0",
        "E       ready set at that pop, as this engine computes it *",
        "E         MulBackward0 #0 * <- popped",
        "E       TanhBackward0 #0 was not ready: it still waited for gradients from MulBackward0 #0",
        "E       PyTorch's order now: */autograd-obtained/__golden__/mlp.jsonl",
        "E       if the change is intended, refresh the golden: pytest --autograd-update-golden test_model.py::test_mlp",
        "test_model.py:13: AssertionError",
        "1 differs",
    ])
    assert "golden.py" not in result.stdout.str()  # the plugin's own frames are hidden
    now = next(line for line in result.outlines if "PyTorch's order now: " in line).split(": ", 1)[1]
    assert [r["name"] for r in golden_rows(now)].count("MulBackward0") == 1
    md = pathlib.Path(now).with_suffix(".md").read_text()
    assert md.startswith("### Backward order differs from the golden\n\n```text\ntest:     test_model.py::test_mlp\n")
    assert "expected TanhBackward0 #0, got MulBackward0 #0" in md
    assert golden_rows(model_test)[5]["name"] == "TanhBackward0"  # the golden is untouched


def test_a_missing_golden_fails_with_a_hint_to_create_it(pytester, model_test):
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E       AssertionError: no golden backward order __golden__/mlp.jsonl for 'mlp'",
        "E       create it with: pytest --autograd-update-golden test_model.py::test_mlp (and commit __golden__/)",
        "1 missing",
    ])
    assert not model_test.exists()


def test_a_golden_that_is_a_link_or_not_a_file_is_refused_not_written_through(pytester, model_test, tmp_path):
    """Found by a hostile review: a link at the golden's place had --autograd-update-golden overwrite the file it
    points to (any file the user can write, from a checked-out repository); a folder or a FIFO there was an
    internal traceback when updating and "no golden" when checking."""
    import os
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    model_test.parent.mkdir()
    os.symlink(precious, model_test)
    for args in (("--autograd-update-golden",), ()):
        result = run(pytester, *args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([
            "E       AssertionError: __golden__/mlp.jsonl: is a symbolic link, not a golden order (a regular file): "
            "refusing to read or write through it"])
    assert precious.read_text() == "keep me"
    os.unlink(model_test)
    os.mkfifo(model_test)
    for args in (("--autograd-update-golden",), ()):
        result = run(pytester, *args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["E       AssertionError: __golden__/mlp.jsonl: is not a regular file (a folder, "
                                     "a FIFO or a device), so not a golden order"])
        assert "RequestError" not in result.stdout.str()


def test_refreshing_leaves_a_matching_golden_alone_and_rewrites_a_changed_one(pytester, model_test, monkeypatch):
    run(pytester, "--autograd-update-golden").assert_outcomes(passed=1)
    before = model_test.read_bytes()
    # A test before it creates autograd nodes: every sequence number of the model moves, its order does not.
    pytester.makepyfile(test_aaa="import torch\n"
                                  "def test_first():\n"
                                  "    x = torch.ones(2, requires_grad=True)\n"
                                  "    for _ in range(40):\n"
                                  "        x = x * 2\n")
    result = run(pytester, "--autograd-update-golden")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["1 unchanged"])
    assert model_test.read_bytes() == before
    monkeypatch.setenv("AUTOGRAD_RUN_TEST_CHANGE", "1")
    result = run(pytester, "--autograd-update-golden")
    result.stdout.fnmatch_lines(["1 updated", "  updated __golden__/mlp.jsonl"])
    assert [r["name"] for r in golden_rows(model_test)].count("MulBackward0") == 1
    run(pytester).assert_outcomes(passed=2)


def test_order_tests_carry_a_marker(pytester, model_test):
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    run(pytester, "--autograd-update-golden").assert_outcomes(passed=2)
    result = run(pytester, "-m", "backward_order")
    result.assert_outcomes(passed=1, deselected=1)


def test_obtained_files_for_ci_go_where_asked(pytester, model_test, monkeypatch):
    run(pytester, "--autograd-update-golden").assert_outcomes(passed=1)
    monkeypatch.setenv("AUTOGRAD_RUN_TEST_CHANGE", "1")
    pytester.mkdir("sub")
    pytester.makeconftest("import pytest\n"
                          "@pytest.fixture(autouse=True)\n"
                          "def elsewhere(monkeypatch):  # DIR is where pytest started, not where a test went\n"
                          "    monkeypatch.chdir('sub')\n")
    run(pytester, "--autograd-obtained", "order-changes").assert_outcomes(failed=1)
    assert not (pytester.path / "sub" / "order-changes").exists()
    out = pytester.path / "order-changes" / "__golden__"
    assert sorted(p.name for p in out.iterdir()) == ["mlp.jsonl", "mlp.md"]
    assert "golden:   __golden__/mlp.jsonl" in (out / "mlp.md").read_text()
    result = run(pytester, "--autograd-obtained", ".")  # the goldens' own folder: refused before any test
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--autograd-obtained: must not be the rootdir*"])


def test_a_golden_of_another_torch_version_passes_with_a_warning(pytester, model_test):
    run(pytester, "--autograd-update-golden").assert_outcomes(passed=1)
    rows = [dict(r, torch="1.13.1") for r in golden_rows(model_test)]
    model_test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run(pytester)
    result.assert_outcomes(passed=1)  # (where the package is installed, pytest also warns that the in-process
    result.stdout.fnmatch_lines([     # run cannot rewrite the plugin module's asserts: not counted here)
        "*GoldenTorchVersion: __golden__/mlp.jsonl: the golden order was recorded with PyTorch 1.13.1; "
        f"this is PyTorch {torch.__version__}"])


def test_an_unreadable_golden_fails_naming_the_line(pytester, model_test):
    model_test.parent.mkdir()
    model_test.write_text("{not json\n")
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       AssertionError: cannot read the golden backward order: "
                                 "*mlp.jsonl: line 1: not JSON*", "1 unreadable"])


def test_default_names_and_bad_names(pytester):
    pytester.makepyfile(test_names="""
        import pytest, torch

        @pytest.mark.parametrize("k", [1, 2])
        def test_p(backward_order, k):
            w = torch.ones(3, requires_grad=True)
            backward_order.check((w * k).sum(), [w])

        def test_bad(backward_order):
            w = torch.ones(3, requires_grad=True)
            backward_order.check(w.sum(), [w], name="../escape")

        class TestNet:
            def test_p(self, backward_order):
                w = torch.ones(3, requires_grad=True)
                backward_order.check(w.exp().sum(), [w])
    """)
    result = run(pytester, "--autograd-update-golden")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["E       ValueError: backward_order: name '../escape' is not a file name*"])
    assert sorted(p.name for p in (pytester.path / "__golden__").iterdir()) == [
        "TestNet-test_p.jsonl", "test_p-1.jsonl", "test_p-2.jsonl"]
    assert golden_rows(pytester.path / "__golden__" / "test_p-1.jsonl")[-1]["leaf"] == "0"  # tensors named by position


def test_two_different_orders_cannot_share_a_golden(pytester):
    pytester.makepyfile(test_shared="""
        import torch

        def test_a(backward_order):
            w = torch.ones(3, requires_grad=True)
            backward_order.check((w * 2).sum(), {"w": w}, name="shared")

        def test_b(backward_order):
            w = torch.ones(3, requires_grad=True)
            backward_order.check((w * 2).exp().sum(), {"w": w}, name="shared")
    """)
    result = run(pytester, "--autograd-update-golden")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["E       AssertionError: __golden__/shared.jsonl: another order was written there "
                                 "by test_shared.py::test_a in this run"])


def with_package_on_path(monkeypatch, *more):
    """Subprocesses import this checkout's autograd_run (and ``more`` folders) first."""
    paths = [str(REPO), *map(str, more)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def test_under_xdist_workers_write_goldens_together(pytester, monkeypatch):
    """Two workers update goldens at once: whole files, one test writes a shared golden, a clash is caught."""
    pytest.importorskip("xdist")
    with_package_on_path(monkeypatch)
    pytester.makepyfile(test_a_clash="""
        import os, torch

        def test_depth(backward_order):  # each worker runs it, with another order: the second claim fails
            depth = 1 if os.environ["PYTEST_XDIST_WORKER"] == "gw0" else 2
            m = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(depth)])
            backward_order.check(m(torch.randn(2, 3)).sum(), m, name="one")
    """, test_many="""
        import pytest, torch

        @pytest.mark.parametrize("width", [2, 3, 4, 5])
        def test_width(backward_order, width):
            torch.manual_seed(width)
            m = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(width)])
            backward_order.check(m(torch.randn(2, 3)).sum(), m)
            head = torch.nn.Linear(3, 1)
            backward_order.check(head(torch.randn(2, 3)).sum(), head, name="head")  # every test, one golden
    """)
    # --dist each: both workers run every test, so each golden is claimed by both at about the same time.
    result = pytester.runpytest_subprocess("-p", PLUGIN, *QUIET, "-n", "2", "--dist", "each",
                                           "--autograd-update-golden")
    result.assert_outcomes(passed=9, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: __golden__/one.jsonl: another order was written there by "
                                 "test_a_clash.py::test_depth in this run"])
    # Counted on the controller, from both workers: the first claim of each golden wrote it, the rest found
    # their order there.
    result.stdout.fnmatch_lines(["*- autograd-run golden backward orders -*", "6 created, 11 unchanged"])
    names = sorted(p.name for p in (pytester.path / "__golden__").iterdir())
    assert names == ["head.jsonl", "one.jsonl", "test_width-2.jsonl", "test_width-3.jsonl", "test_width-4.jsonl",
                     "test_width-5.jsonl"]  # whole goldens only, no temporary files left
    assert len(golden_rows(pytester.path / "__golden__" / "test_width-5.jsonl")) == 1 + 5 * 4
    run(pytester, "test_many.py").assert_outcomes(passed=4)


# -- installation ------------------------------------------------------------------------------------

def entry_points():
    tomllib = pytest.importorskip("tomllib")
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["entry-points"]["pytest11"]


def test_the_entry_point_is_declared_under_the_module_name():
    # Named like the module: `-p autograd_run.pytest_plugin` then finds it registered already (another
    # name would make pytest refuse to register the same module twice).
    assert entry_points() == {PLUGIN: PLUGIN}


def test_pytest_loads_the_plugin_through_the_entry_point(pytester, monkeypatch, tmp_path_factory):
    """An installed distribution's ``pytest11`` entry point, as pip writes it, is enough (and stays cheap)."""
    site = tmp_path_factory.mktemp("site")
    info = site / "autograd_run_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: autograd-run-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points().items()))
    with_package_on_path(monkeypatch, site)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(test_cheap="""
        import sys

        def test_torch_stays_out(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("autograd_run.pytest_plugin")
            assert "torch" not in sys.modules and "numpy" not in sys.modules
    """)
    result = pytester.runpytest_subprocess(*QUIET, "--help")
    result.stdout.fnmatch_lines(["*--autograd-update-golden*", "*--autograd-obtained=DIR*"])
    pytester.runpytest_subprocess(*QUIET, "-p", "no:xdist").assert_outcomes(passed=1)
    both = pytester.runpytest_subprocess(*QUIET, "-p", "no:xdist", "-p", PLUGIN)
    both.assert_outcomes(passed=1)
    assert sys.modules.get("autograd_run") is autograd_run
