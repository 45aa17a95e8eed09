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
    *s_cpu_queue, *s_multithreading, *s_lock, *s_acquire, *s_release, *s_reentrant_depth,
    *s_dependencies, *s_not_ready, *s_outstanding, *s_next, *s_inputs, *s_cpu, *s_seq,
    *s_device, *s_type, *s_index, *s_name, *s_default_priority, *s_priority, *s_key,
    *s_device_queue, *s_streams, *s_add, *s_add_on_device, *s_should_execute, *s_shape,
    *s_dtype, *s_input_nr, *s_node, *s_cpu_str, *s_get, *s_push, *s_stream;

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

/* ------------------------------------------------------------ ReadyQueue */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *tracer;
    int tracing;          /* tracer is not None and tracer.enabled, read when the tracer is set */
    u128 *keys;
    PyObject **items;
    Py_ssize_t size, cap;
    int waiting;          /* workers blocked in pop; a push notifies only then */
    pthread_mutex_t mutex;
    pthread_cond_t not_empty;
} QueueObject;

static PyTypeObject QueueType;

static int queue_set_tracer(QueueObject *self, PyObject *tracer) {
    int tracing = 0;
    if (tracer != NULL && tracer != Py_None) {
        PyObject *en = PyObject_GetAttr(tracer, s_enabled);
        if (en == NULL)
            return -1;
        tracing = PyObject_IsTrue(en);
        Py_DECREF(en);
        if (tracing < 0)
            return -1;
    }
    Py_XINCREF(tracer);
    Py_XSETREF(self->tracer, tracer);
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

static void Queue_dealloc(QueueObject *self) {
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

static int report(QueueObject *q, PyObject *method, PyObject *item, Py_ssize_t depth) {
    PyObject *gt = PyTuple_GET_ITEM(item, 0), *node = PyTuple_GET_ITEM(item, 1);
    PyObject *d = PyLong_FromSsize_t(depth);
    if (d == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodObjArgs(q->tracer, method, (PyObject *)q, gt, node, d, NULL);
    Py_DECREF(d);
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

static PyObject *Queue_pop(QueueObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* pop(waiting_for=None): waiting_for is the GraphTask whose completion the popping loop waits
     * for (None on a device thread), told to the tracer with an idle span. */
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "pop(waiting_for=None)");
        return NULL;
    }
    PyObject *waiting_for = nargs ? args[0] : Py_None;
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
        if (idle0) {
            PyObject *a = PyLong_FromLongLong(idle0), *b = PyLong_FromLongLong(idle1);
            PyObject *r = (a && b) ? PyObject_CallMethodObjArgs(self->tracer, s_worker_idle, (PyObject *)self, a, b,
                                                                waiting_for, NULL)
                                   : NULL;
            Py_XDECREF(a);
            Py_XDECREF(b);
            if (r == NULL) {
                Py_DECREF(item);
                return NULL;
            }
            Py_DECREF(r);
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
    .tp_flags = Py_TPFLAGS_DEFAULT,
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

/* route(engine, gt, node, outputs, exec_info, tracer, parent) -> bool: see worker.route. */
static PyObject *route(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "route(engine, gt, node, outputs, exec_info, tracer, parent)");
        return NULL;
    }
    PyObject *engine = args[0], *gt = args[1], *node = args[2], *outputs = args[3], *exec_info = args[4],
             *tracer = args[5], *parent = args[6];
    PyObject *result = NULL, *key_fn = NULL, *cpu_queue = NULL, *lock = NULL, *deps = NULL, *not_ready = NULL,
             *next = NULL, *outs = NULL, *buffer_type = NULL;
    int exec_nonempty = PyObject_IsTrue(exec_info);
    if (exec_nonempty < 0)
        return NULL;

    PyObject *dp = PyObject_GetAttr(engine, s_default_priority);
    if (dp == NULL)
        return NULL;
    int default_priority = PyObject_IsTrue(dp);
    Py_DECREF(dp);
    if (!default_priority) {
        PyObject *prio = PyObject_GetAttr(engine, s_priority);
        if (prio == NULL)
            return NULL;
        key_fn = PyObject_GetAttr(prio, s_key);
        Py_DECREF(prio);
        if (key_fn == NULL)
            return NULL;
    }
    cpu_queue = PyObject_GetAttr(gt, s_cpu_queue);
    PyObject *mt = cpu_queue ? PyObject_GetAttr(gt, s_multithreading) : NULL;
    if (mt == NULL)
        goto done;
    int multithreading = PyObject_IsTrue(mt);
    Py_DECREF(mt);
    lock = PyObject_GetAttr(gt, s_lock);
    if (lock == NULL)
        goto done;

    /* Acquire the GraphTask lock: timed when tracing and contended (the Python twin's rule). */
    int tracing = 0;
    if (tracer != Py_None) {
        PyObject *en = PyObject_GetAttr(tracer, s_enabled);
        if (en == NULL)
            goto done;
        tracing = PyObject_IsTrue(en);
        Py_DECREF(en);
    }
    {
        PyObject *r;
        if (!tracing) {
            r = PyObject_CallMethodNoArgs(lock, s_acquire);
        } else {
            r = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
            if (r != NULL && r == Py_False) {
                Py_DECREF(r);
                int64_t t0 = now_ns();
                r = PyObject_CallMethodNoArgs(lock, s_acquire);
                if (r != NULL) {
                    PyObject *w = PyLong_FromLongLong(now_ns() - t0);
                    PyObject *label = PyUnicode_FromString("GraphTask");
                    PyObject *rr = (w && label) ? PyObject_CallMethodObjArgs(tracer, s_lock_wait, label, gt, w, NULL)
                                                : NULL;
                    Py_XDECREF(w);
                    Py_XDECREF(label);
                    if (rr == NULL) {
                        Py_DECREF(r);
                        PyObject *rel = PyObject_CallMethodNoArgs(lock, s_release);
                        Py_XDECREF(rel);
                        goto done;
                    }
                    Py_DECREF(rr);
                }
            }
        }
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }

    /* Under the lock from here on: `release` on every path. */
    long long depth;
    PyObject *depth_obj = get_attr_long(gt, s_reentrant_depth, &depth);
    deps = depth_obj ? PyObject_GetAttr(gt, s_dependencies) : NULL;
    not_ready = deps ? PyObject_GetAttr(gt, s_not_ready) : NULL;
    next = not_ready ? PyObject_GetAttr(node, s_next) : NULL;
    outs = next ? PySequence_Fast(outputs, "outputs must be a sequence") : NULL;
    buffer_type = BUFFER_TYPE;
    if (outs == NULL)
        goto unlock;
    if (buffer_type == NULL || !PyList_Check(next) || !PyDict_Check(deps) || !PyDict_Check(not_ready)) {
        PyErr_SetString(PyExc_TypeError, "route: _core.configure() not called, or an unexpected graph task layout");
        goto unlock;
    }
    Py_ssize_t n = PyList_GET_SIZE(next);
    if (PySequence_Fast_GET_SIZE(outs) < n)
        n = PySequence_Fast_GET_SIZE(outs);
    long long added = 0;
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
            if (exec_nonempty) {
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
            PyObject *ins = PyObject_GetAttr(nxt, s_inputs);
            if (ins == NULL)
                goto unlock;
            Py_ssize_t nin = PyObject_Length(ins);
            Py_DECREF(ins);
            PyObject *sz = PyLong_FromSsize_t(nin);
            buf = sz ? PyObject_CallOneArg(buffer_type, sz) : NULL;  /* new reference */
            Py_XDECREF(sz);
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
        PyObject *cpu = PyObject_GetAttr(nxt, s_cpu);
        int on_cpu = cpu ? PyObject_IsTrue(cpu) : -1;
        Py_XDECREF(cpu);
        if (on_cpu < 0) {
            Py_DECREF(buf);
            goto unlock;
        }
        int add_ok;
        PyObject *device = NULL;
        if (!on_cpu) {
            PyObject *ins = PyObject_GetAttr(nxt, s_inputs);
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
                PyObject *streams = PyObject_GetAttr(engine, s_streams);
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
        added++;
        {
            long long out_n;
            PyObject *o = get_attr_long(gt, s_outstanding, &out_n);
            PyObject *no = o ? PyLong_FromLongLong(out_n + 1) : NULL;
            Py_XDECREF(o);
            if (no == NULL || PyObject_SetAttr(gt, s_outstanding, no) < 0) {
                Py_XDECREF(no);
                Py_DECREF(buf);
                goto unlock;
            }
            Py_DECREF(no);
        }
        PyObject *queue;
        if (on_cpu || !multithreading) {
            queue = Py_NewRef(cpu_queue);
        } else {
            PyObject *ndev = PyObject_GetAttr(nxt, s_device);
            PyObject *idx = ndev ? PyObject_GetAttr(ndev, s_index) : NULL;
            Py_XDECREF(ndev);
            queue = idx ? PyObject_CallMethodOneArg(engine, s_device_queue, idx) : NULL;
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
        if (key_fn == NULL && Py_IS_TYPE(queue, &QueueType)) {
            PyObject *sv = PyObject_GetAttr(nxt, s_seq);
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
            if (key_fn != NULL) {
                key = PyObject_CallFunctionObjArgs(key_fn, depth_obj, nxt, NULL);
            } else {
                PyObject *sv = PyObject_GetAttr(nxt, s_seq);
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
    {
        long long out_n;
        PyObject *o = get_attr_long(gt, s_outstanding, &out_n);
        PyObject *no = o ? PyLong_FromLongLong(out_n - 1) : NULL;
        Py_XDECREF(o);
        if (no == NULL || PyObject_SetAttr(gt, s_outstanding, no) < 0) {
            Py_XDECREF(no);
            goto unlock;
        }
        Py_DECREF(no);
        result = PyBool_FromLong(out_n - 1 == 0);
    }
unlock:
    Py_XDECREF(depth_obj);
    {
        /* release the lock, keeping any pending exception */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallMethodNoArgs(lock, s_release);
        if (r == NULL) {
            if (et != NULL)
                PyErr_Clear();
            else
                Py_CLEAR(result);
        } else {
            Py_DECREF(r);
        }
        if (et != NULL) {
            PyErr_Restore(et, ev, tb);
            Py_CLEAR(result);
        }
    }
done:
    Py_XDECREF(key_fn);
    Py_XDECREF(cpu_queue);
    Py_XDECREF(lock);
    Py_XDECREF(deps);
    Py_XDECREF(not_ready);
    Py_XDECREF(next);
    Py_XDECREF(outs);
    return result;
}

/* --------------------------------------------------------- outputs_match */

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
        PyObject *ins = PyObject_GetAttr(target, s_inputs);
        PyObject *meta = ins ? PyObject_GetItem(ins, nr) : NULL;
        Py_XDECREF(ins);
        if (meta == NULL)
            return NULL;
        PyObject *want_shape = PyObject_GetAttr(meta, s_shape);
        PyObject *want_name = want_shape ? PyObject_GetAttr(meta, s_dtype) : NULL;
        Py_DECREF(meta);
        PyObject *shape = want_name ? PyObject_GetAttr(g, s_shape) : NULL;
        if (shape == NULL) {
            Py_XDECREF(want_shape);
            Py_XDECREF(want_name);
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        int same = PyObject_RichCompareBool(shape, want_shape, Py_EQ);
        Py_DECREF(shape);
        Py_DECREF(want_shape);
        if (same != 1) {
            Py_DECREF(want_name);
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        PyObject *want = PyDict_GetItemWithError(dtypes, want_name);
        Py_DECREF(want_name);
        PyObject *dt = want ? PyObject_GetAttr(g, s_dtype) : NULL;
        if (dt == NULL) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        int ok = dt == want;
        Py_DECREF(dt);
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
    if (PyType_Ready(&QueueType) < 0 || PyType_Ready(&BufferType) < 0)
        return NULL;
    MAIN_THREAD = PyThread_get_thread_ident();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ReadyQueue", (PyObject *)&QueueType) < 0 ||
        PyModule_AddObjectRef(m, "InputBufferBase", (PyObject *)&BufferType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
