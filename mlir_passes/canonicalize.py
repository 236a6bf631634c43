"""MLIR's canonicalizer, with torch-mlir's folders and patterns."""
from __future__ import annotations

import dataclasses

from .base import MlirPass
from .registry import register


@register
@dataclasses.dataclass(frozen=True)
class Canonicalize(MlirPass):
    """MLIR's ``canonicalize`` with torch-mlir's folders and canonicalization
    patterns: merges equal constants, erases unused pure ops and folds no-op
    aten ops into their operand (reshape/expand/permute to the same shape,
    clone, same-dtype ``to.dtype``, full slices, ``alias``). Guarantees valid
    IR, but NOT a 1:1 image of ATen: it also folds constant-shaped
    ``aten.zeros``/``aten.ones`` into ``torch.vtensor.literal``, which has no
    ATen op (tests/mlir/canonicalize.mlir), so it is kept out of the default
    pipeline that feeds the FX export."""

    name = "canonicalize"
    max_iterations: int = 10
    top_down: bool = True
