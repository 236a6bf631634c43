"""Training at several sequence lengths: static compiles vs shape-generic groups.

A model nobody on the team wrote (the test zoo's Hugging Face GPT-2 or
Llama, fp32, AdamW, ``lazy_mlir.prepare``) trains at lengths 8, 16, 12, 14
and 10, once with ``dynamic="static"`` (every length
compiles its own groups), once with ``dynamic="auto"`` and
``background_compile=False`` (``auto_blocking``: the second length's step
compiles shape-generic groups, later lengths run them) and once with both
on (``auto``, the default: the shape-generic compile runs on a worker
thread while the steps at new lengths run in TorchScript). Each variant
runs in its own process with empty lazy_mlir and Inductor caches, so all
start cold; then ``auto_warm``, a second ``auto`` process on the caches the
first left, shows what a restart costs (generic variants are stored too).

Per length and variant: the first step's seconds (tracing + any compile;
"TS" marks a step run in TorchScript while the generic code compiled);
per variant, the seconds still spent waiting for background compiles after
the first steps (``lazy_mlir.wait_for_compiles``), and how long the second
steps at a length took when they too ran in TorchScript. Then, once every length
has compiled, the median ms of ``--steps`` steps at
that length, each paired with a step at the first length (static code in
both variants), and the median of the per-pair ratios: on a loaded 2-core
machine step times drift several-fold within a minute, the pairs do not.
Kernels run on ``--threads`` threads (default 1): with 2 OpenMP threads on 2
cores, another busy process stalls every parallel region (a step at a
static length took 180 ms instead of 13), and generic code, with other
loops, suffered more (the 2x "generic price" once reported here).
Per variant: groups compiled, served by generic code. A variant with an
eager fallback or a group run in TorchScript (other than while its code
compiled in the background, before the timed steps), or whose losses differ
from static's by more than 1e-4 (fp32 kernels), prints FAILED instead of
figures, and the script exits 1.

    .venv/bin/python benchmarks/shapes.py [--model gpt2] [--steps 8] [--lengths 8,16,12,14,10]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from harness import cache_env, emit, exit_if_failed, not_compiled, ok_rows, run_child

ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models")
VARIANTS = ("static", "auto_blocking", "auto", "auto_warm")


def child(model_name: str, variant: str, lengths: list[int], steps: int, threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, ZOO_DIR)
    import zoo

    import lazy_mlir
    from lazy_mlir.observe import metrics
    lazy_mlir.init("O1", dynamic="static" if variant == "static" else "auto",
                   background_compile=variant != "auto_blocking", progress=False)
    v, spec = zoo.base_variant(model_name), zoo.SPECS[model_name]
    model = zoo.make_model(v, torch.float32).to("lazy")
    opt = spec.optimizer(model)
    lazy_mlir.prepare(model, opt)
    g = torch.Generator().manual_seed(0)

    def step(length):
        batch = spec.inputs(zoo.Variant(model_name, v.attn, v.dropout, length), zoo.BATCH, g)
        start = time.perf_counter()
        loss = spec.loss(model, *(t.to("lazy") for t in batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch._lazy.mark_step()
        losses.append(loss.item())
        return time.perf_counter() - start

    def interpreted():
        return metrics.snapshot()["interpreted_group_calls"]

    rows, losses = [], []
    metrics.reset()
    for length in lengths:  # first steps: tracing and compiling
        before = interpreted()
        rows.append({"length": length, "first_s": step(length), "interpreted": interpreted() > before})
        before = interpreted()
        second_s = step(length)  # a second step of the length: the code it runs from now on
        if interpreted() > before:
            rows[-1]["second_interpreted_ms"] = 1e3 * second_s
    start = time.perf_counter()
    lazy_mlir.wait_for_compiles()
    waited_s = time.perf_counter() - start
    before_timed = interpreted()
    for row in rows:  # timed steps, each paired with one at the first length
        pairs = [(step(row["length"]), step(lengths[0])) for _ in range(steps)]
        row["ms"] = 1e3 * statistics.median(t for t, _ in pairs)
        row["per_first"] = statistics.median(t / f for t, f in pairs)
    s = metrics.snapshot()
    why = not_compiled(s, "O1") or (s["interpreted_group_calls"] != before_timed
                                    and "groups ran in TorchScript in the timed steps")
    if why:
        return {"failed": why}
    totals = {k: s[k] for k in ("groups_built", "generic_hits", "generic_compiles", "generic_disk_hits",
                                "group_cache_disk_hits", "interpreted_group_calls")}
    totals["groups_compiled"] = s["stage_runs"].get("ts_to_fx", 0)
    return {"rows": rows, "losses": losses, "waited_s": waited_s, **totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lengths", default="8,16,12,14,10")
    parser.add_argument("--threads", type=int, default=1, help="kernel threads (torch.set_num_threads)")
    parser.add_argument("--child", choices=VARIANTS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.child:
        emit(child(args.model, args.child, lengths, args.steps, args.threads))
        return
    folders = {v: [tempfile.mkdtemp(prefix=f"shapes_{v}_") for _ in range(2)] for v in VARIANTS[:3]}
    folders["auto_warm"] = folders["auto"]  # the second process on the first one's caches
    results = {}
    try:
        for variant in VARIANTS:
            print(f"running {variant} ...", file=sys.stderr, flush=True)
            results[variant] = run_child(__file__, [
                "--child", variant, "--model", args.model, "--steps", str(args.steps), "--lengths", args.lengths,
                "--threads", str(args.threads)], cache_env(*folders[variant]))
    finally:
        for pair in folders.values():
            for folder in pair:
                shutil.rmtree(folder, ignore_errors=True)
    static = results["static"] if "failed" not in results["static"] else None
    drifts = {v: max(abs(a - b) for a, b in zip(static["losses"], r["losses"]))
              for v, r in ok_rows(results).items() if static and v != "static"}
    for v, d in drifts.items():
        if d > 1e-4:
            results[v] = {"failed": f"losses differ from static's by {d:.2e}"}
    ok = ok_rows(results)
    drift = max((d for v, d in drifts.items() if v in ok), default=0.0 if static else float("nan"))
    print(f"{args.model}, fp32, AdamW, {args.threads} thread(s), {args.steps} timed pairs per length; "
          f"max loss difference between variants {drift:.1e}")
    print("| length | " + " | ".join(f"{v}: first step s" for v in VARIANTS) + " | "
          + " | ".join(f"{v}: step / first length's" for v in VARIANTS[:3]) + " |")
    print("|---" * (1 + len(VARIANTS) + 3) + "|")
    for k, length in enumerate(lengths):
        rows = {v: ok[v]["rows"][k] for v in ok}
        firsts = [f"{rows[v]['first_s']:.1f}" + (" (TS)" if rows[v]["interpreted"] else "") if v in ok else "FAILED"
                  for v in VARIANTS]
        print(f"| {length} | " + " | ".join(firsts) + " | "
              + " | ".join(f"{rows[v]['per_first']:.2f}" if v in ok else "FAILED" for v in VARIANTS[:3]) + " |")
    total = {v: sum(r["first_s"] for r in ok[v]["rows"]) for v in ok}
    print("first steps in all: " + ", ".join(
        f"{v} {total[v]:.1f} s" + (f" ({total[v] / total['static']:.2f}x static's)" if static else "") for v in total))
    ts_steps = [(r["second_interpreted_ms"], r["ms"]) for r in ok.get("auto", {}).get("rows", [])
                if "second_interpreted_ms" in r]
    if ts_steps:
        print(f"auto: second steps at a length, run in TorchScript while compiling: median "
              f"{statistics.median(t for t, _ in ts_steps):.1f} ms/step, against "
              f"{statistics.median(c for _, c in ts_steps):.1f} ms for the generic code at those lengths later")
    for v in VARIANTS[1:3]:
        if v in ok and static:
            cold = static["rows"][0]["first_s"]
            later = max(r["first_s"] for r in ok[v]["rows"][1:])
            print(f"{v}: slowest first step at a later length {later:.1f} s = {later / cold:.2f}x the cold first "
                  f"step (static's, {cold:.1f} s); {ok[v]['waited_s']:.1f} s left to wait for background "
                  f"compiles after the first steps")
    failed = {}
    for v in VARIANTS:
        if v not in ok:
            failed[v] = results[v]["failed"]
            print(f"{v}: FAILED: {failed[v]}")
            continue
        r = ok[v]
        print(f"{v}: {r['groups_built']} groups built, {r['groups_compiled']} compiled "
              f"({r['generic_compiles']} shape-generic), {r['generic_hits']} sizes served by generic code "
              f"({r['generic_disk_hits']} variants from disk), {r['group_cache_disk_hits']} static groups from disk, "
              f"{r['interpreted_group_calls']} group runs in TorchScript while compiling")
    exit_if_failed(failed)


if __name__ == "__main__":
    main()
