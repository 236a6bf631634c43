"""ZeRO-1/2/3 on the lazy device, as MLIR passes (see engine.py and the
``zero-*`` passes in mlir_passes). Under torchrun, after
``torch.distributed.init_process_group``::

    lazy_mlir.init()
    model = Model().to("lazy")
    optimizer = torch.optim.AdamW(model.parameters(), ...)
    model, optimizer = lazy_mlir.zero.initialize(model, optimizer, stage=3)
    ... the ordinary lazy training loop ...
    state = lazy_mlir.zero.full_state_dict(model)   # collective
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .. import backend, config
from ..observe import metrics
from ..trace import fused_optimizer
from . import ops  # noqa: F401 - registers the marker ops
from .engine import ZeroEngine
from .groups import collective_device

__all__ = ["initialize", "full_state_dict", "memory_report", "comm_stats", "reset_comm_stats", "ZeroOptimizer"]

_ENGINE_ATTR = "_lazy_mlir_zero"


class ZeroOptimizer:
    """The user's optimizer rebuilt over the shards; ``step`` and
    ``zero_grad`` add what the stage needs around the inner optimizer."""

    def __init__(self, inner: torch.optim.Optimizer, engine: ZeroEngine):
        self.inner = inner
        self.engine = engine

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError("lazy_mlir.zero: optimizer.step(closure) is not supported")
        self.engine.before_step()
        self.inner.step()
        self.engine.after_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        self.engine.zero_grad()

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state as CPU tensors (for
        ``torch.save``), and the layout it belongs to (``"zero"``). It loads
        into an optimizer set up alike: same model, world size, rank and
        persistence threshold (the stage may differ: every stage shards the
        optimizer state the same way)."""
        inner = self.inner.state_dict()
        with torch.no_grad():  # copies: AdamW bumps its CPU "step" tensors in place
            state = {k: {name: v.to("cpu", copy=True) if isinstance(v, torch.Tensor) else v
                         for name, v in entry.items()} for k, entry in inner["state"].items()}
        return {"state": state, "param_groups": inner["param_groups"], "zero": self._layout()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads what ``state_dict()`` returned, on the same rank of a group
        of the same size; another layout is an error, not a silent mix of
        shards."""
        layout, expected = state_dict.get("zero"), self._layout()
        if layout != expected:
            raise ValueError(f"lazy_mlir.zero: this optimizer state was saved with layout {layout}, this "
                             f"optimizer has {expected} (world size, rank and the shards' shapes must match)")
        # clones: the inner optimizer keeps CPU "step" tensors as given and bumps them in place
        state = {k: {name: v.clone() if isinstance(v, torch.Tensor) else v for name, v in entry.items()}
                 for k, entry in state_dict["state"].items()}
        self.inner.load_state_dict({"state": state, "param_groups": state_dict["param_groups"]})

    def _layout(self) -> dict:
        # the shards' shapes, not their data's: in stages 1-2 a shard is empty between steps
        owner = {id(self.engine.optimized(m)): m for m in self.engine.managed}
        shapes = [self.engine.owned_shape(owner[id(p)]) for group in self.inner.param_groups for p in group["params"]]
        return {"world_size": self.engine.world, "rank": self.engine.rank, "shapes": shapes}


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, stage: int = 3, process_group=None,
               prefetch_bytes: int = 4 << 20, persistence_threshold: int = 0, reuse_bytes: int | None = None,
               bucket_bytes: int = 4 << 20, reduce_scatter: str = "auto", shard_group_size: int | None = None,
               memory_budget: int | None = None, offload_optimizer: bool = False):
    """Shard ``model``'s parameters, gradients and ``optimizer``'s state over
    ``process_group`` (default: the world) for ZeRO ``stage`` 1, 2 or 3.

    ``prefetch_bytes``: gathered parameter bytes that may be in flight ahead
    of their use; ``persistence_threshold``: parameters with at most this many
    elements stay whole on every rank (gradients all-reduced);
    ``reuse_bytes`` (stage 3; default ``prefetch_bytes``): a gathered
    parameter stays gathered until its next use when at most this many bytes
    of other parameters are used in between (the last layers, from forward
    into backward), instead of being gathered again; ``bucket_bytes``:
    gradient reductions, and gathers started at one point, are merged into
    collectives of up to this many bytes; ``reduce_scatter``: how
    gradient shards are reduced: ``"reduce_scatter_tensor"``,
    or ``"all_to_all"`` (each rank receives every rank's copy of its shard
    and adds them up: gloo's reduce-scatter is an all-reduce, twice the
    bytes); ``"auto"`` picks ``all_to_all`` on gloo;
    ``shard_group_size`` (hybrid sharding, FSDP2's HSDP): shard over blocks
    of this many consecutive ranks of the group (a machine's, under
    torchrun) and replicate across the blocks: gathers stay inside a block,
    gradients are reduce-scattered inside it and their shards all-reduced
    across blocks; the default shards over the whole group;
    ``memory_budget`` (stage 3): bytes the step's buffers may take at their
    peak (gathered parameters, activations, gradients before their
    reduction); given, the schedule is planned from measurements
    (zero/schedule.py): the static one's peak and step time are measured
    over the first steps, the headroom under the budget keeps more
    parameters gathered from forward into backward (one compile), the two
    take turns in blocks of steps, and the plan stays if it measured at
    least 3% faster within the budget, else the static schedule does
    (``metrics["zero_schedule"]`` says what was measured and chosen);
    ``offload_optimizer`` (stage 3, DeepSpeed's ZeRO-Offload): the
    optimizer's state, and a copy of this rank's shards it updates, live
    in host memory; ``optimizer.step()`` runs the step's graph
    (forward, backward, reductions), updates on the host and uploads the
    shards: the device holds shards, gradients and activations only.
    Returns ``(model, optimizer)``: the same model, and an optimizer of
    ``optimizer``'s class and hyper-parameters over the shards. Call before
    the first step.
    """
    if not dist.is_initialized():
        raise RuntimeError("lazy_mlir.zero: call torch.distributed.init_process_group first (run under torchrun)")
    group = process_group or dist.group.WORLD
    # All-or-nothing on every rank: local checks; if every rank passed them,
    # the collectives that compute the shards, then the changes to the model,
    # undone if anything failed on any rank.
    engine = failure = None
    try:
        if hasattr(model, _ENGINE_ATTR):
            raise RuntimeError("lazy_mlir.zero.initialize: this model is already initialized")
        if any(optimizer.state.values()):
            raise RuntimeError("lazy_mlir.zero.initialize: call it before the optimizer's first step")
        engine = ZeroEngine(model, stage, group, prefetch_bytes, persistence_threshold,
                            prefetch_bytes if reuse_bytes is None else reuse_bytes, bucket_bytes, reduce_scatter,
                            shard_group_size, memory_budget, offload_optimizer)
        if any(id(p) not in engine.trainable_ids for g in optimizer.param_groups for p in g["params"]):
            raise ValueError("lazy_mlir.zero.initialize: the optimizer holds a tensor that is not a "
                             "trainable parameter of the model")
    except Exception as exc:  # noqa: BLE001 - told to the other ranks, then raised
        failure = exc
    _agree(group, failure, "in its checks")

    saved_config = config.current
    done = False
    try:
        try:
            engine.shard()
            groups = []
            for g in optimizer.param_groups:
                managed = [engine.by_param[id(p)] for p in g["params"]]
                groups.append({**{k: v for k, v in g.items() if k != "params"},
                               "params": [engine.optimized(m) for m in managed]})
            inner = type(optimizer)(groups)  # each group carries all its hyper-parameters
            # per-tensor updates: with one fused node stage 3 ran 3-18% slower
            # (2026-11-27, zero_step.py, 3 paired rounds), and the unsharded
            # gradients' all-reduces left the all-to-all buckets
            fused_optimizer.exclude(inner)
            engine.attach(model)
            setattr(model, _ENGINE_ATTR, engine)
            _use_zero_pipeline(engine)
        except Exception as exc:  # noqa: BLE001 - told to the other ranks, then raised
            failure = exc
        _agree(group, failure, "while sharding")
        done = True
    finally:  # also on KeyboardInterrupt
        if not done:
            _roll_back(model, engine, saved_config)
    engine.commit()
    engine.start_schedule()
    return model, ZeroOptimizer(inner, engine)


def _agree(group, failure: Exception | None, when: str) -> None:
    """Raises on every rank when any rank of ``group`` failed: its own error,
    or one naming the ranks that failed (a rank that went on alone would
    wait forever in the first step's collectives)."""
    flags = torch.zeros(dist.get_world_size(group), dtype=torch.int32, device=collective_device(group))
    flags[dist.get_rank(group)] = int(failure is not None)
    try:
        dist.all_reduce(flags, group=group)
    except Exception:
        if failure is not None:
            raise failure  # this rank's own error says more than the collective's
        raise
    if failure is not None:
        raise failure
    failed = [r for r, flag in enumerate(flags.tolist()) if flag]
    if failed:
        raise RuntimeError(f"lazy_mlir.zero.initialize failed on rank(s) {failed} of the group {when}; "
                           "this rank's model and optimizer are unchanged")


def _roll_back(model, engine: ZeroEngine | None, saved_config) -> None:
    """The model, its hooks and lazy_mlir's configuration as before initialize()."""
    if engine is not None:
        engine.detach()
    if engine is not None and getattr(model, _ENGINE_ATTR, None) is engine:
        delattr(model, _ENGINE_ATTR)
    if config.current is not saved_config:  # _use_zero_pipeline installed the zero passes
        backend.init(**dataclasses.asdict(saved_config))


def _use_zero_pipeline(engine: ZeroEngine) -> None:
    """Install lazy_mlir's pipeline with the engine's zero passes."""
    engine.pipeline = engine.zero_pipeline()
    engine._use_pipeline()


def _engine(model) -> ZeroEngine:
    engine = getattr(model, _ENGINE_ATTR, None)
    if engine is None:
        raise ValueError("lazy_mlir.zero: this model was not set up with lazy_mlir.zero.initialize")
    return engine


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's full state as CPU tensors, on every rank (a collective:
    all ranks must call it)."""
    return _engine(model).full_state_dict(model)


def memory_report(model: torch.nn.Module, optimizer: ZeroOptimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state,
    and what one unsharded replica would hold (``unsharded_total``)."""
    return _engine(model).memory_report(optimizer.inner)


def comm_stats() -> dict[str, int]:
    """Bytes moved by this rank's compiled collectives since the last reset."""
    return metrics.collective_bytes()


def reset_comm_stats() -> None:
    metrics.reset_collective_bytes()
