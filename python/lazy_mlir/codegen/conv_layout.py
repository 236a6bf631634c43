"""Channels-last activations for a CPU group's convolutions, forward and backward.

Inductor runs a CPU graph's convolutions on oneDNN in channels-last layout
(its "layout optimization"), and takes the other layouts of the graph from
the strides its FX values carry, which are eager's: contiguous.
torch.compile compiles a step as separate graphs, and its backward graph
receives the forward's saved activations channels-last, so its gradients
stay channels-last too. A lazy_mlir group holds the whole step (forward,
backward and optimizer in one graph) with eager's strides throughout.
Inductor then keeps each activation that a ``convolution_backward`` reads
(a pooling's or a residual block's output) in its contiguous layout as well
as channels-last for the next convolution, and the backward's batch-norm,
ReLU and pooling kernels mix the two layouts, transposing in their inner
loops (zoo ResNet at the base size: 6.3 ms of fused kernels a step against
torch.compile's 3.5, docs/performance.md).

``rewrite`` marks each convolution's output channels-last in the graph (a
``clone`` to that memory format, which Inductor lowers to nothing: the
convolution's output is channels-last already), so that the values computed
from it, and the gradients ``convolution_backward`` returns, carry
channels-last strides, as in torch.compile's backward graph. The group's
outputs keep the layouts they had: one that would change is copied back.
Groups with collectives (ZeRO's) are not rewritten: the zero passes planned
their memory with the layouts the graph has (group_lowering).
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._prims_common import make_contiguous_strides_for

aten = torch.ops.aten


def rewrite(gm: fx.GraphModule, fake_inputs: list, fake_mode) -> int:
    """Marks ``gm``'s 2-D CPU convolutions' outputs channels-last; returns
    how many (0: ``gm`` is unchanged). ``fake_inputs`` (of ``fake_mode``)
    carry the inputs' real layouts: the outputs' strides are compared on them."""
    if not torch.backends.mkldnn.is_available():  # Inductor's layout optimization is oneDNN's
        return 0
    convolutions = [n for n in gm.graph.nodes if _is_cpu_conv2d(n)]
    if not convolutions:
        return 0
    before = _output_strides(gm, fake_inputs, fake_mode)
    marks = [_mark(gm.graph, node) for node in convolutions]
    gm.recompile()
    if not _restore_output_layouts(gm, before, _output_strides(gm, fake_inputs, fake_mode)):
        for node, mark in zip(convolutions, marks):  # an output in a layout it cannot be copied back to
            mark.replace_all_uses_with(node)
            gm.graph.erase_node(mark)
        gm.recompile()
        return 0
    gm.graph.lint()
    gm.recompile()
    return len(convolutions)


def _is_cpu_conv2d(node: fx.Node) -> bool:
    value = node.meta.get("val") if node.op == "call_function" else None
    return (node.target is aten.convolution.default and isinstance(value, torch.Tensor) and value.dim() == 4
            and value.device.type == "cpu" and value.is_floating_point()
            and not value.is_contiguous(memory_format=torch.channels_last))


def _mark(graph: fx.Graph, node: fx.Node) -> fx.Node:
    """Routes ``node``'s users through a channels-last clone of it."""
    with graph.inserting_after(node):
        mark = graph.call_function(aten.clone.default, (node,), {"memory_format": torch.channels_last})
    mark.meta["val"] = node.meta["val"].clone(memory_format=torch.channels_last)
    node.replace_all_uses_with(mark, delete_user_cb=lambda user: user is not mark)
    return mark


def _output_strides(gm: fx.GraphModule, fake_inputs: list, fake_mode) -> list:
    with fake_mode, torch.no_grad():
        values = gm(*fake_inputs)
    return [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in values]


def _restore_output_layouts(gm: fx.GraphModule, before: list, after: list) -> bool:
    """Copies each output whose strides the marks changed back to the
    contiguous layout it had (eager's, which Inductor returns). False, with
    nothing copied, when such an output was not contiguous."""
    output = gm.graph.output_node()
    values = list(output.args[0])
    changed = [i for i, (old, new) in enumerate(zip(before, after)) if old != new]
    if any(before[i] != make_contiguous_strides_for(values[i].meta["val"].shape) for i in changed):
        return False
    for i in changed:
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(aten.clone.default, (values[i],), {"memory_format": torch.contiguous_format})
        copy.meta["val"] = values[i].meta["val"].clone(memory_format=torch.contiguous_format)
        values[i] = copy
    output.args = (tuple(values),)
    return True
