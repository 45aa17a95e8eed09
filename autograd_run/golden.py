"""Moved to ``autograd_run.capture.golden`` (kept here for one release)."""

from autograd_run.capture.golden import *  # noqa: F401,F403
