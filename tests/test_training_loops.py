"""The parts of a Hugging Face Trainer-style loop around the model, on the
lazy device against eager: gradient accumulation over micro-batches,
gradient-norm clipping (`clip_grad_norm_`, the Trainer's default) and a
learning-rate schedule, on the zoo's HF GPT-2. One graph execution per
optimizer step, generated code only, and no compile after the first
steps although the learning rate changes every step. And a user's
autograd.Function under a gradient penalty (double backward) in float64."""
import os
import sys

import pytest
import torch

import lazy_mlir
from lazy_mlir.observe import metrics
from helpers import CPU, LAZY, assert_compiled, assert_same_training, train

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))


def _trainer_loop(device, mark_each_micro_batch=False, steps=4, micro_batches=2):
    import zoo

    variant = zoo.base_variant("gpt2")
    spec = zoo.SPECS["gpt2"]
    model = zoo.make_model(variant).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: (step + 1) / steps)
    data = zoo.batches(variant, steps * micro_batches)[:steps * micro_batches]
    losses, norms, snapshots = [], [], []
    for step in range(steps):
        metrics.reset()
        for i in range(micro_batches):
            batch = data[step * micro_batches + i]
            loss = spec.loss(model, *(t.to(device) for t in batch)) / micro_batches
            loss.backward()
            if device == LAZY and mark_each_micro_batch:
                torch._lazy.mark_step()  # torch_xla's recipes: a graph per micro-batch
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        warmup.step()
        opt.zero_grad()
        if device == LAZY:
            torch._lazy.mark_step()
            snapshots.append(metrics.snapshot())
        losses.append(loss.item())
        norms.append(norm.item())
    with torch.no_grad():
        params = {n: p.cpu() for n, p in model.named_parameters()}
    return losses, norms, params, snapshots


@pytest.mark.parametrize("mark_each_micro_batch", [False, True], ids=["one-graph", "graph-per-micro-batch"])
def test_accumulated_clipped_scheduled_steps_match_eager(lazy_level, mark_each_micro_batch):
    eager = _trainer_loop(CPU)
    lazy = _trainer_loop(LAZY, mark_each_micro_batch)
    assert lazy[0] == pytest.approx(eager[0], rel=1e-10)
    assert lazy[1] == pytest.approx(eager[1], rel=1e-10)
    assert min(eager[1]) > 0.05  # the norm was clipped at every step: the test exercises clipping
    for name in eager[2]:
        torch.testing.assert_close(lazy[2][name], eager[2][name], rtol=1e-9, atol=1e-12, msg=name)
    per_step = 3 if mark_each_micro_batch else 1  # each micro-batch, then the optimizer
    for s in lazy[3]:
        assert_compiled(s)
        assert s["graph_executions"] == per_step and s["fallback_count"] == 0, metrics.report()
    assert all(s["compiles"] == 0 for s in lazy[3][2:]), [s["compiles"] for s in lazy[3]]  # lr is an input


class _SquareWithScaledGrad(torch.autograd.Function):
    """A user's autograd.Function: its backward is Python of its own, not
    the derivative of its forward (3x, not 2x: a trace that differentiated
    the forward instead would train otherwise)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * ctx.scale, None


class _PenalisedCritic(torch.nn.Module):
    """A WGAN-GP critic: a gradient penalty on the input gradient, taken with
    create_graph=True in the forward (the backward differentiates a
    backward), behind a custom autograd.Function."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 1)

    def forward(self, x, y):
        x = x.detach().requires_grad_(True)
        out = self.b(_SquareWithScaledGrad.apply(torch.tanh(self.a(x)), 1.0)).squeeze(-1)
        grad, = torch.autograd.grad(out.sum(), x, create_graph=True)
        return torch.nn.functional.mse_loss(out, y) + ((grad.norm(2, dim=1) - 1) ** 2).mean()


def _critic_training(device, steps=3):
    """(float64 losses, final parameters) of the critic trained with AdamW."""
    def make_critic():
        torch.manual_seed(0)
        return _PenalisedCritic().double()

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64))
               for _ in range(steps)]
    return train(make_critic, lambda model: torch.optim.AdamW(model.parameters(), lr=1e-2), batches, device)


def test_custom_autograd_function_and_gradient_penalty_train_as_eagerly_and_as_at_o0():
    """Double backward through a user's autograd.Function: the same float64
    numbers at O1 as eagerly and at O0, one generated graph a step."""
    eager = _critic_training(CPU)
    results = {}
    try:
        for level in ("O0", "O1"):
            lazy_mlir.init(level)
            metrics.reset()
            results[level] = _critic_training(LAZY)
            s = metrics.snapshot()
            assert s["graph_executions"] == 3 and s["fallback_count"] == 0, metrics.report()
            if level == "O1":
                assert_compiled(s)
    finally:
        lazy_mlir.init("O1")
    for reference, got in ((eager, results["O0"]), (eager, results["O1"]), (results["O0"], results["O1"])):
        assert_same_training(reference, got, rtol=1e-12, atol=1e-14)
