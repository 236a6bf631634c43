"""The device-data node pool (lazy_backend/memory/device_data_pool.h, on by
default): a step gets back last step's device-data nodes, with its own data
put in, instead of building new ones; the values read are always the
tensors' own, and no buffer of a past step stays alive. Shapes are this
file's own: LTC keeps compiled graphs across tests."""
from __future__ import annotations

import os

import pytest
import torch

import lazy_mlir
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics

from helpers import assert_compiled, assert_same_training, operands_swapped, train

CPU = torch.device("cpu")
LAZY = torch.device("lazy")


@pytest.fixture
def o1():
    lazy_mlir.init("O1")
    metrics.reset()
    yield
    _C.set_device_data_pool(True)


def _step_done(device):
    if device.type == "lazy":
        torch._lazy.mark_step()


def _recycled() -> int:
    return dict(_C.stats())["device_data_recycled"]


def _train(device, steps=5):
    """helpers.train on an MLP of this file's shapes; also the IR nodes each
    step built (from the end of the last step to the end of this one)."""
    built, last = [], [_C.nodes_built()]

    def count(_):
        built.append(_C.nodes_built() - last[0])
        last[0] = _C.nodes_built()

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(13, 19), torch.nn.Tanh(), torch.nn.Linear(19, 3))

    batches = [(torch.randn(4, 13, generator=g), torch.randn(4, 3, generator=g))
               for g in (torch.Generator().manual_seed(step) for step in range(steps))]
    result = train(make_model, lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), batches, device,
                   loss_fn=lambda m, x, y: torch.nn.functional.mse_loss(m(x), y), after_step=count)
    return result, built


def test_training_recycles_the_device_data_nodes_and_matches_eager(o1):
    eager, _ = _train(CPU)
    _C.set_device_data_pool(False)
    _, built_without = _train(LAZY)
    _C.set_device_data_pool(True)
    recycled = _recycled()
    metrics.reset()
    lazy, built = _train(LAZY)
    assert_same_training(eager, lazy)
    # each step after the first reads the 4 parameters and 8 Adam states the
    # last one wrote, through recycled nodes
    assert _recycled() - recycled >= 12 * 3, _recycled() - recycled
    assert max(built[2:]) <= min(built_without[2:]) - 12, (built, built_without)
    assert_compiled()


def _operands_swapped(device):
    """Same-shaped tensors written and read the other way round every other
    step: the pool hands out nodes in request order, so b's node of the last
    step serves a now, and must read a."""
    return operands_swapped(device, (6, 27), written=True)


def _read_only_then_fresh(device, size=(4, 33), steps=4):
    """A tensor only read, beside same-shaped fresh inputs that come and go
    (read alone first at the first step, so that the slots' order changes
    after it): each same-shaped request may get another's node, and each
    must read its own tensor."""
    torch.manual_seed(3)
    frozen = torch.randn(size).to(device)
    out = []
    for i in range(steps):
        if i == 0:
            torch.neg(frozen)
        fresh = torch.full(size, float(i + 2)).to(device)
        out.append((frozen * fresh).cpu())
        _step_done(device)
    return out


def _pending_across_a_read(device, size=(3, 29), steps=4):
    """A value read mid-step (a partial sync) leaves other tensors pending on
    the step's nodes: those are held, and the nodes the read made free are
    recycled by the rest of the step."""
    torch.manual_seed(4)
    w = torch.randn(size).to(device)
    _step_done(device)
    out = []
    for _ in range(steps):
        kept = w * 3
        w.add_(0.25)
        total = (w * 2).sum().item()
        w.mul_(0.5)
        _step_done(device)
        out.append((kept.cpu(), total, w.cpu().clone()))  # clone: on the CPU, .cpu() is w itself
    return out


@pytest.mark.parametrize("loop", [_operands_swapped, _read_only_then_fresh, _pending_across_a_read])
def test_recycled_nodes_read_the_right_tensors(o1, loop):
    recycled = _recycled()
    lazy = loop(LAZY)
    assert _recycled() > recycled
    eager = loop(CPU)
    assert len(lazy) == len(eager)
    for i, (got, want) in enumerate(zip(lazy, eager)):  # a reduction's order may differ: float rounding only
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=f"{loop.__name__}, step {i}")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_loop_without_mark_step_keeps_no_old_inputs(o1):
    """A loop that only reads values with .cpu() never calls mark_step: each
    read's execution must free the pooled nodes' data, or every input of
    the loop would stay alive (64 MiB each here)."""
    size = (16 << 20,)
    weight = torch.ones(size).to(LAZY)
    (weight * torch.zeros(size).to(LAZY)).sum().cpu()  # compiled and cached before measuring
    before = _rss()
    for i in range(8):
        total = (weight * torch.full(size, float(i)).to(LAZY)).sum().cpu()
        assert total.item() == float(i) * size[0]
    assert _rss() - before < (192 << 20), (_rss() - before) >> 20


def test_no_buffer_of_a_past_step_stays_alive(o1):
    """After mark_step a pooled node that nothing holds lets go of its data:
    once the tensor is gone, so is every buffer it had (a 256 MiB tensor:
    glibc maps and unmaps each, so RSS shows it)."""
    size = (64 << 20,)

    def steps(t, n):
        for _ in range(n):
            t.add_(1.0)
            _step_done(LAZY)

    steps(torch.zeros(size).to(LAZY), 2)  # compiled and cached before measuring
    before = _rss()
    t = torch.zeros(size).to(LAZY)
    recycled = _recycled()
    steps(t, 3)
    assert _recycled() > recycled
    assert t[:3].cpu().tolist() == [3.0, 3.0, 3.0]
    del t
    _step_done(LAZY)
    assert _rss() - before < (128 << 20), (_rss() - before) >> 20


def test_last_steps_parameters_are_freed_at_mark_step(o1):
    """A step replaces its parameters' buffers with its results; the pooled
    nodes that read the old ones must let go of them at mark_step, not at
    the next step's trace: between steps (an evaluation, data loading) a
    64 MiB parameter must not be held twice. First seen: released at the
    end of the execution, when LTC's sync still held the nodes, they kept
    the data until the next trace (+100 MiB here)."""
    model = torch.nn.Linear(4096, 4096, bias=False).to(LAZY)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4096)

    def rss_between_steps(pool: bool) -> int:
        _C.set_device_data_pool(pool)
        for _ in range(3):
            model(x.to(LAZY)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _step_done(LAZY)
        return _rss()

    without_pool = rss_between_steps(False)
    recycled = _recycled()
    with_pool = rss_between_steps(True)
    assert _recycled() > recycled
    assert with_pool - without_pool < (32 << 20), (with_pool - without_pool) >> 20
