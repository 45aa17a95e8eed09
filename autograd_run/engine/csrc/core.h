/*
 * autograd_run/engine/csrc/core.h: the shared header: includes, the module's globals, interned attribute names, ready-queue keys and the slot readers (graphs/model.Node and engine/graph_task.GraphTask fields read without a lookup).
 *
 * Included once, first, by _core.c (the extension is one translation unit built from the files
 * of this folder, in _core.c's order); every other part uses what it defines.
 */
#ifndef AUTOGRAD_RUN_CORE_H
#define AUTOGRAD_RUN_CORE_H


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
    *s_device, *s_type, *s_index, *s_default_priority, *s_priority, *s_key, *s_cost, *s_us, *s_flops, *s_mode,
    *s_device_queue, *s_streams, *s_add, *s_add_on_device, *s_should_execute,
    *s_input_nr, *s_node, *s_cpu_str, *s_get, *s_push, *s_reshape,
    *s_event_log, *s_others, *s_exec_info, *s_state, *s_ctx, *s_anomaly, *s_keep_graph,
    *s_faults, *s_has_hooks, *s_half_nodes, *s_grads, *s_devices, *s_node_start, *s_node_end,
    *s_node_skipped, *s_frame, *s_on_exception, *s_mark_completed,
    *s_worker_device, *s_owner, *s_queue_by_index, *s_push_wakeup, *s_tls, *s_queue, *s_tracer,
    *s_real_cuda, *s_on_stream, *s___enter__, *s___exit__, *s_sums_inline, *s_sum_kernel_ns;

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
       NF_SAVED_STRINGS, NF_INDEX, NF_DEVICE };
static SlotTable NODE_SLOTS = {NULL, 15, {&s_next, &s_inputs, &s_cpu, &s_seq, &s_op, &s_attrs, &s_saves_tensors,
                                          &s_topo_nr, &s_id, &s_name, &s_stream, &s_saved, &s_saved_strings,
                                          &s_index, &s_device}};
enum { GF_COMPLETED, GF_EXPIRED, GF_HAS_ERROR, GF_OUTSTANDING, GF_DEPTH };
static SlotTable GT_SLOTS = {NULL, 5, {&s_completed, &s_expired, &s_has_error, &s_outstanding, &s_reentrant_depth}};
enum { MF_SHAPE, MF_DTYPE, MF_DEVICE, MF_STREAM };
static SlotTable META_SLOTS = {NULL, 4, {&s_shape, &s_dtype, &s_device, &s_stream}};

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

/* ---- rows by identity: a pointer hash from objects to rows (the Recording's nodes, a simulation's slices' nodes;
 * columns.c, recording.c). Open addressing over a power-of-two table at least twice the rows; no Python objects. */

typedef struct {
    uintptr_t *keys; /* 0: empty */
    Py_ssize_t *rows;
    size_t mask;
} PtrRows;

static inline size_t ptr_slot(uintptr_t p, size_t mask) {
    return (size_t)(((uint64_t)(p >> 4) * 0x9E3779B97F4A7C15ULL) >> 20) & mask;
}

/* An empty table for up to n objects (-1 and an exception where memory runs out). */
static int ptr_rows_init(PtrRows *h, Py_ssize_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap <<= 1;
    h->mask = cap - 1;
    h->keys = PyMem_Calloc(cap, sizeof(uintptr_t));
    h->rows = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    if (h->keys == NULL || h->rows == NULL) {
        PyMem_Free(h->keys);
        PyMem_Free(h->rows);
        h->keys = NULL, h->rows = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The slot of address p: where it is, else the empty slot where it would go. */
static inline size_t ptr_probe(const PtrRows *h, uintptr_t p) {
    size_t s = ptr_slot(p, h->mask);
    while (h->keys[s] != 0 && h->keys[s] != p)
        s = (s + 1) & h->mask;
    return s;
}

/* o's row; where o is not there yet, `row` becomes its row (returned too). At most the n objects of ptr_rows_init. */
static inline Py_ssize_t ptr_row_add(PtrRows *h, PyObject *o, Py_ssize_t row) {
    size_t s = ptr_probe(h, (uintptr_t)o);
    if (h->keys[s] != 0)
        return h->rows[s];
    h->keys[s] = (uintptr_t)o;
    h->rows[s] = row;
    return row;
}

/* Each object of `table` -> its first row (-1 and an exception where memory runs out). */
static int ptr_rows_make(PtrRows *h, PyObject *table) {
    Py_ssize_t n = PyList_GET_SIZE(table);
    if (ptr_rows_init(h, n) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        ptr_row_add(h, PyList_GET_ITEM(table, i), i); /* (an object listed twice keeps its first row) */
    return 0;
}

/* o's first row, or -1 where it is not there. */
static inline Py_ssize_t ptr_row(const PtrRows *h, PyObject *o) {
    size_t s = ptr_probe(h, (uintptr_t)o);
    return h->keys[s] != 0 ? h->rows[s] : -1;
}

static void ptr_rows_free(PtrRows *h) {
    PyMem_Free(h->keys);
    PyMem_Free(h->rows);
}

#endif
