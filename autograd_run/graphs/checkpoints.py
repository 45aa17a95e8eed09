"""Checks of ``checkpoint`` nodes: what ``attrs.inner`` names exists, and no checkpoint recomputes itself.

A checkpoint node's ``attrs.inner`` is ``{"roots": [...], "inputs": [...]}``:
one ``[node id, input_nr]`` or null per input slot of the checkpoint (the
nodes of the recomputed outputs), and one variable name or null per next
edge (the recomputation's detached inputs, accumulated by their own
AccumulateGrad nodes); optionally ``mode`` (``backward`` or ``grad``: the
nested call the node makes) and ``checkpoint`` (false for a custom Function
other than torch.utils.checkpoint's, which does not refuse ``grad()``). The nested backward runs when the checkpoint runs, so
a checkpoint whose recomputed graph reaches itself (directly or through
other checkpoints) would never end: refused here.
"""

from __future__ import annotations

from autograd_run.graphs import tensors
from autograd_run.ops import CHECKPOINT


def checkpoint_nodes(graph) -> list:
    return graph.nodes_of(CHECKPOINT)


def inner_variables(graph, checkpoints: list | None = None) -> set[str]:
    """The variables that only hold a checkpoint's recomputation inputs (not the user's leaves);
    ``checkpoints``: the graph's checkpoint nodes when the caller found them already."""
    out = set()
    for n in checkpoint_nodes(graph) if checkpoints is None else checkpoints:
        inner = n.attrs.get("inner") or {}
        out.update(v for v in inner.get("inputs", ()) if isinstance(v, str))
    return out


def check_checkpoints(graph, err) -> None:
    """Raise ``err(path, what)`` for a malformed ``attrs.inner`` or a checkpoint that recomputes itself."""
    nodes = checkpoint_nodes(graph)
    if not nodes:
        return
    for node in nodes:
        p = ("nodes", node.index, "attrs", "inner")
        inner = node.attrs.get("inner")
        if not isinstance(inner, dict) or set(inner) - {"roots", "inputs", "mode", "checkpoint"} or "roots" not in inner:
            raise err(p, "a checkpoint node needs attrs.inner: {roots: [...], inputs: [...]}")
        if inner.get("mode", "backward") not in ("backward", "grad"):
            raise err(p + ("mode",), "mode must be 'backward' or 'grad'")
        if not isinstance(inner.get("checkpoint", True), bool):
            raise err(p + ("checkpoint",), "checkpoint must be true or false")
        roots, inputs = inner["roots"], inner.get("inputs", [])
        if not isinstance(roots, list) or len(roots) != len(node.inputs):
            raise err(p + ("roots",), f"roots must list one [node, input_nr] or null per input slot "
                                      f"({len(node.inputs)})")
        for k, r in enumerate(roots):
            if r is None:
                continue
            ok = (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], int)
                  and not isinstance(r[1], bool))
            target = graph.by_id.get(r[0]) if ok else None
            if target is None or not 0 <= r[1] < len(target.inputs):
                raise err(p + ("roots", k), f"{r!r} is not an existing [node, input_nr]")
            if target is node:
                raise err(p + ("roots", k), "a checkpoint cannot recompute itself")
            # The nested backward hands slot k's gradient to the recomputed output as it is: PyTorch's
            # backward(outputs, grads) refuses a gradient of another shape ("Mismatch in shape").
            have, want = node.inputs[k].shape, target.inputs[r[1]].shape
            if have != want:
                raise err(p + ("roots", k), f"the checkpoint's input slot {k} has shape {list(have)}, but the "
                                            f"recomputed output it feeds ({tensors.short(r[0])} input {r[1]}) has "
                                            f"shape {list(want)}; a nested backward needs the same shape")
        if not isinstance(inputs, list) or len(inputs) != len(node.next):
            raise err(p + ("inputs",), f"inputs must list one variable name or null per next edge ({len(node.next)})")
        for k, v in enumerate(inputs):
            if v is None:
                continue
            var = graph.variables.get(v) if isinstance(v, str) else None
            if var is None or var.node is None:
                raise err(p + ("inputs", k), f"{v!r} is not a variable with an AccumulateGrad node")
    # Which checkpoints each checkpoint's recomputation reaches; a cycle would recurse forever.
    reach: dict = {}
    for node in nodes:
        seen, stack, found = set(), [graph.by_id[r[0]] for r in node.attrs["inner"]["roots"] if r], []
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n.op.name == "checkpoint":
                found.append(n)
            stack.extend(e.node for e in n.next if e is not None)
        reach[node] = found
    state: dict = {}
    for start in nodes:
        stack = [(start, iter(reach[start]))]
        state[start] = 1
        while stack:
            cur, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[cur] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise err(("nodes", nxt.index, "attrs", "inner"),
                          f"checkpoint {nxt.id!r} recomputes a graph that reaches itself again")
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(reach[nxt])))
