"""Text from files and users reaches the terminal escaped and never as rich markup.

A hostile graph names its nodes, variables and failure messages with terminal escape sequences (title
set, erase line), carriage returns, newlines that forge a line ``Error: all good``, and rich markup (a
link, an unbalanced closing tag). Every command shows them as visible escapes, in every table, title,
message and traceback, and prints bracketed paths as they are. Run as a user runs it: in a child process.
"""

import json
import os

import pytest

from builders import doc, leaf, node
from cli_proc import cli

#: Sets the terminal title, returns the carriage, erases the line, forges an error line, then rich markup.
EVIL = "x\x1b]0;pwned\x07\r\x1b[2KError: all good\n[link=http://evil.example]click[/link]x[/nope]"
#: How EVIL is shown: every control character visible, the markup as written.
SHOWN = "x\\x1b]0;pwned\\x07\\r\\x1b[2KError: all good\\n[link=http://evil.example]click[/link]x[/nope]"
MARKUP = "[link=http://evil.example]click[/link]x[/nope]"


def assert_safe(p, traceback_ok=False):
    text = p.out + p.err
    for c in ("\x1b", "\x07", "\r"):
        assert c not in text, f"raw {c!r} reached the terminal"
    assert not [line for line in p.lines if line.startswith("Error: all good")], "a forged line"
    assert "MarkupError" not in text
    if not traceback_ok:
        assert "Traceback (most recent call last)" not in text


def hostile(tmp_path, *, fail=None, trace=None, name="g.json", **fields):
    attrs = {}
    if fail is not None:
        attrs["fail"] = fail
    if trace is not None:
        attrs["trace"] = trace
    d = doc(node(EVIL, "SumBackward0", seq=1, next=["acc"], inputs=[[]], saved={"self_sym_sizes": [2]},
                 attrs=attrs or None),
            leaf(EVIL + "v", [2], id="acc"), **fields)
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def test_summary_tables_show_hostile_ids_escaped(tmp_path):
    p = cli([hostile(tmp_path)])
    assert p.code == 0, p.err
    assert_safe(p)
    assert SHOWN in p.out and MARKUP in p.out  # the slowest-nodes table, the variable's gradient row


def test_a_hostile_failure_message_stays_on_the_error_line(tmp_path):
    p = cli([hostile(tmp_path, fail=EVIL), "--no-summary"])
    assert p.code == 1
    assert_safe(p)
    assert p.err == f"Error: node '{SHOWN}' (SumBackward0): {SHOWN}\n"


def test_the_errors_table_escapes_messages(tmp_path):
    p = cli([hostile(tmp_path, fail=EVIL)], columns=400)
    assert p.code == 1
    assert_safe(p)
    assert f"│ {SHOWN}: {SHOWN} │" in p.out


def test_verbose_traceback_escapes_the_message_from_the_file(tmp_path):
    p = cli([hostile(tmp_path, fail=EVIL), "--no-summary", "--verbose"])
    assert p.code == 1
    assert_safe(p, traceback_ok=True)
    assert "Traceback (most recent call last):" in p.err
    assert f"RuntimeError: {SHOWN}" in p.err.splitlines()


def test_anomaly_forward_trace_is_escaped_line_by_line(tmp_path):
    p = cli([hostile(tmp_path, trace="  File \"m.py\", line 1\n" + EVIL), "--inject-nan", EVIL, "--anomaly",
             "--no-summary"])
    assert p.code == 1
    assert_safe(p)
    lines = p.err.splitlines()
    assert lines[0] == "Error detected in SumBackward0. Traceback of forward call that caused the error:"
    assert lines[1] == '    File "m.py", line 1'
    assert lines[2] == "  x\\x1b]0;pwned\\x07\\r\\x1b[2KError: all good"  # indented: it is the trace's line
    assert lines[-1].startswith("Error: node ")


def test_a_bracketed_trace_path_is_printed_as_it_is(tmp_path):
    folder = tmp_path / "data[test]"
    folder.mkdir()
    p = cli(["example:seed", "--trace", "data[test]/t.json"], cwd=tmp_path)
    assert p.code == 0, p.err
    assert "trace written to data[test]/t.json (open it" in p.out
    assert (folder / "t.json").exists()


def test_hostile_file_names_are_escaped(tmp_path):
    evil_name = "g\x1b[2J[bold]b[link=x]\n.json"
    good = hostile(tmp_path)
    os.rename(good, tmp_path / evil_name)
    p = cli(["validate", evil_name, "missing\rError: all good.json"], cwd=tmp_path)
    assert p.code == 2
    assert_safe(p)
    assert p.out.startswith("g\\x1b[2J[bold]b[link=x]\\n.json: 2 nodes")
    assert p.err == "Error: missing\\rError: all good.json: no such file\n"


def test_click_errors_escape_what_the_user_typed():
    p = cli(["example:seed", "--x\x1b[2J\nError: all good"])
    assert p.code == 2
    assert_safe(p)
    assert "Error: No such option '--x\\x1b[2J\\nError: all good'" in p.err
    p = cli(["example:seed", "y\x1b[2J\nError: all good"])  # click quotes this one with no repr
    assert p.code == 2
    assert_safe(p)
    assert "Error: Got unexpected extra argument (y\\x1b[2J\\nError: all good)" in p.err


def test_order_mismatch_lines_are_escaped(tmp_path):
    g = hostile(tmp_path)
    golden = tmp_path / "golden.jsonl"
    golden.write_text(json.dumps({"id": "y\x1b[2K\nError: all good", "name": "[bold]N[/x]", "seq": 1}) + "\n")
    p = cli([g, "--no-multithreading", "--no-summary", "--expect-order", golden])
    assert p.code == 3
    assert_safe(p)
    assert p.err.splitlines()[0] == (f"order differs at position 0: expected y\\x1b[2K\\nError: all good "
                                     f"([bold]N[/x], seq 1), got {SHOWN} (SumBackward0, seq 1)")


def test_simulate_shows_hostile_ids_escaped(tmp_path):
    p = cli(["simulate", hostile(tmp_path)])
    assert p.code == 0, p.err
    assert_safe(p)
    assert SHOWN in p.out


def test_check_shows_hostile_reference_escaped(tmp_path):
    g = hostile(tmp_path, meta={"reference": {"order": [[EVIL, 1, None]], "grads": {EVIL + "v": [1.0, 1.0]}}})
    p = cli(["check", g])
    assert p.code == 3
    assert_safe(p)
    assert SHOWN in p.out


@pytest.mark.parametrize("kind", ["summary", "json"])
def test_hostile_variable_names_in_gradients(tmp_path, kind):
    args = [hostile(tmp_path)] + (["--json"] if kind == "json" else [])
    p = cli(args)
    assert p.code == 0, p.err
    assert_safe(p)
    if kind == "json":
        assert EVIL + "v" in json.loads(p.out)["grads"]


def test_check_shows_a_hostile_hook_note_once_and_escaped(tmp_path):
    """The note (hook names from meta.hooks, opaque node ids) was printed a second time after the table,
    raw: its escape sequences reached the terminal and its newline forged a line."""
    g = hostile(tmp_path, meta={"reference": {"order": [[EVIL, 1, None]], "grads": {EVIL + "v": [5.0, 5.0]}},
                                "hooks": [{"tensor": EVIL}]})
    p = cli(["check", g], columns=1000)
    assert p.code == 3
    assert_safe(p)
    assert p.out.count("PyTorch ran hooks that the graph file does not hold") == 1 and SHOWN in p.out
