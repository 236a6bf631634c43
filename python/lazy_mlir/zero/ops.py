"""The two ops a ZeRO step is traced with: what must happen, not how.

``lazy_mlir::unshard(shard, shape, group_size, group_name)``
    The full tensor of logical ``shape`` whose flat, zero-padded data is split
    in ``group_size`` equal shards over the group; ``shard`` is this rank's.
``lazy_mlir::reduce_grad(grad, group_size, group_name, sharded, replicas, replica_group)``
    The mean of ``grad`` over the group's ranks (data parallelism): all of it,
    or with ``sharded`` only this rank's flat padded shard.
    With ``replicas`` > 1 (hybrid sharding) the group is one of ``replicas``
    groups that each hold all the shards, and the mean is over all of their
    ranks: the group's result is then averaged over ``replica_group`` (the
    ranks holding the same shard in each group).
    Neither op names this rank (the collectives deliver each rank its own
    shard), so a step traced with them is the same graph on every rank.

They enter the lazy trace as single nodes (their Lazy kernels trace them as
TorchScript builtins), so each compiled group sees them with full shapes;
the ``zero-*`` MLIR passes then lower them to ``_c10d_functional``
collectives, scheduled. Their CPU/CUDA kernels below are the same semantics
run eagerly, for any group that runs in TorchScript: never a wrong answer.
"""
from __future__ import annotations

import math

import torch
from mlir_passes.collectives import shard_size  # one padding rule for traced steps and passes

from ..trace.lazy_kernels import trace_builtin

_c10d = torch.ops._c10d_functional


def flat_padded(tensor: torch.Tensor, group_size: int) -> torch.Tensor:
    flat = tensor.reshape(-1)
    pad = shard_size(flat.numel(), group_size) * group_size - flat.numel()
    return torch.nn.functional.pad(flat, (0, pad)) if pad else flat


@torch.library.custom_op("lazy_mlir::unshard", mutates_args=(), device_types=("cpu", "cuda"))
def unshard(shard: torch.Tensor, shape: list[int], group_size: int, group_name: str) -> torch.Tensor:
    gathered = _c10d.wait_tensor(_c10d.all_gather_into_tensor(shard.contiguous(), group_size, group_name))
    return gathered[:math.prod(shape)].view(shape).clone()


@unshard.register_fake
def _(shard, shape, group_size, group_name):
    return shard.new_empty(shape)


@torch.library.custom_op("lazy_mlir::reduce_grad", mutates_args=(), device_types=("cpu", "cuda"))
def reduce_grad(grad: torch.Tensor, group_size: int, group_name: str, sharded: bool, replicas: int,
                replica_group: str) -> torch.Tensor:
    if not sharded:
        total = _c10d.wait_tensor(_c10d.all_reduce(grad.contiguous(), "sum", group_name))
    else:
        flat = flat_padded(grad, group_size)
        total = _c10d.wait_tensor(_c10d.reduce_scatter_tensor(flat, "sum", group_size, group_name))
    if replicas > 1:
        total = _c10d.wait_tensor(_c10d.all_reduce(total, "sum", replica_group))
    return total / (group_size * replicas)


@reduce_grad.register_fake
def _(grad, group_size, group_name, sharded, replicas, replica_group):
    if not sharded:
        return torch.empty_like(grad)
    return grad.new_empty(shard_size(grad.numel(), group_size))


def _install_lazy_kernels() -> torch.library.Library:

    lib = torch.library.Library("lazy_mlir", "IMPL")
    for op in (torch.ops.lazy_mlir.unshard.default, torch.ops.lazy_mlir.reduce_grad.default):
        lib.impl(op._schema.name.split("::")[1], lambda *a, _op=op, **k: trace_builtin(_op, a, k), "Lazy")
    return lib


_LAZY_LIB = _install_lazy_kernels()
