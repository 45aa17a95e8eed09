/*
 * autograd_run.graphs._build: the loops that make a graph's Node objects, compiled: the loader's two loops over
 * node specs (validate.py is the twin) and the placed copy of a graph (remap.py is the twin).
 *
 *   build_nodes(checker, spec_nodes, st, i)  make the Node of each spec from index i on, as
 *       _Checker._nodes_py does, and return the index of the first spec it does not do
 *       (len(spec_nodes) when it did them all). It does a node only when every check it makes
 *       itself passes: a first-seen op text or input metadata, an AccumulateGrad that is not
 *       plainly right (its variable unknown, taken or not requiring grad, its input missing or of
 *       another shape), another node naming a variable, a saved null, a seq or fwd_thread out of range, the wrong number of next edges,
 *       a missing field an output needs, and every error are left to the Python loop, which then
 *       does that one node (and raises where it is wrong). Saved values that are not plain numbers
 *       in a number field, missing required fields and attrs go to the checker's own methods
 *       (check_value, check_required, check_attrs), which raise the file's error themselves.
 *   link_edges(spec_nodes, st, i)  the next edges of each node from index i on, as
 *       _Checker._edges_py does; a node with a missing target, an input_nr out of range or a
 *       gradient shape its target's slot cannot take is left to the Python loop (before any of its
 *       edges is made).
 *
 *   kept_colons(spec_nodes)  the colons msgspec's JSON encoder would write for these node specs (one per
 *       member, and those inside strings), or None for a value it does not count: load.py's
 *       _json_has_no_duplicates is the twin (it encodes them and counts), and why the count matters.
 *
 *   edges_and_devices(nodes)  a graph's edge count and its distinct devices in one pass over its
 *       nodes (graphs/model.py's Graph.num_edges and Graph.devices are the twins).
 *
 *   remap_nodes(olds, codes, devices, ...)  a graph's nodes made again on other devices, a copy node on
 *       each edge that crosses devices (what-if placements): graphs/remap.py's remap_nodes_py is the
 *       twin, and its docstring says what both do.
 *
 *   remap_variables(variables, fresh)  the variables of such a graph (graphs/remap.py's remap_variables_py).
 *
 * `st` is validate._Build: nodes, by_id, ops, metas (read), default_seqs, max_device_index and
 * forward (read, and written back on return). No lock: the loader runs on one thread; the GIL
 * is held throughout. configure() must have returned True first (the fields of Node and NodeSpec
 * are plain object slots in the expected order); otherwise validate.py uses its own loops only.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* A type's fields as plain object slots: their offsets, or getattr where a field is not one. */
typedef struct {
    PyTypeObject *type;
    int n;
    Py_ssize_t offsets[24];
    PyObject *names[24];
} Slots;

static int slots_configure(Slots *t, PyObject *type, PyObject *names) {
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > 24)
        return 0;
    for (Py_ssize_t f = 0; f < n; f++) {
        PyObject *name = PyTuple_GET_ITEM(names, f);
        PyObject *d = PyObject_GetAttr(type, name);
        if (d == NULL)
            return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 ((PyMemberDescrObject *)d)->d_common.d_type == (PyTypeObject *)type;
        if (ok)
            t->offsets[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok)
            return 0;
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        Py_XSETREF(t->names[f], name);
    }
    t->n = (int)n;
    Py_INCREF(type);
    Py_XSETREF(t->type, (PyTypeObject *)type);
    return 1;
}

/* obj.<field f>, borrowed when it is the exact type (NULL: unset slot, no exception), else a new
 * reference through getattr stored in *owned. */
static inline PyObject *slot(Slots *t, PyObject *obj, int f, PyObject **owned) {
    *owned = NULL;
    if (Py_TYPE(obj) == t->type) {
        PyObject *v = *(PyObject **)((char *)obj + t->offsets[f]);
        if (v != NULL)
            return v;
    }
    *owned = PyObject_GetAttr(obj, t->names[f]);
    return *owned;
}

static inline void slot_put(Slots *t, PyObject *obj, int f, PyObject *v) {
    PyObject **p = (PyObject **)((char *)obj + t->offsets[f]);
    Py_XSETREF(*p, Py_NewRef(v));
}

/* Node's fields, in dataclass order (validate passes dataclasses.fields(Node)'s names). */
enum { N_ID, N_NAME, N_OP, N_SEQ, N_NEXT, N_INPUTS, N_SAVED, N_ATTRS, N_VARIABLE, N_FWD, N_INDEX, N_TOPO,
       N_DEVICE, N_STREAM, N_CONSUMERS, N_CPU, N_SAVES, N_STRINGS, N_FIELDS };
static const char *NODE_FIELDS[N_FIELDS] = {"id", "name", "op", "seq", "next", "inputs", "saved", "attrs",
                                            "variable", "fwd_thread", "index", "topo_nr", "device", "stream",
                                            "consumers", "cpu", "saves_tensors", "saved_strings"};
/* NodeSpec's fields read here. */
enum { S_ID, S_NAME, S_OP, S_SEQ, S_FWD, S_NEXT, S_INPUTS, S_SAVED, S_ATTRS, S_VARIABLE, S_FIELDS };
static const char *SPEC_FIELDS[S_FIELDS] = {"id", "name", "op", "seq", "fwd_thread", "next", "inputs", "saved",
                                            "attrs", "variable"};

/* MetaSpec's fields, in its order (configure_colons checks them). */
enum { M_SHAPE, M_DTYPE, M_DEVICE, M_STREAM, M_FIELDS };
static const char *META_FIELDS[M_FIELDS] = {"shape", "dtype", "device", "stream"};

static Slots NODE = {0}, SPEC = {0}, META = {0};

/* Variable's fields, in dataclass order, and VariableSpec's (configure_variables checks both). */
enum { V_NAME, V_SHAPE, V_DTYPE, V_DEVICE, V_GRAD, V_NODE, V_REQUIRES_GRAD, V_HOOKS, V_FIELDS };
static const char *VARIABLE_FIELDS[V_FIELDS] = {"name", "shape", "dtype", "device", "grad", "node",
                                                "requires_grad", "hooks"};
enum { VS_NAME, VS_SHAPE, VS_DTYPE, VS_DEVICE, VS_GRAD, VS_REQUIRES_GRAD, VS_HOOKS, VS_FIELDS };
static const char *VARIABLE_SPEC_FIELDS[VS_FIELDS] = {"name", "shape", "dtype", "device", "grad", "requires_grad",
                                                      "hooks"};
static Slots VARIABLE = {0}, VARIABLE_SPEC = {0};
/* The defaults of Variable's fields from grad on (the dataclass's own), set on each variable made here. */
static PyObject *VARIABLE_DEFAULTS[V_FIELDS];
static int variables_ready = 0;

/* A variable's field f (new reference): read from its slot where configure_variables succeeded and it is a
 * Variable, else through getattr. */
static PyObject *variable_field(PyObject *var, int f, PyObject *name) {
    if (variables_ready && Py_TYPE(var) == VARIABLE.type) {
        PyObject *v = *(PyObject **)((char *)var + VARIABLE.offsets[f]);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(var, name);
}
static int colons_ready = 0;
static PyObject *EDGE_TYPE, *UNSET, *CPU, *EMPTY, *ACC, *ZERO, *MINUS_ONE, *MAX_SEQ, *FWD_END;
static PyObject *s_nexts, *s_ints, *s_device, *s_stream, *s_type, *s_index, *s_cpu, *s_random, *s_data, *s_npz, *s_count,
    *s_check_value, *s_check_required, *s_check_attrs, *s_elementwise, *s_expands_to, *s_grad_shapes, *s_shape, *s_inputs,
    *s_nodes, *s_by_id, *s_ops, *s_metas, *s_default_seqs, *s_max_device_index, *s_forward, *s_variables,
    *s_node, *s_requires_grad, *s_kind, *s_tensor, *s_int, *s_bool, *s_str, *s_dtype, *s__top_min, *s_bytes,
    *s_saved_tensors, *s__note, *s_check_broadcast, *s_saved, *s_cost, *s_us, *s_flops, *s_mode, *s_dim, *s_sizes;
static int configured = 0;

static PyObject *names_tuple(const char **names, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_InternFromString(names[i]);
        if (s == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

/* configure(Node, node_field_names, NodeSpec, Edge, UNSET, CPU, EMPTY, ACCUMULATE_GRAD, max_seq) -> bool */
static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *node_type, *node_names, *spec_type, *edge, *unset, *cpu, *empty, *acc, *max_seq;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOOO", &PyType_Type, &node_type, &PyTuple_Type, &node_names, &PyType_Type,
                          &spec_type, &PyType_Type, &edge, &unset, &cpu, &empty, &acc, &max_seq))
        return NULL;
    configured = 0;
    /* Node's fields must be exactly the ones this file sets, in this order. */
    if (PyTuple_GET_SIZE(node_names) != N_FIELDS)
        Py_RETURN_FALSE;
    for (int f = 0; f < N_FIELDS; f++) {
        PyObject *name = PyTuple_GET_ITEM(node_names, f);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, NODE_FIELDS[f]) != 0)
            Py_RETURN_FALSE;
    }
    if (!PyType_IsSubtype((PyTypeObject *)edge, &PyTuple_Type))
        Py_RETURN_FALSE;
    PyObject *spec_names = names_tuple(SPEC_FIELDS, S_FIELDS);
    if (spec_names == NULL)
        return NULL;
    int a = slots_configure(&NODE, node_type, node_names);
    int b = a > 0 ? slots_configure(&SPEC, spec_type, spec_names) : a;
    Py_DECREF(spec_names);
    if (a < 0 || b < 0)
        return NULL;
    if (!a || !b)
        Py_RETURN_FALSE;
    Py_XSETREF(EDGE_TYPE, Py_NewRef(edge));
    Py_XSETREF(UNSET, Py_NewRef(unset));
    Py_XSETREF(CPU, Py_NewRef(cpu));
    Py_XSETREF(EMPTY, Py_NewRef(empty));
    Py_XSETREF(ACC, Py_NewRef(acc));
    Py_XSETREF(MAX_SEQ, Py_NewRef(max_seq));
    configured = 1;
    Py_RETURN_TRUE;
}

/* 1 if v is an int with lo <= v < end (end NULL: v <= hi_incl), 0 if not (or not an int), -1 on error. */
static int int_in(PyObject *v, PyObject *lo, PyObject *hi, int inclusive) {
    if (!PyLong_CheckExact(v))
        return 0;
    int r = PyObject_RichCompareBool(v, lo, Py_GE);
    if (r <= 0)
        return r;
    return PyObject_RichCompareBool(v, hi, inclusive ? Py_LE : Py_LT);
}

/* The device of a node with these input metas (the first that is not the CPU), as validate does:
 * sets device, stream (borrowed) and cpu; -1 on error. */
static int node_device(PyObject *inputs, PyObject **device, PyObject **stream, int *cpu) {
    *device = CPU;
    *stream = ZERO;
    *cpu = 1;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(inputs); j++) {
        PyObject *meta = PyList_GET_ITEM(inputs, j);
        PyObject *d = PyObject_GetAttr(meta, s_device);
        if (d == NULL)
            return -1;
        if (d != CPU) {
            PyObject *t = PyObject_GetAttr(d, s_type);
            if (t == NULL) {
                Py_DECREF(d);
                return -1;
            }
            int is_cpu = PyObject_RichCompareBool(t, s_cpu, Py_EQ);
            Py_DECREF(t);
            if (is_cpu < 0) {
                Py_DECREF(d);
                return -1;
            }
            if (!is_cpu) {
                PyObject *s = PyObject_GetAttr(meta, s_stream);
                if (s == NULL) {
                    Py_DECREF(d);
                    return -1;
                }
                /* borrowed: the meta keeps both alive */
                *device = d;
                *stream = s;
                Py_DECREF(d);
                Py_DECREF(s);
                *cpu = 0;
                return 0;
            }
        }
        Py_DECREF(d);
    }
    return 0;
}

/* model.saves_tensors(op, saved), with the op's tensor_fields: 1, 0 or -1. */
static int saves_tensors(PyObject *tensor_fields, PyObject *saved) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    if (PyAnySet_Check(tensor_fields) && PySet_GET_SIZE(tensor_fields) > 0) {
        while (PyDict_Next(saved, &pos, &key, &value)) {
            int r = PySet_Contains(tensor_fields, key);
            if (r != 0)
                return r;
        }
    }
    pos = 0;
    while (PyDict_Next(saved, &pos, &key, &value)) {
        if (!PyDict_CheckExact(value))
            continue;
        int r = PyDict_Contains(value, s_random);
        if (r == 0)
            r = PyDict_Contains(value, s_data);
        if (r == 0)
            r = PyDict_Contains(value, s_npz);
        if (r != 0)
            return r;
    }
    return 0;
}

/* model.has_scalar_strings(op, saved), with the op's scalar_fields: 1, 0 or -1. */
static int has_scalar_strings(PyObject *scalar_fields, PyObject *saved) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    if (!PyAnySet_Check(scalar_fields) || PySet_GET_SIZE(scalar_fields) == 0)
        return 0;
    while (PyDict_Next(saved, &pos, &key, &value)) {
        if (PyUnicode_CheckExact(value)) {
            int r = PySet_Contains(scalar_fields, key);
            if (r != 0)
                return r;
        }
    }
    return 0;
}

static PyObject *st_get(PyObject *st, PyObject *name, PyTypeObject *type) {
    PyObject *v = PyObject_GetAttr(st, name);
    if (v != NULL && type != NULL && !Py_IS_TYPE(v, type)) {
        PyErr_Format(PyExc_TypeError, "_build: st.%U has the wrong type", name);
        Py_CLEAR(v);
    }
    return v;
}

/* The int object of value v to put in a node's index, seq or topo_nr: one object per value where `ints` (the
 * load's table, a list whose slot v holds the first int of value v put in a node, or None) has a slot v, so
 * the three numbers of a million nodes take about a million int objects, not three (64 bytes a node less);
 * else `obj`, or a new int where obj is NULL. A new reference; NULL and an exception where memory runs out. */
static PyObject *shared_int(PyObject *ints, long long v, PyObject *obj) {
    if (ints == NULL || v < 0 || v >= PyList_GET_SIZE(ints))
        return obj ? Py_NewRef(obj) : PyLong_FromLongLong(v);
    PyObject *have = PyList_GET_ITEM(ints, v);
    if (have != Py_None)
        return Py_NewRef(have);
    PyObject *o = obj ? Py_NewRef(obj) : PyLong_FromLongLong(v);
    if (o != NULL) {
        PyList_SET_ITEM(ints, v, Py_NewRef(o));
        Py_DECREF(have); /* (None's reference, held by the list until now) */
    }
    return o;
}

/* shared_int for an object that may be an int (a node's seq from the file): itself where it is not an exact int
 * or does not fit. */
static PyObject *shared_obj(PyObject *ints, PyObject *obj) {
    if (ints == NULL || !PyLong_CheckExact(obj))
        return Py_NewRef(obj);
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    return overflow ? Py_NewRef(obj) : shared_int(ints, v, obj);
}

/* Call checker.<method>(*args): 0, or -1 with its exception. */
static int call_check(PyObject *checker, PyObject *method, PyObject *const *args, size_t n) {
    PyObject *stack[6];
    stack[0] = checker;
    for (size_t k = 0; k < n; k++)
        stack[k + 1] = args[k];
    PyObject *r = PyObject_VectorcallMethod(method, stack, n + 1, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The saved-value checks that need no Python (tensors.quick_random_numel's limits, the dtypes narrower than
 * float32), set by configure_checks(). */
static long long MAX_DIMS = -1, MAX_NUMEL = -1;
static PyObject *NARROW = NULL;

/* validate's MAX_COST_US and MAX_COST_FLOPS (-1: not given, every attrs goes to check_attrs). */
static double MAX_COST_US = -1, MAX_COST_FLOPS = -1;

/* configure_checks(max_dims, max_numel, narrow_dtypes[, max_cost_us, max_cost_flops]) */
static PyObject *configure_checks(PyObject *mod, PyObject *args) {
    long long dims, numel;
    PyObject *narrow;
    double cost_us = -1, cost_flops = -1;
    if (!PyArg_ParseTuple(args, "LLO!|dd", &dims, &numel, &PyFrozenSet_Type, &narrow, &cost_us, &cost_flops))
        return NULL;
    MAX_DIMS = dims;
    MAX_NUMEL = numel;
    Py_XSETREF(NARROW, Py_NewRef(narrow));
    MAX_COST_US = cost_us;
    MAX_COST_FLOPS = cost_flops;
    Py_RETURN_NONE;
}

/* Whether check_attrs would pass `attrs` without a doubt, so it need not be called: exactly {"cost": C}, C null
 * or a dict of "us" and "flops" numbers (int or float, not bool) in [0, the limit] and a "mode" among spin, wait,
 * sleep and matmul (check_cost's rules; nothing else in attrs that check_attrs acts on, for any op). 0: the
 * Python check judges, and raises the file's error where there is one. Never raises. (The limits are below
 * 2**53, so an int that converts to a double within one is within it.) */
static int cost_attrs_ok(PyObject *attrs) {
    if (MAX_COST_US < 0 || !PyDict_CheckExact(attrs) || PyDict_GET_SIZE(attrs) != 1)
        return 0;
    PyObject *cost = PyDict_GetItemWithError(attrs, s_cost);
    if (cost == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (cost == Py_None)
        return 1;
    if (!PyDict_CheckExact(cost))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(cost, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k))
            return 0;
        if (PyUnicode_Compare(k, s_mode) == 0) {
            if (!PyUnicode_CheckExact(v))
                return 0;
            if (PyUnicode_CompareWithASCIIString(v, "spin") != 0 && PyUnicode_CompareWithASCIIString(v, "wait") != 0
                && PyUnicode_CompareWithASCIIString(v, "sleep") != 0
                && PyUnicode_CompareWithASCIIString(v, "matmul") != 0)
                return 0;
            continue;
        }
        double limit, d;
        if (PyUnicode_Compare(k, s_us) == 0)
            limit = MAX_COST_US;
        else if (PyUnicode_Compare(k, s_flops) == 0)
            limit = MAX_COST_FLOPS;
        else
            return 0;
        if (PyFloat_CheckExact(v))
            d = PyFloat_AS_DOUBLE(v);
        else if (PyLong_CheckExact(v)) {
            d = PyLong_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
        } else
            return 0;
        if (!(d >= 0 && d <= limit))
            return 0;
    }
    return 1;
}

/* tensors.quick_random_numel(value) for a dict: its element count, or -1 when it is not a plain
 * {"random": seed, "shape": [...]} spec within the limits (or is one the Python check must judge). */
static long long quick_random_numel(PyObject *value) {
    if (MAX_DIMS < 0 || PyDict_GET_SIZE(value) != 2)
        return -1;
    PyObject *seed = PyDict_GetItemWithError(value, s_random);
    PyObject *shape = seed ? PyDict_GetItemWithError(value, s_shape) : NULL;
    if (shape == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (!PyLong_CheckExact(seed) || !PyList_CheckExact(shape) || PyList_GET_SIZE(shape) > MAX_DIMS)
        return -1;
    int overflow;
    long long sd = PyLong_AsLongLongAndOverflow(seed, &overflow);
    if (overflow || sd < 0 || (sd == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    long long numel = 1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(shape); k++) {
        PyObject *d = PyList_GET_ITEM(shape, k);
        if (!PyLong_CheckExact(d))
            return -1;
        long long v = PyLong_AsLongLongAndOverflow(d, &overflow);
        if (overflow || v < 0 || (v == -1 && PyErr_Occurred()) || __builtin_mul_overflow(numel, v, &numel)) {
            PyErr_Clear();
            return -1;
        }
    }
    return numel <= MAX_NUMEL ? numel : -1;
}

/* The checker's _top_min (the smallest of its largest memory contributors), or -1 with an exception. */
static int read_top_min(PyObject *checker, long long *out) {
    PyObject *v = PyObject_GetAttr(checker, s__top_min);
    if (v == NULL)
        return -1;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        *out = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    return 0;
}

/* checker.<method>(node, i, *rest), then the checker's _top_min read again (the method may have noted a
 * contributor): 0, or -1 with the exception (the file's error, raised by the method). */
static int node_check(PyObject *checker, PyObject *method, PyObject *node, Py_ssize_t i, PyObject *const *rest,
                      size_t nrest, long long *top_min) {
    PyObject *index_o = PyLong_FromSsize_t(i);
    if (index_o == NULL)
        return -1;
    PyObject *a[5] = {node, index_o};
    for (size_t k = 0; k < nrest && k < 3; k++)
        a[2 + k] = rest[k];
    int r = call_check(checker, method, a, 2 + (nrest < 3 ? nrest : 3));
    Py_DECREF(index_o);
    return r < 0 || read_top_min(checker, top_min) < 0 ? -1 : 0;
}

/* One saved value the Python check_value would pass without raising, checked here: 1 done (its bytes added
 * to *saved_bytes; the checker's _note/check_broadcast called where they would be), 0 for check_value to
 * judge, -1 on error. `f` is the declared field or NULL. */
/* Whether a saved matrix of shape `shape` (a list) has input 0's sizes where OpSpec.matrix_dims says it
 * shares its dims (`dims`: that op's entry, or None): 1, 0 (check_value judges), -1. */
static int matrix_fits(PyObject *dims, PyObject *key, PyObject *shape, PyObject *inputs) {
    if (dims == Py_None || PyList_GET_SIZE(inputs) == 0)
        return 1;
    PyObject *pairs = PyDict_Check(dims) ? PyDict_GetItemWithError(dims, key) : NULL;
    if (pairs == NULL)
        return PyErr_Occurred() ? -1 : PyDict_Check(dims);
    PyObject *grad = PyObject_GetAttr(PyList_GET_ITEM(inputs, 0), s_shape);
    if (grad == NULL)
        return -1;
    int ok = PyTuple_Check(grad) && PyTuple_Check(pairs);
    for (Py_ssize_t k = 0; ok > 0 && k < PyTuple_GET_SIZE(pairs); k++) {
        PyObject *pair = PyTuple_GET_ITEM(pairs, k);
        Py_ssize_t d = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0)) : -1;
        Py_ssize_t e = d >= 0 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1)) : -1;
        if (PyErr_Occurred()) {
            ok = -1;
            break;
        }
        if (d < 0 || e < 0 || d >= PyList_GET_SIZE(shape) || e >= PyTuple_GET_SIZE(grad)) {
            ok = 0;
            break;
        }
        ok = PyObject_RichCompareBool(PyList_GET_ITEM(shape, d), PyTuple_GET_ITEM(grad, e), Py_EQ);
    }
    Py_DECREF(grad);
    return ok;
}

static int quick_value(PyObject *checker, PyObject *node, PyObject *inputs, PyObject *op, long rank, PyObject *dims,
                       Py_ssize_t i, PyObject *key, PyObject *value, PyObject *f, long long *saved_bytes,
                       long long *top_min) {
    PyObject *kind = NULL;
    if (f == NULL) {
        if (!PyDict_CheckExact(value))
            return 1; /* an undeclared field that is no tensor spec: not checked */
    } else {
        kind = PyObject_GetAttr(f, s_kind);
        if (kind == NULL)
            return -1;
        Py_DECREF(kind); /* the field keeps it */
        if (!PyUnicode_CheckExact(kind))
            return 0;
        if (PyUnicode_Compare(kind, s_tensor) != 0) {
            if (PyErr_Occurred())
                return -1;
            if (PyBool_Check(value))
                return PyUnicode_Compare(kind, s_bool) == 0;
            if (PyUnicode_CheckExact(value))
                return PyUnicode_Compare(kind, s_str) == 0;
            if (PyLong_CheckExact(value) && PyUnicode_Compare(kind, s_int) == 0) {
                int overflow;
                long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
                if (v == -1 && PyErr_Occurred())
                    return -1;
                return !overflow; /* beyond int64 (a uint64 spelling): check_value decides */
            }
            return 0;
        }
        if (!PyDict_CheckExact(value))
            return 0;
    }
    long long n = quick_random_numel(value);
    if (n < 0)
        return 0;
    PyObject *shape = PyDict_GetItem(value, s_shape); /* borrowed; a list (quick_random_numel) */
    if (f != NULL && rank >= 0) {
        if (PyList_GET_SIZE(shape) != rank)
            return 0;
        int fits = matrix_fits(dims, key, shape, inputs);
        if (fits <= 0)
            return fits;
    }
    *saved_bytes += 4 * n;
    PyObject *path = NULL, *index_o = NULL;
    int result = 1;
    if (4 * n > *top_min) {
        index_o = PyLong_FromSsize_t(i);
        path = index_o ? PyTuple_Pack(4, s_nodes, index_o, s_saved, key) : NULL;
        PyObject *nb = path ? PyLong_FromLongLong(4 * n) : NULL;
        PyObject *a[2] = {nb, path};
        int c = nb ? call_check(checker, s__note, a, 2) : -1;
        Py_XDECREF(nb);
        if (c < 0 || read_top_min(checker, top_min) < 0)
            result = -1;
    }
    if (result > 0 && PyList_GET_SIZE(inputs) > 0) {
        PyObject *ew = PyObject_GetAttr(op, s_elementwise);
        int is = ew ? PyObject_IsTrue(ew) : -1;
        Py_XDECREF(ew);
        if (is < 0)
            result = -1;
        if (is > 0) { /* the saved tensor broadcasts with the gradient: plainly so when of its shape */
            PyObject *meta = PyList_GET_ITEM(inputs, 0);
            PyObject *grad = PyObject_GetAttr(meta, s_shape), *dtype = grad ? PyObject_GetAttr(meta, s_dtype) : NULL;
            int plain = dtype != NULL && PyTuple_Check(grad) && PyTuple_GET_SIZE(grad) == PyList_GET_SIZE(shape);
            for (Py_ssize_t k = 0; plain > 0 && k < PyList_GET_SIZE(shape); k++)
                plain = PyObject_RichCompareBool(PyList_GET_ITEM(shape, k), PyTuple_GET_ITEM(grad, k), Py_EQ);
            if (plain > 0) {
                int narrow = PySet_Contains(NARROW, dtype);
                plain = narrow < 0 ? -1 : !narrow;
            }
            Py_XDECREF(grad);
            Py_XDECREF(dtype);
            if (plain < 0 || grad == NULL || dtype == NULL) { /* an error (getattr failed): never call on with it set */
                result = -1;
            } else if (!plain) {
                if (path == NULL) {
                    index_o = PyLong_FromSsize_t(i);
                    path = index_o ? PyTuple_Pack(4, s_nodes, index_o, s_saved, key) : NULL;
                }
                PyObject *tshape = path ? PyList_AsTuple(shape) : NULL;
                PyObject *a[4] = {tshape, node, path, key};
                if (tshape == NULL || call_check(checker, s_check_broadcast, a, 4) < 0 ||
                    read_top_min(checker, top_min) < 0)
                    result = -1;
                Py_XDECREF(tshape);
            }
        }
    }
    Py_XDECREF(path);
    Py_XDECREF(index_o);
    return result;
}

/* Add n to checker.bytes["saved tensors"]. */
/* checker.bytes[category] += n: 0, or -1 with the exception. */
static int add_bytes(PyObject *checker, PyObject *category, long long n) {
    if (n == 0)
        return 0;
    PyObject *bytes = PyObject_GetAttr(checker, s_bytes);
    if (bytes == NULL)
        return -1;
    PyObject *old = PyDict_Check(bytes) ? PyDict_GetItemWithError(bytes, category) : NULL;
    PyObject *add = old ? PyLong_FromLongLong(n) : NULL;
    PyObject *sum = add ? PyNumber_Add(old, add) : NULL;
    int r = sum ? PyDict_SetItem(bytes, category, sum) : -1;
    if (old == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "_build: checker.bytes has no %R", category);
    Py_XDECREF(add);
    Py_XDECREF(sum);
    Py_DECREF(bytes);
    return r;
}

/* The ops-cache entry (validate._Checker._nodes_py's `ops` values): (op, required, fields, needs,
 * takes_numbers, n_out, count_out, tensor_fields,
 * scalar_fields, the rank input 0 must have or -1, the dims saved matrices share with input 0 or None). */
enum { O_OP, O_REQUIRED, O_FIELDS, O_NEEDS, O_NUMBERS, O_NOUT, O_COUNT, O_TENSORS, O_SCALARS, O_RANK, O_DIMS,
       O_SIZE };

static PyObject *build_nodes(PyObject *mod, PyObject *args) {
    PyObject *checker, *specs, *st;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "OO!On", &checker, &PyList_Type, &specs, &st, &i))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure() has not succeeded");
        return NULL;
    }
    PyObject *nodes = st_get(st, s_nodes, &PyList_Type), *by_id = nodes ? st_get(st, s_by_id, &PyDict_Type) : NULL;
    PyObject *ops = by_id ? st_get(st, s_ops, &PyDict_Type) : NULL, *metas = ops ? st_get(st, s_metas, &PyDict_Type) : NULL;
    PyObject *variables = metas ? st_get(st, s_variables, &PyDict_Type) : NULL;
    PyObject *nexts = variables ? st_get(st, s_nexts, &PyList_Type) : NULL;
    PyObject *dflt = nexts ? st_get(st, s_default_seqs, NULL) : NULL;
    PyObject *maxdev_o = dflt ? st_get(st, s_max_device_index, NULL) : NULL;
    PyObject *ints = maxdev_o ? st_get(st, s_ints, &PyList_Type) : NULL;
    PyObject *result = NULL;
    /* spec input lists seen (by address, direct-mapped: the JSON reader shares one list between the nodes that
     * write the same text), each with its list of metas and the device and stream read from them; held, so
     * that no address is reused while it is compared */
    struct { PyObject *ins, *inputs, *device, *stream; int cpu; } seen_ins[16] = {{0}};
    if (ints == NULL)
        goto done;
    int default_seqs = PyObject_IsTrue(dflt);
    long long max_dev = PyLong_AsLongLong(maxdev_o);
    if (default_seqs < 0 || (max_dev == -1 && PyErr_Occurred()))
        goto done;
    /* saved tensors' bytes, added to the checker's count on the way out (a sum: order does not matter) */
    long long saved_bytes = 0, top_min;
    if (read_top_min(checker, &top_min) < 0)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(specs);
    for (; i < n; i++) {
        PyObject *ns = PyList_GET_ITEM(specs, i);
        PyObject *own[S_FIELDS] = {NULL};
        PyObject *v[S_FIELDS];
        int bad = 0;
        for (int f = 0; f < S_FIELDS; f++) {
            v[f] = slot(&SPEC, ns, f, &own[f]);
            if (v[f] == NULL) {
                bad = -1;
                break;
            }
        }
        PyObject *node = NULL, *inputs = NULL, *info, *seq, *fwd, *device = NULL, *stream = NULL;
        int cpu = 1;
#define NEXT_NODE(code) do { bad = (code); goto node_end; } while (0)
        if (bad)
            goto node_end;
        /* the id: a non-empty string not seen before */
        if (!PyUnicode_CheckExact(v[S_ID]) || PyUnicode_GET_LENGTH(v[S_ID]) == 0)
            NEXT_NODE(1);
        /* (whether the id is new: one look-up in the id table, where the node goes in below) */
        /* the op, from the cache of op texts already resolved */
        PyObject *op_text = (v[S_OP] == UNSET || v[S_OP] == Py_None) ? v[S_NAME] : v[S_OP];
        info = PyDict_GetItemWithError(ops, op_text);
        if (info == NULL)
            NEXT_NODE(PyErr_Occurred() ? -1 : 1);
        if (!PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != O_SIZE)
            NEXT_NODE(1);
        PyObject *op = PyTuple_GET_ITEM(info, O_OP);
        /* an AccumulateGrad: its variable known, requiring grad, without a node yet (else the Python loop's) */
        int is_acc = op == ACC;
        PyObject *var = NULL; /* borrowed from st.variables */
        if (is_acc) {
            if (!PyUnicode_CheckExact(v[S_VARIABLE]))
                NEXT_NODE(1);
            var = PyDict_GetItemWithError(variables, v[S_VARIABLE]);
            if (var == NULL)
                NEXT_NODE(PyErr_Occurred() ? -1 : 1);
            PyObject *has = variable_field(var, V_NODE, s_node);
            if (has == NULL)
                NEXT_NODE(-1);
            Py_DECREF(has);
            if (has != Py_None)
                NEXT_NODE(1);
            PyObject *rg = variable_field(var, V_REQUIRES_GRAD, s_requires_grad);
            if (rg == NULL)
                NEXT_NODE(-1);
            Py_DECREF(rg);
            if (rg != Py_True)
                NEXT_NODE(1);
            if (PyList_Check(v[S_NEXT]) && PyList_GET_SIZE(v[S_NEXT]) > 0)
                NEXT_NODE(1);
        } else if (v[S_VARIABLE] != UNSET && v[S_VARIABLE] != Py_None) {
            NEXT_NODE(1);
        }
        /* seq and fwd_thread */
        seq = v[S_SEQ];
        if (seq == UNSET || seq == Py_None) {
            seq = is_acc ? MAX_SEQ : NULL; /* an AccumulateGrad runs last among equals, as in PyTorch */
        } else {
            int ok = int_in(seq, ZERO, MAX_SEQ, 1);
            if (ok <= 0)
                NEXT_NODE(ok < 0 ? -1 : 1);
        }
        fwd = v[S_FWD];
        if (fwd == UNSET) {
            fwd = Py_None;
        } else if (fwd != Py_None) {
            int ok = int_in(fwd, ZERO, FWD_END, 0);
            if (ok <= 0)
                NEXT_NODE(ok < 0 ? -1 : 1);
        }
        /* input metadata: each one seen before (the first of each kind is made by the Python loop); a spec
         * input list seen before (seen_ins): the list of metas, device and stream made for it again (no node's
         * list is ever changed once made) */
        PyObject *ins = v[S_INPUTS];
        Py_ssize_t nin = PyList_Check(ins) ? PyList_GET_SIZE(ins) : 0;
        int slot_ins = (int)(((uintptr_t)ins >> 4) & 15);
        int same_ins = seen_ins[slot_ins].ins == ins;
        if (same_ins) {
            inputs = Py_NewRef(seen_ins[slot_ins].inputs);
        } else {
            inputs = PyList_New(nin);
            if (inputs == NULL)
                NEXT_NODE(-1);
            for (Py_ssize_t j = 0; j < nin; j++) {
                PyObject *meta = PyDict_GetItemWithError(metas, PyList_GET_ITEM(ins, j));
                if (meta == NULL)
                    NEXT_NODE(PyErr_Occurred() ? -1 : 1);
                PyList_SET_ITEM(inputs, j, Py_NewRef(meta));
            }
        }
        if (is_acc) { /* one input, of the variable's shape and device (none given: the Python loop makes it) */
            if (nin != 1)
                NEXT_NODE(1);
            int same = 1;
            for (int k = 0; k < 2 && same > 0; k++) {
                PyObject *name = k ? s_device : s_shape;
                PyObject *have = PyObject_GetAttr(PyList_GET_ITEM(inputs, 0), name);
                PyObject *want = have ? variable_field(var, k ? V_DEVICE : V_SHAPE, name) : NULL;
                same = want ? (have == want ? 1 : PyObject_RichCompareBool(have, want, Py_EQ)) : -1;
                Py_XDECREF(have);
                Py_XDECREF(want);
            }
            if (same <= 0)
                NEXT_NODE(same < 0 ? -1 : 1);
        }
        if (same_ins) {
            device = seen_ins[slot_ins].device, stream = seen_ins[slot_ins].stream, cpu = seen_ins[slot_ins].cpu;
        } else {
            if (node_device(inputs, &device, &stream, &cpu) < 0)
                NEXT_NODE(-1);
            Py_XSETREF(seen_ins[slot_ins].ins, Py_NewRef(ins));
            Py_XSETREF(seen_ins[slot_ins].inputs, Py_NewRef(inputs)); /* (holds the metas device and stream are from) */
            seen_ins[slot_ins].device = device, seen_ins[slot_ins].stream = stream, seen_ins[slot_ins].cpu = cpu;
        }
        long rank = PyLong_AsLong(PyTuple_GET_ITEM(info, O_RANK));
        if (rank == -1 && PyErr_Occurred())
            NEXT_NODE(-1);
        if (rank >= 0 && nin > 0) {
            PyObject *shape = PyObject_GetAttr(PyList_GET_ITEM(inputs, 0), s_shape);
            if (shape == NULL)
                NEXT_NODE(-1);
            Py_ssize_t dims = PyObject_Length(shape);
            Py_DECREF(shape);
            if (dims < 0)
                NEXT_NODE(-1);
            if (dims != rank)
                NEXT_NODE(1);
        }
        /* saved values: a null is the Python loop's (it drops optional Scalars written null) */
        PyObject *saved = v[S_SAVED];
        if (!PyDict_Check(saved) || PyDict_GET_SIZE(saved) == 0) {
            saved = NULL;
        } else {
            PyObject *key, *value;
            Py_ssize_t pos = 0;
            while (PyDict_Next(saved, &pos, &key, &value))
                if (value == Py_None)
                    NEXT_NODE(1);
        }
        PyObject *attrs = PyDict_Check(v[S_ATTRS]) && PyDict_GET_SIZE(v[S_ATTRS]) ? v[S_ATTRS] : NULL;
        /* the number of next edges, and the saved fields an output's gradient needs */
        PyObject *nxt = v[S_NEXT];
        Py_ssize_t nnext = PyList_Check(nxt) ? PyList_GET_SIZE(nxt) : 0;
        long n_out = PyLong_AsLong(PyTuple_GET_ITEM(info, O_NOUT));
        if (n_out == -1 && PyErr_Occurred())
            NEXT_NODE(-1);
        if (n_out >= 0 && nnext != n_out)
            NEXT_NODE(1);
        PyObject *needs = PyTuple_GET_ITEM(info, O_NEEDS);
        if (needs != Py_None) {
            PyObject *fast = PySequence_Fast(needs, "needs");
            if (fast == NULL)
                NEXT_NODE(-1);
            for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); k++) {
                PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
                if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                    Py_DECREF(fast);
                    NEXT_NODE(1);
                }
                Py_ssize_t out = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
                if (out == -1 && PyErr_Occurred()) {
                    Py_DECREF(fast);
                    NEXT_NODE(-1);
                }
                if (out >= 0 && out < nnext && PyList_GET_ITEM(nxt, out) != Py_None) {
                    PyObject *have = saved ? PyDict_GetItemWithError(saved, PyTuple_GET_ITEM(item, 1)) : NULL;
                    if (have == NULL) {  /* (a null is never here: see above) */
                        Py_DECREF(fast);
                        NEXT_NODE(PyErr_Occurred() ? -1 : 1);
                    }
                }
            }
            Py_DECREF(fast);
        }
        /* the node */
        node = NODE.type->tp_alloc(NODE.type, 0);
        /* its next list: the file's own, whose edges link_edges makes in place (no second list a node: 56 bytes
         * a node at the load's peak, the end of this loop) */
        PyObject *next_list = node == NULL ? NULL : PyList_CheckExact(v[S_NEXT]) ? Py_NewRef(v[S_NEXT]) : PyList_New(0);
        PyObject *index = next_list ? shared_int(ints, i, NULL) : NULL;
        PyObject *seq_o = index ? shared_obj(ints, seq ? seq : MINUS_ONE) : NULL;
        if (seq_o == NULL) {
            Py_XDECREF(next_list);
            Py_XDECREF(index);
            NEXT_NODE(-1);
        }
        if (seq == NULL)
            default_seqs = 1;
        slot_put(&NODE, node, N_ID, v[S_ID]);
        {   /* the name shared with every node of the same name (as the Python loop's sys.intern) */
            PyObject *name = Py_NewRef(v[S_NAME]);
            if (PyUnicode_CheckExact(name))
                PyUnicode_InternInPlace(&name);
            slot_put(&NODE, node, N_NAME, name);
            Py_DECREF(name);
        }
        slot_put(&NODE, node, N_OP, op);
        slot_put(&NODE, node, N_SEQ, seq_o);
        slot_put(&NODE, node, N_NEXT, next_list);
        slot_put(&NODE, node, N_INPUTS, inputs);
        slot_put(&NODE, node, N_SAVED, saved ? saved : EMPTY);
        slot_put(&NODE, node, N_ATTRS, attrs ? attrs : EMPTY);
        slot_put(&NODE, node, N_VARIABLE, is_acc ? v[S_VARIABLE] : Py_None);
        slot_put(&NODE, node, N_FWD, fwd);
        slot_put(&NODE, node, N_INDEX, index);
        slot_put(&NODE, node, N_TOPO, ZERO);
        slot_put(&NODE, node, N_DEVICE, device);
        slot_put(&NODE, node, N_STREAM, stream);
        slot_put(&NODE, node, N_CONSUMERS, Py_None); /* (made when first needed: model.ensure_consumers) */
        slot_put(&NODE, node, N_CPU, cpu ? Py_True : Py_False);
        slot_put(&NODE, node, N_SAVES, Py_False);
        slot_put(&NODE, node, N_STRINGS, Py_False);
        Py_DECREF(next_list);
        Py_DECREF(index);
        Py_DECREF(seq_o);
        /* a count of outputs that depends on the node (saved lists, inputs): a mismatch is the Python loop's */
        PyObject *count_out = PyTuple_GET_ITEM(info, O_COUNT);
        if (count_out != Py_None) {
            PyObject *want = PyObject_CallMethodOneArg(count_out, s_count, node);
            if (want == NULL)
                NEXT_NODE(-1);
            if (want != Py_None) {
                Py_ssize_t w = PyLong_AsSsize_t(want);
                Py_DECREF(want);
                if (w == -1 && PyErr_Occurred())
                    NEXT_NODE(-1);
                if (w != nnext)
                    NEXT_NODE(1);
            } else {
                Py_DECREF(want);
            }
        }
        if (!cpu) {
            PyObject *idx = PyObject_GetAttr(device, s_index);
            long long d = idx ? PyLong_AsLongLong(idx) : -1;
            Py_XDECREF(idx);
            if (d == -1 && PyErr_Occurred())
                NEXT_NODE(-1);
            if (d > max_dev)
                max_dev = d;
        }
        {
            PyObject *had = PyDict_SetDefault(by_id, v[S_ID], node);
            if (had == NULL)
                NEXT_NODE(-1);
            if (had != node) /* an id seen before: the Python loop says so */
                NEXT_NODE(1);
        }
        if (PyList_Append(nodes, node) < 0)
            NEXT_NODE(-1);
        if (is_acc && variables_ready && Py_TYPE(var) == VARIABLE.type)
            slot_put(&VARIABLE, var, V_NODE, node);
        else if (is_acc && PyObject_SetAttr(var, s_node, node) < 0)
            NEXT_NODE(-1);
        /* From here on an error is the file's: the checker's methods raise it (the node stays made). */
        if (saved) {
            int r = saves_tensors(PyTuple_GET_ITEM(info, O_TENSORS), saved);
            if (r < 0)
                NEXT_NODE(-1);
            if (r)
                slot_put(&NODE, node, N_SAVES, Py_True);
            PyObject *numbers = PyTuple_GET_ITEM(info, O_NUMBERS), *fields = PyTuple_GET_ITEM(info, O_FIELDS);
            PyObject *key, *value;
            Py_ssize_t pos = 0;
            while (PyDict_Next(saved, &pos, &key, &value)) {
                if (PyLong_CheckExact(value) || PyFloat_CheckExact(value)) {
                    int in = PySet_Contains(numbers, key);
                    if (in < 0)
                        break;
                    if (in)
                        continue;
                }
                PyObject *f = PyDict_Check(fields) ? PyDict_GetItemWithError(fields, key) : NULL;
                if (f == NULL && PyErr_Occurred())
                    break;
                Py_INCREF(key);
                Py_INCREF(value);
                int q = quick_value(checker, node, inputs, op, rank, PyTuple_GET_ITEM(info, O_DIMS), i, key, value, f,
                                    &saved_bytes, &top_min);
                if (q == 0) {
                    PyObject *rest[3] = {key, value, f ? f : Py_None};
                    q = node_check(checker, s_check_value, node, i, rest, 3, &top_min) < 0 ? -1 : 1;
                }
                Py_DECREF(key);
                Py_DECREF(value);
                if (q < 0)
                    break;
            }
            if (PyErr_Occurred())
                NEXT_NODE(-1);
            r = has_scalar_strings(PyTuple_GET_ITEM(info, O_SCALARS), saved);
            if (r < 0)
                NEXT_NODE(-1);
            if (r)
                slot_put(&NODE, node, N_STRINGS, Py_True);
        }
        PyObject *required = PyTuple_GET_ITEM(info, O_REQUIRED);
        if (PyTuple_Check(required) && PyTuple_GET_SIZE(required)) {
            int missing = 0;
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(required) && !missing; k++) {
                int r = saved ? PyDict_Contains(saved, PyTuple_GET_ITEM(required, k)) : 0;
                if (r < 0)
                    NEXT_NODE(-1);
                missing = !r;
            }
            if (missing && node_check(checker, s_check_required, node, i, &required, 1, &top_min) < 0)
                NEXT_NODE(-1);
        }
        if (attrs && !cost_attrs_ok(attrs) && node_check(checker, s_check_attrs, node, i, &attrs, 1, &top_min) < 0)
            NEXT_NODE(-1);
        /* its next edges kept for link_edges; the spec let go (the Node takes its place in the list, so an
         * error's place still names the node's id): its other objects are freed as the loop goes on */
        if (PyList_Append(nexts, v[S_NEXT]) < 0)
            NEXT_NODE(-1);
        /* (v[] is not read past here: the spec's own values may go with it) */
        if (PyList_SetItem(specs, i, Py_NewRef(node)) < 0)
            NEXT_NODE(-1);
node_end:
#undef NEXT_NODE
        Py_XDECREF(node);
        Py_XDECREF(inputs);
        for (int f = 0; f < S_FIELDS; f++)
            Py_XDECREF(own[f]);
        if (bad < 0)
            goto done;
        if (bad > 0)
            break;
    }
    if (add_bytes(checker, s_saved_tensors, saved_bytes) < 0)
        goto done;
    saved_bytes = 0;
    {
        PyObject *m = PyLong_FromLongLong(max_dev);
        if (m == NULL || PyObject_SetAttr(st, s_max_device_index, m) < 0 ||
            PyObject_SetAttr(st, s_default_seqs, default_seqs ? Py_True : Py_False) < 0) {
            Py_XDECREF(m);
            goto done;
        }
        Py_DECREF(m);
    }
    result = PyLong_FromSsize_t(i);
done:
    for (int k = 0; k < 16; k++) {
        Py_XDECREF(seen_ins[k].ins);
        Py_XDECREF(seen_ins[k].inputs);
    }
    Py_XDECREF(nodes);
    Py_XDECREF(by_id);
    Py_XDECREF(ops);
    Py_XDECREF(metas);
    Py_XDECREF(variables);
    Py_XDECREF(nexts);
    Py_XDECREF(dflt);
    Py_XDECREF(maxdev_o);
    Py_XDECREF(ints);
    return result;
}

/* PyTorch's is_expandable_to(shape, desired) over two tuples of ints: 1, 0 (or not tuples of ints), -1. */
static int expandable(PyObject *shape, PyObject *desired) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(desired))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(shape), m = PyTuple_GET_SIZE(desired);
    if (n > m)
        return 0;
    for (Py_ssize_t k = 1; k <= n; k++) {
        PyObject *a = PyTuple_GET_ITEM(shape, n - k), *b = PyTuple_GET_ITEM(desired, m - k);
        if (!PyLong_CheckExact(a) || !PyLong_CheckExact(b))
            return 0;
        int eq = PyObject_RichCompareBool(a, b, Py_EQ);
        if (eq < 0)
            return -1;
        if (!eq) {
            int overflow;
            long long av = PyLong_AsLongLongAndOverflow(a, &overflow);
            if (av == -1 && PyErr_Occurred())
                return -1;
            if (overflow || av != 1)
                return 0;
        }
    }
    return 1;
}

/* What link_edges asks of a node's op, for the last op met (a graph's nodes come in runs of a few ops): whether
 * it is elementwise, and whether it expands its gradient to saved sizes (OpSpec.expands_to not ""). The op is
 * held while cached, so its address cannot be another op's. */
static PyObject *edge_op = NULL;
static int edge_op_elementwise = 0, edge_op_expands = 0, edge_op_part = 0;
/* its OpSpec.grad_shapes where that is a dict (a matrix product's gradients' shapes), else NULL; held */
static PyObject *edge_op_grad_shapes = NULL;

static int edge_op_flags(PyObject *op) {
    if (op == edge_op)
        return 0;
    PyObject *ew = PyObject_GetAttr(op, s_elementwise);
    int is = ew ? PyObject_IsTrue(ew) : -1;
    Py_XDECREF(ew);
    PyObject *ex = is < 0 ? NULL : PyObject_GetAttr(op, s_expands_to);
    int expands = ex ? PyObject_IsTrue(ex) : -1;
    Py_XDECREF(ex);
    PyObject *gs = expands < 0 ? NULL : PyObject_GetAttr(op, s_grad_shapes);
    if (is < 0 || expands < 0 || gs == NULL)
        return -1;
    Py_XSETREF(edge_op, Py_NewRef(op));
    edge_op_elementwise = is;
    edge_op_expands = expands;
    edge_op_part = PyUnicode_Check(gs) && PyUnicode_CompareWithASCIIString(gs, "part") == 0;
    if (PyDict_Check(gs)) {
        Py_XSETREF(edge_op_grad_shapes, gs);
    } else {
        Py_DECREF(gs);
        Py_CLEAR(edge_op_grad_shapes);
    }
    return 0;
}

/* The shape of a node's gradient k where its op declares it (validate._grad_shape): from edge_op_grad_shapes[k],
 * one (source, dim) per dim, the source "grad" (the node's input 0) or a saved field written as a spec with a
 * shape; or "reversed": input 0's dims in reverse order (t()). A new tuple; NULL where not known (*err 0) or on
 * an error (*err 1). */
static PyObject *grad_shape_of(PyObject *node, Py_ssize_t k, int *err) {
    *err = 0;
    PyObject *key = PyLong_FromSsize_t(k);
    PyObject *spec = key ? PyDict_GetItemWithError(edge_op_grad_shapes, key) : NULL; /* borrowed */
    Py_XDECREF(key);
    int reversed = spec != NULL && PyUnicode_Check(spec) && PyUnicode_CompareWithASCIIString(spec, "reversed") == 0;
    if (spec == NULL || !(PyTuple_Check(spec) || reversed)) {
        *err = PyErr_Occurred() != NULL;
        return NULL;
    }
    PyObject *own_in, *own_saved;
    PyObject *ins = slot(&NODE, node, N_INPUTS, &own_in);
    PyObject *saved = ins ? slot(&NODE, node, N_SAVED, &own_saved) : NULL; /* (t() saves nothing: not a dict) */
    if (saved == NULL) {
        Py_XDECREF(own_in);
        *err = 1;
        return NULL;
    }
    PyObject *grad = NULL, *out = NULL;
    if (PyList_Check(ins) && PyList_GET_SIZE(ins) > 0) {
        grad = PyObject_GetAttr(PyList_GET_ITEM(ins, 0), s_shape);
        if (grad == NULL)
            *err = 1;
    }
    Py_ssize_t n = 0;
    if (grad != NULL && reversed) { /* t(): the incoming gradient's dims in reverse order */
        Py_ssize_t m = PyTuple_Check(grad) ? PyTuple_GET_SIZE(grad) : -1;
        out = m < 0 ? NULL : PyTuple_New(m);
        if (m >= 0 && out == NULL)
            *err = 1;
        for (Py_ssize_t d = 0; out != NULL && d < m; d++)
            PyTuple_SET_ITEM(out, d, Py_NewRef(PyTuple_GET_ITEM(grad, m - 1 - d)));
    } else if (grad != NULL) {
        n = PyTuple_GET_SIZE(spec);
        out = PyTuple_New(n);
        if (out == NULL)
            *err = 1;
    }
    for (Py_ssize_t d = 0; out != NULL && d < n; d++) {
        PyObject *pair = PyTuple_GET_ITEM(spec, d), *shape = NULL;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(pair, 1))) {
            Py_CLEAR(out);
            break;
        }
        PyObject *src = PyTuple_GET_ITEM(pair, 0);
        Py_ssize_t dim = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        if (PyUnicode_Check(src) && PyUnicode_CompareWithASCIIString(src, "grad") == 0) {
            shape = grad;
        } else {
            PyObject *v = PyDict_Check(saved) ? PyDict_GetItemWithError(saved, src) : NULL; /* borrowed */
            shape = v != NULL && PyDict_CheckExact(v) ? PyDict_GetItemWithError(v, s_shape) : NULL;
            if (shape == NULL && PyErr_Occurred()) {
                *err = 1;
                Py_CLEAR(out);
                break;
            }
            if (shape != NULL && !PyList_Check(shape))
                shape = NULL;
        }
        PyObject *size = NULL;
        if (shape != NULL && dim >= 0) {
            if (PyTuple_Check(shape) && dim < PyTuple_GET_SIZE(shape))
                size = PyTuple_GET_ITEM(shape, dim);
            else if (PyList_Check(shape) && dim < PyList_GET_SIZE(shape))
                size = PyList_GET_ITEM(shape, dim);
        }
        if (size == NULL || !PyLong_CheckExact(size)) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, d, Py_NewRef(size));
    }
    Py_XDECREF(grad);
    Py_XDECREF(own_in);
    Py_XDECREF(own_saved);
    return out;
}

/* A cat's gradient k (validate._part_shape): the incoming gradient with its dim `dim` (saved, default 0; a
 * uint64 read back signed) sized as saved `sizes`[k], or else as `want` (the consumer's slot) there. A new tuple;
 * NULL where not known (*err 0) or on an error (*err 1). */
static PyObject *part_shape_of(PyObject *node, Py_ssize_t k, PyObject *want, int *err) {
    *err = 0;
    PyObject *own_in, *own_saved;
    PyObject *ins = slot(&NODE, node, N_INPUTS, &own_in);
    PyObject *saved = ins ? slot(&NODE, node, N_SAVED, &own_saved) : NULL;
    if (saved == NULL) {
        Py_XDECREF(own_in);
        *err = 1;
        return NULL;
    }
    PyObject *grad = NULL, *out = NULL;
    /* a node that saves nothing holds the loader's one empty mapping (not a dict): the defaults */
    int is_dict = PyDict_Check(saved), none = !is_dict && PyObject_Length(saved) == 0;
    if (!is_dict && !none && PyErr_Occurred())
        *err = 1;
    if (PyList_Check(ins) && PyList_GET_SIZE(ins) > 0 && (is_dict || none) && PyTuple_Check(want)) {
        grad = PyObject_GetAttr(PyList_GET_ITEM(ins, 0), s_shape);
        if (grad == NULL)
            *err = 1;
    }
    Py_ssize_t n = grad != NULL && PyTuple_Check(grad) ? PyTuple_GET_SIZE(grad) : 0;
    PyObject *dim = n > 0 && is_dict ? PyDict_GetItemWithError(saved, s_dim) : NULL; /* borrowed */
    PyObject *sizes = n > 0 && is_dict && (dim != NULL || !PyErr_Occurred()) ?
        PyDict_GetItemWithError(saved, s_sizes) : NULL;
    if (PyErr_Occurred()) {
        *err = 1;
        n = 0;
    }
    long long d = 0;
    if (n > 0 && dim != NULL) {
        int overflow;
        d = PyLong_CheckExact(dim) ? PyLong_AsLongLongAndOverflow(dim, &overflow) : (overflow = 2, 0);
        if (overflow == 1) { /* 2**63 .. 2**64-1: PyTorch's uint64 of a negative dim */
            unsigned long long u = PyLong_AsUnsignedLongLong(dim);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                n = 0;
            } else {
                d = (long long)u;
            }
        } else if (overflow != 0) {
            n = 0;
        }
    }
    if (n > 0) {
        d %= (long long)n;
        if (d < 0)
            d += n;
        PyObject *size = NULL;
        Py_ssize_t wn = PyTuple_GET_SIZE(want);
        int legacy_empty = wn == 1 && PyLong_CheckExact(PyTuple_GET_ITEM(want, 0)) &&
                           PyLong_AsLong(PyTuple_GET_ITEM(want, 0)) == 0; /* cat skips it: its gradient is (0,) */
        if (legacy_empty) {
            size = NULL;
        } else if (sizes != NULL && PyList_Check(sizes)) {
            if (k < PyList_GET_SIZE(sizes))
                size = PyList_GET_ITEM(sizes, k);
        } else if (wn > d) {
            size = PyTuple_GET_ITEM(want, d);
        }
        if (size != NULL && PyLong_CheckExact(size)) {
            out = PyTuple_New(n);
            if (out == NULL)
                *err = 1;
            for (Py_ssize_t j = 0; out != NULL && j < n; j++)
                PyTuple_SET_ITEM(out, j, Py_NewRef(j == d ? size : PyTuple_GET_ITEM(grad, j)));
        }
    }
    Py_XDECREF(grad);
    Py_XDECREF(own_in);
    Py_XDECREF(own_saved);
    return out;
}

/* The shape of a node's gradient out of an elementwise op (its first input's), borrowed; NULL if none. A node
 * whose op expands its gradient to saved sizes sets *err to 2: the Python loop checks its edges (a few nodes a
 * graph: a loss's sum or mean). */
static PyObject *out_shape_of(PyObject *node, int *err) {
    PyObject *own_op, *own_in;
    *err = 0;
    PyObject *op = slot(&NODE, node, N_OP, &own_op);
    if (op == NULL) {
        *err = 1;
        return NULL;
    }
    int r = edge_op_flags(op);
    Py_XDECREF(own_op);
    if (r < 0) {
        *err = 1;
        return NULL;
    }
    if (edge_op_expands) {
        *err = 2;
        return NULL;
    }
    if (!edge_op_elementwise)
        return NULL;
    PyObject *ins = slot(&NODE, node, N_INPUTS, &own_in);
    PyObject *shape = NULL;
    if (ins == NULL) {
        *err = 1;
    } else if (PyList_Check(ins) && PyList_GET_SIZE(ins) > 0) {
        shape = PyObject_GetAttr(PyList_GET_ITEM(ins, 0), s_shape);
        if (shape == NULL)
            *err = 1;
        else
            Py_DECREF(shape); /* the meta keeps it */
    }
    Py_XDECREF(own_in);
    return shape;
}

/* Two exact str objects with the same text (what the id table's lookup would find equal). */
static inline int same_text(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyUnicode_CheckExact(a) || PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) ||
        PyUnicode_KIND(a) != PyUnicode_KIND(b))
        return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a)) == 0;
}

/* How many nodes after a node link_edges looks at, by the id's hash, before the id table: an MLP's layer lists
 * its add, matrix product and AccumulateGrad nodes within four of each other; a random DAG's ops (gen random)
 * take half their values from the 32 ops made before. Their ids' hashes are kept in a ring as the loop goes,
 * so the look costs a few reads of one small array, where a look-up in a table of a million ids misses the
 * cache at every step. */
#define NEARBY 32
/* (a power of two above NEARBY: the ring of the next nodes' id hashes) */
#define RING 64

/* A node's id where it is a Node whose id is a string (borrowed; each node's id is in the id table by now, so
 * its hash is kept in the string), else NULL. */
static inline PyObject *node_id_text(PyObject *node) {
    PyObject *id = Py_TYPE(node) == NODE.type ? *(PyObject **)((char *)node + NODE.offsets[N_ID]) : NULL;
    return id != NULL && PyUnicode_CheckExact(id) ? id : NULL;
}

/* The first of the NEARBY nodes after node i whose id is `tid` (its hash h; `ring` holds their ids' hashes at
 * their index mod RING), borrowed, or NULL. */
static inline PyObject *nearby_target(PyObject *nodes, const Py_hash_t *ring, Py_ssize_t i, Py_hash_t h,
                                      PyObject *tid) {
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    for (Py_ssize_t d = 1; d <= NEARBY && i + d < n; d++) {
        if (ring[(i + d) & (RING - 1)] != h)
            continue;
        PyObject *guess = PyList_GET_ITEM(nodes, i + d), *gid = node_id_text(guess);
        if (gid != NULL && same_text(gid, tid))
            return guess;
    }
    return NULL;
}

/* How many nodes' edges link_edges resolves at once (BATCH), and how many edges of a node at most (HINTS). */
#define BATCH 16
#define HINTS 8
_Static_assert(RING >= BATCH + NEARBY, "the ring holds a batch's nodes and the NEARBY after them");

/* The targets of the edges of nodes lo..hi-1 (hi - lo <= BATCH), as link_edges' loop would find them: the
 * first of the NEARBY nodes after a node whose id is the edge's target text, else the id table's node; NULL
 * where it would not find one plainly (not a list of (id, input) pairs, an id that is not a string, more
 * than HINTS edges, an error: the loop then looks as before and says what is wrong). Done for a batch of nodes
 * before any of their edges is made, with each target's node object and its input list fetched ahead: a random
 * DAG's targets lie anywhere in memory, and the look-ups of one batch miss the cache together rather than one
 * after the other. */
static int resolve_batch(PyObject *nodes, PyObject *nexts, PyObject *by_id, Py_ssize_t lo, Py_ssize_t hi,
                          PyObject *hint[BATCH][HINTS], Py_hash_t *ring, Py_ssize_t *filled) {
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    /* the ring: the hashes of the ids of nodes lo+1 .. hi+NEARBY-1 at their index mod RING (> BATCH + NEARBY),
     * kept from batch to batch (`filled`: the first node not in it) */
    Py_ssize_t top = hi + NEARBY < n ? hi + NEARBY : n;
    for (Py_ssize_t g = *filled > lo ? *filled : lo + 1; g < top; g++) {
        PyObject *gid = node_id_text(PyList_GET_ITEM(nodes, g));
        ring[g & (RING - 1)] = gid != NULL ? ((PyASCIIObject *)gid)->hash : -1;
    }
    if (top > *filled)
        *filled = top;
    unsigned far = 0; /* (whether any target came from the id table: only those are fetched ahead) */
    for (Py_ssize_t j = lo; j < hi; j++) {
        PyObject **row = hint[j - lo];
        for (int k = 0; k < HINTS; k++)
            row[k] = NULL;
        PyObject *nxt = PyList_GET_ITEM(nexts, j);
        Py_ssize_t m = PyList_Check(nxt) ? PyList_GET_SIZE(nxt) : 0;
        if (m > HINTS)
            continue;
        for (Py_ssize_t k = 0; k < m; k++) {
            PyObject *e = PyList_GET_ITEM(nxt, k);
            if (e == Py_None)
                continue;
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2)
                break;
            PyObject *tid = PyTuple_GET_ITEM(e, 0), *target = NULL;
            if (!PyUnicode_CheckExact(tid))
                break;
            Py_hash_t h = PyObject_Hash(tid);
            if (h == -1) {
                PyErr_Clear();
                break;
            }
            target = nearby_target(nodes, ring, j, h, tid);
            if (target == NULL) {
                target = PyDict_GetItemWithError(by_id, tid);
                if (target == NULL) {
                    PyErr_Clear();
                    break;
                }
                __builtin_prefetch(target);
                far = 1;
            }
            row[k] = target;
        }
    }
    if (!far)
        return 0;
    /* each target's input list, now its node is (nearly) here, then the list's items */
    for (int level = 0; level < 2; level++)
        for (Py_ssize_t j = lo; j < hi; j++)
            for (int k = 0; k < HINTS; k++) {
                PyObject *t = hint[j - lo][k];
                if (t != NULL && Py_TYPE(t) == NODE.type) {
                    PyObject *tin = *(PyObject **)((char *)t + NODE.offsets[N_INPUTS]);
                    if (tin != NULL)
                        __builtin_prefetch(level == 0 || !PyList_Check(tin) ? (void *)tin
                                                                             : (void *)((PyListObject *)tin)->ob_item);
                }
            }
    return 1;
}

static PyObject *link_edges(PyObject *mod, PyObject *args) {
    PyObject *nexts, *st;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "O!On", &PyList_Type, &nexts, &st, &i))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure() has not succeeded");
        return NULL;
    }
    PyObject *nodes = st_get(st, s_nodes, &PyList_Type), *by_id = nodes ? st_get(st, s_by_id, &PyDict_Type) : NULL;
    PyObject *fwd_o = by_id ? st_get(st, s_forward, NULL) : NULL;
    PyObject *result = NULL;
    if (fwd_o == NULL)
        goto done;
    int forward = PyObject_IsTrue(fwd_o);
    if (forward < 0)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(nexts);
    if (PyList_GET_SIZE(nodes) != n) {
        PyErr_SetString(PyExc_ValueError, "_build.link_edges: one next list per node");
        goto done;
    }
    PyObject *targets[64];
    Py_ssize_t nrs[64];
    /* the targets of the edges of nodes batch..batch_end-1, found ahead (resolve_batch) */
    PyObject *hint[BATCH][HINTS];
    Py_ssize_t batch = i, batch_end = i;
    /* batches left without resolve_batch, and how many the last batch without a target from the id table
     * left out: a chain's targets are all nearby, where the loop alone finds them at least as fast */
    int skip = 0, idle = 0, hinting = 0;
    /* the hashes of the ids of the RING nodes before `filled`, at their index mod RING (-1: none): resolve_batch's,
     * and the loop's for an edge it did not find */
    Py_hash_t ring[RING];
    Py_ssize_t filled = i + 1;
    for (; i < n; i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (i >= batch_end) {
            batch = i;
            batch_end = i + BATCH < n ? i + BATCH : n;
            hinting = skip == 0;
            if (!hinting) {
                skip--;
            } else if (resolve_batch(nodes, nexts, by_id, batch, batch_end, hint, ring, &filled)) {
                idle = 0;
            } else {
                idle = idle < 8 ? 2 * idle + 1 : 16;
                skip = idle;
            }
        }
        PyObject **hinted = hinting ? hint[i - batch] : NULL;
        PyObject *own_out = NULL;
        PyObject *nxt = PyList_GET_ITEM(nexts, i); /* borrowed: the list keeps it until it is let go below */
        int bad = 0;
        Py_ssize_t m = PyList_Check(nxt) ? PyList_GET_SIZE(nxt) : 0;
        if (m > 64) {
            bad = 1;
        } else if (m > 0) {
            int err;
            PyObject *out_shape = out_shape_of(node, &err);
            if (err)
                bad = err == 2 ? 1 : -1;
            /* every edge checked before any is made */
            for (Py_ssize_t k = 0; k < m && !bad; k++) {
                PyObject *e = PyList_GET_ITEM(nxt, k);
                targets[k] = NULL;
                if (e == Py_None)
                    continue;
                if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2) {
                    bad = 1;
                    break;
                }
                /* the few nodes after this one first (a chain, a layer's next ops: most files list a node's
                 * producers right after it), by their ids' text, before the id table (done ahead for the batch,
                 * where it could be: resolve_batch) */
                PyObject *tid = PyTuple_GET_ITEM(e, 0), *target = hinted != NULL && k < HINTS ? hinted[k] : NULL;
                Py_hash_t h = target == NULL && PyUnicode_CheckExact(tid) ? PyObject_Hash(tid) : -1;
                if (h == -1 && PyErr_Occurred()) {
                    bad = -1;
                    break;
                }
                if (target == NULL && h != -1)
                    for (filled = filled > i ? filled : i + 1; filled < n && filled <= i + NEARBY; filled++) {
                        PyObject *gid = node_id_text(PyList_GET_ITEM(nodes, filled));
                        ring[filled & (RING - 1)] = gid != NULL ? ((PyASCIIObject *)gid)->hash : -1;
                    }
                if (target == NULL && h != -1)
                    target = nearby_target(nodes, ring, i, h, tid);
                if (target == NULL)
                    target = PyDict_GetItemWithError(by_id, tid);
                if (target == NULL) {
                    bad = PyErr_Occurred() ? -1 : 1;
                    break;
                }
                Py_ssize_t nr = PyLong_CheckExact(PyTuple_GET_ITEM(e, 1)) ? PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1)) : -1;
                if (nr == -1 && PyErr_Occurred()) {
                    PyErr_Clear();
                    bad = 1;
                    break;
                }
                PyObject *own_tin;
                PyObject *tin = slot(&NODE, target, N_INPUTS, &own_tin);
                if (tin == NULL) {
                    bad = -1;
                    break;
                }
                if (!PyList_Check(tin) || nr < 0 || nr >= PyList_GET_SIZE(tin)) {
                    Py_XDECREF(own_tin);
                    bad = 1;
                    break;
                }
                PyObject *got = out_shape;
                if (got == NULL && edge_op_part) { /* a cat's gradient k: a part of its incoming one */
                    int gerr;
                    PyObject *w = PyObject_GetAttr(PyList_GET_ITEM(tin, nr), s_shape);
                    got = w != NULL ? part_shape_of(node, k, w, &gerr) : NULL;
                    Py_XDECREF(w);
                    if (w == NULL || gerr) {
                        Py_XDECREF(got);
                        Py_XDECREF(own_tin);
                        bad = -1;
                        break;
                    }
                } else if (got == NULL && edge_op_grad_shapes != NULL) { /* a matrix product's gradient k */
                    int gerr;
                    got = grad_shape_of(node, k, &gerr);
                    if (gerr) {
                        Py_XDECREF(own_tin);
                        bad = -1;
                        break;
                    }
                } else {
                    Py_XINCREF(got);
                }
                if (got != NULL) {
                    PyObject *want = PyObject_GetAttr(PyList_GET_ITEM(tin, nr), s_shape);
                    int same = want == NULL ? -1 : want == got ? 1 : PyObject_RichCompareBool(want, got, Py_EQ);
                    if (same == 0) /* a gradient the slot takes by summing (a bias): PyTorch's sum_to */
                        same = expandable(want, got);
                    Py_XDECREF(want);
                    Py_DECREF(got);
                    if (same <= 0) { /* not expandable, or an error: the Python loop decides */
                        Py_XDECREF(own_tin);
                        bad = same < 0 ? -1 : 1;
                        break;
                    }
                }
                Py_XDECREF(own_tin);
                targets[k] = target;
                nrs[k] = nr;
            }
            if (!bad) {
                PyObject *out = slot(&NODE, node, N_NEXT, &own_out);
                if (out == NULL || !PyList_Check(out))
                    bad = out == NULL ? -1 : 1;
                /* the file's list, made the node's (build_nodes): its items become the edges, a None stays */
                int in_place = out == nxt;
                for (Py_ssize_t k = 0; k < m && !bad; k++) {
                    if (targets[k] == NULL) {
                        if (!in_place && PyList_Append(out, Py_None) < 0)
                            bad = -1;
                        continue;
                    }
                    PyObject *edge = ((PyTypeObject *)EDGE_TYPE)->tp_alloc((PyTypeObject *)EDGE_TYPE, 2);
                    PyObject *nr_o = edge ? PyLong_FromSsize_t(nrs[k]) : NULL;
                    if (nr_o == NULL) {
                        Py_XDECREF(edge);
                        bad = -1;
                        break;
                    }
                    PyTuple_SET_ITEM(edge, 0, Py_NewRef(targets[k]));
                    PyTuple_SET_ITEM(edge, 1, nr_o);
                    int r = in_place ? PyList_SetItem(out, k, edge) : PyList_Append(out, edge); /* (Set steals) */
                    if (!in_place)
                        Py_DECREF(edge);
                    if (r < 0) {
                        bad = -1;
                        break;
                    }
                    PyObject *own_idx;
                    PyObject *tidx = slot(&NODE, targets[k], N_INDEX, &own_idx);
                    Py_ssize_t ti = tidx ? PyLong_AsSsize_t(tidx) : -1;
                    Py_XDECREF(own_idx);
                    if (ti == -1 && PyErr_Occurred()) {
                        bad = -1;
                        break;
                    }
                    if (ti <= i)
                        forward = 0;
                }
            }
        }
        Py_XDECREF(own_out);
        if (bad < 0)
            goto done;
        if (bad > 0)
            break;
        /* the file's edges are let go now the node's are made */
        if (nxt != Py_None && PyList_SetItem(nexts, i, Py_NewRef(Py_None)) < 0)
            goto done;
    }
    if (PyObject_SetAttr(st, s_forward, forward ? Py_True : Py_False) < 0)
        goto done;
    result = PyLong_FromSsize_t(i);
done:
    Py_XDECREF(nodes);
    Py_XDECREF(by_id);
    Py_XDECREF(fwd_o);
    return result;
}

/* model._topo_in over a list of nodes (reversed when ``reverse``): each node's topo_nr is 1 + the highest
 * of its next nodes' (0 with none), its next nodes done before it; its int object shared through `ints` (the
 * load's table: shared_int) where that is given. False (nothing raised) at the first
 * node, next list or edge that is not laid out as the loader makes them: the caller then runs the Python
 * loop over the whole order, which sets every number again. */
static PyObject *topo_in(PyObject *mod, PyObject *args) {
    PyObject *nodes, *ints = NULL;
    int reverse;
    if (!PyArg_ParseTuple(args, "O!p|O!", &PyList_Type, &nodes, &reverse, &PyList_Type, &ints))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure() has not succeeded");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *node = PyList_GET_ITEM(nodes, reverse ? n - 1 - k : k);
        if (Py_TYPE(node) != NODE.type)
            Py_RETURN_FALSE;
        PyObject *nxt = *(PyObject **)((char *)node + NODE.offsets[N_NEXT]);
        if (nxt == NULL || !PyList_CheckExact(nxt))
            Py_RETURN_FALSE;
        long long topo = 0;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(nxt); j++) {
            PyObject *e = PyList_GET_ITEM(nxt, j);
            if (e == Py_None)
                continue;
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2 || Py_TYPE(PyTuple_GET_ITEM(e, 0)) != NODE.type)
                Py_RETURN_FALSE;
            PyObject *t = *(PyObject **)((char *)PyTuple_GET_ITEM(e, 0) + NODE.offsets[N_TOPO]);
            if (t == NULL || !PyLong_CheckExact(t))
                Py_RETURN_FALSE;
            long long v = PyLong_AsLongLong(t);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                Py_RETURN_FALSE;
            }
            if (v >= topo)
                topo = v + 1;
        }
        PyObject *t = shared_int(ints, topo, NULL);
        if (t == NULL)
            return NULL;
        PyObject **p = (PyObject **)((char *)node + NODE.offsets[N_TOPO]);
        Py_XSETREF(*p, t);
    }
    Py_RETURN_TRUE;
}

/* ---- remap_nodes: graphs/remap.py remap_nodes_py, compiled (its docstring says what it does) ---- */

/* caches[d][id(m)], made by make(m, d) on a miss (a new reference). */
static PyObject *meta_on(PyObject *caches, Py_ssize_t d, PyObject *m, PyObject *make) {
    PyObject *cache = PyList_GET_ITEM(caches, d);
    PyObject *key = PyLong_FromVoidPtr(m);
    if (key == NULL)
        return NULL;
    PyObject *got = PyDict_GetItemWithError(cache, key);
    if (got != NULL) {
        Py_DECREF(key);
        return Py_NewRef(got);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *dd = PyLong_FromSsize_t(d);
    got = dd ? PyObject_CallFunctionObjArgs(make, m, dd, NULL) : NULL;
    Py_XDECREF(dd);
    if (got != NULL && PyDict_SetItem(cache, key, got) < 0)
        Py_CLEAR(got);
    Py_DECREF(key);
    return got;
}

/* A new Edge (target, nr). */
static PyObject *new_edge(PyObject *target, PyObject *nr) {
    PyObject *edge = ((PyTypeObject *)EDGE_TYPE)->tp_alloc((PyTypeObject *)EDGE_TYPE, 2);
    if (edge != NULL) {
        PyTuple_SET_ITEM(edge, 0, Py_NewRef(target));
        PyTuple_SET_ITEM(edge, 1, Py_NewRef(nr));
    }
    return edge;
}

/* Append (node, nr) to list. */
static int append_pair(PyObject *list, PyObject *node, PyObject *nr) {
    PyObject *pair = PyTuple_Pack(2, node, nr);
    if (pair == NULL)
        return -1;
    int r = PyList_Append(list, pair);
    Py_DECREF(pair);
    return r;
}

/* The index of an edge's target in olds, checked (-1 and an exception where it is not one of them). */
static Py_ssize_t target_index(PyObject *olds, PyObject *e, PyObject **target, PyObject **nr) {
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2 || Py_TYPE(PyTuple_GET_ITEM(e, 0)) != NODE.type) {
        PyErr_SetString(PyExc_TypeError, "remap_nodes: an edge that is not (Node, int)");
        return -1;
    }
    *target = PyTuple_GET_ITEM(e, 0);
    *nr = PyTuple_GET_ITEM(e, 1);
    PyObject *idx = *(PyObject **)((char *)*target + NODE.offsets[N_INDEX]);
    Py_ssize_t ti = idx != NULL && PyLong_CheckExact(idx) ? PyLong_AsSsize_t(idx) : -1;
    if (ti == -1 && PyErr_Occurred())
        return -1;
    if (ti < 0 || ti >= PyList_GET_SIZE(olds) || PyList_GET_ITEM(olds, ti) != *target) {
        PyErr_SetString(PyExc_ValueError, "remap_nodes: an edge to a node that is not in the list at its index");
        return -1;
    }
    return ti;
}

typedef struct {
    long long topo;
    Py_ssize_t i;
} TopoKey;

static int topo_key_cmp(const void *a, const void *b) {
    const TopoKey *x = a, *y = b;
    if (x->topo != y->topo)
        return x->topo < y->topo ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static PyObject *s_tocopy;

static PyObject *remap_nodes(PyObject *mod, PyObject *args) {
    PyObject *olds, *codes, *devices, *metas, *copy_metas, *make, *make_copy, *copy_op, *old_ids;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOOO!", &PyList_Type, &olds, &PyList_Type, &codes, &PyList_Type, &devices,
                          &PyList_Type, &metas, &PyList_Type, &copy_metas, &make, &make_copy, &copy_op, &PyDict_Type,
                          &old_ids))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure() has not succeeded");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(olds), nd = PyList_GET_SIZE(devices);
    if (PyList_GET_SIZE(codes) != n || PyList_GET_SIZE(metas) != nd || PyList_GET_SIZE(copy_metas) != nd) {
        PyErr_SetString(PyExc_ValueError, "remap_nodes: one code per node, one meta cache per device");
        return NULL;
    }
    for (Py_ssize_t d = 0; d < nd; d++)
        if (!PyDict_CheckExact(PyList_GET_ITEM(metas, d)) || !PyDict_CheckExact(PyList_GET_ITEM(copy_metas, d))) {
            PyErr_SetString(PyExc_TypeError, "remap_nodes: the meta caches must be dicts");
            return NULL;
        }
    Py_ssize_t *code = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t)), *pos = NULL;
    TopoKey *keys = NULL;
    PyObject *fresh = NULL, *nodes = NULL, *by_id = NULL, *order = NULL, *result = NULL;
    if (code == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *node = PyList_GET_ITEM(olds, i), *c = PyList_GET_ITEM(codes, i);
        PyObject *idx = Py_TYPE(node) == NODE.type ? *(PyObject **)((char *)node + NODE.offsets[N_INDEX]) : NULL;
        if (idx == NULL || !PyLong_CheckExact(idx) || PyLong_AsSsize_t(idx) != i) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "remap_nodes: every node a Node with its index in the list");
            goto fail;
        }
        code[i] = PyLong_Check(c) ? PyLong_AsSsize_t(c) : -2;
        if (code[i] < -1 || code[i] >= nd) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "remap_nodes: a code is -1 or a device index");
            goto fail;
        }
    }
    /* a node without a device goes where its first producer with a device goes (-2 - device meanwhile) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (code[i] < 0)
            continue;
        PyObject *nxt = *(PyObject **)((char *)PyList_GET_ITEM(olds, i) + NODE.offsets[N_NEXT]);
        if (nxt == NULL || !PyList_Check(nxt)) {
            PyErr_SetString(PyExc_TypeError, "remap_nodes: a node's next is not a list");
            goto fail;
        }
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(nxt); k++) {
            PyObject *e = PyList_GET_ITEM(nxt, k), *t, *nr;
            if (e == Py_None)
                continue;
            Py_ssize_t ti = target_index(olds, e, &t, &nr);
            if (ti < 0)
                goto fail;
            if (code[ti] == -1)
                code[ti] = -2 - code[i];
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (code[i] >= 0)
            continue;
        code[i] = code[i] < -1 ? -2 - code[i] : 0;
        PyObject *c = PyLong_FromSsize_t(code[i]);
        if (c == NULL || PyList_SetItem(codes, i, c) < 0)
            goto fail;
    }

    Py_ssize_t max_index = -1;
    if ((fresh = PyList_New(n)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *old = PyList_GET_ITEM(olds, i), *own;
        Py_ssize_t d = code[i];
        PyObject *inputs = slot(&NODE, old, N_INPUTS, &own);
        if (inputs == NULL)
            goto fail;
        if (!PyList_Check(inputs)) {
            Py_XDECREF(own);
            PyErr_SetString(PyExc_TypeError, "remap_nodes: a node's inputs are not a list");
            goto fail;
        }
        Py_ssize_t ni = PyList_GET_SIZE(inputs);
        PyObject *ins = PyList_New(ni);
        for (Py_ssize_t j = 0; ins != NULL && j < ni; j++) {
            PyObject *got = meta_on(metas, d, PyList_GET_ITEM(inputs, j), make);
            if (got == NULL)
                Py_CLEAR(ins);
            else
                PyList_SET_ITEM(ins, j, got);
        }
        Py_XDECREF(own);
        PyObject *stream = ins != NULL && ni ? PyObject_GetAttr(PyList_GET_ITEM(ins, 0), s_stream) : NULL;
        PyObject *node = ins != NULL && (stream != NULL || !ni) ? NODE.type->tp_alloc(NODE.type, 0) : NULL;
        PyObject *next = node ? PyList_New(0) : NULL, *consumers = next ? PyList_New(0) : NULL;
        if (consumers == NULL) {
            Py_XDECREF(ins);
            Py_XDECREF(stream);
            Py_XDECREF(node);
            Py_XDECREF(next);
            goto fail;
        }
        PyList_SET_ITEM(fresh, i, node);
        static const int shared[] = {N_ID, N_NAME, N_OP, N_SEQ, N_SAVED, N_ATTRS, N_VARIABLE, N_FWD, N_SAVES, N_STRINGS};
        for (size_t f = 0; f < sizeof shared / sizeof shared[0]; f++) {
            PyObject *v = slot(&NODE, old, shared[f], &own);
            if (v == NULL) {
                Py_DECREF(ins);
                Py_XDECREF(stream);
                Py_DECREF(next);
                Py_DECREF(consumers);
                goto fail;
            }
            slot_put(&NODE, node, shared[f], v);
            Py_XDECREF(own);
        }
        slot_put(&NODE, node, N_NEXT, next);
        slot_put(&NODE, node, N_INPUTS, ins);
        slot_put(&NODE, node, N_INDEX, MINUS_ONE);
        slot_put(&NODE, node, N_TOPO, ZERO);
        slot_put(&NODE, node, N_DEVICE, ni ? PyList_GET_ITEM(devices, d) : CPU);
        slot_put(&NODE, node, N_STREAM, ni ? stream : ZERO);
        slot_put(&NODE, node, N_CONSUMERS, consumers);
        slot_put(&NODE, node, N_CPU, ni ? Py_False : Py_True);
        Py_DECREF(next);
        Py_DECREF(ins);
        Py_XDECREF(stream);
        Py_DECREF(consumers);
        if (ni && d > max_index)
            max_index = d;
    }

    /* None in the id table meanwhile (validate._GENERAL_KEYS says why), taken out at the end */
    if ((nodes = PyList_New(0)) == NULL || (by_id = _PyDict_NewPresized(n + 1)) == NULL ||
        PyDict_SetItem(by_id, Py_None, Py_None) < 0)
        goto fail;
    if ((pos = PyMem_Malloc((n ? n : 1) * sizeof(Py_ssize_t))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t copies = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *old = PyList_GET_ITEM(olds, i), *new = PyList_GET_ITEM(fresh, i);
        Py_ssize_t d = code[i];
        PyObject *onext = *(PyObject **)((char *)old + NODE.offsets[N_NEXT]);
        PyObject *nxt = *(PyObject **)((char *)new + NODE.offsets[N_NEXT]);
        PyObject *oid = *(PyObject **)((char *)new + NODE.offsets[N_ID]);
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(onext); k++) {
            PyObject *e = PyList_GET_ITEM(onext, k), *target, *nr;
            if (e == Py_None) {
                if (PyList_Append(nxt, Py_None) < 0)
                    goto fail;
                continue;
            }
            Py_ssize_t ti = target_index(olds, e, &target, &nr);
            if (ti < 0)
                goto fail;
            PyObject *t = PyList_GET_ITEM(fresh, ti);
            PyObject *tcons = *(PyObject **)((char *)t + NODE.offsets[N_CONSUMERS]);
            PyObject *out_nr = PyLong_FromSsize_t(k);
            if (out_nr == NULL)
                goto fail;
            if (code[ti] == d) {
                PyObject *edge = new_edge(t, nr);
                int r = edge == NULL ? -1 : PyList_Append(nxt, edge);
                Py_XDECREF(edge);
                if (r < 0 || append_pair(tcons, new, out_nr) < 0) {
                    Py_DECREF(out_nr);
                    goto fail;
                }
                Py_DECREF(out_nr);
                continue;
            }
            /* a copy on the producer's device, listed just before it */
            PyObject *cid = PyUnicode_FromFormat("copy%zd_%U", copies, oid);
            while (cid != NULL) {
                int taken = PyDict_Contains(old_ids, cid);
                if (taken == 0)
                    taken = PyDict_Contains(by_id, cid);
                if (taken <= 0) {
                    if (taken < 0)
                        Py_CLEAR(cid);
                    break;
                }
                PyObject *longer = PyUnicode_FromFormat("%U_", cid);
                Py_SETREF(cid, longer);
            }
            copies++;
            PyObject *tin = *(PyObject **)((char *)PyTuple_GET_ITEM(e, 0) + NODE.offsets[N_INPUTS]);
            Py_ssize_t nri = PyLong_Check(nr) ? PyLong_AsSsize_t(nr) : -1;
            PyObject *meta = NULL;
            if (cid != NULL && tin != NULL && PyList_Check(tin) && nri >= 0 && nri < PyList_GET_SIZE(tin))
                meta = meta_on(copy_metas, d, PyList_GET_ITEM(tin, nri), make_copy);
            else if (cid != NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "remap_nodes: an edge to an input slot its target lacks");
            PyObject *copy = meta ? NODE.type->tp_alloc(NODE.type, 0) : NULL;
            PyObject *cnext = copy ? PyList_New(1) : NULL, *cins = cnext ? PyList_New(1) : NULL;
            PyObject *ccons = cins ? PyList_New(1) : NULL, *saved = ccons ? PyDict_New() : NULL;
            PyObject *attrs = saved ? PyDict_New() : NULL, *edge = attrs ? new_edge(t, nr) : NULL;
            PyObject *pair = edge ? PyTuple_Pack(2, new, out_nr) : NULL;
            PyObject *index = pair ? PyLong_FromSsize_t(PyList_GET_SIZE(nodes)) : NULL;
            PyObject *back = index ? new_edge(copy, ZERO) : NULL;
            int ok = back != NULL;
            if (ok) {
                PyList_SET_ITEM(cnext, 0, Py_NewRef(edge));
                PyList_SET_ITEM(cins, 0, Py_NewRef(meta));
                PyList_SET_ITEM(ccons, 0, Py_NewRef(pair));
                slot_put(&NODE, copy, N_ID, cid);
                slot_put(&NODE, copy, N_NAME, s_tocopy);
                slot_put(&NODE, copy, N_OP, copy_op);
                slot_put(&NODE, copy, N_SEQ, *(PyObject **)((char *)new + NODE.offsets[N_SEQ]));
                slot_put(&NODE, copy, N_NEXT, cnext);
                slot_put(&NODE, copy, N_INPUTS, cins);
                slot_put(&NODE, copy, N_SAVED, saved);
                slot_put(&NODE, copy, N_ATTRS, attrs);
                slot_put(&NODE, copy, N_VARIABLE, Py_None);
                slot_put(&NODE, copy, N_FWD, Py_None);
                slot_put(&NODE, copy, N_INDEX, index);
                slot_put(&NODE, copy, N_TOPO, ZERO);
                slot_put(&NODE, copy, N_DEVICE, PyList_GET_ITEM(devices, d));
                slot_put(&NODE, copy, N_STREAM, ZERO);
                slot_put(&NODE, copy, N_CONSUMERS, ccons);
                slot_put(&NODE, copy, N_CPU, Py_False);
                slot_put(&NODE, copy, N_SAVES, Py_False);
                slot_put(&NODE, copy, N_STRINGS, Py_False);
                ok = append_pair(tcons, copy, ZERO) == 0 && PyList_Append(nodes, copy) == 0 &&
                     PyDict_SetItem(by_id, cid, copy) == 0 && PyList_Append(nxt, back) == 0;
            }
            Py_XDECREF(cid);
            Py_XDECREF(meta);
            Py_XDECREF(copy);
            Py_XDECREF(cnext);
            Py_XDECREF(cins);
            Py_XDECREF(ccons);
            Py_XDECREF(saved);
            Py_XDECREF(attrs);
            Py_XDECREF(edge);
            Py_XDECREF(pair);
            Py_XDECREF(index);
            Py_XDECREF(back);
            Py_DECREF(out_nr);
            if (!ok)
                goto fail;
        }
        pos[i] = PyList_GET_SIZE(nodes);
        PyObject *index = PyLong_FromSsize_t(pos[i]);
        if (index == NULL)
            goto fail;
        slot_put(&NODE, new, N_INDEX, index);
        Py_DECREF(index);
        if (PyList_Append(nodes, new) < 0 || PyDict_SetItem(by_id, oid, new) < 0)
            goto fail;
    }

    /* the input's nodes by increasing topo_nr, ties in list order, each after its copies */
    if ((keys = PyMem_Malloc((n ? n : 1) * sizeof(TopoKey))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *own, *t = slot(&NODE, PyList_GET_ITEM(olds, i), N_TOPO, &own);
        keys[i].topo = t != NULL && PyLong_Check(t) ? PyLong_AsLongLong(t) : -1;
        keys[i].i = i;
        int bad = t == NULL || !PyLong_Check(t) || (keys[i].topo == -1 && PyErr_Occurred());
        Py_XDECREF(own);
        if (bad) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "remap_nodes: a node's topo_nr is not an int");
            goto fail;
        }
    }
    qsort(keys, (size_t)n, sizeof(TopoKey), topo_key_cmp);
    if ((order = PyList_New(PyList_GET_SIZE(nodes))) == NULL)
        goto fail;
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = keys[k].i;
        for (Py_ssize_t p = i ? pos[i - 1] + 1 : 0; p <= pos[i]; p++)
            PyList_SET_ITEM(order, at++, Py_NewRef(PyList_GET_ITEM(nodes, p)));
    }
    if (PyDict_DelItem(by_id, Py_None) == 0)
        result = Py_BuildValue("(OOOOn)", nodes, fresh, by_id, order, max_index);
fail:
    PyMem_Free(code);
    PyMem_Free(pos);
    PyMem_Free(keys);
    Py_XDECREF(fresh);
    Py_XDECREF(nodes);
    Py_XDECREF(by_id);
    Py_XDECREF(order);
    return result;
}

/* ---- kept_colons: load.py's duplicate-key proof without encoding the nodes again ---- */

/* configure_colons(MetaSpec, node_spec_fields, meta_spec_fields) -> bool: NodeSpec's and MetaSpec's fields must be
 * exactly the ones counted here, in order (a field added later and not counted would only make the proof fail
 * and the exact check run; the check makes sure the count stays the encoder's). */
static PyObject *configure_colons(PyObject *mod, PyObject *args) {
    PyObject *meta_type, *node_names, *meta_names;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &meta_type, &PyTuple_Type, &node_names, &PyTuple_Type,
                          &meta_names))
        return NULL;
    colons_ready = 0;
    if (!configured || PyTuple_GET_SIZE(node_names) != S_FIELDS || PyTuple_GET_SIZE(meta_names) != M_FIELDS)
        Py_RETURN_FALSE;
    for (int f = 0; f < S_FIELDS; f++) {
        PyObject *name = PyTuple_GET_ITEM(node_names, f);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, SPEC_FIELDS[f]) != 0)
            Py_RETURN_FALSE;
    }
    for (int f = 0; f < M_FIELDS; f++) {
        PyObject *name = PyTuple_GET_ITEM(meta_names, f);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, META_FIELDS[f]) != 0)
            Py_RETURN_FALSE;
    }
    int ok = slots_configure(&META, meta_type, meta_names);
    if (ok < 0)
        return NULL;
    colons_ready = ok;
    return PyBool_FromLong(ok);
}

/* The colons in a str (msgspec writes ':' as itself). */
static Py_ssize_t str_colons(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), c = 0;
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const char *p = d, *e = p + n;
        while (p < e && (p = memchr(p, ':', (size_t)(e - p))) != NULL) {
            c++;
            p++;
        }
        return c;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        c += PyUnicode_READ(kind, d, i) == ':';
    return c;
}

/* The colons of a decoded JSON value as the encoder writes it: one per object member and the ones inside its
 * strings; -1 for anything else (a type or a depth not counted here: the caller encodes instead). */
#define COLONS_MAX_DEPTH 64
static Py_ssize_t any_colons(PyObject *v, int depth) {
    if (PyUnicode_CheckExact(v))
        return str_colons(v);
    if (v == Py_None || v == Py_True || v == Py_False || PyLong_CheckExact(v) || PyFloat_CheckExact(v))
        return 0;
    if (depth >= COLONS_MAX_DEPTH)
        return -1;
    Py_ssize_t c = 0;
    if (PyDict_CheckExact(v)) {
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        while (PyDict_Next(v, &pos, &key, &val)) {
            if (!PyUnicode_CheckExact(key))
                return -1;
            Py_ssize_t k = any_colons(val, depth + 1);
            if (k < 0)
                return -1;
            c += 1 + str_colons(key) + k;
        }
        return c;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t k = any_colons(items[i], depth + 1);
            if (k < 0)
                return -1;
            c += k;
        }
        return c;
    }
    return -1;
}

/* The colons of one MetaSpec (an input's metadata) as encoded: its set fields' and its strings'; -1 as above. */
static Py_ssize_t meta_colons(PyObject *m) {
    if (Py_TYPE(m) != META.type)
        return -1;
    Py_ssize_t c = 0;
    for (int f = 0; f < M_FIELDS; f++) {
        PyObject *v = *(PyObject **)((char *)m + META.offsets[f]);
        if (v == NULL)
            return -1;
        if (v == UNSET)
            continue;
        Py_ssize_t k = any_colons(v, 1);
        if (k < 0)
            return -1;
        c += 1 + k;
    }
    return c;
}

/* kept_colons(spec_nodes) -> int | None (see the module docstring). */
static PyObject *kept_colons(PyObject *mod, PyObject *nodes) {
    if (!colons_ready || !PyList_CheckExact(nodes))
        Py_RETURN_NONE;
    long long c = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (Py_TYPE(node) != SPEC.type)
            Py_RETURN_NONE;
        for (int f = 0; f < S_FIELDS; f++) {
            PyObject *v = *(PyObject **)((char *)node + SPEC.offsets[f]);
            if (v == NULL)
                Py_RETURN_NONE;
            if (v == UNSET)
                continue;
            Py_ssize_t k;
            if (f == S_INPUTS && PyList_CheckExact(v)) {
                k = 0;
                for (Py_ssize_t j = 0; j < PyList_GET_SIZE(v) && k >= 0; j++) {
                    Py_ssize_t m = meta_colons(PyList_GET_ITEM(v, j));
                    k = m < 0 ? -1 : k + m;
                }
            } else {
                k = any_colons(v, 1);
            }
            if (k < 0)
                Py_RETURN_NONE;
            c += 1 + k;
        }
    }
    return PyLong_FromLongLong(c);
}

/* edges_and_devices(nodes) -> (edges, devices), or None where the Python pass must do it (not configured,
 * not a list of exact Nodes, a node whose next is not a list): the next edges that lead somewhere (not None)
 * over every node, and the distinct device objects by identity in first-seen order. model.py's
 * Graph.num_edges and Graph.devices are the twins (two map passes over the node list there). Nodes share a
 * few device objects, so a list scanned by identity, with the last one found checked first, is the set. */
static PyObject *edges_and_devices(PyObject *mod, PyObject *nodes) {
    if (!configured || !PyList_CheckExact(nodes))
        Py_RETURN_NONE;
    PyObject *seen = PyList_New(0);
    if (seen == NULL)
        return NULL;
    long long edges = 0;
    PyObject *last = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        if (Py_TYPE(node) != NODE.type)
            goto python;
        PyObject *next = *(PyObject **)((char *)node + NODE.offsets[N_NEXT]);
        PyObject *dev = *(PyObject **)((char *)node + NODE.offsets[N_DEVICE]);
        if (next == NULL || dev == NULL || !PyList_CheckExact(next))
            goto python;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(next); j++)
            edges += PyList_GET_ITEM(next, j) != Py_None;
        if (dev == last)
            continue;
        Py_ssize_t k = 0, nd = PyList_GET_SIZE(seen);
        while (k < nd && PyList_GET_ITEM(seen, k) != dev)
            k++;
        if (k == nd && PyList_Append(seen, dev) < 0) {
            Py_DECREF(seen);
            return NULL;
        }
        last = dev;
    }
    return Py_BuildValue("(LN)", edges, seen);
python:
    Py_DECREF(seen);
    Py_RETURN_NONE;
}

/* ---- variables ------------------------------------------------------------------------------------------ */

static PyObject *s_variable_gradients;

/* Whether a tuple of strings equals `names`. */
static int names_are(PyObject *given, const char **names, int n) {
    if (!PyTuple_Check(given) || PyTuple_GET_SIZE(given) != n)
        return 0;
    for (int f = 0; f < n; f++) {
        PyObject *name = PyTuple_GET_ITEM(given, f);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, names[f]) != 0)
            return 0;
    }
    return 1;
}

/* configure_variables(Variable, field_names, defaults_from_grad, VariableSpec, spec_field_names) -> bool: whether
 * build_variables and variable_bytes may run (both types laid out as this file expects). */
static PyObject *configure_variables(PyObject *mod, PyObject *args) {
    PyObject *var_type, *names, *defaults, *spec_type, *spec_names;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!", &PyType_Type, &var_type, &PyTuple_Type, &names, &PyTuple_Type,
                          &defaults, &PyType_Type, &spec_type, &PyTuple_Type, &spec_names))
        return NULL;
    variables_ready = 0;
    if (!names_are(names, VARIABLE_FIELDS, V_FIELDS) || !names_are(spec_names, VARIABLE_SPEC_FIELDS, VS_FIELDS) ||
        PyTuple_GET_SIZE(defaults) != V_FIELDS - V_GRAD)
        Py_RETURN_FALSE;
    int a = slots_configure(&VARIABLE, var_type, names);
    int b = a > 0 ? slots_configure(&VARIABLE_SPEC, spec_type, spec_names) : a;
    if (a < 0 || b < 0)
        return NULL;
    if (!a || !b)
        Py_RETURN_FALSE;
    for (int f = V_GRAD; f < V_FIELDS; f++)
        Py_XSETREF(VARIABLE_DEFAULTS[f], Py_NewRef(PyTuple_GET_ITEM(defaults, f - V_GRAD)));
    variables_ready = 1;
    Py_RETURN_TRUE;
}

/* build_variables(spec_variables, i, variables, checked, var_bytes) -> the first index not done.
 *
 * validate._Checker._variables_py is the twin: this does each variable spec from index i on that is the common
 * kind (no grad, requires_grad or hooks written; a new, non-empty name) and whose (shape, dtype, device) as
 * written is already in `checked` (the Python loop checks each such triple once), and stops at the first that
 * is not, for the Python loop to do. */
static PyObject *build_variables(PyObject *mod, PyObject *args) {
    PyObject *specs, *variables, *checked, *var_bytes;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "OnO!O!O!", &specs, &i, &PyDict_Type, &variables, &PyDict_Type, &checked,
                          &PyList_Type, &var_bytes))
        return NULL;
    if (!variables_ready || !configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure_variables() has not succeeded");
        return NULL;
    }
    if (!PyList_CheckExact(specs))
        return PyLong_FromSsize_t(i);
    for (; i < PyList_GET_SIZE(specs); i++) {
        PyObject *vs = PyList_GET_ITEM(specs, i);
        if (Py_TYPE(vs) != VARIABLE_SPEC.type)
            break;
#define VS(k) (*(PyObject **)((char *)vs + VARIABLE_SPEC.offsets[k]))
        PyObject *name = VS(VS_NAME), *shape = VS(VS_SHAPE);
        if (VS(VS_GRAD) != UNSET || VS(VS_REQUIRES_GRAD) != UNSET || VS(VS_HOOKS) != UNSET || name == NULL ||
            shape == NULL || VS(VS_DTYPE) == NULL || VS(VS_DEVICE) == NULL || !PyUnicode_CheckExact(name) ||
            PyUnicode_GET_LENGTH(name) == 0 || !PyList_CheckExact(shape))
            break;
        int taken = PyDict_Contains(variables, name);
        if (taken < 0)
            return NULL;
        if (taken)
            break;
        PyObject *shape_t = PyList_AsTuple(shape);
        PyObject *key = shape_t ? PyTuple_Pack(3, shape_t, VS(VS_DTYPE), VS(VS_DEVICE)) : NULL;
#undef VS
        Py_XDECREF(shape_t);
        if (key == NULL)
            return NULL;
        PyObject *got = PyDict_GetItemWithError(checked, key); /* (shape, dtype, device, bytes of a gradient) */
        Py_DECREF(key);
        if (got == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break;
        }
        if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 4)
            break;
        PyObject *var = VARIABLE.type->tp_alloc(VARIABLE.type, 0);
        if (var == NULL)
            return NULL;
        slot_put(&VARIABLE, var, V_NAME, name);
        for (int k = 0; k < 3; k++)
            slot_put(&VARIABLE, var, V_SHAPE + k, PyTuple_GET_ITEM(got, k));
        for (int k = V_GRAD; k < V_FIELDS; k++)
            slot_put(&VARIABLE, var, k, VARIABLE_DEFAULTS[k]);
        int r = PyDict_SetItem(variables, name, var);
        Py_DECREF(var);
        if (r < 0 || PyList_Append(var_bytes, PyTuple_GET_ITEM(got, 3)) < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(i);
}

/* variable_bytes(checker, variables, var_bytes, initial_grads, i) -> the first index not done.
 *
 * validate._Checker._variable_bytes_py is the twin: each variable's gradient bytes from index i on (its
 * var_bytes entry where it has a node, else 0; the larger with its initial gradient's bytes), counted as
 * checker.count(own, "variable gradients", ("variables", i)) counts them: the checker's _note called for those
 * above its _top_min, the sum added to checker.bytes once. It stops at a variable that is not a Variable, a
 * byte count that is not an int of at most 2**62, or where the sum would pass 2**62. */
static PyObject *variable_bytes(PyObject *mod, PyObject *args) {
    PyObject *checker, *variables, *var_bytes, *initial;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "OO!O!O!n", &checker, &PyList_Type, &variables, &PyList_Type, &var_bytes,
                          &PyDict_Type, &initial, &i))
        return NULL;
    if (!variables_ready) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure_variables() has not succeeded");
        return NULL;
    }
    const long long limit = 1LL << 62;
    long long total = 0, top_min;
    if (read_top_min(checker, &top_min) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(variables) < PyList_GET_SIZE(var_bytes) ? PyList_GET_SIZE(variables)
                                                                          : PyList_GET_SIZE(var_bytes);
    int failed = 0;
    for (; i < n; i++) {
        PyObject *var = PyList_GET_ITEM(variables, i);
        if (Py_TYPE(var) != VARIABLE.type)
            break;
        PyObject *node = *(PyObject **)((char *)var + VARIABLE.offsets[V_NODE]);
        PyObject *name = *(PyObject **)((char *)var + VARIABLE.offsets[V_NAME]);
        if (node == NULL || name == NULL)
            break;
        long long own = 0, init = 0;
        if (node != Py_None) {
            own = PyLong_CheckExact(PyList_GET_ITEM(var_bytes, i)) ? PyLong_AsLongLong(PyList_GET_ITEM(var_bytes, i))
                                                                  : -1;
            if (own == -1 && PyErr_Occurred())
                PyErr_Clear();
            if (own < 0 || own > limit)
                break;
        }
        if (PyDict_GET_SIZE(initial)) {
            PyObject *g = PyDict_GetItemWithError(initial, name);
            if (g == NULL && PyErr_Occurred()) {
                failed = 1;
                break;
            }
            init = g == NULL ? 0 : PyLong_CheckExact(g) ? PyLong_AsLongLong(g) : -1;
            if (init == -1 && PyErr_Occurred())
                PyErr_Clear();
            if (init < 0 || init > limit)
                break;
            if (init > own)
                own = init;
        }
        if (total > limit - own)
            break;
        total += own;
        if (own > top_min) {
            PyObject *index_o = PyLong_FromSsize_t(i);
            PyObject *path = index_o ? PyTuple_Pack(2, s_variables, index_o) : NULL;
            PyObject *nb = path ? PyLong_FromLongLong(own) : NULL;
            PyObject *a[3] = {nb, path, s_variable_gradients};
            int c = nb ? call_check(checker, s__note, a, 3) : -1;
            Py_XDECREF(index_o);
            Py_XDECREF(path);
            Py_XDECREF(nb);
            if (c < 0 || read_top_min(checker, &top_min) < 0) {
                failed = 1;
                break;
            }
        }
    }
    /* what was summed is counted even where an error stops the loop (the error is raised all the same) */
    if (add_bytes(checker, s_variable_gradients, total) < 0 || failed)
        return NULL;
    return PyLong_FromSsize_t(i);
}

/* presized(n) -> {}: an empty dict with room for n entries (the id table of a graph of n nodes): a million
 * inserts into a dict grown from empty move every entry about twice more, as it doubles on its way. */
static PyObject *presized(PyObject *mod, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    return _PyDict_NewPresized(n < 0 ? 0 : n);
}

/* remap_variables(variables, fresh) -> {name: Variable}: remap_variables_py, compiled (used where
 * configure_variables succeeded: validate._FAST_VARS); a variable that is not a Variable is a TypeError. */
static PyObject *remap_variables(PyObject *mod, PyObject *args) {
    PyObject *variables, *fresh;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &variables, &PyList_Type, &fresh))
        return NULL;
    if (!variables_ready || !configured) {
        PyErr_SetString(PyExc_RuntimeError, "_build.configure_variables() has not succeeded");
        return NULL;
    }
    PyObject *out = PyDict_New(), *name, *old;
    Py_ssize_t pos = 0;
    while (out != NULL && PyDict_Next(variables, &pos, &name, &old)) {
        PyObject *node = NULL, *dev = NULL;
        if (Py_TYPE(old) != VARIABLE.type) {
            PyErr_SetString(PyExc_TypeError, "remap_variables: a variable that is not a Variable");
            Py_CLEAR(out);
            break;
        }
        PyObject *on = *(PyObject **)((char *)old + VARIABLE.offsets[V_NODE]);
        if (on != NULL && on != Py_None) {
            PyObject *own = NULL, *idx = slot(&NODE, on, N_INDEX, &own);
            Py_ssize_t i = idx ? PyLong_AsSsize_t(idx) : -1;
            Py_XDECREF(own);
            if (i < 0 || i >= PyList_GET_SIZE(fresh)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_IndexError, "remap_variables: a variable's node is not in the graph");
                Py_CLEAR(out);
                break;
            }
            node = PyList_GET_ITEM(fresh, i);
            PyObject *own_d = NULL;
            dev = slot(&NODE, node, N_DEVICE, &own_d);
            Py_XDECREF(own_d); /* (the new node holds it) */
            if (dev == NULL) {
                Py_CLEAR(out);
                break;
            }
        }
        PyObject *var = VARIABLE.type->tp_alloc(VARIABLE.type, 0);
        if (var == NULL) {
            Py_CLEAR(out);
            break;
        }
        for (int f = 0; f < V_FIELDS; f++) {
            PyObject *v = *(PyObject **)((char *)old + VARIABLE.offsets[f]);
            if (f == V_NODE)
                v = node != NULL ? node : Py_None;
            else if (f == V_DEVICE && node != NULL)
                v = dev;
            if (v != NULL)
                slot_put(&VARIABLE, var, f, v);
        }
        int r = PyDict_SetItem(out, name, var);
        Py_DECREF(var);
        if (r < 0)
            Py_CLEAR(out);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"presized", presized, METH_O, "presized(n) -> an empty dict with room for n entries"},
    {"configure_colons", configure_colons, METH_VARARGS,
     "configure_colons(MetaSpec, node_spec_fields, meta_spec_fields) -> bool"},
    {"kept_colons", kept_colons, METH_O, "kept_colons(spec_nodes) -> int | None: see load.py _json_has_no_duplicates"},
    {"configure", configure, METH_VARARGS,
     "configure(Node, node_field_names, NodeSpec, Edge, UNSET, CPU, EMPTY, ACCUMULATE_GRAD, max_seq) -> bool"},
    {"configure_checks", configure_checks, METH_VARARGS, "configure_checks(max_dims, max_numel, narrow_dtypes[, max_cost_us, max_cost_flops])"},
    {"configure_variables", configure_variables, METH_VARARGS,
     "configure_variables(Variable, field_names, defaults_from_grad, VariableSpec, spec_field_names) -> bool"},
    {"build_variables", build_variables, METH_VARARGS,
     "build_variables(spec_variables, i, variables, checked, var_bytes) -> first index not done: see graphs/validate.py"},
    {"variable_bytes", variable_bytes, METH_VARARGS,
     "variable_bytes(checker, variables, var_bytes, initial_grads, i) -> first index not done: see graphs/validate.py"},
    {"build_nodes", build_nodes, METH_VARARGS,
     "build_nodes(checker, spec_nodes, st, i) -> first index not done: see graphs/validate.py"},
    {"link_edges", link_edges, METH_VARARGS,
     "link_edges(nexts, st, i) -> first index not done: see graphs/validate.py"},
    {"edges_and_devices", edges_and_devices, METH_O,
     "edges_and_devices(nodes) -> (edges, distinct devices) or None: see graphs/model.py Graph.num_edges"},
    {"topo_in", topo_in, METH_VARARGS,
     "topo_in(nodes, reverse) -> True, or False where the Python loop must do it: see graphs/model.py _topo_in"},
    {"remap_variables", remap_variables, METH_VARARGS, "remap_variables(variables, fresh): see graphs/remap.py"},
    {"remap_nodes", remap_nodes, METH_VARARGS,
     "remap_nodes(olds, codes, devices, metas, copy_metas, make, make_copy, copy_op, old_ids) -> "
     "(nodes, fresh, by_id, order, max_index): see graphs/remap.py"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_build",
                                    "The loops that make Node objects, compiled (graphs/validate.py and graphs/remap.py are the twins).",
                                    -1, methods};

#define INTERN(var, text)                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;

PyMODINIT_FUNC PyInit__build(void) {
    INTERN(s_device, "device");
    INTERN(s_stream, "stream");
    INTERN(s_type, "type");
    INTERN(s_index, "index");
    INTERN(s_cpu, "cpu");
    INTERN(s_random, "random");
    INTERN(s_data, "data");
    INTERN(s_npz, "npz");
    INTERN(s_count, "count");
    INTERN(s_check_value, "check_value");
    INTERN(s_check_required, "check_required");
    INTERN(s_check_attrs, "check_attrs");
    INTERN(s_elementwise, "elementwise");
    INTERN(s_expands_to, "expands_to");
    INTERN(s_grad_shapes, "grad_shapes");
    INTERN(s_dim, "dim");
    INTERN(s_sizes, "sizes");
    INTERN(s_shape, "shape");
    INTERN(s_cost, "cost");
    INTERN(s_us, "us");
    INTERN(s_flops, "flops");
    INTERN(s_mode, "mode");
    INTERN(s_inputs, "inputs");
    INTERN(s_nodes, "nodes");
    INTERN(s_by_id, "by_id");
    INTERN(s_ops, "ops");
    INTERN(s_metas, "metas");
    INTERN(s_default_seqs, "default_seqs");
    INTERN(s_max_device_index, "max_device_index");
    INTERN(s_forward, "forward");
    INTERN(s_nexts, "nexts");
    INTERN(s_ints, "ints");
    INTERN(s_variables, "variables");
    INTERN(s_node, "node");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_kind, "kind");
    INTERN(s_tensor, "tensor");
    INTERN(s_int, "int");
    INTERN(s_bool, "bool");
    INTERN(s_str, "str");
    INTERN(s_dtype, "dtype");
    INTERN(s__top_min, "_top_min");
    INTERN(s_bytes, "bytes");
    INTERN(s_saved_tensors, "saved tensors");
    INTERN(s_variable_gradients, "variable gradients");
    INTERN(s__note, "_note");
    INTERN(s_check_broadcast, "check_broadcast");
    INTERN(s_saved, "saved");
    INTERN(s_tocopy, "ToCopyBackward0");
    if ((ZERO = PyLong_FromLong(0)) == NULL || (MINUS_ONE = PyLong_FromLong(-1)) == NULL ||
        (FWD_END = PyLong_FromUnsignedLongLong(1ULL << 63)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
