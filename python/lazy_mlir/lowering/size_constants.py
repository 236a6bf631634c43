"""Size constants of a TorchScript graph: where LTC bakes sizes into a
graph. Kept apart from ts_to_fx (fake tensors, sympy) because cache keys
read them in every process, the lean training process included."""
from __future__ import annotations

import torch


def is_size_constant(value) -> bool:
    """An int, int list or 0-d integer tensor constant: where LTC bakes sizes
    into a graph (the tensor form feeds ``IntImplicit``, e.g. GPT-2's
    position ids)."""
    if isinstance(value, list):
        return bool(value) and all(type(v) is int for v in value)
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and value.dtype in (torch.int64, torch.int32)
    return type(value) is int


def size_constant_nodes(graph: torch._C.Graph) -> list[torch._C.Node]:
    """Every size constant's node, in node order: the ordinals
    ``ts_graph_to_fx``'s ``size_exprs`` refer to."""
    return [n for n in graph.nodes() if n.kind() == "prim::Constant" and is_size_constant(n.output().toIValue())]


def size_constants(graph: torch._C.Graph) -> list:
    """The value of every size constant of ``graph`` (a 0-d tensor's as an
    int), in ``size_constant_nodes``'s order."""
    values = (n.output().toIValue() for n in size_constant_nodes(graph))
    return [int(v) if isinstance(v, torch.Tensor) else v for v in values]
