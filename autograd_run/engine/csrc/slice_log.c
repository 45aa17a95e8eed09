/* Python twin: autograd_run/sim/scheduler.py (Simulator.slices: a plain list of 8-tuples where this module is not built).
 *
 * SliceLog: a simulation's slices, each (gt, depth, node, tid, start, end, queue, pushed), kept as columns instead
 * of a tuple each. A million slices as tuples took ~200 MB (the tuple, and an int object for each time above
 * 256); here they take 36 bytes each: the node (a reference), start, end and pushed (int64), and the slice's kind
 * (uint32), the row of its (gt, depth, tid, queue, whether pushed is None) in a small table, as few as the
 * simulation's tasks, depths and workers.
 *
 * It is a sequence of tuples to every reader (len, [i], [-1], [a:b], iteration, append, clear, pickling as a
 * list): an item is made again on each read, equal to the one appended. A slice not of the common form (a field
 * of another type than int, str or None; a time outside int64; not an 8-tuple) is kept as given, by its index
 * (`odd`). The compiled loops add slices without a tuple (slice_log_add); sim_slices (recording.c) reads the
 * columns directly.
 *
 * No lock: a SliceLog is used by the one thread that runs a simulation, under the GIL.
 */

#define SL_ODD UINT32_MAX

typedef struct {
    PyObject *gid, *depth, *tid, *queue; /* exact ints; queue an exact str or None */
    int no_push;                         /* pushed is None */
} SliceKind;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;
    PyObject **node;   /* owned; NULL for an odd slice */
    int64_t *start, *end, *pushed;
    uint32_t *kind;    /* a row of kinds, or SL_ODD */
    SliceKind *kinds;  /* owned references */
    Py_ssize_t nkinds, kcap;
    Py_ssize_t last;   /* the kind of the slice added last, or -1 */
    PyObject *kind_index; /* dict (gid, depth, tid, queue, no_push) -> kind row, made when first needed */
    PyObject *odd;     /* dict index -> the slice as given, made when first needed */
} SliceLogObject;

static PyTypeObject SliceLogType;

/* 1 with *out where o is an exact int within int64, 0 where it is not, -1 on an error. */
static int exact_ll(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
        return 0;
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 1;
}

static int sl_grow(SliceLogObject *L) {
    if (L->n < L->cap)
        return 0;
    Py_ssize_t cap = L->cap < 1024 ? 1024 : L->cap + L->cap / 2;
    PyObject **node = PyMem_Realloc(L->node, cap * sizeof(PyObject *));
    if (node)
        L->node = node;
    int64_t *s = node ? PyMem_Realloc(L->start, cap * 8) : NULL;
    if (s)
        L->start = s;
    int64_t *e = s ? PyMem_Realloc(L->end, cap * 8) : NULL;
    if (e)
        L->end = e;
    int64_t *p = e ? PyMem_Realloc(L->pushed, cap * 8) : NULL;
    if (p)
        L->pushed = p;
    uint32_t *k = p ? PyMem_Realloc(L->kind, cap * 4) : NULL;
    if (k == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    L->kind = k;
    L->cap = cap;
    return 0;
}

/* The row of the kind (gid, depth, tid, queue, no_push), added when new; -1 on an error. Fields already checked. */
static Py_ssize_t sl_kind(SliceLogObject *L, PyObject *gid, PyObject *depth, PyObject *tid, PyObject *queue,
                          int no_push) {
    if (L->last >= 0) {
        SliceKind *k = &L->kinds[L->last];
        if (k->gid == gid && k->depth == depth && k->tid == tid && k->queue == queue && k->no_push == no_push)
            return L->last;
    }
    if (L->kind_index == NULL && (L->kind_index = PyDict_New()) == NULL)
        return -1;
    PyObject *key = Py_BuildValue("(OOOOi)", gid, depth, tid, queue, no_push);
    if (key == NULL)
        return -1;
    PyObject *row = PyDict_GetItemWithError(L->kind_index, key);
    if (row != NULL) {
        Py_DECREF(key);
        return L->last = PyLong_AsSsize_t(row);
    }
    if (PyErr_Occurred() || L->nkinds >= (Py_ssize_t)SL_ODD - 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_OverflowError, "SliceLog: too many kinds of slice");
        Py_DECREF(key);
        return -1;
    }
    if (L->nkinds == L->kcap) {
        Py_ssize_t cap = L->kcap ? L->kcap * 2 : 8;
        SliceKind *ks = PyMem_Realloc(L->kinds, cap * sizeof(SliceKind));
        if (ks == NULL) {
            Py_DECREF(key);
            PyErr_NoMemory();
            return -1;
        }
        L->kinds = ks;
        L->kcap = cap;
    }
    PyObject *v = PyLong_FromSsize_t(L->nkinds);
    int r = v ? PyDict_SetItem(L->kind_index, key, v) : -1;
    Py_XDECREF(v);
    Py_DECREF(key);
    if (r < 0)
        return -1;
    L->kinds[L->nkinds] = (SliceKind){Py_NewRef(gid), Py_NewRef(depth), Py_NewRef(tid), Py_NewRef(queue), no_push};
    return L->last = L->nkinds++;
}

/* Keep `slice` (a new reference, stolen) as given, at the next index. */
static int sl_add_odd(SliceLogObject *L, PyObject *slice) {
    if (slice == NULL)
        return -1;
    if (sl_grow(L) < 0 || (L->odd == NULL && (L->odd = PyDict_New()) == NULL)) {
        Py_DECREF(slice);
        return -1;
    }
    PyObject *i = PyLong_FromSsize_t(L->n);
    int r = i ? PyDict_SetItem(L->odd, i, slice) : -1;
    Py_XDECREF(i);
    Py_DECREF(slice);
    if (r < 0)
        return -1;
    L->node[L->n] = NULL;
    L->start[L->n] = L->end[L->n] = L->pushed[L->n] = 0;
    L->kind[L->n++] = SL_ODD;
    return 0;
}

/* Append (gid, depth, node, tid, start, end, queue, pushed): the loops' way in, with no tuple for the common form. */
static int slice_log_add(SliceLogObject *L, PyObject *gid, PyObject *depth, PyObject *node, PyObject *tid,
                         long long start, long long end, PyObject *queue, PyObject *pushed) {
    int64_t p = 0;
    int fits = PyLong_CheckExact(gid) && PyLong_CheckExact(depth) && PyLong_CheckExact(tid) &&
               (queue == Py_None || PyUnicode_CheckExact(queue));
    if (fits && pushed != Py_None && (fits = exact_ll(pushed, &p)) < 0)
        return -1;
    if (!fits) {
        PyObject *st = PyLong_FromLongLong(start), *en = st ? PyLong_FromLongLong(end) : NULL;
        PyObject *t = en ? PyTuple_Pack(8, gid, depth, node, tid, st, en, queue, pushed) : NULL;
        Py_XDECREF(st);
        Py_XDECREF(en);
        return sl_add_odd(L, t);
    }
    Py_ssize_t k = sl_kind(L, gid, depth, tid, queue, pushed == Py_None);
    if (k < 0 || sl_grow(L) < 0)
        return -1;
    Py_ssize_t i = L->n++;
    L->node[i] = Py_NewRef(node);
    L->start[i] = start;
    L->end[i] = end;
    L->pushed[i] = p;
    L->kind[i] = (uint32_t)k;
    return 0;
}

static int slice_log_append_obj(SliceLogObject *L, PyObject *s) {
    if (PyTuple_CheckExact(s) && PyTuple_GET_SIZE(s) == 8) {
        int64_t st = 0, en = 0;
        int a = exact_ll(PyTuple_GET_ITEM(s, 4), &st), b = a > 0 ? exact_ll(PyTuple_GET_ITEM(s, 5), &en) : a;
        if (a < 0 || b < 0)
            return -1;
        if (a > 0 && b > 0)
            return slice_log_add(L, PyTuple_GET_ITEM(s, 0), PyTuple_GET_ITEM(s, 1), PyTuple_GET_ITEM(s, 2),
                                 PyTuple_GET_ITEM(s, 3), st, en, PyTuple_GET_ITEM(s, 6), PyTuple_GET_ITEM(s, 7));
    }
    return sl_add_odd(L, Py_NewRef(s));
}

/* The slice at i (0 <= i < n), a new tuple. */
static PyObject *sl_item(SliceLogObject *L, Py_ssize_t i) {
    if (L->kind[i] == SL_ODD) {
        PyObject *k = PyLong_FromSsize_t(i);
        PyObject *s = k ? PyDict_GetItemWithError(L->odd, k) : NULL;
        Py_XDECREF(k);
        if (s == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "SliceLog: an odd slice is missing");
        return Py_XNewRef(s);
    }
    SliceKind *k = &L->kinds[L->kind[i]];
    PyObject *st = PyLong_FromLongLong(L->start[i]), *en = st ? PyLong_FromLongLong(L->end[i]) : NULL;
    PyObject *p = en ? (k->no_push ? Py_NewRef(Py_None) : PyLong_FromLongLong(L->pushed[i])) : NULL;
    PyObject *t = p ? PyTuple_Pack(8, k->gid, k->depth, L->node[i], k->tid, st, en, k->queue, p) : NULL;
    Py_XDECREF(st);
    Py_XDECREF(en);
    Py_XDECREF(p);
    return t;
}

static Py_ssize_t SliceLog_len(SliceLogObject *L) { return L->n; }

static PyObject *SliceLog_item(SliceLogObject *L, Py_ssize_t i) {
    if (i < 0 || i >= L->n) {
        PyErr_SetString(PyExc_IndexError, "SliceLog index out of range");
        return NULL;
    }
    return sl_item(L, i);
}

static PyObject *SliceLog_subscript(SliceLogObject *L, PyObject *key) {
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        return SliceLog_item(L, i < 0 ? i + L->n : i);
    }
    if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) < 0)
            return NULL;
        Py_ssize_t len = PySlice_AdjustIndices(L->n, &start, &stop, step);
        PyObject *out = PyList_New(len);
        for (Py_ssize_t j = 0, i = start; out != NULL && j < len; j++, i += step) {
            PyObject *s = sl_item(L, i);
            if (s == NULL)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, j, s);
        }
        return out;
    }
    PyErr_Format(PyExc_TypeError, "SliceLog indices must be integers or slices, not %.200s", Py_TYPE(key)->tp_name);
    return NULL;
}

static void sl_clear_all(SliceLogObject *L) {
    for (Py_ssize_t i = 0; i < L->n; i++)
        Py_CLEAR(L->node[i]);
    for (Py_ssize_t k = 0; k < L->nkinds; k++) {
        Py_CLEAR(L->kinds[k].gid);
        Py_CLEAR(L->kinds[k].depth);
        Py_CLEAR(L->kinds[k].tid);
        Py_CLEAR(L->kinds[k].queue);
    }
    L->n = L->nkinds = 0;
    L->last = -1;
    Py_CLEAR(L->kind_index);
    Py_CLEAR(L->odd);
}

static PyObject *SliceLog_append(SliceLogObject *L, PyObject *s) {
    if (slice_log_append_obj(L, s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *SliceLog_clear(SliceLogObject *L, PyObject *unused) {
    sl_clear_all(L);
    Py_RETURN_NONE;
}

/* Pickled as the list of its slices (what it stands for; sweeps send reports between processes). */
static PyObject *SliceLog_reduce(SliceLogObject *L, PyObject *unused) {
    PyObject *all = PySlice_New(NULL, NULL, NULL);
    PyObject *list = all ? SliceLog_subscript(L, all) : NULL;
    Py_XDECREF(all);
    if (list == NULL)
        return NULL;
    PyObject *r = Py_BuildValue("(O(O))", (PyObject *)&PyList_Type, list);
    Py_DECREF(list);
    return r;
}

/* Its own memory (the columns and the kinds; not the objects it refers to), as sys.getsizeof reports it. */
static PyObject *SliceLog_sizeof(SliceLogObject *L, PyObject *unused) {
    size_t per = sizeof(PyObject *) + 3 * sizeof(int64_t) + sizeof(uint32_t);
    return PyLong_FromSize_t(Py_TYPE(L)->tp_basicsize + (size_t)L->cap * per + (size_t)L->kcap * sizeof(SliceKind));
}

static PyObject *SliceLog_repr(SliceLogObject *L) {
    return PyUnicode_FromFormat("<SliceLog of %zd slices>", L->n);
}

static int SliceLog_init(SliceLogObject *L, PyObject *args, PyObject *kwds) {
    PyObject *items = NULL;
    if (!PyArg_ParseTuple(args, "|O:SliceLog", &items))
        return -1;
    sl_clear_all(L);
    if (items == NULL)
        return 0;
    PyObject *it = PyObject_GetIter(items), *s;
    if (it == NULL)
        return -1;
    while ((s = PyIter_Next(it)) != NULL) {
        int r = slice_log_append_obj(L, s);
        Py_DECREF(s);
        if (r < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *SliceLog_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    SliceLogObject *L = (SliceLogObject *)type->tp_alloc(type, 0);
    if (L != NULL)
        L->last = -1;
    return (PyObject *)L;
}

static int SliceLog_traverse(SliceLogObject *L, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < L->n; i++)
        Py_VISIT(L->node[i]);
    for (Py_ssize_t k = 0; k < L->nkinds; k++) {
        Py_VISIT(L->kinds[k].gid);
        Py_VISIT(L->kinds[k].depth);
        Py_VISIT(L->kinds[k].tid);
        Py_VISIT(L->kinds[k].queue);
    }
    Py_VISIT(L->kind_index);
    Py_VISIT(L->odd);
    return 0;
}

static int SliceLog_tp_clear(SliceLogObject *L) {
    sl_clear_all(L);
    return 0;
}

static void SliceLog_dealloc(SliceLogObject *L) {
    PyObject_GC_UnTrack(L);
    sl_clear_all(L);
    PyMem_Free(L->node);
    PyMem_Free(L->start);
    PyMem_Free(L->end);
    PyMem_Free(L->pushed);
    PyMem_Free(L->kind);
    PyMem_Free(L->kinds);
    Py_TYPE(L)->tp_free((PyObject *)L);
}

static PyMethodDef SliceLog_methods[] = {
    {"append", (PyCFunction)SliceLog_append, METH_O, "append(slice): one (gt, depth, node, tid, start, end, queue, pushed)"},
    {"clear", (PyCFunction)SliceLog_clear, METH_NOARGS, "drop every slice"},
    {"__reduce__", (PyCFunction)SliceLog_reduce, METH_NOARGS, "pickled as the list of its slices"},
    {"__sizeof__", (PyCFunction)SliceLog_sizeof, METH_NOARGS, "the columns' bytes"},
    {NULL},
};

static PySequenceMethods SliceLog_as_sequence = {
    .sq_length = (lenfunc)SliceLog_len,
    .sq_item = (ssizeargfunc)SliceLog_item,
};

static PyMappingMethods SliceLog_as_mapping = {
    .mp_length = (lenfunc)SliceLog_len,
    .mp_subscript = (binaryfunc)SliceLog_subscript,
};

static PyTypeObject SliceLogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.SliceLog",
    .tp_doc = "A simulation's slices as columns; a sequence of (gt, depth, node, tid, start, end, queue, pushed) "
              "tuples to its readers (see csrc/slice_log.c).",
    .tp_basicsize = sizeof(SliceLogObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = SliceLog_new,
    .tp_init = (initproc)SliceLog_init,
    .tp_dealloc = (destructor)SliceLog_dealloc,
    .tp_traverse = (traverseproc)SliceLog_traverse,
    .tp_clear = (inquiry)SliceLog_tp_clear,
    .tp_repr = (reprfunc)SliceLog_repr,
    .tp_as_sequence = &SliceLog_as_sequence,
    .tp_as_mapping = &SliceLog_as_mapping,
    .tp_methods = SliceLog_methods,
};
