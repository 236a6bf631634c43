"""codegen="mlir-llvm": groups compiled by MLIR's LLVM backend match eager;
groups it cannot lower fall back to Inductor with the reason recorded."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import lazy_mlir
from helpers import LAZY, assert_same_training, make_mlp, mlp_batches, sgd, train
from lazy_mlir import config
from lazy_mlir.codegen import mlir_llvm
from lazy_mlir.lowering.fx_to_mlir import import_graph
from lazy_mlir.lowering.group_lowering import lower_group
from lazy_mlir.observe import metrics

CPU = torch.device("cpu")


def compile_fn(f, *inputs):
    gm = make_fx(f)(*inputs)
    return mlir_llvm.compile_module(import_graph(gm, "group"), list(inputs), "test")


@pytest.fixture
def mlir_llvm_codegen():
    lazy_mlir.init("O1", codegen="mlir-llvm")
    metrics.reset()
    mlir_llvm.compiled_groups.clear()
    mlir_llvm.fallbacks.clear()
    try:
        yield
    finally:
        lazy_mlir.init("O1")


def test_linear_relu_sum_matches_eager():
    def f(x, w, b):
        return (F.relu(F.linear(x, w, b)).sum(),)

    inputs = (torch.randn(8, 16), torch.randn(4, 16), torch.randn(4))
    got = compile_fn(f, *inputs)(list(inputs))
    torch.testing.assert_close(got, list(f(*inputs)), rtol=1e-5, atol=1e-6)


def test_calling_convention_edge_cases():
    # A value returned twice, an input returned as is, a non-contiguous
    # input, int64 and bool results.
    def f(x, i):
        y = x * 2
        return y, y, x, (i + 1), x > 0

    x, i = torch.randn(3, 5), torch.arange(6)
    run = compile_fn(f, x, i)
    x_view = torch.randn(5, 3).t()
    got = run([x_view, i])
    expected = f(x_view, i)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert got[2].data_ptr() != x_view.data_ptr()  # an output never aliases an input


@pytest.mark.parametrize("f, x, reason", [
    (torch.lgamma, torch.rand(4), "torch.aten.lgamma"),  # no linalg lowering
    (lambda x: x + torch.rand_like(x), torch.rand(4), "random numbers"),  # torch-mlir's own generator
    (lambda x: x * 2, torch.ones(4, dtype=torch.int8), "8-bit integer"),  # would crash torch-mlir
], ids=["no-lowering", "random", "int8"])
def test_unsupported_group_names_the_reason(f, x, reason):
    with pytest.raises(mlir_llvm.UnsupportedGroup, match=reason):
        compile_fn(lambda x: (f(x),), x)


def test_specialized_scalar_keeps_its_guard():
    # leaky_relu's slope has no tensor form: specialize-scalars bakes it in,
    # and the caller must still be told to check it.
    graph = torch._C.parse_ir('''
        graph(%x : Tensor, %slope : Tensor):
          %s : Scalar = aten::ScalarImplicit(%slope)
          %y : Tensor = aten::leaky_relu(%x, %s)
          return (%y)''')
    x, slope = torch.randn(4, 8), torch.tensor(0.25)
    mlir_llvm.compiled_groups.clear()
    lowered = lower_group(graph, [x, slope], "test", config.Config(codegen="mlir-llvm"))
    assert mlir_llvm.compiled_groups["test"] == 1
    assert lowered.guards == [(1, 0.25)]
    torch.testing.assert_close(lowered.run([x, slope])[0], F.leaky_relu(x, 0.25), rtol=0, atol=0)


def test_mlp_training_matches_eager(mlir_llvm_codegen):
    batches = mlp_batches(steps=3)
    eager = train(make_mlp, sgd, batches, CPU)
    assert_same_training(eager, train(make_mlp, sgd, batches, LAZY))
    assert mlir_llvm.compiled_groups, "no group ran through mlir-llvm"
    assert not mlir_llvm.fallbacks


def test_unsupported_group_falls_back_to_inductor(mlir_llvm_codegen):
    # torch-mlir has no linalg lowering of lgamma; Inductor has.
    def f(x):
        return torch.lgamma(x.abs() + 1).sum(0) * 2

    x = torch.rand(4, 8)
    out = f(x.to(LAZY))
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), f(x))
    reasons = list(mlir_llvm.fallbacks)
    assert len(reasons) == 1 and "torch.aten.lgamma" in reasons[0]
    assert not mlir_llvm.compiled_groups
    assert not metrics.snapshot()["groups_fallen_back"]  # compiled by Inductor, not left to TorchScript
    assert metrics.snapshot()["compiled_group_calls"] >= 1
