"""Variants of one training step timed side by side in one process: each
warms up, then they take turns of a few timed steps on the same batches
(separate processes drift 10-30% apart on these machines). A variant has
``name`` and ``step(batch, timed)``, which records its own times
(``finish_step``: its ``device``, ``opt``, ``losses``, ``seconds`` and
``per_step``)."""
from __future__ import annotations

import statistics
import sys
import time

import torch

from lazy_mlir import metrics
from lazy_step import not_compiled


def run_in_turns(variants, data: list, warmup: int, steps: int, turn: int) -> None:
    """``warmup`` untimed steps each, then ``steps`` timed steps each in
    turns of ``turn``; the batches cycle through ``data``."""
    for variant in variants:
        start = time.perf_counter()
        for i in range(warmup):
            variant.step(data[i % len(data)], timed=False)
        print(f"{variant.name}: warm-up {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    done = 0
    while done < steps:
        n = min(turn, steps - done)
        for variant in variants:
            for i in range(done, done + n):
                variant.step(data[(warmup + i) % len(data)], timed=True)
        done += n


def finish_step(variant, loss, start: float, timed: bool) -> None:
    """A training step after its loss: the backward, the optimizer's step,
    mark_step on the lazy device, the loss read; for a timed step its time
    since ``start`` (and a lazy variant's metrics: ``metrics.reset()`` at the
    step's start is the caller's)."""
    lazy = variant.device.type == "lazy"
    loss.backward()
    variant.opt.step()
    variant.opt.zero_grad()
    if lazy:
        torch._lazy.mark_step()
    variant.losses.append(loss.item())  # after mark_step: reads data
    if timed:
        variant.seconds.append(time.perf_counter() - start)
        if lazy:
            variant.per_step.append(metrics.snapshot())


def first_failure(snapshots: list[dict]) -> str | None:
    """Why a lazy variant's timed steps (metrics.snapshot() each) did not
    all run compiled code at O1 (none still interpreting a group while it
    compiles), or None."""
    for s in snapshots:
        why = not_compiled(s, "O1") or (s["interpreted_group_calls"] and "groups ran in TorchScript while compiling")
        if why:
            return why
    return None


def timed_row(variant, eager_seconds: float, width: int) -> str | None:
    """A variant's row: its name, median step time and ratio to eager's
    median, for the caller to extend; None (and a FAILED row printed) if
    its timed steps did not all run compiled code (``variant.per_step``:
    the lazy variants' snapshots, empty for the others)."""
    why = first_failure(variant.per_step)
    if why:
        print(f"  {variant.name:<{width}} FAILED: {why}")
        return None
    median = statistics.median(variant.seconds)
    return f"  {variant.name:<{width}} {median * 1e3:8.1f} ms  {median / eager_seconds:5.2f}x eager"
