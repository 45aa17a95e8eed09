"""The op vocabulary of graph files: which backward rule computes a node.

A node's ``op`` defaults to its ``name`` (PyTorch's class name, e.g.
``MulBackward0``); graph files may name an op explicitly (``cost``,
``opaque``, ``python``). The engine keeps one rule per member
(``autograd_run.engine.rules``); this module only knows the names and the
few structural facts the validator needs (how many inputs an op takes and
how its outputs' shapes relate to its inputs).
"""

from __future__ import annotations

import enum


class Op(str, enum.Enum):
    ACCUMULATE_GRAD = "AccumulateGrad"
    ADD = "AddBackward0"
    SUB = "SubBackward0"
    MUL = "MulBackward0"
    DIV = "DivBackward0"
    NEG = "NegBackward0"
    MM = "MmBackward0"
    T = "TBackward0"
    SUM = "SumBackward0"
    SUM_DIM = "SumBackward1"
    MEAN = "MeanBackward0"
    RELU = "ReluBackward0"
    EXP = "ExpBackward0"
    LOG = "LogBackward0"
    POW = "PowBackward0"
    ADDMM = "AddmmBackward0"
    BMM = "BmmBackward0"
    TRANSPOSE = "TransposeBackward0"
    PERMUTE = "PermuteBackward0"
    RESHAPE_ALIAS = "ReshapeAliasBackward0"
    UNSAFE_VIEW = "UnsafeViewBackward0"
    MEAN_DIM = "MeanBackward1"
    GELU = "GeluBackward0"
    SOFTMAX = "SoftmaxBackward0"
    LOG_SOFTMAX = "LogSoftmaxBackward0"
    LAYER_NORM = "NativeLayerNormBackward0"
    CAT = "CatBackward0"
    STACK = "StackBackward0"
    SELECT = "SelectBackward0"
    SLICE = "SliceBackward0"
    EMBEDDING = "EmbeddingBackward0"
    SPLIT = "SplitBackward0"
    SPLIT_WITH_SIZES = "SplitWithSizesBackward0"
    UNBIND = "UnbindBackward0"
    SQRT = "SqrtBackward0"
    RSQRT = "RsqrtBackward0"
    RSUB = "RsubBackward1"
    ABS = "AbsBackward0"
    SILU = "SiluBackward0"
    LEAKY_RELU = "LeakyReluBackward0"
    CLAMP = "ClampBackward1"
    SIN = "SinBackward0"
    COS = "CosBackward0"
    WHERE = "WhereBackward0"
    UNSQUEEZE = "UnsqueezeBackward0"
    SQUEEZE = "SqueezeBackward0"
    SQUEEZE_DIM = "SqueezeBackward1"
    SQUEEZE_DIMS = "SqueezeBackward2"
    MAX = "MaxBackward1"
    MIN = "MinBackward1"
    AMAX = "AmaxBackward0"
    AMIN = "AminBackward0"
    MSE_LOSS = "MseLossBackward0"
    NLL_LOSS = "NllLossBackward0"
    NLL_LOSS_2D = "NllLoss2DBackward0"
    CONVOLUTION = "ConvolutionBackward0"
    MAX_POOL_1D = "MaxPool1DWithIndicesBackward0"
    MAX_POOL_2D = "MaxPool2DWithIndicesBackward0"
    MAX_POOL_3D = "MaxPool3DWithIndicesBackward0"
    AVG_POOL_2D = "AvgPool2DBackward0"
    AVG_POOL_3D = "AvgPool3DBackward0"
    BATCH_NORM = "NativeBatchNormBackward0"
    TANH = "TanhBackward0"
    SIGMOID = "SigmoidBackward0"
    CLONE = "CloneBackward0"
    TO_COPY = "ToCopyBackward0"
    VIEW = "ViewBackward0"
    EXPAND = "ExpandBackward0"
    # Synthetic nodes.
    IDENTITY = "identity"   # passes each gradient through unchanged
    COST = "cost"           # does a given amount of real work, emits declared shapes
    OPAQUE = "opaque"       # an op without a rule: zeros of the declared shapes
    PYTHON = "python"       # a Python callable (may re-enter the engine); needs --allow-python
    # Created by the engine for a backward call with several roots; never in a file.
    GRAPH_ROOT = "GraphRoot"


#: Ops whose gradient outputs all have the shape of their (single) input: the
#: consumer of each output must be broadcast-compatible with that shape.
ELEMENTWISE = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.RELU, Op.EXP, Op.TANH,
    Op.SIGMOID, Op.CLONE, Op.IDENTITY, Op.LOG, Op.POW, Op.GELU, Op.SQRT, Op.RSQRT,
    Op.RSUB, Op.ABS, Op.SILU, Op.LEAKY_RELU, Op.CLAMP, Op.SIN, Op.COS,
})

#: Ops that take no gradient input besides their one input slot and have no outputs.
LEAF_OPS = frozenset({Op.ACCUMULATE_GRAD})


#: Saved fields that are tensors in PyTorch (freed by a backward without retain_graph;
#: a plain number there is a wrapped scalar). Other saved fields are sizes, dims, flags.
SAVED_TENSORS: dict[Op, tuple[str, ...]] = {
    Op.MUL: ("self", "other"),
    Op.DIV: ("self", "other"),
    Op.MM: ("self", "mat2"),
    Op.RELU: ("result",),
    Op.EXP: ("result",),
    Op.TANH: ("result",),
    Op.SIGMOID: ("result",),
    Op.LOG: ("self",),
    Op.POW: ("self",),
    Op.ADDMM: ("mat1", "mat2"),
    Op.BMM: ("self", "mat2"),
    Op.GELU: ("self",),
    Op.SOFTMAX: ("result",),
    Op.LOG_SOFTMAX: ("result",),
    Op.LAYER_NORM: ("input", "result1", "result2", "weight", "bias"),
    Op.EMBEDDING: ("indices",),
    Op.SQRT: ("result",),
    Op.RSQRT: ("result",),
    Op.ABS: ("self",),
    Op.SILU: ("self",),
    Op.LEAKY_RELU: ("self",),
    Op.CLAMP: ("self",),
    Op.SIN: ("self",),
    Op.COS: ("self",),
    Op.WHERE: ("condition",),
    Op.MAX: ("self", "result"),
    Op.MIN: ("self", "result"),
    Op.AMAX: ("self", "result"),
    Op.AMIN: ("self", "result"),
    Op.MSE_LOSS: ("self", "target"),
    Op.NLL_LOSS: ("self", "target", "weight", "total_weight"),
    Op.NLL_LOSS_2D: ("self", "target", "weight", "total_weight"),
    Op.CONVOLUTION: ("input", "weight"),
    Op.MAX_POOL_1D: ("self", "result1"),
    Op.MAX_POOL_2D: ("self", "result1"),
    Op.MAX_POOL_3D: ("self", "result1"),
    Op.AVG_POOL_2D: ("self",),
    Op.AVG_POOL_3D: ("self",),
    Op.BATCH_NORM: ("input", "weight", "running_mean", "running_var", "result1", "result2"),
}

_BY_VALUE = {op.value: op for op in Op}
# PyTorch's own spelling of the leaf node's name.
_BY_VALUE["torch::autograd::AccumulateGrad"] = Op.ACCUMULATE_GRAD


def op_from_string(text: str) -> Op | None:
    """The Op named ``text`` (a PyTorch node name or a synthetic op), or None."""
    return _BY_VALUE.get(text)
