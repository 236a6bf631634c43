"""Step memory (runtime/step_memory.h): the large CPU buffers compiled groups
allocate are kept for the next step's requests of the same size."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics

from helpers import CPU, LAZY, assert_compiled, assert_same_training, sgd_momentum, train

MIB = 1 << 20


class WideMLP(nn.Module):
    """Activations of 128 x 512 floats (256 KiB): above the cache's 64 KiB."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(256, 512), nn.Linear(512, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(torch.relu(self.fc1(x))), y)


def _make():
    torch.manual_seed(0)
    return WideMLP()


def _batches(steps=6):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(128, 256, generator=g), torch.randint(0, 10, (128,), generator=g)) for _ in range(steps)]


def _counts():
    s = _C.stats()
    return s["step_memory_hits"], s["step_memory_misses"]


def _reset_after_warmup(i):
    if i == 1:  # steps 0-1 compile (and the first steady step allocates its buffers once)
        metrics.reset()


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
def test_steady_steps_take_every_large_buffer_from_the_last_step(lazy_level):
    eager = train(_make, sgd_momentum, _batches(), CPU)
    lazy = train(_make, sgd_momentum, _batches(), LAZY, after_step=_reset_after_warmup)
    s = metrics.snapshot()
    assert_same_training(eager, lazy)
    assert_compiled(s, calls=4)
    # at least 3 buffers of 64 KiB and up a step: activations and their
    # gradients (fc1's weight and momentum too, where not written in place)
    assert s["step_memory_hits"] >= 3 * 4, s
    assert s["step_memory_misses"] == 0, s


def test_off_keeps_the_allocators_buffers():
    lazy_mlir.init("O1", step_memory=False)
    try:
        metrics.reset()
        train(_make, sgd_momentum, _batches(4), LAZY, after_step=_reset_after_warmup)
        s = metrics.snapshot()
        assert_compiled(s, calls=2)
        assert (s["step_memory_hits"], s["step_memory_misses"]) == (0, 0)
        assert _C.step_memory_stats()["cached_bytes"] == 0
    finally:
        lazy_mlir.init("O1")


def test_only_buffers_allocated_in_a_group_are_cached():
    lazy_mlir.init("O1")
    before = _counts()
    outside = torch.empty(3 * MIB + 4096, dtype=torch.uint8)
    del outside
    small = None
    with _C.StepMemoryScope():
        small = torch.empty(1000, dtype=torch.uint8)  # below 64 KiB: the allocator's
    del small
    assert _counts() == before  # neither asked the cache

    with _C.StepMemoryScope():
        first = torch.empty(3 * MIB + 4096, dtype=torch.uint8)
    address = first.data_ptr()
    del first  # freed outside the scope: cached all the same
    with _C.StepMemoryScope():
        again = torch.empty(3 * MIB + 4096, dtype=torch.uint8)
        other = torch.empty(3 * MIB + 8192, dtype=torch.uint8)  # another size: not that block
    assert again.data_ptr() == address and other.data_ptr() != address
    hits, misses = _counts()
    assert (hits - before[0], misses - before[1]) == (1, 2)


def test_the_cache_stays_bounded_and_lets_idle_blocks_go():
    lazy_mlir.init("O1")
    _C.release_step_memory()
    assert _C.step_memory_stats()["cached_bytes"] == 0
    with _C.StepMemoryScope():
        held = [torch.empty((k + 1) * MIB, dtype=torch.uint8) for k in range(4)]  # 10 MiB live at once
    del held
    s = _C.step_memory_stats()
    assert s["cached_bytes"] == 10 * MIB and s["peak_bytes"] >= 10 * MIB
    with _C.StepMemoryScope():  # sizes nobody freed: misses, under twice the peak
        fresh = [torch.empty((k + 5) * MIB + 4096, dtype=torch.uint8) for k in range(4)]
        s = _C.step_memory_stats()
        assert s["live_bytes"] + s["cached_bytes"] <= 2 * s["peak_bytes"]
    del fresh
    evicted = _C.stats()["step_memory_evicted"]
    for _ in range(17):  # group calls that ask for none of them
        with _C.StepMemoryScope():
            pass
    assert _C.step_memory_stats()["cached_bytes"] == 0
    assert _C.stats()["step_memory_evicted"] > evicted

    with _C.StepMemoryScope():
        kept = torch.empty(2 * MIB, dtype=torch.uint8)
    del kept
    assert _C.step_memory_stats()["cached_bytes"] == 2 * MIB
    _C.release_step_memory()  # what heap.give_back does when a group gets new code
    assert _C.step_memory_stats()["cached_bytes"] == 0


def test_onednn_convolutions_allocate_through_it():
    """ideep takes its buffers with raw_allocate, which wants the block to be
    its own context."""
    lazy_mlir.init("O1")
    torch.manual_seed(4)
    x, w = torch.randn(8, 16, 64, 64), torch.randn(32, 16, 3, 3)
    expected = F.conv2d(x, w, padding=1)
    for _ in range(2):
        with _C.StepMemoryScope():
            got = F.conv2d(x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last),
                           padding=1)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        del got
