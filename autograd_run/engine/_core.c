/*
 * autograd_run.engine._core: the engine's per-node scheduling work, compiled.
 *
 * Each piece has a pure-Python twin that the engine uses when this module
 * is not built (or AUTOGRAD_RUN_PURE_PYTHON=1): same behaviour, same order.
 *
 *   ReadyQueue   a blocking max-heap with libstdc++'s push_heap/pop_heap, so
 *                ties break exactly as std::priority_queue does in PyTorch
 *                (engine/ready_queue.py). Keys are unsigned 128-bit
 *                ((depth << 64) | seq, wake-ups and shutdown above all).
 *                `mutex` guards keys/items/size/waiting; `not_empty` (on
 *                `mutex`) wakes a worker blocked in pop, which waits without
 *                the GIL. Python code never runs while `mutex` is held.
 *   InputBuffer  per-node gradient slots (engine/input_buffer.py adds the
 *                accelerator stream rules in Python on top of this type).
 *   route        hand a node's outputs to the next nodes' InputBuffers and
 *                push the ready ones (worker.route).
 *   outputs_match  the common case of validate_outputs: every gradient
 *                already has the expected shape and dtype.
 *   spin_until   busy-wait to a perf_counter deadline without the GIL.
 *   EventLog     the Recorder's hot events (pushes, pops, node starts and ends, idle
 *                spans) as fixed-size records (record/event_log.py is the twin).
 *   thread_main  the worker loop, running the common kind of node without Python
 *                frames of its own (worker.thread_main_py is the twin).
 *   Lock         the GraphTask lock, taken without a method call.
 *   attr_codes, critical_path  the summary's two loops over Python objects
 *                (record/kernels.py is the twin).
 *   fill         the trace writers' loop: rows of columns formatted by templates
 *                into JSON or protobuf (traces/encode.py is the twin).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <errno.h>
#include <pythread.h>

/* The thread that imported the module (Python's main thread): only it runs signal handlers, so only
 * its idle waits wake up now and then to let a Ctrl-C through (PyErr_CheckSignals). */
static unsigned long MAIN_THREAD = 0;
#define SIGNAL_CHECK_NS 50000000LL

typedef unsigned __int128 u128;

static PyObject *SHUTDOWN_ITEM = NULL;  /* engine/ready_queue.SHUTDOWN, set by configure() */
static PyObject *BUFFER_TYPE = NULL;    /* engine/input_buffer.InputBuffer, set by configure() */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Interned attribute names. */
static PyObject *s_enabled, *s_task_pushed, *s_task_popped, *s_worker_idle, *s_lock_wait,
    *s_cpu_queue, *s_multithreading, *s_lock, *s_acquire, *s_release,
    *s_dependencies, *s_not_ready,
    *s_device, *s_type, *s_index, *s_default_priority, *s_priority, *s_key,
    *s_device_queue, *s_streams, *s_add, *s_add_on_device, *s_should_execute,
    *s_input_nr, *s_node, *s_cpu_str, *s_get, *s_push, *s_reshape,
    *s_event_log, *s_others, *s_exec_info, *s_state, *s_ctx, *s_anomaly, *s_keep_graph,
    *s_faults, *s_has_hooks, *s_half_nodes, *s_grads, *s_devices, *s_node_start, *s_node_end,
    *s_node_skipped, *s_frame, *s_on_exception, *s_mark_completed,
    *s_worker_device, *s_owner, *s_queue_by_index, *s_push_wakeup, *s_tls, *s_queue, *s_tracer,
    *s_real_cuda;

/* ------------------------------------------------------------------ keys */

static int key_from_long(PyObject *v, u128 *out) {
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "a ready-queue key is an int");
        return -1;
    }
    unsigned char buf[16];
    if (_PyLong_AsByteArray((PyLongObject *)v, buf, 16, 1, 0) < 0)
        return -1;
    u128 k = 0;
    for (int i = 15; i >= 0; i--)
        k = (k << 8) | buf[i];
    *out = k;
    return 0;
}

static PyObject *key_to_long(u128 k) {
    unsigned char buf[16];
    for (int i = 0; i < 16; i++) {
        buf[i] = (unsigned char)(k & 0xff);
        k >>= 8;
    }
    return _PyLong_FromByteArray(buf, 16, 1, 0);
}


/* -------------------------------------------------------- slot readers */

/* Fields read on the hot path of two classes with __slots__ (graphs/model.Node, engine/graph_task.
 * GraphTask): configure_worker() finds their slot offsets, and an object of exactly that class is
 * read (and, for the GraphTask, written) at the offset; anything else goes through getattr. */
typedef struct {
    PyTypeObject *type;
    int n;
    PyObject **names[16];
    Py_ssize_t offsets[16];
} SlotTable;

static PyObject *s_next, *s_inputs, *s_cpu, *s_seq, *s_op, *s_attrs, *s_saves_tensors, *s_topo_nr, *s_id, *s_name,
    *s_stream, *s_saved, *s_completed, *s_expired,
    *s_has_error, *s_outstanding, *s_reentrant_depth, *s_shape, *s_dtype, *s_saved_strings, *s_tensor_fields,
    *s_random, *s_dist, *s_float32, *s_normal, *s_create_graph, *s_variable, *s_grad_lock, *s_accumulate, *s_copy,
    *s__released, *s__saved, *s__saved_device;

enum { NF_NEXT, NF_INPUTS, NF_CPU, NF_SEQ, NF_OP, NF_ATTRS, NF_SAVES, NF_TOPO, NF_ID, NF_NAME, NF_STREAM, NF_SAVED,
       NF_SAVED_STRINGS, NF_INDEX };
static SlotTable NODE_SLOTS = {NULL, 14, {&s_next, &s_inputs, &s_cpu, &s_seq, &s_op, &s_attrs, &s_saves_tensors,
                                          &s_topo_nr, &s_id, &s_name, &s_stream, &s_saved, &s_saved_strings,
                                          &s_index}};
enum { GF_COMPLETED, GF_EXPIRED, GF_HAS_ERROR, GF_OUTSTANDING, GF_DEPTH };
static SlotTable GT_SLOTS = {NULL, 5, {&s_completed, &s_expired, &s_has_error, &s_outstanding, &s_reentrant_depth}};
enum { MF_SHAPE, MF_DTYPE };
static SlotTable META_SLOTS = {NULL, 2, {&s_shape, &s_dtype}};

/* Find the offsets; 1 when every field is a plain object slot of `type` itself, else 0 (getattr). */
static int slots_configure(SlotTable *t, PyObject *type) {
    Py_ssize_t offsets[16];
    for (int f = 0; f < t->n; f++) {
        PyObject *d = PyObject_GetAttr(type, *t->names[f]);
        if (d == NULL)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 ((PyMemberDescrObject *)d)->d_common.d_type == (PyTypeObject *)type;
        if (ok)
            offsets[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            Py_CLEAR(t->type);
            return 0;
        }
    }
    memcpy(t->offsets, offsets, sizeof(Py_ssize_t) * t->n);
    Py_INCREF(type);
    Py_XSETREF(t->type, (PyTypeObject *)type);
    return 1;
}

/* obj.<field> as a new reference, or NULL with an exception set. */
static inline PyObject *slot_get(SlotTable *t, PyObject *obj, int f) {
    if (Py_TYPE(obj) == t->type) {
        PyObject *v = *(PyObject **)((char *)obj + t->offsets[f]);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, *t->names[f]);
}

static inline int slot_set(SlotTable *t, PyObject *obj, int f, PyObject *v) {
    if (Py_TYPE(obj) == t->type) {
        PyObject **p = (PyObject **)((char *)obj + t->offsets[f]);
        Py_INCREF(v);
        Py_XSETREF(*p, v);
        return 0;
    }
    return PyObject_SetAttr(obj, *t->names[f], v);
}

/* 1 if obj.<field> is true, 0 if not, -1 on error. */
static inline int slot_true(SlotTable *t, PyObject *obj, int f) {
    PyObject *v = slot_get(t, obj, f);
    if (v == NULL)
        return -1;
    int r = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static inline int slot_long(SlotTable *t, PyObject *obj, int f, long long *out) {
    PyObject *v = slot_get(t, obj, f);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static inline int slot_set_long(SlotTable *t, PyObject *obj, int f, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int r = slot_set(t, obj, f, v);
    Py_DECREF(v);
    return r;
}

#define node_get(node, f) slot_get(&NODE_SLOTS, (node), (f))
#define node_true(node, f) slot_true(&NODE_SLOTS, (node), (f))

/* ------------------------------------------------------------------ Lock */

/* A plain (non-reentrant) lock with threading.Lock's interface, that the compiled loop and route
 * take without a method call. A blocked acquire waits without the GIL (not interruptible: the
 * GraphTask lock is only ever held for a few operations). */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked;
} CLockObject;

static PyTypeObject CLockType;

static PyObject *CLock_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    CLockObject *self = (CLockObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_RuntimeError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void CLock_dealloc(CLockObject *self) {
    if (self->lock != NULL) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 acquired, 0 not (non-blocking or timed out). */
static int clock_acquire(CLockObject *self, int blocking, PY_TIMEOUT_T timeout_us) {
    int ok = PyThread_acquire_lock(self->lock, 0);
    if (!ok && blocking) {
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, timeout_us, 0);
        Py_END_ALLOW_THREADS
        ok = r == PY_LOCK_ACQUIRED;
    }
    if (ok)
        self->locked = 1;
    return ok;
}

static int clock_release(CLockObject *self) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    return 0;
}

static PyObject *CLock_acquire(CLockObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pd", names, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    PY_TIMEOUT_T us = timeout < 0 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);
    return PyBool_FromLong(clock_acquire(self, blocking, us));
}

static PyObject *CLock_release(CLockObject *self, PyObject *unused) {
    if (clock_release(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CLock_enter(CLockObject *self, PyObject *unused) {
    clock_acquire(self, 1, -1);
    Py_RETURN_TRUE;
}

static PyObject *CLock_exit(CLockObject *self, PyObject *args) {
    if (clock_release(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CLock_locked(CLockObject *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static PyMethodDef CLock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))CLock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)CLock_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)CLock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)CLock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)CLock_exit, METH_VARARGS, NULL},
    {NULL}};

static PyTypeObject CLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.Lock",
    .tp_basicsize = sizeof(CLockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lock with threading.Lock's interface that compiled code takes directly.",
    .tp_new = CLock_new,
    .tp_dealloc = (destructor)CLock_dealloc,
    .tp_methods = CLock_methods,
};

/* -------------------------------------------------------------- EventLog */

/* The Recorder's hot events (pushes, pops, node starts and ends, idle spans) as fixed-size records
 * in blocks, appended with the GIL held (so no lock of its own). Nodes, threads and queues are
 * interned into small tables (a node's index is its position in `nodes`; a pointer hash maps a
 * node object to it, and the table holds a reference so an address is never reused). The layout
 * is record/event_log.py's EVENT_DTYPE; the pure-Python twin there keeps the same tables. */

enum { EV_PUSH = 1, EV_POP = 2, EV_START = 3, EV_END = 4, EV_IDLE = 5 };

typedef struct {
    int64_t ts;      /* stamp (IDLE: start) */
    int64_t a;       /* GraphTask id, -1 for none (IDLE: end) */
    int32_t node;    /* node table index, -1 for none */
    int32_t b;       /* PUSH/POP: queue size after; START/END: reentrant depth; IDLE: awaited GraphTask or -1 */
    uint16_t thread; /* thread table index */
    uint16_t queue;  /* queue table index (PUSH, POP, IDLE), else 0 */
    uint8_t kind;
    uint8_t pad[3];
} Event;

#define LOG_BLOCK 32768  /* events per block (1 MiB) */

typedef struct {
    PyObject_HEAD
    Event **blocks;
    Py_ssize_t nblocks, cap_blocks, n;   /* n: events in all blocks */
    PyObject **hkeys;                    /* node pointer hash: open addressing */
    int32_t *hvals;
    Py_ssize_t hcap, hcount;
    PyObject *nodes;                     /* list: node table */
    unsigned long *tidents;              /* thread table: idents */
    char *tnamed;                        /* whether on_thread was called for it */
    Py_ssize_t nthreads, tcap, last_thread;
    PyObject *on_thread;                 /* callable(ident) when a thread first starts a node or idles, or NULL */
    PyObject *queues;                    /* list: queue table (the queue objects) */
    Py_ssize_t last_queue;
    PyObject *clock;                     /* callable() -> ns, or NULL for CLOCK_MONOTONIC (perf_counter_ns) */
    PyObject *last_gt;                   /* the GraphTask whose id is cached (held, so its address is not reused) */
    int64_t last_gt_id;
    PyObject *last_node;                 /* the node last looked up (borrowed, as the hash's keys), or NULL */
    int32_t last_node_idx;               /* its table index: a task's pop, start and end name the same node */
} LogObject;

static PyTypeObject LogType;

static int Log_init(LogObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"clock", "on_thread", NULL};
    PyObject *clock = Py_None, *on_thread = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO", names, &clock, &on_thread))
        return -1;
    if (self->nodes != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "EventLog is initialised once");
        return -1;
    }
    self->nodes = PyList_New(0);
    self->queues = PyList_New(0);
    if (self->nodes == NULL || self->queues == NULL)
        return -1;
    self->clock = clock == Py_None ? NULL : Py_NewRef(clock);
    self->on_thread = on_thread == Py_None ? NULL : Py_NewRef(on_thread);
    self->last_thread = self->last_queue = -1;
    return 0;
}

static void log_free_blocks(LogObject *self) {
    for (Py_ssize_t i = 0; i < self->nblocks; i++)
        PyMem_RawFree(self->blocks[i]);
    PyMem_RawFree(self->blocks);
    self->blocks = NULL;
    self->nblocks = self->cap_blocks = self->n = 0;
}

static int Log_traverse(LogObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->nodes);
    Py_VISIT(self->queues);
    Py_VISIT(self->clock);
    Py_VISIT(self->on_thread);
    Py_VISIT(self->last_gt);
    return 0;
}

/* Drop the node index (its keys are borrowed from the node list, which goes with it). */
static void log_forget_index(LogObject *self) {
    PyMem_RawFree(self->hkeys);
    PyMem_RawFree(self->hvals);
    self->hkeys = NULL;
    self->hvals = NULL;
    self->hcap = self->hcount = 0;
    self->last_node = NULL;
}

static int Log_clear(LogObject *self) {
    Py_CLEAR(self->nodes);   /* the hash's keys are borrowed from this list */
    Py_CLEAR(self->queues);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->on_thread);
    Py_CLEAR(self->last_gt);
    log_forget_index(self);
    return 0;
}

static void Log_dealloc(LogObject *self) {
    PyObject_GC_UnTrack(self);
    Log_clear(self);
    log_free_blocks(self);
    PyMem_RawFree(self->tidents);
    PyMem_RawFree(self->tnamed);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline size_t ptr_hash(PyObject *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static int log_rehash(LogObject *self, Py_ssize_t cap) {
    PyObject **keys = PyMem_RawCalloc(cap, sizeof(PyObject *));
    int32_t *vals = PyMem_RawMalloc(cap * sizeof(int32_t));
    if (!keys || !vals) {
        PyMem_RawFree(keys);
        PyMem_RawFree(vals);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < self->hcap; i++) {
        PyObject *k = self->hkeys[i];
        if (k == NULL)
            continue;
        size_t h = ptr_hash(k) & (cap - 1);
        while (keys[h] != NULL)
            h = (h + 1) & (cap - 1);
        keys[h] = k;
        vals[h] = self->hvals[i];
    }
    PyMem_RawFree(self->hkeys);
    PyMem_RawFree(self->hvals);
    self->hkeys = keys;
    self->hvals = vals;
    self->hcap = cap;
    return 0;
}

/* The node's table index (added on first sight); -1 for None; -2 on error. */
static int32_t log_node(LogObject *self, PyObject *node) {
    if (node == Py_None || node == NULL)
        return -1;
    if (node == self->last_node)
        return self->last_node_idx;
    if (self->hcap) {
        size_t h = ptr_hash(node) & (self->hcap - 1);
        PyObject *k;
        while ((k = self->hkeys[h]) != NULL) {
            if (k == node) {
                self->last_node = node;
                self->last_node_idx = self->hvals[h];
                return self->hvals[h];
            }
            h = (h + 1) & (self->hcap - 1);
        }
    }
    if ((self->hcount + 1) * 2 > self->hcap && log_rehash(self, self->hcap ? self->hcap * 2 : 1024) < 0)
        return -2;
    Py_ssize_t idx = PyList_GET_SIZE(self->nodes);
    if (idx >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "too many distinct nodes in one event log");
        return -2;
    }
    if (PyList_Append(self->nodes, node) < 0)
        return -2;
    size_t h = ptr_hash(node) & (self->hcap - 1);
    while (self->hkeys[h] != NULL)
        h = (h + 1) & (self->hcap - 1);
    self->hkeys[h] = node;  /* borrowed: the list holds it */
    self->hvals[h] = (int32_t)idx;
    self->hcount++;
    self->last_node = node;
    self->last_node_idx = (int32_t)idx;
    return (int32_t)idx;
}

/* This thread's table index; `name` calls on_thread(ident) the first time it is asked for. -1 on error. */
static int log_thread(LogObject *self, int name) {
    unsigned long ident = PyThread_get_thread_ident();
    Py_ssize_t i = self->last_thread;
    if (i < 0 || self->tidents[i] != ident) {
        for (i = 0; i < self->nthreads; i++)
            if (self->tidents[i] == ident)
                break;
        if (i == self->nthreads) {
            if (i >= 65535) {
                PyErr_SetString(PyExc_OverflowError, "too many threads in one event log");
                return -1;
            }
            if (self->nthreads == self->tcap) {
                Py_ssize_t cap = self->tcap ? self->tcap * 2 : 8;
                unsigned long *t = PyMem_RawRealloc(self->tidents, cap * sizeof(unsigned long));
                if (t == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                self->tidents = t;
                char *n = PyMem_RawRealloc(self->tnamed, cap);
                if (n == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                self->tnamed = n;
                self->tcap = cap;
            }
            self->tidents[i] = ident;
            self->tnamed[i] = 0;
            self->nthreads++;
        }
        self->last_thread = i;
    }
    if (name && !self->tnamed[i]) {
        self->tnamed[i] = 1;
        if (self->on_thread != NULL) {
            PyObject *id = PyLong_FromUnsignedLong(ident);
            PyObject *r = id ? PyObject_CallOneArg(self->on_thread, id) : NULL;
            Py_XDECREF(id);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    return (int)i;
}

static int log_queue(LogObject *self, PyObject *queue) {
    if (queue == NULL || queue == Py_None)
        return 0xFFFF;
    Py_ssize_t n = PyList_GET_SIZE(self->queues), i = self->last_queue;
    if (i >= 0 && i < n && PyList_GET_ITEM(self->queues, i) == queue)
        return (int)i;
    for (i = 0; i < n; i++)
        if (PyList_GET_ITEM(self->queues, i) == queue)
            break;
    if (i == n) {
        if (n >= 65535) {
            PyErr_SetString(PyExc_OverflowError, "too many queues in one event log");
            return -1;
        }
        if (PyList_Append(self->queues, queue) < 0)
            return -1;
    }
    self->last_queue = i;
    return (int)i;
}

static int id_obj(PyObject *o, int64_t *out);

/* A GraphTask's id (-1 for None), cached for the last one seen. */
static int log_gt(LogObject *self, PyObject *gt, int64_t *out) {
    if (gt == Py_None || gt == NULL) {
        *out = -1;
        return 0;
    }
    if (gt == self->last_gt) {
        *out = self->last_gt_id;
        return 0;
    }
    if (id_obj(gt, out) < 0)
        return -1;
    Py_INCREF(gt);
    Py_XSETREF(self->last_gt, gt);
    self->last_gt_id = *out;
    return 0;
}

static int log_stamp(LogObject *self, int64_t *out) {
    if (self->clock == NULL) {
        *out = now_ns();
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(self->clock);
    if (r == NULL)
        return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static Event *log_slot(LogObject *self) {
    Py_ssize_t bi = self->n / LOG_BLOCK;
    if (bi == self->nblocks) {
        if (self->nblocks == self->cap_blocks) {
            Py_ssize_t cap = self->cap_blocks ? self->cap_blocks * 2 : 16;
            Event **b = PyMem_RawRealloc(self->blocks, cap * sizeof(Event *));
            if (b == NULL) {
                PyErr_NoMemory();
                return NULL;
            }
            self->blocks = b;
            self->cap_blocks = cap;
        }
        Event *blk = PyMem_RawMalloc(LOG_BLOCK * sizeof(Event));
        if (blk == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->blocks[self->nblocks++] = blk;
    }
    Event *e = &self->blocks[bi][self->n % LOG_BLOCK];
    self->n++;
    memset(e, 0, sizeof(Event));
    return e;
}

/* Append one event: `b` as given, or for START/END with b < 0 the GraphTask's reentrant depth. */
static int log_event(LogObject *self, int kind, PyObject *queue, PyObject *gt, PyObject *node, int64_t b) {
    int64_t gid, ts;
    int thread = log_thread(self, kind == EV_START);
    if (thread < 0)
        return -1;
    int q = (kind == EV_PUSH || kind == EV_POP) ? log_queue(self, queue) : 0;
    if (q < 0 || log_gt(self, gt, &gid) < 0)
        return -1;
    int32_t ni = log_node(self, node);
    if (ni == -2)
        return -1;
    if (b < 0 && (kind == EV_START || kind == EV_END)) {
        long long d;
        if (slot_long(&GT_SLOTS, gt, GF_DEPTH, &d) < 0)
            return -1;
        b = d;
    }
    if (log_stamp(self, &ts) < 0)
        return -1;
    Event *e = log_slot(self);
    if (e == NULL)
        return -1;
    e->ts = ts;
    e->a = gid;
    e->node = ni;
    e->b = b > INT32_MAX ? INT32_MAX : (int32_t)b;
    e->thread = (uint16_t)thread;
    e->queue = (uint16_t)q;
    e->kind = (uint8_t)kind;
    return 0;
}

static int log_idle(LogObject *self, PyObject *queue, int64_t start, int64_t end, PyObject *waiting_for) {
    int64_t wid;
    int thread = log_thread(self, 1);
    if (thread < 0)
        return -1;
    int q = log_queue(self, queue);
    if (q < 0 || log_gt(self, waiting_for, &wid) < 0)
        return -1;
    Event *e = log_slot(self);
    if (e == NULL)
        return -1;
    e->ts = start;
    e->a = end;
    e->node = -1;
    e->b = wid > INT32_MAX ? INT32_MAX : (int32_t)wid;
    e->thread = (uint16_t)thread;
    e->queue = (uint16_t)q;
    e->kind = EV_IDLE;
    return 0;
}

static PyObject *Log_pushpop(LogObject *self, PyObject *const *args, Py_ssize_t n, int kind) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "(queue, gt, node, depth)");
        return NULL;
    }
    Py_ssize_t depth = PyLong_AsSsize_t(args[3]);
    if (depth == -1 && PyErr_Occurred())
        return NULL;
    if (log_event(self, kind, args[0], args[1], args[2], depth) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Log_push(LogObject *self, PyObject *const *args, Py_ssize_t n) {
    return Log_pushpop(self, args, n, EV_PUSH);
}

static PyObject *Log_pop(LogObject *self, PyObject *const *args, Py_ssize_t n) {
    return Log_pushpop(self, args, n, EV_POP);
}

static PyObject *Log_startend(LogObject *self, PyObject *const *args, Py_ssize_t n, int kind) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "(gt, node)");
        return NULL;
    }
    if (log_event(self, kind, NULL, args[0], args[1], -1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Log_start(LogObject *self, PyObject *const *args, Py_ssize_t n) {
    return Log_startend(self, args, n, EV_START);
}

static PyObject *Log_end(LogObject *self, PyObject *const *args, Py_ssize_t n) {
    return Log_startend(self, args, n, EV_END);
}

static PyObject *Log_idle_m(LogObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "idle(queue, start_ns, end_ns, waiting_for)");
        return NULL;
    }
    int64_t a = PyLong_AsLongLong(args[1]), b = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred() || log_idle(self, args[0], a, b, args[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* take(forget_nodes=False) -> (bytes of the records, node table, thread idents, queue table); the
 * records are moved out (the log keeps its tables, so later events keep the same indices). Blocks are
 * freed as they are copied, so the peak is the records plus one block. With forget_nodes the log
 * lets go of its node table and its index too, in the same step (no record in between): later records
 * index a new one (a run of many passes drains the log after each, and a pass's GraphRoot, with its
 * root gradients, is not kept for the rest of the run). */
static PyObject *Log_take(LogObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "take(forget_nodes=False)");
        return NULL;
    }
    int forget = nargs ? PyObject_IsTrue(args[0]) : 0;
    if (forget < 0)
        return NULL;
    Py_ssize_t n = self->n;
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Event));
    if (data == NULL)
        return NULL;
    char *dst = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < self->nblocks; i++) {
        Py_ssize_t count = n - i * LOG_BLOCK;
        if (count > LOG_BLOCK)
            count = LOG_BLOCK;
        memcpy(dst + i * LOG_BLOCK * sizeof(Event), self->blocks[i], count * sizeof(Event));
        PyMem_RawFree(self->blocks[i]);
        self->blocks[i] = NULL;
    }
    PyMem_RawFree(self->blocks);
    self->blocks = NULL;
    self->nblocks = self->cap_blocks = self->n = 0;
    Py_CLEAR(self->last_gt);  /* let the GraphTask go */
    PyObject *idents = PyList_New(self->nthreads);
    for (Py_ssize_t i = 0; idents && i < self->nthreads; i++) {
        PyObject *v = PyLong_FromUnsignedLong(self->tidents[i]);
        if (v == NULL) {
            Py_CLEAR(idents);
            break;
        }
        PyList_SET_ITEM(idents, i, v);
    }
    PyObject *nodes;
    if (forget) {
        PyObject *fresh = PyList_New(0);
        nodes = fresh != NULL ? self->nodes : NULL;  /* handed over whole: its new reference is ours */
        if (fresh != NULL) {
            self->nodes = fresh;
            /* the index goes with the list (its keys were the old list's), as the twin's dict does: a log
             * taken for the last time keeps nothing per node (12 bytes a slot, 25 MB at 1e6 nodes) */
            log_forget_index(self);
        }
    } else {
        nodes = PyList_GetSlice(self->nodes, 0, PyList_GET_SIZE(self->nodes));
    }
    PyObject *queues = PyList_GetSlice(self->queues, 0, PyList_GET_SIZE(self->queues));
    PyObject *out = (idents && nodes && queues) ? PyTuple_Pack(4, data, nodes, idents, queues) : NULL;
    Py_DECREF(data);
    Py_XDECREF(idents);
    Py_XDECREF(nodes);
    Py_XDECREF(queues);
    return out;
}

static PyObject *Log_now(LogObject *self, PyObject *unused) {
    int64_t ts;
    if (log_stamp(self, &ts) < 0)
        return NULL;
    return PyLong_FromLongLong(ts);
}

static Py_ssize_t Log_len(LogObject *self) {
    return self->n;
}

static PyMethodDef Log_methods[] = {
    {"push", (PyCFunction)(void (*)(void))Log_push, METH_FASTCALL, "push(queue, gt, node, depth): a task was pushed"},
    {"pop", (PyCFunction)(void (*)(void))Log_pop, METH_FASTCALL, "pop(queue, gt, node, depth): a task was popped"},
    {"start", (PyCFunction)(void (*)(void))Log_start, METH_FASTCALL, "start(gt, node): a node starts on this thread"},
    {"end", (PyCFunction)(void (*)(void))Log_end, METH_FASTCALL, "end(gt, node): a node ended on this thread"},
    {"idle", (PyCFunction)(void (*)(void))Log_idle_m, METH_FASTCALL,
     "idle(queue, start_ns, end_ns, waiting_for): this thread waited on an empty queue"},
    {"now", (PyCFunction)Log_now, METH_NOARGS, "now() -> the log's clock in ns"},
    {"take", (PyCFunction)(void (*)(void))Log_take, METH_FASTCALL,
     "take(forget_nodes=False) -> (records bytes, nodes, thread idents, queues): the records so far, moved "
     "out; with forget_nodes the node table too (later records index a new one)"},
    {NULL}};

static PySequenceMethods Log_as_sequence = {.sq_length = (lenfunc)Log_len};

static PyTypeObject LogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.EventLog",
    .tp_basicsize = sizeof(LogObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The Recorder's hot events as fixed-size records (see record/event_log.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Log_init,
    .tp_dealloc = (destructor)Log_dealloc,
    .tp_traverse = (traverseproc)Log_traverse,
    .tp_clear = (inquiry)Log_clear,
    .tp_methods = Log_methods,
    .tp_as_sequence = &Log_as_sequence,
};

/* ------------------------------------------------------------ ReadyQueue */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *tracer;
    int tracing;          /* tracer is not None and tracer.enabled, read when the tracer is set */
    LogObject *log;       /* tracer.event_log when compiled (pushes, pops and idle spans go there), or NULL */
    PyObject *others;     /* with a log: tracer.others, the tracers besides it (or NULL) */
    int hooks;            /* the hot hooks to call in Python (HOOK_*): `others`'s with a log, else the tracer's */
    u128 *keys;
    PyObject **items;
    Py_ssize_t size, cap;
    int waiting;          /* workers blocked in pop; a push notifies only then */
    pthread_mutex_t mutex;
    pthread_cond_t not_empty;
} QueueObject;

static PyTypeObject QueueType;

/* Which hot hooks the tracer that gets them implements (`Tracers.implemented`): the tracer's `others`
 * beside a compiled event log, else the tracer itself. The rest are the base class's no-ops, not called. */
#define HOOK_PUSH 1
#define HOOK_POP 2
#define HOOK_START 4
#define HOOK_END 8
#define HOOK_IDLE 16
#define HOOK_ALL 31

static int tracer_info(PyObject *tracer, int *tracing, LogObject **log, PyObject **others, int *mask);

static int queue_set_tracer(QueueObject *self, PyObject *tracer) {
    int tracing;
    LogObject *log;
    PyObject *others;
    int mask;
    if (tracer_info(tracer, &tracing, &log, &others, &mask) < 0)
        return -1;
    Py_XINCREF(tracer);
    Py_XSETREF(self->tracer, tracer);
    Py_XINCREF(log);
    Py_XSETREF(self->log, log);
    Py_XSETREF(self->others, others);
    self->hooks = mask;
    self->tracing = tracing;
    return 0;
}

static int Queue_init(QueueObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"name", "tracer", NULL};
    PyObject *name, *tracer = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", names, &name, &tracer))
        return -1;
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    if (queue_set_tracer(self, tracer) < 0)
        return -1;
    if (self->keys == NULL) {
        self->cap = 16;
        self->keys = PyMem_Malloc(sizeof(u128) * self->cap);
        self->items = PyMem_Malloc(sizeof(PyObject *) * self->cap);
        if (!self->keys || !self->items) {
            PyErr_NoMemory();
            return -1;
        }
        pthread_mutex_init(&self->mutex, NULL);
        pthread_cond_init(&self->not_empty, NULL);
    }
    return 0;
}

/* The queue takes part in cyclic GC: its tracer (and log) can reach a GraphTask whose engine reaches
 * the queue again (through the engine's thread-local state). Items change only with the GIL held. */
static int Queue_traverse(QueueObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->name);
    Py_VISIT(self->tracer);
    Py_VISIT(self->log);
    Py_VISIT(self->others);
    for (Py_ssize_t i = 0; i < self->size; i++)
        Py_VISIT(self->items[i]);
    return 0;
}

static int Queue_clear(QueueObject *self) {
    Py_CLEAR(self->tracer);
    Py_CLEAR(self->log);
    Py_CLEAR(self->others);
    self->tracing = 0;
    Py_ssize_t n = self->size;
    self->size = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_CLEAR(self->items[i]);
    return 0;
}

static void Queue_dealloc(QueueObject *self) {
    PyObject_GC_UnTrack(self);
    for (Py_ssize_t i = 0; i < self->size; i++)
        Py_DECREF(self->items[i]);
    PyMem_Free(self->keys);
    PyMem_Free(self->items);
    if (self->keys != NULL) {
        pthread_mutex_destroy(&self->mutex);
        pthread_cond_destroy(&self->not_empty);
    }
    Py_XDECREF(self->name);
    Py_XDECREF(self->tracer);
    Py_XDECREF(self->log);
    Py_XDECREF(self->others);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* libstdc++ __push_heap: sift the hole up while the parent compares less. Caller holds mutex. */
static void heap_sift_up(QueueObject *q, Py_ssize_t hole, u128 key, PyObject *item) {
    while (hole > 0) {
        Py_ssize_t parent = (hole - 1) >> 1;
        if (!(q->keys[parent] < key))
            break;
        q->keys[hole] = q->keys[parent];
        q->items[hole] = q->items[parent];
        hole = parent;
    }
    q->keys[hole] = key;
    q->items[hole] = item;
}

/* Take the mutex, never blocking on it while holding the GIL (the invariant that keeps a holder of
 * the mutex that waits for the GIL from deadlocking with a holder of the GIL that waits for the
 * mutex). Returns the ns spent waiting for it (0 when uncontended). */
static int64_t lock_nogil(QueueObject *q, int timed) {
    if (pthread_mutex_trylock(&q->mutex) == 0)
        return 0;
    int64_t t0 = timed ? now_ns() : 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&q->mutex);
    Py_END_ALLOW_THREADS
    return timed ? now_ns() - t0 : 0;
}

/* Reserve room for one more (with the GIL, before taking the mutex). */
static int heap_reserve(QueueObject *q) {
    if (q->size + 1 <= q->cap)
        return 0;
    Py_ssize_t cap = q->cap * 2;
    u128 *keys = PyMem_Malloc(sizeof(u128) * cap);
    PyObject **items = PyMem_Malloc(sizeof(PyObject *) * cap);
    if (!keys || !items) {
        PyMem_Free(keys);
        PyMem_Free(items);
        PyErr_NoMemory();
        return -1;
    }
    lock_nogil(q, 0);
    memcpy(keys, q->keys, sizeof(u128) * q->size);
    memcpy(items, q->items, sizeof(PyObject *) * q->size);
    u128 *ok = q->keys;
    PyObject **oi = q->items;
    q->keys = keys;
    q->items = items;
    q->cap = cap;
    pthread_mutex_unlock(&q->mutex);
    PyMem_Free(ok);
    PyMem_Free(oi);
    return 0;
}

/* libstdc++ pop_heap (__adjust_heap: the hole goes down to a leaf taking the larger child,
 * the right one on ties, then the former last element is pushed up from there). Caller holds
 * mutex, size > 0. Returns the top item (its reference moves to the caller). */
static PyObject *heap_pop(QueueObject *q) {
    PyObject *top = q->items[0];
    u128 last_key = q->keys[q->size - 1];
    PyObject *last_item = q->items[q->size - 1];
    Py_ssize_t length = --q->size;
    if (length == 0)
        return top;
    Py_ssize_t hole = 0, child = 0, limit = (length - 1) >> 1;
    while (child < limit) {
        child = 2 * child + 2;
        if (q->keys[child] < q->keys[child - 1])
            child--;
        q->keys[hole] = q->keys[child];
        q->items[hole] = q->items[child];
        hole = child;
    }
    if ((length & 1) == 0 && child == (length - 2) >> 1) {
        child = 2 * (child + 1);
        q->keys[hole] = q->keys[child - 1];
        q->items[hole] = q->items[child - 1];
        hole = child - 1;
    }
    heap_sift_up(q, hole, last_key, last_item);
    return top;
}

static int report_lock_wait(QueueObject *q, PyObject *gt, int64_t waited) {
    PyObject *label = PyUnicode_FromFormat("queue %U", q->name);
    if (label == NULL)
        return -1;
    PyObject *w = PyLong_FromLongLong(waited);
    PyObject *r = w ? PyObject_CallMethodObjArgs(q->tracer, s_lock_wait, label, gt, w, NULL) : NULL;
    Py_DECREF(label);
    Py_XDECREF(w);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* A push or pop told to the tracer: into its event log (and the other tracers), or to the tracer. */
static int report(QueueObject *q, PyObject *method, PyObject *item, Py_ssize_t depth) {
    PyObject *gt = PyTuple_GET_ITEM(item, 0), *node = PyTuple_GET_ITEM(item, 1);
    if (q->log != NULL) {
        if (log_event(q->log, method == s_task_pushed ? EV_PUSH : EV_POP, (PyObject *)q, gt, node, depth) < 0)
            return -1;
    }
    if (!(q->hooks & (method == s_task_pushed ? HOOK_PUSH : HOOK_POP)))
        return 0;
    PyObject *d = PyLong_FromSsize_t(depth);
    if (d == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodObjArgs(q->log != NULL ? q->others : q->tracer, method, (PyObject *)q, gt, node,
                                             d, NULL);
    Py_DECREF(d);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int report_idle(QueueObject *q, int64_t t0, int64_t t1, PyObject *waiting_for) {
    if (q->log != NULL) {
        if (log_idle(q->log, (PyObject *)q, t0, t1, waiting_for) < 0)
            return -1;
    }
    if (!(q->hooks & HOOK_IDLE))
        return 0;
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1);
    PyObject *r = (a && b) ? PyObject_CallMethodObjArgs(q->log != NULL ? q->others : q->tracer, s_worker_idle,
                                                        (PyObject *)q, a, b, waiting_for, NULL)
                           : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Push with a 128-bit key; steals nothing (increfs item). */
static int queue_push(QueueObject *q, u128 key, PyObject *item) {
    if (heap_reserve(q) < 0)
        return -1;
    Py_INCREF(item);
    int64_t waited = lock_nogil(q, q->tracing);
    /* heap_reserve ran before the lock: another pusher may have filled the room meanwhile */
    while (q->size + 1 > q->cap) {
        pthread_mutex_unlock(&q->mutex);
        if (heap_reserve(q) < 0) {
            Py_DECREF(item);
            return -1;
        }
        lock_nogil(q, 0);
    }
    q->size++;
    heap_sift_up(q, q->size - 1, key, item);
    Py_ssize_t depth = q->size;
    if (q->waiting)
        pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->mutex);
    if (q->tracing && item != SHUTDOWN_ITEM && PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
        if (waited && report_lock_wait(q, PyTuple_GET_ITEM(item, 0), waited) < 0)
            return -1;
        if (report(q, s_task_pushed, item, depth) < 0)
            return -1;
    }
    return 0;
}

static PyObject *Queue_push(QueueObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "push(key, item)");
        return NULL;
    }
    u128 key;
    if (key_from_long(args[0], &key) < 0 || queue_push(self, key, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Queue_push_wakeup(QueueObject *self, PyObject *gt) {
    PyObject *item = PyTuple_Pack(3, gt, Py_None, Py_None);
    if (item == NULL)
        return NULL;
    int r = queue_push(self, (u128)1 << 100, item);
    Py_DECREF(item);
    if (r < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Queue_push_shutdown(QueueObject *self, PyObject *unused) {
    if (SHUTDOWN_ITEM == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_core.configure() was not called");
        return NULL;
    }
    if (queue_push(self, (u128)1 << 101, SHUTDOWN_ITEM) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* pop(waiting_for=None): waiting_for is the GraphTask whose completion the popping loop waits
 * for (None on a device thread), told to the tracer with an idle span. */
static PyObject *Queue_pop_impl(QueueObject *self, PyObject *waiting_for) {
    int64_t waited = 0, idle0 = 0, idle1 = 0;
    PyObject *item;
    Py_ssize_t depth;
    int tracing = self->tracing;
    waited = lock_nogil(self, tracing);
    while (self->size == 0) {
        /* Sleep without the GIL until a push; then take the GIL back *before* popping, as a Python
         * worker would: a thread still routing (with the GIL) finishes its pushes first, and the
         * best of them is popped (PyTorch's pusher likewise outruns a waking worker). */
        if (tracing && !idle0)
            idle0 = now_ns();
        waited = 0;  /* waiting for the lock was part of going idle */
        self->waiting++;
        /* Only the main thread runs signal handlers: it sleeps in slices and checks between them,
         * so a Ctrl-C raises KeyboardInterrupt here as it would in Python's own lock waits. */
        int on_main = PyThread_get_thread_ident() == MAIN_THREAD;
        for (;;) {
            int empty;
            Py_BEGIN_ALLOW_THREADS
            if (on_main) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t t = (int64_t)ts.tv_nsec + SIGNAL_CHECK_NS;
                ts.tv_sec += (time_t)(t / 1000000000LL);
                ts.tv_nsec = (long)(t % 1000000000LL);
                while (self->size == 0)
                    if (pthread_cond_timedwait(&self->not_empty, &self->mutex, &ts) == ETIMEDOUT)
                        break;
            } else {
                while (self->size == 0)
                    pthread_cond_wait(&self->not_empty, &self->mutex);
            }
            empty = self->size == 0;
            if (!empty)
                self->waiting--;
            pthread_mutex_unlock(&self->mutex);
            Py_END_ALLOW_THREADS
            if (!empty)
                break;
            if (PyErr_CheckSignals() < 0) {  /* still counted as waiting: undo that, then raise */
                lock_nogil(self, 0);
                self->waiting--;
                pthread_mutex_unlock(&self->mutex);
                return NULL;
            }
            lock_nogil(self, 0);
        }
        if (tracing)
            idle1 = now_ns();
        lock_nogil(self, 0);
    }
    item = heap_pop(self);
    depth = self->size;
    pthread_mutex_unlock(&self->mutex);
    if (tracing && item != SHUTDOWN_ITEM) {
        if (idle0 && report_idle(self, idle0, idle1, waiting_for) < 0) {
            Py_DECREF(item);
            return NULL;
        }
        if (waited && report_lock_wait(self, PyTuple_GET_ITEM(item, 0), waited) < 0) {
            Py_DECREF(item);
            return NULL;
        }
        if (report(self, s_task_popped, item, depth) < 0) {
            Py_DECREF(item);
            return NULL;
        }
    } else if (idle0 && item == SHUTDOWN_ITEM) {
        /* a worker asleep until shutdown: nothing to report */
    }
    return item;
}

static PyObject *Queue_pop(QueueObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "pop(waiting_for=None)");
        return NULL;
    }
    return Queue_pop_impl(self, nargs ? args[0] : Py_None);
}

static PyObject *Queue_empty(QueueObject *self, PyObject *unused) {
    lock_nogil(self, 0);
    int empty = self->size == 0;
    pthread_mutex_unlock(&self->mutex);
    return PyBool_FromLong(empty);
}

static Py_ssize_t Queue_len(QueueObject *self) {
    lock_nogil(self, 0);
    Py_ssize_t n = self->size;
    pthread_mutex_unlock(&self->mutex);
    return n;
}

/* (key, item) pairs in heap order; the items copied under the mutex, the Python objects built after. */
static PyObject *Queue_snapshot(QueueObject *self, PyObject *unused) {
    lock_nogil(self, 0);
    Py_ssize_t n = self->size;
    u128 *keys = PyMem_Malloc(sizeof(u128) * (n ? n : 1));
    PyObject **items = PyMem_Malloc(sizeof(PyObject *) * (n ? n : 1));
    if (keys && items) {
        memcpy(keys, self->keys, sizeof(u128) * n);
        memcpy(items, self->items, sizeof(PyObject *) * n);
        for (Py_ssize_t i = 0; i < n; i++)
            Py_INCREF(items[i]);
    }
    pthread_mutex_unlock(&self->mutex);
    if (!keys || !items) {
        PyMem_Free(keys);
        PyMem_Free(items);
        return PyErr_NoMemory();
    }
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *k = key_to_long(keys[i]);
        PyObject *pair = k ? PyTuple_Pack(2, k, items[i]) : NULL;
        Py_XDECREF(k);
        if (pair == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, pair);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(items[i]);
    PyMem_Free(keys);
    PyMem_Free(items);
    return out;
}

/* rekey(match, new_key): the items that match get new_key(item) in place, without re-heaping
 * (see the Python twin). match/new_key run without the mutex; the keys are applied by identity. */
static PyObject *Queue_rekey(QueueObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "rekey(match, new_key)");
        return NULL;
    }
    PyObject *snap = Queue_snapshot(self, NULL);
    if (snap == NULL)
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(snap);
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *item = PyTuple_GET_ITEM(PyList_GET_ITEM(snap, i), 1);
        PyObject *ok = PyObject_CallOneArg(args[0], item);
        if (ok == NULL)
            goto fail;
        int t = PyObject_IsTrue(ok);
        Py_DECREF(ok);
        if (t < 0)
            goto fail;
        if (!t)
            continue;
        PyObject *k = PyObject_CallOneArg(args[1], item);
        u128 key;
        if (k == NULL || key_from_long(k, &key) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
        lock_nogil(self, 0);
        for (Py_ssize_t j = 0; j < self->size; j++)
            if (self->items[j] == item) {
                self->keys[j] = key;
                break;
            }
        pthread_mutex_unlock(&self->mutex);
    }
    Py_DECREF(snap);
    Py_RETURN_NONE;
fail:
    Py_DECREF(snap);
    return NULL;
}

static PyObject *Queue_get_tracer(QueueObject *self, void *c) {
    return Py_NewRef(self->tracer ? self->tracer : Py_None);
}

static int Queue_set_tracer_attr(QueueObject *self, PyObject *v, void *c) {
    return queue_set_tracer(self, v ? v : Py_None);
}

static PyMethodDef Queue_methods[] = {
    {"push", (PyCFunction)(void (*)(void))Queue_push, METH_FASTCALL, "push(key, item)"},
    {"push_wakeup", (PyCFunction)Queue_push_wakeup, METH_O, "push_wakeup(graph_task)"},
    {"push_shutdown", (PyCFunction)Queue_push_shutdown, METH_NOARGS, "push_shutdown()"},
    {"pop", (PyCFunction)(void (*)(void))Queue_pop, METH_FASTCALL,
     "pop(waiting_for=None) -> item, blocking (without the GIL) while empty"},
    {"snapshot", (PyCFunction)Queue_snapshot, METH_NOARGS, "the queued (key, item) pairs, in heap order"},
    {"empty", (PyCFunction)Queue_empty, METH_NOARGS, "whether the queue is empty now"},
    {"rekey", (PyCFunction)(void (*)(void))Queue_rekey, METH_FASTCALL, "rekey(match, new_key)"},
    {NULL}};

static PyMemberDef Queue_members[] = {
    {"name", T_OBJECT, offsetof(QueueObject, name), READONLY, "the queue's name"},
    {NULL}};

static PyGetSetDef Queue_getset[] = {
    {"tracer", (getter)Queue_get_tracer, (setter)Queue_set_tracer_attr, "hooks called on pushes and pops", NULL},
    {NULL}};

static PySequenceMethods Queue_as_sequence = {.sq_length = (lenfunc)Queue_len};

static PyTypeObject QueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.ReadyQueue",
    .tp_basicsize = sizeof(QueueObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Queue_traverse,
    .tp_clear = (inquiry)Queue_clear,
    .tp_doc = "A blocking max-heap with libstdc++'s exact tie order (see engine/ready_queue.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Queue_init,
    .tp_dealloc = (destructor)Queue_dealloc,
    .tp_methods = Queue_methods,
    .tp_members = Queue_members,
    .tp_getset = Queue_getset,
    .tp_as_sequence = &Queue_as_sequence,
};

/* ----------------------------------------------------------- InputBuffer */

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *grads;          /* list, one slot per input */
    PyObject *owned;          /* None, or a list of bools: the buffer made (owns) the slot's array */
    PyObject *accum_streams, *ready_streams, *ready_events;
} BufferObject;

static PyTypeObject BufferType;

static int Buffer_init(BufferObject *self, PyObject *args, PyObject *kw) {
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "n", &size))
        return -1;
    PyObject *g = PyList_New(size);
    if (g == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < size; i++)
        PyList_SET_ITEM(g, i, Py_NewRef(Py_None));
    Py_XSETREF(self->grads, g);
    Py_XSETREF(self->owned, Py_NewRef(Py_None));
    Py_XSETREF(self->accum_streams, Py_NewRef(Py_None));
    Py_XSETREF(self->ready_streams, Py_NewRef(Py_None));
    Py_XSETREF(self->ready_events, Py_NewRef(Py_None));
    return 0;
}

static int Buffer_traverse(BufferObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->grads);
    Py_VISIT(self->owned);
    Py_VISIT(self->accum_streams);
    Py_VISIT(self->ready_streams);
    Py_VISIT(self->ready_events);
    return 0;
}

static int Buffer_clear(BufferObject *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->grads);
    Py_CLEAR(self->owned);
    Py_CLEAR(self->accum_streams);
    Py_CLEAR(self->ready_streams);
    Py_CLEAR(self->ready_events);
    return 0;
}

static void Buffer_dealloc(BufferObject *self) {
    PyObject_GC_UnTrack(self);
    Buffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sum into a slot that holds a gradient: in place when the buffer owns the stored array. */
static int buffer_sum(BufferObject *self, Py_ssize_t pos, PyObject *old, PyObject *grad) {
    Py_ssize_t n = PyList_GET_SIZE(self->grads);
    if (self->owned == Py_None) {
        PyObject *o = PyList_New(n);
        if (o == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            PyList_SET_ITEM(o, i, Py_NewRef(Py_False));
        Py_SETREF(self->owned, o);
    }
    PyObject *result;
    if (PyList_GET_ITEM(self->owned, pos) == Py_True) {
        result = PyNumber_InPlaceAdd(old, grad);
    } else {
        result = PyNumber_Add(old, grad);
        if (result != NULL)
            PyList_SetItem(self->owned, pos, Py_NewRef(Py_True));
    }
    if (result == NULL)
        return -1;
    PyList_SetItem(self->grads, pos, result);  /* steals result */
    return 0;
}

static int buffer_add(BufferObject *self, Py_ssize_t pos, PyObject *grad) {
    if (grad == Py_None)
        return 0;
    if (pos < 0 || pos >= PyList_GET_SIZE(self->grads)) {
        PyErr_SetString(PyExc_IndexError, "input slot out of range");
        return -1;
    }
    PyObject *old = PyList_GET_ITEM(self->grads, pos);
    if (old == Py_None) {
        PyList_SetItem(self->grads, pos, Py_NewRef(grad));
        return 0;
    }
    Py_INCREF(old);
    int r = buffer_sum(self, pos, old, grad);
    Py_DECREF(old);
    return r;
}

static PyObject *Buffer_add(BufferObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "add(pos, grad)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if ((pos == -1 && PyErr_Occurred()) || buffer_add(self, pos, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Buffer__sum(BufferObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "_sum(pos, old, grad)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if ((pos == -1 && PyErr_Occurred()) || buffer_sum(self, pos, args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Buffer_len(BufferObject *self) {
    return PyList_GET_SIZE(self->grads);
}

static PyMethodDef Buffer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Buffer_add, METH_FASTCALL, "add(pos, grad): a CPU gradient into slot pos"},
    {"_sum", (PyCFunction)(void (*)(void))Buffer__sum, METH_FASTCALL, "_sum(pos, old, grad)"},
    {NULL}};

static PyMemberDef Buffer_members[] = {
    {"grads", T_OBJECT, offsetof(BufferObject, grads), 0, NULL},
    {"owned", T_OBJECT, offsetof(BufferObject, owned), 0, NULL},
    {"accum_streams", T_OBJECT, offsetof(BufferObject, accum_streams), 0, NULL},
    {"ready_streams", T_OBJECT, offsetof(BufferObject, ready_streams), 0, NULL},
    {"ready_events", T_OBJECT, offsetof(BufferObject, ready_events), 0, NULL},
    {NULL}};

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.InputBufferBase",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dictoffset = offsetof(BufferObject, dict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Per-node gradient slots (see engine/input_buffer.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Buffer_init,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_clear = (inquiry)Buffer_clear,
    .tp_methods = Buffer_methods,
    .tp_members = Buffer_members,
    .tp_as_sequence = &Buffer_as_sequence,
};

/* ----------------------------------------------------------------- route */

static PyObject *get_attr_long(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return NULL;
    *out = PyLong_AsLongLong(v);
    if (*out == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

static int id_obj(PyObject *o, int64_t *out) {
    long long v;
    PyObject *r = get_attr_long(o, s_id, &v);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    *out = v;
    return 0;
}

static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int t = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* What routing needs of the engine and its tracer, read once per call (or per worker loop). */
typedef struct {
    PyObject *engine;    /* borrowed */
    PyObject *tracer;    /* borrowed */
    int tracing;         /* tracer.enabled */
    LogObject *log;      /* tracer.event_log when it is a compiled EventLog (borrowed), else NULL */
    PyObject *others;    /* tracer.others: the tracers besides that log (new reference), or NULL */
    int hooks;           /* the hot hooks to call in Python (HOOK_*): `others`'s with a log, else the tracer's */
    PyObject *key_fn;    /* engine.priority.key unless the default priority (new reference), or NULL */
} EngineInfo;

static void engine_info_clear(EngineInfo *ei) {
    Py_CLEAR(ei->others);
    Py_CLEAR(ei->key_fn);
}

/* HOOK_* bits of the hot hooks `t` implements: its `implemented` set (Tracers), else all of them. */
static int hooks_mask(PyObject *t, int *mask) {
    *mask = HOOK_ALL;
    PyObject *impl = PyObject_GetAttrString(t, "implemented");
    if (impl == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (PyAnySet_Check(impl)) {
        PyObject *names[5] = {s_task_pushed, s_task_popped, s_node_start, s_node_end, s_worker_idle};
        int m = 0;
        for (int i = 0; i < 5; i++) {
            int has = PySet_Contains(impl, names[i]);
            if (has < 0) {
                Py_DECREF(impl);
                return -1;
            }
            if (has)
                m |= 1 << i;
        }
        *mask = m;
    }
    Py_DECREF(impl);
    return 0;
}

static int tracer_info(PyObject *tracer, int *tracing, LogObject **log, PyObject **others, int *mask) {
    *tracing = 0;
    *log = NULL;
    *others = NULL;
    *mask = HOOK_ALL;
    if (tracer == NULL || tracer == Py_None)
        return 0;
    int t = attr_true(tracer, s_enabled);
    if (t < 0)
        return -1;
    *tracing = t;
    if (!t)
        return 0;
    PyObject *lg = PyObject_GetAttr(tracer, s_event_log);
    if (lg == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return hooks_mask(tracer, mask);
    }
    if (!Py_IS_TYPE(lg, &LogType)) {
        Py_DECREF(lg);
        return hooks_mask(tracer, mask);
    }
    *mask = 0;  /* the log takes the hot hooks; `others`, when there are others, the ones they implement */
    {
        *log = (LogObject *)lg;  /* the tracer keeps it alive */
        PyObject *o = PyObject_GetAttr(tracer, s_others);
        if (o == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                Py_DECREF(lg);
                return -1;
            }
            PyErr_Clear();
        } else if (o == Py_None) {
            Py_DECREF(o);
        } else {
            *others = o;
            if (hooks_mask(o, mask) < 0) {
                Py_CLEAR(*others);
                Py_DECREF(lg);
                return -1;
            }
        }
    }
    Py_DECREF(lg);
    return 0;
}

static int engine_info_fill(EngineInfo *ei, PyObject *engine, PyObject *tracer) {
    memset(ei, 0, sizeof(*ei));
    ei->engine = engine;
    ei->tracer = tracer;
    int dp = attr_true(engine, s_default_priority);
    if (dp < 0)
        return -1;
    if (!dp) {
        PyObject *prio = PyObject_GetAttr(engine, s_priority);
        if (prio == NULL)
            return -1;
        ei->key_fn = PyObject_GetAttr(prio, s_key);
        Py_DECREF(prio);
        if (ei->key_fn == NULL)
            return -1;
    }
    if (tracer_info(tracer, &ei->tracing, &ei->log, &ei->others, &ei->hooks) < 0) {
        engine_info_clear(ei);
        return -1;
    }
    return 0;
}

/* GraphState.release (the plain function), registered by engine/state.py (register_release): a state
 * whose release() is that one has its containers updated directly (release_node). */
static PyObject *plain_release = NULL;

/* A GraphTask's fields that never change while it runs (graph_task.py), read once per GraphTask. */
typedef struct {
    PyObject *gt;
    PyObject *lock;      /* the GraphTask lock: a compiled Lock (taken directly) or any lock (its methods) */
    PyObject *acquire, *release, *deps, *not_ready, *cpu_queue, *exec_info, *state, *ctx;
    PyObject *half_nodes; /* the state's float16/bfloat16 nodes (Python's path: upcasts), NULL when none */
    /* Where the state's release() is GraphState.release (not overridden): its set of released nodes and
     * its caches of saved values, which release_node() updates directly; else NULL (release() is called). */
    PyObject *released, *saved, *saved_device;
    int multithreading, exec_nonempty, anomaly, keep_graph, has_faults;
} GtInfo;

static void gt_info_clear(GtInfo *gi) {
    Py_CLEAR(gi->gt);
    Py_CLEAR(gi->lock);
    Py_CLEAR(gi->acquire);
    Py_CLEAR(gi->release);
    Py_CLEAR(gi->deps);
    Py_CLEAR(gi->not_ready);
    Py_CLEAR(gi->cpu_queue);
    Py_CLEAR(gi->exec_info);
    Py_CLEAR(gi->state);
    Py_CLEAR(gi->ctx);
    Py_CLEAR(gi->half_nodes);
    Py_CLEAR(gi->released);
    Py_CLEAR(gi->saved);
    Py_CLEAR(gi->saved_device);
}

/* Take the GraphTask lock: 1 taken, 0 not (non-blocking), -1 on error. */
static int gi_acquire(GtInfo *gi, int blocking) {
    if (gi->acquire == NULL)
        return clock_acquire((CLockObject *)gi->lock, blocking, -1);
    PyObject *r = blocking ? PyObject_CallNoArgs(gi->acquire) : PyObject_CallOneArg(gi->acquire, Py_False);
    if (r == NULL)
        return -1;
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return blocking ? (t < 0 ? -1 : 1) : t;
}

static int gi_release(GtInfo *gi) {
    if (gi->release == NULL)
        return clock_release((CLockObject *)gi->lock);
    PyObject *r = PyObject_CallNoArgs(gi->release);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Routing's part (route() is called by the simulation too, with its own duck-typed GraphTask). */
static int gt_info_fill_route(GtInfo *gi, PyObject *gt, PyObject *exec_info) {
    memset(gi, 0, sizeof(*gi));
    gi->gt = Py_NewRef(gt);
    PyObject *lock = gi->lock = PyObject_GetAttr(gt, s_lock);
    if (lock == NULL)
        goto fail;
    if (!Py_IS_TYPE(lock, &CLockType)) {
        gi->acquire = PyObject_GetAttr(lock, s_acquire);
        gi->release = gi->acquire ? PyObject_GetAttr(lock, s_release) : NULL;
        if (gi->release == NULL)
            goto fail;
    }
    gi->cpu_queue = PyObject_GetAttr(gt, s_cpu_queue);
    if (gi->cpu_queue == NULL || (gi->multithreading = attr_true(gt, s_multithreading)) < 0)
        goto fail;
    gi->deps = PyObject_GetAttr(gt, s_dependencies);
    gi->not_ready = gi->deps ? PyObject_GetAttr(gt, s_not_ready) : NULL;
    if (gi->not_ready == NULL)
        goto fail;
    gi->exec_info = Py_NewRef(exec_info);
    if ((gi->exec_nonempty = PyObject_IsTrue(exec_info)) < 0)
        goto fail;
    return 0;
fail:
    gt_info_clear(gi);
    return -1;
}

/* The worker loop's part too. */
static int gt_info_fill(GtInfo *gi, PyObject *gt) {
    PyObject *exec_info = PyObject_GetAttr(gt, s_exec_info);
    if (exec_info == NULL)
        return -1;
    int r = gt_info_fill_route(gi, gt, exec_info);
    Py_DECREF(exec_info);
    if (r < 0)
        return -1;
    gi->state = PyObject_GetAttr(gt, s_state);
    gi->ctx = gi->state ? PyObject_GetAttr(gt, s_ctx) : NULL;
    if (gi->ctx == NULL || (gi->anomaly = attr_true(gt, s_anomaly)) < 0 ||
        (gi->keep_graph = attr_true(gt, s_keep_graph)) < 0 || (gi->has_faults = attr_true(gt, s_faults)) < 0) {
        gt_info_clear(gi);
        return -1;
    }
    PyObject *half = PyObject_GetAttr(gi->state, s_half_nodes);
    if (half == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {  /* a state without it: none */
            gt_info_clear(gi);
            return -1;
        }
        PyErr_Clear();
    }
    if (half != NULL) {
        int any = PyObject_IsTrue(half);
        if (any < 0) {
            Py_DECREF(half);
            gt_info_clear(gi);
            return -1;
        }
        if (any)
            gi->half_nodes = half;
        else
            Py_DECREF(half);
    }
    if (plain_release != NULL) {
        PyObject *method = PyObject_GetAttr(gi->state, s_release);
        if (method == NULL) {  /* a state without release(): called (and failing) only where a node needs it */
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                gt_info_clear(gi);
                return -1;
            }
            PyErr_Clear();
            return 0;
        }
        int plain = PyMethod_Check(method) && PyMethod_GET_FUNCTION(method) == plain_release;
        Py_DECREF(method);
        if (plain) {
            gi->released = PyObject_GetAttr(gi->state, s__released);
            gi->saved = gi->released ? PyObject_GetAttr(gi->state, s__saved) : NULL;
            gi->saved_device = gi->saved ? PyObject_GetAttr(gi->state, s__saved_device) : NULL;
            if (gi->saved_device == NULL) {
                gt_info_clear(gi);
                return -1;
            }
            if (!PySet_CheckExact(gi->released) || !PyDict_CheckExact(gi->saved) ||
                !PyDict_CheckExact(gi->saved_device)) {  /* not the plain containers: call release() */
                Py_CLEAR(gi->released);
                Py_CLEAR(gi->saved);
                Py_CLEAR(gi->saved_device);
            }
        }
    }
    return 0;
}

/* GraphState.release(node) where it is not overridden (gi->released set): marked released first, then its
 * saved values dropped (a concurrent saved() sees the values or the mark). */
static int release_node(GtInfo *gi, PyObject *node) {
    if (gi->released == NULL) {
        PyObject *r = PyObject_CallMethodOneArg(gi->state, s_release, node);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        return 0;
    }
    if (PySet_Add(gi->released, node) < 0)
        return -1;
    PyObject *dicts[2] = {gi->saved, gi->saved_device};
    for (int i = 0; i < 2; i++) {
        if (PyDict_GET_SIZE(dicts[i]) == 0)
            continue;
        int in = PyDict_Contains(dicts[i], node);
        if (in < 0 || (in && PyDict_DelItem(dicts[i], node) < 0))
            return -1;
    }
    return 0;
}

/* A new InputBuffer of `size` slots: allocated directly when BUFFER_TYPE adds no __init__. */
static PyObject *new_buffer(Py_ssize_t size) {
    PyTypeObject *tp = (PyTypeObject *)BUFFER_TYPE;
    if (!PyType_IsSubtype(tp, &BufferType) || tp->tp_init != (initproc)Buffer_init || tp->tp_new != PyType_GenericNew) {
        PyObject *sz = PyLong_FromSsize_t(size);
        PyObject *b = sz ? PyObject_CallOneArg(BUFFER_TYPE, sz) : NULL;
        Py_XDECREF(sz);
        return b;
    }
    BufferObject *b = (BufferObject *)tp->tp_alloc(tp, 0);
    if (b == NULL)
        return NULL;
    PyObject *g = PyList_New(size);
    if (g == NULL) {
        Py_DECREF(b);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++)
        PyList_SET_ITEM(g, i, Py_NewRef(Py_None));
    b->grads = g;
    b->owned = Py_NewRef(Py_None);
    b->accum_streams = Py_NewRef(Py_None);
    b->ready_streams = Py_NewRef(Py_None);
    b->ready_events = Py_NewRef(Py_None);
    return (PyObject *)b;
}

static PyObject *report_lock_label(PyObject *tracer, const char *label, PyObject *gt, int64_t waited) {
    PyObject *w = PyLong_FromLongLong(waited);
    PyObject *l = PyUnicode_FromString(label);
    PyObject *r = (w && l) ? PyObject_CallMethodObjArgs(tracer, s_lock_wait, l, gt, w, NULL) : NULL;
    Py_XDECREF(w);
    Py_XDECREF(l);
    return r;
}

/* worker.route_py, compiled: under the GraphTask lock, hand each output to its next node's
 * InputBuffer and push the nodes that became ready; retire this task; return whether that finished
 * the GraphTask. `outstanding` is read once and written once, both under the lock. */
static PyObject *route_core(EngineInfo *ei, GtInfo *gi, PyObject *node, PyObject *outputs, PyObject *parent) {
    PyObject *gt = gi->gt, *result = NULL, *next = NULL, *outs = NULL, *depth_obj = NULL;
    long long added = 0, out0 = 0;
    int have_out0 = 0, ok = 0;

    /* Acquire the GraphTask lock: timed when tracing and contended (the Python twin's rule). */
    {
        int got = gi_acquire(gi, !ei->tracing);
        if (got < 0)
            return NULL;
        if (!got) {
            int64_t t0 = now_ns();
            if (gi_acquire(gi, 1) < 0)
                return NULL;
            PyObject *rr = report_lock_label(ei->tracer, "GraphTask", gt, now_ns() - t0);
            if (rr == NULL) {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                if (gi_release(gi) < 0)
                    PyErr_Clear();
                PyErr_Restore(et, ev, tb);
                return NULL;
            }
            Py_DECREF(rr);
        }
    }

    /* Under the lock from here on: `release` on every path. */
    long long depth;
    depth_obj = slot_get(&GT_SLOTS, gt, GF_DEPTH);  /* under the lock: expiry changes it */
    depth = depth_obj ? PyLong_AsLongLong(depth_obj) : -1;
    if (depth == -1 && PyErr_Occurred())
        goto unlock;
    next = depth_obj ? node_get(node, NF_NEXT) : NULL;
    outs = next ? PySequence_Fast(outputs, "outputs must be a sequence") : NULL;
    if (outs == NULL)
        goto unlock;
    PyObject *deps = gi->deps, *not_ready = gi->not_ready;
    if (BUFFER_TYPE == NULL || !PyList_Check(next) || !PyDict_Check(deps) || !PyDict_Check(not_ready)) {
        PyErr_SetString(PyExc_TypeError, "route: _core.configure() not called, or an unexpected graph task layout");
        goto unlock;
    }
    if (slot_long(&GT_SLOTS, gt, GF_OUTSTANDING, &out0) < 0)
        goto unlock;
    have_out0 = 1;
    Py_ssize_t n = PyList_GET_SIZE(next);
    if (PySequence_Fast_GET_SIZE(outs) < n)
        n = PySequence_Fast_GET_SIZE(outs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(next, i);
        if (e == Py_None)
            continue;
        PyObject *out = PySequence_Fast_GET_ITEM(outs, i);
        PyObject *nxt = PyTuple_GET_ITEM(e, 0), *input_nr = PyTuple_GET_ITEM(e, 1);
        PyObject *count = PyDict_GetItemWithError(deps, nxt);
        if (count == NULL) {
            if (!PyErr_Occurred()) {
                PyObject *nm = PyObject_GetAttr(nxt, s_name);
                if (nm != NULL) {
                    PyErr_Format(PyExc_RuntimeError, "dependency not found for %U", nm);
                    Py_DECREF(nm);
                }
            }
            goto unlock;
        }
        long c = PyLong_AsLong(count);
        int ready;
        if (c == 1) {
            if (PyDict_DelItem(deps, nxt) < 0)
                goto unlock;
            ready = 1;
        } else {
            PyObject *nc = PyLong_FromLong(c - 1);
            if (nc == NULL || PyDict_SetItem(deps, nxt, nc) < 0) {
                Py_XDECREF(nc);
                goto unlock;
            }
            Py_DECREF(nc);
            ready = 0;
        }
        PyObject *buf = PyDict_GetItemWithError(not_ready, nxt);  /* borrowed */
        if (buf == NULL && PyErr_Occurred())
            goto unlock;
        if (buf == NULL) {
            if (gi->exec_nonempty) {
                PyObject *exec_info = gi->exec_info;
                PyObject *fi = PyDict_Check(exec_info) ? PyDict_GetItemWithError(exec_info, nxt)
                                                       : PyObject_CallMethodOneArg(exec_info, s_get, nxt);
                if (fi == NULL && PyErr_Occurred())
                    goto unlock;
                if (fi == NULL)
                    fi = Py_None;
                if (PyDict_Check(exec_info))
                    Py_INCREF(fi);
                int run = 0;
                if (fi != Py_None) {
                    PyObject *se = PyObject_CallMethodNoArgs(fi, s_should_execute);
                    run = se ? PyObject_IsTrue(se) : -1;
                    Py_XDECREF(se);
                }
                Py_DECREF(fi);
                if (run < 0)
                    goto unlock;
                if (!run)
                    continue;
            }
            PyObject *ins = node_get(nxt, NF_INPUTS);
            if (ins == NULL)
                goto unlock;
            Py_ssize_t nin = PyList_Check(ins) ? PyList_GET_SIZE(ins) : PyObject_Length(ins);
            Py_DECREF(ins);
            buf = nin < 0 ? NULL : new_buffer(nin);  /* new reference */
            if (buf == NULL)
                goto unlock;
            if (!ready && PyDict_SetItem(not_ready, nxt, buf) < 0) {
                Py_DECREF(buf);
                goto unlock;
            }
        } else {
            Py_INCREF(buf);
            if (ready && PyDict_DelItem(not_ready, nxt) < 0) {
                Py_DECREF(buf);
                goto unlock;
            }
        }
        /* add the gradient: CPU slots here, accelerator slots through the Python stream rules */
        int on_cpu = node_true(nxt, NF_CPU);
        if (on_cpu < 0) {
            Py_DECREF(buf);
            goto unlock;
        }
        int add_ok;
        PyObject *device = NULL;
        if (!on_cpu) {
            PyObject *ins = node_get(nxt, NF_INPUTS);
            PyObject *meta = ins ? PyObject_GetItem(ins, input_nr) : NULL;
            Py_XDECREF(ins);
            device = meta ? PyObject_GetAttr(meta, s_device) : NULL;
            Py_XDECREF(meta);
            PyObject *dtype = device ? PyObject_GetAttr(device, s_type) : NULL;
            if (dtype == NULL) {
                Py_XDECREF(device);
                Py_DECREF(buf);
                goto unlock;
            }
            int is_cpu = PyUnicode_Check(dtype) && PyUnicode_Compare(dtype, s_cpu_str) == 0;
            Py_DECREF(dtype);
            if (!is_cpu) {
                PyObject *streams = PyObject_GetAttr(ei->engine, s_streams);
                PyObject *nstream = NULL;
                if (streams != NULL) {
                    /* node_stream(nxt) = (device, stream) of an accelerator node */
                    PyObject *ndev = PyObject_GetAttr(nxt, s_device);
                    PyObject *nst = ndev ? PyObject_GetAttr(nxt, s_stream) : NULL;
                    nstream = nst ? PyTuple_Pack(2, ndev, nst) : NULL;
                    Py_XDECREF(ndev);
                    Py_XDECREF(nst);
                }
                PyObject *r = nstream ? PyObject_CallMethodObjArgs(buf, s_add_on_device, input_nr, out, device,
                                                                    parent, nstream, node, nxt, streams, gt, NULL)
                                      : NULL;
                Py_XDECREF(streams);
                Py_XDECREF(nstream);
                Py_DECREF(device);
                if (r == NULL) {
                    Py_DECREF(buf);
                    goto unlock;
                }
                Py_DECREF(r);
                goto added;
            }
            Py_DECREF(device);
        }
        if (Py_IS_TYPE(buf, &BufferType) || PyObject_TypeCheck(buf, &BufferType)) {
            Py_ssize_t pos = PyLong_AsSsize_t(input_nr);
            add_ok = (pos == -1 && PyErr_Occurred()) ? -1 : buffer_add((BufferObject *)buf, pos, out);
        } else {
            PyObject *r = PyObject_CallMethodObjArgs(buf, s_add, input_nr, out, NULL);
            add_ok = r ? 0 : -1;
            Py_XDECREF(r);
        }
        if (add_ok < 0) {
            Py_DECREF(buf);
            goto unlock;
        }
    added:
        if (!ready) {
            Py_DECREF(buf);
            continue;
        }
        added++;  /* outstanding += 1, written once below */
        PyObject *queue;
        if (on_cpu || !gi->multithreading) {
            queue = Py_NewRef(gi->cpu_queue);
        } else {
            PyObject *ndev = PyObject_GetAttr(nxt, s_device);
            PyObject *idx = ndev ? PyObject_GetAttr(ndev, s_index) : NULL;
            Py_XDECREF(ndev);
            queue = idx ? PyObject_CallMethodOneArg(ei->engine, s_device_queue, idx) : NULL;
            Py_XDECREF(idx);
            if (queue == NULL) {
                Py_DECREF(buf);
                goto unlock;
            }
        }
        PyObject *task = PyTuple_Pack(3, gt, nxt, buf);
        Py_DECREF(buf);
        if (task == NULL) {
            Py_DECREF(queue);
            goto unlock;
        }
        int pushed;
        if (ei->key_fn == NULL && Py_IS_TYPE(queue, &QueueType)) {
            PyObject *sv = node_get(nxt, NF_SEQ);
            unsigned long long seq = sv ? PyLong_AsUnsignedLongLong(sv) : 0;
            Py_XDECREF(sv);
            if (PyErr_Occurred()) {
                Py_DECREF(task);
                Py_DECREF(queue);
                goto unlock;
            }
            pushed = queue_push((QueueObject *)queue, ((u128)(uint64_t)depth << 64) | (u128)seq, task);
        } else {
            PyObject *key;
            if (ei->key_fn != NULL) {
                key = PyObject_CallFunctionObjArgs(ei->key_fn, depth_obj, nxt, NULL);
            } else {
                PyObject *sv = node_get(nxt, NF_SEQ);
                PyObject *sixty4 = PyLong_FromLong(64);
                PyObject *hi = sixty4 ? PyNumber_Lshift(depth_obj, sixty4) : NULL;
                key = (hi && sv) ? PyNumber_Or(hi, sv) : NULL;
                Py_XDECREF(sv);
                Py_XDECREF(sixty4);
                Py_XDECREF(hi);
            }
            PyObject *r = key ? PyObject_CallMethodObjArgs(queue, s_push, key, task, NULL) : NULL;
            Py_XDECREF(key);
            pushed = r ? 0 : -1;
            Py_XDECREF(r);
        }
        Py_DECREF(task);
        Py_DECREF(queue);
        if (pushed < 0)
            goto unlock;
    }
    ok = 1;  /* this task retires: outstanding -= 1 */
unlock:
    if (have_out0) {
        long long final = out0 + added - ok;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int set = slot_set_long(&GT_SLOTS, gt, GF_OUTSTANDING, final);
        if (et != NULL) {
            if (set < 0)
                PyErr_Clear();
            PyErr_Restore(et, ev, tb);
        } else if (set < 0) {
            ok = 0;
        } else if (ok) {
            result = PyBool_FromLong(final == 0);
        }
    }
    Py_XDECREF(depth_obj);
    {
        /* release the lock, keeping any pending exception */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (gi_release(gi) < 0) {
            if (et != NULL)
                PyErr_Clear();
            else
                Py_CLEAR(result);
        }
        if (et != NULL) {
            PyErr_Restore(et, ev, tb);
            Py_CLEAR(result);
        }
    }
    Py_XDECREF(next);
    Py_XDECREF(outs);
    return result;
}

/* route(engine, gt, node, outputs, exec_info, tracer, parent) -> bool: see worker.route_py. */
static PyObject *route(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "route(engine, gt, node, outputs, exec_info, tracer, parent)");
        return NULL;
    }
    EngineInfo ei;
    GtInfo gi;
    if (engine_info_fill(&ei, args[0], args[5]) < 0)
        return NULL;
    if (gt_info_fill_route(&gi, args[1], args[4]) < 0) {
        engine_info_clear(&ei);
        return NULL;
    }
    PyObject *r = route_core(&ei, &gi, args[2], args[3], args[6]);
    gt_info_clear(&gi);
    engine_info_clear(&ei);
    return r;
}

/* --------------------------------------------------------- outputs_match */

/* numpy arrays read without numpy's headers: the leading fields of PyArrayObject_fields (stable
 * since numpy 1.7, numpy 2 included). configure_worker() checks them on a probe array and uses
 * them only for arrays of exactly numpy.ndarray; anything else is read through getattr. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
} ArrayHead;

static PyTypeObject *ARRAY_TYPE = NULL;

/* 1 when g has exactly `shape` (a tuple of ints) and its dtype object is `want`, 0 when not, -1 on error. */
static int array_matches(PyObject *g, PyObject *shape, PyObject *want) {
    if (Py_TYPE(g) == ARRAY_TYPE && PyTuple_CheckExact(shape)) {
        ArrayHead *a = (ArrayHead *)g;
        if (a->descr != want || PyTuple_GET_SIZE(shape) != a->nd)
            return 0;
        for (int i = 0; i < a->nd; i++) {
            PyObject *d = PyTuple_GET_ITEM(shape, i);
            if (!PyLong_CheckExact(d))
                return 0;
            Py_ssize_t v = PyLong_AsSsize_t(d);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (v != a->dimensions[i])
                return 0;
        }
        return 1;
    }
    PyObject *gs = PyObject_GetAttr(g, s_shape);
    if (gs == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = PyObject_RichCompareBool(gs, shape, Py_EQ);
    Py_DECREF(gs);
    if (same != 1) {
        PyErr_Clear();
        return 0;
    }
    PyObject *dt = PyObject_GetAttr(g, s_dtype);
    if (dt == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = dt == want;
    Py_DECREF(dt);
    return ok;
}

/* The compiled loop's check before validate_outputs: 1 when every gradient already fits its slot, or
 * only differs from it in size-1 dimensions (then it is reshaped here, in `grads`, exactly as
 * validate_outputs would: the sum over size-1 dimensions is the element itself); 0 when the full
 * validate_outputs must run (another shape, a dtype to cast, a count that differs); -1 on error. */
static int conform_outputs(PyObject *edges, PyObject *grads, PyObject *dtypes) {
    if (!PyList_Check(edges) || !PyList_Check(grads) || PyList_GET_SIZE(edges) != PyList_GET_SIZE(grads))
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(edges);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(edges, i), *g = PyList_GET_ITEM(grads, i);
        if (e == Py_None || g == Py_None)
            continue;
        PyObject *target = PyTuple_GET_ITEM(e, 0), *nr = PyTuple_GET_ITEM(e, 1);
        PyObject *ins = node_get(target, NF_INPUTS);
        PyObject *meta = ins ? PyObject_GetItem(ins, nr) : NULL;
        Py_XDECREF(ins);
        if (meta == NULL)
            return -1;
        PyObject *shape = slot_get(&META_SLOTS, meta, MF_SHAPE);
        PyObject *name = shape ? slot_get(&META_SLOTS, meta, MF_DTYPE) : NULL;
        Py_DECREF(meta);
        if (name == NULL) {
            Py_XDECREF(shape);
            return -1;
        }
        PyObject *want = PyDict_GetItemWithError(dtypes, name);  /* borrowed */
        Py_DECREF(name);
        if (want == NULL) {
            Py_DECREF(shape);
            if (PyErr_Occurred())
                return -1;
            return 0;
        }
        int ok = array_matches(g, shape, want);
        if (ok == 0 && Py_TYPE(g) == ARRAY_TYPE && ((ArrayHead *)g)->descr == want && PyTuple_CheckExact(shape)) {
            ArrayHead *a = (ArrayHead *)g;
            Py_ssize_t nd = PyTuple_GET_SIZE(shape), td = a->nd, want_n = 1, have_n = 1;
            int fits = nd <= td;
            for (Py_ssize_t k = 1; fits && k <= nd; k++) {
                Py_ssize_t sv = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, nd - k)), t = a->dimensions[td - k];
                if (sv == -1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    fits = 0;
                } else if (sv != 1 && sv != t) {
                    fits = 0;
                }
                want_n *= sv;
            }
            for (Py_ssize_t k = 0; fits && k < td; k++)
                have_n *= a->dimensions[k];
            if (fits && want_n == have_n) {
                PyObject *r = PyObject_CallMethodOneArg(g, s_reshape, shape);
                if (r == NULL) {
                    Py_DECREF(shape);
                    return -1;
                }
                PyList_SetItem(grads, i, r);  /* steals r */
                ok = 1;
            }
        }
        Py_DECREF(shape);
        if (ok <= 0)
            return ok;
    }
    return 1;
}

/* outputs_match(edges, grads, np_dtypes) -> bool: every gradient for a valid edge already has its
 * slot's shape and dtype (np_dtypes maps a dtype name to the numpy dtype object), and the counts
 * agree; False sends the caller to the full validate_outputs. */
static PyObject *outputs_match(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "outputs_match(edges, grads, np_dtypes)");
        return NULL;
    }
    PyObject *edges = args[0], *grads = args[1], *dtypes = args[2];
    if (!PyList_Check(edges) || !PyList_Check(grads) || PyList_GET_SIZE(edges) != PyList_GET_SIZE(grads))
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(edges);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(edges, i), *g = PyList_GET_ITEM(grads, i);
        if (e == Py_None || g == Py_None)
            continue;
        PyObject *target = PyTuple_GET_ITEM(e, 0), *nr = PyTuple_GET_ITEM(e, 1);
        PyObject *ins = node_get(target, NF_INPUTS);
        PyObject *meta;
        if (ins != NULL && PyList_CheckExact(ins) && PyLong_CheckExact(nr)) {
            Py_ssize_t k = PyLong_AsSsize_t(nr);
            meta = (k >= 0 && k < PyList_GET_SIZE(ins)) ? Py_NewRef(PyList_GET_ITEM(ins, k)) : PyObject_GetItem(ins, nr);
        } else {
            meta = ins ? PyObject_GetItem(ins, nr) : NULL;
        }
        Py_XDECREF(ins);
        if (meta == NULL)
            return NULL;
        PyObject *want_shape = slot_get(&META_SLOTS, meta, MF_SHAPE);
        PyObject *want_name = want_shape ? slot_get(&META_SLOTS, meta, MF_DTYPE) : NULL;
        Py_DECREF(meta);
        if (want_name == NULL) {
            Py_XDECREF(want_shape);
            return NULL;
        }
        PyObject *want = PyDict_GetItemWithError(dtypes, want_name);  /* borrowed */
        Py_DECREF(want_name);
        if (want == NULL) {
            Py_DECREF(want_shape);
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        int ok = array_matches(g, want_shape, want);
        Py_DECREF(want_shape);
        if (ok < 0)
            return NULL;
        if (!ok)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------ spin_until */

static PyObject *spin_until(PyObject *mod, PyObject *arg) {
    double deadline = PyFloat_AsDouble(arg);
    if (deadline == -1.0 && PyErr_Occurred())
        return NULL;
    int64_t end = (int64_t)(deadline * 1e9);
    Py_BEGIN_ALLOW_THREADS
    while (now_ns() < end) {
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ----------------------------------------------------------- thread_main */

/* The worker loop (worker.thread_main_py) with evaluate_function's common case compiled: a CPU
 * node of a GraphTask without requested inputs, anomaly mode, hooks or faults, and a node without
 * attrs, runs its rule from here and routes in C; every other node goes through the Python
 * evaluate_function. Same calls, same order, same locking; configure_worker() gives the Python
 * objects it needs. */

static PyObject *RUNNERS = NULL;          /* builtin_nodes.RUNNERS: OpSpec -> fn(node, grads, ctx) */
static PyObject *DIRECT_RULES = NULL;     /* OpSpec -> formula under ops.spec.undefined_passthrough */
static PyObject *ACC_OP = NULL;           /* ops.ACCUMULATE_GRAD */
static PyObject *NP_DTYPES = NULL;        /* worker._NP_DTYPES */
static PyObject *VALIDATE_OUTPUTS = NULL; /* worker.validate_outputs */
static PyObject *MISSING_SAVED = NULL;    /* worker._missing_saved(node, KeyError) -> RuntimeError */
static PyObject *EVALUATE_FUNCTION = NULL;/* worker.evaluate_function */

static PyObject *outputs_match(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* A tracer hook with (gt, node): to the event log and the other tracers, or to the tracer. */
static int trace_node(EngineInfo *ei, int kind, PyObject *gt, PyObject *node) {
    if (ei->log != NULL) {
        if (log_event(ei->log, kind, NULL, gt, node, -1) < 0)
            return -1;
    }
    if (!(ei->hooks & (kind == EV_START ? HOOK_START : HOOK_END)))
        return 0;
    PyObject *target = ei->log != NULL ? ei->others : ei->tracer;
    PyObject *r = PyObject_CallMethodObjArgs(target, kind == EV_START ? s_node_start : s_node_end, gt, node, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* `raise _missing_saved(node, exc) from exc` for the KeyError now set. */
static void translate_key_error(PyObject *node) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    if (tb != NULL && ev != NULL)
        PyException_SetTraceback(ev, tb);
    PyObject *new = PyObject_CallFunctionObjArgs(MISSING_SAVED, node, ev, NULL);
    if (new == NULL) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return;
    }
    PyException_SetContext(new, Py_NewRef(ev));
    PyException_SetCause(new, ev);  /* steals ev; sets __suppress_context__ */
    PyErr_SetObject((PyObject *)Py_TYPE(new), new);
    Py_DECREF(new);
    Py_XDECREF(et);
    Py_XDECREF(tb);
}

/* The node's rule: its formula directly when every defined gradient would reach it anyway
 * (undefined_passthrough's rule), else RUNNERS[op]. New reference, or NULL (KeyError translated). */
static PyObject *run_rule(PyObject *node, PyObject *op, PyObject *grads, PyObject *ctx) {
    PyObject *fn = PyDict_GetItemWithError(DIRECT_RULES, op);
    if (fn != NULL && PyList_Check(grads)) {
        Py_ssize_t n = PyList_GET_SIZE(grads), i;
        for (i = 0; i < n; i++)
            if (PyList_GET_ITEM(grads, i) != Py_None)
                break;
        if (i == n) {  /* every incoming gradient undefined: None for every edge */
            PyObject *next = node_get(node, NF_NEXT);
            Py_ssize_t m = next ? PyObject_Length(next) : -1;
            Py_XDECREF(next);
            if (m < 0)
                return NULL;
            PyObject *out = PyList_New(m);
            for (Py_ssize_t k = 0; out && k < m; k++)
                PyList_SET_ITEM(out, k, Py_NewRef(Py_None));
            return out;
        }
    } else if (fn == NULL) {
        if (PyErr_Occurred())
            return NULL;
        fn = PyDict_GetItemWithError(RUNNERS, op);
        if (fn == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, op);
            translate_key_error(node);
            return NULL;
        }
    }
    PyObject *args[3] = {node, grads, ctx};
    PyObject *out = PyObject_Vectorcall(fn, args, 3, NULL);
    if (out == NULL && PyErr_ExceptionMatches(PyExc_KeyError))
        translate_key_error(node);
    return out;
}

/* worker._call_function's fast path: the rule, then validate_outputs unless the outputs already
 * match their slots. New reference, or NULL. */
static PyObject *call_function(EngineInfo *ei, int real_cuda, PyObject *node, PyObject *op, PyObject *grads,
                               PyObject *ctx) {
    PyObject *outputs = run_rule(node, op, grads, ctx);
    if (outputs == NULL || op == ACC_OP)
        return outputs;
    PyObject *next = node_get(node, NF_NEXT);
    if (next == NULL)
        goto fail;
    int match = real_cuda ? 0 : conform_outputs(next, outputs, NP_DTYPES);
    if (match < 0)
        goto fail;
    if (!match) {
        PyObject *devices = PyObject_GetAttr(ei->engine, s_devices);
        PyObject *r = devices ? PyObject_CallFunctionObjArgs(VALIDATE_OUTPUTS, next, outputs, node, Py_None, devices,
                                                             NULL)
                              : NULL;
        Py_XDECREF(devices);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(next);
    return outputs;
fail:
    Py_XDECREF(next);
    Py_DECREF(outputs);
    return NULL;
}

/* evaluate_function(engine, gt, node, buf): True/False when the task finished routing (whether that
 * completed the GraphTask), None when it did not route; NULL on error. */
static PyObject *evaluate(EngineInfo *ei, GtInfo *gi, int real_cuda, PyObject *node, PyObject *buf) {
    PyObject *gt = gi->gt;
    int fast = !gi->exec_nonempty && !gi->anomaly && !gi->has_faults;
    if (fast) {
        fast = node_true(node, NF_CPU);
        if (fast < 0)
            return NULL;
    }
    if (fast) {
        int hooks = attr_true(gi->state, s_has_hooks);
        if (hooks < 0)
            return NULL;
        int attrs = hooks ? 1 : node_true(node, NF_ATTRS);
        if (attrs < 0)
            return NULL;
        fast = !attrs;
    }
    if (fast && gi->half_nodes != NULL) {  /* a float16/bfloat16 node computes in float32: Python's path */
        int half = PySequence_Contains(gi->half_nodes, node);
        if (half < 0)
            return NULL;
        fast = !half;
    }
    if (!fast)
        return PyObject_CallFunctionObjArgs(EVALUATE_FUNCTION, ei->engine, gt, node, buf, NULL);

    PyObject *grads = PyObject_TypeCheck(buf, &BufferType) ? Py_NewRef(((BufferObject *)buf)->grads)
                                                           : PyObject_GetAttr(buf, s_grads);
    PyObject *op = grads ? node_get(node, NF_OP) : NULL;
    if (op == NULL) {
        Py_XDECREF(grads);
        return NULL;
    }
    if (ei->tracing && trace_node(ei, EV_START, gt, node) < 0) {
        Py_DECREF(grads);
        Py_DECREF(op);
        return NULL;
    }
    PyObject *outputs = call_function(ei, real_cuda, node, op, grads, gi->ctx);
    Py_DECREF(grads);
    Py_DECREF(op);
    if (ei->tracing) {  /* as a `finally`: an error here replaces the rule's */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (trace_node(ei, EV_END, gt, node) < 0) {
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            Py_CLEAR(outputs);
        } else {
            PyErr_Restore(et, ev, tb);
        }
    }
    if (outputs == NULL)
        return NULL;
    int saves = node_true(node, NF_SAVES);
    if (saves < 0)
        goto fail;
    if (saves && !gi->keep_graph) {
        if (release_node(gi, node) < 0)
            goto fail;
    }
    int any = PyObject_IsTrue(outputs);
    if (any < 0)
        goto fail;
    if (!any) {
        Py_DECREF(outputs);
        Py_RETURN_NONE;
    }
    PyObject *res = route_core(ei, gi, node, outputs, Py_None);
    Py_DECREF(outputs);
    return res;
fail:
    Py_DECREF(outputs);
    return NULL;
}

/* `with gt.lock: gt.outstanding -= 1; return gt.outstanding == 0`: 1, 0, or -1 on error. */
static int retire(GtInfo *gi) {
    if (gi_acquire(gi, 1) < 0)
        return -1;
    long long n;
    int result = -1;
    if (slot_long(&GT_SLOTS, gi->gt, GF_OUTSTANDING, &n) == 0 &&
        slot_set_long(&GT_SLOTS, gi->gt, GF_OUTSTANDING, n - 1) == 0)
        result = n - 1 == 0;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (gi_release(gi) < 0) {
        if (et != NULL)
            PyErr_Clear();
        result = -1;
    }
    if (et != NULL)
        PyErr_Restore(et, ev, tb);
    return result;
}

static PyObject *Queue_pop_impl(QueueObject *self, PyObject *waiting_for);

/* The thread-local frame (engine.tls.frame: the running GraphTask and whether reentrant
 * checkpoints are valid) is installed for a task and kept while the thread runs more tasks of the
 * same GraphTask; it is put back before a pop that may block (an empty queue) or run Python
 * tracer hooks, before a task of another GraphTask, before completion and skipped-node hooks, and
 * when the loop returns: no Python code outside a task's node ever sees it (worker.thread_main_py
 * keeps it the same way). */
typedef struct {
    PyObject *tls;
    PyObject *gt;    /* the GraphTask whose frame is installed (held), or NULL */
    PyObject *prev;  /* the frame that was there before (held) */
} FrameState;

/* Put the previous frame back; a pending exception stays (unless this fails: then that error). */
static int frame_restore(FrameState *fs) {
    if (fs->gt == NULL)
        return 0;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int r = PyObject_SetAttr(fs->tls, s_frame, fs->prev);
    Py_CLEAR(fs->gt);
    Py_CLEAR(fs->prev);
    if (r < 0) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return -1;
    }
    PyErr_Restore(et, ev, tb);
    return 0;
}

/* tls.frame = (gt, (prev is None or prev[1]) and not gt.exec_info), unless gt's is installed already. */
static int frame_install(FrameState *fs, PyObject *gt, int exec_nonempty) {
    if (fs->gt == gt)
        return 0;
    if (frame_restore(fs) < 0)
        return -1;
    PyObject *prev = PyObject_GetAttr(fs->tls, s_frame);
    if (prev == NULL)
        return -1;
    int valid = 1;
    if (prev != Py_None) {
        PyObject *p1 = PySequence_GetItem(prev, 1);
        valid = p1 ? PyObject_IsTrue(p1) : -1;
        Py_XDECREF(p1);
    }
    PyObject *frame = valid < 0 ? NULL : PyTuple_Pack(2, gt, (valid && !exec_nonempty) ? Py_True : Py_False);
    if (frame == NULL || PyObject_SetAttr(fs->tls, s_frame, frame) < 0) {
        Py_XDECREF(frame);
        Py_DECREF(prev);
        return -1;
    }
    Py_DECREF(frame);
    fs->gt = Py_NewRef(gt);
    fs->prev = prev;
    return 0;
}

/* One task of the loop; 0 to go on, -1 on error. */
static int run_task(EngineInfo *ei, GtInfo *gi, FrameState *fs, int real_cuda, PyObject *tls, PyObject *item) {
    PyObject *gt = PyTuple_GET_ITEM(item, 0), *node = PyTuple_GET_ITEM(item, 1), *buf = PyTuple_GET_ITEM(item, 2);
    int expired = slot_true(&GT_SLOTS, gt, GF_EXPIRED);
    if (expired != 0)
        return expired < 0 ? -1 : 0;  /* its caller returned after a failure: drop the task unseen */
    if (gi->gt != gt) {
        gt_info_clear(gi);
        if (gt_info_fill(gi, gt) < 0)
            return -1;
    }
    PyObject *finished = Py_NewRef(Py_None);
    if (node != Py_None) {
        int has_error = slot_true(&GT_SLOTS, gt, GF_HAS_ERROR);
        if (has_error < 0)
            goto fail;
        if (!has_error) {
            if (frame_install(fs, gt, gi->exec_nonempty) < 0)
                goto fail;
            PyObject *r = evaluate(ei, gi, real_cuda, node, buf);
            if (r != NULL) {
                Py_SETREF(finished, r);
            } else {  /* captured as a value, re-raised by the caller */
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                PyErr_NormalizeException(&et, &ev, &tb);
                if (tb != NULL && ev != NULL)
                    PyException_SetTraceback(ev, tb);
                PyObject *h = ev ? PyObject_CallMethodObjArgs(ei->engine, s_on_exception, gt, node, ev, NULL) : NULL;
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                if (h == NULL)
                    goto fail;
                Py_DECREF(h);
            }
        } else if (ei->tracing) {
            if (frame_restore(fs) < 0)
                goto fail;
            PyObject *r = PyObject_CallMethodObjArgs(ei->tracer, s_node_skipped, gt, node, NULL);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        }
    }
    int done;
    if (finished == Py_None) {  /* not retired while routing: retire the task here */
        done = retire(gi);
        if (done < 0)
            goto fail;
    } else {
        done = PyObject_IsTrue(finished);
        if (done < 0)
            goto fail;
    }
    Py_DECREF(finished);
    if (done) {
        if (frame_restore(fs) < 0)
            return -1;
        PyObject *r = PyObject_CallMethodOneArg(ei->engine, s_mark_completed, gt);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        PyObject *wd = PyObject_GetAttr(tls, s_worker_device);
        PyObject *owner = wd ? PyObject_GetAttr(gt, s_owner) : NULL;
        int same = owner ? PyObject_RichCompareBool(wd, owner, Py_EQ) : -1;
        Py_XDECREF(wd);
        if (same < 0) {
            Py_XDECREF(owner);
            return -1;
        }
        if (!same) {
            PyObject *q = PyObject_CallMethodObjArgs(ei->engine, s_queue_by_index, gt, owner, NULL);
            PyObject *w = q ? PyObject_CallMethodOneArg(q, s_push_wakeup, gt) : NULL;
            Py_XDECREF(q);
            if (w == NULL) {
                Py_DECREF(owner);
                return -1;
            }
            Py_DECREF(w);
        }
        Py_DECREF(owner);
    }
    return 0;
fail:
    Py_DECREF(finished);
    return -1;
}

static int queue_empty(QueueObject *q) {
    lock_nogil(q, 0);
    int empty = q->size == 0;
    pthread_mutex_unlock(&q->mutex);
    return empty;
}

static PyObject *THREAD_MAIN_PY = NULL;  /* worker.thread_main_py, for a queue that is not compiled */

/* thread_main(engine, graph_task): run tasks from this thread's queue until graph_task completes
 * (None: until a shutdown task). */
static PyObject *thread_main(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "thread_main(engine, graph_task)");
        return NULL;
    }
    PyObject *engine = args[0], *graph_task = args[1];
    if (EVALUATE_FUNCTION == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_core.configure_worker() was not called");
        return NULL;
    }
    PyObject *tls = PyObject_GetAttr(engine, s_tls);
    PyObject *queue = tls ? PyObject_GetAttr(tls, s_queue) : NULL;
    if (queue == NULL) {
        Py_XDECREF(tls);
        return NULL;
    }
    if (!Py_IS_TYPE(queue, &QueueType)) {
        Py_DECREF(queue);
        Py_DECREF(tls);
        return PyObject_CallFunctionObjArgs(THREAD_MAIN_PY, engine, graph_task, NULL);
    }
    PyObject *tracer = PyObject_GetAttr(engine, s_tracer);
    PyObject *devices = tracer ? PyObject_GetAttr(engine, s_devices) : NULL;
    int real_cuda = devices ? attr_true(devices, s_real_cuda) : -1;
    Py_XDECREF(devices);
    EngineInfo ei;
    GtInfo gi;
    FrameState fs = {tls, NULL, NULL};
    memset(&gi, 0, sizeof(gi));
    PyObject *result = NULL;
    if (real_cuda < 0 || engine_info_fill(&ei, engine, tracer) < 0) {
        Py_XDECREF(tracer);
        Py_DECREF(queue);
        Py_DECREF(tls);
        return NULL;
    }
    /* whether a pop may run Python tracer hooks (the frame is put back before them) */
    int pop_hooks = ei.tracing && (ei.hooks & (HOOK_POP | HOOK_IDLE));
    for (;;) {
        if (graph_task != Py_None) {
            int completed = slot_true(&GT_SLOTS, graph_task, GF_COMPLETED);
            if (completed < 0)
                goto out;
            if (completed)
                break;
        }
        if (fs.gt != NULL && (pop_hooks || queue_empty((QueueObject *)queue))) {
            /* Python tracer hooks run in pop, or it blocks: no task's frame while they run */
            if (frame_restore(&fs) < 0)
                goto out;
        }
        if (gi.gt != NULL && queue_empty((QueueObject *)queue))  /* about to block: let go of the GraphTask */
            gt_info_clear(&gi);
        PyObject *item = Queue_pop_impl((QueueObject *)queue, graph_task);
        if (item == NULL)
            goto out;
        if (item == SHUTDOWN_ITEM) {
            Py_DECREF(item);
            break;
        }
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "a ready-queue task is a (graph_task, node, buffer) tuple");
            goto out;
        }
        int r = run_task(&ei, &gi, &fs, real_cuda, tls, item);
        Py_DECREF(item);
        if (r < 0)
            goto out;
    }
    result = Py_NewRef(Py_None);
out:
    if (frame_restore(&fs) < 0)
        Py_CLEAR(result);
    gt_info_clear(&gi);
    engine_info_clear(&ei);
    Py_DECREF(tracer);
    Py_DECREF(queue);
    Py_DECREF(tls);
    return result;
}

/* configure_worker(Node, GraphTask, InputMeta, probe_array, runners, direct_rules, acc, np_dtypes,
 * validate_outputs, missing_saved, evaluate_function, thread_main_py) -> which direct reads are on */
static PyObject *configure_worker(PyObject *mod, PyObject *args) {
    PyObject *node_type, *gt_type, *meta_type, *probe, *runners, *direct, *acc, *np_dtypes, *validate, *missing,
        *evaluate_fn, *tm_py;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!O!OO!OOOO", &PyType_Type, &node_type, &PyType_Type, &gt_type, &PyType_Type,
                          &meta_type, &probe, &PyDict_Type, &runners, &PyDict_Type, &direct, &acc, &PyDict_Type,
                          &np_dtypes, &validate, &missing, &evaluate_fn, &tm_py))
        return NULL;
    int node_ok = slots_configure(&NODE_SLOTS, node_type);
    int gt_ok = node_ok < 0 ? -1 : slots_configure(&GT_SLOTS, gt_type);
    int meta_ok = gt_ok < 0 ? -1 : slots_configure(&META_SLOTS, meta_type);
    if (meta_ok < 0)
        return NULL;
    /* the probe is numpy.empty((2, 3), float32): check the mirrored layout on it */
    int array_ok = 0;
    PyObject *f32 = PyDict_GetItemString(np_dtypes, "float32");
    if (f32 != NULL && PyObject_HasAttr(probe, s_shape)) {
        ArrayHead *a = (ArrayHead *)probe;
        array_ok = a->nd == 2 && a->dimensions[0] == 2 && a->dimensions[1] == 3 && a->descr == f32;
    }
    if (array_ok)
        Py_XSETREF(ARRAY_TYPE, (PyTypeObject *)Py_NewRef(Py_TYPE(probe)));
    else
        Py_CLEAR(ARRAY_TYPE);
    Py_XSETREF(RUNNERS, Py_NewRef(runners));
    Py_XSETREF(DIRECT_RULES, Py_NewRef(direct));
    Py_XSETREF(ACC_OP, Py_NewRef(acc));
    Py_XSETREF(NP_DTYPES, Py_NewRef(np_dtypes));
    Py_XSETREF(VALIDATE_OUTPUTS, Py_NewRef(validate));
    Py_XSETREF(MISSING_SAVED, Py_NewRef(missing));
    Py_XSETREF(EVALUATE_FUNCTION, Py_NewRef(evaluate_fn));
    Py_XSETREF(THREAD_MAIN_PY, Py_NewRef(tm_py));
    return Py_BuildValue("{sOsOsOsO}", "Node", node_ok ? Py_True : Py_False, "GraphTask", gt_ok ? Py_True : Py_False,
                         "InputMeta", meta_ok ? Py_True : Py_False, "ndarray", array_ok ? Py_True : Py_False);
}

/* ------------------------------------------------- summary helpers */

/* Two loops of the summary over Python objects (record/kernels.py is the twin). */

typedef struct {
    uint64_t *keys;  /* key + 1; 0 empty */
    int64_t *vals;
    size_t mask;
} U64Map;

static int u64map_init(U64Map *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 2)
        cap <<= 1;
    m->keys = PyMem_RawCalloc(cap, sizeof(uint64_t));
    m->vals = PyMem_RawMalloc(cap * sizeof(int64_t));
    m->mask = cap - 1;
    if (!m->keys || !m->vals) {
        PyMem_RawFree(m->keys);
        PyMem_RawFree(m->vals);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void u64map_free(U64Map *m) {
    PyMem_RawFree(m->keys);
    PyMem_RawFree(m->vals);
}

static inline size_t u64hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void u64map_put(U64Map *m, uint64_t key, int64_t val) {
    size_t h = u64hash(key) & m->mask;
    while (m->keys[h] != 0 && m->keys[h] != key + 1)
        h = (h + 1) & m->mask;
    m->keys[h] = key + 1;
    m->vals[h] = val;
}

static int64_t u64map_get(U64Map *m, uint64_t key) {
    size_t h = u64hash(key) & m->mask;
    while (m->keys[h] != 0) {
        if (m->keys[h] == key + 1)
            return m->vals[h];
        h = (h + 1) & m->mask;
    }
    return -1;
}

/* attr_codes(objs, name, identity) -> (int64 codes as bytes, distinct values): each object's
 * attribute `name` as the position of its value among the distinct values (in order of first
 * appearance), compared by identity or by equality. */
static PyObject *attr_codes(PyObject *mod, PyObject *args) {
    PyObject *objs, *name;
    int identity;
    if (!PyArg_ParseTuple(args, "O!Up", &PyList_Type, &objs, &name, &identity))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(objs);
    /* a Node field read from its slot where the table knows it */
    int field = name == s_op ? NF_OP : name == s_name ? NF_NAME : name == s_id ? NF_ID : -1;
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *values = PyList_New(0);
    PyObject *seen = PyDict_New();   /* value -> code (by equality) */
    U64Map ptrs = {0};               /* the address of each value in `values` -> its code */
    if (data == NULL || values == NULL || seen == NULL || u64map_init(&ptrs, n) < 0)
        goto fail;
    int64_t *codes = (int64_t *)PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(objs, i);
        PyObject *v = field >= 0 ? node_get(obj, field) : PyObject_GetAttr(obj, name);
        if (v == NULL)
            goto fail;
        int64_t code = u64map_get(&ptrs, (uint64_t)(uintptr_t)v);
        if (code < 0 && !identity) { /* an equal value seen before, as another object */
            PyObject *c = PyDict_GetItemWithError(seen, v);
            if (c == NULL && PyErr_Occurred()) {
                Py_DECREF(v);
                goto fail;
            }
            if (c != NULL) /* (not remembered by address: names are mostly each node's own object) */
                code = PyLong_AsLongLong(c);
        }
        if (code < 0) {
            code = PyList_GET_SIZE(values);
            PyObject *c = PyLong_FromLongLong(code);
            int bad = c == NULL || (!identity && PyDict_SetItem(seen, v, c) < 0) || PyList_Append(values, v) < 0;
            Py_XDECREF(c);
            if (bad) {
                Py_DECREF(v);
                goto fail;
            }
            u64map_put(&ptrs, (uint64_t)(uintptr_t)v, code);
        }
        codes[i] = code;
        Py_DECREF(v);
    }
    Py_DECREF(seen);
    u64map_free(&ptrs);
    PyObject *out = PyTuple_Pack(2, data, values);
    Py_DECREF(data);
    Py_DECREF(values);
    return out;
fail:
    u64map_free(&ptrs);
    Py_XDECREF(data);
    Py_XDECREF(values);
    Py_XDECREF(seen);
    return NULL;
}

/* ------------------------------------------------ pair_common */

/* An int64 column written straight into the bytes object handed back (sized for the most rows it can
 * get, cut to the rows it got). */
typedef struct {
    PyObject *bytes;
    int64_t *v;
    Py_ssize_t n, cap;
} Col;

static int col_alloc(Col *c, Py_ssize_t cap) {
    c->bytes = PyBytes_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int64_t));
    if (c->bytes == NULL)
        return -1;
    c->v = (int64_t *)PyBytes_AS_STRING(c->bytes);
    c->cap = cap;
    c->n = 0;
    return 0;
}

static inline int col_push(Col *c, int64_t x) {
    if (c->n >= c->cap) { /* (the counting pass bounds every column) */
        PyErr_SetString(PyExc_RuntimeError, "pair_common: a column overflowed its bound");
        return -1;
    }
    c->v[c->n++] = x;
    return 0;
}

/* The column's bytes, cut to its rows (a new reference; the column lets go of it). */
static PyObject *col_bytes(Col *c) {
    PyObject *b = c->bytes;
    c->bytes = NULL;
    if (b != NULL && c->n * (Py_ssize_t)sizeof(int64_t) != PyBytes_GET_SIZE(b) &&
        _PyBytes_Resize(&b, c->n * (Py_ssize_t)sizeof(int64_t)) < 0)
        return NULL;
    return b;
}

/* pair_common(events, tid_of, n_nodes) -> None, or (samples, waits, slices, idles), each a tuple of int64
 * columns as bytes (samples: ts, tid, queue, gt, node, depth, pushed; waits: gt, node, queue, pushed, popped,
 * tid, push_row, pop_row; slices: gt, depth, node, tid, start, end, wait; idles: start, end, tid, queue,
 * waiting_for): record/recording._pair for the common case, in one pass (None where it does not hold:
 * then _pair's numpy path decides). The common case is _pairs_once's for the queue samples and for the
 * node starts and ends (one GraphTask among the rows with a node; each node pushed at most once and popped
 * at most once, after its push; started at most once and ended at most once, after its start, on the same
 * thread) and _slice_waits's (at least one wait, all of that GraphTask). */
enum { SC_TS, SC_TID, SC_QUEUE, SC_GT, SC_NODE, SC_DEPTH, SC_PUSHED, SC_N };
enum { WC_GT, WC_NODE, WC_QUEUE, WC_PUSHED, WC_POPPED, WC_TID, WC_PUSH_ROW, WC_POP_ROW, WC_N };
enum { LC_GT, LC_DEPTH, LC_NODE, LC_TID, LC_START, LC_END, LC_WAIT, LC_N };
enum { IC_START, IC_END, IC_TID, IC_QUEUE, IC_WAITING, IC_N };

static PyObject *pair_common(PyObject *mod, PyObject *args) {
    PyObject *evo, *tido;
    Py_ssize_t n_nodes;
    if (!PyArg_ParseTuple(args, "OOn", &evo, &tido, &n_nodes))
        return NULL;
    Py_buffer be, bt;
    if (PyObject_GetBuffer(evo, &be, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(tido, &bt, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&be);
        return NULL;
    }
    PyObject *result = NULL;
    Col sc[SC_N] = {{0}}, wc[WC_N] = {{0}}, lc[LC_N] = {{0}}, ic[IC_N] = {{0}};
    /* per node: the sample row of its push and pop, the event row of its start and end (-1: none yet);
     * its wait (index into the waits) and the event position of that wait's pop */
    int64_t *push_row = NULL, *pop_seen = NULL, *start_ev = NULL, *end_seen = NULL, *wait_of = NULL,
            *wait_pos = NULL;
    Py_ssize_t m = be.len / (Py_ssize_t)sizeof(Event), nt = bt.len / 8;
    const Event *ev = be.buf;
    const int64_t *tid_of = bt.buf;
    int common = be.len % (Py_ssize_t)sizeof(Event) == 0 && n_nodes >= 0;
    if (common) {
        size_t k = (size_t)(n_nodes ? n_nodes : 1) * sizeof(int64_t);
        push_row = PyMem_RawMalloc(k), pop_seen = PyMem_RawMalloc(k), start_ev = PyMem_RawMalloc(k);
        end_seen = PyMem_RawMalloc(k), wait_of = PyMem_RawMalloc(k), wait_pos = PyMem_RawMalloc(k);
        if (!push_row || !pop_seen || !start_ev || !end_seen || !wait_of || !wait_pos) {
            PyErr_NoMemory();
            goto done;
        }
        memset(push_row, 0xff, k), memset(pop_seen, 0xff, k), memset(start_ev, 0xff, k);
        memset(end_seen, 0xff, k), memset(wait_of, 0xff, k);
    }
    /* bounds: every push/pop is a sample, a pop at most one wait, an end at most one slice */
    Py_ssize_t n_samples = 0, n_pops = 0, n_ends = 0, n_idles = 0;
    for (Py_ssize_t i = 0; common && i < m; i++) {
        uint8_t k = ev[i].kind;
        n_samples += k == EV_PUSH || k == EV_POP;
        n_pops += k == EV_POP;
        n_ends += k == EV_END;
        n_idles += k == EV_IDLE;
    }
    for (int c = 0; common && c < SC_N; c++)
        if (col_alloc(&sc[c], n_samples) < 0)
            goto done;
    for (int c = 0; common && c < WC_N; c++)
        if (col_alloc(&wc[c], n_pops) < 0)
            goto done;
    for (int c = 0; common && c < LC_N; c++)
        if (col_alloc(&lc[c], n_ends) < 0)
            goto done;
    for (int c = 0; common && c < IC_N; c++)
        if (col_alloc(&ic[c], n_idles) < 0)
            goto done;
    int64_t gt_s = 0, gt_l = 0;
    int have_s = 0, have_l = 0;
    Py_ssize_t srow = 0;
    for (Py_ssize_t i = 0; common && i < m; i++) {
        const Event *e = &ev[i];
        if (e->thread >= nt) {
            common = 0;
            break;
        }
        int64_t tid = tid_of[e->thread], node = e->node;
        if (node >= n_nodes) {
            common = 0;
            break;
        }
        if (e->kind == EV_PUSH || e->kind == EV_POP) {
            int pushed = e->kind == EV_PUSH;
            if (col_push(&sc[SC_TS], e->ts) < 0 || col_push(&sc[SC_TID], tid) < 0 ||
                col_push(&sc[SC_QUEUE], e->queue) < 0 || col_push(&sc[SC_GT], e->a) < 0 ||
                col_push(&sc[SC_NODE], node) < 0 || col_push(&sc[SC_DEPTH], e->b) < 0 ||
                col_push(&sc[SC_PUSHED], pushed) < 0)
                goto done;
            if (node >= 0) {
                if (have_s && e->a != gt_s) {
                    common = 0;
                    break;
                }
                gt_s = e->a, have_s = 1;
                if (pushed) {
                    if (push_row[node] >= 0 || pop_seen[node] >= 0) { /* pushed twice, or popped first */
                        common = 0;
                        break;
                    }
                    push_row[node] = srow;
                } else {
                    Py_ssize_t p = push_row[node];
                    if (pop_seen[node] >= 0 || p < 0) { /* popped twice, or before its push */
                        common = 0;
                        break;
                    }
                    pop_seen[node] = srow;
                    int64_t w = wc[WC_GT].n;
                    if (col_push(&wc[WC_GT], e->a) < 0 || col_push(&wc[WC_NODE], node) < 0 ||
                        col_push(&wc[WC_QUEUE], sc[SC_QUEUE].v[p]) < 0 || col_push(&wc[WC_PUSHED], sc[SC_TS].v[p]) < 0 ||
                        col_push(&wc[WC_POPPED], e->ts) < 0 || col_push(&wc[WC_TID], tid) < 0 ||
                        col_push(&wc[WC_PUSH_ROW], p) < 0 || col_push(&wc[WC_POP_ROW], srow) < 0)
                        goto done;
                    wait_of[node] = w;
                    wait_pos[node] = i;
                }
            }
            srow++;
        } else if (e->kind == EV_START || e->kind == EV_END) {
            if (node < 0) {
                common = 0; /* (a start or end without a node: the general pairing's) */
                break;
            }
            if (have_l && e->a != gt_l) {
                common = 0;
                break;
            }
            gt_l = e->a, have_l = 1;
            if (e->kind == EV_START) {
                if (start_ev[node] >= 0 || end_seen[node] >= 0) {
                    common = 0;
                    break;
                }
                start_ev[node] = i;
            } else {
                Py_ssize_t st = start_ev[node];
                if (end_seen[node] >= 0 || st < 0 || tid_of[ev[st].thread] != tid) {
                    common = 0;
                    break;
                }
                end_seen[node] = i;
                /* its wait: the node's, if popped before this end */
                int64_t w = wait_of[node] >= 0 && wait_pos[node] < i ? wait_of[node] : -1;
                if (col_push(&lc[LC_GT], e->a) < 0 || col_push(&lc[LC_DEPTH], ev[st].b) < 0 ||
                    col_push(&lc[LC_NODE], node) < 0 || col_push(&lc[LC_TID], tid) < 0 ||
                    col_push(&lc[LC_START], ev[st].ts) < 0 || col_push(&lc[LC_END], e->ts) < 0 ||
                    col_push(&lc[LC_WAIT], w) < 0)
                    goto done;
            }
        } else if (e->kind == EV_IDLE) {
            if (col_push(&ic[IC_START], e->ts) < 0 || col_push(&ic[IC_END], e->a) < 0 ||
                col_push(&ic[IC_TID], tid) < 0 || col_push(&ic[IC_QUEUE], e->queue) < 0 ||
                col_push(&ic[IC_WAITING], e->b) < 0)
                goto done;
        }
    }
    /* _slice_waits's common case: some wait, one GraphTask for the waits and the slices */
    if (common && (wc[WC_GT].n == 0 || (lc[LC_GT].n && gt_l != gt_s)))
        common = 0;
    if (!common) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    {
        Col *groups[4] = {sc, wc, lc, ic};
        int sizes[4] = {SC_N, WC_N, LC_N, IC_N};
        PyObject *out = PyTuple_New(4);
        for (int g = 0; out && g < 4; g++) {
            PyObject *t = PyTuple_New(sizes[g]);
            for (int c = 0; t && c < sizes[g]; c++) {
                PyObject *b = col_bytes(&groups[g][c]);
                if (b == NULL)
                    Py_CLEAR(t);
                else
                    PyTuple_SET_ITEM(t, c, b);
            }
            if (t == NULL)
                Py_CLEAR(out);
            else
                PyTuple_SET_ITEM(out, g, t);
        }
        result = out;
    }
done:
    for (int c = 0; c < SC_N; c++)
        Py_XDECREF(sc[c].bytes);
    for (int c = 0; c < WC_N; c++)
        Py_XDECREF(wc[c].bytes);
    for (int c = 0; c < LC_N; c++)
        Py_XDECREF(lc[c].bytes);
    for (int c = 0; c < IC_N; c++)
        Py_XDECREF(ic[c].bytes);
    PyMem_RawFree(push_row), PyMem_RawFree(pop_seen), PyMem_RawFree(start_ev);
    PyMem_RawFree(end_seen), PyMem_RawFree(wait_of), PyMem_RawFree(wait_pos);
    PyBuffer_Release(&be);
    PyBuffer_Release(&bt);
    return result;
}

/* max_seq(nodes, limit) -> the largest node seq below `limit`, or 0 (GraphState's next sequence number). */
static PyObject *max_seq(PyObject *mod, PyObject *args) {
    PyObject *nodes, *limit;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &nodes, &limit))
        return NULL;
    PyObject *best = PyLong_FromLong(0);
    for (Py_ssize_t i = 0; best && i < PyList_GET_SIZE(nodes); i++) {
        PyObject *seq = node_get(PyList_GET_ITEM(nodes, i), NF_SEQ);
        if (seq == NULL) {
            Py_CLEAR(best);
            break;
        }
        int below = PyObject_RichCompareBool(seq, limit, Py_LT);
        int more = below > 0 ? PyObject_RichCompareBool(seq, best, Py_GT) : below;
        if (more < 0)
            Py_CLEAR(best);
        else if (more)
            Py_SETREF(best, Py_NewRef(seq));
        Py_DECREF(seq);
    }
    return best;
}

/* nodes_of_op(nodes, op) -> the nodes whose op is `op` (the object itself), in order. */
static PyObject *nodes_of_op(PyObject *mod, PyObject *args) {
    PyObject *nodes, *op;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &nodes, &op))
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        PyObject *o = node_get(node, NF_OP);
        if (o == NULL || (o == op && PyList_Append(out, node) < 0))
            Py_CLEAR(out);
        Py_XDECREF(o);
    }
    return out;
}

/* split_saved(nodes, released, cached) -> (plain, rest): the nodes that save tensors and are neither
 * released (a set) nor cached (a dict), split by whether their saved values may need converting: plain
 * (no value is a dict, a list or a string: the node's own mapping serves) or rest (a string may be a
 * Scalar to convert; engine/state.py's twin). */
static PyObject *split_saved(PyObject *mod, PyObject *args) {
    PyObject *nodes, *released, *cached;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyList_Type, &nodes, &released, &PyDict_Type, &cached))
        return NULL;
    PyObject *plain = PyList_New(0), *rest = PyList_New(0);
    if (plain == NULL || rest == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        int saves = node_true(node, NF_SAVES);
        if (saves < 0)
            goto fail;
        if (!saves)
            continue;
        int in = PySet_Contains(released, node);
        if (in < 0)
            goto fail;
        if (in)
            continue;
        in = PyDict_Contains(cached, node);
        if (in < 0)
            goto fail;
        if (in)
            continue;
        PyObject *saved = node_get(node, NF_SAVED);
        if (saved == NULL)
            goto fail;
        int convert = 0;
        if (PyDict_Check(saved)) {
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            while (PyDict_Next(saved, &pos, &k, &v))
                if (Py_IS_TYPE(v, &PyDict_Type) || Py_IS_TYPE(v, &PyList_Type) || Py_IS_TYPE(v, &PyUnicode_Type)) {
                    convert = 1;
                    break;
                }
        } else {
            convert = 1;  /* not a plain dict: let the Python path look */
        }
        Py_DECREF(saved);
        if (PyList_Append(convert ? rest : plain, node) < 0)
            goto fail;
    }
    PyObject *out = PyTuple_Pack(2, plain, rest);
    Py_DECREF(plain);
    Py_DECREF(rest);
    return out;
fail:
    Py_XDECREF(plain);
    Py_XDECREF(rest);
    return NULL;
}

/* GraphState.accumulate (the plain function), registered by engine/state.py: accumulate_grad adds in C
 * only where the state's accumulate is that one (not a subclass's or an instance's own). */
static PyObject *plain_accumulate = NULL;

static PyObject *register_release(PyObject *mod, PyObject *fn) {
    Py_INCREF(fn);
    Py_XSETREF(plain_release, fn);
    Py_RETURN_NONE;
}

static PyObject *register_accumulate(PyObject *mod, PyObject *fn) {
    Py_INCREF(fn);
    Py_XSETREF(plain_accumulate, fn);
    Py_RETURN_NONE;
}

/* accumulate_grad(node, grads, ctx) -> []: the AccumulateGrad runner (engine/builtin_nodes.py's
 * accumulate_grad_py is the twin): state.accumulate(variable, grad, create_graph). Where that is
 * GraphState.accumulate and the state's _grad_lock a _core.Lock, its three cases run here under the lock,
 * taken directly: a first gradient is copied in, create_graph adds out of place, else in place (`+=`). */
static PyObject *accumulate_grad(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "accumulate_grad(node, grads, ctx)");
        return NULL;
    }
    PyObject *g = PySequence_GetItem(args[1], 0);
    if (g == NULL)
        return NULL;
    if (g == Py_None) {
        Py_DECREF(g);
        return PyList_New(0);
    }
    PyObject *state = NULL, *create = NULL, *name = NULL, *method = NULL, *lock = NULL, *store = NULL, *result = NULL;
    if ((state = PyObject_GetAttr(args[2], s_state)) == NULL || (create = PyObject_GetAttr(args[2], s_create_graph)) == NULL ||
        (name = PyObject_GetAttr(args[0], s_variable)) == NULL || (method = PyObject_GetAttr(state, s_accumulate)) == NULL)
        goto done;
    int plain = PyMethod_Check(method) && PyMethod_GET_FUNCTION(method) == plain_accumulate && plain_accumulate != NULL;
    if (plain && (lock = PyObject_GetAttr(state, s_grad_lock)) == NULL)
        goto done;
    if (!plain || !Py_IS_TYPE(lock, &CLockType)) {
        PyObject *r = PyObject_CallFunctionObjArgs(method, name, g, create, NULL);
        if (r != NULL) {
            Py_DECREF(r);
            result = PyList_New(0);
        }
        goto done;
    }
    int out_of_place = PyObject_IsTrue(create);
    if (out_of_place < 0 || (store = PyObject_GetAttr(state, s_grads)) == NULL)
        goto done;
    clock_acquire((CLockObject *)lock, 1, -1);
    int ok = -1;
    PyObject *old = PyDict_GetItemWithError(store, name), *sum;
    Py_XINCREF(old);  /* the dict may change under a call below */
    if (old == NULL && PyErr_Occurred()) {
        ok = -1;
    } else if (old == NULL || old == Py_None) {
        PyObject *copy = PyObject_CallMethodNoArgs(g, s_copy);
        ok = copy == NULL ? -1 : PyDict_SetItem(store, name, copy);
        Py_XDECREF(copy);
    } else if (out_of_place) {
        sum = PyNumber_Add(old, g);
        ok = sum == NULL ? -1 : PyDict_SetItem(store, name, sum);
        Py_XDECREF(sum);
    } else {
        sum = PyNumber_InPlaceAdd(old, g);  /* as `old += g`: no store back (numpy adds in place) */
        ok = sum == NULL ? -1 : 0;
        Py_XDECREF(sum);
    }
    Py_XDECREF(old);
    clock_release((CLockObject *)lock);  /* held: cannot fail, keeps a pending exception */
    if (ok == 0)
        result = PyList_New(0);
done:
    Py_DECREF(g);
    Py_XDECREF(state);
    Py_XDECREF(create);
    Py_XDECREF(name);
    Py_XDECREF(method);
    Py_XDECREF(lock);
    Py_XDECREF(store);
    return result;
}

/* 1 if a random spec of shape `shp` (a list or tuple), `dtype` and `dist` belongs to the group `key`
 * ((shape tuple, dtype, dist)), 0 if not, -1 on error. */
static int same_group(PyObject *key, PyObject *shp, PyObject *dtype, PyObject *dist) {
    PyObject *shape = PyTuple_GET_ITEM(key, 0);
    PyObject *fast = PySequence_Fast(shp, "shape must be a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int same = n == PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; same > 0 && i < n; i++)
        same = PyObject_RichCompareBool(PySequence_Fast_GET_ITEM(fast, i), PyTuple_GET_ITEM(shape, i), Py_EQ);
    Py_DECREF(fast);
    if (same > 0)
        same = PyObject_RichCompareBool(dtype, PyTuple_GET_ITEM(key, 1), Py_EQ);
    if (same > 0)
        same = PyObject_RichCompareBool(dist, PyTuple_GET_ITEM(key, 2), Py_EQ);
    return same;
}

/* scatter(sink, values): mapping[name] = value for each (mapping, name) of the list `sink` and each value
 * of the sequence `values`, in step (state.py's _prepare_converted). */
static PyObject *scatter(PyObject *mod, PyObject *args) {
    PyObject *sink, *values;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &sink, &values))
        return NULL;
    PyObject *fast = PySequence_Fast(values, "values must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(sink);
    if (PySequence_Fast_GET_SIZE(fast) < n)
        n = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *where = PyList_GET_ITEM(sink, i);
        if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) != 2 || !PyDict_Check(PyTuple_GET_ITEM(where, 0))) {
            PyErr_SetString(PyExc_TypeError, "scatter: each sink entry is a (dict, key) pair");
            Py_DECREF(fast);
            return NULL;
        }
        if (PyDict_SetItem(PyTuple_GET_ITEM(where, 0), PyTuple_GET_ITEM(where, 1),
                           PySequence_Fast_GET_ITEM(fast, i)) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

/* group_saved(todo, half, offset) -> (groups, sinks, done, slow): one walk over the saved values of the
 * nodes split_saved says to convert, grouping each random spec's seed (plus offset) by (shape, dtype,
 * dist) and noting where its array goes; engine/state.py's group_saved_py is the twin and says more. */
static PyObject *group_saved(PyObject *mod, PyObject *args) {
    PyObject *todo, *half, *offset;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &todo, &half, &offset))
        return NULL;
    PyObject *groups = PyDict_New(), *sinks = PyDict_New(), *done = PyList_New(0), *slow = PyList_New(0);
    PyObject *saved = NULL, *mapping = NULL, *op = NULL, *fields = NULL, *shape = NULL, *key = NULL;
    /* The last spec's group (specs of one shape, dtype and dist come in runs): its key and lists, borrowed
     * from the dicts, so a spec of the same group is placed without a key tuple or a hash. */
    PyObject *last_key = NULL, *last_seeds = NULL, *last_sink = NULL;
    long offset_value = PyLong_CheckExact(offset) ? PyLong_AsLong(offset) : -1;
    if (offset_value == -1 && PyErr_Occurred())
        PyErr_Clear();  /* an offset past a C long: added as a Python int below */
    int zero_offset = PyLong_CheckExact(offset) && offset_value == 0;
    Py_ssize_t half_size = PyObject_Size(half);
    if (half_size < 0)
        PyErr_Clear();
    int has_half = half_size != 0;
    if (groups == NULL || sinks == NULL || done == NULL || slow == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(todo); i++) {
        PyObject *node = PyList_GET_ITEM(todo, i);
        if ((saved = node_get(node, NF_SAVED)) == NULL)
            goto fail;
        mapping = PyDict_CheckExact(saved) ? PyDict_Copy(saved) : PyObject_CallOneArg((PyObject *)&PyDict_Type, saved);
        Py_CLEAR(saved);
        if (mapping == NULL)
            goto fail;
        int easy = slot_true(&NODE_SLOTS, node, NF_SAVED_STRINGS);
        if (easy < 0)
            goto fail;
        easy = !easy;
        if (easy && has_half) {
            int in = PySequence_Contains(half, node);
            if (in < 0)
                goto fail;
            easy = !in;
        }
        if ((op = node_get(node, NF_OP)) == NULL || (fields = PyObject_GetAttr(op, s_tensor_fields)) == NULL)
            goto fail;
        Py_CLEAR(op);
        Py_ssize_t pos = 0;
        PyObject *name, *v;
        while (PyDict_Next(mapping, &pos, &name, &v)) {
            if (Py_IS_TYPE(v, &PyDict_Type)) {
                PyObject *seed = PyDict_GetItemWithError(v, s_random);
                PyObject *shp = seed ? PyDict_GetItemWithError(v, s_shape) : NULL;
                if (shp == NULL) {
                    if (PyErr_Occurred())
                        goto fail;
                    easy = 0;
                    continue;
                }
                PyObject *dtype = PyDict_GetItemWithError(v, s_dtype);
                if (dtype == NULL && PyErr_Occurred())
                    goto fail;
                int given = dtype ? PyObject_IsTrue(dtype) : 0;
                if (given < 0)
                    goto fail;
                PyObject *dist = PyDict_GetItemWithError(v, s_dist);
                if (dist == NULL && PyErr_Occurred())
                    goto fail;
                PyObject *want_dtype = given ? dtype : s_float32, *want_dist = dist ? dist : s_normal;
                PyObject *seeds, *sink;
                int same = last_key != NULL ? same_group(last_key, shp, want_dtype, want_dist) : 0;
                if (same < 0)
                    goto fail;
                if (same) {
                    seeds = last_seeds;
                    sink = last_sink;
                    goto place;
                }
                if ((shape = PySequence_Tuple(shp)) == NULL)
                    goto fail;
                key = PyTuple_Pack(3, shape, want_dtype, want_dist);
                Py_CLEAR(shape);
                if (key == NULL)
                    goto fail;
                seeds = PyDict_GetItemWithError(groups, key);
                if (seeds == NULL) {
                    if (PyErr_Occurred())
                        goto fail;
                    seeds = PyList_New(0);
                    sink = PyList_New(0);
                    int bad = seeds == NULL || sink == NULL || PyDict_SetItem(groups, key, seeds) < 0 ||
                              PyDict_SetItem(sinks, key, sink) < 0;
                    Py_XDECREF(seeds);  /* the dicts hold them */
                    Py_XDECREF(sink);
                    if (bad)
                        goto fail;
                } else if ((sink = PyDict_GetItemWithError(sinks, key)) == NULL) {
                    goto fail;
                }
                /* the dicts hold the lists as long as this call runs; the key is held here */
                Py_XSETREF(last_key, Py_NewRef(key));
                last_seeds = seeds;
                last_sink = sink;
                Py_CLEAR(key);
            place:;
                PyObject *s = zero_offset ? Py_NewRef(seed) : PyNumber_Add(seed, offset);
                if (s == NULL)
                    goto fail;
                int bad = PyList_Append(seeds, s);
                Py_DECREF(s);
                PyObject *where = bad ? NULL : PyTuple_Pack(2, mapping, name);
                bad = where == NULL || PyList_Append(sink, where) < 0;
                Py_XDECREF(where);
                if (bad)
                    goto fail;
            } else if (Py_IS_TYPE(v, &PyList_Type)) {
                int in = PySequence_Contains(fields, name);
                if (in < 0)
                    goto fail;
                if (in)
                    easy = 0;
            }
        }
        Py_CLEAR(fields);
        PyObject *pair = PyTuple_Pack(2, node, mapping);
        Py_CLEAR(mapping);
        int bad = pair == NULL || PyList_Append(easy ? done : slow, pair) < 0;
        Py_XDECREF(pair);
        if (bad)
            goto fail;
    }
    Py_XDECREF(last_key);
    PyObject *out = PyTuple_Pack(4, groups, sinks, done, slow);
    Py_DECREF(groups);
    Py_DECREF(sinks);
    Py_DECREF(done);
    Py_DECREF(slow);
    return out;
fail:
    Py_XDECREF(last_key);
    Py_XDECREF(saved);
    Py_XDECREF(mapping);
    Py_XDECREF(op);
    Py_XDECREF(fields);
    Py_XDECREF(shape);
    Py_XDECREF(key);
    Py_XDECREF(groups);
    Py_XDECREF(sinks);
    Py_XDECREF(done);
    Py_XDECREF(slow);
    return NULL;
}

/* node_columns(nodes) -> (ids, names, seq bytes, stream bytes, same bytes): what trace writers show of
 * each node: its id and name (lists), seq (uint64) and stream (int64), and -1 where the id is the name
 * (else 0), as int64 columns. */
static PyObject *node_columns(PyObject *mod, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "node_columns(list of nodes)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *ids = PyList_New(n), *names = PyList_New(n);
    PyObject *seq = PyBytes_FromStringAndSize(NULL, n * 8), *stream = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *same = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!ids || !names || !seq || !stream || !same)
        goto fail;
    uint64_t *sq = (uint64_t *)PyBytes_AS_STRING(seq);
    int64_t *st = (int64_t *)PyBytes_AS_STRING(stream), *sm = (int64_t *)PyBytes_AS_STRING(same);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyList_GET_ITEM(arg, i);
        PyObject *id = node_get(node, NF_ID), *name = id ? node_get(node, NF_NAME) : NULL;
        if (name == NULL) {
            Py_XDECREF(id);
            goto fail;
        }
        PyList_SET_ITEM(ids, i, id);
        PyList_SET_ITEM(names, i, name);
        int eq = PyObject_RichCompareBool(id, name, Py_EQ);
        if (eq < 0)
            goto fail;
        sm[i] = eq ? -1 : 0;
        PyObject *v = node_get(node, NF_SEQ);
        sq[i] = v ? PyLong_AsUnsignedLongLong(v) : 0;
        Py_XDECREF(v);
        v = PyErr_Occurred() ? NULL : node_get(node, NF_STREAM);
        st[i] = v ? PyLong_AsLongLong(v) : 0;
        Py_XDECREF(v);
        if (PyErr_Occurred())
            goto fail;
    }
    PyObject *out = PyTuple_Pack(5, ids, names, seq, stream, same);
    Py_DECREF(ids);
    Py_DECREF(names);
    Py_DECREF(seq);
    Py_DECREF(stream);
    Py_DECREF(same);
    return out;
fail:
    Py_XDECREF(ids);
    Py_XDECREF(names);
    Py_XDECREF(seq);
    Py_XDECREF(stream);
    Py_XDECREF(same);
    return NULL;
}

/* input_shape_codes(nodes) -> (int64 codes as bytes, distinct shapes): each node's input shapes (a
 * tuple of shape tuples) as the position of that tuple among the distinct ones (first appearance). */
static PyObject *input_shape_codes(PyObject *mod, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "input_shape_codes(list of nodes)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *seen = PyDict_New(), *values = PyList_New(0);
    if (data == NULL || seen == NULL || values == NULL)
        goto fail;
    int64_t *codes = (int64_t *)PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ins = node_get(PyList_GET_ITEM(arg, i), NF_INPUTS);
        PyObject *fast = ins ? PySequence_Fast(ins, "inputs must be a sequence") : NULL;
        Py_XDECREF(ins);
        if (fast == NULL)
            goto fail;
        Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
        PyObject *key = PyTuple_New(m);
        for (Py_ssize_t j = 0; key && j < m; j++) {
            PyObject *shape = slot_get(&META_SLOTS, PySequence_Fast_GET_ITEM(fast, j), MF_SHAPE);
            PyObject *t = shape ? PySequence_Tuple(shape) : NULL;
            Py_XDECREF(shape);
            if (t == NULL)
                Py_CLEAR(key);
            else
                PyTuple_SET_ITEM(key, j, t);
        }
        Py_DECREF(fast);
        if (key == NULL)
            goto fail;
        PyObject *code = PyDict_GetItemWithError(seen, key);
        if (code == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto fail;
            }
            code = PyLong_FromSsize_t(PyList_GET_SIZE(values));
            int bad = code == NULL || PyDict_SetItem(seen, key, code) < 0 || PyList_Append(values, key) < 0;
            Py_XDECREF(code);
            if (bad) {
                Py_DECREF(key);
                goto fail;
            }
            code = PyDict_GetItem(seen, key);
        }
        codes[i] = PyLong_AsLongLong(code);
        Py_DECREF(key);
    }
    Py_DECREF(seen);
    PyObject *out = PyTuple_Pack(2, data, values);
    Py_DECREF(data);
    Py_DECREF(values);
    return out;
fail:
    Py_XDECREF(data);
    Py_XDECREF(seen);
    Py_XDECREF(values);
    return NULL;
}

static int int64_buffer(PyObject *o, Py_buffer *b, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len != n * 8) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_ValueError, "critical_path: %s must hold %zd int64 values", what, n);
        return -1;
    }
    return 0;
}

/* critical_path(nodes, gt, node, weight, start, order) -> (path run indices, total): the longest chain of
 * runs (run k: node table index node[k] of GraphTask gt[k], weight[k] = queue wait + duration)
 * following next edges within a GraphTask, over runs visited in `order` (latest start first; a
 * run's successors count only once visited); ties go to the first successor in next order and the
 * path starts at the run of the largest total, the earliest `start` (ns) among equal ones, then the first
 * visited, as summary's reference. Every gt must be >= 0. */
static PyObject *critical_path(PyObject *mod, PyObject *args) {
    PyObject *nodes, *gto, *nodeo, *wo, *so, *oo;
    if (!PyArg_ParseTuple(args, "O!OOOOO", &PyList_Type, &nodes, &gto, &nodeo, &wo, &so, &oo))
        return NULL;
    Py_buffer bg, bn, bw, bs, bo;
    Py_ssize_t nn = PyList_GET_SIZE(nodes);
    if (PyObject_GetBuffer(gto, &bg, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_ssize_t m = bg.len / 8;
    if (int64_buffer(nodeo, &bn, m, "node") < 0) {
        PyBuffer_Release(&bg);
        return NULL;
    }
    if (int64_buffer(wo, &bw, m, "weight") < 0) {
        PyBuffer_Release(&bg);
        PyBuffer_Release(&bn);
        return NULL;
    }
    if (int64_buffer(so, &bs, m, "start") < 0) {
        PyBuffer_Release(&bg);
        PyBuffer_Release(&bn);
        PyBuffer_Release(&bw);
        return NULL;
    }
    if (int64_buffer(oo, &bo, m, "order") < 0) {
        PyBuffer_Release(&bg);
        PyBuffer_Release(&bn);
        PyBuffer_Release(&bw);
        PyBuffer_Release(&bs);
        return NULL;
    }
    const int64_t *gt = bg.buf, *node = bn.buf, *w = bw.buf, *st = bs.buf, *order = bo.buf;
    PyObject *result = NULL;
    int64_t *best = PyMem_RawMalloc((m ? m : 1) * sizeof(int64_t));
    int64_t *succ = PyMem_RawMalloc((m ? m : 1) * sizeof(int64_t));
    /* A node's position in `nodes`: by its graph index (pos[index]) when every node's index is a distinct
     * number below 2 * len(nodes) + 16 (graphs loaded or built whole), else through a map of addresses. */
    int64_t *pos = NULL, *last_run = NULL;
    Py_ssize_t npos = 2 * nn + 16;
    U64Map ptrs = {0}, runs = {0};
    int by_index = 1, one_task = 1;
    if (!best || !succ) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 1; j < m && one_task; j++)
        one_task = gt[j] == gt[0];
    if ((pos = PyMem_RawMalloc(npos * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < npos; i++)
        pos[i] = -1;
    for (Py_ssize_t i = 0; i < nn && by_index; i++) {
        long long ix;
        if (slot_long(&NODE_SLOTS, PyList_GET_ITEM(nodes, i), NF_INDEX, &ix) < 0) {
            PyErr_Clear();
            by_index = 0;
        } else if (ix < 0 || ix >= npos || pos[ix] >= 0) {
            by_index = 0;
        } else {
            pos[ix] = i;
        }
    }
    if (!by_index) {
        if (u64map_init(&ptrs, nn) < 0)
            goto done;
        for (Py_ssize_t i = 0; i < nn; i++)
            u64map_put(&ptrs, (uint64_t)(uintptr_t)PyList_GET_ITEM(nodes, i), i);
    }
    if (one_task) {  /* a node's last run is per node alone */
        if ((last_run = PyMem_RawMalloc((nn ? nn : 1) * sizeof(int64_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < nn; i++)
            last_run[i] = -1;
    } else if (u64map_init(&runs, m) < 0) {
        goto done;
    }
    uint64_t stride = (uint64_t)nn + 1;
    int64_t start = -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        int64_t k = order[j];
        if (k < 0 || k >= m || node[k] < 0 || node[k] >= nn || gt[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "critical_path: index out of range");
            goto done;
        }
        PyObject *next = node_get(PyList_GET_ITEM(nodes, node[k]), NF_NEXT);
        if (next == NULL)
            goto done;
        PyObject *fast = PySequence_Fast(next, "next edges must be a sequence");
        Py_DECREF(next);
        if (fast == NULL)
            goto done;
        int64_t top = 0, nxt = -1;
        for (Py_ssize_t e = 0; e < PySequence_Fast_GET_SIZE(fast); e++) {
            PyObject *edge = PySequence_Fast_GET_ITEM(fast, e);
            if (edge == Py_None)
                continue;
            PyObject *target = PyTuple_Check(edge) && PyTuple_GET_SIZE(edge) > 0 ? Py_NewRef(PyTuple_GET_ITEM(edge, 0))
                                                                                  : PyObject_GetAttr(edge, s_node);
            if (target == NULL) {
                Py_DECREF(fast);
                goto done;
            }
            int64_t ti = -1;
            if (by_index) {
                long long ix;
                if (slot_long(&NODE_SLOTS, target, NF_INDEX, &ix) < 0)
                    PyErr_Clear();
                else if (ix >= 0 && ix < npos && pos[ix] >= 0 && PyList_GET_ITEM(nodes, pos[ix]) == target)
                    ti = pos[ix];
            } else {
                ti = u64map_get(&ptrs, (uint64_t)(uintptr_t)target);
            }
            Py_DECREF(target);
            if (ti < 0)
                continue;
            int64_t k2 = one_task ? last_run[ti] : u64map_get(&runs, (uint64_t)gt[k] * stride + (uint64_t)ti);
            if (k2 >= 0 && best[k2] > top) {
                top = best[k2];
                nxt = k2;
            }
        }
        Py_DECREF(fast);
        best[k] = w[k] + top;
        succ[k] = nxt;
        if (one_task)
            last_run[node[k]] = k;
        else
            u64map_put(&runs, (uint64_t)gt[k] * stride + (uint64_t)node[k], k);
        if (start < 0 || best[k] > best[start] || (best[k] == best[start] && st[k] < st[start]))
            start = k;
    }
    if (start >= 0) {
        PyObject *path = PyList_New(0);
        int64_t total = best[start];
        for (int64_t k = start; path && k >= 0; k = succ[k]) {
            PyObject *v = PyLong_FromLongLong(k);
            if (v == NULL || PyList_Append(path, v) < 0)
                Py_CLEAR(path);
            Py_XDECREF(v);
        }
        result = path ? Py_BuildValue("(NL)", path, (long long)total) : NULL;
    } else {
        result = Py_BuildValue("([]L)", 0LL);
    }
done:
    u64map_free(&ptrs);
    u64map_free(&runs);
    PyMem_RawFree(pos);
    PyMem_RawFree(last_run);
    PyMem_RawFree(best);
    PyMem_RawFree(succ);
    PyBuffer_Release(&bg);
    PyBuffer_Release(&bn);
    PyBuffer_Release(&bw);
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bo);
    return result;
}

/* ------------------------------------------------ compute_dependencies */

/* compute_dependencies(root, dependencies, min_topo_nr): graph_task.compute_dependencies_py, compiled:
 * for every node reachable from root, the number of edges that lead into it (an iterative DFS that
 * does not expand nodes below min_topo_nr), counted into the dict `dependencies`. A node is new (to be
 * expanded) when the dict does not hold it yet: every node but the root gets there through an edge, and
 * the root has none leading into it (the graph is acyclic), so the dict is also the DFS's seen set.
 * The stack is a C array of strong references. */
static PyObject *compute_dependencies(PyObject *mod, PyObject *args) {
    PyObject *root, *deps;
    long long min_topo;
    if (!PyArg_ParseTuple(args, "OO!L", &root, &PyDict_Type, &deps, &min_topo))
        return NULL;
    Py_ssize_t cap = 256, n = 0;
    PyObject **stack = PyMem_Malloc(cap * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[n++] = Py_NewRef(root);
    int ok = 1;
    while (n && ok) {
        PyObject *fn = stack[--n];
        PyObject *tv = node_get(fn, NF_TOPO);
        long long topo = tv ? PyLong_AsLongLong(tv) : -1;
        Py_XDECREF(tv);
        if (topo == -1 && PyErr_Occurred()) {
            Py_DECREF(fn);
            ok = 0;
            break;
        }
        if (topo < min_topo) {
            Py_DECREF(fn);
            continue;
        }
        PyObject *next = node_get(fn, NF_NEXT);
        Py_DECREF(fn);
        PyObject *fast = next ? PySequence_Fast(next, "next edges must be a sequence") : NULL;
        Py_XDECREF(next);
        if (fast == NULL) {
            ok = 0;
            break;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
            PyObject *e = PySequence_Fast_GET_ITEM(fast, i);
            if (e == Py_None)
                continue;
            PyObject *nxt = PyTuple_Check(e) && PyTuple_GET_SIZE(e) > 0 ? Py_NewRef(PyTuple_GET_ITEM(e, 0))
                                                                         : PyObject_GetAttr(e, s_node);
            if (nxt == NULL) {
                ok = 0;
                break;
            }
            PyObject *count = PyDict_GetItemWithError(deps, nxt);
            long c = 0;
            if (count != NULL)
                c = PyLong_AsLong(count);
            PyObject *nc = (count == NULL && PyErr_Occurred()) || (c == -1 && PyErr_Occurred()) ? NULL
                                                                                              : PyLong_FromLong(c + 1);
            if (nc == NULL || PyDict_SetItem(deps, nxt, nc) < 0) {
                Py_XDECREF(nc);
                Py_DECREF(nxt);
                ok = 0;
                break;
            }
            Py_DECREF(nc);
            if (count != NULL) {  /* seen before: counted, not expanded again */
                Py_DECREF(nxt);
                continue;
            }
            if (n == cap) {
                PyObject **grown = PyMem_Realloc(stack, 2 * cap * sizeof(PyObject *));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    Py_DECREF(nxt);
                    ok = 0;
                    break;
                }
                stack = grown;
                cap *= 2;
            }
            stack[n++] = nxt;  /* the reference taken above */
        }
        Py_DECREF(fast);
    }
    while (n)
        Py_DECREF(stack[--n]);
    PyMem_Free(stack);
    return ok ? Py_NewRef(Py_None) : NULL;
}

/* ------------------------------------------------------------ fill */

/* The trace writers' inner loop (traces/encode.py is the twin and documents the ops): rows of int64
 * columns and tables of strings, formatted into JSON text or protobuf bytes by small templates. */

enum {
    OP_LIT = 0, OP_I64, OP_U64, OP_US, OP_DUR, OP_JSTR, OP_RAW, OP_SKIPNEG,
    OP_PB_VARINT, OP_PB_STR, OP_PB_BEGIN, OP_PB_END, OP_PB_DELTA, OP_PB_FIXED64, OP_MICRO, OP_JESC, OP_COUNT
};

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *d = PyMem_RawRealloc(o->data, cap);
    if (d == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = d;
    o->cap = cap;
    return 0;
}

static inline int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, s, n);
    o->len += n;
    return 0;
}

static inline int out_u64(Out *o, uint64_t v) {
    char buf[24];
    int i = 24;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return out_put(o, buf + i, 24 - i);
}

static inline int out_i64(Out *o, int64_t v) {
    if (v < 0) {
        if (out_put(o, "-", 1) < 0)
            return -1;
        return out_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return out_u64(o, (uint64_t)v);
}

/* ns as a decimal number of microseconds: 12345678 -> 12345.678, 12345600 -> 12345.6, 12000 -> 12 */
static int out_micro(Out *o, int64_t ns) {
    if (ns < 0) {
        if (out_put(o, "-", 1) < 0)
            return -1;
        ns = -ns;
    }
    if (out_u64(o, (uint64_t)(ns / 1000)) < 0)
        return -1;
    int r = (int)(ns % 1000);
    if (r == 0)
        return 0;
    char buf[4] = {'.', (char)('0' + r / 100), (char)('0' + r / 10 % 10), (char)('0' + r % 10)};
    int n = 4;
    while (buf[n - 1] == '0')
        n--;
    return out_put(o, buf, n);
}

static inline int out_varint(Out *o, uint64_t v) {
    char buf[10];
    int n = 0;
    while (v >= 0x80) {
        buf[n++] = (char)(v | 0x80);
        v >>= 7;
    }
    buf[n++] = (char)v;
    return out_put(o, buf, n);
}

/* A table entry as UTF-8 bytes (str: encoded, undecodable code points replaced; bytes: as they are). */
static int entry_bytes(PyObject *table, int64_t i, const char **s, Py_ssize_t *n, PyObject **hold) {
    if (!PyList_Check(table) || i < 0 || i >= PyList_GET_SIZE(table)) {
        PyErr_SetString(PyExc_IndexError, "fill: table index out of range");
        return -1;
    }
    PyObject *v = PyList_GET_ITEM(table, i);
    *hold = NULL;
    if (PyBytes_Check(v)) {
        *s = PyBytes_AS_STRING(v);
        *n = PyBytes_GET_SIZE(v);
        return 0;
    }
    if (!PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "fill: table entries are str or bytes");
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(v, n);
    if (*s != NULL)
        return 0;
    PyErr_Clear();
    *hold = PyUnicode_AsEncodedString(v, "utf-8", "replace");
    if (*hold == NULL)
        return -1;
    *s = PyBytes_AS_STRING(*hold);
    *n = PyBytes_GET_SIZE(*hold);
    return 0;
}

static int out_json_string(Out *o, const char *s, Py_ssize_t n, int quoted) {
    if (out_reserve(o, n + 2) < 0 || (quoted && out_put(o, "\"", 1) < 0))
        return -1;
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (out_put(o, s + start, i - start) < 0)
            return -1;
        char esc[7];
        int m = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            m = 6;
        }
        if (out_put(o, esc, m) < 0)
            return -1;
        start = i + 1;
    }
    if (out_put(o, s + start, n - start) < 0)
        return -1;
    return quoted ? out_put(o, "\"", 1) : 0;
}

static inline int64_t col_at(Py_buffer *cols, Py_ssize_t ncols, int64_t c, Py_ssize_t row, int *bad) {
    if (c < 0 || c >= ncols) {
        *bad = 1;
        return 0;
    }
    return ((int64_t *)cols[c].buf)[row];
}

/* fill(templates, kinds, columns, tables, lits, base, start, stop, index=None) -> bytes: see traces/encode.py. */
static PyObject *fill(PyObject *mod, PyObject *args) {
    PyObject *templates, *kinds_o, *columns, *tables, *lits, *index_o = Py_None;
    long long base;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!Lnn|O", &PyList_Type, &templates, &kinds_o, &PyList_Type, &columns,
                          &PyList_Type, &tables, &PyList_Type, &lits, &base, &start, &stop, &index_o))
        return NULL;
    Py_ssize_t ncols = PyList_GET_SIZE(columns), ntemp = PyList_GET_SIZE(templates);
    Py_buffer *cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Py_buffer));
    Py_buffer *tmpl = PyMem_Calloc(ntemp ? ntemp : 1, sizeof(Py_buffer));
    Py_buffer kb = {0}, ib = {0};
    int have_kinds = 0, have_index = 0;
    Py_ssize_t nrows = stop;  /* rows the columns must hold */
    Py_ssize_t got_cols = 0, got_tmpl = 0;
    Out o = {0};
    PyObject *result = NULL;
    int64_t prev = base;  /* the last PB_DELTA value (one chain: the packets' timestamps) */
    Py_ssize_t stack[32];
    int depth = 0, bad = 0;
    if (cols == NULL || tmpl == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "fill: bad row range");
        goto done;
    }
    for (; got_cols < ncols; got_cols++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(columns, got_cols), &cols[got_cols], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    for (; got_tmpl < ntemp; got_tmpl++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(templates, got_tmpl), &tmpl[got_tmpl], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    if (index_o != Py_None) {
        if (PyObject_GetBuffer(index_o, &ib, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_index = 1;
        if (ib.itemsize != 8 || ib.len / 8 < stop) {
            PyErr_SetString(PyExc_ValueError, "fill: index is shorter than the rows");
            goto done;
        }
        nrows = 0;  /* the columns' length, from the first one; every index is checked against it */
        if (ncols)
            nrows = cols[0].len / 8;
        for (Py_ssize_t r = start; r < stop; r++) {
            int64_t i = ((int64_t *)ib.buf)[r];
            if (i < 0 || i >= nrows) {
                PyErr_SetString(PyExc_IndexError, "fill: index out of range");
                goto done;
            }
        }
    }
    if (kinds_o != Py_None) {
        if (PyObject_GetBuffer(kinds_o, &kb, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_kinds = 1;
        if (kb.len / 8 < nrows) {
            PyErr_SetString(PyExc_ValueError, "fill: kinds is shorter than the rows");
            goto done;
        }
    }
    for (Py_ssize_t c = 0; c < ncols; c++)
        if (cols[c].itemsize != 8 || cols[c].len / 8 < nrows) {
            PyErr_SetString(PyExc_ValueError, "fill: a column is not int64 or is shorter than the rows");
            goto done;
        }
    for (Py_ssize_t r0 = start; r0 < stop; r0++) {
        Py_ssize_t row = have_index ? (Py_ssize_t)((int64_t *)ib.buf)[r0] : r0;
        int64_t k = have_kinds ? ((int64_t *)kb.buf)[row] : 0;
        if (k < 0 || k >= ntemp) {
            PyErr_SetString(PyExc_ValueError, "fill: template index out of range");
            goto done;
        }
        const int64_t *ops = tmpl[k].buf;
        Py_ssize_t nops = tmpl[k].len / 32;
        for (Py_ssize_t p = 0; p < nops; p++) {
            int64_t op = ops[4 * p], x = ops[4 * p + 1], y = ops[4 * p + 2], z = ops[4 * p + 3];
            int r = 0;
            switch (op) {
            case OP_LIT: {
                if (x < 0 || x >= PyList_GET_SIZE(lits) || !PyBytes_Check(PyList_GET_ITEM(lits, x))) {
                    PyErr_SetString(PyExc_ValueError, "fill: bad literal");
                    goto done;
                }
                PyObject *l = PyList_GET_ITEM(lits, x);
                r = out_put(&o, PyBytes_AS_STRING(l), PyBytes_GET_SIZE(l));
                break;
            }
            case OP_I64: r = out_i64(&o, col_at(cols, ncols, x, row, &bad)); break;
            case OP_U64: r = out_u64(&o, (uint64_t)col_at(cols, ncols, x, row, &bad)); break;
            case OP_US: r = out_micro(&o, col_at(cols, ncols, x, row, &bad) - base); break;
            case OP_DUR: {
                int64_t v = col_at(cols, ncols, x, row, &bad);
                r = out_micro(&o, v < 1 ? 1 : v);
                break;
            }
            case OP_MICRO: r = out_micro(&o, col_at(cols, ncols, x, row, &bad)); break;
            case OP_JSTR:
            case OP_JESC:
            case OP_RAW:
            case OP_PB_STR: {
                int64_t t = op == OP_PB_STR ? y : x, v = col_at(cols, ncols, op == OP_PB_STR ? z : y, row, &bad);
                if (bad)
                    break;
                if (t < 0 || t >= PyList_GET_SIZE(tables)) {
                    PyErr_SetString(PyExc_ValueError, "fill: table index out of range");
                    goto done;
                }
                const char *s;
                Py_ssize_t n;
                PyObject *hold;
                if (entry_bytes(PyList_GET_ITEM(tables, t), v, &s, &n, &hold) < 0)
                    goto done;
                if (op == OP_JSTR || op == OP_JESC)
                    r = out_json_string(&o, s, n, op == OP_JSTR);
                else if (op == OP_RAW)
                    r = out_put(&o, s, n);
                else
                    r = (out_varint(&o, ((uint64_t)x << 3) | 2) < 0 || out_varint(&o, (uint64_t)n) < 0 ||
                         out_put(&o, s, n) < 0) ? -1 : 0;
                Py_XDECREF(hold);
                break;
            }
            case OP_SKIPNEG:
                if (col_at(cols, ncols, x, row, &bad) < 0)
                    p += y;
                break;
            case OP_PB_VARINT:
                r = (out_varint(&o, (uint64_t)x << 3) < 0 ||
                     out_varint(&o, (uint64_t)col_at(cols, ncols, y, row, &bad)) < 0) ? -1 : 0;
                break;
            case OP_PB_FIXED64: {
                uint64_t v = (uint64_t)col_at(cols, ncols, y, row, &bad);
                char buf[8];
                for (int i = 0; i < 8; i++)
                    buf[i] = (char)((v >> (8 * i)) & 0xff);
                r = (out_varint(&o, ((uint64_t)x << 3) | 1) < 0 || out_put(&o, buf, 8) < 0) ? -1 : 0;
                break;
            }
            case OP_PB_DELTA: {
                int64_t v = col_at(cols, ncols, y, row, &bad);
                r = (out_varint(&o, (uint64_t)x << 3) < 0 || out_varint(&o, (uint64_t)(v - prev)) < 0) ? -1 : 0;
                prev = v;
                break;
            }
            case OP_PB_BEGIN:
                if (depth >= 32) {
                    PyErr_SetString(PyExc_ValueError, "fill: messages nested too deep");
                    goto done;
                }
                r = out_varint(&o, ((uint64_t)x << 3) | 2);
                if (r == 0 && (r = out_reserve(&o, 1)) == 0) {
                    stack[depth++] = o.len;
                    o.data[o.len++] = 0;
                }
                break;
            case OP_PB_END: {
                if (depth == 0) {
                    PyErr_SetString(PyExc_ValueError, "fill: end without begin");
                    goto done;
                }
                Py_ssize_t at = stack[--depth], n = o.len - at - 1;
                char buf[10];
                int m = 0;
                uint64_t u = (uint64_t)n;
                while (u >= 0x80) {
                    buf[m++] = (char)(u | 0x80);
                    u >>= 7;
                }
                buf[m++] = (char)u;
                if (m > 1) {
                    if (out_reserve(&o, m - 1) < 0)
                        goto done;
                    memmove(o.data + at + m, o.data + at + 1, n);
                    o.len += m - 1;
                }
                memcpy(o.data + at, buf, m);
                break;
            }
            default:
                PyErr_SetString(PyExc_ValueError, "fill: unknown op");
                goto done;
            }
            if (bad) {
                PyErr_SetString(PyExc_ValueError, "fill: column index out of range");
                goto done;
            }
            if (r < 0)
                goto done;
        }
        if (depth) {
            PyErr_SetString(PyExc_ValueError, "fill: begin without end");
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(o.data ? o.data : "", o.len);
done:
    for (Py_ssize_t c = 0; c < got_cols; c++)
        PyBuffer_Release(&cols[c]);
    for (Py_ssize_t t = 0; t < got_tmpl; t++)
        PyBuffer_Release(&tmpl[t]);
    if (have_kinds)
        PyBuffer_Release(&kb);
    if (have_index)
        PyBuffer_Release(&ib);
    PyMem_Free(cols);
    PyMem_Free(tmpl);
    PyMem_RawFree(o.data);
    return result;
}

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
    {"thread_main", (PyCFunction)(void (*)(void))thread_main, METH_FASTCALL,
     "thread_main(engine, graph_task): the worker loop (worker.thread_main_py)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", NULL, -1, module_methods};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__core(void) {
    INTERN(s_enabled, "enabled");
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
    if (PyType_Ready(&QueueType) < 0 || PyType_Ready(&BufferType) < 0 || PyType_Ready(&LogType) < 0 ||
        PyType_Ready(&CLockType) < 0)
        return NULL;
    MAIN_THREAD = PyThread_get_thread_ident();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ReadyQueue", (PyObject *)&QueueType) < 0 ||
        PyModule_AddObjectRef(m, "InputBufferBase", (PyObject *)&BufferType) < 0 ||
        PyModule_AddObjectRef(m, "EventLog", (PyObject *)&LogType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&CLockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
