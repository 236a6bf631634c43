"""Make the first training step trace the graph of every later step, so a
step compiles once instead of twice.

LTC traces the first step differently from the next for two reasons:
1. A parameter just moved to the lazy device enters the trace as one
   device-data node; once a step has updated it in place, LTC reads it
   through two (forward's and the update's), with other view ops around.
2. The optimizer creates its state (``zeros_like(p)``) inside the first
   step's graph; later steps read that state as device data.
``prepare(model, optimizer)`` updates every parameter in place once (``mul_(1)``,
exact) and runs that small graph, and makes the optimizer's first step
create zero-filled state as device data. Optimizers whose first step is
different math (SGD's momentum buffer starts as a copy of the gradient)
still trace a second graph after the first step.
"""
from __future__ import annotations

import functools

import torch


def prepare(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Call once after moving ``model`` to the lazy device (and creating its
    optimizer), before the first step. Runs one small graph (a mark_step)."""
    params = [p for p in model.parameters() if p.device.type == "lazy"]
    if not params:
        raise ValueError("lazy_mlir.prepare: the model has no parameter on the lazy device; "
                         "call it after model.to('lazy')")
    with torch.no_grad():
        for p in params:
            p.mul_(1)
    torch._lazy.mark_step()
    if optimizer is not None:
        _first_step_state_as_data(optimizer)


def _first_step_state_as_data(optimizer: torch.optim.Optimizer) -> None:
    """Until the optimizer has stepped once, its step() runs under
    _StateAsDeviceData (the instance's step, not the class's)."""
    step = optimizer.step

    @functools.wraps(step)
    def first_step(*args, **kwargs):
        with _StateAsDeviceData():
            result = step(*args, **kwargs)
        if optimizer.state:  # state created: later steps are the steady ones
            del optimizer.step
        return result

    optimizer.step = first_step


def _fill_value(func, args, kwargs):
    if func is torch.zeros_like:
        return 0
    if func is torch.ones_like:
        return 1
    return args[1] if len(args) > 1 else kwargs["fill_value"]  # full_like


class _StateAsDeviceData(torch.overrides.TorchFunctionMode):
    """Tensors that an optimizer creates like a lazy parameter (zeros_like,
    ones_like, full_like) are made on the CPU and moved: device data, as its
    state is in every later step, instead of a constant in the graph."""

    _CREATORS = (torch.zeros_like, torch.ones_like, torch.full_like)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._CREATORS:
            like = args[0]
            device = torch.device(kwargs.get("device") or like.device)
            if device.type == "lazy":
                value = torch.full(like.shape, _fill_value(func, args, kwargs), dtype=kwargs.get("dtype") or like.dtype)
                return value.to(device).requires_grad_(bool(kwargs.get("requires_grad", False)))
        return func(*args, **kwargs)
