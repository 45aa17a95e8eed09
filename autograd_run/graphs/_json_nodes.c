/*
 * autograd_run.graphs._json_nodes: the node list of a graph file's JSON text decoded into the schema's own
 * NodeSpec and MetaSpec (graphs/schema.py), as msgspec decodes it, for the plain files that big graphs are.
 *
 *   configure(NodeSpec, node_field_names, UNSET, inputs_decoder) -> bool
 *       NodeSpec's fields must be plain object slots in that order (the names are checked), and
 *       inputs_decoder is msgspec.json.Decoder(list[MetaSpec]).
 *   read_graph(buffer) -> (nodes, head, bfloat16) | None
 *       the graph file's JSON text in buffer: its "nodes" array decoded (a list of NodeSpec), and its other
 *       members' text as written, in a JSON object of their own after a "nodes":[] (head: msgspec decodes
 *       that, load.py), and whether any string in it is "bfloat16" (or has escapes and could be); None where the text is not plainly read here (anything below, a top level that is
 *       not an object, "nodes" missing or repeated): the loader then decodes the whole file with msgspec,
 *       which also says what is wrong where something is.
 *
 * What msgspec's decode gives, what is read here, and what is handed back (None):
 *   - every node member: id, name, op, seq, fwd_thread, next, inputs, saved, attrs, variable with their
 *     schema types; an unknown or repeated member, or a value of another type: None;
 *   - strings with JSON's escapes undone (a \u of a surrogate half: None) and their bytes decoded as strict
 *     UTF-8 (not UTF-8: None), made anew like msgspec's, except a node's name and op and the keys of saved
 *     and attrs, which are shared between the nodes that write the same text, and node ids and edge
 *     targets, shared with the last one read of the same text (read_id_str) (strings cannot change, so only
 *     `is` tells); a member name of a node or of the file with an escape: None;
 *   - numbers as JSON writes them: an integer of up to 18 digits is an int (longer: None), anything with a
 *     fraction or an exponent a float, correctly rounded as msgspec rounds (Clinger's exact fast path, else
 *     PyOS_string_to_double), an exponent past 300 or more than 40 characters: None;
 *   - true, false, null; arrays as lists, objects as dicts (a repeated key: None), nested at most 64 deep;
 *   - so the nodes it reads have no repeated key anywhere (node members, saved and attrs at any depth, the
 *     input objects' members, checked before msgspec decodes them): the loader's duplicate-key proof then
 *     counts only the other members (load.py);
 *   - a node's inputs: the same text as a node before gives the same list of the same MetaSpec objects
 *     (the loader only reads them); new text is decoded by msgspec itself (inputs_decoder), whose error
 *     makes the answer None;
 *   - a node's saved and attrs: the same text as a node before gives the same dict (a loaded graph's saved
 *     values and attrs are never changed; graphs/remap.py shares them between graphs too), and inside them a
 *     short list of integers (a shape, dims) the same text as one before gives the same list (read_shared_ints).
 * The tests (tests/test_json_nodes.py) compare the result with msgspec's, value by value and type by type,
 * on every example, generated graphs of every kind and fuzzed texts; the load runs both ways.
 *
 * No lock: the loader runs on one thread and holds the GIL throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

enum { F_ID, F_NAME, F_OP, F_SEQ, F_FWD, F_NEXT, F_INPUTS, F_SAVED, F_ATTRS, F_VARIABLE, N_FIELDS };
static const char *FIELDS[N_FIELDS] = {"id", "name", "op", "seq", "fwd_thread", "next", "inputs", "saved",
                                       "attrs", "variable"};
static Py_ssize_t FIELD_LEN[N_FIELDS];
static PyTypeObject *NODE_TYPE = NULL;
static Py_ssize_t OFFSETS[N_FIELDS];
static PyObject *UNSET = NULL, *INPUTS_DECODER = NULL, *s_decode = NULL;

#define MAX_DEPTH 64

/* A text span's object, found again by its bytes: names, ops and keys (str), inputs (list). Open
 * addressing; full (TABLE_SIZE / 2 entries): new texts are not kept (made each time). The spans point
 * into the buffer being decoded, so a table lives for one decode_nodes call. */
#define TABLE_SIZE 4096
typedef struct {
    const char *s;
    Py_ssize_t n;
    Py_hash_t h;
    PyObject *v;
} Entry;
typedef struct {
    Entry e[TABLE_SIZE];
    int used;
} Table;

/* A text's hash for the reader's own tables (never a str's hash): eight bytes at a time, each word mixed in by a
 * multiply and a shift (the tables take its low bits), the last partial word padded with zeros; the length
 * mixed in first, so texts that differ only by trailing zero bytes differ. Non-negative. */
static Py_hash_t span_hash(const char *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0xD6E8FEB86659FD93ULL);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, (size_t)(n - i)); /* (0 to 7 bytes) */
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ULL;
    h ^= h >> 32;
    return (Py_hash_t)(h >> 1);
}

static Entry *table_find(Table *t, const char *s, Py_ssize_t n, Py_hash_t h) {
    size_t i = (size_t)h & (TABLE_SIZE - 1);
    for (;;) {
        Entry *e = &t->e[i];
        if (e->v == NULL || (e->h == h && e->n == n && memcmp(e->s, s, n) == 0))
            return e;
        i = (i + 1) & (TABLE_SIZE - 1);
    }
}

static void table_clear(Table *t) {
    for (int i = 0; i < TABLE_SIZE; i++)
        Py_CLEAR(t->e[i].v);
    t->used = 0;
}

typedef struct {
    const char *p, *end;
    Table *strings, *inputs, *objects, *lists, *ids;
    /* a string of the text "bfloat16" was passed (or one with escapes that may undo to it): numpy's bfloat16 is
     * registered before the graph is built (load._load_json), where the whole file's bytes were searched for it */
    int bfloat16;
} Rd;

/* Every reader: a new reference; NULL with no exception set: not read here (the caller hands back None);
 * NULL with an exception: an error (out of memory), raised. */

static inline void ws(Rd *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static inline int peek(Rd *r, char c) {
    ws(r);
    return r->p < r->end && *r->p == c;
}

static inline int take(Rd *r, char c) {
    if (!peek(r, c))
        return 0;
    r->p++;
    return 1;
}

static int literal(Rd *r, const char *word, Py_ssize_t n) {
    if (r->end - r->p < n || memcmp(r->p, word, n) != 0)
        return 0;
    r->p += n;
    return 1;
}

/* A string's text between its quotes (s, n): 1 plain ASCII without escapes, 2 with escapes or other bytes
 * (str_of decodes it), 0 not a string here (a control character, not closed). */
static int span(Rd *r, const char **s, Py_ssize_t *n) {
    if (!take(r, '"'))
        return 0;
    const char *q = r->p;
    int kind = 1;
    while (q < r->end) {
        unsigned char c = (unsigned char)*q;
        if (c == '"')
            break;
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            kind = 2;
            q += 2;
            continue;
        }
        if (c >= 0x80)
            kind = 2;
        q++;
    }
    if (q >= r->end)
        return 0;
    *s = r->p;
    *n = q - r->p;
    r->p = q + 1;
    if (*n >= 8 && (kind == 1 ? *n == 8 && memcmp(*s, "bfloat16", 8) == 0 : *n <= 48)) /* (6 bytes at most a letter) */
        r->bfloat16 = 1;
    return kind;
}

static PyObject *new_str(const char *s, Py_ssize_t n) {
    PyObject *u = PyUnicode_New(n, 127);
    if (u != NULL)
        memcpy(PyUnicode_DATA(u), s, n);
    return u;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* The string of a span of kind 1 or 2: JSON's escapes undone (a \u of a surrogate: not read here), the
 * bytes decoded as strict UTF-8 (anything else: not read here). */
static PyObject *str_of(const char *s, Py_ssize_t n, int kind) {
    if (kind == 1)
        return new_str(s, n);
    char *buf = PyMem_Malloc(n ? n : 1), *o = buf; /* undone escapes are never longer than their text */
    if (buf == NULL)
        return PyErr_NoMemory();
    for (const char *p = s, *end = s + n; p < end;) {
        if (*p != '\\') {
            *o++ = *p++;
            continue;
        }
        if (end - p < 2)
            goto plain;
        char e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (end - p < 4 || !hex4(p, &cp) || (cp >= 0xD800 && cp <= 0xDFFF))
                goto plain;
            p += 4;
            if (cp < 0x80) {
                *o++ = (char)cp;
            } else if (cp < 0x800) {
                *o++ = (char)(0xC0 | (cp >> 6));
                *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xE0 | (cp >> 12));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            goto plain;
        }
    }
    PyObject *u = PyUnicode_DecodeUTF8(buf, o - buf, "strict");
    PyMem_Free(buf);
    if (u == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear(); /* not UTF-8: msgspec's decode says so */
    return u;
plain:
    PyMem_Free(buf);
    return NULL;
}

static PyObject *read_str(Rd *r) {
    const char *s;
    Py_ssize_t n;
    int kind = span(r, &s, &n);
    return kind ? str_of(s, n, kind) : NULL;
}

/* A string shared by its text (a name, an op, a key). */
static PyObject *read_shared_str(Rd *r) {
    const char *s;
    Py_ssize_t n;
    int kind = span(r, &s, &n);
    if (!kind)
        return NULL;
    Py_hash_t h = span_hash(s, n);
    Entry *e = table_find(r->strings, s, n, h);
    if (e->v != NULL)
        return Py_NewRef(e->v);
    PyObject *u = str_of(s, n, kind);
    if (u != NULL && r->strings->used < TABLE_SIZE / 2) {
        e->s = s, e->n = n, e->h = h, e->v = Py_NewRef(u);
        r->strings->used++;
    }
    return u;
}

/* A node's id or an edge's target: the string made lately for the same text, else made here and kept in its
 * slot (direct-mapped by the text's hash, a slot taken over by the last text that lands in it, so a file of
 * any size needs only the table). A file lists a node soon after the edges into it (the producers after their
 * consumers), so a node's id is mostly the very string its consumer's edge made: a string less per edge that
 * finds one (at a million nodes, 60-110 MB less at the load's peak), and the loader's look-ups of edge targets
 * in the id table find the one object (its hash kept in it). Plain ASCII text only (no escapes), compared
 * with the string's own characters (in the cache line the new reference touches anyway, where the file's
 * earlier text is far behind). The entries are borrowed: each string made here is held by the node being read
 * or one before it until read_graph returns, and a read that fails anywhere ends the whole read, so no entry
 * is looked at after its string could have gone (and the table is let go without a release). */
static PyObject *read_id_str(Rd *r) {
    const char *s;
    Py_ssize_t n;
    int kind = span(r, &s, &n);
    if (kind != 1)
        return kind ? str_of(s, n, kind) : NULL;
    Py_hash_t h = span_hash(s, n);
    Entry *e = &r->ids->e[(size_t)h & (TABLE_SIZE - 1)];
    if (e->v != NULL && e->h == h && e->n == n && memcmp(PyUnicode_DATA(e->v), s, n) == 0)
        return Py_NewRef(e->v);
    PyObject *u = new_str(s, n);
    if (u != NULL)
        e->v = u, e->n = n, e->h = h; /* (borrowed) */
    return u;
}

static PyObject *read_number(Rd *r) {
    ws(r);
    const char *s = r->p, *q = s;
    int is_float = 0;
    if (q < r->end && *q == '-')
        q++;
    if (q >= r->end || *q < '0' || *q > '9')
        return NULL;
    if (*q == '0') {
        q++;
        if (q < r->end && *q >= '0' && *q <= '9')
            return NULL; /* a leading zero: not JSON */
    } else {
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && *q == '.') {
        is_float = 1;
        q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return NULL;
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        is_float = 1;
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        const char *d = q;
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
        if (q == d || q - d > 3)
            return NULL;
        int e = 0;
        for (const char *k = d; k < q; k++)
            e = e * 10 + (*k - '0');
        if (e > 300)
            return NULL;
    }
    Py_ssize_t n = q - s;
    if (n > 40)
        return NULL;
    r->p = q;
    if (!is_float) {
        if (n - (*s == '-') > 18)
            return NULL;
        long long v = 0;
        for (const char *k = s + (*s == '-'); k < q; k++)
            v = v * 10 + (*k - '0');
        return PyLong_FromLongLong(*s == '-' ? -v : v);
    }
    /* Clinger's fast path: at most 15 significant digits (exact in a double) and a power of ten up to 22
     * (exact too): one division or multiplication of two exact numbers, correctly rounded, as the full
     * conversion below would give */
    {
        const char *k = s + (*s == '-');
        unsigned long long m = 0;
        int digits = 0, frac = 0, exp = 0, eneg = 0, in_frac = 0;
        for (; k < q && *k != 'e' && *k != 'E'; k++) {
            if (*k == '.') {
                in_frac = 1;
                continue;
            }
            if (digits || *k != '0')
                digits++;
            m = m * 10 + (*k - '0');
            frac += in_frac;
        }
        if (k < q) {
            k++;
            if (*k == '+' || *k == '-')
                eneg = *k++ == '-';
            for (; k < q; k++)
                exp = exp * 10 + (*k - '0');
        }
        int p10 = (eneg ? -exp : exp) - frac;
        static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                         1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
        if (digits <= 15 && p10 >= -22 && p10 <= 22) {
            double d = (double)m;
            d = p10 < 0 ? d / POW10[-p10] : d * POW10[p10];
            return PyFloat_FromDouble(*s == '-' ? -d : d);
        }
    }
    char buf[48];
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *stop = NULL;
    double d = PyOS_string_to_double(buf, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (stop != buf + n || !isfinite(d))
        return NULL;
    return PyFloat_FromDouble(d);
}

static PyObject *read_value(Rd *r, int depth);

static PyObject *read_object(Rd *r, int depth) {
    if (depth > MAX_DEPTH || !take(r, '{'))
        return NULL;
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (take(r, '}'))
        return d;
    for (;;) {
        PyObject *k = read_shared_str(r);
        if (k == NULL || !take(r, ':'))
            goto fail_k;
        PyObject *v = read_value(r, depth + 1);
        if (v == NULL)
            goto fail_k;
        Py_ssize_t before = PyDict_GET_SIZE(d);
        int bad = PyDict_SetItem(d, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (bad < 0 || PyDict_GET_SIZE(d) == before) /* (the same size: a repeated key) */
            goto fail;
        if (take(r, ','))
            continue;
        if (take(r, '}'))
            return d;
        goto fail;
    fail_k:
        Py_XDECREF(k);
        goto fail;
    }
fail:
    Py_DECREF(d);
    return NULL;
}

/* "[]" or "[" item ("," item)* "]": a list of what `item` reads (given depth + 1), or NULL (as the readers). */
typedef PyObject *(*ItemReader)(Rd *r, int depth);

static PyObject *read_list(Rd *r, ItemReader item, int depth) {
    if (depth > MAX_DEPTH || !take(r, '['))
        return NULL;
    PyObject *l = PyList_New(0);
    if (l == NULL)
        return NULL;
    if (take(r, ']'))
        return l;
    for (;;) {
        PyObject *v = item(r, depth + 1);
        if (v == NULL || PyList_Append(l, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(l);
            return NULL;
        }
        Py_DECREF(v);
        if (take(r, ','))
            continue;
        if (take(r, ']'))
            return l;
        Py_DECREF(l);
        return NULL;
    }
}

static int skip_value(Rd *r, int depth);

/* A list of integers inside a saved value or attrs (a saved tensor's shape, an op's dims) as short as MAX_SHARED:
 * the list made for the same text before, else read (and kept); any other list is read each time. Shared as the
 * saved values and attrs themselves are (never changed once loaded); nodes alike then hold one shape object,
 * which the cost memo compares by identity (signature.c), and a million nodes do not make two lists each. */
#define MAX_SHARED 64
static PyObject *read_shared_ints(Rd *r, int depth) {
    const char *s = r->p;
    if (!skip_value(r, depth))
        return NULL;
    Py_ssize_t n = r->p - s;
    int ints = n <= MAX_SHARED;
    for (Py_ssize_t i = 0; ints && i < n; i++) {
        char c = s[i];
        ints = (c >= '0' && c <= '9') || c == '[' || c == ']' || c == ',' || c == '-' || c == ' ' || c == '\n' ||
               c == '\r' || c == '\t';
    }
    Entry *e = NULL;
    Py_hash_t h = 0;
    if (ints) {
        h = span_hash(s, n);
        e = table_find(r->lists, s, n, h);
        if (e->v != NULL)
            return Py_NewRef(e->v);
    }
    r->p = s;
    PyObject *l = read_list(r, read_value, depth);
    if (l != NULL && e != NULL && r->lists->used < TABLE_SIZE / 2) {
        e->s = s, e->n = n, e->h = h, e->v = Py_NewRef(l);
        r->lists->used++;
    }
    return l;
}

static PyObject *read_value(Rd *r, int depth) {
    ws(r);
    if (r->p >= r->end)
        return NULL;
    switch (*r->p) {
    case '{':
        return read_object(r, depth);
    case '[':
        return read_shared_ints(r, depth);
    case '"':
        return read_str(r);
    case 't':
        return literal(r, "true", 4) ? Py_NewRef(Py_True) : NULL;
    case 'f':
        return literal(r, "false", 5) ? Py_NewRef(Py_False) : NULL;
    case 'n':
        return literal(r, "null", 4) ? Py_NewRef(Py_None) : NULL;
    default:
        return read_number(r);
    }
}

/* Past one value without making it: 1, or 0 where it is not plain (as the readers above). Strings as span(). */
static int skip_value(Rd *r, int depth) {
    ws(r);
    if (r->p >= r->end || depth > MAX_DEPTH)
        return 0;
    char c = *r->p;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->p++;
        if (take(r, close))
            return 1;
        for (;;) {
            if (c == '{') {
                const char *s;
                Py_ssize_t n;
                if (!span(r, &s, &n) || !take(r, ':'))
                    return 0;
            }
            if (!skip_value(r, depth + 1))
                return 0;
            if (take(r, ','))
                continue;
            return take(r, close);
        }
    }
    if (c == '"') {
        const char *s;
        Py_ssize_t n;
        return span(r, &s, &n);
    }
    if (c == 't')
        return literal(r, "true", 4);
    if (c == 'f')
        return literal(r, "false", 5);
    if (c == 'n')
        return literal(r, "null", 4);
    PyObject *num = read_number(r);
    Py_XDECREF(num);
    return num != NULL;
}

/* Optional[int]: an int or None. */
static PyObject *read_int_or_null(Rd *r) {
    ws(r);
    if (r->p < r->end && *r->p == 'n')
        return literal(r, "null", 4) ? Py_NewRef(Py_None) : NULL;
    PyObject *v = read_number(r);
    if (v != NULL && !PyLong_CheckExact(v))
        Py_CLEAR(v);
    return v;
}

/* Optional[str]: a string (shared or not) or None. */
static PyObject *read_str_or_null(Rd *r, int shared) {
    ws(r);
    if (r->p < r->end && *r->p == 'n')
        return literal(r, "null", 4) ? Py_NewRef(Py_None) : NULL;
    return shared ? read_shared_str(r) : read_str(r);
}

/* Optional[tuple[str, int]]: one of a node's next edges (in read_list: list[Optional[tuple[str, int]]]). */
static PyObject *read_edge(Rd *r, int depth) {
    ws(r);
    if (r->p < r->end && *r->p == 'n')
        return literal(r, "null", 4) ? Py_NewRef(Py_None) : NULL;
    if (!take(r, '['))
        return NULL;
    PyObject *t = read_id_str(r), *nr = NULL, *item = NULL;
    if (t != NULL && take(r, ',') && (nr = read_number(r)) != NULL && PyLong_CheckExact(nr) && take(r, ']'))
        item = PyTuple_Pack(2, t, nr);
    Py_XDECREF(t);
    Py_XDECREF(nr);
    return item;
}

/* Whether the input objects in the array text s..s+n have each member name once (msgspec keeps the last of a
 * repeated one without a word): 1 yes, 0 no or not plainly read (a name with an escape, more than 8 members;
 * msgspec then decodes the whole file and the loader's duplicate-key check says where). */
static int input_keys_unique(const char *s, Py_ssize_t n) {
    Rd r = {.p = s, .end = s + n};
    if (!take(&r, '['))
        return 0;
    if (take(&r, ']'))
        return 1;
    for (;;) {
        if (!take(&r, '{'))
            return 0;
        const char *names[8];
        Py_ssize_t lens[8];
        int k = 0;
        if (!take(&r, '}')) {
            for (;;) {
                const char *name;
                Py_ssize_t len;
                if (k == 8 || span(&r, &name, &len) != 1 || !take(&r, ':'))
                    return 0;
                for (int j = 0; j < k; j++)
                    if (lens[j] == len && memcmp(names[j], name, len) == 0)
                        return 0;
                names[k] = name, lens[k] = len, k++;
                if (!skip_value(&r, 2))
                    return 0;
                if (take(&r, ','))
                    continue;
                if (take(&r, '}'))
                    break;
                return 0;
            }
        }
        if (take(&r, ','))
            continue;
        return take(&r, ']');
    }
}

/* list[MetaSpec]: by its text, the list made for the same text before, else msgspec's decode of it (its
 * member names checked unique first). */
static PyObject *read_inputs(Rd *r) {
    ws(r);
    const char *s = r->p;
    if (!peek(r, '[') || !skip_value(r, 0))
        return NULL;
    Py_ssize_t n = r->p - s;
    Py_hash_t h = span_hash(s, n);
    Entry *e = table_find(r->inputs, s, n, h);
    if (e->v != NULL)
        return Py_NewRef(e->v);
    if (!input_keys_unique(s, n))
        return NULL;
    PyObject *text = PyBytes_FromStringAndSize(s, n);
    if (text == NULL)
        return NULL;
    PyObject *l = PyObject_CallMethodOneArg(INPUTS_DECODER, s_decode, text);
    Py_DECREF(text);
    if (l == NULL) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError))
            return NULL;
        PyErr_Clear(); /* msgspec's own complaint: the whole file's decode will say it, with the place */
        return NULL;
    }
    if (r->inputs->used < TABLE_SIZE / 2) {
        e->s = s, e->n = n, e->h = h, e->v = Py_NewRef(l);
        r->inputs->used++;
    }
    return l;
}

/* dict[str, Any] (saved, attrs): by its text, the dict made for the same text before (a loaded graph's saved
 * values and attrs are never changed: graphs/remap.py shares them between graphs too), else read here. */
static PyObject *read_shared_object(Rd *r) {
    ws(r);
    const char *s = r->p;
    if (!peek(r, '{') || !skip_value(r, 1))
        return NULL;
    const char *end = r->p;
    Py_ssize_t n = end - s;
    Py_hash_t h = span_hash(s, n);
    Entry *e = table_find(r->objects, s, n, h);
    if (e->v != NULL)
        return Py_NewRef(e->v);
    r->p = s;
    PyObject *d = read_object(r, 1);
    if (d == NULL)
        return NULL;
    if (r->objects->used < TABLE_SIZE / 2) {
        e->s = s, e->n = n, e->h = h, e->v = Py_NewRef(d);
        r->objects->used++;
    }
    return d;
}

static PyObject *read_node(Rd *r, int depth) {
    if (!take(r, '{'))
        return NULL;
    PyObject *v[N_FIELDS] = {NULL};
    PyObject *node = NULL;
    unsigned seen = 0;
    if (!take(r, '}')) {
        for (;;) {
            const char *k;
            Py_ssize_t kn;
            if (span(r, &k, &kn) != 1 || !take(r, ':'))
                goto done; /* (a member name with escapes: msgspec reads it) */
            int f = -1;
            for (int i = 0; i < N_FIELDS; i++)
                if (FIELD_LEN[i] == kn && k[0] == FIELDS[i][0] && memcmp(FIELDS[i], k, kn) == 0) {
                    f = i;
                    break;
                }
            if (f < 0 || (seen & (1u << f)))
                goto done; /* an unknown or repeated member: msgspec says which */
            seen |= 1u << f;
            switch (f) {
            case F_ID:
                v[f] = read_id_str(r);
                break;
            case F_NAME:
                v[f] = read_shared_str(r);
                break;
            case F_OP:
                v[f] = read_str_or_null(r, 1);
                break;
            case F_VARIABLE:
                v[f] = read_str_or_null(r, 0);
                break;
            case F_SEQ:
            case F_FWD:
                v[f] = read_int_or_null(r);
                break;
            case F_NEXT:
                v[f] = read_list(r, read_edge, 0);
                break;
            case F_INPUTS:
                v[f] = read_inputs(r);
                break;
            default: /* saved, attrs: dict[str, Any] */
                v[f] = read_shared_object(r);
            }
            if (v[f] == NULL)
                goto done;
            if (take(r, ','))
                continue;
            if (take(r, '}'))
                break;
            goto done;
        }
    }
    if (!(seen & (1u << F_ID)) || !(seen & (1u << F_NAME)))
        goto done; /* a required member missing */
    node = NODE_TYPE->tp_alloc(NODE_TYPE, 0);
    if (node == NULL)
        goto done;
    for (int f = 0; f < N_FIELDS; f++) { /* every field: the member read, or UNSET (configure: no others) */
        *(PyObject **)((char *)node + OFFSETS[f]) = v[f] != NULL ? v[f] : Py_NewRef(UNSET);
        v[f] = NULL;
    }
done:
    for (int f = 0; f < N_FIELDS; f++)
        Py_XDECREF(v[f]);
    return node;
}

static PyObject *read_graph(PyObject *mod, PyObject *arg) {
    if (NODE_TYPE == NULL)
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Table *strings = PyMem_Calloc(1, sizeof(Table)), *inputs = PyMem_Calloc(1, sizeof(Table)),
          *objects = PyMem_Calloc(1, sizeof(Table)), *lists = PyMem_Calloc(1, sizeof(Table)),
          *ids = PyMem_Calloc(1, sizeof(Table));
    PyObject *nodes = NULL, *head = NULL, *result = NULL;
    if (strings == NULL || inputs == NULL || objects == NULL || lists == NULL || ids == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    Rd r = {.p = view.buf, .end = (const char *)view.buf + view.len, .strings = strings, .inputs = inputs,
            .objects = objects, .lists = lists, .ids = ids};
    /* the other members' text, kept as written, after a "nodes":[] of their own (msgspec decodes that) */
    if ((head = PyBytes_FromStringAndSize("{\"nodes\":[]", 11)) == NULL)
        goto out;
    if (!take(&r, '{') || take(&r, '}'))
        goto plain;
    for (;;) {
        ws(&r);
        const char *member = r.p, *k;
        Py_ssize_t kn;
        if (span(&r, &k, &kn) != 1 || !take(&r, ':'))
            goto plain; /* (a member name with escapes: msgspec reads it) */
        if (kn == 5 && memcmp(k, "nodes", 5) == 0) {
            if (nodes != NULL)
                goto plain; /* a repeated "nodes": msgspec's decode and the duplicate-key check say so */
            if ((nodes = read_list(&r, read_node, 0)) == NULL) /* the "nodes" array */
                goto plain;
        } else {
            if (!skip_value(&r, 0))
                goto plain;
            PyObject *part = PyBytes_FromStringAndSize(",", 1);
            PyObject *text = part ? PyBytes_FromStringAndSize(member, r.p - member) : NULL;
            if (text != NULL)
                PyBytes_Concat(&part, text);
            Py_XDECREF(text);
            if (part == NULL)
                goto out;
            PyBytes_ConcatAndDel(&head, part);
            if (head == NULL)
                goto out;
        }
        if (take(&r, ','))
            continue;
        if (take(&r, '}'))
            break;
        goto plain;
    }
    ws(&r);
    if (r.p != r.end || nodes == NULL)
        goto plain;
    PyObject *close = PyBytes_FromStringAndSize("}", 1);
    if (close == NULL)
        goto out;
    PyBytes_ConcatAndDel(&head, close);
    if (head != NULL)
        result = PyTuple_Pack(3, nodes, head, r.bfloat16 ? Py_True : Py_False);
    goto out;
plain:
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
out:
    Py_XDECREF(nodes);
    Py_XDECREF(head);
    if (strings)
        table_clear(strings);
    if (inputs)
        table_clear(inputs);
    if (objects)
        table_clear(objects);
    if (lists)
        table_clear(lists);
    PyMem_Free(ids); /* (borrowed entries: nothing to release) */
    PyMem_Free(strings);
    PyMem_Free(inputs);
    PyMem_Free(objects);
    PyMem_Free(lists);
    PyBuffer_Release(&view);
    return result;
}

/* The offset of field `name` of `type` when it is a plain object slot of that type, else -1. */
static Py_ssize_t slot_offset(PyObject *type, PyObject *name) {
    PyObject *d = PyObject_GetAttr(type, name);
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_common.d_type == (PyTypeObject *)type &&
        ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return off;
}

static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *node_type, *names, *unset, *decoder;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &node_type, &PyTuple_Type, &names, &unset, &decoder))
        return NULL;
    /* the schema's fields exactly this reader's (any other: msgspec reads every file), plain slots; a NodeSpec
     * tracked by the collector would need its own allocation path */
    if (PyTuple_GET_SIZE(names) != N_FIELDS || ((PyTypeObject *)node_type)->tp_flags & Py_TPFLAGS_HAVE_GC)
        Py_RETURN_FALSE;
    int found = 0;
    for (Py_ssize_t i = 0; i < N_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        Py_ssize_t off = slot_offset(node_type, name);
        if (off < 0)
            Py_RETURN_FALSE;
        for (int f = 0; f < N_FIELDS; f++)
            if (PyUnicode_CompareWithASCIIString(name, FIELDS[f]) == 0) {
                OFFSETS[f] = off;
                found++;
            }
    }
    if (found != N_FIELDS)
        Py_RETURN_FALSE;
    Py_XSETREF(UNSET, Py_NewRef(unset));
    Py_XSETREF(INPUTS_DECODER, Py_NewRef(decoder));
    Py_XSETREF(NODE_TYPE, (PyTypeObject *)Py_NewRef(node_type));
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(NodeSpec, node_field_names, UNSET, inputs_decoder) -> bool"},
    {"read_graph", read_graph, METH_O,
     "read_graph(buffer) -> (list[NodeSpec], head JSON) | None: see graphs/load.py _decode_json"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_json_nodes",
                                    "A graph file's node list decoded into NodeSpecs (msgspec's decode is the twin).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__json_nodes(void) {
    for (int f = 0; f < N_FIELDS; f++)
        FIELD_LEN[f] = (Py_ssize_t)strlen(FIELDS[f]);
    if ((s_decode = PyUnicode_InternFromString("decode")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
