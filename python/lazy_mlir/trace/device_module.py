"""``torch.lazy``: the lazy device's module, as ``torch.cuda`` is CUDA's, for
code that looks a device's module up by its type.

``torch.utils.checkpoint`` (activation checkpointing; transformers'
``gradient_checkpointing_enable``) and ``torch.random.fork_rng`` do: without
one, checkpointing a lazy model failed with "module 'torch' has no
attribute 'lazy'". They save the device's random state before the forward
and set it back before running that forward again in the backward, so
that its dropout masks are the forward's. A lazy draw takes its numbers
when its graph runs, so the state here is a position in the step's stream
of traced draws (``lazy_backend/ltc_fixes/draw_stream.h``): set back, the next draws
are the ones already traced from there (the same values, not new draws).
Only the step's own draws can be replayed: a state from an earlier step
raises.
"""
from __future__ import annotations

import sys

import torch
import torch._lazy

from ..native import _C

_initialized = True  # torch.utils.checkpoint saves the random state of initialised devices only


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def synchronize(device=None) -> None:
    """Waits for the graphs already running (as torch.cuda.synchronize)."""
    torch._lazy.wait_device_ops()


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


class device:
    """``with torch.lazy.device(i)``: the lazy device is one device."""

    def __init__(self, index=None):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def get_rng_state(device="lazy") -> torch.Tensor:
    """The step and the position of its next draw, as an int64 tensor."""
    return torch.tensor(_C.draw_position(), dtype=torch.int64)


def set_rng_state(new_state: torch.Tensor, device="lazy") -> None:
    """The next draws are the step's draws from ``new_state``'s position on."""
    step, position = (int(v) for v in new_state.tolist())
    _C.set_draw_position(step, position)


def install() -> None:
    """Registers this module as ``torch.lazy`` (once per process)."""
    if getattr(torch, "lazy", None) is None:
        torch._register_device_module("lazy", sys.modules[__name__])

def backing_device() -> str | None:
    """"cpu" or "cuda" behind the lazy device; None before any backend exists."""
    try:
        return torch._C._lazy._get_default_device_type().lower()
    except RuntimeError:  # "Lazy tensor backend not registered."
        return None
