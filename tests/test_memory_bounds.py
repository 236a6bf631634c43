"""Nothing of ours grows with the number of steps: a training loop's heap
(parameters, optimizer state, the step memory cache, the device-data pool,
cached graphs and their bookkeeping) is the same at its 30th step as at
its 10th. A cache without a bound, or a buffer kept per step, fails it.
And lazy_mlir.memory's report accounts for the model's and optimizer's
bytes."""
import pytest
import torch

import lazy_mlir
from lazy_mlir.native import _C
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
    for step, (x, y) in enumerate(gpt_batches(SMALL_GPT, 3)):
        if step == 2:  # the last step's peak measured apart, from what was live when it began
            _C.release_step_memory()  # the cache emptied: peak_bytes starts again from the bytes live
            live_before = _C.step_memory_stats()["live_bytes"]
        model(x.to(LAZY), y.to(LAZY)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
    s = lazy_mlir.memory.snapshot(model, opt)
    # the report's step peak is that step's own, not the process's (which
    # holds the first step's buffers, the new parameters among them)
    assert live_before > 0  # the first step's new parameters, in buffers of its own
    assert s["step_buffers_peak"] == _C.step_memory_stats()["peak_bytes"] - live_before
    # the tied embedding (wte is lm_head's weight) once
    params = sum(p.numel() * 4 for p in make_gpt(SMALL_GPT).parameters())
    assert s["parameters"] == params and s["gradients"] == 0
    moments = 2 * params  # AdamW's exp_avg and exp_avg_sq; its step counts are 0-d
    assert moments <= s["optimizer_state"] <= moments + 8 * len(opt.state), s
    assert s["step_buffers_peak"] > 0 and s["heap_in_use"] > s["parameters"] + s["optimizer_state"]
    text = lazy_mlir.memory.report(model, opt)
    assert "optimizer state" in text and "resident at the peak" in text


_BOUNDED_CACHES = r"""
import gc, json, sys, weakref
import torch
import lazy_mlir
from lazy_mlir.cache import compile_cache
from lazy_mlir.compile import parallel
from lazy_mlir.native import _C
from lazy_mlir.run import executables

lazy_mlir.init(memory_cache_entries=2, dynamic="static", progress=False)
made = []
original = executables.GroupExecutable.__init__
def counted(self, *args, **kwargs):
    made.append(weakref.ref(self))
    original(self, *args, **kwargs)
executables.GroupExecutable.__init__ = counted

def train(model, batch, device):
    torch.manual_seed(batch)
    x, y = torch.randn(batch, 8), torch.randn(batch, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    if device == "lazy":
        torch._lazy.mark_step()
    return loss.item()

torch.manual_seed(0)
eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
lazy = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
lazy.load_state_dict(eager.state_dict())
lazy = lazy.to("lazy")
losses = []
for batch in [1, 2, 3, 4, 5, 6, 1]:  # every size a new graph; the last one's was evicted
    losses.append((train(eager, batch, "cpu"), train(lazy, batch, "lazy")))
gc.collect()
print(json.dumps({"losses": losses, "graphs": _C.computation_cache_entries(),
                  "groups": compile_cache.memory_entries(), "made": len(made), "graphs_bound": len(parallel._graphs),
                  "alive": sum(ref() is not None for ref in made),
                  "compiled_calls": lazy_mlir.metrics.snapshot()["compiled_group_calls"]}))
"""


def test_compiled_graphs_in_memory_are_bounded(tmp_path):
    """memory_cache_entries bounds what a loop that meets new shapes for
    ever keeps compiled in memory: LTC's step graphs and lazy_mlir's groups
    (the code of the ones evicted is freed), and a size met again after its
    graph left memory trains as eager does. In a process of its own: LTC
    sizes its cache at the first step."""
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _BOUNDED_CACHES], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "LAZY_MLIR_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for eager, lazy in out["losses"]:
        assert lazy == pytest.approx(eager, rel=1e-5, abs=1e-6)
    assert out["compiled_calls"] >= 7  # every step ran generated code
    assert out["graphs"] <= 2 and out["groups"] <= 2, out
    assert out["graphs_bound"] == 0, out  # parallel_compile's bookkeeping of graphs past their first run
    # 7 training graphs (and the loss reads) made executables; only those of the graphs kept live on
    assert out["made"] >= 7 and out["alive"] <= 2 * 2, out
