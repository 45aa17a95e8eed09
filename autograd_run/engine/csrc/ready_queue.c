/* Python twin: autograd_run/engine/ready_queue.py.
 * The blocking priority ready queue. Part of _core.c (included there, after core.h). */

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

/* Workers blocked in pop now (a hint: read under the mutex, stale once it is released). */
static PyObject *Queue_get_waiting(QueueObject *self, void *c) {
    lock_nogil(self, 0);
    int n = self->waiting;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromLong(n);
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
    {"waiting", (getter)Queue_get_waiting, NULL, "workers blocked in pop now (a hint)", NULL},
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
