"""autograd-run: replay, schedule and profile PyTorch-style backward graphs.

Pipeline stages, one package each, data flowing one way:
``graphs`` (file format, model, validation) -> ``engine`` (PyTorch's
scheduling reproduced) -> ``traces`` (recording, Chrome trace, summary)
-> ``cli`` (click commands).
"""

import os

__version__ = "0.1.0"


def pure_python_forced() -> bool:
    """Whether ``AUTOGRAD_RUN_PURE_PYTHON`` (set, and not ``0``) forces the pure-Python twins of the compiled
    parts (the engine's core, the seeded drawing): the tests run both."""
    return os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0")
