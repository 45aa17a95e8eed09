"""Nodes of the Python ``autograd.Function``s that PyTorch itself ships, whose backward is known.

A custom Function's node is named ``<Class>Backward``. Most are the user's
own and capture cannot know their backward (see ``autograd_run.capture.inner``);
these are PyTorch's, with a fixed backward:

* ``BackwardHookFunctionBackward``: what ``nn.Module.register_full_backward_hook``
  (and ``_pre_hook``) put around a module's inputs and outputs; it passes each
  gradient through to its own input (the hooks themselves are not in the
  file: capture names them in ``meta.hooks``);
* ``_DirichletBackward``: torch.distributions' reparameterised Dirichlet sample
  (Dirichlet and Beta ``rsample``). Its factor is PyTorch's ``_dirichlet_grad``,
  evaluated with PyTorch's own approximations: capture records its value at
  the saved sample as ``grad_factor``.
"""

from __future__ import annotations

from autograd_run.ops import cost
from autograd_run.ops.arrays import each
from autograd_run.ops.spec import PER_INPUT, op


@op("BackwardHookFunctionBackward", outputs=PER_INPUT, cost=cost.VIEW, views="same")
def backward_hook_function(node, grads, ctx):
    """nn.Module full backward hooks' pass-through (BackwardHookFunction): gradient k to input k (what the module's
    hooks did is held as ``attrs.hooks`` on its slots when capture could fit it)."""
    return each(node, lambda i: grads[i])


@op("_DDPSinkBackward", outputs=PER_INPUT, cost=cost.VIEW, views="same")
def ddp_sink(node, grads, ctx):
    """DistributedDataParallel's _DDPSink (its outputs pass through it under find_unused_parameters or
    static_graph): gradient k to input k. (Its backward also queues the Reducer's delayed all-reduce in
    static_graph's first iteration: communication, which ``sim.ddp`` models, not a gradient.)"""
    return each(node, lambda i: grads[i])


@op("RegisterPostBackwardFunctionBackward", outputs=PER_INPUT, cost=cost.VIEW, views="same")
def fsdp_post_backward(node, grads, ctx):
    """FSDP2's RegisterPostBackwardFunction (``fully_shard`` puts it on a module's inputs): gradient k to input k.
    (Its backward also runs the module's post-backward: the reduce-scatter of its gradients, which
    ``sim.fsdp`` models, not a gradient.)"""
    return each(node, lambda i: grads[i])


@op("RegisterPreBackwardFunctionBackward", outputs=PER_INPUT, cost=cost.VIEW, views="same")
def fsdp_pre_backward(node, grads, ctx):
    """FSDP2's RegisterPreBackwardFunction (a module's outputs under functorch transforms): the gradient passes
    through. (Its backward runs the module's pre-backward: the all-gather, which ``sim.fsdp`` models.)"""
    return each(node, lambda i: grads[i])


@op("_DirichletBackward", outputs=1, saved="result:tensor grad_factor:tensor", elementwise=True, cost=cost.pointwise(4))
def dirichlet(node, grads, ctx):
    """torch.distributions' _Dirichlet (Dirichlet and Beta rsample), x the sample: f (g - sum(x g)) over the last
    dim, f PyTorch's _dirichlet_grad (recorded)."""
    sv = ctx.saved(node)
    x, f, g = sv["result"], sv["grad_factor"], grads[0]
    return each(node, lambda i: f * (g - (x * g).sum(axis=-1, keepdims=True)))
