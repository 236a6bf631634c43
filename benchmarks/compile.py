"""Compile-time benchmark: GPT-mini's first steps cold and warm, against
torch.compile's cold compile of the same model + optimizer, in one run.

Each variant runs in its own process (its own torch state); the caches are
folders made for this run, so "cold" is cold for lazy_mlir and for Inductor:

  lazy_cold           empty lazy_mlir cache, empty Inductor cache
  lazy_cold_in_process  the same, compiled in the training process
                      (isolated_compile=False; by default a worker compiles)
  lazy_warm           a second process on both caches lazy_cold filled
  lazy_inductor_warm  an empty lazy_mlir cache on the Inductor cache lazy_cold
                      filled (what a second process had before lazy_mlir's cache)
  lazy_warm_new_inductor  lazy_cold's lazy_mlir cache, an empty Inductor cache:
                      the stored artefact alone (its C++ kernels are built again)
  lazy_cold_fx        the lazy_mlir cache keeps only the exported FX graph
                      (cache_inductor=False), empty caches
  lazy_warm_fx        a second process on lazy_cold_fx's caches: Inductor's own
                      cache compiles the stored graph again
  torch_compile_cold  torch.compile(model) + torch.compile(opt.step), empty Inductor cache

Per variant: import seconds, wall seconds of steps 0 and 1 (with
``--no-auto-prepare`` the optimizer's first step traces another graph, so
step 1 compiles again), compile seconds over the first
``--compile-steps`` steps (their wall time above the steady step's), and for
lazy_mlir the seconds by stage (metrics ``stage.*``) and the group-cache
outcomes. A variant that failed, or a lazy one that ran a group in
TorchScript or an op eagerly, or whose last step ran no generated code,
prints FAILED instead of figures, and the script exits 1.

    .venv/bin/python benchmarks/compile.py [--steps 5] [--only lazy_cold,lazy_warm] [--no-auto-prepare] [--json compile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from harness import Col, Table, cache_env, emit, excess_s, exit_if_failed, not_compiled, ok_rows, \
    print_loss_diffs, run_child

# variant -> (lazy_mlir cache folder, Inductor cache folder, lazy_mlir.init options); folders by name
VARIANTS = {
    "lazy_cold": ("lazy", "inductor", {}),
    "lazy_cold_in_process": ("lazy_in_process", "inductor_in_process", {"isolated_compile": False}),
    "lazy_warm": ("lazy", "inductor", {}),
    "lazy_inductor_warm": ("lazy_empty", "inductor", {}),
    "lazy_warm_new_inductor": ("lazy", "inductor_empty", {}),
    "lazy_cold_fx": ("lazy_fx", "inductor_fx", {"cache_inductor": False}),
    "lazy_warm_fx": ("lazy_fx", "inductor_fx", {"cache_inductor": False}),
    "torch_compile_cold": (None, "inductor_tc", None),
}
STAGES = ("isolated_compile", "ts_to_fx", "fx_to_mlir", "mlir_passes", "mlir_to_fx", "codegen", "cache_load")


def child(variant: str, steps: int, auto_prepare: bool) -> dict:
    start = time.perf_counter()
    import torch

    from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt
    options = VARIANTS[variant][2]
    lazy = options is not None
    if lazy:
        import lazy_mlir
        from lazy_mlir.observe import metrics
        lazy_mlir.init("O1", progress=False, auto_prepare=auto_prepare, **options)
    result = {"variant": variant, "import_s": time.perf_counter() - start, "steps": []}
    cfg = GPTConfig()
    device = torch.device("lazy" if lazy else "cpu")
    model = make_gpt(cfg).to(device)
    opt = make_adamw(model)
    forward, opt_step = (model, lambda: opt.step()) if lazy else (torch.compile(model), torch.compile(opt.step))
    for x, y in gpt_batches(cfg, steps):
        if lazy:
            metrics.reset()
        start = time.perf_counter()
        loss = forward(x.to(device), y.to(device))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            torch._lazy.mark_step()
        step = {"loss": loss.item(), "wall_s": time.perf_counter() - start}
        if lazy:
            s = metrics.snapshot()
            step.update(seconds=s["seconds"], stage_runs=s["stage_runs"], fallen_back=s["groups_fallen_back"],
                        cache={"hits": s["group_cache_hits"], "disk_hits": s["group_cache_disk_hits"],
                               "misses": s["group_cache_misses"]})
            why = not_compiled(s, "O1")
            # FAILED: a group in TorchScript or an op run eagerly in any step, no generated code run in the last
            if why and (s["groups_fallen_back"] or s["fallback_count"] or len(result["steps"]) == steps - 1):
                result.setdefault("failed", why)
        result["steps"].append(step)
    return result


def run_variant(variant: str, steps: int, folders: dict, auto_prepare: bool) -> dict:
    lazy_dir, inductor_dir, _ = VARIANTS[variant]
    env = {"PYTHONWARNINGS": "ignore", **cache_env(folders.get(lazy_dir), folders[inductor_dir])}
    flags = [] if auto_prepare else ["--no-auto-prepare"]
    return run_child(__file__, ["--child", variant, "--steps", str(steps), *flags], env)


def summarize(result: dict, compile_steps: int) -> dict:
    if "failed" in result:
        return {"failed": result["failed"]}
    steps = result["steps"]
    walls = [s["wall_s"] for s in steps]
    steady = statistics.median(walls[compile_steps:]) if len(walls) > compile_steps else min(walls)
    summary = {"import_s": result["import_s"], "step0_s": walls[0], "step1_s": walls[1] if len(walls) > 1 else None,
               "compile_s": excess_s(walls[:compile_steps], steady), "steady_ms": steady * 1000,
               "losses": [s["loss"] for s in steps]}
    if "seconds" in steps[0]:
        first = steps[:compile_steps]
        summary["stages"] = {k: sum(s["seconds"].get(f"stage.{k}", 0.0) for s in first) for k in STAGES}
        summary["stage_runs"] = {k: sum(s["stage_runs"].get(k, 0) for s in first) for k in STAGES}
        summary["cache"] = {k: sum(s["cache"][k] for s in first) for k in ("hits", "disk_hits", "misses")}
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="steps per variant (>= compile-steps + 1)")
    parser.add_argument("--compile-steps", type=int, default=3)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, in order (warm ones after their cold one)")
    parser.add_argument("--json", default="compile.json")
    parser.add_argument("--keep", action="store_true", help="keep the cache folders (printed)")
    parser.add_argument("--no-auto-prepare", dest="auto_prepare", action="store_false",
                        help="lazy variants init(auto_prepare=False): the first step traces its own graph")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(child(args.child, args.steps, args.auto_prepare))
        return

    root = tempfile.mkdtemp(prefix="lazy_mlir_compile_bench_")
    folders = {name: os.path.join(root, name) for name in
               {d for v in VARIANTS.values() for d in v[:2] if d is not None}}
    results = {}
    try:
        for variant in args.only.split(","):
            print(f"running {variant} ...", file=sys.stderr, flush=True)
            raw = run_variant(variant, args.steps, folders, args.auto_prepare)
            results[variant] = {"raw": raw, "summary": summarize(raw, args.compile_steps)}
    finally:
        if args.keep:
            print(f"cache folders kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    failed = report({v: r["summary"] for v, r in results.items()}, args.compile_steps)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {args.json}")
    exit_if_failed(failed)


def report(summaries: dict, compile_steps: int) -> dict:
    """Prints the tables; returns the failed variants' reasons."""
    ok = ok_rows(summaries)
    reference = ok.get("torch_compile_cold", {}).get("compile_s")
    cold = ok.get("lazy_cold", {}).get("step0_s")
    print(f"\nGPT-mini first steps (compile s = wall time of the first {compile_steps} steps above the steady step)")
    table = Table([
        Col("import s", 9, "import_s"), Col("step0 s", 9, "step0_s"), Col("step1 s", 9, lambda s: s["step1_s"] or 0),
        Col("compile s", 10, "compile_s"),
        Col("/torch.compile", 15, lambda s: f"{s['compile_s'] / reference:.2f}" if reference else "-"),
        Col("step0/cold", 11, lambda s: f"{s['step0_s'] / cold:.2f}" if cold and "stages" in s else "-"),
        Col("steady ms", 10, "steady_ms", ".0f"),
        Col("  group cache (hits/disk/misses)", 0,
            lambda s: "  " + "/".join(str(s["cache"][k]) for k in ("hits", "disk_hits", "misses")) if "cache" in s
            else "  ")], names=(("variant", 24),))
    table.print(summaries)
    print(f"\nlazy_mlir seconds by stage over the first {compile_steps} steps (runs in parentheses)")
    print(f"{'variant':<24}" + "".join(f"{k:>16}" for k in STAGES))
    for variant, s in ok.items():
        if "stages" in s:
            print(f"{variant:<24}" + "".join(f"{s['stages'][k]:>11.1f} ({s['stage_runs'][k]:>2})" for k in STAGES))
    print_loss_diffs(ok, "lazy_cold", 24)
    return table.failed


if __name__ == "__main__":
    main()
