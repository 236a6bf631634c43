"""lazy_mlir: train on ``torch.device("lazy")``, compiled through MLIR.

    import lazy_mlir, torch
    lazy_mlir.init()                      # level="O1" by default
    model = Model().to("lazy"); opt = torch.optim.AdamW(model.parameters())
    # the first step traces the steady-state graph (auto_prepare; or lazy_mlir.prepare(model, opt))
    lazy_mlir.capture(model)              # optional: forward and backward recorded once, replayed each step
    for x, y in data:
        loss = model(x.to("lazy"), y.to("lazy")); loss.backward()
        opt.step(); opt.zero_grad()
        torch._lazy.mark_step()
"""
from __future__ import annotations

import torch  # noqa: F401 - loads libtorch before our extension

from . import config
from .backend import init, wait_for_compiles
from .cluster import compilable  # compilable.allow(op) / deny(op): the user's say on what compiles
from .observe import memory, metrics
from .trace.capture import capture
from .trace.steady_state import prepare

__all__ = ["init", "prepare", "capture", "wait_for_compiles", "metrics", "memory", "config", "compilable", "zero"]


def __getattr__(name: str):
    """``lazy_mlir.zero`` without a second import, as the README shows; imported
    on first use (it loads torch.distributed and MLIR's libraries)."""
    if name == "zero":
        import importlib
        return importlib.import_module(".zero", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
