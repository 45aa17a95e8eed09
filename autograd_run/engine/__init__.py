"""The engine: PyTorch's autograd Engine, reproduced (docs/engine.md; ../shared/ENGINE_SEMANTICS.md).

``engine``        ``Engine.execute``: GraphTasks, the depth-60 reentrant hand-off, errors, anomaly mode;
``worker``        a worker thread's loop (one per device, the caller as CPU worker) and routing;
``graph_task``, ``input_buffer``, ``ready_queue``, ``priority``  a GraphTask's counters, InputBuffers, the
                  priority ready queues;
``state``         a graph's run-time state (saved values, hooks, exec_info);
``streams``, ``devices``, ``waits``, ``threads``  streams and events, device sets, waits, thread kinds;
``builtin_nodes``, ``callables``, ``reentrant_ctx``  the engine's own node kinds, Python nodes, nested calls;
``tracer``        the hook interface the engine calls (its default does nothing);
``reference``     a simple sequential executor: the test oracle;
``core``          the compiled core (``_core.c``) or, with ``AUTOGRAD_RUN_PURE_PYTHON=1``, its Python twins;
``run``           one backward of a graph file's roots.
"""

from autograd_run.engine.devices import DeviceSet
from autograd_run.engine.engine import Engine
from autograd_run.engine.state import ERR_BACKWARD_TWICE, GraphState
from autograd_run.engine.tracer import Tracer

__all__ = ["DeviceSet", "Engine", "ERR_BACKWARD_TWICE", "GraphState", "Tracer"]
