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
from gpt_step import run_in_subprocess
from harness import Col, Table, exit_if_failed, ok_rows, pick_round, ratio_col, run_rounds

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

    def run(label):
        with tempfile.TemporaryDirectory() as dump_dir:
            result = run_in_subprocess("lazy_mlir_O1", args.steps, args.warmup,
                                       {"pipeline": ",".join(variants[label]), "dump_dir": dump_dir})
            return result | generated_code_stats(dump_dir)
    rows = run_rounds(args.rounds, variants, run, pick=pick_round)  # interleaved: timings drift on these machines
    print(f"GPT-mini O1, {args.steps} steps after {args.warmup} warm-up (median), "
          f"median of {args.rounds} interleaved rounds")
    table = Table([Col("ms/step", 9, "ms_per_step"), ratio_col(ok_rows(rows), "default", "vs default", 11),
                   Col("kernels", 9, "fused_kernels", "d"), Col("allocs", 8, "allocations", "d"),
                   Col("extern", 8, "extern_calls", "d")], names=(("pipeline", 28),))
    table.print(rows)
    exit_if_failed(table.failed)


if __name__ == "__main__":
    main()
