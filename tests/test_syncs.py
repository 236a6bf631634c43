"""What cuts a step into several graph executions is counted by source line,
and at O2 (one graph per step) an eager fallback is an error naming the op
and the line."""
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import lazy_mlir
from lazy_mlir import metrics, syncs
from helpers import LAZY


def test_value_reads_are_counted_by_user_source_line(lazy_level):
    x = torch.randn(4, 4).to(LAZY)
    torch._lazy.mark_step()
    metrics.reset()
    y = (x * 2).sum()
    positive = bool(y > 0)  # a read mid-step: runs the graph traced so far
    z = (x + 1).abs().sum().item()
    torch._lazy.mark_step()
    s = metrics.snapshot()
    lines = sorted(s["syncs"])
    assert len(lines) == 2 and all(line.startswith(__file__) for line in lines), lines
    assert "test_value_reads_are_counted_by_user_source_line" in lines[0]
    assert s["graph_executions"] == 3  # the two reads, then mark_step
    assert "syncs                2 graph executions outside mark_step" in metrics.report()
    assert positive == bool((x * 2).sum().cpu() > 0) and z >= 0


def test_a_read_mid_step_that_runs_random_ops_warns(lazy_level):
    """LTC computes only what is read: the dropout mask drawn for the loss is
    drawn again, other numbers, for the gradients at mark_step (unlike
    eager), so the read says so, naming the line. A read whose graph draws
    nothing stays quiet."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 1)).double().to(LAZY)
    x = torch.randn(4, 8, dtype=torch.float64).to(LAZY)
    loss = model(x).sum()
    with pytest.warns(RuntimeWarning, match=r"value read at .*test_syncs.py:\d+ .*ran random ops") as caught:
        loss.item()
    assert len(caught) == 1 and caught[0].filename == __file__, [str(w.message) for w in caught]
    loss.backward()
    torch._lazy.mark_step()
    model.eval()  # no dropout: nothing drawn, nothing to warn about
    loss = model(x).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss.item()
    torch._lazy.mark_step()


def test_ops_carry_the_user_line_and_device_data_none(lazy_level):
    """Every traced op names the user's line; device data (inputs, which no
    error names) records none: the frame walk is skipped for them."""
    x = torch.randn(4, 4).to(LAZY)
    y = (x + 1).sin()
    text = torch._C._lazy._get_tensors_text([y])
    torch._lazy.mark_step()
    lines = {kind: line for line in text.splitlines() for kind in ("device_data", "aten::add", "aten::sin")
             if kind + "(" in line}
    assert lines.keys() == {"device_data", "aten::add", "aten::sin"}, text
    assert "test_syncs.py" in lines["aten::add"] and "test_syncs.py" in lines["aten::sin"], text
    assert "test_syncs.py" not in lines["device_data"], lines["device_data"]  # its trace order only


def test_mark_step_alone_is_no_sync(lazy_level):
    x = torch.randn(3).to(LAZY)
    y = x.sin() * 2
    torch._lazy.mark_step()
    assert metrics.snapshot()["syncs"] == {}
    torch.testing.assert_close(y.cpu(), x.cpu().sin() * 2)


def _data_dependent(x):
    return torch.masked_select(x, x > 0)  # output shape depends on values: no lazy kernel can trace it


def test_o1_eager_fallback_is_counted_with_op_and_source_line(lazy_level):
    x = torch.tensor([0.5, -1.0, 2.0])
    out = _data_dependent(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), _data_dependent(x))
    s = metrics.snapshot()
    assert s["fallbacks"] == {"aten::masked_select": 1}
    (where,) = s["fallback_sources"]
    assert where.startswith("aten::masked_select at " + __file__) and "(_data_dependent)" in where


def test_o2_eager_fallback_is_an_error_naming_op_and_line(lazy_level):
    lazy_mlir.init("O2")
    with pytest.raises(syncs.EagerFallbackError, match=r"aten::masked_select at .*test_syncs.py:\d+ \(_data_dependent\)"):
        _data_dependent(torch.tensor([0.5, -1.0]).to(LAZY))
    torch._lazy.mark_step()


def test_o2_fallback_warn_switch_runs_the_op(lazy_level):
    lazy_mlir.init("O2", o2_fallback="warn")
    x = torch.tensor([0.5, -1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="aten::masked_select at .*test_syncs.py"):
        out = _data_dependent(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), _data_dependent(x))


def test_o2_ltc_eager_kernel_warns(lazy_level):
    """LTC's own nonzero kernel runs eagerly, past our kernels: O2 notices it
    from LTC's counters at the next execution (here the one it forces)."""
    lazy_mlir.init("O2")
    x = torch.tensor([0.0, 1.0, 2.0]).to(LAZY)
    torch._lazy.mark_step()
    with pytest.warns(RuntimeWarning, match=r"LTC ran aten::nonzero eagerly \(noticed at .*test_syncs.py"):
        y = (x * 3).nonzero()
    torch._lazy.mark_step()
    torch.testing.assert_close(y.cpu(), torch.tensor([[1], [2]]))


def test_o2_value_read_warns_with_source_line(lazy_level):
    lazy_mlir.init("O2")
    x = torch.randn(3).to(LAZY)
    torch._lazy.mark_step()
    with pytest.warns(RuntimeWarning, match=r"a value read at .*test_syncs.py:\d+ \(test_o2_value_read"):
        (x * 2).sum().item()
    torch._lazy.mark_step()


def test_import_lazy_mlir_exposes_zero_and_metrics():
    code = "import lazy_mlir; print(callable(lazy_mlir.zero.initialize), callable(lazy_mlir.metrics.report))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
