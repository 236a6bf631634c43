"""Meta kernels that take symbolic sizes, for aten ops whose own take
concrete ones only.

A shape-generic compile runs the group's ops on fakes with symbolic sizes.
The backward of bicubic and bilinear upsampling (a ViT's position
embeddings interpolated to another image size: HF's
``interpolate_pos_encoding``) has a C++ meta kernel that reads its
``input_size`` as concrete ints, and fails on symbols ("Expected IntList
but got GenericList"): the group then compiled static at every image size.
Their output is simply a tensor of ``input_size``, laid out as the
gradient; the kernels themselves run unchanged (Inductor calls aten's).
"""
from __future__ import annotations

import functools
import warnings

import torch
from torch._prims_common import suggest_memory_format

_UPSAMPLE_BACKWARDS = ("upsample_bicubic2d_backward", "upsample_bilinear2d_backward")
_LIB: torch.library.Library | None = None


def _upsample_backward_meta(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return torch.empty(input_size, dtype=grad_output.dtype, device=grad_output.device,
                       memory_format=suggest_memory_format(grad_output))


@functools.cache
def install() -> None:
    """Registers the meta kernels (once per process, before a symbolic lowering)."""
    global _LIB
    _LIB = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel"
        warnings.simplefilter("ignore")
        for name in _UPSAMPLE_BACKWARDS:
            _LIB.impl(name, _upsample_backward_meta, "Meta")
