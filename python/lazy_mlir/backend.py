"""``lazy_mlir.init()``: installs the backend for ``torch.device("lazy")``
(the TorchScript LTC backend wrapped by our C++ core, the trace-time
kernels and hooks, the compile hook), and ``wait_for_compiles()``.
The package's top: it may import every stage."""
from __future__ import annotations

import os

import torch  # noqa: F401 - loads libtorch before our extension
import torch._lazy
import torch._lazy.ts_backend

# The compiler (torch-mlir's MLIR libraries, the lowering, Inductor's
# compile_fx: ~100 MB) is imported by the first compile in this process
# (isolated_compile compiles in a worker, and cached code loads without it),
# lazy_mlir.zero (torch.distributed, MLIR) on first use, and init() imports
# the runtime (fused_optimizer, group_compiler), so that a process that only
# imports lazy_mlir (an eager baseline reading lazy_mlir.models) loads none.
from . import config
from .cluster import compilable
from .compile import background
from .native import _C
from .observe import dump, syncs
from .trace import (autocast, device_module, lazy_kernels, memory_budget, module_ties, moe_experts, steady_state,
                    step_errors, transformers_compat)


def init(level: str = "O1", **options) -> config.Config:
    """Install the lazy_mlir backend for ``torch.device("lazy")``.

    Can be called again to change the level or options; returns the config.
    ``device="cuda"`` backs the lazy device with the GPU ("cuda" is the default
    when torch sees one); the first call fixes the device for the process.
    """
    from .trace import fused_optimizer
    from .run import group_compiler

    cfg = config.Config(level=level, **options)
    cfg.validate()
    if cfg.dump_dir:  # a bad directory is an error here, not a surprise at the first compile
        dump.check_dir(cfg.dump_dir, "dump_dir" if "dump_dir" in options else "LAZY_MLIR_DUMP_DIR")
    _init_ts_backend(cfg.device)  # the TS backend must exist before we wrap it
    config.current = cfg
    # traced ops record their trace order (random draws keep it) and the user's frame
    _C.install_source_locations(list(syncs.INTERNAL_DIRS), record_frames=cfg.source_lines)
    # a value read mid-step that depends on a draw syncs the whole step
    # (value_reads.h), or the step would draw again
    _C.set_random_ops(sorted(compilable.RANDOM_OPS))
    device_module.install()  # torch.lazy: checkpointing's recompute draws the forward's numbers again
    autocast.install(cfg.device)  # torch.autocast("lazy"), with the backing device's cast policy
    _C.set_ltc_ir_debug(True)  # LTC calls the frame function only in IR-debug mode
    lazy_kernels.install()
    module_ties.install()
    step_errors.install()  # a failed step's stored error must not fail the next one
    # its optimizer hook first: an expert's None gradient is seen by steady_state's
    moe_experts.install()  # Switch's and NLLB-MoE's expert loops in one graph
    steady_state.install()  # auto_prepare's hooks
    transformers_compat.install()  # its mask decisions read no lazy value
    if cfg.fuse_optimizer:  # torch.optim.adam.adam stays torch's own until asked for
        fused_optimizer.install()  # Adam/AdamW steps as one traced node
    _C.set_hooks(compilable.classify, group_compiler.compile_group, syncs.on_execute)
    _C.set_native_calls(cfg.native_calls)
    _C.set_step_memory(cfg.step_memory)
    memory_budget.configure(cfg.memory_budget, cfg.device)
    _C.bound_computation_cache(cfg.memory_cache_entries)  # taken at the process's first step
    _C.install(config.LEVELS[cfg.level], f"{cfg.key()};policy={compilable.generation()}")
    return cfg


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Waits for the shape-generic compiles running in the background
    (``Config.background_compile``); False if ``timeout`` seconds passed
    first. Each group switches to its new code at its next run."""
    return background.wait(timeout)


def _init_ts_backend(device: str) -> None:
    """The TorchScript backend on ``device``. It reads LTC_TS_CUDA once, when
    it is created (its mere presence selects CUDA), and cannot be created twice."""
    if device_module.backing_device() is None:
        if device == "cuda":
            os.environ["LTC_TS_CUDA"] = "1"
        else:
            os.environ.pop("LTC_TS_CUDA", None)
        torch._lazy.ts_backend.init()
    backing = device_module.backing_device()
    if backing != device:
        raise RuntimeError(f"lazy_mlir.init(device={device!r}): the lazy device of this process is already backed "
                           f"by {backing} (the TorchScript backend fixes it when first initialised, by an earlier "
                           "init() or by torch._lazy.ts_backend.init() as LTC_TS_CUDA said); "
                           f"use device={backing!r} or a new process")
