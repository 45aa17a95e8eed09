"""What a run shows is what happened: --json is always valid JSON, and gradients are visible."""

import json

import pytest

from builders import doc, leaf, node, run_cli


def strict_json(text: str):
    """Parse as RFC 8259 JSON: bare NaN / Infinity are refused."""
    def refuse(c):
        raise ValueError(f"not JSON: {c}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def complex_graph(tmp_path):
    """d = (a * 2).sum() for a complex a, backward from d with gradient 1+2j: a.grad = [2+4j, 2+4j]."""
    import numpy as np
    np.savez(tmp_path / "c.npz", g=np.array(1 + 2j, dtype=np.complex64))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc(
        node("sum", "SumBackward0", seq=1, next=["mul"], inputs=[{"shape": [], "dtype": "complex64"}],
             saved={"self_sym_sizes": [2]}),
        node("mul", "MulBackward0", seq=0, next=["acc_a", None], inputs=[{"shape": [2], "dtype": "complex64"}],
             saved={"other": 2.0}),
        {**leaf("a", [2]), "inputs": [{"shape": [2], "dtype": "complex64"}]},
        roots=[{"node": "sum", "grad": {"npz": "g"}}],
        variables=[{"name": "a", "shape": [2], "dtype": "complex64"}])))
    return path


def test_json_with_nan_gradients_is_valid_json(capsys):
    code, out, err = run_cli(["example:seed", "--inject-nan", "mul_b", "--json"], capsys)
    assert code == 0, err
    assert strict_json(out)["grads"]["a"] == ["NaN", "NaN"]


def test_json_with_infinite_gradients_is_valid_json(tmp_path, capsys):
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(doc(
        node("mul", "MulBackward0", seq=0, next=["acc_a", None], inputs=[[2]], saved={"other": 1e30}),
        leaf("a", [2]), roots=[{"node": "mul", "grad": [1e30, -1e30]}])))
    code, out, err = run_cli([str(path), "--json"], capsys)
    assert code == 0, err
    assert strict_json(out)["grads"]["a"] == ["Infinity", "-Infinity"]  # float32 overflows


def test_json_with_complex_gradients(complex_graph, capsys):
    code, out, err = run_cli([str(complex_graph), "--json"], capsys)
    assert code == 0, err
    assert strict_json(out)["grads"]["a"] == {"real": [2.0, 2.0], "imag": [4.0, 4.0]}


def test_complex_gradients_in_the_summary(complex_graph, capsys):
    code, out, err = run_cli([str(complex_graph)], capsys)
    assert code == 0, err
    grads = out[out.index("gradients (backward)"):]  # the gradients table (the memory table names a too)
    row = [line for line in grads.splitlines() if line.startswith("│ a ")][0]
    assert "4+8j" in row and "[2.+4.j, 2.+4.j]" in row


def test_a_small_gradient_shows_its_values(capsys):
    code, out, err = run_cli(["example:seed"], capsys)
    assert code == 0, err
    grads = out[out.index("gradients (backward)"):]  # the gradients table (the memory table names a too)
    row = [line for line in grads.splitlines() if line.startswith("│ a ")]
    assert row and "[5., 5.]" in row[0]


def test_requested_gradients_are_printed_without_the_summary(capsys):
    code, out, err = run_cli(["example:seed", "--grad", "--inputs", "a", "--no-summary"], capsys)
    assert code == 0, err
    assert "gradients (grad)" in out and "[5., 5.]" in out and "wall time" not in out


def test_backward_into_a_node_shows_what_it_accumulated(capsys):
    """PyTorch: d.backward(inputs=[s]) with s = b + c accumulates s.grad = [1, 1]; a.grad stays None."""
    code, out, err = run_cli(["example:seed", "--backward", "--inputs", "add", "--json"], capsys)
    assert code == 0, err
    assert strict_json(out)["grads"] == {"a": None, "add": [1.0, 1.0]}
    code, out, err = run_cli(["example:seed", "--backward", "--inputs", "add", "--no-summary"], capsys)
    assert code == 0 and "gradients (backward)" in out and "[1., 1.]" in out


def test_a_small_matrix_gradient_is_shown_on_its_rows_without_newlines(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["example:mlp"], capsys)
    assert code == 0, err
    row = [line for line in out.splitlines() if line.startswith("│ w_out ")][0]
    assert "[[" in row and "], [" in row and "\\n" not in out


def test_the_gradients_table_shows_twenty_rows_then_how_many_more():
    """A table of 1e5 rows takes minutes to draw: the first 20 gradients (values of small ones, names shown
    as written, never as markup), then '... N more'; --json has them all."""
    import io
    import types

    import numpy as np
    from rich.console import Console

    from autograd_run.cli.render import grads_table
    grads = {f"[bold]v{k}": np.full(2, float(k), dtype=np.float32) for k in range(25)}
    con = Console(file=io.StringIO(), width=120, color_system=None)
    con.print(grads_table(types.SimpleNamespace(mode="backward", grads=grads)))
    lines = con.file.getvalue().splitlines()
    rows = [line for line in lines if line.startswith("│ [bold]v")]
    assert [r.split()[1] for r in rows] == [f"[bold]v{k}" for k in range(20)]
    assert "[19., 19.]" in rows[-1] and any(line.startswith("│ ... 5 more ") for line in lines)
