"""The sweep's ``**`` glob (``sweep.globbing``): glob's own matches on a tree without links to folders, and
a bounded, finite walk over a tree with a link loop (glob's recursive walk followed it for ever)."""

from __future__ import annotations

import glob
import os
import random
import subprocess
import sys

import pytest

from autograd_run.sweep import globbing


def _tree(root, rng):
    names = ["a", "b", "c.d", ".hid", "x y", "[k]"]
    for _ in range(40):
        depth = rng.randint(0, 3)
        folder = os.path.join(root, *(rng.choice(names[:5]) for _ in range(depth)))
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, rng.choice(names) + rng.choice([".json", ".yaml", ".txt"])), "w").close()


@pytest.mark.parametrize("pattern", ["**/*.json", "**", "a/**/*.yaml", "**/b/*", "*/**/?.json", "**/[ab].*",
                                     "**/[!a]*.json", "a/**", "**/.hid*", "**/x y/**/*.json"])
def test_matches_what_glob_matches_without_links(pattern, tmp_path):
    seed = random.randrange(1 << 30)
    print("seed", seed)
    _tree(str(tmp_path), random.Random(seed))
    full = os.path.join(str(tmp_path), pattern)
    # glob lists a file once per way two ``**`` can split its path ("x y/x y/b" for "**/x y/**"); a sweep
    # runs each graph once, so the same files, each once
    want = sorted({m for m in glob.glob(full, recursive=True) if os.path.isfile(m)})
    assert globbing.find(full) == want


def test_a_link_loop_ends_and_a_huge_walk_is_refused(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "g.json").write_text("{}")
    os.symlink(tmp_path, tmp_path / "m" / "loop")  # a link back to a parent folder
    assert globbing.find(os.path.join(str(tmp_path), "**/*.json")) == [str(tmp_path / "m" / "g.json")]
    monkeypatch.setattr(globbing, "MAX_ENTRIES", 2)
    with pytest.raises(globbing.GlobTooLarge, match="more than 2 folder entries"):
        globbing.find(os.path.join(str(tmp_path), "**/*.json"))


def test_sweep_over_a_link_loop_finishes(tmp_path):
    """The whole command a review ran: it never finished."""
    d = tmp_path / "models"
    d.mkdir()
    r = subprocess.run([sys.executable, "-m", "autograd_run", "gen", "chain", "--size", "3", "-o", str(d / "c.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    os.symlink(d, d / "again")
    r = subprocess.run([sys.executable, "-m", "autograd_run", "sweep", "-g", str(d) + "/**/*.json", "--policy",
                        "pytorch", "--no-cache", "--workers", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "c.json" in r.stdout + r.stderr
