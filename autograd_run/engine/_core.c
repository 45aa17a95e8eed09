/*
 * autograd_run.engine._core: the engine's per-node scheduling work, compiled. One extension, one
 * translation unit, built from the files of csrc/ included below in this order (each may use what an
 * earlier one defines). Each file opens with the path of its pure-Python twin, which the engine uses when
 * this module is not built (or AUTOGRAD_RUN_PURE_PYTHON=1): same behaviour, same order.
 *
 *   csrc/core.h          includes, the module's globals, interned attribute names (s_*), ready-queue keys
 *                        (unsigned 128-bit: (depth << 64) | seq, wake-ups and shutdown above all) and the
 *                        slot table (fields of graphs/model.Node and engine/graph_task.GraphTask read
 *                        without a lookup)
 *   csrc/lock.c          Lock: the GraphTask lock, taken without a method call
 *   csrc/event_log.c     EventLog: the Recorder's hot events as fixed-size records (record/event_log.py)
 *   csrc/ready_queue.c   ReadyQueue: a blocking max-heap with libstdc++'s push_heap/pop_heap, so ties break
 *                        exactly as std::priority_queue does in PyTorch (engine/ready_queue.py). `mutex`
 *                        guards keys/items/size/waiting; `not_empty` (on `mutex`) wakes a worker blocked
 *                        in pop, which waits without the GIL. Python code never runs while `mutex` is held.
 *   csrc/input_buffer.c  InputBuffer: per-node gradient slots (engine/input_buffer.py adds the accelerator
 *                        stream rules in Python on top of this type)
 *   csrc/node_map.c      NodeMap: a mapping from a graph's nodes to values, slots by the node's index (a dict
 *                        where this module is not built: the simulator's top-level dependency counts, its
 *                        costs by node)
 *   csrc/route.c         route: a node's outputs handed to the next nodes' InputBuffers, the ready ones
 *                        pushed (worker.route)
 *   csrc/outputs_match.c outputs_match: validate_outputs' common case (every gradient already has the
 *                        expected shape and dtype); spin_until: a busy-wait without the GIL (engine/waits.py)
 *   csrc/thread_main.c   thread_main, configure_worker: the worker loop, running the common kind of node
 *                        without Python frames of its own (worker.thread_main_py)
 *   csrc/slice_log.c     SliceLog: a simulation's slices as columns, a sequence of tuples to its readers (a list of
 *                        tuples where this module is not built: sim/scheduler.py)
 *   csrc/recording.c     attr_codes, pair_common, sim_slices, kernel_slices: the Recording's loops over Python objects
 *                        (record/kernels.py, record/recording.py, sim/result.py)
 *   csrc/state.c         max_seq, nodes_of_op, split_saved, group_saved, scatter, accumulate_grad and its
 *                        release hooks: a graph's run-time state (engine/state.py, builtin_nodes.py, run.py)
 *   csrc/columns.c       node_columns, input_shape_codes, critical_path, node_rows, node_edges
 *                        (record/kernels.py)
 *   csrc/dependencies.c  compute_dependencies (engine/graph_task.py)
 *   csrc/signature.c     signature: a node's cost-lookup key for the simulator's CostResolver (sim/signature.py)
 *   csrc/sim_loop.c      sim_loop: the simulation's event loop for calls without nested backward calls and
 *                        without modelled cores (sim/scheduler.py's event methods); sim_sequential, the
 *                        one-worker loop; costs_of, nodes' costs found as both loops find them (sim/costs.py)
 *   csrc/stream_walk.c   stream_walk: the streams report's walk of the critical path through threads and
 *                        streams (analysis/streams.py)
 *   csrc/fill.c          fill: the trace writers' loop, rows of columns formatted by templates into JSON or
 *                        protobuf (traces/encode.py)
 *   this file            configure, the module's method table and its initialisation
 */

/* The parts, in this order (one translation unit: each may use what an earlier one defines). */
#include "csrc/core.h"
#include "csrc/lock.c"
#include "csrc/event_log.c"
#include "csrc/ready_queue.c"
#include "csrc/input_buffer.c"
#include "csrc/node_map.c"
#include "csrc/route.c"
#include "csrc/outputs_match.c"
#include "csrc/thread_main.c"
#include "csrc/slice_log.c"
#include "csrc/recording.c"
#include "csrc/state.c"
#include "csrc/columns.c"
#include "csrc/dependencies.c"
#include "csrc/signature.c"
#include "csrc/sim_loop.c"
#include "csrc/stream_walk.c"
#include "csrc/fill.c"

static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *shutdown, *buffer_type;
    if (!PyArg_ParseTuple(args, "OO", &shutdown, &buffer_type))
        return NULL;
    Py_XSETREF(SHUTDOWN_ITEM, Py_NewRef(shutdown));
    Py_XSETREF(BUFFER_TYPE, Py_NewRef(buffer_type));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"route", (PyCFunction)(void (*)(void))route, METH_FASTCALL, "route(engine, gt, node, outputs, exec_info, tracer, parent)"},
    {"outputs_match", (PyCFunction)(void (*)(void))outputs_match, METH_FASTCALL, "outputs_match(edges, grads, np_dtypes)"},
    {"spin_until", spin_until, METH_O, "busy-wait without the GIL until time.perf_counter() >= deadline"},
    {"configure", configure, METH_VARARGS, "configure(SHUTDOWN, InputBuffer): the Python objects the core uses"},
    {"configure_worker", configure_worker, METH_VARARGS,
     "configure_worker(Node, GraphTask, InputMeta, probe_array, RUNNERS, direct_rules, ACCUMULATE_GRAD, np_dtypes, "
     "validate_outputs, missing_saved, evaluate_function, thread_main_py): what thread_main runs nodes with"},
    {"scatter", scatter, METH_VARARGS, "scatter(sink, values): mapping[name] = value for each (mapping, name)"},
    {"compute_dependencies", compute_dependencies, METH_VARARGS,
     "compute_dependencies(root, dependencies, min_topo_nr): see engine/graph_task.py"},
    {"fill", fill, METH_VARARGS,
     "fill(templates, kinds, columns, tables, lits, base, start, stop, index=None) -> bytes: see traces/encode.py"},
    {"register_release", register_release, METH_O,
     "register_release(GraphState.release): see release_node"},
    {"register_accumulate", register_accumulate, METH_O,
     "register_accumulate(GraphState.accumulate): see accumulate_grad"},
    {"accumulate_grad", (PyCFunction)(void (*)(void))accumulate_grad, METH_FASTCALL,
     "accumulate_grad(node, grads, ctx) -> []: see engine/builtin_nodes.py"},
    {"group_saved", group_saved, METH_VARARGS,
     "group_saved(todo, half, offset) -> (groups, sinks, done, slow): see engine/state.py"},
    {"max_seq", max_seq, METH_VARARGS, "max_seq(nodes, limit): the largest node seq below limit, or 0"},
    {"nodes_of_op", nodes_of_op, METH_VARARGS, "nodes_of_op(nodes, op): the nodes whose op is op, in order"},
    {"split_saved", split_saved, METH_VARARGS,
     "split_saved(nodes, released, cached) -> (plain, rest): see engine/state.py"},
    {"node_columns", node_columns, METH_O,
     "node_columns(nodes) -> (ids, names, seq bytes, stream bytes, same bytes): see record/kernels.py"},
    {"input_shape_codes", input_shape_codes, METH_O,
     "input_shape_codes(nodes) -> (int64 codes bytes, distinct shapes): see record/kernels.py"},
    {"pair_common", pair_common, METH_VARARGS,
     "pair_common(events, tid_of, n_nodes) -> None or the paired columns: see record/recording._pair"},
    {"attr_codes", attr_codes, METH_VARARGS,
     "attr_codes(objs, name, identity) -> (int64 codes bytes, distinct values): see record/kernels.py"},
    {"critical_path", critical_path, METH_VARARGS,
     "critical_path(nodes, gt, node, weight, start, order) -> (path, total): see record/kernels.py"},
    {"sim_loop", sim_loop, METH_VARARGS, "sim_loop(sim, events, order, ...): see sim/scheduler.py"},
    {"node_rows", node_rows, METH_VARARGS, "node_rows(table, objs) -> int64 bytes: see record/kernels.py"},
    {"node_edges", node_edges, METH_O, "node_edges(nodes) -> (src, dst) int64 bytes: see record/kernels.py"},
    {"configure_sim_queue", configure_sim_queue, METH_VARARGS,
     "configure_sim_queue(SimQueue, SimWorker) -> bool: route() pushes onto a SimQueue itself (sim/tasks.py)"},
    {"sim_slices", sim_slices, METH_O, "sim_slices(slices) -> a simulation's slice columns: see sim/result.py"},
    {"kernel_slices", (PyCFunction)(void (*)(void))kernel_slices, METH_FASTCALL,
     "kernel_slices(kernels, cls, name_of) -> a simulation's kernel slices: see sim/result.py"},
    {"stream_walk", stream_walk, METH_VARARGS,
     "stream_walk(arrays, k_nodes, nodes, at, t_end, limit) -> (steps, cpu, kernel, wait ns): see analysis/streams.py"},
    {"costs_of", costs_of, METH_VARARGS,
     "costs_of(costs, resolved, nodes) -> each node's cost: see sim/costs.py CostResolver.many"},
    {"sim_sequential", sim_sequential, METH_VARARGS,
     "sim_sequential(sim, gt, queue, costs, resolved, ...) -> now: see sim/scheduler.py _run_sequential"},
    {"signature", signature, METH_O, "signature(node) -> (key, values) or None: see sim/signature.py"},
    {"thread_main", (PyCFunction)(void (*)(void))thread_main, METH_FASTCALL,
     "thread_main(engine, graph_task): the worker loop (worker.thread_main_py)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", NULL, -1, module_methods};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__core(void) {
    INTERN(s_enabled, "enabled");
    INTERN(SIG_OUTPUTS, "->");
    INTERN(s_task_pushed, "task_pushed");
    INTERN(s_task_popped, "task_popped");
    INTERN(s_worker_idle, "worker_idle");
    INTERN(s_lock_wait, "lock_wait");
    INTERN(s_cpu_queue, "cpu_queue");
    INTERN(s_multithreading, "multithreading");
    INTERN(s_lock, "lock");
    INTERN(s_acquire, "acquire");
    INTERN(s_release, "release");
    INTERN(s_reentrant_depth, "reentrant_depth");
    INTERN(s_dependencies, "dependencies");
    INTERN(s_not_ready, "not_ready");
    INTERN(s_outstanding, "outstanding");
    INTERN(s_next, "next");
    INTERN(s_inputs, "inputs");
    INTERN(s_cpu, "cpu");
    INTERN(s_seq, "seq");
    INTERN(s_device, "device");
    INTERN(s_cost, "cost");
    INTERN(s_us, "us");
    INTERN(s_flops, "flops");
    INTERN(s_mode, "mode");
    INTERN(s_type, "type");
    INTERN(s_index, "index");
    INTERN(s_name, "name");
    INTERN(s_default_priority, "default_priority");
    INTERN(s_priority, "priority");
    INTERN(s_key, "key");
    INTERN(s_device_queue, "device_queue");
    INTERN(s_streams, "streams");
    INTERN(s_add, "add");
    INTERN(s_add_on_device, "add_on_device");
    INTERN(s_should_execute, "should_execute");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_input_nr, "input_nr");
    INTERN(s_node, "node");
    INTERN(s_cpu_str, "cpu");
    INTERN(s_get, "get");
    INTERN(s_push, "push");
    INTERN(s_stream, "stream");
    INTERN(s_topo_nr, "topo_nr");
    INTERN(s_saved, "saved");
    INTERN(s_saved_strings, "saved_strings");
    INTERN(s_create_graph, "create_graph");
    INTERN(s_variable, "variable");
    INTERN(s_grad_lock, "_grad_lock");
    INTERN(s_accumulate, "accumulate");
    INTERN(s_copy, "copy");
    INTERN(s__released, "_released");
    INTERN(s__saved, "_saved");
    INTERN(s__saved_device, "_saved_device");
    INTERN(s_tensor_fields, "tensor_fields");
    INTERN(s_random, "random");
    INTERN(s_dist, "dist");
    INTERN(s_float32, "float32");
    INTERN(s_normal, "normal");
    INTERN(s_reshape, "reshape");
    INTERN(s_id, "id");
    INTERN(s_op, "op");
    INTERN(s_attrs, "attrs");
    INTERN(s_saves_tensors, "saves_tensors");
    INTERN(s_event_log, "event_log");
    INTERN(s_others, "others");
    INTERN(s_exec_info, "exec_info");
    INTERN(s_state, "state");
    INTERN(s_ctx, "ctx");
    INTERN(s_anomaly, "anomaly");
    INTERN(s_keep_graph, "keep_graph");
    INTERN(s_faults, "faults");
    INTERN(s_has_hooks, "has_hooks");
    INTERN(s_half_nodes, "half_nodes");
    INTERN(s_grads, "grads");
    INTERN(s_devices, "devices");
    INTERN(s_node_start, "node_start");
    INTERN(s_node_end, "node_end");
    INTERN(s_node_skipped, "node_skipped");
    INTERN(s_expired, "expired");
    INTERN(s_has_error, "has_error");
    INTERN(s_frame, "frame");
    INTERN(s_on_exception, "on_exception");
    INTERN(s_mark_completed, "mark_completed");
    INTERN(s_worker_device, "worker_device");
    INTERN(s_owner, "owner");
    INTERN(s_queue_by_index, "queue_by_index");
    INTERN(s_push_wakeup, "push_wakeup");
    INTERN(s_tls, "tls");
    INTERN(s_queue, "queue");
    INTERN(s_tracer, "tracer");
    INTERN(s_real_cuda, "real_cuda");
    INTERN(s_completed, "completed");
    INTERN(s_on_stream, "on_stream");
    INTERN(s_sums_inline, "sums_inline");
    INTERN(s_sum_kernel_ns, "sum_kernel_ns");
    INTERN(s___enter__, "__enter__");
    INTERN(s___exit__, "__exit__");
    if (PyType_Ready(&QueueType) < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&LogType) < 0 ||
        PyType_Ready(&CLockType) < 0 || PyType_Ready(&LoopType) < 0 || PyType_Ready(&SliceLogType) < 0 ||
        PyType_Ready(&NodeMapType) < 0)
        return NULL;
    MAIN_THREAD = PyThread_get_thread_ident();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ReadyQueue", (PyObject *)&QueueType) < 0 ||
        PyModule_AddObjectRef(m, "InputBufferBase", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "EventLog", (PyObject *)&LogType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&CLockType) < 0 ||
        PyModule_AddObjectRef(m, "SliceLog", (PyObject *)&SliceLogType) < 0 ||
        PyModule_AddObjectRef(m, "NodeMap", (PyObject *)&NodeMapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
