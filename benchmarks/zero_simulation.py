"""ZeRO-3 past one machine, simulated: one rank of N (N = 8, 64, 1,024) in one process,
sharded over all N or hybrid (shard groups of S ranks, replicated N/S times).

torch.distributed's fake process group (``init_process_group("fake")``:
collectives return at once, moving nothing) stands in for the other N - 1
ranks. lazy_mlir's ZeRO-3 step traces, passes and compiles exactly as on a
real rank r of N: a rank's step graph does not depend on r, only on N (the
shard sizes). Each N runs in a process of its own (a cold compile: the pass
pipeline runs) and reports, for a GPT of ~3.7M parameters:

- per-rank parameter, gradient and optimizer-state bytes
  (``zero.memory_report``), and their total against 1/N of the unsharded
  total plus the configured gather budget (``prefetch_bytes``);
- collective bytes per step by kind (``metrics["collective_bytes"]``, as
  the ZeRO paper counts them: an all-gather's whole output, a
  reduce-scatter's whole input) against the paper's ZeRO-3 volume, 3 Psi
  (Psi = parameter bytes: gathered for forward, again for backward, and the
  gradients reduce-scattered once);
- the step's buffers at their peak (``step_memory_stats``: gathered
  parameters and everything else the step allocates);
- the pass pipeline's compile time (``stage.mlir_passes``) against N = 8's.

A hybrid row (``RxS``: R replicas of shard groups of S ranks, FSDP2's HSDP)
holds 1/S of the state; its volume adds the all-reduce of each gradient
shard across the R replicas (2 Psi/S, counted as an all-reduce's input twice).

A row whose run fell back (an eager op, a group in TorchScript, more than
one graph a step) shows FAILED and the script exits 1. Numbers of a real
run: tests/zero/test_zero.py checks a simulated rank of 3 against the same
rank of a real 3-rank gloo run (memory and collective bytes alike).

    .venv/bin/python benchmarks/zero_simulation.py [--worlds 8,64,1024,128x8] [--steps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PREFETCH_BYTES = 1 << 20
# the ZeRO paper's stage-3 volume, in parameter bytes a step
PAPER_VOLUME = 3.0


def _rank_of(world: int, shard_group: int, steps: int) -> dict:
    """Trains ``steps`` ZeRO-3 steps as rank 0 of ``world`` (sharded over
    groups of ``shard_group`` ranks); the figures."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import lazy_mlir
    import lazy_mlir.zero as zero
    from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt
    from lazy_mlir.native import _C

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    lazy_mlir.init(progress=False)
    config = GPTConfig(n_layer=4, n_head=4, n_embd=256, vocab_size=2048, block_size=64, batch_size=4)
    model = make_gpt(config)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model = model.to("lazy")
    model, optimizer = zero.initialize(model, make_adamw(model), stage=3, prefetch_bytes=PREFETCH_BYTES,
                                       reduce_scatter="reduce_scatter_tensor", shard_group_size=shard_group)
    lazy_mlir.metrics.reset()
    memory = None
    for step, (x, y) in enumerate(gpt_batches(config, steps=steps)):
        loss = model(x.to("lazy"), y.to("lazy"))
        loss.backward()
        optimizer.step()
        if step == steps - 1:
            memory = zero.memory_report(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
    s = lazy_mlir.metrics.snapshot()
    dist.destroy_process_group()
    return {"world": world, "shards": shard_group, "param_bytes": param_bytes, "memory": memory,
            "collective_bytes": {k: v / steps for k, v in s["collective_bytes"].items()},
            "step_peak_bytes": _C.step_memory_stats()["last_step_peak_bytes"],
            "mlir_passes_s": s["seconds"].get("stage.mlir_passes", 0.0),
            "fell_back": (s["fallback_count"], s["groups_fallen_back"], s["graph_executions"] != s["mark_steps"],
                          s["compiled_group_calls"] < steps)}


def _failure(row: dict) -> str | None:
    fallbacks, fallen_back, extra_graphs, not_compiled = row["fell_back"]
    if fallbacks or fallen_back or extra_graphs or not_compiled:
        return f"fell back: {fallbacks} eager ops, groups in TorchScript {fallen_back}, " \
               f"more than one graph a step {extra_graphs}, generated code not run {not_compiled}"
    if not row["mlir_passes_s"]:
        return "the pass pipeline did not run (a cached compile?)"
    return None


def _name(row: dict) -> str:
    shards = row.get("shards", row["world"])
    return str(row["world"]) if shards == row["world"] else f"{row['world'] // shards}x{shards}"


def _table(rows: list[dict]) -> int:
    base = next((r["mlir_passes_s"] for r in rows if _name(r) == "8" and not _failure(r)), None)
    print("| N | params / grads / optimizer bytes per rank | total vs 1/S unsharded (vs 1/S + budget) | all-gather / "
          "reduce-scatter / all-reduce bytes a step | vs ZeRO's volume | step buffers peak | "
          "pass pipeline s (vs N=8) |")
    print("|---|---|---|---|---|---|---|")
    failed = 0
    for r in rows:
        why = r.get("error") or _failure(r)
        if why:
            print(f"| {_name(r)} | FAILED: {why} |")
            failed = 1
            continue
        m, moved, psi = r["memory"], r["collective_bytes"], r["param_bytes"]
        shards = r["shards"]
        share = m["unsharded_total"] / shards
        volume = sum(moved.values()) / psi
        paper = PAPER_VOLUME + (2.0 / shards if shards < r["world"] else 0.0)
        passes = f"{r['mlir_passes_s']:.2f}" + (f" ({r['mlir_passes_s'] / base:.2f}x)" if base else "")
        print(f"| {_name(r)} | {m['params']:,} / {m['grads']:,} / {m['optimizer']:,} | "
              f"{m['total'] / share:.3f}x ({m['total'] / (share + PREFETCH_BYTES):.3f}x) | "
              f"{moved.get('all_gather', 0):,.0f} / {moved.get('reduce_scatter', 0):,.0f} / "
              f"{moved.get('all_reduce', 0):,.0f} | {volume:.3f} Psi ({volume / paper:.3f}x of {paper:.2f}) | "
              f"{r['step_peak_bytes']:,} | {passes} |")
    print(f"\nPsi = {rows[0].get('param_bytes', 0):,} parameter bytes; gather budget {PREFETCH_BYTES:,} bytes; "
          "S = ranks a shard group (N when not hybrid)")
    return failed


def _world(spec: str) -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"RxS"`` -> (R * S, S)."""
    replicas, _, shards = spec.partition("x")
    return (int(replicas) * int(shards), int(shards)) if shards else (int(spec), int(spec))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="8,64,1024,128x8", help="N, or RxS: R replicas of S-rank shard groups")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)  # the child process: one world, "N" or "RxS"
    args = parser.parse_args()
    if args.rank_of:
        world, shards = _world(args.rank_of)
        print("ROW " + json.dumps(_rank_of(world, shards, args.steps)))
        return 0
    rows = []
    for spec in args.worlds.split(","):
        world, shards = _world(spec)
        env = {**os.environ, "LAZY_MLIR_DEVICE": "cpu", "LAZY_MLIR_CACHE": "0", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, __file__, "--rank-of", spec, "--steps", str(args.steps)],
                              env=env, capture_output=True, text=True)
        line = next((l for l in done.stdout.splitlines() if l.startswith("ROW ")), None)
        rows.append(json.loads(line[4:]) if line else
                    {"world": world, "shards": shards, "error": (done.stderr or "no output")[-300:]})
        print(f"N={spec} done", file=sys.stderr)
    return _table(rows)


if __name__ == "__main__":
    sys.exit(main())
