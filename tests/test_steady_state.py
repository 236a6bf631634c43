"""The first training step traces the steady-state graph (one compile for
the whole run): automatically (``auto_prepare``) or through
``lazy_mlir.prepare``; training is unchanged."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import lazy_mlir
from helpers import assert_compiled, assert_same_training
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics
from lazy_mlir.trace import steady_state

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))

STEPS = 3


def _cfg(n_embd: int) -> GPTConfig:
    # each test its own width: LTC's graph cache must not serve another test's graphs
    return GPTConfig(n_layer=1, n_head=2, n_embd=n_embd, vocab_size=40, block_size=8, batch_size=2)


def _train(cfg, device, prepare: bool = False):
    return _train_model(make_gpt(cfg).to(device), cfg, prepare)


def _train_model(model, cfg, prepare: bool = False, batches=None, keep=lambda loss: loss.item()):
    """``batches`` (default: STEPS fresh ones); ``keep(loss)`` after each
    step gives what the returned losses are made of."""
    device = next(model.parameters()).device
    opt = make_adamw(model)
    if prepare:
        lazy_mlir.prepare(model, opt)
    losses, misses, snaps = [], [], []
    for x, y in batches or gpt_batches(cfg, steps=STEPS):
        metrics.reset()
        loss = model(x.to(device), y.to(device))  # the inputs are on the device before the first forward
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazy":
            torch._lazy.mark_step()
            snap = metrics.snapshot()
            misses.append(snap["cache_misses"])
            snaps.append(snap)
            assert_compiled(snap, calls=1)
            assert snap["graph_executions"] == 1 and snap["syncs"] == {}, metrics.report()
        losses.append(keep(loss))
    with torch.no_grad():
        params = {n: p.cpu() for n, p in model.named_parameters()}
    return (torch.stack([torch.as_tensor(v) for v in losses]).cpu(), params), misses, snaps


@pytest.mark.parametrize("how,width", [("auto", 24), ("prepare", 20)])
def test_first_step_traces_the_steady_state_graph(lazy_level, how, width):
    eager, _, _ = _train(_cfg(width), torch.device("cpu"))
    lazy, misses, snaps = _train(_cfg(width), torch.device("lazy"), prepare=how == "prepare")
    assert misses == [1, 0, 0]  # with auto_prepare off: [1, 1, 0] (test below)
    # nor does a group compile again: its inputs alias one another as in every later step
    assert [s["group_cache_misses"] > 0 for s in snaps] == [True, False, False], metrics.report()
    # the setup graph ran before step 0's forward (auto) or in prepare (before the reset)
    assert [s["setup_graphs"] for s in snaps] == ([1, 0, 0] if how == "auto" else [0, 0, 0])
    # AdamW's first updates of near-zero biases amplify fp32 rounding (~1e-6,
    # the same without prepare): the tolerance test_compile_path uses
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_without_auto_prepare_the_first_step_traces_another_graph(lazy_level, monkeypatch):
    monkeypatch.setattr(lazy_mlir.config.current, "auto_prepare", False)
    eager, _, _ = _train(_cfg(16), torch.device("cpu"))
    lazy, misses, snaps = _train(_cfg(16), torch.device("lazy"))
    assert misses == [1, 1, 0] and all(s["setup_graphs"] == 0 for s in snaps)
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_state_created_as_device_data_only_in_the_first_step(lazy_level):
    model = make_gpt(_cfg(28)).to("lazy")
    opt = make_adamw(model)
    x, y = next(gpt_batches(_cfg(28)))
    model(x.to("lazy"), y.to("lazy")).backward()
    created = []
    real_full = torch.full

    def full(*args, **kwargs):
        created.append(args[0])
        return real_full(*args, **kwargs)

    torch.full = full  # _StateAsDeviceData makes state with torch.full on the CPU
    try:
        opt.step()
    finally:
        torch.full = real_full
    assert len(created) == 2 * len(list(model.parameters()))  # exp_avg and exp_avg_sq of each
    assert steady_state._first_steps == {}  # the mode is gone after the step
    exp_avg = opt.state[model.wte.weight]["exp_avg"]
    assert exp_avg.device.type == "lazy" and exp_avg.shape == model.wte.weight.shape
    torch._lazy.mark_step()
    # outside it: a graph op (an expanded scalar, fill_kernels.h), not state-sized device data
    assert "is_scalar_expand=1" in torch._C._lazy._get_tensors_text([torch.zeros_like(exp_avg)])


def test_state_is_the_buffer_made_for_it(lazy_level):
    """The first step's state is adopted as device data: its buffer, not
    .to("lazy")'s two copies (AdamW's moments would be thrice in memory for
    a moment: the GPT-2-small shape's peak was 1.4x eager's)."""
    value = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    lazy = _C.adopt_as_device_data(value)
    assert lazy.device.type == "lazy" and _C.device_data_ptr(lazy) == value.data_ptr()
    torch.testing.assert_close((lazy * 2).cpu(), value * 2)
    with pytest.raises(RuntimeError, match="contiguous"):
        _C.adopt_as_device_data(value.t())


def test_prepare_refuses_a_model_not_on_the_lazy_device():
    with pytest.raises(ValueError, match="no parameter on the lazy device"):
        lazy_mlir.prepare(make_gpt(_cfg(24)))


def test_torch_compile_in_the_same_process(lazy_level):
    """lazy_mlir's hooks are global (every module's forward, every optimizer
    step, torch.optim.adam.adam): a CPU model under torch.compile in the same
    process must trace and train as without lazy_mlir."""
    torch._dynamo.reset()
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=12, vocab_size=40, block_size=8, batch_size=2)

    def train(compiled: bool):
        model = make_gpt(cfg)
        opt = make_adamw(model)
        forward = torch.compile(model, backend="eager", fullgraph=True) if compiled else model
        opt_step = torch.compile(opt.step, backend="eager") if compiled else opt.step
        losses = []
        for x, y in gpt_batches(cfg, steps=STEPS):
            loss = forward(x, y)
            loss.backward()
            opt_step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, [p.detach().clone() for p in model.parameters()]

    (eager_losses, eager_params), (losses, params) = train(False), train(True)
    assert losses == pytest.approx(eager_losses, rel=1e-6)
    for p, q in zip(params, eager_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _forward_hooked() -> bool:
    return torch.nn.Module.__call__ is steady_state._call_while_unsettled


@pytest.fixture
def own_unsettled(monkeypatch):
    """Only this test's lazy parameters count as unsettled (others' models,
    still alive, keep the hook armed for theirs once it ends)."""
    import weakref
    before = steady_state._unsettled
    monkeypatch.setattr(steady_state, "_unsettled", weakref.WeakValueDictionary())
    yield
    monkeypatch.undo()
    if before:
        steady_state._arm()


@pytest.mark.parametrize("width", [26])
def test_the_first_call_wrapper_is_armed_only_while_a_lazy_parameter_is_unsettled(lazy_level, own_unsettled,
                                                                                     width):
    """A Python frame per module call (the wrapper of nn.Module.__call__ that
    sees a model's first call) only while needed; a
    model moved to or built on the lazy device later is still settled, and
    its first step compiles the steady-state graph."""
    moved = make_gpt(_cfg(width)).to("lazy")
    assert _forward_hooked()
    lazy, misses, _ = _train_model(moved, _cfg(width))
    assert misses == [1, 0, 0] and not _forward_hooked()
    assert not steady_state._unsettled

    torch.manual_seed(1)
    with torch.device("lazy"):
        built = make_gpt(_cfg(width))  # built on the device: no .to()
    assert _forward_hooked()
    _, misses, _ = _train_model(built, _cfg(width))
    # Its first step is the moved model's steady-state graph (served by the
    # graph cache: nothing compiles); its causal-mask buffer, a view of a
    # tril built on the device, was settled too.
    assert misses == [0, 0, 0] and not _forward_hooked()

    frozen = torch.nn.Linear(3, 3).requires_grad_(False).to("lazy")  # nothing to settle: no hook for it
    assert not _forward_hooked() and id(frozen.weight) not in steady_state._unsettled


def test_a_hf_model_built_on_the_lazy_device_compiles_once(lazy_level):
    """HF Llama (the zoo's) built under torch.device("lazy"): its buffers'
    bases are settled too, else its first step compiles apart (it did)."""
    import zoo
    v, spec = zoo.base_variant("llama"), zoo.SPECS["llama"]
    with torch.device("lazy"):
        model = zoo.make_model(v, torch.float32)
    opt = spec.optimizer(model)
    g = torch.Generator().manual_seed(0)
    misses = []
    for _ in range(3):
        batch = [x.to("lazy") for x in spec.inputs(v, zoo.BATCH, g)]
        metrics.reset()
        spec.loss(model, *batch).backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        s = metrics.snapshot()
        assert_compiled(s)
        misses.append(s["cache_misses"])
    assert misses == [1, 0, 0], metrics.report()


@pytest.mark.parametrize("capture", ["off", "auto"])
def test_parameters_own_their_buffers_unless_aliased(lazy_level, capture):
    """After settling, a parameter nothing else aliases is a base of its own:
    a step's update regenerates no detach view of it (traced op by op, one
    ``detach_copy`` per parameter is left: autograd's gradient accumulation,
    which a captured backward skips). A ``.data`` alias held from before the
    first step keeps its view and sees every update."""
    import torch._lazy.metrics as ltc_metrics
    from helpers import make_mlp, mlp_batches, sgd

    lazy_mlir.init("O1", capture=capture)
    model = make_mlp().to("lazy")
    held = model.fc1.weight.data
    opt = sgd(model)
    n_params = len(list(model.parameters()))
    for i, (x, y) in enumerate(mlp_batches(3)):
        model(x.to("lazy"), y.to("lazy")).backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        if i == 0:
            ltc_metrics.reset()
    # per step: a gradient's per parameter, and the views of fc1.weight and of
    # the held alias, regenerated from the moved tensor after the update
    # (with every parameter left a view: 17 a step)
    # (captured: the held alias's view alone, the region reading fc1.weight itself)
    assert ltc_metrics.counter_value("lazy::detach_copy") == 2 * (n_params + 2 if capture == "off" else 1)
    with torch.no_grad():
        torch.testing.assert_close(held.cpu(), model.fc1.weight.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("dampening,misses", [(0.0, [1, 0, 0]), (0.5, [1, 1, 0])])
def test_sgd_momentum_first_step_runs_the_steady_update(lazy_level, dampening, misses):
    """SGD's first step copies the gradient into a new momentum buffer; a
    zero buffer gives the same value through the later steps' update, so
    without dampening the first step traces the steady graph. With
    dampening a zero buffer would not: that run traces two graphs, and both
    train as eagerly."""
    from helpers import image_batches, make_convnet, train

    batches = image_batches(3, batch=5 if dampening else 6)  # sizes of their own: the graph cache is per process

    def make_opt(model):
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=dampening, weight_decay=1e-3)

    eager = train(make_convnet, make_opt, batches, torch.device("cpu"))
    traced = []
    lazy = train(make_convnet, make_opt, batches, torch.device("lazy"),
                 after_step=lambda i: (traced.append(metrics.snapshot()["cache_misses"]), metrics.reset()))
    assert traced == misses, metrics.report()
    assert_same_training(eager, lazy, param_atol=1e-5)


@pytest.mark.parametrize("pattern,width", [("fixed_batch", 32), ("detached_losses", 36)])
def test_tensors_kept_across_steps_are_data_not_graph_roots(lazy_level, pattern, width):
    """A batch moved to the device once and fed every step, and losses kept
    as ``loss.detach()`` after mark_step: a sync gives each the device data
    its pending value is (lazy_backend/ltc_fixes/pending_data.h) instead of making it
    a root of the next graph alone, so the first step traces the steady
    graph. Before: misses [1, 1, 0]. The values are eager's."""
    cfg = _cfg(width)
    fixed = next(gpt_batches(cfg))

    def run(device):
        if pattern == "fixed_batch":
            moved_once = [tuple(t.to(device) for t in fixed)] * STEPS
            return _train_model(make_gpt(cfg).to(device), cfg, batches=moved_once)
        return _train_model(make_gpt(cfg).to(device), cfg, keep=lambda loss: loss.detach())

    (eager, _, _), (lazy, misses, _) = run(torch.device("cpu")), run(torch.device("lazy"))
    assert misses == [1, 0, 0]
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_a_loss_summed_after_mark_step_compiles_no_other_group(lazy_level):
    """``running += loss.detach()`` after mark_step traces its add into the
    next step's graph: at step 1 from a Python float, at step 2 from a
    tensor, so steps 1 and 2 trace new graphs. The add stays in the glue
    graph (graph_clusterer.h): the step's group is step 0's. Before: group
    compiles [1, 1, 1, 0]. Reading the sum at the end runs its add alone."""
    cfg = _cfg(44)
    batches = list(gpt_batches(cfg, steps=4))
    running = {}

    def keep(loss):
        running[loss.device.type] = running.get(loss.device.type, 0.0) + loss.detach()
        return loss.item()

    eager, _, _ = _train_model(make_gpt(cfg), cfg, batches=batches, keep=keep)
    lazy, misses, snaps = _train_model(make_gpt(cfg).to("lazy"), cfg, batches=batches, keep=keep)
    assert misses == [1, 1, 1, 0]
    assert [s["group_cache_misses"] + s["group_cache_disk_hits"] for s in snaps] == [1, 0, 0, 0], metrics.report()
    total = running["lazy"].item()
    assert total == pytest.approx(float(lazy[0].sum()), rel=1e-6)
    assert total == pytest.approx(running["cpu"].item(), rel=1e-5)
    assert_same_training(eager, lazy, param_atol=1e-5)


def test_a_frozen_weight_compiles_no_other_graph(lazy_level):
    """A frozen weight (``requires_grad_(False)``, as when fine-tuning) would
    be pending at the first step as a detach copy of its device data (the
    Parameter wrapper of ``.to("lazy")`` detached it), and device data once
    that step's sync settled it: step 0 traced another graph than the
    others. The setup graph settles frozen weights with the trainable ones,
    so step 0 traces the steady-state graph. Before: graph compiles [1, 1,
    0] (HF Pegasus' frozen sinusoidal positions), and before the clusterer
    forwarded the copy to its readers (graph_clusterer.h), group compiles
    [1, 1, 0] too (Whisper's: a second compile of the whole model)."""
    cfg = _cfg(52)
    batches = list(gpt_batches(cfg, steps=STEPS))

    def frozen_gpt():
        model = make_gpt(cfg)
        model.wpe.weight.requires_grad_(False)
        return model

    eager, _, _ = _train_model(frozen_gpt(), cfg, batches=batches)
    lazy, misses, snaps = _train_model(frozen_gpt().to("lazy"), cfg, batches=batches)
    assert misses == [1, 0, 0]
    assert [s["group_cache_misses"] + s["group_cache_disk_hits"] for s in snaps] == [1, 0, 0], metrics.report()
    assert_same_training(eager, lazy, param_atol=1e-5)
    assert torch.equal(lazy[1]["wpe.weight"], eager[1]["wpe.weight"])


class _MaskedLinear(torch.nn.Module):
    """A frozen bool parameter (a fixed mask), settled with the trainable ones."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.keep = torch.nn.Parameter(torch.tensor([True, False] * 3), requires_grad=False)

    def forward(self, x, y):
        return ((self.fc(x) * self.keep - y) ** 2).mean()


def test_a_frozen_bool_parameter_is_settled(lazy_level):
    """Settling updates each parameter in place by one; a bool one (which
    ``mul_(1)`` cannot write: the result would be long) by True."""
    torch.manual_seed(0)
    model = _MaskedLinear()
    lazy_model = _MaskedLinear()
    lazy_model.load_state_dict(model.state_dict())
    batches = [(torch.randn(4, 6), torch.randn(4, 6)) for _ in range(STEPS)]
    eager = _train_model(model, None, batches=batches)[0]
    lazy, misses, _ = _train_model(lazy_model.to("lazy"), None, batches=batches)
    assert misses == [1, 0, 0]
    assert_same_training(eager, lazy)


def _peak_rss_reset() -> bool:
    """Starts the process's peak RSS (VmHWM) again from now; False where Linux cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def test_settling_a_large_model_holds_no_copy_of_it(lazy_level):
    """Settling writes each parameter into a new buffer while the moved
    tensor's two copies are alive: a setup graph of the whole model would
    hold a third copy at once (a 256 MiB model: ~256 MiB more at the peak).
    Chunks of steady_state.SETTLE_BYTES free what the next one reuses."""
    if not _peak_rss_reset():
        pytest.skip("needs /proc/self/clear_refs")
    torch.manual_seed(0)
    def layers():  # 32 MiB each
        return [torch.nn.Linear(*((2048, 4096) if i % 2 == 0 else (4096, 2048)), bias=False) for i in range(8)]
    eager = torch.nn.Sequential(*layers())
    lazy = torch.nn.Sequential(*layers())
    lazy.load_state_dict(eager.state_dict())
    lazy = lazy.to("lazy")
    params = sum(p.numel() * p.element_size() for p in lazy.parameters())
    x = torch.randn(2, 2048)
    metrics.reset()
    _peak_rss_reset()
    before = _rss("VmRSS")
    out = lazy(x.to("lazy"))  # the first training call settles the parameters
    settled = _rss("VmHWM") - before
    assert settled < params / 2, f"settling {params >> 20} MiB of parameters took {settled >> 20} MiB"
    assert metrics.snapshot()["setup_graphs"] == params // steady_state.SETTLE_BYTES  # two layers a graph
    torch.testing.assert_close(out.sum().cpu(), eager(x).sum(), rtol=1e-6, atol=0)
