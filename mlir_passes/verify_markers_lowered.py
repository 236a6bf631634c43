"""Checks that no lazy_mlir marker op is left for code generation."""
from __future__ import annotations

import dataclasses

from .base import Pass
from .registry import register
from .torch_ir import op_error, op_name, ops_of

MARKER_PREFIX = "torch.lazy_mlir."


@register
@dataclasses.dataclass(frozen=True)
class VerifyMarkersLowered(Pass):
    """Raises, naming the op, if a ``torch.lazy_mlir.*`` marker (lazy_mlir.zero's
    ``unshard``/``reduce_grad``) survived the pipeline: a pipeline without the
    zero passes would otherwise export the marker's eager kernel into the
    generated code, a collective per call outside the schedule. The group
    compiler runs it after every pipeline. Changes nothing."""

    name = "verify-markers-lowered"

    def apply(self, module) -> None:
        for op in ops_of(module):
            if (op_name(op) or "").startswith(MARKER_PREFIX):
                raise op_error(self.name, op, "lazy_mlir marker left after the pipeline; "
                                              "the zero passes (lazy_mlir.zero.initialize's pipeline) lower it")
