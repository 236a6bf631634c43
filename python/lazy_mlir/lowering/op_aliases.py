"""Identifier-named stand-ins for ATen overloads whose name is a Python keyword.

FX and Inductor name a call in generated Python as
``torch.ops.<ns>.<op>.<overload>``: ``aten::random.from`` becomes
``torch.ops.aten.random.from``, a syntax error (pytorch issue 151432).
``alias_of`` gives such an overload a stand-in
``lazy_mlir_alias::<op>_<overload>`` with the same schema whose kernel calls the
ATen overload (same results, same RNG stream), so every stage after the
TorchScript graph can name it. Its own namespace: ``lazy_mlir::`` ops are
markers the MLIR passes must lower.
"""
from __future__ import annotations

import keyword

import torch

_LIB = torch.library.Library("lazy_mlir_alias", "DEF")
_aliases: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}


def needs_alias(op: torch._ops.OpOverload) -> bool:
    name, overload = op._schema.name.split("::")[1], op._overloadname
    return keyword.iskeyword(overload) or keyword.iskeyword(name) or not name.isidentifier()


def alias_of(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """``op`` itself, or its identifier-named stand-in."""
    if not needs_alias(op):
        return op
    if op not in _aliases:
        _aliases[op] = _define(op)
    return _aliases[op]


def _define(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    name = op.__name__.replace(".", "_")
    schema = str(op._schema)
    _LIB.define(name + schema[schema.index("("):])

    def kernel(*args, **kwargs):
        return op(*args, **kwargs)

    # CompositeExplicitAutograd covers CPU, CUDA and Meta (fake tensors) alike.
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    return getattr(torch.ops.lazy_mlir_alias, name).default
