"""A CPU group's forward linears on oneDNN's inner product instead of MKL's GEMM.

Inductor calls MKL for every matrix product of a training step (``mm``,
``addmm``: extern kernels), and so does torch.compile. On this project's
CPU machines (AMD EPYC, AVX-512) oneDNN's inner product
(``mkldnn._linear_pointwise`` on plain layouts, the weight not prepacked)
is faster for a linear's forward shapes: README "oneDNN linears" has the
figures. Inductor lowers ``_linear_pointwise`` only for constant (frozen)
weights, so the call is wrapped in an op of ours, which Inductor leaves to
the dispatcher.

Only a large forward linear is rewritten (MIN_MULTIPLY_ADDS): ``mm(x,
t(W))`` or ``addmm(bias, x, t(W))`` of 2-D float32 values, where ``W`` is
no transpose itself. There the weight is the inner product's own layout; the
backward's products (``dY @ W``, ``t(dY) @ X``) would need transposed
copies first, and measured slower.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


@torch.library.custom_op("lazy_mlir::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.t() + bias, by oneDNN (x: [M, K], weight: [N, K], bias: [N] or None)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


_TRANSPOSES = (aten.t.default, aten.t_copy.default)
# Products of fewer multiply-adds stay MKL's: oneDNN's cost per call made the
# zoo's small models slower (HF BERT, linears of 32 x 64 x 64: the loss-captured
# step 1.01 -> 1.31x torch.compile's), while GPT-mini's smallest forward linear
# (1024 x 256 x 256, 2**26) was 6% faster.
MIN_MULTIPLY_ADDS = 2 ** 26


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrites ``gm``'s forward linears in place; returns how many."""
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
        weight = _transposed_weight(transposed)
        if weight is None or not _float32_matrices(x, weight) or (bias is not None and not _bias_of(bias, weight)):
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


def _transposed_weight(node):
    """W when ``node`` is t(W) and W is no transpose itself (a forward's weight)."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or node.target not in _TRANSPOSES:
        return None
    weight = node.args[0]
    if isinstance(weight, fx.Node) and weight.op == "call_function" and weight.target in _TRANSPOSES:
        return None
    return weight


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
