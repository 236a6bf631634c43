"""Matrix products of CPU float32 groups on oneDNN (codegen/onednn_linear):
which products are rewritten into which op (linears into the inner
product, weight gradients and bmm into the matmul primitive), and that
training with them matches eager and really calls the ops from the
generated code. The tests' products are small: they lower the size
thresholds, except where those are the subject."""
import pytest
import torch
import torch.fx as fx

from lazy_mlir.codegen import onednn_linear
from lazy_mlir.observe import metrics
from helpers import make_adamw, make_mlp, mlp_batches, sgd, small_gpt, small_gpt_batches, trained_like_eager

aten = torch.ops.aten


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(onednn_linear, "MIN_MULTIPLY_ADDS", 0)
    monkeypatch.setattr(onednn_linear, "MIN_MATMUL_MULTIPLY_ADDS", 0)


LINEAR, MATMUL = torch.ops.lazy_mlir.onednn_linear.default, torch.ops.lazy_mlir.onednn_matmul.default

# The matmul primitive takes float32 only on CPUs with AVX-512 or AVX-NE-CONVERT
# (an AMD EPYC with AVX2 alone has neither): there the products it would take
# stay MKL's, as test_no_matmul_where_torch_cannot_run_it checks on any CPU.
MATMUL_USABLE = onednn_linear._matmul_usable()
needs_matmul = pytest.mark.skipif(not MATMUL_USABLE, reason="oneDNN's float32 matmul needs AVX-512 or "
                                  "AVX-NE-CONVERT, which this CPU lacks")


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


def _conv1d(graph, x, w, dy, bias):
    """Hugging Face's Conv1D (GPT-2's linears): addmm(bias, x, B), B stored [in, out]"""
    return (_call(graph, aten.addmm.default, bias, x, _call(graph, aten.t.default, w)),  # a clone of t(w) below
            _call(graph, aten.addmm.default, bias, x, _call(graph, aten.clone.default, _call(graph, aten.t.default, w),
                                                            memory_format=torch.contiguous_format)))


def test_a_weight_stored_in_by_out_is_a_linear_too(any_size):
    gm = _graph(_conv1d)
    assert onednn_linear.rewrite(gm) == 2
    assert [n.target for n in gm.graph.nodes if n.target in (aten.addmm.default, LINEAR)] == [LINEAR, LINEAR]
    x, w, bias = torch.randn(8, 4), torch.randn(3, 4), torch.randn(3)
    for out in gm(x, w, None, bias):
        torch.testing.assert_close(out, x @ w.t() + bias)


@pytest.fixture
def timings(monkeypatch):
    """Replaces the stopwatch: each product's (MKL, oneDNN) seconds are
    taken from ``timings[0]``; the calls are counted in ``timings[1]``."""
    state = [(1.0, 1.0), []]

    def median_seconds(mkl, onednn):
        state[1].append((mkl, onednn))
        return state[0]

    monkeypatch.setattr(onednn_linear, "_median_seconds", median_seconds)
    monkeypatch.setattr(onednn_linear, "_measured", {})
    return state


@pytest.mark.parametrize("mkl, onednn, rewritten", [(1.0, 0.5, 3), (1.0, 0.98, 0), (1.0, 1.5, 0)])
def test_measured_products_go_where_they_run_faster(any_size, timings, mkl, onednn, rewritten):
    """On an AVX2-only EPYC MKL beat oneDNN on every GPT-mini linear: by
    default each product is timed and goes to oneDNN only if it wins by
    MIN_GAIN (a tie stays MKL's). One timing per sizes and strides: the
    three linears of _forward are two signatures (with and without bias)."""
    timings[0] = (mkl, onednn)
    gm = _graph(_forward)
    assert onednn_linear.rewrite(gm, measured=True) == rewritten
    assert len(timings[1]) == 2
    assert onednn_linear.rewrite(_graph(_forward), measured=True) == rewritten and len(timings[1]) == 2  # remembered
    x, w, dy, bias = torch.randn(8, 4), torch.randn(3, 4), torch.randn(8, 3), torch.randn(3)
    for got in gm(x, w, dy, bias)[1:]:
        torch.testing.assert_close(got, x @ w.t() + bias)


def test_the_stopwatch_times_both_kernels_on_the_products_layouts(any_size, monkeypatch):
    """The real timing: a Conv1D weight (stored [in, out]) and a weight
    gradient, each timed once with both candidates computing the same product."""
    monkeypatch.setattr(onednn_linear, "_measured", {})
    calls = []
    median_seconds = onednn_linear._median_seconds

    def checked(mkl, onednn):
        torch.testing.assert_close(mkl(), onednn())
        calls.append(1)
        return median_seconds(mkl, onednn)

    monkeypatch.setattr(onednn_linear, "_median_seconds", checked)
    rewritten = onednn_linear.rewrite(_graph(_conv1d), measured=True)
    measured = onednn_linear.measured_products()
    assert len(measured) == len(calls) == 2  # the weight as t(w), and as t(B) of a contiguous B: other strides
    assert all(mkl > 0 and onednn > 0 for mkl, onednn in measured.values())
    assert rewritten == sum(onednn < onednn_linear.MIN_GAIN * mkl for mkl, onednn in measured.values())
    if MATMUL_USABLE:
        onednn_linear.rewrite(_graph(_backward), measured=True)
        assert len(calls) == 4  # the input gradient's linear, the weight gradient's matmul


def test_small_products_stay_mkl():
    assert onednn_linear.rewrite(_graph(_forward)) == 0  # 8 x 4 x 3 multiply-adds


@needs_matmul
def test_input_gradients_are_linears_weight_gradients_matmuls(any_size):
    """dY @ W is the inner product of dY and t(W); t(dY) @ X reduces over the
    rows of both, which the matmul primitive takes transposed, no copy."""
    gm = _graph(_backward)
    assert onednn_linear.rewrite(gm) == 2
    products = [n.target for n in gm.graph.nodes if n.op == "call_function" and n.target in (aten.mm.default, LINEAR,
                                                                                               MATMUL)]
    assert products == [LINEAR, MATMUL], products
    x, w, dy, bias = torch.randn(8, 4), torch.randn(3, 4), torch.randn(8, 3), torch.randn(3)
    dx, dw = gm(x, w, dy, bias)
    torch.testing.assert_close(dx, dy @ w)
    torch.testing.assert_close(dw, dy.t() @ x)


def _attention(graph, x, w, dy, bias):
    """q @ t(k) batched, as an attention's scores: [2, 8, 4] @ [2, 4, 8]"""
    q = _call(graph, aten.view.default, x, [2, 4, 4])
    k = _call(graph, aten.view.default, x, [2, 4, 4])
    scores = _call(graph, aten.bmm.default, q, _call(graph, aten.transpose.int, k, 1, 2))
    return (scores,)


@needs_matmul
def test_bmm_becomes_a_matmul_above_its_threshold(any_size, monkeypatch):
    gm = _graph(_attention)
    assert onednn_linear.rewrite(gm) == 1
    assert [n.target for n in gm.graph.nodes if n.target in (aten.bmm.default, MATMUL)] == [MATMUL]
    x = torch.randn(8, 4)
    (scores,) = gm(x, None, None, None)
    q = x.view(2, 4, 4)
    torch.testing.assert_close(scores, torch.bmm(q, q.transpose(1, 2)))
    monkeypatch.setattr(onednn_linear, "MIN_MATMUL_MULTIPLY_ADDS", 2 * 4 * 4 * 4 + 1)
    assert onednn_linear.rewrite(_graph(_attention)) == 0


def test_no_matmul_where_torch_cannot_run_it(any_size, monkeypatch):
    """at::native::mkldnn_matmul refuses float32 without AVX-512 (or
    AVX-NE-CONVERT): there the products stay MKL's, the linears move."""
    monkeypatch.setattr(onednn_linear, "_matmul_usable", lambda: False)
    gm = _graph(_backward)
    assert onednn_linear.rewrite(gm) == 1
    assert MATMUL not in [n.target for n in gm.graph.nodes]
    assert onednn_linear.rewrite(_graph(_attention)) == 0


def test_other_dtypes_devices_and_scaled_products_stay_mkl(any_size):
    assert onednn_linear.rewrite(_graph(_forward, torch.float64)) == 0
    assert onednn_linear.rewrite(_graph(_forward, device="meta")) == 0  # off the CPU (a GPU group's values)
    assert onednn_linear.rewrite(_graph(_scaled)) == 0


def test_a_value_two_products_read_is_computed_once(any_size):
    """A GELU output that two linears read (an attention block's q and k
    projections; an MLP block's forward linear and weight gradient) is
    computed into one buffer: Inductor's default for an extern op copies an
    unrealized input per call, computing it twice. Two linears: the inner
    product runs on every CPU (the matmul primitive needs AVX-512)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from lazy_mlir.codegen import inductor

    def block(x, w1, w2):
        h = torch.nn.functional.gelu(x).view(16, 8)  # as the export writes it: both read a view
        return h @ w1.t(), h @ w2.t()

    x, w1, w2 = torch.randn(2, 8, 8), torch.randn(4, 8), torch.randn(6, 8)
    gm = make_fx(block, tracing_mode="fake")(x, w1, w2)
    assert onednn_linear.rewrite(gm) == 2
    fake_mode = FakeTensorMode()
    run, code, _ = inductor.compile_graph(gm, [fake_mode.from_tensor(t) for t in (x, w1, w2)], fake_mode, "shared")
    call = code[code.index("def call"):]
    assert call.count("empty_strided_cpu(") == 1, call  # the GELU's one buffer (a copy per product: 2)
    for got, want in zip(run([x, w1, w2]), block(x, w1, w2), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python_wrapper", "cpp_wrapper"])
def test_mlp_trains_as_eager_with_its_linears_on_onednn(tmp_path, any_size, cpp_wrapper):
    """With Inductor's C++ wrapper (the default outside the suite) the code
    calls the ops through aoti_torch_call_dispatcher, from C++ after each
    group's first run."""
    generated = trained_like_eager(tmp_path, make_mlp, sgd, mlp_batches(steps=4), 1e-5, 1e-6, cpp_wrapper=cpp_wrapper,
                                   onednn_linear="on")
    # the MLP's three forward linears and two input gradients (the first layer's input needs none)
    linear, matmul = ("lazy_mlir::onednn_linear", "lazy_mlir::onednn_matmul") if cpp_wrapper else \
        ("lazy_mlir.onednn_linear", "lazy_mlir.onednn_matmul")
    assert generated.count(linear) >= 5, generated[:2000]
    if MATMUL_USABLE:
        assert generated.count(matmul) >= 3, generated[:2000]  # the three weight gradients
    if cpp_wrapper:
        s = metrics.snapshot()
        assert s["native_group_calls"] == s["compiled_group_calls"] - s["groups_built"] > 0, metrics.report()


class SummedLinear(torch.nn.Module):
    """A loss that sums a linear's output: the output's gradient is an expanded tensor (strides of 0)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # eager's and the lazy model's weights alike
        self.fc = torch.nn.Linear(24, 24, bias=False)

    def forward(self, x, y):
        return self.fc(x).sum()


@needs_matmul  # the expanded gradient is a weight gradient's operand: onednn_matmul's
def test_an_expanded_gradient_is_timed_and_trains_as_eager(tmp_path, any_size, monkeypatch):
    """The stopwatch's random operands take the product's strides: filling an
    expanded one in place failed, and the group with it ran in TorchScript."""
    monkeypatch.setattr(onednn_linear, "_measured", {})
    batches = [(torch.randn(5, 24), torch.zeros(5)) for _ in range(3)]
    trained_like_eager(tmp_path, SummedLinear, sgd, batches, 1e-5, 1e-6, onednn_linear="auto")
    layouts = [layout for _, _, operands in onednn_linear.measured_products() for layout in operands if layout]
    assert any(0 in strides for _, strides in layouts), layouts


def test_the_ops_are_cpu_kernels_in_cpp():
    """The generated code calls the ops through the dispatcher with the GIL
    released: a Python kernel would take the GIL back on every call (and
    wait behind a background compile's thread). The linear computes
    x @ W.t() + b, W given as is or as the transposed view of an input
    gradient; the matmul a @ b, 2-D or batched, either side transposed."""
    for name in ("lazy_mlir::onednn_linear", "lazy_mlir::onednn_matmul"):
        dump = torch._C._dispatch_dump(name)
        cpu = next(line for line in dump.splitlines() if line.startswith("CPU:"))
        assert "onednn_ops.cpp" in cpu, dump
    x, w, b = torch.randn(64, 48), torch.randn(32, 48), torch.randn(32)
    op = torch.ops.lazy_mlir.onednn_linear
    torch.testing.assert_close(op(x, w, b), torch.addmm(b, x, w.t()))
    torch.testing.assert_close(op(x, w, None), x @ w.t())
    wt = torch.randn(48, 32).t()  # [32, 48], column-major
    torch.testing.assert_close(op(x, wt, None), x @ wt.t())
    if not MATMUL_USABLE:
        return
    mm = torch.ops.lazy_mlir.onednn_matmul
    dy = torch.randn(64, 32)
    torch.testing.assert_close(mm(dy.t(), x), dy.t() @ x)
    q, k = torch.randn(4, 16, 8), torch.randn(4, 16, 8)
    torch.testing.assert_close(mm(q, k.transpose(1, 2)), torch.bmm(q, k.transpose(1, 2)))
    torch.testing.assert_close(mm(q.transpose(1, 2), k), torch.bmm(q.transpose(1, 2), k))


@needs_matmul
def test_small_gpt_trains_as_eager_with_every_product_on_onednn(tmp_path, any_size):
    """Attention's bmm (operands transposed by the trace's views) and the
    weight gradients as matmuls, the linears as inner products, in one
    compiled step against eager."""
    generated = trained_like_eager(tmp_path, small_gpt, make_adamw, small_gpt_batches(steps=3), 1e-4, 1e-5,
                                   onednn_linear="on")
    assert "extern_kernels.bmm" not in generated and "lazy_mlir.onednn_matmul" in generated, generated[:2000]
