/* Python twin: autograd_run/record/kernels.py (attr_codes), autograd_run/record/recording.py (_pair) and autograd_run/sim/result.py (sim_slices: _slice_columns_py; kernel_slices: _kernel_slices_py).
 * The Recording's loops over Python objects: attribute codes, the pairing of pushes, pops and node runs. Part of _core.c (included there, after core.h). */

/* ------------------------------------------------- summary helpers */

/* Two loops of the summary over Python objects (record/kernels.py is the twin). */

typedef struct {
    uint64_t *keys;  /* key + 1; 0 empty */
    int64_t *vals;
    size_t mask;
} U64Map;

static int u64map_init(U64Map *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 2)
        cap <<= 1;
    m->keys = PyMem_RawCalloc(cap, sizeof(uint64_t));
    m->vals = PyMem_RawMalloc(cap * sizeof(int64_t));
    m->mask = cap - 1;
    if (!m->keys || !m->vals) {
        PyMem_RawFree(m->keys);
        PyMem_RawFree(m->vals);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void u64map_free(U64Map *m) {
    PyMem_RawFree(m->keys);
    PyMem_RawFree(m->vals);
}

static inline size_t u64hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void u64map_put(U64Map *m, uint64_t key, int64_t val) {
    size_t h = u64hash(key) & m->mask;
    while (m->keys[h] != 0 && m->keys[h] != key + 1)
        h = (h + 1) & m->mask;
    m->keys[h] = key + 1;
    m->vals[h] = val;
}

static int64_t u64map_get(U64Map *m, uint64_t key) {
    size_t h = u64hash(key) & m->mask;
    while (m->keys[h] != 0) {
        if (m->keys[h] == key + 1)
            return m->vals[h];
        h = (h + 1) & m->mask;
    }
    return -1;
}

/* attr_codes(objs, name, identity) -> (int64 codes as bytes, distinct values): each object's
 * attribute `name` as the position of its value among the distinct values (in order of first
 * appearance), compared by identity or by equality. */
static PyObject *attr_codes(PyObject *mod, PyObject *args) {
    PyObject *objs, *name;
    int identity;
    if (!PyArg_ParseTuple(args, "O!Up", &PyList_Type, &objs, &name, &identity))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(objs);
    /* a Node field read from its slot where the table knows it */
    int field = name == s_op ? NF_OP : name == s_name ? NF_NAME : name == s_id ? NF_ID : -1;
    PyObject *data = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *values = PyList_New(0);
    PyObject *seen = PyDict_New();   /* value -> code (by equality) */
    U64Map ptrs = {0};               /* the address of each value in `values` -> its code */
    if (data == NULL || values == NULL || seen == NULL || u64map_init(&ptrs, n) < 0)
        goto fail;
    int64_t *codes = (int64_t *)PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PyList_GET_ITEM(objs, i);
        PyObject *v = field >= 0 ? node_get(obj, field) : PyObject_GetAttr(obj, name);
        if (v == NULL)
            goto fail;
        int64_t code = u64map_get(&ptrs, (uint64_t)(uintptr_t)v);
        if (code < 0 && !identity) { /* an equal value seen before, as another object */
            PyObject *c = PyDict_GetItemWithError(seen, v);
            if (c == NULL && PyErr_Occurred()) {
                Py_DECREF(v);
                goto fail;
            }
            if (c != NULL) /* (not remembered by address: names are mostly each node's own object) */
                code = PyLong_AsLongLong(c);
        }
        if (code < 0) {
            code = PyList_GET_SIZE(values);
            PyObject *c = PyLong_FromLongLong(code);
            int bad = c == NULL || (!identity && PyDict_SetItem(seen, v, c) < 0) || PyList_Append(values, v) < 0;
            Py_XDECREF(c);
            if (bad) {
                Py_DECREF(v);
                goto fail;
            }
            u64map_put(&ptrs, (uint64_t)(uintptr_t)v, code);
        }
        codes[i] = code;
        Py_DECREF(v);
    }
    Py_DECREF(seen);
    u64map_free(&ptrs);
    PyObject *out = PyTuple_Pack(2, data, values);
    Py_DECREF(data);
    Py_DECREF(values);
    return out;
fail:
    u64map_free(&ptrs);
    Py_XDECREF(data);
    Py_XDECREF(values);
    Py_XDECREF(seen);
    return NULL;
}

/* ------------------------------------------------ pair_common */

/* An int64 column written straight into the bytes object handed back (sized for the most rows it can
 * get, cut to the rows it got). */
typedef struct {
    PyObject *bytes;
    int64_t *v;
    Py_ssize_t n, cap;
} Col;

static int col_alloc(Col *c, Py_ssize_t cap) {
    c->bytes = PyBytes_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int64_t));
    if (c->bytes == NULL)
        return -1;
    c->v = (int64_t *)PyBytes_AS_STRING(c->bytes);
    c->cap = cap;
    c->n = 0;
    return 0;
}

static inline int col_push(Col *c, int64_t x) {
    if (c->n >= c->cap) { /* (the counting pass bounds every column) */
        PyErr_SetString(PyExc_RuntimeError, "pair_common: a column overflowed its bound");
        return -1;
    }
    c->v[c->n++] = x;
    return 0;
}

/* The column's bytes, cut to its rows (a new reference; the column lets go of it). */
static PyObject *col_bytes(Col *c) {
    PyObject *b = c->bytes;
    c->bytes = NULL;
    if (b != NULL && c->n * (Py_ssize_t)sizeof(int64_t) != PyBytes_GET_SIZE(b) &&
        _PyBytes_Resize(&b, c->n * (Py_ssize_t)sizeof(int64_t)) < 0)
        return NULL;
    return b;
}

/* pair_common(events, tid_of, n_nodes) -> None, or (samples, waits, slices, idles), each a tuple of int64
 * columns as bytes (samples: ts, tid, queue, gt, node, depth, pushed; waits: gt, node, queue, pushed, popped,
 * tid, push_row, pop_row; slices: gt, depth, node, tid, start, end, wait; idles: start, end, tid, queue,
 * waiting_for): record/recording._pair for the common case, in one pass (None where it does not hold:
 * then _pair's numpy path decides). The common case is _pairs_once's for the queue samples and for the
 * node starts and ends (one GraphTask among the rows with a node; each node pushed at most once and popped
 * at most once, after its push; started at most once and ended at most once, after its start, on the same
 * thread) and _slice_waits's (at least one wait, all of that GraphTask). */
enum { SC_TS, SC_TID, SC_QUEUE, SC_GT, SC_NODE, SC_DEPTH, SC_PUSHED, SC_N };
enum { WC_GT, WC_NODE, WC_QUEUE, WC_PUSHED, WC_POPPED, WC_TID, WC_PUSH_ROW, WC_POP_ROW, WC_N };
enum { LC_GT, LC_DEPTH, LC_NODE, LC_TID, LC_START, LC_END, LC_WAIT, LC_N };
enum { IC_START, IC_END, IC_TID, IC_QUEUE, IC_WAITING, IC_N };

static PyObject *pair_common(PyObject *mod, PyObject *args) {
    PyObject *evo, *tido;
    Py_ssize_t n_nodes;
    if (!PyArg_ParseTuple(args, "OOn", &evo, &tido, &n_nodes))
        return NULL;
    Py_buffer be, bt;
    if (PyObject_GetBuffer(evo, &be, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(tido, &bt, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&be);
        return NULL;
    }
    PyObject *result = NULL;
    Col sc[SC_N] = {{0}}, wc[WC_N] = {{0}}, lc[LC_N] = {{0}}, ic[IC_N] = {{0}};
    /* per node: the sample row of its push and pop, the event row of its start and end (-1: none yet);
     * its wait (index into the waits) and the event position of that wait's pop */
    int64_t *push_row = NULL, *pop_seen = NULL, *start_ev = NULL, *end_seen = NULL, *wait_of = NULL,
            *wait_pos = NULL;
    Py_ssize_t m = be.len / (Py_ssize_t)sizeof(Event), nt = bt.len / 8;
    const Event *ev = be.buf;
    const int64_t *tid_of = bt.buf;
    int common = be.len % (Py_ssize_t)sizeof(Event) == 0 && n_nodes >= 0;
    if (common) {
        size_t k = (size_t)(n_nodes ? n_nodes : 1) * sizeof(int64_t);
        push_row = PyMem_RawMalloc(k), pop_seen = PyMem_RawMalloc(k), start_ev = PyMem_RawMalloc(k);
        end_seen = PyMem_RawMalloc(k), wait_of = PyMem_RawMalloc(k), wait_pos = PyMem_RawMalloc(k);
        if (!push_row || !pop_seen || !start_ev || !end_seen || !wait_of || !wait_pos) {
            PyErr_NoMemory();
            goto done;
        }
        memset(push_row, 0xff, k), memset(pop_seen, 0xff, k), memset(start_ev, 0xff, k);
        memset(end_seen, 0xff, k), memset(wait_of, 0xff, k);
    }
    /* bounds: every push/pop is a sample, a pop at most one wait, an end at most one slice */
    Py_ssize_t n_samples = 0, n_pops = 0, n_ends = 0, n_idles = 0;
    for (Py_ssize_t i = 0; common && i < m; i++) {
        uint8_t k = ev[i].kind;
        n_samples += k == EV_PUSH || k == EV_POP;
        n_pops += k == EV_POP;
        n_ends += k == EV_END;
        n_idles += k == EV_IDLE;
    }
    for (int c = 0; common && c < SC_N; c++)
        if (col_alloc(&sc[c], n_samples) < 0)
            goto done;
    for (int c = 0; common && c < WC_N; c++)
        if (col_alloc(&wc[c], n_pops) < 0)
            goto done;
    for (int c = 0; common && c < LC_N; c++)
        if (col_alloc(&lc[c], n_ends) < 0)
            goto done;
    for (int c = 0; common && c < IC_N; c++)
        if (col_alloc(&ic[c], n_idles) < 0)
            goto done;
    int64_t gt_s = 0, gt_l = 0;
    int have_s = 0, have_l = 0;
    Py_ssize_t srow = 0;
    for (Py_ssize_t i = 0; common && i < m; i++) {
        const Event *e = &ev[i];
        if (e->thread >= nt) {
            common = 0;
            break;
        }
        int64_t tid = tid_of[e->thread], node = e->node;
        if (node >= n_nodes) {
            common = 0;
            break;
        }
        if (e->kind == EV_PUSH || e->kind == EV_POP) {
            int pushed = e->kind == EV_PUSH;
            if (col_push(&sc[SC_TS], e->ts) < 0 || col_push(&sc[SC_TID], tid) < 0 ||
                col_push(&sc[SC_QUEUE], e->queue) < 0 || col_push(&sc[SC_GT], e->a) < 0 ||
                col_push(&sc[SC_NODE], node) < 0 || col_push(&sc[SC_DEPTH], e->b) < 0 ||
                col_push(&sc[SC_PUSHED], pushed) < 0)
                goto done;
            if (node >= 0) {
                if (have_s && e->a != gt_s) {
                    common = 0;
                    break;
                }
                gt_s = e->a, have_s = 1;
                if (pushed) {
                    if (push_row[node] >= 0 || pop_seen[node] >= 0) { /* pushed twice, or popped first */
                        common = 0;
                        break;
                    }
                    push_row[node] = srow;
                } else {
                    Py_ssize_t p = push_row[node];
                    if (pop_seen[node] >= 0 || p < 0) { /* popped twice, or before its push */
                        common = 0;
                        break;
                    }
                    pop_seen[node] = srow;
                    int64_t w = wc[WC_GT].n;
                    if (col_push(&wc[WC_GT], e->a) < 0 || col_push(&wc[WC_NODE], node) < 0 ||
                        col_push(&wc[WC_QUEUE], sc[SC_QUEUE].v[p]) < 0 || col_push(&wc[WC_PUSHED], sc[SC_TS].v[p]) < 0 ||
                        col_push(&wc[WC_POPPED], e->ts) < 0 || col_push(&wc[WC_TID], tid) < 0 ||
                        col_push(&wc[WC_PUSH_ROW], p) < 0 || col_push(&wc[WC_POP_ROW], srow) < 0)
                        goto done;
                    wait_of[node] = w;
                    wait_pos[node] = i;
                }
            }
            srow++;
        } else if (e->kind == EV_START || e->kind == EV_END) {
            if (node < 0) {
                common = 0; /* (a start or end without a node: the general pairing's) */
                break;
            }
            if (have_l && e->a != gt_l) {
                common = 0;
                break;
            }
            gt_l = e->a, have_l = 1;
            if (e->kind == EV_START) {
                if (start_ev[node] >= 0 || end_seen[node] >= 0) {
                    common = 0;
                    break;
                }
                start_ev[node] = i;
            } else {
                Py_ssize_t st = start_ev[node];
                if (end_seen[node] >= 0 || st < 0 || tid_of[ev[st].thread] != tid) {
                    common = 0;
                    break;
                }
                end_seen[node] = i;
                /* its wait: the node's, if popped before this end */
                int64_t w = wait_of[node] >= 0 && wait_pos[node] < i ? wait_of[node] : -1;
                if (col_push(&lc[LC_GT], e->a) < 0 || col_push(&lc[LC_DEPTH], ev[st].b) < 0 ||
                    col_push(&lc[LC_NODE], node) < 0 || col_push(&lc[LC_TID], tid) < 0 ||
                    col_push(&lc[LC_START], ev[st].ts) < 0 || col_push(&lc[LC_END], e->ts) < 0 ||
                    col_push(&lc[LC_WAIT], w) < 0)
                    goto done;
            }
        } else if (e->kind == EV_IDLE) {
            if (col_push(&ic[IC_START], e->ts) < 0 || col_push(&ic[IC_END], e->a) < 0 ||
                col_push(&ic[IC_TID], tid) < 0 || col_push(&ic[IC_QUEUE], e->queue) < 0 ||
                col_push(&ic[IC_WAITING], e->b) < 0)
                goto done;
        }
    }
    /* _slice_waits's common case: some wait, one GraphTask for the waits and the slices */
    if (common && (wc[WC_GT].n == 0 || (lc[LC_GT].n && gt_l != gt_s)))
        common = 0;
    if (!common) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    {
        Col *groups[4] = {sc, wc, lc, ic};
        int sizes[4] = {SC_N, WC_N, LC_N, IC_N};
        PyObject *out = PyTuple_New(4);
        for (int g = 0; out && g < 4; g++) {
            PyObject *t = PyTuple_New(sizes[g]);
            for (int c = 0; t && c < sizes[g]; c++) {
                PyObject *b = col_bytes(&groups[g][c]);
                if (b == NULL)
                    Py_CLEAR(t);
                else
                    PyTuple_SET_ITEM(t, c, b);
            }
            if (t == NULL)
                Py_CLEAR(out);
            else
                PyTuple_SET_ITEM(out, g, t);
        }
        result = out;
    }
done:
    for (int c = 0; c < SC_N; c++)
        Py_XDECREF(sc[c].bytes);
    for (int c = 0; c < WC_N; c++)
        Py_XDECREF(wc[c].bytes);
    for (int c = 0; c < LC_N; c++)
        Py_XDECREF(lc[c].bytes);
    for (int c = 0; c < IC_N; c++)
        Py_XDECREF(ic[c].bytes);
    PyMem_RawFree(push_row), PyMem_RawFree(pop_seen), PyMem_RawFree(start_ev);
    PyMem_RawFree(end_seen), PyMem_RawFree(wait_of), PyMem_RawFree(wait_pos);
    PyBuffer_Release(&be);
    PyBuffer_Release(&bt);
    return result;
}

/* ------------------------------------------------- a simulation's slices */

/* obj's code in `table` (a dict obj -> int code), added as the next code when new; `order` gets each new obj. */
static int64_t code_in(PyObject *table, PyObject *order, PyObject *obj) {
    PyObject *c = PyDict_GetItemWithError(table, obj);
    if (c != NULL)
        return PyLong_AsLongLong(c);
    if (PyErr_Occurred())
        return -2;
    Py_ssize_t k = PyList_GET_SIZE(order);
    PyObject *v = PyLong_FromSsize_t(k);
    int r = v ? PyDict_SetItem(table, obj, v) : -1;
    Py_XDECREF(v);
    if (r < 0 || PyList_Append(order, obj) < 0)
        return -2;
    return k;
}

/* Whether a type's objects equal only themselves and hash by address (object's own __eq__ and __hash__: a Node,
 * identity-hashed): told apart by address, as a dict tells them apart, without the dict. */
static inline int identity_type(PyTypeObject *t) {
    return t->tp_richcompare == PyBaseObject_Type.tp_richcompare && t->tp_hash == PyBaseObject_Type.tp_hash;
}

/* A slice's node code: -1 for None; its row in `nodes`, added when new: by address (`by_address`) for an
 * identity_type, else by `table` (a dict's equality). -2 and an exception where that fails. */
static int64_t node_code(PyObject *node, PyObject *nodes, PyObject *table, PtrRows *by_address) {
    if (node == Py_None)
        return -1;
    if (!identity_type(Py_TYPE(node)))
        return code_in(table, nodes, node);
    Py_ssize_t next = PyList_GET_SIZE(nodes), row = ptr_row_add(by_address, node, next);
    return row == next && PyList_Append(nodes, node) < 0 ? -2 : row;
}

/* sim_slices(slices) -> (nodes, node codes, gt, depth, tid, start, end, queues, queue codes, pushed): the columns of
 * a simulation's slices (a list, or a SliceLog, whose columns are read as they are), each (gt, depth, node, tid, start, end, queue or None, pushed or None): the distinct
 * nodes and queue names in order of first appearance (a dict's equality; None is no queue: code -1) and int64
 * columns as bytes (pushed 0 where there is no queue; a None node is code -1). Nodes of an identity_type are
 * coded by address (PtrRows: no dict entry and int per node, 0.34 s at a million nodes); others by a dict.
 * sim/result.py's _slice_columns_py is the twin. */
static PyObject *sim_slices(PyObject *mod, PyObject *arg) {
    SliceLogObject *L = Py_IS_TYPE(arg, &SliceLogType) ? (SliceLogObject *)arg : NULL;
    if (L == NULL && !PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "sim_slices(list of slices, or a SliceLog)");
        return NULL;
    }
    Py_ssize_t n = L ? L->n : PyList_GET_SIZE(arg);
    /* a SliceLog's kinds: their gt, depth, tid and queue code, read at the first slice of each (-2: not yet) */
    Py_ssize_t nk = L ? L->nkinds : 0;
    int64_t *kv = nk ? PyMem_Malloc(nk * 4 * sizeof(int64_t)) : NULL;
    if (nk && kv == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < nk; k++)
        kv[4 * k + 3] = -2;
    enum { C_NODE, C_GT, C_DEPTH, C_TID, C_START, C_END, C_QUEUE, C_PUSHED, C_N };
    PyObject *col[C_N] = {NULL}, *nodes = PyList_New(0), *queues = PyList_New(0);
    PyObject *node_tab = PyDict_New(), *queue_tab = PyDict_New(), *result = NULL;
    PtrRows by_address = {0};
    if (!nodes || !queues || !node_tab || !queue_tab || ptr_rows_init(&by_address, n) < 0)
        goto done;
    int64_t *c[C_N];
    for (int k = 0; k < C_N; k++) {
        if ((col[k] = PyBytes_FromStringAndSize(NULL, n * 8)) == NULL)
            goto done;
        c[k] = (int64_t *)PyBytes_AS_STRING(col[k]);
    }
    static const int ints[] = {C_GT, C_DEPTH, -1, C_TID, C_START, C_END}; /* tuple place -> column */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s;
        if (L != NULL && L->kind[i] != SL_ODD) { /* the columns as they are, the kind's fields read once */
            uint32_t k = L->kind[i];
            SliceKind *sk = &L->kinds[k];
            int64_t *v = &kv[4 * k];
            if (v[3] == -2) {
                PyObject *f[3] = {sk->gid, sk->depth, sk->tid};
                for (int j = 0; j < 3; j++)
                    if ((v[j] = PyLong_AsLongLong(f[j])) == -1 && PyErr_Occurred())
                        goto done;
                if (sk->queue == Py_None)
                    v[3] = -1;
                else if (sk->no_push) { /* a queued slice without a push time: the error the tuple's read gives */
                    PyLong_AsLongLong(Py_None);
                    goto done;
                } else if ((v[3] = code_in(queue_tab, queues, sk->queue)) < 0)
                    goto done;
            }
            c[C_GT][i] = v[0], c[C_DEPTH][i] = v[1], c[C_TID][i] = v[2];
            c[C_START][i] = L->start[i], c[C_END][i] = L->end[i];
            c[C_QUEUE][i] = v[3];
            c[C_PUSHED][i] = v[3] < 0 ? 0 : L->pushed[i];
            if ((c[C_NODE][i] = node_code(L->node[i], nodes, node_tab, &by_address)) < -1)
                goto done;
            continue;
        }
        if (L != NULL) { /* a slice kept as it was given */
            PyObject *key = PyLong_FromSsize_t(i);
            s = key ? PyDict_GetItemWithError(L->odd, key) : NULL;
            Py_XDECREF(key);
            if (s == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "SliceLog: an odd slice is missing");
                goto done;
            }
        } else
            s = PyList_GET_ITEM(arg, i);
        if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 8) {
            PyErr_SetString(PyExc_TypeError, "sim_slices: a slice is an 8-tuple");
            goto done;
        }
        for (int f = 0; f < 6; f++) {
            if (ints[f] < 0)
                continue;
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(s, f));
            if (v == -1 && PyErr_Occurred())
                goto done;
            c[ints[f]][i] = v;
        }
        if ((c[C_NODE][i] = node_code(PyTuple_GET_ITEM(s, 2), nodes, node_tab, &by_address)) < -1)
            goto done;
        PyObject *q = PyTuple_GET_ITEM(s, 6);
        c[C_QUEUE][i] = c[C_PUSHED][i] = 0;
        if (q == Py_None) {
            c[C_QUEUE][i] = -1;
            continue;
        }
        if ((c[C_QUEUE][i] = code_in(queue_tab, queues, q)) < 0)
            goto done;
        long long p = PyLong_AsLongLong(PyTuple_GET_ITEM(s, 7));
        if (p == -1 && PyErr_Occurred())
            goto done;
        c[C_PUSHED][i] = p;
    }
    result = PyTuple_Pack(10, nodes, col[C_NODE], col[C_GT], col[C_DEPTH], col[C_TID], col[C_START], col[C_END],
                          queues, col[C_QUEUE], col[C_PUSHED]);
done:
    for (int k = 0; k < C_N; k++)
        Py_XDECREF(col[k]);
    Py_XDECREF(nodes);
    Py_XDECREF(queues);
    Py_XDECREF(node_tab);
    Py_XDECREF(queue_tab);
    ptr_rows_free(&by_address);
    PyMem_Free(kv);
    return result;
}

/* kernel_slices(kernels, cls, name_of) -> [cls(name_of(stream), node, start, end) for each (stream, node, start, end)
 * of `kernels`], in order: `cls` a tuple type of four fields (KernelSlice, a NamedTuple: made as tuple_subtype_new
 * makes one, by its tp_alloc, without a call to its Python __new__); `name_of` called once per distinct stream
 * object, told apart by identity (the simulator shares one object per stream; all of them are alive in `kernels`,
 * so no address is reused meanwhile). sim/result.py's _kernel_slices_py is the twin. */
static PyObject *kernel_slices(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyType_Check(args[1])
        || !PyType_IsSubtype((PyTypeObject *)args[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "kernel_slices(list of kernels, a tuple type, name_of)");
        return NULL;
    }
    PyObject *kernels = args[0], *name_of = args[2];
    PyTypeObject *cls = (PyTypeObject *)args[1];
    Py_ssize_t n = PyList_GET_SIZE(kernels);
    PyObject *out = PyList_New(n), *names = PyDict_New();  /* names: the stream's address -> its name */
    PyObject *last_stream = NULL, *last_name = NULL;  /* borrowed: the stream from `kernels`, its name from names */
    if (out == NULL || names == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(kernels, i);
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 4) {
            PyErr_SetString(PyExc_TypeError, "kernel_slices: a kernel is a 4-tuple");
            goto fail;
        }
        PyObject *stream = PyTuple_GET_ITEM(k, 0);
        if (stream != last_stream) {
            PyObject *key = PyLong_FromVoidPtr(stream);
            if (key == NULL)
                goto fail;
            PyObject *name = PyDict_GetItemWithError(names, key);
            if (name == NULL) {
                if (PyErr_Occurred() || (name = PyObject_CallOneArg(name_of, stream)) == NULL) {
                    Py_DECREF(key);
                    goto fail;
                }
                int r = PyDict_SetItem(names, key, name);
                Py_DECREF(name);  /* names holds it */
                if (r < 0) {
                    Py_DECREF(key);
                    goto fail;
                }
            }
            Py_DECREF(key);
            last_stream = stream;
            last_name = name;
        }
        PyObject *slice = cls->tp_alloc(cls, 4);
        if (slice == NULL)
            goto fail;
        PyTuple_SET_ITEM(slice, 0, Py_NewRef(last_name));
        for (int f = 1; f < 4; f++)
            PyTuple_SET_ITEM(slice, f, Py_NewRef(PyTuple_GET_ITEM(k, f)));
        PyList_SET_ITEM(out, i, slice);
    }
    Py_DECREF(names);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(names);
    return NULL;
}
