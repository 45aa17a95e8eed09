"""The package's floors, read from its import statements (every module under ``autograd_run/``, parsed with
``ast``; imports inside functions and ``import_module`` calls count too): every import runs down the floors,
and no files import each other in a circle.

A unit is a top-level module or a package folder of ``autograd_run``. ``LAYERS`` orders them from the ground
up (docs/contributing.md says what each holds): a unit may import its own files, the units of lower floors
and, on its own floor, a sibling (the circle check keeps those one-way). A rule broken here is a package
problem to fix, not a rule to loosen.
"""

from __future__ import annotations

import ast
import pathlib

import autograd_run

ROOT = pathlib.Path(autograd_run.__file__).parent

LAYERS = [
    # leaves: errors and the small helpers every floor uses
    {"autograd_run", "errors", "text", "untrusted", "native_stderr", "stopping", "outputs"},
    {"ops"},
    {"graphs"},
    {"engine"},
    {"record"},
    {"analysis"},
    {"traces"},
    {"costs", "parallel"},
    {"sim"},
    {"capture", "draw", "check", "golden"},  # check, golden: the old paths of capture.check, capture.golden
    {"session", "compare", "pytest_plugin"},
    {"sweep"},
    {"cli", "__main__"},
]
FLOOR = {u: i for i, units in enumerate(LAYERS) for u in units}


def module_name(path: pathlib.Path) -> str:
    parts = ("autograd_run",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _compiled(package: str, name: str) -> bool:
    """``from autograd_run.engine import _core``: a compiled extension module (its C source beside it)."""
    folder = ROOT.joinpath(*package.split(".")[1:])
    return (folder / f"{name}.c").exists() or any(folder.glob(f"{name}.*.so"))


def imported(name: str, path: pathlib.Path) -> set[str]:
    """The ``autograd_run`` modules that module ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                base = ".".join(up + ([n.module] if n.module else []))
            # ``from autograd_run import traces`` imports the module; ``from x import name``, module x.
            for a in n.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    found.add(sub)
                elif not _compiled(base, a.name):
                    found.add(base)
        elif (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
              and isinstance(n.args[0].value, str)
              and getattr(n.func, "attr", getattr(n.func, "id", None)) in ("import_module", "__import__")):
            found.add(n.args[0].value)
    return {m for m in found if m == "autograd_run" or m.startswith("autograd_run.")} - {name}


IMPORTS = {name: imported(name, path) & set(MODULES) for name, path in MODULES.items()}


def unit(module: str) -> str:
    """``autograd_run.engine.run`` -> ``engine``; ``autograd_run`` itself -> ``autograd_run``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_is_read():
    assert {"autograd_run.ops.spec", "autograd_run.graphs.load", "autograd_run.engine.engine",
            "autograd_run.traces.order", "autograd_run.cli.main", "autograd_run.session"} <= set(MODULES)
    assert "autograd_run.session" in IMPORTS["autograd_run.cli.run_cmd"]  # inside a function
    assert "autograd_run.sim.order" in IMPORTS["autograd_run.capture.profile"]  # inside a function
    # ``from autograd_run.capture import from_torch``: the package's face, which imports capture.graph
    assert "autograd_run.capture" in IMPORTS["autograd_run.capture.golden"]
    assert "autograd_run.capture.graph" in IMPORTS["autograd_run.capture"]


def test_the_reader_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "autograd_run" / "engine"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("import autograd_run.errors\n"
                   "from . import tracer\n"
                   "from ..traces import order\n"
                   "from autograd_run.engine import _core\n"
                   "def f():\n"
                   "    from autograd_run.cli.main import main\n"
                   "    importlib.import_module('autograd_run.session')\n")
    assert imported("autograd_run.engine.x", src) == {
        "autograd_run.errors", "autograd_run.engine.tracer", "autograd_run.traces.order", "autograd_run.cli.main",
        "autograd_run.session"}  # the compiled _core is no module of the package's own


def test_every_unit_has_a_floor():
    assert {unit(m) for m in MODULES} - set(FLOOR) == set(), "a new module or folder: give it a floor in LAYERS"


def test_no_import_runs_up_the_floors():
    bad = [f"{a} -> {b} ({unit(a)} on floor {FLOOR[unit(a)]}, {unit(b)} on floor {FLOOR[unit(b)]})"
           for a, targets in sorted(IMPORTS.items()) for b in sorted(targets)
           if unit(a) != unit(b) and FLOOR[unit(b)] > FLOOR[unit(a)]]
    assert bad == []


def test_only_the_cli_imports_the_cli():
    bad = [(m, t) for m, targets in IMPORTS.items() if unit(m) not in ("cli", "__main__") for t in targets
           if unit(t) == "cli"]
    assert bad == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_files_import_each_other_in_a_circle():
    assert circles(IMPORTS) == []


#: A compiled part and its pure-Python twin: one class for its users (``engine.core.InputBuffer`` is one or the
#: other, chosen at import), so one name.
TWINS = {"InputBuffer"}


def test_no_two_classes_of_the_package_share_a_name():
    seen: dict[str, str] = {}
    twice = []
    for name, path in MODULES.items():
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(n, ast.ClassDef) and not n.name.startswith("_") and n.name not in TWINS:
                if n.name in seen:
                    twice.append(f"{n.name}: {seen[n.name]} and {name}")
                seen.setdefault(n.name, name)
    assert twice == []


def test_the_old_paths_still_import_for_one_release():
    """CHANGELOG: ``autograd_run.golden`` and ``autograd_run.check`` re-export their new modules; the
    public ``from autograd_run.capture import from_torch`` is the package's face."""
    import autograd_run.capture as capture
    import autograd_run.capture.check as new_check
    import autograd_run.capture.golden as new_golden
    import autograd_run.check as old_check
    import autograd_run.golden as old_golden
    from autograd_run.capture.graph import from_torch
    assert old_check.check_graph is new_check.check_graph
    assert old_golden.read_golden is new_golden.read_golden and old_golden.compare is new_golden.compare
    assert capture.from_torch is from_torch
