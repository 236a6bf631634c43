"""Activation checkpointing (transformers' ``activation_checkpointing_enable``,
torch.utils.checkpoint per decoder layer) on a zoo model: step time and the
lazy step's buffer memory, with and without, side by side in one process.

Copies of one model (the same initial weights) take turns of --turn steps
on the same batches: eager, torch.compile(model) and lazy, each plain and
checkpointed. After --warmup steps each, prints each variant's median step
time over --steps timed steps and its ratio to eager (plain), and for the
lazy variants the peak bytes of the compiled code's own buffers over one
more step above those held before it (runtime/step_memory.h's count:
activations, gradients, temporaries; eager's and torch.compile's allocations are not counted
there, so they get no figure), the graph executions a step, and each
variant's largest difference of its losses to eager's (dropout 0.1: the
lazy recompute must draw the forward's masks again,
lazy_backend/ltc_fixes/draw_stream.h; torch.compile draws other masks). A lazy variant
that ran an op eagerly or a group in TorchScript prints FAILED.

    .venv/bin/python benchmarks/checkpointing.py [--model llama] [--size base] [--steps 8]

2026-12-03, 2 cores, zoo Llama base, dropout 0.1 (eager's masks): lazy
checkpointed 0.68x eager (plain 0.55x), its step's buffers 51 MiB against
143 plain (docs/performance.md, "Activation checkpointing").
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch

import lazy_mlir
from lazy_mlir.native import _C
from lazy_mlir.observe import metrics
from harness import TurnVariant, exit_if_failed, run_in_turns, turn_rows

LAZY = torch.device("lazy")
ZOO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "models")


class Variant(TurnVariant):
    def __init__(self, name, model, spec, device, checkpointed):
        if checkpointed:
            model.activation_checkpointing_enable()
        super().__init__(name, model, device, spec.optimizer)
        self.spec, self.peak_bytes = spec, None

    def step(self, batch, timed: bool) -> None:
        if self.device == LAZY:
            metrics.reset()
        torch.manual_seed(1234 + len(self.losses))  # each variant's step i draws the same masks
        start = time.perf_counter()
        loss = self.spec.loss(self.forward, *(t.to(self.device) for t in batch))
        self.finish_step(loss, start, timed)

    def measure_memory(self, batch) -> None:
        """The peak of the compiled code's buffers during one step, above
        those live before it (every lazy model's weights and optimizer
        state: the other variant's too)."""
        _C.release_step_memory()  # the peak restarts from what is live
        held = _C.step_memory_stats()["live_bytes"]
        self.step(batch, timed=False)
        self.peak_bytes = _C.step_memory_stats()["peak_bytes"] - held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", help="a zoo model with HF's checkpointing (tests/models/zoo.py)")
    parser.add_argument("--size", default="base", help="a zoo size: tiny, base")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--turn", type=int, default=2)
    args = parser.parse_args()
    lazy_mlir.init("O1")
    sys.path.insert(0, ZOO_DIR)
    import zoo

    v, spec = zoo.base_variant(args.model, size=args.size, dropout=args.dropout), zoo.SPECS[args.model]
    model = zoo.make_model(v, torch.float32)
    data = zoo.batches(v, 4, torch.float32)[:4]
    cpu = torch.device("cpu")
    variants = [Variant(name, copy.deepcopy(model), spec, device, checkpointed)
                for name, device, checkpointed in [
                    ("eager", cpu, False), ("eager, checkpointed", cpu, True),
                    ("torch.compile", cpu, False), ("torch.compile, checkpointed", cpu, True),
                    ("lazy", LAZY, False), ("lazy, checkpointed", LAZY, True)]]
    run_in_turns(variants, data, args.warmup, args.steps, args.turn)
    for variant in variants:
        if variant.device == LAZY:
            variant.measure_memory(data[0])
    print(f"\n{args.model} ({args.size}, dropout {args.dropout}), AdamW fp32; median of {args.steps} steps "
          f"after {args.warmup}, turns of {args.turn}")

    def extra(variant) -> str:
        line = ""
        if variant.per_step:
            execs = statistics.mean(s["graph_executions"] for s in variant.per_step)
            line += f"  step's buffers' peak {variant.peak_bytes / 2**20:6.1f} MiB  {execs:.1f} graph executions a step"
        differences = [abs(a - b) for a, b in zip(variant.losses, variants[0].losses)]
        return line + f"  |loss - eager| <= {max(differences):.1e}"
    exit_if_failed(turn_rows(variants, 28, extra))


if __name__ == "__main__":
    main()
