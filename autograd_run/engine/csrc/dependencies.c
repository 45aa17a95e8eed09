/* Python twin: autograd_run/engine/graph_task.py (compute_dependencies).
 * A GraphTask's dependency counts. Part of _core.c (included there, after core.h). */

/* ------------------------------------------------ compute_dependencies */

#define DEP_BATCH 16
/* (bytes: a batch of nodes within this span of memory is not fetched ahead) */
#define DEP_NEAR (64 * 1024)

/* The raw slot f of node `o` (borrowed, unchecked beyond its type), or NULL. */
static inline PyObject *raw_node_slot(PyObject *o, int f) {
    return o != NULL && Py_TYPE(o) == NODE_SLOTS.type ? *(PyObject **)((char *)o + NODE_SLOTS.offsets[f]) : NULL;
}

/* Fetch ahead what compute_dependencies reads for each node of `batch` and each of its edges, a level at a time
 * for the whole batch (each level's addresses are read from the one before): the nodes; their topological
 * numbers and next lists; the lists' items; the edges; their targets; the targets' indexes; the targets' slots
 * in `m`. Reads only objects' own fields (no call, no reference taken); anything not laid out as the loader
 * makes it is left to the loop. */
static void prefetch_batch(PyObject **batch, Py_ssize_t k, NodeMapObject *m) {
    /* nodes that lie together (a chain's, an MLP's: made in the file's order, met in about that order) are
     * read fast as they are: left alone */
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (Py_ssize_t b = 0; b < k; b++) {
        uintptr_t a = (uintptr_t)batch[b];
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
    }
    if (hi - lo < DEP_NEAR)
        return;
    for (Py_ssize_t b = 0; b < k; b++)
        __builtin_prefetch(batch[b]);
    for (Py_ssize_t b = 0; b < k; b++) {
        PyObject *topo = raw_node_slot(batch[b], NF_TOPO), *next = raw_node_slot(batch[b], NF_NEXT);
        if (topo != NULL)
            __builtin_prefetch(topo);
        if (next != NULL)
            __builtin_prefetch(next);
    }
    for (Py_ssize_t b = 0; b < k; b++) {
        PyObject *next = raw_node_slot(batch[b], NF_NEXT);
        if (next != NULL && PyList_CheckExact(next))
            __builtin_prefetch(((PyListObject *)next)->ob_item);
    }
    for (int level = 0; level < 4; level++)
        for (Py_ssize_t b = 0; b < k; b++) {
            PyObject *next = raw_node_slot(batch[b], NF_NEXT);
            if (next == NULL || !PyList_CheckExact(next))
                continue;
            Py_ssize_t size = PyList_GET_SIZE(next);
            for (Py_ssize_t j = 0; j < size && j < 8; j++) {
                PyObject *e = PyList_GET_ITEM(next, j);
                if (level == 0) {
                    __builtin_prefetch(e);
                    continue;
                }
                if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 1)
                    continue;
                PyObject *t = PyTuple_GET_ITEM(e, 0);
                if (level == 1) {
                    __builtin_prefetch(t);
                } else if (level == 2) {
                    PyObject *idx = raw_node_slot(t, NF_INDEX);
                    if (idx != NULL)
                        __builtin_prefetch(idx);
                } else if (m->keys != NULL) {
                    Py_ssize_t i = nm_slot(m, t);
                    if (i >= 0) {
                        __builtin_prefetch(&m->keys[i]);
                        __builtin_prefetch(&m->values[i]);
                    }
                }
            }
        }
}

/* compute_dependencies(root, dependencies, min_topo_nr): graph_task.compute_dependencies_py, compiled:
 * for every node reachable from root, the number of edges that lead into it (an iterative DFS that
 * does not expand nodes below min_topo_nr), counted into `dependencies`, a dict or a NodeMap (node_map.c). A node is new (to be
 * expanded) when the dict does not hold it yet: every node but the root gets there through an edge, and
 * the root has none leading into it (the graph is acyclic), so the dict is also the DFS's seen set.
 * The stack is a C array of strong references. */
static PyObject *compute_dependencies(PyObject *mod, PyObject *args) {
    PyObject *root, *deps;
    long long min_topo;
    if (!PyArg_ParseTuple(args, "OOL", &root, &deps, &min_topo))
        return NULL;
    if (!map_check(deps)) {
        PyErr_SetString(PyExc_TypeError, "compute_dependencies: dependencies must be a dict or a NodeMap");
        return NULL;
    }
    int slots = Py_IS_TYPE(deps, &NodeMapType);
    Py_ssize_t cap = 256, n = 0;
    PyObject **stack = PyMem_Malloc(cap * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[n++] = Py_NewRef(root);
    PyObject *one = PyLong_FromLong(1); /* (a cached small int: never fails) */
    int ok = 1;
    /* With a NodeMap (its order is the slots', not the order entries went in) the nodes are taken from the stack
     * DEP_BATCH at a time and what each step reads is fetched ahead for the whole batch (prefetch_batch): a random
     * DAG's nodes, their next lists, their targets' indexes and slots lie anywhere in memory, and the batch's
     * misses overlap instead of coming one after the other. The counts do not depend on the order. */
    PyObject *batch[DEP_BATCH];
    Py_ssize_t left = 0; /* the batch's nodes not taken on yet: batch[0..left-1], the top of the stack last */
    while ((n || left) && ok) {
        if (left == 0) {
            left = slots ? (n < DEP_BATCH ? n : DEP_BATCH) : 1;
            n -= left;
            memcpy(batch, stack + n, left * sizeof(PyObject *));
            if (left > 1)
                prefetch_batch(batch, left, (NodeMapObject *)deps);
        }
        PyObject *fn = batch[--left]; /* (the stack's order: the node pushed last first) */
        PyObject *tv = node_get(fn, NF_TOPO);
        long long topo = tv ? PyLong_AsLongLong(tv) : -1;
        Py_XDECREF(tv);
        if (topo == -1 && PyErr_Occurred()) {
            Py_DECREF(fn);
            ok = 0;
            break;
        }
        if (topo < min_topo) {
            Py_DECREF(fn);
            continue;
        }
        PyObject *next = node_get(fn, NF_NEXT);
        Py_DECREF(fn);
        PyObject *fast = next ? PySequence_Fast(next, "next edges must be a sequence") : NULL;
        Py_XDECREF(next);
        if (fast == NULL) {
            ok = 0;
            break;
        }
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
            PyObject *e = PySequence_Fast_GET_ITEM(fast, i);
            if (e == Py_None)
                continue;
            PyObject *nxt = PyTuple_Check(e) && PyTuple_GET_SIZE(e) > 0 ? Py_NewRef(PyTuple_GET_ITEM(e, 0))
                                                                         : PyObject_GetAttr(e, s_node);
            if (nxt == NULL) {
                ok = 0;
                break;
            }
            /* one probe for a node met the first time (half the edges of a DAG): its count of 1 goes in */
            PyObject *count; /* borrowed */
            int seen;
            if (slots) {
                count = nm_get((NodeMapObject *)deps, nxt);
                seen = count != NULL;
                if (count == NULL && (PyErr_Occurred() || nm_set((NodeMapObject *)deps, nxt, one) < 0)) {
                    Py_DECREF(nxt);
                    ok = 0;
                    break;
                }
            } else {
                Py_ssize_t before = PyDict_GET_SIZE(deps);
                count = PyDict_SetDefault(deps, nxt, one);
                if (count == NULL) {
                    Py_DECREF(nxt);
                    ok = 0;
                    break;
                }
                seen = PyDict_GET_SIZE(deps) == before;
            }
            if (seen) {  /* seen before: counted once more, not expanded again */
                long c = PyLong_AsLong(count);
                PyObject *nc = c == -1 && PyErr_Occurred() ? NULL : PyLong_FromLong(c + 1);
                int bad = nc == NULL || map_set(deps, nxt, nc) < 0;
                Py_XDECREF(nc);
                Py_DECREF(nxt);
                if (bad) {
                    ok = 0;
                    break;
                }
                continue;
            }
            if (n == cap) {
                PyObject **grown = PyMem_Realloc(stack, 2 * cap * sizeof(PyObject *));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    Py_DECREF(nxt);
                    ok = 0;
                    break;
                }
                stack = grown;
                cap *= 2;
            }
            stack[n++] = nxt;  /* the reference taken above */
        }
        Py_DECREF(fast);
    }
    while (n)
        Py_DECREF(stack[--n]);
    while (left) /* (a batch's nodes not taken on after an error) */
        Py_DECREF(batch[--left]);
    Py_DECREF(one);
    PyMem_Free(stack);
    return ok ? Py_NewRef(Py_None) : NULL;
}
