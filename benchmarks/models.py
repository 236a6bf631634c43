"""Training-step time of the test zoo's models (tests/models/zoo.py): eager,
torch.compile(model) with the optimizer step eager, torch.compile(model) with
torch.compile(optimizer.step), and lazy_mlir O1 (per-op trace, the model
captured). Two more rows compile the loss with the model, each the other's
baseline: torch.compile of the loss function with torch.compile(optimizer.step)
(`compile_loss_opt`), and lazy_mlir.capture of the loss function
(`lazy_mlir_O1_capture_loss`; the ratio column /c.l+opt). The rows compiling
the whole step run in torch.compile's default mode and as rows of their own in
mode="max-autotune-no-cudagraphs" (`compile_model_opt_max_autotune`,
`compile_loss_opt_max_autotune`) and, when the backing device is CUDA,
mode="reduce-overhead" (CUDA graphs: `compile_model_opt_reduce_overhead`,
`compile_loss_opt_reduce_overhead`; asked for elsewhere they are FAILED). The
column /best c. quotes each row against the fastest torch.compile row of its
model that did not fail, named under the model's rows.

Each (model, variant) runs in its own subprocess, all in one invocation and
interleaved round by round, so the ratios are measured side by side. Eager
and torch.compile run on the device backing lazy_mlir's
(harness.backing_device()). Per model and variant: median ms/step after
warm-up, ratios to eager, to the default-mode torch.compile rows and to the
fastest torch.compile row, first-step seconds
(tracing + compiling), with one process per row its peak RSS and that over
eager's, and for lazy_mlir graph executions and eager
fallbacks per step and the step's split into trace / ltc / compile / glue /
kernels (defined in benchmarks/harness.py). fp32, or with ``--autocast bf16`` the forward and loss under
torch.autocast (each row on its own device: "lazy" for lazy_mlir's); ``--autocast fp16`` adds
torch.amp.GradScaler on that device (the loss scaled, ``scaler.step(opt)``, ``scaler.update()``). The zoo's tiny configs
(hidden 32, batch 2, the tests' models) by default: per-step overhead
dominates, as in small-batch steps. ``--size base`` runs the same models at
4 layers x 256 (FFN 1024, vocabulary 1024), batch 8, 128 tokens (64 x 64
images; the CNNs 8x as wide), where matrix products and convolutions
dominate, as in real training (tests/models/zoo.py SIZES).

A row that failed, or a lazy_mlir row whose timed steps did not all run
generated code (a group in TorchScript, an eager fallback, no compiled group
call), shows FAILED and why instead of a figure, and the script exits 1.

    .venv/bin/python benchmarks/models.py [--steps 20] [--warmup 5] [--rounds 1] [--models gpt2,resnet]
    .venv/bin/python benchmarks/models.py --paired   # per model, the rows take turns in one process
    .venv/bin/python benchmarks/models.py --paired --block 5   # turns of 5 steps, 4 of them timed
    .venv/bin/python benchmarks/models.py --paired --block 5 --size base --steps 12 --only eager,compile_loss_opt,lazy_mlir_O1_capture_loss
    .venv/bin/python benchmarks/models.py --paired --block 5 --size base --autocast bf16 --only eager,compile_loss_opt,lazy_mlir_O1_capture_loss
    .venv/bin/python benchmarks/models.py --paired --block 5 --autocast fp16 --models gpt2,resnet --only eager,compile_loss_opt,lazy_mlir_O1_capture_loss

Taking turns step by step, each row's step follows another row's, which has
evicted its caches; a training process runs one model, and ``--block``
times steps that follow the row's own (the figure a user sees), still
interleaved against machine drift.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys

from harness import (COMPILE_ROWS, NAN, Col, StepSplit, Table, backing_device, best_line, check_lazy, compile_fn,
                     emit, exit_if_failed, in_modes, median_ms, mode_refused, modes_legend, ok_rows, pick_round,
                     ratio_col, ratio_cols, run_child, run_rounds, runnable, split_cols, take_turns, time_steps)

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")
MODELS = ["gpt2", "bert", "llama", "t5", "vit", "resnet", "mobilenet"]
# the loss function (and so the model) and optimizer.step under torch.compile, in each mode (harness.COMPILE_MODES)
LOSS_OPT_ROWS = in_modes("compile_loss_opt")
# by default (--only not given) those the backing device runs (harness.runnable)
# lazy_mlir_O1: the plain loop (the model captured automatically); _op_by_op: Config.capture "off";
# _capture: lazy_mlir.capture(model) called; _capture_loss: the loss function captured with the model
VARIANTS = ["eager", *COMPILE_ROWS, *LOSS_OPT_ROWS, "lazy_mlir_O1", "lazy_mlir_O1_op_by_op", "lazy_mlir_O1_capture",
            "lazy_mlir_O1_capture_loss"]
OPT_COMPILED = (*in_modes("compile_model_opt"), *LOSS_OPT_ROWS)
W = max(map(len, VARIANTS)) + 2  # the variant column
AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _make_step(name: str, variant: str, size: str, dropout: float | None = None, autocast: str | None = None):
    """(step(batch) -> loss value, the model's batches) for one row; lazy_mlir
    rows initialise the lazy backend (one per process). ``autocast``: the
    forward and loss under torch.autocast to that dtype (the rows' own device)."""
    import contextlib

    import torch
    sys.path.insert(0, ZOO_DIR)
    import zoo

    lazy = variant.startswith("lazy_mlir")
    if lazy:
        import torch._lazy
        import lazy_mlir
        lazy_mlir.init(_level(variant), capture="off" if variant.endswith("_op_by_op") else "auto")
    device = torch.device("lazy" if lazy else backing_device())
    v, spec = zoo.base_variant(name, size=size), zoo.SPECS[name]
    if dropout is not None:
        v = dataclasses.replace(v, dropout=dropout)
    model = zoo.make_model(v, torch.float32).to(device)
    model.train()
    opt = spec.optimizer(model)
    compile_ = compile_fn(variant, device.type) if variant in (*COMPILE_ROWS, *LOSS_OPT_ROWS) else None  # its mode
    forward = compile_(model) if variant in COMPILE_ROWS else model

    def loss_of(*batch):
        return spec.loss(forward, *batch)

    if variant in LOSS_OPT_ROWS:
        loss_of = compile_(loss_of)
    if variant.endswith("_capture"):
        lazy_mlir.capture(model)
    if variant.endswith("_capture_loss"):
        loss_of = lazy_mlir.capture(loss_of, modules=[model])
    if variant in OPT_COMPILED:
        opt.step = compile_(opt.step)  # an attribute: GradScaler.step calls it too

    mixed = (lambda: torch.autocast(device.type, dtype=getattr(torch, AUTOCAST_DTYPES[autocast]))) if autocast \
        else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device.type) if autocast == "fp16" else None

    def step(batch, mark_step=None):
        with mixed():
            loss = loss_of(*(t.to(device) for t in batch))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        if lazy:
            (mark_step or torch._lazy.mark_step)()
        return loss.item()

    return step, lambda n: zoo.batches(v, n, torch.float32)[:n]  # full batches, one shape


def _level(variant: str) -> str:
    """"O1" of "lazy_mlir_O1", "lazy_mlir_O1_capture", ...."""
    return variant.split("_")[2]


def _lazy_checks(variant: str, steps: int) -> dict:
    from lazy_mlir.observe import metrics
    s = metrics.snapshot()
    result = {"executions_per_step": s["graph_executions"] / steps, "fallbacks_per_step": s["fallback_count"] / steps,
              "syncs": s["syncs"]}
    why = check_lazy(_level(variant), steps if "_capture" in variant else None, s)
    if why:
        result["failed"] = why
    return result


def run_variant(name: str, variant: str, size: str, steps: int, warmup: int, dropout: float | None,
                autocast: str | None) -> dict:
    """Runs in the child process."""
    lazy = variant.startswith("lazy_mlir")
    step, batches = _make_step(name, variant, size, dropout, autocast)
    split, at_warmup = None, None
    if lazy:
        from lazy_mlir.observe import metrics
        split, at_warmup = StepSplit(), metrics.reset
    times, losses = time_steps((lambda batch: step(batch, split.mark_step)) if split else step,
                               batches(warmup + steps), warmup, split, at_warmup)
    result = {"ms_per_step": median_ms(times, warmup), "first_step_s": times[0], "final_loss": losses[-1],
              # the process's own (one process per row: comparable across rows)
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if split:
        result.update(_lazy_checks(variant, steps), split_ms=split.medians_ms(warmup))
    return result


def run_paired(name: str, variants: list[str], size: str, steps: int, warmup: int, block: int,
               dropout: float | None, autocast: str | None) -> dict:
    """Runs in the child process: every row of ``name``, ``block`` steps each
    in turn (at most one lazy_mlir row), with the time in generated code
    split out. A row whose torch.compile mode the device cannot run is
    FAILED, not built."""
    if sum(v.startswith("lazy_mlir") for v in variants) > 1:
        raise SystemExit("--paired takes at most one lazy_mlir row")
    refused = {v: why for v in variants if (why := mode_refused(v, backing_device()))}
    rows = {v: _make_step(name, v, size, dropout, autocast) for v in variants if v not in refused}
    if not rows:
        return {v: {"failed": why} for v, why in refused.items()}
    batches = next(iter(rows.values()))[1](warmup + steps)
    results = take_turns({v: step for v, (step, _) in rows.items()}, batches, warmup, block)
    for v, r in results.items():
        if v.startswith("lazy_mlir"):
            r.update(_lazy_checks(v, steps))
    return {v: {"failed": refused[v]} if v in refused else results[v] for v in variants}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every variant this many times, interleaved; report the median round")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--only", help="rows, comma-separated, of " + ",".join(VARIANTS) + " (default: all the "
                        "backing device runs: reduce-overhead rows on CUDA only)")
    parser.add_argument("--json", default="models.json")
    parser.add_argument("--paired", action="store_true",
                        help="per model, all rows in one process taking turns step by step, with the time in "
                             "generated code ('graph') and the rest ('outside') instead of the lazy split")
    parser.add_argument("--block", type=int, default=1,
                        help="with --paired: each row runs this many steps per turn, the first of each turn "
                             "(after another row's) not timed; 1: rows alternate step by step")
    parser.add_argument("--size", default="tiny", choices=["tiny", "base"],
                        help="the models' size (tests/models/zoo.py SIZES): tiny, the tests' models; base, "
                             "4 layers x 256, batch 8, 128 tokens")
    parser.add_argument("--dropout", type=float, default=None,
                        help="the models' dropout probability (default: the zoo's first variant's, 0 for the "
                             "seven models here)")
    parser.add_argument("--autocast", choices=sorted(AUTOCAST_DTYPES), default=None,
                        help="the forward and loss under torch.autocast to this dtype on each row's device "
                             "(\"lazy\" for lazy_mlir's); weights and optimizer fp32")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-paired", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(run_variant(*args.child, args.size, args.steps, args.warmup, args.dropout, args.autocast))
        return
    if not args.only:
        args.only = ",".join(runnable(VARIANTS, backing_device()))
    if args.child_paired:
        emit(run_paired(args.child_paired, args.only.split(","), args.size, args.steps, args.warmup, args.block,
                        args.dropout, args.autocast))
        return

    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--size", args.size]
    if args.dropout is not None:
        common += ["--dropout", str(args.dropout)]
    if args.autocast:
        common += ["--autocast", args.autocast]
    variants = args.only.split(",")
    if args.paired:  # a process per model, its rows taking turns
        per_model = run_rounds(args.rounds, args.models.split(","), lambda name: run_child(__file__, [
            "--child-paired", name, "--only", args.only, "--block", str(args.block), *common]),
            label=lambda name: f"{name}, rows in turn")
        runs = {(name, v): [rows if "failed" in rows else rows[v] for rows in rounds]
                for name, rounds in per_model.items() for v in variants}
        results = {key: pick_round(rs) for key, rs in runs.items()}
    else:
        def run(key):
            why = mode_refused(key[1], backing_device())  # e.g. reduce-overhead off CUDA: FAILED without a process
            return {"failed": why} if why else run_child(__file__, ["--child", *key, *common])
        results = run_rounds(args.rounds, [(name, v) for name in args.models.split(",") for v in variants], run,
                             label=" ".join, pick=pick_round)

    how = ("one process per row" if not args.paired else
           "all rows of a model in one process taking turns step by step" if args.block == 1 else
           f"all rows of a model in one process taking turns every {args.block} steps, the first of each turn "
           f"not timed")
    dropout = "" if args.dropout is None else f", dropout {args.dropout:g}"
    precision = f"fp32 weights, {args.autocast} autocast" if args.autocast else "fp32"
    print(f"\nZoo training steps ({precision}, {args.size} models{dropout}) on {backing_device()}, {args.steps} timed steps after "
          f"{args.warmup} warm-up (median), median of {args.rounds} interleaved round(s), {how}")
    detail = ([Col("graph", 8, lambda r: r["paired_ms"]["graph"], ".2f"),
               Col("outside", 9, lambda r: r["paired_ms"]["outside"], ".2f")] if args.paired else split_cols())
    failed = {}
    for k, name in enumerate(args.models.split(",")):
        ok = ok_rows({v: results[(name, v)] for v in variants})
        table = Table([Col("ms/step", 9, "ms_per_step", ".2f"),
                       *ratio_cols(ok, ratio_col(ok, "compile_loss_opt", "/c.l+opt", 9)),
                       Col("first s", 9, "first_step_s"),
                       *([] if args.paired else [Col("RSS MB", 8, "peak_rss_mb", ".0f"),
                                                 ratio_col(ok, "eager", "RSS/eag", 8, key="peak_rss_mb")]),
                       Col("exec/step", 10, lambda r: r.get("executions_per_step", NAN), ".2f"),
                       Col("fallb/step", 11, lambda r: r.get("fallbacks_per_step", NAN), ".2f"), *detail,
                       Col("loss", 9, "final_loss", ".4f")], names=(("model", 10), ("variant", W)), failed=failed)
        if k == 0:
            table.header()
        for variant in variants:
            r = results[(name, variant)]
            if table.row(r, name, variant):
                for where, n in r.get("syncs", {}).items():
                    print(f"{'':<{W + 10}}sync: {n / args.steps:g}/step at {where}")
        print(best_line(ok, f" ({name})"))
    print("  c.model: torch.compile(model), optimizer step eager; c.m+opt: torch.compile(model) and "
          "torch.compile(optimizer.step); c.l+opt: torch.compile(loss function) and torch.compile(optimizer.step); "
          "all three in the default mode; " + modes_legend() + "; "
          + ("graph: ms in Inductor-generated code, outside: the rest of the step (medians)" if args.paired else
             "split columns (ms, medians): see benchmarks/harness.py"))
    with open(args.json, "w") as f:
        json.dump({f"{m}/{v}": r for (m, v), r in results.items()}, f, indent=1)
    print(f"\nJSON: {args.json}")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
