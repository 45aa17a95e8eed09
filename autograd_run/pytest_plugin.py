"""The pytest plugin: did the backward order of my model change? (the ``backward_order`` fixture)

Installed with the package (entry point ``pytest11``, named like this
module, so ``-p autograd_run.pytest_plugin`` is harmless and
``-p no:autograd_run.pytest_plugin`` turns it off). It does nothing unless
a test uses the fixture::

    def test_resnet_order(backward_order):
        model = resnet()
        loss = model(x).sum()
        backward_order.check(loss, model, name="resnet")

``check`` captures PyTorch's executed order of the backward
(``autograd_run.capture.golden``: PyTorch runs it once, multithreading off; the
leaves' ``.grad`` are left as they were and the graph is retained) and
compares it with ``__golden__/resnet.jsonl`` beside the test file, by node
identity (name and rank among the graph's nodes of that name; a leaf by its
name). A difference fails the test with the first divergence, the ready set
at that pop and why the expected node was not popped; a missing golden fails
with the command that creates it. A golden recorded with another PyTorch
version that still matches passes with a ``GoldenTorchVersion`` warning.

Options:

``--autograd-update-golden``  write or refresh the golden files instead of
    comparing (a golden that still matches, same PyTorch, is left alone);
``--autograd-obtained DIR``   for each failing check, write PyTorch's order
    now (``.jsonl``) and a Markdown report (``.md``) under DIR at the
    golden's path relative to the rootdir (default: a folder in pytest's
    basetemp), for CI job summaries (docs/ci.md).

Tests using the fixture get the ``backward_order`` marker (``pytest -m
backward_order`` runs just them). Golden files are written atomically, one
file at a time, so ``pytest-xdist`` workers may update goldens together;
the end-of-run summary counts checks from every worker (they travel in the
test reports' ``user_properties``).

Nothing heavy is imported until a check runs: torch and numpy stay out of
pytest runs that do not use the fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

import pytest

from autograd_run.errors import RequestError

GOLDEN_DIR = "__golden__"
MARKER = "backward_order"
#: The ``user_properties`` key of a check's outcome: ``(status, golden path relative to the rootdir)``.
PROPERTY = "autograd_run_golden"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_STATE = pytest.StashKey["_State"]()


class GoldenTorchVersion(UserWarning):
    """A golden order that still matches was recorded with another PyTorch version."""


class _State:
    """Per pytest process: which goldens this run has written, and the checks' outcomes for the summary.

    Registered as a plugin of its own (its hooks see the state); under
    xdist the controller's copy collects the outcomes from the workers'
    reports, and hands the workers one folder of *claims*, so that two
    tests on different workers cannot write different orders to one golden
    unnoticed.
    """

    def __init__(self, claims_dir: str | None = None):
        #: golden path -> (the test that claimed it in this run, digest of the order it wrote)
        self.claims: dict[Path, tuple[str, str]] = {}
        #: a folder shared by all xdist workers of this run (None: one process)
        self.claims_dir = claims_dir
        self._own_claims_dir = False
        #: (status, golden path relative to the rootdir), one per check
        self.outcomes: list[tuple[str, str]] = []
        #: --autograd-obtained, absolute (None: a folder in pytest's basetemp)
        self.obtained: Path | None = None

    def claim(self, path: Path, test: str, digest: str) -> tuple[str, str] | None:
        """Claim ``path`` for writing in this run: None for the first claim, else the earlier (test, digest)."""
        key = path.resolve()
        if key in self.claims:
            return self.claims[key]
        if self.claims_dir is not None:
            target = os.path.join(self.claims_dir, hashlib.sha256(str(key).encode()).hexdigest()[:40] + ".json")
            tmp = f"{target}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump([test, digest], f)
            try:
                os.link(tmp, target)  # atomic, and fails when another worker claimed it first
            except FileExistsError:
                with open(target, encoding="utf-8") as f:
                    self.claims[key] = tuple(json.load(f))
                return self.claims[key]
            finally:
                os.unlink(tmp)
        self.claims[key] = (test, digest)
        return None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """xdist, on the controller: every worker gets the same claims folder."""
        if not node.config.getoption("autograd_update_golden"):
            return
        if self.claims_dir is None:
            self.claims_dir, self._own_claims_dir = tempfile.mkdtemp(prefix="autograd-run-claims-"), True
        node.workerinput["autograd_run_claims"] = self.claims_dir

    def close(self) -> None:
        if self._own_claims_dir:
            shutil.rmtree(self.claims_dir, ignore_errors=True)

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == PROPERTY and isinstance(value, (tuple, list)) and len(value) == 2:
                self.outcomes.append((str(value[0]), str(value[1])))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.outcomes:
            return
        from autograd_run.text import visible
        counts: dict[str, int] = {}
        for status, _ in self.outcomes:
            counts[status] = counts.get(status, 0) + 1
        terminalreporter.write_sep("-", "autograd-run golden backward orders")
        known = ("matched", "differs", "missing", "unreadable", "created", "updated", "unchanged")
        terminalreporter.write_line(", ".join(f"{counts[s]} {s}" for s in known if s in counts))
        for status, path in sorted(self.outcomes, key=lambda o: o[1]):
            if status in ("created", "updated"):
                terminalreporter.write_line(f"  {status} {visible(path)}")


def pytest_addoption(parser):
    group = parser.getgroup("autograd-run", "golden backward orders (autograd-run)")
    group.addoption("--autograd-update-golden", action="store_true", default=False,
                    help="write or refresh the golden backward orders (__golden__/NAME.jsonl) instead of comparing")
    group.addoption("--autograd-obtained", metavar="DIR", default=None,
                    help="write PyTorch's order and a Markdown report of each failing backward_order check under "
                         "DIR (at the golden's path relative to the rootdir)")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARKER}: the test checks a golden backward order "
                                       "(added to every test that uses the backward_order fixture)")
    obtained = config.getoption("autograd_obtained", None)
    if obtained:  # relative to where pytest was started, whatever folder a test changes to
        obtained = (Path(config.invocation_params.dir) / obtained).resolve()
        if obtained == Path(config.rootpath).resolve():
            raise pytest.UsageError("--autograd-obtained: must not be the rootdir (the golden files would be "
                                    "overwritten); name a folder of its own")
    workerinput = getattr(config, "workerinput", None)  # on an xdist worker
    state = _State(workerinput.get("autograd_run_claims") if workerinput else None)
    state.obtained = obtained
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "autograd_run_golden_state")


def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is not None and config.pluginmanager.is_registered(state):
        config.pluginmanager.unregister(state)
        state.close()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if "backward_order" in getattr(item, "fixturenames", ()):
            item.add_marker(MARKER)


@pytest.fixture
def backward_order(request) -> "BackwardOrder":
    """Check a model's backward order against a golden one: ``backward_order.check(loss, params, name=...)``."""
    return BackwardOrder(request)


class BackwardOrder:
    """What the ``backward_order`` fixture gives a test."""

    def __init__(self, request):
        self._request = request
        self._config = request.config

    @property
    def updating(self) -> bool:
        return bool(self._config.getoption("autograd_update_golden"))

    def golden_path(self, name: str | None = None) -> Path:
        """``__golden__/NAME.jsonl`` beside the test file (NAME defaults to the test's name)."""
        __tracebackhide__ = True
        return Path(self._request.path).parent / GOLDEN_DIR / f"{self._name(name)}.jsonl"

    def check(self, outputs, params: Any = None, *, name: str | None = None, inputs=None,
              grad_outputs=None) -> list[dict]:
        """Capture PyTorch's backward order of ``outputs`` and compare it with the golden (or write it).

        ``params`` names the leaves: a module (its ``named_parameters()``), a
        mapping of name to tensor, or a sequence of tensors (named by
        position, ``0``, ``1``, ...); other leaves are ``leaf<k>``. ``inputs``
        takes gradients for those tensors only (``torch.autograd.grad``);
        ``grad_outputs`` are the outputs' gradients (default: ones).
        ``name`` is the golden's file name (default: the test's name, with
        its class and parameters: ``TestNet-test_order-float32``).
        Returns PyTorch's order (golden rows).
        """
        __tracebackhide__ = True
        # `import a.b as b`, not `from a import b`: after an in-process pytester run restored sys.modules the
        # package may still hold a stale `golden` attribute whose RequestError is another class.
        import autograd_run.capture.golden as golden
        from autograd_run.text import visible
        path = self.golden_path(name)
        captured = golden.capture_order(outputs, _leaf_names(params), inputs=inputs, grad_outputs=grad_outputs)
        odd = _not_a_golden_file(path)
        if odd is not None:  # a link (an update would write through it, anywhere), a folder, a FIFO, a device
            self._record("unreadable", path)
            raise AssertionError(_lines(f"{self._show(path)}: {odd}",
                                        f"remove it, then: pytest --autograd-update-golden {self._nodeid()}"))
        if self.updating:
            self._update(path, captured)
            return captured.rows
        if not path.is_file():
            self._record("missing", path)
            got = self._obtained(path, captured, None)
            raise AssertionError(_lines(
                f"no golden backward order {self._show(path)} for {self._name(name)!r}",
                f"create it with: pytest --autograd-update-golden {self._nodeid()} (and commit "
                f"{self._show(path.parent)}/)",
                f"PyTorch's order now: {got}"))
        try:
            gold = golden.read_golden(str(path), "golden")
        except RequestError as exc:  # not a golden order (naming the line), or unreadable
            self._record("unreadable", path)
            raise AssertionError(_lines(f"cannot read the golden backward order: {visible(exc)}",
                                        f"refresh it with: pytest --autograd-update-golden {self._nodeid()}")) from None
        result = golden.compare(gold, captured)
        if result.ok:
            self._record("matched", path)
            if result.torch_note:
                warnings.warn(GoldenTorchVersion(f"{self._show(path)}: {result.torch_note}"), stacklevel=2)
            return captured.rows
        self._record("differs", path)
        got = self._obtained(path, captured, result)
        raise AssertionError(_lines(
            f"backward order of {self._name(name)!r} differs from {self._show(path)}",
            *result.lines(),
            f"PyTorch's order now: {got}",
            f"if the change is intended, refresh the golden: pytest --autograd-update-golden {self._nodeid()}"))

    # -- helpers ----------------------------------------------------------------------------------

    def _name(self, name: str | None) -> str:
        __tracebackhide__ = True
        if name is None:
            test = self._request.node.nodeid.split("::", 1)[-1]  # the class too: TestA::test_x, TestB::test_x
            name = re.sub(r"[^A-Za-z0-9_.-]+", "-", test).strip("-.") or "order"
            return name[:128]
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
            raise ValueError(f"backward_order: name {name!r} is not a file name: use letters, digits, "
                             "'_', '-' and '.' (not first), up to 128 characters")
        return name

    def _nodeid(self) -> str:
        from autograd_run.text import visible
        return shlex.quote(visible(self._request.node.nodeid))

    def _show(self, path: Path) -> str:
        """``path`` for a message: relative to where pytest was started when it lies below, else absolute."""
        from autograd_run.text import visible
        try:
            rel = os.path.relpath(path, self._config.invocation_params.dir)
        except ValueError:  # another drive
            rel = os.pardir
        return visible(os.path.abspath(path) if rel.startswith(os.pardir) else rel)

    def _rel(self, path: Path) -> Path:
        try:
            return Path(path).resolve().relative_to(Path(self._config.rootpath).resolve())
        except ValueError:
            return Path(*Path(path).resolve().parts[1:])

    def _record(self, status: str, path: Path) -> None:
        self._request.node.user_properties.append((PROPERTY, (status, self._rel(path).as_posix())))

    def _update(self, path: Path, captured) -> None:
        __tracebackhide__ = True
        import autograd_run.capture.golden as golden
        from autograd_run.text import visible
        keys = json.dumps([golden.node_key(r) for r in captured.rows] + [captured.torch])
        digest = hashlib.sha256(keys.encode()).hexdigest()
        earlier = self._config.stash[_STATE].claim(path, self._request.node.nodeid, digest)
        if earlier is not None:
            if earlier[1] != digest:
                raise AssertionError(_lines(
                    f"{self._show(path)}: another order was written there by {visible(earlier[0])} in this run",
                    "give each check its own name= (two different orders cannot share one golden)"))
            self._record("unchanged", path)  # another test of this run wrote the same order there
            return
        if path.is_file():
            try:
                old = golden.read_golden(str(path), "golden")
            except RequestError:
                old = None
            if old is not None and golden.compare(old, captured, explain_it=False).ok and old.torch == captured.torch:
                self._record("unchanged", path)
                return
            status = "updated"
        else:
            status = "created"
        path.parent.mkdir(parents=True, exist_ok=True)
        golden.write_golden(str(path), captured.rows, "golden")
        self._record(status, path)

    def _obtained(self, path: Path, captured, result) -> str:
        """Write PyTorch's order now and a Markdown report for CI; returns where (shown)."""
        __tracebackhide__ = True
        import autograd_run.capture.golden as golden
        from autograd_run.outputs import check_output_path
        from autograd_run.text import md_section
        root = self._config.stash[_STATE].obtained
        if root is None:
            root = self._request.getfixturevalue("tmp_path_factory").getbasetemp() / "autograd-obtained"
        out = root / self._rel(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        check_output_path(str(out), "obtained", [str(path)])
        golden.write_golden(str(out), captured.rows, "obtained")
        header = [f"test:     {self._request.node.nodeid}", f"golden:   {self._rel(path).as_posix()}",
                  f"obtained: {self._show(out)}"]
        if result is None:
            md = md_section("No golden backward order", header + ["", "create it with: pytest "
                                                                  f"--autograd-update-golden {self._nodeid()}"])
        else:
            md = result.markdown(header)
        from autograd_run.outputs import atomic_write
        atomic_write(str(out.with_suffix(".md")), md.encode(), "obtained")
        return self._show(out)


def _not_a_golden_file(path: Path) -> str | None:
    """Why ``path`` cannot be a golden order, or None: it is missing or a regular file. A symbolic link is refused
    (``--autograd-update-golden`` would write through it: a checked-out repository could aim one at any file the
    user can write), and so is anything else that is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link, not a golden order (a regular file): refusing to read or write through it"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a folder, a FIFO or a device), so not a golden order"
    return None


def _leaf_names(params: Any) -> Mapping[str, Any] | None:
    """``params`` as a name -> tensor mapping (a module's parameters, a mapping, or tensors by position)."""
    if params is None:
        return None
    import torch
    if isinstance(params, torch.nn.Module):
        names = dict(params.named_parameters())
    elif isinstance(params, Mapping):
        names = dict(params)
    elif isinstance(params, torch.Tensor):
        names = {"0": params}
    else:
        names = {str(k): t for k, t in enumerate(params)}
    for k, t in names.items():
        if not isinstance(k, str) or not isinstance(t, torch.Tensor):
            raise TypeError(f"backward_order: params must name tensors: {k!r} is a {type(t).__name__}")
    return names


def _lines(*lines: str) -> str:
    return "\n".join(lines)
