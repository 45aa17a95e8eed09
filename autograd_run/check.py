"""Moved to ``autograd_run.capture.check`` (kept here for one release)."""

from autograd_run.capture.check import *  # noqa: F401,F403
