/* Python twin: autograd_run/engine/core.py (Lock).
 * The GraphTask lock, taken without a method call. Part of _core.c (included there, after core.h). */

/* ------------------------------------------------------------------ Lock */

/* A plain (non-reentrant) lock with threading.Lock's interface, that the compiled loop and route
 * take without a method call. A blocked acquire waits without the GIL (not interruptible: the
 * GraphTask lock is only ever held for a few operations). */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int locked;
} CLockObject;

static PyTypeObject CLockType;

static PyObject *CLock_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    CLockObject *self = (CLockObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_RuntimeError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void CLock_dealloc(CLockObject *self) {
    if (self->lock != NULL) {
        if (self->locked)
            PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 acquired, 0 not (non-blocking or timed out). */
static int clock_acquire(CLockObject *self, int blocking, PY_TIMEOUT_T timeout_us) {
    int ok = PyThread_acquire_lock(self->lock, 0);
    if (!ok && blocking) {
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, timeout_us, 0);
        Py_END_ALLOW_THREADS
        ok = r == PY_LOCK_ACQUIRED;
    }
    if (ok)
        self->locked = 1;
    return ok;
}

static int clock_release(CLockObject *self) {
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return -1;
    }
    self->locked = 0;
    PyThread_release_lock(self->lock);
    return 0;
}

static PyObject *CLock_acquire(CLockObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pd", names, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    PY_TIMEOUT_T us = timeout < 0 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);
    return PyBool_FromLong(clock_acquire(self, blocking, us));
}

static PyObject *CLock_release(CLockObject *self, PyObject *unused) {
    if (clock_release(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CLock_enter(CLockObject *self, PyObject *unused) {
    clock_acquire(self, 1, -1);
    Py_RETURN_TRUE;
}

static PyObject *CLock_exit(CLockObject *self, PyObject *args) {
    if (clock_release(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *CLock_locked(CLockObject *self, PyObject *unused) {
    return PyBool_FromLong(self->locked);
}

static PyMethodDef CLock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))CLock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)CLock_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)CLock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)CLock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)CLock_exit, METH_VARARGS, NULL},
    {NULL}};

static PyTypeObject CLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.Lock",
    .tp_basicsize = sizeof(CLockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lock with threading.Lock's interface that compiled code takes directly.",
    .tp_new = CLock_new,
    .tp_dealloc = (destructor)CLock_dealloc,
    .tp_methods = CLock_methods,
};
