"""The engine: PyTorch's autograd Engine scheduling, reproduced in Python."""

from autograd_run.engine.devices import DeviceSet
from autograd_run.engine.engine import Engine
from autograd_run.engine.state import ERR_BACKWARD_TWICE, GraphState
from autograd_run.engine.tracer import Tracer

__all__ = ["DeviceSet", "Engine", "ERR_BACKWARD_TWICE", "GraphState", "Tracer"]
