"""lazy_mlir.capture: a module's forward and backward recorded once and
replayed as one IR node each (region_node.h). Every run equals eager; the
steps really replayed (metrics), traced far fewer IR nodes than op by op,
and ran generated code; keys that change record again; a forward that
cannot be recorded runs op by op with a warning."""
import contextlib
import os
import random
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics
from helpers import (LAZY, assert_compiled, assert_same_training, image_batches, make_convnet, make_mlp, mlp_batches,
                     sgd, sgd_momentum, small_gpt, small_gpt_batches, make_adamw, train)

CPU = torch.device("cpu")
FP64 = dict(rtol=1e-12, atol=1e-12)


# How a test's model is trained: under lazy_mlir.capture, or as the user
# wrote it (the plain loop), where Config.capture "auto" captures it at its
# first training call.
HOW = ["captured", "plain loop"]


def as_trained(model: nn.Module, how: str) -> nn.Module:
    return lazy_mlir.capture(model) if how == "captured" else model


@contextlib.contextmanager
def refusal_told(how: str, match: str):
    """A refusal warns where the user asked for capture; automatic capture
    only counts it (in metrics), as the op-by-op trace is what they wrote."""
    if how == "captured":
        with pytest.warns(UserWarning, match=match):
            yield
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    assert not [w for w in seen if "lazy_mlir.capture" in str(w.message)], [str(w.message) for w in seen]


def captured(make_model, dtype=torch.float64):
    return lambda: lazy_mlir.capture(make_model().to(dtype))


def fp64(batches):
    return [(x.double() if x.is_floating_point() else x, y) for x, y in batches]


def nodes_per_step(make_model, make_opt, batches):
    """IR nodes built in each step of a lazy run (IR reuse is off: every op traced builds one)."""
    counts = []
    before = [_C.nodes_built()]

    def after(i):
        counts.append(_C.nodes_built() - before[0])
        before[0] = _C.nodes_built()

    train(make_model, make_opt, batches, LAZY, after_step=after)
    return counts


def test_mlp_replays_one_node_per_graph_and_matches_eager(lazy_level):
    batches = fp64(mlp_batches(4))
    eager = train(captured(make_mlp), sgd, batches, CPU)
    assert metrics.snapshot()["capture_records"] == 0  # CPU calls run the original forward
    lazy_mlir.init("O1", capture="off")
    op_by_op = nodes_per_step(lambda: make_mlp().double(), sgd, batches)
    lazy_mlir.init("O1")
    metrics.reset()
    replayed = nodes_per_step(captured(make_mlp), sgd, batches)
    s = metrics.snapshot()
    assert s["captured_calls"] == 4 and s["capture_records"] == 1 and s["capture_refused"] == 0, metrics.report()
    assert_compiled(s, calls=4)
    assert s["graph_executions"] == s["mark_steps"] == 4 and s["fallback_count"] == 0, metrics.report()
    # forward and backward are one node each: the rest is the loss's seed, SGD and zero_grad
    assert replayed[-1] < op_by_op[-1] / 2, (replayed, op_by_op)
    metrics.reset()
    lazy = train(captured(make_mlp), sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)


def test_gpt_with_adamw_matches_eager(lazy_level):
    batches = small_gpt_batches(3)
    eager = train(captured(small_gpt, torch.float32), make_adamw, batches, CPU)
    lazy = train(captured(small_gpt, torch.float32), make_adamw, batches, LAZY)
    assert_same_training(eager, lazy, rtol=2e-5, atol=2e-5)
    s = metrics.snapshot()
    assert s["captured_calls"] == 3 and s["capture_records"] == 1, metrics.report()
    assert_compiled(s, calls=3)
    assert s["fallback_count"] == 0 and s["graph_executions"] == s["mark_steps"], metrics.report()


class DropoutMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.3, self.training)), y)


def dropout_mlp(draw_seed):
    """The same weights each time; the masks from ``draw_seed``."""
    def make():
        torch.manual_seed(0)
        model = lazy_mlir.capture(DropoutMLP().double())
        torch.manual_seed(draw_seed)
        return model
    return make


def test_dropout_draws_what_eager_draws(lazy_level):
    batches = fp64(mlp_batches(3))
    eager = train(dropout_mlp(7), sgd, batches, CPU)
    lazy = train(dropout_mlp(7), sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    other = train(dropout_mlp(8), sgd, batches, CPU)
    assert (other[0] - eager[0]).abs().max() > 1e-6  # the masks matter
    assert metrics.snapshot()["captured_calls"] == 3


def test_saved_values_are_lazy_tensors_only_and_survive_a_sync_before_backward(lazy_level):
    """A direct replay saves its forward's values for the backward as lazy
    tensors only (no aten tensor or SavedVariable each, region_node.h); a
    mark_step between forward and backward computes them with the forward
    (the dropout masks eager drew), the backward reads them as data, and
    then drops them."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 32, dtype=torch.float64), torch.tensor([1, 2, 3, 4])
    grads = {}
    for device in (CPU, LAZY):
        model = dropout_mlp(7)().to(device)
        loss = model(x.to(device), y.to(device))
        if device.type == "lazy":
            saved = loss.grad_fn.saved
            assert len(saved) > 0 and loss.grad_fn.saved_tensors == ()
            assert not any(torch._is_functional_tensor(t) for t in saved.tensors())
            metrics.reset()
            torch._lazy.mark_step()  # the forward runs, its saved values become data
            assert metrics.snapshot()["graph_executions"] == 1, metrics.report()
        loss.backward()
        if device.type == "lazy":
            assert saved.released and len(saved) == 0
            assert all(torch._is_functional_tensor(p.grad) for p in model.parameters())
            metrics.reset()
            torch._lazy.mark_step()
            # the backward's graph: computed from the saved values as data, not a rerun of the forward
            assert metrics.snapshot()["graph_executions"] == 1, metrics.report()
        grads[device.type] = {n: p.grad.cpu() for n, p in model.named_parameters()}
    for name, g in grads["cpu"].items():
        torch.testing.assert_close(grads["lazy"][name], g, **FP64, msg=name)


def test_retain_graph_keeps_the_saved_values(lazy_level):
    """backward(retain_graph=True) keeps what the forward saved, as autograd
    does, so a second backward accumulates the same gradients; a backward
    after one that kept no graph raises autograd's error."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 32, dtype=torch.float64), torch.tensor([1, 2, 3, 4])
    grads = {}
    for device in (CPU, LAZY):
        model = (captured(make_mlp) if device.type == "lazy" else lambda: make_mlp().double())().to(device)
        loss = model(x.to(device), y.to(device))
        loss.backward(retain_graph=True)
        loss.backward()
        if device.type == "lazy":
            assert loss.grad_fn.saved.released
            torch._lazy.mark_step()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()
        grads[device.type] = {n: p.grad.cpu() for n, p in model.named_parameters()}
    assert metrics.snapshot()["captured_calls"] == 1
    for name, g in grads["cpu"].items():
        torch.testing.assert_close(grads["lazy"][name], g, **FP64, msg=name)


def test_batchnorm_buffers_follow_eager(lazy_level):
    batches = fp64(image_batches(3))
    models = {}

    def make(device):
        def build():
            models[device] = lazy_mlir.capture(make_convnet().double())
            return models[device]
        return build

    eager = train(make("cpu"), sgd_momentum, batches, CPU)
    lazy = train(make("lazy"), sgd_momentum, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    for (name, b_eager), (_, b_lazy) in zip(models["cpu"].named_buffers(), models["lazy"].named_buffers()):
        torch.testing.assert_close(b_lazy.cpu(), b_eager, **FP64, msg=name)
    assert metrics.snapshot()["captured_calls"] == 3


def test_a_changed_key_records_again(lazy_level):
    model = lazy_mlir.capture(make_mlp().double()).to(LAZY)
    x, y = fp64(mlp_batches(1))[0]
    reference = make_mlp().double()

    def check(x, y):
        out = model(x.to(LAZY), y.to(LAZY))
        torch._lazy.mark_step()
        torch.testing.assert_close(out.cpu(), reference(x, y), **FP64)

    check(x, y)
    check(x, y)
    assert metrics.snapshot()["capture_records"] == 1
    check(x[:4], y[:4])  # another batch size
    model.eval(), reference.eval()
    check(x, y)  # eval
    with torch.no_grad():
        check(x, y)  # no autograd
    s = metrics.snapshot()
    assert s["capture_records"] == 4 and s["captured_calls"] == 5, metrics.report()
    reference.fc3 = nn.Linear(64, 10).double()  # a replaced submodule: its new parameters are read
    model.fc3 = nn.Linear(64, 10).double().to(LAZY)
    model.fc3.load_state_dict(reference.fc3.state_dict())
    check(x, y)
    assert metrics.snapshot()["capture_records"] == 5
    model.fc1.weight.requires_grad_(False)  # changed in place: the state's signature, not its identity
    check(x, y)
    check(x, y)
    assert metrics.snapshot()["capture_records"] == 6
    with torch.no_grad():  # a replaced parameter: its new value is read
        reference.fc2.weight = nn.Parameter(reference.fc2.weight * 2)
        model.fc2.weight = nn.Parameter(reference.fc2.weight.detach().to(LAZY))
    check(x, y)
    assert metrics.snapshot()["capture_records"] == 7
    model.fc2.register_buffer("unused", torch.zeros(1, dtype=torch.float64).to(LAZY))  # one more state tensor
    check(x, y)
    assert metrics.snapshot()["capture_records"] == 8


def test_state_entries_see_every_change_to_the_dicts():
    """The check that lets a captured call skip walking its module tree."""
    weight, bias = object(), object()
    params, buffers = {"weight": weight, "bias": bias}, {}
    entries = _C.StateEntries([params, buffers], [(params, "weight", weight), (params, "bias", bias)])
    assert entries.unchanged()
    params["weight"] = object()  # replaced
    assert not entries.unchanged()
    params["weight"] = weight
    assert entries.unchanged()
    buffers["running_mean"] = object()  # added
    assert not entries.unchanged()
    del buffers["running_mean"], params["bias"]  # removed
    assert not entries.unchanged()
    params["bias"] = None  # the same length, another value
    assert not entries.unchanged()
    with pytest.raises(TypeError):
        _C.StateEntries([[]], [])


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
def test_records_are_bounded(lazy_level):
    """A key that keeps changing (a new batch size at every call): RECORD_LIMIT
    records, then a warning naming what changed, and op-by-op calls that
    still equal eager."""
    from lazy_mlir.trace.capture import RECORD_LIMIT

    model = lazy_mlir.capture(make_mlp().double()).to(LAZY)
    reference = make_mlp().double()
    x, y = fp64(mlp_batches(1, batch=RECORD_LIMIT + 2))[0]
    with pytest.warns(UserWarning, match="argument dtypes/shapes/values"):
        for n in range(1, RECORD_LIMIT + 3):
            out = model(x[:n].to(LAZY), y[:n].to(LAZY))
            torch._lazy.mark_step()
            torch.testing.assert_close(out.cpu(), reference(x[:n], y[:n]), **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == RECORD_LIMIT and s["captured_calls"] == RECORD_LIMIT, metrics.report()
    assert s["capture_refused"] == 2 and "MLP" in s["capture_refusals"], metrics.report()


class ReadsValues(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x, y):
        h = self.fc(x)
        if h.sum() > 0:  # Python that reads a value: cannot be recorded
            h = h * 2
        return F.cross_entropy(h, y)


def test_a_forward_that_reads_values_runs_op_by_op(lazy_level):
    def make():
        torch.manual_seed(0)
        return lazy_mlir.capture(ReadsValues().double())

    batches = fp64(mlp_batches(2))
    eager = train(make, sgd, batches, CPU)
    # the warning names the line that read the value
    line = ReadsValues.forward.__code__.co_firstlineno + 2
    with pytest.warns(UserWarning, match=rf"ReadsValues.forward could not be recorded, it runs op by op "
                                         rf"\(.*, at .*test_capture.py:{line} \(forward\)\)"):
        lazy = train(make, sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_refused"] == 2 and s["captured_calls"] == 0, metrics.report()
    assert "ReadsValues" in s["capture_refusals"]


class MakesATensor(nn.Module):
    """A forward that builds a tensor from data on its input's device, as
    transformers' DynamicCache does (``torch.tensor([], device=...)``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x, y):
        scale = torch.tensor([0.5], dtype=x.dtype, device=x.device)
        return F.cross_entropy(self.fc(x) * scale, y)


def test_a_tensor_built_from_data_records_where_a_gpu_is_seen(lazy_level, monkeypatch):
    """With a GPU in the machine, FakeTensorMode lets ``torch.tensor(data,
    device=...)`` build a real tensor on the device and then fakes it, which
    it cannot do for a lazy one ("meta converter nyi", seen on an H200):
    the capture must build it on the CPU and move it under the mode, as
    FakeTensorMode does without a GPU."""
    from torch._subclasses import FakeTensorMode
    monkeypatch.setattr(FakeTensorMode, "avoid_device_init", property(lambda self: False))

    def make():
        torch.manual_seed(0)
        return lazy_mlir.capture(MakesATensor().double())

    batches = fp64(mlp_batches(2))
    eager = train(make, sgd, batches, CPU)
    lazy = train(make, sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_refused"] == 0 and s["captured_calls"] == 2, metrics.report()


class KeywordInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, y=None, z=None):
        out = self.fc(x)
        if y is not None:
            out = out + 3 * y
        if z is not None:
            out = out * z
        return out


def test_tensor_calls_keep_their_structure_per_keyword_names(lazy_level):
    """A call with tensor arguments only keeps its pytree spec per argument
    count and keyword names (CapturedForward._flatten): calls alike in
    count but not in names or order still pass each tensor where it goes."""
    torch.manual_seed(0)
    eager = KeywordInputs().double()
    model = lazy_mlir.capture(KeywordInputs().double().to(LAZY))
    model.load_state_dict(eager.state_dict())
    x, a, b = (torch.randn(4, 8, dtype=torch.float64) for _ in range(3))
    calls = [((x,), {"y": a}), ((x,), {"z": a}), ((x, a), {}), ((x,), {"y": a, "z": b}), ((x,), {"z": b, "y": a}),
             ((x, None, a), {}), ((x,), {"z": a})]
    for args, kwargs in calls:
        expected = eager(*args, **kwargs)
        lazy = model(*(t if t is None else t.to(LAZY) for t in args), **{k: t.to(LAZY) for k, t in kwargs.items()})
        torch._lazy.mark_step()
        torch.testing.assert_close(lazy.cpu(), expected, **FP64, msg=f"{len(args)} args, {list(kwargs)}")
    assert metrics.snapshot()["captured_calls"] == len(calls)


class LogitsMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.3, self.training))


def test_a_loss_function_replays_with_its_model(lazy_level):
    """capture(fn, modules=[model]): the loss and its backward are in the
    node (no nll_loss traced op by op); train/eval of the model is keyed."""
    import torch._lazy.metrics as ltc_metrics

    batches = fp64(mlp_batches(3))
    losses_of = {}  # model -> its loss function (captured on the lazy device)

    def loss_fn(model, x, y):
        if model not in losses_of:
            def loss_of(x, y):
                return F.cross_entropy(model(x), y)
            losses_of[model] = lazy_mlir.capture(loss_of, modules=[model]) if x.device.type == "lazy" else loss_of
        return losses_of[model](x, y)

    def make():
        torch.manual_seed(0)
        model = LogitsMLP().double()
        torch.manual_seed(7)  # the dropout masks
        return model

    def evaluated(device):
        model = next(m for m in losses_of if next(m.parameters()).device.type == device.type)
        model.eval()
        x, y = batches[0]
        return loss_fn(model, x.to(device), y.to(device)).detach().cpu()

    eager = train(make, sgd, batches, CPU, loss_fn=loss_fn)
    lazy = train(make, sgd, batches, LAZY, loss_fn=loss_fn,
                 after_step=lambda i: ltc_metrics.reset() if i == 0 else None)  # step 0 records on fakes
    assert_same_training(eager, lazy, **FP64)
    torch.testing.assert_close(evaluated(LAZY), evaluated(CPU), **FP64)  # eval: no dropout, a record of its own
    s = metrics.snapshot()
    assert s["capture_records"] == 2 and s["captured_calls"] == 4 and s["capture_refused"] == 0, metrics.report()
    assert s["captured_direct_calls"] == 4, metrics.report()  # a loss: nothing for AOTAutograd's wrappers to do
    assert_compiled(s, calls=2)  # the steps after the reset ran generated code
    assert not ltc_metrics.counter_value("lazy::nll_loss_forward"), "the loss was traced op by op"
    with pytest.raises(TypeError, match="modules="):
        lazy_mlir.capture(lambda x: x)
    with pytest.raises(TypeError, match="modules= is for a function"):
        lazy_mlir.capture(LogitsMLP(), modules=[LogitsMLP()])


class ReturnsWeightView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(x), y), self.fc.weight.view(-1)


def test_an_output_aliasing_an_input_keeps_aotautograd(lazy_level):
    """AOTAutograd regenerates an output that is a view of an input (here a
    parameter), so that it aliases the caller's tensor: such a record is not
    replayed directly, and the output is still the parameter's view."""
    batches = fp64(mlp_batches(2))

    def run(device):
        torch.manual_seed(0)
        model = ReturnsWeightView().double().to(device)
        if device == LAZY:
            lazy_mlir.capture(model)
        opt = sgd(model)
        losses = []
        for x, y in batches:
            loss, flat = model(x.to(device), y.to(device))
            assert flat._base is model.fc.weight
            (loss + flat.square().sum()).backward()
            opt.step()
            opt.zero_grad()
            if device == LAZY:
                torch._lazy.mark_step()
            losses.append(loss.item())
        return torch.tensor(losses)

    torch.testing.assert_close(run(LAZY), run(CPU), **FP64)
    s = metrics.snapshot()
    assert s["captured_calls"] == 2 and s["captured_direct_calls"] == 0, metrics.report()
    assert_compiled(s, calls=2)


def test_hugging_face_model_replays_and_matches_eager(lazy_level):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
    import training
    import zoo

    v = zoo.base_variant("bert")  # padded 2-D attention mask
    eager = training.train(v, CPU, shapes=False)
    lazy = training.train(v, LAZY, shapes=False, capture=True)
    torch.testing.assert_close(lazy.losses, eager.losses, rtol=1e-9, atol=1e-10)
    for name, p in eager.params.items():
        torch.testing.assert_close(lazy.params[name], p, rtol=1e-9, atol=1e-10, msg=name)
    for phase, s in lazy.phases.items():
        report = f"{phase}:\n{lazy.reports[phase]}"
        assert s["captured_calls"] == s["mark_steps"] > 0 and s["capture_refused"] == 0, report
        assert_compiled(s, calls=s["mark_steps"])
        assert s["fallback_count"] == 0 and s["graph_executions"] == s["mark_steps"], report
    assert lazy.phases["steady"]["compiles"] == lazy.phases["steady"]["capture_records"] == 0


class Interpolates(nn.Module):
    """Bicubic upsampling records through torch._decomp: its backward
    writes with _unsafe_index_put(grad, [None, None, rows, columns], ...),
    which ts_to_fx gives explicit indices for torch-mlir's importer."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(1, 4, 4, 4))

    def forward(self, x, y):
        up = F.interpolate(self.p, size=(6, 6), mode="bicubic", align_corners=False)
        return F.mse_loss(up * x, y)


def test_bicubic_backward_compiles(lazy_level):
    def make():
        torch.manual_seed(0)
        return lazy_mlir.capture(Interpolates().double())

    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64),
                torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64)) for _ in range(2)]
    eager = train(make, sgd, batches, CPU)
    lazy = train(make, sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["captured_calls"] == 2, metrics.report()
    assert_compiled(s, calls=2)


class SplitsAndUnbinds(nn.Module):
    """Ops whose lazy kernels are lazy_kernels' hand-written ones (split and
    unbind as one slice/select per piece, lerp), as attention code splits
    a fused qkv projection."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(6, 18)

    def forward(self, x, y):
        q, k, v = self.qkv(x).split(6, dim=-1)
        rows = torch.stack([r.tanh() for r in torch.unbind(q * k, dim=0)])
        return F.mse_loss(torch.lerp(rows, v, 0.25), y)


def test_hand_written_kernels_replay_in_one_group(lazy_level):
    """A region emits what those kernels emit, so the step is one fusion
    group as op by op: a Tensor[]-returning op in a region would end it."""
    def make():
        torch.manual_seed(0)
        return lazy_mlir.capture(SplitsAndUnbinds().double())

    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(3, 6, generator=g, dtype=torch.float64),
                torch.randn(3, 6, generator=g, dtype=torch.float64)) for _ in range(3)]
    eager = train(make, sgd, batches, CPU)
    lazy = train(make, sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["captured_calls"] == 3 and s["capture_records"] == 1, metrics.report()
    assert_compiled(s, calls=3)
    assert set(s["groups_per_graph"].values()) == {1}, metrics.report()


def test_parameter_gradients_skip_accumulate_grads_detach(lazy_level):
    """A direct replay's backward stores each parameter's gradient into
    .grad itself (_C.store_leaf_grads) where AccumulateGrad would store it
    as is: no detach traced per parameter. Where AccumulateGrad does more it
    gets the gradient: an existing .grad accumulates, a hook sees it, and
    autograd.grad() returns it and leaves .grad alone. All equal eager."""
    import torch._lazy.metrics as ltc_metrics

    eager = make_mlp().double()
    lazy = lazy_mlir.capture(make_mlp().double().to(LAZY))
    (x, y), = fp64(mlp_batches(1))

    def backward(model, device, grad=False, create_graph=False):
        """The gradients, and the detaches the backward traced."""
        loss = model(x.to(device), y.to(device))
        ltc_metrics.reset()
        grads = torch.autograd.grad(loss, list(model.parameters())) if grad else None
        if not grad:
            loss.backward(create_graph=create_graph)
        detaches = ltc_metrics.counter_value("lazy::detach_copy") or 0
        grads = list(grads or [p.grad for p in model.parameters()])
        # read together: one graph (each its own .cpu() would compile a graph
        # per gradient; a detached view of one would too, its base updated in place)
        with torch.no_grad():
            return (torch._lazy.to_cpu(grads) if device == LAZY else grads), detaches

    def both(**kwargs):
        (expected, _), (got, detaches) = backward(eager, CPU, **kwargs), backward(lazy, LAZY, **kwargs)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, **FP64)
        return detaches

    def set_to_none():
        for model in (eager, lazy):
            model.zero_grad(set_to_none=True)

    assert both() == 0  # stored by the replay: no AccumulateGrad detach (6 parameters)
    both()  # .grad already there: AccumulateGrad adds in place (no detach either way)
    set_to_none()
    seen = []
    lazy.fc1.weight.register_hook(lambda g: seen.append(g.cpu()))
    assert both() == 1  # the hooked parameter's gradient goes through AccumulateGrad, hook first
    torch.testing.assert_close(seen[0], eager.fc1.weight.grad, **FP64)
    set_to_none()
    both(grad=True)
    assert all(p.grad is None for p in lazy.parameters())
    with pytest.warns(UserWarning, match="create_graph=True"):  # torch's reference-cycle warning
        both(create_graph=True)
    # AccumulateGrad under grad mode stores a clone of each gradient
    assert ltc_metrics.counter_value("lazy::empty_strided_symint") == 6
    set_to_none()
    assert metrics.snapshot()["captured_direct_calls"] == 5, metrics.report()
    torch._lazy.mark_step()  # nothing pending left for the next test's first graph


def test_the_first_call_holds_no_input_and_traces_the_later_steps_graph(lazy_level):
    """The record outlives its first call but keeps none of that call's
    tensors: a batch still alive at mark_step is a root of the step's graph,
    read outside its group, so the first step would trace another graph than
    every later one (compiled again) and its batch would never be freed."""
    import weakref

    model = make_convnet().to(LAZY)  # SGD without momentum: its first step is the steady one
    loss_of = lazy_mlir.capture(lambda x, y: model(x, y), modules=[model])
    opt = sgd(model)
    held, misses = [], []
    for x, y in image_batches(3, batch=3):  # a batch size of its own: LTC's graph cache is per process
        metrics.reset()
        x, y = x.to(LAZY), y.to(LAZY)
        held.append(weakref.ref(x))
        loss_of(x, y).backward()
        opt.step()
        opt.zero_grad()
        del x, y
        torch._lazy.mark_step()
        misses.append(metrics.snapshot()["cache_misses"])
        assert_compiled(calls=1)
    assert [ref() is None for ref in held] == [True, True, True]
    assert misses == [1, 0, 0], metrics.report()


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        return self.used(x), self.unused(x)


def test_an_output_the_loss_leaves_out_gives_none_gradients(lazy_level):
    """Eagerly autograd never reaches the parameters behind an output the
    loss does not use: their gradients stay None and AdamW skips them (no
    weight decay). A captured replay's backward took zeros for that output
    and gave those parameters zero gradients, which AdamW stepped."""
    runs = {}
    for device in (CPU, LAZY):
        torch.manual_seed(0)
        model = _TwoHeads().double()
        if device == LAZY:
            lazy_mlir.capture(model)
        model = model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
        for step in range(3):
            metrics.reset()
            used, _ = model(torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
                            .to(device))
            used.square().sum().backward()
            assert model.unused.weight.grad is None and model.used.weight.grad is not None
            opt.step()
            opt.zero_grad()
            if device == LAZY:
                torch._lazy.mark_step()
                assert metrics.snapshot()["captured_direct_calls"] == 1, metrics.report()
                assert_compiled()
        with torch.no_grad():
            runs[device.type] = {n: p.cpu() for n, p in model.named_parameters()}
    for name, p in runs["cpu"].items():
        torch.testing.assert_close(runs["lazy"][name], p, rtol=1e-12, atol=1e-12, msg=name)


class _KeepsAWindow(nn.Module):
    """Returns, beside its loss, the last 3 positions of an intermediate
    (a sliding-window cache's keys): a slice, strided over its base."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        full = torch.cat([x, self.proj(x)], dim=-2)  # (2, 2, 8, 8)
        return full.tanh().square().mean(), full[:, :, -3:, :]


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
@pytest.mark.parametrize("window_in_loss", [False, True], ids=["window-unused", "window-in-loss"])
def test_an_output_sliced_from_an_intermediate_gets_its_gradient(lazy_level, window_in_loss):
    """AOTAutograd gives each gradient coming into a captured backward its
    output's strides with an empty_strided copy. LTC's empty_strided was
    the sizes' elements viewed with those strides: past the end of its
    buffer for a slice (TorchScript refused it, Inductor's code read beyond
    it): Mistral and Starcoder2 failed at O0 with automatic capture."""
    batches = [torch.randn(2, 2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
               for i in range(3)]

    def run(device):
        torch.manual_seed(0)
        model = _KeepsAWindow().double().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for x in batches:
            loss, window = model(x.to(device))
            total = loss + window.sin().sum() if window_in_loss else loss
            total.backward()
            opt.step()
            opt.zero_grad()
            if device == LAZY:
                torch._lazy.mark_step()
            losses.append(total.item())
        return torch.tensor(losses), {n: p.detach().cpu() for n, p in model.named_parameters()}

    eager_losses, eager_params = run(CPU)
    metrics.reset()
    lazy_losses, lazy_params = run(LAZY)
    torch.testing.assert_close(lazy_losses, eager_losses, **FP64)
    for name, p in eager_params.items():
        torch.testing.assert_close(lazy_params[name], p, **FP64, msg=name)
    s = metrics.snapshot()
    assert s["captured_calls"] == 3 and s["capture_refused"] == 0, metrics.report()
    assert s["graph_executions"] == 3 and s["fallback_count"] == 0, metrics.report()
    if lazy_level == "O1":
        assert_compiled(s, calls=3)


def test_empty_strided_spans_its_strides(lazy_level):
    """A lazy empty_strided with gaps (a slice's strides) holds every value
    written into it."""
    values = torch.arange(96, dtype=torch.float64).reshape(2, 2, 3, 8)
    out = torch.empty_strided((2, 2, 3, 8), (128, 64, 8, 1), dtype=torch.float64, device=LAZY)
    out.copy_(values.to(LAZY))
    doubled = out * 2
    torch._lazy.mark_step()
    assert torch.equal(out.cpu(), values) and torch.equal(doubled.cpu(), values * 2)
    assert torch.empty_strided((0, 3), (5, 1), device=LAZY).shape == (0, 3)


# ------------------------------------------------------- Python the replay does not run
class CountsCalls(nn.Module):
    """Branches on a counter its forward increments."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)
        self.calls = 0

    def forward(self, x, y):
        self.calls += 1
        h = torch.tanh(self.fc1(x))
        if self.calls % 2 == 0:
            h = h * 2
        return F.cross_entropy(self.fc2(h), y)


@pytest.mark.parametrize("how", HOW)
def test_a_forward_that_changes_an_attribute_runs_op_by_op(lazy_level, how):
    """A replay would take the branch of the record at every step, and the
    record ran the forward twice (AOTAutograd traces it twice): the counter
    is put back, the module refused with a warning naming the attribute, and
    every step runs the forward once, as eagerly."""
    batches = fp64(mlp_batches(6))
    models = {}

    def make(device):
        def build():
            torch.manual_seed(0)
            models[device] = as_trained(CountsCalls().double(), how)
            return models[device]
        return build

    eager = train(make("cpu"), sgd, batches, CPU)
    with refusal_told(how, r"CountsCalls.forward runs op by op from now on \(it changes Python state "
                           r"that a replay would not: CountsCalls.calls attribute changed\)"):
        lazy = train(make("lazy"), sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    assert models["lazy"].calls == models["cpu"].calls == 6
    s = metrics.snapshot()
    assert s["capture_records"] == 0 and s["captured_calls"] == 0 and s["capture_refused"] == 6, metrics.report()
    assert "CountsCalls.calls" in s["capture_refusals"]["CountsCalls"]


class LayerDrop(nn.Module):
    """Skips each layer with probability 1/2 in training (LayerDrop), drawn
    from Python's random."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        h = self.fc(x)
        for layer in self.layers:
            if not self.training or random.random() >= 0.5:
                h = torch.tanh(layer(h))
        return F.cross_entropy(self.head(h), y)


@pytest.mark.parametrize("how", HOW)
def test_a_forward_that_draws_from_pythons_random_runs_op_by_op(lazy_level, how):
    """A replay would keep the layers of the record's draws at every step:
    the module is refused with a warning naming the draw's line, Python's
    random is put back as before the record, and the steps draw what eager
    draws, no more."""
    batches = fp64(mlp_batches(6))

    def make():
        torch.manual_seed(0)
        random.seed(3)
        return as_trained(LayerDrop().double(), how)

    eager = train(make, sgd, batches, CPU)
    eager_random = random.getstate()
    line = LayerDrop.forward.__code__.co_firstlineno + 3
    with refusal_told(how, rf"LayerDrop.forward runs op by op from now on \(.*Python's random was "
                           rf"drawn from at .*test_capture.py:{line}\)"):
        lazy = train(make, sgd, batches, LAZY)
    assert random.getstate() == eager_random
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 0 and s["captured_calls"] == 0 and s["capture_refused"] == 6, metrics.report()


GELU = True  # read by GlobalFlag.forward, flipped by the training loop


class GlobalFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x, y):
        h = self.fc1(x)
        h = F.gelu(h) if GELU else torch.tanh(h)
        return F.cross_entropy(self.fc2(h), y)


@pytest.mark.parametrize("how", HOW)
def test_a_global_the_forward_reads_is_in_the_key(lazy_level, how):
    """A module-level flag the forward reads, flipped mid-training, records
    again; flipped back, the first record replays."""
    global GELU
    batches = fp64(mlp_batches(6))

    def make():
        torch.manual_seed(0)
        return as_trained(GlobalFlag().double(), how)

    def flip(step):
        global GELU
        if step in (1, 3):
            GELU = not GELU

    runs = []
    try:
        for device in (CPU, LAZY):
            GELU = True
            runs.append(train(make, sgd, batches, device, after_step=flip))
    finally:
        GELU = True
    assert_same_training(*runs, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 2 and s["captured_calls"] == 6 and s["capture_refused"] == 0, metrics.report()


STEPS = 0  # counted by WritesAGlobal.forward


class WritesAGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x, y):
        global STEPS
        STEPS += 1
        h = torch.tanh(self.fc1(x))
        return F.cross_entropy(self.fc2(h if STEPS % 3 else -h), y)


@pytest.mark.parametrize("how", HOW)
def test_a_forward_that_writes_a_global_runs_op_by_op(lazy_level, how):
    """The global is put back, the module refused with a warning naming the
    global and the line that writes it; each step writes it once, as eagerly."""
    global STEPS
    batches = fp64(mlp_batches(6))

    def make():
        torch.manual_seed(0)
        return as_trained(WritesAGlobal().double(), how)

    STEPS = 0
    eager = train(make, sgd, batches, CPU)
    assert STEPS == 6
    STEPS = 0
    line = WritesAGlobal.forward.__code__.co_firstlineno + 2
    with refusal_told(how, rf"WritesAGlobal.forward runs op by op .*global STEPS was written at "
                           rf".*test_capture.py:{line}"):
        lazy = train(make, sgd, batches, LAZY)
    assert STEPS == 6
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 0 and s["capture_refused"] == 6, metrics.report()


class Activation(nn.Module):
    def __init__(self):
        super().__init__()
        self.kind = "gelu"

    def forward(self, h):
        return F.gelu(h) if self.kind == "gelu" else torch.tanh(h)


class AttributeFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(32, 64), Activation(), nn.Linear(64, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(self.act(self.fc1(x))), y)


def _recording_factory(module_class, how):
    """(make, models): make() builds a float64 ``module_class`` as ``how``
    trains it and keeps it in models, for edits between steps."""
    models = []

    def make():
        torch.manual_seed(0)
        models.append(as_trained(module_class().double(), how))
        return models[-1]

    return make, models


@pytest.mark.parametrize("how", HOW)
def test_a_module_attribute_set_between_steps_is_in_the_key(lazy_level, how):
    """A submodule's attribute the training loop sets between steps records
    again; set back, the first record replays."""
    batches = fp64(mlp_batches(6))
    make, models = _recording_factory(AttributeFlag, how)

    def switch(step):
        if step in (1, 3):
            act = models[-1].act
            act.kind = "tanh" if act.kind == "gelu" else "gelu"

    eager = train(make, sgd, batches, CPU, after_step=switch)
    lazy = train(make, sgd, batches, LAZY, after_step=switch)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 2 and s["captured_calls"] == 6 and s["capture_refused"] == 0, metrics.report()


class Settings:
    """A model's settings object (as Hugging Face's config), shared by its modules."""

    def __init__(self):
        self.activation = "gelu"
        self.scale = 1.0


class SettingsFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = Settings()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x, y):
        h = self.fc1(x) * self.config.scale
        h = F.gelu(h) if self.config.activation == "gelu" else torch.tanh(h)
        return F.cross_entropy(self.fc2(h), y)


@pytest.mark.parametrize("how", HOW)
def test_a_settings_objects_field_set_between_steps_is_in_the_key(lazy_level, how):
    """The plain fields of an object a module holds (its config) are in the
    key as the module's own attributes are: edited mid-training (a new
    activation, then a new scale), the forward records again."""
    batches = fp64(mlp_batches(6))
    make, models = _recording_factory(SettingsFlag, how)

    def edit(step):
        if step == 1:
            models[-1].config.activation = "tanh"
        if step == 3:
            models[-1].config.scale = 0.5

    eager = train(make, sgd, batches, CPU, after_step=edit)
    lazy = train(make, sgd, batches, LAZY, after_step=edit)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 3 and s["captured_calls"] == 6 and s["capture_refused"] == 0, metrics.report()
    assert_compiled(s, calls=6)  # the replays ran generated code, not TorchScript


@pytest.mark.parametrize("how", HOW)
def test_a_copied_or_saved_model_is_captured_anew(lazy_level, how, tmp_path):
    """``copy.deepcopy(model)`` (an EMA model) after a step, and the model
    saved whole (``torch.save``, moved to the CPU) and loaded: each records
    its own forward at its first lazy call (records hold the original's
    tensors), and both train as the original."""
    import copy

    batches = fp64(mlp_batches(2))
    torch.manual_seed(0)
    model = as_trained(make_mlp().double(), how).to(LAZY)
    opt = sgd(model)
    x, y = batches[0]
    model(x.to(LAZY), y.to(LAZY)).backward()
    opt.step()
    opt.zero_grad()
    torch._lazy.mark_step()
    twin = copy.deepcopy(model)
    torch.save(copy.deepcopy(model).to(CPU), tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False).to(LAZY)
    metrics.reset()
    losses = []
    for m in (model, twin, loaded):
        loss = m(batches[1][0].to(LAZY), batches[1][1].to(LAZY))
        loss.backward()
        torch._lazy.mark_step()
        losses.append(loss.item())
    assert losses[0] == losses[1] == losses[2]
    s = metrics.snapshot()
    # the copy and the loaded model record at their first call (loaded: Config.capture)
    assert s["captured_calls"] == 3 and s["capture_records"] == 2, metrics.report()
    assert_compiled(s, calls=3)


class Tanh2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        h = torch.tanh(self.fc(x))
        return F.cross_entropy(self.head(h), y)


def test_a_record_names_the_users_lines_without_reading_source_files(lazy_level, monkeypatch):
    """A record's ops name the user's line (errors, dumps) from stack traces
    of file, line and function: torch's stack traces with each frame's
    source text read every file of the forward's frames into linecache for
    the process's life (a ResNet's record held ~9 MB more)."""
    import linecache
    from lazy_mlir.trace import capture as capture_module
    named = []

    def source_of(node, real=capture_module._source_of):
        named.append(real(node))
        return named[-1]

    monkeypatch.setattr(capture_module, "_source_of", source_of)
    linecache.clearcache()
    torch.manual_seed(0)
    batches = fp64(mlp_batches(2))
    train(captured(Tanh2), sgd, batches, LAZY)
    assert metrics.snapshot()["capture_records"] == 1, metrics.report()
    line = Tanh2.forward.__code__.co_firstlineno + 1
    assert any(s and s.endswith(f"test_capture.py forward {line}") for s in named), named
    # frames inside the forward only (Linear's, F.cross_entropy's): read by no other stack
    read = [f for f in linecache.cache if f.endswith(("torch/nn/modules/linear.py", "torch/nn/functional.py"))]
    assert not read, read


class ChannelsLastPool(nn.Module):
    """ConvNeXt's pattern (torchvision): a block computed channels-last
    (permuted to NHWC and back), then adaptive average pooling, whose
    kernel sets a channels-last result's strides with ``as_strided_``."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, x, y):
        h = self.conv(x)
        h = self.mix(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) + h  # channels-last, as the first operand
        return F.cross_entropy(self.head(F.adaptive_avg_pool2d(h, 1).flatten(1)), y)


@pytest.mark.parametrize("how", HOW)
def test_a_forward_with_an_in_place_view_op_is_recorded(lazy_level, how):
    """AOTAutograd applies an in-place view op (``as_strided_``) to its
    functional wrapper of a lazy tensor on the wrapper's own device kernel:
    recorded, as eager computes, with no eager op."""
    batches = fp64(image_batches(3))

    def make():
        torch.manual_seed(0)
        return as_trained(ChannelsLastPool().double(), how)

    eager = train(make, sgd, batches, CPU)
    lazy = train(make, sgd, batches, LAZY)
    assert_same_training(eager, lazy, **FP64)
    s = metrics.snapshot()
    assert s["capture_records"] == 1 and s["capture_refused"] == 0 and s["fallback_count"] == 0, metrics.report()
    assert_compiled(s, calls=len(batches))  # generated code ran, not TorchScript
