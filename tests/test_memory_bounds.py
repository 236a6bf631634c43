"""Nothing of ours grows with the number of steps: a training loop's heap
(parameters, optimizer state, the step memory cache, the device-data pool,
cached graphs and their bookkeeping) is the same at its 30th step as at
its 10th. A cache without a bound, or a buffer kept per step, fails it.
And lazy_mlir.memory's report accounts for the model's and optimizer's
bytes."""
import pytest
import torch

import lazy_mlir
from helpers import LAZY, SMALL_GPT, assert_compiled, gpt_batches, make_adamw, make_gpt


def _heap_in_use() -> int:
    return lazy_mlir.memory.snapshot()["heap_in_use"]


def test_the_heap_is_the_same_at_every_steady_step(lazy_level):
    if not _heap_in_use():
        pytest.skip("needs glibc's mallinfo2")
    model = make_gpt(SMALL_GPT).to(LAZY)
    opt = make_adamw(model)
    in_use = []
    for x, y in gpt_batches(SMALL_GPT, 30):
        loss = model(x.to(LAZY), y.to(LAZY))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        loss.item()
        in_use.append(_heap_in_use())
    assert_compiled(calls=30)
    growth = max(in_use[10:]) - in_use[9]
    # Python's own churn (frames, small objects) stays far below one parameter's size
    assert growth < 256 * 1024, [f"{(b - in_use[9]) / 1024:.0f} KiB" for b in in_use[10:]]


def test_the_memory_report_counts_the_models_and_optimizers_bytes(lazy_level):
    model = make_gpt(SMALL_GPT).to(LAZY)
    opt = make_adamw(model)
    for x, y in gpt_batches(SMALL_GPT, 3):
        model(x.to(LAZY), y.to(LAZY)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
    s = lazy_mlir.memory.snapshot(model, opt)
    # the tied embedding (wte is lm_head's weight) once
    params = sum(p.numel() * 4 for p in make_gpt(SMALL_GPT).parameters())
    assert s["parameters"] == params and s["gradients"] == 0
    moments = 2 * params  # AdamW's exp_avg and exp_avg_sq; its step counts are 0-d
    assert moments <= s["optimizer_state"] <= moments + 8 * len(opt.state), s
    assert s["step_buffers_peak"] > 0 and s["heap_in_use"] > s["parameters"] + s["optimizer_state"]
    text = lazy_mlir.memory.report(model, opt)
    assert "optimizer state" in text and "resident at the peak" in text
