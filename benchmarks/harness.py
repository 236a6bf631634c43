"""The benchmarks' shared harness: how a row is run, timed, checked and printed.

The rules every script follows (benchmarks/README.md):

- a process per row: a variant runs in a fresh process (``run_child``; the
  child prints its result with ``emit``), with its own torch state (one lazy
  backend per process, Dynamo's caches) and its own peak RSS; a row that
  must compile cold gets empty cache folders (``empty_caches``, ``cache_env``);
- pairing: separate processes drift 10-30% apart on these machines, so the
  rows of one comparison run in one invocation, interleaved round by round
  (``run_rounds``, the median round kept: ``pick_round``), or in one
  process taking turns on the same batches (``take_turns``: step by step or
  in warm blocks; ``run_in_turns``: each variant warmed up, then turns);
- medians after warm-up: ``time_steps`` times each step, ``median_ms`` is
  the median of those after the warm-up;
- FAILED: a row that failed, or a lazy_mlir row whose timed steps did not
  all run generated code (``check_lazy``: a group in TorchScript, an eager
  fallback, no compiled group call; a captured model that did not replay),
  prints FAILED and why instead of a figure (``Table``, ``turn_rows``), and
  the script exits 1 (``exit_if_failed``);
- the step split: ``StepSplit`` cuts a lazy step into trace / ltc /
  compile / glue / kernels / read (defined below);
- the torch.compile baselines: a row compiling the whole step runs in each
  of torch.compile's modes (``COMPILE_MODES``; reduce-overhead on CUDA
  only, FAILED elsewhere: ``mode_refused``), and the tables quote every row
  against the fastest torch.compile row (/best c.: ``ratio_cols``,
  ``best_line``).

Nothing here imports torch or lazy_mlir at import time: ``--help`` and the
parent processes stay light.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

NAN = float("nan")

# ---------------------------------------------------------------------------
# A row in a fresh process


def run_child(script: str, args: list[str], env: dict | None = None) -> dict:
    """``script args`` in a fresh process (``env`` added to ours): the JSON
    it printed last on stdout (``emit``), or {"failed": reason} when it
    exited non-zero (the reason: its last line on stderr). Its stderr,
    warnings included, streams through."""
    tail: collections.deque[str] = collections.deque(maxlen=1)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, script, *args], stdout=out, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.strip())
        proc.wait()
        out.seek(0)
        lines = out.read().strip().splitlines()
    if proc.returncode != 0:
        why = tail[0] if tail else "no error message"
        if proc.returncode < 0:
            why = f"killed by signal {-proc.returncode} ({why})"
        return {"failed": why[:300]}
    return json.loads(lines[-1])


def emit(result: Any) -> None:
    """The child's side of ``run_child``: its result, as JSON on the last line
    of stdout."""
    print(json.dumps(result))


def cache_env(lazy_mlir: str | None, inductor: str | None = None) -> dict[str, str]:
    """Environment for ``run_child``: lazy_mlir's compile cache and
    Inductor's in these folders (None: the user's own)."""
    env = {}
    if lazy_mlir is not None:
        env["LAZY_MLIR_CACHE_DIR"] = lazy_mlir
    if inductor is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor
    return env


@contextlib.contextmanager
def empty_caches(prefix: str = "lazy_mlir_bench_", inductor: bool = True):
    """``cache_env`` of empty folders made for one row, removed after it: the
    row compiles cold (``inductor`` False: only lazy_mlir's cache is empty)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield cache_env(os.path.join(folder, "lazy_mlir"), os.path.join(folder, "inductor") if inductor else None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def torchrun(script: str, nproc: int, args: list[str], env: dict | None = None) -> int:
    """``script args`` on ``nproc`` local ranks under torch.distributed.run;
    its exit status. A rank killed by a signal prints every thread's stack
    (PYTHONFAULTHANDLER)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           os.path.abspath(script), *args]
    return subprocess.run(cmd, env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}).returncode


# ---------------------------------------------------------------------------
# Interleaved rounds


def run_rounds(rounds: int, keys: Iterable, run: Callable[[Any], dict], label: Callable[[Any], str] = str,
               once: Collection = (), pick: Callable[[list[dict]], dict] | None = None) -> dict:
    """``run(key)`` for every key, round after round, so that machine drift
    hits the keys alike: per key, its results in order, or with ``pick``
    (e.g. ``pick_round``) the one it picks. Keys in ``once`` run in the
    first round only (a baseline too slow to repeat)."""
    keys = list(keys)
    runs: dict[Any, list[dict]] = {}
    for round_ in range(rounds):
        for key in keys:
            if round_ and key in once:
                continue
            print(f"round {round_ + 1}: {label(key)} ...", file=sys.stderr, flush=True)
            runs.setdefault(key, []).append(run(key))
    return {k: pick(rs) for k, rs in runs.items()} if pick else runs


def pick_round(rounds: list[dict]) -> dict:
    """A variant's result over interleaved rounds: a failed round if any (a
    lucky round does not hide a failure), else the round with the median
    step time (``ms_per_step``)."""
    bad = [r for r in rounds if "failed" in r]
    return bad[0] if bad else sorted(rounds, key=lambda r: r["ms_per_step"])[len(rounds) // 2]


# ---------------------------------------------------------------------------
# Timing


def time_steps(step: Callable[[Any], Any], batches: Iterable, warmup: int = 0, split: StepSplit | None = None,
               at_warmup: Callable[[], None] | None = None) -> tuple[list[float], list]:
    """Runs ``step(batch)`` per batch: (seconds of each step, what each
    returned). ``at_warmup`` runs before the first timed step (the one at
    index ``warmup``; e.g. lazy_mlir.metrics.reset). With a ``split``, each
    step's parts are timed too (``step`` must then call split.mark_step)."""
    seconds, outputs = [], []
    for i, batch in enumerate(batches):
        if i == warmup and at_warmup:
            at_warmup()
        if split:
            split.begin()
        start = time.perf_counter()
        outputs.append(step(batch))
        seconds.append(time.perf_counter() - start)
        if split:
            split.end(start)
    return seconds, outputs


def median_ms(seconds: list[float], warmup: int = 0) -> float:
    """The median step in milliseconds, over the steps after ``warmup``."""
    return statistics.median(seconds[warmup:]) * 1000


def excess_s(seconds: Iterable[float], steady_s: float) -> float:
    """Seconds spent above a steady step's (compiles, in the first steps)."""
    return sum(max(0.0, t - steady_s) for t in seconds)


# ---------------------------------------------------------------------------
# The FAILED rule: did a lazy_mlir row time compiled code?


def not_compiled(s: dict, level: str = "O1") -> str | None:
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


def check_lazy(level: str = "O1", captured_steps: int | None = None, snapshot: dict | None = None) -> str | None:
    """Why a lazy_mlir row's steps since lazy_mlir.metrics.reset() did not
    all run generated code (``not_compiled``) or, for a captured model
    (``captured_steps``: that many timed steps), did not replay its forward
    each step (``not_captured``); None when they did. ``snapshot``:
    lazy_mlir.metrics.snapshot() by default."""
    if snapshot is None:
        import lazy_mlir
        snapshot = lazy_mlir.metrics.snapshot()
    return not_compiled(snapshot, level) or (
        not_captured(snapshot, captured_steps) if captured_steps is not None else None)


def first_failure(snapshots: list[dict]) -> str | None:
    """Why a lazy variant's timed steps (a metrics.snapshot() each, since a
    reset at the step's start) did not all run compiled code at O1 (none
    still interpreting a group while it compiles), or None."""
    for s in snapshots:
        why = not_compiled(s, "O1") or (s["interpreted_group_calls"] and "groups ran in TorchScript while compiling")
        if why:
            return why
    return None


def exit_if_failed(failed: dict[str, str]) -> None:
    """Ends the benchmark with status 1, naming each failed variant and why."""
    if not failed:
        return
    print("\nFAILED variants (no figure printed for them):", file=sys.stderr)
    for name, why in failed.items():
        print(f"  {name}: {why}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------
# Tables


@dataclass
class Col:
    """A table column: ``header`` right-aligned in ``width``; a row's cell is
    ``value`` (a key of the row's result, or a function of it) in ``fmt``.
    A None value leaves the cell blank; a string is printed as it is."""
    header: str
    width: int
    value: str | Callable[[dict], Any]
    fmt: str = ".1f"

    def head(self) -> str:
        return f"{self.header:>{self.width}}"

    def cell(self, r: dict) -> str:
        v = self.value(r) if callable(self.value) else r.get(self.value)
        if v is None:
            return " " * self.width
        return f"{v:>{self.width}}" if isinstance(v, str) else f"{v:>{self.width}{self.fmt}}"


class Table:
    """Rows of results: the names left-aligned (``names``: (header, width)
    each), then ``cols``. A result with "failed" prints FAILED and why,
    never a figure, and is kept in ``failed`` (a dict that can be shared
    between tables) for ``exit_if_failed``."""

    def __init__(self, cols: list[Col], names: tuple = (("variant", 14),), failed: dict | None = None):
        self.cols, self.names = cols, names
        self.failed = {} if failed is None else failed

    def header(self) -> None:
        print("".join(f"{h:<{w}}" for h, w in self.names) + "".join(c.head() for c in self.cols))

    def row(self, r: dict, *names: str, extra: str = "") -> bool:
        """Prints ``r``'s row (``extra`` after its cells); False if it failed."""
        label = "".join(f"{n:<{w}}" for n, (_, w) in zip(names, self.names))
        if "failed" in r:
            self.failed[" ".join(names)] = r["failed"]
            print(f"{label}  FAILED: {r['failed']}")
            return False
        print(label + "".join(c.cell(r) for c in self.cols) + extra)
        return True

    def print(self, results: dict[str, dict]) -> None:
        self.header()
        for name, r in results.items():
            self.row(r, name)


def ok_rows(results: dict) -> dict:
    """The results that did not fail."""
    return {k: r for k, r in results.items() if "failed" not in r}


def ratio_col(ok: dict, base: str, header: str, width: int, key: str = "ms_per_step") -> Col:
    """A row's ``key`` over row ``base``'s (nan when ``base`` failed or is
    missing; ``ok``: the rows that did not fail)."""
    b = ok.get(base, {}).get(key)
    return Col(header, width, lambda r: r[key] / b if b else NAN, ".2f")


def print_loss_diffs(ok: dict, base: str, width: int, key: str = "losses") -> None:
    """Each row's largest loss difference to row ``base``'s, step by step."""
    if base in ok:
        for name, r in ok.items():
            diff = max(abs(a - b) for a, b in zip(ok[base][key], r[key]))
            print(f"  max |loss - {base} loss| {name:<{width}} {diff:.2e}")


def backing_device() -> str:
    """The device behind torch.device("lazy") (lazy_mlir's Config.device): the
    eager and torch.compile baselines run there, so that rows compare."""
    from lazy_mlir.config import Config
    return Config().device


# ---------------------------------------------------------------------------
# The torch.compile rows
#
# The baselines: torch.compile(model) with the optimizer step eager
# (compile_model), torch.compile(model) with torch.compile(optimizer.step)
# (compile_model_opt; models.py also compile_loss_opt, the loss function
# compiled with the model), FSDP2 compiled (zero_step's fsdp2_compiled). A
# row that compiles the whole step runs in torch.compile's default mode and,
# as rows of their own (``in_modes``), in each mode of COMPILE_MODES, named
# by its suffix. The tables quote every row against the fastest of them that
# did not fail (``best_compile``, the /best c. column) and name it
# (``best_line``), beside the older ratios to eager and to the default-mode
# rows (``ratio_cols``).

# a row name's suffix -> torch.compile's mode (no suffix: the default mode)
COMPILE_MODES = {"max_autotune": "max-autotune-no-cudagraphs", "reduce_overhead": "reduce-overhead"}
# the modes that need CUDA, and why: a row in one of them is not offered on
# another device, and FAILED when asked for (``mode_refused``)
CUDA_ONLY_MODES = {"reduce-overhead": "reduce-overhead uses CUDA graphs: CUDA only"}
# the names of the torch.compile rows start with one of these
COMPILE_PREFIXES = ("compile_", "fsdp2_compiled")


def in_modes(base: str) -> tuple[str, ...]:
    """Row ``base`` (default mode) and its rows in each of COMPILE_MODES:
    compile_model_opt, compile_model_opt_max_autotune, ..."""
    return (base, *(f"{base}_{suffix}" for suffix in COMPILE_MODES))


def compile_mode(row: str) -> str | None:
    """torch.compile's mode for ``row``, from its name's suffix (None: the
    default mode)."""
    return next((mode for suffix, mode in COMPILE_MODES.items() if row.endswith("_" + suffix)), None)


def is_compile_row(row: str) -> bool:
    """Whether ``row`` is a torch.compile baseline (a /best c. candidate)."""
    return row.startswith(COMPILE_PREFIXES)


def mode_refused(row: str, device: str) -> str | None:
    """Why ``row``'s mode cannot run on ``device`` (reduce-overhead off
    CUDA), or None: the reason a FAILED row gives."""
    why = CUDA_ONLY_MODES.get(compile_mode(row))
    return f"{why} (the rows run on {device})" if why and not device.startswith("cuda") else None


def runnable(rows: Iterable[str], device: str) -> list[str]:
    """``rows`` less those whose mode ``device`` cannot run: the rows a
    script offers by default."""
    return [r for r in rows if not mode_refused(r, device)]


def compile_fn(row: str, device: str) -> Callable:
    """torch.compile in ``row``'s mode (``compile_mode``); RuntimeError when
    ``device`` cannot run that mode (``mode_refused``)."""
    why = mode_refused(row, device)
    if why:
        raise RuntimeError(why)
    import torch
    mode = compile_mode(row)
    return lambda fn: torch.compile(fn, mode=mode)


# gpt_step's and models' rows with the model under torch.compile
COMPILE_ROWS = ("compile_model", *in_modes("compile_model_opt"))


def best_compile(ok: dict) -> str | None:
    """The fastest torch.compile row (``is_compile_row``) in ``ok`` (the
    rows that did not fail: name -> result with ms_per_step), or None."""
    return min((k for k in ok if is_compile_row(k)), key=lambda k: ok[k]["ms_per_step"], default=None)


def ratio_cols(ok: dict, *own: Col) -> list[Col]:
    """/eager, /c.model (torch.compile(model)), /c.m+opt (torch.compile of
    the model and of optimizer.step, default mode), a script's ``own``
    ratio columns, then /best c. (the fastest torch.compile row that did
    not fail, ``best_compile``): ms/step over those rows'."""
    return [ratio_col(ok, "eager", "/eager", 8), ratio_col(ok, "compile_model", "/c.model", 9),
            ratio_col(ok, "compile_model_opt", "/c.m+opt", 9), *own,
            ratio_col(ok, best_compile(ok) or "", "/best c.", 9)]


def best_line(ok: dict, of: str = "") -> str:
    """The line naming /best c.'s row (``of``: e.g. the model, for a table
    with several)."""
    best = best_compile(ok)
    if best is None:
        return f"  best c.{of}: no torch.compile row ran without failing (/best c. is nan)"
    return (f"  best c.{of}: {best} (mode={compile_mode(best) or 'default'}, {ok[best]['ms_per_step']:.2f} ms/step), "
            "the fastest torch.compile row that did not fail; /best c.: each row's ms/step over its")


def modes_legend() -> str:
    """What the mode suffixes of the rows' names mean, for a table's key."""
    return "; ".join(f"_{suffix}: mode=\"{mode}\"" + (" (CUDA graphs, CUDA only)" if mode in CUDA_ONLY_MODES else "")
                     for suffix, mode in COMPILE_MODES.items())


# ---------------------------------------------------------------------------
# The step split
#
# A lazy step's time in parts (milliseconds, each the median over the timed
# steps; a step's parts add up to its time, their medians need not add up
# to the median step):
#
#     trace    step start to mark_step's entry: the user's forward, backward
#              and optimizer step run in Python while LTC records the graph
#     ltc      inside mark_step, neither compiling nor executing: LTC's sync
#              (hashing the graph, its cache lookup, a miss's lowering to
#              TorchScript, the data handles of inputs and outputs)
#     compile  LTC graph compiles (lazy_mlir's clustering and group binding)
#              plus group builds (TS -> FX -> MLIR -> Inductor, at a group's
#              first run); 0 once the step is warm
#     glue     executing the graph outside compiled groups: the TorchScript
#              interpreter around the groups' calls
#     kernels  inside compiled groups: the generated code with its Python
#              call wrapper
#     read     after mark_step: reading the loss (its data is there already)

SPLIT = ("trace", "ltc", "compile", "glue", "kernels", "read")


class StepSplit:
    """Times the parts of lazy steps. Per step: ``begin()`` before the step's
    clock starts, ``mark_step()`` in place of torch._lazy.mark_step(),
    ``end(start)`` after the clock stops (``start``: its perf_counter() value).
    Metrics must not be reset between begin() and end()."""

    def __init__(self):
        from lazy_mlir.observe import metrics
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


def split_cols() -> list[Col]:
    """The split's columns (a result's ``split_ms``; blank for a row without one)."""
    return [Col(part, 8, lambda r, part=part: (r.get("split_ms") or {}).get(part)) for part in SPLIT]


# ---------------------------------------------------------------------------
# Rows taking turns in one process, timed from outside (take_turns)


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
        from lazy_mlir.run import cuda_graphs
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
    from lazy_mlir.native import _C
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
    from lazy_mlir.observe import metrics
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
            paired["matmul"] = NAN
        results[name] = {"ms_per_step": statistics.median(p["step"] for p in timed) * 1000, "paired_ms": paired,
                         "first_step_s": parts[name][0]["step"], "losses": losses[name],
                         "final_loss": losses[name][-1]}
    return results


# ---------------------------------------------------------------------------
# Variants taking turns in one process, each timing itself (run_in_turns)


class TurnVariant:
    """A variant of one training step for ``run_in_turns``: its copy of the
    model on ``device`` with its optimizer (``make_opt(model)``), the model
    under torch.compile when the name starts with "torch.compile".
    Subclasses define ``step(batch, timed)``, which starts the clock and
    ends with ``finish_step``."""

    def __init__(self, name: str, model, device, make_opt: Callable):
        import torch
        self.name, self.device = name, device
        self.model = model.to(device).train()
        self.opt = make_opt(self.model)
        self.forward = torch.compile(self.model) if name.startswith("torch.compile") else self.model
        self.seconds, self.losses, self.per_step = [], [], []

    def finish_step(self, loss, start: float, timed: bool) -> None:
        """A training step after its loss: the backward, the optimizer's step,
        mark_step on the lazy device, the loss read; for a timed step its time
        since ``start`` (and a lazy variant's metrics: ``metrics.reset()`` at
        the step's start is the caller's)."""
        import torch._lazy
        from lazy_mlir.observe import metrics
        lazy = self.device.type == "lazy"
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        if lazy:
            torch._lazy.mark_step()
        self.losses.append(loss.item())  # after mark_step: reads data
        if timed:
            self.seconds.append(time.perf_counter() - start)
            if lazy:
                self.per_step.append(metrics.snapshot())


def run_in_turns(variants: list[TurnVariant], data: list, warmup: int, steps: int, turn: int) -> None:
    """``warmup`` untimed steps each, then ``steps`` timed steps each in
    turns of ``turn``; the batches cycle through ``data``."""
    for variant in variants:
        start = time.perf_counter()
        for i in range(warmup):
            variant.step(data[i % len(data)], timed=False)
        print(f"{variant.name}: warm-up {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    done = 0
    while done < steps:
        n = min(turn, steps - done)
        for variant in variants:
            for i in range(done, done + n):
                variant.step(data[(warmup + i) % len(data)], timed=True)
        done += n


def turn_rows(variants: list[TurnVariant], width: int, extra: Callable[[TurnVariant], str]) -> dict[str, str]:
    """Prints a row per variant: its median step time and ratio to the first
    variant's (eager), then ``extra(variant)``; FAILED and why instead if its
    timed steps did not all run compiled code (``first_failure`` of its
    ``per_step`` snapshots). Returns the failed variants' reasons."""
    eager = statistics.median(variants[0].seconds)
    failed = {}
    for v in variants:
        why = first_failure(v.per_step)
        if why:
            print(f"  {v.name:<{width}} FAILED: {why}")
            failed[v.name] = why
            continue
        median = statistics.median(v.seconds)
        print(f"  {v.name:<{width}} {median * 1e3:8.1f} ms  {median / eager:5.2f}x eager" + extra(v))
    return failed
