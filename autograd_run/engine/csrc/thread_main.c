/* Python twin: autograd_run/engine/worker.py (thread_main_py, evaluate_function).
 * The worker loop. Part of _core.c (included there, after core.h). */

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
