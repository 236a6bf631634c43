"""Which TorchScript nodes of a captured step may join a fusion group.

The C++ clusterer asks ``classify(node)`` once per node of each new graph:
``COMPUTE`` nodes start and join groups, ``PLUMBING`` nodes (constants, the
``ScalarImplicit`` LTC wraps around 0-d scalar inputs, list construction) are
absorbed into their consumer's group so they never split one, and
``NOT_COMPILABLE`` nodes stay in the TorchScript glue graph.
The rule is by op name and types, and can be widened with ``allow()``.
"""
from __future__ import annotations

import contextlib

import torch

NOT_COMPILABLE, COMPUTE, PLUMBING = 0, 1, 2

PLUMBING_KINDS = {"prim::Constant", "prim::ListConstruct", "aten::ScalarImplicit", "aten::IntImplicit",
                  "aten::FloatImplicit", "aten::BoolImplicit"}

# Ops kept in TorchScript: host syncs, and random ops whose stream of draws
# must match eager PyTorch exactly (the C++ core keeps RANDOM_OPS in trace
# order: lazy_backend/ltc_fixes/draw_order.h). randn, randn_like and normal_
# trace as normal_functional (functionalization's name for normal_).
HOST_SYNCS = {"aten::_local_scalar_dense", "aten::item"}
RANDOM_OPS = {
    "aten::bernoulli", "aten::dropout", "aten::native_dropout", "aten::rand", "aten::rand_like",
    "aten::randn", "aten::randn_like", "aten::randint", "aten::randint_like", "aten::randperm",
    "aten::normal", "aten::normal_functional", "aten::uniform", "aten::multinomial", "aten::exponential",
    "aten::geometric", "aten::cauchy", "aten::log_normal", "aten::random", "aten::poisson", "aten::binomial",
    "aten::_standard_gamma", "aten::_sample_dirichlet", "aten::rrelu_with_noise_functional",
    "lazy_mlir::dropout_mask",  # eager's dropout mask, split from its product (lazy_backend/ltc_fixes/dropout_masks.h)
}
# Inductor generates grouped products (MoE experts) for CUDA bfloat16 only,
# and aten's Meta kernel refuses other dtypes: aten's kernel runs in the glue.
UNGENERATED = {"aten::_grouped_mm"}
# The ops of trace/data_dependent.py (sizes read from data; the CTC loss):
# aten's kernel runs in the glue. Other ops without a Meta kernel compile:
# Inductor sizes them as FakeTensorMode does, running aten's kernel on
# zeros, and calls that kernel from its code (as trace/shape_functions.py sizes their nodes).
UNGENERATED |= {"aten::nonzero", "lazy_mlir::nonzero_contiguous", "aten::repeat_interleave", "aten::bincount",
                "aten::_unique2", "aten::unique_consecutive",
                "aten::_ctc_loss", "aten::_ctc_loss_backward", "lazy_mlir::ctc_loss_padded_alpha",
                # torch's decomposition of it is wrong (lazy_kernels decomposes it itself; traced as a
                # node only when that fails): never Inductor's
                "aten::multilabel_margin_loss_forward"}
DENIED = HOST_SYNCS | RANDOM_OPS | UNGENERATED
# aten, and our own ops (lazy_mlir.zero's collectives markers, lowered by MLIR passes).
COMPILED_NAMESPACES = ("aten::", "lazy_mlir::")
# Ops returning tensor lists that the TS -> FX conversion expands into
# per-tensor ops (lowering/fused_optimizer.py): their lists stay inside a group.
LIST_RETURNING = {"lazy_mlir::adam_step", "lazy_mlir::sgd_step", "aten::_amp_foreach_non_finite_check_and_unscale"}
_allowed: set[str] = set()
_generation = 0  # bumped by allow()/deny(): compiled graphs then recompile

_VALUE_TYPES = (torch._C.TensorType, torch._C.NumberType, torch._C.IntType, torch._C.FloatType,
                torch._C.BoolType, torch._C.NoneType, torch._C.StringType, torch._C.DeviceObjType,
                torch._C.ListType, torch._C.OptionalType)


def allow(kind: str) -> None:
    """Let ``kind`` (e.g. ``"aten::dropout"``) be compiled even if denied.
    Takes effect at the next ``lazy_mlir.init()``."""
    global _generation
    _allowed.add(kind)
    DENIED.discard(kind)
    _generation += 1


def deny(kind: str) -> None:
    """Keep ``kind`` in TorchScript. Takes effect at the next ``lazy_mlir.init()``."""
    global _generation
    _allowed.discard(kind)
    DENIED.add(kind)
    _generation += 1


def generation() -> int:
    return _generation


def draws_random(graph: torch._C.Graph) -> bool:
    """Whether a group's graph runs random ops: only one the user let in
    with ``allow()`` (the denied ones draw in the TorchScript glue)."""
    return any(node.kind() in RANDOM_OPS for node in graph.nodes())


def _ceil_mode_counting_padding(node: torch._C.Node) -> bool:
    """Inductor's avg_pool2d/3d backward divides by the whole window where
    ceil_mode cuts the last one short and the padding counts (eager: by the
    part inside the padded input). torch.compile gives the same wrong
    gradients (2d: a 4x4 window over a 1x1 input, HF EfficientNet's pooler;
    3d: any clipped window); aten's kernel in the glue gives eager's."""
    ceil_mode, count_include_pad = (node.inputsAt(i).toIValue() for i in (5, 6))
    return ceil_mode is not False and count_include_pad is not False


# Ops whose generated code is wrong for some arguments: those calls stay in TorchScript.
WRONG_IN_GENERATED_CODE = {"aten::avg_pool2d_backward": _ceil_mode_counting_padding,
                           "aten::avg_pool3d_backward": _ceil_mode_counting_padding}


def _plain_values(values) -> bool:
    return all(isinstance(v.type(), _VALUE_TYPES) for v in values)


def _unpacked_tensor_list(value: torch._C.Value) -> bool:
    """A Tensor[] that only prim::ListUnpack nodes read (they join its group)."""
    t = value.type()
    return (isinstance(t, torch._C.ListType) and isinstance(t.getElementType(), torch._C.TensorType)
            and all(use.user.kind() == "prim::ListUnpack" for use in value.uses()))


def classify(node: torch._C.Node) -> int:
    kind = node.kind()
    if kind in PLUMBING_KINDS:
        return PLUMBING
    if kind == "prim::ListUnpack":
        # Of a list-returning op the converter expands: compute, at its
        # producer's depth, so in its group; of anything else: TorchScript.
        producer = node.input().node().kind()
        return COMPUTE if producer in LIST_RETURNING and _unpacked_tensor_list(node.input()) else NOT_COMPILABLE
    if kind in _allowed:
        return COMPUTE
    if not kind.startswith(COMPILED_NAMESPACES) or kind in DENIED:
        return NOT_COMPILABLE
    if kind in WRONG_IN_GENERATED_CODE and WRONG_IN_GENERATED_CODE[kind](node):
        return NOT_COMPILABLE
    outputs = list(node.outputs())
    if kind in LIST_RETURNING:
        if not all(isinstance(v.type(), torch._C.TensorType) or _unpacked_tensor_list(v) for v in outputs):
            return NOT_COMPILABLE
    elif not outputs or not all(isinstance(v.type(), torch._C.TensorType) for v in outputs):
        return NOT_COMPILABLE
    return COMPUTE if _plain_values(node.inputs()) else NOT_COMPILABLE


_settling = False  # a setup graph is being synced: none of its groups compiles


@contextlib.contextmanager
def settling():
    """Graphs synced inside run in TorchScript: the first step's setup graphs
    (steady_state's in-place mul_(1)), nothing worth compiling."""
    global _settling
    _settling = True
    try:
        yield
    finally:
        _settling = False


def is_settling() -> bool:
    return _settling
