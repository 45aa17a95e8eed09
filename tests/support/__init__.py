"""Support code for the tests (not part of the autograd_run package).

``tests.support.pt_oracle`` builds a CPU-backed accelerator for PyTorch's
PrivateUse1 key and records what PyTorch's own autograd Engine does on its
per-device worker threads; see ``tests/support/README.md``.
"""
