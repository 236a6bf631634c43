"""Lowering bridges of a fusion group: TorchScript -> FX (``ts_to_fx``), FX -> torch
dialect (``import_graph``, for the MLIR passes), and torch dialect -> ATen FX with
fake-tensor meta (``export_graph``, for codegen)."""
from .fx_to_mlir import import_graph
from .mlir_to_fx import ExportError, export_graph

__all__ = ["import_graph", "export_graph", "ExportError"]
