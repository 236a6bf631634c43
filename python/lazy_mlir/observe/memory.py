"""Where a training process's memory is: ``lazy_mlir.memory.report(model,
optimizer)`` after a ``mark_step``.

The parts (bytes): what the model and optimizer hold (parameters, their
gradients, the optimizer's state, each storage counted once: a tied
weight is one); the last step's own buffers at their peak (the compiled
groups' allocations of 64 KiB and more live at once above those live when
the step began: activations kept for the backward and temporaries,
runtime/step_memory.h) and those the step memory keeps between steps for
the next; glibc's heap (in use, and free but not
given back: the allocator's slack); the process's resident size now and at
its peak. What is in use beyond the parts above is the rest of the process
(libraries, Python objects, small tensors).

On a GPU backend the tensors' bytes are the device's and the heap figures
the host's.
"""
from __future__ import annotations

import ctypes
import gc
import resource

import torch

from ..native import _C
from . import metrics

MIB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap() -> tuple[int, int]:
    """(in use, free and kept) bytes of glibc's malloc; (0, 0) without mallinfo2."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return 0, 0
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def _resident() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _peak_resident() -> int:
    """The process's peak resident size: a memory budget's measurements
    reset the kernel's high-water mark, and keep the run's."""
    rusage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return max(rusage, metrics.snapshot_memory_budget().get("run_peak_bytes", 0))


def _bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each counted once."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = _C.device_data_ptr(t) if t.device.type == "lazy" else t.untyped_storage().data_ptr()
        key = key or id(t)  # pending (no buffer yet): its own
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def snapshot(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """The parts, in bytes (see the module doc)."""
    gc.collect()
    params = list(model.parameters()) if model is not None else []
    state = [t for s in optimizer.state.values() for t in s.values()] if optimizer is not None else []
    step = _C.step_memory_stats()
    in_use, free = _heap()
    return {
        "parameters": _bytes(params),
        "gradients": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state": _bytes(state),
        "step_buffers_peak": step["last_step_peak_bytes"],
        "step_buffers_kept": step["cached_bytes"] + step["planned_bytes"],
        "heap_in_use": in_use + step["mapped_bytes"],  # what the step memory maps itself too
        "heap_free_kept": free,
        "resident": _resident(),
        "peak_resident": _peak_resident(),
    }


def report(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> str:
    s = snapshot(model, optimizer)
    held = s["parameters"] + s["gradients"] + s["optimizer_state"]
    rest = s["heap_in_use"] - held - s["step_buffers_kept"]
    rows = [("parameters", s["parameters"]), ("gradients", s["gradients"]),
            ("optimizer state", s["optimizer_state"]),
            ("last step's buffers, peak", s["step_buffers_peak"]),
            ("  kept for the next step", s["step_buffers_kept"]),
            ("rest of the heap in use", rest), ("heap free, not given back", s["heap_free_kept"]),
            ("resident now", s["resident"]), ("resident at the peak", s["peak_resident"])]
    return "\n".join(["lazy_mlir memory (MiB)"] + [f"  {name:<28}{value / MIB:10.1f}" for name, value in rows])
