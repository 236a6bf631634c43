"""Keep tied parameters tied when a module moves to the lazy device.

``nn.Module.to("lazy")`` cannot swap tensor data in place (lazy and CPU
tensors are incompatible TensorImpls), so it wraps each converted tensor in
a new Parameter per module: GPT's ``wte``/``lm_head`` tie becomes two
parameters, the optimizer updates them separately and training silently
diverges from eager. We wrap ``nn.Module._apply`` so that after a conversion
every module slot that held the same tensor before holds the same one after.
"""
from __future__ import annotations

import threading

import torch.nn as nn

_original_apply = nn.Module._apply
_state = threading.local()


def _slots(module: nn.Module):
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for key, tensor in table.items():
                if tensor is not None:
                    yield table, key, tensor


def _apply_keeping_ties(self, fn, *args, **kwargs):
    if getattr(_state, "active", False):  # inner recursive call
        return _original_apply(self, fn, *args, **kwargs)
    before = list(_slots(self))
    _state.active = True
    try:
        result = _original_apply(self, fn, *args, **kwargs)
    finally:
        _state.active = False
    converted = {}  # id(old tensor) -> its converted tensor (first slot wins)
    for table, key, old in before:
        new = table[key]
        first = converted.setdefault(id(old), new)
        if first is not new:
            table[key] = first
    return result


def install() -> None:
    nn.Module._apply = _apply_keeping_ties
