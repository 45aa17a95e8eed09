/* Python twin: autograd_run/sim/scheduler.py (Simulator.run's event loop and _step, wake, _run_node, _function, _cpu, _launched, kernel, _done, _retire, _go_on; sim_sequential: _run_sequential's loop); autograd_run/sim/costs.py (costs_of: CostResolver.many).
 * sim_loop: the simulation's event loop on a virtual clock, for a call with no nested backward (no checkpoint or
 * python node), with or without the host's cores modelled: the same events in the same order as the Python methods, without their
 * frames. Part of _core.c (included there, after route.c, whose route() it calls).
 *
 * The events are (time, order, kind, ...): kind STEP/WAKE (a worker), FUNCTION/LAUNCHED/DONE/BUSY_TAIL (a node
 * being run, a node run), or PY (an (action, arg) Python made through Loop.at while the loop runs: SimQueue.push's wake-ups are
 * recognised as WAKE). One counter gives every event its order, so ties break exactly as the Python heap's do.
 * Python code the loop calls (a queue's push, the stream rules, _complete) reads the simulator's `now`, which the
 * loop keeps set, and schedules through `sim.at`, which the loop points at its own `at` while it runs. */

enum { EV_STEP, EV_WAKE, EV_FUNCTION, EV_LAUNCHED, EV_DONE, EV_BUSY_TAIL, EV_PY };

typedef struct {
    PyObject *w, *gt, *node, *parent, *queue, *pushed, *cost;
    long long start, cpu_ns, gpu_ns, sleep_ns;
    int holds_gil, blocking;
    /* the cost's source is "attrs" (a spin when it holds the GIL, with cores modelled) */
    int from_attrs;
    /* SimRun.deadline: has_deadline 0 is None; else -1 (a spin) or the time a wait's busy tail ends */
    int has_deadline;
    long long deadline;
} SimRunC;

typedef struct {
    long long t, order;
    int kind;
    PyObject *a, *b; /* STEP/WAKE: a = worker; PY: a = action, b = arg; node kinds: none */
    SimRunC *run;
} SimEv;

typedef struct {
    PyObject_HEAD
    SimEv *heap;
    Py_ssize_t size, cap;
    long long order;
    PyObject *sim, *wake_fn, *step_fn;
} LoopObject;

static PyObject *sl_idle, *sl_idle_since, *sl_waiting_for, *sl_wake_pending, *sl_tid, *sl_heap, *sl_pop,
    *sl_on_done, *sl_returned, *sl_needed, *sl_captures, *sl_leaf_streams, *sl_cpu_ns, *sl_gpu_ns, *sl_holds_gil,
    *sl_blocking, *sl_ready_streams, *sl_ready_events, *sl_ready_waits, *sl_wait, *sl_now, *sl_current_tid,
    *sl__ones, *sl_complete, *sl_at, *sl__pending, *sl__go_on, *sl_sim, *sl_consumers, *sl_detail, *sl_sleep_ns,
    *sl_source, *sl_attrs;

static int sl_intern(void) {
    if (sl_at != NULL)
        return 0;
#define SL(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    SL(sl_idle, "idle"); SL(sl_idle_since, "idle_since"); SL(sl_waiting_for, "waiting_for");
    SL(sl_wake_pending, "wake_pending"); SL(sl_tid, "tid"); SL(sl_heap, "heap"); SL(sl_pop, "pop");
    SL(sl_on_done, "on_done"); SL(sl_returned, "returned"); SL(sl_needed, "needed"); SL(sl_captures, "captures");
    SL(sl_leaf_streams, "leaf_streams"); SL(sl_cpu_ns, "cpu_ns"); SL(sl_gpu_ns, "gpu_ns");
    SL(sl_holds_gil, "holds_gil"); SL(sl_blocking, "blocking"); SL(sl_ready_streams, "ready_streams");
    SL(sl_ready_events, "ready_events"); SL(sl_ready_waits, "ready_waits"); SL(sl_wait, "wait");
    SL(sl_now, "now"); SL(sl_current_tid, "current_tid"); SL(sl__ones, "_ones"); SL(sl_complete, "_complete");
    SL(sl__pending, "_pending"); SL(sl__go_on, "_go_on");
    SL(sl_sim, "sim"); SL(sl_consumers, "consumers"); SL(sl_detail, "detail");
    SL(sl_sleep_ns, "sleep_ns"); SL(sl_source, "source"); SL(sl_attrs, "attrs");
    SL(sl_at, "at");
#undef SL
    return 0;
}

/* ---- SimQueue.push's common case (sim/tasks.py is the twin), for route()'s pushes ---- */

/* sim.tasks.SimQueue (heap, sim, consumers) and SimWorker (idle, wake_pending): plain object slots, found by
 * configure_sim_queue(); NULL types: route() calls SimQueue.push. */
enum { SQ_HEAP, SQ_SIM, SQ_CONSUMERS };
static SlotTable SIMQ_SLOTS = {NULL, 3, {&sl_heap, &sl_sim, &sl_consumers}};
enum { SW_IDLE, SW_WAKE_PENDING };
static SlotTable SIMW_SLOTS = {NULL, 2, {&sl_idle, &sl_wake_pending}};

/* configure_sim_queue(SimQueue, SimWorker) -> bool: whether route() may push onto a SimQueue itself. */
static PyObject *configure_sim_queue(PyObject *mod, PyObject *args) {
    PyObject *q, *w;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &q, &PyType_Type, &w))
        return NULL;
    if (sl_intern() < 0)
        return NULL;
    int a = slots_configure(&SIMQ_SLOTS, q), b = a > 0 ? slots_configure(&SIMW_SLOTS, w) : a;
    if (a < 0 || b < 0)
        return NULL;
    if (!a || !b) {
        Py_CLEAR(SIMQ_SLOTS.type);
        Py_CLEAR(SIMW_SLOTS.type);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* queue.push(key, task), the key the engine's (depth, node.seq), where `queue` is a SimQueue on the compiled heap,
 * no queue samples are kept (the simulator's `detail` off) and its consumer needs no wake-up (it is not idle, or a
 * wake-up is already pending): the heap gets (task, sim.now) under the key, as SimQueue.push does. 1: pushed; 0:
 * not this case (the caller calls the method); -1: an error. */
static int sim_queue_push_fast(PyObject *queue, long long depth, PyObject *node, PyObject *task) {
    if (SIMQ_SLOTS.type == NULL || Py_TYPE(queue) != SIMQ_SLOTS.type)
        return 0;
    PyObject *heap = *(PyObject **)((char *)queue + SIMQ_SLOTS.offsets[SQ_HEAP]);
    PyObject *sim = *(PyObject **)((char *)queue + SIMQ_SLOTS.offsets[SQ_SIM]);
    PyObject *cons = *(PyObject **)((char *)queue + SIMQ_SLOTS.offsets[SQ_CONSUMERS]);
    if (heap == NULL || !Py_IS_TYPE(heap, &QueueType) || sim == NULL || cons == NULL || !PyList_CheckExact(cons) ||
        PyList_GET_SIZE(cons) == 0)
        return 0;
    PyObject *w = PyList_GET_ITEM(cons, PyList_GET_SIZE(cons) - 1);
    if (Py_TYPE(w) != SIMW_SLOTS.type)
        return 0;
    PyObject *idle = *(PyObject **)((char *)w + SIMW_SLOTS.offsets[SW_IDLE]);
    PyObject *pending = *(PyObject **)((char *)w + SIMW_SLOTS.offsets[SW_WAKE_PENDING]);
    if ((idle != Py_False && idle != Py_True) || (pending != Py_False && pending != Py_True) ||
        (idle == Py_True && pending == Py_False))
        return 0; /* a wake-up to schedule: the method's */
    PyObject *detail = PyObject_GetAttr(sim, sl_detail);
    if (detail == NULL)
        return -1;
    Py_DECREF(detail);
    if (detail != Py_False)
        return 0;
    PyObject *sv = node_get(node, NF_SEQ);
    unsigned long long seq = sv ? PyLong_AsUnsignedLongLong(sv) : 0;
    Py_XDECREF(sv);
    if (PyErr_Occurred())
        return -1;
    PyObject *now = PyObject_GetAttr(sim, sl_now);
    PyObject *item = now ? PyTuple_Pack(2, task, now) : NULL;
    Py_XDECREF(now);
    if (item == NULL)
        return -1;
    int r = queue_push((QueueObject *)heap, ((u128)(uint64_t)depth << 64) | (u128)seq, item);
    Py_DECREF(item);
    return r < 0 ? -1 : 1;
}

static void run_free(SimRunC *r) {
    if (r == NULL)
        return;
    Py_XDECREF(r->w); Py_XDECREF(r->gt); Py_XDECREF(r->node); Py_XDECREF(r->parent);
    Py_XDECREF(r->queue); Py_XDECREF(r->pushed); Py_XDECREF(r->cost);
    PyMem_Free(r);
}

static inline int ev_less(const SimEv *x, const SimEv *y) {
    return x->t < y->t || (x->t == y->t && x->order < y->order);
}

/* Push an event with the given order (stealing the references in a and b and the run). */
static int loop_push_ordered(LoopObject *L, long long t, long long order, int kind, PyObject *a, PyObject *b,
                             SimRunC *run) {
    if (L->size == L->cap) {
        Py_ssize_t cap = L->cap ? L->cap * 2 : 64;
        SimEv *h = PyMem_Realloc(L->heap, cap * sizeof(SimEv));
        if (h == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            run_free(run);
            PyErr_NoMemory();
            return -1;
        }
        L->heap = h;
        L->cap = cap;
    }
    SimEv e = {t, order, kind, a, b, run};
    Py_ssize_t i = L->size++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!ev_less(&e, &L->heap[p]))
            break;
        L->heap[i] = L->heap[p];
        i = p;
    }
    L->heap[i] = e;
    return 0;
}

/* Push an event, the next in order. */
static int loop_push(LoopObject *L, long long t, int kind, PyObject *a, PyObject *b, SimRunC *run) {
    return loop_push_ordered(L, t, L->order++, kind, a, b, run);
}

static SimEv loop_pop(LoopObject *L) {
    SimEv top = L->heap[0];
    SimEv last = L->heap[--L->size];
    Py_ssize_t i = 0, n = L->size;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ev_less(&L->heap[c + 1], &L->heap[c]))
            c++;
        if (!ev_less(&L->heap[c], &last))
            break;
        L->heap[i] = L->heap[c];
        i = c;
    }
    if (n > 0)
        L->heap[i] = last;
    return top;
}

/* An (action, arg) event: a WAKE or STEP of the simulator's own, or a Python one. */
static int loop_push_action(LoopObject *L, long long t, long long order, PyObject *action, PyObject *arg) {
    if (PyMethod_Check(action) && PyMethod_GET_SELF(action) == L->sim) {
        PyObject *f = PyMethod_GET_FUNCTION(action);
        if (f == L->wake_fn || f == L->step_fn)
            return loop_push_ordered(L, t, order, f == L->wake_fn ? EV_WAKE : EV_STEP, Py_NewRef(arg), NULL, NULL);
    }
    return loop_push_ordered(L, t, order, EV_PY, Py_NewRef(action), Py_NewRef(arg), NULL);
}

/* Loop.at(t, action, arg=None): Simulator.at while the loop runs (a SimQueue's wake-up becomes a WAKE event). */
static PyObject *Loop_at(LoopObject *L, PyObject *const *args, Py_ssize_t n) {
    if (n < 2 || n > 3) {
        PyErr_SetString(PyExc_TypeError, "at(t, action, arg=None)");
        return NULL;
    }
    long long t = PyLong_AsLongLong(args[0]);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    if (loop_push_action(L, t, L->order++, args[1], n == 3 ? args[2] : Py_None) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static void Loop_dealloc(LoopObject *L) {
    for (Py_ssize_t i = 0; i < L->size; i++) {
        Py_XDECREF(L->heap[i].a);
        Py_XDECREF(L->heap[i].b);
        run_free(L->heap[i].run);
    }
    PyMem_Free(L->heap);
    Py_XDECREF(L->sim);
    Py_XDECREF(L->wake_fn);
    Py_XDECREF(L->step_fn);
    Py_TYPE(L)->tp_free((PyObject *)L);
}

static PyMethodDef Loop_methods[] = {
    {"at", (PyCFunction)(void (*)(void))Loop_at, METH_FASTCALL, "at(t, action, arg=None): see Simulator.at"},
    {NULL}};

static PyTypeObject LoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autograd_run.engine._core.SimLoop",
    .tp_basicsize = sizeof(LoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The event heap of sim_loop (see engine/csrc/sim_loop.c).",
    .tp_dealloc = (destructor)Loop_dealloc,
    .tp_methods = Loop_methods,
};

#define COST_MEMO 32
#define COSTS_SEEN 16

/* What one run of the loop reads: the simulator's records and settings, fetched once. */
typedef struct {
    LoopObject *L;
    PyObject *sim, *costs, *resolved, *by_signature, *measured, *by_values, *slices, *kernels, *started, *skips, *idles, *samples, *stream_free, *streams,
        *ones, *tracer, *cost_op;
    /* CostResolver._by_cost (cost nodes' costs by what they depend on) and its missing-field mark, or NULL */
    PyObject *by_cost, *absent;
    long long order, now, overhead_ns, device_overhead_ns, cost_node_ns, gil_handoff_ns, gil_free_at;
    PyObject *gil_holder; /* borrowed from a live SimRunC's or worker's reference; kept alive in `holder_ref` */
    PyObject *holder_ref;
    int detail, overhead_gil;
    /* cost objects read lately (direct-mapped by address), and their fields: nodes alike share one NodeCost, and
     * a graph's kinds of node come in turns (a layer's ops); each entry holds its cost, so that no address is
     * reused while it is here; released at the loop's end (costs_seen_clear) */
    struct { PyObject *cost; long long cpu, gpu, sleep; int gil, blocking, from_attrs; } costs_seen[COSTS_SEEN];
    /* The host's cores (Simulator._core_free): when each is next free, a binary heap kept exactly as heapq keeps
     * the Python list (core_heap_replace), copied in from that list at the start and back at the end (sim_loop);
     * NULL where cores are not modelled */
    long long *cores;
    Py_ssize_t ncores;
    /* the simulator's `now` as Python last saw it: set (sync_now) only before a call into Python code that may
     * read it (routing, the stream rules' waits, _complete, a Python event, a cost model's call, ...) */
    long long now_seen;
    /* (device, stream) of recent nodes -> their stream tuple and stream_free key, so that nodes of one stream
     * share them (the Python methods make both anew per node: equal values, the same results) */
    struct { PyObject *dev, *st, *parent, *key; } streams_seen[8];
    int streams_next;
    /* the leaf set and stream of the latest leaf_streams.add: adding the same stream object to the same set again
     * changes nothing (nothing removes from a call's leaf set), and skips hashing its Device in Python */
    PyObject *leaf_set, *leaf_stream;
    /* the worker whose task was just retired: it steps once the event's calls have returned (_retire, _go_on),
     * so nodes that take no time do not nest one C call deeper per node */
    PyObject *pending;
    /* task_ids: the last task and worker read, and what was read of them */
    PyObject *ids_gt, *ids_gid, *ids_depth, *ids_w, *ids_tid;
    /* nodes alike (signature.c's sig_alike): per slot an exemplar node whose cost came from by_signature, and that
     * cost; both held (so the exemplar's address is not reused while it is here), released by memo_clear */
    PyObject *memo_node[SIG_MEMO], *memo_cost[SIG_MEMO];
    /* cost nodes' costs (cost_node_known) by what their key is read from: per slot the node's attrs, name and
     * device objects (the loader shares one attrs dict among the nodes that write the same text, one name
     * object per name, one Device per device) and its cpu flag, and the cost _by_cost gave for them; all held
     * (no address reused while it is here: nothing changes a node's attrs during a simulation), released by
     * memo_clear */
    struct { PyObject *attrs, *name, *device, *cost; int cpu; } cost_memo[COST_MEMO];
    /* route()'s reads of the simulator (EngineInfo, with its device queues kept) and of a task's GraphTask
     * (GtInfo: its fields never change while it runs), made once per loop and once per GraphTask instead of
     * once per node (sim_route); route_gt: the GraphTask route_gi was read from (held by route_gi), or NULL */
    EngineInfo route_ei;
    GtInfo route_gi;
    int route_ei_ready;
    PyObject *route_gt;
    /* routing's sums on a stream done here (route_ei.sum_inline: sim_sum_inline) where the simulator's streams say
     * theirs are the default (SimStreams.sums_inline): the streams object (held) and the sum kernel's ns */
    PyObject *sum_streams;
    long long sum_kernel_ns;
    /* the costs read so far (cpu_ns + gpu_ns of each node run), checked against WORK_LIMIT: no simulated time
     * can pass what every cost run one after another adds up to, plus the engine's overheads */
    long long work;
} Sim;

/* The most the costs a simulation reads may add up to (ns): a quarter of what a 64-bit count holds, which leaves
 * room for the engine's overheads and waits. Past it read_cost raises OverflowError (the session says the times
 * do not fit), where the sums of times would otherwise wrap around. */
#define WORK_LIMIT (1LL << 61)

/* route(sim, gt, node, ones, gt.exec_info, tracer, parent) with what it reads of the simulator and of gt read
 * once (Sim's route_ei and route_gi): the same result as the call. */
static long long sim_kernel(Sim *S, PyObject *stream, PyObject *node, long long ns, long long not_before, int *err);
static int get_ll(PyObject *o, PyObject *name, long long *out);

/* A sum on `stream` while routing: SimStreams' _Accumulate.__enter__ (its default kernel, as sim_kernel) at the
 * simulator's now, which routing's callers have just set (sync_now). */
static int sim_sum_inline(void *ctx, PyObject *stream) {
    Sim *S = ctx;
    int err = 0;
    sim_kernel(S, stream, Py_None, S->sum_kernel_ns, S->now, &err);
    return err ? -1 : 0;
}

/* Route_ei made for this loop: its device queues kept, and the sums on a stream done by sim_sum_inline where the
 * simulator's streams say that is what their on_stream does (SimStreams.sums_inline). */
static int sim_route_info(Sim *S) {
    if (engine_info_fill(&S->route_ei, S->sim, S->tracer) < 0)
        return -1;
    S->route_ei.keep_queues = 1;
    S->route_ei_ready = 1;
    PyObject *streams = PyObject_GetAttr(S->sim, s_streams);
    PyObject *ok = streams ? PyObject_CallMethodNoArgs(streams, s_sums_inline) : NULL;
    int inline_ = ok ? PyObject_IsTrue(ok) : -1;
    Py_XDECREF(ok);
    if (inline_ < 0 && streams != NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear(); /* streams of another kind (no sums_inline): their on_stream is entered, as before */
        inline_ = 0;
    }
    if (inline_ == 1 && get_ll(S->sim, s_sum_kernel_ns, &S->sum_kernel_ns) < 0)
        inline_ = -1;
    if (inline_ == 1) {
        S->sum_streams = streams;
        S->route_ei.sum_inline = sim_sum_inline;
        S->route_ei.sum_ctx = S;
        S->route_ei.sum_streams = streams;
        return 0;
    }
    Py_XDECREF(streams);
    return inline_;
}

/* A new list of `n` ones, set as the simulator's `_ones` (routing reads no more of it than it has: the loops grow
 * it before routing a node with more outputs); NULL on an error. */
static PyObject *more_ones(PyObject *sim, Py_ssize_t n) {
    PyObject *ones = PyList_New(n);
    for (Py_ssize_t i = 0; ones != NULL && i < n; i++) {
        PyObject *one = PyLong_FromLong(1);
        if (one == NULL)
            Py_CLEAR(ones);
        else
            PyList_SET_ITEM(ones, i, one);
    }
    if (ones != NULL && PyObject_SetAttr(sim, sl__ones, ones) < 0)
        Py_CLEAR(ones);
    return ones;
}

static PyObject *sim_route(Sim *S, PyObject *gt, PyObject *node, PyObject *parent) {
    if (!S->route_ei_ready && sim_route_info(S) < 0)
        return NULL;
    if (S->route_gt != gt) {
        if (S->route_gt != NULL) {
            gt_info_clear(&S->route_gi);
            S->route_gt = NULL;
        }
        PyObject *exec_info = PyObject_GetAttr(gt, s_exec_info);
        if (exec_info == NULL)
            return NULL;
        int r = gt_info_fill_route(&S->route_gi, gt, exec_info);
        Py_DECREF(exec_info);
        if (r < 0)
            return NULL;
        S->route_gt = gt;
    }
    return route_core(&S->route_ei, &S->route_gi, node, S->ones, parent);
}

static void sim_route_clear(Sim *S) {
    if (S->route_gt != NULL)
        gt_info_clear(&S->route_gi);
    S->route_gt = NULL;
    if (S->route_ei_ready)
        engine_info_clear(&S->route_ei);
    S->route_ei_ready = 0;
    Py_CLEAR(S->sum_streams);
}

static void memo_clear(Sim *S) {
    for (int i = 0; i < SIG_MEMO; i++) {
        Py_CLEAR(S->memo_node[i]);
        Py_CLEAR(S->memo_cost[i]);
    }
    for (int i = 0; i < COST_MEMO; i++) {
        Py_CLEAR(S->cost_memo[i].attrs);
        Py_CLEAR(S->cost_memo[i].name);
        Py_CLEAR(S->cost_memo[i].device);
        Py_CLEAR(S->cost_memo[i].cost);
    }
}

static PyObject *lpy(long long v) { return PyLong_FromLongLong(v); }

static int set_now(Sim *S, long long t) {
    S->now = t;
    return 0;
}

/* sim.now = the loop's clock, before Python code that may read it runs. */
static int sync_now(Sim *S) {
    if (S->now == S->now_seen)
        return 0;
    PyObject *v = lpy(S->now);
    int r = v ? PyObject_SetAttr(S->sim, sl_now, v) : -1;
    Py_XDECREF(v);
    if (r == 0)
        S->now_seen = S->now;
    return r;
}

/* The stream tuple (device, stream) of an accelerator node, and its stream_free key (device type, index, stream):
 * new references, or -1 with an exception. */
static int node_stream_of(Sim *S, PyObject *node, PyObject **parent, PyObject **key) {
    PyObject *dev = node_get(node, NF_DEVICE), *st = dev ? node_get(node, NF_STREAM) : NULL;
    if (st == NULL) {
        Py_XDECREF(dev);
        return -1;
    }
    for (int i = 0; i < 8; i++)
        if (S->streams_seen[i].dev == dev && S->streams_seen[i].st == st) {
            *parent = Py_NewRef(S->streams_seen[i].parent);
            if (key)
                *key = Py_NewRef(S->streams_seen[i].key);
            Py_DECREF(dev);
            Py_DECREF(st);
            return 0;
        }
    PyObject *dt = PyObject_GetAttr(dev, s_type), *di = dt ? PyObject_GetAttr(dev, s_index) : NULL;
    PyObject *k = di ? PyTuple_Pack(3, dt, di, st) : NULL, *p = k ? PyTuple_Pack(2, dev, st) : NULL;
    Py_XDECREF(dt);
    Py_XDECREF(di);
    if (p == NULL) {
        Py_XDECREF(k);
        Py_DECREF(dev);
        Py_DECREF(st);
        return -1;
    }
    int i = S->streams_next;
    S->streams_next = (i + 1) % 8;
    PyObject *old[4] = {S->streams_seen[i].dev, S->streams_seen[i].st, S->streams_seen[i].parent,
                        S->streams_seen[i].key};
    S->streams_seen[i].dev = dev;  /* the entry keeps the device and the stream alive: their addresses stay theirs */
    S->streams_seen[i].st = st;
    S->streams_seen[i].parent = Py_NewRef(p);
    S->streams_seen[i].key = Py_NewRef(k);
    for (int j = 0; j < 4; j++)
        Py_XDECREF(old[j]);
    *parent = p;
    if (key)
        *key = k;
    else
        Py_DECREF(k);
    return 0;
}

/* The stream_free key of a stream tuple: the cached one when it is a node's stream seen lately. */
static PyObject *stream_key_of(Sim *S, PyObject *stream) {
    for (int i = 0; i < 8; i++)
        if (S->streams_seen[i].parent == stream)
            return Py_NewRef(S->streams_seen[i].key);
    PyObject *dev = PyTuple_GET_ITEM(stream, 0);
    PyObject *dt = PyObject_GetAttr(dev, s_type), *di = dt ? PyObject_GetAttr(dev, s_index) : NULL;
    PyObject *key = di ? PyTuple_Pack(3, dt, di, PyTuple_GET_ITEM(stream, 1)) : NULL;
    Py_XDECREF(dt);
    Py_XDECREF(di);
    return key;
}

static int get_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int get_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int set_attr(PyObject *o, PyObject *name, PyObject *v) { return PyObject_SetAttr(o, name, v); }

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* Whether `slices` is what the loops record slices into: a SliceLog, or a list (of tuples). */
static int slices_check(PyObject *slices, const char *who) {
    if (Py_IS_TYPE(slices, &SliceLogType) || PyList_Check(slices))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s: slices is a SliceLog or a list", who);
    return -1;
}

/* A slice (gt, depth, node, tid, start, end, queue, pushed) recorded: into a SliceLog's columns, or as a tuple. */
static int slices_add(PyObject *slices, PyObject *gid, PyObject *depth, PyObject *node, PyObject *tid,
                      long long start, long long end, PyObject *queue, PyObject *pushed) {
    if (Py_IS_TYPE(slices, &SliceLogType))
        return slice_log_add((SliceLogObject *)slices, gid, depth, node, tid, start, end, queue, pushed);
    PyObject *st = PyLong_FromLongLong(start), *en = st ? PyLong_FromLongLong(end) : NULL;
    PyObject *slice = en ? PyTuple_Pack(8, gid, depth, node, tid, st, en, queue, pushed) : NULL;
    Py_XDECREF(st);
    Py_XDECREF(en);
    return append_new(slices, slice);
}

/* gt.leaf_streams.add(stream), skipped when it is the very add made last. */
static int leaf_add(Sim *S, PyObject *gt, PyObject *stream) {
    PyObject *leaves = PyObject_GetAttr(gt, sl_leaf_streams);
    if (leaves == NULL)
        return -1;
    if (leaves == S->leaf_set && stream == S->leaf_stream) {
        Py_DECREF(leaves);
        return 0;
    }
    if (PySet_Add(leaves, stream) < 0) {
        Py_DECREF(leaves);
        return -1;
    }
    Py_XSETREF(S->leaf_set, leaves);  /* holds both: their addresses stay theirs */
    Py_INCREF(stream);
    Py_XSETREF(S->leaf_stream, stream);
    return 0;
}

static int sim_step(Sim *S, PyObject *w);
static int sim_retire(Sim *S, PyObject *w, PyObject *gt, PyObject *finished);

/* _cpu: CPU work of ns from now (once the GIL is free, when it takes it); then the event `then` for the run. */
static int sim_cpu(Sim *S, long long ns, int gil, int then, SimRunC *run);

/* _function: the engine's overhead is done; with cores modelled, a wait sleeps first (no GIL, no core) and then
 * busy-waits to the deadline set now (EV_BUSY_TAIL), and a GIL-holding spin from attrs runs to its own deadline. */
static int sim_function(Sim *S, SimRunC *run) {
    if (S->cores != NULL) {
        if (run->sleep_ns && run->cpu_ns > 0) {
            run->has_deadline = 1;
            run->deadline = S->now + run->cpu_ns;
            long long sleep = run->sleep_ns < run->cpu_ns ? run->sleep_ns : run->cpu_ns;
            return loop_push(S->L, S->now + sleep, EV_BUSY_TAIL, NULL, NULL, run);
        }
        if (run->holds_gil && run->from_attrs) {
            run->has_deadline = 1;
            run->deadline = -1;
        }
    }
    return sim_cpu(S, run->cpu_ns, run->holds_gil, EV_LAUNCHED, run);
}

/* _busy_tail: a wait's sleep is over; it busy-waits on a core until its deadline. */
static int sim_busy_tail(Sim *S, SimRunC *run) {
    long long left = run->deadline - S->now;
    return sim_cpu(S, left > 0 ? left : 0, run->holds_gil, EV_LAUNCHED, run);
}

/* heapq.heapreplace(cores, item) on the C array, step for step as CPython's _heapq does it (the smaller child moves
 * up to a leaf, then the item sifts down from there), so the array stays the list heapq would have made. */
static void core_heap_replace(long long *heap, Py_ssize_t n, long long item) {
    Py_ssize_t pos = 0, limit = n >> 1;
    heap[0] = item;
    while (pos < limit) {
        Py_ssize_t child = 2 * pos + 1;
        if (child + 1 < n && !(heap[child] < heap[child + 1]))
            child++;
        long long tmp = heap[child];
        heap[child] = heap[pos];
        heap[pos] = tmp;
        pos = child;
    }
    long long newitem = heap[pos];
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (newitem < heap[parent]) {
            heap[pos] = heap[parent];
            pos = parent;
            continue;
        }
        break;
    }
    heap[pos] = newitem;
}

static long long sim_kernel(Sim *S, PyObject *stream, PyObject *node, long long ns, long long not_before, int *err) {
    PyObject *key = stream_key_of(S, stream);
    if (key == NULL) {
        *err = 1;
        return 0;
    }
    PyObject *free_at = PyDict_GetItemWithError(S->stream_free, key);
    long long start = 0;
    if (free_at != NULL) {
        start = PyLong_AsLongLong(free_at);
        if (start == -1 && PyErr_Occurred()) {
            Py_DECREF(key);
            *err = 1;
            return 0;
        }
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        *err = 1;
        return 0;
    }
    if (not_before > start)
        start = not_before;
    long long end = start + ns;
    PyObject *ev = lpy(end);
    int r = ev ? PyDict_SetItem(S->stream_free, key, ev) : -1;
    Py_DECREF(key);
    if (r == 0 && node != Py_None) { /* (stream, node, start, end): the end's int shared with stream_free */
        PyObject *sv = lpy(start);
        r = sv ? append_new(S->kernels, PyTuple_Pack(4, stream, node, sv, ev)) : -1;
        Py_XDECREF(sv);
    }
    Py_XDECREF(ev);
    if (r < 0) {
        *err = 1;
        return 0;
    }
    return end;
}

/* A task's id and reentrant depth, a worker's tid (new references): read once per task and per worker (neither
 * changes), the objects held so that their addresses stay theirs. */
static int task_ids(Sim *S, PyObject *gt, PyObject *w, PyObject **gid, PyObject **depth, PyObject **tid) {
    if (gt != S->ids_gt) {
        PyObject *g = PyObject_GetAttr(gt, s_id), *d = g ? PyObject_GetAttr(gt, s_reentrant_depth) : NULL;
        if (d == NULL) {
            Py_XDECREF(g);
            return -1;
        }
        Py_XSETREF(S->ids_gt, Py_NewRef(gt));
        Py_XSETREF(S->ids_gid, g);
        Py_XSETREF(S->ids_depth, d);
    }
    if (w != S->ids_w) {
        PyObject *t = PyObject_GetAttr(w, sl_tid);
        if (t == NULL)
            return -1;
        Py_XSETREF(S->ids_w, Py_NewRef(w));
        Py_XSETREF(S->ids_tid, t);
    }
    *gid = Py_NewRef(S->ids_gid);
    *depth = Py_NewRef(S->ids_depth);
    *tid = Py_NewRef(S->ids_tid);
    return 0;
}

static void task_ids_clear(Sim *S) {
    Py_CLEAR(S->ids_gt);
    Py_CLEAR(S->ids_gid);
    Py_CLEAR(S->ids_depth);
    Py_CLEAR(S->ids_w);
    Py_CLEAR(S->ids_tid);
}

static int sim_done(Sim *S, SimRunC *run) {
    PyObject *gid = NULL, *depth = NULL, *tid = NULL;
    int r = -1;
    if (task_ids(S, run->gt, run->w, &gid, &depth, &tid) < 0)
        goto out;
    if (slices_add(S->slices, gid, depth, run->node, tid, run->start, S->now, run->queue, run->pushed) < 0)
        goto out;
    PyObject *next = node_get(run->node, NF_NEXT);
    if (next == NULL)
        goto out;
    Py_ssize_t nn = PyObject_Length(next);
    Py_DECREF(next);
    if (nn < 0)
        goto out;
    if (nn == 0) {
        if (run->parent != Py_None && leaf_add(S, run->gt, run->parent) < 0)
            goto out;
        r = sim_retire(S, run->w, run->gt, NULL);
        goto out;
    }
    if (set_attr(S->sim, sl_current_tid, tid) < 0)
        goto out;
    if (nn > PyList_GET_SIZE(S->ones)) { /* more outputs than the list has: it grows */
        PyObject *ones = more_ones(S->sim, nn);
        if (ones == NULL)
            goto out;
        Py_SETREF(S->ones, ones);
    }
    PyObject *finished = sync_now(S) < 0 ? NULL : sim_route(S, run->gt, run->node, run->parent);
    if (finished == NULL)
        goto out;
    r = sim_retire(S, run->w, run->gt, finished);
    Py_DECREF(finished);
out:
    Py_XDECREF(gid);
    Py_XDECREF(depth);
    Py_XDECREF(tid);
    run_free(run);
    return r;
}

static int sim_launched(Sim *S, SimRunC *run) {
    long long t = S->now;
    if (run->parent != Py_None && run->gpu_ns) {
        int err = 0;
        long long end = sim_kernel(S, run->parent, run->node, run->gpu_ns, t, &err);
        if (err) {
            run_free(run);
            return -1;
        }
        if (run->blocking && end > t) /* a copy to the host: the worker waits for its stream */
            return loop_push(S->L, end, EV_DONE, NULL, NULL, run);
    }
    return sim_done(S, run);
}

static int sim_then(Sim *S, int then, SimRunC *run) {
    switch (then) {
    case EV_FUNCTION: return sim_function(S, run);
    case EV_LAUNCHED: return sim_launched(S, run);
    case EV_BUSY_TAIL: return sim_busy_tail(S, run);
    default: return sim_done(S, run);
    }
}

static int sim_cpu(Sim *S, long long ns, int gil, int then, SimRunC *run) {
    if (ns <= 0)
        return sim_then(S, then, run);
    long long t = S->now;
    if (gil && S->gil_free_at > t && S->gil_holder != run->w)
        t = S->gil_free_at + S->gil_handoff_ns; /* held by another thread: it sleeps until released, then the hand-off */
    long long end = t + ns;
    if (S->cores != NULL) {
        long long got = S->cores[0];
        if (got > t) { /* every core busy: runnable, it runs when the first one frees */
            if (then == EV_LAUNCHED && run->has_deadline) { /* work to a deadline loses only what is past it */
                long long until = run->deadline < 0 ? end : run->deadline;
                end = until > got ? until : got;
            } else {
                end = got + ns;
            }
        }
        core_heap_replace(S->cores, S->ncores, end);
    }
    if (gil) {
        S->gil_free_at = end;
        Py_INCREF(run->w);
        Py_XSETREF(S->holder_ref, run->w);
        S->gil_holder = run->w;
    }
    return loop_push(S->L, end, then, NULL, NULL, run);
}

static void costs_seen_clear(Sim *S) {
    for (int i = 0; i < COSTS_SEEN; i++)
        Py_CLEAR(S->costs_seen[i].cost);
}

/* The cost's fields, read once per NodeCost object while it stays in costs_seen. */
static int read_cost(Sim *S, PyObject *cost, SimRunC *run) {
    int at = (int)(((uintptr_t)cost >> 4) % COSTS_SEEN);
    if (cost != S->costs_seen[at].cost) {
        long long cpu, gpu;
        long long sleep = 0;
        int gil, blocking, from_attrs = 0;
        if (get_ll(cost, sl_cpu_ns, &cpu) < 0 || get_ll(cost, sl_gpu_ns, &gpu) < 0 ||
            (gil = get_true(cost, sl_holds_gil)) < 0 || (blocking = get_true(cost, sl_blocking)) < 0)
            return -1;
        if (S->cores != NULL) { /* read only where cores are modelled: nothing else looks at them */
            PyObject *source = get_ll(cost, sl_sleep_ns, &sleep) < 0 ? NULL : PyObject_GetAttr(cost, sl_source);
            if (source == NULL)
                return -1;
            from_attrs = PyObject_RichCompareBool(source, sl_attrs, Py_EQ);
            Py_DECREF(source);
            if (from_attrs < 0)
                return -1;
        }
        Py_INCREF(cost);
        Py_XSETREF(S->costs_seen[at].cost, cost);
        S->costs_seen[at].cpu = cpu;
        S->costs_seen[at].gpu = gpu;
        S->costs_seen[at].gil = gil;
        S->costs_seen[at].blocking = blocking;
        S->costs_seen[at].sleep = sleep;
        S->costs_seen[at].from_attrs = from_attrs;
    }
    run->cpu_ns = S->costs_seen[at].cpu;
    run->gpu_ns = S->costs_seen[at].gpu;
    long long work;
    if (__builtin_add_overflow(S->work, run->cpu_ns, &work) ||
        __builtin_add_overflow(work, run->gpu_ns, &work) || work > WORK_LIMIT) {
        PyErr_SetString(PyExc_OverflowError, "the simulated costs add up past a 64-bit count of nanoseconds");
        return -1;
    }
    S->work = work;
    run->holds_gil = S->costs_seen[at].gil;
    run->blocking = S->costs_seen[at].blocking;
    run->sleep_ns = S->costs_seen[at].sleep;
    run->from_attrs = S->costs_seen[at].from_attrs;
    return 0;
}

/* The waits a consumer on `parent` makes before it runs (StreamRules.ready_waits, then streams.wait for each). */
static int sim_ready_waits(Sim *S, PyObject *gt, PyObject *buf, PyObject *parent, PyObject *node) {
    PyObject *ready = PyObject_GetAttr(buf, sl_ready_streams);
    if (ready == NULL)
        return -1;
    if (ready == Py_None) {
        Py_DECREF(ready);
        return 0;
    }
    PyObject *grads = PyObject_GetAttr(buf, s_grads), *events = grads ? PyObject_GetAttr(buf, sl_ready_events) : NULL;
    int r = -1;
    if (events == NULL || !PyList_CheckExact(ready) || !PyList_CheckExact(grads) || !PyList_CheckExact(events) ||
        PyList_GET_SIZE(grads) < PyList_GET_SIZE(ready) || PyList_GET_SIZE(events) < PyList_GET_SIZE(ready)) {
        /* not the plain lists: the Python rules */
        if (events != NULL || PyErr_Occurred() == NULL) {
            PyErr_Clear();
            PyObject *waits = sync_now(S) < 0 ? NULL : PyObject_CallMethodOneArg(buf, sl_ready_waits, parent);
            PyObject *it = waits ? PyObject_GetIter(waits) : NULL;
            Py_XDECREF(waits);
            if (it != NULL) {
                PyObject *pair;
                r = 0;
                while (r == 0 && (pair = PyIter_Next(it)) != NULL) {
                    PyObject *ev = PySequence_GetItem(pair, 1);
                    PyObject *res = ev ? PyObject_CallMethodObjArgs(S->streams, sl_wait, gt, parent, ev, node, NULL)
                                       : NULL;
                    r = res ? 0 : -1;
                    Py_XDECREF(res);
                    Py_XDECREF(ev);
                    Py_DECREF(pair);
                }
                if (PyErr_Occurred())
                    r = -1;
                Py_DECREF(it);
            }
        }
        goto out;
    }
    /* the pairs first (as ready_waits builds its list), then the waits */
    Py_ssize_t n = PyList_GET_SIZE(ready), m = 0;
    PyObject *chosen = PyList_New(0);
    if (chosen == NULL)
        goto out;
    for (Py_ssize_t pos = 0; pos < n; pos++) {
        PyObject *s = PyList_GET_ITEM(ready, pos);
        if (s == Py_None || PyList_GET_ITEM(grads, pos) == Py_None)
            continue;
        int ne = PyObject_RichCompareBool(s, parent, Py_NE);
        if (ne < 0 || (ne && PyList_Append(chosen, PyList_GET_ITEM(events, pos)) < 0)) {
            Py_DECREF(chosen);
            goto out;
        }
        m += ne;
    }
    r = m ? sync_now(S) : 0;
    for (Py_ssize_t i = 0; i < m && r == 0; i++) {
        PyObject *res = PyObject_CallMethodObjArgs(S->streams, sl_wait, gt, parent, PyList_GET_ITEM(chosen, i), node,
                                                   NULL);
        r = res ? 0 : -1;
        Py_XDECREF(res);
    }
    Py_DECREF(chosen);
out:
    Py_DECREF(ready);
    Py_XDECREF(grads);
    Py_XDECREF(events);
    return r;
}

/* CostResolver._cost_node's memo read in C: for a node of the cost op whose attrs' "cost" is a dict, the key
 * (us or the missing mark, flops or the mark, mode or None, cpu, name, device type, device index) looked up in
 * _by_cost. 1: found (*cost a new reference, also put in `resolved`); 0: not this case or not costed yet (the
 * caller calls the resolver, which fills the memo); -1: an error. A key that cannot be hashed is the resolver's case too. */
static int cost_node_known(Sim *S, PyObject *node, PyObject **cost) {
    *cost = NULL;
    PyObject *op = node_get(node, NF_OP);
    if (op == NULL)
        return -1;
    Py_DECREF(op);
    if (op != S->cost_op)
        return 0;
    /* the objects the key is read from, held to the end (and by the memo where the cost is found) */
    PyObject *attrs = node_get(node, NF_ATTRS), *name = attrs ? node_get(node, NF_NAME) : NULL,
             *device = name ? node_get(node, NF_DEVICE) : NULL, *spec = NULL, *key = NULL;
    int cpu = device ? node_true(node, NF_CPU) : -1, r = -1;
    if (cpu < 0)
        goto out;
    /* a node whose attrs, name, device and cpu flag are the very objects of one costed before: its cost */
    int slot = (int)((((uintptr_t)attrs >> 4) ^ ((uintptr_t)name >> 6) ^ ((uintptr_t)device >> 8)) & (COST_MEMO - 1));
    PyObject *found = S->cost_memo[slot].cost;
    if (found == NULL || S->cost_memo[slot].attrs != attrs || S->cost_memo[slot].name != name ||
        S->cost_memo[slot].device != device || S->cost_memo[slot].cpu != cpu) {
        found = NULL;
        spec = PyDict_CheckExact(attrs) ? Py_XNewRef(PyDict_GetItemWithError(attrs, s_cost)) : NULL;
        if (spec == NULL || !PyDict_CheckExact(spec)) {
            r = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        PyObject *us = PyDict_GetItemWithError(spec, s_us), *flops = us || !PyErr_Occurred() ?
            PyDict_GetItemWithError(spec, s_flops) : NULL, *mode = NULL;
        if (!PyErr_Occurred())
            mode = PyDict_GetItemWithError(spec, s_mode);
        PyObject *dtype = PyErr_Occurred() ? NULL : PyObject_GetAttr(device, s_type);
        PyObject *dindex = dtype ? PyObject_GetAttr(device, s_index) : NULL;
        if (dindex != NULL) /* the device's type and index, not the Device (whose hash is Python code) */
            key = PyTuple_Pack(7, us ? us : S->absent, flops ? flops : S->absent, mode ? mode : Py_None,
                               cpu ? Py_True : Py_False, name, dtype, dindex);
        Py_XDECREF(dtype);
        Py_XDECREF(dindex);
        if (key == NULL)
            goto out;
        found = PyDict_GetItemWithError(S->by_cost, key);
        if (found == NULL) {
            if (PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_TypeError))
                    goto out;
                PyErr_Clear(); /* an unhashable value: costed on its own by the resolver */
            }
            r = 0;
            goto out;
        }
        Py_INCREF(found); /* (held while the memo's old entry goes) */
        Py_XSETREF(S->cost_memo[slot].attrs, Py_NewRef(attrs));
        Py_XSETREF(S->cost_memo[slot].name, Py_NewRef(name));
        Py_XSETREF(S->cost_memo[slot].device, Py_NewRef(device));
        Py_XSETREF(S->cost_memo[slot].cost, found);
        S->cost_memo[slot].cpu = cpu;
    }
    if (map_set(S->resolved, node, found) < 0)
        goto out;
    *cost = Py_NewRef(found);
    r = 1;
out:
    Py_XDECREF(key);
    Py_XDECREF(spec);
    Py_XDECREF(attrs);
    Py_XDECREF(name);
    Py_XDECREF(device);
    return r;
}

/* The node's cost (a new reference): CostResolver.__call__ where the answer is known without Python (resolved
 * already, a cost node alike to one costed before, or a cost shared by the nodes of its signature, then noted as
 * resolved), else the resolver's call. */
static PyObject *lookup_cost(Sim *S, PyObject *node) {
    if (S->resolved == NULL)
        return sync_now(S) < 0 ? NULL : PyObject_CallOneArg(S->costs, node);
    PyObject *cost = map_get(S->resolved, node);
    if (cost != NULL)
        return Py_NewRef(cost);
    if (PyErr_Occurred())
        return NULL;
    if (S->by_cost != NULL) { /* a cost node alike to one costed before (CostResolver._cost_node's key) */
        int known = cost_node_known(S, node, &cost);
        if (known < 0)
            return NULL;
        if (known)
            return cost;
    }
    /* CostResolver._resolve's shared case: no attrs, not measured, a signature whose key has one cost */
    PyObject *attrs = node_get(node, NF_ATTRS), *nid = attrs ? node_get(node, NF_ID) : NULL;
    int plain = nid ? PyObject_Not(attrs) : -1;
    if (plain == 1)
        plain = PyDict_Contains(S->measured, nid) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
    Py_XDECREF(attrs);
    Py_XDECREF(nid);
    if (plain < 0)
        return NULL;
    if (plain) {
        /* a node alike to its slot's exemplar costs what the exemplar did (the same key: signature.c) */
        Py_ssize_t slot = sig_memo_slot(node);
        if (slot < 0)
            return NULL;
        if (S->memo_node[slot] != NULL) {
            int alike = sig_alike(S->memo_node[slot], node);
            if (alike < 0)
                return NULL;
            if (alike) {
                cost = Py_NewRef(S->memo_cost[slot]);
                if (map_set(S->resolved, node, cost) < 0) {
                    Py_DECREF(cost);
                    return NULL;
                }
                return cost;
            }
        }
        PyObject *sig = signature(NULL, node);
        if (sig == NULL)
            return NULL;
        if (sig != Py_None) {
            cost = PyDict_GetItemWithError(S->by_signature, PyTuple_GET_ITEM(sig, 0));
            if (cost == NULL && PyErr_Occurred()) {
                Py_DECREF(sig);
                return NULL;
            }
            if (cost != NULL && cost != S->by_values) {
                Py_INCREF(cost);
                Py_DECREF(sig);
                Py_XSETREF(S->memo_node[slot], Py_NewRef(node));
                Py_XSETREF(S->memo_cost[slot], Py_NewRef(cost));
                if (map_set(S->resolved, node, cost) < 0) {
                    Py_DECREF(cost);
                    return NULL;
                }
                return cost;
            }
        }
        Py_DECREF(sig);
    }
    return sync_now(S) < 0 ? NULL : PyObject_CallOneArg(S->costs, node);
}

/* _run_node: the engine's overhead, then the function, kernel and routing (as events). Steals nothing. */
static int sim_run_node(Sim *S, PyObject *w, PyObject *gt, PyObject *node, PyObject *buf, PyObject *queue,
                        PyObject *pushed) {
    long long start = S->now;
    int cpu = node_true(node, NF_CPU);
    if (cpu < 0)
        return -1;
    PyObject *parent;
    if (cpu) {
        parent = Py_NewRef(Py_None);
    } else {
        if (node_stream_of(S, node, &parent, NULL) < 0)
            return -1;
        if (sim_ready_waits(S, gt, buf, parent, node) < 0) {
            Py_DECREF(parent);
            return -1;
        }
    }
    PyObject *exec_info = PyObject_GetAttr(gt, s_exec_info);
    if (exec_info == NULL) {
        Py_DECREF(parent);
        return -1;
    }
    int has = PyObject_IsTrue(exec_info);
    PyObject *fi = NULL;
    if (has > 0) {
        fi = PyObject_CallMethodOneArg(exec_info, s_get, node);
        if (fi == NULL)
            has = -1;
    }
    Py_DECREF(exec_info);
    if (has < 0) {
        Py_DECREF(parent);
        return -1;
    }
    if (fi != NULL && fi != Py_None) {
        int needed = get_true(fi, sl_needed);
        if (needed < 0) {
            Py_DECREF(fi);
            Py_DECREF(parent);
            return -1;
        }
        if (!needed) { /* captured for grad() only: the node does not run */
            int captures = get_true(fi, sl_captures), r = captures < 0 ? -1 : 0;
            if (r == 0 && captures && parent != Py_None)
                r = leaf_add(S, gt, parent);
            PyObject *tid = r == 0 ? PyObject_GetAttr(w, sl_tid) : NULL;
            PyObject *gid = tid ? PyObject_GetAttr(gt, s_id) : NULL;
            if (gid == NULL || append_new(S->skips, Py_BuildValue("(LOOO)", S->now, tid, gid, node)) < 0)
                r = -1;
            Py_XDECREF(tid);
            Py_XDECREF(gid);
            Py_DECREF(fi);
            Py_DECREF(parent);
            return r < 0 ? -1 : sim_retire(S, w, gt, NULL);
        }
    }
    Py_XDECREF(fi);
    PyObject *cost = lookup_cost(S, node);
    if (cost == NULL) {
        Py_DECREF(parent);
        return -1;
    }
    PyObject *gid = PyObject_GetAttr(gt, s_id), *depth = gid ? PyObject_GetAttr(gt, s_reentrant_depth) : NULL;
    int bad = depth == NULL || append_new(S->started, PyTuple_Pack(4, gid, depth, node, w)) < 0;
    Py_XDECREF(gid);
    Py_XDECREF(depth);
    SimRunC *run = bad ? NULL : PyMem_Calloc(1, sizeof(SimRunC));
    if (run == NULL) {
        if (!bad)
            PyErr_NoMemory();
        Py_DECREF(cost);
        Py_DECREF(parent);
        return -1;
    }
    run->w = Py_NewRef(w);
    run->gt = Py_NewRef(gt);
    run->node = Py_NewRef(node);
    run->parent = parent;
    run->queue = Py_NewRef(queue);
    run->pushed = Py_NewRef(pushed);
    run->cost = cost;
    run->start = start;
    if (read_cost(S, cost, run) < 0) {
        run_free(run);
        return -1;
    }
    long long overhead = cpu ? S->overhead_ns : S->device_overhead_ns;
    PyObject *op = node_get(node, NF_OP);
    if (op == NULL) {
        run_free(run);
        return -1;
    }
    if (op == S->cost_op)
        overhead += S->cost_node_ns;
    Py_DECREF(op);
    return sim_cpu(S, overhead, S->overhead_gil, EV_FUNCTION, run);
}

/* _step: worker w is free: leave the loops whose call completed, or pop and run its next task. */
static int sim_step(Sim *S, PyObject *w) {
    for (;;) {
        PyObject *waiting = PyObject_GetAttr(w, sl_waiting_for);
        if (waiting == NULL)
            return -1;
        Py_ssize_t nw = PyList_GET_SIZE(waiting);
        if (nw) {
            int done_call = get_true(PyList_GET_ITEM(waiting, nw - 1), s_completed);
            if (done_call < 0) {
                Py_DECREF(waiting);
                return -1;
            }
            if (done_call) {
                PyObject *gt = Py_NewRef(PyList_GET_ITEM(waiting, nw - 1));
                int r = PyList_SetSlice(waiting, nw - 1, nw, NULL);
                PyObject *done = r < 0 ? NULL : PyObject_GetAttr(gt, sl_on_done);
                PyObject *fresh = done ? PyList_New(0) : NULL;
                r = fresh ? set_attr(gt, sl_on_done, fresh) : -1;
                Py_XDECREF(fresh);
                Py_ssize_t nd = r < 0 ? 0 : PyObject_Length(done);
                for (Py_ssize_t i = 0; r == 0 && i < nd; i++) {
                    PyObject *fn = PySequence_GetItem(done, i);
                    PyObject *res = fn && sync_now(S) == 0 ? PyObject_CallNoArgs(fn) : NULL;
                    Py_XDECREF(fn);
                    r = res ? 0 : -1;
                    Py_XDECREF(res);
                }
                if (r == 0 && nd == 0 && PyList_GET_SIZE(waiting) == 0) { /* the top-level call returned */
                    PyObject *now = lpy(S->now);
                    r = (now && set_attr(gt, sl_returned, now) == 0 && set_attr(w, sl_idle, Py_True) == 0 &&
                         set_attr(w, sl_idle_since, Py_None) == 0) ? 0 : -1;
                    Py_XDECREF(now);
                }
                Py_XDECREF(done);
                Py_DECREF(gt);
                Py_DECREF(waiting);
                return r;
            }
        }
        Py_DECREF(waiting);
        PyObject *q = PyObject_GetAttr(w, s_queue);
        PyObject *heap = q ? PyObject_GetAttr(q, sl_heap) : NULL;
        if (heap == NULL) {
            Py_XDECREF(q);
            return -1;
        }
        Py_ssize_t len = PyObject_Length(heap);
        if (len <= 0) {
            Py_DECREF(heap);
            Py_DECREF(q);
            if (len < 0)
                return -1;
            PyObject *now = lpy(S->now);
            int r = (now && set_attr(w, sl_idle, Py_True) == 0 && set_attr(w, sl_idle_since, now) == 0) ? 0 : -1;
            Py_XDECREF(now);
            return r;
        }
        PyObject *item = Py_IS_TYPE(heap, &QueueType) ? Queue_pop_impl((QueueObject *)heap, Py_None)
                                                      : sync_now(S) < 0 ? NULL
                                                      : PyObject_CallMethodNoArgs(heap, sl_pop);
        PyObject *qname = item ? PyObject_GetAttr(q, s_name) : NULL;
        Py_DECREF(q);
        if (qname == NULL || !PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyTuple_Check(PyTuple_GET_ITEM(item, 0)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(item, 0)) != 3) {
            if (qname != NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a simulated queue's item is ((gt, node, buffer), pushed)");
            Py_XDECREF(item);
            Py_XDECREF(qname);
            Py_DECREF(heap);
            return -1;
        }
        PyObject *task = PyTuple_GET_ITEM(item, 0), *pushed = PyTuple_GET_ITEM(item, 1);
        PyObject *gt = PyTuple_GET_ITEM(task, 0), *node = PyTuple_GET_ITEM(task, 1), *buf = PyTuple_GET_ITEM(task, 2);
        int r = 0;
        if (S->detail) {
            PyObject *tid = PyObject_GetAttr(w, sl_tid), *gid = tid ? PyObject_GetAttr(gt, s_id) : NULL;
            Py_ssize_t left = gid ? PyObject_Length(heap) : -1;
            r = (left < 0 || append_new(S->samples, Py_BuildValue("(LOOOOnO)", S->now, tid, qname, gid, node, left,
                                                                  Py_False)) < 0) ? -1 : 0;
            Py_XDECREF(tid);
            Py_XDECREF(gid);
        }
        Py_DECREF(heap);
        if (r == 0 && node != Py_None)
            r = sim_run_node(S, w, gt, node, buf, qname, pushed);
        int wakeup = node == Py_None;
        Py_DECREF(item);
        Py_DECREF(qname);
        if (r < 0)
            return -1;
        if (!wakeup)
            return 0;
        /* a wake-up: the loop condition is checked again */
    }
}

static int sim_retire(Sim *S, PyObject *w, PyObject *gt, PyObject *finished) {
    int fin;
    if (finished == NULL) {
        long long out;
        if (get_ll(gt, s_outstanding, &out) < 0)
            return -1;
        PyObject *v = lpy(out - 1);
        int r = v ? set_attr(gt, s_outstanding, v) : -1;
        Py_XDECREF(v);
        if (r < 0)
            return -1;
        fin = out - 1 == 0;
    } else {
        fin = PyObject_IsTrue(finished);
        if (fin < 0)
            return -1;
    }
    if (fin) {
        PyObject *res = sync_now(S) < 0 ? NULL : PyObject_CallMethodObjArgs(S->sim, sl_complete, w, gt, NULL);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    if (S->pending != NULL)  /* not reached: one retire per event's calls */
        return sim_step(S, w);
    S->pending = Py_NewRef(w);
    return 0;
}

/* wake: the hand-off has passed: a worker that slept on its empty queue takes its next task. */
static int sim_wake(Sim *S, PyObject *w) {
    if (set_attr(w, sl_wake_pending, Py_False) < 0)
        return -1;
    int idle = get_true(w, sl_idle);
    if (idle <= 0)
        return idle;
    PyObject *since = PyObject_GetAttr(w, sl_idle_since);
    if (since == NULL)
        return -1;
    if (since != Py_None) {
        long long s = PyLong_AsLongLong(since);
        if (s == -1 && PyErr_Occurred()) {
            Py_DECREF(since);
            return -1;
        }
        if (S->now > s) {
            PyObject *waiting = PyObject_GetAttr(w, sl_waiting_for);
            PyObject *wid = NULL;
            if (waiting != NULL) {
                Py_ssize_t nw = PyList_GET_SIZE(waiting);
                wid = nw ? PyObject_GetAttr(PyList_GET_ITEM(waiting, nw - 1), s_id) : Py_NewRef(Py_None);
            }
            PyObject *tid = wid ? PyObject_GetAttr(w, sl_tid) : NULL;
            PyObject *q = tid ? PyObject_GetAttr(w, s_queue) : NULL;
            PyObject *qname = q ? PyObject_GetAttr(q, s_name) : NULL;
            int r = qname ? append_new(S->idles, Py_BuildValue("(OLOOO)", since, S->now, tid, qname, wid)) : -1;
            Py_XDECREF(waiting);
            Py_XDECREF(wid);
            Py_XDECREF(tid);
            Py_XDECREF(q);
            Py_XDECREF(qname);
            if (r < 0) {
                Py_DECREF(since);
                return -1;
            }
        }
    }
    Py_DECREF(since);
    if (set_attr(w, sl_idle, Py_False) < 0)
        return -1;
    return sim_step(S, w);
}

/* The tables of a CostResolver (CostResolver.tables: resolved (a dict or a NodeMap), by signature, measured, the by-values mark, by
 * cost, the missing-field mark, the cost op), borrowed into S; all NULL for None (the cost function is called for
 * every node). */
static int resolver_tables(PyObject *t, Sim *S) {
    S->resolved = S->by_signature = S->measured = S->by_values = S->by_cost = S->absent = NULL;
    if (t == Py_None)
        return 0;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7 || !(PyDict_CheckExact(PyTuple_GET_ITEM(t, 0)) ||
        Py_IS_TYPE(PyTuple_GET_ITEM(t, 0), &NodeMapType)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(t, 1)) || !PyDict_Check(PyTuple_GET_ITEM(t, 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(t, 4))) {
        PyErr_SetString(PyExc_TypeError, "a CostResolver's (resolved, by_signature, measured, mark, by_cost, absent, "
                                         "cost op)");
        return -1;
    }
    S->resolved = PyTuple_GET_ITEM(t, 0);
    S->by_signature = PyTuple_GET_ITEM(t, 1);
    S->measured = PyTuple_GET_ITEM(t, 2);
    S->by_values = PyTuple_GET_ITEM(t, 3);
    S->by_cost = PyTuple_GET_ITEM(t, 4);
    S->absent = PyTuple_GET_ITEM(t, 5);
    if (S->cost_op == NULL)
        S->cost_op = PyTuple_GET_ITEM(t, 6);
    return 0;
}

/* After an error: the simulator's clock where the loop stopped, the error kept. */
static void sync_now_after_error(Sim *S) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (sync_now(S) < 0)
        PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* sim_loop(sim, events, order, wake, step, costs, resolved, slices, kernels, started, skips, idles, samples,
 *          stream_free, streams, ones, tracer, COST, now, overhead_ns, device_overhead_ns, cost_node_ns,
 *          gil_handoff_ns, detail, overhead_gil, gil_free_at, gil_holder, core_free)
 *          -> (now, gil_free_at, gil_holder, order):
 * the events already made (Simulator._events: (time, order, action, arg)) and every later one, run; see
 * scheduler.Simulator._run_compiled. core_free: Simulator._core_free (a list of ints, the cores' heap, updated in
 * place when the loop ends), or None. */
static PyObject *sim_loop(PyObject *mod, PyObject *args) {
    PyObject *sim, *events, *wake_fn, *step_fn, *costs, *resolved, *slices, *kernels, *started, *skips, *idles, *samples,
        *stream_free, *streams, *ones, *tracer, *cost_op, *gil_holder, *core_free;
    long long order, now, overhead_ns, device_overhead_ns, cost_node_ns, gil_handoff_ns, gil_free_at;
    int detail, overhead_gil;
    if (!PyArg_ParseTuple(args, "OO!LOOOOOO!O!O!O!O!O!OO!OOLLLLLppLOO", &sim, &PyList_Type, &events, &order, &wake_fn,
                          &step_fn, &costs,
                          &resolved, &slices, &PyList_Type, &kernels, &PyList_Type, &started,
                          &PyList_Type, &skips, &PyList_Type, &idles, &PyList_Type, &samples, &PyDict_Type,
                          &stream_free, &streams, &PyList_Type, &ones, &tracer, &cost_op, &now, &overhead_ns,
                          &device_overhead_ns, &cost_node_ns, &gil_handoff_ns, &detail, &overhead_gil, &gil_free_at,
                          &gil_holder, &core_free))
        return NULL;
    if (slices_check(slices, "sim_loop") < 0 || sl_intern() < 0)
        return NULL;
    Sim tables = {.cost_op = cost_op};
    if (resolver_tables(resolved, &tables) < 0)
        return NULL;
    long long *cores = NULL;
    Py_ssize_t ncores = 0;
    if (core_free != Py_None) {
        if (!PyList_CheckExact(core_free) || PyList_GET_SIZE(core_free) == 0) {
            PyErr_SetString(PyExc_TypeError, "sim_loop: core_free is a non-empty list of ints, or None");
            return NULL;
        }
        ncores = PyList_GET_SIZE(core_free);
        if ((cores = PyMem_Malloc(ncores * sizeof(long long))) == NULL)
            return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < ncores; i++)
            if ((cores[i] = PyLong_AsLongLong(PyList_GET_ITEM(core_free, i))) == -1 && PyErr_Occurred()) {
                PyMem_Free(cores);
                return NULL;
            }
    }
    LoopObject *L = PyObject_New(LoopObject, &LoopType);
    if (L == NULL) {
        PyMem_Free(cores);
        return NULL;
    }
    L->heap = NULL;
    L->size = L->cap = 0;
    L->order = order;
    L->sim = Py_NewRef(sim);
    L->wake_fn = Py_NewRef(wake_fn);
    L->step_fn = Py_NewRef(step_fn);
    Sim S = {.L = L, .sim = sim, .costs = costs, .resolved = tables.resolved,
             .by_signature = tables.by_signature, .measured = tables.measured, .by_values = tables.by_values,
             .by_cost = tables.by_cost, .absent = tables.absent,
             .slices = slices, .kernels = kernels, .started = started, .skips = skips, .idles = idles,
             .samples = samples, .stream_free = stream_free, .streams = streams, .ones = Py_NewRef(ones),
             .tracer = tracer, .cost_op = cost_op, .now = now, .overhead_ns = overhead_ns,
             .device_overhead_ns = device_overhead_ns, .cost_node_ns = cost_node_ns, .gil_handoff_ns = gil_handoff_ns,
             .gil_free_at = gil_free_at, .gil_holder = gil_holder, .holder_ref = Py_NewRef(gil_holder),
             .detail = detail, .overhead_gil = overhead_gil, .now_seen = now,
             .cores = cores, .ncores = ncores};
    PyObject *result = NULL, *at = PyObject_GetAttr((PyObject *)L, sl_at);
    if (at == NULL || PyObject_SetAttr(sim, sl_at, at) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        long long t, o;
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4) {
            PyErr_SetString(PyExc_TypeError, "sim_loop: an event is (time, order, action, arg)");
            goto restore;
        }
        t = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 0));
        o = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 1));
        if (PyErr_Occurred() || loop_push_action(L, t, o, PyTuple_GET_ITEM(e, 2), PyTuple_GET_ITEM(e, 3)) < 0)
            goto restore;
    }
    while (L->size) {
        SimEv e = loop_pop(L);
        int r = set_now(&S, e.t);
        if (r == 0) {
            switch (e.kind) {
            case EV_STEP: r = sim_step(&S, e.a); break;
            case EV_WAKE: r = sim_wake(&S, e.a); break;
            case EV_PY: {
                PyObject *res = sync_now(&S) < 0 ? NULL : PyObject_CallOneArg(e.a, e.b);
                r = res ? 0 : -1;
                Py_XDECREF(res);
                break;
            }
            default: {
                SimRunC *run = e.run;
                e.run = NULL;
                r = sim_then(&S, e.kind, run);
            }
            }
        }
        while (r == 0 && S.pending != NULL) {
            PyObject *w = S.pending;
            S.pending = NULL;
            r = sim_step(&S, w);
            Py_DECREF(w);
        }
        if (r == 0 && e.kind == EV_PY) {  /* a Python event's own retired workers (Simulator._go_on) */
            PyObject *py_pending = PyObject_GetAttr(sim, sl__pending);
            int more = py_pending ? PyObject_IsTrue(py_pending) : -1;
            Py_XDECREF(py_pending);
            PyObject *res = more > 0 ? PyObject_CallMethodNoArgs(sim, sl__go_on) : NULL;
            r = more < 0 || (more > 0 && res == NULL) ? -1 : 0;
            Py_XDECREF(res);
        }
        Py_XDECREF(e.a);
        Py_XDECREF(e.b);
        run_free(e.run);
        if (r < 0)
            goto restore;
    }
    result = Py_BuildValue("(LLOL)", S.now, S.gil_free_at, S.holder_ref, L->order);
restore:
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (PyObject_DelAttr(sim, sl_at) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
done:
    if (result == NULL)
        sync_now_after_error(&S);
    for (int i = 0; i < 8; i++) {
        Py_XDECREF(S.streams_seen[i].dev);
        Py_XDECREF(S.streams_seen[i].st);
        Py_XDECREF(S.streams_seen[i].parent);
        Py_XDECREF(S.streams_seen[i].key);
    }
    Py_XDECREF(S.pending);
    task_ids_clear(&S);
    memo_clear(&S);
    sim_route_clear(&S);
    Py_XDECREF(S.leaf_set);
    Py_XDECREF(S.leaf_stream);
    Py_XDECREF(at);
    Py_XDECREF(S.ones);
    Py_XDECREF(S.holder_ref);
    costs_seen_clear(&S);
    Py_DECREF(L);
    if (cores != NULL) { /* the cores' heap back into the simulator's list, as the Python methods leave it */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        for (Py_ssize_t i = 0; i < ncores && PyList_GET_SIZE(core_free) == ncores; i++) {
            PyObject *v = PyLong_FromLongLong(cores[i]);
            if (v == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SetItem(core_free, i, v);
        }
        PyMem_Free(cores);
        if (et != NULL)
            PyErr_Restore(et, ev, tb);
    }
    return result;
}

/* sim_sequential(sim, gt, queue, costs, resolved, slices, ones, tracer, COST, now, overhead_ns, cost_node_ns, tid,
 *                qname, gid) -> now: Simulator._run_sequential's loop (its Python twin), for a call whose nodes all run
 * on the CPU, with no exec_info and no queue samples (the caller checks): each popped node runs right after the
 * previous one; its cost, slice and routing as there. `queue` is the caller's compiled ReadyQueue; `resolved` as
 * for sim_loop. The simulator's `now` is set before each routing (a queue's push reads it) and at the end. */
static PyObject *sim_sequential(PyObject *mod, PyObject *args) {
    PyObject *sim, *gt, *queue, *costs, *resolved, *slices, *ones, *tracer, *cost_op, *tid, *qname, *gid;
    PyObject *own_ones = NULL; /* a longer list of ones than the one given, once a node needs it */
    long long now, overhead_ns, cost_node_ns;
    if (!PyArg_ParseTuple(args, "OOO!OOOO!OOLLLOOO", &sim, &gt, &QueueType, &queue, &costs, &resolved,
                          &slices, &PyList_Type, &ones, &tracer, &cost_op, &now, &overhead_ns, &cost_node_ns, &tid,
                          &qname, &gid))
        return NULL;
    if (slices_check(slices, "sim_sequential") < 0 || sl_intern() < 0)
        return NULL;
    Sim S = {.sim = sim, .costs = costs, .now = now, .now_seen = now, .cost_op = cost_op};
    if (resolver_tables(resolved, &S) < 0)
        return NULL;
    PyObject *exec_info = PyObject_GetAttr(gt, s_exec_info), *result = NULL;
    if (exec_info == NULL)
        return NULL;
    EngineInfo ei;
    GtInfo gi;
    if (engine_info_fill(&ei, sim, tracer) < 0) {
        Py_DECREF(exec_info);
        return NULL;
    }
    if (gt_info_fill_route(&gi, gt, exec_info) < 0) {
        engine_info_clear(&ei);
        Py_DECREF(exec_info);
        return NULL;
    }
    QueueObject *q = (QueueObject *)queue;
    SimRunC run = {0};
    PyObject *zero = PyLong_FromLong(0); /* (a cached small int: never fails) */
    long long t = now;
    while (q->size > 0) {
        PyObject *item = Queue_pop_impl(q, Py_None);
        if (item == NULL)
            goto done;
        PyObject *task = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 ? PyTuple_GET_ITEM(item, 0) : NULL;
        if (task == NULL || !PyTuple_Check(task) || PyTuple_GET_SIZE(task) != 3) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "sim_sequential: a queue item is ((gt, node, buffer), pushed)");
            goto done;
        }
        PyObject *node = PyTuple_GET_ITEM(task, 1), *pushed = PyTuple_GET_ITEM(item, 1);
        if (node == Py_None) {
            Py_DECREF(item);
            continue;
        }
        int cpu = node_true(node, NF_CPU);
        if (cpu <= 0) {
            if (cpu == 0)
                PyErr_SetString(PyExc_RuntimeError, "sim_sequential: a node off the CPU (the Python loop's)");
            Py_DECREF(item);
            goto done;
        }
        long long start = t;
        S.now = t;
        PyObject *cost = lookup_cost(&S, node);
        if (cost == NULL || read_cost(&S, cost, &run) < 0) {
            Py_XDECREF(cost);
            Py_DECREF(item);
            goto done;
        }
        Py_DECREF(cost);
        t += overhead_ns + run.cpu_ns;
        PyObject *op = node_get(node, NF_OP);
        if (op == NULL) {
            Py_DECREF(item);
            goto done;
        }
        if (op == cost_op)
            t += cost_node_ns;
        Py_DECREF(op);
        S.now = t;
        if (slices_add(slices, gid, zero, node, tid, start, t, qname, pushed) < 0) {
            Py_DECREF(item);
            goto done;
        }
        PyObject *nxt = node_get(node, NF_NEXT);
        int has_next = nxt ? PyObject_IsTrue(nxt) : -1;
        Py_ssize_t nn = has_next > 0 && PyList_Check(nxt) ? PyList_GET_SIZE(nxt) : 0;
        Py_XDECREF(nxt);
        int r = has_next;
        if (nn > PyList_GET_SIZE(ones)) { /* more outputs than the list has: it grows */
            PyObject *more = more_ones(sim, nn);
            if (more == NULL) {
                r = -1;
            } else {
                Py_XSETREF(own_ones, more);
                ones = more;
            }
        }
        if (r > 0) { /* route(), with what it reads of the simulator and the task read once */
            PyObject *res = sync_now(&S) < 0 ? NULL : route_core(&ei, &gi, node, ones, Py_None);
            r = res ? 0 : -1;
            Py_XDECREF(res);
        } else if (has_next == 0) { /* a leaf: the task retires */
            long long out;
            r = get_ll(gt, s_outstanding, &out);
            PyObject *v = r == 0 ? PyLong_FromLongLong(out - 1) : NULL;
            r = v ? set_attr(gt, s_outstanding, v) : -1;
            Py_XDECREF(v);
        }
        Py_DECREF(item);
        if (r < 0)
            goto done;
    }
    S.now = t;
    if (sync_now(&S) < 0)
        goto done;
    result = PyLong_FromLongLong(t);
done:
    if (result == NULL)
        sync_now_after_error(&S);
    Py_XDECREF(own_ones);
    costs_seen_clear(&S);
    memo_clear(&S);
    Py_DECREF(zero);
    gt_info_clear(&gi);
    engine_info_clear(&ei);
    Py_DECREF(exec_info);
    return result;
}

/* costs_of(costs, resolved, nodes) -> [costs(node) for node in nodes]: the cost of each node, found as the event
 * loops find it (lookup_cost: a CostResolver's tables where `resolved` is them, else a call). Twin:
 * sim.costs.CostResolver.many's list. */
static PyObject *costs_of(PyObject *mod, PyObject *args) {
    PyObject *costs, *tables, *nodes;
    if (!PyArg_ParseTuple(args, "OOO!", &costs, &tables, &PyList_Type, &nodes))
        return NULL;
    Sim S = {.costs = costs}; /* no clock: now == now_seen, so lookup_cost never writes one */
    if (resolver_tables(tables, &S) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i);
        Py_INCREF(node); /* the call may run Python code that changes the list */
        PyObject *c = lookup_cost(&S, node);
        Py_DECREF(node);
        if (c == NULL || PyList_GET_SIZE(nodes) != n) {
            if (c != NULL) {
                Py_DECREF(c);
                PyErr_SetString(PyExc_RuntimeError, "costs_of: the node list changed");
            }
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, c);
    }
    memo_clear(&S);
    return out;
}
