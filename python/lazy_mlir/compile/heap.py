"""Giving the heap a compile freed back to the system.

A compile (a capture's tracing, the lowering, the worker's reply) frees
tens of MB that glibc keeps; the steady-state steps then grow the heap
around them, and the process's peak with it (GPT-mini captured, cold: 586
MB without, 559-573 with). ``malloc_trim`` once when a group gets new code
(compiled or loaded) returns those pages; per step it would cost page
faults (docs/performance.md). The step memory's cached buffers
(runtime/step_memory.h) go first: new code usually means new sizes.
"""
from __future__ import annotations

import ctypes
import functools

from ..native import _C


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries have none
    except (OSError, AttributeError):
        return None


def give_back() -> None:
    _C.release_step_memory()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
