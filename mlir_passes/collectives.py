"""Names and builders of the collective ops the zero passes read and write:
lazy_mlir.zero's markers (``torch.lazy_mlir.*``) and the functional
collectives they lower to (``torch._c10d_functional.*``, run by
torch.distributed: gloo on CPU, NCCL on CUDA)."""
from __future__ import annotations

import math

from torch_mlir import ir

from .torch_ir import create_op, tensor_info, vtensor_type

UNSHARD = "torch.lazy_mlir.unshard"          # (shard, shape, group_size, group_name) -> full
REDUCE_GRAD = "torch.lazy_mlir.reduce_grad"  # (grad, group_size, group_name, sharded, replicas, replica_group) -> mean
C10D = "torch._c10d_functional."
ALL_GATHER = C10D + "all_gather_into_tensor"  # (shard, group_size, group_name), async
REDUCE_SCATTER = C10D + "reduce_scatter_tensor"  # (input, "sum", group_size, group_name), async
ALL_REDUCE = C10D + "all_reduce"  # (input, "sum", group_name), async
ALL_TO_ALL = C10D + "all_to_all_single"  # (input, output_splits, input_splits, group_name), async
WAIT = C10D + "wait_tensor"       # (async result) -> its value


def shard_size(numel: int, group_size: int) -> int:
    """Elements per rank of a flat tensor split over ``group_size`` (also lazy_mlir.zero's)."""
    return max(1, math.ceil(numel / group_size))


def nbytes(value: ir.Value) -> int:
    info = tensor_info(value)
    width = int("".join(c for c in info.dtype if c.isdigit()) or 8)
    return math.prod(info.shape) * max(width // 8, 1)


def flat_type(value: ir.Value, numel: int) -> ir.Type:
    return vtensor_type((numel,), tensor_info(value).dtype, value.type.context)


def consecutive_buckets(items, key, size, limit: int, joins=lambda bucket, item: True) -> list[list]:
    """``items`` cut into runs of one ``key(item)`` (None: never shares a
    bucket) holding at most ``limit`` bytes of ``size(item)`` in all, where
    ``joins(bucket, item)`` accepts each item added."""
    buckets, total = [], 0
    for item in items:
        k = key(item)
        if (buckets and k is not None and k == key(buckets[-1][0]) and total + size(item) <= limit
                and joins(buckets[-1], item)):
            buckets[-1].append(item)
            total += size(item)
        else:
            buckets.append([item])
            total = size(item)
    return buckets


def wait(value: ir.Value, before) -> ir.Operation:
    return create_op(WAIT, [value], [value.type], before)


def all_gather(shard: ir.Value, group_size: ir.Value, group_name: ir.Value, world: int, before) -> ir.Operation:
    numel = tensor_info(shard).shape[0] * world
    return create_op(ALL_GATHER, [shard, group_size, group_name], [flat_type(shard, numel)], before)
