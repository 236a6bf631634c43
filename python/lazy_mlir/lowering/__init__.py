"""Lowering bridges of a fusion group: TorchScript -> FX (``ts_to_fx``), FX -> torch
dialect (``import_graph``, for the MLIR passes), and torch dialect -> ATen FX with
fake-tensor meta (``export_graph``, for codegen)."""
__all__ = ["import_graph", "export_graph", "ExportError"]


def __getattr__(name: str):
    """The bridges import torch-mlir (and through it sympy): only when one is
    used, not when ``lowering.fused_optimizer``, which the optimizer hooks
    need, is imported."""
    if name == "import_graph":
        from .fx_to_mlir import import_graph
        return import_graph
    if name in ("export_graph", "ExportError"):
        from . import mlir_to_fx
        return getattr(mlir_to_fx, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
