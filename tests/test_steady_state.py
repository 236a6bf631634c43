"""lazy_mlir.prepare: the first step traces the steady-state graph (one
compile for the whole run), and training is unchanged."""
from __future__ import annotations

import pytest
import torch

import lazy_mlir
from helpers import assert_compiled, assert_same_training
from lazy_mlir import metrics
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt

# a shape no other test traces: LTC's graph cache must not serve it already
CFG = GPTConfig(n_layer=1, n_head=2, n_embd=24, vocab_size=40, block_size=8, batch_size=2)
STEPS = 3


def _train(device, prepare: bool, make_opt=make_adamw):
    model = make_gpt(CFG).to(device)
    opt = make_opt(model)
    if prepare:
        lazy_mlir.prepare(model, opt)
    losses, misses = [], []
    for x, y in gpt_batches(CFG, steps=STEPS):
        metrics.reset()
        loss = model(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazy":
            torch._lazy.mark_step()
            snap = metrics.snapshot()
            misses.append(snap["cache_misses"])
            assert_compiled(snap, calls=1)
        losses.append(loss.item())
    with torch.no_grad():
        params = {n: p.cpu() for n, p in model.named_parameters()}
    return (torch.tensor(losses), params), misses


def test_first_step_traces_the_steady_state_graph(lazy_level):
    eager, _ = _train(torch.device("cpu"), prepare=False)
    lazy, misses = _train(torch.device("lazy"), prepare=True)
    assert misses == [1, 0, 0]  # without prepare: [1, 1, 0] (the optimizer's first step differs)
    # AdamW's first updates of near-zero biases amplify fp32 rounding (~1e-6,
    # the same without prepare): the tolerance test_compile_path uses
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_state_created_as_device_data_only_in_the_first_step(lazy_level):
    model = make_gpt(CFG).to("lazy")
    opt = make_adamw(model)
    lazy_mlir.prepare(model, opt)
    assert "step" in vars(opt)  # the instance's first-step wrapper
    x, y = next(gpt_batches(CFG))
    model(x.to("lazy"), y.to("lazy")).backward()
    opt.step()
    assert "step" not in vars(opt)  # back to the optimizer's own step
    exp_avg = opt.state[model.wte.weight]["exp_avg"]
    assert exp_avg.device.type == "lazy" and exp_avg.shape == model.wte.weight.shape
    torch._lazy.mark_step()
    assert torch.zeros(3).to("lazy").cpu().eq(0).all()  # zeros_like outside the optimizer is untouched


def test_prepare_refuses_a_model_not_on_the_lazy_device():
    with pytest.raises(ValueError, match="no parameter on the lazy device"):
        lazy_mlir.prepare(make_gpt(CFG))
