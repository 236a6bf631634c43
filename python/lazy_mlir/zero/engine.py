"""ZeRO stages 1-3 for a model on the lazy device: what each step traces.

The engine only changes what is traced, with the two marker ops of
``zero/ops.py``; the ``zero-*`` MLIR passes turn the markers into scheduled
collectives inside the step's compiled graph. Per parameter ``p`` above the
persistence threshold, ``shard`` is this rank's flat padded slice, the
tensor the wrapped optimizer owns (so its state is sharded in every stage):

stage 1  p stays whole. At ``step()``: ``shard <- slice(p)``,
         ``shard.grad <- reduce_grad(p.grad)`` (lowered to reduce-scatter),
         inner step on shards, ``p <- unshard(shard)``.
stage 2  as 1, but each gradient is reduced by a hook as soon as backward
         produces it, and only its shard is kept.
stage 3  ``shard`` is the only storage. A forward pre-hook sets
         ``p <- unshard(shard)`` (full logical shape in the trace, no data);
         the gradient hook reduce-scatters into ``shard.grad`` and empties
         ``p``; the inner step updates shards in place.
``slice(p)`` picks this rank's row of p's shards by an index held as
device data, not as a constant: no traced step names the rank, so every
rank's step is the same graph, compiled once per job
(compile_cache.exclusive).
Parameters at or below the persistence threshold stay whole on every rank;
their gradients are all-reduced and the inner optimizer updates them as is.
Hybrid sharding: "the group" above is this rank's shard group, one of
several replicas; ``reduce_grad`` also names the replica group, over which
its lowering all-reduces the group's result.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .. import backend, config
from . import ops
from .groups import collective_device, collective_group, hybrid_groups
from .schedule import ProfiledSchedule


@dataclasses.dataclass
class ManagedParam:
    name: str
    param: torch.nn.Parameter      # the model's parameter: full logical shape
    shape: list[int]
    numel: int
    shard: torch.Tensor | None     # the optimizer's tensor (None: kept whole)
    # The reduced gradient shard, kept here between backward and step: in
    # stages 1-2 the shard tensor has no data outside step().
    grad_shard: torch.Tensor | None = None
    # What attach() gives the parameter (rank 0's values; None: stage 3 keeps
    # no whole copy), held only between shard() and attach().
    initial: torch.Tensor | None = None
    # offload_optimizer: the host copy the optimizer owns and updates: the
    # shard, or the whole parameter when kept whole
    host: torch.Tensor | None = None

    @property
    def sharded(self) -> bool:
        return self.shard is not None


class ZeroEngine:
    """Set up in three phases, so that zero.initialize can be all-or-nothing:
    ``__init__`` checks (local, changes nothing), ``shard()`` computes every
    rank's shards (collectives, changes nothing of the model), ``attach()``
    commits (parameter data, hooks), recording how to undo each change until
    ``commit()``; ``detach()`` undoes them."""

    def __init__(self, model, stage, process_group, prefetch_bytes, persistence_threshold, reuse_bytes,
                 bucket_bytes, reduce_scatter="auto", shard_group_size=None, memory_budget=None,
                 offload_optimizer=False):
        if stage not in (1, 2, 3):
            raise ValueError(f"lazy_mlir.zero: stage must be 1, 2 or 3, got {stage!r}")
        if reduce_scatter not in ("auto", "all_to_all", "reduce_scatter_tensor"):
            raise ValueError("lazy_mlir.zero: reduce_scatter must be 'auto', 'all_to_all' or "
                             f"'reduce_scatter_tensor', got {reduce_scatter!r}")
        if not dist.is_initialized():
            raise RuntimeError("lazy_mlir.zero: call torch.distributed.init_process_group first (run under torchrun)")
        if memory_budget is not None and (stage != 3 or not isinstance(memory_budget, int) or memory_budget <= 0):
            raise ValueError("lazy_mlir.zero: memory_budget plans stage 3's gathers: a positive number of bytes "
                             f"with stage=3, got {memory_budget!r} with stage={stage}")
        if offload_optimizer and stage != 3:
            raise ValueError(f"lazy_mlir.zero: offload_optimizer needs stage=3, got stage={stage}")
        self.offload = bool(offload_optimizer)
        self.memory_budget = memory_budget
        self.schedule: ProfiledSchedule | None = None  # with a memory_budget, from start_schedule()
        self.stage = stage
        self.process_group = process_group or dist.group.WORLD  # every rank training this model
        whole = dist.get_world_size(self.process_group)
        size = whole if shard_group_size is None else shard_group_size
        if not isinstance(size, int) or size < 1 or whole % size:
            raise ValueError(f"lazy_mlir.zero: shard_group_size must divide the group's {whole} ranks, "
                             f"got {shard_group_size!r}")
        # Hybrid sharding: the group's ranks in consecutive blocks of `size`
        # (a machine's ranks, under torchrun); each block shards the state
        # over its ranks, the blocks replicate it.
        index = dist.get_rank(self.process_group)
        self.world, self.rank = size, index % size      # the shard group's size, this rank in it
        self.replicas = whole // size
        global_ranks = dist.get_process_group_ranks(self.process_group)
        block = index - self.rank
        self._shard_ranks = global_ranks[block:block + size]
        self._replica_ranks = global_ranks[self.rank::size]
        self.group: dist.ProcessGroup | None = None  # the shard group; set by shard(): creating it is a collective
        self.group_name: str | None = None  # of the group the traced collectives run on
        self.replica_group_name = ""        # with replicas: of the group of this shard's holders
        self.device = collective_device(self.process_group)  # of the tensors eager collectives take
        # gloo runs reduce_scatter_tensor as an all-reduce (twice the bytes)
        # plus copies; an all-to-all and a local sum move a reduce-scatter's bytes
        if reduce_scatter == "auto":
            gloo = dist.get_backend(self.process_group) == "gloo"
            reduce_scatter = "all_to_all" if gloo else "reduce_scatter_tensor"
        self.reduce_scatter = reduce_scatter
        self.prefetch_bytes = prefetch_bytes
        self.reuse_bytes = reuse_bytes
        self.bucket_bytes = bucket_bytes
        self.persistence_threshold = persistence_threshold
        self._trainable: list[tuple[str, torch.nn.Parameter]] = []
        seen: set[int] = set()
        for name, p in model.named_parameters():  # tied parameters appear once
            if id(p) in seen or not p.requires_grad:
                continue
            if p.device.type != "lazy":
                raise ValueError(f"lazy_mlir.zero: parameter {name} is on {p.device}; move the model to 'lazy' first")
            seen.add(id(p))
            self._trainable.append((name, p))
        self.trainable_ids = frozenset(seen)
        self.managed: list[ManagedParam] = []
        self.by_param: dict[int, ManagedParam] = {}
        self._empty: dict[torch.dtype, torch.Tensor] = {}
        self._rank_row: torch.Tensor | None = None  # [this rank], device data: set by shard()
        self._undo: list = []  # callables reverting attach()'s changes, in order
        self.pipeline: str | None = None  # set by zero.initialize

    # ------------------------------------------------------------ set-up
    def shard(self) -> None:
        """Every rank's parameters from rank 0's values, and this rank's shards."""
        if self.replicas == 1:
            self.group = self.process_group
            # the group the traced collectives name: groups.py says why not always this one
            self.group_name = collective_group(self.group).group_name
        else:
            self.group, self.group_name, self.replica_group_name = hybrid_groups(
                self.process_group, self._shard_ranks, self._replica_ranks)
        self.managed = [self._manage(name, p) for name, p in self._trainable]
        device = self._trainable[0][1].device if self._trainable else torch.device("lazy")
        self._rank_row = torch.tensor([self.rank]).to(device)
        self.by_param = {id(m.param): m for m in self.managed}

    def attach(self, model) -> None:
        for m in self.managed:
            p = m.param
            self._undo.append(lambda p=p, data=p.data: setattr(p, "data", data))
            if m.initial is not None:
                p.data = m.initial
                m.initial = None
            self._undo.append(p.register_post_accumulate_grad_hook(self._grad_ready).remove)
            if self.stage == 3 and m.sharded:
                p.data = self._placeholder(p)
        self._undo.append(model.register_forward_pre_hook(self._begin_step).remove)

    def detach(self) -> None:
        """Reverts attach(), last change first: the model as it was."""
        while self._undo:
            self._undo.pop()()

    def commit(self) -> None:
        self._undo.clear()  # it holds the parameters' old data

    def start_schedule(self) -> None:
        """With a memory_budget: measure the static schedule from the next step on (schedule.py)."""
        if self.memory_budget is not None:
            param_bytes = sum(m.numel * m.param.element_size() for m in self.managed if m.sharded)
            self.schedule = ProfiledSchedule(self, self.memory_budget, param_bytes)

    def zero_pipeline(self, reuse_bytes: int | None = None, prefetch_bytes: int | None = None) -> str:
        """lazy_mlir's pipeline with this engine's zero passes (before cse,
        which merges the constants they add); ``reuse_bytes``,
        ``prefetch_bytes``: instead of the engine's (a planned schedule's)."""
        import mlir_passes

        reuse = self.reuse_bytes if reuse_bytes is None else reuse_bytes
        prefetch = self.prefetch_bytes if prefetch_bytes is None else prefetch_bytes
        passes = [p.spec() for p in mlir_passes.parse_pipeline(config.current.pipeline)
                  if not p.name.startswith("zero-")]
        at = passes.index("cse") if "cse" in passes else len(passes)
        zero = ["zero-hoist-reduces",
                f"zero-reduce-grads{{all-to-all={str(self.reduce_scatter == 'all_to_all').lower()},"
                f"bucket-bytes={self.bucket_bytes}}}",
                f"zero-insert-gather{{regather={str(self.stage == 3).lower()},reuse-bytes={reuse}}}",
                f"zero-prefetch{{budget-bytes={prefetch},bucket-bytes={self.bucket_bytes}}}"]
        return ",".join(passes[:at] + zero + passes[at:])

    def optimized(self, m: ManagedParam) -> torch.Tensor:
        """The tensor the wrapped optimizer updates for ``m``: its host copy
        (offload), its shard, or the whole parameter."""
        return m.host if self.offload else m.shard if m.sharded else m.param

    def owned_shape(self, m: ManagedParam) -> list[int]:
        """Shape of the tensor the optimizer owns for ``m``: its flat shard, or the whole parameter."""
        return [ops.shard_size(m.numel, self.world)] if m.sharded else list(m.shape)

    def _manage(self, name: str, p: torch.nn.Parameter) -> ManagedParam:
        shape, numel = list(p.shape), p.numel()
        full = self._broadcast(p)  # every rank starts from rank 0's values
        if numel <= self.persistence_threshold:
            return ManagedParam(name, p, shape, numel, None, initial=full.to(p.device), host=self._host(full))
        size = ops.shard_size(numel, self.world)
        local = ops.flat_padded(full, self.world)[self.rank * size:(self.rank + 1) * size].clone()
        return ManagedParam(name, p, shape, numel, local.to(p.device),
                            initial=full.to(p.device) if self.stage < 3 else None, host=self._host(local))

    def _host(self, values: torch.Tensor) -> torch.Tensor | None:
        """With offload: a copy of ``values`` in host memory, for the optimizer."""
        return values.to("cpu", copy=True) if self.offload else None

    def _broadcast(self, p: torch.Tensor) -> torch.Tensor:
        full = p.detach().cpu().to(self.device).contiguous()
        dist.broadcast(full, src=dist.get_global_rank(self.process_group, 0), group=self.process_group)
        return full

    def _placeholder(self, like: torch.Tensor) -> torch.Tensor:
        """An empty tensor standing for a stage-3 parameter's data between uses:
        device data, so it never becomes a graph output."""
        if like.dtype not in self._empty:
            self._empty[like.dtype] = torch.empty(0, dtype=like.dtype).to(like.device)
        return self._empty[like.dtype]

    # ------------------------------------------------------ traced steps
    def _unshard(self, m: ManagedParam) -> torch.Tensor:
        return torch.ops.lazy_mlir.unshard(m.shard.detach(), m.shape, self.world, self.group_name)

    def _reduce(self, grad: torch.Tensor, m: ManagedParam) -> torch.Tensor:
        return torch.ops.lazy_mlir.reduce_grad(grad, self.world, self.group_name, m.sharded, self.replicas,
                                               self.replica_group_name)

    def _my_shard(self, m: ManagedParam) -> torch.Tensor:
        """A copy of this rank's shard of p (in-place updates of the shard
        must not write into p), selected by the device-data rank index."""
        size = ops.shard_size(m.numel, self.world)
        rows = ops.flat_padded(m.param.detach(), self.world).view(self.world, size)
        return rows.index_select(0, self._rank_row).view(size)

    def _begin_step(self, module, args):
        if self.schedule is not None:
            self.schedule.before_step()  # may switch self.pipeline
        self._use_pipeline()
        if self.stage == 3:
            for m in self.managed:
                if m.sharded:
                    m.param.data = self._unshard(m)

    def _use_pipeline(self) -> None:
        """The pass options are this engine's (stage, budget): switch them in
        if another engine in this process changed them (compiled graphs of
        both stay cached)."""
        if self.pipeline is not None and config.current.pipeline != self.pipeline:
            backend.init(**{**dataclasses.asdict(config.current), "pipeline": self.pipeline})

    def _grad_ready(self, p: torch.Tensor) -> None:
        m = self.by_param[id(p)]
        if not m.sharded:
            if self.stage > 1:
                p.grad = self._reduce(p.grad, m)
            return
        if self.stage == 1:
            return  # stage 1 reduces whole gradients at step()
        self._accumulate(m, self._reduce(p.grad, m))
        p.grad = None
        if self.stage == 3:
            p.data = self._placeholder(p)  # backward has what it needs in the trace

    def _accumulate(self, m: ManagedParam, reduced: torch.Tensor) -> None:
        m.grad_shard = reduced if m.grad_shard is None else m.grad_shard + reduced

    def before_step(self) -> None:
        if self.offload:
            return self._gradients_to_host()
        for m in self.managed:
            if self.stage == 1 and m.param.grad is not None:
                grad = self._reduce(m.param.grad, m)
                if m.sharded:
                    self._accumulate(m, grad)
                    m.param.grad = None
                else:
                    m.param.grad = grad
            if not m.sharded:
                continue
            if self.stage < 3:
                m.shard.data = self._my_shard(m)
            m.shard.grad = m.grad_shard

    def after_step(self) -> None:
        if self.offload:
            return self._parameters_from_host()
        for m in self.managed:
            if not m.sharded:
                continue
            m.shard.grad = None  # kept in grad_shard until zero_grad
            if self.stage < 3:
                m.param.data = self._unshard(m)
                m.shard.data = self._placeholder(m.shard)  # rebuilt from p at the next step

    def zero_grad(self) -> None:
        for m in self.managed:
            m.param.grad = None
            m.grad_shard = None
            if m.host is not None:
                m.host.grad = None

    # ------------------------------------------------- offload_optimizer
    def _gradients_to_host(self) -> None:
        """The step's graph runs here (a mark_step: forward, backward and the
        gradients' reductions), and each reduced gradient goes to its host
        copy's .grad, for the optimizer to update on the host."""
        torch._lazy.mark_step()
        for m in self.managed:
            grad = m.grad_shard if m.sharded else m.param.grad
            m.host.grad = None if grad is None else grad.to("cpu")

    def _parameters_from_host(self) -> None:
        """The updated host copies become the device's shards (and whole
        parameters): device data, read by the next step's graph."""
        for m in self.managed:
            m.host.grad = None
            values = m.host.detach().to(m.param.device, copy=True)
            if m.sharded:
                m.shard.data = values
            else:
                m.param.data = values

    # --------------------------------------------------------- reporting
    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in model.state_dict(keep_vars=True).items():
            m = self.by_param.get(id(t))
            if m is None or not m.sharded or self.stage < 3:
                out[name] = t.detach().cpu().clone()
                continue
            local = m.shard.detach().cpu().to(self.device).contiguous()
            gathered = torch.empty(local.numel() * self.world, dtype=local.dtype, device=self.device)
            dist.all_gather_into_tensor(gathered, local, group=self.group)
            out[name] = gathered[:m.numel].view(m.shape).to("cpu", copy=True)
        return out

    def memory_report(self, optimizer) -> dict[str, int]:
        def nbytes(t):
            return 0 if t is None else t.numel() * t.element_size()

        params = grads = full_params = 0
        for m in self.managed:
            params += nbytes(m.param) + nbytes(m.shard)
            grads += nbytes(m.param.grad) + nbytes(m.grad_shard)
            full_params += m.numel * m.param.element_size()
        owner = {id(self.optimized(m)): m for m in self.managed}
        state = full_state = 0
        for tensor, entry in optimizer.state.items():
            m = owner.get(id(tensor))
            for value in entry.values():
                if isinstance(value, torch.Tensor):
                    state += nbytes(value)
                    scale = m.numel / value.numel() if m is not None and m.sharded and value.dim() else 1
                    full_state += int(nbytes(value) * scale)
        # with offload the optimizer's state and host copies are in host memory, not the device's
        return {"params": params, "grads": grads, "optimizer": state, "total": params + grads + state,
                "unsharded_total": 2 * full_params + full_state, "world_size": self.world,
                "replicas": self.replicas, "optimizer_on_host": self.offload}
