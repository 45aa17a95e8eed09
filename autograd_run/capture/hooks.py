"""Hooks on a captured graph: found, named and reported, since a graph file cannot hold Python hooks.

A tensor hook (``t.register_hook(fn)``, e.g. gradient clipping; a module's
full backward hooks are tensor hooks too) runs inside PyTorch's backward
and may replace the gradient the tensor receives; the replay knows nothing
of it. Two ways to find them:

* leaves: ``tensor._backward_hooks`` and ``_post_accumulate_grad_hooks`` say
  it directly (``leaf_hooks``); a module's full backward hooks leave
  ``BackwardHookFunctionBackward`` nodes (captured as pass-throughs);
* any other tensor: PyTorch does not expose a node's tensor pre-hooks, so
  the reference backward watches what they do (``HookWatch``): a post-hook
  on every node adds up what it sends along each edge, and a pre-hook on
  the consumer compares the sum with what the node actually receives, which
  is after the tensor hooks ran. A difference names the tensor (output k of
  node N). A hook that leaves every value unchanged is not reported: it
  changes nothing the replay computes.

``describe`` turns the findings into one warning line and the entries of
``meta.hooks`` (``check`` mentions them when gradients differ).
"""

from __future__ import annotations

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
        return [fn.register_prehook(lambda g, fn=fn: self._received(fn, g)),
                fn.register_hook(lambda gi, go, fn=fn: self._sent(fn, gi))]

    def _sent(self, fn, outs) -> None:
        for (nf, nr), g in zip(fn.next_functions, outs):
            if nf is not None:
                self.add(nf, nr, g)

    def _received(self, fn, grads) -> None:
        for slot, got in enumerate(grads):
            want = self.sent.pop((fn, slot), None)
            if want is None or got is None or got is want:
                continue
            try:
                diff = self._difference(got, want)
            except (RuntimeError, TypeError):  # layouts that cannot be compared (sparse): not judged
                continue
            if diff is not None:
                self.changed[(fn, slot)] = diff

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
        return (got.double() - want.double()).abs().max().item()


def describe(cap, watch: HookWatch | None, leaves: dict[str, list[str]]) -> list[dict]:
    """The hooks found, as ``meta.hooks`` entries: ``{"tensor", "node", "slot", "how"}``."""
    out = []
    for name, kinds in leaves.items():
        acc = next(fn for fn, n in cap.var_of.items() if n == name)
        out.append({"tensor": f"leaf {name!r}", "node": cap.ids[acc], "slot": 0,
                    "how": " and ".join(kinds)})
    for fn, doc in cap.docs.items():
        if doc["name"] == MODULE_HOOK_NODE:
            out.append({"tensor": f"the tensors passing node {doc['id']} ({MODULE_HOOK_NODE})", "node": doc["id"],
                        "slot": None, "how": "nn.Module full backward hooks (register_full_backward_hook or "
                                             "register_full_backward_pre_hook)"})
    seen = {e["node"] for e in out}
    if watch is not None:
        for (fn, slot), diff in watch.changed.items():
            nid = cap.ids.get(fn)
            if nid is None or nid in seen or fn not in cap.docs:
                continue
            var = cap.var_of.get(fn)
            tensor = f"leaf {var!r}" if var is not None else f"output {slot} of {fn.name()} (node {nid})"
            out.append({"tensor": tensor, "node": nid, "slot": slot,
                        "how": f"a hook changed its gradient (max abs change {diff:.3g})"})
    return out


def warning_text(found: list[dict]) -> str:
    names = ", ".join(e["tensor"] for e in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return (f"tensor hooks are not part of the graph file and the replay runs without them: {names} "
            f"(listed in meta.hooks)")
