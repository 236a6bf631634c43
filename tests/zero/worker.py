"""One rank of a ZeRO test run (launched by tests/zero/test_zero.py under
torchrun): trains a small GPT (``--zoo NAME``: a Hugging Face model of the
zoo) for a few steps on its slice of a fixed global batch and saves what
the test compares with a single-process eager run: the global losses, the
final full state, memory and graph counts.

With ``--resume-at K`` it also checkpoints after step K (full_state_dict and
this rank's optimizer state, through torch.save), and once the run is over
loads that checkpoint into a fresh, differently initialised model, sets it up
with zero.initialize and trains steps K.. again: the resumed losses and final
state are saved next to the uninterrupted ones."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch
import torch.distributed as dist

import lazy_mlir
import lazy_mlir.zero as zero
from lazy_mlir.cache import compile_cache
from lazy_mlir.models import GPTConfig, gpt_batches, make_adamw, make_gpt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "models"))
import zoo  # noqa: E402  (tests/models/zoo.py: Hugging Face models nobody here wrote)

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
    parser.add_argument("--resume-at", type=int, default=-1, help="checkpoint after this many steps, resume from it")
    # nccl: the lazy device on this rank's GPU (the launcher sets LAZY_MLIR_DEVICE=cuda)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    # rank 0 of this many ranks, alone, on torch's fake process group (its
    # collectives move nothing: benchmarks/zero_simulation.py); no torchrun
    parser.add_argument("--simulate-world", type=int, default=0)
    parser.add_argument("--shard-group-size", type=int, default=None, help="hybrid sharding: ranks a shard group")
    parser.add_argument("--memory-budget", type=int, default=None, help="stage 3: a schedule planned from measurements")
    parser.add_argument("--offload-optimizer", action="store_true", help="stage 3: the optimizer on the host")
    parser.add_argument("--batch-size", type=int, default=CONFIG.batch_size, help="the global batch's rows")
    parser.add_argument("--capture", action="store_true", help="the model under lazy_mlir.capture")
    parser.add_argument("--autocast", action="store_true", help="the forward under bfloat16 autocast")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="the model's")
    parser.add_argument("--level", default="O1", choices=("O0", "O1"), help="O0: TorchScript runs every group")
    parser.add_argument("--zoo", default=None, help="a model of tests/models/zoo.py (tiny size) instead of the GPT")
    args = parser.parse_args()
    config = dataclasses.replace(CONFIG, batch_size=args.batch_size)
    torch.set_num_threads(1)
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if args.simulate_world:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.simulate_world)
    else:
        dist.init_process_group(args.backend, timeout=__import__("datetime").timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    lazy_mlir.init(args.level, progress=False)
    group_keys = record_group_keys()

    dtype = getattr(torch, args.dtype)
    if args.zoo:
        spec = zoo.SPECS[args.zoo]
        build, make_optimizer, compute_loss = (lambda seed=0: zoo.make_model(zoo_variant(args.zoo), dtype, seed),
                                               spec.optimizer, spec.loss)
        global_batches = zoo_batches(args.zoo, args.steps, args.batch_size, dtype)
    else:
        build, make_optimizer = (lambda seed=0: make_gpt(config, seed=seed).to(dtype)), make_adamw
        compute_loss = (lambda model, x, y: model(x, y))
        global_batches = gpt_batches(config, steps=args.steps)

    def setup(model):  # a model build() made, in the run's dtype
        model = model.to("lazy")
        model, optimizer = zero.initialize(model, make_optimizer(model), stage=args.stage,
                                           prefetch_bytes=args.prefetch_bytes,
                                           persistence_threshold=args.persistence_threshold,
                                           reuse_bytes=args.reuse_bytes, reduce_scatter=args.reduce_scatter,
                                           bucket_bytes=args.bucket_bytes, shard_group_size=args.shard_group_size,
                                           memory_budget=args.memory_budget, offload_optimizer=args.offload_optimizer)
        if args.capture:  # after initialize: its forward pre-hook gathers the parameters the record reads
            lazy_mlir.capture(model)
        return model, optimizer

    model, optimizer = setup(build())
    rows = args.batch_size // world
    batches = [tuple(t[rank * rows:(rank + 1) * rows] for t in batch) for batch in global_batches]
    checkpoint = f"{args.out}.ckpt.rank{rank}"
    losses, memory, checkpoint_executions = [], None, 0
    lazy_mlir.metrics.reset()
    for step, batch in enumerate(batches):
        if step == args.die_at_step and rank == world - 1:
            os._exit(3)  # a crashed rank: no clean shutdown
        if step == args.resume_at:
            before, group_keys["in_steps"] = lazy_mlir.metrics.snapshot()["graph_executions"], False
            torch.save({"model": zero.full_state_dict(model), "optimizer": optimizer.state_dict()}, checkpoint)
            checkpoint_executions = lazy_mlir.metrics.snapshot()["graph_executions"] - before
        group_keys["in_steps"] = True
        with torch.autocast("lazy", dtype=torch.bfloat16, enabled=args.autocast):
            loss = compute_loss(model, *(t.to("lazy") for t in batch))
        loss.backward()
        optimizer.step()
        if step == args.steps - 1:
            memory = zero.memory_report(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        # read after the loop (reading now would run a graph); detached in the
        # step, one output of its graph (after mark_step it would share the
        # loss's data: lazy_backend/ltc_fixes/pending_data.h)
        losses.append(loss.detach())
        torch._lazy.mark_step()
    group_keys["in_steps"] = False
    snapshot = lazy_mlir.metrics.snapshot()
    snapshot["graph_executions"] -= checkpoint_executions  # the training steps' own, the checkpoint's reads aside
    result = {"losses": global_mean(losses), "state": zero.full_state_dict(model), "memory": memory,
              "metrics": {k: snapshot[k] for k in ("graph_executions", "mark_steps", "fallback_count",
                                                    "groups_fallen_back", "compiled_group_calls", "collective_bytes",
                                                    "captured_calls", "capture_refused", "zero_schedule")},
              "time": time.time(), "group_keys": group_keys,
              "optimizer_devices": sorted({v.device.type for entry in optimizer.state.values() for v in entry.values()
                                           if isinstance(v, torch.Tensor)})}
    if args.resume_at >= 0:
        saved = torch.load(checkpoint)
        fresh = build(seed=1)  # other initial weights: only the checkpoint can make it match
        fresh.load_state_dict(saved["model"])
        model, optimizer = setup(fresh)
        optimizer.load_state_dict(saved["optimizer"])
        resumed = []
        group_keys["in_steps"] = True  # the resumed steps: the graphs the first model compiled
        for batch in batches[args.resume_at:]:
            loss = compute_loss(model, *(t.to("lazy") for t in batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            resumed.append(loss.detach())
            torch._lazy.mark_step()
        result.update(resumed_losses=global_mean(resumed), resumed_state=zero.full_state_dict(model))
    torch.save(result, f"{args.out}.rank{rank}")
    dist.destroy_process_group()


def zoo_variant(name: str) -> zoo.Variant:
    """The zoo model's tiny variant without dropout (its masks would be
    drawn per rank, not as eager draws them for the global batch)."""
    return zoo.base_variant(name, dropout=0.0)


def zoo_batches(name: str, steps: int, batch_size: int, dtype: torch.dtype) -> list[tuple]:
    """``steps`` global batches of ``batch_size`` rows for a zoo model (its
    first length; floating inputs in ``dtype``): the ranks slice them, the
    test's eager reference trains on them whole."""
    variant, g = zoo_variant(name), torch.Generator().manual_seed(1)
    batches = [zoo.SPECS[name].inputs(variant, batch_size, g) for _ in range(steps)]
    return [tuple(t.to(dtype) if t.is_floating_point() else t for t in batch) for batch in batches]


def record_group_keys() -> dict:
    """The cache keys of the groups this rank looked up in its training steps
    ("used", a set: while "in_steps" is set; setting up and checkpointing
    slice at the rank) and of those it compiled itself ("compiled", a list: a
    key twice would be a group compiled twice; "compiled_in_steps", those of
    the training steps), for the checks that ranks compile each group once
    and a step's graph once."""
    keys = {"used": set(), "compiled": [], "compiled_in_steps": [], "in_steps": False}
    lookup, store = compile_cache.lookup, compile_cache.store

    def looked_up(key, *args, **kwargs):
        if keys["in_steps"]:
            keys["used"].add(key)
        return lookup(key, *args, **kwargs)

    def stored(key, lowered, *args, **kwargs):
        if lowered.artifacts is not None:  # compiled here (a size served by generic code stores none)
            keys["compiled"].append(key)
            if keys["in_steps"]:
                keys["compiled_in_steps"].append(key)
        return store(key, lowered, *args, **kwargs)

    compile_cache.lookup, compile_cache.store = looked_up, stored
    return keys


def global_mean(losses: list[torch.Tensor]) -> torch.Tensor:
    """Each step's loss averaged over the ranks: the loss of the global batch."""
    total = torch.stack([loss.cpu() for loss in losses])
    if dist.get_backend() == dist.Backend.NCCL:  # NCCL reduces CUDA tensors only
        total = total.cuda()
    dist.all_reduce(total)
    return total.cpu() / dist.get_world_size()


if __name__ == "__main__":
    main()
