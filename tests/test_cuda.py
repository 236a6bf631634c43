"""The lazy device backed by a CUDA GPU: training equals eager PyTorch on
the same GPU, one graph execution per step, every group compiled (Inductor's
Triton kernels) from CUDA inputs: the MLP, GPT-mini and the zoo's HF
GPT-2 and ResNet (tests/models), traced and captured. fp64, so that a wrong result stands out from the
reduction-order noise of fp32 (docs/architecture.md, facts). ZeRO on NCCL is in
tests/zero/test_zero.py; tools/gpu_check.sh runs both on a GPU machine. Skips without a GPU, or when this process's lazy
device is the CPU (LAZY_MLIR_DEVICE=cpu: the first init fixes it)."""
import os
import sys

import pytest
import torch

import lazy_mlir
from lazy_mlir.observe import metrics
from lazy_mlir.compile import routes
from helpers import (LAZY, assert_compiled, assert_same_training, make_adamw, make_mlp, mlp_batches, scaled_fp16_training,
                     sgd, small_gpt, small_gpt_batches, train, zoo_autocast_training)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")

CUDA = torch.device("cuda")


@pytest.fixture(params=["O1", "O2"])
def on_cuda(request, monkeypatch):
    """lazy_mlir on the GPU at a level; yields the devices of every lowered group's inputs."""
    try:
        lazy_mlir.init(request.param, device="cuda")
    except RuntimeError as exc:  # backed by the CPU since this process's first init
        pytest.skip(str(exc))
    metrics.reset()
    devices = set()

    def lower(graph, inputs, name, cfg):
        devices.update(t.device.type for t in inputs)
        return lower_group(graph, inputs, name, cfg)

    lower_group = routes.lower_group
    monkeypatch.setattr(routes, "lower_group", lower)
    yield devices
    lazy_mlir.init("O1", device="cuda")


def fp64(make):
    return lambda: make().double()


def lazy_train(devices, *args):
    result = train(*args, LAZY)
    s = metrics.snapshot()
    assert_compiled(s, calls=s["mark_steps"])
    assert s["graph_executions"] == s["mark_steps"]
    assert devices == {"cuda"}, devices
    assert_replayed(s)
    return result


def assert_replayed(s: dict, some: bool = True) -> None:
    """With CUDA graphs on, every group run after its first was a graph's
    replay (``some``: at least one was; not so in a zoo run's warm-up, whose
    two steps are two graphs, each run once)."""
    if lazy_mlir.config.current.cuda_graphs:
        assert s["cuda_graph_refusals"] == {}, metrics.report()
        assert s["cuda_graph_replays"] == s["compiled_group_calls"] - s["groups_built"], metrics.report()
        assert s["cuda_graph_replays"] > 0 or not some, metrics.report()
    else:
        assert s["cuda_graphs_captured"] == s["cuda_graph_replays"] == 0, metrics.report()


def test_mlp_sgd_matches_eager_on_the_gpu(on_cuda):
    batches = [(x.double(), y) for x, y in mlp_batches()]
    eager = train(fp64(make_mlp), sgd, batches, CUDA)
    assert_same_training(eager, lazy_train(on_cuda, fp64(make_mlp), sgd, batches), rtol=1e-9, atol=1e-11)


def test_outputs_of_a_replay_outlive_the_next_one(on_cuda):
    """A CUDA graph's replay overwrites its own output buffers: the losses,
    held as lazy tensors until after the last step, must keep each step's
    value (cuda_graphs copies the outputs out)."""
    batches = [(x.double(), y) for x, y in mlp_batches(steps=6)]
    eager = train(fp64(make_mlp), sgd, batches, CUDA)[0]
    model = fp64(make_mlp)().to(LAZY)
    opt = sgd(model)
    held = []
    for x, y in batches:
        loss = model(x.to(LAZY), y.to(LAZY))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        held.append(loss)
    # eager's losses went through item() into a float32 tensor
    torch.testing.assert_close(torch.stack([loss.cpu() for loss in held]).float(), eager, rtol=1e-6, atol=1e-7)
    assert_replayed(metrics.snapshot())


def test_gpt_adamw_matches_eager_on_the_gpu(on_cuda):
    batches = small_gpt_batches()
    eager = train(fp64(small_gpt), make_adamw, batches, CUDA)
    assert_same_training(eager, lazy_train(on_cuda, fp64(small_gpt), make_adamw, batches), rtol=1e-9,
                         atol=1e-11, param_atol=1e-9)


class _DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.fc2(torch.nn.functional.dropout(self.fc1(x).relu(), 0.3)), y)


@pytest.mark.parametrize("on_cuda", ["O1"], indirect=True)  # at O2 the glue's draws are refused
def test_dropout_draws_eager_cudas_masks(on_cuda):
    """With eager's stream each mask is drawn in the glue by aten's CUDA
    kernel on the GPU's generator (lazy_mlir::dropout_mask,
    lazy_backend/ltc_fixes/dropout_masks.h; the product in the step's one group):
    eager CUDA's masks, draw for draw."""
    batches = [(x.double(), y) for x, y in mlp_batches()]
    eager = train(fp64(_DropoutMLP), sgd, batches, CUDA)  # the model's init seeds every generator
    assert_same_training(eager, lazy_train(on_cuda, fp64(_DropoutMLP), sgd, batches), rtol=1e-9, atol=1e-11)
    assert metrics.snapshot()["groups_built"] == 1, metrics.report()


@pytest.mark.parametrize("capture", [False, True], ids=["traced", "captured"])
@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_zoo_model_matches_eager_on_the_gpu(on_cuda, name, capture):
    """Models nobody on the team wrote: the zoo's HF GPT-2 (sdpa attention,
    AdamW) and its torchvision-style ResNet (convolutions, BatchNorm), traced
    op by op and captured (lazy_mlir.capture), without dropout (lazy dropout
    draws on the CPU generator, eager CUDA's on the GPU's)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "models"))
    import training
    import zoo

    v = zoo.base_variant(name)
    assert v.dropout == 0
    eager = training.train(v, CUDA, shapes=False)
    lazy = training.train(v, LAZY, shapes=False, capture=capture)
    assert set(lazy.phases) == {"warmup", "steady"}
    torch.testing.assert_close(lazy.losses, eager.losses, rtol=1e-9, atol=1e-10)
    for param, p in eager.params.items():
        torch.testing.assert_close(lazy.params[param], p, rtol=1e-9, atol=1e-10, msg=param)
    for phase, s in lazy.phases.items():
        assert_compiled(s, calls=s["mark_steps"])
        assert s["fallback_count"] == 0 and s["graph_executions"] == s["mark_steps"], lazy.reports[phase]
        assert_replayed(s, some=phase == "steady")
        if capture:
            assert s["capture_refused"] == 0 and s["captured_calls"] == s["mark_steps"], lazy.reports[phase]
    assert on_cuda == {"cuda"}, on_cuda


@pytest.mark.parametrize("on_cuda", ["O1"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_as_cuda_autocast(on_cuda, dtype):
    """torch.autocast("lazy") behind a GPU casts by CUDA's policy (softmax,
    layer norm and the loss in float32; float16 by default): the zoo's HF
    GPT-2 gives eager CUDA autocast's dtype out of every module, and its
    losses within the lower precision's rounding."""
    with torch.autocast("lazy"):
        assert torch.get_autocast_dtype("lazy") == torch.float16
    eager_losses, eager_dtypes, _ = zoo_autocast_training("gpt2", CUDA, dtype)
    losses, dtypes, snapshots = zoo_autocast_training("gpt2", LAZY, dtype)
    assert dtypes == eager_dtypes
    torch.testing.assert_close(losses, eager_losses, rtol=5e-3, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()
    assert on_cuda == {"cuda"}, on_cuda


@pytest.mark.parametrize("on_cuda", ["O1"], indirect=True)
def test_grad_scaler_steps_in_one_graph_on_cuda(on_cuda):
    """float16 with torch.amp.GradScaler("lazy") behind a GPU, where float16
    is used: from an overflowing scale, the skipped steps, scales and Adam's
    step counts are eager CUDA's, one graph execution a step (the fused
    AdamW takes GradScaler's found_inf, tests/test_autocast.py)."""
    make_opt = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731
    eager_losses, eager_scales, _, eager_steps, _, _ = scaled_fp16_training(CUDA, 2.0 ** 20, make_opt)
    losses, scales, snapshots, steps, _, _ = scaled_fp16_training(LAZY, 2.0 ** 20, make_opt)
    assert scales == eager_scales and steps == eager_steps and steps[-1] > 0, (scales, steps, eager_steps)
    torch.testing.assert_close(losses, eager_losses, rtol=5e-3, atol=0)
    for s in snapshots:
        assert_compiled(s)
        assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()
    assert on_cuda == {"cuda"}, on_cuda

