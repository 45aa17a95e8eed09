/* Python twin: autograd_run/analysis/streams.py (stream_walk_py).
 * stream_walk: the walk of the critical path through threads and streams, back from the run's last end, one
 * step per item on it, over the int64 columns analysis.streams._path makes. Part of _core.c (included there,
 * after core.h). Reads only; the GIL is held throughout. */

enum { W_KS, W_KE, W_KC, W_KP, W_KL, W_KQ, W_COMM, W_SS, W_SE, W_ST, W_SP, W_SG, W_SN, W_S_OFF, W_S_ITEMS, W_S_ENDS,
       W_S_BEST, W_T_OFF, W_T_ITEMS, W_W_OFF, W_W_TS, W_W_SRC, W_E_BOUNDS, W_E_SRC, W_N_BOUNDS, W_N_SLICES, W_COUNT };

/* bisect.bisect_right over a[0:n] (the same steps on a list that is not quite sorted). */
static Py_ssize_t walk_bisect_right(const int64_t *a, Py_ssize_t n, int64_t x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* What a step was (a new reference): the node itself (StreamReport.path labels it "{id} {name}" when read), or
 * its name alone (a collective's kernel). */
static PyObject *walk_label(PyObject *node, int name_only) {
    return name_only ? PyObject_GetAttr(node, s_name) : Py_NewRef(node);
}

/* Append (kind, label, ns) to steps; steals `label` (NULL: an error already set). */
static int walk_step(PyObject *steps, PyObject *kind, PyObject *label, long long ns) {
    PyObject *v = label ? PyLong_FromLongLong(ns) : NULL;
    PyObject *t = v ? PyTuple_Pack(3, kind, label, v) : NULL;
    Py_XDECREF(v);
    Py_XDECREF(label);
    int r = t ? PyList_Append(steps, t) : -1;
    Py_XDECREF(t);
    return r;
}

/* stream_walk(arrays, k_nodes, nodes, at, t_end, limit) -> (steps root to end, cpu ns, kernel ns, wait ns); a step is
 * (kind, what, ns) as analysis/streams.py StreamReport.steps holds it */
static PyObject *stream_walk(PyObject *mod, PyObject *args) {
    PyObject *arrays, *k_nodes, *nodes;
    Py_ssize_t at, limit;
    long long t_end;
    if (!PyArg_ParseTuple(args, "O!O!O!nLn", &PyTuple_Type, &arrays, &PyList_Type, &k_nodes, &PyList_Type, &nodes,
                          &at, &t_end, &limit))
        return NULL;
    if (PyTuple_GET_SIZE(arrays) != W_COUNT) {
        PyErr_SetString(PyExc_ValueError, "stream_walk: the 26 columns of analysis.streams._path");
        return NULL;
    }
    Py_buffer b[W_COUNT];
    const int64_t *a[W_COUNT];
    Py_ssize_t len[W_COUNT];
    int got = 0;
    PyObject *steps = NULL, *result = NULL, *kernel_s = NULL, *cpu_s = NULL, *wait_s = NULL, *empty = NULL;
    unsigned long long *stamp = NULL;
    for (; got < W_COUNT; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(arrays, got), &b[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        if (b[got].itemsize != 8 || b[got].format == NULL || (strcmp(b[got].format, "l") && strcmp(b[got].format, "q"))) {
            got++;
            PyErr_SetString(PyExc_TypeError, "stream_walk: the columns are int64");
            goto done;
        }
        a[got] = (const int64_t *)b[got].buf;
        len[got] = b[got].len / 8;
    }
    Py_ssize_t n_k = len[W_KS], n_s = len[W_SS], n_streams = len[W_S_OFF] - 1, n_threads = len[W_T_OFF] - 1;
    Py_ssize_t n_nodes = len[W_E_BOUNDS] - 1;
    /* the sizes the walk's indexing relies on */
    int ok = n_streams >= 0 && n_threads >= 0 && n_nodes >= 0 && len[W_N_BOUNDS] == n_nodes + 1 &&
             len[W_W_OFF] == n_streams + 1 && PyList_GET_SIZE(k_nodes) == n_k && PyList_GET_SIZE(nodes) == n_nodes;
    for (int c = W_KE; ok && c <= W_COMM; c++)
        ok = len[c] == n_k;
    for (int c = W_SE; ok && c <= W_SN; c++)
        ok = len[c] == n_s;
    ok = ok && len[W_S_ITEMS] == len[W_S_ENDS] && len[W_S_ITEMS] == len[W_S_BEST] && len[W_W_TS] == len[W_W_SRC];
    if (ok)
        ok = a[W_S_OFF][n_streams] == len[W_S_ITEMS] && a[W_T_OFF][n_threads] == len[W_T_ITEMS] &&
             a[W_W_OFF][n_streams] == len[W_W_TS] && a[W_E_BOUNDS][n_nodes] == len[W_E_SRC] &&
             a[W_N_BOUNDS][n_nodes] == len[W_N_SLICES];
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "stream_walk: columns of inconsistent lengths");
        goto done;
    }
    if ((stamp = PyMem_Calloc(n_streams ? n_streams : 1, sizeof *stamp)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    kernel_s = PyUnicode_InternFromString("kernel");
    cpu_s = kernel_s ? PyUnicode_InternFromString("cpu") : NULL;
    wait_s = cpu_s ? PyUnicode_InternFromString("wait") : NULL;
    empty = wait_s ? PyUnicode_FromString("") : NULL;
    if ((steps = empty ? PyList_New(0) : NULL) == NULL)
        goto done;
#define IN(i, n) ((i) >= 0 && (i) < (n))
#define CHECK(cond)                                                                    \
    if (!(cond)) {                                                                     \
        PyErr_SetString(PyExc_ValueError, "stream_walk: an index out of its column"); \
        goto done;                                                                     \
    }
    long long cpu_ns = 0, gpu_ns = 0, wait_ns = 0;
    Py_ssize_t seen = 0;
    CHECK(IN(at, n_k + n_s));
    while (seen < limit) {
        seen++;
        long long a_start, best_t = 0;
        int has_best = 0;
        Py_ssize_t nxt = -1;
        if (at < n_k) {
            Py_ssize_t k = at;
            a_start = a[W_KS][k];
            if (walk_step(steps, kernel_s, walk_label(PyList_GET_ITEM(k_nodes, k), a[W_COMM][k] != 0),
                          t_end - a_start) < 0)
                goto done;
            gpu_ns += t_end - a_start;
            int64_t sc = a[W_KC][k], j = a[W_KP][k];
            CHECK(IN(sc, n_streams));
            int64_t base = a[W_S_OFF][sc], count = a[W_S_OFF][sc + 1] - base;
            CHECK(base >= 0 && count >= 0 && base + count <= len[W_S_ITEMS] && j >= 0 && j <= count);
            int64_t prev = -1;
            if (j) {
                prev = a[W_S_ITEMS][base + j - 1];
                CHECK(IN(prev, n_k));
                if (a[W_KE][prev] <= a_start) {
                    best_t = a[W_KE][prev], nxt = prev, has_best = 1;
                }
            }
            int64_t wl = a[W_W_OFF][sc], wh = a[W_W_OFF][sc + 1];
            if (wh > wl) {
                CHECK(wl >= 0 && wh <= len[W_W_TS]);
                const int64_t *ts = a[W_W_TS] + wl;
                Py_ssize_t lo = walk_bisect_right(ts, wh - wl, j ? a[W_KQ][prev] : -1);
                Py_ssize_t hi = walk_bisect_right(ts, wh - wl, a[W_KQ][k]);
                for (Py_ssize_t w = lo; w < hi; w++) {
                    int64_t o = a[W_W_SRC][wl + w];
                    if (o < 0)
                        continue;
                    CHECK(IN(o, n_streams));
                    if (stamp[o] == (unsigned long long)seen) /* each recording stream once, first seen first */
                        continue;
                    stamp[o] = (unsigned long long)seen;
                    int64_t ob = a[W_S_OFF][o], on = a[W_S_OFF][o + 1] - ob;
                    if (on == 0)
                        continue;
                    CHECK(ob >= 0 && on > 0 && ob + on <= len[W_S_ITEMS]);
                    const int64_t *es = a[W_S_ENDS] + ob;
                    Py_ssize_t i = walk_bisect_right(es, on, a_start) - 1;
                    while (i >= 0 && es[i] > a_start)
                        i--;
                    if (i >= 0) {
                        i = a[W_S_BEST][ob + i];
                        CHECK(IN(i, on));
                        if (es[i] <= a_start && (!has_best || es[i] > best_t)) {
                            best_t = es[i], nxt = a[W_S_ITEMS][ob + i], has_best = 1;
                        }
                    }
                }
            }
            int64_t launch = a[W_KL][k];
            if (launch >= 0) {
                CHECK(IN(launch, n_s));
                long long t = a[W_SE][launch] < a_start ? a[W_SE][launch] : a_start;
                if (!has_best || t > best_t) {
                    best_t = t, nxt = n_k + launch, has_best = 1;
                }
            }
        } else { /* a node slice */
            Py_ssize_t i = at - n_k;
            int64_t d = a[W_SN][i];
            CHECK(IN(d, n_nodes));
            a_start = a[W_SS][i];
            if (walk_step(steps, cpu_s, walk_label(PyList_GET_ITEM(nodes, d), 0), t_end - a_start) < 0)
                goto done;
            cpu_ns += t_end - a_start;
            int64_t j = a[W_SP][i], tc = a[W_ST][i];
            if (j) {
                CHECK(IN(tc, n_threads) && j > 0 && a[W_T_OFF][tc] + j - 1 < len[W_T_ITEMS]);
                int64_t prev = a[W_T_ITEMS][a[W_T_OFF][tc] + j - 1];
                CHECK(IN(prev, n_s));
                if (a[W_SE][prev] <= a_start) {
                    best_t = a[W_SE][prev], nxt = n_k + prev, has_best = 1;
                }
            }
            int64_t gt = a[W_SG][i], p = -1, p_end = 0;
            int has_p = 0;
            CHECK(a[W_E_BOUNDS][d] >= 0 && a[W_E_BOUNDS][d + 1] <= len[W_E_SRC]);
            for (int64_t e = a[W_E_BOUNDS][d]; e < a[W_E_BOUNDS][d + 1]; e++) {
                int64_t sc = a[W_E_SRC][e];
                CHECK(IN(sc, n_nodes) && a[W_N_BOUNDS][sc] >= 0 && a[W_N_BOUNDS][sc + 1] <= len[W_N_SLICES]);
                for (int64_t x = a[W_N_BOUNDS][sc]; x < a[W_N_BOUNDS][sc + 1]; x++) {
                    int64_t q = a[W_N_SLICES][x];
                    CHECK(IN(q, n_s));
                    int64_t qe = a[W_SE][q];
                    if (a[W_SG][q] == gt && qe <= a_start && (!has_p || qe > p_end || (qe == p_end && q < p))) {
                        p = q, p_end = qe, has_p = 1;
                    }
                }
            }
            if (has_p && (!has_best || p_end > best_t)) {
                best_t = p_end, nxt = n_k + p, has_best = 1;
            }
        }
        if (nxt < 0)
            break;
        CHECK(IN(nxt, n_k + n_s));
        if (a_start > best_t) {
            if (walk_step(steps, wait_s, Py_NewRef(empty), a_start - best_t) < 0)
                goto done;
            wait_ns += a_start - best_t;
        }
        t_end = best_t;
        at = nxt;
    }
#undef CHECK
#undef IN
    if (PyList_Reverse(steps) < 0)
        goto done;
    result = Py_BuildValue("(OLLL)", steps, cpu_ns, gpu_ns, wait_ns);
done:
    for (int c = 0; c < got; c++)
        PyBuffer_Release(&b[c]);
    PyMem_Free(stamp);
    Py_XDECREF(steps);
    Py_XDECREF(kernel_s);
    Py_XDECREF(cpu_s);
    Py_XDECREF(wait_s);
    Py_XDECREF(empty);
    return result;
}
