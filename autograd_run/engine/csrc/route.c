/* Python twin: autograd_run/engine/worker.py (route).
 * A node's outputs handed to the next nodes' InputBuffers. Part of _core.c (included there, after core.h). */

/* ----------------------------------------------------------------- route */

/* (sim_loop.c) a push onto a simulator's queue without calling its method, where that is its common case. */
static int sim_queue_push_fast(PyObject *queue, long long depth, PyObject *node, PyObject *task);

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
    /* engine.device_queue(i) for i < 8, kept once asked (new references), where the caller says the queues stay
     * the same while this EngineInfo lives (the simulation's loop: Simulator.devices is fixed); else unused */
    int keep_queues;
    PyObject *queues[8];
    /* A sum on a stream done by the caller (the simulation's loop: sim_kernel) instead of entering
     * `streams.on_stream(stream)`, where `sum_streams` (borrowed) says its sums are exactly that
     * (SimStreams.sums_inline) and is the engine's `streams`; else NULL. -1 with an exception. */
    int (*sum_inline)(void *ctx, PyObject *stream);
    void *sum_ctx;
    PyObject *sum_streams;
    /* engine.streams, read when first needed (new reference; the engine's and the simulator's are set once, in
     * their __init__), else NULL */
    PyObject *streams;
} EngineInfo;

static void engine_info_clear(EngineInfo *ei) {
    Py_CLEAR(ei->streams);
    Py_CLEAR(ei->others);
    Py_CLEAR(ei->key_fn);
    for (int i = 0; i < 8; i++)
        Py_CLEAR(ei->queues[i]);
}

/* engine.device_queue(idx), from ei's kept queues where it keeps them (a new reference; NULL on error). */
static PyObject *device_queue_of(EngineInfo *ei, PyObject *idx) {
    long i = ei->keep_queues ? PyLong_AsLong(idx) : -1;
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i >= 0 && i < 8 && ei->queues[i] != NULL)
        return Py_NewRef(ei->queues[i]);
    PyObject *queue = PyObject_CallMethodOneArg(ei->engine, s_device_queue, idx);
    if (queue != NULL && i >= 0 && i < 8)
        ei->queues[i] = Py_NewRef(queue);
    return queue;
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

/* Device equality as the frozen dataclass's __eq__ (same class, equal type and index): 1, 0, -1 on error; -2 when
 * the two are not of one class (the caller then leaves the comparison to Python). */
static int device_eq(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b))
        return -2;
    PyObject *ta = PyObject_GetAttr(a, s_type), *tb = ta ? PyObject_GetAttr(b, s_type) : NULL;
    int r = tb ? PyObject_RichCompareBool(ta, tb, Py_EQ) : -1;
    Py_XDECREF(ta);
    Py_XDECREF(tb);
    if (r != 1)
        return r;
    PyObject *ia = PyObject_GetAttr(a, s_index), *ib = ia ? PyObject_GetAttr(b, s_index) : NULL;
    r = ib ? PyObject_RichCompareBool(ia, ib, Py_EQ) : -1;
    Py_XDECREF(ia);
    Py_XDECREF(ib);
    return r;
}

/* StreamRules.add_on_device's most common case without a Python call (input_buffer.py): the first gradient
 * of a slot, produced on the consumer's own stream of the gradient's device, so the slot accumulates there and
 * no event is recorded. 1: done; 0: another case (nothing was changed: the caller calls the Python rules);
 * -1: an error. Only for the configured InputBuffer class itself (its rules are StreamRules'). */
static int first_add_same_stream(PyObject *buf, PyObject *input_nr, PyObject *grad, PyObject *device,
                                 PyObject *producer, PyObject *consumer) {
    if ((PyObject *)Py_TYPE(buf) != BUFFER_TYPE || grad == Py_None || !PyTuple_CheckExact(producer) ||
        PyTuple_GET_SIZE(producer) != 2 || !PyTuple_CheckExact(consumer) || PyTuple_GET_SIZE(consumer) != 2 ||
        !PyLong_CheckExact(input_nr))
        return 0;
    BufferObject *b = (BufferObject *)buf;
    Py_ssize_t pos = PyLong_AsSsize_t(input_nr);
    if (pos == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(b->grads);
    if (pos < 0 || pos >= n)
        return 0;
    PyObject *accum = b->accum_streams;
    if (accum != Py_None && (!PyList_CheckExact(accum) || PyList_GET_SIZE(accum) != n ||
                             PyList_GET_ITEM(accum, pos) != Py_None || !PyList_CheckExact(b->ready_streams) ||
                             PyList_GET_SIZE(b->ready_streams) != n))
        return 0;
    PyObject *cs = PyTuple_GET_ITEM(consumer, 1), *ps = PyTuple_GET_ITEM(producer, 1);
    if (!PyLong_CheckExact(cs) || !PyLong_CheckExact(ps))
        return 0;
    int r = device_eq(PyTuple_GET_ITEM(consumer, 0), device);  /* the slot accumulates on the consumer's stream */
    if (r != 1)
        return r == -1 ? -1 : 0;
    r = device_eq(PyTuple_GET_ITEM(consumer, 0), PyTuple_GET_ITEM(producer, 0));  /* ... which is the producer's */
    if (r != 1)
        return r == -1 ? -1 : 0;
    r = PyObject_RichCompareBool(cs, ps, Py_EQ);
    if (r != 1)
        return r;
    if (accum == Py_None) {
        PyObject *lists[3];
        for (int k = 0; k < 3; k++) {
            lists[k] = PyList_New(n);
            if (lists[k] == NULL) {
                for (int j = 0; j < k; j++)
                    Py_DECREF(lists[j]);
                return -1;
            }
            for (Py_ssize_t i = 0; i < n; i++)
                PyList_SET_ITEM(lists[k], i, Py_NewRef(Py_None));
        }
        Py_SETREF(b->accum_streams, lists[0]);
        Py_SETREF(b->ready_streams, lists[1]);
        Py_SETREF(b->ready_events, lists[2]);
    }
    PyList_SetItem(b->accum_streams, pos, Py_NewRef(consumer));
    PyList_SetItem(b->grads, pos, Py_NewRef(grad));
    PyList_SetItem(b->ready_streams, pos, Py_NewRef(producer));
    return 1;
}

/* Stream tuples equal as Python compares them ((device, id) pairs): 1, 0, -1 on error, -2: left to Python. */
static int stream_eq(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || PyTuple_GET_SIZE(a) != 2 || PyTuple_GET_SIZE(b) != 2 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(a, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(b, 1)))
        return -2;
    int r = device_eq(PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(b, 0));
    if (r != 1)
        return r;
    return PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(b, 1), Py_EQ);
}

/* StreamRules.add_on_device's next commonest case: a later gradient of a slot whose gradients are all made and
 * summed on the consumer's own stream (no wait, no record): the sum runs inside `with streams.on_stream(accum)`.
 * 1: done; 0: another case (nothing changed); -1: an error. */
static int later_add_same_stream(EngineInfo *ei, PyObject *buf, PyObject *input_nr, PyObject *grad,
                                 PyObject *producer, PyObject *consumer, PyObject *streams) {
    if ((PyObject *)Py_TYPE(buf) != BUFFER_TYPE || grad == Py_None || !PyLong_CheckExact(input_nr))
        return 0;
    BufferObject *b = (BufferObject *)buf;
    if (!PyList_CheckExact(b->accum_streams) || !PyList_CheckExact(b->ready_streams))
        return 0;
    Py_ssize_t pos = PyLong_AsSsize_t(input_nr), n = PyList_GET_SIZE(b->grads);
    if (pos == -1 && PyErr_Occurred())
        return -1;
    if (pos < 0 || pos >= n || PyList_GET_SIZE(b->accum_streams) != n || PyList_GET_SIZE(b->ready_streams) != n)
        return 0;
    PyObject *accum = PyList_GET_ITEM(b->accum_streams, pos);
    if (accum == Py_None)
        return 0;
    PyObject *checks[3] = {producer, PyList_GET_ITEM(b->ready_streams, pos), consumer};
    for (int k = 0; k < 3; k++) {
        int r = stream_eq(accum, checks[k]);
        if (r != 1)
            return r == -1 ? -1 : 0;
    }
    Py_INCREF(accum);  /* held across the Python calls below */
    int rc = -1;
    PyObject *mgr = NULL, *enter = NULL, *exit = NULL;
    if (ei->sum_inline != NULL && streams == ei->sum_streams) { /* the manager's __enter__, done by the caller */
        if (ei->sum_inline(ei->sum_ctx, accum) < 0)
            goto out;
        PyObject *old = Py_NewRef(PyList_GET_ITEM(b->grads, pos));
        int summed = buffer_sum(b, pos, old, grad);
        Py_DECREF(old);
        if (summed < 0)
            goto out;
        PyList_SetItem(b->ready_streams, pos, Py_NewRef(accum));
        rc = 1;
        goto out;
    }
    mgr = PyObject_CallMethodOneArg(streams, s_on_stream, accum);
    if (mgr == NULL || !(enter = PyObject_GetAttr((PyObject *)Py_TYPE(mgr), s___enter__)) ||
        !(exit = PyObject_GetAttr((PyObject *)Py_TYPE(mgr), s___exit__)))
        goto out;
    PyObject *entered = PyObject_CallOneArg(enter, mgr);
    if (entered == NULL)
        goto out;
    Py_DECREF(entered);
    PyObject *old = Py_NewRef(PyList_GET_ITEM(b->grads, pos));
    int summed = buffer_sum(b, pos, old, grad);
    Py_DECREF(old);
    PyObject *res;
    if (summed < 0) {  /* the manager's __exit__ sees the error, and may swallow it, as in a with statement */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL)
            PyException_SetTraceback(ev, tb);
        res = PyObject_CallFunctionObjArgs(exit, mgr, et, ev, tb ? tb : Py_None, NULL);
        int swallow = res ? PyObject_IsTrue(res) : -1;
        Py_XDECREF(res);
        if (swallow == 0)
            PyErr_Restore(et, ev, tb);
        else {
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
        }
        if (swallow != 1)
            goto out;
    } else {
        res = PyObject_CallFunctionObjArgs(exit, mgr, Py_None, Py_None, Py_None, NULL);
        if (res == NULL)
            goto out;
        Py_DECREF(res);
    }
    PyList_SetItem(b->ready_streams, pos, Py_NewRef(accum));
    rc = 1;
out:
    Py_XDECREF(mgr);
    Py_XDECREF(enter);
    Py_XDECREF(exit);
    Py_DECREF(accum);
    return rc;
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
    if (BUFFER_TYPE == NULL || !PyList_Check(next) || !map_check(deps) || !map_check(not_ready)) {
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
        PyObject *count = map_get(deps, nxt);
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
            if (map_del(deps, nxt) < 0)
                goto unlock;
            ready = 1;
        } else {
            PyObject *nc = PyLong_FromLong(c - 1);
            if (nc == NULL || map_set(deps, nxt, nc) < 0) {
                Py_XDECREF(nc);
                goto unlock;
            }
            Py_DECREF(nc);
            ready = 0;
        }
        PyObject *buf = map_get(not_ready, nxt);  /* borrowed */
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
            if (!ready && map_set(not_ready, nxt, buf) < 0) {
                Py_DECREF(buf);
                goto unlock;
            }
        } else {
            Py_INCREF(buf);
            if (ready && map_del(not_ready, nxt) < 0) {
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
            device = meta ? slot_get(&META_SLOTS, meta, MF_DEVICE) : NULL;
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
                if (ei->streams == NULL)
                    ei->streams = PyObject_GetAttr(ei->engine, s_streams);
                PyObject *streams = Py_XNewRef(ei->streams);
                PyObject *nstream = NULL;
                if (streams != NULL) {
                    /* node_stream(nxt) = (device, stream) of an accelerator node */
                    PyObject *ndev = node_get(nxt, NF_DEVICE);
                    PyObject *nst = ndev ? node_get(nxt, NF_STREAM) : NULL;
                    nstream = nst ? PyTuple_Pack(2, ndev, nst) : NULL;
                    Py_XDECREF(ndev);
                    Py_XDECREF(nst);
                }
                int quick = nstream ? first_add_same_stream(buf, input_nr, out, device, parent, nstream) : -1;
                if (quick == 0)
                    quick = later_add_same_stream(ei, buf, input_nr, out, parent, nstream, streams);
                PyObject *r = quick == 1 ? Py_NewRef(Py_None)
                            : quick == 0 ? PyObject_CallMethodObjArgs(buf, s_add_on_device, input_nr, out, device,
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
            PyObject *ndev = node_get(nxt, NF_DEVICE);
            PyObject *idx = ndev ? PyObject_GetAttr(ndev, s_index) : NULL;
            Py_XDECREF(ndev);
            queue = idx ? device_queue_of(ei, idx) : NULL;
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
            if (ei->key_fn == NULL) { /* a simulator's queue: its push's common case without a call */
                int fast = sim_queue_push_fast(queue, depth, nxt, task);
                if (fast != 0) {
                    Py_DECREF(task);
                    Py_DECREF(queue);
                    if (fast < 0)
                        goto unlock;
                    continue;
                }
            }
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
