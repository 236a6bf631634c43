"""What cuts a step into several graph executions is counted by source line,
and at O2 (one graph per step) an eager fallback is an error naming the op
and the line."""
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.observe import metrics, syncs
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


def _dropout_step(device, read, captured=False):
    """One fp64 training step of a dropout MLP with eager's masks, the loss
    read by ``read`` between forward and backward: (value read, gradients)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3)).double().to(device)
    if captured:
        lazy_mlir.capture(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    torch.manual_seed(5)  # the masks
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    value = read(loss)
    loss.backward()
    if device.type == "lazy":
        torch._lazy.mark_step()
    return value, [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("captured", [False, True], ids=["op-by-op", "captured"])
def test_an_item_mid_step_keeps_eagers_draws(lazy_level, captured):
    """loss.item() between a dropout forward and mark_step: LTC alone would
    compute only the loss, and draw the masks again, other numbers, for the
    gradients at mark_step. The read syncs every live tensor first
    (value_reads.h), so the step keeps eager's draws: the value read and
    the gradients equal eager's, in two graphs, without a warning."""
    lazy_mlir.init("O1", capture="auto" if captured else "off")
    read = lambda loss: loss.item()  # noqa: E731
    eager_value, eager_grads = _dropout_step(torch.device("cpu"), read)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lazy_mlir")  # ours only: the compile's deprecations are torch's
        value, grads = _dropout_step(LAZY, read, captured)
    assert value == pytest.approx(eager_value, rel=1e-12)
    for lazy_grad, eager_grad in zip(grads, eager_grads):
        torch.testing.assert_close(lazy_grad, eager_grad, rtol=1e-12, atol=1e-12)
    s = metrics.snapshot()
    assert s["graph_executions"] == 2 and sum(s["syncs"].values()) == 1, metrics.report()
    assert s["captured_calls"] == (1 if captured else 0)
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] > 0, metrics.report()


def _dropout_select_step(device):
    """One fp64 step of a dropout model whose loss selects the positive
    outputs (``masked_select``: its size is a count read mid-step, on values
    that depend on the dropout masks), then a CTC loss: (loss, gradients)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 5)).double().to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 2, 8, generator=g, dtype=torch.float64)
    targets, input_lengths, target_lengths = torch.tensor([[1, 2, 3], [2, 4, 0]]), torch.tensor([10, 9]), torch.tensor([3, 2])
    torch.manual_seed(5)  # the masks
    out = model(x.to(device))
    log_probs = out.log_softmax(-1)
    loss = F.ctc_loss(log_probs, targets.to(device), input_lengths.to(device), target_lengths.to(device))
    loss = loss + out.masked_select(out > 0).square().sum()
    loss.backward()
    if device.type == "lazy":
        torch._lazy.mark_step()
    return loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()]


def test_a_count_read_mid_step_keeps_eagers_draws(lazy_level):
    """A read mid-step of a value that depends on random draws (here the
    count ``masked_select`` needs, trace/data_dependent.py): LTC alone would
    compute only that value, and the backward would draw the dropout masks
    again (gradients far off eager's). The read syncs every live tensor
    first (value_reads.h), so the step keeps eager's draws, without the
    redraw warning; nothing runs eagerly."""
    eager_loss, eager_grads = _dropout_select_step(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lazy_mlir: a value read")  # the redraw warning
        loss, grads = _dropout_select_step(LAZY)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-12, atol=1e-12)
    for lazy_grad, eager_grad in zip(grads, eager_grads):
        torch.testing.assert_close(lazy_grad, eager_grad, rtol=1e-12, atol=1e-12)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0, metrics.report()
    assert list(s["syncs"]) == [f"lazy_mlir reads how many elements aten::masked_select selects, at {__file__}:"
                                f"{_dropout_select_step.__code__.co_firstlineno + 13} (_dropout_select_step)"], s["syncs"]
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] > 0, metrics.report()


def test_other_reads_mid_step_that_run_random_ops_warn(lazy_level):
    """.cpu() keeps LTC's own kernel, which computes only the tensor read:
    the masks drawn for it are drawn again for the gradients, so the read
    says so, naming the line. A read whose graph draws nothing stays quiet."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 1)).double().to(LAZY)
    x = torch.randn(4, 8, dtype=torch.float64).to(LAZY)
    loss = model(x).sum()
    with pytest.warns(RuntimeWarning, match=r"value read at .*test_syncs.py:\d+ .*ran random ops") as caught:
        loss.cpu()
    assert len(caught) == 1 and caught[0].filename == __file__, [str(w.message) for w in caught]
    loss.backward()
    torch._lazy.mark_step()
    model.eval()  # no dropout: nothing drawn, nothing to warn about
    loss = model(x).sum()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lazy_mlir")
        loss.cpu()
        loss.item()
    torch._lazy.mark_step()


def test_a_warning_made_an_error_inside_an_execution_is_raised_by_the_next_mark_step(lazy_level):
    """A read's warning that the user's filter makes an error (-W error) is
    raised by the next mark_step, before it syncs: raised inside LTC's sync,
    it would be kept and rethrown at the next sync, and a Python error
    rethrown twice aborts the process."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 1)).double().to(LAZY)
    x = torch.randn(4, 8, dtype=torch.float64)
    loss = model(x.to(LAZY)).sum()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lazy_mlir: a value read")
        assert loss.cpu().shape == ()  # the read completes
    with pytest.raises(RuntimeWarning, match=r"value read at .*test_syncs.py:\d+ .*ran random ops"):
        torch._lazy.mark_step()
    torch._lazy.mark_step()  # the step's pending work, and nothing left over
    y = (x.to(LAZY) * 2).sum()
    torch._lazy.mark_step()
    torch.testing.assert_close(y.cpu(), (x * 2).sum())


@pytest.mark.python_wrapper
def test_a_compile_warning_made_an_error_is_raised_by_the_next_mark_step(lazy_level, monkeypatch):
    """A group's first compile runs inside the graph's execution: a warning
    of it that the user's filter makes an error waits for the next
    mark_step, and the group still compiles and runs its code."""
    from lazy_mlir.compile import routes

    real = routes.lower_group

    def noisy(*args):
        warnings.warn("injected compile notice", UserWarning)
        return real(*args)

    monkeypatch.setattr(routes, "lower_group", noisy)
    x = torch.randn(5, 37)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="injected compile notice")
        y = (x.to(LAZY) * 3).exp().sum(0)
        torch._lazy.mark_step()  # compiles, inside the execution
        torch.testing.assert_close(y.cpu(), (x * 3).exp().sum(0))
        with pytest.raises(UserWarning, match="injected compile notice"):
            torch._lazy.mark_step()
    s = metrics.snapshot()
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] >= 1, metrics.report()


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


def test_a_detached_value_read_after_mark_step_runs_no_graph(lazy_level):
    """``loss.detach().cpu()`` / ``.item()`` after mark_step (a training
    loop logging its loss): the detached copy of device data takes that
    data (lazy_backend/ltc_fixes/pending_data.h) instead of executing a graph of its
    own for a copy (one a read before). What is read is a copy: writing it
    leaves the lazy tensor alone."""
    w = torch.randn(4, requires_grad=True)
    lazy_w = w.detach().to(LAZY).requires_grad_()
    loss = (lazy_w * 3).square().sum()
    loss.backward()
    torch._lazy.mark_step()
    expected = (w.detach() * 3).square().sum()
    metrics.reset()
    read = loss.detach().cpu()
    value = loss.detach().item()
    grad = lazy_w.grad.detach().cpu()
    assert metrics.snapshot()["graph_executions"] == 0, metrics.report()
    torch.testing.assert_close(read, expected)
    assert value == pytest.approx(float(expected))
    torch.testing.assert_close(grad, 18 * w.detach())
    read.add_(1)
    assert loss.item() == pytest.approx(float(expected))


def _data_dependent(x):
    return torch.unique(x, dim=0)  # sizes from data with no rule to read them: no lazy kernel traces it


def test_o1_eager_fallback_is_counted_with_op_and_source_line(lazy_level):
    x = torch.tensor([0.5, -1.0, 2.0, 0.5])
    out = _data_dependent(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), _data_dependent(x))
    s = metrics.snapshot()
    assert s["fallbacks"] == {"aten::unique_dim": 1}
    (where,) = s["fallback_sources"]
    assert where.startswith("aten::unique_dim at " + __file__) and "(_data_dependent)" in where


def test_o2_eager_fallback_is_an_error_naming_op_and_line(lazy_level):
    lazy_mlir.init("O2")
    with pytest.raises(syncs.EagerFallbackError, match=r"aten::unique_dim at .*test_syncs.py:\d+ \(_data_dependent\)"):
        _data_dependent(torch.tensor([0.5, -1.0]).to(LAZY))
    torch._lazy.mark_step()


def test_o2_fallback_warn_switch_runs_the_op(lazy_level):
    lazy_mlir.init("O2", o2_fallback="warn")
    x = torch.tensor([0.5, -1.0, 2.0])
    with pytest.warns(RuntimeWarning, match="aten::unique_dim at .*test_syncs.py"):
        out = _data_dependent(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), _data_dependent(x))


def test_o2_ltc_eager_kernel_warns(lazy_level):
    """An op LTC runs eagerly, past our kernels (``equal``: no Lazy kernel,
    LTC's fallback): O2 notices it from LTC's counters at the next execution."""
    lazy_mlir.init("O2")
    x = torch.tensor([0.0, 1.0, 2.0]).to(LAZY)
    torch._lazy.mark_step()
    with pytest.warns(RuntimeWarning, match=r"LTC ran aten::equal eagerly"):
        same = torch.equal(x * 3, x + x + x)
        torch._lazy.mark_step()
    assert same


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
