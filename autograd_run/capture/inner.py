"""Graphs that exist only while a custom autograd.Function's backward runs, captured as data.

A reentrant checkpoint (``torch.utils.checkpoint(..., use_reentrant=True)``)
is a custom Function: its node, ``CheckpointFunctionBackward``, recomputes
the checkpointed segment on detached copies of its inputs, with grad mode
on, and calls ``torch.autograd.backward(outputs, grads)`` over that new
graph; its gradients are the detached inputs' ``.grad``. Nothing of that
graph exists before the backward pass, so it is captured during the
reference backward:

* a pre-hook on every custom Function node pushes it on a stack with the
  gradients it receives, a post-hook pops it with the gradients it returns;
* while a node is on the stack, ``torch.autograd.backward`` and
  ``torch.autograd.grad`` are wrapped: a call walks the graph it is given,
  adds its new nodes to the capture (saved values are read now, before the
  nested backward frees them) and registers the order pre-hooks on them, so
  PyTorch's reference order includes them; after the call the gradients of
  the graph's leaves are noted;
* when the node returns, each of its outputs must be one of those leaf
  gradients (``backward``) or one of the call's results (``grad``), and the
  nested call's root gradients must be the ones it received. Then the node
  is written as ``op: checkpoint`` with ``attrs.inner``
  (``autograd_run.graphs.checkpoints``) and the detached inputs become
  variables named ``<node id>.input<k>``. Nested checkpoints recurse.

A custom Function whose backward builds no graph (most of them: the
arithmetic it does is not recorded anywhere autograd can see) becomes a
``python`` node that calls its own ``backward`` again at replay
(``autograd_run.engine.callables.autograd_function``, run only with
``--allow-python``), when capture can hold what the backward reads: the
class importable by name (``attrs.function``, ``module:Qualname``), the
tensors it saved (``saved``: ``saved_tensors.<k>``) and the attributes its
forward set on ``ctx`` as data (``attrs.ctx``: numbers, strings, flags,
lists of them; tensors go to ``saved`` as ``ctx.<name>``). Otherwise, and
for one that transforms the nested gradients before returning them, it
stays ``opaque`` with ``attrs.reason`` saying why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def is_custom_function(fn) -> bool:
    """Whether ``fn`` is the node of a Python ``torch.autograd.Function``."""
    return hasattr(fn, "_forward_cls")


def custom_function_reason(fn, why: str) -> str:
    cls = getattr(fn, "_forward_cls", None)
    label = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else fn.name()
    return f"custom autograd.Function {label}: {why}"


NO_GRAPH = ("its backward is Python code that builds no autograd graph (no nested backward() or grad() call "
            "whose graph could be replayed)")

#: The shipped callable that replays a custom Function's own backward (``python`` nodes).
FUNCTION_CALLABLE = "autograd_run.engine.callables:autograd_function"
#: The node's own attributes, not ones the user's forward set on ctx.
_CTX_SKIP = {"to_save", "non_differentiable", "dirty_tensors", "saved_variables", "needs_input_grad",
             "materialize_grads"}


def _library_backward(torch, cls):
    """For the class ``torch.library``'s ``register_autograd`` generates (``GeneratedBackwardFor_<ns>_<op>_<overload>``,
    not importable): the registered backward function of that custom op, or None."""
    name = getattr(cls, "__name__", "")
    if getattr(cls, "__module__", "") != "torch._library.autograd" or not name.startswith("GeneratedBackwardFor_"):
        return None
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return None
    for opdef in list(OPDEFS.values()):  # custom_op defines the default overload only
        if name == f"GeneratedBackwardFor_{opdef._namespace}_{opdef._name}_default":
            return getattr(opdef, "_backward_fn", None)
    return None


#: Scripts ``capture`` ran (``runpy.run_path`` under a run name): run name -> (absolute path, its namespace).
#: A Function defined at a script's top level is found through it and replayed by loading that file again.
SCRIPTS: dict[str, tuple[str, dict]] = {}


def register_script(run_name: str, path: str, namespace: dict) -> None:
    """Tell capture that ``path`` ran as module ``run_name`` (``capture SCRIPT:FUNC`` does, before the call)."""
    import os
    SCRIPTS[run_name] = (os.path.abspath(path), namespace)


def _from_script(obj) -> tuple[str, str] | None:
    """``(Qualname, script path)`` for a class or function defined at the top level of a script capture ran."""
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    ran = SCRIPTS.get(mod or "")
    if ran is None or "<locals>" in qual:
        return None
    found = ran[1]
    for k, part in enumerate(qual.split(".")):
        found = found.get(part) if k == 0 else getattr(found, part, None)
        if found is None:
            return None
    return (qual, ran[0]) if found is obj else None


def _importable(cls) -> str | None:
    """``module:Qualname`` when importing it by name gives this very class (or function); else None."""
    import importlib
    mod, qual = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if not mod or mod == "__main__" or "<locals>" in qual or mod in SCRIPTS:
        return None
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{mod}:{qual}" if obj is cls else None


def _ctx_value(torch, v):
    """A ctx attribute as JSON data, or raise TypeError."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": str(v)}
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, torch.Size):
        return [int(n) for n in v]
    if isinstance(v, (list, tuple)):
        return [_ctx_value(torch, x) for x in v]
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).replace("torch.", "")}
    if isinstance(v, dict):  # a config (transformers' YOSO keeps one): its items, keys plain values
        items = list(v.items())
        if not all(k is None or isinstance(k, (bool, int, str)) for k, _ in items):
            raise TypeError("dict with keys other than str, int, bool or None")
        return {"dict": [[k, _ctx_value(torch, x)] for k, x in items]}
    raise TypeError(type(v).__name__)


def function_state(torch, fn, nid: str, arrays):
    """What replaying custom Function node ``fn``'s backward needs: ``(attrs, saved)``, or why not (a str).

    Read while the forward's saved tensors still exist (before the reference backward)."""
    cls = getattr(fn, "_forward_cls", None)
    where = _importable(cls) if cls is not None else None
    kind = "function"
    script = None
    if where is None and cls is not None and (found := _from_script(cls)) is not None:
        where, script = f"{cls.__module__}:{found[0]}", found[1]
    if where is None and cls is not None:
        backward = _library_backward(torch, cls)  # a torch.library custom op's registered backward
        where = _importable(backward) if backward is not None else None
        kind = "library"
    if where is None:
        return ("its class is not importable by name (defined inside a function, in __main__, or generated "
                "without an importable backward), so a replay cannot call its backward")
    if kind == "function" and getattr(cls, "backward", None) is None:
        return "it has no backward of its own to call"
    try:
        saved_tensors = fn.saved_tensors
    except RuntimeError as e:
        return f"its saved tensors cannot be read ({str(e)[:80]})"
    saved = {}
    for k, t in enumerate(saved_tensors):
        saved[f"saved_tensors.{k}"] = None if t is None else arrays.put(f"{nid}.saved_tensors.{k}", t)
    ctx = {}
    for name, v in sorted(vars(fn).items()):
        if name.startswith("__") or name in _CTX_SKIP:  # (PyTorch's own ctx state is not in the instance dict)
            continue
        if isinstance(v, torch.Tensor):
            saved[f"ctx.{name}"] = arrays.put(f"{nid}.ctx.{name}", v)
            continue
        try:
            ctx[name] = _ctx_value(torch, v)
        except TypeError as e:
            return f"its ctx.{name} is a {e} a graph file cannot hold"
    attrs = {"callable": FUNCTION_CALLABLE, "function": where, "ctx": ctx,
             **({"library_op": True} if kind == "library" else {}),
             **({"script": script} if script else {}),
             "saved_count": len(saved_tensors),
             "needs_input_grad": [bool(b) for b in fn.needs_input_grad],
             "materialize_grads": bool(getattr(fn, "materialize_grads", True))}
    return attrs, saved


@dataclass
class _Call:
    """One nested ``torch.autograd.backward`` or ``grad`` call made by a running custom node."""

    kind: str
    edges: list
    grads: list
    inputs: list | None
    #: ``grad``: its results; ``backward``: AccumulateGrad node -> the leaf's ``.grad`` after the call.
    result: list = field(default_factory=list)
    leaf_grads: dict = field(default_factory=dict)
    #: Nodes this call added to the capture.
    new: list = field(default_factory=list)
    #: Positions of the reference order this call's nodes ran at: [start, end).
    window: tuple = (0, 0)


@dataclass
class _Running:
    fn: object
    incoming: tuple
    calls: list = field(default_factory=list)


class NestedCapture:
    """Watches custom Function nodes during one reference backward (a context manager; see the module doc).

    ``on_new(fns)`` is called with the nodes each nested call adds (the
    reference run registers its order pre-hooks there, and watches the leaves),
    ``on_call(edges, grads)`` with each nested call's roots and their gradients,
    ``position()`` gives the length of the reference order so far.
    """

    def __init__(self, cap, on_new, on_call=None, position=None):
        self.cap = cap
        self.on_new = on_new
        self.on_call = on_call
        self.position = position or (lambda: 0)
        #: Nested calls of nodes left opaque: their graphs do not run in the replay.
        self.dropped: list[_Call] = []
        self.stack: list[_Running] = []
        self.handles: list = []
        self.watched: set = set()
        self.resolved: set = set()
        self._inner_vars: set[str] = set()
        self._orig = None
        #: Nested calls running now: the reentrant depth of the nodes that run (0 in the outer backward).
        self.depth = 0

    # -- hooks ---------------------------------------------------------------------------------------
    def watch(self, fns) -> None:
        for fn in fns:
            if fn in self.cap.custom and fn not in self.watched:
                self.watched.add(fn)
                self.handles.append(fn.register_prehook(lambda g, fn=fn: self._enter(fn, g)))
                self.handles.append(fn.register_hook(lambda gi, go, fn=fn: self._leave(fn, gi)))

    def _enter(self, fn, grads) -> None:
        self.stack.append(_Running(fn, tuple(grads)))

    def _leave(self, fn, outs) -> None:
        run = self.stack.pop()
        assert run.fn is fn
        self.resolve(run, tuple(outs))

    def __enter__(self):
        import torch
        self.watch(list(self.cap.docs))
        self._orig = (torch.autograd.backward, torch.autograd.grad)
        torch.autograd.backward, torch.autograd.grad = self._backward, self._grad
        return self

    def __exit__(self, *exc):
        import torch
        torch.autograd.backward, torch.autograd.grad = self._orig
        for h in self.handles:
            h.remove()
        self.handles = []
        return False

    def _active(self) -> bool:
        """Whether a watched custom node is running. Not tied to the capturing thread: PyTorch hands a
        nested backward 60 levels deep to a pool thread while the caller waits, so the nodes still run
        one at a time and the stack stays in order."""
        return bool(self.stack)

    # -- the wrapped calls ---------------------------------------------------------------------------
    def _start(self, kind, tensors, grads, inputs) -> _Call:
        import torch
        from torch.autograd.graph import get_gradient_edge
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        if grads is None or isinstance(grads, torch.Tensor):
            grads = (grads,) * len(tensors) if grads is None else (grads,)
        edges = [get_gradient_edge(t) if t.requires_grad else None for t in tensors]
        call = _Call(kind, edges, list(grads), None if inputs is None else
                     ([inputs] if isinstance(inputs, torch.Tensor) else list(inputs)))
        call.new = self.cap.add([e.node for e in edges if e is not None])
        self.on_new(call.new)
        self.watch(call.new)
        if self.on_call is not None:
            self.on_call(edges, [torch.ones_like(t) if g is None else g for t, g in zip(tensors, call.grads)])
        return call

    def _backward(self, tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                  inputs=None):
        if not self._active():
            return self._orig[0](tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
        call = self._start("backward", tensors, grad_tensors, inputs)
        accs = self._leaves(call)
        start = self.position()
        self.depth += 1
        try:
            out = self._orig[0](tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
        finally:
            self.depth -= 1
        call.window = (start, self.position())
        call.leaf_grads = {fn: fn.variable.grad for fn in accs}
        self.stack[-1].calls.append(call)
        return out

    def _grad(self, outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, *args, **kw):
        if not self._active():
            return self._orig[1](outputs, inputs, grad_outputs, retain_graph, create_graph, *args, **kw)
        call = self._start("grad", outputs, grad_outputs, inputs)
        start = self.position()
        self.depth += 1
        try:
            out = self._orig[1](outputs, inputs, grad_outputs, retain_graph, create_graph, *args, **kw)
        finally:
            self.depth -= 1
        call.window = (start, self.position())
        call.result = list(out)
        self.stack[-1].calls.append(call)
        return out

    def _leaves(self, call) -> list:
        reach = self.cap.reachable([e.node for e in call.edges if e is not None])
        return [fn for fn in reach if fn in self.cap.var_of]

    # -- resolving a node ----------------------------------------------------------------------------
    def resolve(self, run: _Running, outs: tuple) -> None:
        """Write ``run.fn`` as a checkpoint over its nested call's graph, or leave it opaque saying why."""
        fn = run.fn
        self.resolved.add(fn)
        doc = self.cap.docs[fn]
        why = self._inner(run, outs)
        if why is NO_GRAPH:
            state = self.cap.custom_state.get(fn)
            if isinstance(state, tuple):
                attrs, saved = state
                doc["op"] = "python"
                doc.setdefault("attrs", {}).pop("reason", None)
                doc["attrs"].update(attrs)
                if saved:
                    doc["saved"] = saved
                return
            if isinstance(state, str):
                why = f"{NO_GRAPH}, and {state}"
        if isinstance(why, str):
            if run.calls:  # its nested graphs ran in PyTorch, not in the replay: left out (``finish``)
                self.dropped.extend(run.calls)
                n = sum(len(c.new) for c in run.calls)
                why += f"; the {n} node(s) its nested backward ran are left out of the graph and the order"
            doc["op"] = "opaque"
            doc.setdefault("attrs", {})["reason"] = custom_function_reason(fn, why)
            return
        inner, renames = why
        for old, new in renames:
            self.cap.rename_variable(old, new)
            self._inner_vars.add(new)
        doc["op"] = "checkpoint"
        attrs = doc.setdefault("attrs", {})
        attrs.pop("reason", None)
        attrs["inner"] = inner

    def _inner(self, run: _Running, outs: tuple):
        fn = run.fn
        if not run.calls:
            return NO_GRAPH
        if len(run.calls) > 1:
            return f"its backward makes {len(run.calls)} nested backward calls (one can be kept as data)"
        call = run.calls[0]
        if call.kind == "backward" and call.inputs is not None:
            return "its nested backward() names inputs= (not kept as data)"
        slots = _root_slots(run.incoming, call.grads)
        if slots is None:
            return "its nested backward is given gradients other than the ones the node received"
        roots: list = [None] * len(run.incoming)
        for j, slot in enumerate(slots):
            e = call.edges[j]
            if e is None:
                return "its nested backward starts from a tensor that does not require grad"
            roots[slot] = [self.cap.ids[e.node], e.output_nr]
        next_fns = fn.next_functions
        if len(outs) != len(next_fns):
            return f"it returned {len(outs)} gradients for {len(next_fns)} inputs"
        names: list = []
        renames = []
        new = set(call.new)
        for k, out in enumerate(outs):
            if out is None or next_fns[k][0] is None:
                names.append(None)
                continue
            acc = None
            if call.kind == "backward":
                acc = next((a for a, g in call.leaf_grads.items() if g is out), None)
            else:
                j = next((j for j, r in enumerate(call.result) if r is out), None)
                t = call.inputs[j] if j is not None else None
                if t is not None and t.grad_fn is None:
                    acc = next((a for a in self.cap.var_of if a.variable is t), None)
            if acc is None:
                return (f"its gradient for input {k} is not one its nested {call.kind}() computed "
                        "(it transforms them in Python)")
            old = self.cap.var_of[acc]
            if acc not in new or old in self.cap.names:
                return f"its gradient for input {k} is the gradient of a leaf that other nodes use too"
            new_name = f"{self.cap.ids[fn]}.input{k}"
            renames.append((old, new_name))
            names.append(new_name)
        inner = {"roots": roots, "inputs": names}
        if call.kind == "grad":
            inner["mode"] = "grad"
        if fn.name() != "CheckpointFunctionBackward":
            inner["checkpoint"] = False
        return inner, renames

    def inner_variables(self) -> set[str]:
        """The variables that are custom nodes' detached inputs (not user leaves)."""
        return set(self._inner_vars)

    def dropped_positions(self) -> set[int]:
        """Positions of the reference order run by the nested calls of nodes left opaque."""
        return {i for c in self.dropped for i in range(*c.window)}

    def finish(self) -> set:
        """Take the nested graphs of nodes left opaque out of the capture; returns the nodes removed.

        A node stays when a kept node still points at it, and a user leaf's
        AccumulateGrad node always stays. Custom nodes that never ran keep the
        opaque reason they got at capture.
        """
        self.stack.clear()
        cap = self.cap
        candidates = {fn for c in self.dropped for fn in c.new}
        if not candidates:
            return set()
        by_id = {d["id"]: fn for fn, d in cap.docs.items()}
        keep = {fn for fn in candidates if fn in cap.var_of and cap.var_of[fn] in cap.names}
        changed = True
        while changed:
            changed = False
            for fn, d in cap.docs.items():
                if fn in candidates and fn not in keep:
                    continue
                targets = [e[0] for e in d.get("next") or () if e is not None]
                targets += [r[0] for r in (d.get("attrs", {}).get("inner") or {}).get("roots", ()) if r]
                for t in targets:
                    tf = by_id.get(t)
                    if tf in candidates and tf not in keep:
                        keep.add(tf)
                        changed = True
        drop = candidates - keep
        for fn in drop:
            doc = cap.docs.pop(fn)
            cap.nodes.remove(doc)
            name = cap.var_of.pop(fn, None)
            if name is not None:
                cap.variables.remove(cap.var_doc.pop(name))
        return drop


def _root_slots(incoming: tuple, grads: list) -> list | None:
    """Which input slot of the custom node each nested root gradient came from, or None if one did not.

    A gradient is the very tensor the node received; an undefined incoming
    gradient reaches the node's backward as zeros (PyTorch materialises it),
    taken in slot order.
    """
    slots: list[int] = []
    used: set[int] = set()
    for g in grads:
        if g is None:
            return None
        slot = next((i for i, inc in enumerate(incoming) if inc is g and i not in used), None)
        if slot is None:
            last = max(slots, default=-1)
            slot = next((i for i, inc in enumerate(incoming) if inc is None and i not in used and i > last), None)
            if slot is None or bool(g.any()):
                return None
        used.add(slot)
        slots.append(slot)
    return slots
