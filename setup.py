"""Build the engine's compiled core (optional: without a C compiler the pure-Python twin is used).

Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("autograd_run.engine._core", ["autograd_run/engine/_core.c"],
                             extra_compile_args=["-O2"], optional=True)])
