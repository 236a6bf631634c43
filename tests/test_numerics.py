"""Training on the lazy device gives eager PyTorch's numbers (fp32 to rtol 1e-5; AdamW in fp64).

Compiled groups run Inductor kernels whose reductions sum in another order
than eager's: losses still agree to rtol 1e-5, but AdamW normalises each
gradient element by its own running RMS, so an element whose gradient is
~0 (pure rounding noise) moves by up to ~lr/100 differently. torch.compile
shows the same deviation from eager (5e-6 on GPT-mini's c_fc.weight, the
same element); the AdamW test runs in float64.
"""
import pytest
import torch

from lazy_mlir.observe import metrics
from helpers import (LAZY, assert_compiled, assert_same_training, image_batches, make_adamw, make_convnet,
                     make_mlp, mlp_batches, sgd, sgd_momentum, small_gpt, small_gpt_batches, train)

CPU = torch.device("cpu")


def lazy_train(lazy_level, *args):
    """Trains on the lazy device and checks every group really compiled (no
    silent TorchScript fallback hides behind equal numbers)."""
    result = train(*args, LAZY)
    s = metrics.snapshot()
    if lazy_level != "O0":  # O0 runs everything in TorchScript on purpose
        assert_compiled(s, calls=s["mark_steps"])
    assert s["graph_executions"] == s["mark_steps"]
    return result


@pytest.mark.parametrize("lazy_level", ["O0", "O1", "O2"], indirect=True)
def test_mlp_sgd_matches_eager(lazy_level):
    batches = mlp_batches()
    assert_same_training(train(make_mlp, sgd, batches, CPU), lazy_train(lazy_level, make_mlp, sgd, batches))


def small_gpt_float64():
    return small_gpt().double()


@pytest.mark.parametrize("lazy_level", ["O0", "O1", "O2"], indirect=True)
def test_gpt_adamw_matches_eager(lazy_level):
    """In float64: AdamW turns a gradient that is rounding noise (the key
    projection's bias: softmax cancels it, its true gradient is 0) into an
    update of up to lr, so in float32 any other summation order moves it,
    even O0's (its TorchScript graph feeds MKL transposed copies where eager
    feeds views, and MKL picks kernels by layout and CPU: equal bits on a
    Xeon, 1e-6 apart on an AMD EPYC). In float64 AdamW's eps (1e-8) bounds
    what noise of 1e-18 can move: any real difference shows."""
    batches = small_gpt_batches()
    eager = train(small_gpt_float64, make_adamw, batches, CPU)
    lazy = lazy_train(lazy_level, small_gpt_float64, make_adamw, batches)
    assert_same_training(eager, lazy, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lazy_level", ["O0", "O1", "O2"], indirect=True)
def test_convnet_batchnorm_sgd_momentum_matches_eager(lazy_level):
    batches = image_batches()
    eager = train(make_convnet, sgd_momentum, batches, CPU)
    assert_same_training(eager, lazy_train(lazy_level, make_convnet, sgd_momentum, batches))


def test_fourier_mixing_compiles_with_complex_tensors(lazy_level):
    """FNet's token mixing, ``fftn(x).real`` (x cast to complex64), forward
    and backward in one group: the complex dtypes' numbers (c10's, not
    torch-mlir's table, which counts them one too high) and their MLIR type
    (``complex<f32>``) export; before, both groups fell back."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 16, generator=g), torch.randn(16, 16, generator=g)

    def grads(device):
        a, b = x.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()
        mixed = torch.fft.fftn(a.to(torch.complex64), dim=(-1, -2)).real
        loss = torch.tanh(mixed @ b).square().mean()
        loss.backward()
        if device == LAZY:
            metrics.reset()
            torch._lazy.mark_step()
        return loss.cpu().detach(), a.grad.cpu(), b.grad.cpu()

    for got, want in zip(grads(LAZY), grads(CPU)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_compiled()
    assert metrics.snapshot()["graph_executions"] == 1, metrics.report()


def test_overlapping_strided_chunks_of_a_transposed_tensor_are_eagers(lazy_level):
    """Longformer's sliding-window chunks: ``as_strided`` over a transposed
    reshape, windows overlapping by half. Eager reads the reshape's fresh
    row-major values; Inductor lowered as_strided onto the storage beneath
    the views (the untransposed input), other elements (Longformer's loss
    1.1e-3 off in fp64). The export gathers the elements instead."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 16, generator=g, dtype=torch.float64)

    def grads(device):
        a = x.clone().to(device).requires_grad_()
        rows = a.transpose(0, 1).reshape(4, 2, 4, 16)  # a copy: the transpose is not viewable so
        stride = list(rows.stride())
        stride[1] //= 2
        chunks = rows.as_strided((4, 3, 4, 16), stride)  # three windows of 4 rows, overlapping by 2
        loss = (chunks * torch.arange(1.0, 4.0, dtype=torch.float64).view(1, 3, 1, 1).to(device)).square().sum()
        loss.backward()
        if device == LAZY:
            metrics.reset()
            torch._lazy.mark_step()
            steps.append(metrics.snapshot())
        return loss.cpu().detach(), a.grad.cpu()

    steps = []
    for got, want in zip(grads(LAZY), grads(CPU)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert_compiled(steps[0])
    assert steps[0]["graph_executions"] == 1, steps[0]


@pytest.mark.compiles_in_step("one step: its generated code is what is checked")
def test_ceil_mode_average_pool_gradients_are_eagers(lazy_level):
    """Inductor's avg_pool2d/3d backward divides a window that ceil_mode
    cuts short by its whole size when padding counts (torch.compile's
    gradients are wrong the same way: 3 -> 0.1875 for HF EfficientNet's 4x4
    pooler over a 1x1 map). Those calls run aten's kernel in the glue; with
    count_include_pad=False the backward compiles."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    x2, x3 = torch.randn(2, 3, 1, 1, generator=g, dtype=torch.float64), torch.randn(2, 2, 5, 5, 5, generator=g,
                                                                                      dtype=torch.float64)

    def grads(device):
        a, b = x2.clone().to(device).requires_grad_(), x3.clone().to(device).requires_grad_()
        pooled = [F.avg_pool2d(a, 4, 4, ceil_mode=True), F.avg_pool3d(b, 2, 2, ceil_mode=True),
                  F.avg_pool3d(b, 2, 2, ceil_mode=True, count_include_pad=False)]
        sum(((p * torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape).to(device)).sum() for p in pooled)).backward()
        if device == LAZY:
            metrics.reset()
            torch._lazy.mark_step()
        return a.grad.cpu(), b.grad.cpu()

    for got, want in zip(grads(LAZY), grads(CPU)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert_compiled()
    assert metrics.snapshot()["graph_executions"] == 1
