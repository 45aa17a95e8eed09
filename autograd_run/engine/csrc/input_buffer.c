/* Python twin: autograd_run/engine/input_buffer.py.
 * Per-node gradient slots. Part of _core.c (included there, after core.h). */

/* ----------------------------------------------------------- InputBuffer */

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *grads;          /* list, one slot per input */
    PyObject *owned;          /* None, or a list of bools: the buffer made (owns) the slot's array */
    PyObject *accum_streams, *ready_streams, *ready_events;
} BufferObject;

static PyTypeObject BufferType;

static int Buffer_init(BufferObject *self, PyObject *args, PyObject *kw) {
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "n", &size))
        return -1;
    PyObject *g = PyList_New(size);
    if (g == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < size; i++)
        PyList_SET_ITEM(g, i, Py_NewRef(Py_None));
    Py_XSETREF(self->grads, g);
    Py_XSETREF(self->owned, Py_NewRef(Py_None));
    Py_XSETREF(self->accum_streams, Py_NewRef(Py_None));
    Py_XSETREF(self->ready_streams, Py_NewRef(Py_None));
    Py_XSETREF(self->ready_events, Py_NewRef(Py_None));
    return 0;
}

static int Buffer_traverse(BufferObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->grads);
    Py_VISIT(self->owned);
    Py_VISIT(self->accum_streams);
    Py_VISIT(self->ready_streams);
    Py_VISIT(self->ready_events);
    return 0;
}

static int Buffer_clear(BufferObject *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->grads);
    Py_CLEAR(self->owned);
    Py_CLEAR(self->accum_streams);
    Py_CLEAR(self->ready_streams);
    Py_CLEAR(self->ready_events);
    return 0;
}

static void Buffer_dealloc(BufferObject *self) {
    PyObject_GC_UnTrack(self);
    Buffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sum into a slot that holds a gradient: in place when the buffer owns the stored array. */
static int buffer_sum(BufferObject *self, Py_ssize_t pos, PyObject *old, PyObject *grad) {
    Py_ssize_t n = PyList_GET_SIZE(self->grads);
    if (self->owned == Py_None) {
        PyObject *o = PyList_New(n);
        if (o == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            PyList_SET_ITEM(o, i, Py_NewRef(Py_False));
        Py_SETREF(self->owned, o);
    }
    PyObject *result;
    if (PyList_GET_ITEM(self->owned, pos) == Py_True) {
        result = PyNumber_InPlaceAdd(old, grad);
    } else {
        result = PyNumber_Add(old, grad);
        if (result != NULL)
            PyList_SetItem(self->owned, pos, Py_NewRef(Py_True));
    }
    if (result == NULL)
        return -1;
    PyList_SetItem(self->grads, pos, result);  /* steals result */
    return 0;
}

static int buffer_add(BufferObject *self, Py_ssize_t pos, PyObject *grad) {
    if (grad == Py_None)
        return 0;
    if (pos < 0 || pos >= PyList_GET_SIZE(self->grads)) {
        PyErr_SetString(PyExc_IndexError, "input slot out of range");
        return -1;
    }
    PyObject *old = PyList_GET_ITEM(self->grads, pos);
    if (old == Py_None) {
        PyList_SetItem(self->grads, pos, Py_NewRef(grad));
        return 0;
    }
    Py_INCREF(old);
    int r = buffer_sum(self, pos, old, grad);
    Py_DECREF(old);
    return r;
}

static PyObject *Buffer_add(BufferObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "add(pos, grad)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if ((pos == -1 && PyErr_Occurred()) || buffer_add(self, pos, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Buffer__sum(BufferObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "_sum(pos, old, grad)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if ((pos == -1 && PyErr_Occurred()) || buffer_sum(self, pos, args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Buffer_len(BufferObject *self) {
    return PyList_GET_SIZE(self->grads);
}

static PyMethodDef Buffer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Buffer_add, METH_FASTCALL, "add(pos, grad): a CPU gradient into slot pos"},
    {"_sum", (PyCFunction)(void (*)(void))Buffer__sum, METH_FASTCALL, "_sum(pos, old, grad)"},
    {NULL}};

static PyMemberDef Buffer_members[] = {
    {"grads", T_OBJECT, offsetof(BufferObject, grads), 0, NULL},
    {"owned", T_OBJECT, offsetof(BufferObject, owned), 0, NULL},
    {"accum_streams", T_OBJECT, offsetof(BufferObject, accum_streams), 0, NULL},
    {"ready_streams", T_OBJECT, offsetof(BufferObject, ready_streams), 0, NULL},
    {"ready_events", T_OBJECT, offsetof(BufferObject, ready_events), 0, NULL},
    {NULL}};

static PySequenceMethods Buffer_as_sequence = {.sq_length = (lenfunc)Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.InputBufferBase",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dictoffset = offsetof(BufferObject, dict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Per-node gradient slots (see engine/input_buffer.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Buffer_init,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_clear = (inquiry)Buffer_clear,
    .tp_methods = Buffer_methods,
    .tp_members = Buffer_members,
    .tp_as_sequence = &Buffer_as_sequence,
};
