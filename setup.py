"""Build the compiled parts (optional: without a C compiler the pure-Python twins are used).

* ``autograd_run.engine._core``: the engine's per-node scheduling work (``_core.c`` and the parts it
  includes from ``engine/csrc/``).
* ``autograd_run.graphs._build``: the loader's loops over node specs (``graphs/validate.py`` is the twin).
* ``autograd_run.graphs._json_nodes``: a graph file's node list decoded into node specs (msgspec's own
  decode is the twin; ``graphs/load.py``).
* ``autograd_run.graphs._draw``: seeded random tensors in bulk; it links numpy's ``npyrandom``
  static library (shipped with numpy for extensions, see numpy's "Extending numpy.random") for
  numpy's own distributions, so it is built only where numpy is importable at build time
  (``pyproject.toml`` lists it among the build requirements).

Everything else about the package is in pyproject.toml.
"""

import os

from setuptools import Extension, setup

# _core.c includes the files of engine/csrc/ (one translation unit): they are its dependencies.
CORE_PARTS = sorted(os.path.join("autograd_run", "engine", "csrc", f)
                    for f in os.listdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "autograd_run",
                                                     "engine", "csrc")))
extensions = [Extension("autograd_run.engine._core", ["autograd_run/engine/_core.c"], depends=CORE_PARTS,
                        extra_compile_args=["-O2"], optional=True),
              Extension("autograd_run.graphs._build", ["autograd_run/graphs/_build.c"],
                        extra_compile_args=["-O2"], optional=True),
              Extension("autograd_run.graphs._json_nodes", ["autograd_run/graphs/_json_nodes.c"],
                        extra_compile_args=["-O2"], optional=True)]
try:
    import numpy
except ImportError:
    numpy = None
if numpy is not None:
    random_lib = os.path.join(os.path.dirname(numpy.__file__), "random", "lib")
    if os.path.isdir(random_lib):
        extensions.append(Extension("autograd_run.graphs._draw", ["autograd_run/graphs/_draw.c"],
                                    include_dirs=[numpy.get_include()], library_dirs=[random_lib],
                                    libraries=["npyrandom", "m"], extra_compile_args=["-O2"], optional=True))

setup(ext_modules=extensions)
