"""Models for the multi-device oracle, written with plain torch on the ``accel`` devices.

Each scenario's ``build()`` runs a fresh forward (fixed seed) and returns a
:class:`tests.support.pt_oracle.Run`. The graphs are chosen so that the
order each worker thread executes is fixed by the graph alone: whenever a
node on one worker gets its last input from another worker, either the
receiving worker has nothing else it could run first, or everything it
could run first has a higher priority anyway. (A node whose readiness
races with other ready work on the same queue would make the per-worker
order depend on timing; see the README.)

Import only after :func:`tests.support.pt_oracle.load_backend`.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.support.pt_oracle import Run, on_stream

A0, A1, CPU = "accel:0", "accel:1", "cpu"


@dataclass
class Scenario:
    """``build(d0, d1)`` runs the forward with the model on devices d0/d1 (``accel:0``/``accel:1``
    for the oracle, ``cpu``/``cpu`` for a reference of the gradients). ``events_race``: a node
    gets gradients from two workers at once, so which one arrives first (and therefore which
    event calls each worker makes in InputBuffer::add) depends on timing; the per-worker node
    order does not. ``order_race``: the per-worker node order itself depends on timing (kept
    as a known example; each worker still runs the same set of nodes). ``delay``: graph node id
    (``n<i>``, as ``from_torch`` numbers the graph) -> seconds its worker sleeps just before running
    it (a node pre-hook in PyTorch, ``node_start`` in our replay), to force one interleaving of a
    race on both engines. ``repeats``: runs of this scenario when fewer than asked for (a forced
    interleaving costs its delay every run)."""
    build: Callable[..., Run]
    description: str
    events_race: bool = False
    order_race: bool = False
    delay: dict[str, float] = field(default_factory=dict)
    repeats: int | None = None

    def oracle(self) -> Run:
        return self.build(A0, A1)

    def reference(self) -> Run:
        return self.build(CPU, CPU)


SCENARIOS: dict[str, Scenario] = {}


def scenario(description: str, events_race: bool = False, order_race: bool = False,
             delay: dict[str, float] | None = None, repeats: int | None = None):
    def register(fn):
        SCENARIOS[fn.__name__] = Scenario(fn, description, events_race, order_race, dict(delay or {}), repeats)
        return fn
    return register


def _params(**modules) -> dict:
    return {f"{m}.{p}": t for m, mod in modules.items() for p, t in mod.named_parameters()}


def _leaf(shape, device, seed_gen, name, leaves):
    t = torch.randn(shape, generator=seed_gen).to(device).requires_grad_()
    leaves[name] = t
    return t


@scenario("MLP split over accel:0 and accel:1 with .to(); loss on accel:1")
def mlp_2dev(d0: str, d1: str) -> Run:
    torch.manual_seed(0)
    l1, l2, l3 = nn.Linear(6, 8).to(d0), nn.Linear(8, 8).to(d1), nn.Linear(8, 3).to(d1)
    x = torch.randn(4, 6).to(d0)
    h = torch.relu(l1(x)).to(d1)
    y = l3(torch.tanh(l2(h)))
    loss = y.pow(2).mean()
    return Run([loss], leaves=_params(l1=l1, l2=l2, l3=l3))


@scenario("a CPU input branches to accel:0 and accel:1; the branches join on accel:0")
def join_2dev(d0: str, d1: str) -> Run:
    g = torch.Generator().manual_seed(1)
    leaves: dict = {}
    x = _leaf((4, 5), CPU, g, "x", leaves)
    w0 = _leaf((5, 6), d0, g, "w0", leaves)
    w1 = _leaf((5, 6), d1, g, "w1", leaves)
    a = torch.tanh(x.to(d0) @ w0)
    b = torch.sigmoid(x.to(d1) @ w1)
    j = a + b.to(d0)
    loss = (j * j).sum()
    return Run([loss], leaves=leaves)


@scenario("join_2dev with x on accel:0: x's AccumulateGrad (top priority) becomes ready when "
          "accel:1's gradient arrives, before or after accel:0 runs other ready nodes",
          events_race=True, order_race=True)
def join_race(d0: str, d1: str) -> Run:
    g = torch.Generator().manual_seed(1)
    leaves: dict = {}
    x = _leaf((4, 5), d0, g, "x", leaves)
    w0 = _leaf((5, 6), d0, g, "w0", leaves)
    w1 = _leaf((5, 6), d1, g, "w1", leaves)
    a = torch.tanh(x @ w0)
    b = torch.sigmoid(x.to(d1) @ w1)
    loss = ((a + b.to(d0)) ** 2).sum()
    return Run([loss], leaves=leaves)


@scenario("encoder on accel:1 then accel:0, head and loss on the CPU (caller thread)")
def cpu_head(d0: str, d1: str) -> Run:
    torch.manual_seed(2)
    e1, e2, head = nn.Linear(5, 8).to(d1), nn.Linear(8, 8).to(d0), nn.Linear(8, 2)
    x = torch.randn(3, 5).to(d1)
    h = torch.relu(e1(x)).to(d0)
    h = torch.tanh(e2(h)).to(CPU)
    loss = head(h).square().mean()
    return Run([loss], leaves=_params(e1=e1, e2=e2, head=head))


@scenario("shared encoder on accel:0, one loss on each device; backward([l0, l1]) from the caller",
          events_race=True)
def two_roots(d0: str, d1: str) -> Run:
    torch.manual_seed(3)
    enc, h0, h1 = nn.Linear(5, 6).to(d0), nn.Linear(6, 2).to(d0), nn.Linear(6, 3).to(d1)
    x = torch.randn(4, 5).to(d0)
    h = torch.tanh(enc(x))
    l0 = h0(h).sum()
    l1 = h1(h.to(d1)).square().sum()
    return Run([l0, l1], leaves=_params(enc=enc, h0=h0, h1=h1))


#: two_roots' race, forced each way: TanhBackward0 (n3, accel:0) gets one gradient from the accel:0 head's
#: AddmmBackward0 (n1, pt_autograd_0) and one from ToCopyBackward0 (n14, pt_autograd_1). The first to arrive
#: is stored (its wait left to the consumer's worker), the second is summed on the consumer's stream by the
#: producer's worker, so each worker's event calls depend on which arrives first. Holding one producer back
#: this long (the other branch is a few small nodes) decides it.
LATE_S = 0.25
FORCED_REPEATS = 4


@scenario("two_roots with the accel:0 head held back (n1 late): ToCopyBackward0's gradient reaches "
          "TanhBackward0 first", delay={"n1": LATE_S}, repeats=FORCED_REPEATS)
def two_roots_copy_first(d0: str, d1: str) -> Run:
    return two_roots(d0, d1)


@scenario("two_roots with ToCopyBackward0 held back (n14 late): the accel:0 head's gradient reaches "
          "TanhBackward0 first", delay={"n14": LATE_S}, repeats=FORCED_REPEATS)
def two_roots_head_first(d0: str, d1: str) -> Run:
    return two_roots(d0, d1)


@scenario("8 branches on accel:0 from one accel:1 leaf: 8 cross-device grads into one AccumulateGrad")
def fan_in(d0: str, d1: str) -> Run:
    g = torch.Generator().manual_seed(4)
    leaves: dict = {}
    x = _leaf((3, 4), d1, g, "x", leaves)
    ws = [_leaf((3, 4), d0, g, f"w{k}", leaves) for k in range(8)]
    ys = [torch.tanh(x.to(d0) * w) for w in ws]
    z = torch.stack(ys).sum()
    s = _leaf((), d1, g, "s", leaves)
    loss = z.to(d1) * s
    return Run([loss], leaves=leaves)


def _twin(d: str) -> str:
    """The same index on the backend's second device type (VE, not an accelerator)."""
    return d if d == CPU else d.replace("accel", "ve")


@scenario("accel:0 -> ve:1 -> accel:1: index 1 of both device types runs on pt_autograd_1")
def colocated(d0: str, d1: str) -> Run:
    torch.manual_seed(8)
    v1 = _twin(d1)
    l1, l2, l3 = nn.Linear(5, 6).to(d0), nn.Linear(6, 6).to(v1), nn.Linear(6, 2).to(d1)
    x = torch.randn(3, 5).to(d0)
    h = torch.relu(l1(x)).to(v1)
    h = torch.tanh(l2(h)).to(d1)
    loss = l3(h).sum()
    return Run([loss], leaves=_params(l1=l1, l2=l2, l3=l3))


@scenario("reentrant checkpoint (use_reentrant=True) of a block on accel:0, head on accel:1")
def checkpoint_dev(d0: str, d1: str) -> Run:
    torch.manual_seed(5)
    l1 = nn.Linear(5, 6).to(d0)
    block = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)).to(d0)
    head = nn.Linear(6, 2).to(d1)
    x = torch.randn(3, 5).to(d0)
    h = torch.relu(l1(x))
    h = checkpoint(block, h, use_reentrant=True)
    loss = head(h.to(d1)).sum()
    return Run([loss], leaves=_params(l1=l1, block=block, head=head))


@scenario("reentrant checkpoint of a block that spans accel:0 and accel:1 (its .to() inside), head on accel:1")
def checkpoint_span(d0: str, d1: str) -> Run:
    torch.manual_seed(8)
    l1 = nn.Linear(5, 6).to(d0)
    a, b = nn.Linear(6, 6).to(d0), nn.Linear(6, 6).to(d1)
    head = nn.Linear(6, 2).to(d1)
    x = torch.randn(3, 5).to(d0)

    def block(t):
        return b(torch.tanh(a(t)).to(d1))
    h = torch.relu(l1(x))
    h = checkpoint(block, h, use_reentrant=True)
    loss = head(torch.tanh(h)).sum()
    return Run([loss], leaves=_params(l1=l1, a=a, b=b, head=head))


@scenario("reentrant checkpoint on accel:0 whose block runs on accel:1 (inputs moved in, output moved back), "
          "beside a branch on accel:1 the outer graph still has to run", order_race=True)
def checkpoint_span_back(d0: str, d1: str) -> Run:
    torch.manual_seed(9)
    l1 = nn.Linear(5, 6).to(d0)
    a, b = nn.Linear(6, 6).to(d1), nn.Linear(6, 6).to(d1)
    side = nn.Linear(6, 6).to(d1)
    x = torch.randn(3, 5).to(d0)

    def block(t):
        return b(torch.tanh(a(t.to(d1)))).to(d0)
    h = torch.relu(l1(x))
    c = checkpoint(block, h, use_reentrant=True)
    s = torch.tanh(side(h.to(d1))).to(d0)
    loss = (c * s).sum()
    return Run([loss], leaves=_params(l1=l1, a=a, b=b, side=side))


#: checkpoint_span_back's race, forced: the nested backward's first accel:1 node reaches thread 1 while it
#: runs the outer branch (n9 TanhBackward0, n10 AddmmBackward0, then n11, n13, n14, n12). Holding the
#: checkpoint node (n2) back lets thread 1 finish the outer branch first; holding n2 back a little, so that
#: thread 1 is surely in n11 when the nested nodes reach its queue, and n11 longer, makes their depth win as
#: soon as n11 is done.
@scenario("checkpoint_span_back with the checkpoint node held back (n2 late): thread 1 runs the outer "
          "branch, then the nested block", delay={"n2": LATE_S}, repeats=FORCED_REPEATS)
def checkpoint_span_back_outer_first(d0: str, d1: str) -> Run:
    return checkpoint_span_back(d0, d1)


@scenario("checkpoint_span_back with the outer side.bias AccumulateGrad held back (n11 late): the nested "
          "block runs on thread 1 right after it (then n2's gradient and n12's race to ReluBackward0: events_race)",
          events_race=True, delay={"n2": 0.1, "n11": 0.4}, repeats=FORCED_REPEATS)
def checkpoint_span_back_nested_first(d0: str, d1: str) -> Run:
    return checkpoint_span_back(d0, d1)


NESTED_DEPTH = 64


def _nested(k: int, t, w):
    if k == 0:
        return torch.tanh(t * w)
    return checkpoint(functools.partial(_nested, k - 1, w=w), t, use_reentrant=True)


@scenario(f"{NESTED_DEPTH} nested reentrant checkpoints on accel:0: hand-off to a pool thread at depth 60")
def nested_checkpoint(d0: str, d1: str) -> Run:
    g = torch.Generator().manual_seed(6)
    leaves: dict = {}
    x = _leaf((4,), d0, g, "x", leaves)
    w = _leaf((4,), d0, g, "w", leaves)
    with warnings.catch_warnings():
        # The inner checkpoints see inputs without grad during the outer forward.
        warnings.simplefilter("ignore")
        y = _nested(NESTED_DEPTH, x, w)
    loss = y.sum()

    def backward():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss.backward()
    return Run([loss], leaves=leaves, backward=backward)


@scenario("first layer's forward on stream 1 of accel:0, the rest on stream 0")
def side_stream(d0: str, d1: str) -> Run:
    torch.manual_seed(7)
    l1, l2 = nn.Linear(5, 6).to(d0), nn.Linear(6, 2).to(d0)
    x = torch.randn(3, 5).to(d0)
    with on_stream(0, 1) if d0 != CPU else contextlib.nullcontext():
        h = torch.tanh(l1(x))
    loss = l2(h).sum()
    return Run([loss], leaves=_params(l1=l1, l2=l2))
