"""Where aten's CPU kernel rounds a constant to float32 in every dtype, the
generated code rounds it the same way.

``hardsigmoid_backward`` multiplies the gradient by ``1.0f / 6.0f``, a
float32 literal, also for float64 tensors; Inductor's decomposition
multiplies by float64's 1/6. The two differ by 3e-8 of every such gradient:
a float64 MobileNetV3 (squeeze-excitation scales through a hardsigmoid)
trained at O1 differed from eager by 1e-9 of its largest gradient against
eager's own rounding of 1e-14, and the numerics checker, comparing with
aten's kernel, sent the whole step to TorchScript. Eager's value is the one
users compare with, so the graph computes it: ``rewrite`` spells the op out
with eager's constant (float64 only: in float32 the constants agree, and
half types compute in float32).
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

# float(1.0f / 6.0f): aten's one_sixth in hardsigmoid_backward_kernel
FLOAT32_ONE_SIXTH = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))


def rewrite(gm: fx.GraphModule) -> int:
    """Spells out float64 ``hardsigmoid_backward`` with aten's constant;
    returns how many were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.target is not aten.hardsigmoid_backward.default or _dtype(node) is not torch.float64:
            continue
        grad, x = node.args
        with gm.graph.inserting_before(node):
            inside = gm.graph.call_function(aten.logical_and.default, (
                gm.graph.call_function(aten.gt.Scalar, (x, -3.0)), gm.graph.call_function(aten.lt.Scalar, (x, 3.0))))
            scaled = gm.graph.call_function(aten.mul.Tensor, (grad, FLOAT32_ONE_SIXTH))
            result = gm.graph.call_function(aten.where.ScalarOther, (inside, scaled, 0.0))
        result.meta = dict(node.meta)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _dtype(node: fx.Node):
    value = node.meta.get("val")
    return value.dtype if isinstance(value, torch.Tensor) else None
