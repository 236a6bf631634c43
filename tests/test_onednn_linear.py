"""Linears of CPU float32 groups on oneDNN (codegen/onednn_linear):
which products are rewritten, and that training with them matches eager
and really calls the op from the generated code. The tests' products are
small: they lower the size threshold, except where it is the subject."""
import pytest
import torch
import torch.fx as fx

import lazy_mlir
from lazy_mlir import metrics
from lazy_mlir.codegen import onednn_linear
from helpers import LAZY, assert_compiled, assert_same_training, make_mlp, mlp_batches, sgd, train

aten = torch.ops.aten
CPU = torch.device("cpu")


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MIN_MULTIPLY_ADDS", 0)


def _graph(build, dtype=torch.float32, device="cpu"):
    """A graph of ``build(graph, x, w, dy, bias)``'s products, with fake values as the export gives them."""
    graph = fx.Graph()
    shapes = {"x": (8, 4), "w": (3, 4), "dy": (8, 3), "bias": (3,)}
    nodes = {}
    for name, shape in shapes.items():
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = torch.empty(shape, dtype=dtype, device=device)
    graph.output(build(graph, **nodes))
    return fx.GraphModule(torch.nn.Module(), graph)


def _call(graph, target, *args, **kwargs):
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args], **kwargs)
    return node


def _forward(graph, x, w, dy, bias):
    """mm, addmm, and addmm as the export writes it (beta and alpha 1 given)"""
    return (_call(graph, aten.mm.default, x, _call(graph, aten.t.default, w)),
            _call(graph, aten.addmm.default, bias, x, _call(graph, aten.t.default, w)),
            _call(graph, aten.addmm.default, bias, x, _call(graph, aten.t.default, w), beta=1, alpha=1))


def _scaled(graph, x, w, dy, bias):
    return _call(graph, aten.addmm.default, bias, x, _call(graph, aten.t.default, w), beta=1, alpha=2)


def _backward(graph, x, w, dy, bias):
    dx = _call(graph, aten.mm.default, dy, _call(graph, aten.t.default, _call(graph, aten.t.default, w)))
    dw = _call(graph, aten.mm.default, _call(graph, aten.t.default, dy), x)
    return dx, dw


def test_forward_linears_are_rewritten_and_compute_the_same(any_size):
    gm = _graph(_forward)
    assert onednn_linear.rewrite(gm) == 3
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.lazy_mlir.onednn_linear.default] * 3, targets
    x, w, dy, bias = torch.randn(8, 4), torch.randn(3, 4), torch.randn(8, 3), torch.randn(3)
    mm, addmm, addmm_kw = gm(x, w, dy, bias)
    torch.testing.assert_close(mm, x @ w.t())
    torch.testing.assert_close(addmm, x @ w.t() + bias)
    torch.testing.assert_close(addmm_kw, x @ w.t() + bias)


def test_small_products_stay_mkl():
    assert onednn_linear.rewrite(_graph(_forward)) == 0  # 8 x 4 x 3 multiply-adds


def test_input_gradients_are_rewritten_weight_gradients_stay_mkl(any_size):
    gm = _graph(_backward)
    assert onednn_linear.rewrite(gm) == 1  # dY @ W, not t(dY) @ X
    products = [n.target for n in gm.graph.nodes if n.target in (aten.mm.default,
                                                                  torch.ops.lazy_mlir.onednn_linear.default)]
    assert products == [torch.ops.lazy_mlir.onednn_linear.default, aten.mm.default], products
    x, w, dy, bias = torch.randn(8, 4), torch.randn(3, 4), torch.randn(8, 3), torch.randn(3)
    dx, dw = gm(x, w, dy, bias)
    torch.testing.assert_close(dx, dy @ w)
    torch.testing.assert_close(dw, dy.t() @ x)


def test_other_dtypes_devices_and_scaled_products_stay_mkl(any_size):
    assert onednn_linear.rewrite(_graph(_forward, torch.float64)) == 0
    assert onednn_linear.rewrite(_graph(_forward, device="meta")) == 0  # off the CPU (a GPU group's values)
    assert onednn_linear.rewrite(_graph(_scaled)) == 0


@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python_wrapper", "cpp_wrapper"])
def test_mlp_trains_as_eager_with_its_linears_on_onednn(tmp_path, any_size, cpp_wrapper):
    """With Inductor's C++ wrapper (the default outside the suite) the code
    calls the op through aoti_torch_call_dispatcher, from C++ after each
    group's first run."""
    lazy_mlir.init("O1", dump_dir=str(tmp_path), cache=False, cpp_wrapper=cpp_wrapper)
    try:
        lazy_mlir._C.clear_computation_cache()  # an earlier test's MLP graph would run its code: compile anew
        metrics.reset()
        batches = mlp_batches(steps=4)
        eager = train(make_mlp, sgd, batches, CPU)
        lazy = train(make_mlp, sgd, batches, LAZY)
        assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6)
        assert_compiled(calls=4)
        generated = "\n".join(p.read_text() for p in tmp_path.glob("*.5.generated.py"))
        # the MLP's three forward linears and two input gradients (the first layer's input needs none)
        name = "lazy_mlir::onednn_linear" if cpp_wrapper else "lazy_mlir.onednn_linear"
        assert generated.count(name) >= 5, generated[:2000]
        if cpp_wrapper:
            s = metrics.snapshot()
            assert s["native_group_calls"] == s["compiled_group_calls"] - s["groups_built"] > 0, metrics.report()
    finally:
        lazy_mlir.init("O1")


def test_the_op_is_a_cpu_kernel_in_cpp():
    """The generated code calls the op through the dispatcher with the GIL
    released: a Python kernel would take the GIL back on every call (and
    wait behind a background compile's thread). The C++ kernel computes
    x @ W.t() + b, W given as is or as the transposed view of an input
    gradient."""
    dump = torch._C._dispatch_dump("lazy_mlir::onednn_linear")
    cpu = next(line for line in dump.splitlines() if line.startswith("CPU:"))
    assert "onednn_linear.cpp" in cpu, dump
    x, w, b = torch.randn(64, 48), torch.randn(32, 48), torch.randn(32)
    op = torch.ops.lazy_mlir.onednn_linear
    torch.testing.assert_close(op(x, w, b), torch.addmm(b, x, w.t()))
    torch.testing.assert_close(op(x, w, None), x @ w.t())
    wt = torch.randn(48, 32).t()  # [32, 48], column-major
    torch.testing.assert_close(op(x, wt, None), x @ wt.t())
