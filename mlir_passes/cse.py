"""MLIR's common subexpression elimination."""
from __future__ import annotations

import dataclasses

from .base import MlirPass
from .registry import register


@register
@dataclasses.dataclass(frozen=True)
class Cse(MlirPass):
    """MLIR's ``cse``: merges identical side-effect-free ops and erases unused
    ones. In the torch dialect that is constants and ``prim.ListConstruct``:
    torch-mlir does not mark ``torch.aten`` ops side-effect free, so two equal
    aten ops stay two ops. Guarantees valid IR, ATen ops untouched."""

    name = "cse"
