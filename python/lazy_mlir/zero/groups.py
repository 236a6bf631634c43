"""The process groups a ZeRO step's collectives run on.

gloo runs a group's asynchronous collectives on a pool of worker threads (2
by default), so two collectives can be in flight in gloo at once. A compiled
ZeRO step keeps many in flight (every gather is issued ahead of its use), and
two of them running concurrently race inside gloo: AddressSanitizer caught
a double free between the two worker threads of one ProcessGroupGloo (one in
``gloo::transport::Context::LazyTally::~LazyTally``, the other in
``ProcessGroupGloo::runLoop``), seen without ASAN as ``malloc(): unaligned
tcache chunk detected`` or a segfault in roughly one 3-rank run in five
(tools/zero_soak.py). On gloo the traced collectives therefore run on a
group of the same ranks with one worker thread: still asynchronous to the
step's compute, never concurrent with each other. NCCL groups are used as is.

Collectives called eagerly (set-up, checkpoints) take tensors on the device
the group's backend works on: ``collective_device``.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d

BACKEND = "lazy_mlir_gloo"  # gloo with a single worker thread


def _create_serial_gloo(store, rank: int, size: int, timeout: datetime.timedelta):
    options = dist.ProcessGroupGloo._Options()
    options._threads = 1
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(store, rank, size, options)


def _register_backend() -> None:
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create_serial_gloo, devices=["cpu"])


def collective_device(group: dist.ProcessGroup) -> torch.device:
    """Where tensors handed to ``group``'s eager collectives must live: NCCL
    takes only CUDA tensors (this rank's current device, which the user binds
    with torch.cuda.set_device); gloo and the others take CPU tensors."""
    return torch.device("cuda") if dist.get_backend(group) == dist.Backend.NCCL else torch.device("cpu")


def collective_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """``group`` itself, or for a gloo group whose backend runs collectives on
    more than one thread, a new single-thread gloo group of the same ranks and
    timeout. Collective over ``group``'s ranks: every member must call it."""
    if dist.get_backend(group) != "gloo":
        return group
    gloo = group._get_backend(torch.device("cpu"))
    if gloo.options._threads <= 1:
        return group
    _register_backend()
    ranks = tuple(dist.get_process_group_ranks(group))
    key = (ranks, gloo.options._timeout)
    # One per set of ranks: a second engine (a model set up again, from a
    # checkpoint) names the same group in its traced steps, so they are the
    # graphs the first one compiled. Every rank asks alike (SPMD), so every
    # rank takes the registered group or makes a new one. Found by name in
    # torch.distributed's registry, not held here: a group destroyed since
    # (destroy_process_group) is gone from it, and one held past it would be
    # torn down at interpreter exit with its gloo thread still running.
    registered = _live_group(_serial_group_names.get(key))
    if registered is not None:
        return registered
    serial = dist.new_group(ranks=list(ranks), backend=BACKEND, timeout=gloo.options._timeout,
                            use_local_synchronization=True)
    _serial_group_names[key] = serial.group_name
    return serial


def hybrid_groups(parent: dist.ProcessGroup, shard_ranks: list[int], replica_ranks: list[int]
                  ) -> tuple[dist.ProcessGroup, str, str]:
    """For hybrid sharding: this rank's shard group (``shard_ranks``, global
    ranks), and the names its traced collectives give it and this rank's
    replica group (``replica_ranks``: the ranks holding the same shard).
    The names are the same on every rank (``lazy_mlir.shard.<parent>.<size>``,
    ``lazy_mlir.replica...``: aliases in torch's registry of groups, which
    functional collectives look names up in), so every rank traces the same
    step and a job compiles it once, as without replicas. On gloo, groups
    with a single worker thread (see above). Collective over each group's
    ranks only: every rank makes its shard group, then its replica group."""
    backend = dist.get_backend(parent)
    options: dict = {"backend": backend, "use_local_synchronization": True}
    if backend == "gloo":
        _register_backend()
        options.update(backend=BACKEND, timeout=parent._get_backend(torch.device("cpu")).options._timeout)
    made = []
    for kind, ranks in (("shard", shard_ranks), ("replica", replica_ranks)):
        alias = f"lazy_mlir.{kind}.{parent.group_name}.{len(shard_ranks)}"
        key = (alias, tuple(ranks))
        # one per alias: a second engine (a model set up again) traces the
        # graphs the first compiled; a group destroyed since is made again
        group = _live_group(_hybrid_group_names.get(key))
        if group is None:
            group = dist.new_group(ranks=ranks, **options)
            _hybrid_group_names[key] = group.group_name
            try:
                c10d._unregister_process_group(alias)  # one of a destroyed world
            except Exception:  # noqa: BLE001 - none registered
                pass
            c10d._register_process_group(alias, group)
        made.append((group, alias))
    return made[0][0], made[0][1], made[1][1]


def _live_group(name: str | None) -> dist.ProcessGroup | None:
    """The group torch.distributed holds under ``name``, None when it holds
    none (never made, or destroyed since: destroy_process_group)."""
    if name is None:
        return None
    return next((pg for pg, n in dist.distributed_c10d._world.pg_names.items() if n == name), None)


_hybrid_group_names: dict = {}  # (alias, ranks) -> the name torch gave the group
_serial_group_names: dict = {}  # (ranks, timeout) -> the name of the serial group made for them
