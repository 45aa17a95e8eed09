"""The package's layers, read from its import statements (every module under ``autograd_run/``,
parsed with ``ast``; imports inside functions count too).

    cli  ->  session, capture, check  ->  traces  ->  engine  ->  graphs  ->  ops
    pytest_plugin  ->  golden  ->  capture, traces, engine, graphs
                       (errors, outputs, text and untrusted are leaves anyone may use)

A rule broken here is a package problem to fix, not a rule to loosen.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import autograd_run

ROOT = pathlib.Path(autograd_run.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = ("autograd_run",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


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
            subs = {f"{base}.{a.name}" for a in n.names} & set(MODULES)
            found.update(subs)
            if len(subs) < len(n.names):
                found.add(base)
        elif (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
              and isinstance(n.args[0].value, str)
              and getattr(n.func, "attr", getattr(n.func, "id", None)) in ("import_module", "__import__")):
            found.add(n.args[0].value)
    return {m for m in found if m == "autograd_run" or m.startswith("autograd_run.")}


IMPORTS = {name: imported(name, path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    """``autograd_run.engine.run`` -> ``engine``; ``autograd_run`` itself -> ``autograd_run``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports_of(package: str) -> list[tuple[str, str]]:
    """(importing module, imported module) for every module of ``package``."""
    return sorted((m, t) for m, targets in IMPORTS.items() if layer(m) == package for t in targets)


def test_every_module_is_read():
    assert {"autograd_run.ops.spec", "autograd_run.graphs.load", "autograd_run.engine.engine",
            "autograd_run.traces.order", "autograd_run.cli.main", "autograd_run.session"} <= set(MODULES)
    assert ("autograd_run.cli.run_cmd", "autograd_run.session") in imports_of("cli")  # inside a function


def test_the_reader_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "autograd_run" / "engine"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("import autograd_run.errors\n"
                   "from . import tracer\n"
                   "from ..traces import order\n"
                   "def f():\n"
                   "    from autograd_run.cli.main import main\n"
                   "    importlib.import_module('autograd_run.session')\n")
    assert imported("autograd_run.engine.x", src) == {
        "autograd_run.errors", "autograd_run.engine.tracer", "autograd_run.traces.order", "autograd_run.cli.main",
        "autograd_run.session"}


RULES = {
    # package: (what it may import, in words)
    "ops": ({"ops", "errors"}, "ops imports only ops.* and errors"),
    "graphs": ({"graphs", "ops", "errors", "untrusted"}, "graphs imports only ops, the leaves errors and untrusted, and itself"),
    "text": ({"text"}, "text is a leaf"),
    "untrusted": ({"untrusted"}, "untrusted (reading untrusted files) is a leaf"),
    "pytest_plugin": ({"pytest_plugin", "golden", "outputs", "text", "errors"},
                      "the pytest plugin goes through golden (and the leaves)"),
}

FORBIDDEN = {
    "engine": {"traces", "cli", "session", "capture", "check"},
    "traces": {"cli", "session"},
    "golden": {"cli", "session", "pytest_plugin"},
}


@pytest.mark.parametrize("package", sorted(RULES))
def test_lower_layers_import_only_what_is_below_them(package):
    may, rule = RULES[package]
    bad = [(m, t) for m, t in imports_of(package) if layer(t) not in may]
    assert bad == [], rule


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_do_not_reach_up(package):
    bad = [(m, t) for m, t in imports_of(package) if layer(t) in FORBIDDEN[package]]
    assert bad == [], f"{package} must not import {sorted(FORBIDDEN[package])}"


def test_only_the_cli_imports_the_cli():
    # autograd_run.__main__ is the command line too: `python -m autograd_run`.
    bad = [(m, t) for m, targets in IMPORTS.items() if layer(m) not in ("cli", "__main__") for t in targets
           if layer(t) == "cli"]
    assert bad == []


def test_no_import_cycles_between_packages():
    edges: dict[str, set[str]] = {}
    for m, targets in IMPORTS.items():
        for t in targets:
            if layer(t) != layer(m):
                edges.setdefault(layer(m), set()).add(layer(t))
    cycles = set()

    def visit(node, path):
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt):]
                k = loop.index(min(loop))
                cycles.add(" -> ".join(loop[k:] + loop[:k] + [loop[k]]))
            else:
                visit(nxt, path + [nxt])
    for start in sorted(edges):
        visit(start, [start])
    assert sorted(cycles) == []
