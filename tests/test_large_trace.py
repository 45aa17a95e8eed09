"""A plain JSON trace over 100 MB is written, with one warning on stderr naming its size and the compact formats
(the limit is lowered here so that a small graph crosses it); other formats never warn."""

import os

import pytest
from click.testing import CliRunner

from autograd_run.cli.main import cli
from autograd_run.traces import trace_file


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(trace_file, "LARGE_JSON_BYTES", 4_000)


@pytest.mark.parametrize("command", [["run"], ["simulate"]])
def test_a_large_json_trace_is_written_with_a_warning(small_limit, tmp_path, command):
    out = tmp_path / "t.json"
    r = CliRunner().invoke(cli, [*command, "example:mlp", "--no-summary", "--trace", str(out)])
    assert r.exit_code == 0, r.output
    size = os.path.getsize(out)
    assert size > 4_000
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: the trace")]
    assert lines == [f"warning: the trace {out} is {size / 1e6:.0f} MB of plain JSON; the Perfetto UI may not open "
                     "it: for big graphs write .pftrace (Perfetto's protobuf, about 5x smaller) or .json.gz "
                     "(about 10x)"]


@pytest.mark.parametrize("name", ["t.pftrace", "t.json.gz", "t.kineto.json"])
def test_other_formats_do_not_warn(small_limit, tmp_path, name):
    r = CliRunner().invoke(cli, ["run", "example:mlp", "--no-summary", "--trace", str(tmp_path / name)])
    assert r.exit_code == 0, r.output
    assert "warning: the trace" not in r.stderr


def test_under_the_limit_nothing_is_said(tmp_path):
    r = CliRunner().invoke(cli, ["run", "example:mlp", "--no-summary", "--trace", str(tmp_path / "t.json")])
    assert r.exit_code == 0 and "warning: the trace" not in r.stderr


def test_the_path_is_shown_escaped(tmp_path):
    p = tmp_path / "a\nb.json"
    p.write_text("x" * 200)
    w = trace_file.large_trace_warning(str(p), "json", limit=100)
    assert "\n" not in w and "a\\nb.json" in w
