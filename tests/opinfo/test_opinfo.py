"""OpInfo samples on the lazy device at O1 against eager CPU PyTorch.

The fast subset runs in ``make test``; the whole op_db (both dtypes) runs with
``.venv/bin/python -m pytest tests/opinfo -m opinfo_full`` (docs/testing.md).
"""
import pytest
import torch
from torch.utils._pytree import tree_flatten

import lazy_mlir
import lazy_opinfo

# A sample of what real models use: elementwise, reductions, tuple outputs,
# matmuls, convolution, normalisation, indexing, views.
FAST = ["add", "mul", "div.no_rounding_mode", "exp", "sigmoid", "nn.functional.gelu", "clamp", "where",
        "sum", "amax", "var_mean", "max.reduction_with_dim", "sort", "topk", "cumsum",
        "matmul", "addmm", "nn.functional.conv2d", "nn.functional.layer_norm", "softmax",
        "masked_fill", "flip", "cat", "transpose", "empty", "bernoulli"]
# These must run generated code (not only give the right numbers).
MUST_COMPILE = {"add", "mul", "exp", "sigmoid", "nn.functional.gelu", "sum", "amax", "var_mean",
                "max.reduction_with_dim", "addmm", "softmax", "cat"}


@pytest.fixture(scope="module", autouse=True)
def o1():
    lazy_mlir.init("O1")
    yield


def check(outcome, name):
    if outcome.status == "skipped":
        pytest.skip(outcome.detail)
    assert outcome.status != "failed", f"{name}: {outcome.detail}"
    assert outcome.status != "no_sample", f"{name}: {outcome.detail}"
    if name in MUST_COMPILE:
        assert outcome.status == "compiled", f"{name}: {outcome.status} {outcome.detail}"


@pytest.mark.parametrize("dtype", lazy_opinfo.DTYPES, ids=str)
@pytest.mark.parametrize("name", FAST)
def test_fast(name, dtype):
    check(lazy_opinfo.run_op(name, dtype), name)


def test_channels_last_input():
    check(lazy_opinfo.run_op("nn.functional.conv2d", torch.float32, channels_last=True), "nn.functional.conv2d")


def test_host_side_argument_stays_on_cpu():
    # tensor_split's tensor of indices: aten requires it on the CPU, as OpInfo leaves it.
    (sample, host), = lazy_opinfo.placed_samples(lazy_opinfo.OPS["tensor_split"], torch.float32)
    assert [id(a) for a in sample.args if isinstance(a, torch.Tensor)] == list(host)
    check(lazy_opinfo.run_sample(lazy_opinfo.OPS["tensor_split"], sample, torch.float32, host_side=host), "tensor_split")


def test_size_output_compares_as_size():
    check(lazy_opinfo.run_op("broadcast_shapes", torch.float32), "broadcast_shapes")
    flat, spec = tree_flatten((5, 5))  # a tuple is not the Size eager gives
    with pytest.raises(AssertionError, match="structure"):
        lazy_opinfo.compare(flat, spec, torch.Size([5, 5]), torch.float32)


def test_random_from_draws_what_eager_draws():
    sample = lazy_opinfo.samples(lazy_opinfo.OPS["add"], torch.float32)[0]
    outcome = lazy_opinfo.run_sample(lambda x, *_, **__: x.random_(3, 1000) * 2, sample, torch.float32, seed=5)
    assert outcome.status in ("compiled", "torchscript"), outcome.detail  # random stays in TorchScript


@pytest.mark.opinfo_full
@pytest.mark.parametrize("dtype", lazy_opinfo.DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(lazy_opinfo.OPS))
def test_full(name, dtype):
    outcome = lazy_opinfo.run_op(name, dtype)
    if outcome.status == "no_sample":
        pytest.skip(outcome.detail)
    check(outcome, name)
