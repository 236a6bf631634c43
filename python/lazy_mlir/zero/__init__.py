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

from . import ops  # noqa: F401 - registers the marker ops
from .engine import ZeroEngine

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

    def state_dict(self):
        """This rank's (sharded) optimizer state."""
        return self.inner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.inner.load_state_dict(state_dict)


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, stage: int = 3, process_group=None,
               prefetch_bytes: int = 4 << 20, persistence_threshold: int = 0, reuse_bytes: int | None = None,
               bucket_bytes: int = 4 << 20, reduce_scatter: str = "auto"):
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
    gradient shards are reduced (stages 2-3): ``"reduce_scatter_tensor"``,
    or ``"all_to_all"`` (each rank receives every rank's copy of its shard
    and adds them up: gloo's reduce-scatter is an all-reduce, twice the
    bytes); ``"auto"`` picks ``all_to_all`` on gloo.
    Returns ``(model, optimizer)``: the same model, and an optimizer of
    ``optimizer``'s class and hyper-parameters over the shards. Call before
    the first step.
    """
    if hasattr(model, _ENGINE_ATTR):
        raise RuntimeError("lazy_mlir.zero.initialize: this model is already initialized")
    if any(optimizer.state.values()):
        raise RuntimeError("lazy_mlir.zero.initialize: call it before the optimizer's first step")
    engine = ZeroEngine(model, stage, process_group, prefetch_bytes, persistence_threshold,
                        prefetch_bytes if reuse_bytes is None else reuse_bytes, bucket_bytes, reduce_scatter)
    by_param = engine.by_param
    groups = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            m = by_param.get(id(p))
            if m is None:
                raise ValueError("lazy_mlir.zero.initialize: the optimizer holds a tensor that is not a "
                                 "trainable parameter of the model")
            params.append(m.shard if m.sharded else m.param)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    inner = type(optimizer)(groups)  # each group carries all its hyper-parameters
    setattr(model, _ENGINE_ATTR, engine)
    _use_zero_pipeline(engine)
    return model, ZeroOptimizer(inner, engine)


def _use_zero_pipeline(engine: ZeroEngine) -> None:
    """Install lazy_mlir's pipeline with the engine's zero passes (before cse,
    which merges the constants they add)."""
    import mlir_passes
    from lazy_mlir import config

    passes = [p.spec() for p in mlir_passes.parse_pipeline(config.current.pipeline) if not p.name.startswith("zero-")]
    at = passes.index("cse") if "cse" in passes else len(passes)
    zero = ["zero-hoist-reduces",
            f"zero-reduce-grads{{all-reduce={str(engine.stage == 1).lower()},"
            f"all-to-all={str(engine.stage > 1 and engine.reduce_scatter == 'all_to_all').lower()},"
            f"bucket-bytes={engine.bucket_bytes}}}",
            f"zero-insert-gather{{regather={str(engine.stage == 3).lower()},reuse-bytes={engine.reuse_bytes}}}",
            f"zero-prefetch{{budget-bytes={engine.prefetch_bytes},bucket-bytes={engine.bucket_bytes}}}"]
    engine.pipeline = ",".join(passes[:at] + zero + passes[at:])
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
    from lazy_mlir import metrics
    return metrics.collective_bytes()


def reset_comm_stats() -> None:
    from lazy_mlir import metrics
    metrics.reset_collective_bytes()
