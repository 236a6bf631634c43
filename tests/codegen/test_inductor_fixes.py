"""Inductor's CPU code for a scatter with atomic adds in a 2-D tiled kernel
(codegen/inductor_fixes.py): the smallest graph of the multi-query
attention miscompile. ``index_put(accumulate=True)``, as the backward of
``qkv[..., [-2], :]`` traces it, whose values read an input laid out
transposed: Inductor tiles the kernel in two dimensions to transpose that
input, and with more than one thread its atomic store offset the address
twice (wrong sums, writes past the buffer)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lazy_mlir.codegen import inductor, inductor_fixes
from lazy_mlir.lowering.group_lowering import fake_inputs_of


def _key_gradient(index, grad, other, base):
    """The gradient of one key head taken out of a fused projection by a
    list index, its values a transposed view of a sum."""
    values = torch.ops.aten.add.Tensor(grad, other).view(2, 1, 8, 8).transpose(1, 2)
    rows = torch.arange(2).view(2, 1, 1)
    cols = torch.arange(8).view(8, 1)
    return (torch.ops.aten.index_put.default(base, [rows, cols, index], values, True),)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the atomic path: one thread takes a plain store
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("head", [-2, 4])
def test_scatter_in_a_transposing_kernel_matches_eager(two_threads, tmp_path, monkeypatch, head):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # generated here, not served
    torch.manual_seed(0)
    transposed = torch.randn(2, 1, 8, 8, dtype=torch.float64).transpose(2, 3).contiguous().transpose(2, 3)
    inputs = [torch.tensor([head]), torch.randn(2, 1, 8, 8, dtype=torch.float64), transposed,
              torch.zeros(2, 8, 6, 8, dtype=torch.float64)]
    gm = make_fx(_key_gradient)(*inputs)
    fake_mode, fakes = fake_inputs_of(inputs)
    run, code, _ = inductor.compile_graph(gm, fakes, fake_mode, "tile2d_scatter_test")
    # the kernel this is about: a transposed tile and a vectorized atomic add
    assert "transpose_mxn" in code and "atomic_add_vec" in code, code
    torch.testing.assert_close(run(list(inputs))[0], _key_gradient(*inputs)[0], rtol=0, atol=0)


def test_the_fix_is_installed_while_inductor_needs_it():
    installed = inductor_fixes.install()
    assert installed == (["tile2d-atomic-add"] if inductor_fixes._tile2d_atomic_add_offset_twice() else [])
    if installed:  # installed over Inductor's own method, which stays reachable
        from torch._inductor.codegen import cpp
        assert hasattr(cpp.CppTile2DKernel.store, "__wrapped__")


def _weight_decay(mat1, mat2, weight):
    """SGD's weight decay on a gradient fresh from its product, as a
    captured backward hands it to the optimizer."""
    return (torch.ops.aten.add.Tensor(torch.ops.aten.mm.default(mat1, mat2), weight, alpha=1e-3),)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_product_plus_a_scaled_tensor_keeps_the_scale(tmp_path, monkeypatch, dtype):
    """Inductor's add+mm -> addmm fusion drops the add's alpha (0.25 off in
    float64 here); inductor_fixes.rewrite spells the scale out."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    inputs = [torch.randn(10, 6, dtype=dtype), torch.randn(6, 16, dtype=dtype), torch.randn(10, 16, dtype=dtype)]
    gm = make_fx(_weight_decay)(*inputs)
    fake_mode, fakes = fake_inputs_of(inputs)
    run, _, _ = inductor.compile_graph(gm, fakes, fake_mode, "scaled_addmm_test")
    tolerance = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run(list(inputs))[0], _weight_decay(*inputs)[0], **tolerance)
    assert inductor_fixes._addmm_pattern_drops_alpha() == (inductor_fixes.rewrite(make_fx(_weight_decay)(*inputs)) == 1)
