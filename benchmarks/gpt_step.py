"""GPT-mini training-step benchmark (DESIGN.md "Benchmarks").

Runs, each in its own subprocess and in one invocation: eager,
torch.compile(model), torch.compile(model + optimizer step), the stock
torch._lazy TorchScript backend, and lazy_mlir O0/O1/O2. Prints a table and
writes JSON: median ms/step after warm-up, ratios to eager and to
torch.compile, peak RSS, compile seconds (warm-up time above the median),
graph executions and fallbacks per step, and trace overhead (time inside
mark_step not spent executing the graph).

    .venv/bin/python benchmarks/gpt_step.py [--steps 20] [--warmup 5] [--only eager,lazy_mlir_O1]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ["eager", "compile_model", "compile_model_opt", "ts_lazy", "lazy_mlir_O0", "lazy_mlir_O1",
            "lazy_mlir_O2"]


def _step_fn(variant: str, init_options: dict):
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
        lazy_mlir.init(variant.rsplit("_", 1)[1], **init_options)
    device = torch.device("lazy" if lazy else "cpu")
    model = make_gpt(cfg).to(device)
    opt = make_adamw(model)
    forward = torch.compile(model) if variant.startswith("compile_") else model
    opt_step = torch.compile(opt.step) if variant == "compile_model_opt" else opt.step
    stats = {"mark_step_s": 0.0}

    def step(x, y):
        loss = forward(x.to(device), y.to(device))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            start = time.perf_counter()
            torch._lazy.mark_step()
            stats["mark_step_s"] = time.perf_counter() - start
        return loss.item()

    return step, stats, cfg


def run_variant(variant: str, steps: int, warmup: int, init_options: dict | None = None) -> dict:
    """Runs in the child process. ``init_options`` go to lazy_mlir.init()."""
    from lazy_mlir.models import gpt_batches

    step, stats, cfg = _step_fn(variant, init_options or {})
    lazy_metrics = None
    if variant.startswith("lazy_mlir"):
        from lazy_mlir import metrics as lazy_metrics
    times, losses, overheads = [], [], []
    for i, (x, y) in enumerate(gpt_batches(cfg, warmup + steps)):
        if lazy_metrics is not None and i == warmup:
            lazy_metrics.reset()
        exec_before = lazy_metrics.snapshot()["seconds"]["execute"] if lazy_metrics and i >= warmup else 0.0
        start = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - start)
        if lazy_metrics is not None and i >= warmup:
            executed = lazy_metrics.snapshot()["seconds"]["execute"] - exec_before
            overheads.append(stats["mark_step_s"] - executed)
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
    if lazy_metrics is not None:
        s = lazy_metrics.snapshot()
        result.update({
            "executions_per_step": s["graph_executions"] / steps,
            "fallbacks_per_step": s["fallback_count"] / steps,
            "trace_overhead_ms": statistics.median(overheads) * 1000,
            "trace_overhead_pct": 100 * statistics.median(overheads) / median,
        })
    elif variant == "ts_lazy":
        import torch._lazy.metrics as ltc
        fallbacks = sum(ltc.counter_value(n) or 0 for n in ltc.counter_names() if n.startswith("aten::"))
        result["fallbacks_per_step"] = fallbacks / (warmup + steps)
    return result


class ChildFailed(RuntimeError):
    pass


def run_child(script: str, args: list[str]) -> dict:
    """Runs ``script args`` in a fresh process (each variant gets its own
    torch state); the child prints its result as JSON on its last line."""
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if proc.returncode != 0:
        raise ChildFailed(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_in_subprocess(variant: str, steps: int, warmup: int, init_options: dict | None = None) -> dict | None:
    try:
        return run_child(__file__, ["--child", variant, "--steps", str(steps), "--warmup", str(warmup),
                                    "--init-options", json.dumps(init_options or {})])
    except ChildFailed as exc:
        print(f"  {variant} failed:\n{exc}", file=sys.stderr)
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--json", default="gpt_step.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--init-options", default="{}", help="JSON dict for lazy_mlir.init()")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.steps, args.warmup, json.loads(args.init_options))))
        return

    # Timings on these machines drift: interleave the variants round by round
    # and keep, per variant, the round with the median step time.
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for variant in args.only.split(","):
            if variant == "ts_lazy" and round_ > 0:
                continue  # seconds per step: one round is enough for this baseline
            print(f"round {round_ + 1}: running {variant} ...", file=sys.stderr, flush=True)
            # The stock TS backend takes seconds per step (eager fallbacks): fewer steps.
            steps, warmup = (min(args.steps, 5), min(args.warmup, 2)) if variant == "ts_lazy" else (args.steps, args.warmup)
            result = run_in_subprocess(variant, steps, warmup, json.loads(args.init_options))
            if result is not None:
                runs.setdefault(variant, []).append(result)
    results = {v: sorted(rs, key=lambda r: r["ms_per_step"])[len(rs) // 2] for v, rs in runs.items()}

    eager = results.get("eager", {}).get("ms_per_step")
    best_compile = min((results[v]["ms_per_step"] for v in ("compile_model", "compile_model_opt") if v in results),
                       default=None)
    print(f"\nGPT-mini step, {args.steps} timed steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved round(s)")
    header = f"{'variant':<20}{'ms/step':>9}{'/eager':>8}{'/compile':>9}{'compile s':>10}{'RSS MB':>8}" \
             f"{'exec/step':>10}{'fallb/step':>11}{'trace ovh':>10}{'loss':>9}"
    print(header)
    for v, r in results.items():
        ms = r["ms_per_step"]
        print(f"{v:<20}{ms:>9.1f}{ms / eager if eager else float('nan'):>8.2f}"
              f"{ms / best_compile if best_compile else float('nan'):>9.2f}{r['compile_s']:>10.1f}"
              f"{r['peak_rss_mb']:>8.0f}{r.get('executions_per_step', float('nan')):>10.2f}"
              f"{r.get('fallbacks_per_step', float('nan')):>11.2f}"
              f"{(str(round(r['trace_overhead_pct'], 1)) + '%') if 'trace_overhead_pct' in r else '':>10}"
              f"{r['final_loss']:>9.4f}")
    if "ts_lazy" in results:
        print("  ts_lazy: the stock torch._lazy TorchScript backend, q/k/v sliced (its split returns CPU "
              f"tensors), {results['ts_lazy']['steps']} timed steps")
    if "eager" in results:
        ref = results["eager"]["losses"]
        for v, r in results.items():
            diff = max(abs(a - b) for a, b in zip(ref, r["losses"]))
            print(f"  max |loss - eager loss| {v:<20} {diff:.2e}")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
