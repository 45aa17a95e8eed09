/* Python twin: autograd_run/sim/scheduler.py, autograd_run/sim/costs.py (a plain dict where this module is not
 * built: _new_task's counts, CostResolver.resolved). Part of _core.c (included there, after core.h).
 *
 * NodeMap(n): a mapping from a graph's nodes to values, for a table as big as the graph (the top-level
 * simulated call's dependency counts and the simulation's costs by node: every node of a million-node graph is
 * in each once). A dict keyed by node
 * pays for a hash probe and an entry in a table of its own, both far from the node in memory; this keeps the
 * value in a slot found by the node's `index` (its place in the file, which it already holds: graphs/model.Node),
 * 16 bytes a slot, two arrays of n slots made when the first entry goes in and freed when the map empties by
 * clear() (and when it is freed).
 *
 * Any key works as in a dict: a key whose index is not an int in [0, n) (another kind of object, a node of
 * another graph, an index past n) or whose slot is taken by another node (two graphs' nodes can share an index)
 * goes to `rest`, a plain dict. So a key is in its slot or in `rest`, never both: an entry that goes into a
 * free slot is taken out of `rest` first where `rest` holds anything.
 *
 * Fields:
 *   cap       slots, the n given (no slot arrays while `keys` is NULL)
 *   keys      the node in slot i (a strong reference), or NULL
 *   values    its value (a strong reference), where keys[i] is not NULL
 *   in_slots  the entries in slots
 *   rest      the entries without a slot (a dict, made when first needed)
 * Touched only with the GIL held (the simulator's tasks are one thread's). Iteration (keys, values, items,
 * iter) goes by slot, then `rest`; nothing the simulator does reads the order (a dict's is the order entries
 * went in). */

typedef struct {
    PyObject_HEAD
    Py_ssize_t cap;
    PyObject **keys;
    PyObject **values;
    Py_ssize_t in_slots;
    PyObject *rest;
} NodeMapObject;

static PyTypeObject NodeMapType;

/* The slot of `key` (its index), or -1 where it has none. Never sets an exception. */
static inline Py_ssize_t nm_slot(NodeMapObject *m, PyObject *key) {
    if (NODE_SLOTS.type == NULL || Py_TYPE(key) != NODE_SLOTS.type)
        return -1;
    PyObject *v = *(PyObject **)((char *)key + NODE_SLOTS.offsets[NF_INDEX]);
    if (v == NULL || !PyLong_CheckExact(v))
        return -1;
    int overflow = 0;
    long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || i < 0 || i >= m->cap)
        return -1;
    return (Py_ssize_t)i;
}

static int nm_alloc(NodeMapObject *m) {
    if (m->keys != NULL)
        return 0;
    m->keys = PyMem_Calloc((size_t)m->cap, sizeof(PyObject *));
    m->values = m->keys ? PyMem_Malloc((size_t)m->cap * sizeof(PyObject *)) : NULL;
    if (m->values == NULL) {
        PyMem_Free(m->keys);
        m->keys = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The value of `key` (borrowed), or NULL: absent (no exception) or an error (an exception: `rest`'s). */
static PyObject *nm_get(NodeMapObject *m, PyObject *key) {
    Py_ssize_t i = m->keys ? nm_slot(m, key) : -1;
    if (i >= 0 && m->keys[i] == key)
        return m->values[i];
    if (m->rest == NULL || PyDict_GET_SIZE(m->rest) == 0)
        return NULL;
    return PyDict_GetItemWithError(m->rest, key);
}

/* m[key] = value: 0, or -1 with an exception. */
static int nm_set(NodeMapObject *m, PyObject *key, PyObject *value) {
    Py_ssize_t i = nm_slot(m, key);
    if (i >= 0) {
        if (nm_alloc(m) < 0)
            return -1;
        if (m->keys[i] == key) {
            Py_SETREF(m->values[i], Py_NewRef(value));
            return 0;
        }
        if (m->keys[i] == NULL) {
            if (m->rest != NULL && PyDict_GET_SIZE(m->rest) > 0) { /* (a key is never in both) */
                PyObject *had = PyDict_GetItemWithError(m->rest, key);
                if (had == NULL && PyErr_Occurred())
                    return -1;
                if (had != NULL) {
                    PyObject *held = Py_NewRef(had);
                    int r = PyDict_SetItem(m->rest, key, value);
                    Py_DECREF(held);
                    return r;
                }
            }
            m->keys[i] = Py_NewRef(key);
            m->values[i] = Py_NewRef(value);
            m->in_slots++;
            return 0;
        }
    }
    if (m->rest == NULL && (m->rest = PyDict_New()) == NULL)
        return -1;
    return PyDict_SetItem(m->rest, key, value);
}

/* del m[key]: 0, or -1 with an exception (KeyError where it is absent). */
static int nm_del(NodeMapObject *m, PyObject *key) {
    Py_ssize_t i = m->keys ? nm_slot(m, key) : -1;
    if (i >= 0 && m->keys[i] == key) {
        PyObject *k = m->keys[i], *v = m->values[i];
        m->keys[i] = NULL;
        m->in_slots--;
        Py_DECREF(v); /* (after the slot is empty: a destructor may read this map) */
        Py_DECREF(k);
        return 0;
    }
    if (m->rest == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return PyDict_DelItem(m->rest, key);
}

/* Every entry out, the slot arrays freed. */
static void nm_clear_all(NodeMapObject *m) {
    PyObject **keys = m->keys, **values = m->values;
    Py_ssize_t cap = m->cap;
    m->keys = m->values = NULL;
    m->in_slots = 0;
    if (keys != NULL) {
        for (Py_ssize_t i = 0; i < cap; i++) {
            if (keys[i] != NULL) {
                Py_DECREF(values[i]);
                Py_DECREF(keys[i]);
            }
        }
        PyMem_Free(keys);
        PyMem_Free(values);
    }
    Py_CLEAR(m->rest);
}

static PyObject *NodeMap_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Py_ssize_t n;
    static char *kwlist[] = {"n", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:NodeMap", kwlist, &n))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "NodeMap: n must be >= 0");
        return NULL;
    }
    NodeMapObject *m = (NodeMapObject *)type->tp_alloc(type, 0);
    if (m != NULL)
        m->cap = n;
    return (PyObject *)m;
}

static int NodeMap_traverse(NodeMapObject *m, visitproc visit, void *arg) {
    if (m->keys != NULL) {
        for (Py_ssize_t i = 0; i < m->cap; i++) {
            if (m->keys[i] != NULL) {
                Py_VISIT(m->keys[i]);
                Py_VISIT(m->values[i]);
            }
        }
    }
    Py_VISIT(m->rest);
    return 0;
}

static int NodeMap_tp_clear(NodeMapObject *m) {
    nm_clear_all(m);
    return 0;
}

static void NodeMap_dealloc(NodeMapObject *m) {
    PyObject_GC_UnTrack(m);
    nm_clear_all(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t NodeMap_length(NodeMapObject *m) {
    return m->in_slots + (m->rest ? PyDict_GET_SIZE(m->rest) : 0);
}

static PyObject *NodeMap_subscript(NodeMapObject *m, PyObject *key) {
    PyObject *v = nm_get(m, key);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return Py_NewRef(v);
}

static int NodeMap_ass_subscript(NodeMapObject *m, PyObject *key, PyObject *value) {
    return value == NULL ? nm_del(m, key) : nm_set(m, key, value);
}

static int NodeMap_contains(NodeMapObject *m, PyObject *key) {
    PyObject *v = nm_get(m, key);
    return v != NULL ? 1 : PyErr_Occurred() ? -1 : 0;
}

static PyObject *NodeMap_get(NodeMapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get expected 1 or 2 arguments");
        return NULL;
    }
    PyObject *v = nm_get(m, args[0]);
    if (v == NULL && PyErr_Occurred())
        return NULL;
    return Py_NewRef(v != NULL ? v : nargs == 2 ? args[1] : Py_None);
}

static PyObject *NodeMap_setdefault(NodeMapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "setdefault expected 1 or 2 arguments");
        return NULL;
    }
    PyObject *v = nm_get(m, args[0]);
    if (v != NULL)
        return Py_NewRef(v);
    if (PyErr_Occurred())
        return NULL;
    PyObject *d = nargs == 2 ? args[1] : Py_None;
    return nm_set(m, args[0], d) < 0 ? NULL : Py_NewRef(d);
}

static PyObject *NodeMap_pop(NodeMapObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop expected 1 or 2 arguments");
        return NULL;
    }
    PyObject *v = nm_get(m, args[0]);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (nargs == 2)
            return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    Py_INCREF(v);
    if (nm_del(m, args[0]) < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

static PyObject *NodeMap_clear(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) {
    nm_clear_all(m);
    Py_RETURN_NONE;
}

/* The entries as a list: keys (what 0), values (1) or (key, value) pairs (2); slots first, then `rest`. */
static PyObject *nm_list(NodeMapObject *m, int what) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; m->keys != NULL && i < m->cap; i++) {
        if (m->keys[i] == NULL)
            continue;
        PyObject *item = what == 0 ? Py_NewRef(m->keys[i]) : what == 1 ? Py_NewRef(m->values[i])
                                                                         : PyTuple_Pack(2, m->keys[i], m->values[i]);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(item);
    }
    if (m->rest != NULL && PyDict_GET_SIZE(m->rest) > 0) {
        PyObject *more = what == 0 ? PyDict_Keys(m->rest) : what == 1 ? PyDict_Values(m->rest) : PyDict_Items(m->rest);
        int r = more == NULL ? -1 : PyList_SetSlice(out, PyList_GET_SIZE(out), PyList_GET_SIZE(out), more);
        Py_XDECREF(more);
        if (r < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *NodeMap_keys(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) { return nm_list(m, 0); }
static PyObject *NodeMap_values(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) { return nm_list(m, 1); }
static PyObject *NodeMap_items(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) { return nm_list(m, 2); }

static PyObject *NodeMap_iter(NodeMapObject *m) {
    PyObject *keys = nm_list(m, 0);
    PyObject *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *NodeMap_copy(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) {
    NodeMapObject *c = (NodeMapObject *)NodeMapType.tp_alloc(&NodeMapType, 0);
    if (c == NULL)
        return NULL;
    c->cap = m->cap;
    if (m->rest != NULL && (c->rest = PyDict_Copy(m->rest)) == NULL) {
        Py_DECREF(c);
        return NULL;
    }
    if (m->keys != NULL && m->in_slots > 0) {
        if (nm_alloc(c) < 0) {
            Py_DECREF(c);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < m->cap; i++) {
            if (m->keys[i] != NULL) {
                c->keys[i] = Py_NewRef(m->keys[i]);
                c->values[i] = Py_NewRef(m->values[i]);
            }
        }
        c->in_slots = m->in_slots;
    }
    return (PyObject *)c;
}

static PyObject *NodeMap_sizeof(NodeMapObject *m, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t size = Py_TYPE(m)->tp_basicsize + (m->keys != NULL ? 2 * m->cap * (Py_ssize_t)sizeof(PyObject *) : 0);
    return PyLong_FromSsize_t(size);
}

static PyObject *NodeMap_repr(NodeMapObject *m) {
    int r = Py_ReprEnter((PyObject *)m);
    if (r != 0)
        return r > 0 ? PyUnicode_FromString("NodeMap({...})") : NULL;
    PyObject *items = nm_list(m, 2), *d = items ? PyDict_New() : NULL, *out = NULL;
    if (d != NULL && PyDict_MergeFromSeq2(d, items, 1) == 0)
        out = PyUnicode_FromFormat("NodeMap(%R)", d);
    Py_XDECREF(items);
    Py_XDECREF(d);
    Py_ReprLeave((PyObject *)m);
    return out;
}

static PyMappingMethods NodeMap_as_mapping = {
    .mp_length = (lenfunc)NodeMap_length,
    .mp_subscript = (binaryfunc)NodeMap_subscript,
    .mp_ass_subscript = (objobjargproc)NodeMap_ass_subscript,
};

static PySequenceMethods NodeMap_as_sequence = {
    .sq_contains = (objobjproc)NodeMap_contains,
};

static PyMethodDef NodeMap_methods[] = {
    {"get", (PyCFunction)(void (*)(void))NodeMap_get, METH_FASTCALL, "get(key, default=None)"},
    {"setdefault", (PyCFunction)(void (*)(void))NodeMap_setdefault, METH_FASTCALL, "setdefault(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))NodeMap_pop, METH_FASTCALL, "pop(key[, default])"},
    {"clear", (PyCFunction)NodeMap_clear, METH_NOARGS, "every entry out, and the slots' memory freed"},
    {"copy", (PyCFunction)NodeMap_copy, METH_NOARGS, "a shallow copy (a NodeMap of the same size)"},
    {"keys", (PyCFunction)NodeMap_keys, METH_NOARGS, "the keys, as a list (slots first, then the rest)"},
    {"values", (PyCFunction)NodeMap_values, METH_NOARGS, "the values, as a list (as keys())"},
    {"items", (PyCFunction)NodeMap_items, METH_NOARGS, "(key, value) pairs, as a list (as keys())"},
    {"__sizeof__", (PyCFunction)NodeMap_sizeof, METH_NOARGS, "bytes held, the slot arrays included"},
    {NULL},
};

static PyTypeObject NodeMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "autograd_run.engine._core.NodeMap",
    .tp_basicsize = sizeof(NodeMapObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "NodeMap(n): a mapping from nodes to values, each node of index i < n held in slot i "
              "(engine/csrc/node_map.c; a dict where the compiled core is not built)",
    .tp_new = NodeMap_new,
    .tp_dealloc = (destructor)NodeMap_dealloc,
    .tp_traverse = (traverseproc)NodeMap_traverse,
    .tp_clear = (inquiry)NodeMap_tp_clear,
    .tp_as_mapping = &NodeMap_as_mapping,
    .tp_as_sequence = &NodeMap_as_sequence,
    .tp_iter = (getiterfunc)NodeMap_iter,
    .tp_methods = NodeMap_methods,
    .tp_repr = (reprfunc)NodeMap_repr,
};

/* Mapping helpers for the compiled loops, which take a dict or a NodeMap. */
static inline PyObject *map_get(PyObject *map, PyObject *key) { /* borrowed; NULL: absent or an error */
    return Py_IS_TYPE(map, &NodeMapType) ? nm_get((NodeMapObject *)map, key) : PyDict_GetItemWithError(map, key);
}

static inline int map_set(PyObject *map, PyObject *key, PyObject *value) {
    return Py_IS_TYPE(map, &NodeMapType) ? nm_set((NodeMapObject *)map, key, value) : PyDict_SetItem(map, key, value);
}

static inline int map_del(PyObject *map, PyObject *key) {
    return Py_IS_TYPE(map, &NodeMapType) ? nm_del((NodeMapObject *)map, key) : PyDict_DelItem(map, key);
}

static inline int map_check(PyObject *map) {
    return PyDict_Check(map) || Py_IS_TYPE(map, &NodeMapType);
}
