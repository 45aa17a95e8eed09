/* Python twin: autograd_run/sim/signature.py (signature_py).
 * signature: a node's cost-lookup key, built without Python frames: the simulator's CostResolver asks for one per
 * node of a graph it costs (a placed graph: every node). Part of _core.c (included there, after core.h). */

static PyObject *SIG_OUTPUTS = NULL; /* "->": ends the input metas in a key (signature.py's _OUTPUTS) */

/* The five fields of recently seen metas, by identity: a loaded graph shares one InputMeta object among all the
 * slots that expect the same gradient (two objects for a 1e5-node graph), and an InputMeta is a frozen value. An
 * entry holds its meta, so the address cannot be reused while it is cached. Touched only with the GIL held. */
#define SIG_CACHE 64
static struct {
    PyObject *meta;
    PyObject *fields[5];
} sig_cache[SIG_CACHE];

/* A meta's (shape, dtype, device type, device index, stream) into key[at..at+5); 0, or -1 with an exception. */
static int sig_meta(PyObject *key, Py_ssize_t at, PyObject *meta) {
    size_t slot = ((uintptr_t)meta >> 4) % SIG_CACHE;
    if (sig_cache[slot].meta != meta) {
        PyObject *f[5] = {NULL, NULL, NULL, NULL, NULL}, *dev = NULL;
        int ok = (f[0] = slot_get(&META_SLOTS, meta, MF_SHAPE)) && (f[1] = slot_get(&META_SLOTS, meta, MF_DTYPE)) &&
                 (dev = slot_get(&META_SLOTS, meta, MF_DEVICE)) && (f[2] = PyObject_GetAttr(dev, s_type)) &&
                 (f[3] = PyObject_GetAttr(dev, s_index)) && (f[4] = slot_get(&META_SLOTS, meta, MF_STREAM));
        Py_XDECREF(dev);
        if (!ok) {
            for (int k = 0; k < 5; k++)
                Py_XDECREF(f[k]);
            return -1;
        }
        PyObject *old_meta = sig_cache[slot].meta, *old[5];
        memcpy(old, sig_cache[slot].fields, sizeof old);
        sig_cache[slot].meta = Py_NewRef(meta);
        memcpy(sig_cache[slot].fields, f, sizeof f);
        Py_XDECREF(old_meta);  /* after the entry is whole again: a destructor may run signature */
        for (int k = 0; k < 5; k++)
            Py_XDECREF(old[k]);
    }
    for (int k = 0; k < 5; k++)
        PyTuple_SET_ITEM(key, at + k, Py_NewRef(sig_cache[slot].fields[k]));
    return 0;
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

/* signature(node) -> (key, values) or None: see sim/signature.py. The key is made at its final size (a tuple
 * filled in place: 4 + 5 per input + 1 + 5 or 1 per next edge, + 1 with saved items). */
static PyObject *signature(PyObject *mod, PyObject *node) {
    PyObject *key = NULL, *op = NULL, *name = NULL, *dev = NULL, *dtype = NULL, *dindex = NULL, *metas = NULL,
             *next = NULL, *saved = NULL, *items = NULL, *values = NULL, *result = NULL, *fin = NULL, *fnext = NULL;
    if (!(op = node_get(node, NF_OP)) || !(name = node_get(node, NF_NAME)) ||
        !(dev = node_get(node, NF_DEVICE)) || !(dtype = PyObject_GetAttr(dev, s_type)) ||
        !(dindex = PyObject_GetAttr(dev, s_index)) || !(metas = node_get(node, NF_INPUTS)) ||
        !(fin = PySequence_Fast(metas, "a node's inputs are a list")) || !(next = node_get(node, NF_NEXT)) ||
        !(fnext = PySequence_Fast(next, "a node's next edges are a list")) || !(saved = node_get(node, NF_SAVED)))
        goto done;
    int truth = PyObject_IsTrue(saved);
    if (truth < 0)
        goto done;
    Py_ssize_t nin = PySequence_Fast_GET_SIZE(fin), nnext = PySequence_Fast_GET_SIZE(fnext);
    Py_ssize_t size = 4 + 5 * nin + 1 + truth;
    for (Py_ssize_t i = 0; i < nnext; i++)
        size += PySequence_Fast_GET_ITEM(fnext, i) == Py_None ? 1 : 5;
    if (truth) {  /* the saved items first: a node costed on its own (None) needs no key */
        if (!(items = PyList_New(0)) || !(values = PyList_New(0)))
            goto done;
        int r = sig_saved(saved, items, values);
        if (r < 0)
            goto done;
        if (r == 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    if (!(key = PyTuple_New(size)))
        goto done;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(op));
    PyTuple_SET_ITEM(key, 1, Py_NewRef(name));
    PyTuple_SET_ITEM(key, 2, Py_NewRef(dtype));
    PyTuple_SET_ITEM(key, 3, Py_NewRef(dindex));
    Py_ssize_t at = 4;
    for (Py_ssize_t i = 0; i < nin; i++, at += 5)
        if (sig_meta(key, at, PySequence_Fast_GET_ITEM(fin, i)) < 0)
            goto done;
    PyTuple_SET_ITEM(key, at++, Py_NewRef(SIG_OUTPUTS));
    for (Py_ssize_t i = 0; i < nnext; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(fnext, i);
        if (e == Py_None) {
            PyTuple_SET_ITEM(key, at++, Py_NewRef(Py_None));
            continue;
        }
        PyObject *meta = sig_edge_meta(e);
        int r = meta ? sig_meta(key, at, meta) : -1;
        Py_XDECREF(meta);
        if (r < 0)
            goto done;
        at += 5;
    }
    PyObject *tv;
    if (truth) {
        PyObject *ti = PyList_AsTuple(items);
        if (ti == NULL)
            goto done;
        PyTuple_SET_ITEM(key, at++, ti);
        tv = PyList_AsTuple(values);
    } else {
        tv = PyTuple_New(0);
    }
    if (tv != NULL) {
        result = PyTuple_Pack(2, key, tv);
        Py_DECREF(tv);
    }
done:
    Py_XDECREF(key);
    Py_XDECREF(op);
    Py_XDECREF(name);
    Py_XDECREF(dev);
    Py_XDECREF(dtype);
    Py_XDECREF(dindex);
    Py_XDECREF(metas);
    Py_XDECREF(fin);
    Py_XDECREF(next);
    Py_XDECREF(fnext);
    Py_XDECREF(saved);
    Py_XDECREF(items);
    Py_XDECREF(values);
    return result;
}

/* --- nodes alike: a key's cost found without the key --------------------------------------------------------
 * Nodes built alike have equal signature keys: the same op object and device object, the same name, the same
 * input meta objects (a loaded graph shares one InputMeta among all the slots that expect the same gradient), the
 * same meta objects at their next edges (None where the other has None), and saved items alike in their order
 * (equal names; a tensor spec -- an exact dict -- with equal shape and dtype against one; anything else against
 * anything else but a tensor spec, a list only of exact ints). Those are exactly what the key holds (see
 * signature() above and signature_py), so two nodes alike by this test have equal keys; a difference this test
 * does not look through (an equal device or meta in another object, a shape as a tuple against a list) says "not
 * alike", which only costs the caller the key. sig_alike(a, b): 1 alike, 0 not, -1 an exception. */
static int sig_alike_saved(PyObject *a, PyObject *b) {
    if (a == b)  /* one mapping: the same items (nodes with no saved values share the loader's empty one) */
        return 1;
    if (!PyDict_CheckExact(a) || !PyDict_CheckExact(b) || PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
        return 0;
    Py_ssize_t pa = 0, pb = 0;
    PyObject *ka, *va, *kb, *vb;
    while (PyDict_Next(a, &pa, &ka, &va)) {
        if (!PyDict_Next(b, &pb, &kb, &vb))
            return 0;
        if (ka != kb) {
            if (!PyUnicode_CheckExact(ka) || !PyUnicode_CheckExact(kb) || PyUnicode_Compare(ka, kb) != 0)
                return PyErr_Occurred() ? -1 : 0;
        }
        int da = PyDict_CheckExact(va), db = PyDict_CheckExact(vb);
        if (da != db)
            return 0;
        if (db) {
            PyObject *sa = PyDict_GetItemWithError(va, s_shape), *sb = sa ? PyDict_GetItemWithError(vb, s_shape) : NULL;
            if (sb == NULL || sb == Py_None || sa == Py_None || Py_TYPE(sa) != Py_TYPE(sb))
                return PyErr_Occurred() ? -1 : 0;
            int same = PyObject_RichCompareBool(sa, sb, Py_EQ);
            if (same <= 0)
                return same;
            PyObject *ta = PyDict_GetItemWithError(va, s_dtype);
            if (ta == NULL && PyErr_Occurred())
                return -1;
            PyObject *tb = PyDict_GetItemWithError(vb, s_dtype);
            if (tb == NULL && PyErr_Occurred())
                return -1;
            if ((ta == NULL) != (tb == NULL))
                return 0;
            if (ta != NULL && (same = PyObject_RichCompareBool(ta, tb, Py_EQ)) <= 0)
                return same;
        } else if (PyList_CheckExact(vb)) {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vb); i++)
                if (!PyLong_CheckExact(PyList_GET_ITEM(vb, i)))
                    return 0;  /* signature None: the node is costed on its own */
        }
    }
    return 1;
}

static int sig_alike(PyObject *a, PyObject *b) {
    PyObject *fa[4] = {NULL}, *fb[4] = {NULL};  /* op, name, inputs, next */
    PyObject *dev_a = NULL, *dev_b = NULL, *sa = NULL, *sb = NULL;
    static const int F[4] = {NF_OP, NF_NAME, NF_INPUTS, NF_NEXT};
    int r = -1;
    for (int k = 0; k < 4; k++)
        if (!(fa[k] = node_get(a, F[k])) || !(fb[k] = node_get(b, F[k])))
            goto done;
    r = 0;
    if (fa[0] != fb[0])
        goto done;
    if (fa[1] != fb[1]) {
        if (!PyUnicode_CheckExact(fa[1]) || !PyUnicode_CheckExact(fb[1]) || PyUnicode_Compare(fa[1], fb[1]) != 0) {
            r = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
    }
    r = -1;
    if (!(dev_a = node_get(a, NF_DEVICE)) || !(dev_b = node_get(b, NF_DEVICE)))
        goto done;
    r = 0;
    if (dev_a != dev_b || !PyList_CheckExact(fa[2]) || !PyList_CheckExact(fb[2]) || !PyList_CheckExact(fa[3]) ||
        !PyList_CheckExact(fb[3]) || PyList_GET_SIZE(fa[2]) != PyList_GET_SIZE(fb[2]) ||
        PyList_GET_SIZE(fa[3]) != PyList_GET_SIZE(fb[3]))
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fa[2]); i++)
        if (PyList_GET_ITEM(fa[2], i) != PyList_GET_ITEM(fb[2], i))
            goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fa[3]); i++) {
        PyObject *ea = PyList_GET_ITEM(fa[3], i), *eb = PyList_GET_ITEM(fb[3], i);
        if (ea == Py_None || eb == Py_None) {
            if (ea != eb)
                goto done;
            continue;
        }
        PyObject *ma = sig_edge_meta(ea), *mb = ma ? sig_edge_meta(eb) : NULL;
        int same = ma == mb;
        Py_XDECREF(ma);
        Py_XDECREF(mb);
        if (mb == NULL) {
            r = -1;
            goto done;
        }
        if (!same)
            goto done;
    }
    r = -1;
    if (!(sa = node_get(a, NF_SAVED)) || !(sb = node_get(b, NF_SAVED)))
        goto done;
    r = sig_alike_saved(sa, sb);
done:
    for (int k = 0; k < 4; k++) {
        Py_XDECREF(fa[k]);
        Py_XDECREF(fb[k]);
    }
    Py_XDECREF(dev_a);
    Py_XDECREF(dev_b);
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    return r;
}

/* Where a node would find its exemplar: by its op, its first input meta and its edge and input counts (nodes
 * alike agree on all of them); -1 with an exception. */
#define SIG_MEMO 32
static Py_ssize_t sig_memo_slot(PyObject *node) {
    PyObject *op = node_get(node, NF_OP), *ins = op ? node_get(node, NF_INPUTS) : NULL,
             *nxt = ins ? node_get(node, NF_NEXT) : NULL;
    Py_ssize_t slot = -1;
    if (nxt != NULL) {
        uintptr_t h = (uintptr_t)op >> 4;
        if (PyList_CheckExact(ins) && PyList_GET_SIZE(ins) > 0)
            h = h * 31 + ((uintptr_t)PyList_GET_ITEM(ins, 0) >> 4);
        h = h * 31 + (uintptr_t)(PyList_CheckExact(ins) ? PyList_GET_SIZE(ins) : 0);
        h = h * 31 + (uintptr_t)(PyList_CheckExact(nxt) ? PyList_GET_SIZE(nxt) : 0);
        slot = (Py_ssize_t)(h % SIG_MEMO);
    }
    Py_XDECREF(op);
    Py_XDECREF(ins);
    Py_XDECREF(nxt);
    return slot;
}
