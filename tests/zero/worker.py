"""One rank of a ZeRO test run (launched by tests/zero/test_zero.py under
torchrun): trains a small GPT for a few AdamW steps on its slice of a fixed
global batch and saves what the test compares with a single-process eager
run: the global losses, the final full state, memory and graph counts."""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import lazy_mlir
import lazy_mlir.zero as zero
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt

# n_embd=36 and vocab 50: parameter sizes not divisible by 3 (or 2) ranks.
CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=36, vocab_size=50, block_size=8, batch_size=6)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", required=True)
    # a live-gather budget of a fraction of the model's 137 KB, as in real use
    parser.add_argument("--prefetch-bytes", type=int, default=32 << 10)
    parser.add_argument("--persistence-threshold", type=int, default=40)
    parser.add_argument("--reuse-bytes", type=int, default=0)
    parser.add_argument("--reduce-scatter", default="auto")
    parser.add_argument("--bucket-bytes", type=int, default=4 << 20)
    parser.add_argument("--die-at-step", type=int, default=-1, help="the last rank exits at this step")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    lazy_mlir.init(progress=False)
    model = make_gpt(CONFIG).to("lazy")
    model, optimizer = zero.initialize(model, make_adamw(model), stage=args.stage,
                                       prefetch_bytes=args.prefetch_bytes,
                                       persistence_threshold=args.persistence_threshold,
                                       reuse_bytes=args.reuse_bytes, reduce_scatter=args.reduce_scatter,
                                       bucket_bytes=args.bucket_bytes)
    rows = CONFIG.batch_size // world
    losses, memory = [], None
    lazy_mlir.metrics.reset()
    for step, (x, y) in enumerate(gpt_batches(CONFIG, steps=args.steps)):
        if step == args.die_at_step and rank == world - 1:
            os._exit(3)  # a crashed rank: no clean shutdown
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        loss = model(x.to("lazy"), y.to("lazy"))
        loss.backward()
        optimizer.step()
        if step == args.steps - 1:
            memory = zero.memory_report(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        torch._lazy.mark_step()
        losses.append(loss.detach())  # read after the loop: reading now would run a graph
    snapshot = lazy_mlir.metrics.snapshot()
    global_losses = torch.stack([loss.cpu() for loss in losses])
    dist.all_reduce(global_losses)
    state = zero.full_state_dict(model)
    result = {"losses": global_losses / world, "state": state, "memory": memory,
              "metrics": {k: snapshot[k] for k in ("graph_executions", "mark_steps", "fallback_count",
                                                    "groups_fallen_back", "compiled_group_calls", "collective_bytes")},
              "time": time.time()}
    torch.save(result, f"{args.out}.rank{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
