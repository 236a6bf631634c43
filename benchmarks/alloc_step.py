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

from harness import Col, Table, check_lazy, emit, exit_if_failed, median_ms, ok_rows, pick_round, \
    print_loss_diffs, ratio_col, run_child, run_rounds, time_steps

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
        from lazy_mlir.native import _C
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
    faults, stats0 = [], {}

    def counted(batch):  # a step and its minor page faults
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        loss = step(*batch)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return loss

    times, losses = time_steps(counted, batches[:warmup + steps], warmup,
                               at_warmup=(lambda: stats0.update(_C.stats())) if lazy else None)
    result = {
        "variant": name,
        "ms_per_step": median_ms(times, warmup),
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
        why = check_lazy("O1")  # over all the steps: the metrics are not reset (they hold _C.stats())
        if why:
            result["failed"] = why
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
        emit(run_variant(args.child, args.steps, args.warmup, args.profiled))
        return

    results = run_rounds(args.rounds, args.only.split(","), lambda name: run_child(__file__, [
        "--child", name, "--steps", str(args.steps), "--warmup", str(args.warmup), "--profiled", str(args.profiled)]),
        label=lambda name: f"running {name}", pick=pick_round)
    ok = ok_rows(results)
    print(f"\nGPT-mini + AdamW step: {args.steps} timed steps after {args.warmup} warm-up (medians), allocations "
          f"over {args.profiled} profiled steps, median of {args.rounds} interleaved round(s)")

    def lazy(cell):  # a column of the lazy rows only
        return lambda r: cell(r) if "state_tensors" in r else None
    table = Table([
        Col("ms/step", 9, "ms_per_step"), ratio_col(ok, "eager", "/eager", 8),
        Col("faults", 8, "page_faults_per_step", ".0f"), Col("RSS MB", 8, "peak_rss_mb", ".0f"),
        ratio_col(ok, "eager", "/eager", 8, key="peak_rss_mb"), Col("allocs", 8, "allocs_per_step", ".0f"),
        Col("MB", 8, "alloc_mb_per_step"), Col(">=64K", 7, "large_allocs_per_step", ".0f"),
        Col("MB", 8, "large_alloc_mb_per_step"),
        Col("fresh state", 13, lazy(lambda r: f"{r['state_fresh_per_step']:>7.0f} of {r['state_tensors']:<3}")),
        Col("in place", 10, lazy(lambda r: f"{r['outputs_in_place']:>6.0f} of {r['group_outputs']:<3.0f}")),
        Col("MB", 7, lazy(lambda r: r["in_place_bytes"] / 2**20)), Col("copies", 8, lazy(lambda r: r["donor_copies"]))])
    table.print(results)
    print("  faults: minor page faults; allocs/MB: CPU allocator allocations per step (all, and >= 64 KiB); "
          "fresh state: parameters and AdamW moments whose data came back in a new buffer; in place: group "
          "outputs written into a donated input (and MB); copies: donated inputs cloned because still in use")
    print_loss_diffs(ok, "eager", 14)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    exit_if_failed(table.failed)


if __name__ == "__main__":
    main()
