"""FX -> torch dialect -> FX round trips: same numerics, fake meta good enough for Inductor."""
import gc
import operator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

from lazy_mlir.lowering.fx_to_mlir import import_graph
from lazy_mlir.lowering.mlir_to_fx import ExportError, export_graph

aten = torch.ops.aten


def roundtrip(f, *inputs):
    """Traces ``f``, imports and exports it, checks both graphs agree; returns (module, exported)."""
    gm = make_fx(f, tracing_mode="fake", pre_dispatch=False)(*inputs)
    assert all(isinstance(n.meta["val"], FakeTensor) for n in gm.graph.find_nodes(op="placeholder"))
    module = import_graph(gm, "main")
    exported = export_graph(module, "main")
    expected = gm(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = exported(*inputs)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    for node in call_nodes(exported):
        assert "val" in node.meta, node
    return module, exported


def call_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def targets(gm):
    return [n.target for n in call_nodes(gm)]


def test_linear_gelu_layer_norm():
    def f(x, w, b):
        h = F.gelu(F.linear(x, w, b))
        return F.layer_norm(h, (8,))

    module, exported = roundtrip(f, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8))
    assert "torch.aten.native_layer_norm" in str(module)
    # One multi-result call; only its used result is unpacked.
    assert targets(exported).count(operator.getitem) == 1
    assert str(import_graph(exported, "main")) == str(module)  # export then import is a fixpoint


def test_softmax_log_softmax_nll_loss():
    def f(x, y):
        return x.softmax(-1), F.nll_loss(x.log_softmax(-1), y), F.cross_entropy(x, y)

    roundtrip(f, torch.randn(6, 5), torch.tensor([0, 4, 2, 1, 3, 0]))


def test_matmul_bmm_transpose_view():
    def f(a, b, c):
        m = (a @ b).transpose(0, 1).contiguous().view(-1, 2)
        return m, torch.bmm(c, c.transpose(1, 2)), torch.matmul(c, b[:, :3].reshape(3, 4))

    roundtrip(f, torch.randn(3, 4), torch.randn(4, 6), torch.randn(2, 5, 3))


def test_tensor_constants():
    def f(x, i):
        scale = torch.tensor([1.0, 2.0, 3.0, 4.0])  # dense_resource blob
        one = torch.tensor(0.5)  # one element: a splat DenseElementsAttr
        mask = torch.tensor([True, False, True, False])
        offsets = torch.tensor([3, 1], dtype=torch.int64)
        return torch.where(mask, x * scale, x * one), i + offsets

    module, exported = roundtrip(f, torch.randn(2, 4), torch.tensor([5, 7]))
    assert "dense_resource" in str(module)
    assert len([n for n in exported.graph.nodes if n.op == "get_attr"]) == 4


def test_integer_ops():
    def f(w, idx):
        e = F.embedding(idx, w)
        positions = torch.arange(idx.shape[1])
        return e.sum(dim=1, dtype=torch.float64), idx * 3 + positions, (idx > 2), e.argmax(-1), torch.zeros(2, 3, dtype=torch.int32)

    roundtrip(f, torch.randn(10, 4), torch.tensor([[1, 5, 9], [0, 2, 3]]))


def test_split_returns_a_list():
    roundtrip(lambda x: torch.split(x, 2)[1] * 2, torch.randn(6, 3))


def test_ltc_style_graph_built_by_hand():
    """The functionalised ops LTC emits, and a scalar that only exists at run time."""
    mode = FakeTensorMode(static_shapes=True)
    graph = torch.fx.Graph()

    def call(target, *args, val=None):
        node = graph.call_function(target, args)
        fakes = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        with mode:
            node.meta["val"] = target(*fakes) if val is None else val
        return node

    x, lr = graph.placeholder("x"), graph.placeholder("lr")
    with mode:
        x.meta["val"], lr.meta["val"] = torch.empty(3, 4), torch.empty(())
    step = call(aten.ScalarImplicit.default, lr, val=0.0)  # 0-d input -> scalar, as LTC does
    t = call(aten.t_copy.default, x)
    v = call(aten.view_copy.default, t, [2, 6])
    e = call(aten.expand_copy.default, v, [5, 2, 6])
    graph.output((call(aten.mul.Scalar, e, step),))
    gm = torch.fx.GraphModule({}, graph)

    exported = export_graph(import_graph(gm, "ltc"), "ltc", mode)
    assert targets(exported) == [aten.ScalarImplicit.default, aten.t_copy.default, aten.view_copy.default,
                                 aten.expand_copy.default, aten.mul.Scalar]
    for lr_value in (0.1, 0.2):  # the scalar stays a run-time input
        inputs = (torch.randn(3, 4), torch.tensor(lr_value))
        torch.testing.assert_close(exported(*inputs)[0], gm(*inputs)[0], rtol=0, atol=0)


def test_collectives_import_as_torch_operator():
    mode = FakeTensorMode(static_shapes=True)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    with mode:
        x.meta["val"] = torch.empty(4, 3)
        gathered = graph.call_function(torch.ops._c10d_functional.all_gather_into_tensor.default, (x, 2, "0"))
        gathered.meta["val"] = torch.empty(8, 3)
        waited = graph.call_function(torch.ops._c10d_functional.wait_tensor.default, (gathered,))
        waited.meta["val"] = torch.empty(8, 3)
    graph.output((waited,))

    module = import_graph(torch.fx.GraphModule({}, graph), "gather")
    assert 'torch.operator "torch._c10d_functional.all_gather_into_tensor"' in str(module)
    exported = export_graph(module, "gather", mode)
    gather, wait = call_nodes(exported)
    assert gather.target is torch.ops._c10d_functional.all_gather_into_tensor.default
    assert gather.args[1:] == (2, "0") and wait.meta["val"].shape == (8, 3)


def test_arg_attrs_and_context_lifetime():
    gm = make_fx(lambda a, b: a + b, tracing_mode="fake")(torch.randn(2), torch.randn(2))
    module = import_graph(gm, "step", {1: {"lazy_mlir.sharded": "true"}})
    gc.collect()  # the module must keep its own Context alive
    text = str(module)
    assert "%arg1: !torch.vtensor<[2],f32> {lazy_mlir.sharded = true}" in text
    assert "%arg0: !torch.vtensor<[2],f32>," in text
    with pytest.raises(IndexError, match="arguments \\[2\\]"):
        import_graph(gm, "step", {2: {"lazy_mlir.sharded": "true"}})


def parse(text):
    context = ir.Context()
    torch_d.register_dialect(context)
    return ir.Module.parse(text, context)


def test_hand_written_mlir():
    """Forms passes may produce: mm without overload, dense and splat literals, a bf16 blob
    (the importer itself needs the ml_dtypes package for bf16 constants), tuples,
    derefine, NumToTensor."""
    module = parse("""
    func.func @f(%x: !torch.vtensor<[2,2],f32>) -> (!torch.vtensor<[2,2],f32>, !torch.vtensor<[2],si64>, !torch.vtensor<[2],bf16>, !torch.vtensor<[],f32>, !torch.vtensor<[],f64>) {
      %w = torch.vtensor.literal(dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>) : !torch.vtensor<[2,2],f32>
      %c = torch.vtensor.literal(dense<7> : tensor<2xsi64>) : !torch.vtensor<[2],si64>
      %h = torch.vtensor.literal(dense_resource<half> : tensor<2xbf16>) : !torch.vtensor<[2],bf16>
      %t = torch.prim.TupleConstruct %x, %w : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32> -> !torch.tuple<vtensor, vtensor>
      %int1 = torch.constant.int 1
      %w1 = torch.prim.TupleIndex %t, %int1 : !torch.tuple<vtensor, vtensor>, !torch.int -> !torch.vtensor<[2,2],f32>
      %0 = torch.aten.mm %x, %w1 : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2,2],f32> -> !torch.vtensor<[2,2],f32>
      %none = torch.constant.none
      %dtype = torch.derefine %none : !torch.none to !torch.optional<int>
      %1 = torch.aten.sum %0, %dtype : !torch.vtensor<[2,2],f32>, !torch.optional<int> -> !torch.vtensor<[],f32>
      %float = torch.constant.float 2.5
      %2 = torch.prim.NumToTensor.Scalar %float : !torch.float -> !torch.vtensor<[],f64>
      return %0, %c, %h, %1, %2 : !torch.vtensor<[2,2],f32>, !torch.vtensor<[2],si64>, !torch.vtensor<[2],bf16>, !torch.vtensor<[],f32>, !torch.vtensor<[],f64>
    }
    {-# dialect_resources: { builtin: { half: "0x02000000C03F0040" } } #-}""")
    x = torch.randn(2, 2)
    out, const, half, total, scalar = export_graph(module, "f")(x)
    torch.testing.assert_close(out, x @ torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    torch.testing.assert_close(total, out.sum())
    assert const.tolist() == [7, 7]
    assert half.dtype == torch.bfloat16 and half.tolist() == [1.5, 2.0]
    assert scalar.dtype == torch.float64 and scalar.item() == 2.5


def test_unsupported_op_names_op_and_location():
    module = parse("""
    func.func @f(%x: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
      %0 = torch.operator "torch.mystery.op"(%x) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> loc("model.py":12:3)
      return %0 : !torch.vtensor<[2],f32>
    }""")
    with pytest.raises(ExportError, match=r"'torch.operator' at loc\(\"model.py\":12:3\): .*torch.mystery.op"):
        export_graph(module, "f")


def test_type_disagreement_is_reported():
    module = parse("""
    func.func @f(%x: !torch.vtensor<[2],f32>) -> !torch.vtensor<[3],f32> {
      %0 = torch.aten.neg %x : !torch.vtensor<[2],f32> -> !torch.vtensor<[3],f32>
      return %0 : !torch.vtensor<[3],f32>
    }""")
    with pytest.raises(ExportError, match=r"torch.aten.neg.*\(\(2,\), torch.float32\) when run"):
        export_graph(module, "f")


def test_inductor_compiles_with_fake_inputs():
    from torch._inductor.compile_fx import compile_fx_inner

    mode = FakeTensorMode(static_shapes=True)
    gm = make_fx(lambda x, w: (torch.relu(x @ w) * 2,), tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4))
    exported = export_graph(import_graph(gm, "main"), "main", mode)
    fake_inputs = [n.meta["val"] for n in exported.graph.find_nodes(op="placeholder")]
    with torch._guards.tracing(torch._guards.TracingContext(mode)):
        compiled = compile_fx_inner(exported, fake_inputs)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(compiled([x, w])[0], torch.relu(x @ w) * 2)
