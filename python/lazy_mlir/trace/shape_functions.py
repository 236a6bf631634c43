"""Output sizes of the ops traced as builtin nodes (lazy_kernels.trace_builtin).

A node needs its outputs' dtypes and sizes when it is traced. Most ops give
them through their Meta kernel. For the ~40 that have none (aten's
``_logcumsumexp``, ``geqrf``, the margin losses' backward, the histograms,
``fractional_max_pool3d_backward``, the slow convolutions...), the rule is
FakeTensorMode's for the same case (``fake_tensor.run_fallback_kernel``,
which Inductor relies on when it compiles them): run aten's kernel once on
zeros of the arguments' sizes and strides, on the backing device. An op not
tagged ``dynamic_output_shape`` has sizes that do not depend on values.
Callers keep the result per argument signature (lazy_kernels._OUTPUT_SHAPES).

Written by hand here, on meta tensors, only for what zeros cannot tell:
draws (running one would advance the generator) and an op whose Meta kernel
refuses arguments its CPU kernel takes.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import device_module


def _grouped_mm_shapes(self, mat2, offs=None, bias=None, out_dtype=None):
    """aten's Meta kernel for _grouped_mm admits bfloat16 only (CUDA's
    kernels); its CPU kernel takes float32 too. As aten's CPU kernel gives:
    2-D x 3-D (MoE experts, ``offs`` their rows' ends) (M, N); 3-D x 2-D
    (groups along N) (M, all groups' N); 2-D x 2-D (groups along K) and
    3-D x 3-D one (M, N) matrix per group."""
    dtype = out_dtype or self.dtype
    if self.dim() == 2 and mat2.dim() == 2:
        shape = (offs.shape[0], self.shape[0], mat2.shape[1])
    elif self.dim() == 3 and mat2.dim() == 3:
        shape = (self.shape[0], self.shape[1], mat2.shape[2])
    else:
        shape = (self.shape[-2], mat2.shape[-1])
    return self.new_empty(shape, dtype=dtype)


BY_HAND = {
    "aten::_grouped_mm": _grouped_mm_shapes,
    # draws of their input's shape, with no Meta kernel
    "aten::binomial": lambda count, prob, generator=None: torch.empty_like(count),
    "aten::_sample_dirichlet": lambda self, generator=None: torch.empty_like(self),
}


def _has_meta(qualified: str) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return any(has(qualified, key) for key in ("Meta", "CompositeExplicitAutograd",
                                                "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd"))


def computable(qualified: str, op: torch._ops.OpOverload | None) -> bool:
    """Whether a node of ``op`` gets its sizes here. Not: draws without a
    function by hand, ops whose sizes come from values, ops with no tensor
    argument (``from_file``), ops with no kernel for the backing device
    (CUDA's own on a CPU-backed lazy device)."""
    if qualified in BY_HAND or _has_meta(qualified):
        return True
    if op is None or {torch.Tag.nondeterministic_seeded, torch.Tag.dynamic_output_shape} & set(op.tags):
        return False
    if not any("Tensor" in str(formal.type) for formal in op._schema.arguments):
        return False
    backend = {"cuda": "CUDA"}.get(device_module.backing_device() or "cpu", "CPU")
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, backend)


def _on_zeros(op):
    """``op``'s outputs computed by its kernel on zeros shaped as the meta arguments."""
    def shapes(*args, **kwargs):
        device = torch.device(device_module.backing_device() or "cpu")

        def real(x):
            if isinstance(x, torch.Tensor):
                return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device).zero_()
            return device if isinstance(x, torch.device) and x.type == "meta" else x

        out = op(*tree_map(real, args), **tree_map(real, kwargs))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (t.layout != torch.strided or t.is_quantized):
                raise NotImplementedError(f"{op}: returns a {t.layout} tensor, which the lazy device has not")
        return out

    return shapes


def shapes_of(qualified: str, op: torch._ops.OpOverload):
    """A function of the op's arguments on the meta device whose results have
    its outputs' dtypes and sizes."""
    if qualified in BY_HAND:
        return BY_HAND[qualified]
    if _has_meta(qualified) or not computable(qualified, op):
        return op  # its Meta kernel (or the refusal the caller turns into the eager path)
    return _on_zeros(op)
