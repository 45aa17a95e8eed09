"""A model under FSDP2 (``fully_shard``), captured: its units, their parameters and where their hooks ran.

``fully_shard(module)`` makes ``module`` one FSDP unit (an ``FSDPParamGroup``
of the parameters it manages; the root's own parameters are the root's unit).
What the backward does per unit (torch 2.13, ``_fsdp_state.py`` and
``_fsdp_param_group.py``):

* **pre-backward**: a tensor hook on the unit's forward outputs. It runs in
  the node that first receives one of their gradients, before that node
  computes: the unit's all-gather (unless its parameters stayed unsharded:
  the root's do, and any unit's with ``reshard_after_forward=False``), a
  wait for it, then the prefetch of the unit before it in forward order
  (or the units ``set_modules_to_backward_prefetch`` named);
* **post-backward**: ``RegisterPostBackwardFunction``'s node on the unit's
  inputs (when an input requires grad; otherwise the root's final callback
  runs it): reshard, wait for the previous unit's reduce-scatter, then the
  reduce-scatter of this unit's gradients (and under HSDP an all-reduce);
* **recompute** (activation checkpointing, ``use_reentrant=False``): the
  first node that unpacks a tensor the checkpointed block saved runs the
  block's forward again, inside the backward; the pre-forward of each unit
  in it all-gathers the unit if it is sharded (in forward order), then its
  ``set_modules_to_forward_prefetch`` targets (``forward_prefetch``), and the
  post-forward does not reshard in a backward (``is_bw()``).

``section`` also writes each group's switches where they are not FSDP's
default (``reduce_grads``, ``all_reduce_grads``, ``reshard_after_backward``,
``unshard_in_backward``: false) and ``forward_calls`` for a unit whose module
ran more than once in the forward (FSDP's ``post_forward_order``, read before
the backward's final callback clears it).

``FsdpWatch`` records, during the reference backward capture runs, the node
each pre- and post-backward ran in (and each recomputed pre-forward) (``torch._C._current_autograd_node()``:
the node the engine is evaluating; none in the final callback) and each
parameter's gradient as the post-backward takes it (FSDP moves it from the
unsharded parameter to the sharded one: the reference gradient is read
there). ``section`` writes the graph file's ``fsdp`` section (see
``docs/parallel.md``); ``graphs.validate`` checks it as untrusted data.

Before the graph is walked ``gather_for_capture`` unshards every unit
(``FSDPModule.unshard()``): a unit resharded after its forward holds its
parameters' storage freed, and the capture reads their values.
"""

from __future__ import annotations


def fsdp_states(module) -> list:
    """The FSDP states under ``module`` (``fully_shard``), the root's first, in ``named_modules`` order."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without distributed
        return []
    out, seen = [], set()
    for _, m in module.named_modules():
        if isinstance(m, FSDPModule):
            st = m._get_fsdp_state()
            if id(st) not in seen:
                seen.add(id(st))
                out.append(st)
    return out


def groups_of(module) -> list:
    """The FSDP parameter groups (units) under ``module``, in post-forward order when a forward has run (the
    order FSDP records and prefetches by), else in ``named_modules`` order."""
    states = fsdp_states(module)
    groups = [g for st in states for g in st._fsdp_param_groups]
    if not groups:
        return []
    order = list(getattr(states[0]._comm_ctx, "post_forward_order", []) or [])
    seen, out = set(), []
    for g in order + groups:  # a unit run twice in the forward is one unit here (first post-forward)
        if id(g) not in seen and any(g is h for h in groups):
            seen.add(id(g))
            out.append(g)
    return out


def parameter_pairs(module) -> list:
    """[(name, tensor)] in registration order, with each FSDP-managed parameter as the unsharded tensor that the
    backward's AccumulateGrad node holds (``named_parameters`` gives the sharded DTensor or, for the root, the
    unsharded one)."""
    fsdp_of = {}
    for g in groups_of(module):
        for fp in g.fsdp_params:
            for t in (getattr(fp, "sharded_param", None), getattr(fp, "_unsharded_param", None)):
                if t is not None:
                    fsdp_of[id(t)] = fp
    out = []
    for name, p in module.named_parameters():
        fp = fsdp_of.get(id(p))
        t = getattr(fp, "_unsharded_param", None) if fp is not None else p
        out.append((name, t if t is not None else p))
    return out


def gather_for_capture(module) -> None:
    """Unshard every unit so that its parameters' values can be read (see the module docstring)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return
    for m in module.modules():
        if isinstance(m, FSDPModule):
            handle = m.unshard()
            if handle is not None:
                handle.wait()


class FsdpWatch:
    """Records each unit's pre- and post-backward during one backward (a context manager; see the module
    docstring), and each pre-forward that runs inside it (activation checkpointing recomputing a block that holds
    the unit). ``events``: [(kind, group, node or None)] in the order they ran (kind ``pre``, ``post`` or
    ``recompute``); ``grads``: {id(unsharded
    parameter): its gradient as the post-backward took it}."""

    def __init__(self, module):
        self.groups = groups_of(module)
        #: {id(group): its post-forwards} before the backward (whose final callback clears FSDP's record): FSDP
        #: records each call of a module run more than once in the forward
        self.calls: dict = {}
        states = fsdp_states(module) if self.groups else []
        for g in (getattr(states[0]._comm_ctx, "post_forward_order", None) or ()) if states else ():
            self.calls[id(g)] = self.calls.get(id(g), 0) + 1
        self.events: list = []
        self.grads: dict = {}
        self._orig = None

    def __enter__(self):
        if not self.groups:
            return self
        import torch
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        pre, post, fwd = FSDPParamGroup.pre_backward, FSDPParamGroup.post_backward, FSDPParamGroup.pre_forward
        self._orig = (FSDPParamGroup, pre, post, fwd)
        watch = self

        def pre_forward(group, *args, **kwargs):
            # a forward inside the backward: activation checkpointing recomputing a block (its unpack of a saved
            # tensor, in the node the engine is evaluating); a unit not unsharded yet is all-gathered there
            if torch._C._current_graph_task_id() != -1:
                watch.events.append(("recompute", group, torch._C._current_autograd_node()))
            return fwd(group, *args, **kwargs)

        def pre_backward(group, *args, **kwargs):
            if group._training_state.name != "PRE_BACKWARD":  # FSDP's own test: a second call is a no-op
                watch.events.append(("pre", group, torch._C._current_autograd_node()))
            return pre(group, *args, **kwargs)

        def post_backward(group, *args, **kwargs):
            watch.events.append(("post", group, torch._C._current_autograd_node()))
            for fp in group.fsdp_params:
                t = getattr(fp, "_unsharded_param", None)
                if t is not None and t.grad is not None:
                    watch.grads[id(t)] = t.grad.detach().clone()
            return post(group, *args, **kwargs)

        FSDPParamGroup.pre_backward, FSDPParamGroup.post_backward = pre_backward, post_backward
        FSDPParamGroup.pre_forward = pre_forward
        # the sharded gradients as they were: the capture's backward leaves the model's gradients unchanged
        self._sharded = [(fp, fp.sharded_param.grad) for g in self.groups for fp in g.fsdp_params]
        return self

    def __exit__(self, *exc):
        if self._orig is not None:
            cls, pre, post, fwd = self._orig
            cls.pre_backward, cls.post_backward, cls.pre_forward = pre, post, fwd
            self._orig = None
            for fp, grad in self._sharded:
                fp.sharded_param.grad = grad
        return False


def _dtype(t) -> str | None:
    return None if t is None else str(t).replace("torch.", "")


def section(module, watch: FsdpWatch, node_ids: dict, names_by_id: dict) -> dict | None:
    """The graph file's ``fsdp`` section: the units in forward (post-forward) order with their parameters
    (variable names), whether each reshards after forward, its pre- and post-backward node (None: the final
    callback; a unit whose pre-backward never ran: None too), its explicit backward prefetch targets."""
    groups = watch.groups
    if not groups:
        return None
    states = fsdp_states(module)
    name_of = {id(g): g._module_fqn or "" for g in groups}
    pre, post = {}, {}
    recompute = []
    for kind, g, node in watch.events:
        if kind == "recompute":
            nid = node_ids.get(node) if node is not None else None
            if nid is not None and id(g) in name_of:
                recompute.append([nid, name_of[id(g)]])
            continue
        table = pre if kind == "pre" else post
        if id(g) not in table:
            table[id(g)] = None if node is None else node_ids.get(node)
    prefetch_by_group = {}
    forward_by_group = {}
    for st in states:
        # set_modules_to_forward_prefetch: run by the state's pre-forward after its groups' (so after the last
        # group's), in forward order; in a backward only by a recompute's pre-forward
        ahead = [name_of[id(t)] for s in getattr(st, "_states_to_forward_prefetch", ()) for t in s._fsdp_param_groups
                 if id(t) in name_of]
        if ahead and st._fsdp_param_groups:
            forward_by_group[id(st._fsdp_param_groups[-1])] = ahead
        targets = [name_of[id(t)] for s in st._states_to_backward_prefetch for t in reversed(s._fsdp_param_groups)
                   if id(t) in name_of]
        if st._states_to_backward_prefetch:
            for g in st._fsdp_param_groups:
                prefetch_by_group[id(g)] = targets
    calls = watch.calls
    units = []
    for g in groups:
        params = []
        for fp in g.fsdp_params:
            t = getattr(fp, "_unsharded_param", None)
            name = names_by_id.get(id(t)) if t is not None else None
            if name is not None:
                params.append(name)
        mp = getattr(g, "mp_policy", None)
        unit = {"name": name_of[id(g)], "parameters": params,
                "reshard_after_forward": bool(getattr(g, "post_forward_mesh_info", None) is not None),
                "pre_backward": pre.get(id(g)), "post_backward": post.get(id(g))}
        if id(g) in prefetch_by_group:
            unit["backward_prefetch"] = prefetch_by_group[id(g)]
        if id(g) in forward_by_group:
            unit["forward_prefetch"] = forward_by_group[id(g)]
        # the group's backward switches, written only where they differ from FSDP's defaults (all true):
        # set_requires_gradient_sync (reduce_grads; all_reduce_grads, set_requires_all_reduce too),
        # set_reshard_after_backward, set_unshard_in_backward
        for key in ("reduce_grads", "all_reduce_grads", "reshard_after_backward", "unshard_in_backward"):
            if getattr(g, key, True) is False:
                unit[key] = False
        if calls.get(id(g), 0) > 1:  # its module ran more than once in the forward (the simulation refuses it)
            unit["forward_calls"] = calls[id(g)]
        for key in ("param_dtype", "reduce_dtype"):
            value = _dtype(getattr(mp, key, None))
            if value is not None:
                unit[key] = value
        units.append(unit)
    out = {"units": units}
    if states and states[0]._fsdp_param_groups:
        out["root"] = name_of[id(states[0]._fsdp_param_groups[0])]
    # the root's final callback runs the post-backwards it did not see in this order: its states in
    # named_modules order (the root's first), each one's groups reversed (``_root_post_backward_final_callback``)
    final = [name_of[id(g)] for st in states for g in reversed(st._fsdp_param_groups) if id(g) in name_of]
    if len(final) == len(units):
        out["final_order"] = final
    if recompute:
        out["recompute"] = recompute
    try:
        import torch.distributed as dist
        out["world_size"] = int(dist.get_world_size())
    except (RuntimeError, ValueError):
        pass
    return out
