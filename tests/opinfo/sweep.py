"""The whole OpInfo sweep at O1: one row per (op, dtype) in a TSV, then a table.

    .venv/bin/python tests/opinfo/sweep.py --out opinfo.tsv [--dtypes float32,float64] [--samples 1]

Rows are appended as they finish and ops already in ``--out`` are skipped, so
a sweep killed by a crash resumes where it stopped. ``--table`` only prints
the table of an existing TSV.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STATUSES = ("compiled", "torchscript", "fell_back", "eager_fallback", "failed", "skipped", "no_sample")
MEANING = {
    "compiled": "traced, compiled (generated code ran), matches eager",
    "torchscript": "traced, left in TorchScript (not compilable), matches eager",
    "fell_back": "traced, its group failed to compile and ran in TorchScript, matches eager",
    "eager_fallback": "an LTC eager fallback ran (op not traced), matches eager",
    "failed": "error or mismatch against eager",
    "skipped": "skipped with a reason (random draws, uninitialised output)",
    "no_sample": "no CPU sample for the dtype",
}


def table(path: str) -> str:
    rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
    counts = collections.Counter((dtype, status) for _, dtype, status, _ in rows)
    dtypes = sorted({dtype for _, dtype, _, _ in rows})
    lines = ["| outcome | " + " | ".join(dtypes) + " | meaning |", "|---|" + "---|" * len(dtypes) + "---|"]
    for status in STATUSES:
        lines.append(f"| {status} | " + " | ".join(str(counts[(d, status)]) for d in dtypes) + f" | {MEANING[status]} |")
    lines.append("| total | " + " | ".join(str(sum(counts[(d, s)] for s in STATUSES)) for d in dtypes) + " | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="opinfo.tsv")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--samples", type=int, default=1, help="samples per op and dtype")
    parser.add_argument("--table", action="store_true", help="only print the table of --out")
    args = parser.parse_args()
    if not args.table:
        import lazy_mlir
        import lazy_opinfo
        lazy_mlir.init("O1")
        done = set()
        if os.path.exists(args.out):
            done = {tuple(line.split("\t")[:2]) for line in open(args.out)}
        with open(args.out, "a") as out:
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                for name in lazy_opinfo.OPS:
                    if (name, dtype_name) in done:
                        continue
                    outcome = lazy_opinfo.run_op(name, dtype, args.samples)
                    detail = " ".join(outcome.detail.split())
                    out.write(f"{name}\t{dtype_name}\t{outcome.status}\t{detail}\n")
                    out.flush()
    print(table(args.out))


if __name__ == "__main__":
    main()
