"""docs/ci.md works as written: its test file, its golden command, the GitHub job's steps and the GitLab script.

The page's code blocks are read from the page and run as plain shell
commands in a fresh project folder, in a subprocess as CI would, with
`autograd-run` and `pytest` on PATH and the plugin loaded through a
`pytest11` entry point (as `pip install` would install it). The install
steps are the only lines not run: this checkout stands in for them.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

torch = pytest.importorskip("torch", reason="the CI recipe checks PyTorch's orders")

import autograd_run  # noqa: E402

pytestmark = pytest.mark.torch

REPO = pathlib.Path(autograd_run.__file__).resolve().parents[1]
PAGE = REPO / "docs" / "ci.md"


def blocks(lang):
    return re.findall(rf"^```{lang}\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project as the page describes it, with `autograd-run` and `pytest` installed from this checkout."""
    root = tmp_path_factory.mktemp("project")
    (tmp_path_factory.getbasetemp() / "bin").mkdir(exist_ok=True)
    bin_dir = tmp_path_factory.getbasetemp() / "bin"
    for name, module in (("autograd-run", "autograd_run.cli.main"), ("pytest", "pytest")):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m {module} \"$@\"\n")
        exe.chmod(0o755)
    site = tmp_path_factory.mktemp("site")
    info = site / "autograd_run_ci-0.dist-info"  # the entry point pip writes for the package
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: autograd-run-ci\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nautograd_run.pytest_plugin = autograd_run.pytest_plugin\n")
    test_file = blocks("python")[0]
    first = test_file.splitlines()[0]
    assert first.startswith("# ")
    (root / first[2:]).parent.mkdir(parents=True)
    (root / first[2:]).write_text(test_file)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GITHUB_", "SCALE_HIDDEN"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(REPO), str(site)]),
               PYTEST_ADDOPTS="-p no:cacheprovider -p no:hypothesispytest",  # quieter, faster runs
               PYTEST_XDIST_AUTO_NUM_WORKERS="1")  # `-n auto` as written, one worker on a shared test machine
    return root, env


def sh(script, cwd, env, shell=("bash", "--noprofile", "--norc", "-eo", "pipefail", "-c")):
    return subprocess.run([*shell, script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def github_steps():
    (workflow,) = [yaml.safe_load(b) for b in blocks("yaml") if "jobs:" in b]
    (job,) = workflow["jobs"].values()
    return job["steps"]


def run_github_job(root, env, summary):
    """The job's `run:` steps as GitHub runs them (bash -eo pipefail; `if: failure()` after a failure)."""
    env = dict(env, GITHUB_STEP_SUMMARY=str(summary))
    summary.write_text("")
    failed, ran = False, []
    for step in github_steps():
        if "run" not in step:
            assert step["uses"].startswith(("actions/checkout@", "actions/setup-python@", "actions/upload-artifact@"))
            continue
        if step["name"] == "Install":
            assert step["run"].startswith('pip install "autograd-run[torch]" pytest pytest-xdist')
            continue
        if step.get("if") == "failure()" and not failed:
            continue
        result = sh(step["run"], root, env)
        ran.append((step["name"], result))
        failed = failed or result.returncode != 0
    return ran


def test_the_page_creates_the_golden_then_the_github_job_passes(project, tmp_path):
    root, env = project
    update = sh("pytest --autograd-update-golden", root, env)
    assert update.returncode == 0, update.stdout + update.stderr
    assert "created tests/__golden__/model.jsonl" in update.stdout
    ran = run_github_job(root, env, tmp_path / "summary.md")
    assert [name for name, _ in ran] == ["Backward-order tests"]  # the summary step only runs on a failure
    result = ran[0][1]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "1 matched" in result.stdout
    assert (tmp_path / "summary.md").read_text() == ""


def test_a_changed_model_fails_the_github_job_with_the_divergence_in_the_job_summary(project, tmp_path):
    root, env = project
    if not (root / "tests" / "__golden__" / "model.jsonl").exists():
        assert sh("pytest --autograd-update-golden", root, env).returncode == 0
    ran = run_github_job(root, dict(env, SCALE_HIDDEN="1"), tmp_path / "summary.md")
    (tests_name, tests), (summary_name, summary_step) = ran
    assert tests.returncode == 1 and "1 failed" in tests.stdout and "1 differs" in tests.stdout
    assert summary_name == "Order changes in the job summary"
    assert summary_step.returncode == 0, summary_step.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("### Backward order differs from the golden\n\n```text\n"
                              "test:     tests/test_model.py::test_model_backward_order\n"
                              "golden:   tests/__golden__/model.jsonl\n"
                              "obtained: order-changes/tests/__golden__/model.jsonl\n")
    assert "expected GeluBackward0 #0, got MulBackward0 #0" in summary
    assert (root / "order-changes" / "tests" / "__golden__" / "model.jsonl").is_file()
    # The failure the page shows is the failure the test prints (but for the seq number and where the order went).
    (example,) = [b for b in blocks("") if "AssertionError" in b]
    want = [re.sub(r"seq \d+", "seq N", line[4:]) for line in example.splitlines()
            if not line.startswith("E   PyTorch's order now: ")]
    got = [re.sub(r"seq \d+", "seq N", line[8:]) for line in tests.stdout.splitlines()
           if line.startswith("E       ") and "PyTorch's order now: " not in line]
    assert got == want


def test_a_changed_model_fails_the_gitlab_job_with_the_divergence_in_its_test_report(project):
    root, env = project
    if not (root / "tests" / "__golden__" / "model.jsonl").exists():
        assert sh("pytest --autograd-update-golden", root, env).returncode == 0
    (ci,) = [yaml.safe_load(b) for b in blocks("yaml") if "script:" in b]
    job = ci["backward-order"]
    install, *script = job["script"]
    assert install.startswith('pip install "autograd-run[torch]" pytest pytest-xdist')
    result = sh("\n".join(script), root, dict(env, SCALE_HIDDEN="1"), shell=("sh", "-e", "-c"))
    assert result.returncode == 1 and "1 failed" in result.stdout
    report = (root / job["artifacts"]["reports"]["junit"]).read_text()
    assert "expected GeluBackward0 #0, got MulBackward0 #0" in report
    assert all((root / p).exists() for p in job["artifacts"]["paths"])
