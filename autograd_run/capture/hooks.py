"""Hooks on a captured graph: found, named and reported; a leaf's ``register_hook`` transforms held as data.

A tensor hook (``t.register_hook(fn)``, e.g. gradient clipping; a module's
full backward hooks are tensor hooks too) runs inside PyTorch's backward
and may replace the gradient the tensor receives; the replay knows nothing
of it. Two ways to find them:

* leaves: ``tensor._backward_hooks`` and ``_post_accumulate_grad_hooks`` say
  it directly (``leaf_hooks``); a module's full backward hooks leave
  ``BackwardHookFunctionBackward`` nodes (captured as pass-throughs). Their
  hooks (``register_full_backward_hook``'s on the module's inputs,
  ``register_full_backward_pre_hook``'s on its outputs) are post-hooks of
  those nodes that replace what the node sends: the reference backward
  compares what such a node received with what it sent, slot by slot (the
  node passes gradient k on as gradient k), so a change is seen there;
* any other tensor: PyTorch does not expose a node's tensor pre-hooks, so
  the reference backward watches what they do (``HookWatch``): a post-hook
  on every node adds up what it sends along each edge, and a pre-hook on
  the consumer compares the sum with what the node actually receives, which
  is after the tensor hooks ran. A difference names the tensor (output k of
  node N). A hook that leaves every value unchanged is not reported: it
  changes nothing the replay computes.

``describe`` turns the findings into one warning line and the entries of
``meta.hooks`` (``check`` mentions them when gradients differ). A leaf's own
hook functions can also be held (``hold_leaf_hooks``, below): probed, and
written into the variable as ``engine.tensor_hooks`` data when a kind fits.
"""

from __future__ import annotations

import math

#: The pass-through node that nn.Module full backward hooks put around a module's inputs and outputs.
MODULE_HOOK_NODE = "BackwardHookFunctionBackward"


def leaf_hooks(cap) -> dict[str, list[str]]:
    """Variable name -> the kinds of hooks its leaf tensor carries."""
    out: dict[str, list[str]] = {}
    for fn, name in cap.var_of.items():
        var = fn.variable
        kinds = []
        if getattr(var, "_backward_hooks", None):
            kinds.append("register_hook")
        if getattr(var, "_post_accumulate_grad_hooks", None):
            kinds.append("register_post_accumulate_grad_hook")
        if kinds:
            out[name] = kinds
    return out


class HookWatch:
    """Compares what each node receives with what its producers sent (see the module docstring)."""

    def __init__(self, torch, cap):
        self.torch = torch
        self.cap = cap
        self.sent: dict = {}
        self.changed: dict = {}   # (fn, slot) -> max abs difference
        self.pairs: dict = {}     # (fn, slot) -> (what was sent, what the node received), for fitting
        #: A module hook node's changes: (fn, slot) -> (what it received, what it sent after the module's hooks)
        self.module_pairs: dict = {}
        self.module_ran: set = set()   # the module hook nodes that ran
        self._got: dict = {}           # module hook node -> what it received, until it sends
        self._raw: dict = {}           # node with post-hooks of the program's -> what it computed, until it sends
        #: What those post-hooks (``grad_fn.register_hook``) changed: (fn, output slot) -> max abs change
        self.post_changed: dict = {}

    def add(self, fn, slot: int, grad) -> None:
        if grad is None:
            return
        key = (fn, slot)
        old = self.sent.get(key)
        self.sent[key] = grad if old is None else old + grad

    def roots(self, edges, grads) -> None:
        """A backward call's root gradients (they reach the root nodes as if sent by a GraphRoot)."""
        for e, g in zip(edges, grads):
            if e is not None:
                node = e.node if hasattr(e, "node") else e[0]
                nr = e.output_nr if hasattr(e, "output_nr") else e[1]
                self.add(node, nr, g)

    def handles(self, fn) -> list:
        out = [fn.register_prehook(lambda g, fn=fn: self._received(fn, g)),
               fn.register_hook(lambda gi, go, fn=fn: self._sent(fn, gi))]
        if fn.name() != MODULE_HOOK_NODE:  # (a module's hooks are seen at their pass-through node)
            ref = getattr(out[1], "hooks_dict_ref", None)
            posts = ref() if callable(ref) else None
            if posts and any(not str(getattr(h, "__module__", "")).startswith("autograd_run")
                             for k, h in posts.items() if k != out[1].id):
                # the node has post-hooks of the program's own (grad_fn.register_hook): one more post-hook,
                # moved first, sees what the node computed before they ran
                first = fn.register_hook(lambda gi, go, fn=fn: self._raw.__setitem__(fn, tuple(gi)))
                mine = posts.pop(first.id)
                rest = list(posts.items())  # PyTorch calls them in the plain dict's order: insert them again
                posts.clear()
                posts[first.id] = mine
                posts.update(rest)
                out.append(first)
        return out

    def _sent(self, fn, outs) -> None:
        got = self._got.pop(fn, None)
        if got is not None:
            self._module_hooks(fn, got, outs)
        raw = self._raw.pop(fn, None)
        if raw is not None:  # what the node's own post-hooks did to what it sends
            for slot, (g, o) in enumerate(zip(raw, outs)):
                if g is None and o is None or g is o:
                    continue
                try:
                    diff = float("nan") if g is None or o is None else self._difference(o, g)
                except (RuntimeError, TypeError):
                    continue
                if diff is not None:
                    self.post_changed[(fn, slot)] = diff
        for (nf, nr), g in zip(fn.next_functions, outs):
            if nf is not None:
                self.add(nf, nr, g)

    def _module_hooks(self, fn, got, outs) -> None:
        """What a module's full backward hooks did at their pass-through node ``fn``: slot k received
        ``got[k]`` and sends ``outs[k]``."""
        self.module_ran.add(fn)
        for slot, (g, o) in enumerate(zip(got, outs)):
            if g is None or o is None or g is o:
                continue
            try:
                diff = self._difference(o, g)
            except (RuntimeError, TypeError):
                continue
            if diff is not None:
                self.changed[(fn, slot)] = diff
                self.module_pairs[(fn, slot)] = (g.detach(), o.detach())

    def captured(self, fn, slot: int, got) -> None:
        """What ``grad()`` returned for a requested non-leaf input (output ``slot`` of ``fn``) whose node did
        not run: PyTorch ran the tensor's hooks on it before capturing it, and no node pre-hook saw that."""
        self._compare(fn, [(slot, got)])

    def _received(self, fn, grads) -> None:
        if fn.name() == MODULE_HOOK_NODE:
            self._got[fn] = tuple(grads)
        self._compare(fn, enumerate(grads))

    def _compare(self, fn, slots) -> None:
        for slot, got in slots:
            want = self.sent.pop((fn, slot), None)
            if want is None or got is None or got is want:
                continue
            try:
                diff = self._difference(got, want)
            except (RuntimeError, TypeError):  # layouts that cannot be compared (sparse): not judged
                continue
            if diff is not None:
                self.changed[(fn, slot)] = diff
                self.pairs[(fn, slot)] = (want.detach(), got.detach())

    def _difference(self, got, want):
        """None when ``got`` is what was sent (NaNs in the same places count as equal), else the max change."""
        torch = self.torch
        if got.layout != torch.strided or want.layout != torch.strided:
            got, want = got.to_dense(), want.to_dense()
        if got.shape != want.shape:
            return float("nan")
        want = want.to(got.dtype)
        if torch.equal(got, want):
            return None
        if torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.nan_to_num(got),
                                                                           torch.nan_to_num(want)):
            return None
        wide = torch.complex128 if got.is_complex() else torch.float64  # (abs: a complex difference's modulus)
        return float((got.to(wide) - want.to(wide)).abs().max())


def describe(cap, watch: HookWatch | None, leaves: dict[str, list[str]],
             held: dict[str, list[str]] | None = None, held_nodes: dict[str, str] | None = None) -> list[dict]:
    """The hooks found, as ``meta.hooks`` entries: ``{"tensor", "node", "slot", "how"}``, and ``"held"`` (what the
    file holds them as) for the leaves whose ``register_hook`` functions are held as data (``hold_leaf_hooks``)."""
    out = []
    held = held or {}
    for name, kinds in leaves.items():
        acc = next(fn for fn, n in cap.var_of.items() if n == name)
        entry = {"tensor": f"leaf {name!r}", "node": cap.ids[acc], "slot": 0, "how": " and ".join(kinds)}
        if name in held:
            entry["held"] = ", ".join(held[name])
        out.append(entry)
    for fn, doc in cap.docs.items():
        if doc["name"] == MODULE_HOOK_NODE:
            entry = {"tensor": f"the tensors passing node {doc['id']} ({MODULE_HOOK_NODE})", "node": doc["id"],
                     "slot": None, "how": MODULE_HOW}
            if watch is not None and fn in watch.module_ran:
                changed = sorted(k for (f, k) in watch.changed if f is fn)
                if not changed:
                    entry["unchanged"] = True   # they ran and changed no gradient: the replay needs nothing
                elif held_nodes and doc["id"] in held_nodes and \
                        set(changed) <= set(held_slots(doc)):
                    entry["held"] = held_nodes[doc["id"]]
            out.append(entry)
    seen = {e["node"] for e in out}
    if watch is not None:
        for (fn, slot), diff in watch.changed.items():
            nid = cap.ids.get(fn)
            if nid is None or nid in seen or fn not in cap.docs:
                continue
            var = cap.var_of.get(fn)
            tensor = f"leaf {var!r}" if var is not None else f"output {slot} of {fn.name()} (node {nid})"
            entry = {"tensor": tensor, "node": nid, "slot": slot,
                     "how": f"a hook changed its gradient (max abs change {diff:.3g})"}
            if held_nodes and nid in held_nodes:
                entry["held"] = held_nodes[nid]
            out.append(entry)
        for (fn, slot), diff in watch.post_changed.items():
            nid = cap.ids.get(fn)
            if nid is None:
                continue
            out.append({"tensor": f"gradient {slot} that node {nid} ({fn.name()}) sends", "node": nid, "slot": slot,
                        "how": f"a node post-hook (grad_fn.register_hook) changed it (max abs change {diff:.3g})"})
    return out


def _names(found: list[dict]) -> str:
    return ", ".join(e["tensor"] for e in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")


#: ``how`` of a module's full backward hooks in ``meta.hooks``.
MODULE_HOW = "nn.Module full backward hooks (register_full_backward_hook or register_full_backward_pre_hook)"


def held_slots(doc: dict) -> list[int]:
    """The slots of a node document's held hooks (``attrs.hooks``)."""
    return [h.get("slot") for h in (doc.get("attrs") or {}).get("hooks", []) if isinstance(h, dict)]


def replayed(entry) -> bool:
    """Whether a ``meta.hooks`` entry's effect is in the graph file: its hooks held as data, or module hooks
    that changed no gradient. (Read from files: anything else, or a malformed entry, is not.)"""
    if not isinstance(entry, dict):
        return False
    how = str(entry.get("how", ""))
    if how == MODULE_HOW and entry.get("unchanged") is True:
        return True
    return bool(entry.get("held")) and (how == "register_hook" or how.startswith("a hook") or how == MODULE_HOW)


def warning_text(found: list[dict]) -> str:
    """The capture's message about hooks: which are held as data, which changed nothing, which the replay runs
    without."""
    held = [e for e in found if replayed(e) and not e.get("unchanged")]
    idle = [e for e in found if replayed(e) and e.get("unchanged")]
    lost = [e for e in found if not replayed(e)]
    parts = []
    if held:
        parts.append("tensor hooks held as data in the graph file (the replay runs them): " + "; ".join(
            f"{e['tensor']}: {e['held']}" for e in held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else ""))
    if idle:
        parts.append(f"module backward hooks that changed no gradient in the captured backward (the replay needs "
                     f"none of them): {_names(idle)}")
    if lost:
        parts.append(f"tensor hooks are not part of the graph file and the replay runs without them: "
                     f"{_names(lost)} (listed in meta.hooks)")
    return "; ".join(parts)


# -- hooks held as data ----------------------------------------------------------------------------------------
#
# A leaf's ``register_hook`` functions are at hand (``tensor._backward_hooks``): capture calls each one with a few
# probe gradients (random, of the leaf's shape and dtype, at scales 1e-3 to 1e6; a hook that keeps state sees
# those calls too) and holds it as data when one of ``engine.tensor_hooks``' kinds reproduces every probe to 1e-12
# of its largest entry: scale, clamp, clip_norm (2-norm or max-norm, eps 1e-6 or 0). Otherwise a hook function
# importable by name is held as a ``python`` hook; any other (a lambda the data kinds do not fit) is reported as
# today. The replay runs the held hooks as PyTorch does: tensor pre-hooks of the leaf's AccumulateGrad, in order.

#: Scales of the probe gradients.
PROBE_SCALES = (1e-3, 1.0, 30.0, 1e6)
#: How close a data hook must reproduce each probe, relative to the probe result's largest entry.
FIT_TOL = 1e-12


def _close(torch, got, want) -> bool:
    if got.shape != want.shape:
        return False
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-300)
    return float((got - want).abs().max()) <= FIT_TOL * scale if got.numel() else True


def _probe(torch, hook, var):
    """``[(probe, result)]`` for each probe scale, or None when the hook refuses a probe or returns a non-tensor."""
    g = torch.Generator().manual_seed(4242)
    pairs = []
    for s in PROBE_SCALES:
        p = (torch.randn(var.shape, generator=g, dtype=torch.float64) * s).to(var.dtype)
        arg = p.clone()
        try:
            with torch.no_grad():
                r = hook(arg)
        except Exception:  # noqa: BLE001 - any failure means: not a data hook
            return None
        r = arg if r is None else r  # changed in place, or left alone
        if not isinstance(r, torch.Tensor) or r.shape != p.shape:
            return None
        pairs.append((p.double(), r.detach().double()))
    return pairs


def _fit_scale(torch, pairs):
    p, r = pairs[-1]
    nz = p != 0
    if not bool(nz.any()):
        return None
    c = float((r[nz] / p[nz]).median())
    if not math.isfinite(c):
        return None
    spec = {"kind": "scale", "by": c}
    return spec if all(_close(torch, r, p * c) for p, r in pairs) else None


def _fit_clamp(torch, pairs):
    lo = hi = None
    for p, r in pairs:
        up, down = r > p, r < p
        if bool(up.any()):
            v = float(r[up].max())
            lo = v if lo is None else max(lo, v)
        if bool(down.any()):
            v = float(r[down].min())
            hi = v if hi is None else min(hi, v)
    if lo is None and hi is None:
        return None
    spec = {"kind": "clamp"}
    if lo is not None:
        spec["min"] = lo
    if hi is not None:
        spec["max"] = hi
    return spec if all(_close(torch, r, p.clamp(lo, hi)) for p, r in pairs) else None


def _fit_clip_norm(torch, pairs):
    for norm_type in (2.0, math.inf):
        for eps in (1e-6, 0.0):
            m = None
            for p, r in pairs:
                n = float(torch.linalg.vector_norm(p, norm_type))
                nz = p != 0
                if not bool(nz.any()):
                    continue
                c = float((r[nz] / p[nz]).median())
                if c < 1.0 - 1e-12:
                    m = c * (n + eps)
                    break
            if m is None:
                continue
            spec = {"kind": "clip_norm", "max_norm": m, "norm_type": "inf" if math.isinf(norm_type) else norm_type,
                    "eps": eps}
            if all(_close(torch, r, p * min(1.0, m / (float(torch.linalg.vector_norm(p, norm_type)) + eps)))
                   for p, r in pairs):
                return spec
    return None


def identify(torch, hook, var) -> dict | None:
    """``hook`` (a leaf's ``register_hook`` function) as one ``engine.tensor_hooks`` mapping, or None.

    {"kind": "identity"} for a hook that changes no probe (nothing to hold)."""
    from autograd_run.capture.inner import _importable
    if var.numel() == 0 or not (var.is_floating_point()) or var.dtype in (torch.float16, torch.bfloat16):
        target = _importable(hook)
        return {"kind": "python", "callable": target} if target else None
    pairs = _probe(torch, hook, var)
    if pairs is not None:
        if all(_close(torch, r, p) for p, r in pairs):
            return {"kind": "identity"}
        for fit in (_fit_scale, _fit_clamp, _fit_clip_norm):
            spec = fit(torch, pairs)
            if spec is not None:
                return spec
    target = _importable(hook)
    return {"kind": "python", "callable": target} if target else None


def hold_leaf_hooks(torch, cap) -> dict[str, list[str]]:
    """Write each leaf's ``register_hook`` functions into its variable as data where every one of them can be
    (``variables[i].hooks``); returns variable name -> the held hooks described (for the capture's message)."""
    from autograd_run.engine.tensor_hooks import describe as say
    held: dict[str, list[str]] = {}
    for fn, name in cap.var_of.items():
        var = fn.variable
        hooks = list((getattr(var, "_backward_hooks", None) or {}).values())
        if not hooks:
            continue
        specs = [identify(torch, h, var) for h in hooks]
        if any(s is None for s in specs):
            continue
        specs = [s for s in specs if s["kind"] != "identity"]
        if specs:
            cap.var_doc[name]["hooks"] = specs
        held[name] = [say(s) for s in specs] or ["a hook that changes nothing"]
    return held


def hold_node_hooks(torch, cap, watch) -> dict:
    """Hold the hooks seen changing a non-leaf tensor's gradient (``HookWatch``) as data on the node that
    receives it (``attrs.hooks`` with the slot), when one observation fits a kind: ``scale`` (received = c *
    sent) or ``clamp`` (the bounds are the values clipped entries took). PyTorch does not expose these hook
    functions, so what is held is what the hooks did to the captured gradient (``observed``): the replay of the
    captured values is exact; a norm clip, for one, is held as the scale it applied. Returns node id -> the held
    hook described."""
    from autograd_run.engine.tensor_hooks import describe as say
    held: dict = {}
    if watch is None:
        return held
    # a tensor's hooks first, then the module hooks' change at the same pass-through node (they run in that order)
    observed = list(watch.pairs.items()) + list(watch.module_pairs.items())
    for (fn, slot), (sent, got) in observed:
        doc = cap.docs.get(fn)
        if doc is None or fn in cap.var_of:  # a leaf's hooks are held from the functions themselves
            continue
        if sent.is_complex() or got.is_complex():  # no data kind is fitted to complex gradients
            continue
        try:
            pairs = [(sent.double(), got.to(sent.dtype).double())]
        except (RuntimeError, TypeError):
            continue
        if sent.is_complex() or got.shape != sent.shape:
            continue
        spec = _fit_scale(torch, pairs) or _fit_clamp(torch, pairs)
        if spec is None:
            continue
        spec = {"slot": int(slot), **spec, "observed": True}
        doc.setdefault("attrs", {}).setdefault("hooks", []).append(spec)
        text = say(spec) + f" (observed{', slot ' + str(slot) if fn.name() == MODULE_HOOK_NODE else ''})"
        held[doc["id"]] = held[doc["id"]] + "; " + text if doc["id"] in held else text
    return held
