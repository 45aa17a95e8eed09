/* Python twin: autograd_run/record/kernels.py.
 * Node columns, input shape codes and the critical path for the trace writers and the summary. Part of _core.c (included there, after core.h). */

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

/* critical_path(nodes, gt, node, weight, start, order) -> (path run indices as int64 bytes, total): the longest chain of
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
    if (start >= 0) { /* the path's runs as int64 bytes (a million-run path as ints: 40 MB more, and their time) */
        Py_ssize_t len = 0;
        for (int64_t k = start; k >= 0; k = succ[k])
            len++;
        PyObject *path = PyBytes_FromStringAndSize(NULL, len * 8);
        if (path != NULL) {
            int64_t *out = (int64_t *)PyBytes_AS_STRING(path);
            for (int64_t k = start; k >= 0; k = succ[k])
                *out++ = k;
        }
        result = path ? Py_BuildValue("(NL)", path, (long long)best[start]) : NULL;
    } else {
        result = Py_BuildValue("(y#L)", "", (Py_ssize_t)0, 0LL);
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

/* node_rows(table, objs) -> int64 bytes: the row in `table` of each object of `objs` (the same object, not an
 * equal one; its first row), -1 where it is not there. */
static PyObject *node_rows(PyObject *mod, PyObject *args) {
    PyObject *table, *objs;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &table, &PyList_Type, &objs))
        return NULL;
    PtrRows h;
    if (ptr_rows_make(&h, table) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(objs);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out != NULL) {
        int64_t *r = (int64_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++)
            r[i] = ptr_row(&h, PyList_GET_ITEM(objs, i));
    }
    ptr_rows_free(&h);
    return out;
}

/* node_edges(table) -> (src bytes, dst bytes): every next edge from a node of `table` to a node of `table`, as
 * int64 rows (the target's first row), nodes in table order, each node's edges in order. */
static PyObject *node_edges(PyObject *mod, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "node_edges(list of nodes)");
        return NULL;
    }
    PtrRows h;
    if (ptr_rows_make(&h, arg) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(arg), m = 0, cap = n + 16;
    int64_t *src = PyMem_Malloc(cap * sizeof(int64_t)), *dst = PyMem_Malloc(cap * sizeof(int64_t));
    PyObject *result = NULL;
    if (src == NULL || dst == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *nxt = node_get(PyList_GET_ITEM(arg, j), NF_NEXT);
        if (nxt == NULL)
            goto done;
        PyObject *seq = PySequence_Fast(nxt, "a node's next is not a sequence");
        Py_DECREF(nxt);
        if (seq == NULL)
            goto done;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
            PyObject *e = PySequence_Fast_GET_ITEM(seq, k);
            if (e == Py_None)
                continue;
            /* (an Edge is a tuple subclass, whose sq_item CPython fills with the generic slot that looks up
             * __getitem__ and calls it: a tuple's item is read directly) */
            PyObject *target = PyTuple_Check(e) && PyTuple_GET_SIZE(e) > 0 ? Py_NewRef(PyTuple_GET_ITEM(e, 0))
                                                                         : PySequence_GetItem(e, 0);
            if (target == NULL) {
                Py_DECREF(seq);
                goto done;
            }
            Py_ssize_t d = ptr_row(&h, target);
            Py_DECREF(target);
            if (d < 0)
                continue;
            if (m == cap) {
                cap *= 2;
                int64_t *s2 = PyMem_Realloc(src, cap * sizeof(int64_t)), *d2 = s2 ? PyMem_Realloc(dst, cap * sizeof(int64_t)) : NULL;
                if (s2 != NULL)
                    src = s2;
                if (d2 == NULL) {
                    Py_DECREF(seq);
                    PyErr_NoMemory();
                    goto done;
                }
                dst = d2;
            }
            src[m] = j;
            dst[m] = d;
            m++;
        }
        Py_DECREF(seq);
    }
    result = Py_BuildValue("(y#y#)", (char *)src, m * 8, (char *)dst, m * 8);
done:
    PyMem_Free(src);
    PyMem_Free(dst);
    ptr_rows_free(&h);
    return result;
}
