"""MLIR passes of lazy_mlir: one file per pass, named after its pipeline flag
(``fold_copy_ops.py`` for ``fold-copy-ops``), a registry and a pipeline
builder. Shipped as its own top-level package beside ``lazy_mlir``.

    import mlir_passes
    mlir_passes.run_pipeline(module, mlir_passes.DEFAULT_PIPELINE)
"""
import importlib

# What the compiler runs on every imported group. cse merges the constants
# the rewrites add. canonicalize is left out: it folds constant-shaped
# aten.zeros/ones into torch.vtensor.literal, which has no ATen op to export
# to FX (tests/mlir/canonicalize.mlir).
DEFAULT_PIPELINE = "fold-copy-ops,scalar-implicit-to-tensor,specialize-scalars,cse"

__all__ = ["DEFAULT_PIPELINE", "Pass", "PassError", "PipelineError", "available_passes", "get_pass",
           "parse_pipeline", "pipeline_id", "register", "run_pipeline"]

# Where each name lives: importing them loads MLIR's libraries (~40 MB), which
# the package import leaves to their first use (DEFAULT_PIPELINE needs none).
_HOMES = {"Pass": "base", "PassError": "base", "PipelineError": "base", "parse_pipeline": "pipeline",
          "pipeline_id": "pipeline", "run_pipeline": "pipeline", "available_passes": "registry",
          "get_pass": "registry", "register": "registry"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
