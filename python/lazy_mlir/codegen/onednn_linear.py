"""A CPU group's linears on oneDNN's inner product instead of MKL's GEMM.

Inductor calls MKL for every matrix product of a training step (``mm``,
``addmm``: extern kernels), and so does torch.compile. On this project's
CPU machines (AMD EPYC, AVX-512) oneDNN's inner product
(``mkldnn._linear_pointwise``, the weight not prepacked) is faster for a
linear's forward and its input gradient: README "Linears on
oneDNN" has the figures. Inductor lowers ``_linear_pointwise`` only for
constant (frozen) weights, so the call is wrapped in an op of ours, which
Inductor leaves to the dispatcher; its kernel is C++, so that the
generated code's calls run no Python and take no GIL.

Rewritten, in float32 and from MIN_MULTIPLY_ADDS on: ``mm(x, t(W))`` and
``addmm(bias, x, t(W))``, the inner product of x and W, whatever W is: a
forward's weight, or ``t(W)`` in an input gradient ``dY @ W`` (oneDNN
takes the transposed weight without a copy). A weight's gradient
``t(X) @ dY`` stays MKL's: oneDNN was slower on the transposed input.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import _C  # noqa: F401 - defines lazy_mlir::onednn_linear, its CPU kernel in C++ (runtime/onednn_linear.cpp)

aten = torch.ops.aten


@torch.library.register_fake("lazy_mlir::onednn_linear")
def _(x, weight, bias):
    """x @ weight.t() + bias, by oneDNN (x: [M, K], weight: [N, K], bias: [N] or None)."""
    return x.new_empty((x.shape[0], weight.shape[0]))


_TRANSPOSES = (aten.t.default, aten.t_copy.default)
# Products of fewer multiply-adds stay MKL's: oneDNN's cost per call made the
# zoo's small models slower (HF BERT, linears of 32 x 64 x 64: the loss-captured
# step 1.01 -> 1.31x torch.compile's), while GPT-mini's smallest forward linear
# (1024 x 256 x 256, 2**26) was 6% faster.
MIN_MULTIPLY_ADDS = 2 ** 26


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrites ``gm``'s linears (forwards, input gradients) in place; returns how many."""
    graph, rewritten = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        if node.target is aten.addmm.default:
            if len(node.args) != 3 or node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                continue
            bias, x, transposed = node.args
        else:
            bias, (x, transposed) = None, node.args
        weight = _untransposed(transposed)
        if weight is None or _untransposed(x) is not None:  # t(X) @ dY: a weight's gradient, MKL's
            continue
        if not _float32_matrices(x, weight) or (bias is not None and not _bias_of(bias, weight)):
            continue
        if not _large(_val(x).shape, _val(weight).shape):
            continue
        with graph.inserting_before(node):
            linear = graph.call_function(torch.ops.lazy_mlir.onednn_linear.default, (x, weight, bias))
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()  # the transposes only the products read
        gm.recompile()
    return rewritten


def _untransposed(node):
    """W when ``node`` is t(W), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _TRANSPOSES:
        return None
    return node.args[0]


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _float32_matrices(*nodes) -> bool:
    vals = [_val(n) for n in nodes]
    return all(v is not None and v.dtype == torch.float32 and v.device.type == "cpu" and v.dim() == 2 for v in vals)


def _large(x_shape, weight_shape) -> bool:
    sizes = (*x_shape, weight_shape[0])
    if not all(isinstance(n, int) for n in sizes):  # symbolic (shape-generic code): unknown, MKL's
        return False
    m, k, n = sizes
    return m * k * n >= MIN_MULTIPLY_ADDS


def _bias_of(bias, weight) -> bool:
    """addmm broadcasts its first operand; the inner product takes one value per output feature."""
    v = _val(bias)
    return v is not None and v.dtype == torch.float32 and v.dim() == 1 and v.shape[0] == _val(weight).shape[0]
