"""Functionalized copy variants of view ops -> the view ops themselves."""
from __future__ import annotations

import dataclasses

from .base import Pass
from .registry import register
from .torch_ir import aten_name, create_aten, op_error, ops_of, replace_op, tensor_info

# Copy variant -> view op taking the same operands (checked against the
# torch.ops.aten schemas by tests/mlir/test_aten_schemas.py).
VIEW_OF_COPY = {
    "t_copy": "t",
    # reshape, not view: aten.view needs viewable strides when Inductor
    # leaves it to an eager fallback; on value semantics both mean the same.
    "view_copy": "reshape",
    "_unsafe_view": "reshape",
    "view_copy.dtype": "view.dtype",
    "permute_copy": "permute",
    "transpose_copy.int": "transpose.int",
    "expand_copy": "expand",
    "select_copy.int": "select.int",
    "slice_copy.Tensor": "slice.Tensor",
    "diagonal_copy": "diagonal",
    "unsqueeze_copy": "unsqueeze",
    "squeeze_copy": "squeeze",
    "squeeze_copy.dim": "squeeze.dim",
    "squeeze_copy.dims": "squeeze.dims",
    "split_copy.Tensor": "split.Tensor",
    "split_with_sizes_copy": "split_with_sizes",
    "unbind_copy.int": "unbind.int",
}
# Ops whose result equals their operand on value semantics.
IDENTITIES = {"detach_copy", "alias_copy", "detach", "alias"}


@register
@dataclasses.dataclass(frozen=True)
class FoldCopyOps(Pass):
    """Replaces the ``*_copy`` ops of functionalized graphs (LTC, AOT) by
    their view forms (``t_copy`` -> ``t``, ``view_copy`` -> ``reshape``, ...,
    see VIEW_OF_COPY), with the same operands and result types, and deletes
    ``detach_copy``/``alias_copy``/``detach``/``alias``, using their operand
    instead (left alone if the types differ). Assumes value semantics: the
    rewritten ops must have only ``!torch.vtensor`` operands and results,
    else it raises, naming the op. Guarantees that every op it emits is an
    ATen overload with its schema's operands (so Inductor can take views,
    not full copies), and that results and their types are unchanged."""

    name = "fold-copy-ops"

    def apply(self, module) -> None:
        for op in ops_of(module):
            op_name = aten_name(op)
            if op_name not in VIEW_OF_COPY and op_name not in IDENTITIES:
                continue
            self._check_value_semantics(op)
            if op_name in IDENTITIES:
                source = op.operation.operands[0]
                if source.type == op.operation.results[0].type:
                    replace_op(op, [source])
                continue
            results = op.operation.results
            view = create_aten(VIEW_OF_COPY[op_name], list(op.operation.operands), [r.type for r in results], op)
            replace_op(op, view.results)

    def _check_value_semantics(self, op) -> None:
        for value in [*op.operation.operands, *op.operation.results]:
            info = tensor_info(value)
            if info is not None and not info.value_semantics:
                raise op_error(self.name, op, f"expects value semantics (!torch.vtensor) but has {value.type}; "
                                              "run it on functional IR as FxImporter produces")
