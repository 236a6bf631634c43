"""Shared test helpers: the same training loop run eagerly and on the lazy device."""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazy_mlir
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt  # noqa: F401 - make_adamw re-exported
from lazy_mlir.observe import metrics

LAZY = torch.device("lazy")
CPU = torch.device("cpu")
_ZOO_DIR = os.path.join(os.path.dirname(__file__), "models")  # tests/models/zoo.py

# Small enough for a 2-core CI machine, same structure as GPT-mini (docs/performance.md).
SMALL_GPT = GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=128, block_size=32, batch_size=4)


def train(make_model, make_opt, batches, device, loss_fn=None, after_step=None):
    """Runs the user loop over ``batches`` (tuples of tensors: the model's,
    or ``loss_fn(model, *batch)``'s, inputs); returns (losses in float64,
    exact for either dtype, final parameters on the CPU)."""
    model = make_model().to(device)
    opt = make_opt(model)
    losses = []
    for i, batch in enumerate(batches):
        inputs = [t.to(device) for t in batch]
        loss = loss_fn(model, *inputs) if loss_fn else model(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device.type == "lazy":
            torch._lazy.mark_step()
        losses.append(loss.item())  # after mark_step: reads data, runs no graph
        if after_step:
            after_step(i)
    with torch.no_grad():  # p.detach() would trace a detach_copy and run a graph per parameter
        params = {n: p.cpu() for n, p in model.named_parameters()}
    return torch.tensor(losses, dtype=torch.float64), params


def hf_step(model, opt, device, **inputs) -> float:
    """One user step of a Hugging Face model, its loss computed from
    ``labels`` in ``inputs``: backward, optimizer step, mark_step on the lazy
    device; returns the loss read."""
    loss = model(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if device.type == "lazy":
        torch._lazy.mark_step()
    return loss.item()


def assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6, param_atol=None):
    (eager_losses, eager_params), (lazy_losses, lazy_params) = eager, lazy
    torch.testing.assert_close(lazy_losses, eager_losses, rtol=rtol, atol=atol)
    assert eager_params.keys() == lazy_params.keys()
    for name in eager_params:
        torch.testing.assert_close(lazy_params[name], eager_params[name], rtol=rtol,
                                   atol=atol if param_atol is None else param_atol, msg=name)


def assert_compiled(s: dict | None = None, calls: int = 1) -> None:
    """The steps since metrics.reset() ran generated code, and no group fell
    back to TorchScript (equal numbers alone would not show that)."""
    s = s or metrics.snapshot()
    assert s["groups_fallen_back"] == {}, s["groups_fallen_back"]
    assert s["interpreted_group_calls"] == 0, metrics.report()  # ran TorchScript while compiling
    assert s["compiled_group_calls"] >= calls, metrics.report()


# ----------------------------------------------------------------- workloads
def operands_swapped(device, size, steps=4, written=False):
    """Two same-shaped tensors that stay on the device, read the other way
    round every other step (b - a after a - b), and updated in place each
    step if ``written``: each step's difference, on the CPU."""
    torch.manual_seed(2)
    a, b = torch.randn(size).to(device), torch.randn(size).to(device)
    if device.type == "lazy":
        torch._lazy.mark_step()
    out = []
    for i in range(steps):
        d = (a - b) if i % 2 == 0 else (b - a)
        if written:
            a.add_(1.0)
            b.mul_(0.5)
        if device.type == "lazy":
            torch._lazy.mark_step()
        out.append(d.cpu())
    return out


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x, y):
        h = F.gelu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        return F.cross_entropy(self.fc3(h), y)


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return MLP()


def mlp_batches(steps=5, batch=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(steps)]


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


def small_gpt():
    return make_gpt(SMALL_GPT)


def small_gpt_batches(steps=5):
    return list(gpt_batches(SMALL_GPT, steps))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.cross_entropy(self.head(h.mean((2, 3))), y)


def make_convnet(seed=0):
    torch.manual_seed(seed)
    return ConvNet()


def image_batches(steps=5, batch=4, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def sgd_momentum(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def stochastic_units(h):
    """``h`` times a draw of ``bernoulli(sigmoid(h))``: a draw that reads
    computed values stays in the TorchScript glue (eager's stream) between
    the groups before and after it. (A dropout's mask reads none and cuts
    no group: lazy_backend/ltc_fixes/dropout_masks.h.)"""
    return h * torch.bernoulli(torch.sigmoid(h.detach()))


class StochasticMLP(nn.Module):
    """Two draws that read computed values: three groups a step."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x, y):
        h = stochastic_units(F.gelu(self.fc1(x)))
        h = stochastic_units(torch.tanh(self.fc2(h)))
        return F.cross_entropy(self.fc3(h), y)


def trained_like_eager(tmp_path, make_model, make_opt, batches, rtol, atol, **config) -> str:
    """Trains ``make_model`` compiled anew (no cache; an earlier test's graph
    would run its code) and eagerly; checks the numbers and that generated
    code ran; returns that code as dumped."""
    lazy_mlir.init("O1", dump_dir=str(tmp_path), cache=False, **config)
    try:
        lazy_mlir.native._C.clear_computation_cache()
        metrics.reset()
        eager = train(make_model, make_opt, batches, CPU)
        lazy = train(make_model, make_opt, batches, LAZY)
        assert_same_training(eager, lazy, rtol=rtol, atol=atol)
        assert_compiled(calls=len(batches))
        return "\n".join(p.read_text() for p in tmp_path.glob("*.5.generated.py"))
    finally:
        lazy_mlir.init("O1")


def train_token_batches(model, shapes, device):
    """SGD over random token batches of each (batch, length) in ``shapes``:
    (losses, parameters, per-step metrics on the lazy device)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, snapshots = [], []
    for b, t in shapes:
        ids = torch.randint(0, 50, (b, t), generator=torch.Generator().manual_seed(b * 100 + t))
        if device == LAZY:
            metrics.reset()
        loss = model(ids.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        end_step(device, loss, losses, snapshots)
    with torch.no_grad():  # p.detach() would trace a graph per parameter
        return torch.tensor(losses), {n: p.cpu() for n, p in model.named_parameters()}, snapshots


def zoo_autocast_training(name, device, dtype=torch.bfloat16, steps=3, capture=False):
    """Losses, module output dtypes (in call order) and per-step metrics of
    ``steps`` AdamW steps of a float32 zoo model under ``dtype`` autocast."""
    if _ZOO_DIR not in sys.path:
        sys.path.insert(0, _ZOO_DIR)
    import zoo

    v = zoo.base_variant(name)
    model = zoo.make_model(v, dtype=torch.float32).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtypes = []
    for module_name, module in model.named_modules():
        module.register_forward_hook(
            lambda m, i, out, n=module_name: dtypes.append((n, out.dtype)) if isinstance(out, torch.Tensor) else None)
    forward = lazy_mlir.capture(model) if capture else model
    losses, snapshots = [], []
    for batch in zoo.batches(v, steps, dtype=torch.float32)[:steps]:
        metrics.reset()
        with torch.autocast(device.type, dtype=dtype):
            loss = zoo.SPECS[name].loss(forward, *(t.to(device) for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        end_step(device, loss, losses, snapshots)
    return losses, dtypes, snapshots


def end_step(device, loss, losses: list, snapshots: list) -> None:
    """After a step's optimizer step: on the lazy device, mark the step and
    keep its metrics; then read the loss (a value read after mark_step)."""
    if device == LAZY:
        torch._lazy.mark_step()
        snapshots.append(metrics.snapshot())
    losses.append(loss.item())


def scaled_fp16_training(device, init_scale, make_opt, steps=4, name="gpt2", growth_interval=2000, clip=None):
    """A zoo model (HF GPT-2) trained ``steps`` steps in float32 under float16
    autocast with torch.amp.GradScaler from ``init_scale`` (growing it
    after ``growth_interval`` steps without overflow; with ``clip``, the
    gradients unscaled by the user and their norm clipped to it before the
    step, as HF's Trainer does). Returns the
    losses, the scales after each step, the lazy metrics of each step,
    the optimizer's progress after each (Adam's step count in
    ``state_dict()``, else the momentum's norm), the final parameters and
    the first three gradients of the last step (on the CPU)."""
    if _ZOO_DIR not in sys.path:
        sys.path.insert(0, _ZOO_DIR)
    import zoo

    v = zoo.base_variant(name)
    model = zoo.make_model(v, dtype=torch.float32).to(device).train()
    opt = make_opt(model.parameters())
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_interval=growth_interval)
    losses, scales, snapshots, steps_taken = [], [], [], []
    for batch in zoo.batches(v, steps, dtype=torch.float32)[:steps]:
        metrics.reset()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = zoo.SPECS[name].loss(model, *(t.to(device) for t in batch))
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        end_step(device, loss, losses, snapshots)
        scales.append(scaler.get_scale())
        # Adam's step count as state_dict() gives it; SGD's momentum (none, or zeros
        # made for the first step, until a step is taken)
        state = opt.state_dict()["state"]
        steps_taken.append(int(state[0]["step"]) if "step" in state.get(0, {}) else
                           round(sum(float(v.norm()) for s in state.values() for v in s.values() if v is not None), 3))
        # the unscaled gradients, as GradScaler leaves them
        grads = [p.grad.detach().cpu().clone() for p in list(model.parameters())[:3]]
        opt.zero_grad()
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, scales, snapshots, steps_taken, params, grads
