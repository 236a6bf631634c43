"""Measured effect of each MLIR pass on GPT-mini at O1: the step with the
default pipeline against the pipeline without that pass, side by side in one
run (median ms/step), plus what Inductor generated (fused kernels, buffer
allocations) read from the per-group dumps.

    .venv/bin/python benchmarks/pass_effect.py [--steps 15] [--warmup 5]
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import tempfile

import mlir_passes
from child import exit_if_failed, pick_round
from gpt_step import run_in_subprocess

# Passes that can be left out without making groups uncompilable
# (scalar-implicit-to-tensor and specialize-scalars are what lets groups reach Inductor).
OPTIONAL = ["fold-copy-ops", "cse"]


def generated_code_stats(dump_dir: str) -> dict:
    code = "".join(open(f).read() for f in glob.glob(os.path.join(dump_dir, "*.5.generated.py")))
    return {"fused_kernels": len(re.findall(r"^\s+cpp_fused_\w+\(", code, re.M)),
            "allocations": code.count("empty_strided_cpu("),
            "extern_calls": len(re.findall(r"extern_kernels\.\w+\(", code))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median round is kept")
    args = parser.parse_args()
    default = mlir_passes.DEFAULT_PIPELINE.split(",")
    variants = {"default": default} | {f"without {p}": [q for q in default if q != p] for p in OPTIONAL}
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):  # interleaved: timings drift on these machines
        for label, passes in variants.items():
            with tempfile.TemporaryDirectory() as dump_dir:
                result = run_in_subprocess("lazy_mlir_O1", args.steps, args.warmup,
                                           {"pipeline": ",".join(passes), "dump_dir": dump_dir})
                runs.setdefault(label, []).append(result | generated_code_stats(dump_dir))
    rows = {label: pick_round(rs) for label, rs in runs.items()}
    failed = {label: r["failed"] for label, r in rows.items() if "failed" in r}
    base = rows["default"].get("ms_per_step", float("nan"))
    print(f"GPT-mini O1, {args.steps} steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'pipeline':<28}{'ms/step':>9}{'vs default':>11}{'kernels':>9}{'allocs':>8}{'extern':>8}")
    for label, r in rows.items():
        if label in failed:
            print(f"{label:<28}  FAILED: {failed[label]}")
            continue
        print(f"{label:<28}{r['ms_per_step']:>9.1f}{r['ms_per_step'] / base:>11.2f}{r['fused_kernels']:>9}"
              f"{r['allocations']:>8}{r['extern_calls']:>8}")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
