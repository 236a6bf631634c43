"""Devices carried through lowering: a group's placeholders, literals and
scalars made tensors live on its inputs' device, not the CPU. Checked without
a GPU: fake CUDA tensors (FakeTensorMode needs no GPU) where no real tensor
is made, the meta device where literals are real tensors."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from lazy_mlir import config
from lazy_mlir.codegen import inductor, mlir_llvm
from lazy_mlir.lowering import group_lowering
from lazy_mlir.lowering.group_lowering import group_device, lower_group
from lazy_mlir.lowering.mlir_to_fx import ExportError, export_graph
from lazy_mlir.lowering.ts_to_fx import ts_graph_to_fx

CUDA, META, CPU = torch.device("cuda", 0), torch.device("meta"), torch.device("cpu")

# An argument, a 0-d CPU-style scalar argument, a literal and a scalar made a tensor.
MODULE = """
func.func @f(%x: !torch.vtensor<[2,2],f32>, %s: !torch.vtensor<[],f32>) -> (!torch.vtensor<[2,2],f32>, !torch.vtensor<[],f64>) {
  %w = torch.vtensor.literal(dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>) : !torch.vtensor<[2,2],f32>
  %0 = torch.aten.mm %x, %w : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32> -> !torch.vtensor<[2,2],f32>
  %1 = torch.aten.mul.Tensor %0, %s : !torch.vtensor<[2,2],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[2,2],f32>
  %float = torch.constant.float 2.5
  %2 = torch.prim.NumToTensor.Scalar %float : !torch.float -> !torch.vtensor<[],f64>
  return %1, %2 : !torch.vtensor<[2,2],f32>, !torch.vtensor<[],f64>
}"""
NO_LITERAL = MODULE.replace("%w = torch.vtensor.literal(dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>) : "
                            "!torch.vtensor<[2,2],f32>", "").replace("%x, %w", "%x, %x")


def parse(text):
    context = ir.Context()
    torch_d.register_dialect(context)
    return ir.Module.parse(text, context)


def vals(gm, op):
    return [n.meta["val"] for n in gm.graph.nodes if n.op == op]


def test_export_puts_placeholders_and_results_on_the_given_devices():
    # A CUDA group with a 0-d CPU scalar beside its CUDA input (fake: no GPU needed).
    gm = export_graph(parse(NO_LITERAL), "f", FakeTensorMode(static_shapes=True), CUDA, [CUDA, CPU])
    assert [v.device for v in vals(gm, "placeholder")] == [CUDA, CPU]
    scalar = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.scalar_tensor.default)
    assert scalar.kwargs["device"] == CUDA and scalar.meta["val"].device == CUDA
    assert {v.device for v in vals(gm, "call_function")} == {CUDA}


def test_export_makes_literals_on_the_group_device():
    gm = export_graph(parse(MODULE), "f", FakeTensorMode(static_shapes=True), META)
    assert [v.device for v in vals(gm, "placeholder")] == [META, META]
    (literal,) = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert getattr(gm, literal.target).device == META and literal.meta["val"].device == META
    out, scalar = gm(torch.empty(2, 2, device=META), torch.empty((), device=META))
    assert out.device == META and scalar.device == META


def test_export_defaults_to_the_cpu_and_checks_the_device_count():
    gm = export_graph(parse(MODULE), "f")
    assert {v.device for v in vals(gm, "placeholder") + vals(gm, "get_attr")} == {CPU}
    with pytest.raises(ExportError, match="1 argument devices for 2 arguments"):
        export_graph(parse(MODULE), "f", arg_devices=[CPU])


def test_ts_to_fx_keeps_the_inputs_devices():
    graph = torch._C.parse_ir("""
        graph(%x : Tensor, %y : Tensor):
          %one : int = prim::Constant[value=1]()
          %z : Tensor = aten::add(%x, %y, %one)
          return (%z)""")
    gm, _, _ = ts_graph_to_fx(graph, [torch.empty(3, device=META), torch.empty((), device=CPU)])
    assert [v.device for v in vals(gm, "placeholder")] == [META, CPU]
    assert vals(gm, "call_function")[0].device == META


def test_group_device_is_the_inputs_non_cpu_device_else_the_backends():
    assert group_device([torch.empty((), device=CPU), torch.empty(2, device=META)], "cpu") == META
    assert group_device([torch.empty(2)], "cuda") == CPU
    assert group_device([], "cuda") == torch.device("cuda")


def with_tensor_constant(ir_text: str, value: torch.Tensor) -> torch._C.Graph:
    """``ir_text``'s graph with ``%c`` of its first node's inputs replaced by a tensor constant."""
    graph = torch._C.parse_ir(ir_text)
    node = next(iter(graph.nodes()))
    with graph.insert_point_guard(node):
        constant = graph.insertConstant(value)
    node.replaceInput(1, constant)
    return graph


def test_a_group_off_the_cpu_goes_to_inductor_with_its_device(monkeypatch):
    """mlir-llvm refuses it (its code runs on the host), and Inductor gets a
    graph whose placeholders and literals (LTC's 0-d constants) are on the group's device."""
    graph = with_tensor_constant("""
        graph(%x : Tensor, %c : Tensor):
          %y : Tensor = aten::mul(%x, %c)
          return (%y)""", torch.tensor(3.0))
    graph.eraseInput(1)
    seen = {}

    def fake_inductor(gm, fake_inputs, fake_mode, name, serializable=False, cpp_wrapper=False):
        seen["gm"], seen["inputs"] = gm, fake_inputs
        return (lambda inputs: []), "", None

    monkeypatch.setattr(inductor, "compile_graph", fake_inductor)
    mlir_llvm.fallbacks.clear()
    lower_group(graph, [torch.empty(4, device=META)], "test", config.Config(codegen="mlir-llvm", cache=False))
    (reason,) = mlir_llvm.fallbacks
    assert "the group runs on meta: mlir-llvm generates CPU code only" in reason
    assert [t.device for t in seen["inputs"]] == [META]
    gm = seen["gm"]
    assert {v.device for v in vals(gm, "placeholder") + vals(gm, "call_function")} == {META}
    (literal,) = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert getattr(gm, literal.target).device == META


def test_mlir_llvm_refuses_cuda_inputs():
    with FakeTensorMode():
        inputs = [torch.empty(2, 2, device=CUDA), torch.empty((), device=CUDA)]
    with pytest.raises(mlir_llvm.UnsupportedGroup, match="runs on cuda:0"):
        mlir_llvm.compile_module(parse(NO_LITERAL), inputs, "test")
    with pytest.raises(mlir_llvm.UnsupportedGroup, match="runs on cuda"):
        mlir_llvm.compile_module(parse(NO_LITERAL), [], "test", device="cuda")


def test_lower_group_hands_real_devices_to_export(monkeypatch):
    # group_lowering passes the inputs' devices, not its default: the seam the tests above rely on.
    calls = []
    real = group_lowering.export_graph

    def spy(module, name, fake_mode, device, arg_devices, arg_fakes=None):
        calls.append((device, list(arg_devices)))
        return real(module, name, fake_mode, device, arg_devices, arg_fakes)

    monkeypatch.setattr(group_lowering, "export_graph", spy)
    graph = torch._C.parse_ir("""
        graph(%x : Tensor):
          %y : Tensor = aten::neg(%x)
          return (%y)""")
    x = torch.randn(3)
    lowered = lower_group(graph, [x], "test", config.Config(cache=False))
    assert calls == [(CPU, [CPU])]
    torch.testing.assert_close(lowered.run([x])[0], -x)
