"""A compiled group runs only on inputs like those it was compiled for, and a
group that fails does not fail the steps after it."""
import pytest
import torch

from lazy_mlir.compile import routes
from lazy_mlir.lowering import group_lowering
from lazy_mlir.observe import metrics
from lazy_mlir.run import executables
from helpers import LAZY


def fn(x):
    return (x * 2 + 1).relu() - x.sum(1, keepdim=True)


def run_lazy(x):
    y = fn(x.to(LAZY))
    torch._lazy.mark_step()
    return y.cpu()


@pytest.mark.python_wrapper
def test_channels_last_input_takes_its_own_compiled_variant(lazy_level, lowerings):
    x = torch.randn(2, 3, 5, 7)
    layouts = [x, x.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last), x]
    for inp in layouts:
        torch.testing.assert_close(run_lazy(inp), fn(inp))
    # one compile per layout; going back to a layout seen before compiles nothing
    assert len(lowerings) == 2
    s = metrics.snapshot()
    assert s["groups_fallen_back"] == {} and s["graph_executions"] == 4


@pytest.mark.python_wrapper
def test_transposed_input_of_the_same_shape(lazy_level, lowerings):
    a, b = torch.randn(6, 6), torch.randn(6, 6).t()
    assert a.shape == b.shape and a.stride() != b.stride()
    for inp in (a, b, a, b):
        torch.testing.assert_close(run_lazy(inp), fn(inp))
    assert len(lowerings) == 2 and metrics.snapshot()["groups_fallen_back"] == {}


def test_layout_guard_sees_strides_dtypes_and_sizes():
    x = torch.randn(2, 3, 4, 5)
    guard = executables.layout_guard([x, torch.randn(3)])
    assert guard.check(torch.randn(2, 3, 4, 5), torch.randn(3))
    assert not guard.check(x.to(memory_format=torch.channels_last), torch.randn(3))
    assert not guard.check(x, torch.randn(3, dtype=torch.float64))
    assert not guard.check(x, torch.randn(4))
    assert not guard.check(x, torch.randn(6)[::2])


def test_layout_guard_passes_an_input_passed_twice():
    """LTC passes a weight read by forward and by its update twice; Dynamo's
    TensorGuards alone rejects such a list, even the one it was built from
    (every real model's step then recursed into a TorchScript fallback)."""
    w, x = torch.randn(4, 4), torch.randn(3)
    guard = executables.layout_guard([w, x, w])
    assert guard.check(w, x, w)
    assert not guard.check(torch.randn(4, 4), torch.randn(3), w)  # positions 0 and 2 no longer alias
    w2 = torch.randn(4, 4)
    assert guard.check(w2, torch.randn(3), w2)
    assert not guard.check(w2.t().contiguous().t(), torch.randn(3), w2.t().contiguous().t())


class _FailingRun:
    """Generated code that raises on the calls listed (counting from 0)."""

    def __init__(self, run, failing_calls):
        self.run, self.failing_calls, self.calls = run, failing_calls, 0

    def __call__(self, inputs):
        call, self.calls = self.calls, self.calls + 1
        if call in self.failing_calls:
            raise RuntimeError("injected run failure")
        return self.run(inputs)


def _lower_with_failing_run(monkeypatch, failing_calls):
    def lower(graph, inputs, name, cfg):
        lowered = group_lowering.lower_group(graph, inputs, name, cfg)
        lowered.run = _FailingRun(lowered.run, failing_calls)
        return lowered

    monkeypatch.setattr(routes, "lower_group", lower)


@pytest.mark.python_wrapper
def test_code_failing_its_first_run_falls_back_for_this_and_later_steps(lazy_level, monkeypatch):
    _lower_with_failing_run(monkeypatch, failing_calls={0})
    inputs = [torch.randn(3, 11) for _ in range(3)]
    with pytest.warns(RuntimeWarning, match="injected run failure"):
        outputs = [run_lazy(x) for x in inputs]
    for x, y in zip(inputs, outputs):
        torch.testing.assert_close(y, fn(x))
    assert any("injected run failure" in why for why in metrics.snapshot()["groups_fallen_back"].values())


@pytest.mark.python_wrapper
def test_a_failed_step_does_not_poison_the_next(lazy_level, monkeypatch):
    _lower_with_failing_run(monkeypatch, failing_calls={1})
    first, failing, after = torch.randn(4, 9), torch.randn(4, 9), torch.randn(4, 9)
    torch.testing.assert_close(run_lazy(first), fn(first))
    with pytest.raises(RuntimeError, match="injected run failure"):
        run_lazy(failing)
    for _ in range(2):  # the same graph and group again, new data
        torch.testing.assert_close(run_lazy(after), fn(after))
    assert metrics.snapshot()["groups_fallen_back"] == {}


def _embedding_step(model, optimizer, ids):
    loss = model(ids.to(model[0].weight.device)).square().sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if loss.device.type == "lazy":
        torch._lazy.mark_step()
    return loss.item()


def test_a_failed_step_that_updated_state_says_so_at_the_next(lazy_level):
    """A failed step's results never got values, the parameters and optimizer
    state it updated among them. The next step says so, naming the first
    error, instead of failing deep in its graph; with the model and
    optimizer built anew from the weights, training goes on as eager's."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 1)).double()
    saved = {k: v.clone() for k, v in eager.state_dict().items()}
    def build():
        model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 1)).double()
        model.load_state_dict(saved)
        model = model.to(LAZY)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, optimizer = build()
    _embedding_step(model, optimizer, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="index out of bounds"):
        _embedding_step(model, optimizer, torch.tensor([1, 12]))  # no row 12
    with pytest.raises(RuntimeError, match=r"tensors of this step read values that an earlier step was to "
                                           r"compute when it failed \(.*index out of bounds.*\)"):
        _embedding_step(model, optimizer, torch.tensor([3, 4]))
    model, optimizer = build()
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    for ids in (torch.tensor([3, 4]), torch.tensor([5, 3])):
        assert _embedding_step(model, optimizer, ids) == pytest.approx(_embedding_step(eager, eager_optimizer, ids),
                                                                       rel=1e-12)


class _CountingItem:
    """Counts .item() calls (a host sync per call on a GPU)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = torch.Tensor.item

        def item(t):
            self.calls += 1
            return real(t)

        monkeypatch.setattr(torch.Tensor, "item", item)


def test_scalar_guards_read_each_tensor_once(monkeypatch):
    guards = executables.ScalarGuards([(1, 0.25)])
    x, slope = torch.randn(3), torch.tensor(0.25)
    reads = _CountingItem(monkeypatch)
    assert all(guards.hold([x, slope]) for _ in range(3))
    assert reads.calls == 1  # the same tensor again: known, not read
    assert guards.hold([x, torch.tensor(0.25)]) and reads.calls == 2  # another tensor is read
    assert not guards.hold([x, torch.tensor(0.5)])
    slope.fill_(0.5)  # the version counter says the known tensor changed
    assert not guards.hold([x, slope])


def test_steady_state_steps_check_baked_scalars_without_reading_them(lazy_level, monkeypatch):
    """LTC hands over the same device data for the same Python scalar each
    step, so after the first step the guard reads nothing."""
    import torch.nn.functional as F

    x = torch.randn(6, 47)  # not test_recompiles' shape: LTC keeps compiled graphs across tests

    def step(threshold):
        y = F.threshold(x.to(LAZY), threshold, 0.0)
        torch._lazy.mark_step()
        return y.cpu()

    torch.testing.assert_close(step(0.25), F.threshold(x, 0.25, 0.0))  # compiles, reads its values
    reads = _CountingItem(monkeypatch)
    for _ in range(3):
        torch.testing.assert_close(step(0.25), F.threshold(x, 0.25, 0.0))
    assert reads.calls == 0
    torch.testing.assert_close(step(0.5), F.threshold(x, 0.5, 0.0))  # a new value still recompiles
    assert reads.calls >= 1
    s = metrics.snapshot()
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] >= 5


@pytest.mark.python_wrapper
def test_a_baked_zero_keeps_its_sign(lazy_level, lowerings):
    """leaky_relu's slope is baked into the code (guarded): -0.0 == 0.0 in
    Python, yet the code differs (1 / (x * -0.0) is +inf for x < 0, 1 / (x * 0.0)
    -inf). A guard that compared with == served the 0.0 code for -0.0."""
    import torch.nn.functional as F

    x = -torch.arange(1.0, 44.0).reshape(1, 43)  # a shape of this test's own

    def inverse(t, slope):
        return 1 / F.leaky_relu(t, slope)

    for slope in (0.0, -0.0, 0.0, -0.0, float("nan"), float("nan")):
        got = inverse(x.to(LAZY), slope)
        torch._lazy.mark_step()
        torch.testing.assert_close(got.cpu(), inverse(x, slope), equal_nan=True, msg=f"slope {slope!r}")
    assert len(lowerings) == 3, lowerings  # 0.0, -0.0 and NaN: each compiled once, then served
    assert metrics.snapshot()["groups_fallen_back"] == {}


def test_scalar_guards_tell_the_sign_of_zero_and_know_nan():
    zero, nan = executables.ScalarGuards([(0, 0.0)]), executables.ScalarGuards([(0, float("nan"))])
    assert zero.hold([torch.tensor(0.0)]) and not zero.hold([torch.tensor(-0.0)])
    assert nan.hold([torch.tensor(float("nan"))]) and not nan.hold([torch.tensor(1.0)])


def test_a_builtin_op_constant_keeps_its_sign(lazy_level):
    """Ops traced as builtin nodes (hardtanh) hash their constants into the
    LTC graph hash: -0.0 printed as 0.0, so hardtanh(x, -0.0, 5) hashed like
    hardtanh(x, 0.0, 5) and LTC served the 0.0 graph (+inf for -inf)."""
    import torch.nn.functional as F

    x = -torch.arange(1.0, 48.0).reshape(1, 47)  # a shape of this test's own

    def inverse(t, low):
        return 1 / F.hardtanh(t, low, 5.0)

    for low in (0.0, -0.0, 0.0, -0.0):
        got = inverse(x.to(LAZY), low)
        torch._lazy.mark_step()
        torch.testing.assert_close(got.cpu(), inverse(x, low), msg=f"min_val {low!r}")
