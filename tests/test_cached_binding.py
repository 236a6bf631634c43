"""A cached graph runs with the parameter binding of the graph being run.

LTC looks computations up by the roots' tree hashes plus the order in which
the post-order first meets each parameter; device data hashes by shape alone.
Graphs that differ only in which parameter a later use reads collide: with
stock LTC the second graph below runs the first one's code and computes
x - y for sub(y, x), silently (parameter_binding.h). Each case runs the same
loop eagerly and on the lazy device and compares exactly. Shapes are this
file's own, per level: LTC caches compiled graphs by structure across tests.
"""
import pytest
import torch

import lazy_mlir
from lazy_mlir.observe import metrics

CPU = torch.device("cpu")
LAZY = torch.device("lazy")
LEVELS = ["O0", "O1"]


def shape(level, rows, cols):
    return (rows, cols + (0 if level == "O1" else 100))


def step_done(device):
    if device.type == "lazy":
        torch._lazy.mark_step()


def swapped_operands(device, size, steps=4):
    """Fresh `.to(device)` tensors alive at the sync: in stock LTC roots that
    fix the parameters' order whatever order the step reads them in; here
    they take their data before the sync (lazy_backend/ltc_fixes/pending_data.h)."""
    torch.manual_seed(0)
    x, y = torch.randn(size), torch.randn(size)
    out = []
    for i in range(steps):
        lx, ly = x.to(device), y.to(device)
        r = torch.sub(ly, lx) if i % 2 else torch.sub(lx, ly)
        step_done(device)
        out.append(r.cpu())
    return out


def swapped_pair_training(device, size, steps=6):
    """A training loop that swaps its pair's roles every other step (an
    augmentation): stock LTC trains on the unswapped pair from step 1 on."""
    torch.manual_seed(1)
    firsts = [torch.randn(size) for _ in range(steps)]
    seconds = [torch.randn(size) for _ in range(steps)]
    w = torch.linspace(0.5, 1.5, size[1]).expand(size).contiguous().to(device).requires_grad_()
    out = []
    for i in range(steps):
        a, b = firsts[i].to(device), seconds[i].to(device)
        if i % 2:
            a, b = b, a
        err = a * w - b
        err.backward(torch.ones_like(err))
        with torch.no_grad():
            w -= 0.125 * w.grad
        w.grad = None
        step_done(device)
        out.append(err.detach().cpu())
    return out + [w.detach().cpu()]


def alternating_direction(device, size, steps=4):
    """Device-resident operands: the first use fixes their order, the second
    reads them the other way round every other step."""
    torch.manual_seed(2)
    a, b = torch.randn(size).to(device), torch.randn(size).to(device)
    step_done(device)
    out = []
    for i in range(steps):
        s = a * b
        d = (a - b) if i % 2 == 0 else (b - a)
        step_done(device)
        out += [s.cpu(), d.cpu()]
    return out


def run(loop, level, size):
    lazy_mlir.init(level)
    try:
        before = metrics.snapshot()
        lazy = loop(LAZY, size)
        after = metrics.snapshot()
    finally:
        lazy_mlir.init("O1")
    if level == "O1":  # the rebound variants ran generated code, not TorchScript
        assert after["groups_fallen_back"] == before["groups_fallen_back"], after["groups_fallen_back"]
        calls = after["group_calls"] - before["group_calls"]
        assert after["compiled_group_calls"] - before["compiled_group_calls"] == calls > 0, metrics.report()
    eager = loop(CPU, size)
    assert len(lazy) == len(eager)
    for i, (got, want) in enumerate(zip(lazy, eager)):
        assert torch.equal(got, want), (level, i, got, want)
    return after["rebinds"] - before["rebinds"], after["compiles"] - before["compiles"]


@pytest.mark.parametrize("level", LEVELS)
def test_swapped_operands(level):
    rebinds, compiles = run(swapped_operands, level, shape(level, 3, 11))
    # the moved pair are no roots, so the post-order orders the parameters:
    # both directions are one graph (as roots: a second lowering, rebound)
    assert (rebinds, compiles) == (0, 1)


@pytest.mark.parametrize("level", LEVELS)
def test_swapped_pair_training(level):
    rebinds, _ = run(swapped_pair_training, level, shape(level, 5, 13))
    assert rebinds == 0  # as test_swapped_operands: the use order is the parameter order


@pytest.mark.parametrize("level", LEVELS)
def test_alternating_direction(level):
    rebinds, _ = run(alternating_direction, level, shape(level, 7, 17))
    assert rebinds == 1


@pytest.mark.parametrize("level", LEVELS)
def test_steady_state_lowers_once(level):
    """The same program on new data each step: one lowering, no rebinding."""
    size = shape(level, 9, 19)

    def loop(device):
        torch.manual_seed(3)
        out = []
        for _ in range(4):
            x, y = torch.randn(size).to(device), torch.randn(size).to(device)
            r = x * 2 - y
            step_done(device)
            out.append(r.cpu())
        return out

    assert run(lambda device, _size: loop(device), level, size) == (0, 1)
