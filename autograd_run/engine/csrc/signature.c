/* Python twin: autograd_run/sim/signature.py (signature_py).
 * signature: a node's cost-lookup key, built without Python frames: the simulator's CostResolver asks for one per
 * node of a graph it costs (a placed graph: every node). Part of _core.c (included there, after core.h). */

static PyObject *SIG_OUTPUTS = NULL; /* "->": ends the input metas in a key (signature.py's _OUTPUTS) */

/* Append a meta's (shape, dtype, device type, device index, stream) to `key`; 0, or -1 with an exception. */
static int sig_meta(PyObject *key, PyObject *meta) {
    PyObject *v[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *dev = NULL;
    int rc = -1;
    if (!(v[0] = slot_get(&META_SLOTS, meta, MF_SHAPE)) || !(v[1] = slot_get(&META_SLOTS, meta, MF_DTYPE)) ||
        !(dev = PyObject_GetAttr(meta, s_device)) || !(v[2] = PyObject_GetAttr(dev, s_type)) ||
        !(v[3] = PyObject_GetAttr(dev, s_index)) || !(v[4] = PyObject_GetAttr(meta, s_stream)))
        goto done;
    rc = 0;
    for (int i = 0; i < 5 && rc == 0; i++)
        rc = PyList_Append(key, v[i]);
done:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(v[i]);
    Py_XDECREF(dev);
    return rc;
}

/* The input meta an edge (Edge(node, input_nr)) leads to: edge.node.inputs[edge.input_nr]; a new reference. */
static PyObject *sig_edge_meta(PyObject *edge) {
    PyObject *target, *nr;
    if (PyTuple_Check(edge) && PyTuple_GET_SIZE(edge) == 2) {
        target = Py_NewRef(PyTuple_GET_ITEM(edge, 0));
        nr = Py_NewRef(PyTuple_GET_ITEM(edge, 1));
    } else {
        target = PyObject_GetAttr(edge, s_node);
        nr = target ? PyObject_GetAttr(edge, s_input_nr) : NULL;
        if (nr == NULL) {
            Py_XDECREF(target);
            return NULL;
        }
    }
    PyObject *inputs = node_get(target, NF_INPUTS);
    Py_DECREF(target);
    PyObject *meta = inputs ? PyObject_GetItem(inputs, nr) : NULL;
    Py_XDECREF(inputs);
    Py_DECREF(nr);
    return meta;
}

/* Each (name, value) of `saved` into items and values as signature_py does; 1 done, 0: None (the node is costed
 * on its own), -1 an exception. */
static int sig_saved_item(PyObject *k, PyObject *v, PyObject *items, PyObject *values) {
    PyObject *item = NULL;
    if (PyDict_CheckExact(v)) {
        PyObject *shape = PyDict_GetItemWithError(v, s_shape);
        if (shape == NULL)
            return PyErr_Occurred() ? -1 : 0;
        if (shape == Py_None)
            return 0;
        PyObject *dtype = PyDict_GetItemWithError(v, s_dtype);
        if (dtype == NULL && PyErr_Occurred())
            return -1;
        PyObject *t = PySequence_Tuple(shape);
        if (t == NULL)
            return -1;
        item = PyTuple_Pack(3, k, t, dtype ? dtype : Py_None);
        Py_DECREF(t);
    } else if (PyList_CheckExact(v)) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!PyLong_CheckExact(PyList_GET_ITEM(v, i)))
                return 0;
        PyObject *t = PyList_AsTuple(v);
        if (t == NULL || PyList_Append(values, t) < 0) {
            Py_XDECREF(t);
            return -1;
        }
        Py_DECREF(t);
        item = PyTuple_Pack(1, k);
    } else {
        if (PyList_Append(values, v) < 0)
            return -1;
        item = PyTuple_Pack(1, k);
    }
    if (item == NULL || PyList_Append(items, item) < 0) {
        Py_XDECREF(item);
        return -1;
    }
    Py_DECREF(item);
    return 1;
}

static int sig_saved(PyObject *saved, PyObject *items, PyObject *values) {
    if (PyDict_CheckExact(saved)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(saved, &pos, &k, &v)) {
            Py_INCREF(k);
            Py_INCREF(v);
            int r = sig_saved_item(k, v, items, values);
            Py_DECREF(k);
            Py_DECREF(v);
            if (r <= 0)
                return r;
        }
        return 1;
    }
    PyObject *pairs = PyMapping_Items(saved);
    if (pairs == NULL)
        return -1;
    int r = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs) && r == 1; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        r = sig_saved_item(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), items, values);
    }
    Py_DECREF(pairs);
    return r;
}

/* signature(node) -> (key, values) or None: see sim/signature.py. */
static PyObject *signature(PyObject *mod, PyObject *node) {
    PyObject *key = NULL, *op = NULL, *name = NULL, *dev = NULL, *dtype = NULL, *dindex = NULL, *metas = NULL,
             *next = NULL, *saved = NULL, *items = NULL, *values = NULL, *result = NULL;
    if (!(op = node_get(node, NF_OP)) || !(name = node_get(node, NF_NAME)) ||
        !(dev = PyObject_GetAttr(node, s_device)) || !(dtype = PyObject_GetAttr(dev, s_type)) ||
        !(dindex = PyObject_GetAttr(dev, s_index)))
        goto done;
    if (!(key = PyList_New(4)))
        goto done;
    PyList_SET_ITEM(key, 0, Py_NewRef(op));
    PyList_SET_ITEM(key, 1, Py_NewRef(name));
    PyList_SET_ITEM(key, 2, Py_NewRef(dtype));
    PyList_SET_ITEM(key, 3, Py_NewRef(dindex));
    if (!(metas = node_get(node, NF_INPUTS)))
        goto done;
    PyObject *fast = PySequence_Fast(metas, "a node's inputs are a list");
    if (fast == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++)
        if (sig_meta(key, PySequence_Fast_GET_ITEM(fast, i)) < 0) {
            Py_DECREF(fast);
            goto done;
        }
    Py_DECREF(fast);
    if (PyList_Append(key, SIG_OUTPUTS) < 0 || !(next = node_get(node, NF_NEXT)))
        goto done;
    fast = PySequence_Fast(next, "a node's next edges are a list");
    if (fast == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(fast, i);
        int r;
        if (e == Py_None) {
            r = PyList_Append(key, Py_None);
        } else {
            PyObject *meta = sig_edge_meta(e);
            r = meta ? sig_meta(key, meta) : -1;
            Py_XDECREF(meta);
        }
        if (r < 0) {
            Py_DECREF(fast);
            goto done;
        }
    }
    Py_DECREF(fast);
    if (!(saved = node_get(node, NF_SAVED)))
        goto done;
    int truth = PyObject_IsTrue(saved);
    if (truth < 0)
        goto done;
    if (!truth) {
        PyObject *t = PyList_AsTuple(key), *empty = t ? PyTuple_New(0) : NULL;
        if (empty != NULL)
            result = PyTuple_Pack(2, t, empty);
        Py_XDECREF(t);
        Py_XDECREF(empty);
        goto done;
    }
    if (!(items = PyList_New(0)) || !(values = PyList_New(0)))
        goto done;
    int r = sig_saved(saved, items, values);
    if (r < 0)
        goto done;
    if (r == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *ti = PyList_AsTuple(items);
    if (ti == NULL || PyList_Append(key, ti) < 0) {
        Py_XDECREF(ti);
        goto done;
    }
    Py_DECREF(ti);
    PyObject *tk = PyList_AsTuple(key), *tv = tk ? PyList_AsTuple(values) : NULL;
    if (tv != NULL)
        result = PyTuple_Pack(2, tk, tv);
    Py_XDECREF(tk);
    Py_XDECREF(tv);
done:
    Py_XDECREF(key);
    Py_XDECREF(op);
    Py_XDECREF(name);
    Py_XDECREF(dev);
    Py_XDECREF(dtype);
    Py_XDECREF(dindex);
    Py_XDECREF(metas);
    Py_XDECREF(next);
    Py_XDECREF(saved);
    Py_XDECREF(items);
    Py_XDECREF(values);
    return result;
}
