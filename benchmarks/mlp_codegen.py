"""The two codegen backends side by side on the test MLP (SGD), O1:
Inductor and mlir-llvm (torch dialect -> linalg -> LLVM ExecutionEngine),
median ms/step after warm-up, each in its own subprocess, interleaved rounds.

    .venv/bin/python benchmarks/mlp_codegen.py [--steps 30] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(codegen: str, steps: int, warmup: int) -> float:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import torch
    import lazy_mlir
    from helpers import LAZY, make_mlp, mlp_batches, sgd

    lazy_mlir.init("O1", codegen=codegen, progress=False)
    model = make_mlp().to(LAZY)
    opt = sgd(model)
    times = []
    for x, y in mlp_batches(warmup + steps, batch=64):
        start = time.perf_counter()
        loss = model(x.to(LAZY), y.to(LAZY))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        loss.item()
        times.append(time.perf_counter() - start)
    failures = lazy_mlir.metrics.snapshot()["groups_fallen_back"]
    assert not failures, failures
    return statistics.median(times[warmup:]) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.steps, args.warmup)))
        return
    results = {"inductor": [], "mlir-llvm": []}
    for _ in range(args.rounds):
        for codegen in results:
            out = subprocess.run([sys.executable, __file__, "--child", codegen, "--steps", str(args.steps),
                                  "--warmup", str(args.warmup)], capture_output=True, text=True, check=True)
            results[codegen].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(results["inductor"])
    print(f"MLP (32-64-64-10, batch 64) SGD step at O1, median of {args.rounds} rounds")
    for codegen, times in results.items():
        ms = statistics.median(times)
        print(f"  {codegen:<10} {ms:7.2f} ms/step  {ms / base:5.2f}x inductor")


if __name__ == "__main__":
    main()
