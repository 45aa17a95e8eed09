/* Python twin: autograd_run/traces/encode.py.
 * The trace writers' loop: rows of columns formatted by templates. Part of _core.c (included there, after core.h). */

/* ------------------------------------------------------------ fill */

/* The trace writers' inner loop (traces/encode.py is the twin and documents the ops): rows of int64
 * columns and tables of strings, formatted into JSON text or protobuf bytes by small templates. */

enum {
    OP_LIT = 0, OP_I64, OP_U64, OP_US, OP_DUR, OP_JSTR, OP_RAW, OP_SKIPNEG,
    OP_PB_VARINT, OP_PB_STR, OP_PB_BEGIN, OP_PB_END, OP_PB_DELTA, OP_PB_FIXED64, OP_MICRO, OP_JESC, OP_COUNT
};

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *d = PyMem_RawRealloc(o->data, cap);
    if (d == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = d;
    o->cap = cap;
    return 0;
}

static inline int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, s, n);
    o->len += n;
    return 0;
}

static inline int out_u64(Out *o, uint64_t v) {
    char buf[24];
    int i = 24;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return out_put(o, buf + i, 24 - i);
}

static inline int out_i64(Out *o, int64_t v) {
    if (v < 0) {
        if (out_put(o, "-", 1) < 0)
            return -1;
        return out_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return out_u64(o, (uint64_t)v);
}

/* ns as a decimal number of microseconds: 12345678 -> 12345.678, 12345600 -> 12345.6, 12000 -> 12 */
static int out_micro(Out *o, int64_t ns) {
    if (ns < 0) {
        if (out_put(o, "-", 1) < 0)
            return -1;
        ns = -ns;
    }
    if (out_u64(o, (uint64_t)(ns / 1000)) < 0)
        return -1;
    int r = (int)(ns % 1000);
    if (r == 0)
        return 0;
    char buf[4] = {'.', (char)('0' + r / 100), (char)('0' + r / 10 % 10), (char)('0' + r % 10)};
    int n = 4;
    while (buf[n - 1] == '0')
        n--;
    return out_put(o, buf, n);
}

static inline int out_varint(Out *o, uint64_t v) {
    char buf[10];
    int n = 0;
    while (v >= 0x80) {
        buf[n++] = (char)(v | 0x80);
        v >>= 7;
    }
    buf[n++] = (char)v;
    return out_put(o, buf, n);
}

/* A table entry as UTF-8 bytes (str: encoded, undecodable code points replaced; bytes: as they are). */
static int entry_bytes(PyObject *table, int64_t i, const char **s, Py_ssize_t *n, PyObject **hold) {
    if (!PyList_Check(table) || i < 0 || i >= PyList_GET_SIZE(table)) {
        PyErr_SetString(PyExc_IndexError, "fill: table index out of range");
        return -1;
    }
    PyObject *v = PyList_GET_ITEM(table, i);
    *hold = NULL;
    if (PyBytes_Check(v)) {
        *s = PyBytes_AS_STRING(v);
        *n = PyBytes_GET_SIZE(v);
        return 0;
    }
    if (!PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "fill: table entries are str or bytes");
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(v, n);
    if (*s != NULL)
        return 0;
    PyErr_Clear();
    *hold = PyUnicode_AsEncodedString(v, "utf-8", "replace");
    if (*hold == NULL)
        return -1;
    *s = PyBytes_AS_STRING(*hold);
    *n = PyBytes_GET_SIZE(*hold);
    return 0;
}

static int out_json_string(Out *o, const char *s, Py_ssize_t n, int quoted) {
    if (out_reserve(o, n + 2) < 0 || (quoted && out_put(o, "\"", 1) < 0))
        return -1;
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (out_put(o, s + start, i - start) < 0)
            return -1;
        char esc[7];
        int m = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            m = 6;
        }
        if (out_put(o, esc, m) < 0)
            return -1;
        start = i + 1;
    }
    if (out_put(o, s + start, n - start) < 0)
        return -1;
    return quoted ? out_put(o, "\"", 1) : 0;
}

static inline int64_t col_at(Py_buffer *cols, Py_ssize_t ncols, int64_t c, Py_ssize_t row, int *bad) {
    if (c < 0 || c >= ncols) {
        *bad = 1;
        return 0;
    }
    return ((int64_t *)cols[c].buf)[row];
}

/* fill(templates, kinds, columns, tables, lits, base, start, stop, index=None) -> bytes: see traces/encode.py. */
static PyObject *fill(PyObject *mod, PyObject *args) {
    PyObject *templates, *kinds_o, *columns, *tables, *lits, *index_o = Py_None;
    long long base;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!Lnn|O", &PyList_Type, &templates, &kinds_o, &PyList_Type, &columns,
                          &PyList_Type, &tables, &PyList_Type, &lits, &base, &start, &stop, &index_o))
        return NULL;
    Py_ssize_t ncols = PyList_GET_SIZE(columns), ntemp = PyList_GET_SIZE(templates);
    Py_buffer *cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Py_buffer));
    Py_buffer *tmpl = PyMem_Calloc(ntemp ? ntemp : 1, sizeof(Py_buffer));
    Py_buffer kb = {0}, ib = {0};
    int have_kinds = 0, have_index = 0;
    Py_ssize_t nrows = stop;  /* rows the columns must hold */
    Py_ssize_t got_cols = 0, got_tmpl = 0;
    Out o = {0};
    PyObject *result = NULL;
    int64_t prev = base;  /* the last PB_DELTA value (one chain: the packets' timestamps) */
    Py_ssize_t stack[32];
    int depth = 0, bad = 0;
    if (cols == NULL || tmpl == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "fill: bad row range");
        goto done;
    }
    for (; got_cols < ncols; got_cols++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(columns, got_cols), &cols[got_cols], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    for (; got_tmpl < ntemp; got_tmpl++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(templates, got_tmpl), &tmpl[got_tmpl], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    if (index_o != Py_None) {
        if (PyObject_GetBuffer(index_o, &ib, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_index = 1;
        if (ib.itemsize != 8 || ib.len / 8 < stop) {
            PyErr_SetString(PyExc_ValueError, "fill: index is shorter than the rows");
            goto done;
        }
        nrows = 0;  /* the columns' length, from the first one; every index is checked against it */
        if (ncols)
            nrows = cols[0].len / 8;
        for (Py_ssize_t r = start; r < stop; r++) {
            int64_t i = ((int64_t *)ib.buf)[r];
            if (i < 0 || i >= nrows) {
                PyErr_SetString(PyExc_IndexError, "fill: index out of range");
                goto done;
            }
        }
    }
    if (kinds_o != Py_None) {
        if (PyObject_GetBuffer(kinds_o, &kb, PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        have_kinds = 1;
        if (kb.len / 8 < nrows) {
            PyErr_SetString(PyExc_ValueError, "fill: kinds is shorter than the rows");
            goto done;
        }
    }
    for (Py_ssize_t c = 0; c < ncols; c++)
        if (cols[c].itemsize != 8 || cols[c].len / 8 < nrows) {
            PyErr_SetString(PyExc_ValueError, "fill: a column is not int64 or is shorter than the rows");
            goto done;
        }
    for (Py_ssize_t r0 = start; r0 < stop; r0++) {
        Py_ssize_t row = have_index ? (Py_ssize_t)((int64_t *)ib.buf)[r0] : r0;
        int64_t k = have_kinds ? ((int64_t *)kb.buf)[row] : 0;
        if (k < 0 || k >= ntemp) {
            PyErr_SetString(PyExc_ValueError, "fill: template index out of range");
            goto done;
        }
        const int64_t *ops = tmpl[k].buf;
        Py_ssize_t nops = tmpl[k].len / 32;
        for (Py_ssize_t p = 0; p < nops; p++) {
            int64_t op = ops[4 * p], x = ops[4 * p + 1], y = ops[4 * p + 2], z = ops[4 * p + 3];
            int r = 0;
            switch (op) {
            case OP_LIT: {
                if (x < 0 || x >= PyList_GET_SIZE(lits) || !PyBytes_Check(PyList_GET_ITEM(lits, x))) {
                    PyErr_SetString(PyExc_ValueError, "fill: bad literal");
                    goto done;
                }
                PyObject *l = PyList_GET_ITEM(lits, x);
                r = out_put(&o, PyBytes_AS_STRING(l), PyBytes_GET_SIZE(l));
                break;
            }
            case OP_I64: r = out_i64(&o, col_at(cols, ncols, x, row, &bad)); break;
            case OP_U64: r = out_u64(&o, (uint64_t)col_at(cols, ncols, x, row, &bad)); break;
            case OP_US: r = out_micro(&o, col_at(cols, ncols, x, row, &bad) - base); break;
            case OP_DUR: {
                int64_t v = col_at(cols, ncols, x, row, &bad);
                r = out_micro(&o, v < 1 ? 1 : v);
                break;
            }
            case OP_MICRO: r = out_micro(&o, col_at(cols, ncols, x, row, &bad)); break;
            case OP_JSTR:
            case OP_JESC:
            case OP_RAW:
            case OP_PB_STR: {
                int64_t t = op == OP_PB_STR ? y : x, v = col_at(cols, ncols, op == OP_PB_STR ? z : y, row, &bad);
                if (bad)
                    break;
                if (t < 0 || t >= PyList_GET_SIZE(tables)) {
                    PyErr_SetString(PyExc_ValueError, "fill: table index out of range");
                    goto done;
                }
                const char *s;
                Py_ssize_t n;
                PyObject *hold;
                if (entry_bytes(PyList_GET_ITEM(tables, t), v, &s, &n, &hold) < 0)
                    goto done;
                if (op == OP_JSTR || op == OP_JESC)
                    r = out_json_string(&o, s, n, op == OP_JSTR);
                else if (op == OP_RAW)
                    r = out_put(&o, s, n);
                else
                    r = (out_varint(&o, ((uint64_t)x << 3) | 2) < 0 || out_varint(&o, (uint64_t)n) < 0 ||
                         out_put(&o, s, n) < 0) ? -1 : 0;
                Py_XDECREF(hold);
                break;
            }
            case OP_SKIPNEG:
                if (col_at(cols, ncols, x, row, &bad) < 0)
                    p += y;
                break;
            case OP_PB_VARINT:
                r = (out_varint(&o, (uint64_t)x << 3) < 0 ||
                     out_varint(&o, (uint64_t)col_at(cols, ncols, y, row, &bad)) < 0) ? -1 : 0;
                break;
            case OP_PB_FIXED64: {
                uint64_t v = (uint64_t)col_at(cols, ncols, y, row, &bad);
                char buf[8];
                for (int i = 0; i < 8; i++)
                    buf[i] = (char)((v >> (8 * i)) & 0xff);
                r = (out_varint(&o, ((uint64_t)x << 3) | 1) < 0 || out_put(&o, buf, 8) < 0) ? -1 : 0;
                break;
            }
            case OP_PB_DELTA: {
                int64_t v = col_at(cols, ncols, y, row, &bad);
                r = (out_varint(&o, (uint64_t)x << 3) < 0 || out_varint(&o, (uint64_t)(v - prev)) < 0) ? -1 : 0;
                prev = v;
                break;
            }
            case OP_PB_BEGIN:
                if (depth >= 32) {
                    PyErr_SetString(PyExc_ValueError, "fill: messages nested too deep");
                    goto done;
                }
                r = out_varint(&o, ((uint64_t)x << 3) | 2);
                if (r == 0 && (r = out_reserve(&o, 1)) == 0) {
                    stack[depth++] = o.len;
                    o.data[o.len++] = 0;
                }
                break;
            case OP_PB_END: {
                if (depth == 0) {
                    PyErr_SetString(PyExc_ValueError, "fill: end without begin");
                    goto done;
                }
                Py_ssize_t at = stack[--depth], n = o.len - at - 1;
                char buf[10];
                int m = 0;
                uint64_t u = (uint64_t)n;
                while (u >= 0x80) {
                    buf[m++] = (char)(u | 0x80);
                    u >>= 7;
                }
                buf[m++] = (char)u;
                if (m > 1) {
                    if (out_reserve(&o, m - 1) < 0)
                        goto done;
                    memmove(o.data + at + m, o.data + at + 1, n);
                    o.len += m - 1;
                }
                memcpy(o.data + at, buf, m);
                break;
            }
            default:
                PyErr_SetString(PyExc_ValueError, "fill: unknown op");
                goto done;
            }
            if (bad) {
                PyErr_SetString(PyExc_ValueError, "fill: column index out of range");
                goto done;
            }
            if (r < 0)
                goto done;
        }
        if (depth) {
            PyErr_SetString(PyExc_ValueError, "fill: begin without end");
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(o.data ? o.data : "", o.len);
done:
    for (Py_ssize_t c = 0; c < got_cols; c++)
        PyBuffer_Release(&cols[c]);
    for (Py_ssize_t t = 0; t < got_tmpl; t++)
        PyBuffer_Release(&tmpl[t]);
    if (have_kinds)
        PyBuffer_Release(&kb);
    if (have_index)
        PyBuffer_Release(&ib);
    PyMem_Free(cols);
    PyMem_Free(tmpl);
    PyMem_RawFree(o.data);
    return result;
}
