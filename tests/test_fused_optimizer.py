"""Adam/AdamW/SGD steps traced as one node per parameter group (lazy_mlir.trace.fused_optimizer).

Each test trains the user's own (single-tensor) optimizer eagerly on the CPU
and on the lazy device, and checks that the lazy step really took the fused
path: the metrics count fused groups, the trace holds one lazy_mlir::adam_step
(or sgd_step) node and a fraction of the unfused trace's nodes.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import lazy_mlir
from lazy_mlir import config
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics
from helpers import LAZY, assert_compiled

# Shapes no other test uses (LTC and the group cache key graphs by shape).
D_IN, D_HID, D_OUT, BATCH = 9, 13, 5, 6


def _model(dtype):
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.Tanh(), nn.Linear(D_HID, D_OUT)).to(dtype)


def _batches(dtype, steps):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(BATCH, D_IN, generator=g, dtype=dtype) for _ in range(steps)]


def _loss(model, x):
    return model(x).pow(2).mean()


def _fused(level):
    lazy_mlir.init(level, fuse_optimizer=True)
    metrics.reset()


def _train(make_opt, dtype, steps=4, inspect=None, scheduler=None):
    """Eager CPU and lazy runs of the same loop; returns both models. ``inspect``
    sees the lazy parameters and optimizer after each step's trace, before mark_step."""
    eager = _model(dtype)
    lazy = copy.deepcopy(eager).to(LAZY)
    eager_opt, lazy_opt = make_opt(eager), make_opt(lazy)
    schedulers = [scheduler(o) for o in (eager_opt, lazy_opt)] if scheduler else []
    for x in _batches(dtype, steps):
        _loss(eager, x).backward()
        eager_opt.step()
        eager_opt.zero_grad()
        _loss(lazy, x.to(LAZY)).backward()
        lazy_opt.step()
        lazy_opt.zero_grad()
        if inspect:
            inspect(lazy, lazy_opt)
        torch._lazy.mark_step()
        for s in schedulers:
            s.step()
    return eager, eager_opt, lazy, lazy_opt


def _assert_params_close(eager, lazy, rtol, atol):
    with torch.no_grad():
        for (name, p), q in zip(eager.named_parameters(), lazy.parameters()):
            torch.testing.assert_close(q.cpu(), p, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def _assert_state_close(eager_opt, lazy_opt, rtol, atol):
    for p, q in zip(eager_opt.state.values(), lazy_opt.state.values()):
        assert p.keys() == q.keys()
        for key in p:
            assert q[key].device.type == ("cpu" if key == "step" else "lazy"), key  # the user's layout
            torch.testing.assert_close(q[key].cpu(), p[key], rtol=rtol, atol=atol, msg=key)


def _pending_text(model, opt) -> str:
    tensors = list(model.parameters()) + [t for s in opt.state.values() for t in s.values() if t.device == LAZY]
    return torch._C._lazy._get_tensors_text(tensors)


def _ir_nodes(text: str) -> int:
    return sum(1 for line in text.splitlines() if " = " in line)


CASES = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
    "adam_amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.05, amsgrad=True),
    "adamw_amsgrad_maximize": lambda m: torch.optim.AdamW(m.parameters(), lr=5e-3, amsgrad=True, maximize=True),
    # SGD: the first step makes the momentum buffers (other math), later ones update them
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
    "sgd_nesterov_decay_maximize": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.8, dampening=0.0,
                                                             nesterov=True, weight_decay=1e-3, maximize=True),
    # fused=True (HF's adamw_torch_fused, torchtune's default): torch refuses
    # the lazy device; the node computes what aten's fused kernel does (eager
    # here runs that kernel), up to rounding
    "adamw_fused": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1,
                                               fused=True),
    "sgd_momentum_fused": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, fused=True),
}
# SGD's other settings run at O0 (the op's eager kernel: the same sgd_update
# the compiled expansion records), compiles being the suite's cost.
O0_CASES = {
    "sgd_dampening": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.7, dampening=0.2),
    "sgd_plain": lambda m: torch.optim.SGD(m.parameters(), lr=0.05),
}


def _op(case: str) -> str:
    return "lazy_mlir::sgd_step(" if case.startswith("sgd") else "lazy_mlir::adam_step("


def _fused_fp64_run(make_opt, case: str) -> tuple[int, dict]:
    """Trains in fp64 against eager; checks parameters and state to ~1e-13
    and one fused node in every step's trace. Returns (steps, metrics)."""
    kinds = []
    eager, eager_opt, lazy, lazy_opt = _train(
        make_opt, torch.float64, inspect=lambda m, o: kinds.append(_pending_text(m, o)))
    _assert_params_close(eager, lazy, rtol=1e-12, atol=1e-13)
    _assert_state_close(eager_opt, lazy_opt, rtol=1e-12, atol=1e-13)
    assert all(text.count(_op(case)) == 1 for text in kinds), kinds[-1]
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == len(kinds) and s["optimizer_groups_unfused"] == {}
    return len(kinds), s


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager_fp64_compiled(lazy_level, case):
    """fp64: the single-tensor math, compiled, within ~1e-14 of eager; one
    fused node per step, run as generated code, nothing eager."""
    _fused(lazy_level)
    steps, s = _fused_fp64_run(CASES[case], case)
    assert s["fallback_count"] == 0, s["fallbacks"]
    # every step after the first reuses the graph (SGD's second step is the
    # first with momentum buffers: another graph)
    first_graphs = 2 if case in ("sgd_momentum", "sgd_momentum_fused", "sgd_nesterov_decay_maximize") else 1
    assert s["cache_hits"] >= steps - first_graphs, metrics.report()
    assert_compiled(s, calls=steps)


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
@pytest.mark.parametrize("case", sorted(O0_CASES))
def test_other_sgd_settings_match_eager(lazy_level, case):
    _fused(lazy_level)
    _fused_fp64_run(O0_CASES[case], case)


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
def test_matches_eager_fp32_compiled(lazy_level):
    _fused(lazy_level)
    eager, eager_opt, lazy, lazy_opt = _train(CASES["adamw"], torch.float32)
    _assert_params_close(eager, lazy, rtol=1e-5, atol=1e-6)
    _assert_state_close(eager_opt, lazy_opt, rtol=1e-5, atol=1e-6)
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == 4 and s["fallback_count"] == 0
    assert_compiled(s, calls=4)


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
def test_step_counts_that_differ_get_one_scalars_input_each(lazy_level):
    """A parameter without a gradient at the first step gets its state a step
    later, so the group's step counts differ: each distinct count's scalars
    are one input, shared by its parameters (scalar_rows says whose), and
    the compiled step matches eager in fp64."""
    _fused(lazy_level)
    eager = _model(torch.float64)
    lazy = copy.deepcopy(eager).to(LAZY)
    eager_opt, lazy_opt = CASES["adamw"](eager), CASES["adamw"](lazy)
    traces = []
    for step, x in enumerate(_batches(torch.float64, 4)):
        for model, opt, batch in ((eager, eager_opt, x), (lazy, lazy_opt, x.to(LAZY))):
            _loss(model, batch).backward()
            if step == 0:
                model[2].bias.grad = None  # Adam skips it: no state, no step count yet
            opt.step()
            opt.zero_grad()
        traces.append(_pending_text(lazy, lazy_opt))
        torch._lazy.mark_step()
    _assert_params_close(eager, lazy, rtol=1e-12, atol=1e-13)
    _assert_state_close(eager_opt, lazy_opt, rtol=1e-12, atol=1e-13)
    scalars_inputs = [text.count("Double[3]] lazy_tensors::device_data") for text in traces]
    assert scalars_inputs == [1, 2, 2, 2], scalars_inputs
    assert "scalar_rows=[0, 0, 0]," in traces[0] and "scalar_rows=[0, 0, 0, 1]," in traces[-1]
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == 4 and s["fallback_count"] == 0, metrics.report()
    assert_compiled(s, calls=4)


def test_step_scalars_are_adams_python_doubles():
    """The C++ scalars are bit for bit what torch's single-tensor Adam computes
    in Python (``**``, not sqrt, for the square root)."""
    lr, weight_decay, beta1, beta2 = 3e-4, 0.1, 0.9, 0.95
    for step in [1.0, 2.0, 7.0, 1000.0, 123457.0]:
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        python = [1 - lr * weight_decay, bias_correction2 ** 0.5, -(lr / bias_correction1)]
        assert _C.adam_step_scalars(step, lr, weight_decay, beta1, beta2) == python, step


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
def test_trace_shrinks(lazy_level):
    """The optimizer's part of the trace: one node per group instead of ~10
    per parameter (4 parameters here)."""
    def optimizer_nodes(fuse):
        lazy_mlir.init("O0", fuse_optimizer=fuse)
        counts = []

        def inspect(model, opt):
            counts.append(_ir_nodes(_pending_text(model, opt)))

        _train(CASES["adamw"], torch.float64, steps=2, inspect=inspect)
        return counts[-1]

    fused, unfused = optimizer_nodes(True), optimizer_nodes(False)
    assert fused < unfused
    # forward and backward are the same in both traces: the difference is the optimizer's
    assert unfused - fused >= 4 * 6, (fused, unfused)


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
@pytest.mark.parametrize("case", ["adamw", "sgd_momentum"])
def test_lr_schedule_keeps_the_graph(lazy_level, case):
    """lr is an input: a scheduler changing it every step traces no new graph;
    O0 runs the op's eager kernel (the same ops as torch's Adam). Equal to
    an fp64 ulp, not bit for bit: on some CPUs a vectorised kernel's tail
    rounds differently (2.8e-17 on 0.weight seen on 2026-11-25's machine);
    a wrong lr would differ by orders of magnitude more."""
    _fused(lazy_level)
    eager, _, lazy, _ = _train(CASES[case], torch.float64, steps=5,
                               scheduler=lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.7))
    _assert_params_close(eager, lazy, rtol=2e-15, atol=1e-16)
    s = metrics.snapshot()
    hits = 3 if case == "sgd_momentum" else 4  # steps 2-5 hit (SGD: 3-5, its step 2 is the first with buffers)
    assert s["cache_hits"] >= hits and s["optimizer_groups_fused"] == 5, metrics.report()


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
def test_unfusable_settings_keep_torchs_path(lazy_level):
    """Tensor betas: torch's own path, counted with the reason, same results."""
    _fused(lazy_level)
    def make(m):
        return torch.optim.Adam(m.parameters(), lr=1e-2, betas=(torch.tensor(0.8), torch.tensor(0.9)))

    eager, _, lazy, _ = _train(make, torch.float64, steps=2)
    _assert_params_close(eager, lazy, rtol=1e-12, atol=1e-13)
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == 0 and s["optimizer_groups_unfused"] == {"tensor betas": 2}


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
def test_option_off(lazy_level):
    lazy_mlir.init("O0", fuse_optimizer=False)
    assert not config.current.fuse_optimizer
    texts = []
    _train(CASES["adamw"], torch.float64, steps=1, inspect=lambda m, o: texts.append(_pending_text(m, o)))
    assert "adam_step" not in texts[0]
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == 0 and s["optimizer_groups_unfused"] == {}


def test_per_tensor_reasons_a_group_is_not_fused(lazy_level):
    """The per-tensor checks, one C++ call per group and step
    (optimizer_checks.h): each reason names what torch's path is kept for."""
    lazy = [torch.zeros(3, device="lazy", dtype=dtype) for dtype in (torch.float32, torch.float64, torch.bfloat16)]
    cpu_steps = [torch.tensor(1.0) for _ in lazy]
    assert _C.group_tensors_unfusable(lazy, cpu_steps) is None
    assert _C.group_tensors_unfusable(lazy, []) is None  # SGD: no step counts
    assert _C.group_tensors_unfusable(lazy, [torch.tensor(1.0, device="lazy")]) == "step counts not on the CPU"
    complex_param = torch.zeros(3, device="lazy", dtype=torch.complex64)
    assert _C.group_tensors_unfusable([*lazy, complex_param], []) == "complex parameters"
    for odd in (torch.zeros(3), torch.zeros(3, device="lazy", dtype=torch.int64)):  # another device, not a float
        assert _C.group_tensors_unfusable([*lazy, odd], []) == "parameters not all floating-point on one lazy device"


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
@pytest.mark.parametrize("case", ["adamw", "sgd_momentum"])
def test_results_go_into_the_lazy_tensors_the_state_has(lazy_level, case):
    """Once the state exists, a fused step makes no lazy tensor per result:
    each parameter and state tensor takes its new value in the lazy tensor
    it holds (functional_update.h; Adam's scalars are the one new tensor).
    The values stay eager's, and every step after the state's first one
    hits the graph cache: the step's outputs keep one order although the
    updated tensors keep their age (orderUpdatedLast)."""
    import torch._lazy.metrics as ltc_metrics
    _fused(lazy_level)
    eager = _model(torch.float64)
    lazy = copy.deepcopy(eager).to(LAZY)
    eager_opt, lazy_opt = CASES[case](eager), CASES[case](lazy)
    created, misses, losses = [], [], {"cpu": [], LAZY: []}
    for x in _batches(torch.float64, 4):
        for model, opt, device in ((eager, eager_opt, "cpu"), (lazy, lazy_opt, LAZY)):
            loss = _loss(model, x.to(device))  # held through mark_step, as a loop that logs it does
            loss.backward()
            before = ltc_metrics.counter_value("CreateLtcTensor") or 0
            opt.step()
            if device == LAZY:
                created.append((ltc_metrics.counter_value("CreateLtcTensor") or 0) - before)
            opt.zero_grad()
            losses[device].append(loss)
        misses_before = metrics.snapshot()["cache_misses"]
        torch._lazy.mark_step()
        misses.append(metrics.snapshot()["cache_misses"] - misses_before)
    torch.testing.assert_close(torch.stack([t.cpu() for t in losses[LAZY]]), torch.stack(losses["cpu"]).detach(),
                               rtol=1e-12, atol=1e-13)
    _assert_params_close(eager, lazy, rtol=1e-12, atol=1e-13)
    _assert_state_close(eager_opt, lazy_opt, rtol=1e-12, atol=1e-13)
    results = len(list(lazy.parameters())) * (3 if case == "adamw" else 2)
    assert all(n <= 1 for n in created[1:]), (created, results)  # not one per result
    # SGD's first step is given zero momentum buffers (steady_state): one graph too
    assert misses == [1, 0, 0, 0], misses


def test_adams_lists_are_collected_as_torch_collects_them():
    """_C.collect_adam_group against Adam._init_group itself (CPU tensors:
    it reads no device), and None with the lists untouched where torch's
    own must run: a state not made yet, a sparse gradient."""
    from lazy_mlir.native import _C
    from lazy_mlir.trace.fused_optimizer import _original_adam_init_group

    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(3)]
    opt = torch.optim.AdamW(params, amsgrad=True)
    for p in params[:2]:  # the third has no gradient: not collected
        p.grad = torch.randn(3)
    lists = [[] for _ in range(6)]
    assert _C.collect_adam_group(params, opt.state, True, *lists) is None  # first step: no state yet
    assert lists == [[]] * 6 and len(opt.state) == 0  # nothing appended, nothing inserted
    expected = [[] for _ in range(6)]
    _original_adam_init_group(opt, opt.param_groups[0], *expected)  # makes the states
    assert _C.collect_adam_group(params, opt.state, True, *lists) is False  # has_complex
    assert [[id(t) for t in ts] for ts in lists] == [[id(t) for t in ts] for ts in expected]
    params[1].grad = torch.randn(3).to_sparse()
    untouched = [[] for _ in range(6)]
    assert _C.collect_adam_group(params, opt.state, True, *untouched) is None and untouched == [[]] * 6


@pytest.mark.parametrize("lazy_level", ["O0"], indirect=True)
def test_a_fused_optimizers_checkpoint_resumes_on_the_lazy_device(lazy_level):
    """load_state_dict puts a fused=True optimizer's step counts on the
    parameters' device (torch's fused kernels read them there); torch's own
    fused step then failed on the lazy device. The node takes them back to
    the CPU and resumes as eager does."""
    _fused(lazy_level)

    def make(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, fused=True)

    eager = _model(torch.float64)
    eager_opt = make(eager)
    first, *rest = _batches(torch.float64, 3)
    _loss(eager, first).backward()
    eager_opt.step()
    eager_opt.zero_grad()
    lazy = copy.deepcopy(eager).to(LAZY)
    lazy_opt = make(lazy)
    lazy_opt.load_state_dict(copy.deepcopy(eager_opt.state_dict()))
    assert next(iter(lazy_opt.state.values()))["step"].device.type == "lazy"  # torch's policy for fused=True
    metrics.reset()
    for x in rest:
        for model, opt, batch in ((eager, eager_opt, x), (lazy, lazy_opt, x.to(LAZY))):
            _loss(model, batch).backward()
            opt.step()
            opt.zero_grad()
        torch._lazy.mark_step()
    _assert_params_close(eager, lazy, rtol=1e-12, atol=1e-13)
    _assert_state_close(eager_opt, lazy_opt, rtol=1e-12, atol=1e-13)
    s = metrics.snapshot()
    assert s["optimizer_groups_fused"] == 2 and s["fallback_count"] == 0, metrics.report()
