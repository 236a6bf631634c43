"""IR reuse (``Config.reuse_ir``, lazy_backend/ltc_fixes/ir_reuse.h): a step that
traces last step's op sequence gets last step's IR nodes back instead of
building them, and computes exactly what eager PyTorch computes, including
the cases where stock LTC's reuse goes wrong. Shapes are this file's own:
LTC keeps compiled graphs across tests."""
from __future__ import annotations

import pytest
import torch

import lazy_mlir
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics

from helpers import operands_swapped

CPU = torch.device("cpu")
LAZY = torch.device("lazy")


@pytest.fixture
def reuse():
    lazy_mlir.init("O1", reuse_ir=True)
    metrics.reset()
    yield
    lazy_mlir.init("O1")


def _step_done(device):
    if device.type == "lazy":
        torch._lazy.mark_step()


def _train(device, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(11, 23), torch.nn.GELU(), torch.nn.Linear(23, 5)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, built = [], []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, labels = torch.randn(6, 11, generator=g).to(device), torch.randint(0, 5, (6,), generator=g).to(device)
        before = _C.nodes_built()
        # cross-entropy: its backward starts with nll_loss_backward (weight=None),
        # which LTC's reuse check never matched (lazy_kernels._register_explicit_weight)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        built.append(_C.nodes_built() - before)
        _step_done(device)
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], built


def test_training_reuses_the_trace_and_matches_eager(reuse):
    eager_losses, eager_params, _ = _train(CPU)
    losses, params, built = _train(LAZY)
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    for got, want in zip(params, eager_params):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # Steady-state steps build only what is never reused (scalar nodes):
    # a small fraction of the first step's nodes.
    assert built[0] > 50, built
    assert max(built[3:]) < built[0] / 4, built
    snap = metrics.snapshot()  # the steps ran generated code, not TorchScript
    assert snap["compiled_group_calls"] == snap["group_calls"] > 0 and snap["groups_fallen_back"] == {}, metrics.report()


def _operands_swapped(device):
    """Tensors that stay on the device, read the other way round every other
    step: LTC's reuse compares operands by hash, and device data hashed by
    shape alone handed b - a the node of a - b."""
    return operands_swapped(device, (5, 29))


def _read_only_then_fresh(device, size=(3, 31), steps=4):
    """A tensor only read keeps its device-data node as IR value; the next
    step then skips that node's place in the trie, where a fresh same-shaped
    input could take the node over and replace its data."""
    torch.manual_seed(3)
    frozen = torch.randn(size).to(device)
    out = []
    for i in range(steps):
        fresh = torch.full(size, float(i)).to(device)
        out.append((frozen * 2 + fresh).cpu())
        _step_done(device)
    return out


@pytest.mark.parametrize("loop", [_operands_swapped, _read_only_then_fresh])
def test_reused_nodes_read_the_right_tensors(reuse, loop):
    lazy = loop(LAZY)
    eager = loop(CPU)
    for i, (got, want) in enumerate(zip(lazy, eager)):
        assert torch.equal(got, want), (loop.__name__, i)


def test_the_trie_keeps_no_old_buffers_and_few_branches(reuse):
    """Steps alternating between sizes fork the trie: branches are pruned and
    device-data buffers only the trie holds are released."""
    w = torch.randn(37, 7).to(LAZY)
    before = _C.stats()
    for step in range(12):
        x = torch.randn(3 + step, 37).to(LAZY)
        (x @ w).sum().cpu()
        _step_done(LAZY)
    stats = {k: v - before[k] for k, v in _C.stats().items()}
    assert stats["trie_branches_pruned"] > 0, stats
    assert stats["trie_buffers_released"] > 0, stats
