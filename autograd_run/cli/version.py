"""``autograd-run --version``: the versions a bug report needs."""

from __future__ import annotations

import platform
import sys

import click


def _dist_version(name: str) -> str | None:
    import importlib.metadata  # 50-80 ms of imports every command would pay; only --version reads it
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_lines() -> list[str]:
    """The tool, Python, numpy, the engine core, and torch and cupy when installed (without importing them)."""
    import numpy

    from autograd_run import __version__
    from autograd_run.engine import core
    from autograd_run.graphs import seeding, validate
    lines = [f"autograd-run {__version__}",
             f"Python {platform.python_version()} ({platform.python_implementation()}, {sys.platform})",
             f"numpy {numpy.__version__}",
             f"engine: {core.WHY}",
             f"random tensors: {seeding.WHY}",
             f"graph loading: {validate.WHY}"]
    for dist, label in (("torch", "torch"), ("cupy-cuda12x", "cupy"), ("cupy", "cupy")):
        v = _dist_version(dist)
        if v is not None and not any(line.startswith(label + " ") for line in lines):
            lines.append(f"{label} {v}")
    if not any(line.startswith("torch ") for line in lines):
        lines.append("torch: not installed (capture and check need it: pip install 'autograd-run[torch]')")
    return lines


def show_version(ctx: click.Context, param, value) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo("\n".join(version_lines()))
    ctx.exit()
