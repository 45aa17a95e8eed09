"""Deterministic graph generators: chain, fan-out/fan-in, MLP, transformer, random DAG.

Each generator builds the backward graph a PyTorch forward program would
leave behind, with sequence numbers in forward-creation order (so a node's
next edges point at lower sequence numbers, as in PyTorch) and saved tensors
as seeded random specs, so a generated graph is small on disk and computes
the same gradients everywhere. The same arguments and seed give the same
file.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from autograd_run.graphs.model import FORMAT

GENERATORS = ("chain", "fanout", "mlp", "transformer", "random")


class PackedNodes:
    """A document's node list already encoded as JSON, in the order the file lists them: ``pieces``, each
    the comma-separated text of some nodes (``dump.dumps`` writes them between the list's brackets).
    What ``Builder(packed=True)`` makes: a big graph's nodes as text take ~140 bytes a node instead of
    the ~900 of their dicts."""

    __slots__ = ("pieces", "count")

    def __init__(self, pieces: list[bytes], count: int):
        self.pieces = pieces
        self.count = count

    def __len__(self) -> int:
        return self.count


class Builder:
    """Collects nodes as a forward program would create them.

    ``packed``: every ``PACK`` nodes are encoded as JSON text at once (``PackedNodes``), so a generated
    ten-million-node graph fits in memory; the document's ``nodes`` is then a ``PackedNodes``, which
    ``dump.dumps`` writes as JSON only.
    """

    PACK = 8192

    def __init__(self, seed: int = 0, packed: bool = False):
        self.nodes: list[dict[str, Any]] = []
        self.variables: list[dict[str, Any]] = []
        self.seq = 0
        self.seed = seed
        self._saved_seed = seed * 1_000_003
        self.packed = packed
        self._pieces: list[bytes] = []
        self._count = 0

    def _add(self, d: dict[str, Any]) -> None:
        self.nodes.append(d)
        if self.packed and len(self.nodes) >= self.PACK:
            self._pack()

    def _pack(self) -> None:
        # the file lists nodes in reverse creation order: each batch reversed here, the batches in graph()
        if self.nodes:
            self._pieces.append(msgspec.json.encode(self.nodes[::-1])[1:-1])
            self._count += len(self.nodes)
            self.nodes.clear()

    def rand(self, shape, dtype: str = "float32") -> dict[str, Any]:
        self._saved_seed += 1
        return {"random": self._saved_seed, "shape": list(shape), **({"dtype": dtype} if dtype != "float32" else {})}

    def meta(self, shape, dtype="float32", device="cpu") -> dict[str, Any]:
        m: dict[str, Any] = {"shape": list(shape)}
        if dtype != "float32":
            m["dtype"] = dtype
        if device != "cpu":
            m["device"] = device
        return m

    def leaf(self, name: str, shape, dtype="float32", device="cpu") -> list:
        self.variables.append({"name": name, "shape": list(shape), **({"dtype": dtype} if dtype != "float32" else {}),
                               **({"device": device} if device != "cpu" else {})})
        nid = f"acc_{name}"
        self._add({"id": nid, "name": "AccumulateGrad", "variable": name,
                   "inputs": [self.meta(shape, dtype, device)]})
        return [nid, 0]

    def op(self, name: str, out_shape, nxt: list, saved: dict | None = None, attrs: dict | None = None,
           op: str | None = None, dtype="float32", device="cpu", inputs: list | None = None) -> list:
        nid = f"{name[:-9] if name.endswith('Backward0') or name.endswith('Backward1') else name}_{self.seq}".lower()
        d: dict[str, Any] = {"id": nid, "name": name, "seq": self.seq, "next": nxt,
                             "inputs": inputs or [self.meta(out_shape, dtype, device)]}
        if op:
            d["op"] = op
        if saved:
            d["saved"] = saved
        if attrs:
            d["attrs"] = attrs
        self.seq += 1
        self._add(d)
        return [nid, 0]

    def graph(self, root: list, root_grad: Any = "ones", **extra) -> dict[str, Any]:
        doc = {"format": FORMAT, "roots": [{"node": root[0], "input_nr": root[1], "grad": root_grad}],
               "variables": self.variables, **extra}
        # Consumers first, as a reader expects a backward graph: reverse creation order.
        if self.packed:
            self._pack()
            doc["nodes"] = PackedNodes(self._pieces[::-1], self._count)
        else:
            doc["nodes"] = list(reversed(self.nodes))
        return doc


def chain(n: int = 100, op: str = "mul", shape=(1,), seed: int = 0, packed: bool = False) -> dict[str, Any]:
    """``y = x; y = y * c`` (or ``y + 1``) n times, then backward from y."""
    b = Builder(seed, packed)
    y = b.leaf("x", shape)
    for _ in range(n):
        if op == "mul":
            y = b.op("MulBackward0", shape, [y, None], saved={"other": 1.0001})
        else:
            y = b.op("AddBackward0", shape, [y, None], saved={"alpha": 1})
    return b.graph(y)


def fanout(width: int = 8, shape=(1,), seed: int = 0, packed: bool = False) -> dict[str, Any]:
    """``x`` feeds ``width`` products ``x * c_i``, summed pairwise left to right, then ``.sum()``."""
    b = Builder(seed, packed)
    x = b.leaf("x", shape)
    branches = [b.op("MulBackward0", shape, [x, None], saved={"other": float(i + 1)}) for i in range(width)]
    acc = branches[0]
    for br in branches[1:]:
        acc = b.op("AddBackward0", shape, [acc, br], saved={"alpha": 1})
    root = b.op("SumBackward0", (), [acc], saved={"self_sym_sizes": list(shape)}, inputs=[b.meta(())])
    return b.graph(root)


def mlp(layers: int = 2, width: int = 16, batch: int = 8, in_features: int | None = None,
        seed: int = 0, packed: bool = False) -> dict[str, Any]:
    """``h = relu(h @ W_i + b_i)`` per layer, ``loss = (h @ W_out).sum()``."""
    b = Builder(seed, packed)
    fin = in_features or width
    h = None  # the input x needs no grad
    h_shape = (batch, fin)
    for i in range(layers):
        w = b.leaf(f"w{i}", (h_shape[1], width))
        bias = b.leaf(f"b{i}", (width,))
        mm = b.op("MmBackward0", (batch, width), [h, w], saved={"self": b.rand(h_shape), "mat2": b.rand((h_shape[1], width))})
        add = b.op("AddBackward0", (batch, width), [mm, bias], saved={"alpha": 1})
        h = b.op("ReluBackward0", (batch, width), [add], saved={"result": b.rand((batch, width))})
        h_shape = (batch, width)
    w = b.leaf("w_out", (width, 1))
    out = b.op("MmBackward0", (batch, 1), [h, w], saved={"self": b.rand(h_shape), "mat2": b.rand((width, 1))})
    root = b.op("SumBackward0", (), [out], saved={"self_sym_sizes": [batch, 1]}, inputs=[b.meta(())])
    return b.graph(root)


def transformer(layers: int = 2, heads: int = 4, seq_len: int = 16, dim: int = 32, devices: int = 0,
                cost: str = "spin", seed: int = 0, packed: bool = False) -> dict[str, Any]:
    """Transformer blocks as cost nodes shaped like PyTorch's (for scheduling studies).

    Each block: layer norm, QKV projection, per-head attention (scores, softmax,
    weighted sum), output projection and residual add, then an MLP with its own
    residual. With ``devices=K`` the layers are spread over ``cuda:0..K-1`` with
    ``ToCopyBackward0`` nodes where activations cross devices.
    """
    b = Builder(seed, packed)
    shape = (seq_len, dim)
    head = (seq_len, dim // heads)

    def dev(layer: int) -> str:
        return "cpu" if devices <= 0 else f"cuda:{layer * devices // layers}"

    def work(name, out_shape, nxt, flops, device, inputs=None):
        return b.op(name, out_shape, nxt, op="cost", device=device, inputs=inputs,
                    attrs={"cost": {"flops": int(flops), "mode": cost}})

    x = b.leaf("x", shape, device=dev(0))
    h = x
    for layer in range(layers):
        d = dev(layer)
        if layer and dev(layer - 1) != d:
            h = b.op("ToCopyBackward0", shape, [h], inputs=[b.meta(shape, device=d)])
        w_qkv = b.leaf(f"l{layer}_w_qkv", (dim, 3 * dim), device=d)
        ln = work("NativeLayerNormBackward0", shape, [h], 8 * seq_len * dim, d)
        qkv = work("AddmmBackward0", (seq_len, 3 * dim), [ln, w_qkv], 2 * seq_len * dim * 3 * dim, d)
        outs = []
        for hd in range(heads):
            q = work("SliceBackward0", head, [qkv], seq_len * dim // heads, d)
            k = work("SliceBackward0", head, [qkv], seq_len * dim // heads, d)
            v = work("SliceBackward0", head, [qkv], seq_len * dim // heads, d)
            s = work("BmmBackward0", (seq_len, seq_len), [q, k], 2 * seq_len * seq_len * dim // heads, d)
            p = work("SoftmaxBackward0", (seq_len, seq_len), [s], 5 * seq_len * seq_len, d)
            outs.append(work("BmmBackward0", head, [p, v], 2 * seq_len * seq_len * dim // heads, d))
        cat = work("CatBackward0", shape, outs, seq_len * dim, d)
        w_o = b.leaf(f"l{layer}_w_o", (dim, dim), device=d)
        proj = work("MmBackward0", shape, [cat, w_o], 2 * seq_len * dim * dim, d)
        res1 = b.op("AddBackward0", shape, [h, proj], saved={"alpha": 1}, device=d)
        w_1 = b.leaf(f"l{layer}_w_1", (dim, 4 * dim), device=d)
        w_2 = b.leaf(f"l{layer}_w_2", (4 * dim, dim), device=d)
        ln2 = work("NativeLayerNormBackward0", shape, [res1], 8 * seq_len * dim, d)
        up = work("MmBackward0", (seq_len, 4 * dim), [ln2, w_1], 8 * seq_len * dim * dim, d)
        act = work("GeluBackward0", (seq_len, 4 * dim), [up], 8 * seq_len * dim, d)
        down = work("MmBackward0", shape, [act, w_2], 8 * seq_len * dim * dim, d)
        h = b.op("AddBackward0", shape, [res1, down], saved={"alpha": 1}, device=d)
    root = b.op("SumBackward0", (), [h], saved={"self_sym_sizes": list(shape)},
                inputs=[b.meta((), device=dev(layers - 1))])
    return b.graph(root)


def random_dag(nodes: int = 200, leaves: int = 40, width: int = 4, seed: int = 0, packed: bool = False) -> dict[str, Any]:
    """A seeded random DAG of elementwise ops over ``leaves`` variables.

    Nodes are created in forward order; each consumes one to three earlier
    values (leaves or nodes), preferring recent ones, as real programs do.
    """
    rng = random.Random(seed)
    b = Builder(seed, packed)
    shape = (width,)
    values = [b.leaf(f"v{i}", shape) for i in range(leaves)]
    unused = list(values)
    for _ in range(nodes):
        fan = rng.choice((1, 2, 2, 2, 3))
        picks = []
        for _ in range(fan):
            if unused and rng.random() < 0.5:
                picks.append(unused.pop(rng.randrange(len(unused))))
            else:
                lo = max(0, len(values) - 32)
                picks.append(values[rng.randrange(lo, len(values))])
        if fan == 1:
            if rng.random() < 0.5:
                y = b.op("ReluBackward0", shape, picks, saved={"result": b.rand(shape)})
            else:
                y = b.op("ExpBackward0", shape, picks, saved={"result": b.rand(shape)})
        elif fan == 2:
            if rng.random() < 0.5:
                y = b.op("MulBackward0", shape, picks, saved={"self": b.rand(shape), "other": b.rand(shape)})
            else:
                y = b.op("AddBackward0", shape, picks, saved={"alpha": 1})
        else:
            y = b.op("Identity", shape, picks, op="identity")
        values.append(y)
        unused.append(y)
    # Fold every value nobody consumed into the root, so the whole DAG is reachable.
    tail = [v for v in unused if v is not values[-1]]
    y = values[-1]
    for v in tail:
        y = b.op("AddBackward0", shape, [y, v], saved={"alpha": 1})
    root = b.op("SumBackward0", (), [y], saved={"self_sym_sizes": list(shape)}, inputs=[b.meta(())])
    return b.graph(root)


def generate(kind: str, **kwargs) -> dict[str, Any]:
    """The document of a generated graph (``packed=True``: its nodes as JSON text, see ``Builder``)."""
    fn = {"chain": chain, "fanout": fanout, "mlp": mlp, "transformer": transformer, "random": random_dag}[kind]
    return fn(**kwargs)
