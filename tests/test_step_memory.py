"""Step memory (runtime/step_memory.h): the large CPU buffers compiled groups
allocate are planned in one arena once a step repeats, or kept for the next
step's requests of the same size."""
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
    return s["step_memory_planned"], s["step_memory_hits"], s["step_memory_misses"]


def _reset_after_warmup(i):
    if i == 1:  # step 0 compiles, step 1 repeats it: planned from step 2 on
        metrics.reset()


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
def test_steady_steps_take_every_large_buffer_from_the_plan(lazy_level):
    eager = train(_make, sgd_momentum, _batches(), CPU)
    lazy = train(_make, sgd_momentum, _batches(), LAZY, after_step=_reset_after_warmup)
    s = metrics.snapshot()
    assert_same_training(eager, lazy)
    assert_compiled(s, calls=4)
    # at least 3 buffers of 64 KiB and up a step: activations and their
    # gradients (fc1's weight and momentum too, where not written in place)
    assert s["step_memory_planned"] >= 3 * 4, s
    assert (s["step_memory_hits"], s["step_memory_misses"]) == (0, 0), s
    stats = _C.step_memory_stats()
    # the arena: about the step's peak (buffers whose lifetimes do not overlap share bytes)
    assert 0 < stats["planned_bytes"] <= 1.25 * stats["last_step_peak_bytes"], stats
    assert stats["cached_bytes"] == 0, stats


def test_off_keeps_the_allocators_buffers():
    lazy_mlir.init("O1", step_memory=False)
    try:
        metrics.reset()
        train(_make, sgd_momentum, _batches(4), LAZY, after_step=_reset_after_warmup)
        s = metrics.snapshot()
        assert_compiled(s, calls=2)
        assert (s["step_memory_planned"], s["step_memory_hits"], s["step_memory_misses"]) == (0, 0, 0)
        assert _C.step_memory_stats()["cached_bytes"] == _C.step_memory_stats()["planned_bytes"] == 0
    finally:
        lazy_mlir.init("O1")


def _step(sizes_mib, keep=()):
    """One step of a group allocating ``sizes_mib`` (+4 KiB) in turn, each
    freed before the next is allocated unless its index is in ``keep``
    (returned: live past the step); their addresses."""
    kept, addresses = [], []
    with _C.StepMemoryScope():
        for i, size in enumerate(sizes_mib):
            t = torch.full((size * MIB + 4096,), i + 1, dtype=torch.uint8)
            addresses.append(t.data_ptr())
            if i in keep:
                kept.append(t)
            del t
    torch._lazy.mark_step()
    return addresses, kept


def test_a_repeating_step_is_planned_in_one_arena():
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    first, _ = _step([3, 2, 1])  # its own pages, unmapped when freed: nothing kept
    assert _C.step_memory_stats()["cached_bytes"] == 0
    before = _counts()
    second, _ = _step([3, 2, 1])  # the plan the first made
    planned, hits, misses = (a - b for a, b in zip(_counts(), before))
    assert (planned, hits, misses) == (3, 0, 0)
    stats = _C.step_memory_stats()
    # one at a time: all at offset 0 of an arena of the largest
    assert len(set(second)) == 1 and stats["planned_bytes"] == 3 * MIB + 4096
    third, _ = _step([3, 2, 1])
    assert third == second


def test_a_buffer_held_past_its_step_keeps_its_bytes():
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    for _ in range(2):
        _step([2, 2])
    addresses, kept = _step([2, 2], keep={0})  # planned: both at offset 0; the first one held
    assert addresses[0] != addresses[1]  # the second did not take the held one's bytes
    assert torch.all(kept[0] == 1)
    _step([2, 2])  # the step after: its first buffer cannot have those bytes either
    assert torch.all(kept[0] == 1)


def test_a_step_of_other_sizes_keeps_the_plan_and_takes_the_free_lists():
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    for _ in range(2):
        planned_at, _ = _step([3, 1])
    before = _counts()
    _step([5])  # an evaluation step between training steps
    planned, hits, misses = (a - b for a, b in zip(_counts(), before))
    assert (planned, misses) == (0, 1)
    again, _ = _step([3, 1])
    assert again == planned_at
    assert _counts()[0] - before[0] == 2


def _resident() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_steps_of_other_sizes_do_not_hold_the_arena_beside_their_buffers():
    """A step that strays from the plan gives back the arena's pages no
    buffer of it holds (a memory budget's switch to another graph held both:
    GPT-2-small's shape peaked 160 MiB over its steady steps), and its
    free-list blocks go at its end, so the step after does not hold both
    either. The plan stays: the step after that follows it again."""
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    for _ in range(3):
        planned_at, _ = _step([48])  # the plan's arena: 48 MiB, its pages resident between steps
    assert _C.step_memory_stats()["planned_bytes"] == 48 * MIB + 4096
    before = _resident()
    with _C.StepMemoryScope():
        t = torch.full((5 * MIB,), 1, dtype=torch.uint8)  # other sizes: the step strays
        during = _resident()
        del t
    torch._lazy.mark_step()
    assert during < before - 32 * MIB, (before, during)
    assert _C.step_memory_stats()["cached_bytes"] == 0
    again, _ = _step([48])
    assert again == planned_at and _C.step_memory_stats()["planned_bytes"] == 48 * MIB + 4096


def test_a_step_that_strays_keeps_the_plans_live_buffers_intact():
    """Giving the arena's pages back skips those of the plan's buffers still
    in use: a buffer taken from the plan before the step strayed keeps its
    bytes (a dropped page would read as zeros)."""
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()

    def step(stray_mib=None):
        with _C.StepMemoryScope():
            planned = torch.full((8 * MIB + 4096,), 7, dtype=torch.uint8)
            other = torch.full(((stray_mib or 4) * MIB + 4096,), 1, dtype=torch.uint8)
            intact = bool(torch.all(planned == 7)) and bool(torch.all(other == 1))
            del planned, other
        torch._lazy.mark_step()
        return intact

    for _ in range(3):
        assert step()
    assert step(stray_mib=5)  # the second buffer strays while the first is live
    assert step()


def test_steps_that_keep_straying_do_not_hold_the_arena_either():
    """A graph changed for good (a memory budget's switch): the second step
    that strays, which takes the plan's first buffer again before it strays,
    gives the arena's pages back too (no step that followed the plan came
    between: not steps taking turns)."""
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    for _ in range(3):
        _step([48, 8])  # both at the arena's offset 0: 48 MiB
    before = _resident()
    for _ in range(2):
        with _C.StepMemoryScope():
            t = torch.full((48 * MIB + 4096,), 1, dtype=torch.uint8)  # the plan's first buffer
            del t
            u = torch.full((5 * MIB,), 2, dtype=torch.uint8)  # other sizes: the step strays
            during = _resident()
            del u
        torch._lazy.mark_step()
        assert during < before - 32 * MIB, (before, during)


def test_steps_taking_turns_keep_the_arena_and_their_free_lists():
    """Steps that stray the same way each time (gradient accumulation's last
    micro-batch after the others) keep the arena's pages and their own
    free-list blocks from their second turn on: no page faults, every
    buffer from the plan or a free list."""
    lazy_mlir.init("O1")
    _C.release_step_memory()
    torch._lazy.mark_step()
    for _ in range(2):
        planned_at, _ = _step([3, 1])
    for _ in range(2):  # the first turns: the first gives its blocks back, the second keeps them
        _step([5])
        _step([3, 1])
    before = _counts()
    for _ in range(2):
        _step([5])
        again, _ = _step([3, 1])
    assert tuple(a - b for a, b in zip(_counts(), before)) == (4, 2, 0)  # planned, hits, misses
    assert again == planned_at


def _free_lists_only():
    """Steps whose sizes never repeat: planning stops, the free lists serve."""
    _C.release_step_memory()
    torch._lazy.mark_step()
    for k in range(5):
        _step([k + 20])
    assert _C.step_memory_stats()["planned_bytes"] == 0


def test_only_buffers_allocated_in_a_group_are_cached():
    lazy_mlir.init("O1")
    _free_lists_only()
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
    planned, hits, misses = _counts()
    assert (planned - before[0], hits - before[1], misses - before[2]) == (0, 1, 2)


def test_the_cache_stays_bounded_and_lets_idle_blocks_go():
    lazy_mlir.init("O1")
    _free_lists_only()
    for _ in range(17):  # the steps' blocks go idle
        with _C.StepMemoryScope():
            pass
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
