"""Demo: train GPT-mini (docs/performance.md) with AdamW on the lazy device through
lazy_mlir, then the same steps eagerly, and compare step times and losses.

    make demo            # or: .venv/bin/python examples/train_gpt.py --steps 30 --level O1
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

import lazy_mlir
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt


def run(device: torch.device, steps: int, label: str):
    cfg = GPTConfig()
    model = make_gpt(cfg).to(device)
    opt = make_adamw(model)
    losses, times = [], []
    bar = tqdm(gpt_batches(cfg, steps), total=steps, desc=f"{label:>14}", unit="step")
    for x, y in bar:
        start = time.perf_counter()
        loss = model(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "lazy":
            torch._lazy.mark_step()
        losses.append(loss.item())  # waits for the step's result
        times.append((time.perf_counter() - start) * 1000)
        bar.set_postfix(loss=f"{losses[-1]:.4f}", ms=f"{times[-1]:.0f}")
    return losses, times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the timing (compiles)")
    parser.add_argument("--level", default="O1", choices=["O0", "O1", "O2"])
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())

    cfg = lazy_mlir.init(args.level)  # on a GPU machine the lazy device is the GPU: eager runs there too
    lazy_losses, lazy_times = run(torch.device("lazy"), args.steps, f"lazy_mlir {args.level}")
    report = lazy_mlir.metrics.report()
    eager_losses, eager_times = run(torch.device(cfg.device), args.steps, "eager")

    timed = slice(args.warmup, None)
    lazy_ms, eager_ms = statistics.median(lazy_times[timed]), statistics.median(eager_times[timed])
    max_diff = max(abs(a - b) for a, b in zip(lazy_losses, eager_losses))
    print()
    print(f"GPT-mini, AdamW, {args.steps} steps ({args.warmup} warm-up) on {cfg.device}, median ms/step")
    print(f"  {'':<16}{'ms/step':>10}{'vs eager':>10}{'final loss':>12}")
    print(f"  {'eager':<16}{eager_ms:>10.1f}{1.0:>10.2f}{eager_losses[-1]:>12.4f}")
    print(f"  {'lazy_mlir ' + args.level:<16}{lazy_ms:>10.1f}{lazy_ms / eager_ms:>10.2f}{lazy_losses[-1]:>12.4f}")
    print(f"  first-step (compile) time on lazy: {lazy_times[0] / 1000:.1f} s, second step: "
          f"{lazy_times[1] / 1000:.2f} s; "
          f"max |loss difference| vs eager: {max_diff:.2e}")
    print()
    print(report)


if __name__ == "__main__":
    main()
