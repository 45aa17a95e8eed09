"""autograd-run: replay, schedule and profile PyTorch-style backward graphs.

Pipeline stages, one package each, data flowing one way:
``graphs`` (file format, model, validation) -> ``engine`` (PyTorch's
scheduling reproduced) -> ``traces`` (recording, Chrome trace, summary)
-> ``cli`` (click commands).
"""

__version__ = "0.1.0"
