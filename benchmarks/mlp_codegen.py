"""The two codegen backends side by side on the test MLP (SGD), O1:
Inductor and mlir-llvm (torch dialect -> linalg -> LLVM ExecutionEngine),
median ms/step after warm-up, each in its own subprocess, interleaved rounds.

A row whose steps did not all run generated code (a group in TorchScript,
an eager fallback), or an mlir-llvm row with a group that mlir-llvm could
not lower (Inductor compiled it instead), prints FAILED, and the script
exits 1.

    .venv/bin/python benchmarks/mlp_codegen.py [--steps 30] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from harness import check_lazy, emit, exit_if_failed, median_ms, run_child, run_rounds, time_steps

HERE = os.path.dirname(os.path.abspath(__file__))
CODEGENS = ("inductor", "mlir-llvm")


def run(codegen: str, steps: int, warmup: int) -> dict:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import torch
    import lazy_mlir
    from helpers import LAZY, make_mlp, mlp_batches, sgd
    from lazy_mlir.codegen import mlir_llvm

    lazy_mlir.init("O1", codegen=codegen, progress=False)
    model = make_mlp().to(LAZY)
    opt = sgd(model)

    def step(batch):
        x, y = batch
        loss = model(x.to(LAZY), y.to(LAZY))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        return loss.item()
    times, _ = time_steps(step, mlp_batches(warmup + steps, batch=64))
    why = check_lazy("O1")
    if not why and mlir_llvm.fallbacks:  # the row would time Inductor's code under mlir-llvm's name
        why = f"{sum(mlir_llvm.fallbacks.values())} group(s) compiled by Inductor: {next(iter(mlir_llvm.fallbacks))}"
    return {"failed": why} if why else {"ms_per_step": median_ms(times, warmup)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(run(args.child, args.steps, args.warmup))
        return
    results = run_rounds(args.rounds, CODEGENS, lambda codegen: run_child(__file__, [
        "--child", codegen, "--steps", str(args.steps), "--warmup", str(args.warmup)]))
    # per codegen, the median of its rounds' medians; a failed round fails the row
    failed = {c: next(r["failed"] for r in rs if "failed" in r) for c, rs in results.items()
              if any("failed" in r for r in rs)}
    ms = {c: statistics.median(r["ms_per_step"] for r in rs) for c, rs in results.items() if c not in failed}
    base = ms.get("inductor", float("nan"))
    print(f"MLP (32-64-64-10, batch 64) SGD step at O1, median of {args.rounds} rounds")
    for codegen in results:
        if codegen in failed:
            print(f"  {codegen:<10} FAILED: {failed[codegen]}")
        else:
            print(f"  {codegen:<10} {ms[codegen]:7.2f} ms/step  {ms[codegen] / base:5.2f}x inductor")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
