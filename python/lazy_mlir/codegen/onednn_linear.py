"""A CPU group's matrix products on oneDNN instead of MKL.

Inductor calls MKL for every matrix product of a training step (``mm``,
``addmm``, ``bmm``: extern kernels), and so does torch.compile. On this
project's CPU machines (AMD EPYC, AVX-512) oneDNN is faster (docs/performance.md
"Linears on oneDNN" has the figures):

- its inner product (``mkldnn._linear_pointwise``, the weight not
  prepacked) for ``mm(x, t(W))`` and ``addmm(bias, x, t(W))``: a linear's
  forward, and its input gradient ``dY @ W`` as ``x = dY`` with ``t(W)``
  (the transposed weight taken without a copy);
- its matmul primitive (``at::native::mkldnn_matmul``) for the other
  ``mm``, a weight's gradient ``t(dY) @ X``, whose operands it reads
  transposed without a copy (the inner product needs the reduced dimension
  contiguous), and for ``bmm`` (an attention's products).

Inductor lowers ``_linear_pointwise`` only for constant (frozen) weights and
has no lowering for the matmul primitive, so each call is an op of ours
(``lazy_mlir::onednn_linear``, ``lazy_mlir::onednn_matmul``) that Inductor
leaves to the dispatcher; their kernels are C++ (runtime/onednn_ops.cpp),
so that the generated code's calls run no Python and take no GIL. Only
float32 products from a size on are rewritten: below it, oneDNN's cost per
call loses.

Which library is faster depends on the CPU: on an AMD EPYC with AVX2 alone,
MKL's sgemm beat oneDNN's inner product on most GPT-mini linears (by up to 15%).
So by default (``Config.onednn_linear == "auto"``) each product is timed
with both, on random tensors of its sizes and strides, when a group that
holds it compiles (once per product and process), and goes to oneDNN only
if oneDNN is faster there by ``MIN_GAIN``; ``"on"`` rewrites every eligible
product unmeasured.
"""
from __future__ import annotations

import functools
import math
import statistics
import time

import torch
import torch.fx as fx

from ..native import _C  # noqa: F401 - defines the ops, their CPU kernels in C++ (runtime/onednn_ops.cpp)

aten = torch.ops.aten


@torch.library.register_fake("lazy_mlir::onednn_linear")
def _(x, weight, bias):
    """x @ weight.t() + bias, by oneDNN (x: [M, K], weight: [N, K], bias: [N] or None)."""
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.register_fake("lazy_mlir::onednn_matmul")
def _(a, b):
    """a @ b by oneDNN's matmul primitive (2-D, or 3-D batched; either operand may be transposed)."""
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


_TRANSPOSES = (aten.t.default, aten.t_copy.default)
# Products of fewer multiply-adds stay MKL's: oneDNN's cost per call made the
# zoo's tiny models slower (HF BERT, linears of 32 x 64 x 64: the loss-captured
# step 1.01 -> 1.31x torch.compile's; alone, 2**18 took 2.3x MKL's time, 2**21
# 1.3x, 2**23 0.9-1.04x), while from 2**25 it is faster: 520 x 256 x 256
# 0.77-0.87x MKL's, and in-process A/B on the base-size zoo (ViT's, Llama's
# key/value and T5's decoder projections) 0.984-0.988 of the step with those
# on MKL.
MIN_MULTIPLY_ADDS = 2 ** 25


# The matmul primitive's floor, over a bmm's whole batch: GPT-mini's
# attention products (32 x 128 x 128 x 64 = 2**25) were 1-21% faster on it,
# its weight gradients (2**26 to 2**28) 0-26%; the zoo's stay below.
MIN_MATMUL_MULTIPLY_ADDS = 2 ** 25


# In "auto" mode oneDNN takes a product only when its median time is below
# this fraction of MKL's: a tie stays with MKL (torch.compile's choice).
MIN_GAIN = 0.97
_TIMED_RUNS, _WARMUP_RUNS = 7, 2
_measured: dict[tuple, tuple[float, float]] = {}  # product signature -> (MKL's, oneDNN's) median seconds


def rewrite(gm: fx.GraphModule, measured: bool = False) -> int:
    """Rewrites ``gm``'s float32 CPU products in place: linears (forwards,
    input gradients) into ``onednn_linear``, the other ``mm`` (weight
    gradients) and ``bmm`` into ``onednn_matmul``; with ``measured``, only
    those that oneDNN runs faster on this machine. Returns how many."""
    if not torch.backends.mkldnn.is_available():  # a torch built without oneDNN
        return 0
    graph, rewritten = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.mm.default, aten.addmm.default):
            replacement = _linear(node)
            if replacement is None and node.target is aten.mm.default:
                replacement = _matmul(node)
        elif node.target is aten.bmm.default:
            replacement = _matmul(node)
        else:
            continue
        if replacement is None or (measured and not onednn_is_faster(*replacement)):
            continue
        target, args = replacement
        if isinstance(args[1], _TransposeOf):  # addmm(bias, x, B): the weight is t(B)
            with graph.inserting_before(node):
                weight = graph.call_function(aten.t.default, (args[1].node,))
            weight.meta["val"] = args[1].val
            args = (args[0], weight, args[2])
        with graph.inserting_before(node):
            product = graph.call_function(target, args)
        product.meta = dict(node.meta)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()  # the transposes only the linears read
        gm.recompile()
    return rewritten


@functools.cache
def register_with_inductor() -> None:
    """Registers the ops with Inductor (before any graph that calls them is
    compiled, cached ones included) as fallbacks whose tensor inputs are
    realized where they are computed, then given the FX values' stride
    order. By default Inductor copies an unrealized input into a buffer of
    its own for each call, so a value two products read is computed twice:
    GPT-mini's GELU output, read by the forward linear and by the backward's
    weight gradient, was computed again in the backward (4 more GELU loops
    over 1M elements a step)."""
    from torch._inductor import lowering
    from torch._inductor.ir import TensorBox

    def realized_in_place(fx_node, *args, **kwargs):
        for arg in args:
            if isinstance(arg, TensorBox):
                arg.realize()  # the value's own buffer (a view's base included), not a copy
        return lowering.constrain_to_fx_strides(fx_node, *args, **kwargs)

    for op in (torch.ops.lazy_mlir.onednn_linear.default, torch.ops.lazy_mlir.onednn_matmul.default):
        lowering.make_fallback(op, layout_constraint=realized_in_place)


def _linear(node):
    """(onednn_linear, its arguments) for ``mm(x, t(W))`` or ``addmm(bias, x,
    t(W))``, and for ``addmm(bias, x, B)``, a linear whose weight is stored
    [in, out] (Hugging Face's Conv1D: GPT-2's), with W = t(B) inserted (a
    view oneDNN takes without a copy); else None."""
    if node.target is aten.addmm.default:
        if len(node.args) != 3 or node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, b = node.args
    else:
        bias, (x, b) = None, node.args
    if _untransposed(x) is not None:  # t(X) @ dY: a weight's gradient, for _matmul
        return None
    weight = _untransposed(b)
    if weight is None and bias is None:  # mm(x, B): for _matmul
        return None
    if weight is not None:
        w = _val(weight)
    else:  # addmm(bias, x, B): the weight is t(B)
        w = _val(b).t() if _val(b) is not None and _val(b).dim() == 2 else None
    if not _float32_cpu(_val(x), w, dims=2) or (bias is not None and not _bias_of(_val(bias), w)):
        return None
    if not _at_least(MIN_MULTIPLY_ADDS, *_val(x).shape, w.shape[0]):
        return None
    return torch.ops.lazy_mlir.onednn_linear.default, (x, weight if weight is not None else _TransposeOf(b, w), bias)


def _matmul(node):
    """(onednn_matmul, its arguments) for a large float32 ``mm(a, b)`` or ``bmm(a, b)``, else None."""
    if len(node.args) != 2 or node.kwargs or not _matmul_usable():
        return None
    a, b = node.args
    dims = 3 if node.target is aten.bmm.default else 2
    if not _float32_cpu(_val(a), _val(b), dims=dims):
        return None
    if not _at_least(MIN_MATMUL_MULTIPLY_ADDS, *_val(a).shape, _val(b).shape[-1]):
        return None
    return torch.ops.lazy_mlir.onednn_matmul.default, (a, b)


class _TransposeOf:
    """t(``node``), inserted only if the product is rewritten (``val``: its value)."""

    def __init__(self, node: fx.Node, val: torch.Tensor):
        self.node, self.val = node, val


def onednn_is_faster(target, args) -> bool:
    """Whether oneDNN runs the product ``target(*args)`` (a rewritten one:
    ``onednn_linear``'s or ``onednn_matmul``'s FX arguments) faster than
    MKL runs the original on this machine, at this process's thread count,
    by ``MIN_GAIN``. Timed once per sizes and strides, on random tensors,
    the two taking turns, each run after a cache flush (as in a step, whose
    other kernels evict the operands)."""
    vals = [a.val if isinstance(a, _TransposeOf) else _val(a) for a in args]
    signature = (str(target), torch.get_num_threads(),
                 tuple(None if v is None else (tuple(v.shape), tuple(v.stride())) for v in vals))
    if signature not in _measured:
        tensors = [None if v is None else _random_laid_out_as(v) for v in vals]
        if target is torch.ops.lazy_mlir.onednn_linear.default:
            x, w, bias = tensors
            mkl = (lambda: torch.mm(x, w.t())) if bias is None else (lambda: torch.addmm(bias, x, w.t()))
        else:
            mkl = functools.partial(torch.matmul, *tensors)
        _measured[signature] = _median_seconds(mkl, functools.partial(target, *tensors))
    mkl_seconds, onednn_seconds = _measured[signature]
    return onednn_seconds < MIN_GAIN * mkl_seconds


def _random_laid_out_as(v: torch.Tensor) -> torch.Tensor:
    """Random values with ``v``'s sizes and strides. A gradient of a sum is
    an expanded tensor (strides of 0), whose elements share memory: filling
    it in place is an error, so the values are drawn in the storage it spans."""
    span = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if n > 0)
    return torch.randn(span).as_strided(v.shape, v.stride())


def _median_seconds(*candidates) -> tuple[float, ...]:
    flush = torch.empty(32 << 20, dtype=torch.uint8)
    times = [[] for _ in candidates]
    for run in range(_WARMUP_RUNS + _TIMED_RUNS):
        for fn, taken in zip(candidates, times):
            flush.fill_(run)
            start = time.perf_counter()
            fn()
            if run >= _WARMUP_RUNS:
                taken.append(time.perf_counter() - start)
    return tuple(statistics.median(t) for t in times)


def measured_products() -> dict[tuple, tuple[float, float]]:
    """The products timed so far: signature -> (MKL's, oneDNN's) median seconds."""
    return dict(_measured)


@functools.cache
def _matmul_usable() -> bool:
    """at::native::mkldnn_matmul takes float32 only on CPUs with AVX-512 (BW,
    VL, DQ) or AVX-NE-CONVERT (the check it shares with bfloat16)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _untransposed(node):
    """W when ``node`` is t(W), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _TRANSPOSES:
        return None
    return node.args[0]


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _float32_cpu(*vals, dims: int) -> bool:
    return all(v is not None and v.dtype == torch.float32 and v.device.type == "cpu" and v.dim() == dims for v in vals)


def _at_least(minimum: int, *sizes) -> bool:
    """Whether the product of ``sizes`` (a product's multiply-adds) reaches ``minimum``."""
    if not all(isinstance(n, int) for n in sizes):  # symbolic (shape-generic code): unknown, MKL's
        return False
    return math.prod(sizes) >= minimum


def _bias_of(bias, weight) -> bool:
    """addmm broadcasts its first operand; the inner product takes one value
    per output feature (``bias``, ``weight``: their values)."""
    return bias is not None and bias.dtype == torch.float32 and bias.dim() == 1 and bias.shape[0] == weight.shape[0]
