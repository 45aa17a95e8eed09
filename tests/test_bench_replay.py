"""``python -m bench replay``: its draw takes the libraries in turns, and each case's outcome is what ``check``
found, on real transformers models (one exact, one with an opaque node) in fresh processes as the bench runs them."""

import os
import random

import pytest

from bench import replay_external as R


def test_the_draw_takes_the_libraries_in_turns_and_covers_the_pool():
    pool = [("timm", f"t{i}") for i in range(9)] + [("torchvision", "a"), ("torchvision.video", "v"), ("hf", "g")]
    got = list(R.draw(pool, random.Random(3)))
    assert sorted(got) == sorted(pool)
    libs = [src.partition(".")[0] for src, _ in got]
    assert sorted(libs[:3]) == ["hf", "timm", "torchvision"]  # one of each before any library's second
    assert sorted(libs[3:5]) == ["timm", "torchvision"]        # then the ones left
    assert list(R.draw(pool, random.Random(3))) == got          # the seed repeats the draw


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, outcome", [("gpt2", "exact"), ("reformer", "not compared")])
def test_a_case_is_what_check_found(tmp_path, name, outcome):
    pytest.importorskip("torch")
    pytest.importorskip("transformers", reason="the Hugging Face models need transformers (make test installs it)")
    env = dict(os.environ, PYTHONPATH=R.ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    row = R.one("hf", name, str(tmp_path), env, max_params=25_000_000, timeout=500)
    assert row["outcome"] == outcome, row
    if outcome == "not compared":  # Reformer's reversible Function recombines nested backward calls: opaque
        assert "_ReversibleFunction" in row["why"]
    assert row["nodes"] > 10 and row["dtype"] == "float64"
    assert R.one("hf", name, str(tmp_path), env, max_params=1000, timeout=500)["outcome"] == "too big"
