"""GPT-mini training-step benchmark (docs/performance.md).

Runs, each in its own subprocess and in one invocation: eager,
torch.compile(model) with the optimizer step eager, torch.compile(model) with
torch.compile(optimizer.step) in the default mode, in mode="max-autotune-no-cudagraphs"
(``compile_model_opt_max_autotune``) and, when the backing device is CUDA, in
mode="reduce-overhead" (CUDA graphs, ``compile_model_opt_reduce_overhead``; asked
for elsewhere it is FAILED), the stock torch._lazy TorchScript backend, and
lazy_mlir O0/O1/O2 (the plain loop: the model captured by itself, Config.capture "auto"), O1
traced op by op (``lazy_mlir_O1_op_by_op``, Config.capture "off"), O1 without
Config.fuse_optimizer (AdamW traced op by op instead of as one node), and O1 with
lazy_mlir.capture(model) called (forward and backward recorded once, replayed as one IR
node each: what the plain loop does by itself, so the two should be level). Eager and torch.compile run on the device that backs lazy_mlir's (harness.backing_device()). Prints a table and writes JSON:
median ms/step after warm-up, ratios to eager, to the default-mode torch.compile
rows and to the fastest torch.compile row that did not fail ("/best c.", named
under the table), peak RSS, compile seconds (warm-up time above the median), graph executions
and eager fallbacks per step, and for lazy_mlir rows the step's split into
trace / ltc / compile / glue / kernels (defined in benchmarks/harness.py).

With --paired, the timings come from one process instead: eager, the
torch.compile rows and one lazy_mlir row take turns step by step, so that
machine drift hits them alike (separate processes on these machines differ
by 10-30% from run to run), and each row's step is split into time inside
Inductor-generated code ("graph", torch.compile's and ours alike), its
matmuls, and the rest of the step ("outside": Python, autograd, tracing).

A row that failed, or an O1/O2 row whose steps did not all run generated code
(a group in TorchScript, an eager fallback, no compiled group call), shows
FAILED and why instead of a figure, and the script exits 1.

    .venv/bin/python benchmarks/gpt_step.py [--steps 20] [--warmup 5] [--only eager,lazy_mlir_O1]
    .venv/bin/python benchmarks/gpt_step.py --paired [--only eager,compile_model_opt,lazy_mlir_O1]

--shape gpt2-small runs GPT-2 small's layers (12 x 768, 12 heads, a
vocabulary of 8192: 91.5M parameters) on sequences of 256 in batches of 2,
the size at which peak memory against eager's is measured (each row in its
own process, its peak RSS in the table):

    .venv/bin/python benchmarks/gpt_step.py --shape gpt2-small --steps 6 --warmup 2 \
        --only eager,compile_model_opt,lazy_mlir_O1 --cold-cache
    .venv/bin/python benchmarks/gpt_step.py --paired --only eager,compile_model_opt,compile_model_opt_max_autotune,lazy_mlir_O1
"""
from __future__ import annotations

import argparse
import json

from harness import (COMPILE_ROWS, NAN, Col, StepSplit, Table, backing_device, best_line, check_lazy, compile_fn,
                     emit, empty_caches, excess_s, exit_if_failed, in_modes, median_ms, mode_refused, modes_legend,
                     ok_rows, pick_round, print_loss_diffs, ratio_cols, run_child, run_rounds, runnable, split_cols,
                     take_turns, time_steps)

# the model and optimizer.step under torch.compile, in each mode (harness.COMPILE_MODES)
MODEL_OPT_ROWS = in_modes("compile_model_opt")
# by default (--only not given) those the backing device runs (harness.runnable)
VARIANTS = ["eager", "compile_model", *MODEL_OPT_ROWS, "ts_lazy", "lazy_mlir_O0", "lazy_mlir_O1",
            "lazy_mlir_O1_op_by_op", "lazy_mlir_O1_unfused_opt", "lazy_mlir_O1_budget", "lazy_mlir_O1_capture",
            "lazy_mlir_O1_capture_no_cuda_graphs", "lazy_mlir_O2"]
# lazy_mlir rows: level and init() options
LAZY_MLIR_ROWS = {"lazy_mlir_O0": ("O0", {}), "lazy_mlir_O1": ("O1", {}), "lazy_mlir_O2": ("O2", {}),
                  # AdamW traced op by op (Config.fuse_optimizer, on by default, off)
                  "lazy_mlir_O1_unfused_opt": ("O1", {"fuse_optimizer": False}),
                  # every call traced op by op (Config.capture "off"; lazy_mlir_O1 captures the model by itself)
                  "lazy_mlir_O1_op_by_op": ("O1", {"capture": "off"}),
                  # init(memory_budget=--memory-budget x the eager row's peak RSS): runs after that row
                  "lazy_mlir_O1_budget": ("O1", {}),
                  "lazy_mlir_O1_capture": ("O1", {}),
                  # on a GPU: the groups' code called kernel by kernel (Config.cuda_graphs off)
                  "lazy_mlir_O1_capture_no_cuda_graphs": ("O1", {"cuda_graphs": False})}
CAPTURE_CALLED_ROWS = {"lazy_mlir_O1_capture", "lazy_mlir_O1_capture_no_cuda_graphs"}  # lazy_mlir.capture(model)
# rows whose model must replay every step: those, and the plain loop's automatic capture
CAPTURED_ROWS = {"lazy_mlir_O1", "lazy_mlir_O1_budget", *CAPTURE_CALLED_ROWS}
BUDGET_ROW = "lazy_mlir_O1_budget"
SETTLE_LIMIT = 40  # steps the budget row may take to choose what to recompute


# --shape: GPT-mini (lazy_mlir.models' defaults), or GPT-2 small's layers
# (12 x 768, 12 heads; 91.5M parameters with a vocabulary of 8192) on
# sequences of 256, batches of 2: the size the memory figures are taken at
SHAPES = {"mini": {}, "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=8192, block_size=256,
                                         batch_size=2)}
SHAPE_NAMES = {"mini": "GPT-mini", "gpt2-small": "GPT-2-small shape"}


def _step_fn(variant: str, init_options: dict, split: StepSplit | None, shape: str = "mini"):
    import torch
    from lazy_mlir.models import GPTConfig, make_adamw, make_gpt

    # The stock TS backend returns CPU tensors from split: it runs the same
    # model with q, k, v sliced instead.
    cfg = GPTConfig(split_qkv=variant != "ts_lazy", **SHAPES[shape])
    lazy = variant.startswith(("ts_lazy", "lazy_mlir"))
    if variant == "ts_lazy":
        import torch._lazy.ts_backend
        torch._lazy.ts_backend.init()
    elif lazy:
        import lazy_mlir
        level, options = LAZY_MLIR_ROWS[variant]
        lazy_mlir.init(level, **{**init_options, **options})
    device = torch.device("lazy" if lazy else backing_device())
    model = make_gpt(cfg).to(device)
    if variant in CAPTURE_CALLED_ROWS:
        lazy_mlir.capture(model)
    opt = make_adamw(model)
    compile_ = compile_fn(variant, device.type) if variant in COMPILE_ROWS else None  # in the row's mode
    forward = compile_(model) if compile_ else model
    opt_step = compile_(opt.step) if variant in MODEL_OPT_ROWS else opt.step
    mark_step = split.mark_step if split else torch._lazy.mark_step

    def step(x, y):
        loss = forward(x.to(device), y.to(device))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            mark_step()
        return loss.item()

    step.model, step.optimizer = model, opt  # for the memory split
    return step, cfg


def _lazy_failure(variant: str, steps: int) -> str | None:
    """Why a lazy_mlir row's timed steps did not all run generated code (or
    replay a captured model's forward); None when they did."""
    return check_lazy(LAZY_MLIR_ROWS[variant][0], steps if variant in CAPTURED_ROWS else None)


def run_variant(variant: str, steps: int, warmup: int, init_options: dict | None = None, shape: str = "mini") -> dict:
    """Runs in the child process. ``init_options`` go to lazy_mlir.init()."""
    from lazy_mlir.observe import memory, metrics
    from lazy_mlir.models import gpt_batches

    split = StepSplit() if variant.startswith("lazy_mlir") else None
    step, cfg = _step_fn(variant, init_options or {}, split, shape)
    warm_up = {}
    settled = 0
    if variant == BUDGET_ROW:  # steps until it chose (measured in turn), then warm-up and timed steps as any row's
        for settled, batch in enumerate(gpt_batches(cfg, SETTLE_LIMIT, seed=2), 1):
            step(*batch)
            if metrics.snapshot()["memory_budget"]["chosen_fraction"] is not None:
                break

    def at_warmup():
        warm_up.update(metrics.snapshot())
        metrics.reset()
    times, losses = time_steps(lambda batch: step(*batch), gpt_batches(cfg, warmup + steps), warmup, split,
                               at_warmup if split else None)
    median = median_ms(times, warmup)
    result = {
        "variant": variant,
        "ms_per_step": median,
        "compile_s": excess_s(times[:warmup], median / 1000),
        # the run's: getrusage's unless a memory budget's measurements reset it (lazy_mlir.memory)
        "peak_rss_mb": memory.snapshot()["peak_resident"] / 2**20,
        # lazy_mlir.memory's parts (bytes) after the last step; the step's buffers: lazy rows only
        "memory": memory.snapshot(step.model, step.optimizer),
        "steps": steps,
        "final_loss": losses[-1],
        "losses": losses,
    }
    if split:
        s = metrics.snapshot()
        result.update({
            "executions_per_step": s["graph_executions"] / steps,
            "fallbacks_per_step": s["fallback_count"] / steps,
            "split_ms": split.medians_ms(warmup),
            # cold: groups compiled in this process (its RSS holds the compiler); warm: all from the cache
            "cache": "cold" if warm_up["group_cache_misses"] else "warm",
        })
        why = _lazy_failure(variant, steps)
        if variant == BUDGET_ROW:
            result.update(memory_budget=s["memory_budget"], settle_steps=settled)
            if s["memory_budget"]["chosen_fraction"] is None:
                why = f"chose nothing to recompute in {SETTLE_LIMIT} steps"
        if why:
            result["failed"] = why
    elif variant == "ts_lazy":
        import torch._lazy.metrics as ltc
        fallbacks = sum(ltc.counter_value(n) or 0 for n in ltc.counter_names() if n.startswith("aten::"))
        result["fallbacks_per_step"] = fallbacks / (warmup + steps)
    return result


# (and the device's runnable rows of these: reduce-overhead on CUDA only)
PAIRED_DEFAULT = "eager,compile_model,compile_model_opt,compile_model_opt_max_autotune," \
                 "compile_model_opt_reduce_overhead,lazy_mlir_O1"


def run_paired(variants: list[str], steps: int, warmup: int, init_options: dict, shape: str = "mini") -> dict[str, dict]:
    """All ``variants`` in this process, one step of each in turn (at most
    one lazy_mlir row: the lazy backend is one per process). A row whose
    torch.compile mode the device cannot run is FAILED, not built."""
    from lazy_mlir.models import gpt_batches

    lazy_rows = [v for v in variants if v.startswith(("lazy_mlir", "ts_lazy"))]
    if len(lazy_rows) > 1 or "ts_lazy" in lazy_rows:
        raise SystemExit(f"--paired takes at most one lazy_mlir row, got {lazy_rows}")
    refused = {v: why for v in variants if (why := mode_refused(v, backing_device()))}
    built = {v: _step_fn(v, init_options, None, shape) for v in variants if v not in refused}
    if not built:
        return {v: {"failed": why} for v, why in refused.items()}
    cfg = next(iter(built.values()))[1]  # every row's model has the same sizes
    rows = {v: (lambda batch, step=step: step(*batch)) for v, (step, _) in built.items()}
    results = take_turns(rows, list(gpt_batches(cfg, warmup + steps)), warmup)
    for v, r in results.items():
        r.update(variant=v, steps=steps)
        if v in LAZY_MLIR_ROWS:
            why = _lazy_failure(v, steps)
            if why:
                r["failed"] = why
    return {v: {"failed": refused[v]} if v in refused else results[v] for v in variants}


NAME = max(map(len, VARIANTS)) + 1  # the variant column's width


def print_paired(results: dict[str, dict], steps: int, warmup: int, shape: str = "mini") -> dict[str, str]:
    """Prints the --paired table; returns the failed rows' reasons."""
    ok = ok_rows(results)
    print(f"\n{SHAPE_NAMES[shape]} step on {backing_device()}, all rows in one process taking turns step by step, "
          f"{steps} timed steps after {warmup} warm-up (medians, ms)")
    table = Table([Col("ms/step", 9, "ms_per_step"), *ratio_cols(ok),
                   *(Col(part, width, lambda r, part=part: r["paired_ms"][part])
                     for part, width in (("graph", 8), ("matmul", 8), ("outside", 9)))], names=(("variant", NAME),))
    table.print(results)
    print(best_line(ok))
    print("  " + modes_legend())
    print("  graph: inside Inductor-generated code (kernels and their wrapper); matmul: its mm/addmm/bmm calls "
          "(nan: a C++ wrapper calls them out of Python's sight); outside: the rest of the step (Python, autograd, "
          "lazy tracing, LTC)")
    print_loss_diffs(ok, "eager", NAME)
    return table.failed


def _state_mb(r: dict) -> float:
    m = r.get("memory")
    return (m["parameters"] + m["gradients"] + m["optimizer_state"]) / 2**20 if m else NAN


def run_in_subprocess(variant: str, steps: int, warmup: int, init_options: dict | None = None,
                      cold: bool = False, shape: str = "mini") -> dict:
    """The variant's result from a fresh process; {"failed": why} if it failed.
    ``cold``: a lazy_mlir row gets an empty compile cache folder of its own."""
    args = ["--child", variant, "--steps", str(steps), "--warmup", str(warmup),
            "--init-options", json.dumps(init_options or {}), "--shape", shape]
    if not cold:
        return run_child(__file__, args)
    with empty_caches("lazy_mlir_cold_cache_", inductor=False) as env:
        return run_child(__file__, args, env)


def _print_budget(r: dict, ratio: float) -> None:
    mb = r["memory_budget"]
    budget, peak = mb["budget_bytes"] / 2**20, r["peak_rss_mb"]
    print(f"  {BUDGET_ROW}: init(memory_budget={ratio} x eager's peak RSS = {budget:,.0f} MiB); chose "
          f"{float(mb['chosen_fraction']):.0%} of the model's blocks checkpointed ({mb['why']}) after "
          f"{r['settle_steps']} steps; the run's peak RSS {peak:,.0f} MiB: "
          + ("within the budget" if peak <= budget else "OVER the budget"))
    for fraction, m in sorted(mb["measured"].items(), key=lambda kv: float(kv[0])):
        print(f"    {float(fraction):.0%} checkpointed: step peak RSS {m['peak_bytes'] / 2**20:,.0f} MiB, step buffers "
              f"{m['step_buffers_bytes'] / 2**20:,.0f} MiB, step {m['step_seconds'] * 1e3:,.0f} ms")
    for entry in mb["partitions"]:
        for fraction, p in entry.items():
            if isinstance(p, dict):  # JSON keys: strings
                print(f"    {entry['module']} with {float(fraction):.0%} of its {entry['blocks']} blocks "
                      f"checkpointed: saves {p['saved_bytes'] / 2**20:,.1f} MiB, recomputes {p['recomputed_ops']} ops")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", help="rows, comma-separated, of " + ",".join(VARIANTS) + " (default: all "
                        "that the backing device runs, reduce-overhead on CUDA only; with --paired, see --paired)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--paired", action="store_true",
                        help="time the rows in one process, step by step in turn (default rows: "
                             f"{PAIRED_DEFAULT}, the last torch.compile row on CUDA only)")
    parser.add_argument("--cold-cache", action="store_true",
                        help="each lazy_mlir row compiles its groups in its own process (an empty compile cache); "
                             "by default rows load what the cache holds")
    parser.add_argument("--shape", choices=list(SHAPES), default="mini",
                        help="GPT-mini, or GPT-2 small's layers (12 x 768) with a vocabulary of 8192, "
                             "sequences of 256, batches of 2")
    parser.add_argument("--memory-budget", type=float, default=0.8,
                        help=f"{BUDGET_ROW}'s init(memory_budget=...), as this times the eager row's peak RSS "
                             "(the eager row runs before it)")
    parser.add_argument("--json", default="gpt_step.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--init-options", default="{}", help="JSON dict for lazy_mlir.init()")
    args = parser.parse_args()
    if args.child:
        emit(run_variant(args.child, args.steps, args.warmup, json.loads(args.init_options), args.shape))
        return
    if args.paired:
        rows = args.only.split(",") if args.only else runnable(PAIRED_DEFAULT.split(","), backing_device())
        results = run_paired(rows, args.steps, args.warmup, json.loads(args.init_options), args.shape)
        failed = print_paired(results, args.steps, args.warmup, args.shape)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        exit_if_failed(failed)
        return

    seen: dict[str, dict] = {}

    def run(variant):
        seen[variant] = run_row(variant)
        return seen[variant]

    def run_row(variant):
        why = mode_refused(variant, backing_device())
        if why:  # e.g. reduce-overhead off CUDA: FAILED without a process
            return {"failed": why}
        options = json.loads(args.init_options)
        if variant == BUDGET_ROW:
            if "peak_rss_mb" not in seen.get("eager", {}):
                return {"failed": "needs the eager row's peak RSS: list eager before it in --only"}
            options["memory_budget"] = int(args.memory_budget * seen["eager"]["peak_rss_mb"] * 2**20)
        # The stock TS backend takes seconds per step (eager fallbacks): fewer steps, one round.
        steps, warmup = (min(args.steps, 5), min(args.warmup, 2)) if variant == "ts_lazy" else (args.steps, args.warmup)
        return run_in_subprocess(variant, steps, warmup, options, args.cold_cache, args.shape)
    # Timings on these machines drift: interleave the variants round by round
    # and keep, per variant, the round with the median step time.
    results = run_rounds(args.rounds, args.only.split(",") if args.only else runnable(VARIANTS, backing_device()), run,
                         label=lambda v: f"running {v}", once={"ts_lazy"}, pick=pick_round)
    ok = ok_rows(results)
    print(f"\n{SHAPE_NAMES[args.shape]} step on {backing_device()}, {args.steps} timed steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved round(s)")
    table = Table([Col("ms/step", 9, "ms_per_step"), *ratio_cols(ok), Col("compile s", 10, "compile_s"),
                   Col("RSS MB", 8, "peak_rss_mb", ".0f"),
                   Col("state MB", 9, lambda r: _state_mb(r), ".0f"),
                   Col("step MB", 8, lambda r: r["memory"]["step_buffers_peak"] / 2**20 if "cache" in r else NAN,
                       ".0f"),
                   Col("cache", 6, lambda r: r.get("cache", "-")),
                   Col("exec/step", 10, lambda r: r.get("executions_per_step", NAN), ".2f"),
                   Col("fallb/step", 11, lambda r: r.get("fallbacks_per_step", NAN), ".2f"), *split_cols(),
                   Col("loss", 9, "final_loss", ".4f")], names=(("variant", NAME),))
    table.print(results)
    print(best_line(ok))
    print("  c.model: torch.compile(model), optimizer step eager; c.m+opt: torch.compile(model) and "
          "torch.compile(optimizer.step), default mode; " + modes_legend() + "; split columns (ms, medians): "
          "see benchmarks/harness.py")
    print("  state MB: parameters, gradients and optimizer state after the last step; step MB: the last "
          "step's own buffers at their peak, above those live when it began (activations and temporaries, "
          "lazy_mlir.memory)")
    print("  cache: cold, the row compiled its groups (its peak RSS holds torch-mlir and Inductor's compiler); "
          "warm, it loaded them from lazy_mlir's compile cache as native code (--cold-cache: always cold)")
    if "ts_lazy" in ok:
        print("  ts_lazy: the stock torch._lazy TorchScript backend, q/k/v sliced (its split returns CPU "
              f"tensors), {ok['ts_lazy']['steps']} timed steps")
    if BUDGET_ROW in ok:
        _print_budget(ok[BUDGET_ROW], args.memory_budget)
    # the budget row trains more steps first (it measures while choosing): not eager's losses
    print_loss_diffs({k: r for k, r in ok.items() if k != BUDGET_ROW}, "eager", NAME)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {args.json}")
    exit_if_failed(table.failed)


if __name__ == "__main__":
    main()
