"""A step that fails must not fail the next one.

When a graph execution raises, LTC both throws from ``mark_step`` and stores
the exception in the device lock, which rethrows it at the next lock: the
next ``mark_step`` or value read fails with the old error. After
``mark_step`` has raised it, ``wait_device_ops`` takes the stored copy.
(With LTC's thread pool, ``mark_step`` does not raise: the stored copy is the
only report and stays.) A warning that an earlier read's execution raised
as an error (syncs._warn_in_execution) is raised first, before the sync.
"""
from __future__ import annotations

import functools

import torch._lazy

from ..observe import syncs


def install() -> None:
    if getattr(torch._lazy.mark_step, "_lazy_mlir_wrapped", False):
        return
    original = torch._lazy.mark_step

    @functools.wraps(original)
    def mark_step(*args, **kwargs):
        syncs.raise_deferred()  # a warning an earlier read raised as an error, inside its execution
        try:
            return original(*args, **kwargs)
        except Exception:
            try:
                torch._lazy.wait_device_ops()  # rethrows and clears the stored copy
            except Exception:  # noqa: BLE001 - the same error, already being raised
                pass
            raise

    mark_step._lazy_mlir_wrapped = True
    torch._lazy.mark_step = mark_step
