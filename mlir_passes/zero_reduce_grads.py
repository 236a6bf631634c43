"""Lowers lazy_mlir.zero's ``reduce_grad`` markers to reduce-scatter or all-reduce."""
from __future__ import annotations

import dataclasses
import math

from .base import Pass
from .collectives import ALL_REDUCE, ALL_TO_ALL, REDUCE_GRAD, REDUCE_SCATTER, consecutive_buckets, flat_type, \
    nbytes, shard_size, wait
from .registry import register
from .torch_ir import cat, constant_bool, constant_float, constant_int, constant_none, constant_str, \
    constant_value, create_aten, create_op, functions, int_list, op_error, op_name, ops_of, slice_tensor, \
    tensor_info, vtensor_type


@register
@dataclasses.dataclass(frozen=True)
class ZeroReduceGrads(Pass):
    """Replaces each ``torch.lazy_mlir.reduce_grad(%grad, N, group, sharded, R,
    replicas)`` (the mean of a gradient over N data-parallel ranks, times R
    replicas of the group; when sharded only this rank's flat zero-padded
    shard of it) by functional collectives: the
    collective starts where the marker was (as soon as backward has made
    the gradient) and its ``wait_tensor`` sits just before the first use of
    the result (as late as possible), so it overlaps the rest of backward.

    A shard is made with ``reduce_scatter_tensor`` over the flattened,
    padded gradient; with ``all-to-all`` by ``all_to_all_single`` (each
    rank receives every rank's copy of its slice) and a sum over ranks: the
    same bytes as a reduce-scatter, where gloo runs
    ``reduce_scatter_tensor`` as an all-reduce (twice the bytes) plus
    copies. A whole gradient (a parameter kept whole) is an ``all_reduce``.
    Nothing lowered names this rank: the collectives hand each rank its
    own shard. The sum is divided by N after the wait.

    With R > 1 replicas (hybrid sharding) the group's sum is then
    all-reduced over the ``replicas`` group and divided by N * R. That
    all-reduce starts where the next reduction starts (the group's
    collective, started a stretch of backward earlier, is waited for there)
    or at the first use if that comes first, and is waited for at the first
    use: it overlaps the rest of backward too.

    Consecutive markers of one kind (whole or sharded; with ``all-to-all``
    both), group and dtype whose gradients hold at most ``bucket-bytes`` in
    all share one collective (fewer, larger transfers): it starts where the
    last of them was and is waited for before the first use of any.
    Guarantees: no ``reduce_grad`` marker remains."""

    name = "zero-reduce-grads"
    all_to_all: bool = False
    bucket_bytes: int = 0

    def apply(self, module) -> None:
        for func in functions(module):
            index = {op.operation: i for i, op in enumerate(ops_of(func))}
            markers = [o.operation for o in ops_of(func) if op_name(o) == REDUCE_GRAD]
            # first uses found before any rewrite: an op's hash changes with its operands
            first_uses = [min((u.owner.operation for u in m.results[0].uses), key=index.__getitem__, default=None)
                          for m in markers]
            live = []
            for marker, first_use in zip(markers, first_uses):
                if first_use is None:
                    marker.erase()  # a reduction nobody reads
                else:
                    live.append((marker, index[marker], first_use, index[first_use]))
            buckets = self._buckets(live)
            for k, bucket in enumerate(buckets):
                first_use, use_at = min(((m[2], m[3]) for m in bucket), key=lambda use: use[1])
                # where the replicas' all-reduce starts: where the next reduction does, if before the use
                later = buckets[k + 1][-1] if k + 1 < len(buckets) else None
                handoff = later[0] if later is not None and later[1] < use_at else first_use
                if len(bucket) == 1:
                    self._lower(bucket[0][0], first_use, handoff)
                else:
                    self._lower_bucket([member[0] for member in bucket], first_use, handoff)

    def _buckets(self, live) -> list[list[tuple]]:
        """Consecutive markers of one kind (whole, or sharded over the same
        ranks; with all-to-all, both), dtype and group, while their
        gradients hold at most ``bucket-bytes`` in all and no member's result
        is used before the last member's marker (where the bucket's
        collective starts)."""
        def key(member):
            marker = member[0]
            world, sharded = _constants(self.name, marker)
            # an all-to-all bucket carries whole gradients too (see _lower_bucket)
            kind = None if self.all_to_all else sharded
            return (kind, world, constant_value(marker.operands[2]), _replicas(self.name, marker),
                    constant_value(marker.operands[5]), tensor_info(marker.operands[0]).dtype)

        def joins(bucket, member):
            return min(m[3] for m in bucket) > member[1]

        return consecutive_buckets(live, key, lambda member: nbytes(member[0].operands[0]), self.bucket_bytes, joins)

    def _lower(self, marker, first_use, handoff) -> None:
        grad, group_size, group_name = marker.operands[:3]
        world, sharded = _constants(self.name, marker)
        replicas = _replicas(self.name, marker)
        collect = handoff if replicas > 1 else first_use  # where the group's collective is waited for
        if not sharded:
            started = create_op(ALL_REDUCE, [grad, constant_str("sum", marker), group_name], [grad.type],
                                marker).results[0]
            reduced = wait(started, collect).results[0]
        else:
            flat = _flat_padded(grad, world, marker)
            reduced = self._sum_my_shard(flat, world, group_size, group_name, marker, collect)
        reduced = _across_replicas(reduced, replicas, marker.operands[5], collect, first_use)
        _replace_by_mean(marker, reduced, world * replicas, first_use)

    def _sum_my_shard(self, flat, world: int, group_size, group_name, start, first_use):
        """This rank's 1/world slice of the sum over ranks of ``flat``: the
        collective starts before op ``start``, is waited before ``first_use``."""
        width = tensor_info(flat).shape[0] // world
        dtype, context = tensor_info(flat).dtype, flat.type.context
        mine = vtensor_type((width,), dtype, context)
        if self.all_to_all:  # receive every rank's copy of my slice, then add them up here
            splits = int_list([width] * world, start)
            started = create_op(ALL_TO_ALL, [flat, splits, splits, group_name], [flat.type], start).results[0]
            copies = create_aten("view", [wait(started, first_use).results[0], int_list([world, width], first_use)],
                                 [vtensor_type((world, width), dtype, context)], first_use).results[0]
            args = [copies, int_list([0], first_use), constant_bool(False, first_use), constant_none(first_use)]
            return create_aten("sum.dim_IntList", args, [mine], first_use).results[0]
        started = create_op(REDUCE_SCATTER, [flat, constant_str("sum", start), group_size, group_name], [mine],
                            start).results[0]
        return wait(started, first_use).results[0]

    def _lower_bucket(self, markers, first_use, handoff) -> None:
        """One collective for several markers, started where the last of them
        was (when all their gradients are made) and waited before the first
        use of any. Sharded gradients are laid out [ranks, shard] side by
        side, so each rank's slice of the bucket holds its shard of each. A
        whole gradient in an all-to-all bucket takes one full copy per rank
        (each rank receives all ranks' copies and sums them, an all-reduce
        without a collective of its own: gloo pays per collective)."""
        last = markers[-1]
        group_size, group_name = last.operands[1:3]
        world = _constants(self.name, last)[0]
        replicas = _replicas(self.name, last)
        collect = handoff if replicas > 1 else first_use
        any_sharded = any(_constants(self.name, m)[1] for m in markers)
        dtype, context = tensor_info(last.operands[0]).dtype, last.context
        if not any_sharded:
            pieces = [create_aten("reshape", [m.operands[0], int_list([-1], last)],
                                  [flat_type(m.operands[0], _numel(m.operands[0]))], last).results[0] for m in markers]
            widths = [tensor_info(p).shape[0] for p in pieces]
            whole = cat(pieces, 0, vtensor_type((sum(widths),), dtype, context), last)
            started = create_op(ALL_REDUCE, [whole, constant_str("sum", last), group_name], [whole.type],
                                last).results[0]
            reduced = wait(started, collect).results[0]
        else:
            rows = []
            for m in markers:
                if not _constants(self.name, m)[1]:
                    width = _numel(m.operands[0])
                    one = create_aten("reshape", [m.operands[0], int_list([1, width], last)],
                                      [vtensor_type((1, width), dtype, context)], last).results[0]
                    copies = [one, int_list([world, width], last), constant_bool(False, last)]
                    rows.append(create_aten("expand", copies, [vtensor_type((world, width), dtype, context)],
                                            last).results[0])
                    continue
                flat = _flat_padded(m.operands[0], world, last)
                width = tensor_info(flat).shape[0] // world
                rows.append(create_aten("view", [flat, int_list([world, width], last)],
                                        [vtensor_type((world, width), dtype, context)], last).results[0])
            widths = [tensor_info(r).shape[1] for r in rows]
            total = sum(widths)
            side_by_side = cat(rows, 1, vtensor_type((world, total), dtype, context), last)
            flat = create_aten("reshape", [side_by_side, int_list([-1], last)],
                               [vtensor_type((world * total,), dtype, context)], last).results[0]
            reduced = self._sum_my_shard(flat, world, group_size, group_name, last, collect)
        reduced = _across_replicas(reduced, replicas, last.operands[5], collect, first_use)
        offset = 0
        for m, width in zip(markers, widths):
            part = slice_tensor(reduced, 0, offset, offset + width, vtensor_type((width,), dtype, context), first_use)
            shaped = create_aten("view", [part, int_list(tensor_info(m.results[0]).shape, first_use)],
                                 [m.results[0].type], first_use).results[0]
            _replace_by_mean(m, shaped, world * replicas, first_use)
            offset += width


def _constants(pass_name, marker) -> tuple[int, bool]:
    """The marker's group size and whether it makes a shard."""
    if len(marker.operands) != 6:
        raise op_error(pass_name, marker, "takes (grad, group size, group, sharded, replicas, replica group)")
    world, sharded = constant_value(marker.operands[1]), constant_value(marker.operands[3])
    if not isinstance(world, int) or not isinstance(sharded, bool):
        raise op_error(pass_name, marker, "group size (an int) and sharded (a bool) must be constants")
    return world, sharded


def _replicas(pass_name, marker) -> int:
    replicas, group = constant_value(marker.operands[4]), constant_value(marker.operands[5])
    if not isinstance(replicas, int) or replicas < 1 or not isinstance(group, str):
        raise op_error(pass_name, marker, "replicas and the replica group must be constants")
    return replicas


def _across_replicas(reduced, replicas: int, replica_group, start, first_use):
    """``reduced`` summed over ``replica_group`` when there are replicas:
    started before op ``start``, waited for before ``first_use``."""
    if replicas == 1:
        return reduced
    started = create_op(ALL_REDUCE, [reduced, constant_str("sum", start), replica_group], [reduced.type],
                        start).results[0]
    return wait(started, first_use).results[0]


def _numel(value) -> int:
    return math.prod(tensor_info(value).shape)


def _flat_padded(grad, world: int, before):
    """``grad`` flattened and zero-padded to a multiple of ``world``."""
    numel = _numel(grad)
    size = shard_size(numel, world)
    flat = create_aten("reshape", [grad, int_list([-1], before)], [flat_type(grad, numel)], before).results[0]
    if size * world != numel:
        pad = [flat, int_list([0, size * world - numel], before), constant_float(0.0, before)]
        flat = create_aten("constant_pad_nd", pad, [flat_type(grad, size * world)], before).results[0]
    return flat


def _replace_by_mean(marker, reduced, world: int, before) -> None:
    result = marker.results[0]
    mean = create_aten("div.Scalar", [reduced, constant_int(world, before)], [result.type], before)
    result.replace_all_uses_with(mean.results[0])
    marker.erase()
