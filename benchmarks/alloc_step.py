"""Allocations, bytes and page faults per GPT-mini training step (AdamW):
eager against lazy_mlir O1 with and without buffer donation, each variant in
its own process, in one invocation.

Per variant, over the timed steps after warm-up (medians): ms/step, minor
page faults per step (getrusage), peak RSS; then a few more steps under the
profiler's memory tracking (CPU allocator events): allocations per step,
bytes allocated per step, and those of 64 KiB or more. For lazy rows also:
the state tensors (parameters, exp_avg, exp_avg_sq) whose device data came
back from the step in a fresh buffer rather than in their own, and the
compiled groups' outputs per step with those written into a donated input.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/alloc_step.py \\
        [--steps 20] [--warmup 5] [--profiled 3] [--rounds 1] [--only eager,O1,O1-nodonate]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

from child import exit_if_failed, pick_round, run_child

VARIANTS = {  # name -> lazy_mlir.init options (None: eager)
    "eager": None,
    "O1": {"level": "O1", "donate_buffers": True},
    "O1-nodonate": {"level": "O1", "donate_buffers": False},
}
LARGE = 64 << 10


def _state_tensors(model, opt):
    tensors = list(model.parameters())
    for state in opt.state.values():
        tensors += [v for k, v in state.items() if k in ("exp_avg", "exp_avg_sq")]
    return tensors


def run_variant(name: str, steps: int, warmup: int, profiled: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt

    options = VARIANTS[name]
    lazy = options is not None
    if lazy:
        import lazy_mlir
        from lazy_mlir import _C
        options = dict(options)
        lazy_mlir.init(options.pop("level"), progress=False, **options)
    cfg = GPTConfig()
    device = torch.device("lazy" if lazy else "cpu")
    model = make_gpt(cfg).to(device)
    opt = make_adamw(model)

    fresh = []  # per lazy step: state tensors whose buffer changed
    buffers = {}  # id(state tensor) -> its buffer's address after the previous step

    def step(x, y):
        loss = model(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if lazy:
            torch._lazy.mark_step()
            state = _state_tensors(model, opt)
            after = {id(t): _C.device_data_ptr(t) for t in state}
            fresh.append((sum(buffers.get(k, a) != a for k, a in after.items()), len(state)))
            buffers.update(after)
        return loss.item()

    batches = list(gpt_batches(cfg, warmup + steps + profiled))
    times, faults, losses = [], [], []
    stats0 = None
    for i, (x, y) in enumerate(batches[:warmup + steps]):
        if i == warmup and lazy:
            stats0 = dict(_C.stats())
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    result = {
        "variant": name,
        "ms_per_step": statistics.median(times[warmup:]) * 1000,
        "page_faults_per_step": statistics.median(faults[warmup:]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "losses": losses,
    }
    if lazy:
        s = dict(_C.stats())
        d = {k: (s[k] - stats0[k]) / steps for k in ("group_outputs", "group_output_bytes", "outputs_in_place",
                                                      "in_place_bytes", "donor_copies", "donor_copy_bytes")}
        timed = fresh[warmup:warmup + steps]
        result.update(d)
        result["state_tensors"] = timed[-1][1]
        result["state_fresh_per_step"] = statistics.median(f for f, _ in timed)
    # Allocations under the profiler (its overhead stays out of the timings above).
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for x, y in batches[warmup + steps:]:
            step(x, y)
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0]
    result.update({
        "allocs_per_step": len(sizes) / profiled,
        "alloc_mb_per_step": sum(sizes) / profiled / 2**20,
        "large_allocs_per_step": sum(1 for b in sizes if b >= LARGE) / profiled,
        "large_alloc_mb_per_step": sum(b for b in sizes if b >= LARGE) / profiled / 2**20,
    })
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profiled", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the median round is reported")
    parser.add_argument("--only", default=",".join(VARIANTS))
    parser.add_argument("--json", default="alloc_step.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.steps, args.warmup, args.profiled)))
        return

    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for name in args.only.split(","):
            print(f"round {round_ + 1}: running {name} ...", file=sys.stderr, flush=True)
            runs.setdefault(name, []).append(run_child(__file__, [
                "--child", name, "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--profiled", str(args.profiled)]))
    results = {n: pick_round(rs) for n, rs in runs.items()}
    failed = {n: r["failed"] for n, r in results.items() if "failed" in r}
    ok = {n: r for n, r in results.items() if n not in failed}
    eager = ok.get("eager", {})
    print(f"\nGPT-mini + AdamW step: {args.steps} timed steps after {args.warmup} warm-up (medians), allocations "
          f"over {args.profiled} profiled steps, median of {args.rounds} interleaved round(s)")
    print(f"{'variant':<14}{'ms/step':>9}{'/eager':>8}{'faults':>8}{'RSS MB':>8}{'/eager':>8}{'allocs':>8}"
          f"{'MB':>8}{'>=64K':>7}{'MB':>8}{'fresh state':>13}{'in place':>10}{'MB':>7}{'copies':>8}")
    for n, r in results.items():
        if n in failed:
            print(f"{n:<14}  FAILED: {failed[n]}")
            continue
        lazy = "state_tensors" in r
        print(f"{n:<14}{r['ms_per_step']:>9.1f}{r['ms_per_step'] / eager.get('ms_per_step', float('nan')):>8.2f}"
              f"{r['page_faults_per_step']:>8.0f}{r['peak_rss_mb']:>8.0f}"
              f"{r['peak_rss_mb'] / eager.get('peak_rss_mb', float('nan')):>8.2f}"
              f"{r['allocs_per_step']:>8.0f}{r['alloc_mb_per_step']:>8.1f}{r['large_allocs_per_step']:>7.0f}"
              f"{r['large_alloc_mb_per_step']:>8.1f}"
              + (f"{r['state_fresh_per_step']:>7.0f} of {r['state_tensors']:<3}{r['outputs_in_place']:>6.0f} of "
                 f"{r['group_outputs']:<3.0f}{r['in_place_bytes'] / 2**20:>7.1f}{r['donor_copies']:>8.1f}"
                 if lazy else ""))
    print("  faults: minor page faults; allocs/MB: CPU allocator allocations per step (all, and >= 64 KiB); "
          "fresh state: parameters and AdamW moments whose data came back in a new buffer; in place: group "
          "outputs written into a donated input (and MB); copies: donated inputs cloned because still in use")
    if "eager" in ok:
        for n, r in ok.items():
            diff = max(abs(a - b) for a, b in zip(eager["losses"], r["losses"]))
            print(f"  max |loss - eager loss| {n:<14} {diff:.2e}")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
