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
outcomes. A variant whose groups fell back to TorchScript gets no figures.

    .venv/bin/python benchmarks/compile.py [--steps 5] [--only lazy_cold,lazy_warm] [--no-auto-prepare] [--json compile.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

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
        from lazy_mlir import metrics
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
        result["steps"].append(step)
    return result


def run_variant(variant: str, steps: int, folders: dict, auto_prepare: bool) -> dict:
    lazy_dir, inductor_dir, _ = VARIANTS[variant]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCHINDUCTOR_CACHE_DIR": folders[inductor_dir]}
    if lazy_dir is not None:
        env["LAZY_MLIR_CACHE_DIR"] = folders[lazy_dir]
    flags = [] if auto_prepare else ["--no-auto-prepare"]
    proc = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(steps), *flags],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"variant": variant, "error": proc.stderr[-3000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(result: dict, compile_steps: int) -> dict:
    steps = result["steps"]
    walls = [s["wall_s"] for s in steps]
    steady = statistics.median(walls[compile_steps:]) if len(walls) > compile_steps else min(walls)
    summary = {"import_s": result["import_s"], "step0_s": walls[0], "step1_s": walls[1] if len(walls) > 1 else None,
               "compile_s": sum(max(0.0, w - steady) for w in walls[:compile_steps]), "steady_ms": steady * 1000,
               "losses": [s["loss"] for s in steps]}
    if "seconds" in steps[0]:
        first = steps[:compile_steps]
        summary["stages"] = {k: sum(s["seconds"].get(f"stage.{k}", 0.0) for s in first) for k in STAGES}
        summary["stage_runs"] = {k: sum(s["stage_runs"].get(k, 0) for s in first) for k in STAGES}
        summary["cache"] = {k: sum(s["cache"][k] for s in first) for k in ("hits", "disk_hits", "misses")}
        summary["fallen_back"] = {k: v for s in steps for k, v in s["fallen_back"].items()}
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
        print(json.dumps(child(args.child, args.steps, args.auto_prepare)))
        return

    root = tempfile.mkdtemp(prefix="lazy_mlir_compile_bench_")
    folders = {name: os.path.join(root, name) for name in
               {d for v in VARIANTS.values() for d in v[:2] if d is not None}}
    results = {}
    try:
        for variant in args.only.split(","):
            print(f"running {variant} ...", file=sys.stderr, flush=True)
            raw = run_variant(variant, args.steps, folders, args.auto_prepare)
            if "error" in raw:
                print(f"  {variant} failed:\n{raw['error']}", file=sys.stderr)
                continue
            results[variant] = {"raw": raw, "summary": summarize(raw, args.compile_steps)}
    finally:
        if args.keep:
            print(f"cache folders kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(results, args.compile_steps)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nJSON: {args.json}")


def report(results: dict, compile_steps: int) -> None:
    reference = results.get("torch_compile_cold", {}).get("summary", {}).get("compile_s")
    cold = results.get("lazy_cold", {}).get("summary", {}).get("step0_s")
    print(f"\nGPT-mini first steps (compile s = wall time of the first {compile_steps} steps above the steady step)")
    print(f"{'variant':<24}{'import s':>9}{'step0 s':>9}{'step1 s':>9}{'compile s':>10}{'/torch.compile':>15}"
          f"{'step0/cold':>11}{'steady ms':>10}  group cache (hits/disk/misses)")
    for variant, r in results.items():
        s = r["summary"]
        if s.get("fallen_back"):
            print(f"{variant:<24}  no figures: groups fell back to TorchScript: {s['fallen_back']}")
            continue
        ratio = f"{s['compile_s'] / reference:.2f}" if reference else "-"
        vs_cold = f"{s['step0_s'] / cold:.2f}" if cold and variant.startswith("lazy") else "-"
        cache = "/".join(str(s["cache"][k]) for k in ("hits", "disk_hits", "misses")) if "cache" in s else ""
        print(f"{variant:<24}{s['import_s']:>9.1f}{s['step0_s']:>9.1f}{s['step1_s'] or 0:>9.1f}{s['compile_s']:>10.1f}"
              f"{ratio:>15}{vs_cold:>11}{s['steady_ms']:>10.0f}  {cache}")
    print(f"\nlazy_mlir seconds by stage over the first {compile_steps} steps (runs in parentheses)")
    print(f"{'variant':<24}" + "".join(f"{k:>16}" for k in STAGES))
    for variant, r in results.items():
        s = r["summary"]
        if "stages" in s and not s.get("fallen_back"):
            print(f"{variant:<24}" + "".join(f"{s['stages'][k]:>11.1f} ({s['stage_runs'][k]:>2})" for k in STAGES))
    base = results.get("lazy_cold", {}).get("summary", {}).get("losses")
    if base:
        for variant, r in results.items():
            losses = r["summary"]["losses"]
            diff = max(abs(a - b) for a, b in zip(base, losses))
            print(f"  max |loss - lazy_cold loss| {variant:<24} {diff:.2e}")


if __name__ == "__main__":
    main()
