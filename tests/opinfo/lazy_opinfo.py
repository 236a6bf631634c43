"""Runs PyTorch's OpInfo samples on the lazy device at O1 and checks them
against eager CPU PyTorch; says how each op ran (compiled, left in
TorchScript, ...). Shared by the tests here and ``sweep.py``."""
from __future__ import annotations

import dataclasses
import warnings

import torch
import torch._lazy
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten

from lazy_mlir.observe import metrics

LAZY = torch.device("lazy")
DTYPES = (torch.float32, torch.float64)
TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-7, atol=1e-7)}

# Ops whose results legitimately differ from eager: skipped, with the reason.
_RANDOM = ("bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
           "normal.in_place", "normal.number_mean", "uniform", "rand_like", "randn", "randn_like",
           "randint", "randint_like", "nn.functional.dropout", "nn.functional.dropout2d",
           "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout.with_train",
           "nn.functional.rrelu", "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d")
_UNINITIALISED = ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided")
SKIPS = {**{n: "random draws: another order or generator than eager" for n in _RANDOM},
         **{n: "uninitialised output (empty): nothing to compare" for n in _UNINITIALISED}}


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


OPS = {full_name(op): op for op in op_db}


@dataclasses.dataclass
class Outcome:
    status: str  # "compiled" | "torchscript" | "fell_back" | "eager_fallback" | "failed" | "skipped" | "no_sample"
    detail: str = ""


def _placement_samples(op, dtype):
    """The op's samples made for a non-CPU device (``meta``): where they leave a
    tensor on the CPU, the op wants it there (aten reads it on the host, e.g.
    ``tensor_split``'s ``tensor_indices_or_sections``). Stops at the first sample
    the generator cannot make on ``meta`` (it calls ``.item()``, ...)."""
    try:
        yield from op.sample_inputs("meta", dtype, requires_grad=False)
    except Exception:  # noqa: BLE001 - then every tensor goes to the lazy device
        return


def _host_side(sample, placed) -> frozenset:
    """ids of ``sample``'s tensors that ``placed`` (the same sample made for
    ``meta``) keeps on the CPU; empty where the two do not line up."""
    if placed is None:
        return frozenset()
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    placed_leaves, placed_spec = tree_flatten((placed.input, placed.args, placed.kwargs))
    if spec != placed_spec:
        return frozenset()
    return frozenset(id(v) for v, p in zip(leaves, placed_leaves)
                     if isinstance(v, torch.Tensor) and isinstance(p, torch.Tensor) and p.device.type == "cpu"
                     and v.shape == p.shape and v.dtype == p.dtype)


def placed_samples(op, dtype, max_samples=1, channels_last=False):
    """The op's first samples for ``dtype`` (CPU tensors), optionally channels_last,
    each with the ids of its tensors that stay on the CPU in the lazy run (where
    OpInfo leaves them for a non-CPU device)."""
    found = []
    placements = _placement_samples(op, dtype)
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        host = _host_side(sample, next(placements, None))
        if channels_last:
            if not (isinstance(sample.input, torch.Tensor) and sample.input.dim() == 4):
                continue
            sample = sample.transform(lambda t: t.contiguous(memory_format=torch.channels_last)
                                      if isinstance(t, torch.Tensor) and t.dim() == 4 and id(t) not in host else t)
        found.append((sample, host))
        if len(found) == max_samples:
            break
    return found


def samples(op, dtype, max_samples=1, channels_last=False):
    """The op's first samples for ``dtype`` (CPU tensors), optionally channels_last."""
    return [sample for sample, _ in placed_samples(op, dtype, max_samples, channels_last)]


def compare(lazy_flat, lazy_spec, eager_out, dtype) -> None:
    """Every output (tuples included) equal to eager, NaN positions too, in
    containers of the same types (a ``torch.Size`` is not a tuple). The lazy
    outputs come flattened (``tree_flatten``: unflattening makes a Size a tuple)."""
    eager_flat, eager_spec = tree_flatten(eager_out)
    assert lazy_spec == eager_spec, f"output structure {lazy_spec} != eager {eager_spec}"
    for i, (got, want) in enumerate(zip(lazy_flat, eager_flat)):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), f"output {i}: {type(got).__name__}, eager gives a tensor"
            torch.testing.assert_close(got.cpu(), want, equal_nan=True, **TOLERANCE[dtype], msg=lambda m: f"output {i}: {m}")
        else:
            assert got == want, f"output {i}: {got!r} != eager {want!r}"


def run_sample(fn, sample, dtype, seed=0, host_side=frozenset()) -> Outcome:
    """Runs ``fn`` on ``sample`` lazily (one mark_step) and eagerly; compares and
    classifies. Every tensor goes to the lazy device but those in ``host_side``."""
    metrics.reset()
    try:
        lazy_sample = sample.transform(lambda v: v.to(LAZY) if isinstance(v, torch.Tensor) and id(v) not in host_side else v)
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a group falling back warns; the metrics say it
            lazy_out = fn(lazy_sample.input, *lazy_sample.args, **lazy_sample.kwargs)
            torch._lazy.mark_step()
            lazy_flat, lazy_spec = tree_flatten(lazy_out)
            lazy_flat = [v.cpu() if isinstance(v, torch.Tensor) else v for v in lazy_flat]
    except Exception as exc:  # noqa: BLE001 - reported per op
        return Outcome("failed", f"lazy run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    torch.manual_seed(seed)
    eager_out = fn(sample.input, *sample.args, **sample.kwargs)
    try:
        compare(lazy_flat, lazy_spec, eager_out, dtype)
    except AssertionError as exc:
        return Outcome("failed", f"mismatch: {' '.join(str(exc).split())[:200]}")
    return classify(metrics.snapshot())


def classify(s: dict) -> Outcome:
    if s["fallbacks"]:
        return Outcome("eager_fallback", ", ".join(sorted(s["fallbacks"])))
    if s["groups_fallen_back"]:
        return Outcome("fell_back", next(iter(s["groups_fallen_back"].values()))[:200])
    if s["compiled_group_calls"]:
        return Outcome("compiled")
    return Outcome("torchscript")


def run_op(name: str, dtype, max_samples=1, channels_last=False) -> Outcome:
    """The op's outcome over its first samples: the first that is not 'compiled' wins."""
    if name in SKIPS:
        return Outcome("skipped", SKIPS[name])
    op = OPS[name]
    if dtype not in op.supported_dtypes("cpu"):
        return Outcome("no_sample", f"{dtype} not supported on CPU")
    found = placed_samples(op, dtype, max_samples, channels_last)
    if not found:
        return Outcome("no_sample", "no sample input")
    outcomes = [run_sample(op, sample, dtype, host_side=host) for sample, host in found]
    return next((o for o in outcomes if o.status != "compiled"), outcomes[0])
