"""GPT-mini training-step benchmark (DESIGN.md "Benchmarks").

Runs, each in its own subprocess and in one invocation: eager,
torch.compile(model) with the optimizer step eager, torch.compile(model) with
torch.compile(optimizer.step), the stock torch._lazy TorchScript backend, and
lazy_mlir O0/O1/O2, O1 without Config.fuse_optimizer (AdamW traced op by op instead of as one
node), and O1 with the model captured (lazy_mlir.capture: forward and backward recorded once,
replayed as one IR node each). Eager and torch.compile run on the device that backs lazy_mlir's (lazy_step.backing_device()). Prints a table and writes JSON:
median ms/step after warm-up, ratios to eager and to each torch.compile row,
peak RSS, compile seconds (warm-up time above the median), graph executions
and eager fallbacks per step, and for lazy_mlir rows the step's split into
trace / ltc / compile / glue / kernels (defined in benchmarks/lazy_step.py).

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
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time

from child import exit_if_failed, pick_round, run_child
from lazy_step import (COMPILE_ROWS, RATIO_COLUMNS, SPLIT_HEADER, StepSplit, backing_device,
                       not_captured, not_compiled, ratio_cells, split_cells, take_turns)

VARIANTS = ["eager", "compile_model", "compile_model_opt", "ts_lazy", "lazy_mlir_O0", "lazy_mlir_O1",
            "lazy_mlir_O1_unfused_opt", "lazy_mlir_O1_capture", "lazy_mlir_O1_capture_no_cuda_graphs", "lazy_mlir_O2"]
# lazy_mlir rows: level and init() options
LAZY_MLIR_ROWS = {"lazy_mlir_O0": ("O0", {}), "lazy_mlir_O1": ("O1", {}), "lazy_mlir_O2": ("O2", {}),
                  # AdamW traced op by op (Config.fuse_optimizer, on by default, off)
                  "lazy_mlir_O1_unfused_opt": ("O1", {"fuse_optimizer": False}),
                  "lazy_mlir_O1_capture": ("O1", {}),
                  # on a GPU: the groups' code called kernel by kernel (Config.cuda_graphs off)
                  "lazy_mlir_O1_capture_no_cuda_graphs": ("O1", {"cuda_graphs": False})}
CAPTURED_ROWS = {"lazy_mlir_O1_capture", "lazy_mlir_O1_capture_no_cuda_graphs"}  # the model under lazy_mlir.capture


def _step_fn(variant: str, init_options: dict, split: StepSplit | None):
    import torch
    from lazy_mlir.models import GPTConfig, make_adamw, make_gpt

    # The stock TS backend returns CPU tensors from split: it runs the same
    # model with q, k, v sliced instead.
    cfg = GPTConfig(split_qkv=variant != "ts_lazy")
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
    if variant in CAPTURED_ROWS:
        lazy_mlir.capture(model)
    opt = make_adamw(model)
    forward = torch.compile(model) if variant in COMPILE_ROWS else model
    opt_step = torch.compile(opt.step) if variant == "compile_model_opt" else opt.step
    mark_step = split.mark_step if split else torch._lazy.mark_step

    def step(x, y):
        loss = forward(x.to(device), y.to(device))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            mark_step()
        return loss.item()

    return step, cfg


def run_variant(variant: str, steps: int, warmup: int, init_options: dict | None = None) -> dict:
    """Runs in the child process. ``init_options`` go to lazy_mlir.init()."""
    from lazy_mlir import metrics
    from lazy_mlir.models import gpt_batches

    split = StepSplit() if variant.startswith("lazy_mlir") else None
    step, cfg = _step_fn(variant, init_options or {}, split)
    times, losses = [], []
    for i, (x, y) in enumerate(gpt_batches(cfg, warmup + steps)):
        if split:
            if i == warmup:
                warm_up = metrics.snapshot()
                metrics.reset()
            split.begin()
        start = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - start)
        if split:
            split.end(start)
    median = statistics.median(times[warmup:])
    result = {
        "variant": variant,
        "ms_per_step": median * 1000,
        "compile_s": sum(max(0.0, t - median) for t in times[:warmup]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
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
        why = not_compiled(s, LAZY_MLIR_ROWS[variant][0]) or (
            not_captured(s, steps) if variant in CAPTURED_ROWS else None)
        if why:
            result["failed"] = why
    elif variant == "ts_lazy":
        import torch._lazy.metrics as ltc
        fallbacks = sum(ltc.counter_value(n) or 0 for n in ltc.counter_names() if n.startswith("aten::"))
        result["fallbacks_per_step"] = fallbacks / (warmup + steps)
    return result


PAIRED_DEFAULT = "eager,compile_model,compile_model_opt,lazy_mlir_O1"


def run_paired(variants: list[str], steps: int, warmup: int, init_options: dict) -> dict[str, dict]:
    """All ``variants`` in this process, one step of each in turn (at most
    one lazy_mlir row: the lazy backend is one per process)."""
    from lazy_mlir import metrics
    from lazy_mlir.models import gpt_batches

    lazy_rows = [v for v in variants if v.startswith(("lazy_mlir", "ts_lazy"))]
    if len(lazy_rows) > 1 or "ts_lazy" in lazy_rows:
        raise SystemExit(f"--paired takes at most one lazy_mlir row, got {lazy_rows}")
    built = {v: _step_fn(v, init_options, None) for v in variants}
    cfg = built[variants[0]][1]  # every row's model has the same sizes
    rows = {v: (lambda batch, step=step: step(*batch)) for v, (step, _) in built.items()}
    results = take_turns(rows, list(gpt_batches(cfg, warmup + steps)), warmup)
    for v, r in results.items():
        r.update(variant=v, steps=steps)
        if v in LAZY_MLIR_ROWS:
            s = metrics.snapshot()
            why = not_compiled(s, LAZY_MLIR_ROWS[v][0]) or (not_captured(s, steps) if v in CAPTURED_ROWS else None)
            if why:
                r["failed"] = why
    return results


NAME = max(map(len, VARIANTS)) + 1  # the variant column's width
RATIO_HEADER = f"{'variant':<{NAME}}{'ms/step':>9}{RATIO_COLUMNS}"


def _ratio_cells(ms: float, ok: dict[str, dict]) -> str:
    return f"{ms:>9.1f}{ratio_cells(ms, ok)}"


def _print_loss_diffs(ok: dict[str, dict]) -> None:
    if "eager" in ok:
        for v, r in ok.items():
            diff = max(abs(a - b) for a, b in zip(ok["eager"]["losses"], r["losses"]))
            print(f"  max |loss - eager loss| {v:<{NAME}} {diff:.2e}")


def print_paired(results: dict[str, dict], steps: int, warmup: int) -> None:
    ok = {v: r for v, r in results.items() if "failed" not in r}
    print(f"\nGPT-mini step on {backing_device()}, all rows in one process taking turns step by step, "
          f"{steps} timed steps after {warmup} warm-up (medians, ms)")
    print(f"{RATIO_HEADER}{'graph':>8}{'matmul':>8}{'outside':>9}")
    for v, r in results.items():
        if v not in ok:
            print(f"{v:<{NAME}}  FAILED: {r['failed']}")
            continue
        p = r["paired_ms"]
        print(f"{v:<{NAME}}{_ratio_cells(r['ms_per_step'], ok)}{p['graph']:>8.1f}{p['matmul']:>8.1f}{p['outside']:>9.1f}")
    print("  graph: inside Inductor-generated code (kernels and their wrapper); matmul: its mm/addmm/bmm calls "
          "(nan: a C++ wrapper calls them out of Python's sight); outside: the rest of the step (Python, autograd, "
          "lazy tracing, LTC)")
    _print_loss_diffs(ok)


def run_in_subprocess(variant: str, steps: int, warmup: int, init_options: dict | None = None,
                      cold: bool = False) -> dict:
    """The variant's result from a fresh process; {"failed": why} if it failed.
    ``cold``: a lazy_mlir row gets an empty compile cache folder of its own."""
    args = ["--child", variant, "--steps", str(steps), "--warmup", str(warmup),
            "--init-options", json.dumps(init_options or {})]
    if not cold:
        return run_child(__file__, args)
    with tempfile.TemporaryDirectory(prefix="lazy_mlir_cold_cache_") as cache_dir:
        return run_child(__file__, args, {"LAZY_MLIR_CACHE_DIR": cache_dir})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", help=f"rows (default: all, with --paired {PAIRED_DEFAULT})")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--paired", action="store_true",
                        help="time the rows in one process, step by step in turn (default rows: "
                             f"{PAIRED_DEFAULT})")
    parser.add_argument("--cold-cache", action="store_true",
                        help="each lazy_mlir row compiles its groups in its own process (an empty compile cache); "
                             "by default rows load what the cache holds")
    parser.add_argument("--json", default="gpt_step.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--init-options", default="{}", help="JSON dict for lazy_mlir.init()")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.steps, args.warmup, json.loads(args.init_options))))
        return
    if args.paired:
        results = run_paired((args.only or PAIRED_DEFAULT).split(","), args.steps, args.warmup,
                             json.loads(args.init_options))
        print_paired(results, args.steps, args.warmup)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        exit_if_failed({v: r["failed"] for v, r in results.items() if "failed" in r})
        return

    # Timings on these machines drift: interleave the variants round by round
    # and keep, per variant, the round with the median step time.
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for variant in (args.only or ",".join(VARIANTS)).split(","):
            if variant == "ts_lazy" and round_ > 0:
                continue  # seconds per step: one round is enough for this baseline
            print(f"round {round_ + 1}: running {variant} ...", file=sys.stderr, flush=True)
            # The stock TS backend takes seconds per step (eager fallbacks): fewer steps.
            steps, warmup = (min(args.steps, 5), min(args.warmup, 2)) if variant == "ts_lazy" else (args.steps, args.warmup)
            runs.setdefault(variant, []).append(run_in_subprocess(variant, steps, warmup, json.loads(args.init_options),
                                                                  args.cold_cache))
    results = {v: pick_round(rs) for v, rs in runs.items()}
    failed = {v: r["failed"] for v, r in results.items() if "failed" in r}

    ok = {v: r for v, r in results.items() if v not in failed}
    print(f"\nGPT-mini step on {backing_device()}, {args.steps} timed steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved round(s)")
    print(f"{RATIO_HEADER}{'compile s':>10}{'RSS MB':>8}{'cache':>6}{'exec/step':>10}{'fallb/step':>11}{SPLIT_HEADER}{'loss':>9}")
    for v, r in results.items():
        if v in failed:
            print(f"{v:<{NAME}}  FAILED: {failed[v]}")
            continue
        print(f"{v:<{NAME}}{_ratio_cells(r['ms_per_step'], ok)}"
              f"{r['compile_s']:>10.1f}{r['peak_rss_mb']:>8.0f}{r.get('cache', '-'):>6}"
              f"{r.get('executions_per_step', float('nan')):>10.2f}"
              f"{r.get('fallbacks_per_step', float('nan')):>11.2f}{split_cells(r.get('split_ms'))}"
              f"{r['final_loss']:>9.4f}")
    print("  c.model: torch.compile(model), optimizer step eager; c.m+opt: torch.compile(model) and "
          "torch.compile(optimizer.step); split columns (ms, medians): see benchmarks/lazy_step.py")
    print("  cache: cold, the row compiled its groups (its peak RSS holds torch-mlir and Inductor's compiler); "
          "warm, it loaded them from lazy_mlir's compile cache as native code (--cold-cache: always cold)")
    if "ts_lazy" in ok:
        print("  ts_lazy: the stock torch._lazy TorchScript backend, q/k/v sliced (its split returns CPU "
              f"tensors), {ok['ts_lazy']['steps']} timed steps")
    _print_loss_diffs(ok)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {args.json}")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
