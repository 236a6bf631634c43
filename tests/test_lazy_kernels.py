"""Ops the stock TS backend mishandles trace into the graph, with no fallback."""
import re
import sys

import pytest
import torch
import torch.nn.functional as F

import lazy_mlir

from lazy_mlir.observe import metrics
from lazy_mlir.trace import lazy_kernels, shape_functions
from helpers import CPU, LAZY, assert_compiled


def _lazy_leaf(t):
    return t.detach().clone().to(LAZY).requires_grad_(True)


@pytest.mark.parametrize("split", [
    lambda t: t.split(3, dim=1),                 # nanoGPT's c_attn(x).split(C, dim=2)
    lambda t: t.split([2, 5, 1], dim=1),
    lambda t: t.chunk(3, dim=-1),
    lambda t: t.unbind(0),
])
def test_view_splitting_ops_stay_lazy_with_gradients(lazy_level, split):
    x = torch.randn(4, 8)
    xl = _lazy_leaf(x)
    xe = x.clone().requires_grad_(True)
    parts_l, parts_e = split(xl), split(xe)
    assert all(p.device.type == "lazy" for p in parts_l)
    weights = [float(i + 1) for i in range(len(parts_e))]
    sum(w * p.sin().sum() for w, p in zip(weights, parts_l)).backward()
    sum(w * p.sin().sum() for w, p in zip(weights, parts_e)).backward()
    torch._lazy.mark_step()
    for pl, pe in zip(parts_l, parts_e):
        torch.testing.assert_close(pl.cpu(), pe)
    torch.testing.assert_close(xl.grad.cpu(), xe.grad)
    assert metrics.snapshot()["fallback_count"] == 0


def test_lerp_traces_without_sync(lazy_level):
    a, b, w = torch.randn(5), torch.randn(5), torch.rand(5)
    out_s = torch.lerp(a.to(LAZY), b.to(LAZY), 0.3)
    out_t = torch.lerp(a.to(LAZY), b.to(LAZY), w.to(LAZY))
    assert metrics.snapshot()["graph_executions"] == 0  # nothing ran eagerly
    torch.testing.assert_close(out_s.cpu(), torch.lerp(a, b, 0.3))
    torch.testing.assert_close(out_t.cpu(), torch.lerp(a, b, w))
    assert metrics.snapshot()["fallback_count"] == 0


def test_ops_with_a_decomposition_are_traced_through_it(lazy_level):
    registered = lazy_kernels.decomposed_ops()
    # ops the TS backend lacks, each with an aten-written torch._decomp entry
    for name in ("aten::mse_loss", "aten::nansum", "aten::floor_divide"):
        assert name in registered
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    xl, yl = x.to(LAZY), y.to(LAZY)
    results = [F.mse_loss(xl, yl), torch.nansum(xl, 1), torch.floor_divide(xl, yl)]
    expected = [F.mse_loss(x, y), torch.nansum(x, 1), torch.floor_divide(x, y)]
    assert metrics.snapshot()["graph_executions"] == 0
    torch._lazy.mark_step()
    for got, want in zip(results, expected):
        torch.testing.assert_close(got.cpu(), want)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1



def test_decompositions_with_views_run_functionalized(lazy_level):
    # upsample_bicubic2d's decomposition calls unsqueeze: below functionalization
    # that reached LTC as as_strided (an eager fallback and a sync; ViT's
    # interpolate_pos_encoding). The input is a permuted view, as in ViT.
    assert "aten::upsample_bicubic2d" in lazy_kernels.decomposed_ops()
    p = torch.randn(1, 17, 8, dtype=torch.float64)
    pl = _lazy_leaf(p)
    pe = p.clone().requires_grad_(True)
    outs = [F.interpolate(t[:, 1:].reshape(1, 4, 4, 8).permute(0, 3, 1, 2), size=(6, 6), mode="bicubic")
            for t in (pl, pe)]
    for out in outs:
        (out * out).sum().backward()
    assert metrics.snapshot()["graph_executions"] == 0
    torch._lazy.mark_step()
    torch.testing.assert_close(outs[0].cpu(), outs[1])
    torch.testing.assert_close(pl.grad.cpu(), pe.grad)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1

IDX = torch.tensor([2, 0])
BUILTIN_CASES = {
    "sin": torch.sin,
    "erf": torch.erf,
    "where": lambda t: torch.where(t > 0, t, 0.5),
    "index": lambda t: t[IDX.to(t.device)],
    "index_none_first": lambda t: t[:, IDX.to(t.device)],
    "var": lambda t: t.var(1),
    "argmax": lambda t: t.argmax(1),
    "roll": lambda t: t.roll(1, 0),
    "atan2": lambda t: torch.atan2(t, t + 1),
    "any": lambda t: (t > 0).any(1),
}


@pytest.mark.parametrize("case", sorted(BUILTIN_CASES))
def test_ops_without_lazy_kernel_trace_as_builtin_nodes(lazy_level, case):
    f = BUILTIN_CASES[case]
    x = torch.randn(3, 4)
    out = f(x.to(LAZY))
    assert metrics.snapshot()["graph_executions"] == 0
    torch._lazy.mark_step()
    torch.testing.assert_close(out.cpu(), f(x))
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1


def test_data_dependent_op_takes_the_counted_eager_path(lazy_level):
    x = torch.tensor([[3.0, 1.0], [3.0, 2.0]])
    torch.testing.assert_close(torch.unique(x.to(LAZY), dim=0).cpu(), torch.unique(x, dim=0))
    assert metrics.snapshot()["fallbacks"] == {"aten::unique_dim": 1}


def test_failing_decomposition_falls_back_to_the_builtin(lazy_level, monkeypatch):
    op = torch.ops.aten.logaddexp.default

    def broken(*args, **kwargs):
        raise NotImplementedError("as_strided on the lazy device")

    kernel = lazy_kernels._decomposed_kernel(op, broken)
    monkeypatch.setattr(lazy_kernels, "_untrusted", set())
    x, y = torch.randn(3), torch.randn(3)
    with pytest.warns(RuntimeWarning, match="decomposition of aten.logaddexp.default failed"):
        out = kernel(x.to(LAZY), y.to(LAZY))
    assert out.device.type == "lazy"
    kernel(x.to(LAZY), y.to(LAZY))  # no second warning
    torch.testing.assert_close(out.cpu(), torch.logaddexp(x, y))
    assert metrics.snapshot()["fallback_count"] == 0


def test_inplace_ops_keep_their_shape_and_dtype_checks(lazy_level):
    """In-place pointwise ops get a C++ Meta kernel (functionalization's shape
    check); it must reject what eager rejects."""
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        torch.ones(3, dtype=torch.long).to(LAZY).mul_(0.5)
    with pytest.raises(RuntimeError, match=r"doesn't match the broadcast shape \[2, 3\]"):
        torch.ones(3).to(LAZY).add_(torch.ones(2, 3).to(LAZY))
    a, b = torch.randn(2, 3), torch.randn(3)
    out = a.to(LAZY).addcmul_(b.to(LAZY), b.to(LAZY), value=0.5).lerp_(b.to(LAZY), 0.25)
    torch.testing.assert_close(out.cpu(), a.clone().addcmul_(b, b, value=0.5).lerp_(b, 0.25))


def test_backend_and_kernels_are_installed(lazy_level):
    assert lazy_mlir.native._C.is_active()  # our backend, not the stock TS one, serves device "lazy"
    assert "aten::sin" in lazy_kernels.builtin_ops()
    # In-place pointwise ops run functionalization's meta check in C++, not in Python refs
    # (GPT-mini's trace: 41 -> 13 ms).
    for op in ("aten::addcdiv_", "aten::lerp_.Scalar", "aten::mul_.Tensor", "aten::empty_like"):
        meta = next(line for line in torch._C._dispatch_dump_table(op).splitlines() if line.startswith("Meta:"))
        assert "meta_kernels.cpp" in meta, (op, meta)


@pytest.mark.parametrize("attention", [
    lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    lambda q, k, v, m: torch.ops.aten._safe_softmax((q @ k.transpose(-1, -2)).masked_fill(~m, float("-inf")), -1) @ v,
])
def test_masked_attention_traces_in_one_graph(lazy_level, attention, monkeypatch):
    """Masked/causal SDPA reaches _safe_softmax, whose composite kernel ends in
    where.self_out: LTC has no kernel for it (an eager fallback, 3 graph
    executions per attention call). Our _safe_softmax kernel
    (safe_softmax_kernel.h) calls the functional where instead, without the
    Python kernel of the out= variant."""
    python_kernels = []
    original = lazy_kernels._schema_arguments
    monkeypatch.setattr(lazy_kernels, "_schema_arguments",
                        lambda op, args, kwargs: python_kernels.append(str(op)) or original(op, args, kwargs))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[0] = False  # a fully masked row: _safe_softmax's zeros, not NaN
    leaves = [_lazy_leaf(t) for t in (q, k, v)]
    eager_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out_l = attention(*leaves, mask.to(LAZY))
    out_e = attention(*eager_leaves, mask)
    (out_l * out_l).sum().backward()
    (out_e * out_e).sum().backward()
    torch._lazy.mark_step()
    s = metrics.snapshot()
    assert s["fallback_count"] == 0, s["fallbacks"]
    assert s["graph_executions"] == 1 and s["syncs"] == {}
    torch.testing.assert_close(out_l.cpu(), out_e)
    for lazy_leaf, eager_leaf in zip(leaves, eager_leaves):
        torch.testing.assert_close(lazy_leaf.grad.cpu(), eager_leaf.grad)
    assert "aten.where.self_out" not in python_kernels


def test_out_and_inplace_variants_trace_their_functional_sibling(lazy_level):
    """Called below functionalization (as composite kernels do), out= and
    in-place variants LTC lacks write the traced result into their argument.
    (An out= of another size is refused: LTC's resize_ is broken.)"""
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    cond = x > 0
    xl, yl = x.to(LAZY), y.to(LAZY)
    torch._lazy.mark_step()
    metrics.reset()
    with torch._C._AutoDispatchBelowAutograd(), torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
        out = torch.empty(3, 4, device=LAZY)
        torch.ops.aten.where.self_out(cond.to(LAZY), xl, yl, out=out)
        inplace = xl.clone()
        torch.ops.aten.sinc_(inplace)
        shifted = torch.arange(4).to(LAZY)  # Python's in-place operator: __ilshift__ -> __lshift__
        torch.ops.aten.__ilshift__.Scalar(shifted, 2)
    torch._lazy.mark_step()
    assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]
    torch.testing.assert_close(out.cpu(), torch.where(cond, x, y))
    torch.testing.assert_close(inplace.cpu(), torch.sinc(x))
    assert shifted.cpu().tolist() == [0, 4, 8, 12]


def test_every_mutable_variant_with_a_functional_sibling_is_covered(lazy_level):
    """The class, not the instance: what still takes the eager path is random
    (RNG stream kept), has no functional sibling, or is not a tensor op."""
    assert {"aten::where.self_out", "aten::sinc_", "aten::hardswish_"} <= set(lazy_kernels.mutable_ops())
    for qualified in lazy_kernels.uncovered_ops():
        op = lazy_kernels._resolve(qualified)
        if op is None or not op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags:
            continue
        assert lazy_kernels._functional_sibling(op) is None, qualified


def test_factories_of_numbers_are_handed_to_the_step_without_a_fallback(lazy_level):
    """linspace, logspace and range (their composite kernels call their out=
    variants with an empty out the lazy device cannot resize) are made on the
    host from their numbers and enter the step as data: no eager fallback,
    no sync, one graph execution."""
    x = torch.randn(5)
    lazy = x.to(LAZY)
    torch._lazy.mark_step()
    metrics.reset()
    made = [torch.linspace(0, 1, 5, device=LAZY), torch.logspace(0, 2, 5, device=LAZY, dtype=torch.float64),
            torch.range(0, 4, device=LAZY)]
    out = [lazy * m for m in made]
    torch._lazy.mark_step()
    expected = [torch.linspace(0, 1, 5), torch.logspace(0, 2, 5, dtype=torch.float64), torch.range(0, 4)]
    for o, e in zip(out, expected):
        torch.testing.assert_close(o.cpu(), x * e)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()


def test_every_op_on_the_eager_path_says_why(lazy_level):
    """uncovered_ops() names each op left on the eager path with its reason:
    none is there for want of a rule (an op with sizes its inputs' sizes
    give would be "other"); the data-dependent ones traced are not there."""
    uncovered = lazy_kernels.uncovered_ops()
    assert uncovered and all(why != "other" for why in uncovered.values()), \
        {q: why for q, why in uncovered.items() if why == "other"}
    assert not {"aten::nonzero", "aten::masked_select", "aten::index.Tensor", "aten::_ctc_loss.Tensor"} & set(uncovered)
    assert uncovered["aten::unique_dim"].startswith("its sizes come from its inputs' values")
    # a node whose sizes nothing computes takes the eager path at every call: listed too
    # (SyncBatchNorm's statistics have CUDA kernels only); one without a Meta kernel is not
    assert uncovered["aten::batch_norm_stats"].startswith("no Meta kernel, and no kernel of the backing device's")
    assert "aten::fractional_max_pool3d_backward" not in uncovered
    draws = {q for q, why in uncovered.items() if why.startswith("random")}
    assert draws == {"aten::_fused_dropout", "aten::_fill_mem_eff_dropout_mask_"}, draws  # CUDA's kernels
    assert not {"aten::linspace.out", "aten::logspace.out", "aten::range.out"} & set(uncovered)
    assert uncovered["aten::_scaled_dot_product_flash_attention_for_cpu"].startswith("another backend's own kernel")


def test_composites_that_call_their_own_out_variant_are_traced(lazy_level):
    """logical_not's composite kernel calls logical_not.out on an empty({0})
    buffer the lazy device cannot resize (and that variant's kernel would call
    logical_not back): such ops are traced themselves, with no recursion."""
    x, y = torch.randn(6), torch.randn(6)
    xl, yl = x.to(LAZY), y.to(LAZY)
    ops = [lambda a, b: torch.logical_not(a), torch.logical_and, torch.logical_xor,
           lambda a, b: torch.frexp(a)[0], lambda a, b: torch.kthvalue(a, 2)[0],
           lambda a, b: torch.nanquantile(a, 0.3)]
    outs = [f(xl, yl) for f in ops]
    torch._lazy.mark_step()
    for f, out in zip(ops, outs):
        torch.testing.assert_close(out.cpu(), f(x, y))
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()


def test_composite_kernels_that_use_views_or_resize_are_traced(lazy_level):
    """Composite kernels run below functionalization: addr/rot90/any.dims/
    unsafe_split call view ops, logsumexp resizes an empty out= buffer; the
    lazy device refuses both. Each op is then traced another way, in the same
    graph, and the refused view is not counted as an eager fallback (the first
    refusal per op and process costs one graph execution: LTC's fallback moves
    the arguments to the CPU before refusing). adaptive_max_pool2d's
    decomposition returns NotImplemented: traced as a node."""
    x, u, v = torch.randn(7, 13), torch.randn(7), torch.randn(13)
    p = torch.randn(1, 2, 7, 13)
    ops = [lambda: torch.addr(x, u, v), lambda: torch.rot90(x, 1, (0, 1)),
           lambda: torch.any(x > 1, dim=(0, 1)), lambda: torch.unsafe_split(x, 3, dim=1)[2],
           lambda: torch.logsumexp(x, dim=1), lambda: F.adaptive_max_pool2d(p, (3, 4))]
    eager = [f() for f in ops]
    x, u, v, p = x.to(LAZY), u.to(LAZY), v.to(LAZY), p.to(LAZY)
    for step in range(2):
        metrics.reset()
        outs = [f() for f in ops]
        torch._lazy.mark_step()
        for out, want in zip(outs, eager):
            torch.testing.assert_close(out.cpu(), want)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()
    assert {"aten::addr", "aten::rot90", "aten::logsumexp"} <= set(lazy_kernels.composite_ops())


def test_pixel_shuffle_traces_with_eager_values(lazy_level):
    """LTC's own pixel_shuffle kernel (functionalize_aten_op) reached the op's
    Meta kernel, which only allocates: uninitialised values, silently."""
    assert {"aten::pixel_shuffle", "aten::pixel_unshuffle"} <= set(lazy_kernels.replaced_ops())
    x, z = torch.randn(2, 18, 3, 5), torch.randn(2, 2, 6, 9)
    xl, zl = _lazy_leaf(x), _lazy_leaf(z)
    xe, ze = x.clone().requires_grad_(True), z.clone().requires_grad_(True)
    outs = [(F.pixel_shuffle(a, 3), F.pixel_unshuffle(b, 3)) for a, b in ((xl, zl), (xe, ze))]
    for shuffled, unshuffled in outs:
        (shuffled.sin().sum() + unshuffled.cos().sum()).backward()
    torch._lazy.mark_step()
    for got, want in zip(outs[0], outs[1]):
        assert torch.equal(got.cpu(), want)  # data movement: exact
    for got, want in zip((xl.grad, zl.grad), (xe.grad, ze.grad)):
        torch.testing.assert_close(got.cpu(), want)  # generated sin/cos
    assert metrics.snapshot()["fallback_count"] == 0


def _bn_training_step(dev, x, read_loss):
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(3, 2, 3).double().to(dev), torch.nn.BatchNorm2d(2).double().to(dev)
    loss = bn(conv(x.to(dev))).square().mean()
    if read_loss:
        loss.item()  # executes the forward's graph before mark_step executes the step's
    loss.backward()
    return bn


def _bn_forward_under_no_grad(dev, x, read_loss):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3).double().to(dev)
    with torch.no_grad():
        bn(x.to(dev))  # output dropped: only the running statistics change
    return bn


def _bn_eval_forward(dev, x, read_loss):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3).double()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(1, 2)
    bn = bn.to(dev).eval()  # LTC's own kernel: nothing written
    bn.output = bn(x.to(dev))
    return bn


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
@pytest.mark.parametrize("case", ["step", "step, loss read first", "no_grad forward", "eval forward"])
def test_batchnorm_running_stats_are_updated_once_per_forward(lazy_level, case):
    """LTC's training native_batch_norm updated the running statistics only
    as a side effect of its kernel writing into its inputs: lost when nothing
    read the node, applied twice when a loss read ran it before mark_step,
    and read stale (zeros) once after a step with auto_prepare. Eval mode
    runs LTC's kernel, kept under ours."""
    assert "aten::native_batch_norm" in lazy_kernels.replaced_ops()
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    run = {"no_grad forward": _bn_forward_under_no_grad, "eval forward": _bn_eval_forward}.get(case, _bn_training_step)
    eager, lazy = run("cpu", x, "read" in case), run(LAZY, x, "read" in case)
    torch._lazy.mark_step()
    if case == "eval forward":
        torch.testing.assert_close(lazy.output.cpu(), eager.output, rtol=1e-12, atol=1e-12)
    for name in ("running_mean", "running_var", "num_batches_tracked"):  # each read once, directly
        torch.testing.assert_close(getattr(lazy, name).cpu(), getattr(eager, name), rtol=1e-12, atol=1e-12, msg=name)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0, metrics.report()
    if lazy_level == "O1":  # the functional batch norm node compiles: no group ran in TorchScript
        assert not s["groups_fallen_back"] and s["compiled_group_calls"] == s["group_calls"] > 0, metrics.report()


def test_index_select_of_a_0d_input(lazy_level):
    """LTC's shape function refused a 0-d input ("Empty output_sizes")."""
    x = torch.tensor(1.75)
    outs = [torch.index_select(x.to(LAZY), 0, i.to(LAZY)) for i in (torch.tensor([0]), torch.tensor(0))]
    outs.append(torch.index_select(torch.randn(3, 7).to(LAZY), 1, torch.tensor([6, 1]).to(LAZY)).shape)
    torch._lazy.mark_step()
    for out in outs[:2]:
        assert out.shape == () and out.cpu().item() == 1.75
    assert outs[2] == (3, 2)
    assert metrics.snapshot()["fallback_count"] == 0


def test_max_pool3d_is_traced_with_its_backward(lazy_level):
    """LTC's max_pool3d autograd kernel and max_pool3d_with_indices(_backward)
    kernels called the eager fallback."""
    x = torch.randn(1, 3, 5, 7, 6)
    xl, xe = _lazy_leaf(x), x.clone().requires_grad_(True)
    outs = []
    for t in (xl, xe):
        pooled = F.max_pool3d(t, 3, 2, ceil_mode=True)
        values, indices = F.max_pool3d(t, 2, 1, dilation=(1, 2, 1), return_indices=True)
        (pooled.sum() + 2 * values.sum()).backward()
        outs.append((pooled, values, indices, t.grad))
    torch._lazy.mark_step()
    for got, want in zip(*outs):
        assert torch.equal(got.cpu(), want)
    assert metrics.snapshot()["fallback_count"] == 0


def test_mutable_ops_trace_their_functional_variant(lazy_level):
    """_native_batch_norm_legit / _batch_norm_with_update update running stats
    in place: traced as their *_functional variant plus copies into the stats;
    eye.m_out (eye, matrix_power(0)) as eye.m on its out tensor's dtype."""
    assert {"aten::_native_batch_norm_legit", "aten::_batch_norm_with_update",
            "aten::eye.m_out"} <= set(lazy_kernels.mutable_ops())
    x, w, b = torch.randn(6, 3, 5, dtype=torch.float64), torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    stats = [torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5]
    calls = [lambda a, w, b, m, v: torch.ops.aten._native_batch_norm_legit(a, w, b, m, v, True, 0.3, 1e-5),
             lambda a, w, b, m, v: torch.ops.aten._native_batch_norm_legit(a, w, b, m, v, False, 0.3, 1e-5),
             lambda a, w, b, m, v: torch.ops.aten._batch_norm_with_update(a, w, b, m, v, 0.2, 1e-4)[:3]]
    for call in calls:
        metrics.reset()
        eager_stats = [s.clone() for s in stats]
        lazy_stats = [s.to(LAZY) for s in stats]
        want = call(x, w, b, *eager_stats)
        got = call(x.to(LAZY), w.to(LAZY), b.to(LAZY), *lazy_stats)
        torch._lazy.mark_step()
        for g, e in zip(list(got) + lazy_stats, list(want) + eager_stats):
            torch.testing.assert_close(g.cpu(), e, rtol=1e-12, atol=1e-12)  # reordered sums only
        assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]
    m = torch.randn(2, 4, 4)
    outs = [torch.eye(3, 5, device=LAZY), torch.eye(4, dtype=torch.int32, device=LAZY),
            torch.linalg.matrix_power(m.to(LAZY), 0)]
    torch._lazy.mark_step()
    for got, want in zip(outs, [torch.eye(3, 5), torch.eye(4, dtype=torch.int32), torch.linalg.matrix_power(m, 0)]):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]


def test_composite_calling_a_mutable_op_without_sibling_is_traced_as_a_node(lazy_level):
    """cummax's composite kernel calls _cummax_helper, which has no functional
    variant: cummax itself is traced as a node (it was an eager fallback)."""
    x = torch.randn(4, 9)
    x[1, 3] = x[1, 2]  # a tie: the later index wins, as in eager
    outs = [torch.cummax(x.to(LAZY), 1), torch.cummin(x.to(LAZY), 0)]
    torch._lazy.mark_step()
    for got, want in zip(outs, [torch.cummax(x, 1), torch.cummin(x, 0)]):
        assert torch.equal(got.values.cpu(), want.values) and torch.equal(got.indices.cpu(), want.indices)
    assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]
    assert {"aten::cummax", "aten::cummin"} <= set(lazy_kernels.composite_ops())


def test_ops_without_meta_kernel_trace_with_our_shape_functions(lazy_level):
    """_logcumsumexp and geqrf have no Meta kernel: their output shapes come
    from lazy_kernels' shape functions and they are traced as nodes (they
    were eager fallbacks)."""
    x, a = torch.randn(3, 5, 4), torch.randn(2, 5, 3)
    outs = [torch.logcumsumexp(x.to(LAZY), 1), torch.geqrf(a.to(LAZY)), torch.geqrf(a.mT.to(LAZY))]
    torch._lazy.mark_step()
    wants = [torch.logcumsumexp(x, 1), torch.geqrf(a), torch.geqrf(a.mT)]
    for got, want in zip(torch.utils._pytree.tree_leaves(outs), torch.utils._pytree.tree_leaves(wants)):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
    assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]


@pytest.mark.compiles_in_step("one step: its generated code is what is checked")
def test_moe_routing_counts_and_grouped_products_trace_in_the_step(lazy_level):
    """transformers' MoE experts (Mixtral, Qwen3-MoE) count tokens per
    expert with histc on integers off the CPU, and multiply each expert's
    rows with _grouped_mm: CPU has no integer histc (the graph failed when
    it ran), and _grouped_mm's composite kernel reads its offsets on the host
    while its Meta kernel admits bfloat16 only (a RuntimeError at trace).
    Now: counted in float64, and the product a node of aten's kernel in the
    glue (with its backward), all in the step's one graph."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 3, (10,), generator=g, dtype=torch.int32)
    a, w = torch.randn(10, 8, generator=g), torch.randn(3, 8, 4, generator=g)

    def step(device):
        a_, w_ = a.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()
        counts = torch.histc(ids.to(device) if device == LAZY else ids.float(), bins=3, min=0, max=2)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        out = torch._grouped_mm(a_, w_, offs=offs)
        (out * out).sum().backward()
        if device == LAZY:
            metrics.reset()
            torch._lazy.mark_step()
        return counts.cpu(), out.cpu(), a_.grad.cpu(), w_.grad.cpu()

    eager, lazy = step(CPU), step(LAZY)
    assert lazy[0].dtype == torch.int32 and torch.equal(lazy[0], eager[0].int())
    for got, want in zip(lazy[1:], eager[1:]):
        torch.testing.assert_close(got, want)
    s = metrics.snapshot()
    assert s["graph_executions"] == 1 and s["fallback_count"] == 0, metrics.report()
    assert s["groups_fallen_back"] == {} and s["compiled_group_calls"] > 0, metrics.report()
    assert "aten::_grouped_mm" in lazy_kernels.composite_ops()


def test_custom_ops_with_views_run_functionalized(lazy_level):
    """A torch.library.custom_op's Python body runs below functionalization on
    the lazy device: torch's chunked linear_cross_entropy op (views of its
    inputs) was refused; its body is now traced under functionalization."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    x, w, target = torch.randn(6, 4), torch.randn(5, 4), torch.randint(0, 5, (6,))
    options = LinearCrossEntropyOptions(batch_chunk_size=2)
    outs = [F.linear_cross_entropy(x.to(LAZY), w.to(LAZY), target.to(LAZY), reduction=r, options=options)
            for r in ("mean", "none")]
    torch._lazy.mark_step()
    for got, r in zip(outs, ("mean", "none")):
        torch.testing.assert_close(got.cpu(), F.linear_cross_entropy(x, w, target, reduction=r, options=options))
    assert metrics.snapshot()["fallback_count"] == 0, metrics.snapshot()["fallbacks"]
    assert {"torch_nn::_linear_cross_entropy_batch_chunked",
            "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction"} <= set(lazy_kernels.composite_ops())


def test_builtin_output_shapes_are_computed_once_per_signature(lazy_level, monkeypatch):
    """A builtin node's output shapes come from its (often Python) meta kernel
    once per op and argument signature: later steps reuse them. Another
    size, dtype or scalar (-0.0 against 0.0 included) is another signature."""
    calls, shapes_of = [], shape_functions.shapes_of

    def counted(qualified, op):
        def shapes(self):
            calls.append((tuple(self.shape), self.dtype))
            return shapes_of(qualified, op)(self)
        return shapes if qualified == "aten::geqrf" else shapes_of(qualified, op)

    monkeypatch.setattr(shape_functions, "shapes_of", counted)
    monkeypatch.setattr(lazy_kernels, "_OUTPUT_SHAPES", {})
    inputs = [torch.randn(2, 6, 3), torch.randn(2, 6, 3), torch.randn(3, 7, 2),
              torch.randn(2, 6, 3, dtype=torch.float64)]
    for a in inputs:
        q, tau = torch.geqrf(a.to(LAZY))
        torch._lazy.mark_step()
        want_q, want_tau = torch.geqrf(a)
        assert (q.shape, tau.shape, q.dtype) == (want_q.shape, want_tau.shape, want_q.dtype)
        torch.testing.assert_close((q.cpu(), tau.cpu()), (want_q, want_tau))
    assert calls == [((2, 6, 3), torch.float32), ((3, 7, 2), torch.float32), ((2, 6, 3), torch.float64)]
    assert metrics.snapshot()["fallback_count"] == 0  # traced as nodes, not run eagerly
    signatures = {lazy_kernels._signature((torch.ones(2), s)) for s in (0.0, -0.0, float("nan"), 0)}
    assert len(signatures) == 4, signatures


def test_zeros_are_an_expanded_scalar(lazy_level):
    """torch.zeros, new_zeros and zero_ (functionalized: zero) build zeros in
    the graph (fill_kernels.h); LTC's zero read the host-made empty tensor,
    one more graph input per call."""
    g = torch.randn(2, 3).to(LAZY)
    torch._lazy.mark_step()
    x = torch.randn(4, 5).to(LAZY) * 2  # a pending value: zero_ ignores it
    made = {"zeros": torch.zeros(4, 5, device=LAZY, dtype=torch.float64), "new_zeros": g.new_zeros(4, 5),
            "zero_": x.zero_(), "int zeros": torch.zeros(4, 5, device=LAZY, dtype=torch.int32)}
    for name, t in made.items():
        text = torch._C._lazy._get_tensors_text([t])
        assert "is_scalar_expand=1" in text and "aten::zero(" not in text, (name, text)
        assert "[4,5]] lazy_tensors::device_data" not in text, (name, text)
    for name, t in made.items():
        assert t.device.type == "lazy" and t.shape == (4, 5), name
        assert t.cpu().eq(0).all() and t.cpu().dtype == {"zeros": torch.float64, "int zeros": torch.int32}.get(
            name, torch.float32), name


def test_slice_and_select_gradients_scatter_into_an_expanded_zero(lazy_level):
    """The backward of slicing and indexing (slice_backward,
    select_backward: a causal LM's label shift, x[:, 0]) is the gradient
    scattered into zeros built in the graph (fill_kernels.h). LTC's own
    kernels ran torch._decomp's Python decomposition, whose new_zeros made
    an input-sized device data from a fresh host allocation every step."""
    x = torch.randn(3, 5, dtype=torch.float64)
    xl, xe = _lazy_leaf(x), x.clone().requires_grad_(True)
    for t in (xl, xe):
        ((t[:, 1:4] * 2).sum() + (t[:, 0] * 3).sum() + (t[:, ::2] ** 2).sum()).backward()
    text = torch._C._lazy._get_tensors_text([xl.grad])
    assert text.count("aten::slice_scatter") == 2 and text.count("aten::select_scatter") == 1, text
    # the zeros are expanded scalars: the one [3, 5] device data is x (read by
    # pow's backward), no host tensor was made for them and zeroed
    assert text.count("is_scalar_expand=1") == 3 and "aten::zero(" not in text, text
    assert text.count("[Double[3,5]] lazy_tensors::device_data") == 1, text
    torch.testing.assert_close(xl.grad.cpu(), xe.grad, rtol=0, atol=0)
    assert metrics.snapshot()["fallback_count"] == 0


def test_fill_likes_are_one_expanded_scalar(lazy_level):
    """ones_like, zeros_like and full_like (autograd's seed of every
    backward) build the filled value directly (fill_kernels.h), not an
    empty tensor then fill_/zero_; other devices and dtypes as eager."""
    import torch._lazy.metrics as ltc_metrics

    x = torch.randn(3, 4)
    lazy_x = x.to(LAZY)
    ltc_metrics.reset()
    cases = [(torch.ones_like, {}), (torch.zeros_like, {"dtype": torch.float64}),
             (lambda t, **kw: torch.full_like(t, 2.5, **kw), {"dtype": torch.int32})]
    results = [(fill(lazy_x, **kw), fill(x, **kw)) for fill, kw in cases]
    traced = {n for n in ltc_metrics.counter_names() if n.startswith("lazy::")}
    assert not traced, traced  # no fill_, zero or copy traced
    for got, expected in results:
        assert got.device.type == "lazy" and got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    on_cpu = torch.ones_like(lazy_x, device="cpu")  # another device: aten's composite
    assert on_cpu.device.type == "cpu" and on_cpu.sum().item() == 12


def test_a_builtin_call_signature_seen_once_is_traced_in_cpp(lazy_level, monkeypatch):
    """kernel_fronts.h: once the Python kernel has traced where.self for a
    call signature, the op's C++ front builds that signature's nodes itself
    (no Python), the same nodes: the graph hashes as the first step's. A new
    size goes through Python once."""
    python_calls = []
    original = lazy_kernels.trace_builtin

    def counted(op, args, kwargs):
        python_calls.append(str(op))
        return original(op, args, kwargs)

    monkeypatch.setattr(lazy_kernels, "trace_builtin", counted)
    hashes = []
    for shape in [(3, 7, 11), (3, 7, 11), (3, 7, 11), (5, 13)]:  # sizes no other test uses
        c, a, b = torch.rand(shape) > 0.5, torch.randn(shape), torch.randn(shape)
        out = torch.where(c.to(LAZY), a.to(LAZY), b.to(LAZY)) * 2
        hashes.append(torch._C._lazy._get_graph_hash([out]))
        torch.testing.assert_close(out.cpu(), torch.where(c, a, b) * 2)
        torch._lazy.mark_step()
    assert python_calls == ["aten.where.self", "aten.where.self"]  # the first of each size
    assert hashes[0] == hashes[1] == hashes[2] != hashes[3]
    assert metrics.snapshot()["fallback_count"] == 0


@pytest.mark.parametrize("lazy_level", ["O1"], indirect=True)
def test_mobile_activations_are_nodes_traced_in_cpp(lazy_level, monkeypatch):
    """hardswish, hardsigmoid and hardtanh (ReLU6) and their backwards, which
    the TS backend lacks, are builtin nodes, not their decompositions: after
    a call signature's first step no Python runs for them. Values and
    gradients as eager's, from generated code."""
    assert {"aten::hardswish", "aten::hardswish_backward", "aten::hardsigmoid_backward",
            "aten::hardtanh_backward"} <= set(lazy_kernels.builtin_ops())
    python_calls = []
    for name in ("trace_builtin", "_functionalized"):
        original = getattr(lazy_kernels, name)
        monkeypatch.setattr(lazy_kernels, name, lambda *a, _o=original, _n=name: python_calls.append(_n) or _o(*a))
    x = torch.randn(7, 19) * 4  # across the kinks at -3, 0, 3 and 6 (a size no other test traces)

    def grads(device):
        t = x.to(device, copy=True).requires_grad_()
        out = F.hardswish(t) + F.hardsigmoid(t) * 2 + F.relu6(t) * 3
        out.sum().backward()
        return out.detach(), t.grad

    expected = grads(CPU)
    for step in range(3):
        got = grads(LAZY)
        torch._lazy.mark_step()
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.cpu(), e)
        if step == 0:
            first = len(python_calls)
            assert 0 < first and "_functionalized" not in python_calls
    assert len(python_calls) == first  # later steps: C++ fronts only
    s = metrics.snapshot()
    assert s["fallback_count"] == 0
    assert s["compiled_group_calls"] >= 3 and s["groups_fallen_back"] == {}


def test_a_composite_kernel_that_traced_once_is_called_from_cpp(lazy_level, monkeypatch):
    """kernel_fronts.h: the Python composite kernel runs until the op's
    composite kernel has traced on the lazy device once; then the C++ front
    calls that kernel itself. A user's error there still surfaces as eager's."""
    from lazy_mlir.native import _C

    for name in ("aten::mul.Scalar", "aten::empty_like"):
        _C.set_composite_direct(name, False)  # as before any call
    redispatched = []
    original = torch._ops.OpOverload.redispatch

    def counted(self, keyset, *args, **kwargs):
        redispatched.append(str(self))
        return original(self, keyset, *args, **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counted)
    x = torch.randn(4, 6)
    for _ in range(3):
        torch.testing.assert_close(torch.ops.aten.mul.Scalar(x.to(LAZY), 2.5).cpu(), x * 2.5)
        empty = torch.empty_like(x.to(LAZY), dtype=torch.float64)
        assert (empty.shape, empty.dtype, empty.device.type) == (x.shape, torch.float64, "lazy")
    assert redispatched == ["aten.mul.Scalar", "aten.empty_like.default"]  # the first calls only
    for t in (x, x.to(LAZY)):
        with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last format"):
            torch.empty_like(t, memory_format=torch.channels_last)
    torch.testing.assert_close(torch.ops.aten.mul.Scalar(x.to(LAZY), -1.0).cpu(), -x)  # still direct
    assert redispatched == ["aten.mul.Scalar", "aten.empty_like.default", "aten.empty_like.default"]
    assert metrics.snapshot()["fallback_count"] == 0


def test_host_index_tensors_are_traced_with_their_gradient(lazy_level):
    """A lazy table indexed with a host tensor (BEiT's relative position
    bias: its index is made on the host and cached): aten moves the index
    to the table's device, so the kernel does too, and the index and its
    gradient (index_put) are traced instead of run on the host, mid-step."""
    g = torch.Generator().manual_seed(0)
    table, index = torch.randn(52, 2, generator=g, dtype=torch.float64), torch.randint(0, 52, (17, 17), generator=g)

    def grad(device):
        t = table.clone().to(device).requires_grad_()
        (t[index.view(-1)] * torch.arange(578, dtype=torch.float64).view(289, 2).to(device)).square().sum().backward()
        if device == LAZY:
            torch._lazy.mark_step()
        return t.grad.cpu()

    metrics.reset()
    torch.testing.assert_close(grad(LAZY), grad(CPU), rtol=1e-12, atol=1e-12)
    s = metrics.snapshot()
    assert s["fallbacks"] == {} and s["graph_executions"] == 1, metrics.report()


def test_an_index_gradient_is_a_kernel_of_inductors_own(tmp_path):
    """An indexing's backward is aten._index_put_impl (accumulate), which
    Inductor has no lowering for: it called aten's kernel (under the C++
    wrapper through its proxy executor: Swin's relative position bias,
    12 calls a step). Converted to index_put, it is Inductor's own scatter
    kernel (its adds perhaps in another order: equal to rounding)."""
    lazy_mlir.init("O1", dump_dir=str(tmp_path))
    try:
        g = torch.Generator().manual_seed(1)
        table, index = torch.randn(23, 3, generator=g, dtype=torch.float64), torch.randint(0, 23, (41,), generator=g)

        def grad(device):
            t = table.clone().to(device).requires_grad_()
            (t[index.to(device)] * 3.0).sin().sum().backward()
            if device == LAZY:
                torch._lazy.mark_step()
            return t.grad.cpu()

        metrics.reset()
        torch.testing.assert_close(grad(LAZY), grad(CPU), rtol=1e-12, atol=1e-12)
        assert_compiled(calls=1)
        exported = "".join(p.read_text() for p in tmp_path.glob("*.4.export.fx.txt"))
        generated = "".join(p.read_text() for p in tmp_path.glob("*.5.generated.py"))
        assert "aten.index_put.default" in exported and "_index_put_impl" not in exported, exported
        # a kernel of Inductor's own does the scatter (atomic adds when it has threads)
        assert re.search(r"cpp_fused\w*_index_put", generated) and "_index_put_impl" not in generated, generated
    finally:
        lazy_mlir.init("O1")


def test_an_in_place_op_run_on_the_host_writes_its_lazy_target(lazy_level, monkeypatch):
    """An index gradient's index_put_ whose functional sibling runs on the
    host (made to here; BEiT's host index did it) and reads values that
    depend on a dropout: the fallback syncs every live tensor first
    (value_reads.h), its target too, which then held device data without
    IR, and LTC's copy_ refused to write the result into it ("Expected
    dst_tensor_data to be true"). Written as a lazy value, it is eager's."""
    traced = lazy_kernels.trace_builtin

    def no_index_put(op, args, kwargs):
        if op._schema.name == "aten::_index_put_impl":
            raise RuntimeError("run on the host")
        return traced(op, args, kwargs)

    monkeypatch.setattr(lazy_kernels, "trace_builtin", no_index_put)
    table, index = torch.randn(8, 3, dtype=torch.float64), torch.tensor([1, 5, 1, 7])

    def grad(device):
        t = table.clone().to(device).requires_grad_()
        torch.manual_seed(3)
        F.dropout(t[index.to(device)], 0.5).square().sum().backward()
        if device == LAZY:
            torch._lazy.mark_step()
        return t.grad.cpu()

    metrics.reset()
    torch.testing.assert_close(grad(LAZY), grad(CPU), rtol=1e-12, atol=1e-12)
    assert metrics.snapshot()["fallbacks"] == {"aten::_index_put_impl": 1}, metrics.report()


def test_uncovered_ops_before_init_is_an_error():
    """Before init() installs lazy_mlir's kernels the list would be the stock
    backend's: an error that says so, in a process that has not called init."""
    import subprocess
    code = ("from lazy_mlir.trace import lazy_kernels\n"
            "try:\n    lazy_kernels.uncovered_ops()\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "call lazy_mlir.init() first" in out.stdout, out.stdout + out.stderr


def margin_losses(device):
    """multilabel_margin_loss on rows with a -1 (labels after it ignored),
    each reduction and a 1-D input, and its gradient."""
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3).to(device).requires_grad_()
    target = torch.tensor([[0, 2, -1], [1, -1, 0], [2, 0, 1], [-1, 0, 2]]).to(device)
    losses = [F.multilabel_margin_loss(x * 2, target, reduction=r) for r in ("none", "mean", "sum")]
    losses.append(F.multilabel_margin_loss(x[1], target[1], reduction="none"))
    (grad,) = torch.autograd.grad(losses[1] + losses[3], x)
    if device.type == "lazy":
        torch._lazy.mark_step()
    return [t.detach().cpu() for t in (*losses, grad)]


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_multilabel_margin_loss_is_aten_s_not_torch_decomposition_s(lazy_level):
    """torch 2.13's decomposition of multilabel_margin_loss_forward counts the
    target slots after a row's first -1 as class 0 (torch.compile gives the
    wrong loss too): traced through it, the loss was 2.7x eager's at O0 and
    O1 alike. lazy_kernels decomposes it itself."""
    _assert_one_step_as_eager(margin_losses, rtol=1e-12, atol=1e-14)


def _assert_one_step_as_eager(step, **tolerance):
    """``step`` on the lazy device gives eager's values, in one graph
    execution with no eager fallback."""
    eager = step(CPU)
    metrics.reset()
    lazy = step(LAZY)
    for got, want in zip(lazy, eager):
        torch.testing.assert_close(got, want, **tolerance)
    s = metrics.snapshot()
    assert s["fallback_count"] == 0 and s["graph_executions"] == 1, metrics.report()


def gradients_without_meta_kernels(device):
    """Ops with no Meta kernel, reached by training: Gamma's, Beta's and
    Dirichlet's rsample backward, the margin losses' backward, histograms."""
    from torch.distributions.dirichlet import _Dirichlet
    torch.manual_seed(0)
    rate = torch.linspace(0.5, 3, 6, dtype=torch.float64).to(device).requires_grad_()
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3).to(device).requires_grad_()
    concentration = torch.linspace(0.5, 2, 6, dtype=torch.float64).reshape(2, 3).to(device).requires_grad_()
    labels = torch.tensor([0, 2, 1, 1]).to(device)
    gamma = torch._standard_gamma(rate)  # rsample's draw, without the distribution's argument checks
    loss = (gamma.sum() + F.multi_margin_loss(x, labels)
            + F.multilabel_margin_loss(x, torch.tensor([[0, -1, 2]] * 4).to(device))
            + _Dirichlet.apply(concentration).pow(2).sum())  # Dirichlet.rsample, without its checks
    grads = torch.autograd.grad(loss, [rate, x, concentration])
    hist = torch.histogramdd(x.detach()[:, :2], bins=[3, 4], range=[-1.0, 1.0, -1.0, 1.0])
    histogram = torch.histogram(x.detach().flatten(), bins=5, range=(-1.0, 1.0))
    if device.type == "lazy":
        torch._lazy.mark_step()
    return [t.cpu() for t in (loss.detach(), *grads, hist.hist, histogram.hist, histogram.bin_edges)]


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_ops_without_meta_kernels_are_traced_with_shape_functions(lazy_level):
    """Their nodes' sizes come from shape_functions (aten's kernel run on
    zeros); without them, each call took the eager path (4 fallbacks here)
    and uncovered_ops() did not list them."""
    _assert_one_step_as_eager(gradients_without_meta_kernels, rtol=1e-10, atol=1e-12)
    if lazy_level == "O1":
        assert_compiled()  # their groups ran generated code, not TorchScript
    assert "aten::multi_margin_loss_backward" not in lazy_kernels.uncovered_ops()


def _f64(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def more_ops_without_meta_kernels(device):
    """Fractional 3-D max pooling's backward (training), the slow and dilated
    convolutions aten's convolution picks on some inputs, masked softmax,
    SyncBatchNorm's CPU statistics, forward-mode GLU's backward...: none has
    a Meta kernel. Each ran eagerly, one fallback and execution per call."""
    aten = torch.ops.aten
    torch.manual_seed(0)  # fractional pooling draws its windows (traced in eager's order)
    x = _f64(1, 2, 6, 6, 6).to(device).requires_grad_()
    pooled = F.fractional_max_pool3d(x, 2, output_size=(3, 4, 3))
    (grad_x,) = torch.autograd.grad(pooled.pow(2).sum(), [x])
    image, weight, bias = _f64(2, 3, 7, 6, seed=1).to(device), _f64(4, 3, 3, 2, seed=2).to(device), _f64(4).to(device)
    volume, weight3 = _f64(1, 2, 5, 6, 4, seed=3).to(device), _f64(3, 2, 2, 3, 2, seed=4).to(device)
    scores = _f64(2, 3, 4, seed=5).to(device)
    mask = torch.tensor([[[False, True, False, True]] * 3] * 2).to(device)
    outs = [
        grad_x,
        aten._slow_conv2d_forward(image, weight, [3, 2], bias, [2, 1], [1, 0]),
        *aten._slow_conv2d_backward.output_mask(_f64(2, 4, 4, 5, seed=6).to(device), image, weight, [3, 2], [2, 1],
                                                [1, 0], [True, True, True]),
        aten.slow_conv_dilated2d(image, weight, [3, 2], bias, [1, 2], [1, 1], [2, 1]),
        aten.slow_conv3d_forward(volume, weight3, [2, 3, 2], None, [1, 2, 1], [1, 0, 1]),
        aten.slow_conv_dilated3d(volume, weight3, [2, 3, 2], None, [1, 1, 2], [0, 1, 1], [2, 1, 2]),
        aten.slow_conv_transpose3d(volume, _f64(2, 3, 2, 2, 3, seed=7).to(device), [2, 2, 3], None, [2, 1, 1],
                                   [0, 1, 1], [1, 0, 0], [1, 1, 1]),
        aten._masked_softmax(scores, mask, 2, 2),
        aten._masked_softmax_backward(scores, scores.softmax(-1), mask, 2),
        *aten.batch_norm_update_stats(image, _f64(3).to(device), _f64(3).abs().to(device), 0.1),
        *aten._aminmax.dim(scores, 1, True),
        aten._compute_linear_combination(scores, _f64(5, 2, seed=8).to(device)),
        aten._add_relu.Scalar(scores, 0.5, 2),
        aten.glu_backward_jvp(_f64(4, 6).to(device), _f64(4, 3).to(device), _f64(4, 6, seed=9).to(device),
                              _f64(4, 3, seed=10).to(device), _f64(4, 6, seed=11).to(device), 1),
        *aten._transform_bias_rescale_qkv(_f64(2, 5, 12).to(device), _f64(12).to(device), 2),
    ]
    if device.type == "lazy":
        torch._lazy.mark_step()
    return [t.detach().cpu() for t in outs]


@pytest.mark.parametrize("lazy_level", ["O0", "O1"], indirect=True)
def test_more_ops_without_meta_kernels_trace_in_the_step(lazy_level):
    _assert_one_step_as_eager(more_ops_without_meta_kernels, rtol=1e-12, atol=1e-12)
    if lazy_level == "O1":
        assert_compiled()
