"""The MLIR compile path: scalars stay runtime inputs, dumps, O2 errors."""
import os
import re
import time

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics, progress
from helpers import LAZY, assert_compiled, assert_same_training, make_mlp, mlp_batches, train

CPU = torch.device("cpu")


class ScheduledAdamW:
    """AdamW whose LambdaLR scheduler is stepped after every training step."""

    def __init__(self):
        self.opt = None

    def __call__(self, model):
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: 1.0 / (1 + step))
        return self.opt


def test_learning_rate_schedule_does_not_recompile(lazy_level):
    batches = mlp_batches(10, batch=11)
    lazy_opt, counts = ScheduledAdamW(), []

    def after_lazy_step(i):
        lazy_opt.scheduler.step()  # a new learning rate every step
        s = metrics.snapshot()
        counts.append((s["compiles"], s["group_cache_misses"]))

    lazy = train(make_mlp, lazy_opt, batches, LAZY, after_step=after_lazy_step)
    assert counts[1] == counts[-1], counts  # steps 0 and 1 differ (optimizer state init); none after
    assert counts[-1][1] >= 1  # groups really were lowered through MLIR
    assert_compiled(calls=10)
    eager_opt = ScheduledAdamW()
    eager = train(make_mlp, eager_opt, batches, CPU, after_step=lambda i: eager_opt.scheduler.step())
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_dump_dir_has_every_stage(lazy_level, tmp_path):
    lazy_mlir.init("O1", dump_dir=str(tmp_path))
    train(make_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.01), mlp_batches(1, batch=13), LAZY)
    files = sorted(os.listdir(tmp_path))
    group = files[0].split(".")[0] + "." + files[0].split(".")[1]
    stages = {f[len(group) + 1:] for f in files if f.startswith(group + ".")}
    assert {"0.ts.txt", "1.fx.txt", "2.mlir", "3.after-fold-copy-ops.mlir", "3.after-scalar-implicit-to-tensor.mlir",
            "3.after-cse.mlir", "4.export.fx.txt", "5.generated.py"} <= stages, stages
    assert "torch.aten" in (tmp_path / f"{group}.2.mlir").read_text()
    assert "t_copy" not in (tmp_path / f"{group}.3.after-fold-copy-ops.mlir").read_text()


class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(self.fc(x), 0.5).sum()  # random: kept in TorchScript


def test_o2_error_names_op_and_source_line(lazy_level):
    lazy_mlir.init("O2")
    model = DropoutMLP().to(LAZY)
    loss = model(torch.randn(2, 8).to(LAZY))
    with pytest.raises(RuntimeError, match=r"lazy_mlir O2: aten::\w+ cannot be compiled \(at .*test_compile_path.py forward \d+\)"):
        torch._lazy.mark_step()
    del loss


def test_o1_keeps_uncompilable_ops_in_torchscript(lazy_level):
    torch.manual_seed(0)
    model = DropoutMLP().to(LAZY)
    loss = model(torch.randn(2, 8).to(LAZY))
    torch._lazy.mark_step()
    assert torch.isfinite(loss.cpu())
    s = metrics.snapshot()
    assert s["graph_executions"] == 1 and s["groups_built"] >= 1 and s["fallback_count"] == 0
    assert_compiled(s)


def test_compiles_report_progress(lazy_level, capsys, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_SECONDS", 0.05)  # a reminder during any compile, not every 30 s
    train(make_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.02), mlp_batches(1, batch=17), LAZY)
    err = capsys.readouterr().err
    assert re.search(r"lazy_mlir: compiling graph\d+\.g0 \(\d+ ops\) \.\.\.", err), err
    assert re.search(r"lazy_mlir: still compiling graph\d+\.g0 \(\d+ ops\): \d+ s", err), err
    assert re.search(r"lazy_mlir: compiled graph\d+\.g0 in \d+\.\d s", err), err
    last = err.rindex("lazy_mlir: compiled")
    time.sleep(0.2)  # the reminders ended with the compile
    assert "still compiling" not in capsys.readouterr().err
    assert "still compiling" not in err[last:]


@pytest.mark.python_wrapper
def test_inductor_compiles_through_its_fx_graph_cache(lazy_level):
    """The converter's FakeTensorMode carries a ShapeEnv; without one Inductor
    bypasses its FX graph cache ("No shape env": a warm compile 40 s, not 5 s).
    With lazy_mlir's cache on, groups compile through standalone_compile,
    whose bundled AOTAutograd cache entry holds the FX graph's code."""
    from torch._dynamo.utils import counters
    for cache_inductor in (False, True):
        lazy_mlir.init("O1", cache_inductor=cache_inductor)
        counters["inductor"].clear()
        counters["aot_autograd"].clear()
        train(make_mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.03), mlp_batches(1, batch=23 + cache_inductor),
              LAZY)
        assert counters["inductor"]["fxgraph_cache_bypass"] == counters["aot_autograd"]["autograd_cache_bypass"] == 0
        looked_up = counters["aot_autograd"]["autograd_cache_hit"] + counters["aot_autograd"]["autograd_cache_miss"]
        assert looked_up >= 1
        if not cache_inductor:
            assert counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"] >= 1
