"""GPT-mini data-parallel training step on 2 CPU ranks (or GPUs): FSDP2 vs lazy_mlir ZeRO.

Runs in one invocation (re-launching itself under torchrun, gloo, one thread
per rank): FSDP2 (``fully_shard`` per block, then the root) eager, FSDP2
under torch.compile (the sharded model compiled, and its optimizer step) in
the default mode, in mode="max-autotune-no-cudagraphs"
(``fsdp2_compiled_max_autotune``) and, with ``--device cuda``,
mode="reduce-overhead" (CUDA graphs, ``fsdp2_compiled_reduce_overhead``; asked
for on cpu it is FAILED), lazy_mlir ZeRO stages 1, 2 and 3, ZeRO-3 with the
model under ``lazy_mlir.capture`` (``zero3_capture``: like ``torch.compile(model)``, the
user's statement that the forward reads nothing else that changes; forward
and backward replayed instead of traced op by op), ZeRO-3 with its schedule
planned from measurements under ``--memory-budget`` (``zero3_planned``: its
first steps, untimed, measure the static schedule and a plan; the table
says what was chosen, and its step time over zero3's, paired round by
round), and DeepSpeed ZeRO-3, eager and with
DeepCompile (CUDA only), when DeepSpeed is installed. Each rank
trains on its slice of the global batch from the same initial weights. Prints
a table (rank 0) and writes JSON: median ms/step, per-rank bytes of
parameters + gradients + optimizer state against the unsharded total, and
collective bytes per step measured against ZeRO theory (Ψ = parameter bytes),
each row's step time over the fastest compiled FSDP2 row's (/best c., that row
named under the table), ZeRO-3's step time over each FSDP2 row's, paired round
by round, and each lazy_mlir row's step split into trace / ltc / compile /
glue / kernels / read (benchmarks/harness.py). A variant that fails shows FAILED and why
instead of a figure, and the script exits 1.

    .venv/bin/python benchmarks/zero_step.py [--steps 10] [--warmup 3] [--rounds 5] [--only fsdp2,zero3]
    .venv/bin/python benchmarks/zero_step.py --autocast --only fsdp2,fsdp2_compiled,zero3   # bfloat16

``--device cuda`` runs each rank on its own GPU over NCCL (``--nproc 1`` on a
one-GPU machine), the lazy device backed by CUDA. DeepCompile re-plans its
graph at its 5th step: give it ``--warmup 8`` so that falls in the warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback

from harness import (SPLIT, StepSplit, best_compile, best_line, check_lazy, compile_fn, exit_if_failed, in_modes,
                     median_ms, modes_legend, runnable, time_steps, torchrun)

# FSDP2 under torch.compile, in each mode (harness.COMPILE_MODES)
FSDP2_COMPILED = in_modes("fsdp2_compiled")
VARIANTS = ["fsdp2", *FSDP2_COMPILED, "zero1", "zero2", "zero3", "zero3_capture", "zero3_planned", "deepspeed",
            "deepcompile"]
# Collective bytes per rank per step in units of Ψ, as the ZeRO paper counts
# them: an all-reduce moves 2Ψ (reduce-scatter + all-gather). Stages 1
# and 2 reduce-scatter grads (Ψ) + all-gather updated params (Ψ); stage 3 and FSDP2
# all-gather params in forward and again in backward (2Ψ) + reduce-scatter (Ψ).
THEORY_PSI = {"fsdp2": 3, **dict.fromkeys(FSDP2_COMPILED, 3), "zero1": 2, "zero2": 2, "zero3": 3, "zero3_capture": 3,
              "zero3_planned": 3,
              "deepspeed": 3, "deepcompile": 3}
MIB = 2 ** 20
W = max(map(len, VARIANTS)) + 2  # the variant column


def _nbytes(t) -> int:
    from torch.distributed.tensor import DTensor
    t = t.to_local() if isinstance(t, DTensor) else t  # this rank's shard
    return t.numel() * t.element_size()


def _fsdp_memory(model, opt) -> dict:
    import torch
    params = list(model.parameters())
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    report = {"params": sum(map(_nbytes, params)), "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
              "optimizer": sum(map(_nbytes, state))}
    report["total"] = sum(report.values())
    # numel() of a DTensor is the global one: params + grads + optimizer state unsharded
    report["unsharded_total"] = sum(2 * p.numel() * p.element_size() for p in params) + \
        sum(t.numel() * t.element_size() for t in state)
    return report


def _build(variant: str, cfg, args):
    """Returns (step(x, y, zero_grad=True) -> loss tensor, memory() -> dict | None).

    ``memory`` is called after a step run with zero_grad=False, so that it sees
    the gradients; it then clears them."""
    import torch
    from lazy_mlir.models import make_adamw, make_gpt

    # torch.compile in an FSDP2 row's mode; raises first (a FAILED row) for a mode the device cannot run
    compile_ = compile_fn(variant, args.device) if variant in FSDP2_COMPILED else None
    model = make_gpt(cfg, seed=0)
    if not variant.startswith("zero"):  # the zero variants move it to the lazy device
        model = model.to(args.device)
    # --autocast: each row's forward under bfloat16 autocast on its own device
    device_type = "lazy" if variant.startswith("zero") else args.device

    def mixed():
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=args.autocast)

    if variant.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # FSDP2's own mixed precision: bfloat16 gathers and compute, float32 reductions
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.autocast \
            else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        opt = make_adamw(model)
        forward = compile_(model) if compile_ else model
        opt_step = compile_(opt.step) if compile_ else opt.step

        def step(x, y, zero_grad=True):
            with mixed():
                loss = forward(x, y)
            loss.backward()
            opt_step()
            if zero_grad:
                opt.zero_grad(set_to_none=True)
            return loss

        def memory():
            report = _fsdp_memory(model, opt)
            opt.zero_grad(set_to_none=True)
            return report
        return step, memory
    if variant in ("deepspeed", "deepcompile"):
        import deepspeed
        # memory_efficient_linear off: ZeRO-3 would replace torch.nn.functional.linear for the whole
        # process (every variant's), and DeepCompile's compile() puts the original back (for both engines)
        ds_config = {"train_micro_batch_size_per_gpu": cfg.batch_size // args.nproc,
                     "zero_optimization": {"stage": 3, "memory_efficient_linear": False},
                     "bf16": {"enabled": args.autocast}}  # bfloat16 weights, float32 master copies
        if variant == "deepcompile":
            from deepspeed.compile.util import is_deepcompile_supported
            if not is_deepcompile_supported():
                raise RuntimeError("DeepCompile needs torch >= 2.6 and the cuda accelerator (--device cuda)")
            ds_config["compile"] = {"deepcompile": True}
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # before ZeRO-3 partitions them
        engine, *_ = deepspeed.initialize(model=model, optimizer=make_adamw(model), config=ds_config)
        if variant == "deepcompile":
            _profile_allgathers_up_to(param_bytes)
            engine.compile()
            if not engine.is_deepcompile_active():  # it falls back to plain torch.compile, logging only
                raise RuntimeError("DeepSpeed did not activate DeepCompile")

        def step(x, y, zero_grad=True):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()  # also zeroes the grads
            return loss
        return step, None

    import lazy_mlir.zero as zero
    model = model.to("lazy")
    opt = make_adamw(model)
    model, opt = zero.initialize(model, opt, stage=int(variant[4]), process_group=None,
                                 prefetch_bytes=args.prefetch_bytes, persistence_threshold=args.persistence_threshold,
                                 reuse_bytes=args.reuse_bytes, bucket_bytes=args.bucket_bytes,
                                 reduce_scatter=args.reduce_scatter,
                                 memory_budget=args.memory_budget * MIB if variant == "zero3_planned" else None)
    if variant.endswith("_capture"):
        import lazy_mlir
        lazy_mlir.capture(model)

    def step(x, y, zero_grad=True, mark_step=None):
        with mixed():
            loss = model(x.to("lazy"), y.to("lazy"))
        loss.backward()
        opt.step()
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        (mark_step or torch._lazy.mark_step)()
        torch._lazy.wait_device_ops()
        return loss

    def memory():
        report = zero.memory_report(model, opt)
        opt.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        return report
    return step, memory


def _profile_allgathers_up_to(max_bytes: int):
    """DeepCompile's prefetch pass predicts all-gather times from a profile
    it takes at its first compile: bf16 all-gathers of 2**1 to 2**30
    elements (2 GiB), 15 runs each, then a fit with scipy's interp1d. The
    GPU machine has no scipy, and a lent GPU's minutes are few: the same
    profile (DeepSpeed's own run_all_gather) up to the first power of two
    above ``max_bytes`` (the model's parameters: no gather is larger), and
    numpy's interp over it, extrapolating linearly beyond as interp1d
    did. Only the time prediction changes, not what DeepCompile plans with it."""
    import numpy as np
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.compile.passes import prefetch
    from deepspeed.compile.profilers import comm_profile
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def create_predictor():
        if comm_profile.profile_results is None:
            with unset_fake_temporarily():
                top = max(2, (max_bytes // 2).bit_length() + 1)  # bf16: 2 bytes an element
                comm_profile.profile_results = comm_profile.run_all_gather(
                    get_accelerator().current_device(), torch.bfloat16, top + 1)
        sizes, times = map(np.asarray, zip(*comm_profile.profile_results))

        def predict(size):
            if size == 0:
                return 0
            if size <= sizes[-1]:
                return float(np.interp(size, sizes, times))
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            return float(times[-1] + slope * (size - sizes[-1]))
        return predict
    prefetch.create_predictor = create_predictor


def worker(args):
    import torch
    import torch.distributed as dist
    from lazy_mlir.models import GPTConfig, gpt_batches, make_gpt

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    cfg = GPTConfig(n_layer=args.n_layer, n_embd=args.n_embd, batch_size=args.batch_size)
    rows = cfg.batch_size // world
    batches = [(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
               for x, y in gpt_batches(cfg, args.warmup + args.steps)]
    # the zero variants take them from the CPU (x.to("lazy")), the others from the device
    device_batches = [(x.to(args.device), y.to(args.device)) for x, y in batches]
    psi = sum(p.numel() * p.element_size() for p in make_gpt(cfg).parameters())

    # by default all that can run: DeepCompile and reduce-overhead (harness.runnable) run on CUDA only
    variants = args.only.split(",") if args.only else \
        runnable([v for v in VARIANTS if args.device == "cuda" or v != "deepcompile"], args.device)
    ds_variants = [v for v in variants if v in ("deepspeed", "deepcompile")]
    if ds_variants:
        os.environ.setdefault("DS_ACCELERATOR", args.device)
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            log("deepspeed: not installed, skipped")
            variants = [v for v in variants if v not in ds_variants]
    if any(v.startswith("zero") for v in variants):
        import lazy_mlir
        import lazy_mlir.zero as zero
        lazy_mlir.init(device=args.device)
    built, failed = {}, {}
    for v in variants:
        try:
            built[v] = _build(v, cfg, args)
        except Exception as e:  # noqa: BLE001 - shown as the variant's FAILED row; same on every rank
            failed[v] = _why(e)

    # Timings drift: interleave the variants round by round, keep the median of
    # the per-round medians. Every round replays the same batches, so all
    # variants end after the same steps and their final losses compare.
    runs = {v: {"round_ms": []} for v in built}
    for round_ in range(args.rounds):
        for v, (step, _) in list(built.items()):
            log(f"round {round_ + 1}: running {v} ...")
            dist.barrier()
            split = StepSplit() if v.startswith("zero") else None
            last = {}

            def timed(batch):
                loss = step(*batch, mark_step=split.mark_step) if split else step(*batch)
                if args.device == "cuda":  # the step's kernels have only been queued
                    torch.cuda.synchronize()
                last["loss"] = loss

            def at_warmup():
                zero.reset_comm_stats()
                lazy_mlir.metrics.reset()
            try:
                if v == "zero3_planned" and round_ == 0:  # untimed: measure, plan, compile, measure, choose
                    from lazy_mlir.zero.schedule import SETTLED_AFTER
                    for batch in (batches * (SETTLED_AFTER // len(batches) + 1))[:SETTLED_AFTER]:
                        step(*batch)
                    runs[v]["schedule"] = lazy_mlir.metrics.snapshot()["zero_schedule"]
                times, _ = time_steps(timed, batches if v.startswith("zero") else device_batches, args.warmup, split,
                                      at_warmup if split else None)
                if v.startswith("zero"):
                    _check_compiled(v, args.steps)
            except Exception as e:  # noqa: BLE001 - e.g. torch.compile of FSDP2 on gloo: a FAILED row
                log(f"{v} failed:\n{traceback.format_exc()}")
                failed[v] = _why(e)
                del built[v], runs[v]
                continue
            runs[v]["round_ms"].append(median_ms(times, args.warmup))
            runs[v]["final_loss"] = last["loss"].item()  # read once, outside the timed steps
            # as it comes: a run cut short (a lent GPU's time limit) still says what it measured
            log(f"round {round_ + 1}: {v} {runs[v]['round_ms'][-1]:.1f} ms/step, loss {runs[v]['final_loss']:.4f}")
            if split:
                comm = zero.comm_stats()
                runs[v]["comm_bytes_per_step"] = {op: b / args.steps for op, b in comm.items()}
                runs[v].setdefault("round_split_ms", []).append(split.medians_ms(args.warmup))
    for v, (step, memory) in built.items():  # one untimed step that keeps its grads, for memory
        dist.barrier()
        step(*(batches if v.startswith("zero") else device_batches)[0], zero_grad=False)
        runs[v]["memory"] = memory() if memory else None
        runs[v]["ms_per_step"] = statistics.median(runs[v]["round_ms"])
    if rank == 0:
        report(args, cfg, psi, runs, failed)
    dist.destroy_process_group()
    if rank == 0:
        exit_if_failed(failed)


def _check_compiled(variant: str, steps: int) -> None:
    """Raises on every rank when any rank's timed steps of a lazy_mlir row
    did not all run generated code (or, captured, replay every forward):
    the row would time something else under its name."""
    import torch.distributed as dist

    why = check_lazy("O1", steps if variant.endswith("_capture") else None)
    whys = [None] * dist.get_world_size()
    dist.all_gather_object(whys, why)  # every rank drops the row, or none: the next barrier needs them all
    bad = [(rank, w) for rank, w in enumerate(whys) if w]
    if bad:
        raise RuntimeError(f"rank {bad[0][0]}: {bad[0][1]}")


def _why(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def report(args, cfg, psi, runs, failed):
    import torch
    ranks = f"nccl ranks ({torch.cuda.get_device_name()})" if args.device == "cuda" else "gloo ranks"
    precision = "bfloat16 autocast, " if args.autocast else ""
    print(f"\nGPT-mini ({precision}{cfg.n_layer} layers, d {cfg.n_embd}, global batch {cfg.batch_size}) on {args.nproc} "
          f"{ranks}, {args.steps} timed steps after {args.warmup} warm-up (median), median of {args.rounds} "
          f"interleaved round(s); Ψ = {psi / MIB:.2f} MiB of parameters")
    best = best_compile(runs)  # the fastest compiled FSDP2 row: /best c.
    print(f"{'variant':<{W}}{'ms/step':>9}{'/best c.':>9}{'MiB/rank':>10}{'MiB full':>10}{'ratio':>7}"
          f"{'comm MiB/step':>15}{'theory':>16}{'meas/th':>9}{'loss':>9}")
    for v, r in runs.items():
        mem, theory = r["memory"], THEORY_PSI[v] * psi
        comm = sum(r["comm_bytes_per_step"].values()) if "comm_bytes_per_step" in r else None
        r.update(theory_comm_bytes_per_step=theory, comm_vs_theory=comm / theory if comm is not None else None)
        over_best = r["ms_per_step"] / runs[best]["ms_per_step"] if best else float("nan")
        print(f"{v:<{W}}{r['ms_per_step']:>9.1f}{over_best:>9.2f}"
              + (f"{mem['total'] / MIB:>10.2f}{mem['unsharded_total'] / MIB:>10.2f}"
                 f"{mem['total'] / mem['unsharded_total']:>7.2f}" if mem else f"{'n/a':>10}{'n/a':>10}{'n/a':>7}")
              + (f"{comm / MIB:>15.2f}" if comm is not None else f"{'n/a':>15}")
              + f"{f'{THEORY_PSI[v]}Ψ = {theory / MIB:.2f}':>16}"
              + (f"{comm / theory:>9.2f}" if comm is not None else f"{'n/a':>9}") + f"{r['final_loss']:>9.4f}")
    for v, why in failed.items():
        print(f"{v:<{W}}  FAILED: {why}")
    print(best_line(runs))
    print("  ratio: MiB/rank over MiB full; fsdp2_compiled: the model and optimizer.step under torch.compile, default "
          "mode; " + modes_legend())
    for v, r in runs.items():
        if "round_split_ms" in r:  # each part's median over the rounds
            r["split_ms"] = {part: statistics.median(s[part] for s in r["round_split_ms"]) for part in SPLIT}
            print(f"  {v} step split (ms; benchmarks/harness.py): "
                  + ", ".join(f"{part} {ms:.1f}" for part, ms in r["split_ms"].items()))
    ratios = {}
    if {"zero3", "zero3_planned"} <= runs.keys():
        plan = runs["zero3_planned"]["schedule"]
        rounds = [p / z for p, z in zip(runs["zero3_planned"]["round_ms"], runs["zero3"]["round_ms"])]
        ratios["zero3_planned_over_zero3"] = statistics.median(rounds)
        print(f"  zero3_planned / zero3 step time: {ratios['zero3_planned_over_zero3']:.2f}, median of the per-round "
              f"ratios ({', '.join(f'{r:.2f}' for r in rounds)}; target <= 0.9); its schedule (budget "
              f"{plan['budget_bytes'] / MIB:.0f} MiB): {plan['chosen']} ({plan['why']}); static "
              f"{plan['static']['ms']:.1f} ms, peak {plan['static']['peak_bytes'] / MIB:.1f} MiB"
              + (f"; planned (reuse {plan['planned']['reuse_bytes'] / MIB:.1f} MiB) {plan['planned']['ms']:.1f} ms, "
                 f"peak {plan['planned']['peak_bytes'] / MIB:.1f} MiB" if "ms" in plan.get("planned", {}) else ""))
    for ours, fsdp in [(z, f) for z in ("zero3", "zero3_capture") for f in ("fsdp2", *FSDP2_COMPILED)]:
        if {ours, fsdp} <= runs.keys():
            # each round runs FSDP2 and ZeRO-3 back to back: their ratio is taken
            # per round (side by side, under the same machine load), then the median
            rounds = [z / f for z, f in zip(runs[ours]["round_ms"], runs[fsdp]["round_ms"])]
            paired = ratios[f"{ours}_over_{fsdp}"] = statistics.median(rounds)
            ratio = ratios[f"{ours}_over_{fsdp}_of_medians"] = runs[ours]["ms_per_step"] / runs[fsdp]["ms_per_step"]
            print(f"  {ours} / {fsdp} step time: {paired:.2f}, median of the per-round ratios "
                  f"({', '.join(f'{r:.2f}' for r in rounds)}; target <= 0.9); ratio of the medians {ratio:.2f}")
    with open(args.json, "w") as f:
        json.dump({"config": vars(args), "psi_bytes": psi, "best_compiled": best, **ratios, "variants": runs,
                   "failed": failed}, f, indent=1)
    print(f"\nJSON: {args.json}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--only", help=f"comma-separated, of {','.join(VARIANTS)} (default: all; on cpu, "
                                       "all but deepcompile and fsdp2_compiled_reduce_overhead)")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8, help="global batch, split over the ranks")
    parser.add_argument("--nproc", type=int, default=2, help="ranks; with --device cuda, one GPU each")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: NCCL, each rank on its GPU, the lazy device backed by CUDA")
    parser.add_argument("--prefetch-bytes", type=int, default=8 * MIB)
    parser.add_argument("--reuse-bytes", type=int, default=None,
                        help="ZeRO-3: keep a gathered parameter until its next use across at most this many "
                             "bytes of other parameters (default: --prefetch-bytes)")
    parser.add_argument("--memory-budget", type=int, default=96,
                        help="zero3_planned: MiB the step's buffers may take at their peak (zero.initialize's "
                             "memory_budget)")
    parser.add_argument("--bucket-bytes", type=int, default=4 * MIB,
                        help="merge gradient reductions (and gathers started together) up to this size")
    parser.add_argument("--reduce-scatter", default="auto", choices=["auto", "all_to_all", "reduce_scatter_tensor"],
                        help="how ZeRO-2/3 reduce gradient shards (auto: all_to_all on gloo)")
    parser.add_argument("--persistence-threshold", type=int, default=1024,
                        help="parameters with fewer elements are not sharded")
    parser.add_argument("--autocast", action="store_true",
                        help="bfloat16 mixed precision: the forward under torch.autocast (\"lazy\" for lazy_mlir's "
                             "rows, which then gather autocast's weights in bfloat16); FSDP2 with "
                             "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32); DeepSpeed bf16")
    parser.add_argument("--json", default="zero_step.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    if "LOCAL_RANK" in os.environ:
        worker(parser.parse_args(json.loads(os.environ["ZERO_STEP_ARGS"])))
        return
    args = parser.parse_args()
    if args.device == "cuda":  # said here, before torchrun starts ranks that would each fail
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            parser.error("--device cuda: torch sees no GPU (torch.cuda.is_available() is False"
                         + (", a CPU build of torch)" if torch.version.cuda is None else ")"))
        if args.nproc > gpus:  # NCCL refuses two ranks on one GPU
            parser.error(f"--device cuda: --nproc {args.nproc} needs {args.nproc} GPUs (one per rank), torch "
                         f"sees {gpus}; pass --nproc {gpus}")
    # The options reach the ranks in ZERO_STEP_ARGS: torchrun reads those after the
    # script too, --nproc as its --nproc-per-node
    env = {"ZERO_STEP_ARGS": json.dumps(sys.argv[1:])}
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
    sys.exit(torchrun(__file__, args.nproc, ["--worker"], env))


if __name__ == "__main__":
    main()
