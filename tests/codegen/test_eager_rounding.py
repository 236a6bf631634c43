"""Generated code rounds as aten's kernels do where they round a constant to
float32 in every dtype (codegen/eager_rounding): float64 hardsigmoid
gradients, as in MobileNetV3's squeeze-excitation, equal eager's."""
import pytest
import torch
import torch._lazy
import torch.fx as fx

from helpers import assert_compiled
from lazy_mlir.codegen import eager_rounding
from lazy_mlir.observe import metrics

LAZY = torch.device("lazy")


@pytest.mark.compiles_in_step("the gradient is read in the step that compiles it")
def test_float64_hardsigmoid_gradient_equals_eagers(lazy_level):
    x = torch.randn(2, 16, 8, dtype=torch.float64) * 4  # both sides of the [-3, 3] window
    w = torch.randn(16, 1, dtype=torch.float64)
    eager_x, lazy_x = x.clone().requires_grad_(), x.to(LAZY).requires_grad_()
    (torch.nn.functional.hardsigmoid(eager_x) * w).square().sum().backward()
    metrics.reset()
    (torch.nn.functional.hardsigmoid(lazy_x) * w.to(LAZY)).square().sum().backward()
    torch._lazy.mark_step()
    assert_compiled()
    # Inductor's own decomposition (1/6 in float64) is 3e-8 off of aten's
    torch.testing.assert_close(lazy_x.grad.cpu(), eager_x.grad, rtol=1e-15, atol=0)


def test_only_float64_is_rewritten():
    def f(g, x):
        return torch.ops.aten.hardsigmoid_backward(g, x)

    for dtype, expected in ((torch.float64, 1), (torch.float32, 0)):
        g, x = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype) * 4
        gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(g, x)
        assert eager_rounding.rewrite(gm) == expected
        assert isinstance(gm, fx.GraphModule)
        torch.testing.assert_close(gm(g, x), f(g, x), rtol=0, atol=0)
