"""A lazy_mlir benchmark row: its step time split into parts, the check that
it timed compiled code, and the device its eager baselines run on.

The split (milliseconds, each the median over the timed steps; a step's
parts add up to its time, their medians need not add up to the median step):

    trace    step start to mark_step's entry: the user's forward, backward
             and optimizer step run in Python while LTC records the graph
    ltc      inside mark_step, neither compiling nor executing: LTC's sync
             (hashing the graph, its cache lookup, a miss's lowering to
             TorchScript, the data handles of inputs and outputs)
    compile  LTC graph compiles (lazy_mlir's clustering and group binding)
             plus group builds (TS -> FX -> MLIR -> Inductor, at a group's
             first run); 0 once the step is warm
    glue     executing the graph outside compiled groups: the TorchScript
             interpreter around the groups' calls
    kernels  inside compiled groups: the generated code with its Python
             call wrapper
    read     after mark_step: reading the loss (its data is there already)
"""
from __future__ import annotations

import statistics
import time

SPLIT = ("trace", "ltc", "compile", "glue", "kernels", "read")
SPLIT_HEADER = "".join(f"{name:>8}" for name in SPLIT)


# The torch.compile rows every benchmark reports, and a row's ratios to
# eager and to each of them.
COMPILE_ROWS = ("compile_model", "compile_model_opt")
RATIO_COLUMNS = f"{'/eager':>8}{'/c.model':>9}{'/c.m+opt':>9}"


def ratio_cells(ms: float, ok: dict[str, dict]) -> str:
    """``ms`` over eager's and each torch.compile row's ms/step (``ok``: the
    rows that did not fail, by variant)."""
    bases = [ok.get(v, {}).get("ms_per_step") for v in ("eager", *COMPILE_ROWS)]
    return "".join(f"{ms / base if base else float('nan'):>{w}.2f}" for base, w in zip(bases, (8, 9, 9)))


def backing_device() -> str:
    """The device behind torch.device("lazy") (lazy_mlir's Config.device): the
    eager and torch.compile baselines run there, so that rows compare."""
    from lazy_mlir.config import Config
    return Config().device


class StepSplit:
    """Times the parts of lazy steps. Per step: ``begin()`` before the step's
    clock starts, ``mark_step()`` in place of torch._lazy.mark_step(),
    ``end(start)`` after the clock stops (``start``: its perf_counter() value).
    Metrics must not be reset between begin() and end()."""

    def __init__(self):
        from lazy_mlir import metrics
        self._metrics = metrics
        self.steps: list[dict[str, float]] = []

    def begin(self) -> None:
        self._before = self._metrics.snapshot()["seconds"]

    def mark_step(self) -> None:
        import torch._lazy
        self._entry = time.perf_counter()
        torch._lazy.mark_step()
        self._exit = time.perf_counter()

    def end(self, start: float) -> None:
        stop = time.perf_counter()
        after = self._metrics.snapshot()["seconds"]
        d = {k: after[k] - self._before.get(k, 0.0) for k in after}
        self.steps.append({
            "trace": self._entry - start,
            "ltc": self._exit - self._entry - d["compile"] - d["execute"],
            "compile": d["compile"] + d["group_build"],
            "glue": d["execute"] - d["group_run"],
            "kernels": d["group_run"] - d["group_build"],
            "read": stop - self._exit,
        })

    def medians_ms(self, skip: int) -> dict[str, float]:
        """Per part, the median over the steps after the first ``skip``."""
        timed = self.steps[skip:]
        return {part: statistics.median(s[part] for s in timed) * 1000 for part in SPLIT}


def split_cells(split: dict[str, float] | None) -> str:
    """The split's columns of a table row (blank for a row without one)."""
    if not split:
        return " " * len(SPLIT_HEADER)
    return "".join(f"{split[part]:>8.1f}" for part in SPLIT)


def not_compiled(s: dict, level: str) -> str | None:
    """Why a lazy_mlir row at ``level`` did not time compiled code over the
    steps since metrics.reset() (``s``: metrics.snapshot()); None when it
    did. O0 runs everything in TorchScript by design and is not checked."""
    if level == "O0":
        return None
    if s["groups_fallen_back"]:
        name, why = next(iter(s["groups_fallen_back"].items()))
        # "[its ops] ExcType: message ... help text": the error's first line, not the ops or the help
        error = why.split("] ", 1)[1] if why.startswith("[") and "] " in why else why
        first = next((line.strip() for line in error.splitlines() if line.strip()), error)
        return f"{len(s['groups_fallen_back'])} group(s) ran in TorchScript, e.g. {name}: {first[:200]}"
    if s["compiled_group_calls"] <= 0:
        return "no group ran generated code"
    if s["fallback_count"]:
        return "eager fallbacks: " + ", ".join(f"{op} x{n}" for op, n in s["fallbacks"].items())
    if s["cuda_graph_refusals"]:  # on a GPU: code that was to be replayed launched kernel by kernel
        name, why = next(iter(s["cuda_graph_refusals"].items()))
        return f"{len(s['cuda_graph_refusals'])} group(s) not replayed as CUDA graphs, e.g. {name}: {why[:200]}"
    return None


def not_captured(s: dict, steps: int) -> str | None:
    """Why a row with its model captured (lazy_mlir.capture) did not replay
    every timed step's forward (``s``: metrics.snapshot() over those steps)."""
    if s["capture_refused"]:
        return f"the forward ran op by op: {s['capture_refusals']}"
    if s["captured_calls"] != steps:
        return f"{s['captured_calls']} of {steps} forwards replayed"
    return None


class GeneratedCodeClock:
    """Time spent in Inductor-generated code, for any row that runs some
    (torch.compile's and lazy_mlir's alike): ``graph`` inside compiled graph
    calls (the generated wrapper with its kernels), ``matmul`` in the
    extern GEMM calls among them (mm, addmm, bmm) when the wrapper is Python:
    a C++ wrapper (lazy_mlir's Config.cpp_wrapper, on by default) calls them
    without Python, and take_turns reports nan. Wraps those entry points
    for the whole process, and adds the time of lazy_mlir's calls into its
    code from C++ (native_call: no Python entry point to wrap) and of its
    CUDA graph replays (cuda_graphs, with the copies in and out); ``take()``
    returns and clears the seconds since the last take."""

    def __init__(self):
        from torch._inductor import output_code
        from torch._inductor.select_algorithm import extern_kernels
        from lazy_mlir import cuda_graphs
        self.seconds = {"graph": 0.0, "matmul": 0.0}
        self._native_ns = _native_ns()
        self._wrap(output_code.CompiledFxGraph, "__call__", "graph")
        self._wrap(cuda_graphs.GraphedCode, "__call__", "graph")
        for name in ("mm", "addmm", "bmm"):
            self._wrap(extern_kernels, name, "matmul")

    def _wrap(self, owner, name: str, part: str) -> None:
        original = getattr(owner, name)
        seconds = self.seconds

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        native_ns, self._native_ns = self._native_ns, _native_ns()
        self.seconds["graph"] += (self._native_ns - native_ns) / 1e9
        taken = dict(self.seconds)
        for part in self.seconds:
            self.seconds[part] = 0.0
        return taken


def _native_ns() -> int:
    from lazy_mlir import _C
    return _C.stats()["native_ns"]


PAIRED_PARTS = ("graph", "matmul", "outside")


def take_turns(rows: dict, batches: list, warmup: int, block: int = 1) -> dict[str, dict]:
    """Runs ``rows`` (name -> step(batch) returning the loss) in this process,
    taking turns so that machine drift hits them alike: with ``block`` 1
    one step of each per batch; with ``block`` k each row runs k batches in
    a row, and the first step of each turn, which follows another row's
    steps (its caches evicted, its memory handed out), is not timed: the
    steps timed are then those of a process that trains one model, as a
    user's does. Per row: ``ms_per_step``, the medians of PAIRED_PARTS in
    ``paired_ms`` (GeneratedCodeClock's parts; ``outside`` is the rest of the
    step), first step seconds and the losses. lazy_mlir's metrics are reset
    once the warm-up steps are done."""
    from lazy_mlir import metrics
    clock = GeneratedCodeClock()
    parts = {name: [] for name in rows}
    losses = {name: [] for name in rows}
    if warmup % block:
        raise SystemExit(f"--block {block} must divide --warmup {warmup} (the metrics restart at a turn)")
    for first in range(0, len(batches), block):
        turn = batches[first:first + block]
        if first == warmup:
            metrics.reset()
        for name, step in rows.items():
            for k, batch in enumerate(turn):
                clock.take()
                start = time.perf_counter()
                losses[name].append(step(batch))
                total = time.perf_counter() - start
                taken = clock.take()
                timed = block == 1 or k > 0
                parts[name].append({"step": total, **taken, "outside": total - taken["graph"], "timed": timed})
    results = {}
    for name in rows:
        timed = [p for p in parts[name][warmup:] if p["timed"]]
        paired = {k: statistics.median(p[k] for p in timed) * 1000 for k in PAIRED_PARTS}
        if paired["graph"] > 0 and not any(p["matmul"] for p in timed):  # a C++ wrapper: GEMMs out of sight
            paired["matmul"] = float("nan")
        results[name] = {"ms_per_step": statistics.median(p["step"] for p in timed) * 1000, "paired_ms": paired,
                         "first_step_s": parts[name][0]["step"], "losses": losses[name],
                         "final_loss": losses[name][-1]}
    return results
