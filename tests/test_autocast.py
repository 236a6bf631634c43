"""``torch.autocast("lazy")``: mixed precision on the lazy device, cast by
torch's own policy for the device behind it (python/lazy_mlir/autocast.py,
lazy_backend/kernels/lazy_autocast.h). Checked against eager CPU autocast: the
same dtype out of every module, losses within bfloat16's rounding, and one
compiled graph a step."""
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from lazy_mlir.observe import metrics
from lazy_mlir.trace import autocast
from helpers import CPU, LAZY, assert_compiled, end_step, scaled_fp16_training, zoo_autocast_training

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))


def test_the_policy_tables_are_torchs():
    """Each table names exactly the ops torch casts on that device: a
    torch upgrade that adds or drops one fails here."""
    for table, key in ((autocast.CPU_POLICIES, "AutocastCPU"), (autocast.CUDA_POLICIES, "AutocastCUDA")):
        assert set(table) == set(torch._C._dispatch_get_registrations_for_dispatch_key(key)), key


def _policy_cases(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g).to(device)
    w = torch.randn(6, 8, generator=g).to(device)
    img = torch.randn(2, 3, 8, 8, generator=g).to(device)
    kernel = torch.randn(4, 3, 3, 3, generator=g).to(device)
    q = torch.randn(2, 2, 5, 8, generator=g).to(device)
    target = torch.tensor([0, 1, 2, 3]).to(device)
    x64 = x.double()
    return {
        "linear": lambda: F.linear(x, w),
        "matmul": lambda: x @ w.t(),
        "bmm": lambda: torch.bmm(q[0], q[1].transpose(1, 2)),
        "addmm": lambda: torch.addmm(w[:4, :4], x, w.t()[:, :4]),
        "conv2d": lambda: F.conv2d(img, kernel, padding=1),
        "sdpa": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "cross_entropy": lambda: F.cross_entropy(F.linear(x, w), target),  # fp32 on a bf16 input
        "mse_loss": lambda: F.mse_loss(F.linear(x, w), F.linear(x, w).detach() + 1),
        "softmax (no policy on CPU)": lambda: torch.softmax(F.linear(x, w), -1),
        "layer_norm (no policy on CPU)": lambda: F.layer_norm(F.linear(x, w), (6,)),
        "cat (promote)": lambda: torch.cat([F.linear(x, w), x[:, :6]]),
        "stack (promote, all bf16)": lambda: torch.stack([F.linear(x, w), F.linear(x, w)]),
        "float64 untouched": lambda: x64 @ x64.t(),
        "prod (fp32)": lambda: F.linear(x, w).prod(-1),
    }


def test_each_cpu_policy_gives_cpu_autocasts_dtype_and_values(lazy_level):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = {name: case() for name, case in _policy_cases(CPU).items()}
    with torch.autocast("lazy", dtype=torch.bfloat16):
        lazy = {name: case() for name, case in _policy_cases(LAZY).items()}
    for name in eager:
        assert lazy[name].dtype == eager[name].dtype, name
        torch.testing.assert_close(lazy[name].cpu(), eager[name], rtol=1e-2, atol=1e-2, msg=name)
    assert {v.dtype for v in eager.values()} == {torch.bfloat16, torch.float32, torch.float64}


def test_autocast_state_follows_torchs_context_manager(lazy_level):
    x = torch.randn(3, 3).to(LAZY)
    assert not torch.is_autocast_enabled("lazy")
    assert torch.amp.is_autocast_available("lazy")
    with torch.autocast("lazy"):  # the backing CPU's default lower precision
        assert torch.is_autocast_enabled("lazy") and torch.get_autocast_dtype("lazy") == torch.bfloat16
        assert (x @ x).dtype == torch.bfloat16
        with torch.autocast("lazy", enabled=False):  # transformers' float32 islands
            assert not torch.is_autocast_enabled("lazy") and (x @ x).dtype == torch.float32
        assert (x @ x).dtype == torch.bfloat16
        assert (x.cpu() @ x.cpu()).dtype == torch.float32  # CPU autocast is another device's
    with pytest.raises(ValueError):
        with torch.autocast("lazy", dtype=torch.bfloat16):
            raise ValueError
    assert not torch.is_autocast_enabled("lazy") and (x @ x).dtype == torch.float32
    assert torch.is_autocast_enabled("cpu") is False  # other devices still answered by torch
    torch._lazy.mark_step()


def _zoo_names() -> list:
    import zoo
    return ["gpt2", "resnet", *(pytest.param(n, marks=pytest.mark.zoo_full) for n in zoo.SPECS
                                if n not in ("gpt2", "resnet"))]


@pytest.mark.parametrize("name", _zoo_names())
def test_a_zoo_model_trains_as_under_cpu_autocast(lazy_level, name):
    """GPT-2 and ResNet here; every other zoo model (25 in all) under -m zoo_full."""
    eager_losses, eager_dtypes, _ = zoo_autocast_training(name, CPU)
    losses, dtypes, snapshots = zoo_autocast_training(name, LAZY)
    assert dtypes == eager_dtypes  # every module's output, in order: the policies are torch's
    assert {d for _, d in dtypes} >= {torch.bfloat16}
    # bfloat16 rounding, fused differently (measured within 6e-4 for GPT-2 and ResNet, 1.8e-3 for mT5)
    torch.testing.assert_close(losses, eager_losses, rtol=5e-3, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()
    assert snapshots[-1]["compiles"] == 0


def test_a_captured_model_records_again_when_autocast_changes(lazy_level):
    traced, _, _ = zoo_autocast_training("gpt2", LAZY, steps=2)
    captured, _, _ = zoo_autocast_training("gpt2", LAZY, steps=2, capture=True)
    torch.testing.assert_close(captured, traced, rtol=2e-3, atol=0)
    import lazy_mlir
    import zoo
    v = zoo.base_variant("gpt2")
    model = lazy_mlir.capture(zoo.make_model(v, dtype=torch.float32).to(LAZY))
    ids = zoo.batches(v, 1, dtype=torch.float32)[0][0].to(LAZY)
    metrics.reset()
    plain = model(input_ids=ids).logits
    with torch.autocast("lazy", dtype=torch.bfloat16):
        mixed = model(input_ids=ids).logits
    assert plain.dtype == torch.float32 and mixed.dtype == torch.bfloat16
    assert metrics.snapshot()["capture_records"] == 2
    torch._lazy.mark_step()


def _hf_gpt2_upcast():
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                     reorder_and_upcast_attn=True, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    return transformers.GPT2LMHeadModel(config)


def _hf_training(device, mixed, checkpointing=False, steps=3):
    model = _hf_gpt2_upcast().to(device).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses, snapshots = [], []
    for _ in range(steps):
        ids = torch.randint(0, 64, (2, 16), generator=g).to(device)
        metrics.reset()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        end_step(device, loss, losses, snapshots)
    return losses, snapshots


@pytest.mark.parametrize("mixed,checkpointing", [(False, False), (True, False), (True, True)],
                         ids=["float32", "autocast", "autocast-checkpointed"])
def test_transformers_own_autocast_regions_run(lazy_level, mixed, checkpointing):
    """GPT-2's reorder_and_upcast_attn turns autocast off around its float32
    attention (``maybe_autocast(device, enabled=False)``): on the lazy
    device that raised "unsupported autocast device_type", autocast used or
    not. Checkpointing's recompute enters the forward's autocast again."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' gradient_checkpointing_enable rename
        eager, _ = _hf_training(CPU, mixed, checkpointing)
        lazy, snapshots = _hf_training(LAZY, mixed, checkpointing)
    torch.testing.assert_close(lazy, eager, rtol=2e-3 if mixed else 1e-6, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()


_CUDA_POLICY_SCRIPT = textwrap.dedent("""
    import torch, torch._lazy, torch._lazy.ts_backend
    import torch.nn.functional as F
    from lazy_mlir.trace import autocast
    torch._lazy.ts_backend.init()
    autocast.install("cuda")  # the GPU's table, on the CPU-backed TorchScript device
    lazy = torch.device("lazy")
    x = torch.randn(4, 8, device=lazy)
    with torch.autocast("lazy"):
        low = x @ x.t()
        print("default", torch.get_autocast_dtype("lazy"), low.dtype)
        print("softmax", torch.softmax(low, -1).dtype, torch.softmax(low, -1, dtype=torch.float16).dtype)
        print("sum", low.sum().dtype, x.double().sum().dtype)
        print("norm", low.norm().dtype, low.norm(2, dim=1).dtype, x.double().norm().dtype)
        print("exp", low.exp().dtype)
        print("addcmul", torch.addcmul(low, x[:, :4], low).dtype, torch.addcmul(low, low, low).dtype)
        try:
            F.binary_cross_entropy(torch.sigmoid(x), torch.ones_like(x))
        except RuntimeError as error:
            print("bce", str(error).splitlines()[0])
""")


def test_the_gpu_table_casts_by_its_policies():
    """The GPU's table has policies the CPU's lacks (an output dtype set,
    norm's dtype overload, promotion, a refused op): run here on the
    CPU-backed device, in a process of its own (a process has one table)."""
    out = subprocess.run([sys.executable, "-c", _CUDA_POLICY_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines.pop("bce").startswith("aten::binary_cross_entropy is unsafe to autocast"), out.stdout
    assert lines == {
        "default": "torch.float16 torch.float16",
        "softmax": "torch.float32 torch.float16",
        "sum": "torch.float32 torch.float64",
        "norm": "torch.float32 torch.float32 torch.float64",
        "exp": "torch.float32",
        "addcmul": "torch.float32 torch.float16",
    }, out.stdout


@pytest.mark.parametrize("make_opt, reads_until_taken", [
    pytest.param(lambda ps: torch.optim.AdamW(ps, lr=1e-3), False, id="adamw"),
    # fused=True: the optimizer's own _step_supports_amp_scaling; the node unscales as aten's fused kernel
    pytest.param(lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True), False, id="adamw_fused"),
    # zero buffers made for the first step (steady_state): a skipped step keeps them zero
    pytest.param(lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9), False, id="sgd_momentum",
                 marks=pytest.mark.slow),
    # with dampening there are no buffers until a step is taken: found_inf is read till then
    pytest.param(lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, dampening=0.1), True, id="sgd_dampening"),
])
def test_grad_scaler_steps_in_one_graph(lazy_level, make_opt, reads_until_taken):
    """float16 with torch.amp.GradScaler("lazy"): its unscale (aten's
    _amp_foreach_non_finite_check_and_unscale_) was an eager fallback that
    executed the step's graph and copied every gradient (19 graph
    executions a step), then GradScaler read found_inf before deciding to
    call optimizer.step (a second one). Now the unscale is traced and the
    fused optimizer takes grad_scale/found_inf (_step_supports_amp_scaling),
    keeping its tensors where found_inf is set: one graph a step. A scale
    of 2**20 overflows float16 gradients: the first steps are skipped and
    the scale halved until one is taken, as eagerly; Adam's step count
    leaves out the skipped ones."""
    eager_losses, eager_scales, _, eager_steps, eager_params, eager_grads = scaled_fp16_training(
        CPU, 2.0 ** 20, make_opt)
    losses, scales, snapshots, steps, params, grads = scaled_fp16_training(LAZY, 2.0 ** 20, make_opt)
    assert scales == eager_scales and scales[0] < 2.0 ** 20 and scales[-1] == scales[-2], scales
    assert steps == pytest.approx(eager_steps, rel=2e-2) and 0 < steps[-1], (steps, eager_steps)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-3, atol=0)
    # where float16 rounding flips a near-zero gradient, Adam moves the element
    # by up to lr the other way: bounded by that, all but a few very close
    torch.testing.assert_close(params, eager_params, rtol=0, atol=4e-3)
    lazy_flat, eager_flat = torch.cat([p.flatten() for p in params]), torch.cat([p.flatten() for p in eager_params])
    assert ((lazy_flat - eager_flat).abs() > 1e-5 + 1e-3 * eager_flat.abs()).float().mean() < 1e-2
    # unscaled (else 2**17 times larger); the values follow the parameters' spread
    torch.testing.assert_close([g.norm() for g in grads], [g.norm() for g in eager_grads], rtol=2e-2, atol=0)
    first_taken = next(i for i, scale in enumerate(scales) if scale == ([2.0 ** 20] + scales)[i])
    for i, s in enumerate(snapshots):
        assert_compiled(s)
        reads = reads_until_taken and i <= first_taken
        assert s["fallback_count"] == 0 and s["graph_executions"] == (2 if reads else 1), (i, metrics.report())
        assert s["optimizer_groups_fused"] == (0 if reads else 1), s


def test_grad_scaler_with_the_users_unscale_and_clipping_steps_in_one_graph(lazy_level):
    """HF Trainer's float16 step: scaler.unscale_(opt), clip_grad_norm_,
    scaler.step(opt). GradScaler then passes found_inf alone (the gradients
    are unscaled already): skipped steps, scales and Adam's step counts as
    eagerly, one graph execution a step."""
    make_opt = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731
    eager_losses, eager_scales, _, eager_steps, eager_params, _ = scaled_fp16_training(
        CPU, 2.0 ** 18, make_opt, 5, clip=1.0)
    losses, scales, snapshots, steps, params, _ = scaled_fp16_training(LAZY, 2.0 ** 18, make_opt, 5, clip=1.0)
    assert scales == eager_scales and steps == eager_steps and 0 < steps[-1] < 5, (scales, steps, eager_steps)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-3, atol=0)
    torch.testing.assert_close(params, eager_params, rtol=0, atol=4e-3)  # Adam's sign flips, as above
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()


def test_a_skipped_steps_count_is_taken_back_by_state_dict_and_load_state_dict_replaces_it(lazy_level):
    """Adam's step count after a step GradScaler skips (traced as taken,
    found_inf not yet read): state_dict() reads found_inf and gives eager's
    count; load_state_dict() before then replaces the counts, and nothing
    is taken back from the loaded ones afterwards."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(LAZY)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("lazy", init_scale=2.0 ** 10)

    def step(overflow: bool):
        x = torch.full((2, 4), float("inf") if overflow else 1.0)
        with torch.autocast("lazy", dtype=torch.float16):
            loss = model(x.to(LAZY)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        torch._lazy.mark_step()

    step(False)
    saved = copy.deepcopy(opt.state_dict())  # step 1, taken (state_dict() holds the live tensors)
    step(True)  # traced as step 2, skipped
    assert [int(s["step"]) for s in opt.state_dict()["state"].values()] == [1, 1]
    step(True)  # skipped again; loaded over before its skip is read
    opt.load_state_dict(saved)
    step(False)
    assert [int(s["step"]) for s in opt.state_dict()["state"].values()] == [2, 2]
    assert all(p.isfinite().all() for p in model.parameters())


def _run_expansion(expand, args):
    """``expand`` (lowering/grad_scaler.py) recorded into an FX graph whose
    inputs are ``args``' tensors (lists of them too), then run."""
    import torch.fx as fx
    graph, inputs = fx.Graph(), []

    def placeholder(t):
        node = graph.placeholder(f"x{len(inputs)}")
        node.meta["val"] = t
        inputs.append(t)
        return node

    nodes = [[placeholder(t) for t in a] if isinstance(a, list) else placeholder(a) if torch.is_tensor(a) else a
             for a in args]
    results = expand(lambda target, *a, **k: graph.call_function(target, a, k), graph, nodes)
    graph.output(results)
    return fx.GraphModule(torch.nn.Module(), graph)(*inputs)


@pytest.mark.parametrize("found, tracker, scale, factors", [
    (0.0, 0, 1024.0, (2.0, 0.5)), (0.0, 2, 1024.0, (2.0, 0.5)), (1.0, 2, 1024.0, (2.0, 0.5)),
    (0.0, 2, 3e38, (2.0, 0.5)),   # growth overflows: the scale stays
    (0.0, 2, 1000.3, (1.3, 0.9)), (1.0, 1, 1000.3, (1.3, 0.9)),  # rounded as aten's (in float64: float32 differs)
])
def test_update_scale_expansion_computes_as_atens_kernel(found, tracker, scale, factors):
    from lazy_mlir.lowering.grad_scaler import expand_amp_update_scale
    args = [torch.tensor(scale), torch.tensor(tracker, dtype=torch.int32), torch.tensor(found), *factors, 3]
    want = torch.ops.aten._amp_update_scale(*args)
    got = _run_expansion(expand_amp_update_scale, args)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    assert [g.item() for g in got] == [w.item() for w in want], (got, want)


def test_unscale_expansion_computes_as_atens_kernel():
    from lazy_mlir.lowering.grad_scaler import expand_amp_unscale
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g, dtype=dtype) * 1000 for dtype in (torch.float16, torch.float32,
                                                                             torch.float64)]
    for bad in (None, float("inf"), float("nan")):
        case = [t.clone() for t in grads]
        if bad is not None:
            case[1][2, 1] = bad
        args = [case, torch.tensor(0.0), torch.tensor(1 / 1024.0)]
        got = _run_expansion(expand_amp_unscale, args)
        want = torch.ops.aten._amp_foreach_non_finite_check_and_unscale(*args)
        assert got[1].item() == want[1].item() == (bad is not None)
        for a, b in zip(got[0], want[0]):
            assert a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan())
            assert torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_the_fused_step_unscales_as_grad_scaler_does(optimizer):
    """The fused node given GradScaler's grad_scale unscales the gradients
    itself (lowering/fused_optimizer.py): bit for bit what aten's unscale
    with GradScaler's inv_scale gives, then the same step, for float32 and
    float64 gradients (float16 in float32, as aten's) and a scale 1000.3; the
    unscaled gradients are its last result."""
    from lazy_mlir.lowering.fused_optimizer import adam_update, sgd_update
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 3, generator=g, dtype=dtype) for dtype in (torch.float16, torch.float32, torch.float64)]
    grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) * 500 for p in params]
    states = [torch.rand(p.shape, generator=g, dtype=p.dtype) for p in params]
    scale = torch.tensor(1000.3)

    def step(grads, grad_scale=None):
        run = lambda target, *a, **k: target(*a, **k)  # noqa: E731
        if optimizer == "adam":
            scalars = [torch.tensor([1 - 1e-4, 0.3, -1e-3], dtype=torch.float64)]
            return adam_update(run, params, grads, states, states, [], scalars, [0, 0, 0], 0.9, 0.99, 0.1, 1e-8,
                               False, False, True, None, grad_scale, dtype_of=lambda t: t.dtype)
        return sgd_update(run, params, grads, states, torch.tensor(0.01, dtype=torch.float64), 0.1, 0.9, 0.0,
                          False, False, None, grad_scale, dtype_of=lambda t: t.dtype)

    unscaled = [t.clone() for t in grads]
    torch._amp_foreach_non_finite_check_and_unscale_(unscaled, torch.tensor(0.0),
                                                     scale.double().reciprocal().float())
    fused, want = step(grads, scale), step(unscaled)
    assert all(torch.equal(a, b) for a, b in zip(fused[-1], unscaled)), "gradients unscaled otherwise"
    assert not want[-1] and len(fused) == len(want)
    for got_list, want_list in zip(fused[:-1], want[:-1]):
        assert all(torch.equal(a, b) for a, b in zip(got_list, want_list))


def test_grad_scaler_grows_and_backs_off_as_eagerly(lazy_level):
    """GradScaler.update in the compiled graph (aten's _amp_update_scale
    expanded, lowering/grad_scaler.py, not Inductor's extern call): with
    growth_interval=1 the scale doubles after every step taken and halves
    after every overflow, eager's sequence step for step."""
    make_opt = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731
    eager_losses, eager_scales, _, eager_steps, _, _ = scaled_fp16_training(CPU, 2.0 ** 18, make_opt, 6,
                                                                             growth_interval=1)
    losses, scales, snapshots, steps, _, _ = scaled_fp16_training(LAZY, 2.0 ** 18, make_opt, 6, growth_interval=1)
    assert scales == eager_scales and steps == eager_steps, (scales, eager_scales, steps, eager_steps)
    pairs = list(zip(scales, scales[1:]))
    assert any(b > a for a, b in pairs) and any(b < a for a, b in pairs), scales  # both branches ran
    torch.testing.assert_close(losses, eager_losses, rtol=1e-3, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()


@pytest.mark.parametrize("name", ["resnet", *(n for n in _zoo_names() if not isinstance(n, str))])
def test_a_zoo_model_steps_with_grad_scaler_as_eagerly(lazy_level, name):
    """Float16 autocast with GradScaler (its default scale, 2**16, which
    some of these overflow at first) and AdamW: the scales and Adam's step
    counts of eager CPU, losses within 5e-3 (measured 6.3e-4 at most,
    ResNet's), one graph execution a step. ResNet here (GPT-2 above), the
    zoo's 23 others under -m zoo_full."""
    make_opt = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731
    eager_losses, eager_scales, _, eager_steps, _, _ = scaled_fp16_training(CPU, 2.0 ** 16, make_opt, 3, name)
    losses, scales, snapshots, steps, _, _ = scaled_fp16_training(LAZY, 2.0 ** 16, make_opt, 3, name)
    assert scales == eager_scales and steps == eager_steps, (scales, eager_scales, steps, eager_steps)
    torch.testing.assert_close(losses, eager_losses, rtol=5e-3, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()

