"""A line on stderr every half minute while a compile holds the step.

A cold compile of a whole training step takes tens of seconds, a large
model's minutes; between its "compiling" and "compiled" lines nothing else
shows that the process is working (``Config.progress``)."""
from __future__ import annotations

import contextlib
import sys
import threading
import time

EVERY_SECONDS = 30.0


@contextlib.contextmanager
def still_compiling(what: str, enabled: bool = True):
    """Prints "lazy_mlir: still compiling <what>: N s" every
    ``EVERY_SECONDS`` until the block ends."""
    if not enabled:
        yield
        return
    done = threading.Event()
    start = time.perf_counter()

    def remind() -> None:
        while not done.wait(EVERY_SECONDS):
            print(f"lazy_mlir: still compiling {what}: {time.perf_counter() - start:.0f} s", file=sys.stderr,
                  flush=True)

    reminder = threading.Thread(target=remind, name="lazy_mlir-progress", daemon=True)
    reminder.start()
    try:
        yield
    finally:
        done.set()
        reminder.join()
