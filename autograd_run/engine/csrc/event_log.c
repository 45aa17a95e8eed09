/* Python twin: autograd_run/record/event_log.py.
 * The Recorder's hot events as fixed-size records. Part of _core.c (included there, after core.h). */

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
