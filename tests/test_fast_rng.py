"""Config.fast_rng: random draws made by the generated code (as torch.compile
makes them) instead of by aten's kernels in the TorchScript glue. The masks
are then not eager's, so these tests check what must still hold: the draws
run in the group, differ from step to step, repeat under torch.manual_seed,
keep their probability, and the backward uses the forward's mask."""
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics
from helpers import LAZY, assert_compiled

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))


@pytest.fixture
def fast_rng(lazy_level):
    lazy_mlir.init(lazy_level, fast_rng=True)
    metrics.reset()
    yield
    lazy_mlir.init(lazy_level)


def _one_group_per_graph(s: dict) -> None:
    """Each graph ran one compiled group: a draw left in the glue would split it."""
    assert_compiled(s)
    assert s["groups_per_graph"] and set(s["groups_per_graph"].values()) == {1}, metrics.report()


class Noisy(nn.Module):
    """Every kind of draw a training step makes: dropout, a stochastic-depth
    gate (rand), a Bernoulli mask of a tensor of probabilities, noise."""

    def __init__(self, width=40):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = F.dropout(torch.relu(self.fc1(x)), 0.25, self.training)
        h = h * (torch.rand(x.shape[0], 1, device=x.device) + 0.75).floor() / 0.75
        h = h * torch.bernoulli(torch.full_like(h, 0.9)) + 0.01 * torch.randn_like(h)
        h = h + torch.empty_like(h).uniform_(-0.01, 0.01) + torch.empty_like(h).normal_(0.0, 0.01)
        return self.fc2(h).square().mean()


def _steps(model, x, n):
    """n training steps on one batch, plain SGD at lr 0 (the weights stay): the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    for _ in range(n):
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        losses.append(loss.item())
    return losses


def test_every_draw_runs_in_the_group_and_repeats_under_the_seed(fast_rng):
    torch.manual_seed(0)
    model = Noisy().to(LAZY)
    x = torch.randn(16, 40).to(LAZY)
    torch._lazy.mark_step()
    metrics.reset()
    torch.manual_seed(1)
    first = _steps(model, x, 4)
    _one_group_per_graph(metrics.snapshot())
    assert len(set(first)) == 4, first  # new draws every step: the seed is not baked into the code
    torch.manual_seed(1)
    assert _steps(model, x, 4) == first  # the generated code draws its seed from torch's generator
    torch.manual_seed(2)
    assert _steps(model, x, 4) != first


def test_dropout_keeps_its_probability_and_the_backward_its_mask(fast_rng):
    weight = torch.ones(64, 64).to(LAZY).requires_grad_()
    kept = []
    for _ in range(3):
        y = F.dropout(weight * 1.0, 0.3, training=True)
        y.sum().backward()
        torch._lazy.mark_step()
        y_cpu, grad = y.cpu(), weight.grad.cpu()
        weight.grad = None
        # the kept elements are scaled by 1 / (1 - p), the rest zero, and the
        # gradient is the same mask times the same scale
        torch.testing.assert_close(y_cpu[y_cpu != 0], torch.full_like(y_cpu[y_cpu != 0], 1 / 0.7))
        torch.testing.assert_close(grad, y_cpu, rtol=0, atol=0)
        kept.append((y_cpu != 0).float().mean().item())
    _one_group_per_graph(metrics.snapshot())
    # 4096 draws a step: the kept fraction's standard deviation is 0.007
    assert all(abs(k - 0.7) < 0.035 for k in kept), kept
    assert len(set(kept)) > 1, kept


def test_a_value_read_mid_step_keeps_the_steps_masks(fast_rng):
    # loss.item() before mark_step runs the step's graph with the loss (the
    # read depends on draws): the gradients must come from the same masks
    weight = torch.ones(64, 64).to(LAZY).requires_grad_()
    torch._lazy.mark_step()
    for _ in range(2):
        loss = F.dropout(weight * 1.0, 0.3, training=True).sum()
        read = loss.item()
        loss.backward()
        torch._lazy.mark_step()
        assert weight.grad.sum().item() == pytest.approx(read, rel=1e-6)  # grad = mask / 0.7, summed
        weight.grad = None


def test_without_fast_rng_draws_stay_in_the_glue(lazy_level):
    # the default: eager's stream, drawn by TorchScript between two groups
    assert not lazy_mlir.config.current.fast_rng
    torch.manual_seed(0)
    model = Noisy().to(LAZY)
    x = torch.randn(16, 40).to(LAZY)
    torch._lazy.mark_step()
    metrics.reset()
    _steps(model, x, 1)
    assert max(metrics.snapshot()["groups_per_graph"].values()) > 1, metrics.report()


def _bert_losses(device):
    import zoo
    v = zoo.base_variant("bert", dropout=0.1)
    spec = zoo.SPECS["bert"]
    model = zoo.make_model(v, torch.float32).to(device)
    model.train()
    opt = spec.optimizer(model)
    losses = []
    for batch in zoo.batches(v, 3, torch.float32)[:3]:
        loss = spec.loss(model, *(t.to(device) for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == LAZY:
            torch._lazy.mark_step()
        losses.append(loss.item())
    return torch.tensor(losses)


def test_hf_bert_with_dropout_trains_in_one_group(fast_rng):
    eager = _bert_losses(torch.device("cpu"))
    metrics.reset()
    lazy = _bert_losses(LAZY)
    s = metrics.snapshot()
    _one_group_per_graph(s)
    assert s["graph_executions"] == 3 and s["fallback_count"] == 0, metrics.report()
    # other masks than eager's, at the same weights and batches: close, not equal
    assert not torch.equal(lazy, eager)
    torch.testing.assert_close(lazy, eager, rtol=0.03, atol=0)
