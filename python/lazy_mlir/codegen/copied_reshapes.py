"""Reshapes nested in reshapes' index arithmetic, cut by a row-major copy.

Inductor computes a reshape by folding it into the index arithmetic of
whatever reads it (``ir.View``'s reindexer), through views and pointwise
ops, down to the nearest buffer, unless its input is a buffer laid out so
that the reshape is a view. A reshape that regroups dims (``[.., 16, 31] ->
[.., 31, 16]``: neither only splitting dims nor only merging neighbours)
indexes its input by remainders and quotients of a sum of the new indices.
A chain of them over pointwise ops and slices, with no buffer between
(Funnel Transformer's relative shift: reshape, slice, reshape, slice, and
its backward's ``slice_scatter``s), nests each into the next: index
expressions of thousands of characters, which Inductor's CPU tiling
simplifies with sympy for each loop variable of each kernel that reads
them (``stride_at``: 60-70 s for one of Funnel's; its first step did not
compile in 15 min, nor did torch.compile's).

``rewrite`` gives the input of such a reshape, when that input's index
already holds another, a row-major buffer of its own
(``prims.inductor_force_stride_order``, which Inductor lowers to a copy
into that layout, as eager's reshape copies a tensor it cannot view); the
reshape is then a view of that buffer. Splits and merges compose into one
index each and are left to Inductor: none of the zoo's models gets a copy.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch._inductor import inductor_prims  # noqa: F401 - registers prims.inductor_force_stride_order
from torch._prims_common import make_contiguous_strides_for

aten = torch.ops.aten

_RESHAPES = {aten.reshape.default, aten.view.default, aten._unsafe_view.default}
# Views: Inductor indexes their input (a reshape of one folds unless the
# strides allow a view of the input's buffer).
_VIEWS = {aten.slice.Tensor, aten.select.int, aten.permute.default, aten.transpose.int, aten.t.default,
          aten.expand.default, aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.diagonal.default, aten.alias.default}
# Ops Inductor lowers to index arithmetic over their inputs, with no buffer
# of their own, besides those tagged pointwise. Any other op (products,
# reductions, placeholders) gives a buffer.
_INDEXING = {aten.slice_scatter.default, aten.select_scatter.default, aten.slice_backward.default,
             aten.select_backward.default, aten.constant_pad_nd.default,
             aten.cat.default, aten.index.Tensor, aten.gather.default, aten.embedding.default,
             aten._to_copy.default, aten.copy.default, aten.index_select.default, aten.roll.default,
             aten.flip.default, aten.repeat.default}


@dataclasses.dataclass(frozen=True)
class _Indexing:
    """How Inductor would compute a value: from a buffer (``buffer``: a
    buffer or a view of one), and whether its index holds a reshape that
    regroups dims, folded into it (``folded``)."""
    buffer: bool
    folded: bool


_BUFFER = _Indexing(buffer=True, folded=False)


def rewrite(gm: fx.GraphModule) -> int:
    """Cuts ``gm``'s nested regrouping reshapes with row-major copies; returns
    how many (0: ``gm`` is unchanged). Static shapes only: a shape-generic
    graph's row-major strides are expressions of its sizes."""
    indexing: dict[fx.Node, _Indexing] = {}
    copies = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        reads = [indexing.get(a, _BUFFER) for a in node.all_input_nodes]
        if node.target in _RESHAPES and _static(node):
            source = indexing.get(node.args[0], _BUFFER)
            before, after = node.args[0].meta["val"], node.meta["val"]
            if before.shape == after.shape or (source.buffer and after._is_view()):  # the input, or a view of it
                indexing[node] = source
            elif not _regroups(before.shape, after.shape):  # one index in, one index out: nothing nests
                indexing[node] = dataclasses.replace(source, buffer=False)
            elif source.folded:
                _copy_row_major(gm.graph, node, node.args[0])
                copies += 1
                indexing[node] = _BUFFER
            else:
                indexing[node] = _Indexing(buffer=False, folded=True)
        elif node.target in _VIEWS:
            indexing[node] = reads[0] if reads else _BUFFER
        elif node.target in _INDEXING or torch.Tag.pointwise in getattr(node.target, "tags", ()):
            indexing[node] = _Indexing(buffer=False, folded=any(r.folded for r in reads))
    if copies:
        gm.graph.lint()
        gm.recompile()
    return copies


def _regroups(before, after) -> bool:
    """The reshape neither only splits dims nor only merges neighbours
    (``[.., 16, 31] -> [.., 31, 16]``): Inductor then indexes its input by
    remainders of sums of the new indices, which nest when another such
    reshape reads them. Splits give sums, merges quotients and remainders
    of one index, which compose into one (adding and dropping ones aside)."""
    before, after = [n for n in before if n != 1], [n for n in after if n != 1]
    return not (_splits(before, after) or _splits(after, before))


def _splits(before: list, after: list) -> bool:
    """Each of ``before``'s sizes is the product of consecutive sizes of ``after``."""
    i = 0
    for n in before:
        product = 1
        while product < n and i < len(after):
            product *= after[i]
            i += 1
        if product != n:
            return False
    return i == len(after)


def _static(node: fx.Node) -> bool:
    value, source = node.meta.get("val"), node.args[0]
    return isinstance(value, torch.Tensor) and isinstance(source, fx.Node) and \
        isinstance(source.meta.get("val"), torch.Tensor) and \
        all(isinstance(s, int) for s in (*value.shape, *source.meta["val"].shape))


def _copy_row_major(graph: fx.Graph, reshape: fx.Node, source: fx.Node) -> None:
    value = source.meta["val"]
    with graph.inserting_before(reshape):
        copy = graph.call_function(torch.ops.prims.inductor_force_stride_order.default,
                                   (source, list(make_contiguous_strides_for(value.shape))))
    copy.meta["val"] = torch.ops.prims.inductor_force_stride_order.default(copy.args[0].meta["val"], copy.args[1])
    reshape.replace_input_with(source, copy)
