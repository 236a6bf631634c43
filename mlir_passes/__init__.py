"""MLIR passes of lazy_mlir: one file per pass, named after its pipeline flag
(``fold_copy_ops.py`` for ``fold-copy-ops``), a registry and a pipeline
builder. Shipped as its own top-level package beside ``lazy_mlir``.

    import mlir_passes
    mlir_passes.run_pipeline(module, mlir_passes.DEFAULT_PIPELINE)
"""
from .base import Pass, PassError, PipelineError
from .pipeline import parse_pipeline, pipeline_id, run_pipeline
from .registry import available_passes, get_pass, register

# What the compiler runs on every imported group. cse merges the constants
# the rewrites add. canonicalize is left out: it folds constant-shaped
# aten.zeros/ones into torch.vtensor.literal, which has no ATen op to export
# to FX (tests/mlir/canonicalize.mlir).
DEFAULT_PIPELINE = "fold-copy-ops,scalar-implicit-to-tensor,specialize-scalars,cse"

__all__ = ["DEFAULT_PIPELINE", "Pass", "PassError", "PipelineError", "available_passes", "get_pass",
           "parse_pipeline", "pipeline_id", "register", "run_pipeline"]
