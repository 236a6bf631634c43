"""Lowers lazy_mlir.zero's ``reduce_grad`` markers to reduce-scatter or all-reduce."""
from __future__ import annotations

import dataclasses

from .base import Pass
from .collectives import ALL_REDUCE, REDUCE_GRAD, REDUCE_SCATTER, flat_type, shard_size, wait
from .registry import register
from .torch_ir import constant_float, constant_int, constant_str, constant_value, create_aten, create_op, \
    functions, int_list, op_error, op_name, ops_of, tensor_info


@register
@dataclasses.dataclass(frozen=True)
class ZeroReduceGrads(Pass):
    """Replaces each ``torch.lazy_mlir.reduce_grad(%grad, N, group, rank)``
    (the mean of a gradient over N data-parallel ranks; with rank >= 0 only
    that rank's flat zero-padded shard of it) by functional collectives: the
    collective starts where the marker was (as soon as backward has made
    the gradient) and its ``wait_tensor`` sits just before the first use of
    the result (as late as possible), so it overlaps the rest of backward.

    A shard is made with ``reduce_scatter_tensor`` over the flattened,
    padded gradient (ZeRO-2/3); with ``all-reduce`` (ZeRO-1) by
    ``all_reduce`` and a slice at ``rank``. Rank -1 (parameters kept whole)
    is always an ``all_reduce``. The sum is divided by N after the wait.
    Guarantees: no ``reduce_grad`` marker remains."""

    name = "zero-reduce-grads"
    all_reduce: bool = False

    def apply(self, module) -> None:
        for func in functions(module):
            index = {op.operation: i for i, op in enumerate(ops_of(func))}
            markers = [o.operation for o in ops_of(func) if op_name(o) == REDUCE_GRAD]
            # first uses found before any rewrite: an op's hash changes with its operands
            first_uses = [min((u.owner.operation for u in m.results[0].uses), key=index.__getitem__, default=None)
                          for m in markers]
            for marker, first_use in zip(markers, first_uses):
                self._lower(marker, first_use)

    def _lower(self, marker, first_use) -> None:
        grad, group_size, group_name, shard_rank = marker.operands
        world, rank = constant_value(group_size), constant_value(shard_rank)
        if not isinstance(world, int) or not isinstance(rank, int):
            raise op_error(self.name, marker, "group size and rank must be constants")
        result = marker.results[0]
        if first_use is None:
            marker.erase()
            return
        sum_ = constant_str("sum", marker)
        if rank < 0:
            started = create_op(ALL_REDUCE, [grad, sum_, group_name], [grad.type], marker).results[0]
            reduced = wait(started, first_use).results[0]
        else:
            numel = 1
            for d in tensor_info(grad).shape:
                numel *= d
            size = shard_size(numel, world)
            flat = create_aten("reshape", [grad, int_list([-1], marker)], [flat_type(grad, numel)], marker).results[0]
            if size * world != numel:
                pad = [flat, int_list([0, size * world - numel], marker), constant_float(0.0, marker)]
                flat = create_aten("constant_pad_nd", pad, [flat_type(grad, size * world)], marker).results[0]
            if self.all_reduce:
                started = create_op(ALL_REDUCE, [flat, sum_, group_name], [flat.type], marker).results[0]
                whole = wait(started, first_use).results[0]
                args = [whole, constant_int(0, first_use), constant_int(rank * size, first_use),
                        constant_int((rank + 1) * size, first_use), constant_int(1, first_use)]
                reduced = create_aten("slice.Tensor", args, [result.type], first_use).results[0]
            else:
                started = create_op(REDUCE_SCATTER, [flat, sum_, group_size, group_name], [result.type],
                                    marker).results[0]
                reduced = wait(started, first_use).results[0]
        mean = create_aten("div.Scalar", [reduced, constant_int(world, first_use)], [result.type], first_use)
        result.replace_all_uses_with(mean.results[0])
        marker.erase()
