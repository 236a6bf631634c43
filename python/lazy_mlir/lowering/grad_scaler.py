"""GradScaler's two aten ops -> per-tensor aten ops, in the TS -> FX
conversion (``ts_to_fx``). Neither has a lowering in Inductor: it calls
aten's kernel as an extern (for ``_amp_update_scale``, through its proxy
executor under the C++ wrapper, with a warning at every compile), outside
the fused code. Traced, each is one builtin node (aten's kernel in
TorchScript, ``lazy_kernels``); compiled, these expansions compute what
aten's CPU kernels compute.
"""
from __future__ import annotations

from typing import Callable

import torch

from .fused_optimizer import placer, times_inv_scale

aten = torch.ops.aten


# GradScaler.unscale_ (and its inf check before a fused optimizer's step):
# each gradient times inv_scale in float32 (float64 for float64) and back,
# and found_inf set to 1 where a value is not finite.
AMP_UNSCALE = "aten::_amp_foreach_non_finite_check_and_unscale"


def expand_amp_unscale(emit: Callable, graph: torch.fx.Graph, args: list) -> tuple:
    grads, found_inf, inv_scale = args
    place = placer(graph, lambda i: [grads[i], inv_scale])
    out, nonfinite = [], []
    for i, grad in enumerate(grads):
        with place(i):  # by its gradient, where Inductor can fuse the check with what computed it
            out.append(times_inv_scale(emit, grad, inv_scale, grad.meta["val"].dtype))
            nonfinite.append(emit(aten.logical_not.default, emit(aten.all.default, emit(aten.isfinite.default, grad))))
    if not out:
        return out, found_inf
    found = emit(aten.any.default, emit(aten.stack.default, nonfinite))
    return out, emit(aten.where.self, found, emit(aten.ones_like.default, found_inf), found_inf)


AMP_UPDATE_SCALE = "aten::_amp_update_scale"


def expand_amp_update_scale(emit: Callable, graph: torch.fx.Graph, args: list) -> tuple:
    """GradScaler.update: after an overflow the scale times backoff_factor
    and the growth tracker 0; else the tracker counts the step, and at
    growth_interval steps the scale grows by growth_factor (unless that is
    not finite) and the tracker restarts. The products in float64, as
    aten's CPU kernel computes them (a float times a double)."""
    scale, tracker, found_inf, growth_factor, backoff_factor, growth_interval = args
    dtype = scale.meta["val"].dtype

    def times(factor):
        wide = emit(aten.mul.Tensor, emit(aten._to_copy.default, scale, dtype=torch.float64), factor)
        return emit(aten._to_copy.default, wide, dtype=dtype)

    overflow = emit(aten.ne.Scalar, found_inf, 0)
    successful = emit(aten.add.Tensor, tracker, 1)
    grows = emit(aten.eq.Scalar, successful, growth_interval)
    grown = times(growth_factor)
    grown = emit(aten.where.self, emit(aten.isfinite.default, grown), grown, scale)
    new_scale = emit(aten.where.self, overflow, times(backoff_factor), emit(aten.where.self, grows, grown, scale))
    restarts = emit(aten.logical_or.default, overflow, grows)
    new_tracker = emit(aten.where.self, restarts, emit(aten.zeros_like.default, tracker), successful)
    return new_scale, new_tracker


EXPANSIONS = {AMP_UNSCALE: expand_amp_unscale, AMP_UPDATE_SCALE: expand_amp_update_scale}
