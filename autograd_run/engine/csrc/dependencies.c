/* Python twin: autograd_run/engine/graph_task.py (compute_dependencies).
 * A GraphTask's dependency counts. Part of _core.c (included there, after core.h). */

/* ------------------------------------------------ compute_dependencies */

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
    while (n && ok) {
        PyObject *fn = stack[--n];
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
    Py_DECREF(one);
    PyMem_Free(stack);
    return ok ? Py_NewRef(Py_None) : NULL;
}
