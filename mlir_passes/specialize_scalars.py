"""Runtime scalars that no rewrite could keep as tensors -> guarded constants."""
from __future__ import annotations

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from .base import Pass
from .registry import register
from .torch_ir import ATEN, ops_of

VALUE_ATTR = "lazy_mlir.value"          # set by the importer: the argument's value at compile time
SPECIALIZED_ATTR = "lazy_mlir.specialized"  # set here: the code depends on that value


@register
@dataclasses.dataclass(frozen=True)
class SpecializeScalars(Pass):
    """Replaces each ``torch.aten.ScalarImplicit %argN`` still left (its
    consumer has no tensor form, e.g. ``threshold_backward``'s threshold) by a
    ``torch.constant.float``/``int`` of the value the argument carries in its
    ``lazy_mlir.value`` attribute, and marks that argument
    ``lazy_mlir.specialized``: the caller must check the value at every run
    and recompile when it changes. Runs after ``scalar-implicit-to-tensor``,
    so values that change every step (learning rates) never get here.
    Arguments without ``lazy_mlir.value`` are left alone. Guarantees: no
    ScalarImplicit of such an argument remains."""

    name = "specialize-scalars"

    def apply(self, module) -> None:
        for op in ops_of(module):
            if op.operation.name == "func.func":
                self._specialize(op.operation.opview)

    def _specialize(self, func) -> None:
        if "arg_attrs" not in func.attributes:
            return
        arg_attrs = list(ir.ArrayAttr(func.attributes["arg_attrs"]))
        changed = False
        for index, arg in enumerate(func.arguments):
            attrs = ir.DictAttr(arg_attrs[index])
            if VALUE_ATTR not in attrs:
                continue
            users = [u.owner for u in arg.uses if u.owner.name == ATEN + "ScalarImplicit"]
            for user in users:
                value = attrs[VALUE_ATTR]
                with ir.InsertionPoint(user), user.location:
                    if isinstance(value, ir.FloatAttr):
                        constant = torch_d.ConstantFloatOp(ir.FloatAttr(value)).result
                    else:
                        constant = torch_d.ConstantIntOp(ir.IntegerAttr(value)).result
                user.results[0].replace_all_uses_with(constant)
                user.erase()
            if users:
                entries = {a.name: a.attr for a in attrs}
                entries[SPECIALIZED_ATTR] = ir.UnitAttr.get(func.context)
                arg_attrs[index] = ir.DictAttr.get(entries, func.context)
                changed = True
        if changed:
            func.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_attrs, func.context)
