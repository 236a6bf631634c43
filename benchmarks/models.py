"""Training-step time of the test zoo's models (tests/models/zoo.py):
eager vs torch.compile(model + optimizer step) vs lazy_mlir O1.

Each (model, variant) runs in its own subprocess, all in one invocation and
interleaved round by round, so the ratios are measured side by side. Per
model and variant: median ms/step after warm-up, ratios to eager and to
torch.compile, first-step seconds (tracing + compiling), and for lazy_mlir
graph executions, eager fallbacks and milliseconds of graph execution
(a mean; the rest of a step is tracing) per step. fp32, the zoo's tiny configs
(hidden 32, batch 2): per-step overhead dominates, as in small-batch steps.

A lazy_mlir figure is refused, and the reason printed instead, when the run
failed, when any op fell back to eager, or when any group ran in TorchScript
instead of generated code: such a time would not measure the compiler.

    .venv/bin/python benchmarks/models.py [--steps 20] [--warmup 5] [--rounds 1] [--models gpt2,resnet]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from gpt_step import ChildFailed, run_child

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")
MODELS = ["gpt2", "bert", "llama", "t5", "vit", "resnet", "mobilenet"]
VARIANTS = ["eager", "compile", "lazy_mlir_O1"]


def run_variant(name: str, variant: str, steps: int, warmup: int) -> dict:
    """Runs in the child process."""
    import torch
    sys.path.insert(0, ZOO_DIR)
    import zoo

    lazy = variant.startswith("lazy_mlir")
    if lazy:
        import lazy_mlir
        from lazy_mlir import metrics
        lazy_mlir.init(variant.rsplit("_", 1)[1])
    device = torch.device("lazy" if lazy else "cpu")
    v, spec = zoo.base_variant(name), zoo.SPECS[name]
    model = zoo.make_model(v, torch.float32).to(device)
    model.train()
    opt = spec.optimizer(model)
    forward = torch.compile(model) if variant == "compile" else model
    opt_step = torch.compile(opt.step) if variant == "compile" else opt.step
    data = zoo.batches(v, warmup + steps, torch.float32)[:warmup + steps]  # full batches, one shape
    times, losses, warm = [], [], {}
    for i, batch in enumerate(data):
        if lazy and i == warmup:
            warm = metrics.snapshot()
            metrics.reset()
        start = time.perf_counter()
        loss = spec.loss(forward, *(t.to(device) for t in batch))
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            torch._lazy.mark_step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    result = {"ms_per_step": statistics.median(times[warmup:]) * 1000, "first_step_s": times[0],
              "final_loss": losses[-1]}
    if lazy:
        s = metrics.snapshot()
        result.update({
            "executions_per_step": s["graph_executions"] / steps,
            "execute_ms_per_step": s["seconds"]["execute"] * 1000 / steps,  # the rest is tracing
            "fallbacks_per_step": s["fallback_count"] / steps,
            "fallbacks": {**warm["fallbacks"], **s["fallbacks"]},
            "groups_fallen_back": {**warm["groups_fallen_back"], **s["groups_fallen_back"]},
            "torchscript_group_calls": s["group_calls"] - s["compiled_group_calls"],
            "syncs": s["syncs"],
        })
    return result


def refusal(result: dict) -> str | None:
    """Why this variant's time must not be printed (None: print it)."""
    if "error" in result:
        return "failed: " + result["error"].strip().splitlines()[-1][:150]
    if result.get("fallbacks"):
        return "eager fallbacks: " + ", ".join(f"{op} x{n}" for op, n in result["fallbacks"].items())
    if result.get("groups_fallen_back"):
        name, why = next(iter(result["groups_fallen_back"].items()))
        return f"{len(result['groups_fallen_back'])} group(s) ran in TorchScript, e.g. {name}: {why[-150:]}"
    if result.get("torchscript_group_calls"):
        return f"{result['torchscript_group_calls']} group calls ran in TorchScript"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--json", default="models.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(*args.child, args.steps, args.warmup)))
        return

    runs: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for name in args.models.split(","):
            for variant in args.only.split(","):
                print(f"round {round_ + 1}: {name} {variant} ...", file=sys.stderr, flush=True)
                try:
                    result = run_child(__file__, ["--child", name, variant, "--steps", str(args.steps),
                                                  "--warmup", str(args.warmup)])
                except ChildFailed as exc:
                    result = {"error": str(exc)}
                runs.setdefault((name, variant), []).append(result)
    # per (model, variant): the failed run if any (a failure is not hidden by a
    # lucky round), else the round with the median step time
    results = {}
    for key, rs in runs.items():
        bad = [r for r in rs if refusal(r)]
        results[key] = bad[0] if bad else sorted(rs, key=lambda r: r["ms_per_step"])[len(rs) // 2]

    print(f"\nZoo training steps (fp32), {args.steps} timed steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved round(s)")
    print(f"{'model':<10}{'variant':<14}{'ms/step':>9}{'/eager':>8}{'/compile':>9}{'first s':>9}"
          f"{'exec/step':>10}{'fallb/step':>11}{'exec ms':>9}{'loss':>9}")
    for name in args.models.split(","):
        ok = {v: r for (m, v), r in results.items() if m == name and not refusal(r)}
        eager, comp = (ok.get(v, {}).get("ms_per_step") for v in ("eager", "compile"))
        for variant in args.only.split(","):
            r = results[(name, variant)]
            why = refusal(r)
            if why:
                print(f"{name:<10}{variant:<14}  no figure: {why}")
                continue
            ms = r["ms_per_step"]
            print(f"{name:<10}{variant:<14}{ms:>9.2f}{ms / eager if eager else float('nan'):>8.2f}"
                  f"{ms / comp if comp else float('nan'):>9.2f}{r['first_step_s']:>9.1f}"
                  f"{r.get('executions_per_step', float('nan')):>10.2f}"
                  f"{r.get('fallbacks_per_step', float('nan')):>11.2f}"
                  f"{r.get('execute_ms_per_step', float('nan')):>9.2f}{r['final_loss']:>9.4f}")
            if r.get("syncs"):
                for where, n in r["syncs"].items():
                    print(f"{'':<24}sync: {n / args.steps:g}/step at {where}")
    with open(args.json, "w") as f:
        json.dump({f"{m}/{v}": r for (m, v), r in results.items()}, f, indent=1)
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
