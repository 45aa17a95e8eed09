/* Python twin: autograd_run/engine/worker.py (validate_outputs) and autograd_run/engine/waits.py (spin_until).
 * Validate_outputs' common case; a busy-wait without the GIL. Part of _core.c (included there, after core.h). */

/* --------------------------------------------------------- outputs_match */

/* numpy arrays read without numpy's headers: the leading fields of PyArrayObject_fields (stable
 * since numpy 1.7, numpy 2 included). configure_worker() checks them on a probe array and uses
 * them only for arrays of exactly numpy.ndarray; anything else is read through getattr. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
} ArrayHead;

static PyTypeObject *ARRAY_TYPE = NULL;

/* 1 when g has exactly `shape` (a tuple of ints) and its dtype object is `want`, 0 when not, -1 on error. */
static int array_matches(PyObject *g, PyObject *shape, PyObject *want) {
    if (Py_TYPE(g) == ARRAY_TYPE && PyTuple_CheckExact(shape)) {
        ArrayHead *a = (ArrayHead *)g;
        if (a->descr != want || PyTuple_GET_SIZE(shape) != a->nd)
            return 0;
        for (int i = 0; i < a->nd; i++) {
            PyObject *d = PyTuple_GET_ITEM(shape, i);
            if (!PyLong_CheckExact(d))
                return 0;
            Py_ssize_t v = PyLong_AsSsize_t(d);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (v != a->dimensions[i])
                return 0;
        }
        return 1;
    }
    PyObject *gs = PyObject_GetAttr(g, s_shape);
    if (gs == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = PyObject_RichCompareBool(gs, shape, Py_EQ);
    Py_DECREF(gs);
    if (same != 1) {
        PyErr_Clear();
        return 0;
    }
    PyObject *dt = PyObject_GetAttr(g, s_dtype);
    if (dt == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = dt == want;
    Py_DECREF(dt);
    return ok;
}

/* The compiled loop's check before validate_outputs: 1 when every gradient already fits its slot, or
 * only differs from it in size-1 dimensions (then it is reshaped here, in `grads`, exactly as
 * validate_outputs would: the sum over size-1 dimensions is the element itself); 0 when the full
 * validate_outputs must run (another shape, a dtype to cast, a count that differs); -1 on error. */
static int conform_outputs(PyObject *edges, PyObject *grads, PyObject *dtypes) {
    if (!PyList_Check(edges) || !PyList_Check(grads) || PyList_GET_SIZE(edges) != PyList_GET_SIZE(grads))
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(edges);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(edges, i), *g = PyList_GET_ITEM(grads, i);
        if (e == Py_None || g == Py_None)
            continue;
        PyObject *target = PyTuple_GET_ITEM(e, 0), *nr = PyTuple_GET_ITEM(e, 1);
        PyObject *ins = node_get(target, NF_INPUTS);
        PyObject *meta = ins ? PyObject_GetItem(ins, nr) : NULL;
        Py_XDECREF(ins);
        if (meta == NULL)
            return -1;
        PyObject *shape = slot_get(&META_SLOTS, meta, MF_SHAPE);
        PyObject *name = shape ? slot_get(&META_SLOTS, meta, MF_DTYPE) : NULL;
        Py_DECREF(meta);
        if (name == NULL) {
            Py_XDECREF(shape);
            return -1;
        }
        PyObject *want = PyDict_GetItemWithError(dtypes, name);  /* borrowed */
        Py_DECREF(name);
        if (want == NULL) {
            Py_DECREF(shape);
            if (PyErr_Occurred())
                return -1;
            return 0;
        }
        int ok = array_matches(g, shape, want);
        if (ok == 0 && Py_TYPE(g) == ARRAY_TYPE && ((ArrayHead *)g)->descr == want && PyTuple_CheckExact(shape)) {
            ArrayHead *a = (ArrayHead *)g;
            Py_ssize_t nd = PyTuple_GET_SIZE(shape), td = a->nd, want_n = 1, have_n = 1;
            int fits = nd <= td;
            for (Py_ssize_t k = 1; fits && k <= nd; k++) {
                Py_ssize_t sv = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, nd - k)), t = a->dimensions[td - k];
                if (sv == -1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    fits = 0;
                } else if (sv != 1 && sv != t) {
                    fits = 0;
                }
                want_n *= sv;
            }
            for (Py_ssize_t k = 0; fits && k < td; k++)
                have_n *= a->dimensions[k];
            if (fits && want_n == have_n) {
                PyObject *r = PyObject_CallMethodOneArg(g, s_reshape, shape);
                if (r == NULL) {
                    Py_DECREF(shape);
                    return -1;
                }
                PyList_SetItem(grads, i, r);  /* steals r */
                ok = 1;
            }
        }
        Py_DECREF(shape);
        if (ok <= 0)
            return ok;
    }
    return 1;
}

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
        PyObject *ins = node_get(target, NF_INPUTS);
        PyObject *meta;
        if (ins != NULL && PyList_CheckExact(ins) && PyLong_CheckExact(nr)) {
            Py_ssize_t k = PyLong_AsSsize_t(nr);
            meta = (k >= 0 && k < PyList_GET_SIZE(ins)) ? Py_NewRef(PyList_GET_ITEM(ins, k)) : PyObject_GetItem(ins, nr);
        } else {
            meta = ins ? PyObject_GetItem(ins, nr) : NULL;
        }
        Py_XDECREF(ins);
        if (meta == NULL)
            return NULL;
        PyObject *want_shape = slot_get(&META_SLOTS, meta, MF_SHAPE);
        PyObject *want_name = want_shape ? slot_get(&META_SLOTS, meta, MF_DTYPE) : NULL;
        Py_DECREF(meta);
        if (want_name == NULL) {
            Py_XDECREF(want_shape);
            return NULL;
        }
        PyObject *want = PyDict_GetItemWithError(dtypes, want_name);  /* borrowed */
        Py_DECREF(want_name);
        if (want == NULL) {
            Py_DECREF(want_shape);
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        int ok = array_matches(g, want_shape, want);
        Py_DECREF(want_shape);
        if (ok < 0)
            return NULL;
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
