"""User-visible configuration of lazy_mlir, set by ``lazy_mlir.init()``."""
from __future__ import annotations

import dataclasses
import os

import torch

LEVELS = {"O0": 0, "O1": 1, "O2": 2}
CODEGENS = ("inductor", "mlir-llvm")
DEVICES = ("cpu", "cuda")


@dataclasses.dataclass
class Config:
    # O0: TorchScript runs everything (the reference); O1: fusion groups of
    # compilable ops (default); O2: the whole step as one group, or an error.
    level: str = "O1"
    # The device behind torch.device("lazy"): "cpu" or "cuda"; LAZY_MLIR_DEVICE
    # sets it, else "cuda" when torch sees a GPU. Fixed for the process at the first init().
    device: str = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_DEVICE") or _default_device())
    # Where per-group IR dumps go (None: no dumps). LAZY_MLIR_DUMP_DIR sets it.
    dump_dir: str | None = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_DUMP_DIR"))
    # Kernel generator for compiled groups: "inductor" (C++ on CPU, Triton on GPU), or
    # "mlir-llvm" (MLIR's loops through LLVM, CPU only; groups it cannot lower use Inductor).
    codegen: str = "inductor"
    # MLIR pass pipeline run on every group (see mlir_passes); None: the default.
    pipeline: str | None = None
    # Record the user's source line of every traced op (for errors, warnings, dumps).
    source_lines: bool = True
    # Print a line to stderr when a group starts and ends compiling, and
    # every 30 s while a compile holds the step (cold compiles of a whole
    # training step take tens of seconds, a large model's minutes).
    progress: bool = True
    # At O2, an op that would run eagerly is an "error" naming the op and the
    # source line, or only a "warn"ing (the op then runs on the CPU).
    o2_fallback: str = "error"
    # The persistent compile cache (see compile_cache): on unless LAZY_MLIR_CACHE=0;
    # its folder (LAZY_MLIR_CACHE_DIR, else $XDG_CACHE_HOME/lazy_mlir or
    # ~/.cache/lazy_mlir) and its size bound (LAZY_MLIR_CACHE_MAX_MB, LRU).
    cache: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_CACHE", True))
    cache_dir: str = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_CACHE_DIR") or _default_cache_dir())
    cache_max_mb: int = dataclasses.field(default_factory=lambda: int(os.environ.get("LAZY_MLIR_CACHE_MAX_MB", "2048")))
    # How many compiled step graphs (LTC's computation cache) and compiled
    # groups (lazy_mlir's, served across graphs) this process keeps in memory,
    # each the most recently used: a loop that meets new shapes or new code
    # for ever holds no more (an evicted one is loaded again from the disk
    # cache, or compiled). LTC's part is fixed for the process at its first
    # step. LAZY_MLIR_MEMORY_CACHE_ENTRIES sets it.
    memory_cache_entries: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("LAZY_MLIR_MEMORY_CACHE_ENTRIES", "256")))
    # Also store Inductor's compiled artefact (else only the exported FX graph,
    # which Inductor's own cache compiles again in the next process).
    cache_inductor: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_CACHE_INDUCTOR", True))
    # Shape-generic groups ("automatic dynamic", see shape_generic): "auto"
    # compiles a group seen at a second size once more with symbolic sizes,
    # and serves later sizes from that code; "static" compiles every size
    # apart. LAZY_MLIR_DYNAMIC sets it.
    dynamic: str = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_DYNAMIC") or "auto")
    # At O1, a shape-generic compile (a group at a new size) runs on a worker
    # thread, and the group runs in TorchScript until its code is ready, instead
    # of the step waiting for the compile (see background). LAZY_MLIR_BACKGROUND_COMPILE=0 turns it off.
    background_compile: bool = dataclasses.field(
        default_factory=lambda: _env_flag("LAZY_MLIR_BACKGROUND_COMPILE", True))
    # Worker processes that generate code for a graph's groups beside this
    # process, when its first execution leaves several to compile (see
    # parallel_compile); 0: one after the other, in the step.
    # LAZY_MLIR_COMPILE_WORKERS sets it; the default is half the CPUs, at most 4.
    compile_workers: int = dataclasses.field(default_factory=lambda: int(
        os.environ.get("LAZY_MLIR_COMPILE_WORKERS") or default_compile_workers()))
    # Compile a static CPU group with the C++ wrapper in a worker process
    # (isolated_compile) and call the library it builds from C++ (with
    # native_calls on): the training process never loads torch-mlir or
    # Inductor's compiler (~100 MB of its peak). LAZY_MLIR_ISOLATED_COMPILE=0
    # compiles in this process.
    isolated_compile: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_ISOLATED_COMPILE", True))
    # Before a model's first training forward and an optimizer's first step,
    # do what lazy_mlir.prepare() does, so the first step traces (and
    # compiles) the steady-state graph (see steady_state). LAZY_MLIR_AUTO_PREPARE=0 turns it off.
    auto_prepare: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_AUTO_PREPARE", True))
    # "auto": the first module a training step calls with trainable lazy
    # parameters (the model) is captured as lazy_mlir.capture(model) does, its
    # forward and backward recorded once and replayed, where capture's guards
    # allow (a refusal, and why, is in lazy_mlir.metrics); "off": every call
    # traced op by op unless the user captures. LAZY_MLIR_CAPTURE=off turns it off.
    capture: str = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_CAPTURE") or "auto")
    # Buffer donation: parameters, gradients and optimizer state that a step
    # overwrites are written by the generated code into their own storage
    # when nothing else can read the old value (see lazy_mlir.codegen.donation and
    # lazy_backend/memory/buffer_donation.h). LAZY_MLIR_DONATE=0 turns it off.
    donate_buffers: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_DONATE", True))
    # Inductor's C++ wrapper (its cpp_wrapper option) around a group's CPU
    # kernels instead of the Python one: no Python per kernel call, buffer
    # allocation and size check at run time (~1 ms of a zoo model's step),
    # and a shorter cold compile (all the kernels one library, the wrapper
    # another at -O1: the Python wrapper builds one library per kernel). Groups with
    # collectives keep the Python wrapper (their issue order is checked on
    # its source); a group whose C++ wrapper fails to compile gets the
    # Python one, with a warning. LAZY_MLIR_CPP_WRAPPER=0 turns it off.
    cpp_wrapper: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_CPP_WRAPPER", True))
    # Call such a group's C++-wrapped code from C++, with no Python per call
    # (lazy_mlir.codegen.native_call); read at each init(), for every group.
    # LAZY_MLIR_NATIVE_CALLS=0 turns it off.
    native_calls: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_NATIVE_CALLS", True))
    # A budget for the process's memory (bytes, or a fraction of the device's:
    # RAM on the CPU) under which captured modules checkpoint their repeated
    # blocks (a transformer's layers), as many as measured steps show the
    # budget needs (trace/memory_budget.py; metrics["memory_budget"]).
    # None: no block checkpointed.
    memory_budget: int | float | None = None
    # Give the large CPU buffers compiled groups allocate (64 KiB and up) the
    # offsets of one arena planned from the last step when steps repeat, and
    # keep the others for the next step's same-sized ones, instead of glibc
    # unmapping them and the next step faulting fresh pages in
    # (runtime/step_memory.h: the arena holds about the step's peak).
    # LAZY_MLIR_STEP_MEMORY=0 turns it off.
    step_memory: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_STEP_MEMORY", True))
    # A CPU group's large float32 matrix products on oneDNN instead of MKL:
    # linears (forward, input gradient) on its inner product, weight
    # gradients and bmm on its matmul primitive (codegen/onednn_linear).
    # "auto": each product where oneDNN is measured faster on this machine;
    # "on": every one; "off": none (LAZY_MLIR_ONEDNN_LINEAR=auto, 1 or 0).
    onednn_linear: str = dataclasses.field(default_factory=lambda: _on_off_auto(
        os.environ.get("LAZY_MLIR_ONEDNN_LINEAR", "auto")))
    # On a GPU, replay a group's generated code as one CUDA graph from its
    # second run on (lazy_mlir.run.cuda_graphs): one launch instead of one per
    # kernel. LAZY_MLIR_CUDA_GRAPHS=0 turns it off.
    cuda_graphs: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_CUDA_GRAPHS", True))
    # Set by the backend on one fusion group's copy of the config, never by
    # users: the group inputs its code may write outputs into.
    donated_inputs: tuple = ()
    # Trace an Adam/AdamW (or SGD) step on the lazy device as one node per
    # parameter group instead of ~10 (SGD: ~3) ops per parameter (see
    # fused_optimizer; same math, float rounding aside): ~30% less trace and
    # LTC sync on GPT-mini, its generated code as fast or faster (docs/performance.md).
    # LAZY_MLIR_FUSE_OPTIMIZER=0 turns it off.
    fuse_optimizer: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_FUSE_OPTIMIZER", True))
    # A fusion group per repeated layer (lazy_mlir.cluster.layer_groups): "auto" for
    # models that skip layers at random (LayerDrop), "on" for every model,
    # "off" for none (LAZY_MLIR_LAYER_GROUPS=auto, 1 or 0).
    layer_groups: str = dataclasses.field(default_factory=lambda: _on_off_auto(
        os.environ.get("LAZY_MLIR_LAYER_GROUPS", "auto")))
    # Switch Transformers' and NLLB-MoE's expert loops run in static shapes
    # (lazy_mlir.trace.moe_experts), every expert called each step. True: an expert
    # that got no token has a None gradient, as eagerly (the optimizer skips
    # it), read before each optimizer step: two graph executions a step.
    # False: it keeps a zero gradient, as GShard-style MoE code gives it (the
    # optimizer updates it: weight decay, moments): one graph a step.
    # LAZY_MLIR_MOE_EAGER_GRADS=0 turns it off.
    moe_eager_grads: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_MOE_EAGER_GRADS", True))
    # The numerics checker (numerics_check): the first run of each group's new
    # code is also run in TorchScript on the same inputs and compared; a
    # group that disagrees is reported and runs in TorchScript. Off by
    # default (one TorchScript run per new code); LAZY_MLIR_CHECK=1 turns it on.
    check: bool = dataclasses.field(default_factory=lambda: _env_flag("LAZY_MLIR_CHECK", False))
    # Warn when one group (its ops and source lines) has compiled more variants than this.
    recompile_limit: int = 8
    # Comma-separated log topics for stderr; "recompiles" explains each compile
    # after a group's first as it happens. LAZY_MLIR_LOG sets it.
    log: str = dataclasses.field(default_factory=lambda: os.environ.get("LAZY_MLIR_LOG", ""))

    # Fields that do not change compiled code (so not part of key()).
    _NOT_IN_KEY = ("dump_dir", "source_lines", "progress", "o2_fallback", "cache", "cache_dir",
                   "cache_max_mb", "memory_cache_entries", "cache_inductor", "recompile_limit", "log", "dynamic", "background_compile",
                   "compile_workers", "isolated_compile", "auto_prepare", "capture", "fuse_optimizer",
                   "native_calls", "cuda_graphs", "step_memory", "layer_groups", "moe_eager_grads", "check",
                   "memory_budget")

    def key(self) -> str:
        """Names every option that changes compiled code: the backend
        recompiles cached graphs when it changes. Passes count by their
        source, so editing a pass also changes the key."""
        import mlir_passes
        fields = dataclasses.asdict(self)
        fields["pipeline"] = mlir_passes.light_pipeline_id(self.pipeline) or mlir_passes.pipeline_id(self.pipeline)
        return ";".join(f"{k}={v}" for k, v in sorted(fields.items()) if k not in self._NOT_IN_KEY)

    def __post_init__(self):
        if self.pipeline is None:
            import mlir_passes
            self.pipeline = mlir_passes.DEFAULT_PIPELINE

    def validate(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"lazy_mlir: level must be one of {sorted(LEVELS)}, got {self.level!r}")
        if self.o2_fallback not in ("error", "warn"):
            raise ValueError(f"lazy_mlir: o2_fallback must be 'error' or 'warn', got {self.o2_fallback!r}")
        if self.device not in DEVICES:
            raise ValueError(f"lazy_mlir: device must be one of {DEVICES}, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            why = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no GPU"
            raise RuntimeError(f"lazy_mlir: device='cuda', but {why} (torch.cuda.is_available() is False); "
                               "use device='cpu', or set up on a machine with an NVIDIA GPU (make setup "
                               "installs the CUDA build of torch there)")
        if self.onednn_linear not in ONEDNN_CHOICES:
            raise ValueError(f"lazy_mlir: onednn_linear must be one of {ONEDNN_CHOICES}, got {self.onednn_linear!r}")
        if self.layer_groups not in LAYER_GROUP_CHOICES:
            raise ValueError(f"lazy_mlir: layer_groups must be one of {LAYER_GROUP_CHOICES}, got {self.layer_groups!r}")
        if self.capture not in ("auto", "off"):
            raise ValueError(f"lazy_mlir: capture must be 'auto' or 'off', got {self.capture!r}")
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or budget <= 0 or (isinstance(budget, float) and budget > 1)):
            raise ValueError("lazy_mlir: memory_budget must be a number of bytes (an int) or a fraction of the "
                             f"device's memory in (0, 1] (a float), got {budget!r}")
        if self.dynamic not in ("auto", "static"):
            raise ValueError(f"lazy_mlir: dynamic must be 'auto' or 'static', got {self.dynamic!r}")
        if self.codegen not in CODEGENS:
            raise ValueError(f"lazy_mlir: codegen must be one of {CODEGENS}, got {self.codegen!r}")
        if self.donated_inputs:
            raise ValueError("lazy_mlir: donated_inputs is set per fusion group by the backend, not by init()")
        if self.compile_workers < 0:
            raise ValueError(f"lazy_mlir: compile_workers must be 0 or more, got {self.compile_workers!r}")
        if self.cache_max_mb <= 0:
            raise ValueError(f"lazy_mlir: cache_max_mb must be positive, got {self.cache_max_mb!r}")
        if self.memory_cache_entries <= 0:
            raise ValueError(f"lazy_mlir: memory_cache_entries must be positive, got {self.memory_cache_entries!r}")
        import mlir_passes
        if mlir_passes.light_pipeline_id(self.pipeline) is None:  # else every flag names a pass module
            mlir_passes.parse_pipeline(self.pipeline)  # unknown passes fail here, not at first compile

    def logs(self, topic: str) -> bool:
        return topic in {t.strip() for t in self.log.split(",")}


ONEDNN_CHOICES = LAYER_GROUP_CHOICES = ("auto", "on", "off")


def _on_off_auto(value: str) -> str:
    value = value.strip().lower()
    return {"": "auto", "1": "on", "true": "on", "0": "off", "false": "off", "no": "off"}.get(value, value)


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "off", "no")


def default_compile_workers() -> int:
    """Half the CPUs, at most 4: each worker and this process take a core."""
    return min(4, (os.cpu_count() or 1) // 2)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_cache_dir() -> str:
    """$XDG_CACHE_HOME/lazy_mlir, else ~/.cache/lazy_mlir."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lazy_mlir")


current = Config()
