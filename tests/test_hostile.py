"""Every hostile corpus case through the CLI (``validate`` and ``run``), under memory and time limits.

Each must exit 2 with exactly one ``Error:`` line that names the file and
says what is wrong (``tests/hostile/expected.json``), and no traceback. The
corpus files are small; cases that need the file system (a FIFO, a link to
``/dev/zero``, a directory, a sparse file over the size cap (and one under it, but too big for the memory
the limits leave), the compressed
npz bomb, side files that are FIFOs) are made here in ``tmp_path``.
``tests/hostile/make_corpus.py`` writes the corpus.

The invocations run in children forked from one driver process
(``tests/hostile/driver.py``) with ``RLIMIT_AS`` of 2 GiB and a time limit
each: a fresh process per invocation without an interpreter start each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


from test_graph_hardening import _deflated_zero_member

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "hostile")
REPO = os.path.dirname(HERE)
MEM_LIMIT = 2 << 30
TIME_LIMIT = 30

SEED = json.dumps({"format": "autograd-graph/1", "roots": [{"node": "m", "grad": {"npz": "x"}}],
                   "variables": [{"name": "a", "shape": [2]}],
                   "nodes": [{"id": "m", "name": "MulBackward0", "next": [["acc", 0], None], "inputs": [{"shape": [2]}],
                              "saved": {"other": 2.0}},
                             {"id": "acc", "name": "AccumulateGrad", "variable": "a"}]})

def made_cases(tmp_path) -> dict[str, str]:
    """File-system cases: name -> expected message fragment."""
    cases = {}
    os.mkfifo(tmp_path / "fifo.json")
    cases["fifo.json"] = "is a FIFO (named pipe), not a regular file"
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    cases["zero.yaml"] = "is a character device, not a regular file"
    (tmp_path / "folder.json").mkdir()
    cases["folder.json"] = "is a directory"
    with open(tmp_path / "sparse.json", "wb") as f:
        f.truncate((4 << 30) + 1)
    cases["sparse.json"] = "larger than 4096 MiB"
    # under the cap, but more than the limited machine has for loading it: refused before it is read
    with open(tmp_path / "sparse_1g.json", "wb") as f:
        f.truncate((1 << 30) + 1)
    cases["sparse_1g.json"] = "file takes at least 9.0 GiB of memory, and"
    os.mkfifo(tmp_path / "fifo_side.npz")
    (tmp_path / "fifo_side.json").write_text(SEED.replace('{"npz": "x"}', '{"npz": "x", "file": "fifo_side.npz"}'))
    cases["fifo_side.json"] = "side file 'fifo_side.npz' is not a regular file"
    os.symlink("/dev/zero", tmp_path / "zero_side.npz")
    (tmp_path / "zero_side.json").write_text(SEED.replace('{"npz": "x"}', '{"npz": "x", "file": "zero_side.npz"}'))
    cases["zero_side.json"] = "lies outside the graph's folder"
    # The compressed bomb: a ~2 MB member that expands to 2 GiB, under a 2 GiB address space
    # (so a 1 GiB budget): refused from its header, before a byte of data is read.
    _deflated_zero_member(tmp_path / "bomb.npz", "x.npy", (1 << 28,))
    doc = json.loads(SEED)
    doc["roots"][0]["grad"] = "ones"
    doc["nodes"][0] = {"id": "m", "name": "SumBackward0", "next": [["acc", 0]], "inputs": [{"shape": []}],
                       "saved": {"self_sym_sizes": [2], "captured_extra": {"npz": "x"}}}
    (tmp_path / "bomb.json").write_text(json.dumps(doc))
    cases["bomb.json"] = "the graph needs 2.0 GiB of memory"
    return cases


def drive(invocations: list) -> dict:
    out = subprocess.run([sys.executable, os.path.join(CORPUS, "driver.py"), "--mem", str(MEM_LIMIT),
                          "--timeout", str(TIME_LIMIT)],
                         input=json.dumps(invocations), capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_every_hostile_case_fails_cleanly_under_limits(tmp_path):
    with open(os.path.join(CORPUS, "expected.json")) as f:
        expected = json.load(f)
    cases = [(name, CORPUS, frag) for name, frag in expected.items()]
    cases += [(name, str(tmp_path), frag) for name, frag in made_cases(tmp_path).items()]
    assert len(cases) > 70
    invocations = []
    for name, cwd, _ in cases:
        invocations.append([f"validate {name}", cwd, ["validate", name]])
        invocations.append([f"run {name}", cwd, [name, "--no-summary"]])
    results = drive(invocations)
    problems = []
    for name, _, frag in cases:
        for cmd in ("validate", "run"):
            r = results[f"{cmd} {name}"]
            lines = r["err"].splitlines()
            errors = [line for line in lines if line.startswith("Error:")]
            ok = (r["rc"] == 2 and len(errors) == 1 and errors[0].startswith(f"Error: {name}: ")
                  and frag in errors[0])
            ok = ok and not r["hang"] and not any(line.startswith("Traceback") for line in lines)
            if not ok:
                problems.append(f"{cmd} {name}: rc={r['rc']} hang={r['hang']} {r['seconds']}s\n{r['err'][-1500:]}")
    assert not problems, "\n\n".join(problems)
