"""Does a long lazy_mlir ZeRO-3 run hold its memory? GPT-mini on 2 gloo ranks
(one thread each) for ``--steps`` steps; every ``--every`` steps each rank
reads its resident set size (VmRSS, after the step's graph has run). Rank 0
prints the table, each rank's growth from step ``--baseline`` (100) to the
end, and its growth over the second half of the run, with the slope of a
least-squares line through those points.

The verdict is on the second half: RSS still rises for a while after the
compiles (from step 100 to ~200 by 40-110 MiB on this machine, then it stays
flat), while a leak grows for the whole run. The run fails (exit 1) when a
rank's RSS grows by more than ``--max-growth-mib`` (32) between the middle
of the run and its end: over 1,000 steps that is a leak of 64 KiB a step.
It prints FAILED instead of figures, and exits 1, when a rank's steps of the
second half did not all run generated code (a group in TorchScript, an op
run eagerly): the figures would describe another path than lazy_mlir's.

    .venv/bin/python benchmarks/zero_rss.py [--steps 1000] [--max-growth-mib 32] [--json zero_rss.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from harness import check_lazy, torchrun

MIB = 2 ** 20


def rss_bytes() -> int:
    """Current (not peak) resident set size of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (step, MiB) points, in MiB per 100 steps."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(s for s, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((s - mx) ** 2 for s, _ in points)
    return 100 * sum((s - mx) * (v - my) for s, v in points) / sxx


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import lazy_mlir
    import lazy_mlir.zero as zero
    from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt
    from lazy_mlir.observe import metrics

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lazy_mlir.init(progress=rank == 0)
    cfg = GPTConfig()  # GPT-mini: 4 layers, d 256, vocab 1024, seq 128, batch 8
    model = make_gpt(cfg).to("lazy")
    model, opt = zero.initialize(model, make_adamw(model), stage=3, prefetch_bytes=8 * MIB,
                                 persistence_threshold=1024)
    rows = cfg.batch_size // world
    samples = []  # (step, rss bytes, loss)
    start = time.monotonic()
    # batches are drawn as the loop goes: holding 1,000 of them would itself grow RSS
    for step, (x, y) in enumerate(gpt_batches(cfg, steps=args.steps), start=1):
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        loss = model(x.to("lazy"), y.to("lazy"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        if step == args.steps // 2:
            metrics.reset()  # check_lazy below: over the second half, the verdict's
        if step % args.every == 0 or step == args.steps:
            torch._lazy.wait_device_ops()
            samples.append((step, rss_bytes(), loss.item()))  # after mark_step: a read, no graph run
            if rank == 0:
                print(f"  step {step}: rank 0 RSS {samples[-1][1] / MIB:.1f} MiB, loss {samples[-1][2]:.4f}, "
                      f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    everyone, whys = [None] * world, [None] * world
    dist.all_gather_object(everyone, samples)
    dist.all_gather_object(whys, check_lazy("O1"))
    dist.destroy_process_group()
    return report(args, everyone, whys, time.monotonic() - start) if rank == 0 else 0


def report(args, everyone: list[list[tuple[int, int, float]]], whys: list[str | None], seconds: float) -> int:
    world = len(everyone)
    bad = [(r, why) for r, why in enumerate(whys) if why]
    if bad:
        print(f"\nGPT-mini ZeRO-3, {world} gloo ranks, {args.steps} steps: FAILED: rank {bad[0][0]}: {bad[0][1]}")
        return 1
    print(f"\nGPT-mini ZeRO-3, {world} gloo ranks, {args.steps} steps in {seconds:.0f} s; RSS in MiB")
    print(f"{'step':>6}" + "".join(f"{f'rank {r}':>10}" for r in range(world)) + f"{'loss':>9}")
    for i, (step, _, loss) in enumerate(everyone[0]):
        print(f"{step:>6}" + "".join(f"{samples[i][1] / MIB:>10.1f}" for samples in everyone) + f"{loss:>9.4f}")
    middle = args.steps // 2
    ranks, worst = [], -float("inf")
    for r, samples in enumerate(everyone):
        mib = [(s, b / MIB) for s, b, _ in samples]
        after = [(s, v) for s, v in mib if s >= args.baseline]
        second = [(s, v) for s, v in mib if s >= middle]
        if len(after) < 2 or len(second) < 2:
            print(f"rank {r}: too few samples after step {min(args.baseline, middle)}: run more steps",
                  file=sys.stderr)
            return 2
        growth, checked = after[-1][1] - after[0][1], second[-1][1] - second[0][1]
        worst = max(worst, checked)
        ranks.append({"rank": r, "rss_mib": [[s, round(v, 2)] for s, v in mib], "growth_mib": growth,
                      "second_half_growth_mib": checked, "second_half_mib_per_100_steps": slope(second)})
        print(f"rank {r}: {after[0][1]:.1f} MiB at step {after[0][0]} -> {after[-1][1]:.1f} MiB at step "
              f"{after[-1][0]}: growth {growth:+.1f} MiB; from step {second[0][0]}: {checked:+.1f} MiB, "
              f"slope {slope(second):+.2f} MiB / 100 steps")
    ok = worst <= args.max_growth_mib
    print(f"{'PASS' if ok else 'FAIL'}: largest growth over the second half {worst:+.1f} MiB "
          f"(threshold {args.max_growth_mib} MiB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "seconds": seconds, "ranks": ranks, "pass": ok}, f, indent=1)
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100, help="read RSS every this many steps")
    parser.add_argument("--baseline", type=int, default=100, help="report the growth from this step on")
    # a leak of one step's activations or gathered weights (MiB a step) exceeds
    # it within a few dozen steps; after warm-up the samples vary by a few MiB
    parser.add_argument("--max-growth-mib", type=float, default=32.0,
                        help="fail when RSS grows by more than this from the middle of the run to its end")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        return worker(args)
    return torchrun(__file__, args.nproc, sys.argv[1:], {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    sys.exit(main())
