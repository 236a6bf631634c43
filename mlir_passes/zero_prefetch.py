"""Issues zero-insert-gather's all-gathers early, within a byte budget, bucketing small ones."""
from __future__ import annotations

import dataclasses

from torch_mlir import ir

from .base import Pass
from .collectives import ALL_GATHER, WAIT, all_gather, consecutive_buckets, flat_type, nbytes, wait
from .registry import register
from .torch_ir import VIEW_OPS, cat, constant_value, create_aten, functions, hoist_constants, int_list, op_name, \
    slice_tensor, tensor_info, vtensor_type


@register
@dataclasses.dataclass(frozen=True)
class ZeroPrefetch(Pass):
    """Moves each ``all_gather_into_tensor`` whose only user is its
    ``wait_tensor`` earlier, so the transfer overlaps the compute before its
    use. Gathers are taken in the order of their waits; gather i is issued
    right after the wait of the latest earlier gather j such that the
    gathers j+1..i together hold at most ``budget-bytes`` (at the function's
    start when all of them fit, at its own wait when it alone does not):
    the bytes of issued, not yet waited gathers never exceed the budget.
    No gather moves above the op defining its shard. A re-gather (stage 3)
    that would be issued while an earlier gather of the same shard is still
    read is dropped: its uses read the earlier copy, which then lives until
    them (one copy where the schedule would hold two).

    Gathers that end up issued at the same point, each of at most
    ``bucket-bytes`` and of one dtype and group, become one: their shards
    are concatenated, gathered once, waited before the first of the
    original waits and split back per rank. Guarantees: every use still
    follows its wait; the collectives' order is the same on every rank."""

    name = "zero-prefetch"
    budget_bytes: int = 4 << 20
    bucket_bytes: int = 1 << 20

    def apply(self, module) -> None:
        for func in functions(module):
            self._schedule(func.regions[0].blocks[0])

    def _schedule(self, block) -> None:
        hoist_constants(block)  # a gather's group constants must not pin it late
        ops = [op.operation for op in block.operations]
        index = {op: i for i, op in enumerate(ops)}
        pairs = []  # (gather, wait) in the order of the waits
        for op in ops:
            if op_name(op) == WAIT and op_name(op.operands[0].owner) == ALL_GATHER:
                gather = op.operands[0].owner.operation
                if len(list(gather.results[0].uses)) == 1:
                    pairs.append((gather, op))
        if not pairs:
            return
        sizes = [nbytes(g.results[0]) for g, _ in pairs]
        # positions found before any rewrite: an ir.Operation's hash is not
        # stable under rewrites of its operands
        definitions = [_definition_point(gather) for gather, _ in pairs]
        starts = [index[d] if d is not None else -1 for d in definitions]
        last_uses = [_last_use(wait_op, index) for _, wait_op in pairs]
        while True:
            anchors = self._anchors(pairs, sizes, starts, index)
            reuse = _redundant_regathers(pairs, anchors, last_uses)
            if not reuse:
                break
            for i, k in sorted(reuse.items(), reverse=True):  # i's data is k's, still live: use k's
                gather, wait_op = pairs[i]
                wait_op.results[0].replace_all_uses_with(pairs[k][1].results[0])
                wait_op.erase()
                gather.erase()
                last_uses[k] = max(last_uses[k], last_uses[i])
                for column in (pairs, sizes, starts, last_uses):
                    del column[i]
        last_at: dict[int, object] = {}  # anchor -> gather last put there: gathers keep their waits' order
        for (gather, _), anchor in zip(pairs, anchors):
            if anchor is None:
                continue
            if anchor in last_at:
                gather.move_after(last_at[anchor])
            elif anchor < 0:
                gather.move_before(ops[0])
            else:
                gather.move_after(ops[anchor])
            last_at[anchor] = gather
        self._bucket(pairs, sizes, anchors)

    def _anchors(self, pairs, sizes, starts, index) -> list:
        """Where each gather goes, as a position in the block's original ops
        (-1: the function's start; None: it stays)."""
        anchors = []
        for i in range(len(pairs)):
            j, in_flight = i, sizes[i]
            while j > 0 and in_flight + sizes[j - 1] <= self.budget_bytes:
                j -= 1
                in_flight += sizes[j]
            if in_flight > self.budget_bytes:
                anchors.append(None)
                continue
            after_wait = index[pairs[j - 1][1]] if j > 0 else -1
            anchors.append(max(after_wait, starts[i]))
        return anchors

    def _bucket(self, pairs, sizes, anchors) -> None:
        """Bucket consecutive gathers (in the order of their waits) issued at
        one point, while the bucket holds at most ``bucket-bytes``: the
        first use waits for the whole bucket, so buckets stay small."""
        def key(i):
            if anchors[i] is None or sizes[i] > self.bucket_bytes:
                return None
            shard, group_size, group_name = pairs[i][0].operands
            return anchors[i], tensor_info(shard).dtype, constant_value(group_size), constant_value(group_name)

        def joins(bucket, i):  # a shard twice is a re-gather: leave it be
            return all(pairs[m][0].operands[0] != pairs[i][0].operands[0] for m in bucket)

        for bucket in consecutive_buckets(range(len(pairs)), key, sizes.__getitem__, self.bucket_bytes, joins):
            if len(bucket) > 1:
                _merge([pairs[i] for i in bucket])


def _redundant_regathers(pairs, anchors, last_uses) -> dict[int, int]:
    """Re-gathers (i -> k) that the budget would issue while the earlier
    gather k of the same shard is still in use: i then takes k's data,
    which stays live until i's last use instead (one copy, where the
    schedule would hold two)."""
    reuse = {}
    for i, (gather, _) in enumerate(pairs):
        if anchors[i] is None:
            continue
        for k in range(i - 1, -1, -1):
            if list(pairs[k][0].operands) == list(gather.operands) and k not in reuse:
                if anchors[i] < last_uses[k]:
                    reuse[i] = k
                break
    return reuse


def _last_use(wait_op, index) -> int:
    """Position of the last op that reads the gathered tensor, directly or
    through views of it (zero-insert-gather's slice and view, a ``t``)."""
    last, values = index[wait_op], [wait_op.results[0]]
    while values:
        for use in values.pop().uses:
            user = use.owner.operation
            last = max(last, index[user])
            if user.name in VIEW_OPS:
                values.extend(user.results)
    return last


def _definition_point(gather):
    """The last op defining one of ``gather``'s operands (None: all are arguments)."""
    owners = [v.owner.operation for v in gather.operands if not isinstance(v.owner, ir.Block)]
    latest = None
    for owner in owners:
        if latest is None or latest.is_before_in_block(owner):
            latest = owner
    return latest


def _merge(members) -> None:
    """One gather for several: cat the shards, gather, wait before the first
    of the old waits, and slice each member's columns out of the
    [ranks, total] result."""
    first_gather = members[0][0]
    shard0, group_size, group_name = first_gather.operands
    dtype, context = tensor_info(shard0).dtype, shard0.type.context
    world = tensor_info(first_gather.results[0]).shape[0] // tensor_info(shard0).shape[0]
    shards = [gather.operands[0] for gather, _ in members]
    widths = [tensor_info(s).shape[0] for s in shards]
    total = sum(widths)
    side_by_side = cat(shards, 0, flat_type(shard0, total), first_gather)
    merged = all_gather(side_by_side, group_size, group_name, world, first_gather)
    first_wait = members[0][1]
    for _, old_wait in members[1:]:
        if old_wait.is_before_in_block(first_wait):
            first_wait = old_wait
    done = wait(merged.results[0], first_wait).results[0]
    rows = create_aten("view", [done, int_list([world, total], first_wait)],
                       [vtensor_type((world, total), dtype, context)], first_wait).results[0]
    offset = 0
    for (gather, old_wait), width in zip(members, widths):
        part = slice_tensor(rows, 1, offset, offset + width, vtensor_type((world, width), dtype, context), first_wait)
        flat = create_aten("reshape", [part, int_list([-1], first_wait)], [old_wait.results[0].type], first_wait)
        old_wait.results[0].replace_all_uses_with(flat.results[0])
        offset += width
    for gather, old_wait in members:
        old_wait.erase()
        gather.erase()
