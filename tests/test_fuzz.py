"""A CI-sized batch of the structure-aware fuzzer (``bench/fuzz.py``): no tracebacks, hangs,
memory-limit breaches or malformed error lines. The full run (10,000 cases) is
``python -m bench.fuzz``."""

from bench.fuzz import run_fuzz


def test_fuzz_batch_finds_no_tracebacks_hangs_or_breaches(tmp_path):
    s = run_fuzz(cases=300, seed=20_161, workers=2, timeout=30, mem=3 << 30, out=str(tmp_path), quiet=True)
    assert sum(s["exit_codes"].values()) == 300
    found = {k: [(e["case"], e["steps"], e["detail"][-500:]) for e in s[k]]
             for k in ("traceback", "hang", "breach", "message")}
    assert not any(found.values()), found
