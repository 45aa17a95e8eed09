"""Which implementation of the per-node scheduling work the engine uses: compiled, or pure Python.

The compiled core (``_core.c``: the ready queue, InputBuffer slots,
``route``, ``outputs_match``, ``spin_until``, the worker loop ``thread_main``
(which also releases a node's saved values itself where ``GraphState.release``
is not overridden), AccumulateGrad (``accumulate_grad``: ``GraphState.accumulate``
under its lock, where not overridden), the walk that groups saved random
tensors before a run (``group_saved``), the Recorder's ``EventLog``, the
summary's and trace writers' loops, the GraphTask's ``Lock``, and for the
simulator its event loop (``sim_loop``) and cost-lookup key (``signature``)) is built when the package is
installed with a C compiler present; each piece has a pure-Python twin with
the same behaviour and the same order, used when the extension is missing
or when ``AUTOGRAD_RUN_PURE_PYTHON=1`` is set (the tests run both).

``COMPILED`` says which is in use; ``WHY`` says why, for ``--version`` and
bug reports.
"""

from __future__ import annotations

import os
import threading

from autograd_run.engine import input_buffer as _ib
from autograd_run.engine import ready_queue as _rq

_core = None
if os.environ.get("AUTOGRAD_RUN_PURE_PYTHON", "") not in ("", "0"):
    WHY = "pure Python (AUTOGRAD_RUN_PURE_PYTHON is set)"
else:
    try:
        from autograd_run.engine import _core
        WHY = "compiled core"
    except ImportError as exc:
        WHY = f"pure Python (the compiled core is not built: {exc})"

COMPILED = _core is not None

if COMPILED:
    class InputBuffer(_ib.StreamRules, _core.InputBufferBase):
        """Gradient slots in C, PyTorch's accelerator stream rules in Python (``input_buffer``)."""

    ReadyQueue = _core.ReadyQueue
    _core.configure(_rq.SHUTDOWN, InputBuffer)
    route_impl = _core.route
    outputs_match = _core.outputs_match
    spin_until = _core.spin_until
    thread_main_impl = _core.thread_main
    configure_worker = _core.configure_worker
    EventLog = _core.EventLog
    Lock = _core.Lock
    attr_codes = _core.attr_codes
    critical_path = _core.critical_path
    pair_common = _core.pair_common
    compute_dependencies = _core.compute_dependencies
    NodeMap = _core.NodeMap
    fill = _core.fill
    input_shape_codes = _core.input_shape_codes
    node_columns = _core.node_columns
    node_rows = _core.node_rows
    node_edges = _core.node_edges
    signature = _core.signature
    sim_loop = _core.sim_loop
    sim_sequential = _core.sim_sequential
    costs_of = _core.costs_of
    stream_walk = _core.stream_walk
    sim_slices = _core.sim_slices
    SliceLog = _core.SliceLog
    kernel_slices = _core.kernel_slices
    configure_sim_queue = _core.configure_sim_queue
    split_saved = _core.split_saved
    group_saved = _core.group_saved
    scatter = _core.scatter
    max_seq = _core.max_seq
    nodes_of_op = _core.nodes_of_op
    accumulate_grad = _core.accumulate_grad
    register_accumulate = _core.register_accumulate
    register_release = _core.register_release
else:
    InputBuffer = _ib.InputBuffer
    ReadyQueue = _rq.ReadyQueue
    route_impl = None  # the worker's own route()
    outputs_match = None
    spin_until = None
    thread_main_impl = None  # the worker's own thread_main_py()
    configure_worker = None
    EventLog = None  # record.event_log's twin
    Lock = threading.Lock
    attr_codes = None  # record.kernels' twins
    critical_path = None
    pair_common = None  # record.recording._pair's numpy path
    compute_dependencies = None  # graph_task.compute_dependencies_py
    NodeMap = None  # a dict: the simulator's top-level dependency counts, its costs by node (sim/scheduler.py, costs.py)
    signature = None  # sim.signature.signature_py
    sim_loop = None  # sim.scheduler's event methods
    sim_sequential = None  # sim.scheduler.Simulator._run_sequential's loop
    costs_of = None  # sim.costs.CostResolver.many's list
    stream_walk = None  # analysis.streams.stream_walk_py
    sim_slices = None  # sim.result._slice_columns_py
    SliceLog = list  # a simulation's slices: a list of tuples (csrc/slice_log.c keeps them as columns)
    kernel_slices = None  # sim.result._kernel_slices_py
    configure_sim_queue = None  # sim.tasks.SimQueue.push (always called)
    fill = None  # traces.encode.fill_py
    input_shape_codes = None  # record.kernels' twins
    node_columns = None
    node_rows = None  # record.kernels' twins
    node_edges = None
    split_saved = None  # engine.state's twin
    group_saved = None  # engine.state's twin
    scatter = None  # engine.state's twin
    max_seq = None  # engine.state's twin
    nodes_of_op = None  # graphs.checkpoints' twin
    accumulate_grad = None  # engine.builtin_nodes' twin
    register_accumulate = None
    register_release = None
