/* Python twin: autograd_run/engine/state.py (GraphState), autograd_run/engine/builtin_nodes.py (AccumulateGrad), autograd_run/engine/run.py (nodes_of_op).
 * A graph's run-time state: sequence numbers, saved values split and grouped, released, AccumulateGrad. Part of _core.c (included there, after core.h). */

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
