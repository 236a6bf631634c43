"""Lowering: one fusion group from TorchScript to code, stage by stage.

``group_lowering`` runs the stages: TorchScript -> FX (``ts_to_fx``), FX ->
torch dialect (``fx_to_mlir``), the MLIR passes (``mlir_passes``), torch
dialect -> ATen FX with fake-tensor meta (``mlir_to_fx``), then a code
generator (``codegen``). ``lowered_group`` is what a compile gives,
``portable_graph`` the exported graph as bytes (cache entries, compile
workers). The optimizer and GradScaler ops' definitions and expansions live
here too (``fused_optimizer``, ``grad_scaler``).
May import: codegen, cluster, observe, config. The entry points below
import ``group_lowering`` (MLIR, Inductor, fake tensors) at their first call.
"""
from __future__ import annotations

from typing import Callable


def lowering_function(name: str) -> Callable:
    """``group_lowering.<name>``, imported at its first call: a process whose
    groups all come from the cache as native code never loads MLIR or the
    lowering's fake tensors. A module attribute, so tests can replace it."""
    def call(*args, **kwargs):
        from . import group_lowering
        return getattr(group_lowering, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call
