"""MLIR passes of lazy_mlir (shipped as lazy_mlir.passes)."""
