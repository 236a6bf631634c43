"""heap.give_back: the memory a compile freed goes back to the system."""
import sys

import pytest

from lazy_mlir.compile import heap


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._malloc_trim() is None, reason="glibc only")
def test_freed_heap_is_returned():
    held = [bytearray(100_000) for _ in range(600)]  # ~60 MB of heap chunks (below glibc's mmap threshold)
    for chunk in held:
        chunk[::4096] = b"\1" * len(chunk[::4096])  # touched: resident
    held.pop()  # the top chunk stays in use: glibc keeps the freed heap below it until trimmed
    keep = held.pop()
    del held
    before = _resident_mb()
    heap.give_back()
    assert _resident_mb() < before - 40, (before, _resident_mb())
    assert keep[0] == 1
