"""A bound on the loads Inductor traces to compute one element of a value.

Inductor computes a pointwise value inside each kernel that reads it, unless
it realizes it as a buffer; to decide, and to generate each kernel, it calls
the value's loader once per read, and that loader calls its own inputs'
loaders in turn: the work is the value's expression tree with every shared
input counted once per read. A chain whose links each read the previous
link twice doubles it at each link. Adam's ``exp_avg.lerp_(grad, 0.1)`` is
one: Inductor decomposes it into ``start + w * (end - start)``, so k
optimizer steps in one graph (k ``opt.step()`` calls before a
``mark_step``) trace 2^k loads of the first ``exp_avg``: with 12 steps on a
4-parameter MLP, 283 s of compile, against 13 s for one step. Inductor's own
limit (a value read by several ops is realized when its inlined code
exceeds ``realize_opcount_threshold``) counts the ops by tracing that same
tree, so it does not stop the growth.

``bound`` runs as Inductor's post-grad pass, after its decompositions, where
each read is a use in the graph: it counts each pointwise value's tree, and
where one would exceed ``MAX_TRACED_LOADS``, realizes its largest inputs
(``prims.inductor_force_stride_order`` at the input's own strides: Inductor
then stores it in that layout, no copy) until it fits; a view read is cut
at the value behind it. The zoo's models
stay below the bound (T5's largest tree: ~110 loads), so their code is
unchanged; the chain above reaches ~1,750 at 8 steps. With the bound, 12
chained steps of that MLP compile in 28 s, and 10 of the zoo's GPT-2 at the
base size (52 parameters) in 164 s (one step: 42 s; 272 s with a bound of
512, over 10 min without). Static layouts only: a shape-generic graph's
strides are expressions of its sizes.
"""
from __future__ import annotations

import torch
import torch.fx as fx

# Loader calls to compute one element of a value: above the zoo's largest
# (T5's ~110); a chain of doubling links is realized every ~5 links.
MAX_TRACED_LOADS = 128


def bound(graph: fx.Graph) -> int:
    """Realizes the inputs that take a pointwise value's tree over
    ``MAX_TRACED_LOADS``; returns how many (0: ``graph`` is unchanged)."""
    loads: dict[fx.Node, int] = {}  # a pointwise value's tree (buffers: absent, 0)
    realized = 0
    for node in list(graph.nodes):
        if not _inlined(node):
            continue
        reads = _reads(node)
        traced = 1 + sum(loads.get(r, 0) for r in reads)
        while traced > MAX_TRACED_LOADS:
            largest = max(reads, key=lambda r: loads.get(r, 0))
            views = _views_down_to_value(largest)
            source = views.pop() if views else largest
            if not loads.get(source) or not _realizable(source):
                break
            _realize(graph, source)
            loads[source] = 0
            for view in reversed(views):  # now index arithmetic over the buffer
                loads[view] = 1 + loads.get(view.args[0], 0)
            realized += 1
            traced = 1 + sum(loads.get(r, 0) for r in reads)
        loads[node] = traced
    return realized


def _inlined(node: fx.Node) -> bool:
    """A value Inductor computes in the kernels that read it: pointwise ops
    and views (index arithmetic over their input)."""
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
        (torch.Tag.pointwise in target.tags or target.is_view)


def _reads(node: fx.Node) -> list[fx.Node]:
    """``node``'s inputs, once per use."""
    reads: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), reads.append)
    return reads


def _views_down_to_value(node: fx.Node) -> list[fx.Node]:
    """The views from ``node`` down to the value they view, that value last
    (empty: ``node`` is no view). A view is not realized itself: its
    layout need not be a buffer's (an expanded one, Inductor refuses)."""
    chain = []
    while isinstance(node.target, torch._ops.OpOverload) and node.target.is_view:
        chain.append(node)
        node = node.args[0]
    return chain + [node] if chain else []


def _realizable(node: fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and all(isinstance(s, int) for s in (*value.shape, *value.stride()))


def _realize(graph: fx.Graph, node: fx.Node) -> None:
    """``node``'s users read a buffer of it, laid out as it is."""
    from torch._inductor import inductor_prims  # noqa: F401 - registers prims.inductor_force_stride_order
    value = node.meta["val"]
    with graph.inserting_after(node):
        stored = graph.call_function(torch.ops.prims.inductor_force_stride_order.default,
                                     (node, list(value.stride())))
    stored.meta["val"] = value
    node.replace_all_uses_with(stored, delete_user_cb=lambda user: user is not stored)
