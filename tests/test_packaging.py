"""The wheel works outside the repository: built, installed into a fresh virtual environment, run there."""

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(900)


def sh(args, cwd, env=None, timeout=600):
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args}: {out.stdout[-2000:]}{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    # Under pytest-xdist this module's tests may run on two workers, each building in the checkout: two builds at
    # once trip over each other's staging folder (autograd_run-0.1.0/: "No such file or directory"). A lock in
    # the folder the workers' temporary folders share makes them build one after the other.
    import fcntl
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    with open(shared / "packaging-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sh([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", str(out)], ROOT)
    return out


def test_the_sdist_carries_the_sources_examples_and_specs(dist):
    (sdist,) = dist.glob("*.tar.gz")
    names = tarfile.open(sdist).getnames()
    for must in ("autograd_run/engine/_core.c", "autograd_run/engine/csrc/core.h", "autograd_run/engine/csrc/route.c",
                 "autograd_run/graphs/_draw.c", "setup.py", "LICENSE", "autograd_run/graphs/examples/seed.yaml",
                 "autograd_run/sim/specs/h100.json", "autograd_run/parallel/networks/ib-ndr.json"):
        assert any(n.endswith(must) for n in names), must


def test_the_wheel_carries_package_data(dist):
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("autograd_run/engine/_core") and n.endswith(".so") for n in names), "compiled core"
    assert any(n.startswith("autograd_run/graphs/_draw") and n.endswith(".so") for n in names), "compiled drawing"
    for must in ("autograd_run/graphs/examples/seed.yaml", "autograd_run/graphs/examples/checkpoint.yaml",
                 "autograd_run/sim/specs/h100.json", "autograd_run/parallel/networks/nvlink-h100.json"):
        assert must in names, must
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: MIT" in meta and "Requires-Python: >=3.11" in meta


def test_the_wheel_runs_in_a_fresh_environment_outside_the_checkout(dist, tmp_path):
    (wheel,) = dist.glob("*.whl")
    venv = tmp_path / "venv"
    # Without the checkout on PYTHONPATH: pip would see its autograd_run.egg-info (made by the build) as the
    # package already installed, and install nothing.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOGRAD_RUN_PURE_PYTHON")}
    sh([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    sh([str(py), "-m", "pip", "install", "-q", str(wheel)], tmp_path, env)
    tool = str(venv / "bin" / "autograd-run")
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert "a" in sh([tool, "example:seed"], work, env)
    assert "example:seed" in sh([tool, "examples"], work, env)
    sh([tool, "gen", "chain", "--n", "100", "-o", "x.json"], work, env)
    assert "x.json" in sh([tool, "x.json"], work, env)
    assert "simulated" in sh([tool, "simulate", "example:mlp", "--spec", "a100"], work, env)
    version = sh([tool, "--version"], work, env)
    assert "engine: compiled core" in version and "autograd-run 0.1.0" in version
    assert "random tensors: compiled, in bulk" in version
    assert "graph loading: compiled" in version
    # it is the installed copy that ran, not the checkout
    where = sh([str(py), "-c", "import autograd_run; print(autograd_run.__file__)"], work, env)
    assert str(ROOT) not in where and str(venv) in where


def test_capture_without_torch_says_which_extra_to_install(tmp_path):
    script = tmp_path / "m.py"
    script.write_text("def main():\n    pass\n")
    # torch looks absent: importlib finds no spec for it
    code = ("import importlib.util\n"
            "orig = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: None if name == 'torch' else orig(name, *a)\n"
            "from autograd_run.cli.main import main\n"
            f"main(['capture', {str(script)!r}, '-o', {str(tmp_path / 'g.json')!r}])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr == "Error: capture needs PyTorch, which is not installed: pip install 'autograd-run[torch]'\n"
